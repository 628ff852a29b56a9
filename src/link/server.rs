//! The exec server's side of a physical link, on the link engine: a direct `noise+ws://` link
//! (path `/v1/link`) or the environment link to a relay (`super::environment`). The engine
//! (`execrelay_io::driver::EndpointLink`) owns frames, streams, windows, keepalive, the
//! write deadline and the budgets; this module owns what sits above it: the Noise handshake,
//! the message-1 `ts` check, authorization, and one `ConnectionProcessor` per stream.
//!
//! # Tasks
//!
//! - The engine's two tasks per link (reader, writer). The reader never waits on a stream.
//! - This module's accept loop ([`run_link`]): one [`OpenRequest`] per `OPEN`; it checks the
//!   suite the `OPEN`'s flags name against `noise_suites` (else `unsupported_suite`, not
//!   charged), reads message 1 in that suite, checks its `ts` against the listener's replay cache (any order: parallel
//!   clients of one key stamp independently) and the key's stream quota, then hands the
//!   stream to its own task.
//! - One task per stream: authorization (the engine caps pending ones at
//!   `max_pending_authorizations`), then the stream's `ConnectionProcessor`, whose reader
//!   decrypts (in that task) and whose writer seals (in that task)
//!   (`super::virtual_stream`). When the processor ends, the stream gets an authenticated
//!   close record and then its `RESET` (§8).
//!
//! Budgets (§8) are the engine's: handshake failures are charged through
//! [`OpenRequest::handshake_failed`] and answered with a handshake-failure reason
//! (`handshake_failed`, `unauthorized`, `replayed_handshake`, `clock_skew`). On a direct link
//! the bucket is the client's (`handshake_failure_burst`): the failure that takes its last
//! token closes the link ([`HandshakeBudgetPolicy::CloseLink`]). On the environment link the
//! relay charges each such `RESET` to the client link and address whose `OPEN` it answers,
//! so the link keeps only a last-resort budget (`relay_link_handshake_failure_burst`, far
//! above what one relay-throttled client can spend) that refuses new `OPEN`s for a cool-down
//! when empty ([`HandshakeBudgetPolicy::RefuseOpens`]), never touching established streams.
//! A `ts` refused because its key has too many handshakes in the window is load (`busy`),
//! not a failure.
//!
//! Bounds this module applies per link:
//!
//! - **Reassembly**: one budget per link ([`REASSEMBLY_BUDGET_NAME`],
//!   `max_link_reassembly_bytes`, a child of the server's inbound budget); every stream's
//!   opener charges its unfinished messages to it (`super::virtual_stream`), and a stream
//!   whose message cannot grow is reset `busy` alone (counted as a `busy` Noise failure).
//! - **Quotas and idleness per stream**: each stream's connection gets the client's key, the
//!   link's peer address on a direct link (none through the relay, which hides the clients'
//!   addresses) and `idle_connection_timeout_ms`. A key holds at most `max_streams_per_key`
//!   streams over all links (`super::key_quota`); more are refused `too_many_streams`.
//! - **Idle links**: a direct link that holds no stream (pending or open) for
//!   `idle_link_timeout_ms` is closed (not a failure). The environment link is never closed
//!   for idleness: it is how clients reach this server at all.
//! - The descriptor reserve is checked before a direct link is handed here (`crate::server`).
//!
//! Accepting links (the HTTP front, `max_links`) and dialling the relay belong to the
//! composition root and `super::environment`; this module drives one link it is handed.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use execrelay_io::driver::ReadAhead;
use futures_util::StreamExt;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::Notify;
use tokio_tungstenite::WebSocketStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use super::key_quota::{KeyStream, StreamsPerKey};
use super::virtual_stream::noise_transport;
use crate::bounds::{ByteBudget, IdleTimer};
use crate::config::ServerConfig;
use crate::connection::{ConnectionOptions, ConnectionProcessor};
use crate::metrics::GaugeGuard;
use crate::noise::authorizer::{AuthRequest, Authorizer};
use crate::noise::keys::{fingerprint, Keypair};
use crate::noise::timestamp::{unix_micros, Admission, SharedHelloTimestamps, TimestampError};
use crate::session::SessionRegistry;
use execrelay_io::driver::{EndpointLink, OpenRequest};
use execrelay_protocol::config::{
    BucketConfig, EndpointConfig, HandshakeBudgetPolicy, KeepaliveConfig, HANDSHAKE_COOLDOWN,
};
use execrelay_protocol::frame::StreamId;
use execrelay_protocol::noise::handshake::{read_hello_suite, PendingHandshake};
use execrelay_protocol::noise::suite::NoiseSuite;
use execrelay_protocol::reason::{CloseReason, Reason};

