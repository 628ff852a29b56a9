//! One session, and the driver state every session of a server shares: the one lock over
//! the `SessionTable` (`table.rs`, the sans-IO core: slots, holders, deadlines, quotas, approvals), the
//! server's metrics, output budget and exec policy, and the tracker of closing sessions.
//!
//! A [`Session`] is the handle connections hold. Its methods feed the table what happened
//! (attach, detach, a start, an exit delivered) and do, under the same lock where order
//! matters, what the table answers: evict a connection, point processes at a connection's
//! [`ReadySet`](crate::process::ReadySet), send pending requests again. Spawning goes through
//! `process::output_pump::start_process` into the session's [`SessionScope`]. It never decodes
//! JSON (the connection's handler hands it typed options) and never writes to a transport.
//!
//! # The end of a session
//!
//! Close (`session/close`, expiry, the end of a stdio connection, shutdown) ends **everything
//! the session started**, whatever process group or session it moved to and whether or not
//! its direct child is still known: SIGTERM to every process of the scope, a grace until the
//! scope is empty (the largest `killGraceMs` of its processes, never more than
//! `max_kill_grace_ms`: a client cannot stretch a path it does not control), then SIGKILL to
//! whatever is left and the scope's removal. That runs in a task the registry tracks
//! (shutdown waits for it); [`Session::terminated`] resolves when it is over.

use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::approvals::{reason, Resolution, Taken};
use super::ended_ids::{EndedIds, ENDED_WRITE_IDS};
use super::error::SessionError;
use super::pending::PendingStart;
pub use super::spec::{ConnHandle, StartSpec};
use super::table::{Attached, Closed, Handles, Holder, SessionTable, Slot};
use crate::config::{ServerConfig, DEFAULT_KILL_GRACE_MS};
use crate::metrics::{ContainmentStage, Metrics};
use crate::policy::PolicyFile;
use crate::process::containment::SessionScope;
use crate::process::event_log::LogLimits;
use crate::process::output_pump::start_process;
use crate::process::{ManagedProcess, OutputBudget};
use crate::rpc::messages::ExitReason;
use crate::sync::lock;

/// The driver's handles in the [`SessionTable`].
pub(super) struct Live;

impl Handles for Live {
    type Session = Arc<Session>;
    type Process = Arc<ManagedProcess>;
    type Pending = Arc<PendingStart>;
    type Conn = ConnHandle;
}

/// What every session of a server shares: the table under its one lock, and what starting a
/// process needs. The registry owns it; sessions hold it weakly.
pub(super) struct Shared {
    pub(super) config: Arc<ServerConfig>,
    /// The sans-IO core. Lock order: this lock, then a process's own locks; a
    /// [`RequestSink`](super::RequestSink) and [`ManagedProcess::set_delivery`] are called under it (both are
    /// short and never call back).
    pub(super) table: Mutex<SessionTable<Live>>,
    /// Wakes the timer task when a deadline was armed.
    pub(super) wake: Arc<Notify>,
    pub(super) metrics: Arc<Metrics>,
    /// The server-wide output budget (`output_budget_bytes`) every process draws on.
    pub(super) budget: Arc<OutputBudget>,
    /// `--exec-policy`; `None` allows everything.
    pub(super) policy: Option<Arc<PolicyFile>>,
}

impl Drop for Shared {
    /// The timer task holds the wake-up, not the table: it wakes, finds the table gone, and
    /// ends.
    fn drop(&mut self) {
        self.wake.notify_one();
    }
}

/// The present time for the table: tokio's clock (paused in tests), as a std `Instant`.
pub(super) fn now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

