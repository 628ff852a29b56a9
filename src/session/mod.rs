//! Sessions (layer 3): processes and their retained output, outliving connections.
//!
//! # Layout
//!
//! - [`session_registry`]: the [`SessionRegistry`] every connection of a server shares:
//!   create, resume, `maxSessions`, shutdown.
//! - [`session`]: one [`Session`]: attach, detach and expiry, close, starting processes from a
//!   typed [`StartSpec`], reaping exited ones.
//! - [`quota`]: the per-key and per-address quotas of sessions and processes.
//! - `gated_start.rs`: starting through the exec policy: allow, deny, or ask the client and
//!   wait (`process/list` shows `pendingApproval`); a start retried for a pending id joins it.
//! - [`ended_ids`]: the bounded ids of processes that ended and were forgotten, so that a
//!   control request crossing the exit's acknowledgement is answered as for an exited one,
//!   with their last accepted `writeId`s (a repeated write is answered `accepted`).
//! - [`approvals`]: the session's pending server → client requests (`process/approve`), their
//!   ids, callbacks, and the `-32006` reasons.
//! - `stall_watchdog.rs`: the task that watches every attached process for a stall (the
//!   rule is `process::stall_watch`) and reports it.
//! - [`stream_state`]: what a process's output waits for, in one line (log counters, pump,
//!   writer, the transport's flow control both ways): the watchdog's report, and every
//!   process's at once for an operator (`execrelay serve` logs them on `SIGUSR1`).
//!
//! It takes already-decoded, validated options and returns typed [`SessionError`]s (the
//! connection maps them to JSON-RPC). It must never decode JSON nor write to a transport:
//! delivery goes through the attached connection's [`ReadySet`](crate::process::ReadySet).

pub mod approvals;
pub mod ended_ids;
mod gated_start;
// `session::session` is the one session, beside the registry of them all.
pub mod quota;
#[allow(clippy::module_inception)]
pub mod session;
pub mod session_registry;
mod stall_watchdog;
pub mod stream_state;

pub use approvals::{AnswerOutcome, ApprovalAnswer, RequestSink, ServerRequest};
pub use gated_start::{Caller, ListedProcess, ListedState};
pub use quota::AddressKey;
pub use session::{ConnHandle, Session, StartSpec};
pub use session_registry::SessionRegistry;

use crate::process::containment::ContainmentError;
use crate::process::StartError;

/// Failures of session and process bookkeeping; mapped to JSON-RPC codes in
/// `connection/error_map.rs`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    /// Unknown or expired session, or a wrong token (deliberately one variant).
    #[error("unknown or expired session, or wrong resume token")]
    UnknownSession,
    /// `maxSessions` reached.
    #[error("too many sessions ({0})")]
    TooManySessions(usize),
    /// `maxProcesses` reached for this session.
    #[error("too many processes ({0})")]
    TooManyProcesses(usize),
    /// A per-client quota reached: `limit` names it (`maxSessionsPerKey`,
    /// `maxSessionsPerAddress`, `maxProcessesPerKey`, `maxProcessesPerAddress`).
    #[error("quota reached: {limit} ({value})")]
    QuotaReached {
        /// The quota's name.
        limit: &'static str,
        /// Its value.
        value: usize,
    },
    /// The process id is taken.
    #[error("process id {0:?} already exists")]
    ProcessExists(String),
    /// No such process.
    #[error("unknown process id {0:?}")]
    UnknownProcess(String),
    /// The child could not be started: what failed, which path, the OS error.
    #[error("{0}")]
    Start(StartError),
    /// The exec policy denied it, or its approval was refused, timed out or withdrawn.
    #[error("not approved: {reason}")]
    NotApproved {
        /// One of [`approvals::reason`]'s phrases.
        reason: &'static str,
        /// The policy rule that denied or asked.
        rule: Option<String>,
    },
    /// The session's containment scope could not be made (a cgroup could not be created).
    #[error("{0}")]
    Containment(ContainmentError),
}

impl SessionError {
    /// The same error again, for every start that joined a pending one (an OS error keeps its
    /// kind and text).
    pub(crate) fn duplicate(&self) -> SessionError {
        match self {
            SessionError::UnknownSession => SessionError::UnknownSession,
            SessionError::TooManySessions(n) => SessionError::TooManySessions(*n),
            SessionError::TooManyProcesses(n) => SessionError::TooManyProcesses(*n),
            SessionError::ProcessExists(id) => SessionError::ProcessExists(id.clone()),
            SessionError::UnknownProcess(id) => SessionError::UnknownProcess(id.clone()),
            SessionError::QuotaReached { limit, value } => SessionError::QuotaReached {
                limit,
                value: *value,
            },
            SessionError::Start(e) => SessionError::Start(e.clone()),
            SessionError::Containment(e) => SessionError::Containment(duplicate_containment(e)),
            SessionError::NotApproved { reason, rule } => SessionError::NotApproved {
                reason,
                rule: rule.clone(),
            },
        }
    }
}

/// An OS error again, with its number when it has one (else its kind and text).
fn duplicate_io(e: &std::io::Error) -> std::io::Error {
    match e.raw_os_error() {
        Some(n) => std::io::Error::from_raw_os_error(n),
        None => std::io::Error::new(e.kind(), e.to_string()),
    }
}

/// A containment error again (for [`SessionError::duplicate`]).
fn duplicate_containment(e: &ContainmentError) -> ContainmentError {
    match e {
        ContainmentError::Config(s) => ContainmentError::Config(s.clone()),
        ContainmentError::Unavailable { backend, reason } => ContainmentError::Unavailable {
            backend: *backend,
            reason: reason.clone(),
        },
        ContainmentError::ScopeClosed => ContainmentError::ScopeClosed,
        ContainmentError::NotEmpty => ContainmentError::NotEmpty,
        ContainmentError::Io(e) => ContainmentError::Io(duplicate_io(e)),
    }
}
