//! The replay cache of handshake message 1 (`secure-transport.md` §3), sans-IO, shared by the
//! exec server (the `ts` of every stream's message 1, per client key: `execrelay::noise::
//! timestamp`) and the relay (the `ts` of every environment link's message 1, per environment
//! id: [`crate::env_handshake`]).
//!
//! A message 1 carries `ts`, microseconds since the Unix epoch, fresh for every handshake. A
//! `ts` is admitted only if it is
//!
//! 1. within the clock window (`HANDSHAKE_CLOCK_WINDOW`, ±2 minutes by default) of the
//!    verifier's clock;
//! 2. **not earlier than the moment the verifier started** (the cache lives in memory: without
//!    this, a restart would open a replay window for every message 1 captured before it);
//! 3. not already accepted (or awaiting acceptance) for that key: the cache keeps every `ts`
//!    it accepted per key until it leaves the window, when the clock check refuses its replay
//!    anyway.
//!
//! This is a set per key, not a high-water mark: honest parallel clients of one key (several
//! processes, several links) stamp independently and arrive in any order, and each is
//! accepted once; a stamp far ahead of the clock cannot lock the real key out either.
//!
//! # Bounds
//!
//! - Per key: at most `per_key` stamps in the window (accepted and pending together,
//!   `MAX_HANDSHAKES_PER_KEY_WINDOW` = 4096 by default); beyond it that key's new handshakes
//!   are refused ([`ReplayError::KeyBusy`], sent as `busy`) until old stamps age out. That
//!   costs the key alone.
//! - Keys: at most `max_keys`; stamps over all keys: at most `max_stamps`. Past either, the
//!   least recently accepted key is forgotten whole (its replays within the window are then
//!   caught only by the start rule and the clock). Only admitted handshakes (authorized keys,
//!   listed environments) are recorded, so strangers cannot push keys out.
//!
//! It never reads a clock (callers pass `now` in microseconds since the epoch, as
//! [`unix_micros`] turns a clock reading into) and never logs.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::Hash;
use std::time::{Duration, SystemTime};

/// `t` in microseconds since the Unix epoch, the unit of `ts` and of every `now` this cache
/// is fed (0 before the epoch; saturating far in the future).
pub fn unix_micros(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// How far a message 1's `ts` may be from the verifier's clock, either way
/// (`secure-transport.md` §3 `HANDSHAKE_CLOCK_WINDOW`). It is also how long the cache must
/// keep a stamp: once a `ts` is this old, the clock check refuses its replay.
pub const HANDSHAKE_CLOCK_WINDOW: Duration = Duration::from_secs(120);

/// Stamps one key may have in the window at once (§3 `MAX_HANDSHAKES_PER_KEY_WINDOW`): 4096
/// handshakes of one key within ±2 minutes is far beyond honest use (about 17 per second
/// sustained), and it bounds the cache per key.
pub const MAX_HANDSHAKES_PER_KEY_WINDOW: usize = 4096;

/// Stamps kept over all keys: about 20 bytes each in a `BTreeSet`, so at most about 5 MiB.
/// Enough for a thousand accepted handshakes a second within the window; past it the least
/// recently used key is forgotten first.
pub const MAX_TRACKED_STAMPS: usize = 1 << 18;

/// Why a `ts` is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayError {
    /// Further from the verifier's clock than the window.
    #[error(
        "the peer's clock is {} s {} ours, more than the {} s allowed: fix the clock of one of them",
        secs(ts.abs_diff(*now)),
        if ts < now { "behind" } else { "ahead of" },
        window.as_secs()
    )]
    ClockSkew {
        /// The refused `ts`.
        ts: u64,
        /// The verifier's clock.
        now: u64,
        /// The window.
        window: Duration,
    },
    /// Stamped before the verifier started: a message 1 captured before a restart, or a peer
    /// whose clock is behind ours and which stamped it just before we came up.
    #[error(
        "message 1 was stamped {} s before this process started: a replay of one captured \
         before the restart, or the peer's clock is behind ours",
        secs(started.saturating_sub(*ts))
    )]
    BeforeStart {
        /// The refused `ts`.
        ts: u64,
        /// When the verifier started.
        started: u64,
    },
    /// Already accepted, or awaiting acceptance, for this key: a replayed message 1.
    #[error("replayed message 1: its ts {ts} was already seen for this key")]
    Replayed {
        /// The refused `ts`.
        ts: u64,
    },
    /// The key has its maximum of stamps in the window.
    #[error(
        "{limit} handshakes of this key within the clock window: refused until older ones age out"
    )]
    KeyBusy {
        /// The per-key limit.
        limit: usize,
    },
}

