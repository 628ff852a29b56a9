//! Keepalive of one link (`secure-transport.md` §6.4), sans-IO: when to ping, and when the
//! link is dead.
//!
//! A ping goes out every `interval` minus a jitter drawn from a seeded generator. Each ping
//! carries 8 random bytes (`getrandom`): a peer that never reads its link cannot guess them,
//! so it cannot answer blindly and pass for alive. Only a pong echoing a payload we sent
//! answers it (and every ping before it). The link is dead when its oldest unanswered ping is
//! `pong_timeout` old. Nothing else counts: inbound data, unsolicited pongs and stale echoes
//! do not keep a link alive, so a peer that keeps sending but never answers is dead, and a
//! silent peer that answers lives forever.
//!
//! A **probe** ([`Keepalive::probe`]) asks for proof of life now: a ping goes out at once,
//! and if neither it nor any later ping is answered within the probe's deadline the link is
//! dead. The relay probes an environment's link when another exec server claims its id.
//!
//! Sans-IO: it never reads a clock (callers pass `now`); the payloads are its one
//! non-deterministic input.

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
    /// The seeded generator's fallback for payloads if the system's randomness fails.
    fallback: SplitMix64,
    /// (payload, when handed to the writer) of pings not yet answered, oldest first.
    outstanding: VecDeque<([u8; 8], Instant)>,
    /// A probe: answered if a pong echoes a ping sent at or after `since`; dead at `deadline`.
    probe: Option<Probe>,
    dead: bool,
}

#[derive(Debug, Clone, Copy)]
struct Probe {
    /// The probe's ping is due (or was sent) from here; any ping handed out since answers it.
    since: Instant,
    deadline: Instant,
    /// The probe's ping went out (`poll_ping` took it).
    sent: bool,
}

/// Eight bytes nobody can guess; the seeded generator's if the system's randomness fails
/// (then only as unpredictable as the seed, which a peer does not see either).
fn random_payload(fallback: &mut SplitMix64) -> [u8; 8] {
    let mut b = [0u8; 8];
    if getrandom::getrandom(&mut b).is_err() {
        b = fallback.next().to_le_bytes();
    }
    b
}

