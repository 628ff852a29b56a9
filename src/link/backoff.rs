//! Retry delays (sans-IO): a doubling schedule with a cap and jitter, fed "the last attempt
//! lived this long" and a random number, never a clock. Used by the exec server's environment
//! link (re-dialling the relay) and by the client's first connection (an environment the
//! relay says is offline or moving). It never sleeps: its callers do.

use std::time::Duration;

use crate::config::ServerConfig;

/// Reconnection delays (sans-IO): `initial`, doubling after every failed attempt or short
/// link up to `max`, back to `initial` after a link that lived `reset_after`; after a
/// refusal by the relay ([`Backoff::delay_refused`]) the doubling goes on up to
/// `refused_max` instead (a refusal lasts until an operator fixes a file). Each delay loses a
/// random part of up to a quarter (jitter), so environments that lost one relay together do
/// not all come back in the same instant.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    refused_max: Duration,
    reset_after: Duration,
    next: Duration,
}

impl Backoff {
    /// The schedule of `config` (`relay_backoff_initial_ms`, `relay_backoff_max_ms`,
    /// `relay_refused_backoff_max_ms`, `relay_backoff_reset_ms`).
    pub fn from_config(config: &ServerConfig) -> Backoff {
        Backoff::new(
            Duration::from_millis(config.relay_backoff_initial_ms.max(1)),
            Duration::from_millis(config.relay_backoff_max_ms.max(1)),
            Duration::from_millis(config.relay_backoff_reset_ms),
        )
        .with_refused_max(Duration::from_millis(config.relay_refused_backoff_max_ms))
    }

    /// A schedule starting at `initial` (a refusal's cap is `max` until
    /// [`with_refused_max`](Self::with_refused_max)).
    pub fn new(initial: Duration, max: Duration, reset_after: Duration) -> Backoff {
        let max = max.max(initial);
        Backoff {
            initial,
            max,
            refused_max: max,
            reset_after,
            next: initial,
        }
    }

    /// After a refusal, delays grow up to `refused_max` (never below the usual cap).
    pub fn with_refused_max(mut self, refused_max: Duration) -> Backoff {
        self.refused_max = refused_max.max(self.max);
        self
    }

    /// The delay before the next attempt, after an attempt whose link lived `lived` (`None`:
    /// it never came up). `random` is any random number (the jitter's source).
    pub fn delay(&mut self, lived: Option<Duration>, random: u64) -> Duration {
        if lived.is_some_and(|l| l >= self.reset_after) {
            self.next = self.initial;
        }
        // A run of refusals may have taken `next` past the usual cap.
        let base = self.next.min(self.max);
        self.next = (base * 2).min(self.max);
        jitter(base, random)
    }

    /// The delay before the next attempt after the relay refused the link.
    pub fn delay_refused(&mut self, random: u64) -> Duration {
        let base = self.next;
        self.next = (base * 2).min(self.refused_max);
        jitter(base, random)
    }
}

fn jitter(base: Duration, random: u64) -> Duration {
    let quarter = base.as_nanos() as u64 / 4;
    let off = if quarter == 0 { 0 } else { random % quarter };
    base - Duration::from_nanos(off)
}

/// A random number for [`Backoff`]'s jitter.
pub(crate) fn random() -> u64 {
    let mut b = [0u8; 8];
    // Jitter only: a failure of the system's randomness leaves the delay unjittered.
    let _ = getrandom::getrandom(&mut b);
    u64::from_le_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn doubles_to_the_cap_and_resets_after_a_long_link() {
        let mut b = Backoff::new(S, 30 * S, 60 * S);
        let no_jitter = 0;
        let got: Vec<u64> = (0..7).map(|_| b.delay(None, no_jitter).as_secs()).collect();
        assert_eq!(got, [1, 2, 4, 8, 16, 30, 30]);
        // A link that came up but died young does not reset the schedule.
        assert_eq!(b.delay(Some(59 * S), no_jitter), 30 * S);
        // One that lived a minute does.
        assert_eq!(b.delay(Some(60 * S), no_jitter), S);
        assert_eq!(b.delay(None, no_jitter), 2 * S);
    }

    #[test]
    fn refusals_slow_down_to_their_own_cap_and_a_failure_comes_back_under_the_usual_one() {
        let mut b = Backoff::new(S, 30 * S, 60 * S).with_refused_max(300 * S);
        let got: Vec<u64> = (0..11).map(|_| b.delay_refused(0).as_secs()).collect();
        assert_eq!(got, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
        // The relay unreachable now: back under the usual cap at once.
        assert_eq!(b.delay(None, 0), 30 * S);
        assert_eq!(b.delay(None, 0), 30 * S);
        // A long link resets everything.
        assert_eq!(b.delay(Some(60 * S), 0), S);
        assert_eq!(b.delay_refused(0), 2 * S);
        // A refusal cap below the usual one is raised to it.
        let mut b = Backoff::new(S, 30 * S, 60 * S).with_refused_max(S);
        let got: Vec<u64> = (0..7).map(|_| b.delay_refused(0).as_secs()).collect();
        assert_eq!(got, [1, 2, 4, 8, 16, 30, 30]);
    }

    #[test]
    fn jitter_takes_off_at_most_a_quarter() {
        let mut seen = std::collections::HashSet::new();
        for r in 0..1000u64 {
            let mut b = Backoff::new(S, 30 * S, 60 * S);
            let d = b.delay(None, r.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            assert!(d <= S && d > S * 3 / 4, "{d:?}");
            seen.insert(d);
        }
        assert!(seen.len() > 100, "jittered: {} distinct delays", seen.len());
    }
}
