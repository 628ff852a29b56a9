//! The composition root: [`compose`] builds every exec server of this process (network and
//! in-process, `local.rs`); [`Server::run`] (and [`run`]) owns every listener of one network
//! server, its [`SessionRegistry`], and the one shutdown sequence.
//!
//! # What this module owns
//!
//! - **The listeners** ([`Listener`]): stdio (one connection; its end ends the server), plain
//!   `ws://` (one `ConnectionProcessor` per WebSocket, at most `max_connections`),
//!   `noise+ws://` (one link driver per physical link on `/v1/link`, at most `max_links`), the
//!   environment link to a relay (`Listener::Relay`: dialled, redialled with backoff), the
//!   metrics endpoint and the health endpoint (`/readyz`, `/livez`, `/status`, also on the
//!   metrics endpoint: ready while accepting and, with a relay link, while it is up); every
//!   TCP listener is an HTTP front (`execrelay_io::http`) whose
//!   routes and upgrade hand-off are wired here. A new kind is one more [`Listener`] variant
//!   and one more arm in [`Server::run`].
//! - **Process containment at start** ([`start_containment`]): the backend (a cgroup per
//!   session where the server may create one), the crash sweep of instances left by a server
//!   that died, and the subreaper, all before the first spawn.
//! - **The shutdown sequence**, once for all listeners: stop accepting (abandon handshakes),
//!   terminate every process and let exit notices reach attached clients (bounded by the
//!   server's caps), kill everything any session started, end every connection and link and
//!   wait for their tasks, close every session.
//! - Parsing `--listen` and the URLs printed for bound listeners.
//!
//! # What it must never do
//!
//! - Hold protocol logic: connections, links, sessions and HTTP are their modules' business.
//! - Print: binding and printing the bound URL belong to the binary (`cli/serve.rs`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use execrelay_io::driver::link_websocket_config;
use execrelay_io::http::{
    self, Front, FrontStream, Health, MetricsRenderer, OnUpgrade, PathPattern, Routes, Upgrade,
    UpgradeRoute, REPLY_TIMEOUT_MS,
};
use execrelay_protocol::websocket::Role;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::WebSocketStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::bounds::give_back::{give_back, GIVE_BACK_CHECK_MS};
use crate::bounds::{DescriptorReserve, GiveBack};
use crate::config::{ServerConfig, SHUTDOWN_DELIVERY_GRACE_MS};
use crate::connection::{ConnectionOptions, ConnectionProcessor};
use crate::link::environment::{run_environment, RelayDial};
use crate::link::health::EnvironmentHealth;
use crate::link::key_quota::StreamsPerKey;
use crate::link::server::{
    keepalive_config, run_link, LinkContext, LinkPeer, NoiseServerConfig, LINK_PATH,
};
use crate::metrics::Metrics;
use crate::noise::timestamp::{hello_timestamps, SharedHelloTimestamps};
use crate::policy::PolicyFile;
pub use crate::process::containment::{start_containment, StartError};

mod local;
use crate::session::SessionRegistry;
use crate::transport::stdio::stdio_transport;
use crate::transport::websocket::{framed_with_keepalive, websocket_config};
pub use local::LocalServer;

/// The body of the `404` a WebSocket upgrade on another path gets from a `noise+ws://`
/// listener: a client that dialled it with `ws://` or `relay+ws://` learns what to use.
pub const NOISE_SERVER_HINT: &str =
    "this is an execrelay exec server speaking Noise; use noise+ws://HOST:PORT";

/// Where to listen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    /// The server's own stdin/stdout.
    Stdio,
    /// Plain WebSocket.
    Ws(SocketAddr),
    /// Noise-encrypted physical links (`/v1/link`).
    Noise(SocketAddr),
}

/// A listen address that cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ListenError {
    /// Not `stdio`, `ws://HOST:PORT` nor `noise+ws://HOST:PORT`.
    #[error("unsupported --listen {0:?}: expected stdio, ws://HOST:PORT or noise+ws://HOST:PORT")]
    Unsupported(String),
    /// Plain text off loopback without the danger flag.
    #[error(
        "refusing to serve plain ws:// on non-loopback address {0}: use a loopback address, or pass --danger-plaintext if you really mean it"
    )]
    NotLoopback(SocketAddr),
}