/// The path physical links connect to.
pub const LINK_PATH: &str = "/v1/link";

/// The name clients and logs see when a link's reassembly budget is full.
pub const REASSEMBLY_BUDGET_NAME: &str = "maxLinkReassemblyBytes";

/// Who is at the other end of a link: what the quotas, the idle rule and the handshake budget
/// make of it.
#[derive(Debug, Clone)]
pub enum LinkPeer {
    /// One client connected directly (`noise+ws://`): its address counts toward the
    /// per-address quotas of every stream, the link closes when it holds no stream for
    /// `idle_link_timeout_ms`, and an empty handshake-failure budget closes it.
    Direct(SocketAddr),
    /// The relay (the environment link), named for logs: the clients' addresses are not known
    /// here (the per-key quotas still apply), the link is kept while idle, and an empty
    /// handshake-failure budget refuses new `OPEN`s for a cool-down instead of closing it
    /// (other clients share the link).
    Relay(String),
}

impl LinkPeer {
    /// The address counted by the per-address quotas, on a direct link.
    fn addr(&self) -> Option<IpAddr> {
        match self {
            LinkPeer::Direct(a) => Some(a.ip()),
            LinkPeer::Relay(_) => None,
        }
    }

    /// What an empty handshake-failure bucket does.
    fn policy(&self) -> HandshakeBudgetPolicy {
        match self {
            LinkPeer::Direct(_) => HandshakeBudgetPolicy::CloseLink,
            LinkPeer::Relay(_) => HandshakeBudgetPolicy::RefuseOpens {
                cooldown: HANDSHAKE_COOLDOWN,
            },
        }
    }

    /// The handshake-failure bucket: the client's on a direct link, the last-resort one of
    /// the environment link (the relay charges every failure to the client that caused it).
    fn failure_budget(&self, config: &ServerConfig) -> BucketConfig {
        match self {
            LinkPeer::Direct(_) => BucketConfig {
                burst: config.handshake_failure_burst,
                refill: Duration::from_millis(config.handshake_failure_refill_ms),
            },
            LinkPeer::Relay(_) => BucketConfig {
                burst: config.relay_link_handshake_failure_burst,
                refill: Duration::from_millis(config.relay_link_handshake_failure_refill_ms),
            },
        }
    }

    fn name(&self) -> String {
        match self {
            LinkPeer::Direct(a) => a.to_string(),
            LinkPeer::Relay(name) => name.clone(),
        }
    }
}

/// What one link's streams share beside the [`LinkContext`].
#[derive(Clone)]
struct PerLink {
    link: EndpointLink,
    /// `max_link_reassembly_bytes` under the server's inbound budget.
    reassembly: ByteBudget,
    /// The peer address for the quotas (direct links only).
    addr: Option<IpAddr>,
    /// Names the link in logs.
    name: String,
    /// The streams this module holds on the link, for the idle rule.
    live: LiveStreams,
}

/// The streams of one link this module holds: an `OPEN` being judged or authorized, or an
/// accepted stream whose connection runs (until its close record and `RESET` are queued).
/// This is the idle rule's "the link has a stream"; a stream's end wakes the link's loop at
/// once, so an empty link is timed from the moment its last stream went. (The engine's own
/// count also holds streams still flushing their last records, which would delay the clock.)
#[derive(Clone, Default)]
struct LiveStreams {
    count: Arc<AtomicUsize>,
    changed: Arc<Notify>,
}

impl LiveStreams {
    fn enter(&self) -> LiveGuard {
        self.count.fetch_add(1, Ordering::AcqRel);
        LiveGuard(self.clone())
    }

    fn any(&self) -> bool {
        self.count.load(Ordering::Acquire) > 0
    }
}

/// One stream counted in [`LiveStreams`] while it is held.
struct LiveGuard(LiveStreams);

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.0.count.fetch_sub(1, Ordering::AcqRel);
        self.0.changed.notify_one();
    }
}

