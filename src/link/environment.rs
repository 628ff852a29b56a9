//! The exec server's environment link (`secure-transport.md` §6.1–§6.2): dial the relay at
//! `URL/v1/env/ID`, prove the environment's key in the link handshake on stream id 0
//! (`execrelay_protocol::env_handshake`, pinning the relay's key), then serve the link exactly
//! as a direct one ([`super::server::run_link`]: per-stream handshakes, authorization,
//! `ConnectionProcessor`s, session binding to the client key), with the budget policy of a
//! link that carries many clients' streams: an empty handshake bucket refuses new `OPEN`s for
//! a cool-down and never touches established streams. When the link ends, dial again after
//! a [`Backoff`] delay, until the server shuts down; a refusal by the relay is logged with
//! what to check and retried on a slower schedule (up to `relay_refused_backoff_max_ms`).
//! Every attempt's outcome goes to the link's [`EnvironmentHealth`] (`/readyz`).
//!
//! It never decides anything about streams (that is `server.rs`) and never holds a relay
//! secret: the relay learns nothing it could use elsewhere.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::backoff::{random, Backoff};
use super::dial::{dial, environment_url, LinkSocket, TlsRoots};
use super::health::EnvironmentHealth;
use super::server::{run_link, LinkContext, LinkPeer};
use crate::noise::keys::{fingerprint, KEY_BYTES};
use crate::noise::timestamp::next_hello_ts;
use execrelay_io::driver::{recv_frame, send_frame};
use execrelay_protocol::env_handshake::{
    EnvironmentHandshake, LinkRefusal, REASON_CLOCK_SKEW, REASON_HELD, REASON_UNAUTHORIZED,
};
use execrelay_protocol::reason::CloseReason;

/// How long the link handshake (message 1 out, message 2 or a refusal back) may take.
pub const LINK_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Where and how the environment link goes (`execrelay serve --relay URL --environment-id ID
/// --relay-key PUB [--ca-file FILE]`).
#[derive(Debug, Clone)]
pub struct RelayDial {
    /// The relay's base URL (`ws://RELAY:PORT` or `wss://…`).
    pub relay_url: String,
    /// This environment's id.
    pub env_id: String,
    /// The relay's public key, pinned.
    pub relay_public: [u8; KEY_BYTES],
    /// How `wss://` verifies the relay's certificate.
    pub tls: TlsRoots,
}

/// How one attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Attempt {
    /// The link came up and lived this long.
    Lived(Duration),
    /// The relay could not be reached or did not answer.
    Unreachable,
    /// The relay refused for load (`busy`) or a malformed exchange: retried as a failure.
    Refused,
    /// The relay refused this environment's key or id, the relay did not prove the pinned
    /// key, or the clocks are apart: retried on the slower schedule until someone fixes it.
    Misconfigured,
    /// Stopped.
    Stopped,
}

/// Keep the environment link up until `stop` fires (then no new link is dialled; the link up
/// ends with the context's `shutdown`, after exit notices went out). `health` follows every
/// attempt (`/readyz`, `/status`, the metrics).
pub async fn run_environment(
    dial_cfg: RelayDial,
    ctx: LinkContext,
    health: Arc<EnvironmentHealth>,
    stop: CancellationToken,
) {
    let url = match environment_url(&dial_cfg.relay_url, &dial_cfg.env_id) {
        Ok(u) => u,
        Err(e) => {
            tracing::error!(error = %e, "environment link not started");
            health.update(|st, now| st.refused(now, false, e.to_string()));
            return;
        }
    };
    let mut backoff = Backoff::from_config(ctx.registry.config());
    let span = tracing::info_span!("environment_link", env = %dial_cfg.env_id);
    async move {
        let mut attempt = 0u64;
        let mut held = HeldReport::default();
        loop {
            if stop.is_cancelled() {
                return;
            }
            attempt += 1;
            health.update(|st, _| st.dialling());
            // Not raced against `stop` as a whole: a link that is up ends with the
            // connections (the context's `shutdown`), after the exit notices went out.
            let outcome =
                connect_and_serve(&dial_cfg, &url, &ctx, &health, attempt, &stop, &mut held).await;
            let delay = match outcome {
                Attempt::Stopped => return,
                Attempt::Lived(lived) => backoff.delay(Some(lived), random()),
                Attempt::Unreachable | Attempt::Refused => backoff.delay(None, random()),
                Attempt::Misconfigured => backoff.delay_refused(random()),
            };
            tracing::info!(?delay, "dialling the relay again");
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(delay) => {}
            }
        }
    }
    .instrument(span)
    .await
}

