//! The router's links: how a link is registered (an environment's, a client's, either side of
//! a relay-to-relay link), closed on the relay's own initiative or by its driver, and torn
//! down, resetting every stream it carried on the other side and settling the handshake
//! budgets those streams held (`budgets.rs`).
//!
//! It owns the invariants that concern a link's whole life: the live holder of an
//! environment id keeps it; a client link's death touches only the streams it opened; a
//! client link holding no stream starts its idle clock. It must never wait or do I/O: closing
//! is an event for the driver ([`RouterEvent::Close`]).

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use super::budgets::{AddrState, Settle};
use super::queue::OutQueue;
use super::{
    AddLinkError, Lane, Link, LinkId, LinkKind, RouteKey, Router, RouterEvent, RoutingTable,
    StreamChange, REVOKED_REMEMBERED,
};
use crate::address::AddressKey;
use crate::bucket::TokenBucket;
use crate::closed_set::ClosedSet;
use crate::frame::{Frame, StreamId};
use crate::keepalive::Keepalive;
use crate::reason::{CloseReason, Reason};

impl<T: RoutingTable> Router<T> {
    pub(super) fn new_link(
        &mut self,
        kind: LinkKind,
        env: Arc<str>,
        addr: Option<AddressKey>,
        now: Instant,
        seed: u64,
    ) -> LinkId {
        let id = self.next_id;
        self.next_id += 1;
        self.tick(now);
        let client = kind == LinkKind::Client;
        let opens = client.then(|| TokenBucket::per_second(self.cfg.opens_per_second, now));
        let failures = client.then(|| TokenBucket::new(self.cfg.handshake_failures, now));
        self.links.insert(
            id,
            Link {
                kind,
                env,
                addr,
                streams: HashSet::new(),
                out: OutQueue::default(),
                closed_streams: ClosedSet::new(self.cfg.closed_streams_remembered),
                malformed: TokenBucket::new(self.cfg.malformed_frames, now),
                unknown: TokenBucket::new(self.cfg.unknown_stream_frames, now),
                opens,
                failures,
                idle_since: client.then_some(now),
                keepalive: Keepalive::new(self.cfg.keepalive, now, seed),
                wake_pending: false,
                forward: false,
            },
        );
        id
    }

    /// Mark `link` as one end of a relay-to-relay link: no idle reaping, traffic counted as
    /// forwarded.
    pub(super) fn mark_forward(&mut self, link: LinkId) {
        if let Some(l) = self.links.get_mut(&link) {
            l.forward = true;
            l.idle_since = None;
        }
    }

    /// Register the forwarding side of a relay-to-relay link (cluster): a link to the relay
    /// that holds `env`'s environment link, which takes the place of that environment's link
    /// here (the holder answers `OPEN`s as the environment would). Refused like
    /// [`add_environment_link`](Self::add_environment_link) while a link holds the id.
    pub fn add_forward_environment_link(
        &mut self,
        now: Instant,
        env: &str,
        seed: u64,
    ) -> Result<LinkId, AddLinkError> {
        let id = self.add_environment_link(now, env, seed)?;
        self.mark_forward(id);
        Ok(id)
    }

    /// Register the holder's side of a relay-to-relay link (cluster): one more client link of
    /// `env`, from an authenticated relay rather than an address (no per-address limits; the
    /// caller bounds relay links), never reaped for idleness.
    pub fn add_relay_client_link(&mut self, now: Instant, env: &str, seed: u64) -> LinkId {
        let id = self.new_link(LinkKind::Client, Arc::from(env), None, now, seed);
        self.mark_forward(id);
        id
    }

    /// Close `env`'s environment link with `reason` (cluster: a newer holder elsewhere took
    /// the id, or the environment must re-dial to its new home). Its streams reset
    /// `environment_gone`. False if it has no link.
    pub fn close_environment(&mut self, env: &str, reason: CloseReason) -> bool {
        match self.envs.get(env).and_then(|e| e.link) {
            Some(link) => {
                self.close_link(link, reason);
                true
            }
            None => false,
        }
    }

