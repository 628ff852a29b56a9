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
//! - Where links run: on the caller's runtime, or with [`RelayServer::with_runtimes`] on the
//!   link runtimes, a client link on its environment link's runtime when it can
//!   (`Shared::homes`, kept by the environment link while it is up).
//! - Logs: a span per link (`env_link{env, peer}`, `client_link{env, peer}`) and, at debug
//!   level, per stream (the hub's). Never key material: only fingerprints.
//!
//! # What it must never do
//!
//! - Look inside a payload or hold a stream key: frames go to the hub, which reads headers.
//! - Await a destination on a link's reader (the hub's invariant); block the runtime on a
//!   lock held across an `.await` (none is).
//!
//! # The path of one frame
//!
//! Client → environment; the other way is the same with the roles swapped.
//!
//! 1. The client link's reader task reads one binary WebSocket message. tungstenite refuses a
//!    message longer than `max_frame_bytes` from its header (the link closes,
//!    `oversized_frame`), so nothing larger is ever buffered.
//! 2. The reader takes the hub's lock once for that message and every one that has already
//!    arrived behind it (`READ_BATCH_BYTES`, `READ_BATCH_FRAMES`), and calls
//!    `Router::handle_frame(now, link, bytes)` for each, in order: decode
//!    the 44-byte header (`frame.rs`) and check its rules; the payload is never looked at.
//!    Malformed frames and frames for streams the link does not hold (ids whose `OPEN` was
//!    refused included) are charged to that link's budgets; past them, that link alone closes.
//! 3. `OPEN`: admission (rate bucket, per-link, per-address-per-environment and per-environment
//!    stream limits, the address's handshake-failure tokens covering its pending `OPEN`s,
//!    relay-wide queued bytes, the environment link's control reserve, the environment online,
//!    the id free)
//!    → a `Route` in the `RoutingTable` and the frame on the environment link's control lane, or
//!    a `RESET` (`busy`, `environment_offline`, …) on the client's. `DATA`: the route's
//!    `RelayFlow` checks it is the next record and inside the receiver's last report (clipped to
//!    `max_window_records`) → queued on the environment link's per-stream `DATA` lane, or the
//!    route is reset (`window_exceeded` / `malformed_frame`) on both links and nothing else is
//!    touched. `ACK`: the report is recorded and the frame coalesced on the destination's `ACK`
//!    lane. `RESET`: the route is removed and the frame queued behind that stream's `DATA`; an
//!    environment's `RESET` answering an `OPEN` with a handshake-failure reason is charged to the
//!    client link and address that sent it (the failure that takes the last token of either
//!    closes that link). Every frame queued for a client link counts, at its memory cost,
//!    against that link's share (`client_link_share_bytes`, all but `DATA`): one that would pass
//!    it closes the link.
//! 4. The router emits `Wake { link }` for the destination; the hub notifies that link's writer
//!    (a `Notify`), releases the lock, and the reader goes back to its socket. **It never waited
//!    for the destination.**
//! 5. The environment link's writer task takes the lock, pops a batch (`WRITE_BATCH_BYTES`:
//!    ping, control, `ACK`s, then `DATA` round robin between streams), releases it, and feeds
//!    each frame to the WebSocket as the message it came in as (no new message, no copy of the
//!    payload before the WebSocket's own write buffer), batch after batch while the router has
//!    more, then flushes, each write under `WRITE_TIMEOUT` (= `pong_timeout_ms`); a write past
//!    it kills that link.
//!
//! # Who owns which queue
//!
//! Every queue in the relay is the router's (`relay/README.md`, "Who owns which queue"): per
//! link a control lane (an environment link's `OPEN`s under the control reserve; on a client
//! link, everything but `DATA` under its share), one coalesced `ACK` per stream, and
//! per-stream `DATA` lanes (each at most one window, by the flow accounting); all lanes
//! together, each frame at its memory cost, under `max_queued_bytes` for new streams. Beside
//! them: tungstenite's write buffer per link (128 KiB plus two frames), the writer's batch,
//! and the HTTP front's pending connections. The server adds no queue of its own: admission
//! happens before a link is registered, and metrics and logs are read from the hub.
//!
//! # Invariants
//!
//! - **It reads frame headers only and holds no stream key**: payloads (handshake messages,
//!   records) are forwarded as the bytes that came in. Its only key admits environments.
//! - **No reader awaits a destination**; a slow link slows only its own writer, and a
//!   well-behaved sender never exceeds what the router will queue for it (one window).
//! - **A stream is reset only for its own fault or its links' death**; a link is closed only for
//!   its own budgets (handshake failures its `OPEN`s caused, its share of the queue), its
//!   keepalive or probe, its write deadline, its idleness or a message that takes too long (a
//!   client link), or a revocation.
//! - **Budgets are charged to whoever spends them**: an environment's handshake-failure answer is
//!   the client's (link and address), never the environment's; an address's pending `OPEN`s
//!   never outnumber its failure tokens.
//! - **An environment is admitted only with the key its line lists, a fresh `ts` (the replay
//!   cache: nothing before the relay's start), and under the environments file's lock**, so no
//!   revoked key keeps or gains a link past one poll; **the live holder of an id keeps it** (a
//!   newcomer is admitted only once the holder fails a probe or is gone).
//! - **The relay's descriptors are counted by construction**: `max_client_links` and
//!   `max_pending_handshakes` are sized at start to leave `descriptor_reserve` and the metrics
//!   listener's share of the (raised) limit free.
//! - **The routing table stays behind `router::RoutingTable`** (a shared fabric for several
//!   relays is a later table); everything else about a route is in the router.
//! - **Labels and log fields are ours**: reasons are fixed enums; the only peer-chosen strings in
//!   logs are the environment id (validated: 1–128 of `A-Z a-z 0-9 - . _ ~`) and stream ids in
//!   hex; keys appear as fingerprints.

