//! Sessions (layer 3): processes and their retained output, outliving connections.
//!
//! # Layout
//!
//! - [`session_registry`]: the [`SessionRegistry`] every connection of a server shares:
//!   create, resume, `maxSessions`, shutdown.
//! - [`session`]: one [`Session`]: attach, detach and expiry, close, starting processes from a
//!   typed [`StartSpec`], reaping exited ones.
//! - [`quota`]: the per-key and per-address quotas of sessions and processes.
//!
//! It takes already-decoded, validated options and returns typed [`SessionError`]s (the
//! connection maps them to JSON-RPC). It must never decode JSON nor write to a transport:
//! delivery goes through the attached connection's [`ReadySet`](crate::process::ReadySet).

// `session::session` is the one session, beside the registry of them all.
pub mod quota;
#[allow(clippy::module_inception)]
pub mod session;
pub mod session_registry;

pub use quota::AddressKey;
pub use session::{ConnHandle, Session, StartSpec};
pub use session_registry::SessionRegistry;

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
    /// The OS refused to start the child.
    #[error("spawn failed: {0}")]
    Spawn(std::io::Error),
    /// The session's containment scope could not be made (a cgroup could not be created).
    #[error("{0}")]
    Containment(crate::process::containment::ContainmentError),
}
