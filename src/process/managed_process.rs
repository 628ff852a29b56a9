//! One running (or exited) process as the server knows it: its event log, stdin, PTY, and
//! the control operations of `protocol.md` §4 (signal, terminate, resize, write, read).
//!
//! Signals reach the process group by identity only ([`ManagedProcess::signal_group`]):
//! `killpg` through the [`DirectChild`] while the leader is unreaped (its number cannot name
//! anyone else's group then), afterwards each member still in the session's scope by pidfd.
//! It never signals by a bare pid or group id.
//!
//! Shared as `Arc<ManagedProcess>` between the session, the output pumps, the supervisor and
//! connection writers. All state a peer can change sits behind short, non-async locks; the
//! only async lock is stdin's, held by at most one write at a time. It never spawns (that is
//! `spawn.rs`) and never writes to a transport (that is the connection writer).
//!
//! Split by concern: the operations on the process group (signal, terminate, resize) are in
//! `managed_process/signals.rs`, stdin (write, close) in `managed_process/stdin.rs`.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::containment::{DirectChild, SessionScope};
use super::error::ProcessError;
use super::event_log::{Event, EventLog, LogLimits};
use super::exit_delivery::{delivered, ExitDelivery, Finisher};
use super::output_budget::{Blocked, OutputBudget};
use super::output_drain::OutputDrain;
use super::ready_set::ReadySet;
use super::spawn::{InputWriter, PtyControl};
use super::stall_watch::Observation;
use super::write_ids::WriteIds;
use crate::config::PUMP_CHUNK_BYTES;
use crate::metrics::Metrics;
use crate::rpc::messages::{ExitInfo, ExitReason, OutputCapKeep};
use crate::rpc::notification::json_string;
use crate::sync::lock;

mod signals;
mod stdin;

pub use signals::check_term_size;
pub use stdin::{WriteStatus, WRITE_EXIT_GRACE};

/// Per-process options from `process/start`, with defaults applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessOptions {
    /// `timeoutMs`.
    pub timeout: Option<Duration>,
    /// `outputBytesCap`, per stream.
    pub output_cap: Option<u64>,
    /// `outputCapKeep`: what the cap keeps (the head, or the head and the tail).
    pub output_cap_keep: OutputCapKeep,
    /// `drainTimeoutMs`.
    pub drain_timeout: Duration,
    /// `killGraceMs`.
    pub kill_grace: Duration,
    /// `killProcessGroupOnExit`.
    pub kill_group_on_exit: bool,
}

/// Occupancy of a process's event log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessStats {
    /// Retained bytes, with per-event overhead.
    pub retained_bytes: usize,
    /// Unwritten bytes, with per-event overhead.
    pub unwritten_bytes: usize,
    /// Next seq to assign.
    pub next_seq: u64,
    /// Highest released seq.
    pub released_through: u64,
    /// Highest seq written to a transport.
    pub written_through: u64,
    /// Highest seq acknowledged by the client (acks only).
    pub acked_through: u64,
    /// The exit notice is in the log.
    pub exited: bool,
}

/// What `process/list` shows of one process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessInfo {
    /// Client-chosen id.
    pub process_id: String,
    /// OS pid (also the process group id).
    pub pid: u32,
    /// What was started (shared with the process: a `process/list` answer copies no argv).
    pub argv: Arc<[String]>,
    /// Runs on a PTY.
    pub tty: bool,
    /// Next seq to assign.
    pub next_seq: u64,
    /// The exit notice, once the process exited.
    pub exit: Option<ExitInfo>,
}

/// The answer to `process/read`.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadOutcome {
    /// Events after `afterSeq`, oldest first.
    pub events: Vec<Event>,
    /// The `afterSeq` to pass to continue after these events.
    pub next_seq: u64,
    /// The direct child is still running.
    pub running: bool,
    /// The exit notice is in the log.
    pub exited: bool,
}

/// The `nextSeq` of a read after `after_seq` that returned `events`: one past the last event,
/// or one past `after_seq` when there was none. Saturates: `afterSeq` is the client's number,
/// and `u64::MAX` (which no event can follow) must neither wrap to 0 nor panic.
pub fn next_seq_after(after_seq: u64, events: &[Event]) -> u64 {
    events.last().map_or(after_seq, |e| e.seq).saturating_add(1)
}