/// Parse `--listen`. A non-loopback plain address is refused unless `danger_plaintext`.
pub fn parse_listen(s: &str, danger_plaintext: bool) -> Result<ListenAddr, ListenError> {
    if s == "stdio" {
        return Ok(ListenAddr::Stdio);
    }
    if let Some(rest) = s.strip_prefix("noise+ws://") {
        let addr: SocketAddr = rest
            .trim_end_matches('/')
            .replace("localhost", "127.0.0.1")
            .parse()
            .map_err(|_| ListenError::Unsupported(s.to_string()))?;
        // Encrypted and authenticated: any address is fine.
        return Ok(ListenAddr::Noise(addr));
    }
    let rest = s
        .strip_prefix("ws://")
        .ok_or_else(|| ListenError::Unsupported(s.to_string()))?;
    let hostport = rest.trim_end_matches('/');
    let addr: SocketAddr = hostport
        .replace("localhost", "127.0.0.1")
        .parse()
        .map_err(|_| ListenError::Unsupported(s.to_string()))?;
    if !addr.ip().is_loopback() && !danger_plaintext {
        return Err(ListenError::NotLoopback(addr));
    }
    Ok(ListenAddr::Ws(addr))
}

/// One listener of a server, bound by the caller.
pub enum Listener {
    /// The server's own stdin/stdout: one connection; when it ends, the server shuts down.
    Stdio,
    /// Plain WebSocket (`ws://`): one JSON-RPC connection per WebSocket, on any path.
    Ws(TcpListener),
    /// Noise physical links (`noise+ws://`, path `/v1/link`).
    Noise(TcpListener, Arc<NoiseServerConfig>),
    /// The Prometheus endpoint (`GET /metrics`), with the health routes (`/readyz`,
    /// `/livez`, `/status`).
    Metrics(TcpListener),
    /// The health routes alone (`--health-listen`): `/readyz`, `/livez`, `/status`.
    Health(TcpListener),
    /// The environment link: dial a relay and keep one link up (`serve --relay`), serving
    /// its streams as a `noise+ws://` listener serves its links' (`secure-transport.md` §6).
    Relay(RelayDial, Arc<NoiseServerConfig>),
}

/// What the server's HTTP fronts upgrade.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// A JSON-RPC connection over plain WebSocket.
    JsonRpc,
    /// A Noise physical link.
    Link,
}

/// The composition root of every exec server of this process, network (`execrelay serve`,
/// [`Server`]) or in-process (`Client::in_process`, [`LocalServer`]): containment started
/// first ([`start_containment`]: the backend of `config`, the crash sweep, the subreaper),
/// then its own [`Metrics`] and the [`SessionRegistry`] that is handed both (the registry
/// builds neither). `execrelay demo` runs `execrelay serve`, so it is composed here too.
pub fn compose(
    config: Arc<ServerConfig>,
    policy: Option<Arc<PolicyFile>>,
) -> Result<Arc<SessionRegistry>, StartError> {
    let containment = start_containment(&config)?;
    crate::process::spawn::open_shared_stdin();
    Ok(SessionRegistry::with_exec_policy(
        config,
        Arc::new(Metrics::new()),
        containment,
        policy,
    ))
}

/// One exec server: its registry, before and while it runs.
pub struct Server {
    registry: Arc<SessionRegistry>,
}

/// Serve `listeners` with `config` until `shutdown` fires (or the stdio connection ends), then
/// run the shutdown sequence and return. See [`Server::new`] and [`Server::run`].
pub async fn run(
    listeners: Vec<Listener>,
    config: Arc<ServerConfig>,
    shutdown: CancellationToken,
) -> Result<(), StartError> {
    Server::new(config)?.run(listeners, shutdown).await;
    Ok(())
}

impl Server {
    /// A server with a fresh registry, its own [`Metrics`] and its containment (built here,
    /// the composition root, and passed in: the registry builds neither). Fails when the
    /// containment cannot start ([`start_containment`]).
    pub fn new(config: Arc<ServerConfig>) -> Result<Server, StartError> {
        Self::with_exec_policy(config, None)
    }

    /// A server whose starts go through the exec policy `policy` (`--exec-policy`, loaded and
    /// checked by the caller); see [`new`](Self::new).
    pub fn with_exec_policy(
        config: Arc<ServerConfig>,
        policy: Option<Arc<PolicyFile>>,
    ) -> Result<Server, StartError> {
        Ok(Server {
            registry: compose(config, policy)?,
        })
    }

    /// The registry (tests and embedders read its sessions and metrics).
    pub fn registry(&self) -> &Arc<SessionRegistry> {
        &self.registry
    }

