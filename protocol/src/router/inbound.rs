//! Frames in on one relay link: header checks, `OPEN` admission, `ACCEPT`, the window check
//! of `DATA`, `ACK` and `RESET` forwarding. Every path ends in exactly one of: a frame queued
//! for the other side, a refusal or reset (counted), a quiet drop (counted), a charge to a
//! budget, or the link closing.

use std::time::Instant;

use bytes::Bytes;

use super::{
    Lane, LinkId, LinkKind, Route, RouteKey, Router, RoutingTable, Settle, StreamChange,
    HANDSHAKE_FAILURE_REASONS,
};
use crate::flow::{FlowError, RelayFlow};
use crate::frame::{Frame, FrameType, StreamId, LINK_STREAM};
use crate::reason::{CloseReason, DropReason, Reason};

impl<T: RoutingTable> Router<T> {
    /// One binary WebSocket message arrived on `link` at `now`.
    pub fn handle_frame(&mut self, now: Instant, link: LinkId, msg: impl Into<Bytes>) {
        self.tick(now);
        let Some(l) = self.links.get(&link) else {
            return;
        };
        let (kind, env, forward) = (l.kind, l.env.clone(), l.forward);
        let f = match Frame::decode_bytes_named(msg.into()) {
            Ok(f) => f,
            Err(bad) => {
                self.counters.frames_in[0] += 1;
                // A header that reads (reserved flag bits, a reason too long, a type this
                // version lacks) names its stream: answered as a decoded frame that breaks a
                // rule is, below. Anything else names nothing and is only charged.
                match bad.named {
                    Some((ftype, stream)) => {
                        let open = ftype == FrameType::Open as u8;
                        self.malformed_named(now, link, kind, RouteKey { env, stream }, open)
                    }
                    None => self.malformed(now, link, None),
                }
                return;
            }
        };
        self.counters.frames_in[f.ftype as usize] += 1;
        if f.ftype == FrameType::Data {
            self.counters.data_bytes_in += f.payload.len() as u64;
            if forward {
                self.forwarded.bytes += f.payload.len() as u64;
            }
        }
        let key = RouteKey {
            env,
            stream: f.stream,
        };
        if f.check_rules().is_err() {
            let open = f.ftype == FrameType::Open;
            self.malformed_named(now, link, kind, key, open);
            return;
        }
        match (kind, f.ftype) {
            (LinkKind::Client, FrameType::Open) => self.on_open(now, link, key, f),
            (LinkKind::Environment, FrameType::Accept) => self.on_accept(now, link, key, f),
            (_, FrameType::Data | FrameType::Ack | FrameType::Reset) => {
                self.on_stream_frame(now, link, kind, key, f)
            }
            // OPEN from an environment, ACCEPT from a client.
            _ => self.malformed(now, link, Some(f.stream)),
        }
    }

    /// A frame that names `key`'s stream but breaks a rule of §5 or does not decode: charged as
    /// malformed, and its stream reset if this link holds it. A client's `OPEN` (`open`) on
    /// an id this link does not hold is refused as any `OPEN` is, so that the client learns
    /// why instead of waiting for its own timeout; it opens nothing. Never on stream id 0: a
    /// `RESET` there speaks for the link, not a stream.
    fn malformed_named(
        &mut self,
        now: Instant,
        link: LinkId,
        kind: LinkKind,
        key: RouteKey,
        open: bool,
    ) {
        let stream = key.stream;
        let refuse = kind == LinkKind::Client
            && open
            && stream != LINK_STREAM
            && !self.owns(link, kind, &key);
        self.malformed(now, link, Some(stream));
        if refuse && self.links.contains_key(&link) {
            self.refuse(link, stream, Reason::MalformedFrame);
        }
    }

    /// Whether `key` is routed and `link` is one of its two ends (as `kind`).
    fn owns(&mut self, link: LinkId, kind: LinkKind, key: &RouteKey) -> bool {
        self.table.get_mut(key).is_some_and(|r| match kind {
            LinkKind::Client => r.client == link,
            LinkKind::Environment => r.env_link == link,
        })
    }

