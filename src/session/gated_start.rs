//! Starting a process through the exec policy (`protocol.md` §7): allowed at once, denied
//! (`-32006`, nothing spawned), or **asked**: a `process/approve` request goes to the client
//! and the start waits for the answer (bounded by `approval_timeout_ms`), its process id
//! taken and listed as `pendingApproval`.
//!
//! A start that arrives for an id waiting for approval with the same spec is the same start
//! retried (the client lost its connection and resumed): it **joins** the pending one and gets
//! its outcome, so the process is spawned once whichever connection the answer came on. Any
//! other start for that id gets `-32002`.
//!
//! It never decodes JSON and never writes to a transport: requests leave through the attached
//! connection's [`RequestSink`](super::RequestSink).

use std::sync::{Arc, Mutex};

use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use super::approvals::{reason, AnswerOutcome, ApprovalAnswer, Resolution};
use super::session::{Slot, StartSpec};
use super::{Session, SessionError};
use crate::metrics::ApprovalOutcome;
use crate::policy::Action;
use crate::process::ManagedProcess;
use crate::rpc::messages::ApproveParams;
use crate::sync::lock;

/// Who asks for a start.
#[derive(Debug, Clone, Copy)]
pub struct Caller {
    /// The connection.
    pub conn_id: u64,
    /// It declared `serverRequests: ["process/approve"]`.
    pub can_approve: bool,
}

type Outcome = Option<Result<Arc<ManagedProcess>, Arc<SessionError>>>;

/// A start waiting for the client's approval.
pub(crate) struct PendingStart {
    spec: StartSpec,
    /// Its argv, shared with every `process/list` answer that shows it.
    argv: Arc<[String]>,
    /// Its outcome, for starts that joined it; `None` until decided.
    done: watch::Sender<Outcome>,
    /// Connections of the starts that joined: each opens delivery after writing its result.
    joined: Mutex<Vec<u64>>,
}

/// How `process/list` shows a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListedState {
    /// Spawned, not yet exited.
    Running,
    /// Exited; retained for its client.
    Exited,
    /// Waiting for the client's approval: nothing spawned yet.
    PendingApproval,
}

impl ListedState {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            ListedState::Running => "running",
            ListedState::Exited => "exited",
            ListedState::PendingApproval => "pendingApproval",
        }
    }
}

/// One entry of `process/list`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedProcess {
    /// Client-chosen id.
    pub process_id: String,
    /// OS pid; `None` while pending approval.
    pub pid: Option<u32>,
    /// What was (or would be) started, shared with the process (or the pending start).
    pub argv: Arc<[String]>,
    /// On a PTY.
    pub tty: bool,
    /// Its state.
    pub state: ListedState,
    /// Next seq to assign (1 while pending).
    pub next_seq: u64,
    /// The exit code, once exited normally.
    pub exit_code: Option<i32>,
    /// The signal's name, once killed by one.
    pub signal: Option<String>,
}

impl Session {
    /// Every known process, pending approvals included, sorted by id.
    pub fn list(&self) -> Vec<ListedProcess> {
        let mut out: Vec<ListedProcess> = lock(&self.processes)
            .iter()
            .filter_map(|(id, slot)| match slot {
                Slot::Ready(p) => {
                    let info = p.info();
                    Some(ListedProcess {
                        process_id: info.process_id,
                        pid: Some(info.pid),
                        argv: info.argv,
                        tty: info.tty,
                        state: if info.exit.is_some() {
                            ListedState::Exited
                        } else {
                            ListedState::Running
                        },
                        next_seq: info.next_seq,
                        exit_code: info.exit.as_ref().and_then(|e| e.exit_code),
                        signal: info.exit.and_then(|e| e.signal),
                    })
                }
                Slot::Pending(ps) => Some(ListedProcess {
                    process_id: id.clone(),
                    pid: None,
                    argv: ps.argv.clone(),
                    tty: ps.spec.spawn.tty.is_some(),
                    state: ListedState::PendingApproval,
                    next_seq: 1,
                    exit_code: None,
                    signal: None,
                }),
                Slot::Starting => None,
            })
            .collect();
        out.sort_by(|a, b| a.process_id.cmp(&b.process_id));
        out
    }

