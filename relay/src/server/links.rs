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
use crate::cluster::node::{
    ClusterNode, Located, REASON_DIRECTORY_UNAVAILABLE, REASON_HOLDER_UNREACHABLE,
};
use execrelay_io::driver::{
    recv_frame, send_frame, FrameIoError, PendingLink, RelayHub, LINK_CLOSE_TIMEOUT,
};
use execrelay_io::http::FrontStream;
use execrelay_protocol::env_handshake::{
    finish_admission, precheck_link_open, read_link_open, AdmittedLink, LinkRefusal,
};
use execrelay_protocol::frame::{Frame, FrameType, LINK_STREAM};
use execrelay_protocol::keys::fingerprint;
use execrelay_protocol::reason::CloseReason;
use execrelay_protocol::router::AddLinkError;

type Ws = WebSocketStream<FrontStream>;

/// How long a new environment link waits for the slot of the silent link it evicted
/// (`pending_env_links.rs`): that link gives it up as soon as its task runs, so this only
/// bounds a race with another newcomer; past it the new link is refused `busy` as before.
const EVICTED_SLOT_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

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
    let slot = match shared.link_handshakes.clone().try_acquire_owned() {
        Ok(slot) => Some(slot),
        // Every slot is held: the oldest link still silent, of the address that holds the
        // most, gives its slot up (an exec server sends its message 1 at once).
        Err(_) if shared.silent_env_links.evict_one() => tokio::time::timeout(
            EVICTED_SLOT_WAIT,
            shared.link_handshakes.clone().acquire_owned(),
        )
        .await
        .ok()
        .and_then(Result::ok),
        Err(_) => None,
    };
    let Some(slot) = slot else {
        shared.stats.link_handshake(LinkOutcome::Busy);
        tracing::warn!("environment link refused: too many environment links in their handshake");
        refuse(ws, &Frame::reset(LINK_STREAM, "busy"), timeout).await;
        return;
    };
    let silent = shared.silent_env_links.register(peer.ip());
    let first = tokio::select! {
        first = recv_frame(&mut ws, timeout) => first,
        () = silent.evicted.cancelled() => {
            // Its slot goes to a newer link first; then it is told, as any refused link is.
            drop((slot, address_slot, silent));
            shared.stats.link_handshake(LinkOutcome::Evicted);
            tracing::warn!("environment link closed: silent in its handshake while every slot was held; its slot went to a newer link");
            refuse(ws, &Frame::reset(LINK_STREAM, "busy"), timeout).await;
            return;
        }
        () = stop.cancelled() => return,
    };
    // It spoke: never evicted from here on.
    drop(silent);
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
                Ok(a) if !stop.is_cancelled() => {
                    // The environment itself is here now: a forwarding link that stood for
                    // it gives way (its clients stay, served by this link).
                    if let Some(c) = shared.cluster() {
                        c.yield_forward(&hub, &id);
                    }
                    match hub.add_environment(&id) {
                        Ok(p) => Claim::Registered(a, p),
                        Err(AddLinkError::Held { holder }) => Claim::Held(a, holder),
                        Err(e) => Claim::Refused(Err(e)),
                    }
                }
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
    // Its clients' links move to this runtime (`RelayServer::with_runtimes`): said before
    // message 2, so a client that connects once the environment is up finds it.
    let _home = Home::claim(&shared, &id, link.id());
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
    let link_id = link.id();
    if let Some(c) = shared.cluster() {
        c.hold(&hub, &id, link_id);
    }
    let reason = link.serve(ws).await;
    if let Some(c) = shared.cluster() {
        c.release(&hub, &id, link_id);
    }
    log_close("environment", reason);
}

/// An environment link's entry in `Shared::homes` (the link runtime it runs on) while it
/// lives: none off the link runtimes; removed on drop unless a newer link of the id took it.
struct Home<'a> {
    shared: &'a Shared,
    id: &'a str,
    link: execrelay_protocol::router::LinkId,
}

