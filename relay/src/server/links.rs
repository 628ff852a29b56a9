//! What happens to each upgraded WebSocket of the relay, and the environments-file watcher.
//!
//! - [`environment_link`]: the §6.2 handshake on stream id 0 (message 1 within the handshake
//!   timeout; admission and registration under the environments file's lock), then the hub
//!   drives the link until it ends.
//! - [`client_link`]: registered with the hub at once (per-address limit), then driven.
//! - [`watch_environments`]: re-reads the environments file when it changes and closes the
//!   links of revoked ids.
//!
//! Every refusal is logged with its reason in the link's span and counted.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::WebSocketStream;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::metrics::{ClientRefusal, LinkOutcome};
use super::{lock, unix_micros, Shared, RELAY_VERSION};
use crate::driver::{
    recv_frame, send_frame, FrameIoError, PendingLink, RelayHub, LINK_CLOSE_TIMEOUT,
};
use crate::env_handshake::{
    finish_admission, precheck_link_open, read_link_open, AdmittedLink, LinkRefusal,
};
use crate::frame::{Frame, LINK_STREAM};
use crate::http::FrontStream;
use crate::keys::fingerprint;
use crate::reason::CloseReason;
use crate::router::AddLinkError;

type Ws = WebSocketStream<FrontStream>;

/// Close a WebSocket with `code` and a fixed `reason`, bounded by [`LINK_CLOSE_TIMEOUT`].
async fn close(mut ws: Ws, code: CloseCode, reason: &'static str) {
    let frame = CloseFrame {
        code,
        reason: reason.into(),
    };
    let _ = tokio::time::timeout(LINK_CLOSE_TIMEOUT, ws.close(Some(frame))).await;
}

/// Send a refusal (`RESET` on stream id 0), then close.
async fn refuse(mut ws: Ws, reset: &Frame, deadline: std::time::Duration) {
    let _ = send_frame(&mut ws, reset, deadline.min(LINK_CLOSE_TIMEOUT)).await;
    close(ws, CloseCode::Policy, "refused").await;
}

/// How a link's end reads in the log.
fn log_close(kind: &str, reason: CloseReason) {
    match reason {
        CloseReason::Local | CloseReason::Transport => {
            tracing::info!(%reason, "{kind} link closed")
        }
        CloseReason::Replaced => {
            tracing::info!(%reason, "{kind} link closed: replaced by a newer link of the same environment")
        }
        CloseReason::Revoked => tracing::warn!(
            %reason,
            "{kind} link closed: the environment is no longer listed with this key"
        ),
        _ => tracing::warn!(%reason, "{kind} link closed by the relay"),
    }
}

/// An upgraded `/v1/env/ID`: handshake, admission, then the hub.
pub(crate) async fn environment_link(
    hub: RelayHub,
    shared: Arc<Shared>,
    ws: Ws,
    id: String,
    peer: SocketAddr,
    stop: CancellationToken,
) {
    let span = tracing::info_span!("env_link", env = %id, %peer);
    environment_link_inner(hub, shared, ws, id, peer, stop)
        .instrument(span)
        .await
}

