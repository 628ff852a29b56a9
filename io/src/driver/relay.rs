//! The relay's links: one [`Router`] shared by every link of the relay, each link driven by
//! the common I/O loop. The reader of a link hands frames to the router, which queues them on
//! their destination links and says whose writer to wake; it never waits for a destination.
//!
//! ```text
//! let hub = RelayHub::new(cfg)?;
//! // after the HTTP upgrade of /v1/env/ID and the handshake on stream id 0 (§6.2):
//! tokio::spawn(async move { hub.serve_environment(ws, &id).await });
//! // after the upgrade of /v1/connect/ID:
//! tokio::spawn(async move { hub.serve_client(ws, &id, peer_ip).await });
//! // environments file changed and ID is gone:
//! hub.remove_environment(&id);
//! ```
//!
//! Registration and serving can be split ([`RelayHub::add_environment`] then
//! [`PendingLink::serve`]) so that a caller can register a link atomically with its own
//! checks (the relay server registers an environment under the lock of its environments file,
//! so a revocation cannot slip between the admission and the registration).
//!
//! Logs: every stream of a client link gets a `stream` span (debug level, child of the span
//! the link was served in) that lives as long as the route; its events say when it opened,
//! was accepted, refused or reset and why. When debug logs are off, nothing is kept.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::WebSocketStream;
use tracing::Span;

use super::{now, run_io, seed, Arrivals, LinkCore, LinkSignals, LinkSocket, ReadAhead};
use execrelay_protocol::batch::Batch;
use execrelay_protocol::config::{ConfigError, RelayConfig};
use execrelay_protocol::frame::StreamId;
use execrelay_protocol::reason::{CloseReason, Counters};
use execrelay_protocol::router::{
    AddLinkError, LinkId, LinkKind, MemoryTable, Router, RouterEvent, RoutingTable, StreamChange,
};
use execrelay_protocol::sync::lock;
use execrelay_protocol::transmit::Transmit;

/// A link the hub drives: how to wake and close it, and the span it is served in.
struct HubLinkState {
    signals: Arc<LinkSignals>,
    span: Span,
    /// Those waiting for the link to answer a probe ([`RelayHub::probe`]): told `()` when it
    /// does, dropped when the link ends.
    probes: Vec<tokio::sync::oneshot::Sender<()>>,
}

struct HubInner<T: RoutingTable> {
    router: Router<T>,
    links: HashMap<LinkId, HubLinkState>,
    /// The `stream` span of each routed stream, while debug logs are on.
    streams: HashMap<(LinkId, StreamId), Span>,
}

/// `0123…` (32 hex digits): a stream id in logs. Ids are random and carry nothing secret.
fn hex_id(id: &StreamId) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

impl<T: RoutingTable> HubInner<T> {
    fn stream_changed(&mut self, client: LinkId, stream: StreamId, change: StreamChange) {
        let key = (client, stream);
        let span = match change {
            StreamChange::Opened => {
                let parent = self.links.get(&client).map(|l| l.span.clone());
                let span = match parent {
                    Some(p) => tracing::debug_span!(parent: &p, "stream", id = %hex_id(&stream)),
                    None => tracing::debug_span!("stream", id = %hex_id(&stream)),
                };
                if span.is_disabled() {
                    return;
                }
                self.streams.insert(key, span.clone());
                span
            }
            StreamChange::Accepted => match self.streams.get(&key) {
                Some(s) => s.clone(),
                None => return,
            },
            StreamChange::Refused(_) => {
                let parent = self.links.get(&client).map(|l| l.span.clone());
                match parent {
                    Some(p) => tracing::debug_span!(parent: &p, "stream", id = %hex_id(&stream)),
                    None => return,
                }
            }
            StreamChange::Reset(_) | StreamChange::PeerReset { .. } => {
                match self.streams.remove(&key) {
                    Some(s) => s,
                    None => return,
                }
            }
        };
        let _in = span.enter();
        match change {
            StreamChange::Opened => tracing::debug!("OPEN routed to the environment"),
            StreamChange::Accepted => tracing::debug!("ACCEPT routed to the client"),
            StreamChange::Refused(reason) => tracing::debug!(%reason, "OPEN refused"),
            StreamChange::Reset(reason) => tracing::debug!(%reason, "stream reset by the relay"),
            StreamChange::PeerReset { from } => {
                let from = match from {
                    LinkKind::Client => "client",
                    LinkKind::Environment => "environment",
                };
                tracing::debug!(from, "stream reset by one end; forwarded")
            }
        }
    }
}

struct HubShared<T: RoutingTable> {
    inner: Mutex<HubInner<T>>,
}