impl<'a> Home<'a> {
    fn claim(
        shared: &'a Shared,
        id: &'a str,
        link: execrelay_protocol::router::LinkId,
    ) -> Option<Home<'a>> {
        let runtime = execrelay_io::runtimes::current_index()?;
        lock(&shared.homes).insert(id.to_string(), (link, runtime));
        Some(Home { shared, id, link })
    }
}

impl Drop for Home<'_> {
    fn drop(&mut self) {
        let mut homes = lock(&self.shared.homes);
        if homes.get(self.id).is_some_and(|h| h.0 == self.link) {
            homes.remove(self.id);
        }
    }
}

/// One attempt to register an admitted environment link.
enum Claim {
    Registered(AdmittedLink, PendingLink),
    /// A live link holds the id.
    Held(AdmittedLink, execrelay_protocol::router::LinkId),
    /// `Ok`: refused by the admission checks; `Err`: by the hub.
    Refused(Result<LinkRefusal, AddLinkError>),
}

/// A second exec server claimed the id of a live, answering one: two servers share the
/// environment's key. The live one keeps the id; said once per holder at `warn` (the other
/// server redials with its backoff, each refused again), then at `debug`.
fn report_shared_key(shared: &Shared, id: &str, holder: execrelay_protocol::router::LinkId) {
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
/// stream end to end. `via_front`: the request carried the front's header, honoured only when
/// `peer` is in `trusted_front`.
pub(crate) async fn client_link(
    hub: RelayHub,
    shared: Arc<Shared>,
    mut ws: Ws,
    id: String,
    peer: SocketAddr,
    via_front: bool,
    stop: CancellationToken,
) {
    let span = tracing::info_span!("client_link", env = %id, %peer);
    async move {
        if stop.is_cancelled() {
            close(ws, CloseCode::Away, "shutting down").await;
            return;
        }
        if let Some(c) = shared.cluster() {
            let forwarded = match hub.environment_link(&id) {
                None => match find_holder(c, &hub, &id).await {
                    Ok(forwarded) => forwarded,
                    Err(reason) => {
                        refuse_streams(ws, reason, shared.settings.link_handshake_timeout()).await;
                        return;
                    }
                },
                Some(link) => c.is_forward(&id, link),
            };
            // The front's header is believed only from the front itself: any client can
            // send it, and it moves environments.
            let via_front = via_front && {
                let trusted = shared.settings.trusted_front.contains(peer.ip());
                if !trusted {
                    c.front_header_ignored();
                    tracing::debug!("X-Execrelay-Front ignored: the peer is not in trusted_front");
                }
                trusted
            };
            if forwarded && via_front {
                // The front sends this environment's clients here now: it should live here.
                c.announce_home(&id);
            }
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
        if let Some(c) = shared.cluster() {
            c.client_gone(&hub, &id);
        }
        log_close("client", reason);
    }
    .instrument(span)
    .await
}

/// Cluster: a client link for an environment this relay does not hold. Ask the directory;
/// if another relay holds it, make sure a relay-to-relay link to it stands for the
/// environment here. `Err` is the `RESET` reason every stream of the client link gets (the
/// misroute fails fast); `Ok` serves the link (`true`: forwarded; `false`: no holder
/// anywhere, its `OPEN`s are refused `environment_offline` as on a standalone relay).
async fn find_holder(c: &Arc<ClusterNode>, hub: &RelayHub, id: &str) -> Result<bool, &'static str> {
    match c.locate(id).await {
        Located::Holder(h) if h.node != c.node_id() => match c.forward(hub, id, &h).await {
            Ok(()) => {
                tracing::info!(holder = %h.node, "misrouted client link: forwarded to the environment's relay");
                Ok(true)
            }
            Err(e) => {
                tracing::warn!(holder = %h.node, error = %e, "misrouted client link refused: the environment's relay cannot be reached");
                Err(REASON_HOLDER_UNREACHABLE)
            }
        },
        Located::Holder(_) | Located::Nowhere => Ok(false),
        Located::Unavailable(why) => {
            tracing::warn!(%why, "misrouted client link refused (directory_unavailable)");
            Err(REASON_DIRECTORY_UNAVAILABLE)
        }
        Located::Busy => {
            tracing::warn!("misrouted client link refused: too many directory lookups (busy)");
            Err("busy")
        }
    }
}

/// Most `OPEN`s a refused client link has answered before it is closed.
pub const MAX_REFUSED_OPENS: usize = 16;

/// Answer the client link's `OPEN`s with `RESET reason` (at most [`MAX_REFUSED_OPENS`], for
/// at most `deadline`), then close it: its client learns why at once instead of waiting for
/// a handshake timeout.
async fn refuse_streams(mut ws: Ws, reason: &'static str, deadline: std::time::Duration) {
    let until = tokio::time::Instant::now() + deadline;
    let mut answered = 0;
    while answered < MAX_REFUSED_OPENS {
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            break;
        }
        match recv_frame(&mut ws, left).await {
            Ok(f) if f.ftype == FrameType::Open => {
                answered += 1;
                if send_frame(&mut ws, &Frame::reset(f.stream, reason), LINK_CLOSE_TIMEOUT)
                    .await
                    .is_err()
                {
                    return;
                }
                if answered == 1 {
                    // Later OPENs in flight get their answer too; then the link goes.
                    continue;
                }
            }
            Ok(_) => {}
            Err(_) => break,
        }
    }
    close(ws, CloseCode::Again, reason).await;
}