    /// A response from the client to server request `id`: only the first answer to a pending
    /// request counts; a late or repeated one is ignored (and logged); an id this session
    /// never sent is for the connection to treat as a protocol error.
    pub fn answer(&self, id: &str, answer: ApprovalAnswer) -> AnswerOutcome {
        let (outcome, taken) = lock(&self.approvals).take_by_id(id);
        match (outcome, taken) {
            (AnswerOutcome::Answered, Some(t)) => t.resolve(match answer {
                ApprovalAnswer::Approve => Resolution::Approved,
                ApprovalAnswer::Deny => Resolution::Refused {
                    reason: reason::CLIENT_DENIED,
                },
                ApprovalAnswer::Unreadable => Resolution::Refused {
                    reason: reason::CLIENT_ERROR,
                },
            }),
            (AnswerOutcome::LateOrDuplicate, _) => {
                tracing::info!(request = %id, "late or duplicate answer ignored")
            }
            _ => tracing::warn!("response to a request this session never sent"),
        }
        outcome
    }

    /// Start a process as the exec policy says (see the module docs): at once, never, or
    /// once the client approves. Events are delivered as for [`start`](Self::start).
    pub async fn start_checked(
        self: &Arc<Self>,
        spec: StartSpec,
        caller: Caller,
    ) -> Result<Arc<ManagedProcess>, SessionError> {
        if let Some(pending) = self.join_pending(&spec, caller.conn_id)? {
            return wait_outcome(&pending).await;
        }
        let Some(registry) = self.registry.upgrade() else {
            return Err(SessionError::UnknownSession);
        };
        let verdict = registry.exec_verdict(&spec.spawn);
        match verdict.action {
            Action::Allow => self.start(spec, caller.conn_id),
            Action::Deny => {
                registry.metrics().policy_denials.inc();
                tracing::info!(process = %spec.process_id, rule = %verdict.rule, "denied by the exec policy");
                Err(SessionError::NotApproved {
                    reason: reason::POLICY_DENIED,
                    rule: Some(verdict.rule),
                })
            }
            Action::Ask if !caller.can_approve => {
                registry.metrics().approval(ApprovalOutcome::Denied);
                Err(SessionError::NotApproved {
                    reason: reason::CANNOT_ASK,
                    rule: Some(verdict.rule),
                })
            }
            Action::Ask => {
                let metrics = registry.metrics().clone();
                drop(registry);
                self.start_after_approval(spec, verdict.rule, caller.conn_id, &metrics)
                    .await
            }
        }
    }

    /// The pending start `spec` joins, if its id waits for approval with this very spec;
    /// `-32002` if it waits with another.
    fn join_pending(
        &self,
        spec: &StartSpec,
        conn_id: u64,
    ) -> Result<Option<Arc<PendingStart>>, SessionError> {
        let procs = lock(&self.processes);
        match procs.get(&spec.process_id) {
            Some(Slot::Pending(p)) if p.spec == *spec => {
                lock(&p.joined).push(conn_id);
                tracing::info!(process = %spec.process_id, "start joins the one waiting for approval");
                Ok(Some(p.clone()))
            }
            Some(Slot::Pending(_)) => Err(SessionError::ProcessExists(spec.process_id.clone())),
            _ => Ok(None),
        }
    }

