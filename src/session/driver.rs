//! The driver of the session table: the one place that does what the table decides. It owns
//! the table's lock, the processes (spawning them into their session's scope, the task that
//! reports each one's delivered exit), containment at a session's end (SIGTERM to the scope,
//! the capped grace, SIGKILL, removal) and the one timer task that fires the table's
//! deadlines.
//!
//! The state it works on is declared beside the session (`session.rs`: the [`Shared`] table
//! and its handles); this file adds the doing to it (`impl Shared`, [`Session::end`]), so
//! that the session's methods reach the driver without importing it.
//!
//! Every call into the table goes through [`Shared::drive`]: feed the table (under its lock),
//! do the actions it queued that connections must see in the table's order while still under
//! the lock ([`Action::in_order`]: forget a session, point a process's delivery, evict a
//! connection, send a request), then the rest once the lock is released (spawn, signal a
//! scope, resolve an approval, abandon a process, wake the timer). The table never sees a
//! process, a scope or a clock; this module never decides who holds what or when.
//!
//! It never decodes JSON and never writes to a transport: delivery goes through the
//! connection's [`ReadySet`](crate::process::ReadySet), requests through its
//! [`RequestSink`](super::RequestSink).

use std::sync::{Arc, Weak};
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::sync::Notify;

use super::ended_ids::ENDED_WRITE_IDS;
use super::error::SessionError;
use super::session::{now, Live, Session, Shared};
use super::spec::StartSpec;
use super::table::{Action, EndCause, SessionTable};
use crate::config::{ServerConfig, DEFAULT_KILL_GRACE_MS};
use crate::metrics::ContainmentStage;
use crate::process::containment::SessionScope;
use crate::process::event_log::LogLimits;
use crate::process::output_pump::start_process;
use crate::process::ManagedProcess;
use crate::rpc::messages::ExitReason;
use crate::sync::lock;

/// What a spawn the driver did came to.
type Launched = Result<Arc<ManagedProcess>, SessionError>;

impl Shared {
    /// Feed the table with `f` and do what it asks (module docs). Returns `f`'s answer.
    pub(super) fn drive<R>(self: &Arc<Self>, f: impl FnOnce(&mut SessionTable<Live>) -> R) -> R {
        self.drive_launch(f).0
    }

    /// [`drive`](Self::drive) for a call that may queue one [`Action::Spawn`]: also what
    /// that spawn came to (`None` if nothing was spawned).
    pub(super) fn drive_launch<R>(
        self: &Arc<Self>,
        f: impl FnOnce(&mut SessionTable<Live>) -> R,
    ) -> (R, Option<Launched>) {
        let (r, later) = {
            let mut t = lock(&self.table);
            let r = f(&mut t);
            let mut later = Vec::new();
            while let Some(a) = t.poll_action() {
                if a.in_order() {
                    perform_in_order(a);
                } else {
                    later.push(a);
                }
            }
            (r, later)
        };
        let mut launched = None;
        for a in later {
            if let Some(l) = self.perform(a) {
                launched = Some(l);
            }
        }
        (r, launched)
    }

    /// Do one action that is not [`in order`](Action::in_order), the table's lock released.
    fn perform(self: &Arc<Self>, a: Action<Live>) -> Option<Launched> {
        match a {
            Action::Spawn {
                session,
                process,
                serial,
                spec,
            } => return Some(self.spawn(&session, &process, serial, spec)),
            Action::SignalScope {
                session,
                processes,
                cause,
            } => {
                if cause == EndCause::Expired {
                    tracing::info!(session = %session.id, "detached session expired");
                }
                session.end(processes, cause.exit_reason(), Some(self));
            }
            Action::Resolve {
                request,
                resolution,
            } => request.resolve(resolution),
            Action::Abandon(p) => p.abandon(),
            Action::Arm(at) => {
                // The timer task sleeps until the earliest deadline it read: wake it to read
                // this earlier one.
                tracing::trace!(
                    in_ms = at.saturating_duration_since(now()).as_millis() as u64,
                    "session deadline armed"
                );
                self.wake.notify_one()
            }
            in_order => perform_in_order(in_order),
        }
        None
    }

    /// Spawn `spec` for slot `process` (`serial`) of `session` into its scope, and tell the
    /// table what came of it.
    fn spawn(
        self: &Arc<Self>,
        session: &Arc<Session>,
        process: &str,
        serial: u64,
        spec: StartSpec,
    ) -> Launched {
        let limits = LogLimits {
            retained_bytes: self.config.retained_output_bytes,
            fault_release_past_limit: crate::faults::active(crate::faults::Fault::ReleasePastLimit),
        };
        let started = start_process(
            spec.process_id,
            &spec.spawn,
            spec.options,
            limits,
            session.acks,
            self.metrics.clone(),
            self.budget.clone(),
            &session.scope,
        );
        let (proc, supervisor) = match started {
            Ok(p) => p,
            Err(e) => {
                let ours = self.drive(|t| t.handle_spawned(&session.id, process, serial, None));
                // Closed meanwhile: its scope refused the child.
                if !ours || session.closed.is_cancelled() {
                    return Err(SessionError::UnknownSession);
                }
                return Err(SessionError::Start(e));
            }
        };
        // A slot gone meanwhile (closed) abandons the child: the close's kill of the scope
        // takes it (it was placed before the scope closed, or the spawn would have failed).
        if !self.drive(|t| t.handle_spawned(&session.id, process, serial, Some(proc.clone()))) {
            // Still supervised: its pumps and its reap run until the kill takes it.
            tokio::spawn(supervisor);
            return Err(SessionError::UnknownSession);
        }
        let after = after_exit(Arc::downgrade(self), session, proc.clone(), serial);
        tokio::spawn(async move {
            supervisor.await;
            after.await;
        });
        Ok(proc)
    }
}