impl<T: RoutingTable> HubShared<T> {
    /// Run `f` on the router, then wake the writers it names and close the links it closed.
    fn with<R>(&self, f: impl FnOnce(&mut Router<T>) -> R) -> R {
        let mut inner = lock(&self.inner);
        // Inputs without a `now` of their own (a link's end, a revocation) act at this time.
        inner.router.tick(now());
        let r = f(&mut inner.router);
        while let Some(ev) = inner.router.poll_event() {
            match ev {
                RouterEvent::Wake { link } => {
                    if let Some(s) = inner.links.get(&link) {
                        s.signals.writer.notify_one();
                    }
                }
                RouterEvent::Close { link, reason } => {
                    if let Some(s) = inner.links.get_mut(&link) {
                        s.signals.close(reason);
                        // Dead: whoever waits for its answer learns it at once.
                        s.probes.clear();
                    }
                }
                RouterEvent::Rearm { link } => {
                    if let Some(s) = inner.links.get(&link) {
                        s.signals.timer.notify_one();
                    }
                }
                RouterEvent::ProbeAnswered { link } => {
                    if let Some(s) = inner.links.get_mut(&link) {
                        for p in s.probes.drain(..) {
                            let _ = p.send(());
                        }
                    }
                }
                RouterEvent::Stream {
                    client,
                    stream,
                    change,
                } => inner.stream_changed(client, stream, change),
            }
        }
        r
    }
}

/// Figures of a relay at one instant, for metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelaySnapshot {
    /// Live links (client and environment).
    pub links: usize,
    /// Environments with a link (each has exactly one environment link).
    pub environments: usize,
    /// Routed streams.
    pub streams: usize,
    /// Bytes queued on every link together.
    pub queued_bytes: usize,
    /// The deepest single link's queue, in bytes.
    pub deepest_link_queue_bytes: usize,
    /// Resets, drops, closes and frames so far.
    pub counters: Counters,
}

/// A relay: the routing core and the driver of each of its links. Cloning shares it.
pub struct RelayHub<T: RoutingTable + 'static = MemoryTable> {
    shared: Arc<HubShared<T>>,
}

impl<T: RoutingTable + 'static> Clone for RelayHub<T> {
    fn clone(&self) -> Self {
        RelayHub {
            shared: self.shared.clone(),
        }
    }
}

impl RelayHub<MemoryTable> {
    /// A relay with an in-memory routing table.
    pub fn new(cfg: RelayConfig) -> Result<Self, ConfigError> {
        RelayHub::with_table(cfg, MemoryTable::default())
    }
}