    async fn start_after_approval(
        self: &Arc<Self>,
        spec: StartSpec,
        rule: String,
        conn_id: u64,
        metrics: &crate::metrics::Metrics,
    ) -> Result<Arc<ManagedProcess>, SessionError> {
        let id = spec.process_id.clone();
        let pending = Arc::new(PendingStart {
            spec: spec.clone(),
            argv: Arc::from(spec.spawn.argv.as_slice()),
            done: watch::channel(None).0,
            joined: Mutex::new(Vec::new()),
        });
        self.reserve(&id, Slot::Pending(pending.clone()))?;
        let (tx, mut rx) = oneshot::channel();
        let (request, closed_meanwhile) = {
            let st = lock(&self.attach);
            let mut approvals = lock(&self.approvals);
            let request = approvals.register(approve_params(&spec, &rule), move |r| {
                let _ = tx.send(r);
            });
            if self.closed.is_cancelled() {
                // Closed before we registered: `close` could not withdraw us.
                (
                    request,
                    approvals.take_last().map(|t| (t, reason::SESSION_CLOSED)),
                )
            } else {
                match st.current.as_ref().map(|c| c.requests.as_ref()) {
                    Some(Some(sink)) => {
                        sink(request.clone());
                        (request, None)
                    }
                    // Resumed meanwhile by a client that cannot answer (this start began on
                    // the connection it evicted): nobody can answer, as `attach` decided for
                    // the requests pending then.
                    Some(None) => (
                        request,
                        approvals
                            .take_last()
                            .map(|t| (t, reason::RESUMED_WITHOUT_CAPABILITY)),
                    ),
                    // Detached: sent to the connection that resumes it.
                    None => (request, None),
                }
            }
        };
        if let Some((t, why)) = closed_meanwhile {
            t.resolve(Resolution::Refused { reason: why });
        }
        metrics.approval(ApprovalOutcome::Requested);
        tracing::info!(process = %id, request = %request.id, %rule, "approval requested");

        let deadline = Instant::now() + self.config.approval_timeout();
        let resolution = match tokio::time::timeout_at(deadline, &mut rx).await {
            Ok(r) => r,
            Err(_) => {
                let taken = lock(&self.approvals).take_id(&request.id);
                if let Some(t) = taken {
                    t.resolve(Resolution::Refused {
                        reason: reason::TIMED_OUT,
                    });
                }
                // Whatever came first (the answer may have won the race) is in the channel.
                rx.await
            }
        }
        // The callback always sends; a dropped one would mean the session vanished.
        .unwrap_or(Resolution::Refused {
            reason: reason::SESSION_CLOSED,
        });
        metrics.approval(match &resolution {
            Resolution::Approved => ApprovalOutcome::Approved,
            Resolution::Refused { reason } if *reason == reason::TIMED_OUT => {
                ApprovalOutcome::TimedOut
            }
            Resolution::Refused { reason }
                if *reason == reason::CLIENT_DENIED || *reason == reason::CLIENT_ERROR =>
            {
                ApprovalOutcome::Denied
            }
            Resolution::Refused { .. } => ApprovalOutcome::Withdrawn,
        });
        tracing::info!(process = %id, request = %request.id, ?resolution, "approval resolved");

        // Our slot, if it is still ours (a closed session dropped it): Starting to spawn,
        // gone to refuse.
        let answering = {
            let mut procs = lock(&self.processes);
            match procs.get(&id) {
                Some(Slot::Pending(p)) if Arc::ptr_eq(p, &pending) => {
                    if resolution == Resolution::Approved {
                        procs.insert(id.clone(), Slot::Starting);
                    } else {
                        procs.remove(&id);
                    }
                    Some(std::mem::take(&mut *lock(&pending.joined)))
                }
                _ => None,
            }
        };
        let result = match (resolution, answering) {
            (Resolution::Approved, Some(answering)) => self.launch(spec, conn_id, &answering),
            (Resolution::Approved, None) => Err(SessionError::NotApproved {
                reason: reason::SESSION_CLOSED,
                rule: Some(rule),
            }),
            (Resolution::Refused { reason }, _) => Err(SessionError::NotApproved {
                reason,
                rule: Some(rule),
            }),
        };
        let shared = match &result {
            Ok(p) => Ok(p.clone()),
            Err(e) => Err(Arc::new(e.duplicate())),
        };
        pending.done.send_replace(Some(shared));
        result
    }
}

/// The outcome of a pending start, once decided.
async fn wait_outcome(pending: &PendingStart) -> Result<Arc<ManagedProcess>, SessionError> {
    let mut rx = pending.done.subscribe();
    let outcome = match rx.wait_for(Option::is_some).await {
        Ok(v) => v.clone(),
        // The sender lives in the pending start, which we hold: never taken.
        Err(_) => None,
    };
    match outcome {
        Some(Ok(p)) => Ok(p),
        Some(Err(e)) => Err(e.duplicate()),
        None => Err(SessionError::UnknownSession),
    }
}

/// What the client is asked about: environment names only (values may be secrets), the
/// working directory the child would get.
fn approve_params(spec: &StartSpec, rule: &str) -> ApproveParams {
    let mut env_names: Vec<String> = spec
        .spawn
        .env
        .iter()
        .filter(|(_, v)| v.is_some())
        .map(|(k, _)| k.clone())
        .collect();
    env_names.sort();
    env_names.dedup();
    ApproveParams {
        process_id: spec.process_id.clone(),
        argv: spec.spawn.argv.clone(),
        cwd: effective_cwd(spec),
        env_names,
        tty: spec.spawn.tty.is_some(),
        rule: rule.to_string(),
    }
}

/// The child's working directory: the start's `cwd`, else the server's own.
pub(super) fn effective_cwd(spec: &StartSpec) -> String {
    match &spec.spawn.cwd {
        Some(c) => c.clone(),
        None => std::env::current_dir()
            .map(|d| d.display().to_string())
            .unwrap_or_else(|_| "/".to_string()),
    }
}