fn secs(micros: u64) -> String {
    format!("{}.{}", micros / 1_000_000, (micros % 1_000_000) / 100_000)
}

impl ReplayError {
    /// The `RESET` reason (and metrics label) of this refusal.
    pub fn reset_reason(&self) -> &'static str {
        match self {
            ReplayError::ClockSkew { .. } => "clock_skew",
            ReplayError::BeforeStart { .. } | ReplayError::Replayed { .. } => "replayed_handshake",
            ReplayError::KeyBusy { .. } => "busy",
        }
    }
}

/// The limits of one cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplayLimits {
    /// The clock window ([`HANDSHAKE_CLOCK_WINDOW`]).
    pub window: Duration,
    /// Stamps per key in the window ([`MAX_HANDSHAKES_PER_KEY_WINDOW`]).
    pub per_key: usize,
    /// Keys remembered.
    pub max_keys: usize,
    /// Stamps remembered over all keys ([`MAX_TRACKED_STAMPS`]).
    pub max_stamps: usize,
}

impl ReplayLimits {
    /// The defaults, remembering at most `max_keys` keys.
    pub fn with_keys(max_keys: usize) -> ReplayLimits {
        ReplayLimits {
            window: HANDSHAKE_CLOCK_WINDOW,
            per_key: MAX_HANDSHAKES_PER_KEY_WINDOW,
            max_keys,
            max_stamps: MAX_TRACKED_STAMPS,
        }
    }
}

#[derive(Debug, Default)]
struct KeyStamps {
    accepted: BTreeSet<u64>,
    /// Stamps of handshakes checked and not yet accepted or released (authorization pending).
    pending: Vec<u64>,
    /// Position in the use order (only keys with accepted stamps have one).
    used: Option<u64>,
}

impl KeyStamps {
    fn is_empty(&self) -> bool {
        self.accepted.is_empty() && self.pending.is_empty()
    }
}

/// The replay cache, per key `K` (a client's static key, an environment id).
#[derive(Debug)]
pub struct ReplayCache<K> {
    limits: ReplayLimits,
    window_us: u64,
    started: u64,
    keys: HashMap<K, KeyStamps>,
    /// Use order of keys with accepted stamps: position → key, least recent first.
    order: BTreeMap<u64, K>,
    next_use: u64,
    stamps: usize,
}

impl<K: Eq + Hash + Clone> ReplayCache<K> {
    /// An empty cache for a verifier that started at `started` (microseconds since the
    /// epoch): nothing stamped earlier is ever admitted.
    pub fn new(limits: ReplayLimits, started: u64) -> Self {
        ReplayCache {
            window_us: u64::try_from(limits.window.as_micros()).unwrap_or(u64::MAX),
            limits: ReplayLimits {
                per_key: limits.per_key.max(1),
                max_keys: limits.max_keys.max(1),
                max_stamps: limits.max_stamps.max(1),
                ..limits
            },
            started,
            keys: HashMap::new(),
            order: BTreeMap::new(),
            next_use: 0,
            stamps: 0,
        }
    }

    /// The limits.
    pub fn limits(&self) -> &ReplayLimits {
        &self.limits
    }

