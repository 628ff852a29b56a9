//! The timestamp of handshake message 1 (`secure-transport.md` §3), which stops a captured
//! message 1 from being replayed, as WireGuard's timestamp does.
//!
//! - Client side: [`next_hello_ts`], microseconds since the Unix epoch, strictly increasing
//!   across every handshake of the process (so per client key too).
//! - Server side: [`HelloTimestamps`], sans-IO: the largest `ts` accepted per client key, in a
//!   bounded LRU ([`TRACKED_CLIENT_KEYS`]), plus the `ts` of handshakes still waiting for
//!   authorization; and [`Admission`], the guard a pending handshake holds until it is
//!   authorized (the `ts` is then recorded) or dropped (it is forgotten).
//!
//! Only authorized handshakes enter the LRU, so unauthorized keys (anyone can make one) cannot
//! push authorized keys out of it. A handshake waiting for authorization still blocks a
//! replay of its own message 1 (a replay carries the very same `ts`), but not another
//! handshake of the same key with a smaller `ts` that was stamped first and overtaken on the
//! way (two links of one client, two processes sharing a key): only accepted handshakes
//! raise the bar. This module never reads a clock on the server side (the caller passes
//! `now`) and never logs key material.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use super::keys::{fingerprint, KEY_BYTES};

/// How far a client's `ts` may be from the server's clock, either way (`secure-transport.md`
/// §3: 10 minutes). It also bounds how long a forgotten key's message 1 can be replayed: once
/// its `ts` is this old, the clock check refuses it anyway. One value with the relay's check
/// of environment links.
pub const MAX_CLOCK_SKEW: Duration = execrelay_relay::env_handshake::MAX_CLOCK_SKEW;

/// Client keys whose largest accepted `ts` the server remembers; past it, the least recently
/// accepted key is forgotten first. An entry is about 100 bytes, so the table stays under
/// half a MiB. Forgetting a key matters only if it is replayed within [`MAX_CLOCK_SKEW`] of
/// its capture, so this is the number of distinct authorized keys that can handshake within
/// 10 minutes without weakening the replay check; more than that is beyond the deployments
/// one exec server is meant for.
pub const TRACKED_CLIENT_KEYS: usize = 4096;

type ClientKey = [u8; KEY_BYTES];

/// Microseconds since the Unix epoch (0 before it; saturating far in the future).
pub fn unix_micros(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// The last `ts` this process sent.
static LAST_HELLO_TS: AtomicU64 = AtomicU64::new(0);

/// The `ts` for the next message 1 this process sends: now in microseconds since the Unix
/// epoch, or one more than the previous one if the clock has not moved past it. Shared by
/// every key of the process, which makes it strictly increasing per key as well.
pub fn next_hello_ts() -> u64 {
    next_after(&LAST_HELLO_TS, unix_micros(SystemTime::now()))
}

fn next_after(last: &AtomicU64, now: u64) -> u64 {
    let step = |prev: u64| now.max(prev.saturating_add(1));
    match last.fetch_update(Ordering::AcqRel, Ordering::Acquire, |p| Some(step(p))) {
        Ok(prev) | Err(prev) => step(prev),
    }
}

/// Why a message 1's `ts` is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TimestampError {
    /// Further from the server's clock than [`MAX_CLOCK_SKEW`].
    #[error(
        "the client's clock is {} s {} the server's, more than the {} s allowed: \
         fix the clock of the client or of the server",
        skew_secs(*client_ts, *server_ts),
        if client_ts < server_ts { "behind" } else { "ahead of" },
        MAX_CLOCK_SKEW.as_secs()
    )]
    ClockSkew {
        /// The client's `ts`.
        client_ts: u64,
        /// The server's clock.
        server_ts: u64,
    },
    /// Not larger than the largest accepted for this key, or the `ts` of one of its
    /// handshakes still awaiting authorization: a replayed message 1.
    #[error("replayed message 1: its ts {ts} is not above {last}, already seen for this key")]
    Replayed {
        /// The refused `ts`.
        ts: u64,
        /// The largest accepted for the key, or `ts` itself when a pending handshake has it.
        last: u64,
    },
}