    /// Close every client link of `env` with `reason`, relay-to-relay links included
    /// (cluster: the environment's link here ended, or the relay-to-relay link standing for
    /// it did, so its clients must dial again to find the environment). Returns how many.
    pub fn close_clients(&mut self, env: &str, reason: CloseReason) -> usize {
        let links: Vec<LinkId> = self
            .links
            .iter()
            .filter(|(_, l)| l.kind == LinkKind::Client && &*l.env == env)
            .map(|(id, _)| *id)
            .collect();
        for l in &links {
            self.close_link(*l, reason);
        }
        links.len()
    }

    /// The client links of `env` (cluster: whether a relay-to-relay link is still used).
    pub fn client_link_count(&self, env: &str) -> usize {
        self.links
            .values()
            .filter(|l| l.kind == LinkKind::Client && &*l.env == env)
            .count()
    }

    /// Register an environment link whose handshake (§6.2) succeeded. While another link
    /// holds the id this is refused ([`AddLinkError::Held`]): the caller probes the holder
    /// ([`Router::probe`]) and tries again once it is gone; the live holder keeps the id.
    pub fn add_environment_link(
        &mut self,
        now: Instant,
        env: &str,
        seed: u64,
    ) -> Result<LinkId, AddLinkError> {
        self.tick(now);
        let env: Arc<str> = Arc::from(env);
        if let Some(holder) = self.envs.get(&env).and_then(|e| e.link) {
            return Err(AddLinkError::Held { holder });
        }
        if self.environment_count() >= self.cfg.max_environments {
            return Err(AddLinkError::TooManyEnvironments);
        }
        let id = self.new_link(LinkKind::Environment, env.clone(), None, now, seed);
        self.revoked.retain(|r| *r != env);
        self.envs.entry(env).or_default().link = Some(id);
        Ok(id)
    }

    /// Register a client link for environment `env` from `addr` (the environment need not be
    /// online: its `OPEN`s are then refused `environment_offline`).
    pub fn add_client_link(
        &mut self,
        now: Instant,
        env: &str,
        addr: IpAddr,
        seed: u64,
    ) -> Result<LinkId, AddLinkError> {
        self.tick(now);
        let addr = AddressKey::of(addr);
        let n = self.per_addr.get(&addr).map_or(0, |a| a.links);
        if n >= self.cfg.max_client_links_per_address {
            return Err(AddLinkError::TooManyLinksFromAddress);
        }
        self.prune_addresses(now);
        let failures = self.cfg.address_handshake_failures;
        self.per_addr
            .entry(addr)
            .or_insert_with(|| AddrState {
                links: 0,
                failures: TokenBucket::new(failures, now),
                pending_opens: 0,
                touched: now,
            })
            .links += 1;
        Ok(self.new_link(LinkKind::Client, Arc::from(env), Some(addr), now, seed))
    }

    /// The environment is no longer listed: close its link at once (its streams reset
    /// `environment_revoked`), and refuse its `OPEN`s so from now on.
    pub fn remove_environment(&mut self, env: &str) {
        if !self.revoked.iter().any(|r| &**r == env) {
            if self.revoked.len() >= REVOKED_REMEMBERED {
                self.revoked.pop_front();
            }
            self.revoked.push_back(Arc::from(env));
        }
        if let Some(link) = self.envs.get(env).and_then(|e| e.link) {
            self.close_link(link, CloseReason::Revoked);
        }
    }

    /// Whether `env` was revoked (and not listed again since).
    pub fn is_revoked(&self, env: &str) -> bool {
        self.revoked.iter().any(|r| &**r == env)
    }

    /// The driver saw `link` end (socket closed, write deadline, shutdown): reset its streams
    /// on the other side and forget it. Idempotent.
    pub fn link_closed(&mut self, link: LinkId, reason: CloseReason) {
        self.teardown(link, reason);
    }

