//! Flow control of one stream direction (`secure-transport.md` §7), sans-IO.
//!
//! - [`SendWindow`]: the sender's credit. It never lets a record past the peer's
//!   `ack + window` out.
//! - [`RecvWindow`]: the receiver's accounting: records arrive in order numbered from 1, at
//!   most `window` past what was consumed (handed to the application); a bare `ACK` is due
//!   once half a window was consumed since the last report, or `ACK_EVERY_RECORDS` (8) if
//!   fewer: a relay may have clipped the window the sender sees.
//! - [`RelayFlow`]: what the relay keeps per stream per direction (the receiver's last report
//!   and the sender's highest `seq`), to reset a sender past its window without reading
//!   anything but frame headers.
//!
//! Reports are monotonic: a report that would lower the limit `ack + window` (an old frame
//! overtaken by a newer `ACK` in a relay's control lane) is ignored, so reordering between a
//! stream's `ACK`s and its `DATA` can never take credit back.

use crate::config::ACK_EVERY_RECORDS;

/// Why a received record is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FlowError {
    /// Not the next record of the direction (records are numbered 1, 2, 3, … on an ordered
    /// link).
    #[error("record {got} out of order (expected {expected})")]
    OutOfOrder {
        /// The next record expected.
        expected: u64,
        /// The record that arrived.
        got: u64,
    },
    /// Past `ack + window`.
    #[error("record {seq} past the window (limit {limit})")]
    WindowExceeded {
        /// The record that arrived.
        seq: u64,
        /// The last record the receiver accepts.
        limit: u64,
    },
    /// The peer acknowledged a record never sent.
    #[error("ack {ack} of a record never sent (sent {sent})")]
    AckBeyondSent {
        /// The acknowledgement received.
        ack: u64,
        /// Records sent so far.
        sent: u64,
    },
}

/// The sender's side of one direction.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SendWindow {
    sent: u64,
    limit: u64,
    /// The report that set `limit` (what the peer said it consumed, and its window): kept for
    /// the stall watchdog's account of a stream, never used to decide anything.
    reported: (u64, u32),
}

impl SendWindow {
    /// No credit until the peer's first report (its `OPEN` or `ACCEPT`).
    pub fn new() -> Self {
        SendWindow::default()
    }

    /// Take the peer's report (`ack`, `window`) from any frame it sent on this stream.
    /// Returns whether this gave credit to a sender that had none.
    pub fn on_report(&mut self, ack: u64, window: u32) -> Result<bool, FlowError> {
        if ack > self.sent {
            return Err(FlowError::AckBeyondSent {
                ack,
                sent: self.sent,
            });
        }
        let limit = ack.saturating_add(u64::from(window));
        if limit <= self.limit {
            return Ok(false);
        }
        let was_blocked = self.sent >= self.limit;
        self.limit = limit;
        self.reported = (ack, window);
        Ok(was_blocked)
    }

    /// Records that may be sent now.
    pub fn credit(&self) -> u64 {
        self.limit.saturating_sub(self.sent)
    }

    /// The number the next record gets.
    pub fn next_seq(&self) -> u64 {
        self.sent + 1
    }

    /// Records sent so far (the last `seq`).
    pub fn sent(&self) -> u64 {
        self.sent
    }

    /// The peer's report that set the current limit: (`ack`, `window`).
    pub fn reported(&self) -> (u64, u32) {
        self.reported
    }

    /// Number the next record if there is credit.
    pub fn take(&mut self) -> Option<u64> {
        if self.sent < self.limit {
            self.sent += 1;
            Some(self.sent)
        } else {
            None
        }
    }
}

/// The receiver's side of one direction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvWindow {
    window: u32,
    received: u64,
    consumed: u64,
    reported: u64,
}

impl RecvWindow {
    /// A receiver advertising `window` records (never 0: validated in the config).
    pub fn new(window: u32) -> Self {
        RecvWindow {
            window: window.max(1),
            received: 0,
            consumed: 0,
            reported: 0,
        }
    }

    /// Check and count an arriving record.
    pub fn on_data(&mut self, seq: u64) -> Result<(), FlowError> {
        let expected = self.received + 1;
        if seq != expected {
            return Err(FlowError::OutOfOrder { expected, got: seq });
        }
        let limit = self.consumed + u64::from(self.window);
        if seq > limit {
            return Err(FlowError::WindowExceeded { seq, limit });
        }
        self.received = seq;
        Ok(())
    }

    /// The application consumed every record up to `seq` (cumulative; an older `seq` is a
    /// no-op). Returns whether a bare `ACK` is now due. `None` if `seq` was never received.
    pub fn consume(&mut self, seq: u64) -> Option<bool> {
        if seq > self.received {
            return None;
        }
        self.consumed = self.consumed.max(seq);
        Some(self.ack_due())
    }

    /// Half a window consumed since the last report, or [`ACK_EVERY_RECORDS`] if fewer (at
    /// least one record).
    pub fn ack_due(&self) -> bool {
        let every = (self.window / 2).clamp(1, ACK_EVERY_RECORDS);
        self.consumed - self.reported >= u64::from(every)
    }