    /// When the verifier started (microseconds since the epoch).
    pub fn started(&self) -> u64 {
        self.started
    }

    /// Check `ts` for `key` at `now` (microseconds since the epoch) without recording it.
    pub fn check(&mut self, key: &K, ts: u64, now: u64) -> Result<(), ReplayError> {
        if ts.abs_diff(now) > self.window_us {
            return Err(ReplayError::ClockSkew {
                ts,
                now,
                window: self.limits.window,
            });
        }
        if ts < self.started {
            return Err(ReplayError::BeforeStart {
                ts,
                started: self.started,
            });
        }
        self.expire_key(key, now);
        let Some(k) = self.keys.get(key) else {
            return Ok(());
        };
        if k.accepted.contains(&ts) || k.pending.contains(&ts) {
            return Err(ReplayError::Replayed { ts });
        }
        if k.accepted.len() + k.pending.len() >= self.limits.per_key {
            return Err(ReplayError::KeyBusy {
                limit: self.limits.per_key,
            });
        }
        Ok(())
    }

    /// [`check`](Self::check), then hold `ts` as pending (its handshake awaits authorization):
    /// a replay of it is refused until it is [`accept`](Self::accept)ed or
    /// [`release`](Self::release)d.
    pub fn hold(&mut self, key: &K, ts: u64, now: u64) -> Result<(), ReplayError> {
        self.check(key, ts, now)?;
        self.keys.entry(key.clone()).or_default().pending.push(ts);
        Ok(())
    }

    /// A pending handshake stamped `ts` was dropped (refused, reset, its link ended): forget
    /// it.
    pub fn release(&mut self, key: &K, ts: u64) {
        if let Some(k) = self.keys.get_mut(key) {
            if let Some(i) = k.pending.iter().position(|&t| t == ts) {
                k.pending.swap_remove(i);
            }
            if k.is_empty() {
                self.forget(key);
            }
        }
    }

    /// A handshake stamped `ts` was accepted: remember the stamp until it leaves the window
    /// (a pending one moves from pending to accepted).
    pub fn accept(&mut self, key: &K, ts: u64, now: u64) {
        let use_at = self.next_use;
        self.next_use += 1;
        let k = self.keys.entry(key.clone()).or_default();
        if let Some(i) = k.pending.iter().position(|&t| t == ts) {
            k.pending.swap_remove(i);
        }
        if k.accepted.insert(ts) {
            self.stamps += 1;
        }
        if let Some(old) = k.used.replace(use_at) {
            self.order.remove(&old);
        }
        self.order.insert(use_at, key.clone());
        self.shrink(key, now);
    }

    /// [`check`](Self::check) and [`accept`](Self::accept) in one step, for a verifier whose
    /// admission does not wait (the relay's environment links).
    pub fn admit(&mut self, key: &K, ts: u64, now: u64) -> Result<(), ReplayError> {
        self.check(key, ts, now)?;
        self.accept(key, ts, now);
        Ok(())
    }

    /// Whether `ts` is remembered as accepted for `key`.
    pub fn accepted(&self, key: &K, ts: u64) -> bool {
        self.keys.get(key).is_some_and(|k| k.accepted.contains(&ts))
    }

    /// Keys remembered (with accepted or pending stamps).
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether no key is remembered.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Accepted stamps remembered over all keys.
    pub fn stamps(&self) -> usize {
        self.stamps
    }

    /// Drop `key`'s accepted stamps that left the window: their replays fail the clock check.
    fn expire_key(&mut self, key: &K, now: u64) {
        let horizon = now.saturating_sub(self.window_us);
        let Some(k) = self.keys.get_mut(key) else {
            return;
        };
        let keep = k.accepted.split_off(&horizon);
        let gone = k.accepted.len();
        k.accepted = keep;
        self.stamps -= gone;
        if k.is_empty() {
            self.forget(key);
        }
    }