/// A session: processes and their retained output, outliving connections.
pub struct Session {
    /// Public id.
    pub id: String,
    /// The client acknowledges events.
    pub acks: bool,
    pub(super) shared: Weak<Shared>,
    /// Cancelled when the session is taken out of the table (closed or expired).
    pub(super) closed: CancellationToken,
    /// Once closed: the ids the table had forgotten and the ones the close ended, kept for
    /// the requests still on their way (see [`get_or_ended`](Self::get_or_ended)).
    pub(super) ended_at_close: OnceLock<EndedIds>,
    /// Everything the session starts is placed here, and killed with it.
    pub(super) scope: Arc<SessionScope>,
    /// The registry's tracker of closing sessions (shutdown waits for it).
    pub(super) closing: TaskTracker,
    /// Cancelled once close has ended every process of the session.
    pub(super) terminated: CancellationToken,
}

impl ConnHandle {
    /// This connection as a session's holder in the table.
    pub(super) fn holder(&self) -> Holder<ConnHandle> {
        Holder {
            conn_id: self.conn_id,
            can_answer: self.requests.is_some(),
            conn: self.clone(),
        }
    }
}

impl Session {
    /// Run `f` on the table, if the server still runs.
    fn with_table<R>(&self, f: impl FnOnce(&mut SessionTable<Live>) -> R) -> Option<R> {
        let shared = self.shared.upgrade()?;
        let mut t = lock(&shared.table);
        Some(f(&mut t))
    }

    /// How long the session survives detached.
    pub fn detached_ttl(&self) -> Duration {
        self.with_table(|t| t.ttl(&self.id))
            .flatten()
            .unwrap_or(Duration::ZERO)
    }

    /// Set how long the session survives detached (`sessionTtlMs`, already checked against
    /// the server's `max_session_ttl_ms`); takes effect at the next detach.
    pub fn set_detached_ttl(&self, ttl: Duration) {
        self.with_table(|t| t.set_ttl(&self.id, ttl));
    }

    /// Whether a connection holds the session.
    pub fn is_attached(&self) -> bool {
        self.with_table(|t| t.holder(&self.id).is_some())
            .unwrap_or(false)
    }

    /// Whether `conn_id` holds the session.
    pub fn is_attached_to(&self, conn_id: u64) -> bool {
        self.with_table(|t| t.holder(&self.id).is_some_and(|h| h.conn_id == conn_id))
            .unwrap_or(false)
    }

    /// Do what the table answered to an attach by `conn`: evict the previous holder, send
    /// `conn` every pending server request again (same ids), then re-deliver every
    /// unacknowledged retained event, then live ones. Called under the table's lock, so
    /// attaches are done in the order the table saw them; the requests are queued on `conn`'s
    /// control lane before its processes are marked ready, and the writer serves that lane
    /// first, so they precede every replayed event. Returns the requests to refuse (after
    /// the lock is released).
    pub(super) fn apply_attach(a: Attached<Live>, conn: &ConnHandle) -> Vec<Taken> {
        if let Some(old) = a.evicted {
            old.evict.cancel();
        }
        if let Some(sink) = &conn.requests {
            for r in a.resend {
                sink(r);
            }
        }
        for p in a.processes {
            p.attach_delivery(Some(conn.ready.clone()), true);
        }
        a.withdrawn
    }

    /// The connection `conn_id` ended. If it still held the session, detach and arm the
    /// expiry deadline.
    pub fn detach(self: &Arc<Self>, conn_id: u64) {
        if self.closed.is_cancelled() {
            // Closed on purpose (`session/close`): nothing to keep. The close took the entry
            // out of the table with its holder, so the connection was let go of then (its
            // request sink holds the connection's control lane open, and its writer would
            // wait for it until its flush deadline).
            return;
        }
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        let ttl = {
            let mut t = lock(&shared.table);
            let Some(processes) = t.detach(now(), &self.id, conn_id) else {
                return;
            };
            for p in processes {
                p.set_delivery(None);
            }
            t.ttl(&self.id).unwrap_or_default()
        };
        shared.wake.notify_one();
        tracing::info!(session = %self.id, ttl_ms = ttl.as_millis() as u64, "session detached");
    }