    /// Charged to the malformed budget (past it the link closes); the stream it names is
    /// reset if this link is one of its ends.
    fn malformed(&mut self, now: Instant, link: LinkId, stream: Option<StreamId>) {
        self.counters.dropped(DropReason::Malformed);
        let Some(l) = self.links.get(&link) else {
            return;
        };
        let kind = l.kind;
        if let Some(s) = stream {
            let key = RouteKey {
                env: l.env.clone(),
                stream: s,
            };
            if self.owns(link, kind, &key) {
                self.reset_route(&key, Reason::MalformedFrame, kind);
            }
        }
        if let Some(l) = self.links.get_mut(&link) {
            if !l.malformed.take(now) {
                self.close_link(link, CloseReason::MalformedBudget);
            }
        }
    }

    /// A frame for a stream this link is not an end of: free if the stream closed recently
    /// on this link, if it is a `RESET` (it asks for nothing, and `RESET`s cross), or if the
    /// link is an environment's (below), else charged to the unknown-stream budget. Never
    /// answered (a relay resets only streams it routes).
    fn unknown(&mut self, now: Instant, link: LinkId, stream: &StreamId, ftype: FrameType) {
        let Some(l) = self.links.get_mut(&link) else {
            return;
        };
        if l.closed_streams.contains(stream) {
            self.counters.dropped(DropReason::ClosedStream);
            return;
        }
        self.counters.dropped(DropReason::UnknownStream);
        // An environment link is never charged: it is authenticated, its junk costs the relay
        // no more than its traffic, and its late frames (crossing a client's RESET) are
        // forgotten as soon as clients close more streams than the closed set remembers,
        // which any client can do; closing it would cut every client of the environment.
        if ftype == FrameType::Reset || l.kind == LinkKind::Environment {
            return;
        }
        if !l.unknown.take(now) {
            self.close_link(link, CloseReason::UnknownStreamBudget);
        }
    }

    /// Refuse a client's `OPEN` with `reason`, touching nothing else. The refusal counts
    /// against the link's share like every frame queued for it (a client that sends `OPEN`s
    /// faster than it reads their refusals is not reading its link: closed at its share,
    /// [`RelayConfig::client_link_share_bytes`]). The id is not remembered as closed: frames
    /// for an id whose `OPEN` was refused are charged as unknown (an honest client sends
    /// nothing after an `OPEN` but waits for its answer).
    fn refuse(&mut self, link: LinkId, stream: StreamId, reason: Reason) {
        self.counters.dropped(DropReason::RefusedOpen);
        self.counters.reset(reason);
        self.stream_event(link, stream, StreamChange::Refused(reason));
        self.enqueue(link, Frame::reset(stream, reason.as_str()), Lane::Control);
    }

    fn on_open(&mut self, now: Instant, link: LinkId, key: RouteKey, mut f: Frame) {
        let s = key.stream;
        if let Some(r) = self.table.get_mut(&key) {
            if r.client == link {
                // The opener's own id again: its stream is broken, as on a direct link.
                self.reset_route(&key, Reason::DuplicateOpen, LinkKind::Client);
            } else {
                // Another client holds the id: refuse this one, never disturb the holder.
                self.refuse(link, s, Reason::Busy);
            }
            return;
        }
        let max_client = self.cfg.max_streams_per_client_link;
        let Some(l) = self.links.get_mut(&link) else {
            return;
        };
        l.closed_streams.remove(&s);
        let rate_ok = l.opens.as_mut().is_none_or(|b| b.take(now));
        if !rate_ok || l.streams.len() >= max_client {
            self.refuse(link, s, Reason::Busy);
            return;
        }
        let Some(env_link) = self.envs.get(&key.env).and_then(|e| e.link) else {
            let why = if self.is_revoked(&key.env) {
                Reason::EnvironmentRevoked
            } else {
                Reason::EnvironmentOffline
            };
            self.refuse(link, s, why);
            return;
        };
        let addr = self.links.get(&link).and_then(|l| l.addr);
        if let Some(a) = addr {
            // Forwarded only while every pending OPEN of the address could pay for a failure:
            // what one address can make environments' handshakes fail stays within its bucket.
            let paid = self.per_addr.get_mut(&a).is_some_and(|st| {
                let tokens = st.failures.remaining(now) as usize;
                st.pending_opens < tokens
            });
            let per_env = self
                .addr_env_streams
                .get(&(a, key.env.clone()))
                .copied()
                .unwrap_or(0);
            if !paid || per_env >= self.cfg.max_streams_per_address_per_environment {
                self.refuse(link, s, Reason::Busy);
                return;
            }
        }
        let env_full = self
            .envs
            .get(&key.env)
            .is_some_and(|e| e.streams.len() >= self.cfg.max_streams_per_environment);
        let queue_full = self.queued_bytes >= self.cfg.max_queued_bytes;
        let reserve_full = self
            .links
            .get(&env_link)
            .is_some_and(|e| e.out.control_bytes() + f.wire_len() > self.cfg.control_reserve_bytes);
        if env_full || queue_full || reserve_full {
            self.refuse(link, s, Reason::Busy);
            return;
        }
        let mut to_client = RelayFlow::new();
        f.window = f.window.min(self.cfg.max_window_records);
        to_client.on_report(0, f.window);
        let route = Route {
            client: link,
            env_link,
            accepted: false,
            to_env: RelayFlow::new(),
            to_client,
        };
        if self.table.insert(key.clone(), route).is_err() {
            self.refuse(link, s, Reason::Busy);
            return;
        }
        if let Some(l) = self.links.get_mut(&link) {
            l.streams.insert(s);
            l.idle_since = None;
        }
        if let Some(e) = self.envs.get_mut(&key.env) {
            e.streams.insert(s);
        }
        if let Some(a) = addr {
            if let Some(st) = self.per_addr.get_mut(&a) {
                st.pending_opens += 1;
            }
            *self
                .addr_env_streams
                .entry((a, key.env.clone()))
                .or_insert(0) += 1;
        }
        if let Some(e) = self.links.get_mut(&env_link) {
            e.closed_streams.remove(&s);
        }
        self.stream_event(link, s, StreamChange::Opened);
        self.enqueue(env_link, f, Lane::Control);
    }