/// Do an [`in order`](Action::in_order) action, under the table's lock.
fn perform_in_order(a: Action<Live>) {
    match a {
        Action::Forget { session, ended } => {
            // Set under the lock: a request that finds the session gone finds these.
            let _ = session.ended_at_close.set(ended);
            session.closed.cancel();
        }
        Action::Deliver {
            process,
            to,
            replay,
        } => process.attach_delivery(to.map(|c| c.ready), replay),
        Action::Evict(conn) => conn.evict.cancel(),
        Action::Request { to, request } => {
            if let Some(sink) = &to.requests {
                sink(request);
            }
        }
        other => debug_assert!(false, "{other:?} is not done under the lock"),
    }
}

/// Tell the table once `p`'s exit notice was acknowledged (acks) or written (no acks): it
/// forgets the process then, or `exitedRetentionMs` later. Run after the process's
/// supervisor, in its task, which ends there: what is left is a finisher run by whoever
/// delivers the notice (the reader handling the ack, the writer that wrote it;
/// `process/exit_delivery.rs`), not a task waiting for it.
fn after_exit(
    shared: Weak<Shared>,
    session: &Session,
    p: Arc<ManagedProcess>,
    serial: u64,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let (acks, id) = (session.acks, session.id.clone());
    let closed = session.closed.clone();
    async move {
        tokio::select! {
            _ = p.wait_finished() => {}
            _ = closed.cancelled() => return,
        }
        // Weak: the finisher is kept by the process itself until it runs.
        let weak = Arc::downgrade(&p);
        p.when_exit_delivered(
            acks,
            Box::new(move |p: &ManagedProcess| {
                if closed.is_cancelled() {
                    return;
                }
                // Final once the child exited: a write after that is `exited` or, for an id
                // already written, `accepted` without a new id remembered.
                match p.try_last_write_ids(ENDED_WRITE_IDS) {
                    Some(written) => exit_delivered(&shared, &id, &p.id, serial, acks, written),
                    // A write still holds stdin (it gives up now that the child is gone):
                    // wait for it in a task, never here.
                    None => {
                        if let Some(p) = weak.upgrade() {
                            tokio::spawn(async move {
                                let written = p.last_write_ids(ENDED_WRITE_IDS).await;
                                exit_delivered(&shared, &id, &p.id, serial, acks, written);
                            });
                        }
                    }
                }
            }),
        );
    }
}

fn exit_delivered(
    shared: &Weak<Shared>,
    session: &str,
    process: &str,
    serial: u64,
    acks: bool,
    written: Vec<Arc<str>>,
) {
    if let Some(shared) = shared.upgrade() {
        shared.drive(|t| t.exit_delivered(now(), session, process, serial, acks, written));
    }
}

impl Session {
    /// End this session's processes `procs` (their exit notices say `ended`; nobody reads
    /// their output again) and everything else in its scope, in a task the registry tracks
    /// (`session.rs`, "The end of a session"). `shared` is `None` once the server is gone.
    pub(super) fn end(
        &self,
        procs: Vec<Arc<ManagedProcess>>,
        ended: ExitReason,
        shared: Option<&Arc<Shared>>,
    ) {
        for p in &procs {
            p.mark_ending(ended);
            p.abandon();
        }
        let grace = end_grace(&procs, shared.map(|s| &*s.config));
        let (scope, id) = (self.scope.clone(), self.id.clone());
        let done = self.terminated.clone();
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

/// The timer task: sleeps until the table's next deadline (or until an earlier one is
/// armed), fires what is due, and does what the table asks (end an expired session, refuse an
/// approval that timed out). It ends when the registry is gone.
pub(super) fn spawn_timers(shared: Weak<Shared>, wake: Arc<Notify>) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    rt.spawn(async move {
        loop {
            // Registered before the table is read: a deadline armed after this read wakes it.
            let notified = wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let next = {
                let Some(sh) = shared.upgrade() else { return };
                sh.drive(|t| {
                    t.handle_timeout(now());
                    t.poll_timeout()
                })
            };
            match next {
                Some(at) => {
                    let at = tokio::time::Instant::from_std(at);
                    tokio::select! {
                        _ = tokio::time::sleep_until(at) => {}
                        _ = &mut notified => {}
                    }
                }
                None => notified.await,
            }
        }
    });
}