/// What a Noise listener (or environment link) needs besides the [`ServerConfig`], whose
/// link settings it uses.
pub struct NoiseServerConfig {
    /// The server's static key.
    pub keys: Keypair,
    /// Who may open streams.
    pub authorizer: Arc<dyn Authorizer>,
    /// Environment id bound into the prologue (empty for a direct listener).
    pub env_id: String,
}

/// The keepalive of every link and WebSocket of an exec server, from its settings
/// (`keepalive_interval_ms`, `pong_timeout_ms`; the write deadline is the pong timeout, the
/// jitter a tenth of the interval).
pub fn keepalive_config(config: &ServerConfig) -> KeepaliveConfig {
    let interval = Duration::from_millis(config.keepalive_interval_ms.max(1));
    let pong = Duration::from_millis(config.pong_timeout_ms.max(1));
    KeepaliveConfig {
        interval,
        jitter: interval / 10,
        pong_timeout: pong,
        write_timeout: pong,
    }
}

/// The engine settings of one server link: the server's limits, the handshake-failure
/// bucket (`failures`) and what its emptying does (`policy`).
pub fn endpoint_config(
    config: &ServerConfig,
    failures: BucketConfig,
    policy: HandshakeBudgetPolicy,
) -> EndpointConfig {
    EndpointConfig {
        window: config.noise_window_records,
        max_streams: config.max_streams_per_link,
        max_pending_opens: config.max_pending_authorizations,
        handshake_failures: failures,
        on_handshake_budget_empty: policy,
        // The environment link (`RefuseOpens`) carries every client's streams: frames for
        // streams it no longer remembers are dropped, never a reason to close it.
        unknown_streams_close_link: matches!(policy, HandshakeBudgetPolicy::CloseLink),
        keepalive: keepalive_config(config),
        ..EndpointConfig::default()
    }
}

/// What every link of one listener (or of the environment dialer) shares.
#[derive(Clone)]
pub struct LinkContext {
    /// Keys, authorizer, environment id.
    pub noise: Arc<NoiseServerConfig>,
    /// The server's sessions.
    pub registry: Arc<SessionRegistry>,
    /// Message-1 timestamps, one table per listener.
    pub timestamps: SharedHelloTimestamps,
    /// Streams per client key, one table for the whole server.
    pub streams_per_key: Arc<StreamsPerKey>,
    /// Fires when connections must end (the server's shutdown).
    pub shutdown: CancellationToken,
    /// Every task a link starts (authorizations, stream processors), awaited at shutdown.
    pub tasks: TaskTracker,
}

fn short(sid: &StreamId) -> String {
    sid.iter().take(4).map(|b| format!("{b:02x}")).collect()
}

/// The `RESET` reason of a refused `ts`, and whether it is a handshake failure (charged, as
/// a replay or a clock far off) or load (a key with too many handshakes in the window: `busy`,
/// that key's own doing, never charged to anyone).
fn ts_reason(e: &TimestampError) -> (Reason, bool) {
    match e {
        TimestampError::ClockSkew { .. } => (Reason::ClockSkew, true),
        TimestampError::KeyBusy { .. } => (Reason::Busy, false),
        _ => (Reason::ReplayedHandshake, true),
    }
}

/// The idle clock's now: tokio's, so that paused-time tests drive it.
fn idle_now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