pub(crate) struct Inner {
    pub(crate) log: EventLog,
    pub(crate) drain: OutputDrain,
    pub(crate) stdout_bytes: u64,
    pub(crate) stderr_bytes: u64,
    pub(crate) dropped_bytes: u64,
    pub(crate) exit: Option<ExitInfo>,
    /// What a pump waits for, while one waits for room (the stall watchdog's account).
    pub(crate) waiting_for: Option<Blocked>,
}

struct StdinState {
    writer: Option<InputWriter>,
    closed: bool,
    ids: WriteIds,
}

/// A process of a session.
pub struct ManagedProcess {
    /// Client-chosen id.
    pub id: String,
    /// The id as a JSON string literal, precomputed for the notification hot path.
    pub(crate) id_json: String,
    /// OS pid, also the process group id.
    pub pid: u32,
    /// What was started (at most `MAX_ARGV_BYTES`), shared with every `process/list`
    /// answer that shows it.
    pub argv: Arc<[String]>,
    /// Runs on a PTY.
    pub tty: bool,
    pub(crate) opts: ProcessOptions,
    pub(crate) started: Instant,
    pub(crate) inner: Mutex<Inner>,
    /// Wakes pumps waiting for room and long polls waiting for events.
    pub(crate) changed: Notify,
    /// Who learns that the exit notice was written or acknowledged (`exit_delivery.rs`):
    /// apart from `changed`, which each event written would wake for nothing.
    exit_delivery: ExitDelivery<ManagedProcess>,
    /// The direct child was reaped.
    pub(crate) exited: CancellationToken,
    /// The exit notice is in the log.
    pub(crate) finished: CancellationToken,
    /// The session is gone: pumps stop waiting for room and quit.
    pub(crate) abandoned: CancellationToken,
    /// Why the process is being ended, by whoever started ending it first (a timeout, a
    /// client, the session's close or expiry, shutdown); `None`: nobody here did.
    end_cause: Mutex<Option<ExitReason>>,
    /// The session cgroup's OOM kill count when the process started (`None`: not known here).
    pub(crate) oom_kills_at_start: Option<u64>,
    stdin: tokio::sync::Mutex<StdinState>,
    pty: Option<PtyControl>,
    delivery: Mutex<Option<Arc<ReadySet>>>,
    /// The direct child by pidfd: group signals while it is unreaped, and its reap.
    pub(crate) direct: Arc<DirectChild>,
    /// The session's scope: the group's members once the leader was reaped.
    scope: Arc<SessionScope>,
    /// The server's counters (bytes in and out, blocked delivery time).
    pub(crate) metrics: Arc<Metrics>,
    /// The server-wide output budget this process's log draws on (its pumps wait on it).
    pub(crate) budget: Arc<OutputBudget>,
}