    fn forget(&mut self, key: &K) {
        if let Some(k) = self.keys.remove(key) {
            self.stamps -= k.accepted.len();
            if let Some(at) = k.used {
                self.order.remove(&at);
            }
        }
    }

    /// Keep within the limits after `just` was accepted: expired stamps go first, then the
    /// least recently used keys (never `just`).
    fn shrink(&mut self, just: &K, now: u64) {
        if self.keys.len() <= self.limits.max_keys && self.stamps <= self.limits.max_stamps {
            return;
        }
        let all: Vec<K> = self.order.values().cloned().collect();
        for key in &all {
            self.expire_key(key, now);
        }
        while self.keys.len() > self.limits.max_keys || self.stamps > self.limits.max_stamps {
            let victim = self
                .order
                .values()
                .find(|k| *k != just)
                .cloned()
                .or_else(|| self.keys.keys().find(|k| *k != just).cloned());
            match victim {
                Some(v) => self.forget(&v),
                None => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_764_547_200_123_456;
    const MIN: u64 = 60_000_000;

    fn cache(per_key: usize, max_keys: usize) -> ReplayCache<u8> {
        ReplayCache::new(
            ReplayLimits {
                window: HANDSHAKE_CLOCK_WINDOW,
                per_key,
                max_keys,
                max_stamps: 1000,
            },
            NOW - 10 * MIN,
        )
    }

    /// Parallel clients of one key stamp independently and arrive in any order: each stamp
    /// is accepted once, whatever came before it; a second arrival of any is a replay.
    #[test]
    fn stamps_of_one_key_are_accepted_in_any_order_and_each_once() {
        let mut c = cache(16, 4);
        for ts in [NOW + 5, NOW + 1, NOW + 9, NOW - 3, NOW] {
            c.admit(&1, ts, NOW).unwrap();
        }
        for ts in [NOW + 5, NOW + 1, NOW + 9, NOW - 3, NOW] {
            assert_eq!(c.admit(&1, ts, NOW), Err(ReplayError::Replayed { ts }));
        }
        assert_eq!(c.stamps(), 5);
        // Another key has its own history.
        c.admit(&2, NOW, NOW).unwrap();
    }

    /// A stamp far ahead (within the window) locks nobody out: later honest stamps below it
    /// still pass.
    #[test]
    fn a_stamp_ahead_of_the_clock_does_not_lock_the_key_out() {
        let mut c = cache(16, 4);
        c.admit(&1, NOW + 2 * MIN, NOW).unwrap();
        c.admit(&1, NOW + 1, NOW).unwrap();
        c.admit(&1, NOW + 2, NOW + 1).unwrap();
    }

    /// The window is ±2 minutes, exactly: at its edge a stamp passes, one microsecond past
    /// it is `clock_skew` (both ways).
    #[test]
    fn the_clock_window_is_two_minutes_either_way_at_its_edge() {
        let mut c = cache(16, 4);
        c.admit(&1, NOW - 2 * MIN, NOW).unwrap();
        c.admit(&1, NOW + 2 * MIN, NOW).unwrap();
        let late = c.admit(&1, NOW - 2 * MIN - 1, NOW).unwrap_err();
        assert_eq!(late.reset_reason(), "clock_skew");
        assert!(late.to_string().contains("120.0 s behind"), "{late}");
        let early = c.admit(&1, NOW + 2 * MIN + 1, NOW).unwrap_err();
        assert!(early.to_string().contains("ahead of"), "{early}");
    }

    /// Nothing stamped before the verifier started passes, even inside the window: a message
    /// 1 captured before a restart cannot be replayed after it. At the start instant exactly,
    /// it passes.
    #[test]
    fn nothing_stamped_before_the_start_is_admitted() {
        let started = NOW;
        let mut c: ReplayCache<u8> = ReplayCache::new(ReplayLimits::with_keys(4), started);
        let e = c.admit(&1, started - 1, NOW + 1).unwrap_err();
        assert_eq!(
            e,
            ReplayError::BeforeStart {
                ts: started - 1,
                started
            }
        );
        assert_eq!(e.reset_reason(), "replayed_handshake");
        c.admit(&1, started, NOW + 1).unwrap();
    }

    /// Per key at most `per_key` stamps in the window: the next is `busy` for that key alone,
    /// and once the oldest leaves the window, one more passes.
    #[test]
    fn a_key_at_its_limit_is_busy_alone_until_its_stamps_age_out() {
        let mut c = cache(3, 4);
        for i in 0..3 {
            c.admit(&1, NOW + i, NOW).unwrap();
        }
        let e = c.admit(&1, NOW + 3, NOW).unwrap_err();
        assert_eq!(e, ReplayError::KeyBusy { limit: 3 });
        assert_eq!(e.reset_reason(), "busy");
        c.admit(&2, NOW + 3, NOW).unwrap();
        // Pending stamps count too.
        c.hold(&2, NOW + 4, NOW).unwrap();
        c.hold(&2, NOW + 5, NOW).unwrap();
        assert!(c.hold(&2, NOW + 6, NOW).is_err());
        // The first stamp leaves the window (2 minutes after it): one more passes.
        let later = NOW + 2 * MIN + 1;
        c.admit(&1, later, later).unwrap();
        assert!(c.admit(&1, later + 1, later).is_err(), "again at the limit");
    }

    /// A pending stamp blocks its own replay; released, it is forgotten; accepted, it stays.
    #[test]
    fn a_pending_stamp_blocks_its_replay_and_is_forgotten_when_released() {
        let mut c = cache(16, 4);
        c.hold(&1, NOW, NOW).unwrap();
        assert_eq!(c.hold(&1, NOW, NOW), Err(ReplayError::Replayed { ts: NOW }));
        c.hold(&1, NOW - 1, NOW).unwrap();
        c.release(&1, NOW);
        c.release(&1, NOW - 1);
        assert!(c.is_empty(), "nothing left behind");
        c.hold(&1, NOW, NOW).unwrap();
        c.accept(&1, NOW, NOW);
        assert!(c.accepted(&1, NOW));
        assert!(c.hold(&1, NOW, NOW).is_err());
    }

    /// Past `max_keys`, the least recently accepted key is forgotten first; past
    /// `max_stamps`, likewise; expired stamps go before any live key is forgotten.
    #[test]
    fn the_least_recently_used_key_is_forgotten_first_and_expired_stamps_before_it() {
        let mut c = cache(16, 3);
        for k in 1..=3u8 {
            c.admit(&k, NOW + u64::from(k), NOW).unwrap();
        }
        c.admit(&1, NOW + 10, NOW).unwrap(); // key 2 is now the least recently used
        c.admit(&4, NOW + 11, NOW).unwrap();
        assert_eq!(c.len(), 3);
        assert!(!c.accepted(&2, NOW + 2), "key 2 was forgotten");
        assert!(c.accepted(&3, NOW + 3) && c.accepted(&1, NOW + 10));

        let mut s: ReplayCache<u8> = ReplayCache::new(
            ReplayLimits {
                window: HANDSHAKE_CLOCK_WINDOW,
                per_key: 16,
                max_keys: 16,
                max_stamps: 4,
            },
            NOW - 10 * MIN,
        );
        for i in 0..4 {
            s.admit(&1, NOW - MIN + i, NOW - MIN).unwrap();
        }
        // Three minutes on, key 1's stamps are out of the window: they go, no key is lost.
        let later = NOW + 2 * MIN;
        s.admit(&2, later, later).unwrap();
        assert_eq!(s.stamps(), 1);
        for i in 1..=4 {
            s.admit(&3, later + i, later).unwrap();
        }
        assert!(s.stamps() <= 4);
        assert!(s.accepted(&3, later + 4));
        assert!(!s.accepted(&2, later), "the least recently used key went");
    }
}