pub mod cli;
mod links;
pub mod metrics;
mod pending_env_links;
pub mod runtime_threads;
mod serve;
pub mod settings;

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::cluster::node::ClusterNode;
use crate::cluster::ClusterSpec;
use execrelay_io::descriptors::{nofile_limit, RelayDescriptorPlan};
use execrelay_io::driver::RelayHub;
use execrelay_io::http::AddressSlots;
use execrelay_io::runtimes::LinkRuntimes;
use execrelay_io::tls::TlsListener;
use execrelay_protocol::env_handshake::LinkTimestamps;
use execrelay_protocol::keys::environments::{EnvironmentsFile, Reload};
use execrelay_protocol::keys::{fingerprint, Keypair};
use execrelay_protocol::replay::ReplayCache;
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
pub use crate::RELAY_VERSION;

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
    Descriptors(#[from] execrelay_io::descriptors::TooFewDescriptors),
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
    /// The links among them that have not sent their message 1: one gives its slot up when
    /// every slot is held (`pending_env_links.rs`).
    pub silent_env_links: Arc<pending_env_links::SilentLinks>,
    /// Per environment id, the holder link whose second claimant was last reported (two
    /// exec servers share a key): reported once per holder, not at every redial.
    pub shared_keys_reported:
        Mutex<std::collections::HashMap<String, execrelay_protocol::router::LinkId>>,
    /// The relay's membership of a cluster (`--cluster`), set once at the start of
    /// [`RelayServer::run`]; unset when standalone.
    pub cluster: std::sync::OnceLock<Arc<ClusterNode>>,
    /// Per environment id with a link on a link runtime, that link and its runtime: where its
    /// clients' links go ([`RelayServer::with_runtimes`]). One entry per live environment
    /// link at most (removed when the link ends), so bounded by `max_environments`.
    pub homes:
        Mutex<std::collections::HashMap<String, (execrelay_protocol::router::LinkId, usize)>>,
}

pub(crate) use execrelay_protocol::sync::lock;

/// Microseconds since the Unix epoch now (the link handshake's clock).
pub(crate) fn unix_micros() -> u64 {
    execrelay_protocol::replay::unix_micros(SystemTime::now())
}

impl Shared {
    /// The cluster membership, if any.
    pub(crate) fn cluster(&self) -> Option<&Arc<ClusterNode>> {
        self.cluster.get()
    }

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
    cluster: Option<ClusterSpec>,
    runtimes: Option<LinkRuntimes>,
}