fn skew_secs(a: u64, b: u64) -> String {
    format!("{:.1}", a.abs_diff(b) as f64 / 1e6)
}

impl TimestampError {
    /// The `RESET` reason and metrics label for this refusal.
    pub fn reset_reason(&self) -> &'static str {
        match self {
            TimestampError::ClockSkew { .. } => "clock_skew",
            TimestampError::Replayed { .. } => "replayed_handshake",
        }
    }
}

/// The server's memory of message-1 timestamps, sans-IO.
#[derive(Debug)]
pub struct HelloTimestamps {
    capacity: usize,
    /// Largest accepted `ts` per key, and the key's position in `order`.
    accepted: HashMap<ClientKey, (u64, u64)>,
    /// Use order: position → key; the first entry is the least recently used.
    order: BTreeMap<u64, ClientKey>,
    next_use: u64,
    /// The `ts` of handshakes waiting for authorization, per key. Bounded by the pending
    /// authorizations of all links.
    pending: HashMap<ClientKey, Vec<u64>>,
}

impl HelloTimestamps {
    /// A table remembering at most `capacity` keys ([`TRACKED_CLIENT_KEYS`] in the server).
    pub fn new(capacity: usize) -> Self {
        HelloTimestamps {
            capacity: capacity.max(1),
            accepted: HashMap::new(),
            order: BTreeMap::new(),
            next_use: 0,
            pending: HashMap::new(),
        }
    }

    /// Check a message 1's `ts` against the clock (`now`, microseconds since the epoch) and
    /// this key's history; if it passes, hold it as pending until [`accept`](Self::accept)
    /// or [`release`](Self::release).
    pub fn admit(&mut self, key: &ClientKey, ts: u64, now: u64) -> Result<(), TimestampError> {
        let max_skew = u64::try_from(MAX_CLOCK_SKEW.as_micros()).unwrap_or(u64::MAX);
        if ts.abs_diff(now) > max_skew {
            return Err(TimestampError::ClockSkew {
                client_ts: ts,
                server_ts: now,
            });
        }
        if let Some(last) = self.last_accepted(key).filter(|&last| ts <= last) {
            return Err(TimestampError::Replayed { ts, last });
        }
        let pending = self.pending.entry(*key).or_default();
        if pending.contains(&ts) {
            return Err(TimestampError::Replayed { ts, last: ts });
        }
        pending.push(ts);
        Ok(())
    }

    /// The pending handshake stamped `ts` was dropped (refused, reset, or its link ended):
    /// forget it.
    pub fn release(&mut self, key: &ClientKey, ts: u64) {
        if let Some(pending) = self.pending.get_mut(key) {
            if let Some(i) = pending.iter().position(|&t| t == ts) {
                pending.swap_remove(i);
            }
            if pending.is_empty() {
                self.pending.remove(key);
            }
        }
    }

    /// A pending handshake was authorized: remember its `ts` as accepted (the key becomes
    /// the most recently used; the least recently used one is forgotten if the table is
    /// full).
    pub fn accept(&mut self, key: &ClientKey, ts: u64) {
        self.release(key, ts);
        let best = match self.accepted.remove(key) {
            Some((old, at)) => {
                self.order.remove(&at);
                old.max(ts)
            }
            None => {
                if self.accepted.len() >= self.capacity {
                    if let Some((_, oldest)) = self.order.pop_first() {
                        self.accepted.remove(&oldest);
                    }
                }
                ts
            }
        };
        let at = self.next_use;
        self.next_use += 1;
        self.order.insert(at, *key);
        self.accepted.insert(*key, (best, at));
    }