impl<T: RoutingTable + 'static> RelayHub<T> {
    /// A relay over `table`.
    pub fn with_table(cfg: RelayConfig, table: T) -> Result<Self, ConfigError> {
        Ok(RelayHub {
            shared: Arc::new(HubShared {
                inner: Mutex::new(HubInner {
                    router: Router::with_table(cfg, table)?,
                    links: HashMap::new(),
                    streams: HashMap::new(),
                }),
            }),
        })
    }

    /// Serve an environment link whose handshake on stream id 0 succeeded, until it ends
    /// (refused while another live link holds the id). Returns why it ended.
    pub async fn serve_environment<S>(
        &self,
        ws: WebSocketStream<ReadAhead<S>>,
        env: &str,
    ) -> Result<CloseReason, AddLinkError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        Ok(self.add_environment(env)?.serve(ws).await)
    }

    /// Serve a client link for environment `env` from `addr`, until it ends.
    pub async fn serve_client<S>(
        &self,
        ws: WebSocketStream<ReadAhead<S>>,
        env: &str,
        addr: IpAddr,
    ) -> Result<CloseReason, AddLinkError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        Ok(self.add_client(env, addr)?.serve(ws).await)
    }

    /// Register an environment link (its handshake succeeded) now; serve it with
    /// [`PendingLink::serve`]. Frames routed to it meanwhile wait in its queue. Dropping the
    /// [`PendingLink`] unserved closes it. While another link holds the id this is refused
    /// ([`AddLinkError::Held`]): [`probe`](Self::probe) the holder, and try again if it did
    /// not answer (it is closed then).
    pub fn add_environment(&self, env: &str) -> Result<PendingLink<T>, AddLinkError> {
        let seed = seed();
        let id = self
            .shared
            .with(|r| r.add_environment_link(now(), env, seed))?;
        Ok(self.pending(id))
    }

    /// Register a client link for environment `env` from `addr` now; serve it with
    /// [`PendingLink::serve`].
    pub fn add_client(&self, env: &str, addr: IpAddr) -> Result<PendingLink<T>, AddLinkError> {
        let seed = seed();
        let id = self
            .shared
            .with(|r| r.add_client_link(now(), env, addr, seed))?;
        Ok(self.pending(id))
    }

    fn pending(&self, id: LinkId) -> PendingLink<T> {
        let signals = Arc::new(LinkSignals::new());
        let mut inner = lock(&self.shared.inner);
        inner.links.insert(
            id,
            HubLinkState {
                signals: signals.clone(),
                span: Span::current(),
                probes: Vec::new(),
            },
        );
        PendingLink {
            hub: self.shared.clone(),
            id,
            signals,
            served: false,
        }
    }

    /// Register the forwarding side of a relay-to-relay link for `env` (cluster): it takes the
    /// place of the environment's link here ([`Router::add_forward_environment_link`]).
    pub fn add_forward_environment(&self, env: &str) -> Result<PendingLink<T>, AddLinkError> {
        let seed = seed();
        let id = self
            .shared
            .with(|r| r.add_forward_environment_link(now(), env, seed))?;
        Ok(self.pending(id))
    }

    /// Register the holder's side of a relay-to-relay link for `env` (cluster): one more
    /// client link, without per-address limits ([`Router::add_relay_client_link`]).
    pub fn add_relay_client(&self, env: &str) -> PendingLink<T> {
        let seed = seed();
        let id = self
            .shared
            .with(|r| r.add_relay_client_link(now(), env, seed));
        self.pending(id)
    }

    /// The link holding `env`'s id here (an environment link or a forwarding relay link).
    pub fn environment_link(&self, env: &str) -> Option<LinkId> {
        lock(&self.shared.inner).router.environment_link(env)
    }

    /// Close `env`'s environment link with `reason`; false if it has none.
    pub fn close_environment(&self, env: &str, reason: CloseReason) -> bool {
        self.shared.with(|r| r.close_environment(env, reason))
    }

    /// Close every client link of `env` with `reason`, relay-to-relay links included; how
    /// many.
    pub fn close_clients(&self, env: &str, reason: CloseReason) -> usize {
        self.shared.with(|r| r.close_clients(env, reason))
    }

    /// How many client links `env` has here.
    pub fn client_link_count(&self, env: &str) -> usize {
        lock(&self.shared.inner).router.client_link_count(env)
    }

    /// Traffic across relay-to-relay links so far.
    pub fn forwarded(&self) -> execrelay_protocol::router::Forwarded {
        lock(&self.shared.inner).router.forwarded()
    }

    /// The environment is no longer listed: its link closes at once, its streams reset.
    pub fn remove_environment(&self, env: &str) {
        self.shared.with(|r| r.remove_environment(env));
    }

    /// Ask `link` for proof of life ([`Router::probe`]): true once it answers, false if it
    /// closes first (it does at the probe timeout if it stays silent).
    pub async fn probe(&self, link: LinkId) -> bool {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let timeout = {
            let mut inner = lock(&self.shared.inner);
            if !inner.router.is_live(link) {
                return false;
            }
            match inner.links.get_mut(&link) {
                Some(s) => s.probes.push(tx),
                None => return false,
            }
            inner.router.config().environment_probe_timeout
        };
        self.shared.with(|r| r.probe(now(), link));
        // The router closes a silent link at the probe timeout; the margin only guards
        // against a link whose reader is gone.
        matches!(
            tokio::time::timeout(timeout + Duration::from_secs(1), rx).await,
            Ok(Ok(()))
        )
    }

    /// Close every link (graceful shutdown): each link's tasks send a close frame (bounded by
    /// `LINK_CLOSE_TIMEOUT`) and their `serve_*` calls return `CloseReason::Local`.
    pub fn shutdown(&self) {
        let inner = lock(&self.shared.inner);
        for s in inner.links.values() {
            s.signals.close(CloseReason::Local);
        }
    }

    /// Figures for metrics.
    pub fn snapshot(&self) -> RelaySnapshot {
        let inner = lock(&self.shared.inner);
        let r = &inner.router;
        RelaySnapshot {
            links: r.link_count(),
            environments: r.environment_count(),
            streams: r.route_count(),
            queued_bytes: r.queued_bytes(),
            deepest_link_queue_bytes: r.deepest_link_queue_bytes(),
            counters: r.counters().clone(),
        }
    }
}

/// A link registered with the hub and not yet served: [`serve`](Self::serve) it with its
/// WebSocket. Dropped unserved, it is closed (its streams reset) and forgotten.
pub struct PendingLink<T: RoutingTable + 'static = MemoryTable> {
    hub: Arc<HubShared<T>>,
    id: LinkId,
    signals: Arc<LinkSignals>,
    served: bool,
}