    /// Whether anything was consumed since the last report.
    pub fn unreported(&self) -> bool {
        self.consumed > self.reported
    }

    /// The (`ack`, `window`) to put on an outgoing frame; it counts as a report.
    pub fn report(&mut self) -> (u64, u32) {
        self.reported = self.consumed;
        (self.consumed, self.window)
    }

    /// The advertised window.
    pub fn window(&self) -> u32 {
        self.window
    }

    /// Highest record received.
    pub fn received(&self) -> u64 {
        self.received
    }

    /// Highest record consumed.
    pub fn consumed(&self) -> u64 {
        self.consumed
    }

    /// Highest record reported to the sender (the `ack` of the last frame that carried one).
    pub fn reported(&self) -> u64 {
        self.reported
    }
}

/// A relay's accounting of one stream direction: the receiver's highest report and the
/// sender's highest record.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RelayFlow {
    highest: u64,
    limit: u64,
}

impl RelayFlow {
    /// Nothing may pass before the receiver's first report.
    pub fn new() -> Self {
        RelayFlow::default()
    }

    /// The receiver said (`ack`, `window`).
    pub fn on_report(&mut self, ack: u64, window: u32) {
        self.limit = self.limit.max(ack.saturating_add(u64::from(window)));
    }

    /// A record from the sender: in order and inside the receiver's last window.
    pub fn on_data(&mut self, seq: u64) -> Result<(), FlowError> {
        let expected = self.highest + 1;
        if seq != expected {
            return Err(FlowError::OutOfOrder { expected, got: seq });
        }
        if seq > self.limit {
            return Err(FlowError::WindowExceeded {
                seq,
                limit: self.limit,
            });
        }
        self.highest = seq;
        Ok(())
    }

    /// The last record the receiver accepts.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The sender's highest record.
    pub fn highest(&self) -> u64 {
        self.highest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sender_stops_at_ack_plus_window_and_resumes_on_report() {
        let mut s = SendWindow::new();
        assert_eq!(s.take(), None, "no credit before the first report");
        assert_eq!(s.on_report(0, 3), Ok(true));
        assert_eq!(
            (s.take(), s.take(), s.take(), s.take()),
            (Some(1), Some(2), Some(3), None)
        );
        assert_eq!(s.on_report(2, 3), Ok(true));
        assert_eq!(s.credit(), 2);
        assert_eq!(s.on_report(1, 3), Ok(false), "an older report is ignored");
        assert_eq!(s.credit(), 2);
        assert_eq!(
            s.on_report(4, 3),
            Err(FlowError::AckBeyondSent { ack: 4, sent: 3 })
        );
    }

    #[test]
    fn receiver_accepts_exactly_the_window_in_order() {
        let mut r = RecvWindow::new(4);
        for seq in 1..=4 {
            assert_eq!(r.on_data(seq), Ok(()));
        }
        assert_eq!(
            r.on_data(5),
            Err(FlowError::WindowExceeded { seq: 5, limit: 4 })
        );
        assert_eq!(
            r.on_data(6),
            Err(FlowError::OutOfOrder {
                expected: 5,
                got: 6
            })
        );
        assert_eq!(r.consume(1), Some(false));
        assert_eq!(r.consume(2), Some(true), "half of 4 consumed");
        assert_eq!(r.report(), (2, 4));
        assert!(!r.ack_due());
        assert_eq!(r.on_data(5), Ok(()));
        assert_eq!(r.on_data(6), Ok(()));
        assert_eq!(r.consume(7), None, "never received");
    }

    #[test]
    fn a_large_window_still_acks_every_eight_records() {
        // 64 records advertised, perhaps clipped to 16 by a relay: the sender must hear of
        // progress before it runs out of the window it saw.
        let mut r = RecvWindow::new(64);
        for seq in 1..=8 {
            assert_eq!(r.on_data(seq), Ok(()));
        }
        assert_eq!(r.consume(7), Some(false));
        assert_eq!(r.consume(8), Some(true), "8 = ACK_EVERY_RECORDS consumed");
        assert_eq!(r.report(), (8, 64));
        assert!(!r.ack_due());
    }

    #[test]
    fn window_of_one_acks_every_record() {
        let mut r = RecvWindow::new(1);
        assert_eq!(r.on_data(1), Ok(()));
        assert_eq!(r.consume(1), Some(true));
    }

    #[test]
    fn relay_flow_tracks_the_receivers_highest_report() {
        let mut f = RelayFlow::new();
        assert!(matches!(
            f.on_data(1),
            Err(FlowError::WindowExceeded { .. })
        ));
        f.on_report(0, 2);
        assert_eq!(f.on_data(1), Ok(()));
        assert_eq!(f.on_data(2), Ok(()));
        assert!(f.on_data(3).is_err());
        f.on_report(1, 2);
        f.on_report(0, 2); // overtaken, ignored
        assert_eq!(f.limit(), 3);
        assert_eq!(f.on_data(3), Ok(()));
    }
}