    /// The largest accepted `ts` of `key`, if it is remembered.
    pub fn last_accepted(&self, key: &ClientKey) -> Option<u64> {
        self.accepted.get(key).map(|&(ts, _)| ts)
    }

    /// Keys remembered.
    pub fn len(&self) -> usize {
        self.accepted.len()
    }

    /// Whether no key is remembered.
    pub fn is_empty(&self) -> bool {
        self.accepted.is_empty()
    }
}

/// The table shared by every link of a listener.
pub type SharedHelloTimestamps = Arc<Mutex<HelloTimestamps>>;

/// A message 1 whose `ts` passed, held while its handshake waits for authorization. Dropped
/// without [`accept`](Admission::accept), it is forgotten (the key is not remembered).
pub struct Admission {
    table: SharedHelloTimestamps,
    key: ClientKey,
    ts: u64,
    settled: bool,
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admission")
            .field("client", &fingerprint(&self.key))
            .field("ts", &self.ts)
            .finish()
    }
}

fn locked(table: &SharedHelloTimestamps) -> std::sync::MutexGuard<'_, HelloTimestamps> {
    // The table holds no invariant a panic elsewhere could break half-way.
    table.lock().unwrap_or_else(|p| p.into_inner())
}

impl Admission {
    /// [`HelloTimestamps::admit`] on the shared table.
    pub fn admit(
        table: &SharedHelloTimestamps,
        key: &ClientKey,
        ts: u64,
        now: u64,
    ) -> Result<Admission, TimestampError> {
        locked(table).admit(key, ts, now)?;
        Ok(Admission {
            table: table.clone(),
            key: *key,
            ts,
            settled: false,
        })
    }