impl<T: RoutingTable + 'static> PendingLink<T> {
    /// The link's number in the hub (for logs).
    pub fn id(&self) -> LinkId {
        self.id
    }

    /// Drive the link over `ws` (upgraded over [`ReadAhead::websocket`], or
    /// [`ReadAhead::websocket_client`] for a link this relay dialled) until it ends. Returns
    /// why it ended.
    pub async fn serve<S>(self, ws: WebSocketStream<ReadAhead<S>>) -> CloseReason
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        self.serve_with(ws, None).await
    }

    /// [`serve`](Self::serve), with the socket's [`Arrivals`]: a client link whose message
    /// takes longer than the relay's message timeout to arrive is closed
    /// (`message_timeout`).
    pub async fn serve_with<S>(
        self,
        ws: WebSocketStream<ReadAhead<S>>,
        arrivals: Option<Arc<Arrivals>>,
    ) -> CloseReason
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let sock = LinkSocket::from_websocket(ws).await;
        self.serve_socket(sock, arrivals).await
    }

    async fn serve_socket<S>(
        mut self,
        sock: LinkSocket<S>,
        arrivals: Option<Arc<Arrivals>>,
    ) -> CloseReason
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        self.served = true;
        let (write_timeout, message_timeout) = {
            let inner = lock(&self.hub.inner);
            // Closed between registration and now (revoked at once): say so.
            if !inner.router.is_live(self.id) {
                self.signals.close(CloseReason::Revoked);
            }
            let cfg = inner.router.config();
            (cfg.keepalive.write_timeout, cfg.message_timeout)
        };
        let link = Arc::new(HubLink {
            hub: self.hub.clone(),
            id: self.id,
            signals: self.signals.clone(),
            write_timeout,
            message_timeout: arrivals.is_some().then_some(message_timeout),
        });
        run_io(sock, link, arrivals).await
    }
}

impl<T: RoutingTable + 'static> Drop for PendingLink<T> {
    fn drop(&mut self) {
        if !self.served {
            self.hub
                .with(|r| r.link_closed(self.id, CloseReason::Local));
        }
        lock(&self.hub.inner).links.remove(&self.id);
    }
}

/// One link of the hub, as the I/O loop sees it.
struct HubLink<T: RoutingTable> {
    hub: Arc<HubShared<T>>,
    id: LinkId,
    signals: Arc<LinkSignals>,
    write_timeout: Duration,
    message_timeout: Option<Duration>,
}

impl<T: RoutingTable + 'static> LinkCore for HubLink<T> {
    fn signals(this: &Arc<Self>) -> &LinkSignals {
        &this.signals
    }

    fn on_frame(this: &Arc<Self>, now: Instant, msg: Bytes) {
        this.hub.with(|r| r.handle_frame(now, this.id, msg));
    }

    fn on_frames(this: &Arc<Self>, now: Instant, batch: &mut Batch<Bytes>) {
        // One turn of the hub's lock for the batch: the router's events (each destination's
        // wake-up) are handled once, after the last frame.
        this.hub.with(|r| {
            for msg in batch.drain() {
                r.handle_frame(now, this.id, msg);
            }
        });
    }

    fn on_pong(this: &Arc<Self>, _now: Instant, payload: &[u8]) {
        this.hub.with(|r| r.handle_pong(this.id, payload));
    }

    fn on_timer(this: &Arc<Self>, now: Instant) {
        this.hub.with(|r| r.handle_timeout(now, this.id));
    }

    fn next_timer(this: &Arc<Self>) -> Option<Instant> {
        lock(&this.hub.inner).router.poll_timeout(this.id)
    }

    fn poll_batch(this: &Arc<Self>, now: Instant, out: &mut Batch<Transmit>) {
        this.hub.with(|r| {
            while out.has_room() {
                let Some(t) = r.poll_transmit(now, this.id) else {
                    break;
                };
                let n = match &t {
                    Transmit::Frame(f) => f.wire_len(),
                    Transmit::Ping(p) => p.len(),
                };
                out.push(t, n);
            }
        });
    }

    fn on_closed(this: &Arc<Self>, reason: CloseReason) {
        this.hub.with(|r| r.link_closed(this.id, reason));
        this.signals.close(reason);
        if let Some(s) = lock(&this.hub.inner).links.get_mut(&this.id) {
            s.probes.clear();
        }
    }

    fn write_timeout(this: &Arc<Self>) -> Duration {
        this.write_timeout
    }

    fn message_timeout(this: &Arc<Self>) -> Option<Duration> {
        this.message_timeout
    }
}
