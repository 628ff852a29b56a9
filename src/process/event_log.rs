//! The per-process event log: output deltas and the exit notice, numbered by `seq`, with
//! retention and a delivery cursor.
//!
//! Sans-IO: a plain struct, no tokio, no clock. The output pump appends, the connection
//! writer takes unwritten events and marks them written, readers (`process/read`) copy ranges,
//! and acks release. It owns the rule of `processes.md` §4: nothing is released before it is
//! written (without acks) or acknowledged (with acks), so a gap is impossible by
//! construction; a read below the retained range is reported as exactly that range.
//! It must never drop an event that has not been released by those rules.
//!
//! **Liveness**: a log that its client owes nothing (every event written, and with acks every
//! event acknowledged) always admits a chunk. The output pump waits for room on nothing but
//! this log's own changes (and the budget's), so a log full and unreleasable with nothing
//! owed would stop its child for good (`a_log_that_is_owed_nothing_always_admits_a_chunk`).
//!
//! Its unwritten bytes are its part of the server-wide output budget: the log holds a
//! [`BudgetShare`] and keeps it equal to them after every change, and an output chunk is
//! appended only once its retention and the budget admit it ([`EventLog::try_append_output`]).

use std::collections::VecDeque;

use bytes::Bytes;

use super::output_budget::{Blocked, BudgetShare};
use crate::rpc::messages::{ExitInfo, StreamName};

/// Bookkeeping cost charged per event on top of its bytes, so that a log of tiny events is
/// bounded too (an event's allocation, seq and stream tag).
pub const EVENT_OVERHEAD_BYTES: usize = 64;

/// What an event says.
#[derive(Debug, Clone, PartialEq)]
pub enum EventBody {
    /// Raw output bytes (at most `MAX_CHUNK_BYTES`).
    Output {
        /// Source stream.
        stream: StreamName,
        /// Raw bytes.
        chunk: Bytes,
    },
    /// Output of `stream` read and not kept (`outputCapKeep: "headAndTail"`): between the
    /// head already delivered and the tail that follows this event.
    Omitted {
        /// Source stream.
        stream: StreamName,
        /// Bytes not kept.
        omitted_bytes: u64,
    },
    /// The exit notice; always the last event.
    Exited(ExitInfo),
}

impl EventBody {
    /// Bytes of output it carries (0 for notices).
    pub fn output_len(&self) -> usize {
        match self {
            EventBody::Output { chunk, .. } => chunk.len(),
            EventBody::Omitted { .. } | EventBody::Exited(_) => 0,
        }
    }
}

/// One numbered event.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// 1, 2, 3, … per process.
    pub seq: u64,
    /// Content.
    pub body: EventBody,
}

impl Event {
    fn cost(&self) -> usize {
        EVENT_OVERHEAD_BYTES + self.body.output_len()
    }
}

/// What an output chunk of `len` bytes costs the log and the budget.
pub fn output_cost(len: usize) -> usize {
    EVENT_OVERHEAD_BYTES + len
}

/// A read that asked for released events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    /// `fromSeq..=toSeq` are gone.
    #[error("events {from_seq}..={to_seq} are no longer retained")]
    Released {
        /// First missing seq.
        from_seq: u64,
        /// Last missing seq.
        to_seq: u64,
    },
}

/// Limits of one log (its unwritten bytes are bounded by the server-wide output budget).
#[derive(Debug, Clone, Copy)]
pub struct LogLimits {
    /// Retained bytes from which written (without acks) events are released, oldest first;
    /// also the point at which the pump must stop appending. Both rules take the limit
    /// itself as full, so they never leave a log in between, full and unreleasable.
    pub retained_bytes: usize,
    /// Debug builds' fault injection only (`faults::Fault::ReleasePastLimit`): release only
    /// past the limit, the old dead end, so that tests can see the stall watchdog catch it.
    #[doc(hidden)]
    pub fault_release_past_limit: bool,
}