    fn on_accept(&mut self, now: Instant, link: LinkId, key: RouteKey, mut f: Frame) {
        if !self.owns(link, LinkKind::Environment, &key) {
            self.unknown(now, link, &key.stream, f.ftype);
            return;
        }
        let Some(r) = self.table.get_mut(&key) else {
            return;
        };
        if r.accepted {
            self.reset_route(&key, Reason::MalformedFrame, LinkKind::Environment);
            return;
        }
        f.window = f.window.min(self.cfg.max_window_records);
        r.to_env.on_report(0, f.window);
        let answered = r.clone();
        r.accepted = true;
        let client = r.client;
        let addr = self.links.get(&client).and_then(|l| l.addr);
        self.settle(&answered, &key.env, addr, Settle::Answered);
        self.stream_event(client, key.stream, StreamChange::Accepted);
        self.enqueue(client, f, Lane::Control);
    }

    fn on_stream_frame(
        &mut self,
        now: Instant,
        link: LinkId,
        kind: LinkKind,
        key: RouteKey,
        mut f: Frame,
    ) {
        if !self.owns(link, kind, &key) {
            self.unknown(now, link, &key.stream, f.ftype);
            return;
        }
        let from_client = kind == LinkKind::Client;
        if f.ftype == FrameType::Reset {
            let Some(route) = self.remove_route(&key) else {
                return;
            };
            self.counters.peer_resets += 1;
            self.stream_event(
                route.client,
                key.stream,
                StreamChange::PeerReset { from: kind },
            );
            if let Some(l) = self.links.get_mut(&link) {
                l.closed_streams.insert(key.stream);
            }
            let dest = if from_client {
                route.env_link
            } else {
                route.client
            };
            // An environment's refusal of an OPEN leaves the id unknown on the client link
            // (frames for it are charged, as for a refusal of the relay's own).
            let answers_open = !from_client && !route.accepted;
            if !answers_open {
                if let Some(l) = self.links.get_mut(&dest) {
                    l.closed_streams.insert(key.stream);
                }
            }
            let failed =
                answers_open && HANDSHAKE_FAILURE_REASONS.contains(&f.reset_reason().as_str());
            let client_addr = self.links.get(&route.client).and_then(|l| l.addr);
            self.enqueue(dest, f, Lane::AfterData);
            let how = match (from_client, failed) {
                (true, _) => Settle::Abandoned,
                (false, true) => Settle::Failed,
                (false, false) => Settle::Refund,
            };
            self.settle(&route, &key.env, client_addr, how);
            if failed {
                // Charged to whoever sent the OPEN, never to the environment (§8).
                self.charge_failure(now, route.client, client_addr);
            }
            return;
        }
        if from_client
            && f.ftype == FrameType::Ack
            && self.table.get_mut(&key).is_some_and(|r| !r.accepted)
        {
            // A client has received nothing before the ACCEPT, so it has nothing to report.
            // Forwarded, such an ACK would reach an environment that may already have refused
            // the stream and forgotten it (charged there as an unknown stream: a flood of them
            // could close the environment's link). Its DATA before the ACCEPT is past a
            // window not yet granted (`window_exceeded`, below); only its RESET goes through.
            self.reset_route(&key, Reason::MalformedFrame, kind);
            return;
        }
        // Records of the other direction still in this link's queue have not reached its
        // end: a report that acknowledges one is a lie (an honest receiver acknowledges only
        // what it consumed), and believing it would let the relay queue more than one window
        // for a receiver that does not read. The stream is reset, alone.
        let undelivered = self
            .links
            .get(&link)
            .map_or(0, |l| l.out.stream_frames(&key.stream));
        let undelivered = u64::try_from(undelivered).unwrap_or(u64::MAX);
        let Some(r) = self.table.get_mut(&key) else {
            return;
        };
        let delivered = if from_client {
            r.to_client.highest()
        } else {
            r.to_env.highest()
        }
        .saturating_sub(undelivered);
        if f.ack > delivered {
            self.reset_route(&key, Reason::MalformedFrame, kind);
            return;
        }
        // The frame's report is about the other direction, whose receiver is its sender.
        let window = f.window.min(self.cfg.max_window_records);
        // Forwarded as the relay will hold it: a sender never learns of a window larger than
        // the relay's, so an endpoint tuned to a larger window (or a relay configured below
        // the default) slows a stream down instead of getting it reset. The field is
        // cleartext and outside the Noise prologue; rewriting it re-encodes the header only.
        f.window = window;
        let (reverse, dest) = if from_client {
            (&mut r.to_client, r.env_link)
        } else {
            (&mut r.to_env, r.client)
        };
        reverse.on_report(f.ack, window);
        if f.ftype == FrameType::Ack {
            self.enqueue(dest, f, Lane::Ack);
            return;
        }
        if !from_client && !r.accepted {
            // The environment sends nothing before its ACCEPT, and the link is ordered.
            self.reset_route(&key, Reason::MalformedFrame, kind);
            return;
        }
        let flow = if from_client {
            &mut r.to_env
        } else {
            &mut r.to_client
        };
        match flow.on_data(f.seq) {
            Ok(()) => self.enqueue(dest, f, Lane::Data),
            Err(FlowError::WindowExceeded { .. }) => {
                self.reset_route(&key, Reason::WindowExceeded, kind)
            }
            Err(_) => self.reset_route(&key, Reason::MalformedFrame, kind),
        }
    }

