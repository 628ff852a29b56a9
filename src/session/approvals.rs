//! Server → client requests of one session (`protocol.md` §7): `process/approve`, each with
//! its id (`s-1`, `s-2`, … in the session's own id space) and the callback its answer goes to.
//!
//! A pending request belongs to the **session**, not to the connection that first carried
//! it: when the connection drops it stays pending, and [`Session::attach`] sends it again,
//! with the same id, to the connection that resumes the session (before any replayed event).
//! Exactly one resolution reaches each callback: the first answer, the timeout, or the
//! withdrawal when the session ends; whoever takes the request out of `Approvals` first
//! decides, under its lock, and the rest find it gone.
//!
//! It never decodes JSON (the connection hands it a typed [`ApprovalAnswer`]) and never
//! writes to a transport (the connection's [`RequestSink`] does).
//!
//! [`Session::attach`]: super::Session

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::rpc::messages::ApproveParams;

/// `data.reason` of the `-32006` errors, one fixed phrase per cause.
pub mod reason {
    /// A `deny` rule of the exec policy matched.
    pub const POLICY_DENIED: &str = "denied by the exec policy";
    /// The client answered `deny`.
    pub const CLIENT_DENIED: &str = "denied by the client";
    /// The client answered with an error, or with a result that is not a decision.
    pub const CLIENT_ERROR: &str = "the client could not answer";
    /// The client did not declare `serverRequests: ["process/approve"]`.
    pub const CANNOT_ASK: &str =
        "approval required, and the client cannot answer approval requests";
    /// `approval_timeout_ms` passed.
    pub const TIMED_OUT: &str = "approval timed out";
    /// The session was closed (`session/close`, stdio end, shutdown).
    pub const SESSION_CLOSED: &str = "session closed";
    /// The detached session expired.
    pub const SESSION_EXPIRED: &str = "session expired";
    /// The session was resumed by a client that cannot answer approval requests.
    pub const RESUMED_WITHOUT_CAPABILITY: &str =
        "the session was resumed by a client that cannot answer approval requests";
}

/// Where a connection takes the server requests of the session it holds: it queues them on
/// its control lane. Called under the session's locks: it must not block or call back.
pub type RequestSink = Arc<dyn Fn(ServerRequest) + Send + Sync>;

/// One server → client request, as sent (and re-sent on resume).
#[derive(Debug, Clone)]
pub struct ServerRequest {
    /// `s-N`.
    pub id: String,
    /// The `process/approve` params.
    pub params: Arc<ApproveParams>,
}

/// The client's answer, decoded by the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApprovalAnswer {
    /// `{"decision": "approve"}`.
    Approve,
    /// `{"decision": "deny"}`.
    Deny,
    /// An error response, or a result without a valid decision: a denial.
    Unreadable,
}

/// How a pending request ended: what its callback receives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// Start the process.
    Approved,
    /// Do not; `reason` is one of [`reason`]'s phrases.
    Refused {
        /// Why.
        reason: &'static str,
    },
}

/// What became of a response from the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerOutcome {
    /// It was the first answer to a pending request: its callback has it.
    Answered,
    /// An id this session sent whose request is no longer pending (answered before, timed
    /// out, withdrawn): ignored.
    LateOrDuplicate,
    /// An id this session never sent: a protocol error on that connection.
    NeverSent,
}

type Callback = Box<dyn FnOnce(Resolution) + Send>;

struct Pending {
    params: Arc<ApproveParams>,
    callback: Callback,
}

/// A request taken out of the registry; [`Taken::resolve`] runs its callback. Taken under the
/// session's lock, resolved after it is released (the callback may wake other tasks).
pub(crate) struct Taken(Pending);

impl Taken {
    pub(crate) fn resolve(self, r: Resolution) {
        (self.0.callback)(r)
    }
}

/// The pending requests of one session.
#[derive(Default)]
pub(super) struct Approvals {
    /// The number of the last id handed out (`s-1` is the first).
    last: u64,
    pending: BTreeMap<u64, Pending>,
}

impl Approvals {
    /// Register a request; its callback gets exactly one [`Resolution`].
    pub(super) fn register(
        &mut self,
        params: ApproveParams,
        callback: impl FnOnce(Resolution) + Send + 'static,
    ) -> ServerRequest {
        self.last += 1;
        let params = Arc::new(params);
        self.pending.insert(
            self.last,
            Pending {
                params: params.clone(),
                callback: Box::new(callback),
            },
        );
        ServerRequest {
            id: request_id(self.last),
            params,
        }
    }