impl ManagedProcess {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        id: String,
        pid: u32,
        argv: Arc<[String]>,
        tty: bool,
        opts: ProcessOptions,
        limits: LogLimits,
        acks: bool,
        streams: usize,
        stdin: Option<InputWriter>,
        pty: Option<PtyControl>,
        metrics: Arc<Metrics>,
        budget: Arc<OutputBudget>,
        direct: Arc<DirectChild>,
        scope: Arc<SessionScope>,
    ) -> Self {
        let drain = OutputDrain::new(opts.drain_timeout, streams);
        ManagedProcess {
            id_json: json_string(&id),
            id,
            pid,
            argv,
            tty,
            opts,
            started: Instant::now(),
            inner: Mutex::new(Inner {
                log: EventLog::new(limits, acks, budget.share()),
                drain,
                stdout_bytes: 0,
                stderr_bytes: 0,
                dropped_bytes: 0,
                exit: None,
                waiting_for: None,
            }),
            changed: Notify::new(),
            exit_delivery: ExitDelivery::default(),
            exited: CancellationToken::new(),
            finished: CancellationToken::new(),
            abandoned: CancellationToken::new(),
            end_cause: Mutex::new(None),
            oom_kills_at_start: scope.oom_kills(),
            stdin: tokio::sync::Mutex::new(StdinState {
                writer: stdin,
                closed: false,
                ids: WriteIds::default(),
            }),
            pty,
            delivery: Mutex::new(None),
            metrics,
            budget,
            direct,
            scope,
        }
    }

    /// A snapshot of the log's occupancy (metrics, tests).
    pub fn stats(&self) -> ProcessStats {
        let inner = self.inner();
        ProcessStats {
            retained_bytes: inner.log.retained_cost(),
            unwritten_bytes: inner.log.unwritten_cost(),
            next_seq: inner.log.next_seq(),
            released_through: inner.log.released_through(),
            written_through: inner.log.written_through(),
            acked_through: inner.log.acked_through(),
            exited: inner.exit.is_some(),
        }
    }

    pub(crate) fn inner(&self) -> MutexGuard<'_, Inner> {
        lock(&self.inner)
    }

    /// Whether the direct child is still running (not yet reaped).
    pub fn is_running(&self) -> bool {
        !self.exited.is_cancelled()
    }

    /// Resolves once the direct child was reaped (whether or not its output was drained).
    pub async fn wait_exited(&self) {
        self.exited.cancelled().await
    }

    /// Resolves once the exit notice is in the log.
    pub async fn wait_finished(&self) {
        self.finished.cancelled().await
    }

    /// Route future events to `ready` (a connection's writer), or nowhere (`None`: detached).
    /// Marks the process ready at once so that retained unwritten events flow.
    pub fn set_delivery(self: &Arc<Self>, ready: Option<Arc<ReadySet>>) {
        self.attach_delivery(ready, false);
    }

    /// Point delivery at `ready` and, with `rewind`, re-deliver from after the last
    /// acknowledged event (on resume). The delivery lock is held across both, and
    /// [`mark_written_by`](Self::mark_written_by) takes it too, so a writer of the previous
    /// connection that finishes a write afterwards cannot move the new connection's cursor.
    pub fn attach_delivery(self: &Arc<Self>, ready: Option<Arc<ReadySet>>, rewind: bool) {
        let mut d = lock(&self.delivery);
        let has_unwritten = {
            let mut inner = self.inner();
            if rewind {
                inner.log.rewind_delivery();
            }
            inner.log.has_unwritten()
        };
        *d = ready;
        if let Some(r) = d.as_ref() {
            if has_unwritten {
                r.push(self.clone());
            }
        }
    }

    /// One look at this process for the stall watchdog, if it delivers to a connection (a
    /// detached process holds its output on purpose). With the connection's ready set, for
    /// the account of a stall.
    pub fn stall_observation(&self) -> Option<(Observation, Arc<ReadySet>)> {
        let ready = lock(&self.delivery).clone()?;
        let (progress, unwritten, owed, pump_waiting, would_admit) = {
            let inner = self.inner();
            let log = &inner.log;
            let pump_waiting = inner
                .waiting_for
                .filter(|_| inner.drain.blocked_pumps() > 0);
            (
                [
                    log.next_seq(),
                    log.written_through(),
                    log.released_through(),
                    log.acked_through(),
                ],
                log.has_unwritten(),
                log.acks() && log.acked_through() < log.written_through(),
                pump_waiting,
                log.would_admit_output(PUMP_CHUNK_BYTES).is_ok(),
            )
        };
        let flow = ready.flow().and_then(|f| f.snapshot());
        let o = Observation {
            progress,
            unwritten,
            owed_by_client: owed,
            pump_waiting,
            would_admit,
            writer: ready.phase(),
            transport_can_send: flow.map(|f| f.can_send),
            transport_sent: flow.map(|f| f.sent),
            link_queued_bytes: flow.map(|f| f.link_queued_bytes),
        };
        Some((o, ready))
    }

    /// Whether `ready` is the current delivery target.
    pub fn delivers_to(&self, ready: &Arc<ReadySet>) -> bool {
        lock(&self.delivery)
            .as_ref()
            .is_some_and(|r| Arc::ptr_eq(r, ready))
    }

    /// Tell the attached writer (if any) that events wait.
    pub(crate) fn notify_delivery(self: &Arc<Self>) {
        if let Some(r) = lock(&self.delivery).as_ref() {
            r.push(self.clone());
        }
        self.changed.notify_waiters();
    }

    /// Unwritten events for the connection writer (at least one if any).
    pub fn peek_unwritten(&self, max_bytes: usize) -> Vec<Event> {
        self.inner().log.peek_unwritten(max_bytes)
    }

    /// The writer of `ready` handed events up to `seq` to its transport. Ignored unless
    /// `ready` is still the delivery target: after a detach or a resume the cursor belongs to
    /// the new attachment. Returns whether more events wait for `ready`.
    pub fn mark_written_by(&self, ready: &Arc<ReadySet>, seq: u64) -> bool {
        let (more, exit_written) = {
            let d = lock(&self.delivery);
            if !d.as_ref().is_some_and(|r| Arc::ptr_eq(r, ready)) {
                return false;
            }
            let mut inner = self.inner();
            inner.log.mark_written(seq);
            (inner.log.has_unwritten(), inner.log.exit_written())
        };
        self.changed.notify_waiters();
        // The exit notice was written: run what waited for that here, on the writer.
        self.exit_delivery.changed(self, exit_written, false);
        more
    }

    /// `process/ack`.
    pub fn ack(&self, seq: u64) {
        let (exit_written, exit_acked) = {
            let mut inner = self.inner();
            inner.log.ack(seq);
            (inner.log.exit_written(), inner.log.exit_acked())
        };
        self.changed.notify_waiters();
        // An ack past the write cursor (after a resume) also marks events written. What
        // waited for the ack runs here, on the connection's reader (`exit_delivery.rs`).
        self.exit_delivery.changed(self, exit_written, exit_acked);
    }

    /// Whether the exit notice was written (without acks) or acknowledged (with acks).
    pub fn exit_delivered(&self, acks: bool) -> bool {
        let inner = self.inner();
        delivered(acks, inner.log.exit_written(), inner.log.exit_acked())
    }

    /// Wait until [`exit_delivered`](Self::exit_delivered).
    pub async fn wait_exit_delivered(&self, acks: bool) {
        let notify = self.exit_delivery.notify(acks);
        loop {
            let notified = notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.exit_delivered(acks) {
                return;
            }
            notified.await;
        }
    }

    /// Run `f` once the exit notice is [delivered](Self::exit_delivered): here and now if it
    /// is, else by whoever delivers it, the connection's reader handling the ack or the
    /// writer that wrote it (`exit_delivery.rs`). One finisher per process.
    pub fn when_exit_delivered(&self, acks: bool, f: Finisher<ManagedProcess>) {
        self.exit_delivery
            .when_delivered(self, acks, || self.exit_delivered(acks), f);
    }

    /// What `process/list` shows of this process.
    pub fn info(&self) -> ProcessInfo {
        let inner = self.inner();
        ProcessInfo {
            process_id: self.id.clone(),
            pid: self.pid,
            argv: self.argv.clone(),
            tty: self.tty,
            next_seq: inner.log.next_seq(),
            exit: inner.exit.clone(),
        }
    }

    /// `process/read`: events after `after_seq`, long-polling up to `wait`. Ends at once
    /// when `cancel` fires (connection closed or session resumed elsewhere).
    pub async fn read(
        &self,
        after_seq: u64,
        max_bytes: usize,
        wait: Duration,
        acks: bool,
        cancel: &CancellationToken,
    ) -> Result<ReadOutcome, ProcessError> {
        let deadline = Instant::now() + wait;
        if acks && after_seq > 0 {
            // An ack like `process/ack`'s, and like it, it wakes whoever waits on this
            // process's log: a pump waiting for room, the reaper waiting for the exit
            // notice to be acknowledged.
            self.ack(after_seq);
        }
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let inner = self.inner();
                let events = inner.log.read(after_seq, max_bytes)?;
                let done = inner.exit.is_some();
                if !events.is_empty() || done || Instant::now() >= deadline {
                    return Ok(ReadOutcome {
                        next_seq: next_seq_after(after_seq, &events),
                        events,
                        running: self.is_running(),
                        exited: done,
                    });
                }
            }
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(deadline) => {}
                _ = cancel.cancelled() => return Err(ProcessError::ReadCancelled),
            }
        }
    }

    /// The session is over: stop the pumps (nobody will read the output again). Killing is
    /// the session's business: its scope is killed whole (`Session::close`).
    pub fn abandon(&self) {
        self.abandoned.cancel();
        self.changed.notify_waiters();
    }
}

