//! The exec server's environment link (`secure-transport.md` §6.1–§6.2): dial the relay at
//! `URL/v1/env/ID`, prove the environment's key in the link handshake on stream id 0
//! (`execrelay_relay::env_handshake`, pinning the relay's key), then serve the link exactly
//! as a direct one ([`super::server::run_link`]: per-stream handshakes, authorization,
//! `ConnectionProcessor`s, session binding to the client key), with the budget policy of a
//! link that carries many clients' streams: an empty handshake bucket refuses new `OPEN`s for
//! a cool-down and never touches established streams. When the link ends, dial again after
//! a [`Backoff`] delay, until the server shuts down.
//!
//! It never decides anything about streams (that is `server.rs`) and never holds a relay
//! secret: the relay learns nothing it could use elsewhere.

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::dial::{dial, environment_url, LinkSocket, TlsRoots};
use super::server::{run_link, LinkContext, LinkPeer};
use crate::config::ServerConfig;
use crate::noise::keys::{fingerprint, KEY_BYTES};
use crate::noise::timestamp::next_hello_ts;
use execrelay_relay::driver::{recv_frame, send_frame};
use execrelay_relay::env_handshake::{EnvironmentHandshake, LinkRefusal, REASON_HELD};
use execrelay_relay::reason::CloseReason;

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

/// Reconnection delays (sans-IO): `initial`, doubling after every failed attempt or short
/// link up to `max`, back to `initial` after a link that lived `reset_after`; each delay
/// loses a random part of up to a quarter (jitter), so environments that lost one relay
/// together do not all come back in the same instant.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    reset_after: Duration,
    next: Duration,
}

impl Backoff {
    /// The schedule of `config` (`relay_backoff_initial_ms`, `relay_backoff_max_ms`,
    /// `relay_backoff_reset_ms`).
    pub fn from_config(config: &ServerConfig) -> Backoff {
        Backoff::new(
            Duration::from_millis(config.relay_backoff_initial_ms.max(1)),
            Duration::from_millis(config.relay_backoff_max_ms.max(1)),
            Duration::from_millis(config.relay_backoff_reset_ms),
        )
    }

    /// A schedule starting at `initial`.
    pub fn new(initial: Duration, max: Duration, reset_after: Duration) -> Backoff {
        Backoff {
            initial,
            max: max.max(initial),
            reset_after,
            next: initial,
        }
    }

    /// The delay before the next attempt, after an attempt whose link lived `lived` (`None`:
    /// it never came up). `random` is any random number (the jitter's source).
    pub fn delay(&mut self, lived: Option<Duration>, random: u64) -> Duration {
        if lived.is_some_and(|l| l >= self.reset_after) {
            self.next = self.initial;
        }
        let base = self.next;
        self.next = (self.next * 2).min(self.max);
        let quarter = base.as_nanos() as u64 / 4;
        let off = if quarter == 0 { 0 } else { random % quarter };
        base - Duration::from_nanos(off)
    }
}

fn random() -> u64 {
    let mut b = [0u8; 8];
    // Jitter only: a failure of the system's randomness leaves the delay unjittered.
    let _ = getrandom::getrandom(&mut b);
    u64::from_le_bytes(b)
}

/// Keep the environment link up until `stop` fires (then no new link is dialled; the link up
/// ends with the context's `shutdown`, after exit notices went out).
pub async fn run_environment(dial_cfg: RelayDial, ctx: LinkContext, stop: CancellationToken) {
    let url = match environment_url(&dial_cfg.relay_url, &dial_cfg.env_id) {
        Ok(u) => u,
        Err(e) => {
            tracing::error!(error = %e, "environment link not started");
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
            // Not raced against `stop` as a whole: a link that is up ends with the
            // connections (the context's `shutdown`), after the exit notices went out.
            let lived = connect_and_serve(&dial_cfg, &url, &ctx, attempt, &stop, &mut held).await;
            let delay = backoff.delay(lived, random());
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
/// (with the context's `shutdown`, like every connection). How long the link lived, if it
/// came up.
async fn connect_and_serve(
    dial_cfg: &RelayDial,
    url: &str,
    ctx: &LinkContext,
    attempt: u64,
    stop: &CancellationToken,
    held: &mut HeldReport,
) -> Option<Duration> {
    let ws = tokio::select! {
        _ = stop.cancelled() => return None,
        ws = establish(dial_cfg, url, ctx, attempt, held) => ws?,
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
    Some(lived)
}

/// Dial the relay and run the link handshake: the link's WebSocket, ready for the engine.
async fn establish(
    dial_cfg: &RelayDial,
    url: &str,
    ctx: &LinkContext,
    attempt: u64,
    held: &mut HeldReport,
) -> Option<LinkSocket> {
    let keys = &ctx.noise.keys;
    let mut ws = match dial(url, &dial_cfg.tls, LINK_HANDSHAKE_TIMEOUT).await {
        Ok(ws) => ws,
        Err(e) => {
            tracing::warn!(attempt, error = %e, "cannot reach the relay");
            return None;
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
            return None;
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
            return None;
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
            return None;
        }
        // The relay's RESET reason, or a message 2 that does not verify (another relay key).
        tracing::error!(
            attempt,
            env = %dial_cfg.env_id,
            key = %fingerprint(&keys.public),
            relay = %fingerprint(&dial_cfg.relay_public),
            "the relay refused this environment link: {e} (check --environment-id, --relay-key, and that the relay's environments file lists this server's public key for the id)"
        );
        return None;
    }
    tracing::info!(attempt, relay = %url, "environment link up");
    Some(ws)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn doubles_to_the_cap_and_resets_after_a_long_link() {
        let mut b = Backoff::new(S, 30 * S, 60 * S);
        let no_jitter = 0;
        let got: Vec<u64> = (0..7).map(|_| b.delay(None, no_jitter).as_secs()).collect();
        assert_eq!(got, [1, 2, 4, 8, 16, 30, 30]);
        // A link that came up but died young does not reset the schedule.
        assert_eq!(b.delay(Some(59 * S), no_jitter), 30 * S);
        // One that lived a minute does.
        assert_eq!(b.delay(Some(60 * S), no_jitter), S);
        assert_eq!(b.delay(None, no_jitter), 2 * S);
    }

    #[test]
    fn jitter_takes_off_at_most_a_quarter() {
        let mut seen = std::collections::HashSet::new();
        for r in 0..1000u64 {
            let mut b = Backoff::new(S, 30 * S, 60 * S);
            let d = b.delay(None, r.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            assert!(d <= S && d > S * 3 / 4, "{d:?}");
            seen.insert(d);
        }
        assert!(seen.len() > 100, "jittered: {} distinct delays", seen.len());
    }
}