    /// Serve every listener until `shutdown` fires or the stdio connection (if any) ends;
    /// then, once for all of them:
    ///
    /// 1. stop accepting and abandon connections not yet upgraded;
    /// 2. terminate every process and wait, bounded by the server's caps, until exit notices
    ///    have reached attached clients, then kill everything any session started
    ///    ([`SessionRegistry::shutdown`], [`SHUTDOWN_DELIVERY_GRACE_MS`]);
    /// 3. end every connection and link, and wait for their tasks;
    /// 4. close every session and wait until each has ended.
    pub async fn run(self, listeners: Vec<Listener>, shutdown: CancellationToken) {
        let registry = self.registry;
        let config = registry.config().clone();
        // Fronts stop accepting on it.
        let stop_accepting = CancellationToken::new();
        // Connections and links end on it, after the exit notices are out.
        let conn_shutdown = CancellationToken::new();
        // Set when the stdio connection ends on its own.
        let stdio_ended = CancellationToken::new();
        let fronts = TaskTracker::new();
        let tasks = TaskTracker::new();
        let connections = Arc::new(Semaphore::new(config.max_connections));
        let links = Arc::new(Semaphore::new(config.max_links));
        // The environment link's health, if the server has one: `/readyz` follows it.
        let environment = listeners.iter().find_map(|l| match l {
            Listener::Relay(dial, _) => Some(EnvironmentHealth::new(
                &dial.relay_url,
                &dial.env_id,
                registry.metrics().clone(),
            )),
            _ => None,
        });
        let health = server_health(&registry, environment.clone(), stop_accepting.clone());
        tasks.spawn(give_back_memory(registry.clone(), conn_shutdown.clone()));
        // One table for every listener: a key's streams count over all its links.
        let streams_per_key = StreamsPerKey::new(config.max_streams_per_key);
        for listener in listeners {
            match listener {
                Listener::Stdio => {
                    let transport = stdio_transport(config.max_message_bytes);
                    let options = ConnectionOptions {
                        close_session_on_end: true,
                        answer_after_eof: true,
                        ..ConnectionOptions::default()
                    };
                    let (registry, stop, ended) =
                        (registry.clone(), conn_shutdown.clone(), stdio_ended.clone());
                    tasks.spawn(async move {
                        ConnectionProcessor::run(transport, registry, options, stop).await;
                        ended.cancel();
                    });
                }
                Listener::Ws(listener) => {
                    let routes = Routes {
                        health: Health::always(),
                        metrics: None,
                        // Every path is served: no hint needed.
                        not_found_hint: None,
                        upgrades: vec![UpgradeRoute {
                            path: PathPattern::Any,
                            route: Route::JsonRpc,
                            capacity: Some(connections.clone()),
                        }],
                    };
                    let (registry, stop, spawner) =
                        (registry.clone(), conn_shutdown.clone(), tasks.clone());
                    let max = config.max_message_bytes;
                    // The server pings every plain WebSocket too (§6.4).
                    let keepalive = keepalive_config(&config);
                    let idle = config.idle_connection_timeout();
                    let reserve = DescriptorReserve::new(config.descriptor_reserve);
                    let on_upgrade: OnUpgrade<Route> = Arc::new(move |up: Upgrade<Route>| {
                        let Some(ws) = admit_descriptors(&reserve, &spawner, up.ws, up.peer) else {
                            return;
                        };
                        let transport = framed_with_keepalive(
                            ws,
                            Role::Server,
                            max,
                            up.peer.to_string(),
                            Some(keepalive),
                        );
                        let (registry, stop, permit) = (registry.clone(), stop.clone(), up.permit);
                        let options = ConnectionOptions {
                            peer_addr: Some(up.peer.ip()),
                            idle_timeout: Some(idle),
                            ..ConnectionOptions::default()
                        };
                        spawner.spawn(async move {
                            ConnectionProcessor::run(transport, registry, options, stop).await;
                            // The slot of `max_connections` is free once the connection ends.
                            drop(permit);
                        });
                    });
                    let front = Front {
                        routes,
                        limits: config.websocket_front_limits(),
                        websocket: websocket_config(max),
                        on_upgrade,
                        tls: None,
                    };
                    fronts.spawn(http::serve(listener, front, stop_accepting.clone()));
                }
                Listener::Noise(listener, noise) => {
                    let routes = Routes {
                        health: Health::always(),
                        metrics: None,
                        not_found_hint: Some(NOISE_SERVER_HINT),
                        upgrades: vec![UpgradeRoute {
                            path: PathPattern::Exact(LINK_PATH),
                            route: Route::Link,
                            capacity: Some(links.clone()),
                        }],
                    };
                    // Message-1 timestamps, shared by every link of the listener: a message 1
                    // replayed on another link is refused too.
                    let timestamps: SharedHelloTimestamps = hello_timestamps(&config);
                    let ctx = LinkContext {
                        noise,
                        registry: registry.clone(),
                        timestamps,
                        streams_per_key: streams_per_key.clone(),
                        shutdown: conn_shutdown.clone(),
                        tasks: tasks.clone(),
                    };
                    let reserve = DescriptorReserve::new(config.descriptor_reserve);
                    let on_upgrade: OnUpgrade<Route> = Arc::new(move |up: Upgrade<Route>| {
                        let Some(ws) = admit_descriptors(&reserve, &ctx.tasks, up.ws, up.peer)
                        else {
                            return;
                        };
                        let span = tracing::info_span!("link", peer = %up.peer);
                        // A direct link is one client's: its address counts toward the
                        // quotas, it closes when idle, and an empty handshake budget closes it.
                        let link = run_link(ws, LinkPeer::Direct(up.peer), ctx.clone());
                        let permit = up.permit;
                        ctx.tasks.spawn(
                            async move {
                                link.await;
                                // The slot of `max_links` is free once the link ends.
                                drop(permit);
                            }
                            .instrument(span),
                        );
                    });
                    let front = Front {
                        routes,
                        limits: config.websocket_front_limits(),
                        websocket: link_websocket_config(),
                        on_upgrade,
                        tls: None,
                    };
                    fronts.spawn(http::serve(listener, front, stop_accepting.clone()));
                }
                Listener::Relay(dial, noise) => {
                    let ctx = LinkContext {
                        noise,
                        registry: registry.clone(),
                        // Its own table: the environment link is a listener of its own.
                        timestamps: hello_timestamps(&config),
                        streams_per_key: streams_per_key.clone(),
                        shutdown: conn_shutdown.clone(),
                        tasks: tasks.clone(),
                    };
                    let health = match &environment {
                        Some(h) => h.clone(),
                        None => EnvironmentHealth::new(
                            &dial.relay_url,
                            &dial.env_id,
                            registry.metrics().clone(),
                        ),
                    };
                    // Redialling stops with accepting; the link up ends with the connections.
                    tasks.spawn(run_environment(dial, ctx, health, stop_accepting.clone()));
                }
                Listener::Metrics(listener) => {
                    let reg = registry.clone();
                    let render: MetricsRenderer =
                        Arc::new(move || reg.metrics().render(&reg.stats()));
                    let front: Front<Route> = Front {
                        routes: Routes {
                            health: Some(health.clone()),
                            metrics: Some(render),
                            upgrades: Vec::new(),
                            not_found_hint: None,
                        },
                        limits: config.metrics_front_limits(),
                        websocket: websocket_config(config.max_message_bytes),
                        on_upgrade: Arc::new(|_| {}),
                        tls: None,
                    };
                    fronts.spawn(http::serve(listener, front, stop_accepting.clone()));
                }
                Listener::Health(listener) => {
                    let front: Front<Route> = Front {
                        routes: Routes {
                            health: Some(health.clone()),
                            metrics: None,
                            not_found_hint: None,
                            upgrades: Vec::new(),
                        },
                        limits: config.metrics_front_limits(),
                        websocket: websocket_config(config.max_message_bytes),
                        on_upgrade: Arc::new(|_| {}),
                        tls: None,
                    };
                    fronts.spawn(http::serve(listener, front, stop_accepting.clone()));
                }
            }
        }

        tokio::select! {
            () = shutdown.cancelled() => {}
            () = stdio_ended.cancelled() => {}
        }
        // 1. No new connections; handshakes in progress are abandoned.
        stop_accepting.cancel();
        fronts.close();
        fronts.wait().await;
        // 2. Terminate every process; exit notices reach attached clients (bounded by the
        //    caps); then everything any session started is killed.
        tracing::info!("shutting down: terminating processes");
        registry
            .shutdown(Duration::from_millis(SHUTDOWN_DELIVERY_GRACE_MS))
            .await;
        // 3. End every connection and link once their notices are written; wait for them.
        conn_shutdown.cancel();
        tasks.close();
        tasks.wait().await;
        // 4. Every session is closed (nothing of theirs is left running) and its scope removed.
        registry.close_all().await;
    }
}