    /// Remove a route and its bookkeeping on both links; their queues keep its frames. The
    /// caller settles the route's address accounting ([`Router::settle`]).
    fn remove_route(&mut self, key: &RouteKey) -> Option<Route> {
        let route = self.table.remove(key)?;
        self.client_lost_stream(route.client, &key.stream);
        if let Some(e) = self.envs.get_mut(&key.env) {
            e.streams.remove(&key.stream);
        }
        Some(route)
    }

    /// The relay resets a routed stream on both of its links (its queued frames dropped),
    /// counted once by `reason`, for a rule broken by the `fault` side. Nothing else is
    /// touched.
    fn reset_route(&mut self, key: &RouteKey, reason: Reason, fault: LinkKind) {
        let Some(route) = self.remove_route(key) else {
            return;
        };
        let addr = self.links.get(&route.client).and_then(|l| l.addr);
        let how = match fault {
            LinkKind::Client => Settle::Abandoned,
            LinkKind::Environment => Settle::Refund,
        };
        self.settle(&route, &key.env, addr, how);
        self.counters.reset(reason);
        self.stream_event(route.client, key.stream, StreamChange::Reset(reason));
        for link in [route.client, route.env_link] {
            if let Some(l) = self.links.get_mut(&link) {
                self.queued_bytes -= l.out.drop_stream(&key.stream);
                l.closed_streams.insert(key.stream);
            }
            self.enqueue(
                link,
                Frame::reset(key.stream, reason.as_str()),
                Lane::Control,
            );
        }
    }
}