/// What a relay's HTTP front upgrades.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// `/v1/env/ID`.
    Environment,
    /// `/v1/connect/ID`.
    Client,
    /// `/v1/relay/ID` (cluster only): a relay-to-relay link.
    Relay,
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
            silent_env_links: Arc::default(),
            settings,
            stats: ServerStats::default(),
            cluster: std::sync::OnceLock::new(),
            homes: Mutex::new(std::collections::HashMap::new()),
        });
        Ok(RelayServer {
            hub,
            shared,
            tls: None,
            cluster: None,
            runtimes: None,
        })
    }

    /// Join the cluster `spec` when run (`--cluster`): NATS as the directory of the
    /// environments this relay holds, relay-to-relay links for misrouted clients
    /// ([`crate::cluster`]).
    pub fn with_cluster(mut self, spec: ClusterSpec) -> RelayServer {
        self.cluster = Some(spec);
        self
    }

    /// Speak TLS on the links' listener (`wss://`) with `tls`'s certificate, re-read when its
    /// files change (checked every [`CERTIFICATE_POLL_MS`](execrelay_io::tls::CERTIFICATE_POLL_MS) while the relay runs).
    pub fn with_tls(mut self, tls: TlsListener) -> RelayServer {
        self.tls = Some(tls);
        self
    }

    /// Run the links on `runtimes` ([`LinkRuntimes`]; the binary's `--runtime-threads`): each
    /// connection to the links' listener goes to the one running the fewest tasks; a client
    /// link then moves to the runtime of its environment's link, if that one is up (over
    /// `ws://` or the relay's own TLS: the session moves with its socket), so a route's reader
    /// and writer wake each other on one thread; a link's tasks stay where it is. The
    /// listeners, the watchers, the cluster's tasks and the
    /// shutdown sequence stay on the runtime that runs [`run`](Self::run). Without it every
    /// link runs there too. The caller stops `runtimes` after `run` returns
    /// ([`LinkRuntimes::shutdown`]): by then every link has ended.
    pub fn with_runtimes(mut self, runtimes: LinkRuntimes) -> RelayServer {
        self.runtimes = Some(runtimes);
        self
    }

    /// The cluster this relay joins when run ([`with_cluster`](Self::with_cluster)).
    pub fn cluster(&self) -> Option<&ClusterSpec> {
        self.cluster.as_ref()
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
        self.metrics_handle().render()
    }

    /// The `/status` document now.
    pub fn render_status(&self) -> String {
        self.metrics_handle().status()
    }

    /// A handle that renders this relay's metrics while it runs (for embedders and tests
    /// without a metrics listener).
    pub fn metrics_handle(&self) -> MetricsHandle {
        MetricsHandle {
            hub: self.hub.clone(),
            shared: self.shared.clone(),
            tls: self.tls.clone(),
            runtimes: self.runtimes.clone(),
        }
    }
}

/// Renders a running relay's metrics ([`RelayServer::metrics_handle`]).
#[derive(Clone)]
pub struct MetricsHandle {
    hub: RelayHub,
    shared: Arc<Shared>,
    tls: Option<TlsListener>,
    runtimes: Option<LinkRuntimes>,
}

impl MetricsHandle {
    /// The metrics text now (what `GET /metrics` answers).
    pub fn render(&self) -> String {
        metrics::render(&self.figures(), &self.shared.stats, &self.shared.settings)
    }

    /// The `/status` document now.
    pub fn status(&self) -> String {
        metrics::status(&self.figures(), &self.shared.settings)
    }

    /// One series' value (`name{labels}` exactly as rendered), 0 if absent.
    pub fn value(&self, series: &str) -> u64 {
        self.render()
            .lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map_or(0, |v| v as u64)
    }

    fn figures(&self) -> Figures {
        let (hub, shared) = (&self.hub, &self.shared);
        let (listed, ok) = {
            let file = lock(&shared.environments);
            (file.current().len(), file.broken().is_none())
        };
        Figures {
            hub: hub.snapshot(),
            environments_listed: listed,
            environments_file_ok: ok,
            tls: self.tls.as_ref().map(|t| t.store().figures()),
            max_client_links: shared.settings.max_client_links,
            cluster: shared.cluster().map(|c| cluster_figures(hub, c)),
            runtimes: self
                .runtimes
                .as_ref()
                .map(LinkRuntimes::figures)
                .unwrap_or_default(),
        }
    }
}

fn cluster_figures(hub: &RelayHub, c: &ClusterNode) -> metrics::ClusterFigures {
    use std::sync::atomic::Ordering::Relaxed;
    let s = &c.stats;
    metrics::ClusterFigures {
        directory_up: c.directory_up(),
        held: c.holdings(),
        forwarding_links: c.forwards(),
        forwarded: hub.forwarded(),
        lookups: s.lookups.load(Relaxed),
        lookup_misses: s.lookup_misses.load(Relaxed),
        lookup_failures: s.lookup_failures.load(Relaxed),
        lookups_answered: s.lookups_answered.load(Relaxed),
        forward_links: s.forward_links.load(Relaxed),
        forward_failures: s.forward_failures.load(Relaxed),
        relay_links_admitted: s.relay_links_admitted.load(Relaxed),
        relay_links_refused: s.relay_links_refused.load(Relaxed),
        takeovers: s.takeovers.load(Relaxed),
        moves: s.moves.load(Relaxed),
        front_header_ignored: s.front_header_ignored.load(Relaxed),
    }
}

/// The URL to print for the bound relay listener (`wss://` when it speaks TLS).
pub fn bound_url(addr: std::net::SocketAddr) -> String {
    format!("ws://{addr}")
}

/// The URL to print for a bound relay listener that speaks TLS.
pub fn bound_tls_url(addr: std::net::SocketAddr) -> String {
    format!("wss://{addr}")
}