impl ManagedProcess {
    /// Record why the process is being ended, before the signal that ends it: the first
    /// cause recorded wins (a client's terminate after a timeout does not make it
    /// `terminated`), and nothing is recorded once the exit notice is in the log.
    pub fn mark_ending(&self, reason: ExitReason) {
        if self.finished.is_cancelled() {
            return;
        }
        let mut cause = lock(&self.end_cause);
        if cause.is_none() {
            *cause = Some(reason);
        }
    }

    /// The cause recorded by [`mark_ending`](Self::mark_ending), if any.
    pub fn end_cause(&self) -> Option<ExitReason> {
        *lock(&self.end_cause)
    }

    /// The session cgroup's OOM kill count now, against the one at start: whether the
    /// kernel's OOM killer struck in the session while this process ran (`None`: not known).
    pub(crate) fn oom_killed_since_start(&self) -> Option<bool> {
        let before = self.oom_kills_at_start?;
        let now = self.scope.oom_kills()?;
        Some(now > before)
    }
}

/// The `reason` of an exit notice (`protocol.md` §5): the cause recorded before the end when
/// there is one; else `oomKilled` for a death by `SIGKILL` while the session's OOM count rose
/// (the kernel sent it: nobody here did); else `exited`.
pub fn exit_reason(
    cause: Option<ExitReason>,
    signal: Option<&str>,
    oom: Option<bool>,
) -> ExitReason {
    match (cause, signal, oom) {
        (Some(c), _, _) => c,
        (None, Some("SIGKILL"), Some(true)) => ExitReason::OomKilled,
        _ => ExitReason::Exited,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::event_log::EventBody;
    use crate::rpc::messages::StreamName;

    fn output(seq: u64) -> Event {
        Event {
            seq,
            body: EventBody::Output {
                stream: StreamName::Stdout,
                chunk: bytes::Bytes::from_static(b"x"),
            },
        }
    }

    /// The first recorded cause wins; without one, only a SIGKILL while the session's OOM
    /// count rose is `oomKilled`; an unknown count never is.
    #[test]
    fn the_exit_reason_is_the_first_cause_else_the_oom_killer_else_exited() {
        use ExitReason as R;
        assert_eq!(
            exit_reason(Some(R::Timeout), Some("SIGKILL"), Some(true)),
            R::Timeout
        );
        assert_eq!(
            exit_reason(Some(R::ServerShutdown), None, None),
            R::ServerShutdown
        );
        assert_eq!(exit_reason(None, Some("SIGKILL"), Some(true)), R::OomKilled);
        assert_eq!(exit_reason(None, Some("SIGKILL"), Some(false)), R::Exited);
        assert_eq!(exit_reason(None, Some("SIGKILL"), None), R::Exited);
        assert_eq!(exit_reason(None, Some("SIGTERM"), Some(true)), R::Exited);
        assert_eq!(exit_reason(None, None, Some(true)), R::Exited);
    }

    #[test]
    fn next_seq_follows_the_last_event_or_after_seq() {
        assert_eq!(next_seq_after(0, &[]), 1);
        assert_eq!(next_seq_after(4, &[output(5), output(6)]), 7);
        assert_eq!(next_seq_after(9, &[]), 10);
    }

    /// `afterSeq` 2^64−1 saturates instead of wrapping to 0 (or panicking in a debug build).
    #[test]
    fn next_seq_saturates_at_the_largest_after_seq() {
        assert_eq!(next_seq_after(u64::MAX, &[]), u64::MAX);
        assert_eq!(next_seq_after(u64::MAX - 1, &[]), u64::MAX);
        assert_eq!(next_seq_after(0, &[output(u64::MAX)]), u64::MAX);
    }
}