/// Cluster: an upgraded `/v1/relay/ID`: a relay of the cluster forwards misrouted clients of
/// environment `ID`. Admitted after the relay-to-relay handshake (its key listed in the
/// cluster keys file), then served as one more client link of the environment.
pub(crate) async fn relay_link(
    hub: RelayHub,
    shared: Arc<Shared>,
    ws: Ws,
    id: String,
    peer: SocketAddr,
    stop: CancellationToken,
) {
    let span = tracing::info_span!("relay_link", env = %id, %peer);
    relay_link_inner(hub, shared, ws, id, stop)
        .instrument(span)
        .await
}

async fn relay_link_inner(
    hub: RelayHub,
    shared: Arc<Shared>,
    mut ws: Ws,
    id: String,
    stop: CancellationToken,
) {
    let Some(c) = shared.cluster().cloned() else {
        return;
    };
    let timeout = shared.settings.link_handshake_timeout();
    let Some(slot) = c.relay_link_slot() else {
        tracing::warn!(
            max = shared.settings.max_relay_links,
            "relay link refused: this relay holds its maximum of relay-to-relay links"
        );
        refuse(ws, &Frame::reset(LINK_STREAM, "busy"), timeout).await;
        return;
    };
    let open = tokio::select! {
        f = recv_frame(&mut ws, timeout) => f,
        () = stop.cancelled() => return,
    };
    let open = match open {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!(error = %e, "relay link refused: no handshake");
            close(ws, CloseCode::Policy, "no link handshake").await;
            return;
        }
    };
    let admitted = match c.admit_relay_link(&id, &open) {
        Ok(a) => a,
        Err(refusal) => {
            tracing::warn!(error = %refusal, "relay link refused ({})", refusal.reset_reason());
            refuse(ws, &refusal.reset_frame(), timeout).await;
            return;
        }
    };
    let link = hub.add_relay_client(&id);
    if let Err(e) = send_frame(&mut ws, &admitted.accept, timeout).await {
        tracing::warn!(error = %e, "relay link lost while sending message 2");
        return;
    }
    tracing::info!(from = %admitted.node, link = link.id(), "relay-to-relay link up (holding)");
    let reason = link.serve(ws).await;
    drop(slot);
    log_close("relay", reason);
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
