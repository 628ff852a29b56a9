//! A token bucket fed the current time: the shape of every per-link budget (handshake
//! failures, malformed frames, unknown-stream frames, `OPEN`s per second).
//!
//! Sans-IO: it never reads a clock; callers pass `now`. It owns no policy: what an empty
//! bucket means (refuse, cool down, close the link) is the caller's decision.

use std::time::{Duration, Instant};

use crate::config::BucketConfig;

/// A token bucket: `burst` tokens when full, one more every `refill`.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    burst: u32,
    refill: Duration,
    tokens: u32,
    /// When the next token is due counts from here.
    last: Instant,
}

impl TokenBucket {
    /// A full bucket.
    pub fn new(cfg: BucketConfig, now: Instant) -> Self {
        TokenBucket {
            burst: cfg.burst,
            refill: cfg.refill,
            tokens: cfg.burst,
            last: now,
        }
    }

    /// A bucket of `n` per second (burst `n`, one token per `1/n` s).
    pub fn per_second(n: u32, now: Instant) -> Self {
        let refill = Duration::from_secs(1) / n.max(1);
        TokenBucket::new(BucketConfig { burst: n, refill }, now)
    }

    fn refill(&mut self, now: Instant) {
        if self.refill.is_zero() {
            self.tokens = self.burst;
            self.last = now;
            return;
        }
        let elapsed = now.saturating_duration_since(self.last);
        let earned = elapsed.as_nanos() / self.refill.as_nanos();
        if earned > 0 {
            let earned = u32::try_from(earned).unwrap_or(u32::MAX);
            self.tokens = self.tokens.saturating_add(earned).min(self.burst);
            self.last += self.refill.saturating_mul(earned);
        }
        if self.tokens == self.burst {
            self.last = now;
        }
    }

    /// Take one token. False when there was none: the budget is exceeded.
    pub fn take(&mut self, now: Instant) -> bool {
        self.refill(now);
        if self.tokens == 0 {
            return false;
        }
        self.tokens -= 1;
        true
    }

    /// Tokens left now.
    pub fn remaining(&mut self, now: Instant) -> u32 {
        self.refill(now);
        self.tokens
    }

    /// Tokens when full.
    pub fn burst(&self) -> u32 {
        self.burst
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_then_empty_then_refills_one_per_interval_capped_at_burst() {
        let t0 = Instant::now();
        let cfg = BucketConfig {
            burst: 3,
            refill: Duration::from_secs(1),
        };
        let mut b = TokenBucket::new(cfg, t0);
        assert!(b.take(t0));
        assert!(b.take(t0));
        assert!(b.take(t0));
        assert_eq!(b.remaining(t0), 0);
        assert!(!b.take(t0), "the fourth take exceeds a burst of 3");
        assert!(!b.take(t0 + Duration::from_millis(999)));
        assert!(b.take(t0 + Duration::from_secs(1)));
        assert_eq!(b.remaining(t0 + Duration::from_secs(100)), 3);
    }

    #[test]
    fn per_second_spreads_the_refill() {
        let t0 = Instant::now();
        let mut b = TokenBucket::per_second(4, t0);
        for _ in 0..4 {
            assert!(b.take(t0));
        }
        assert!(!b.take(t0));
        assert!(!b.take(t0 + Duration::from_millis(249)));
        assert!(b.take(t0 + Duration::from_millis(250)));
    }
}
