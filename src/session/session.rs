//! One session: processes and their retained output, outliving connections, and which
//! connection (if any) it is attached to.
//!
//! It owns a session's part of the lifecycle of `processes.md` §5: attach (evicting the
//! previous holder), detach and arm the expiry timer, close, starting processes from a
//! validated [`StartSpec`] into the session's [`SessionScope`], and reaping exited ones. It
//! never decodes JSON (the connection's handler hands it typed options) and never writes to a
//! transport: delivery goes through the attached connection's [`ReadySet`].
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

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::approvals::{reason, Approvals, RequestSink, Resolution};
use super::ended_ids::{EndedIds, ENDED_WRITE_IDS};
use super::gated_start::PendingStart;
use super::quota::{AddressKey, Owner};
use super::session_registry::SessionRegistry;
use super::SessionError;
use crate::config::{ServerConfig, DEFAULT_KILL_GRACE_MS};
use crate::metrics::ContainmentStage;
use crate::process::containment::SessionScope;
use crate::process::event_log::LogLimits;
use crate::process::output_pump::start_process;
use crate::process::spawn::SpawnSpec;
use crate::process::{ManagedProcess, ProcessOptions, ReadySet};
use crate::rpc::messages::ExitReason;
use crate::sync::lock;

/// A validated `process/start`: what to spawn and how to run it. The connection's handler
/// decodes and validates the params and applies the defaults; the session never sees JSON.
#[derive(Debug, Clone, PartialEq)]
pub struct StartSpec {
    /// The client-chosen id (1 to `MAX_PROCESS_ID_BYTES` bytes).
    pub process_id: String,
    /// What to spawn.
    pub spawn: SpawnSpec,
    /// How to run it (timeouts, caps, grace).
    pub options: ProcessOptions,
}

/// What a connection brings when it attaches a session.
#[derive(Clone)]
pub struct ConnHandle {
    /// Unique per server.
    pub conn_id: u64,
    /// Where the session's events go while attached.
    pub ready: Arc<ReadySet>,
    /// Cancelled when another connection takes the session over.
    pub evict: CancellationToken,
    /// The client's static public key on a Noise channel (sessions are bound to it).
    pub peer_key: Option<Vec<u8>>,
    /// The peer's IP address (the `ws://` connection's, or the Noise link's), for the
    /// per-address quotas; `None` on stdio.
    pub peer_addr: Option<IpAddr>,
    /// Where server requests (`process/approve`) go while this connection holds the session;
    /// `None` when the client did not declare it can answer them.
    pub requests: Option<RequestSink>,
}

pub(super) enum Slot {
    /// Being spawned: the id is taken, nothing to show yet.
    Starting,
    /// Waiting for the client's approval (`process/list` shows it as `pendingApproval`).
    Pending(Arc<PendingStart>),
    Ready(Arc<ManagedProcess>),
}

pub(super) struct AttachState {
    pub(super) current: Option<ConnHandle>,
    /// Bumped on every attach and detach, so an old expiry timer can tell it is stale.
    pub(super) generation: u64,
}

/// A session: processes and their retained output, outliving connections.
pub struct Session {
    /// Public id.
    pub id: String,
    pub(super) token: Vec<u8>,
    /// The client acknowledges events.
    pub acks: bool,
    pub(super) peer_key: Option<Vec<u8>>,
    /// The creator's address, for the per-address quotas (the session stays its creator's).
    pub(super) owner_address: Option<AddressKey>,
    pub(super) config: Arc<ServerConfig>,
    pub(super) processes: Mutex<HashMap<String, Slot>>,
    /// Ids of processes that ended and were forgotten. Lock order: after `processes`.
    pub(super) ended: Mutex<EndedIds>,
    pub(super) attach: Mutex<AttachState>,
    pub(super) registry: Weak<SessionRegistry>,
    pub(super) closed: CancellationToken,
    /// Pending server → client requests (`process/approve`). Lock order: `attach`, then
    /// `approvals`; `processes` is never held while taking either.
    pub(super) approvals: Mutex<Approvals>,
    /// Everything the session starts is placed here, and killed with it.
    pub(super) scope: Arc<SessionScope>,
    /// The registry's tracker of closing sessions (shutdown waits for it).
    pub(super) closing: TaskTracker,
    /// Cancelled once close has ended every process of the session.
    pub(super) terminated: CancellationToken,
    /// How long the session survives detached, in milliseconds: the server's default, or
    /// what the client's `sessionTtlMs` asked for (within `max_session_ttl_ms`).
    pub(super) detached_ttl_ms: AtomicU64,
}