/// Drive one physical link until it closes or the context's `shutdown` fires; returns why it
/// ended. `peer` says who is at the other end ([`LinkPeer`]: quotas, idle rule, what an
/// empty handshake-failure bucket does).
pub async fn run_link<S>(
    ws: WebSocketStream<ReadAhead<S>>,
    peer: LinkPeer,
    ctx: LinkContext,
) -> CloseReason
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let metrics = ctx.registry.metrics().clone();
    let _live = GaugeGuard::new(&metrics.noise_links);
    let config = ctx.registry.config();
    let cfg = endpoint_config(config, peer.failure_budget(config), peer.policy());
    let (link, mut incoming) = match EndpointLink::spawn_server(ws, cfg) {
        Ok(x) => x,
        Err(e) => {
            tracing::error!(error = %e, "link settings refused");
            return CloseReason::Local;
        }
    };
    let per_link = PerLink {
        link: link.clone(),
        reassembly: ctx
            .registry
            .inbound_budget()
            .child(REASSEMBLY_BUDGET_NAME, config.max_link_reassembly_bytes),
        addr: peer.addr(),
        name: peer.name(),
        live: LiveStreams::default(),
    };
    let live = per_link.live.clone();
    // A direct link that holds no stream (pending or open) for the idle timeout is closed;
    // the environment link never is (`None`).
    let mut idle = match peer {
        LinkPeer::Direct(_) => Some(IdleTimer::new(config.idle_link_timeout(), idle_now())),
        LinkPeer::Relay(_) => None,
    };
    tracing::info!("link open");
    loop {
        // After every event: an `OPEN`, a stream's end, a deadline.
        if let Some(idle) = idle.as_mut() {
            idle.observe(idle_now(), live.any());
        }
        let idle_deadline = idle
            .as_ref()
            .map(|i| tokio::time::Instant::from_std(i.deadline()));
        tokio::select! {
            _ = ctx.shutdown.cancelled() => {
                link.close();
                break;
            }
            req = incoming.next() => match req {
                Some(req) => on_open(&ctx, &per_link, req),
                None => break,
            },
            _ = live.changed.notified() => {}
            _ = sleep_until_some(idle_deadline) => {
                if let Some(idle) = idle.as_mut() {
                    idle.observe(idle_now(), live.any());
                    if idle.expired(idle_now()) {
                        tracing::info!("closing link: no stream within the idle timeout");
                        link.close();
                        break;
                    }
                }
            }
        }
    }
    let reason = link.closed().await;
    match reason {
        CloseReason::Local | CloseReason::Transport => tracing::info!(%reason, "link closed"),
        _ => {
            tracing::warn!(%reason, "link closed");
            metrics.noise_failure(reason.as_str());
        }
    }
    reason
}

/// Sleep until `deadline`, or forever without one.
async fn sleep_until_some(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// One `OPEN`: message 1, its `ts` and the key's quota here; authorization and the stream in a
/// task.
fn on_open(ctx: &LinkContext, link: &PerLink, req: OpenRequest) {
    let live = link.live.enter();
    let sid = req.stream();
    let metrics = ctx.registry.metrics();
    // The suite first (§3): one this server does not implement or list is refused before any
    // cryptography, uncharged (an honest client of another configuration meets it), and the
    // reason tells the client to retry with suite 0.
    let accepted = ctx.registry.config().noise_suites;
    let Some(suite) = NoiseSuite::from_number(req.suite_bits()).filter(|s| accepted.contains(*s))
    else {
        tracing::info!(
            stream = %short(&sid),
            suite = req.suite_bits(),
            accepted = %accepted,
            "stream refused: Noise suite not accepted here (noise_suites)"
        );
        metrics.noise_failure("unsupported_suite");
        req.refuse(Reason::UnsupportedSuite);
        return;
    };
    let pending = match read_hello_suite(
        suite,
        &ctx.noise.keys,
        &ctx.noise.env_id,
        &sid,
        req.payload(),
    ) {
        Ok(p) => p,
        Err(e) => {
            tracing::info!(stream = %short(&sid), error = %e, "handshake failed");
            metrics.noise_failure("handshake_failed");
            req.handshake_failed(Reason::HandshakeFailed);
            return;
        }
    };
    // After decryption and the payload's shape, before authorization: a replayed message 1
    // learns nothing about the key's authorization and takes no slot.
    let now = unix_micros(SystemTime::now());
    let admission =
        match Admission::admit(&ctx.timestamps, &pending.client_key, pending.hello.ts, now) {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(
                    stream = %short(&sid),
                    client = %fingerprint(&pending.client_key),
                    "handshake refused: {e}"
                );
                metrics.noise_failure(e.reset_reason());
                match ts_reason(&e) {
                    (reason, true) => req.handshake_failed(reason),
                    (reason, false) => req.refuse(reason),
                }
                return;
            }
        };
    // The key's share of the server's streams (`max_streams_per_key`): a refusal, not a
    // failure (the key is genuine; it holds enough already).
    let Some(quota) = ctx.streams_per_key.try_enter(&pending.client_key) else {
        tracing::warn!(
            stream = %short(&sid),
            client = %fingerprint(&pending.client_key),
            max = ctx.streams_per_key.limit(),
            "stream refused: this client key holds its maximum of streams (max_streams_per_key)"
        );
        metrics.noise_failure("too_many_streams");
        req.refuse(Reason::TooManyStreams);
        return;
    };
    let task = stream_task(
        ctx.clone(),
        link.clone(),
        req,
        pending,
        admission,
        format!("{}/{}", link.name, short(&sid)),
        (live, quota),
    );
    ctx.tasks.spawn(task.in_current_span());
}