    /// The handshake was authorized: remember its `ts`.
    pub fn accept(mut self) {
        self.settled = true;
        locked(&self.table).accept(&self.key, self.ts);
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        if !self.settled {
            locked(&self.table).release(&self.key, self.ts);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_764_547_200_123_456;
    const MIN: u64 = 60_000_000;

    #[test]
    fn client_timestamps_strictly_increase_even_when_the_clock_does_not() {
        let last = AtomicU64::new(0);
        assert_eq!(next_after(&last, NOW), NOW);
        assert_eq!(next_after(&last, NOW), NOW + 1, "same microsecond");
        assert_eq!(next_after(&last, NOW - 5), NOW + 2, "clock stepped back");
        assert_eq!(next_after(&last, NOW + 100), NOW + 100);
        let a = next_hello_ts();
        let b = next_hello_ts();
        assert!(b > a);
        let now = unix_micros(SystemTime::now());
        assert!(
            a.abs_diff(now) < MIN,
            "microseconds since the epoch: {a} vs {now}"
        );
    }

    #[test]
    fn a_ts_must_grow_per_key() {
        let mut t = HelloTimestamps::new(8);
        let (a, b) = ([1; 32], [2; 32]);
        t.admit(&a, NOW, NOW).unwrap();
        t.accept(&a, NOW);
        assert_eq!(
            t.admit(&a, NOW, NOW),
            Err(TimestampError::Replayed { ts: NOW, last: NOW })
        );
        assert!(t.admit(&a, NOW - 1, NOW).is_err());
        // Another key has a history of its own.
        t.admit(&b, NOW - 10, NOW).unwrap();
        t.admit(&a, NOW + 1, NOW).unwrap();
        assert_eq!(t.last_accepted(&a), Some(NOW));
    }

    #[test]
    fn a_pending_handshake_blocks_its_own_replay_and_is_forgotten_when_dropped() {
        let mut t = HelloTimestamps::new(8);
        let a = [1; 32];
        t.admit(&a, NOW, NOW).unwrap();
        assert_eq!(
            t.admit(&a, NOW, NOW),
            Err(TimestampError::Replayed { ts: NOW, last: NOW }),
            "a replay while the original waits for authorization"
        );
        // Handshakes of the key stamped earlier but checked later (another link) pass while
        // nothing with a larger `ts` has been accepted.
        t.admit(&a, NOW + 5, NOW).unwrap();
        t.admit(&a, NOW - 3, NOW).unwrap();
        for ts in [NOW, NOW + 5, NOW - 3] {
            t.release(&a, ts);
        }
        assert!(t.is_empty() && t.pending.is_empty(), "nothing left behind");
        t.admit(&a, NOW, NOW).unwrap();
        // Once one is accepted, the smaller ones still pending may finish, new ones may not.
        t.admit(&a, NOW - 1, NOW).unwrap();
        t.accept(&a, NOW);
        t.accept(&a, NOW - 1);
        assert_eq!(t.last_accepted(&a), Some(NOW));
        assert!(t.admit(&a, NOW - 2, NOW).is_err());
    }

    #[test]
    fn the_clock_window_is_ten_minutes_either_way() {
        let mut t = HelloTimestamps::new(8);
        let k = [3; 32];
        t.admit(&k, NOW - 10 * MIN, NOW).unwrap();
        t.admit(&k, NOW + 10 * MIN, NOW).unwrap();
        let late = t.admit(&k, NOW - 10 * MIN - 1, NOW + 1).unwrap_err();
        assert_eq!(late.reset_reason(), "clock_skew");
        let msg = late.to_string();
        assert!(msg.contains("600.0 s behind"), "{msg}");
        let early = t.admit(&k, NOW + 11 * MIN, NOW).unwrap_err();
        assert!(early.to_string().contains("660.0 s ahead of"), "{early}");
    }

    /// At capacity the least recently accepted key is forgotten first: its old message 1
    /// passes the table again (the clock check still bounds it), while the others' do not.
    #[test]
    fn the_least_recently_used_key_is_forgotten_first() {
        let mut t = HelloTimestamps::new(3);
        let keys: Vec<ClientKey> = (1..=4).map(|i| [i; 32]).collect();
        for (i, k) in keys[..3].iter().enumerate() {
            t.accept(k, NOW + i as u64);
        }
        assert_eq!(t.len(), 3);
        // Key 1 is used again: key 2 is now the least recently used.
        t.accept(&keys[0], NOW + 10);
        t.accept(&keys[3], NOW + 11);
        assert_eq!(t.len(), 3, "never more than the capacity");
        assert_eq!(t.last_accepted(&keys[1]), None, "key 2 was forgotten");
        assert_eq!(t.last_accepted(&keys[0]), Some(NOW + 10));
        assert_eq!(t.last_accepted(&keys[2]), Some(NOW + 2));
        t.admit(&keys[1], NOW + 1, NOW).unwrap();
        assert!(t.admit(&keys[2], NOW + 2, NOW).is_err());
        assert!(t.admit(&keys[0], NOW + 10, NOW).is_err());
    }

    #[test]
    fn accepting_keeps_the_largest_ts() {
        let mut t = HelloTimestamps::new(2);
        let k = [9; 32];
        t.accept(&k, NOW + 5);
        t.accept(&k, NOW + 3);
        assert_eq!(t.last_accepted(&k), Some(NOW + 5));
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn an_admission_dropped_is_released_and_one_accepted_is_recorded() {
        let table: SharedHelloTimestamps = Arc::new(Mutex::new(HelloTimestamps::new(4)));
        let k = [5; 32];
        let first = Admission::admit(&table, &k, NOW, NOW).unwrap();
        assert!(Admission::admit(&table, &k, NOW, NOW).is_err());
        drop(first);
        let again = Admission::admit(&table, &k, NOW, NOW).unwrap();
        again.accept();
        assert_eq!(locked(&table).last_accepted(&k), Some(NOW));
        assert!(locked(&table).pending.is_empty());
        assert!(Admission::admit(&table, &k, NOW, NOW).is_err());
    }
}
