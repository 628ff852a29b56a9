//! What the session table asks its driver to do: the [`Action`]s it queues for
//! [`poll_action`](super::SessionTable::poll_action), in the order the driver must do them.
//!
//! Plain values carrying the driver's opaque handles: the table builds them and never performs
//! them (no spawn, no signal, no write, no wake-up here).

use std::time::Instant;

use super::{reason, EndedIds, ExitReason, Handles, Resolution, ServerRequest, Taken};

/// Why a session ended: what its processes' exit notices and its withdrawn approvals say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndCause {
    /// Closed: `session/close`, the end of a stdio connection, shutdown.
    Closed,
    /// Its detached TTL passed.
    Expired,
}

impl EndCause {
    /// The `reason` of the exit notices of the processes the end kills.
    pub fn exit_reason(self) -> ExitReason {
        match self {
            EndCause::Closed => ExitReason::SessionClosed,
            EndCause::Expired => ExitReason::SessionExpired,
        }
    }

    /// The `-32006` reason of the approvals the end withdraws.
    pub fn refusal(self) -> &'static str {
        match self {
            EndCause::Closed => reason::SESSION_CLOSED,
            EndCause::Expired => reason::SESSION_EXPIRED,
        }
    }
}

/// One thing the driver must do for the table. Those marked *in order* are done before the
/// table is fed again (under the same lock), so that connections see them in the order the
/// table decided; the others right after.
pub enum Action<H: Handles> {
    /// Spawn `spec` as process `process` of `session`, into the session's scope, and feed
    /// the result back with [`handle_spawned`](super::SessionTable::handle_spawned) (slot
    /// `serial`, [`Slot::Starting`](super::Slot::Starting) until then).
    Spawn {
        /// The session.
        session: H::Session,
        /// The process id its slot took.
        process: String,
        /// The slot's serial.
        serial: u64,
        /// What to spawn.
        spec: H::Spec,
    },
    /// End everything `session` started: SIGTERM to every process of its scope, a grace, then
    /// SIGKILL and the scope's removal. `processes`: its known ones (their exit notices say
    /// `cause`; nobody reads their output again).
    SignalScope {
        /// The session.
        session: H::Session,
        /// Its spawned processes.
        processes: Vec<H::Process>,
        /// Why.
        cause: EndCause,
    },
    /// *In order.* The session is out of the table (unknown to resume, its slots free, its
    /// deadlines gone): mark the handle closed, keeping `ended` (the processes it forgot and
    /// the ones its end kills) so that a request already on its way for one of them is
    /// answered as for an exited process.
    Forget {
        /// The session.
        session: H::Session,
        /// The ended ids.
        ended: EndedIds,
    },
    /// *In order.* Point `process`'s events at connection `to` (nowhere when `None`); with
    /// `replay`, re-deliver every unacknowledged event first (a resume).
    Deliver {
        /// The process.
        process: H::Process,
        /// The connection holding its session, if any.
        to: Option<H::Conn>,
        /// Re-deliver from after the last acknowledged event.
        replay: bool,
    },
    /// *In order.* Connection `0` lost its session to another: end it.
    Evict(H::Conn),
    /// *In order.* Send `request` (`process/approve`) on connection `to`, before any event
    /// delivered after it.
    Request {
        /// The connection holding the session (it can answer).
        to: H::Conn,
        /// The request, with its id in the session's id space.
        request: ServerRequest,
    },
    /// Run a pending approval's callback with its one resolution.
    Resolve {
        /// The request, taken out of the session's approvals.
        request: Taken,
        /// Its outcome.
        resolution: Resolution,
    },
    /// A process was spawned for a slot that is gone (its session closed meanwhile): let go
    /// of it (the session's end kills its scope, which holds the child).
    Abandon(H::Process),
    /// A deadline earlier than every other was armed: the timer must wake by `0`.
    Arm(Instant),
}

impl<H: Handles> Action<H> {
    /// Whether the driver must do it before the table is fed again (see [`Action`]).
    pub fn in_order(&self) -> bool {
        matches!(
            self,
            Action::Forget { .. }
                | Action::Deliver { .. }
                | Action::Evict(_)
                | Action::Request { .. }
        )
    }
}

impl<H: Handles> std::fmt::Debug for Action<H> {
    /// The kind of action (tests and logs); the handles are opaque.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Action::Spawn {
                process, serial, ..
            } => write!(f, "Spawn({process}, {serial})"),
            Action::SignalScope {
                processes, cause, ..
            } => write!(f, "SignalScope({cause:?}, {} processes)", processes.len()),
            Action::Forget { ended, .. } => write!(f, "Forget({} ended)", ended.len()),
            Action::Deliver { to, replay, .. } => write!(
                f,
                "Deliver({}, replay {replay})",
                if to.is_some() {
                    "to a connection"
                } else {
                    "nowhere"
                }
            ),
            Action::Evict(_) => write!(f, "Evict"),
            Action::Request { request, .. } => write!(f, "Request({})", request.id),
            Action::Resolve { resolution, .. } => write!(f, "Resolve({resolution:?})"),
            Action::Abandon(_) => write!(f, "Abandon"),
            Action::Arm(_) => write!(f, "Arm"),
        }
    }
}