async fn environment_link_inner(
    hub: RelayHub,
    shared: Arc<Shared>,
    mut ws: Ws,
    id: String,
    peer: SocketAddr,
    stop: CancellationToken,
) {
    let timeout = shared.settings.link_handshake_timeout();
    // The address's share first: one host cannot take every slot.
    let Some(address_slot) = shared.link_handshake_addresses.try_take(peer.ip()) else {
        shared.stats.link_handshake(LinkOutcome::Busy);
        tracing::warn!(
            max = shared.settings.max_pending_link_handshakes_per_address,
            "environment link refused: too many environment links in their handshake from this address"
        );
        refuse(ws, &Frame::reset(LINK_STREAM, "busy"), timeout).await;
        return;
    };
    let Ok(slot) = shared.link_handshakes.clone().try_acquire_owned() else {
        shared.stats.link_handshake(LinkOutcome::Busy);
        tracing::warn!("environment link refused: too many environment links in their handshake");
        refuse(ws, &Frame::reset(LINK_STREAM, "busy"), timeout).await;
        return;
    };
    let first = tokio::select! {
        first = recv_frame(&mut ws, timeout) => first,
        () = stop.cancelled() => return,
    };
    let open = match first {
        Ok(f) => f,
        Err(e) => {
            let outcome = match e {
                FrameIoError::Timeout(_) | FrameIoError::Closed => LinkOutcome::Timeout,
                _ => LinkOutcome::Malformed,
            };
            shared.stats.link_handshake(outcome);
            tracing::warn!(error = %e, "environment link refused: no link handshake (message 1 on stream id 0)");
            if outcome == LinkOutcome::Malformed {
                refuse(ws, &Frame::reset(LINK_STREAM, "malformed_frame"), timeout).await;
            } else {
                close(ws, CloseCode::Policy, "no link handshake").await;
            }
            return;
        }
    };
    // The checks before any cryptography (an OPEN on stream id 0, a listed id) under the
    // environments file's lock; message 1's Diffie-Hellman outside it (a stranger can ask for
    // it at its connection rate: it must not hold up reloads and other admissions, nor a
    // runtime thread waiting on the lock); then admission and registration under the lock
    // again, against the file as it is then: a reload (which revokes under the same lock)
    // sees this link registered, or this admission sees the reload. No `.await` while it is
    // held.
    let pre = {
        let mut file = lock(&shared.environments);
        shared.apply_reload(&mut file, &hub);
        precheck_link_open(&id, &open, &file)
    };
    let mut read = Some(pre.and_then(|()| read_link_open(&shared.keys, &id, &open)));
    // Admission (key, fresh `ts`) and registration under the lock; if a live link holds the
    // id, probe it outside the lock: a holder that answers keeps the id (two exec servers
    // share the key: this newcomer is refused), a silent one is closed at the probe timeout
    // and the newcomer takes the id, re-checked against the file as it is then.
    let mut admitted_once: Option<AdmittedLink> = None;
    let mut probed = false;
    let registered = loop {
        let step = {
            let mut file = lock(&shared.environments);
            shared.apply_reload(&mut file, &hub);
            let checked = match (admitted_once.take(), read.take()) {
                (Some(a), _) => file
                    .admits(&id, &a.env_key)
                    .map(|()| a)
                    .map_err(LinkRefusal::from),
                (None, Some(read)) => read.and_then(|hs| {
                    let mut ts = lock(&shared.timestamps);
                    finish_admission(hs, &id, &file, &mut ts, unix_micros(), RELAY_VERSION)
                }),
                (None, None) => return,
            };
            match checked {
                Ok(a) if !stop.is_cancelled() => match hub.add_environment(&id) {
                    Ok(p) => Claim::Registered(a, p),
                    Err(AddLinkError::Held { holder }) => Claim::Held(a, holder),
                    Err(e) => Claim::Refused(Err(e)),
                },
                Ok(_) => return,
                Err(refusal) => Claim::Refused(Ok(refusal)),
            }
        };
        match step {
            Claim::Registered(a, p) => break Ok((a, p)),
            Claim::Held(a, holder) if !probed => {
                probed = true;
                let alive = tokio::select! {
                    alive = hub.probe(holder) => alive,
                    () = stop.cancelled() => return,
                };
                if alive {
                    break Err(Ok((LinkRefusal::Held, Some(holder))));
                }
                tracing::info!(
                    holder,
                    "the link holding this environment id did not answer a probe: closed, this one takes the id"
                );
                admitted_once = Some(a);
            }
            Claim::Held(_, holder) => break Err(Ok((LinkRefusal::Held, Some(holder)))),
            Claim::Refused(Ok(r)) => break Err(Ok((r, None))),
            Claim::Refused(Err(e)) => break Err(Err(e)),
        }
    };
    let (admitted, link) = match registered {
        Ok(ok) => ok,
        Err(Ok((refusal, holder))) => {
            shared
                .stats
                .link_handshake(LinkOutcome::of_reason(refusal.reset_reason()));
            match holder {
                Some(holder) => report_shared_key(&shared, &id, holder),
                None => tracing::warn!(
                    error = %refusal,
                    "environment link refused ({})",
                    refusal.reset_reason()
                ),
            }
            refuse(ws, &refusal.reset_frame(), timeout).await;
            return;
        }
        Err(Err(AddLinkError::TooManyEnvironments)) => {
            shared.stats.link_handshake(LinkOutcome::Busy);
            tracing::warn!(
                max = shared.settings.max_environments,
                "environment link refused: the relay serves its maximum of environments"
            );
            refuse(ws, &Frame::reset(LINK_STREAM, "busy"), timeout).await;
            return;
        }
        Err(Err(e)) => {
            shared.stats.link_handshake(LinkOutcome::Busy);
            tracing::warn!(error = %e, "environment link refused");
            refuse(ws, &Frame::reset(LINK_STREAM, "busy"), timeout).await;
            return;
        }
    };
    if let Err(e) = send_frame(&mut ws, &admitted.accept, timeout).await {
        // `link` drops unserved: the hub forgets it.
        shared.stats.link_handshake(LinkOutcome::Timeout);
        tracing::warn!(error = %e, "environment link lost while sending message 2");
        return;
    }
    shared.stats.link_handshake(LinkOutcome::Accepted);
    drop((slot, address_slot));
    tracing::info!(
        key = %fingerprint(&admitted.env_key),
        link = link.id(),
        "environment link up"
    );
    let reason = link.serve(ws).await;
    log_close("environment", reason);
}