/// Authorize, accept, and serve one stream until its connection ends.
async fn stream_task(
    ctx: LinkContext,
    link: PerLink,
    mut req: OpenRequest,
    pending: PendingHandshake,
    admission: Admission,
    peer: String,
    held: (LiveGuard, KeyStream),
) {
    let (_live_stream, key_stream) = held;
    let sid = req.stream();
    let metrics = ctx.registry.metrics().clone();
    let auth = AuthRequest {
        client_key: pending.client_key,
        token: pending.hello.token.clone(),
        env_id: ctx.noise.env_id.clone(),
    };
    tracing::debug!(stream = %short(&sid), client = %fingerprint(&auth.client_key), "authorizing");
    let authorizer = ctx.noise.authorizer.clone();
    // An authorizer that never answers must not outlive its stream, its link, or shutdown
    // (which waits for these tasks): a client that resets its pending stream (or breaks a
    // rule on it) ends the authorization at once, so the engine's cap on pending `OPEN`s
    // also caps the authorizations in flight. Dropping the request refuses the stream.
    let verdict = tokio::select! {
        r = authorizer.authorize(auth) => r,
        () = req.cancelled() => {
            tracing::debug!(stream = %short(&sid), "stream gone while authorizing");
            return;
        }
        _ = link.link.closed() => return,
        _ = ctx.shutdown.cancelled() => return,
    };
    if let Err(why) = verdict {
        tracing::info!(stream = %short(&sid), %why, "authorization refused");
        metrics.noise_failure("unauthorized");
        drop(admission);
        req.handshake_failed(Reason::Unauthorized);
        return;
    }
    admission.accept(unix_micros(SystemTime::now()));
    let client_key = pending.client_key;
    let (msg2, keys) = match pending.accept(env!("CARGO_PKG_VERSION")) {
        Ok(x) => x,
        Err(_) => {
            req.handshake_failed(Reason::HandshakeFailed);
            return;
        }
    };
    let Ok(handle) = req.accept(Bytes::from(msg2)) else {
        return; // the link closed meanwhile
    };
    let _live = GaugeGuard::new(&metrics.noise_streams);
    tracing::info!(stream = %short(&sid), client = %fingerprint(&client_key), "stream open");
    let config = ctx.registry.config();
    // The stream's unfinished messages are charged to the link's reassembly budget, and each
    // keeps its charge until the connection takes it.
    let (mut transport, end) = noise_transport(
        handle,
        keys,
        config.max_message_bytes,
        link.reassembly.clone(),
        peer,
    );
    // The key holds this stream while its client can still send on it: the quota's slot goes
    // with the inbound half, given back as soon as the connection stops reading (the peer
    // closed, idleness, eviction), not when the connection's last writes are flushed (up to
    // a few seconds later: parallel clients of one key that finish and start again would
    // otherwise count twice).
    transport.incoming = Box::pin(transport.incoming.map(move |m| {
        let _ = &key_stream;
        m
    }));
    ConnectionProcessor::run(
        transport,
        ctx.registry.clone(),
        ConnectionOptions {
            close_session_on_end: false,
            peer_key: Some(client_key.to_vec()),
            peer_addr: link.addr,
            idle_timeout: Some(config.idle_connection_timeout()),
            ..ConnectionOptions::default()
        },
        ctx.shutdown.clone(),
    )
    .await;
    // The client always learns its stream is gone: the authenticated close, then RESET (or
    // the RESET alone, with the reason the stream failed for).
    if let Some(failed) = end.close_with_record("closed").await {
        tracing::info!(stream = %short(&sid), reason = %failed.as_str(), "stream reset");
        metrics.noise_failure(failed.as_str());
    }
}
