//! The timestamp of handshake message 1 (`secure-transport.md` §3), which stops a captured
//! message 1 from being replayed.
//!
//! - Client side: [`next_hello_ts`], microseconds since the Unix epoch, strictly increasing
//!   across every handshake of the process (so unique per client key within a process).
//! - Server side: the replay cache of the protocol crate (`execrelay_protocol::replay`, shared with
//!   the relay's environment links), per client key: a `ts` is accepted within the clock
//!   window (`handshake_clock_window_ms`, ±2 minutes), not earlier than the moment the
//!   listener started, and once. Parallel clients of one key (several processes, several
//!   links) stamp independently and are accepted in any order. [`Admission`] is the guard a
//!   handshake holds while it waits for authorization: authorized, its stamp is remembered
//!   ([`Admission::accept`]); dropped, it is forgotten.
//!
//! Only authorized handshakes enter the cache, so unauthorized keys (anyone can make one)
//! cannot push authorized keys out of it. A handshake waiting for authorization still blocks
//! a replay of its own message 1 (a replay carries the very same `ts`). This module never
//! reads a clock on the server side (the caller passes `now`) and never logs key material.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

pub use execrelay_protocol::replay::unix_micros;
use execrelay_protocol::replay::{ReplayCache, ReplayLimits};

use super::keys::{fingerprint, KEY_BYTES};
use crate::config::ServerConfig;
use crate::sync::lock as locked;

pub use execrelay_protocol::replay::ReplayError as TimestampError;

/// Client keys whose accepted stamps the server remembers; past it, the least recently
/// accepted key is forgotten first (as past the cache's total of stamps,
/// `execrelay_protocol::replay::MAX_TRACKED_STAMPS`). Forgetting a key matters only if one of its
/// message 1s is replayed within the clock window of its capture (the start rule and the
/// clock refuse the rest), so this is the number of distinct authorized keys that can
/// handshake within 2 minutes without weakening the replay check.
pub const TRACKED_CLIENT_KEYS: usize = 4096;

type ClientKey = [u8; KEY_BYTES];

/// The last `ts` this process sent.
static LAST_HELLO_TS: AtomicU64 = AtomicU64::new(0);

/// The `ts` for the next message 1 this process sends: now in microseconds since the Unix
/// epoch, or one more than the previous one if the clock has not moved past it. Shared by
/// every key of the process, which makes it unique per key as well.
pub fn next_hello_ts() -> u64 {
    next_after(&LAST_HELLO_TS, unix_micros(SystemTime::now()))
}

fn next_after(last: &AtomicU64, now: u64) -> u64 {
    let step = |prev: u64| now.max(prev.saturating_add(1));
    match last.fetch_update(Ordering::AcqRel, Ordering::Acquire, |p| Some(step(p))) {
        Ok(prev) | Err(prev) => step(prev),
    }
}

/// The server's replay cache of message-1 stamps, per client key.
pub type HelloTimestamps = ReplayCache<ClientKey>;

/// The cache shared by every link of a listener.
pub type SharedHelloTimestamps = Arc<Mutex<HelloTimestamps>>;

/// A listener's cache, started now: nothing stamped earlier is ever accepted on it.
pub fn hello_timestamps(config: &ServerConfig) -> SharedHelloTimestamps {
    let limits = ReplayLimits {
        window: Duration::from_millis(config.handshake_clock_window_ms),
        per_key: config.max_handshakes_per_key_window,
        ..ReplayLimits::with_keys(TRACKED_CLIENT_KEYS)
    };
    Arc::new(Mutex::new(ReplayCache::new(
        limits,
        unix_micros(SystemTime::now()),
    )))
}

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

impl Admission {
    /// Check `ts` of `key` at `now` (microseconds since the epoch) and hold it as pending.
    pub fn admit(
        table: &SharedHelloTimestamps,
        key: &ClientKey,
        ts: u64,
        now: u64,
    ) -> Result<Admission, TimestampError> {
        locked(table).hold(key, ts, now)?;
        Ok(Admission {
            table: table.clone(),
            key: *key,
            ts,
            settled: false,
        })
    }

    /// The handshake was authorized at `now`: remember its stamp.
    pub fn accept(mut self, now: u64) {
        self.settled = true;
        locked(&self.table).accept(&self.key, self.ts, now);
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

    fn table(started: u64) -> SharedHelloTimestamps {
        Arc::new(Mutex::new(ReplayCache::new(
            ReplayLimits::with_keys(4),
            started,
        )))
    }

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

    /// Honest parallel clients of one key: stamps arrive in any order, each accepted once;
    /// the second arrival of any is a replay.
    #[test]
    fn parallel_stamps_of_one_key_pass_in_any_order_and_each_once() {
        let t = table(NOW - MIN);
        let k = [5; 32];
        for ts in [NOW + 3, NOW + 1, NOW + 2] {
            Admission::admit(&t, &k, ts, NOW).unwrap().accept(NOW);
        }
        for ts in [NOW + 3, NOW + 1, NOW + 2] {
            let e = Admission::admit(&t, &k, ts, NOW).unwrap_err();
            assert_eq!(e.reset_reason(), "replayed_handshake");
        }
    }

    #[test]
    fn an_admission_dropped_is_released_and_one_accepted_is_recorded() {
        let t = table(NOW - MIN);
        let k = [5; 32];
        let first = Admission::admit(&t, &k, NOW, NOW).unwrap();
        assert!(
            Admission::admit(&t, &k, NOW, NOW).is_err(),
            "a replay while the first waits for authorization"
        );
        drop(first);
        assert!(locked(&t).is_empty(), "forgotten");
        let again = Admission::admit(&t, &k, NOW, NOW).unwrap();
        again.accept(NOW);
        assert!(locked(&t).accepted(&k, NOW));
        assert!(Admission::admit(&t, &k, NOW, NOW).is_err());
    }

    /// A listener started at `NOW` refuses a message 1 stamped before, even one it never saw
    /// (captured before a restart).
    #[test]
    fn nothing_stamped_before_the_listener_started_is_accepted() {
        let t = table(NOW);
        let e = Admission::admit(&t, &[1; 32], NOW - 1, NOW + 5).unwrap_err();
        assert_eq!(e.reset_reason(), "replayed_handshake");
        assert!(e.to_string().contains("before this process started"), "{e}");
        Admission::admit(&t, &[1; 32], NOW, NOW + 5).unwrap();
    }

    #[test]
    fn the_clock_window_comes_from_the_settings() {
        let config = ServerConfig {
            handshake_clock_window_ms: 1_000,
            ..ServerConfig::default()
        };
        let t = hello_timestamps(&config);
        let now = unix_micros(SystemTime::now());
        let e = Admission::admit(&t, &[1; 32], now + 1_000_001, now).unwrap_err();
        assert_eq!(e.reset_reason(), "clock_skew");
        Admission::admit(&t, &[1; 32], now + 1_000_000, now).unwrap();
    }
}