    /// Close a link on the relay's own initiative; the driver is told to close the socket.
    pub(super) fn close_link(&mut self, link: LinkId, reason: CloseReason) {
        if self.teardown(link, reason) {
            self.events.push_back(RouterEvent::Close { link, reason });
        }
    }

    /// Forget `link`, resetting its streams on the other side. False if it was gone.
    pub(super) fn teardown(&mut self, link: LinkId, reason: CloseReason) -> bool {
        let Some(l) = self.links.remove(&link) else {
            return false;
        };
        self.counters.closed(reason);
        self.queued_bytes -= l.out.bytes();
        if let Some(addr) = l.addr {
            if let Some(a) = self.per_addr.get_mut(&addr) {
                a.links -= 1;
            }
        }
        match l.kind {
            LinkKind::Client => {
                for s in l.streams {
                    let key = RouteKey {
                        env: l.env.clone(),
                        stream: s,
                    };
                    if let Some(route) = self.table.remove(&key) {
                        if let Some(e) = self.envs.get_mut(&l.env) {
                            e.streams.remove(&s);
                        }
                        if let Some(e) = self.links.get_mut(&route.env_link) {
                            e.closed_streams.insert(s);
                        }
                        // An OPEN that dies with its link before its answer costs its token:
                        // otherwise a client could send OPENs that fail, close its link
                        // before the failures come back, and never pay for them.
                        self.settle(&route, &l.env, l.addr, Settle::Abandoned);
                        self.counters.reset(Reason::ClientGone);
                        self.stream_event(link, s, StreamChange::Reset(Reason::ClientGone));
                        let reset = Frame::reset(s, Reason::ClientGone.as_str());
                        self.enqueue(route.env_link, reset, Lane::AfterData);
                    }
                }
            }
            LinkKind::Environment => {
                let streams = match self.envs.get_mut(&l.env) {
                    Some(e) if e.link == Some(link) => {
                        e.link = None;
                        std::mem::take(&mut e.streams)
                    }
                    _ => HashSet::new(),
                };
                let why = if self.is_revoked(&l.env) {
                    Reason::EnvironmentRevoked
                } else {
                    Reason::EnvironmentGone
                };
                for s in streams {
                    let key = RouteKey {
                        env: l.env.clone(),
                        stream: s,
                    };
                    if let Some(route) = self.table.remove(&key) {
                        let addr = self.links.get(&route.client).and_then(|c| c.addr);
                        self.settle(&route, &l.env, addr, Settle::Refund);
                        self.client_lost_stream(route.client, &s);
                        if let Some(c) = self.links.get_mut(&route.client) {
                            c.closed_streams.insert(s);
                        }
                        self.counters.reset(why);
                        self.stream_event(route.client, s, StreamChange::Reset(why));
                        let reset = Frame::reset(s, why.as_str());
                        self.enqueue(route.client, reset, Lane::AfterData);
                    }
                }
            }
        }
        if let Some(addr) = l.addr {
            self.forget_address_if_done(addr);
        }
        if self
            .envs
            .get(&l.env)
            .is_some_and(|e| e.link.is_none() && e.streams.is_empty())
        {
            self.envs.remove(&l.env);
        }
        true
    }

    /// Client link `link` no longer holds `stream`; with no stream left, its idle clock starts
    /// (and its reader is told to look at its timer again).
    pub(super) fn client_lost_stream(&mut self, link: LinkId, stream: &StreamId) {
        let now = self.clock;
        if let Some(l) = self.links.get_mut(&link) {
            l.streams.remove(stream);
            if l.kind == LinkKind::Client
                && !l.forward
                && l.streams.is_empty()
                && l.idle_since.is_none()
            {
                l.idle_since = now;
                self.events.push_back(RouterEvent::Rearm { link });
            }
        }
    }
}
