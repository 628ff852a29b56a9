//! The handshake-failure budget of `secure-transport.md` §8, sans-IO: a token bucket per
//! physical link, charged for every failed handshake and every protocol violation on a
//! stream that is not yet established.

use std::time::{Duration, Instant};

/// Default burst: failures tolerated back to back.
pub const FAILURE_BURST: u32 = 8;
/// Default refill: one failure forgiven per this interval.
pub const FAILURE_REFILL: Duration = Duration::from_secs(2);

/// A token bucket fed the current time.
#[derive(Debug, Clone)]
pub struct FailureBudget {
    burst: u32,
    refill: Duration,
    tokens: u32,
    last: Instant,
}

impl FailureBudget {
    /// A full bucket.
    pub fn new(burst: u32, refill: Duration, now: Instant) -> Self {
        FailureBudget {
            burst,
            refill,
            tokens: burst,
            last: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        if self.refill.is_zero() {
            self.tokens = self.burst;
            return;
        }
        let elapsed = now.saturating_duration_since(self.last);
        let earned = (elapsed.as_nanos() / self.refill.as_nanos()) as u32;
        if earned > 0 {
            self.tokens = (self.tokens + earned).min(self.burst);
            self.last += self.refill * earned;
        }
        if self.tokens == self.burst {
            self.last = now;
        }
    }

    /// Charge one failure. Returns false when the bucket is empty: the link has used up its
    /// budget.
    pub fn charge(&mut self, now: Instant) -> bool {
        self.refill(now);
        if self.tokens == 0 {
            return false;
        }
        self.tokens -= 1;
        self.tokens > 0
    }

    /// Tokens left.
    pub fn remaining(&mut self, now: Instant) -> u32 {
        self.refill(now);
        self.tokens
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_then_empty_then_refills() {
        let t0 = Instant::now();
        let mut b = FailureBudget::new(3, Duration::from_secs(1), t0);
        assert!(b.charge(t0));
        assert!(b.charge(t0));
        assert!(!b.charge(t0), "the third failure empties a burst of 3");
        assert!(!b.charge(t0));
        assert_eq!(b.remaining(t0 + Duration::from_millis(999)), 0);
        assert_eq!(b.remaining(t0 + Duration::from_secs(1)), 1);
        assert_eq!(
            b.remaining(t0 + Duration::from_secs(100)),
            3,
            "capped at the burst"
        );
    }
}