/// The event log of one process.
#[derive(Debug)]
pub struct EventLog {
    events: VecDeque<Event>,
    /// Highest seq released (0: none).
    released_through: u64,
    /// Next seq to assign.
    next_seq: u64,
    /// Highest seq handed to the transport of the attached connection.
    written_through: u64,
    /// Highest seq acknowledged by the client.
    acked_through: u64,
    retained_cost: usize,
    unwritten_cost: usize,
    limits: LogLimits,
    acks: bool,
    exit_seq: Option<u64>,
    /// This log's part of the server-wide output budget: always `unwritten_cost`.
    budget: BudgetShare,
}

impl EventLog {
    /// An empty log drawing on `budget`. `acks`: the session's client acknowledges events.
    pub fn new(limits: LogLimits, acks: bool, budget: BudgetShare) -> Self {
        EventLog {
            events: VecDeque::new(),
            released_through: 0,
            next_seq: 1,
            written_through: 0,
            acked_through: 0,
            retained_cost: 0,
            unwritten_cost: 0,
            limits,
            acks,
            exit_seq: None,
            budget,
        }
    }

    /// Whether a chunk of `len` bytes may be appended now, and if so charge it to the budget
    /// (the caller appends it at once, with [`append_output`](Self::append_output)). Refused
    /// while the retention is full, or by the output budget's rules (`output_budget.rs`):
    /// the pump then holds the chunk and waits (the child blocks on its pipe), backpressure
    /// instead of loss.
    pub fn admit_output(&mut self, len: usize) -> Result<(), Blocked> {
        if self.retained_cost >= self.limits.retained_bytes {
            return Err(Blocked::Retention);
        }
        self.budget.admit(output_cost(len))
    }

    /// Whether a chunk of `len` bytes would be admitted now ([`admit_output`](Self::admit_output)
    /// without charging it).
    pub fn would_admit_output(&self, len: usize) -> Result<(), Blocked> {
        if self.retained_cost >= self.limits.retained_bytes {
            return Err(Blocked::Retention);
        }
        self.budget.would_admit(output_cost(len))
    }

    /// Append `chunk` if it is admitted ([`admit_output`](Self::admit_output)); its seq, or
    /// the chunk back with what it waits for.
    pub fn try_append_output(
        &mut self,
        stream: StreamName,
        chunk: Bytes,
    ) -> Result<u64, (Bytes, Blocked)> {
        match self.admit_output(chunk.len()) {
            Ok(()) => Ok(self.append_output(stream, chunk)),
            Err(why) => Err((chunk, why)),
        }
    }

    /// Append an output chunk; returns its seq. Charged to the budget whether admitted or
    /// not: callers go through [`try_append_output`](Self::try_append_output), which admits
    /// it first.
    pub fn append_output(&mut self, stream: StreamName, chunk: Bytes) -> u64 {
        self.push(EventBody::Output { stream, chunk })
    }

    /// Append the notice that `omitted` bytes of `stream` were not kept. Like the exit notice
    /// it is charged without admission (a notice is never held back; at most one per stream).
    pub fn append_omitted(&mut self, stream: StreamName, omitted: u64) -> u64 {
        self.push(EventBody::Omitted {
            stream,
            omitted_bytes: omitted,
        })
    }

    /// Append the exit notice; it takes the highest seq. Appending twice is a bug upstream;
    /// the second is ignored and the first seq returned.
    pub fn append_exit(&mut self, info: ExitInfo) -> u64 {
        if let Some(seq) = self.exit_seq {
            return seq;
        }
        let seq = self.push(EventBody::Exited(info));
        self.exit_seq = Some(seq);
        seq
    }

