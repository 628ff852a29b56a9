//! Keepalive of one link (`secure-transport.md` §6.4), sans-IO: when to ping, and when the
//! link is dead.
//!
//! A ping goes out every `interval` minus a jitter drawn from a seeded generator. Each ping
//! carries an 8-byte counter; only a pong echoing a counter we sent answers it (and every ping
//! before it). The link is dead when its oldest unanswered ping is `pong_timeout` old.
//! Nothing else counts: inbound data, unsolicited pongs and stale echoes do not keep a link
//! alive, so a peer that keeps sending but never answers is dead, and a silent peer that
//! answers lives forever.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::config::KeepaliveConfig;

/// Pings remembered while unanswered. With the default settings at most three can be
/// outstanding before the link is declared dead (30 s / 13.5 s); the cap only matters for
/// odd settings (a pong timeout many intervals long), where forgetting the newest ones is
/// harmless: the oldest decides death.
pub const MAX_OUTSTANDING_PINGS: usize = 64;

/// SplitMix64: a tiny seeded generator for the jitter, so that tests are deterministic and
/// the engine needs no randomness source.
#[derive(Debug, Clone)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// The keepalive state of one link.
#[derive(Debug, Clone)]
pub struct Keepalive {
    cfg: KeepaliveConfig,
    rng: SplitMix64,
    next_ping: Instant,
    ping_due: bool,
    sent: u64,
    /// (counter, when handed to the writer) of pings not yet answered, oldest first.
    outstanding: VecDeque<(u64, Instant)>,
    dead: bool,
}

impl Keepalive {
    /// Start at `now`; the first ping is due one (jittered) interval later.
    pub fn new(cfg: KeepaliveConfig, now: Instant, seed: u64) -> Self {
        let mut k = Keepalive {
            cfg,
            rng: SplitMix64(seed),
            next_ping: now,
            ping_due: false,
            sent: 0,
            outstanding: VecDeque::new(),
            dead: false,
        };
        k.next_ping = now + k.jittered_interval();
        k
    }

    fn jittered_interval(&mut self) -> Duration {
        let j = self.cfg.jitter.as_nanos() as u64;
        let off = if j == 0 { 0 } else { self.rng.next() % (j + 1) };
        self.cfg.interval.saturating_sub(Duration::from_nanos(off))
    }

    /// When [`handle_timeout`](Self::handle_timeout) must next be called; `None` once dead.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.dead {
            return None;
        }
        let ping = (!self.ping_due).then_some(self.next_ping);
        let death = self
            .outstanding
            .front()
            .map(|(_, at)| *at + self.cfg.pong_timeout);
        match (ping, death) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Advance to `now`: a ping may become due, or the link dead.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.dead {
            return;
        }
        if let Some((_, at)) = self.outstanding.front() {
            if now >= *at + self.cfg.pong_timeout {
                self.dead = true;
                return;
            }
        }
        if !self.ping_due && now >= self.next_ping {
            self.ping_due = true;
        }
    }

    /// Whether a ping waits for the writer.
    pub fn wants_ping(&self) -> bool {
        self.ping_due && !self.dead
    }

    /// The payload of a due ping, counted as sent at `now` (when the writer takes it).
    pub fn poll_ping(&mut self, now: Instant) -> Option<[u8; 8]> {
        if !self.wants_ping() {
            return None;
        }
        self.ping_due = false;
        self.sent += 1;
        if self.outstanding.len() < MAX_OUTSTANDING_PINGS {
            self.outstanding.push_back((self.sent, now));
        }
        self.next_ping = now + self.jittered_interval();
        Some(self.sent.to_be_bytes())
    }

    /// A pong arrived. Returns whether it answered a ping of ours.
    pub fn on_pong(&mut self, payload: &[u8]) -> bool {
        let Ok(bytes) = <[u8; 8]>::try_from(payload) else {
            return false;
        };
        let n = u64::from_be_bytes(bytes);
        let answers = self.outstanding.iter().any(|(c, _)| *c == n);
        if answers {
            self.outstanding.retain(|(c, _)| *c > n);
        }
        answers
    }

    /// Whether the link is dead.
    pub fn is_dead(&self) -> bool {
        self.dead
    }

    /// Settings.
    pub fn config(&self) -> &KeepaliveConfig {
        &self.cfg
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> KeepaliveConfig {
        KeepaliveConfig {
            interval: Duration::from_secs(15),
            jitter: Duration::ZERO,
            pong_timeout: Duration::from_secs(30),
            write_timeout: Duration::from_secs(30),
        }
    }

    #[test]
    fn dead_exactly_one_pong_timeout_after_the_first_unanswered_ping() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut k = Keepalive::new(cfg(), t0, 1);
        assert_eq!(k.poll_timeout(), Some(t0 + s(15)));
        k.handle_timeout(t0 + s(15));
        assert_eq!(k.poll_ping(t0 + s(15)), Some(1u64.to_be_bytes()));
        k.handle_timeout(t0 + s(30));
        assert!(k.poll_ping(t0 + s(30)).is_some());
        assert!(!k.on_pong(b"junk"), "a pong that echoes nothing of ours");
        assert!(
            !k.on_pong(&9u64.to_be_bytes()),
            "an echo of a ping never sent"
        );
        k.handle_timeout(t0 + s(45) - Duration::from_nanos(1));
        assert!(!k.is_dead());
        assert_eq!(k.poll_timeout(), Some(t0 + s(45)));
        k.handle_timeout(t0 + s(45));
        assert!(k.is_dead());
        assert_eq!(k.poll_timeout(), None);
    }

    #[test]
    fn an_answer_clears_that_ping_and_every_one_before_it() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut k = Keepalive::new(cfg(), t0, 1);
        k.handle_timeout(t0 + s(15));
        k.poll_ping(t0 + s(15));
        k.handle_timeout(t0 + s(30));
        k.poll_ping(t0 + s(30));
        assert!(k.on_pong(&2u64.to_be_bytes()));
        // Nothing outstanding: the next event is the next ping.
        assert_eq!(k.poll_timeout(), Some(t0 + s(45)));
        assert!(!k.on_pong(&1u64.to_be_bytes()), "a stale echo");
    }

    #[test]
    fn jitter_stays_within_its_bound_and_is_deterministic_per_seed() {
        let t0 = Instant::now();
        let c = KeepaliveConfig {
            jitter: Duration::from_millis(1500),
            ..cfg()
        };
        let a = Keepalive::new(c, t0, 7).poll_timeout();
        assert_eq!(a, Keepalive::new(c, t0, 7).poll_timeout());
        for seed in 0..100 {
            let at = Keepalive::new(c, t0, seed).poll_timeout().unwrap();
            assert!(at >= t0 + Duration::from_millis(13_500) && at <= t0 + c.interval);
        }
    }
}
