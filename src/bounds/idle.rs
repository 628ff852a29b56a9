//! The idle rule of connections and links, sans-IO: when something became idle, and when it
//! may be closed for it.
//!
//! A thing is **busy** while its owner says so (a connection with a request in flight or a
//! process of its session running; a link with a stream) and **active** when something
//! happens on it (a connection's inbound message). It is closed once it has been neither
//! busy nor active for the whole timeout. The owner reports activity with
//! [`IdleTimer::touch`] and busyness with [`IdleTimer::observe`] (after each of its events,
//! or at each deadline when busyness changes where it cannot see it), and sleeps until
//! [`IdleTimer::deadline`]. While busy, the deadline comes every quarter of the timeout so that
//! an end of busyness the owner cannot see is noticed: the close then comes between one
//! timeout and one and a quarter after it, never earlier.

use std::time::{Duration, Instant};

/// The longest timeout an [`IdleTimer`] keeps: a year. A longer one (a configuration may say
/// anything) is clamped to it, so that a deadline can never overflow the clock.
pub const MAX_IDLE_TIMEOUT: Duration = Duration::from_secs(365 * 24 * 3600);

/// The idle clock of one connection or link. The caller passes `now` (tokio's clock, so
/// paused-time tests drive it).
#[derive(Debug, Clone)]
pub struct IdleTimer {
    timeout: Duration,
    last_active: Instant,
    busy: bool,
}

impl IdleTimer {
    /// Idle from `now`, closed after `timeout` of idleness.
    pub fn new(timeout: Duration, now: Instant) -> IdleTimer {
        IdleTimer {
            timeout: timeout.min(MAX_IDLE_TIMEOUT),
            last_active: now,
            busy: false,
        }
    }

    /// Something happened: idleness starts again from `now`.
    pub fn touch(&mut self, now: Instant) {
        self.last_active = self.last_active.max(now);
    }

    /// The owner is (or is not) busy at `now`. The end of busyness counts as activity.
    pub fn observe(&mut self, now: Instant, busy: bool) {
        if busy || self.busy {
            self.touch(now);
        }
        self.busy = busy;
    }

    /// When to look again: the idle deadline, or the next busy check.
    pub fn deadline(&self) -> Instant {
        if self.busy {
            self.last_active + (self.timeout / 4).max(Duration::from_millis(1))
        } else {
            self.last_active + self.timeout
        }
    }

    /// Whether it has been idle for the whole timeout at `now`.
    pub fn expired(&self, now: Instant) -> bool {
        !self.busy && now >= self.last_active + self.timeout
    }

    /// The timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(100);

    #[test]
    fn idle_from_the_start_and_expires_at_the_timeout_exactly() {
        let t0 = Instant::now();
        let t = IdleTimer::new(T, t0);
        assert_eq!(t.deadline(), t0 + T);
        assert!(!t.expired(t0 + T - Duration::from_millis(1)));
        assert!(t.expired(t0 + T));
    }

    #[test]
    fn a_huge_timeout_is_clamped_not_overflowed() {
        let t0 = Instant::now();
        let t = IdleTimer::new(Duration::from_millis(u64::MAX), t0);
        assert_eq!(t.deadline(), t0 + MAX_IDLE_TIMEOUT);
        assert!(!t.expired(t0 + MAX_IDLE_TIMEOUT - Duration::from_secs(1)));
    }

    #[test]
    fn activity_moves_the_deadline() {
        let t0 = Instant::now();
        let mut t = IdleTimer::new(T, t0);
        t.touch(t0 + Duration::from_secs(60));
        assert!(!t.expired(t0 + T));
        assert_eq!(t.deadline(), t0 + Duration::from_secs(160));
        // An older instant never moves it back.
        t.touch(t0);
        assert_eq!(t.deadline(), t0 + Duration::from_secs(160));
    }

    #[test]
    fn busy_never_expires_and_idleness_counts_from_its_end() {
        let t0 = Instant::now();
        let mut t = IdleTimer::new(T, t0);
        t.observe(t0 + Duration::from_secs(10), true);
        assert_eq!(
            t.deadline(),
            t0 + Duration::from_secs(35),
            "checks every T/4"
        );
        for k in 1..=20 {
            let now = t0 + Duration::from_secs(10 + 25 * k);
            t.observe(now, true);
            assert!(!t.expired(now), "busy at {k}");
        }
        let end = t0 + Duration::from_secs(1000);
        t.observe(end, false);
        assert_eq!(t.deadline(), end + T);
        assert!(!t.expired(end + T - Duration::from_millis(1)));
        assert!(t.expired(end + T));
    }

    #[test]
    fn an_unseen_end_of_busyness_closes_within_a_quarter_more() {
        let t0 = Instant::now();
        let mut t = IdleTimer::new(T, t0);
        t.observe(t0, true);
        // Busyness ends just after this check, unseen until the next one at t0 + T/4.
        let seen = t.deadline();
        t.observe(seen, false);
        assert!(t.expired(seen + T));
        assert!(seen + T <= t0 + T + T / 4);
        assert!(!t.expired(t0 + T), "never before a whole timeout");
    }
}