/// Whether the relay's "another server holds this id" refusal was reported since the link was
/// last up: said once (two servers share this environment's key), then quietly retried.
#[derive(Debug, Default)]
struct HeldReport {
    said: bool,
}

/// One attempt: dial, handshake (abandoned when `stop` fires), serve until the link ends
/// (with the context's `shutdown`, like every connection).
async fn connect_and_serve(
    dial_cfg: &RelayDial,
    url: &str,
    ctx: &LinkContext,
    health: &EnvironmentHealth,
    attempt: u64,
    stop: &CancellationToken,
    held: &mut HeldReport,
) -> Attempt {
    let ws = tokio::select! {
        _ = stop.cancelled() => return Attempt::Stopped,
        ws = establish(dial_cfg, url, ctx, health, attempt, held) => match ws {
            Ok(ws) => ws,
            Err(outcome) => return outcome,
        },
    };
    held.said = false;
    let started = tokio::time::Instant::now();
    let reason = run_link(ws, LinkPeer::Relay(format!("relay {url}")), ctx.clone()).await;
    let lived = started.elapsed();
    if reason == CloseReason::Local {
        // Our own shutdown closed it: nothing was lost.
        tracing::info!(?lived, "environment link closed");
    } else {
        tracing::warn!(%reason, ?lived, "environment link lost");
    }
    health.update(|st, now| st.lost(now, format!("the link to {url} was lost ({reason})")));
    Attempt::Lived(lived)
}

/// Dial the relay and run the link handshake: the link's WebSocket, ready for the engine, or
/// how the attempt failed (logged, and recorded in `health`).
async fn establish(
    dial_cfg: &RelayDial,
    url: &str,
    ctx: &LinkContext,
    health: &EnvironmentHealth,
    attempt: u64,
    held: &mut HeldReport,
) -> Result<LinkSocket, Attempt> {
    let keys = &ctx.noise.keys;
    let unreachable = |why: String| {
        health.update(|st, now| st.unreachable(now, why));
        Attempt::Unreachable
    };
    let mut ws = match dial(url, &dial_cfg.tls, LINK_HANDSHAKE_TIMEOUT).await {
        Ok(ws) => ws,
        Err(e) => {
            tracing::warn!(attempt, error = %e, "cannot reach the relay");
            return Err(unreachable(e.to_string()));
        }
    };
    let (hs, open) = match EnvironmentHandshake::start(
        keys,
        &dial_cfg.relay_public,
        &dial_cfg.env_id,
        next_hello_ts(),
    ) {
        Ok(x) => x,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the link handshake");
            return Err(unreachable(format!("cannot start the link handshake: {e}")));
        }
    };
    let answer = async {
        send_frame(&mut ws, &open, LINK_HANDSHAKE_TIMEOUT).await?;
        recv_frame(&mut ws, LINK_HANDSHAKE_TIMEOUT).await
    };
    let answer = match answer.await {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!(attempt, error = %e, "the relay did not answer the link handshake");
            return Err(unreachable(format!(
                "the relay at {url} did not answer the link handshake: {e}"
            )));
        }
    };
    if let Err(e) = hs.finish(&answer) {
        if matches!(&e, LinkRefusal::Refused(r) if r == REASON_HELD) {
            // Another exec server with this key holds the id and is alive: the relay keeps
            // it. Said once; the redials (at the backoff's pace) are quiet until one succeeds.
            if held.said {
                tracing::debug!(attempt, "the relay still gives the id to another server");
            } else {
                held.said = true;
                tracing::error!(
                    attempt,
                    env = %dial_cfg.env_id,
                    key = %fingerprint(&keys.public),
                    "another exec server with this environment key holds environment {:?} at the relay (environment_in_use): two servers share a key. This one keeps trying and takes over when the other stops; give each server its own key and id",
                    dial_cfg.env_id
                );
            }
            ctx.registry
                .metrics()
                .environment_link()
                .refused("environment_in_use");
            health.update(|st, now| {
                st.refused(
                    now,
                    false,
                    format!(
                        "another exec server with this environment key holds environment {} at {url} (environment_in_use)",
                        dial_cfg.env_id
                    ),
                )
            });
            return Err(Attempt::Refused);
        }
        let refusal = Refusal::of(&e, dial_cfg, &fingerprint(&keys.public), url);
        // The relay's RESET reason, or a message 2 that does not verify (another relay key).
        tracing::error!(
            attempt,
            env = %dial_cfg.env_id,
            key = %fingerprint(&keys.public),
            relay = %fingerprint(&dial_cfg.relay_public),
            "{}",
            refusal.message
        );
        ctx.registry
            .metrics()
            .environment_link()
            .refused(refusal.label);
        health.update(|st, now| st.refused(now, refusal.unauthorized, refusal.message));
        return Err(if refusal.misconfigured {
            Attempt::Misconfigured
        } else {
            Attempt::Refused
        });
    }
    tracing::info!(
        attempt,
        "connected to relay {} as environment {}",
        dial_cfg.relay_url,
        dial_cfg.env_id
    );
    ctx.registry.metrics().environment_link().came_up();
    health.update(|st, now| st.up(now));
    Ok(ws)
}

