//! The handshake-failure budget of `secure-transport.md` §8, sans-IO: a token bucket per
//! physical link, charged for every failed handshake and every protocol violation on a
//! stream that is not yet established.
//!
//! The bucket never reads a clock: the caller passes `now`. The link driver passes tokio's
//! clock (`tokio::time::Instant::now().into_std()`), the same clock as its keepalive, so
//! tests on paused time drive both. It must never panic, whatever the instants it is given:
//! every step of the refill arithmetic saturates.

use std::time::{Duration, Instant};

// The defaults (burst, refill) are settings: `config::HANDSHAKE_FAILURE_BURST` and
// `config::HANDSHAKE_FAILURE_REFILL_MS`.

/// A token bucket fed the current time.
#[derive(Debug, Clone)]
pub struct FailureBudget {
    burst: u32,
    refill: Duration,
    tokens: u32,
    /// When the refill interval under way started (the bucket earns a token one `refill`
    /// after it).
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
        // Whole intervals elapsed; more than the bucket can hold is as good as a full one.
        let earned = elapsed.as_nanos() / self.refill.as_nanos();
        let missing = self.burst.saturating_sub(self.tokens);
        if earned >= u128::from(missing) {
            self.tokens = self.burst;
            self.last = now;
            return;
        }
        // Here earned < missing <= burst: it fits a u32, and `refill * earned` is at most
        // the elapsed time, so neither the product nor the sum can overflow.
        let earned = earned as u32;
        if earned > 0 {
            self.tokens += earned;
            self.last += self.refill * earned;
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

    /// A refill interval that does not divide the elapsed time keeps the remainder: 1.5
    /// intervals earn one token now and the next one half an interval later.
    #[test]
    fn a_partial_interval_carries_over() {
        let t0 = Instant::now();
        let mut b = FailureBudget::new(3, Duration::from_secs(2), t0);
        for _ in 0..3 {
            b.charge(t0);
        }
        assert_eq!(b.remaining(t0 + Duration::from_secs(3)), 1);
        assert_eq!(b.remaining(t0 + Duration::from_millis(3999)), 1);
        assert_eq!(b.remaining(t0 + Duration::from_secs(4)), 2);
    }

    /// More intervals than a u32 holds: 2^32 intervals of 1 ns once truncated to 0 tokens
    /// earned (the bucket stayed empty), and 2^32 − 1 overflowed `tokens + earned` (a
    /// panic in a debug build). Both refill the bucket to its burst.
    #[test]
    fn huge_elapsed_times_fill_the_bucket_without_overflow() {
        let t0 = Instant::now();
        let mut b = FailureBudget::new(3, Duration::from_nanos(1), t0);
        for _ in 0..3 {
            b.charge(t0);
        }
        assert_eq!(b.remaining(t0), 0);
        assert_eq!(b.remaining(t0 + Duration::from_nanos(1 << 32)), 3);

        let mut b = FailureBudget::new(3, Duration::from_nanos(1), t0);
        b.charge(t0);
        b.charge(t0);
        assert_eq!(b.remaining(t0), 1);
        assert_eq!(b.remaining(t0 + Duration::from_nanos(u32::MAX as u64)), 3);

        // An instant before the last refill (a caller mixing clocks) earns nothing.
        let mut b = FailureBudget::new(2, Duration::from_secs(1), t0 + Duration::from_secs(5));
        b.charge(t0);
        assert_eq!(b.remaining(t0), 1);
    }
}