/// One attempt to register an admitted environment link.
enum Claim {
    Registered(AdmittedLink, PendingLink),
    /// A live link holds the id.
    Held(AdmittedLink, crate::router::LinkId),
    /// `Ok`: refused by the admission checks; `Err`: by the hub.
    Refused(Result<LinkRefusal, AddLinkError>),
}

/// A second exec server claimed the id of a live, answering one: two servers share the
/// environment's key. The live one keeps the id; said once per holder at `warn` (the other
/// server redials with its backoff, each refused again), then at `debug`.
fn report_shared_key(shared: &Shared, id: &str, holder: crate::router::LinkId) {
    let first = lock(&shared.shared_keys_reported).insert(id.to_string(), holder) != Some(holder);
    if first {
        tracing::warn!(
            holder,
            "two exec servers share the key of this environment: the live link keeps the id and this newer one is refused (environment_in_use) — give each server its own key and environment id, or stop one"
        );
    } else {
        tracing::debug!(
            holder,
            "environment link refused: the id is held (environment_in_use)"
        );
    }
}

/// An upgraded `/v1/connect/ID`: registered with the hub (per-address limit), then driven.
/// Client links are not authenticated by the relay (§6.2): the environment authenticates every
/// stream end to end.
pub(crate) async fn client_link(
    hub: RelayHub,
    shared: Arc<Shared>,
    mut ws: Ws,
    id: String,
    peer: SocketAddr,
    stop: CancellationToken,
) {
    let span = tracing::info_span!("client_link", env = %id, %peer);
    async move {
        if stop.is_cancelled() {
            close(ws, CloseCode::Away, "shutting down").await;
            return;
        }
        let link = match hub.add_client(&id, peer.ip()) {
            Ok(link) => link,
            Err(e) => {
                shared.stats.client_refused(ClientRefusal::PerAddress);
                tracing::warn!(
                    error = %e,
                    max = shared.settings.max_client_links_per_address,
                    "client link refused"
                );
                close(
                    ws,
                    CloseCode::Again,
                    "too many client links from this address",
                )
                .await;
                return;
            }
        };
        tracing::info!(link = link.id(), "client link up");
        // A message that takes longer than `message_timeout_ms` to arrive closes the link.
        let arrivals = ws.get_mut().arrivals();
        let reason = link.serve_with(ws, Some(arrivals)).await;
        log_close("client", reason);
    }
    .instrument(span)
    .await
}

/// Check the environments file every `environments_poll_ms` until `stop`; revoked ids lose
/// their link at once.
pub(crate) async fn watch_environments(
    hub: RelayHub,
    shared: Arc<Shared>,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(shared.settings.environments_poll());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let mut file = lock(&shared.environments);
        shared.apply_reload(&mut file, &hub);
    }
}
