//! Sessions (layer 3): processes and their retained output, outliving connections.
//!
//! A sans-IO core and a thin driver, in the shape of the link engine: the table (`table.rs`)
//! holds every session's bookkeeping, is fed `now` and events, and answers with actions
//! (spawn this, signal that scope, deliver to that connection, arm this deadline); the driver
//! (`driver.rs`) owns the processes, the containment scopes and the one timer task, and does
//! what the table answers. The table never spawns, signals, reads a clock or locks; the driver
//! never decides who holds a session, when it expires or whether a start may spawn.
//!
//! # Layout (each file imports only the ones above it)
//!
//! - `error.rs`: [`SessionError`].
//! - [`quota`]: the per-key and per-address quotas of sessions and processes.
//! - [`ended_ids`]: the bounded ids of processes that ended and were forgotten, so that a
//!   control request crossing the exit's acknowledgement is answered as for an exited one,
//!   with their last accepted `writeId`s (a repeated write is answered `accepted`).
//! - [`approvals`]: the session's pending server → client requests (`process/approve`), their
//!   ids, callbacks, and the `-32006` reasons.
//! - `table.rs` (and `table/action.rs`): **the core**: sessions, holders, process slots,
//!   quotas, approvals and every deadline (expiry, exited retention, approval timeout);
//!   `handle_timeout(now)`, `handle_spawned`, `poll_timeout`, `poll_action`. No tokio, no
//!   process, no lock, no clock reading.
//! - `spec.rs`: a validated start ([`StartSpec`]) and a connection's handle ([`ConnHandle`]).
//! - `verdict.rs`: what the exec policy says about a start.
//! - `pending.rs`: a start waiting for approval, and its outcome for the starts that join it.
//! - [`session`]: one [`Session`] (the handle connections hold) and the state the driver
//!   shares (the table under its lock): detach, close, starts from a typed [`StartSpec`], fed
//!   to the table through the driver.
//! - `driver.rs`: **the driver**: feeds the table under its lock and performs its actions
//!   (spawn into the session's scope and feed the result back, signal a scope at a session's
//!   end, point a process's delivery, evict, send and resolve requests), the task that reports
//!   each process's delivered exit, and the one timer task.
//! - `gated_start.rs`: starting through the exec policy: allow, deny, or ask the client and
//!   wait (`process/list` shows `pendingApproval`); a start retried for a pending id joins it.
//! - [`session_registry`]: the [`SessionRegistry`] every connection of a server shares:
//!   create (opening the session's scope), resume, shutdown; it starts the timer task.
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
mod driver;
pub mod ended_ids;
mod error;
mod gated_start;
mod pending;
pub mod quota;
mod spec;
// `session::session` is the one session, beside the registry of them all.
#[allow(clippy::module_inception)]
pub mod session;
pub mod session_registry;
mod stall_watchdog;
pub mod stream_state;
mod table;
mod verdict;

pub use approvals::{AnswerOutcome, ApprovalAnswer, RequestSink, ServerRequest};
pub use error::SessionError;
pub use gated_start::{Caller, ListedProcess, ListedState};
pub use quota::AddressKey;
pub use session::{ConnHandle, Session, StartSpec};
pub use session_registry::SessionRegistry;
