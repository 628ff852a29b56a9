//! Who pays (`secure-transport.md` §6.4, §8): the relay's state per client address, and
//! the handshake failures an environment's answers charge to the client link and the address
//! whose `OPEN` they answer.
//!
//! An address's `OPEN`s awaiting an answer reserve its failure tokens (the relay forwards one
//! only while they are fewer than its tokens), so every failure they can cause is paid for in
//! advance; an `OPEN` settles its token when it is answered or its route ends ([`Settle`]).
//! The table of addresses is swept amortized and bounded ([`MAX_TRACKED_ADDRESSES`]).
//!
//! It never reads a clock (the router's inputs bring `now`).

use std::sync::Arc;
use std::time::Instant;

use super::{LinkId, Route, Router, RoutingTable};
use crate::address::AddressKey;
use crate::bucket::TokenBucket;
use crate::reason::CloseReason;

/// What the relay keeps per client address (IPv4 address or IPv6 /64).
#[derive(Debug)]
pub(super) struct AddrState {
    /// Client links from it.
    pub(super) links: usize,
    /// Handshake failures its `OPEN`s caused, over all its links.
    pub(super) failures: TokenBucket,
    /// Its `OPEN`s forwarded and not yet answered (`ACCEPT` or `RESET`): never more than its
    /// failure tokens, so that every failure they can cause is paid for in advance.
    pub(super) pending_opens: usize,
    /// When its bucket was last charged (or the address first seen): the least recent are
    /// forgotten first when the table is full.
    pub(super) touched: Instant,
}

/// Addresses the relay keeps state for at most (links, pending `OPEN`s, a failure bucket not
/// yet full again: about 100 bytes each, so at most about 6 MiB). Only an attacker spread over
/// more addresses than this (IPv6 /64s) reaches it; then addresses without a link or a pending
/// `OPEN` are forgotten (their buckets start full again: a distributed attacker, which the
/// per-address bound does not claim to stop).
pub const MAX_TRACKED_ADDRESSES: usize = 1 << 16;

/// The address table is first swept when it holds this many entries.
pub(super) const PRUNE_ADDRESSES_FROM: usize = 128;

/// `RESET` reasons with which an environment refuses a handshake (§8): charged to the client
/// link and address whose `OPEN` they answer. `busy` and `too_many_streams` are load, never
/// charged.
pub const HANDSHAKE_FAILURE_REASONS: [&str; 4] = [
    "handshake_failed",
    "unauthorized",
    "replayed_handshake",
    "clock_skew",
];

impl<T: RoutingTable> Router<T> {
    /// Forget addresses with nothing left to remember (no link, no pending `OPEN`, a full
    /// failure bucket) once the table holds twice as many entries as links (amortized: a
    /// sweep at most every so many new links): an address cannot refill its bucket by closing
    /// its links and coming back. Past [`MAX_TRACKED_ADDRESSES`], addresses without a link or
    /// a pending `OPEN` are forgotten even with a bucket not yet full.
    pub(super) fn prune_addresses(&mut self, now: Instant) {
        if self.per_addr.len() < self.prune_addresses_at {
            return;
        }
        self.per_addr.retain(|_, a| {
            a.links > 0 || a.pending_opens > 0 || a.failures.remaining(now) < a.failures.burst()
        });
        if self.per_addr.len() >= MAX_TRACKED_ADDRESSES {
            // Full of addresses whose buckets are refilling: forget those without a link or a
            // pending OPEN, least recently charged first, down to three quarters.
            let mut idle: Vec<(Instant, AddressKey)> = self
                .per_addr
                .iter()
                .filter(|(_, a)| a.links == 0 && a.pending_opens == 0)
                .map(|(k, a)| (a.touched, *k))
                .collect();
            let excess = (self.per_addr.len() + 1)
                .saturating_sub(MAX_TRACKED_ADDRESSES * 3 / 4)
                .min(idle.len());
            if excess > 0 {
                idle.select_nth_unstable_by_key(excess - 1, |(t, _)| *t);
                for (_, k) in &idle[..excess] {
                    self.per_addr.remove(k);
                }
            }
        }
        // The next sweep once the table has doubled: each sweep is paid for by as many adds.
        self.prune_addresses_at =
            (2 * self.per_addr.len()).clamp(PRUNE_ADDRESSES_FROM, MAX_TRACKED_ADDRESSES);
    }

    /// Drop `addr`'s entry once it remembers nothing (no link, no pending `OPEN`, a full
    /// failure bucket).
    pub(super) fn forget_address_if_done(&mut self, addr: AddressKey) {
        let Some(now) = self.clock else {
            return;
        };
        if self.per_addr.get_mut(&addr).is_some_and(|a| {
            a.links == 0 && a.pending_opens == 0 && a.failures.remaining(now) >= a.failures.burst()
        }) {
            self.per_addr.remove(&addr);
        }
    }

    /// A route opened from address `addr` ended, or its `OPEN` was answered: its share of the
    /// address's streams for the environment is given back when it ends, and an `OPEN` still
    /// unanswered settles its reserved failure token as `how` says.
    pub(super) fn settle(
        &mut self,
        route: &Route,
        env: &Arc<str>,
        addr: Option<AddressKey>,
        how: Settle,
    ) {
        let Some(addr) = addr else {
            return;
        };
        if how != Settle::Answered {
            let key = (addr, env.clone());
            if let Some(n) = self.addr_env_streams.get_mut(&key) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.addr_env_streams.remove(&key);
                }
            }
        }
        if route.accepted {
            return;
        }
        let Some(now) = self.clock else {
            return;
        };
        if let Some(a) = self.per_addr.get_mut(&addr) {
            a.pending_opens = a.pending_opens.saturating_sub(1);
            if how == Settle::Abandoned {
                a.failures.take(now);
                a.touched = now;
                self.counters.abandoned_opens += 1;
            }
        }
    }

    /// An environment refused client link `link`'s `OPEN` with a handshake-failure reason:
    /// one token of the link's bucket and of its address's (§8). The failure that takes
    /// either's last token closes the link (`handshake_budget`); while the address has no
    /// token left, its new `OPEN`s are refused `busy` without reaching any environment.
    pub(super) fn charge_failure(&mut self, now: Instant, link: LinkId, addr: Option<AddressKey>) {
        self.counters.handshake_failures += 1;
        let mut empty = false;
        if let Some(b) = self.links.get_mut(&link).and_then(|l| l.failures.as_mut()) {
            b.take(now);
            empty |= b.remaining(now) == 0;
        }
        if let Some(a) = addr.and_then(|a| self.per_addr.get_mut(&a)) {
            a.failures.take(now);
            a.touched = now;
            empty |= a.failures.remaining(now) == 0;
        }
        if empty {
            self.close_link(link, CloseReason::HandshakeBudget);
        }
    }
}

/// How an `OPEN` whose route ends (or is answered) settles its address's reserved token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Settle {
    /// The environment answered `ACCEPT`: the token is given back (the route lives on).
    Answered,
    /// The route ended for a reason that is not the client's (its environment went, or
    /// answered with a refusal that is load, not a failure): the token is given back.
    Refund,
    /// The route ended before its answer by the client's doing (its `RESET`, a rule it broke,
    /// its link's death): the token is spent, since the environment may have answered with a
    /// failure the relay will never see.
    Abandoned,
    /// The environment answered with a handshake failure: the token is spent, and the link's
    /// bucket charged too ([`Router::charge_failure`]).
    Failed,
}