impl Keepalive {
    /// Start at `now`; the first ping is due one (jittered) interval later.
    pub fn new(cfg: KeepaliveConfig, now: Instant, seed: u64) -> Self {
        let mut k = Keepalive {
            cfg,
            rng: SplitMix64(seed),
            next_ping: now,
            ping_due: false,
            fallback: SplitMix64(seed ^ 0x5DEE_CE66_D1CE_4E5B),
            outstanding: VecDeque::new(),
            probe: None,
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
        let probe = self.probe.map(|p| p.deadline);
        [ping, death, probe].into_iter().flatten().min()
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
        if self.probe.is_some_and(|p| now >= p.deadline) {
            self.dead = true;
            return;
        }
        if !self.ping_due && now >= self.next_ping {
            self.ping_due = true;
        }
    }

    /// Ask for proof of life: a ping is due now, and unless a pong answers it (or a later
    /// ping) within `deadline`, the link is dead at `now + deadline`. A probe already running
    /// keeps its own (earlier) deadline.
    pub fn probe(&mut self, now: Instant, deadline: std::time::Duration) {
        if self.dead || self.probe.is_some() {
            return;
        }
        self.ping_due = true;
        self.probe = Some(Probe {
            since: now,
            deadline: now + deadline,
            sent: false,
        });
    }

    /// Whether a probe waits for its answer.
    pub fn probing(&self) -> bool {
        self.probe.is_some()
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
        let payload = random_payload(&mut self.fallback);
        if self.outstanding.len() >= MAX_OUTSTANDING_PINGS {
            // The oldest decides death: forget the newest instead.
            self.outstanding.pop_back();
        }
        self.outstanding.push_back((payload, now));
        if let Some(p) = self.probe.as_mut() {
            p.sent = true;
        }
        self.next_ping = now + self.jittered_interval();
        Some(payload)
    }

    /// A pong arrived. Returns whether it answered a ping of ours (and every ping before it);
    /// a running probe is answered by a ping sent since it started.
    pub fn on_pong(&mut self, payload: &[u8]) -> bool {
        let Ok(bytes) = <[u8; 8]>::try_from(payload) else {
            return false;
        };
        let Some(i) = self.outstanding.iter().position(|(p, _)| *p == bytes) else {
            return false;
        };
        let sent_at = self.outstanding[i].1;
        self.outstanding.drain(..=i);
        if self.probe.is_some_and(|p| p.sent && sent_at >= p.since) {
            self.probe = None;
        }
        true
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
        let first = k.poll_ping(t0 + s(15)).unwrap();
        k.handle_timeout(t0 + s(30));
        assert!(k.poll_ping(t0 + s(30)).is_some());
        assert!(!k.on_pong(b"junk"), "a pong that echoes nothing of ours");
        for guess in [1u64, 2, 3] {
            assert!(
                !k.on_pong(&guess.to_be_bytes()),
                "a counter guessed blindly answers nothing"
            );
        }
        let mut other = first;
        other[0] ^= 1;
        assert!(!k.on_pong(&other), "an echo of a ping never sent");
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
        let first = k.poll_ping(t0 + s(15)).unwrap();
        k.handle_timeout(t0 + s(30));
        let second = k.poll_ping(t0 + s(30)).unwrap();
        assert_ne!(first, second, "payloads are not a counter");
        assert!(k.on_pong(&second));
        // Nothing outstanding: the next event is the next ping.
        assert_eq!(k.poll_timeout(), Some(t0 + s(45)));
        assert!(!k.on_pong(&first), "a stale echo");
    }

    /// Ping payloads are random: a thousand pings, a thousand distinct payloads, none of them
    /// a small counter.
    #[test]
    fn ping_payloads_are_unpredictable() {
        let t0 = Instant::now();
        let mut k = Keepalive::new(cfg(), t0, 1);
        let mut seen = std::collections::HashSet::new();
        for i in 1..=1000u32 {
            let now = t0 + Duration::from_secs(15) * i;
            k.handle_timeout(now);
            let p = k.poll_ping(now).unwrap();
            assert!(k.on_pong(&p));
            assert!(u64::from_be_bytes(p) > u64::from(i), "{p:?}");
            seen.insert(p);
        }
        assert_eq!(seen.len(), 1000);
    }

    /// A probe pings at once; a link that answers within its deadline lives on, one that does
    /// not is dead at the deadline exactly (well before the pong timeout). An answer to a ping
    /// sent before the probe does not count for it.
    #[test]
    fn a_probe_needs_an_answer_within_its_deadline() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut k = Keepalive::new(cfg(), t0, 1);
        k.handle_timeout(t0 + s(15));
        let old = k.poll_ping(t0 + s(15)).unwrap();
        k.probe(t0 + s(16), s(5));
        assert!(k.wants_ping() && k.probing());
        assert_eq!(k.poll_timeout(), Some(t0 + s(21)));
        assert!(k.on_pong(&old), "the old ping is answered...");
        assert!(k.probing(), "...but that is no answer to the probe");
        let p = k.poll_ping(t0 + s(16)).unwrap();
        assert!(k.on_pong(&p));
        assert!(!k.probing());
        k.handle_timeout(t0 + s(21));
        assert!(!k.is_dead());

        let mut silent = Keepalive::new(cfg(), t0, 1);
        silent.probe(t0, s(5));
        silent.poll_ping(t0).unwrap();
        silent.handle_timeout(t0 + s(5) - Duration::from_nanos(1));
        assert!(!silent.is_dead());
        silent.handle_timeout(t0 + s(5));
        assert!(silent.is_dead());
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