    /// Close: the session is gone at once (unknown to resume, its slot free), every pending
    /// approval is withdrawn, and a tracked task ends everything it started (module docs, "The
    /// end of a session"). [`terminated`](Self::terminated) resolves when that is done.
    /// Idempotent.
    pub fn close(&self) {
        let closed = self.with_table(|t| {
            let c = t.close(&self.id).map(|c| self.keep_ended(c));
            // Under the lock: a start that finds the session gone sees `closed` set, and a
            // request for one of its processes finds it ended.
            self.closed.cancel();
            c
        });
        match closed {
            Some(Some(c)) => {
                self.finish_close(c, reason::SESSION_CLOSED, ExitReason::SessionClosed)
            }
            Some(None) => {}
            // The server is gone with its table: end what the scope holds all the same.
            None => {
                if !self.closed.is_cancelled() {
                    self.closed.cancel();
                }
                self.end(Vec::new(), ExitReason::SessionClosed);
            }
        }
    }

    /// End what the table took out on close: tell pending approvals `why` (one of
    /// [`reason`]'s phrases) and the exit notices of the processes it ends `ended` (unless
    /// something else was ending them), and end the scope in a tracked task.
    pub(super) fn finish_close(&self, c: Closed<Live>, why: &'static str, ended: ExitReason) {
        let c = self.keep_ended(c);
        self.closed.cancel();
        for t in c.withdrawn {
            t.resolve(Resolution::Refused { reason: why });
        }
        self.end(c.processes, ended);
    }

    /// Keep the ids the close ended (the first close's: close is idempotent).
    fn keep_ended(&self, mut c: Closed<Live>) -> Closed<Live> {
        let _ = self.ended_at_close.set(std::mem::take(&mut c.ended));
        c
    }

    fn end(&self, procs: Vec<Arc<ManagedProcess>>, ended: ExitReason) {
        // Nobody will read their output again.
        for p in &procs {
            p.mark_ending(ended);
            p.abandon();
        }
        let shared = self.shared.upgrade();
        let grace = end_grace(&procs, shared.as_ref().map(|s| &*s.config));
        let (scope, id, done) = (self.scope.clone(), self.id.clone(), self.terminated.clone());
        let metrics = shared.map(|s| s.metrics.clone());
        self.closing.spawn(async move {
            let failed = |stage| {
                if let Some(m) = &metrics {
                    m.containment_failure(stage);
                }
            };
            end_scope(&scope, grace, &id, failed).await;
            // The supervisors have reaped the direct children (or will: they are dead).
            drop(procs);
            done.cancel();
        });
    }

    /// Resolves once close has ended every process of the session (SIGTERM, the grace, then
    /// SIGKILL and the scope's removal).
    pub async fn terminated(&self) {
        self.terminated.cancelled().await
    }

    /// Whether the session was closed.
    pub fn is_closed(&self) -> bool {
        self.closed.is_cancelled()
    }

    /// Resolves when the session is closed.
    pub async fn closed(&self) {
        self.closed.cancelled().await
    }

    /// Processes currently known.
    pub fn processes(&self) -> Vec<Arc<ManagedProcess>> {
        self.with_table(|t| t.processes(&self.id))
            .unwrap_or_default()
    }

    /// How many process ids are taken.
    pub fn process_count(&self) -> usize {
        self.with_table(|t| t.slot_count(&self.id)).unwrap_or(0)
    }

    /// Find a process.
    pub fn get(&self, id: &str) -> Result<Arc<ManagedProcess>, SessionError> {
        match self.with_table(|t| t.slot(&self.id, id).map(|(s, _)| s.clone())) {
            Some(Some(Slot::Ready(p))) => Ok(p),
            _ => Err(SessionError::UnknownProcess(id.to_string())),
        }
    }

    /// Find a process for a control request: `Ok(None)` when `id` names one of this
    /// session's processes that ended and was forgotten (see [`EndedIds`]), to be answered
    /// as for an exited process.
    pub fn get_or_ended(&self, id: &str) -> Result<Option<Arc<ManagedProcess>>, SessionError> {
        let found = self.with_table(|t| match t.slot(&self.id, id) {
            Some((Slot::Ready(p), _)) => Some(Some(p.clone())),
            Some(_) => None,
            None if t.is_ended(&self.id, id) => Some(None),
            // Closed: the close's ids are kept here (set under the table's lock).
            None => self
                .ended_at_close
                .get()
                .is_some_and(|e| e.contains(id))
                .then_some(None),
        });
        found
            .flatten()
            .ok_or_else(|| SessionError::UnknownProcess(id.to_string()))
    }