/// Hand the memory the allocator keeps back to the system after a burst of output, and when
/// the server becomes idle (`bounds::give_back`), until `stop`.
async fn give_back_memory(registry: Arc<SessionRegistry>, stop: CancellationToken) {
    let mut rule = GiveBack::new();
    let every = Duration::from_millis(GIVE_BACK_CHECK_MS);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        let st = registry.stats();
        let idle = st.sessions_attached + st.sessions_detached == 0;
        if rule.observe(st.retained_output_bytes as u64, idle) {
            // Off the runtime's threads: it walks every arena of the allocator.
            let _ = tokio::task::spawn_blocking(give_back).await;
            tracing::debug!(idle, "memory handed back to the system");
        }
    }
}

/// The health routes of the metrics and health listeners: ready while the server accepts
/// (not shutting down) and, with an environment link, while that link is up and
/// authenticated; `/status` from the registry, the metrics' gauges and the link's health.
fn server_health(
    registry: &Arc<SessionRegistry>,
    environment: Option<Arc<EnvironmentHealth>>,
    stopping: CancellationToken,
) -> Health {
    let ready = {
        let (environment, stopping) = (environment.clone(), stopping.clone());
        move || -> Result<(), String> {
            if stopping.is_cancelled() {
                return Err("shutting down".into());
            }
            match &environment {
                Some(h) => h.readiness(),
                None => Ok(()),
            }
        }
    };
    let status = {
        let (registry, ready) = (registry.clone(), ready.clone());
        move || status_document(&registry, environment.as_deref(), ready()).to_string()
    };
    Health {
        ready: Some(Arc::new(ready)),
        status: Some(Arc::new(status)),
    }
}

