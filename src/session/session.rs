//! One session, and the state the driver shares across a server's sessions: the one lock
//! over the `SessionTable` (`table.rs`, the sans-IO core), the server's metrics, output
//! budget and exec policy.
//!
//! A [`Session`] is the handle connections hold. Its methods feed the table what happened (a
//! detach, a start, a close, a delivery opened) through the driver (`driver.rs`), which does
//! what the table answers: spawn into the session's [`SessionScope`], point processes at a
//! connection's [`ReadySet`](crate::process::ReadySet), end the scope. It never spawns,
//! signals or decides who holds what itself, never decodes JSON (the connection's handler
//! hands it typed options) and never writes to a transport.
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

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::ended_ids::EndedIds;
use super::error::SessionError;
use super::pending::PendingStart;
pub use super::spec::{ConnHandle, StartSpec};
use super::table::{Handles, Holder, SessionTable, Slot};
use crate::config::ServerConfig;
use crate::metrics::Metrics;
use crate::policy::PolicyFile;
use crate::process::containment::SessionScope;
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
    type Spec = StartSpec;
}

/// What every session of a server shares: the table under its one lock, and what starting a
/// process needs. The registry owns it; sessions hold it weakly.
pub(super) struct Shared {
    pub(super) config: Arc<ServerConfig>,
    /// The sans-IO core. Lock order: this lock, then a process's own locks; a
    /// [`RequestSink`](super::RequestSink) and [`ManagedProcess::attach_delivery`] are called
    /// under it (both are short and never call back).
    pub(super) table: Mutex<SessionTable<Live>>,
    /// Wakes the timer task when an earlier deadline was armed.
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
    /// Run `f` on the table (a question: it queues nothing), if the server still runs.
    fn with_table<R>(&self, f: impl FnOnce(&SessionTable<Live>) -> R) -> Option<R> {
        let shared = self.shared.upgrade()?;
        let t = lock(&shared.table);
        Some(f(&t))
    }

    /// Feed the table through the driver, if the server still runs.
    pub(super) fn drive<R>(&self, f: impl FnOnce(&mut SessionTable<Live>) -> R) -> Option<R> {
        Some(self.shared.upgrade()?.drive(f))
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
        self.drive(|t| t.set_ttl(&self.id, ttl));
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
        let ttl = shared.drive(|t| {
            t.detach(now(), &self.id, conn_id)
                .then(|| t.ttl(&self.id).unwrap_or_default())
        });
        let Some(ttl) = ttl else {
            return;
        };
        tracing::info!(session = %self.id, ttl_ms = ttl.as_millis() as u64, "session detached");
    }

    /// Close: the session is gone at once (unknown to resume, its slot free), every pending
    /// approval is withdrawn, and a tracked task ends everything it started (module docs, "The
    /// end of a session"). [`terminated`](Self::terminated) resolves when that is done.
    /// Idempotent.
    pub fn close(&self) {
        // The table ends the session (its scope signalled, its approvals withdrawn) and the
        // driver forgets it under the lock: a start that finds the session gone sees `closed`
        // set, and a request for one of its processes finds it ended.
        let closed = self.drive(|t| {
            t.close(&self.id);
            self.closed.cancel();
        });
        if closed.is_none() {
            // The server is gone with its table: end what the scope holds all the same.
            if !self.closed.is_cancelled() {
                self.closed.cancel();
            }
            self.end(Vec::new(), ExitReason::SessionClosed, None);
        }
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
        let Some(shared) = self.shared.upgrade() else {
            // The registry outlives its sessions except while the server shuts down.
            return Err(SessionError::UnknownSession);
        };
        let id = start.process_id.clone();
        let (reserved, launched) =
            shared.drive_launch(|t| t.start(&self.id, &id, start, vec![conn_id]));
        reserved?;
        launched.unwrap_or(Err(SessionError::UnknownSession))
    }

    /// Take `id` as `slot` if it may be taken now (the table counts the owner's quotas and
    /// takes the slot in one step); a start waiting for approval holds its slot (and counts
    /// against the quotas) as a running one does. Returns the slot's serial.
    pub(super) fn reserve(&self, id: &str, slot: Slot<Live>) -> Result<u64, SessionError> {
        // The registry outlives its sessions except while the server shuts down.
        self.drive(|t| t.reserve(&self.id, id, slot))
            .unwrap_or(Err(SessionError::UnknownSession))
    }

    /// Open event delivery of `p` to connection `conn_id`, if it still holds the session.
    pub fn enable_delivery(&self, p: &Arc<ManagedProcess>, conn_id: u64) {
        self.drive(|t| t.enable_delivery(&self.id, conn_id, p.clone()));
    }
}
