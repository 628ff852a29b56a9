//! The drain state machine: after the direct child exits, how long output may still be read.
//!
//! Sans-IO: fed the current time and the pumps' events, asked for the deadline. It owns the
//! rules of `processes.md` §3: the drain deadline is `drainTimeoutMs` after the exit, pushed
//! back by every moment a pump spent blocked delivering to a slow client, and a stream cut at
//! the deadline marks the exit notice `outputDrainTimedOut` unless the stream had already
//! reached its `outputBytesCap` (then nothing deliverable was lost). It never touches a
//! descriptor or a clock itself.

use std::time::{Duration, Instant};

/// How one output stream ended (or not yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamEnd {
    /// Still being read.
    Open,
    /// Reached end of file: complete.
    Eof,
    /// Stopped at the drain deadline. `capped`: it had reached its cap, so only discarded
    /// bytes could have been pending.
    Cut {
        /// The stream had reached `outputBytesCap` before it was cut.
        capped: bool,
    },
}

/// Drain bookkeeping for one process (up to two streams).
#[derive(Debug)]
pub struct OutputDrain {
    timeout: Duration,
    exited_at: Option<Instant>,
    blocked_pumps: u32,
    blocked_since: Option<Instant>,
    blocked_after_exit: Duration,
    streams: Vec<StreamEnd>,
}

impl OutputDrain {
    /// `streams`: how many output streams the process has (2 for pipes, 1 for a PTY).
    pub fn new(timeout: Duration, streams: usize) -> Self {
        OutputDrain {
            timeout,
            exited_at: None,
            blocked_pumps: 0,
            blocked_since: None,
            blocked_after_exit: Duration::ZERO,
            streams: vec![StreamEnd::Open; streams],
        }
    }

    /// The direct child has exited (its status is known).
    pub fn child_exited(&mut self, now: Instant) {
        if self.exited_at.is_none() {
            self.exited_at = Some(now);
            // Blocking that began before the exit only counts from the exit on.
            if let Some(since) = self.blocked_since.as_mut() {
                *since = now.max(*since);
            }
        }
    }

    /// Whether the child has exited.
    pub fn has_exited(&self) -> bool {
        self.exited_at.is_some()
    }

    /// Pumps waiting for room now.
    pub fn blocked_pumps(&self) -> u32 {
        self.blocked_pumps
    }

    /// A pump starts waiting for the client to make room.
    pub fn block_begin(&mut self, now: Instant) {
        if self.blocked_pumps == 0 {
            self.blocked_since = Some(now);
        }
        self.blocked_pumps += 1;
    }

    /// A pump stops waiting.
    pub fn block_end(&mut self, now: Instant) {
        if self.blocked_pumps == 0 {
            return;
        }
        self.blocked_pumps -= 1;
        if self.blocked_pumps == 0 {
            if let (Some(since), Some(exited)) = (self.blocked_since.take(), self.exited_at) {
                let since = since.max(exited);
                self.blocked_after_exit += now.saturating_duration_since(since);
            }
            self.blocked_since = None;
        }
    }

    /// When reading must stop: `None` before the exit and while a pump is blocked on the
    /// client (that time does not count against the budget).
    pub fn deadline(&self) -> Option<Instant> {
        let exited = self.exited_at?;
        if self.blocked_pumps > 0 {
            return None;
        }
        Some(exited + self.timeout + self.blocked_after_exit)
    }

    /// Whether reading must stop now.
    pub fn expired(&self, now: Instant) -> bool {
        self.deadline().is_some_and(|d| now >= d)
    }

    /// Record how stream `index` ended.
    pub fn stream_ended(&mut self, index: usize, end: StreamEnd) {
        if let Some(s) = self.streams.get_mut(index) {
            *s = end;
        }
    }

    /// Every stream ended.
    pub fn all_streams_ended(&self) -> bool {
        self.streams.iter().all(|s| *s != StreamEnd::Open)
    }

    /// `outputDrainTimedOut`: some stream was cut while deliverable output could be pending.
    pub fn timed_out(&self) -> bool {
        self.streams
            .iter()
            .any(|s| matches!(s, StreamEnd::Cut { capped: false }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn no_deadline_before_exit() {
        let d = OutputDrain::new(ms(100), 2);
        assert_eq!(d.deadline(), None);
        assert!(!d.expired(Instant::now() + ms(10_000)));
    }

    #[test]
    fn deadline_is_timeout_after_exit() {
        let t0 = Instant::now();
        let mut d = OutputDrain::new(ms(100), 2);
        d.child_exited(t0);
        assert_eq!(d.deadline(), Some(t0 + ms(100)));
        assert!(!d.expired(t0 + ms(99)));
        assert!(d.expired(t0 + ms(100)));
    }

    #[test]
    fn blocked_time_after_exit_extends_the_deadline() {
        let t0 = Instant::now();
        let mut d = OutputDrain::new(ms(100), 2);
        d.block_begin(t0); // blocked before the exit: only counts from the exit
        d.child_exited(t0 + ms(50));
        assert_eq!(d.deadline(), None, "no deadline while blocked");
        d.block_end(t0 + ms(550));
        assert_eq!(d.deadline(), Some(t0 + ms(50) + ms(100) + ms(500)));
    }

    #[test]
    fn overlapping_blocks_count_once() {
        let t0 = Instant::now();
        let mut d = OutputDrain::new(ms(100), 2);
        d.child_exited(t0);
        d.block_begin(t0 + ms(10));
        d.block_begin(t0 + ms(20));
        d.block_end(t0 + ms(30));
        assert_eq!(d.deadline(), None);
        d.block_end(t0 + ms(40));
        assert_eq!(d.deadline(), Some(t0 + ms(130)));
        d.block_end(t0 + ms(50)); // spurious end is ignored
        assert_eq!(d.deadline(), Some(t0 + ms(130)));
    }

    #[test]
    fn timed_out_only_for_uncapped_cut_streams() {
        let mut d = OutputDrain::new(ms(1), 2);
        d.stream_ended(0, StreamEnd::Eof);
        assert!(!d.all_streams_ended());
        d.stream_ended(1, StreamEnd::Cut { capped: true });
        assert!(d.all_streams_ended());
        assert!(!d.timed_out(), "a cap fully captured is not a timeout");
        d.stream_ended(1, StreamEnd::Cut { capped: false });
        assert!(d.timed_out());
    }
}