impl Session {
    /// How long the session survives detached.
    pub fn detached_ttl(&self) -> Duration {
        Duration::from_millis(self.detached_ttl_ms.load(Ordering::Relaxed))
    }

    /// Set how long the session survives detached (`sessionTtlMs`, already checked against
    /// the server's `max_session_ttl_ms`); takes effect at the next detach.
    pub fn set_detached_ttl(&self, ttl: Duration) {
        let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        self.detached_ttl_ms.store(ms, Ordering::Relaxed);
    }

    /// Whether a connection holds the session.
    pub fn is_attached(&self) -> bool {
        lock(&self.attach).current.is_some()
    }

    /// Whether `conn_id` holds the session.
    pub fn is_attached_to(&self, conn_id: u64) -> bool {
        lock(&self.attach)
            .current
            .as_ref()
            .is_some_and(|c| c.conn_id == conn_id)
    }

    /// Attach to `conn`: evict the previous holder, send `conn` every pending server request
    /// again (same ids), then re-deliver every unacknowledged retained event, then live ones.
    /// The requests are queued on `conn`'s control lane before its processes are marked
    /// ready, and the writer serves that lane first, so they precede every replayed event.
    pub(super) fn attach(&self, conn: &ConnHandle) {
        let withdrawn = {
            let mut st = lock(&self.attach);
            if let Some(old) = st.current.take() {
                if old.conn_id != conn.conn_id {
                    old.evict.cancel();
                }
            }
            st.current = Some(conn.clone());
            st.generation += 1;
            let withdrawn = {
                let mut approvals = lock(&self.approvals);
                match &conn.requests {
                    Some(sink) => {
                        for r in approvals.pending() {
                            sink(r);
                        }
                        Vec::new()
                    }
                    // A client that cannot answer holds the session now: nobody can.
                    None => approvals.take_all(),
                }
            };
            for p in self.processes() {
                p.attach_delivery(Some(conn.ready.clone()), true);
            }
            withdrawn
        };
        for t in withdrawn {
            t.resolve(Resolution::Refused {
                reason: reason::RESUMED_WITHOUT_CAPABILITY,
            });
        }
    }

    /// The connection `conn_id` ended. If it still held the session, detach and arm the
    /// expiry timer.
    pub fn detach(self: &Arc<Self>, conn_id: u64) {
        if self.closed.is_cancelled() {
            // Closed on purpose (`session/close`): nothing to keep, but let go of the
            // connection (its request sink holds the connection's control lane open, and its
            // writer would wait for it until its flush deadline).
            let mut st = lock(&self.attach);
            if st.current.as_ref().is_some_and(|c| c.conn_id == conn_id) {
                st.current = None;
            }
            return;
        }
        let generation = {
            let mut st = lock(&self.attach);
            match &st.current {
                Some(c) if c.conn_id == conn_id => {}
                _ => return,
            }
            st.current = None;
            st.generation += 1;
            for p in self.processes() {
                p.set_delivery(None);
            }
            st.generation
        };
        let ttl = self.detached_ttl();
        // The deadline is fixed now, not when the timer task first runs.
        let deadline = Instant::now() + ttl;
        let me = Arc::downgrade(self);
        tracing::info!(session = %self.id, ttl_ms = ttl.as_millis() as u64, "session detached");
        tokio::spawn(async move {
            tokio::time::sleep_until(deadline).await;
            let Some(s) = me.upgrade() else { return };
            let stale = {
                let st = lock(&s.attach);
                st.generation != generation || st.current.is_some()
            };
            if !stale {
                tracing::info!(session = %s.id, "detached session expired");
                s.close_with(reason::SESSION_EXPIRED, ExitReason::SessionExpired);
            }
        });
    }

    /// Close: the session is gone at once (unknown to resume, its slot free), every pending
    /// approval is withdrawn, and a tracked task ends everything it started (module docs, "The
    /// end of a session"). [`terminated`](Self::terminated) resolves when that is done.
    /// Idempotent.
    pub fn close(&self) {
        self.close_with(reason::SESSION_CLOSED, ExitReason::SessionClosed)
    }