    /// Whether `id` is a process of this session that ended and was forgotten after it
    /// accepted the write `write_id` (a repeat of it is answered `accepted`).
    pub fn ended_wrote(&self, id: &str, write_id: &str) -> bool {
        let in_table = self.with_table(|t| t.ended_wrote(&self.id, id, write_id));
        in_table.unwrap_or(false)
            || self
                .ended_at_close
                .get()
                .is_some_and(|e| e.wrote(id, write_id))
    }

    /// Start a process for connection `conn_id`, without asking the exec policy (see
    /// [`start_checked`](Self::start_checked)). Its events are not delivered until
    /// [`enable_delivery`](Self::enable_delivery) (after the start result is written).
    pub fn start(
        self: &Arc<Self>,
        start: StartSpec,
        conn_id: u64,
    ) -> Result<Arc<ManagedProcess>, SessionError> {
        let serial = self.reserve(&start.process_id, Slot::Starting)?;
        self.launch(start, serial, conn_id, &[])
    }

    /// Take `id` as `slot` if it may be taken now (the table counts the owner's quotas and
    /// takes the slot in one step); a start waiting for approval holds its slot (and counts
    /// against the quotas) as a running one does. Returns the slot's serial.
    pub(super) fn reserve(&self, id: &str, slot: Slot<Live>) -> Result<u64, SessionError> {
        // The registry outlives its sessions except while the server shuts down.
        self.with_table(|t| t.reserve(&self.id, id, slot))
            .unwrap_or(Err(SessionError::UnknownSession))
    }

    /// Spawn the process whose id is reserved as [`Slot::Starting`] with `serial`. Its events
    /// go to the attached connection at once unless that is `conn_id` or one of `answering`
    /// (they open delivery after writing their start result, so the result comes first).
    pub(super) fn launch(
        self: &Arc<Self>,
        start: StartSpec,
        serial: u64,
        conn_id: u64,
        answering: &[u64],
    ) -> Result<Arc<ManagedProcess>, SessionError> {
        let StartSpec {
            process_id: id,
            spawn: spec,
            options: opts,
        } = start;
        // The registry outlives its sessions except while the server shuts down.
        let Some(shared) = self.shared.upgrade() else {
            return Err(SessionError::UnknownSession);
        };
        let limits = LogLimits {
            retained_bytes: shared.config.retained_output_bytes,
            fault_release_past_limit: crate::faults::active(crate::faults::Fault::ReleasePastLimit),
        };
        let started = start_process(
            id.clone(),
            &spec,
            opts,
            limits,
            self.acks,
            shared.metrics.clone(),
            shared.budget.clone(),
            &self.scope,
        );
        let proc = match started {
            Ok(p) => p,
            Err(e) => {
                lock(&shared.table).free(&self.id, &id, serial);
                // Closed meanwhile: its scope refused the child.
                if self.closed.is_cancelled() {
                    return Err(SessionError::UnknownSession);
                }
                return Err(SessionError::Start(e));
            }
        };
        {
            let mut t = lock(&shared.table);
            if !t.replace(&self.id, &id, serial, Slot::Ready(proc.clone())) {
                drop(t);
                // Closed meanwhile: the close's kill of the scope takes the child (it was
                // placed before the scope closed, or the spawn would have failed).
                proc.abandon();
                return Err(SessionError::UnknownSession);
            }
            // If the session moved to another connection while we spawned, the start result
            // will never reach that client's stream in order anyway: deliver there now.
            if let Some(cur) = t.holder(&self.id) {
                if cur.conn_id != conn_id && !answering.contains(&cur.conn_id) {
                    proc.set_delivery(Some(cur.conn.ready.clone()));
                }
            }
        }
        self.spawn_reaper(proc.clone(), serial);
        Ok(proc)
    }