/// A refused link handshake, as the log, `/readyz` and the metrics tell it.
struct Refusal {
    /// The metrics label (a fixed string).
    label: &'static str,
    /// The relay does not list this server's key for the id.
    unauthorized: bool,
    /// A refusal only an operator can lift (slower retries).
    misconfigured: bool,
    /// What happened and what to check.
    message: String,
}

impl Refusal {
    fn of(e: &LinkRefusal, dial: &RelayDial, own_key: &str, url: &str) -> Refusal {
        let (env, relay_key) = (&dial.env_id, fingerprint(&dial.relay_public));
        match e {
            LinkRefusal::Refused(reason) if reason == REASON_UNAUTHORIZED => Refusal {
                label: "unauthorized",
                unauthorized: true,
                misconfigured: true,
                message: format!(
                    "the relay at {url} refused environment {env} (unauthorized): check that the relay's environments file lists this server's public key ({own_key}, the line of its --key's .pub file) for the id {env}, and that --relay-key is this relay's public key (pinned: {relay_key}); retrying, more slowly, until it is fixed"
                ),
            },
            LinkRefusal::Refused(reason) if reason == REASON_CLOCK_SKEW => Refusal {
                label: "clock_skew",
                unauthorized: false,
                misconfigured: true,
                message: format!(
                    "the relay at {url} refused environment {env}: this host's clock and the relay's are too far apart; fix the clock (NTP) of one of them"
                ),
            },
            LinkRefusal::Refused(reason) if reason == "busy" => Refusal {
                label: "busy",
                unauthorized: false,
                misconfigured: false,
                message: format!(
                    "the relay at {url} refused environment {env} for now (busy): it serves its maximum of environments or of link handshakes; retrying"
                ),
            },
            LinkRefusal::WrongRelay => Refusal {
                label: "wrong_relay_key",
                unauthorized: false,
                misconfigured: true,
                message: format!(
                    "the relay at {url} did not prove the pinned --relay-key ({relay_key}): check that --relay-key is the public key of the relay at this URL; retrying, more slowly, until it is fixed"
                ),
            },
            other => Refusal {
                label: "other",
                unauthorized: false,
                misconfigured: false,
                message: format!("the relay at {url} refused environment {env}: {other}"),
            },
        }
    }
}
