//! The relay server (`secure-transport.md` §6): one HTTP front whose WebSocket upgrades become
//! environment links (`/v1/env/ID`, admitted by the §6.2 handshake against the environments
//! file) and client links (`/v1/connect/ID`), all driven by one [`RelayHub`]; the environments
//! file watched for revocations; TLS on the listener when given ([`RelayServer::with_tls`],
//! its certificate files watched for renewal); `GET /readyz`, `/livez` and `/status`;
//! Prometheus metrics on their own listener; and one shutdown sequence. The `execrelay-relay` binary only parses flags and calls
//! [`RelayServer::run`]; the exec server's `demo` runs a relay in-process through [`run`].
//!
//! # What this module owns
//!
//! - The listener's routes, and what happens to each upgrade (`links.rs`).
//! - The environments file and the link handshakes' timestamps, behind one lock each. An
//!   environment is admitted and registered with the hub under the environments file's lock,
//!   and a reload revokes under the same lock, so a removed key can never slip a link in
//!   between.
//! - Logs: a span per link (`env_link{env, peer}`, `client_link{env, peer}`) and, at debug
//!   level, per stream (the hub's). Never key material: only fingerprints.
//!
//! # What it must never do
//!
//! - Look inside a payload or hold a stream key: frames go to the hub, which reads headers.
//! - Await a destination on a link's reader (the hub's invariant); block the runtime on a
//!   lock held across an `.await` (none is).

pub mod cli;
mod links;
pub mod metrics;
pub mod settings;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::descriptors::{nofile_limit, RelayDescriptorPlan};
use crate::driver::{link_websocket_config_with, RelayHub};
use crate::env_handshake::LinkTimestamps;
use crate::http::{
    self, AddressSlots, Front, Health, MetricsRenderer, OnUpgrade, PathPattern, Routes, Upgrade,
    UpgradeRoute,
};
use crate::keys::environments::{EnvironmentsFile, Reload};
use crate::keys::{fingerprint, Keypair};
use crate::replay::ReplayCache;
use crate::tls::{TlsListener, CERTIFICATE_POLL_MS};
use metrics::{Figures, ServerStats};
use settings::{RelaySettings, SettingsError};

/// The path prefix of environment links: `/v1/env/ID`.
pub const ENV_PATH_PREFIX: &str = "/v1/env/";
/// The body of the `404` a WebSocket upgrade on another path gets: a client that dialled the
/// relay with `ws://` or `noise+ws://` learns what to use (its CLI shows it).
pub const RELAY_HINT: &str =
    "this is an execrelay relay; clients use relay+ws://HOST:PORT/ENVIRONMENT_ID (relay+wss:// over TLS)";

/// The path prefix of client links: `/v1/connect/ID`.
pub const CONNECT_PATH_PREFIX: &str = "/v1/connect/";
/// The relay's version, sent in message 2 of every environment link.
pub const RELAY_VERSION: &str = env!("CARGO_PKG_VERSION");

/// How long shutdown waits for links to close (each sends its close frame within the
/// driver's `LINK_CLOSE_TIMEOUT`) before it returns anyway.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// What a relay needs to start.
#[derive(Debug)]
pub struct RelayServerConfig {
    /// The relay's static key (`--key`).
    pub keys: Keypair,
    /// The environments file (`--environments`), loaded (a bad file is refused at start).
    pub environments: EnvironmentsFile,
    /// Every limit.
    pub settings: RelaySettings,
}