    fn push(&mut self, body: EventBody) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        let ev = Event { seq, body };
        let cost = ev.cost();
        self.retained_cost += cost;
        self.unwritten_cost += cost;
        self.events.push_back(ev);
        self.budget.sync(self.unwritten_cost);
        seq
    }

    /// Next seq to be assigned (`nextSeq` of `process/list`).
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// The exit notice's seq, once appended.
    pub fn exit_seq(&self) -> Option<u64> {
        self.exit_seq
    }

    /// Whether the exit notice has been written to a transport.
    pub fn exit_written(&self) -> bool {
        self.exit_seq.is_some_and(|s| self.written_through >= s)
    }

    /// Whether the exit notice has been acknowledged.
    pub fn exit_acked(&self) -> bool {
        self.exit_seq.is_some_and(|s| self.acked_through >= s)
    }

    /// Whether the client acknowledges events (they are released by its acks).
    pub fn acks(&self) -> bool {
        self.acks
    }

    /// Highest seq written so far.
    pub fn written_through(&self) -> u64 {
        self.written_through
    }

    /// Highest seq acknowledged by the client (acks only).
    pub fn acked_through(&self) -> u64 {
        self.acked_through
    }

    /// Highest seq released so far.
    pub fn released_through(&self) -> u64 {
        self.released_through
    }

    /// Bytes (with per-event overhead) currently retained.
    pub fn retained_cost(&self) -> usize {
        self.retained_cost
    }

    /// Bytes (with per-event overhead) not yet written to a transport.
    pub fn unwritten_cost(&self) -> usize {
        self.unwritten_cost
    }

    /// Whether events wait to be written.
    pub fn has_unwritten(&self) -> bool {
        self.written_through + 1 < self.next_seq
    }

    /// Copy unwritten events, oldest first, up to about `max_bytes` of output (at least one).
    /// They stay unwritten until [`mark_written`](Self::mark_written).
    pub fn peek_unwritten(&self, max_bytes: usize) -> Vec<Event> {
        self.copy_after(self.written_through, max_bytes)
    }

    /// The transport accepted every event up to `seq`.
    pub fn mark_written(&mut self, seq: u64) {
        let seq = seq.min(self.next_seq - 1);
        if seq <= self.written_through {
            return;
        }
        for ev in self.events.iter() {
            if ev.seq > self.written_through && ev.seq <= seq {
                self.unwritten_cost -= ev.cost();
            }
        }
        self.written_through = seq;
        self.budget.sync(self.unwritten_cost);
        self.release();
    }

    /// The client has every event up to `seq` (`process/ack`, or a read's `afterSeq`).
    pub fn ack(&mut self, seq: u64) {
        let seq = seq.min(self.next_seq - 1);
        if seq > self.acked_through {
            self.acked_through = seq;
            if seq > self.written_through {
                // The client has these events although the cursor is behind them (a resume
                // rewound it to the previous ack, and the client then acknowledged what it got
                // over the old connection): they are written. Otherwise they would be released
                // while still counted as unwritten, and the pump would wait for room forever.
                self.mark_written(seq);
            } else {
                self.release();
            }
        }
    }

    /// A connection (re)attached: deliver again from after the last acknowledged event
    /// (without acks, from the oldest retained one; the client deduplicates by seq).
    pub fn rewind_delivery(&mut self) {
        let from = if self.acks {
            self.acked_through.max(self.released_through)
        } else {
            self.released_through
        };
        if from < self.written_through {
            self.written_through = from;
            self.unwritten_cost = self
                .events
                .iter()
                .filter(|e| e.seq > from)
                .map(Event::cost)
                .sum();
            self.budget.sync(self.unwritten_cost);
        }
    }

    /// Events with `seq > after_seq`, up to about `max_bytes` of output (at least one event
    /// when any is available).
    pub fn read(&self, after_seq: u64, max_bytes: usize) -> Result<Vec<Event>, ReadError> {
        if after_seq < self.released_through {
            return Err(ReadError::Released {
                from_seq: after_seq + 1,
                to_seq: self.released_through,
            });
        }
        Ok(self.copy_after(after_seq, max_bytes))
    }

    fn copy_after(&self, after_seq: u64, max_bytes: usize) -> Vec<Event> {
        let first = self.released_through + 1;
        // Saturating: `after_seq` is the client's number, up to u64::MAX.
        let skip = usize::try_from(after_seq.saturating_sub(first - 1)).unwrap_or(usize::MAX);
        let mut out = Vec::new();
        let mut bytes = 0usize;
        for ev in self.events.iter().skip(skip) {
            let len = ev.body.output_len();
            if !out.is_empty() && bytes + len > max_bytes {
                break;
            }
            bytes += len;
            out.push(ev.clone());
        }
        out
    }

    fn release(&mut self) {
        while let Some(front) = self.events.front() {
            let releasable = if self.acks {
                front.seq <= self.acked_through
            } else {
                // At the limit, not only past it: admission stops at the limit
                // (`admit_output`), so a log that stops there with every event written must
                // release, or its pump would wait for room no one will make. The two rules
                // are each other's complement: a log owed nothing always admits a chunk.
                let full = if self.limits.fault_release_past_limit {
                    self.retained_cost > self.limits.retained_bytes
                } else {
                    self.retained_cost >= self.limits.retained_bytes
                };
                front.seq <= self.written_through && full
            };
            if !releasable {
                break;
            }
            let cost = front.cost();
            self.retained_cost -= cost;
            self.released_through = front.seq;
            self.events.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::process::output_budget::OutputBudget;

    fn limits(retained: usize) -> LogLimits {
        LogLimits {
            retained_bytes: retained,
            fault_release_past_limit: false,
        }
    }

    /// A log alone, on a budget that never binds.
    fn log_of(retained: usize, acks: bool) -> EventLog {
        EventLog::new(limits(retained), acks, OutputBudget::unlimited().share())
    }

    fn chunk(n: usize) -> Bytes {
        Bytes::from(vec![b'x'; n])
    }

    fn exit() -> ExitInfo {
        ExitInfo {
            exit_code: Some(0),
            signal: None,
            reason: Default::default(),
            timed_out: false,
            output_drain_timed_out: false,
            stdout_bytes: 0,
            stderr_bytes: 0,
            dropped_bytes: 0,
            duration_ms: 0,
        }
    }

    #[test]
    fn seqs_are_contiguous_and_exit_is_last() {
        let mut log = log_of(1 << 20, false);
        assert_eq!(log.append_output(StreamName::Stdout, chunk(1)), 1);
        assert_eq!(log.append_output(StreamName::Stderr, chunk(1)), 2);
        assert_eq!(log.append_exit(exit()), 3);
        assert_eq!(log.append_exit(exit()), 3, "exit is appended once");
        let evs = log.read(0, usize::MAX).unwrap();
        let seqs: Vec<u64> = evs.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, vec![1, 2, 3]);
        assert!(matches!(evs[2].body, EventBody::Exited(_)));
    }

    /// Regression: after a resume rewound the cursor, an ack for events the client got over
    /// the old connection released them while they still counted as unwritten, so the log
    /// never had room again.
    #[test]
    fn an_ack_past_a_rewound_cursor_moves_the_cursor() {
        let budget = OutputBudget::new(1 << 20);
        let mut log = EventLog::new(limits(1 << 20), true, budget.share());
        for _ in 0..5 {
            log.append_output(StreamName::Stdout, chunk(50));
        }
        log.mark_written(5);
        log.ack(2);
        log.rewind_delivery();
        assert_eq!(log.written_through(), 2);
        assert_eq!(
            budget.unwritten(),
            3 * output_cost(50),
            "three events unwritten again hold the budget"
        );
        log.ack(4);
        assert_eq!(log.written_through(), 4);
        assert_eq!(log.released_through(), 4);
        let left: Vec<u64> = log
            .peek_unwritten(usize::MAX)
            .iter()
            .map(|e| e.seq)
            .collect();
        assert_eq!(left, vec![5]);
        assert_eq!(
            budget.unwritten(),
            output_cost(50),
            "one unwritten event left"
        );
        log.mark_written(5);
        assert_eq!(log.unwritten_cost(), 0);
        assert_eq!(budget.unwritten(), 0);
        assert!(!log.has_unwritten());
    }

    #[test]
    fn unwritten_events_are_never_released() {
        let mut log = log_of(100, false);
        for _ in 0..10 {
            log.append_output(StreamName::Stdout, chunk(50));
        }
        assert_eq!(
            log.admit_output(1),
            Err(Blocked::Retention),
            "over the retention limit: pump must wait"
        );
        assert_eq!(log.read(0, usize::MAX).unwrap().len(), 10, "nothing lost");
        log.mark_written(4);
        // Released oldest-first while over the limit, but only written ones.
        assert_eq!(log.released_through(), 4);
        assert_eq!(
            log.read(2, usize::MAX),
            Err(ReadError::Released {
                from_seq: 3,
                to_seq: 4
            })
        );
        assert_eq!(log.read(4, usize::MAX).unwrap()[0].seq, 5);
    }

    /// Regression (a stream that stopped for good after its reader paused): without acks,
    /// written events were released only while the log was *over* its limit, and a chunk was
    /// admitted only while it was *under* it. A log that landed on the limit to the byte,
    /// everything written, did neither: its pump waited for a release that no one would make,
    /// the child blocked on its pipe, and the client, having read everything, waited forever.
    #[test]
    fn a_log_full_to_the_byte_with_everything_written_admits_more() {
        let mut log = log_of(3 * output_cost(100), false);
        for _ in 0..3 {
            log.append_output(StreamName::Stdout, chunk(100));
        }
        assert_eq!(
            log.retained_cost(),
            3 * output_cost(100),
            "exactly at the limit"
        );
        assert_eq!(log.admit_output(100), Err(Blocked::Retention));
        log.mark_written(3);
        assert!(!log.has_unwritten());
        assert_eq!(
            log.admit_output(100),
            Ok(()),
            "everything written: room for the pump (it waits for nothing else)"
        );
        assert!(log.retained_cost() < 3 * output_cost(100));
    }

    /// The liveness rule the pump relies on, over many random runs: once the client side owes
    /// the log nothing (every event written, and with acks every event acknowledged), a chunk
    /// is admitted. Otherwise a pump that waits for room waits for an event that never comes.
    #[test]
    fn a_log_that_is_owed_nothing_always_admits_a_chunk() {
        let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        for run in 0..2000 {
            let acks = run % 2 == 0;
            let chunk_max = 1 + next(4096) as usize;
            let limit = output_cost(chunk_max) * (1 + next(8) as usize) + next(3) as usize;
            let mut log = log_of(limit, acks);
            for _ in 0..200 {
                match next(4) {
                    0 | 1 => {
                        let len = 1 + next(chunk_max as u64) as usize;
                        let _ = log.try_append_output(StreamName::Stdout, chunk(len));
                    }
                    2 => log.mark_written(log.next_seq() - 1),
                    _ => log.ack(log.written_through()),
                }
                if !log.has_unwritten() && (!acks || log.acked_through() == log.written_through()) {
                    assert_eq!(
                        log.would_admit_output(chunk_max),
                        Ok(()),
                        "run {run}: limit {limit}, retained {} with nothing owed",
                        log.retained_cost()
                    );
                }
            }
        }
    }

    /// `afterSeq` is the client's: the largest one reads nothing (no overflow, no panic),
    /// and acknowledging it acknowledges only what exists.
    #[test]
    fn a_read_after_the_largest_seq_is_empty() {
        let mut log = log_of(1 << 20, true);
        log.append_output(StreamName::Stdout, chunk(5));
        assert_eq!(log.read(u64::MAX, usize::MAX), Ok(Vec::new()));
        assert_eq!(log.read(u64::MAX - 1, 0), Ok(Vec::new()));
        log.ack(u64::MAX);
        assert_eq!(log.acked_through(), 1);
        assert_eq!(log.read(u64::MAX, usize::MAX), Ok(Vec::new()));
    }

    #[test]
    fn written_events_stay_while_under_the_limit() {
        let mut log = log_of(10_000, false);
        log.append_output(StreamName::Stdout, chunk(10));
        log.mark_written(1);
        assert_eq!(log.released_through(), 0);
        assert_eq!(log.read(0, 100).unwrap().len(), 1);
    }

    #[test]
    fn acks_release_and_only_acks() {
        let mut log = log_of(100, true);
        for _ in 0..5 {
            log.append_output(StreamName::Stdout, chunk(50));
        }
        log.mark_written(5);
        assert_eq!(log.released_through(), 0, "written is not enough with acks");
        log.ack(3);
        assert_eq!(log.released_through(), 3);
        log.ack(2);
        assert_eq!(log.released_through(), 3, "acks never go backwards");
        log.ack(99);
        assert_eq!(log.released_through(), 5, "ack is clamped to what exists");
    }

    /// Output is appended only as the budget admits it; a refused chunk comes back whole, and
    /// writing frees the budget for it.
    #[test]
    fn the_budget_admits_output_and_writes_free_it() {
        use crate::config::MAX_CHUNK_BYTES;
        let full = output_cost(MAX_CHUNK_BYTES);
        let budget = OutputBudget::new(4 * full);
        let mut a = EventLog::new(limits(1 << 30), false, budget.share());
        let mut b = EventLog::new(limits(1 << 30), false, budget.share());
        // Alone, a may take the whole budget.
        for seq in 1..=4 {
            assert_eq!(
                a.try_append_output(StreamName::Stdout, chunk(MAX_CHUNK_BYTES)),
                Ok(seq)
            );
        }
        // b's guarantee, past the budget.
        assert_eq!(b.try_append_output(StreamName::Stderr, chunk(10)), Ok(1));
        assert_eq!(budget.unwritten(), 4 * full + output_cost(10));
        // Within b's fair share (half the budget), but the budget is spent.
        let refused = chunk(MAX_CHUNK_BYTES);
        match b.try_append_output(StreamName::Stderr, refused.clone()) {
            Err((back, Blocked::Budget)) => assert_eq!(back, refused),
            other => panic!("expected the budget to refuse, got {other:?}"),
        }
        assert_eq!(b.next_seq(), 2, "nothing appended");
        a.mark_written(2);
        assert_eq!(budget.unwritten(), 2 * full + output_cost(10));
        assert_eq!(b.try_append_output(StreamName::Stderr, refused), Ok(2));
        // The exit notice is charged without admission: it is never held back.
        let before = budget.unwritten();
        b.append_exit(exit());
        assert_eq!(budget.unwritten(), before + EVENT_OVERHEAD_BYTES);
        drop(b);
        assert_eq!(
            budget.unwritten(),
            2 * full,
            "a dropped log gives its share back"
        );
        assert_eq!(budget.ahead(), 1);
    }

    #[test]
    fn peek_respects_max_bytes_but_returns_one() {
        let mut log = log_of(1 << 20, false);
        log.append_output(StreamName::Stdout, chunk(300));
        log.append_output(StreamName::Stdout, chunk(300));
        assert_eq!(log.peek_unwritten(100).len(), 1);
        assert_eq!(log.peek_unwritten(600).len(), 2);
        assert_eq!(log.read(0, 0).unwrap().len(), 1);
    }

    #[test]
    fn rewind_redelivers_after_last_ack() {
        let mut log = log_of(1 << 20, true);
        for _ in 0..4 {
            log.append_output(StreamName::Stdout, chunk(1));
        }
        log.mark_written(4);
        log.ack(2);
        log.rewind_delivery();
        let seqs: Vec<u64> = log
            .peek_unwritten(usize::MAX)
            .iter()
            .map(|e| e.seq)
            .collect();
        assert_eq!(seqs, vec![3, 4]);
    }

    #[test]
    fn rewind_without_acks_redelivers_everything_retained() {
        let mut log = log_of(1 << 20, false);
        for _ in 0..3 {
            log.append_output(StreamName::Stdout, chunk(1));
        }
        log.mark_written(3);
        log.rewind_delivery();
        assert_eq!(log.peek_unwritten(usize::MAX).len(), 3);
    }

    #[test]
    fn exit_written_and_acked_flags() {
        let mut log = log_of(1 << 20, true);
        let s = log.append_exit(exit());
        assert!(!log.exit_written());
        log.mark_written(s);
        assert!(log.exit_written());
        assert!(!log.exit_acked());
        log.ack(s);
        assert!(log.exit_acked());
    }
}