    /// Close, telling pending approvals `why` (one of [`reason`]'s phrases) and the exit
    /// notices of the processes it ends `ended` (unless something else was ending them).
    fn close_with(&self, why: &'static str, ended: ExitReason) {
        // The attach lock orders close against `start`'s insertion: a process is either
        // taken here or refused there.
        let procs: Vec<Arc<ManagedProcess>> = {
            let _st = lock(&self.attach);
            if self.closed.is_cancelled() {
                return;
            }
            self.closed.cancel();
            let procs: Vec<Arc<ManagedProcess>> = lock(&self.processes)
                .drain()
                .filter_map(|(_, s)| match s {
                    Slot::Ready(p) => Some(p),
                    // A start waiting for approval spawned nothing: dropping its slot is all.
                    Slot::Starting | Slot::Pending(_) => None,
                })
                .collect();
            // A request already on its way for one of them (a stdin pump's last write
            // crossing `session/close`) is answered as for an exited process.
            let mut ended = lock(&self.ended);
            for p in &procs {
                ended.insert(p.id.clone());
            }
            procs
        };
        // After `closed` is set: a request registered later sees it and withdraws itself.
        let withdrawn = lock(&self.approvals).take_all();
        for t in withdrawn {
            t.resolve(Resolution::Refused { reason: why });
        }
        if let Some(r) = self.registry.upgrade() {
            r.remove(&self.id);
        }
        // Nobody will read their output again.
        for p in &procs {
            p.mark_ending(ended);
            p.abandon();
        }
        let grace = end_grace(&procs, &self.config);
        let (scope, id, done) = (self.scope.clone(), self.id.clone(), self.terminated.clone());
        let metrics = self.registry.upgrade().map(|r| r.metrics().clone());
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

    /// Who owns the session, for the per-client quotas.
    pub(super) fn owner(&self) -> Owner {
        Owner {
            key: self.peer_key.clone(),
            address: self.owner_address,
        }
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
        lock(&self.processes)
            .values()
            .filter_map(|s| match s {
                Slot::Ready(p) => Some(p.clone()),
                Slot::Starting | Slot::Pending(_) => None,
            })
            .collect()
    }

    /// How many process ids are taken.
    pub fn process_count(&self) -> usize {
        lock(&self.processes).len()
    }

    /// Find a process.
    pub fn get(&self, id: &str) -> Result<Arc<ManagedProcess>, SessionError> {
        match lock(&self.processes).get(id) {
            Some(Slot::Ready(p)) => Ok(p.clone()),
            _ => Err(SessionError::UnknownProcess(id.to_string())),
        }
    }

    /// Find a process for a control request: `Ok(None)` when `id` names one of this
    /// session's processes that ended and was forgotten (see [`ended_ids`](super::ended_ids)),
    /// to be answered as for an exited process.
    pub fn get_or_ended(&self, id: &str) -> Result<Option<Arc<ManagedProcess>>, SessionError> {
        let procs = lock(&self.processes);
        match procs.get(id) {
            Some(Slot::Ready(p)) => Ok(Some(p.clone())),
            None if lock(&self.ended).contains(id) => Ok(None),
            _ => Err(SessionError::UnknownProcess(id.to_string())),
        }
    }

    /// Whether `id` is a process of this session that ended and was forgotten after it
    /// accepted the write `write_id` (a repeat of it is answered `accepted`).
    pub fn ended_wrote(&self, id: &str, write_id: &str) -> bool {
        lock(&self.ended).wrote(id, write_id)
    }

    /// Start a process for connection `conn_id`, without asking the exec policy (see
    /// [`start_checked`](Self::start_checked)). Its events are not delivered until
    /// [`enable_delivery`](Self::enable_delivery) (after the start result is written).
    pub fn start(
        self: &Arc<Self>,
        start: StartSpec,
        conn_id: u64,
    ) -> Result<Arc<ManagedProcess>, SessionError> {
        self.reserve(&start.process_id, Slot::Starting)?;
        self.launch(start, conn_id, &[])
    }

    /// Take `id` as `slot` if it may be taken now: under the owner's per-key and per-address
    /// quotas, unknown, and under `maxProcesses`. The quotas are counted and the slot taken
    /// under one admission, so two starts at once cannot both take the owner's last slot; a
    /// start waiting for approval holds its slot (and counts against the quotas) as a running
    /// one does.
    pub(super) fn reserve(&self, id: &str, slot: Slot) -> Result<(), SessionError> {
        // The registry outlives its sessions except while the server shuts down.
        let Some(registry) = self.registry.upgrade() else {
            return Err(SessionError::UnknownSession);
        };
        // Lock order: the admission, then `processes` (the admission counts every session's
        // processes, this one's included, so `processes` must not be held while taking it).
        let _admission = registry.admit_process(self)?;
        let mut procs = lock(&self.processes);
        if procs.contains_key(id) {
            return Err(SessionError::ProcessExists(id.to_string()));
        }
        if procs.len() >= self.config.max_processes {
            return Err(SessionError::TooManyProcesses(self.config.max_processes));
        }
        procs.insert(id.to_string(), slot);
        lock(&self.ended).remove(id);
        Ok(())
    }

    /// Spawn the process whose id is already reserved as [`Slot::Starting`]. Its events go to
    /// the attached connection at once unless that is `conn_id` or one of `answering` (they
    /// open delivery after writing their start result, so the result comes first).
    pub(super) fn launch(
        self: &Arc<Self>,
        start: StartSpec,
        conn_id: u64,
        answering: &[u64],
    ) -> Result<Arc<ManagedProcess>, SessionError> {
        let StartSpec {
            process_id: id,
            spawn: spec,
            options: opts,
        } = start;
        // The registry outlives its sessions except while the server shuts down.
        let (metrics, budget) = match self.registry.upgrade() {
            Some(r) => (r.metrics().clone(), r.output_budget().clone()),
            None => {
                lock(&self.processes).remove(&id);
                return Err(SessionError::UnknownSession);
            }
        };
        let limits = LogLimits {
            retained_bytes: self.config.retained_output_bytes,
            fault_release_past_limit: crate::faults::active(crate::faults::Fault::ReleasePastLimit),
        };
        let started = start_process(
            id.clone(),
            &spec,
            opts,
            limits,
            self.acks,
            metrics,
            budget,
            &self.scope,
        );
        let proc = match started {
            Ok(p) => p,
            Err(e) => {
                lock(&self.processes).remove(&id);
                // Closed meanwhile: its scope refused the child.
                if self.closed.is_cancelled() {
                    return Err(SessionError::UnknownSession);
                }
                return Err(SessionError::Start(e));
            }
        };
        {
            let st = lock(&self.attach);
            let mut procs = lock(&self.processes);
            if self.closed.is_cancelled() {
                drop(procs);
                drop(st);
                // The close's kill of the scope takes the child (it was placed before the
                // scope closed, or the spawn would have failed).
                proc.abandon();
                return Err(SessionError::UnknownSession);
            }
            procs.insert(id.clone(), Slot::Ready(proc.clone()));
            // If the session moved to another connection while we spawned, the start result
            // will never reach that client's stream in order anyway: deliver there now.
            if let Some(cur) = &st.current {
                if cur.conn_id != conn_id && !answering.contains(&cur.conn_id) {
                    proc.set_delivery(Some(cur.ready.clone()));
                }
            }
        }
        self.spawn_reaper(proc.clone());
        Ok(proc)
    }

    /// Open event delivery of `p` to connection `conn_id`, if it still holds the session.
    pub fn enable_delivery(&self, p: &Arc<ManagedProcess>, conn_id: u64) {
        let st = lock(&self.attach);
        if let Some(cur) = &st.current {
            if cur.conn_id == conn_id {
                p.set_delivery(Some(cur.ready.clone()));
            }
        }
    }

    /// Remove an exited process once its exit notice was acknowledged (acks) or
    /// `exitedRetentionMs` after it was written (no acks).
    fn spawn_reaper(self: &Arc<Self>, p: Arc<ManagedProcess>) {
        let me = Arc::downgrade(self);
        let acks = self.acks;
        let retention = Duration::from_millis(self.config.exited_retention_ms);
        let closed = self.closed.clone();
        tokio::spawn(async move {
            let wait = async {
                p.wait_finished().await;
                p.wait_exit_delivered(acks).await;
                if !acks {
                    tokio::time::sleep(retention).await;
                }
            };
            tokio::select! {
                _ = wait => {}
                _ = closed.cancelled() => return,
            }
            // Final once the child exited: a write after that is `exited` or, for an id
            // already written, `accepted` without a new id remembered.
            let written = p.last_write_ids(ENDED_WRITE_IDS).await;
            if let Some(s) = me.upgrade() {
                let mut procs = lock(&s.processes);
                if let Some(Slot::Ready(cur)) = procs.get(&p.id) {
                    if Arc::ptr_eq(cur, &p) {
                        procs.remove(&p.id);
                        lock(&s.ended).insert_with_writes(p.id.clone(), written);
                    }
                }
            }
        });
    }
}

/// The grace of a session's end: the largest `killGraceMs` of its known processes (the default
/// when none is known: what is left is what they started), never more than
/// `max_kill_grace_ms`, whatever a client asked for.
fn end_grace(procs: &[Arc<ManagedProcess>], config: &ServerConfig) -> Duration {
    procs
        .iter()
        .map(|p| p.opts.kill_grace)
        .max()
        .unwrap_or(Duration::from_millis(DEFAULT_KILL_GRACE_MS))
        .min(config.max_kill_grace())
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
