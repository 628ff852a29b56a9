//! The exec server's side of a physical link, on the link engine: a direct `noise+ws://` link
//! (path `/v1/link`) or the environment link to a relay (`super::environment`). The engine
//! (`execrelay_relay::driver::EndpointLink`) owns frames, streams, windows, keepalive, the
//! write deadline and the budgets; this module owns what sits above it: the Noise handshake,
//! the message-1 `ts` check, authorization, and one `ConnectionProcessor` per stream.
//!
//! # Tasks
//!
//! - The engine's two tasks per link (reader, writer). The reader never waits on a stream.
//! - This module's accept loop ([`run_link`]): one [`OpenRequest`] per `OPEN`; it reads
//!   message 1 and checks its `ts` in order (so `OPEN`s of one key are judged in the order
//!   they were stamped), then hands the stream to its own task.
//! - One task per stream: authorization (the engine caps pending ones at
//!   `max_pending_authorizations`), then the stream's `ConnectionProcessor`, whose reader
//!   decrypts (in that task) and whose writer seals (in that task)
//!   (`super::virtual_stream`). When the processor ends, the stream gets an authenticated
//!   close record and then its `RESET` (§8).
//!
//! Budgets (§8) are the engine's: handshake failures are charged through
//! [`OpenRequest::handshake_failed`]; an empty bucket closes a direct link
//! ([`HandshakeBudgetPolicy::CloseLink`]) or refuses new `OPEN`s on an environment link for a
//! cool-down ([`HandshakeBudgetPolicy::RefuseOpens`]), never touching established streams.
//!
//! Accepting links (the HTTP front, `max_links`) and dialling the relay belong to the
//! composition root and `super::environment`; this module drives one link it is handed.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::WebSocketStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use super::virtual_stream::noise_transport;
use crate::config::ServerConfig;
use crate::connection::{ConnectionOptions, ConnectionProcessor};
use crate::metrics::GaugeGuard;
use crate::noise::authorizer::{AuthRequest, Authorizer};
use crate::noise::handshake::{read_hello, PendingHandshake};
use crate::noise::keys::{fingerprint, Keypair};
use crate::noise::timestamp::{unix_micros, Admission, SharedHelloTimestamps, TimestampError};
use crate::session::SessionRegistry;
use execrelay_relay::config::{
    BucketConfig, EndpointConfig, HandshakeBudgetPolicy, KeepaliveConfig,
};
use execrelay_relay::driver::{EndpointLink, OpenRequest};
use execrelay_relay::frame::StreamId;
use execrelay_relay::reason::{CloseReason, Reason};

/// The path physical links connect to.
pub const LINK_PATH: &str = "/v1/link";

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

/// The engine settings of one server link: the server's limits, and what an empty handshake
/// budget does (`policy`).
pub fn endpoint_config(config: &ServerConfig, policy: HandshakeBudgetPolicy) -> EndpointConfig {
    EndpointConfig {
        max_streams: config.max_streams_per_link,
        max_pending_opens: config.max_pending_authorizations,
        handshake_failures: BucketConfig {
            burst: config.handshake_failure_burst,
            refill: Duration::from_millis(config.handshake_failure_refill_ms),
        },
        on_handshake_budget_empty: policy,
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
    /// Fires when connections must end (the server's shutdown).
    pub shutdown: CancellationToken,
    /// Every task a link starts (authorizations, stream processors), awaited at shutdown.
    pub tasks: TaskTracker,
}

fn short(sid: &StreamId) -> String {
    sid.iter().take(4).map(|b| format!("{b:02x}")).collect()
}

fn ts_reason(e: &TimestampError) -> Reason {
    match e {
        TimestampError::ClockSkew { .. } => Reason::ClockSkew,
        TimestampError::Replayed { .. } => Reason::ReplayedHandshake,
    }
}

/// Drive one physical link until it closes or the context's `shutdown` fires; returns why it
/// ended. `peer` names it in logs; `policy` is what an empty handshake-failure bucket does
/// (close a direct link, refuse new `OPEN`s on an environment link).
pub async fn run_link<S>(
    ws: WebSocketStream<S>,
    peer: String,
    ctx: LinkContext,
    policy: HandshakeBudgetPolicy,
) -> CloseReason
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let metrics = ctx.registry.metrics().clone();
    let _live = GaugeGuard::new(&metrics.noise_links);
    let cfg = endpoint_config(ctx.registry.config(), policy);
    let (link, mut incoming) = match EndpointLink::spawn_server(ws, cfg) {
        Ok(x) => x,
        Err(e) => {
            tracing::error!(error = %e, "link settings refused");
            return CloseReason::Local;
        }
    };
    tracing::info!("link open");
    loop {
        tokio::select! {
            _ = ctx.shutdown.cancelled() => {
                link.close();
                break;
            }
            req = incoming.next() => match req {
                Some(req) => on_open(&ctx, &link, req, &peer),
                None => break,
            },
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

/// One `OPEN`: message 1 and its `ts` here, in order; authorization and the stream in a task.
fn on_open(ctx: &LinkContext, link: &EndpointLink, req: OpenRequest, peer: &str) {
    let sid = req.stream();
    let metrics = ctx.registry.metrics();
    let pending = match read_hello(&ctx.noise.keys, &ctx.noise.env_id, &sid, req.payload()) {
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
                req.handshake_failed(ts_reason(&e));
                return;
            }
        };
    let task = stream_task(
        ctx.clone(),
        link.clone(),
        req,
        pending,
        admission,
        format!("{peer}/{}", short(&sid)),
    );
    ctx.tasks.spawn(task.in_current_span());
}

/// Authorize, accept, and serve one stream until its connection ends.
async fn stream_task(
    ctx: LinkContext,
    link: EndpointLink,
    req: OpenRequest,
    pending: PendingHandshake,
    admission: Admission,
    peer: String,
) {
    let sid = req.stream();
    let metrics = ctx.registry.metrics().clone();
    let auth = AuthRequest {
        client_key: pending.client_key,
        token: pending.hello.token.clone(),
        env_id: ctx.noise.env_id.clone(),
    };
    tracing::debug!(stream = %short(&sid), client = %fingerprint(&auth.client_key), "authorizing");
    let authorizer = ctx.noise.authorizer.clone();
    // An authorizer that never answers must not outlive its link (nor hold up shutdown,
    // which waits for these tasks); dropping the request refuses the stream.
    let verdict = tokio::select! {
        r = authorizer.authorize(auth) => r,
        _ = link.closed() => return,
        _ = ctx.shutdown.cancelled() => return,
    };
    if let Err(why) = verdict {
        tracing::info!(stream = %short(&sid), %why, "authorization refused");
        metrics.noise_failure("unauthorized");
        drop(admission);
        req.handshake_failed(Reason::Unauthorized);
        return;
    }
    admission.accept();
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
    let max = ctx.registry.config().max_message_bytes;
    let (transport, end) = noise_transport(handle, keys, max, peer);
    ConnectionProcessor::run(
        transport,
        ctx.registry.clone(),
        ConnectionOptions {
            close_session_on_end: false,
            peer_key: Some(client_key.to_vec()),
            ..ConnectionOptions::default()
        },
        ctx.shutdown.clone(),
    )
    .await;
    // The client always learns its stream is gone: the authenticated close, then RESET.
    end.close_with_record("closed").await;
}
