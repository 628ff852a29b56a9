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

use std::sync::Arc;

use tokio::sync::oneshot;

use super::approvals::{reason, AnswerOutcome, ApprovalAnswer, Resolution};
use super::error::SessionError;
use super::pending::PendingStart;
use super::session::{now, Session, StartSpec};
use super::table::{Registered, Slot};
use super::verdict::exec_verdict;
use crate::metrics::{ApprovalOutcome, Metrics};
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
        let slots = self
            .shared
            .upgrade()
            .map(|sh| lock(&sh.table).slots(&self.id))
            .unwrap_or_default();
        let mut out: Vec<ListedProcess> = slots
            .into_iter()
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
                    process_id: id,
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
        let resolution = match answer {
            ApprovalAnswer::Approve => Resolution::Approved,
            ApprovalAnswer::Deny => Resolution::Refused {
                reason: reason::CLIENT_DENIED,
            },
            ApprovalAnswer::Unreadable => Resolution::Refused {
                reason: reason::CLIENT_ERROR,
            },
        };
        let outcome = self
            .drive(|t| t.answer(&self.id, id, resolution))
            .unwrap_or(AnswerOutcome::LateOrDuplicate);
        match outcome {
            AnswerOutcome::Answered => {}
            AnswerOutcome::LateOrDuplicate => {
                tracing::info!(request = %id, "late or duplicate answer ignored")
            }
            AnswerOutcome::NeverSent => {
                tracing::warn!("response to a request this session never sent")
            }
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
            return pending.outcome().await;
        }
        let Some(shared) = self.shared.upgrade() else {
            return Err(SessionError::UnknownSession);
        };
        let verdict = exec_verdict(shared.policy.as_deref(), &spec.spawn);
        let metrics = shared.metrics.clone();
        drop(shared);
        match verdict.action {
            Action::Allow => self.start(spec, caller.conn_id),
            Action::Deny => {
                metrics.policy_denials.inc();
                tracing::info!(process = %spec.process_id, rule = %verdict.rule, "denied by the exec policy");
                Err(SessionError::NotApproved {
                    reason: reason::POLICY_DENIED,
                    rule: Some(verdict.rule),
                })
            }
            Action::Ask if !caller.can_approve => {
                metrics.approval(ApprovalOutcome::Denied);
                Err(SessionError::NotApproved {
                    reason: reason::CANNOT_ASK,
                    rule: Some(verdict.rule),
                })
            }
            Action::Ask => {
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
        let Some(shared) = self.shared.upgrade() else {
            return Ok(None);
        };
        let t = lock(&shared.table);
        match t.slot(&self.id, &spec.process_id) {
            Some((Slot::Pending(p), _)) if p.spec == *spec => {
                p.join(conn_id);
                tracing::info!(process = %spec.process_id, "start joins the one waiting for approval");
                Ok(Some(p.clone()))
            }
            Some((Slot::Pending(_), _)) => {
                Err(SessionError::ProcessExists(spec.process_id.clone()))
            }
            _ => Ok(None),
        }
    }

    async fn start_after_approval(
        self: &Arc<Self>,
        spec: StartSpec,
        rule: String,
        conn_id: u64,
        metrics: &Metrics,
    ) -> Result<Arc<ManagedProcess>, SessionError> {
        let id = spec.process_id.clone();
        let pending = PendingStart::new(&spec);
        let serial = self.reserve(&id, Slot::Pending(pending.clone()))?;
        let (tx, rx) = oneshot::channel();
        // The table arms the request's deadline (`approval_timeout_ms`); its timer resolves
        // it as timed out unless an answer, a withdrawal or the session's end comes first.
        // The driver sends it to the holder; if the session was resumed meanwhile by a
        // client that cannot answer (this start began on the connection it evicted), the
        // table refuses it, as `attach` did for the requests pending then.
        let params = approve_params(&spec, &rule);
        let registered = self
            .drive(|t| {
                t.register_approval(now(), &self.id, params, move |r| {
                    let _ = tx.send(r);
                })
            })
            .flatten();
        let request = match registered {
            Some(Registered::Send(r) | Registered::Held(r) | Registered::Refused(r)) => r,
            // Closed before we registered: nothing will answer.
            None => {
                metrics.approval(ApprovalOutcome::Requested);
                metrics.approval(ApprovalOutcome::Withdrawn);
                return self.decided(
                    &pending,
                    Err(SessionError::NotApproved {
                        reason: reason::SESSION_CLOSED,
                        rule: Some(rule),
                    }),
                );
            }
        };
        metrics.approval(ApprovalOutcome::Requested);
        tracing::info!(process = %id, request = %request.id, %rule, "approval requested");

        // The callback always sends; a dropped one would mean the session vanished.
        let resolution = rx.await.unwrap_or(Resolution::Refused {
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

        // Our slot, if it is still ours (a closed session dropped it): spawned by the table's
        // word if approved, freed if not. Its events go at once to the holder unless that
        // is this start's connection or one whose start joined it (each opens delivery after
        // writing its result, so the result comes first).
        let result = match resolution {
            Resolution::Approved => {
                let launched = self.shared.upgrade().map(|sh| {
                    sh.drive_launch(|t| {
                        let mut starters = pending.take_joined();
                        starters.push(conn_id);
                        t.approved(&self.id, &id, serial, spec, starters)
                    })
                });
                match launched {
                    Some((true, Some(l))) => l,
                    _ => Err(SessionError::NotApproved {
                        reason: reason::SESSION_CLOSED,
                        rule: Some(rule),
                    }),
                }
            }
            Resolution::Refused { reason } => {
                self.drive(|t| t.free(&self.id, &id, serial));
                Err(SessionError::NotApproved {
                    reason,
                    rule: Some(rule),
                })
            }
        };
        self.decided(&pending, result)
    }

    /// Publish `result` to the starts that joined `pending`, and return it.
    fn decided(
        &self,
        pending: &PendingStart,
        result: Result<Arc<ManagedProcess>, SessionError>,
    ) -> Result<Arc<ManagedProcess>, SessionError> {
        let shared = match &result {
            Ok(p) => Ok(p.clone()),
            Err(e) => Err(Arc::new(e.duplicate())),
        };
        pending.done.send_replace(Some(shared));
        result
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