/// The `/status` document: what the server holds now, against its limits.
fn status_document(
    registry: &SessionRegistry,
    environment: Option<&EnvironmentHealth>,
    ready: Result<(), String>,
) -> serde_json::Value {
    let st = registry.stats();
    let config = registry.config();
    let metrics = registry.metrics();
    let budget = registry.output_budget();
    serde_json::json!({
        "version": env!("CARGO_PKG_VERSION"),
        "uptime_seconds": registry.uptime().as_secs(),
        "ready": ready.is_ok(),
        "not_ready_reason": ready.err(),
        "sessions": {
            "attached": st.sessions_attached,
            "detached": st.sessions_detached,
            "limit": config.max_sessions,
        },
        "processes": {
            "running": st.processes_running,
            "exited": st.processes_exited,
            "largest_session": st.largest_session_processes,
            "limit_per_session": config.max_processes,
        },
        "connections": {
            "open": metrics.connections.get(),
            "limit": config.max_connections,
        },
        "links": {
            "open": metrics.noise_links.get(),
            "streams": metrics.noise_streams.get(),
            "limit": config.max_links,
        },
        "output": {
            "retained_bytes": st.retained_output_bytes,
            "unwritten_bytes": budget.unwritten(),
            "budget_bytes": config.output_budget_bytes,
        },
        "environment_link": environment.map(EnvironmentHealth::status),
    })
}

/// Admit an upgraded connection or link only while more than the descriptor reserve is
/// free; otherwise close it at once with `1013` ("try again later"), so that
/// connections run out before a spawn can fail for want of a descriptor. The WebSocket is
/// handed back when admitted.
fn admit_descriptors(
    reserve: &DescriptorReserve,
    tasks: &TaskTracker,
    ws: WebSocketStream<FrontStream>,
    peer: SocketAddr,
) -> Option<WebSocketStream<FrontStream>> {
    let Err(low) = reserve.check() else {
        return Some(ws);
    };
    tracing::warn!(%peer, "connection refused: {low}");
    let mut ws = ws;
    tasks.spawn(async move {
        let close = CloseFrame {
            code: CloseCode::Again,
            reason: "server is low on file descriptors".into(),
        };
        // A peer that does not read its close frame does not hold the socket longer.
        let reply = Duration::from_millis(REPLY_TIMEOUT_MS);
        let _ = tokio::time::timeout(reply, ws.close(Some(close))).await;
    });
    None
}

/// The URL to print for a bound listener.
pub fn bound_url(addr: SocketAddr) -> String {
    format!("ws://{addr}")
}

/// The URL to print for a bound Noise listener.
pub fn bound_noise_url(addr: SocketAddr) -> String {
    format!("noise+ws://{addr}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses() {
        assert_eq!(parse_listen("stdio", false).unwrap(), ListenAddr::Stdio);
        assert!(matches!(
            parse_listen("ws://127.0.0.1:0", false).unwrap(),
            ListenAddr::Ws(_)
        ));
        assert!(matches!(
            parse_listen("ws://0.0.0.0:80", false),
            Err(ListenError::NotLoopback(_))
        ));
        assert!(parse_listen("ws://0.0.0.0:80", true).is_ok());
        assert!(parse_listen("tcp://127.0.0.1:1", false).is_err());
    }
}