/// A relay that cannot start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// A setting is invalid.
    #[error(transparent)]
    Settings(#[from] SettingsError),
    /// The open files limit cannot hold a relay.
    #[error(transparent)]
    Descriptors(#[from] crate::descriptors::TooFewDescriptors),
}

/// What the links of a relay share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub keys: Keypair,
    pub environments: Mutex<EnvironmentsFile>,
    pub timestamps: Mutex<LinkTimestamps>,
    pub settings: RelaySettings,
    pub stats: ServerStats,
    /// Slots of environment links between their upgrade and their admission.
    pub link_handshakes: Arc<Semaphore>,
    /// The same slots, counted per peer address.
    pub link_handshake_addresses: Arc<AddressSlots>,
    /// Per environment id, the holder link whose second claimant was last reported (two
    /// exec servers share a key): reported once per holder, not at every redial.
    pub shared_keys_reported: Mutex<std::collections::HashMap<String, crate::router::LinkId>>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Microseconds since the Unix epoch (the link handshake's clock).
pub(crate) fn unix_micros() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

impl Shared {
    /// Look at the environments file and apply what changed: revoked ids lose their link at
    /// once (their streams reset `environment_gone`). Called with the file's lock held by the
    /// caller, so registration and revocation never interleave.
    pub(crate) fn apply_reload(&self, file: &mut EnvironmentsFile, hub: &RelayHub) {
        match file.poll() {
            None => {}
            Some(Reload::Changed { listed, revoked }) => {
                self.stats.environments_reloaded(true, revoked.len());
                tracing::info!(
                    file = %file.path().display(),
                    listed,
                    revoked = revoked.len(),
                    "environments file reloaded"
                );
                for id in revoked {
                    tracing::warn!(
                        env = %id,
                        "environment no longer listed with its key: closing its link"
                    );
                    hub.remove_environment(&id);
                }
            }
            Some(Reload::Failed { error }) => {
                self.stats.environments_reloaded(false, 0);
                tracing::error!(
                    %error,
                    "environments file unusable: no new environment link is admitted until it is fixed (links up are kept)"
                );
            }
        }
    }
}

/// One relay, before and while it runs.
pub struct RelayServer {
    hub: RelayHub,
    shared: Arc<Shared>,
    tls: Option<TlsListener>,
}

/// What a relay's HTTP front upgrades.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// `/v1/env/ID`.
    Environment,
    /// `/v1/connect/ID`.
    Client,
}

/// Serve relay links on `listener` until `shutdown`, then close every link and return. No
/// metrics listener (see [`RelayServer::run`]).
pub async fn run(
    listener: TcpListener,
    config: RelayServerConfig,
    shutdown: CancellationToken,
) -> Result<(), ServerError> {
    RelayServer::new(config)?
        .run(listener, None, shutdown)
        .await;
    Ok(())
}

impl RelayServer {
    /// A relay: settings checked, caps sized to the process's descriptor limit (read, not
    /// raised: the binary raises it first), hub built.
    pub fn new(config: RelayServerConfig) -> Result<RelayServer, ServerError> {
        config.settings.validate()?;
        let needs = config.settings.descriptor_needs();
        let limit = nofile_limit().map(|l| l.soft).unwrap_or(u64::MAX);
        let plan = RelayDescriptorPlan::derive(limit, needs)?;
        if plan.lowered(&needs) {
            tracing::warn!(
                limit,
                max_client_links = plan.client_links,
                max_pending_handshakes = plan.pending_handshakes,
                descriptor_reserve = plan.reserve,
                "open files limit too low for the configured caps: lowered to fit (raise `ulimit -n` to keep them)"
            );
        } else {
            tracing::info!(
                limit,
                max_client_links = plan.client_links,
                descriptor_reserve = plan.reserve,
                "open files: caps fit the limit"
            );
        }
        let settings = config.settings.within(&plan);
        let hub = RelayHub::new(settings.engine()).map_err(SettingsError::from)?;
        tracing::info!(
            key = %fingerprint(&config.keys.public),
            environments = config.environments.current().len(),
            file = %config.environments.path().display(),
            "relay configured"
        );
        // Nothing stamped before this moment is admitted: a restart opens no replay window.
        let timestamps: LinkTimestamps = ReplayCache::new(settings.replay_limits(), unix_micros());
        let shared = Arc::new(Shared {
            keys: config.keys,
            environments: Mutex::new(config.environments),
            timestamps: Mutex::new(timestamps),
            shared_keys_reported: Mutex::new(std::collections::HashMap::new()),
            link_handshakes: Arc::new(Semaphore::new(settings.max_pending_link_handshakes)),
            link_handshake_addresses: AddressSlots::new(
                settings.max_pending_link_handshakes_per_address,
            ),
            settings,
            stats: ServerStats::default(),
        });
        Ok(RelayServer {
            hub,
            shared,
            tls: None,
        })
    }

    /// Speak TLS on the links' listener (`wss://`) with `tls`'s certificate, re-read when its
    /// files change (checked every [`CERTIFICATE_POLL_MS`] while the relay runs).
    pub fn with_tls(mut self, tls: TlsListener) -> RelayServer {
        self.tls = Some(tls);
        self
    }

    /// The hub (tests and embedders read its figures).
    pub fn hub(&self) -> &RelayHub {
        &self.hub
    }

    /// The settings in force: as configured, with the caps the descriptor limit allows.
    pub fn settings(&self) -> &RelaySettings {
        &self.shared.settings
    }

    /// The metrics text now (what `GET /metrics` answers).
    pub fn render_metrics(&self) -> String {
        render(&self.hub, &self.shared, self.tls.as_ref())
    }

    /// The `/status` document now.
    pub fn render_status(&self) -> String {
        status(&self.hub, &self.shared, self.tls.as_ref())
    }

    /// A handle that renders this relay's metrics while it runs (for embedders and tests
    /// without a metrics listener).
    pub fn metrics_handle(&self) -> MetricsHandle {
        MetricsHandle {
            hub: self.hub.clone(),
            shared: self.shared.clone(),
            tls: self.tls.clone(),
        }
    }

    /// Serve relay links on `listener` (and metrics on `metrics`, if given) until `shutdown`
    /// fires; then, once: stop accepting, close every link (each sends a close frame, bounded),
    /// and wait for their tasks (at most [`SHUTDOWN_TIMEOUT`]).
    pub async fn run(
        self,
        listener: TcpListener,
        metrics: Option<TcpListener>,
        shutdown: CancellationToken,
    ) {
        let RelayServer { hub, shared, tls } = self;
        let settings = &shared.settings;
        let stop_accepting = CancellationToken::new();
        let fronts = TaskTracker::new();
        let tasks = TaskTracker::new();
        let client_links = Arc::new(Semaphore::new(settings.max_client_links));

        // Ready while the relay accepts links: once shutdown begins, every listener stops, and
        // nothing else makes a relay unable to serve (a broken environments file keeps the
        // links up and is its own metric and alert).
        let health = {
            let (h, s, t) = (hub.clone(), shared.clone(), tls.clone());
            let stopping = shutdown.clone();
            Health {
                ready: Some(Arc::new(move || {
                    if stopping.is_cancelled() {
                        Err("shutting down".into())
                    } else {
                        Ok(())
                    }
                })),
                status: Some(Arc::new(move || status(&h, &s, t.as_ref()))),
            }
        };
        let routes = Routes {
            health: Some(health.clone()),
            metrics: None,
            not_found_hint: Some(RELAY_HINT),
            upgrades: vec![
                UpgradeRoute {
                    path: PathPattern::WithId(ENV_PATH_PREFIX),
                    route: Route::Environment,
                    capacity: None,
                },
                UpgradeRoute {
                    path: PathPattern::WithId(CONNECT_PATH_PREFIX),
                    route: Route::Client,
                    capacity: Some(client_links),
                },
            ],
        };
        let on_upgrade: OnUpgrade<Route> = {
            let (hub, shared, tasks, stop) =
                (hub.clone(), shared.clone(), tasks.clone(), shutdown.clone());
            Arc::new(move |up: Upgrade<Route>| {
                let Some(id) = up.id.clone() else {
                    return;
                };
                let (hub, shared, stop) = (hub.clone(), shared.clone(), stop.clone());
                match up.route {
                    Route::Environment => {
                        tasks.spawn(links::environment_link(
                            hub, shared, up.ws, id, up.peer, stop,
                        ));
                    }
                    Route::Client => {
                        let permit = up.permit;
                        tasks.spawn(async move {
                            links::client_link(hub, shared, up.ws, id, up.peer, stop).await;
                            // The slot of `max_client_links` is free once the link ends.
                            drop(permit);
                        });
                    }
                }
            })
        };
        let front = Front {
            routes,
            limits: settings.front_limits(),
            websocket: link_websocket_config_with(settings.max_frame_bytes),
            on_upgrade,
            tls: tls.clone(),
        };
        fronts.spawn(http::serve(listener, front, stop_accepting.clone()));
        if let Some(tls) = &tls {
            tasks.spawn(
                tls.clone()
                    .watch(Duration::from_millis(CERTIFICATE_POLL_MS), shutdown.clone()),
            );
        }

        if let Some(listener) = metrics {
            let (h, s, t) = (hub.clone(), shared.clone(), tls.clone());
            let renderer: MetricsRenderer = Arc::new(move || render(&h, &s, t.as_ref()));
            let front: Front<Route> = Front {
                routes: Routes {
                    health: Some(health),
                    metrics: Some(renderer),
                    upgrades: Vec::new(),
                    not_found_hint: None,
                },
                limits: settings.metrics_front_limits(),
                websocket: link_websocket_config_with(settings.max_frame_bytes),
                on_upgrade: Arc::new(|_| {}),
                tls: None,
            };
            fronts.spawn(http::serve(listener, front, stop_accepting.clone()));
        }

        tasks.spawn(links::watch_environments(
            hub.clone(),
            shared.clone(),
            shutdown.clone(),
        ));

        shutdown.cancelled().await;
        tracing::info!("shutting down: closing every link");
        stop_accepting.cancel();
        fronts.close();
        fronts.wait().await;
        hub.shutdown();
        tasks.close();
        if tokio::time::timeout(SHUTDOWN_TIMEOUT, tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!("links still closing after the shutdown timeout; leaving them");
        }
    }
}

/// Renders a running relay's metrics ([`RelayServer::metrics_handle`]).
#[derive(Clone)]
pub struct MetricsHandle {
    hub: RelayHub,
    shared: Arc<Shared>,
    tls: Option<TlsListener>,
}

impl MetricsHandle {
    /// The metrics text now (what `GET /metrics` answers).
    pub fn render(&self) -> String {
        render(&self.hub, &self.shared, self.tls.as_ref())
    }

    /// One series' value (`name{labels}` exactly as rendered), 0 if absent.
    pub fn value(&self, series: &str) -> u64 {
        self.render()
            .lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map_or(0, |v| v as u64)
    }
}

fn figures(hub: &RelayHub, shared: &Shared, tls: Option<&TlsListener>) -> Figures {
    let (listed, ok) = {
        let file = lock(&shared.environments);
        (file.current().len(), file.broken().is_none())
    };
    Figures {
        hub: hub.snapshot(),
        environments_listed: listed,
        environments_file_ok: ok,
        tls: tls.map(|t| t.store().figures()),
        max_client_links: shared.settings.max_client_links,
    }
}

fn render(hub: &RelayHub, shared: &Shared, tls: Option<&TlsListener>) -> String {
    metrics::render(&figures(hub, shared, tls), &shared.stats, &shared.settings)
}

fn status(hub: &RelayHub, shared: &Shared, tls: Option<&TlsListener>) -> String {
    metrics::status(&figures(hub, shared, tls), &shared.settings)
}

/// The URL to print for the bound relay listener (`wss://` when it speaks TLS).
pub fn bound_url(addr: std::net::SocketAddr) -> String {
    format!("ws://{addr}")
}

/// The URL to print for a bound relay listener that speaks TLS.
pub fn bound_tls_url(addr: std::net::SocketAddr) -> String {
    format!("wss://{addr}")
}