    /// Every pending request, oldest first (sent again to a resuming connection).
    pub(super) fn pending(&self) -> Vec<ServerRequest> {
        self.pending
            .iter()
            .map(|(n, p)| ServerRequest {
                id: request_id(*n),
                params: p.params.clone(),
            })
            .collect()
    }

    /// Whether no request is pending.
    #[cfg(test)]
    pub(super) fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Take request `id` out if it is pending, saying what the id was.
    pub(super) fn take_by_id(&mut self, id: &str) -> (AnswerOutcome, Option<Taken>) {
        let Some(n) = parse_request_id(id).filter(|n| *n <= self.last) else {
            return (AnswerOutcome::NeverSent, None);
        };
        match self.pending.remove(&n) {
            Some(p) => (AnswerOutcome::Answered, Some(Taken(p))),
            None => (AnswerOutcome::LateOrDuplicate, None),
        }
    }

    /// Take request `id` out if it is still pending (the timeout's path).
    pub(super) fn take_id(&mut self, id: &str) -> Option<Taken> {
        let n = parse_request_id(id)?;
        self.pending.remove(&n).map(Taken)
    }

    /// Take the request registered last (it found the session closed).
    pub(super) fn take_last(&mut self) -> Option<Taken> {
        self.pending.remove(&self.last).map(Taken)
    }

    /// Take every pending request out (the session ends).
    pub(super) fn take_all(&mut self) -> Vec<Taken> {
        std::mem::take(&mut self.pending)
            .into_values()
            .map(Taken)
            .collect()
    }
}

/// `s-N`.
pub fn request_id(n: u64) -> String {
    format!("s-{n}")
}

/// `N` of `s-N`, written exactly as [`request_id`] writes it (no sign, no leading zero).
pub fn parse_request_id(id: &str) -> Option<u64> {
    let digits = id.strip_prefix("s-")?;
    let n: u64 = digits.parse().ok()?;
    (n > 0 && digits.len() == n.to_string().len()).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    fn params(pid: &str) -> ApproveParams {
        ApproveParams {
            process_id: pid.into(),
            argv: vec!["rm".into()],
            cwd: "/".into(),
            env_names: vec![],
            tty: false,
            rule: "r".into(),
        }
    }

    type Log = Arc<Mutex<Vec<(String, Resolution)>>>;

    fn register(a: &mut Approvals, pid: &str, log: &Log) -> ServerRequest {
        let log = log.clone();
        let name = pid.to_string();
        a.register(params(pid), move |r| log.lock().unwrap().push((name, r)))
    }

    #[test]
    fn ids_count_up_in_the_sessions_own_space() {
        let mut a = Approvals::default();
        let log = Log::default();
        assert_eq!(register(&mut a, "p", &log).id, "s-1");
        assert_eq!(register(&mut a, "q", &log).id, "s-2");
        let ids: Vec<String> = a.pending().into_iter().map(|r| r.id).collect();
        assert_eq!(ids, ["s-1", "s-2"], "oldest first");
    }

    #[test]
    fn only_the_first_answer_counts_and_unknown_ids_are_never_sent() {
        let mut a = Approvals::default();
        let log = Log::default();
        register(&mut a, "p", &log);
        let (o, t) = a.take_by_id("s-1");
        assert_eq!(o, AnswerOutcome::Answered);
        t.unwrap().resolve(Resolution::Approved);
        assert_eq!(a.take_by_id("s-1").0, AnswerOutcome::LateOrDuplicate);
        for never in ["s-2", "s-0", "s-01", "1", "x-1", "s-", "s--1", "s-+1", ""] {
            assert_eq!(a.take_by_id(never).0, AnswerOutcome::NeverSent, "{never:?}");
        }
        assert_eq!(
            *log.lock().unwrap(),
            vec![("p".to_string(), Resolution::Approved)]
        );
    }

    #[test]
    fn a_timed_out_or_withdrawn_request_takes_no_answer() {
        let mut a = Approvals::default();
        let log = Log::default();
        register(&mut a, "p", &log);
        register(&mut a, "q", &log);
        let t = a.take_id("s-1").unwrap();
        t.resolve(Resolution::Refused {
            reason: reason::TIMED_OUT,
        });
        assert!(a.take_id("s-1").is_none(), "resolved once");
        assert_eq!(a.take_by_id("s-1").0, AnswerOutcome::LateOrDuplicate);
        for t in a.take_all() {
            t.resolve(Resolution::Refused {
                reason: reason::SESSION_CLOSED,
            });
        }
        assert!(a.is_empty());
        assert_eq!(a.take_by_id("s-2").0, AnswerOutcome::LateOrDuplicate);
        let log = log.lock().unwrap();
        assert_eq!(log.len(), 2);
        assert_eq!(log[1].0, "q");
    }
}