    /// Open event delivery of `p` to connection `conn_id`, if it still holds the session.
    pub fn enable_delivery(&self, p: &Arc<ManagedProcess>, conn_id: u64) {
        self.with_table(|t| {
            if let Some(cur) = t.holder(&self.id) {
                if cur.conn_id == conn_id {
                    p.set_delivery(Some(cur.conn.ready.clone()));
                }
            }
        });
    }

    /// Tell the table once `p`'s exit notice was acknowledged (acks) or written (no acks):
    /// it forgets the process then, or `exitedRetentionMs` later.
    fn spawn_reaper(self: &Arc<Self>, p: Arc<ManagedProcess>, serial: u64) {
        let shared = self.shared.clone();
        let (acks, session) = (self.acks, self.id.clone());
        let closed = self.closed.clone();
        tokio::spawn(async move {
            let wait = async {
                p.wait_finished().await;
                p.wait_exit_delivered(acks).await;
            };
            tokio::select! {
                _ = wait => {}
                _ = closed.cancelled() => return,
            }
            // Final once the child exited: a write after that is `exited` or, for an id
            // already written, `accepted` without a new id remembered.
            let written = p.last_write_ids(ENDED_WRITE_IDS).await;
            if let Some(shared) = shared.upgrade() {
                lock(&shared.table).exit_delivered(now(), &session, &p.id, serial, acks, written);
                shared.wake.notify_one();
            }
        });
    }
}

/// The grace of a session's end: the largest `killGraceMs` of its known processes (the default
/// when none is known: what is left is what they started), never more than
/// `max_kill_grace_ms`, whatever a client asked for.
fn end_grace(procs: &[Arc<ManagedProcess>], config: Option<&ServerConfig>) -> Duration {
    let grace = procs
        .iter()
        .map(|p| p.opts.kill_grace)
        .max()
        .unwrap_or(Duration::from_millis(DEFAULT_KILL_GRACE_MS));
    match config {
        Some(c) => grace.min(c.max_kill_grace()),
        None => grace,
    }
}

/// End everything in `scope`: SIGTERM to every process, up to `grace` for the scope to empty,
/// then SIGKILL to whatever is left, and remove the scope. Failures are logged: nothing more
/// can be done for a process that survives SIGKILL (uninterruptible sleep) than to leave the
/// scope for shutdown or the next start's sweep.
async fn end_scope(
    scope: &Arc<SessionScope>,
    grace: Duration,
    session: &str,
    failed: impl Fn(ContainmentStage),
) {
    let s = scope.clone();
    let reached = tokio::task::spawn_blocking(move || s.signal_all(Signal::SIGTERM)).await;
    let reached = match reached {
        Ok(Ok(n)) => n,
        Ok(Err(e)) => {
            failed(ContainmentStage::Signal);
            tracing::warn!(session, error = %e, "SIGTERM to the session's processes failed");
            1
        }
        Err(e) => {
            failed(ContainmentStage::Signal);
            tracing::warn!(session, error = %e, "SIGTERM to the session's processes failed");
            1
        }
    };
    if reached > 0 {
        if let Err(e) = scope.wait_empty(grace).await {
            failed(ContainmentStage::Signal);
            tracing::warn!(session, error = %e, "waiting for the session's processes failed");
        }
    }
    match scope.kill_all().await {
        Ok(r) if !r.emptied => {
            failed(ContainmentStage::Kill);
            tracing::error!(
                session,
                "processes of the session survived SIGKILL; left for shutdown"
            )
        }
        Ok(_) => {}
        Err(e) => {
            failed(ContainmentStage::Kill);
            tracing::error!(session, error = %e, "killing the session's processes failed")
        }
    }
    if let Err(e) = scope.remove() {
        failed(ContainmentStage::RemoveScope);
        tracing::warn!(session, error = %e, "removing the session's scope failed");
    }
}
