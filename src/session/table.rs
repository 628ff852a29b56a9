//! The session table: the sans-IO core of `session/`, in the shape of the link engine
//! (`handle_*` fed `now` and what happened, `poll_timeout`, `poll_action`).
//!
//! It owns the bookkeeping of every session of a server: create (with `maxSessions` and the
//! per-key and per-address quotas), resume (token and client key compared in constant time),
//! attach and evict, detach and the expiry deadline, close, the process slots (with
//! `maxProcesses` and the process quotas, counted and taken in one step), the pending
//! approvals and their deadlines, the retention deadline of an exited process, and the ids of
//! the processes it forgot (acknowledged, retained out, or ended by close:
//! [`EndedIds`]), so that a control request crossing that is answered as for an exited one.
//!
//! It **decides** and the driver **does**: every effect is an [`Action`] queued for
//! [`poll_action`](SessionTable::poll_action): spawn this start into its session's scope
//! ([`Action::Spawn`], whose result comes back through
//! [`handle_spawned`](SessionTable::handle_spawned)), signal a session's scope at its end
//! ([`Action::SignalScope`], then [`Action::Forget`]), point a process's events at the
//! connection that holds its session or at nobody ([`Action::Deliver`]), evict a connection,
//! send or resolve an approval request, wake the timer for a new earliest deadline
//! ([`Action::Arm`]).
//!
//! The process slots live in `table/slots.rs`, the server requests in `table/requests.rs`,
//! the actions in `table/action.rs`: one core, split by concern.
//!
//! It holds the driver's handles (a process, a pending start, a connection, the session
//! itself, a start's spec: [`Handles`]) as opaque values, hands them back in its answers and
//! actions, and never calls them. It must never spawn, signal, sleep, read a clock, lock or
//! touch a transport (no I/O of any kind): the driver (`driver.rs`) feeds it `now` and what
//! happened under the one lock that guards it, and does what it queued.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use subtle::ConstantTimeEq;

use super::approvals::{reason, AnswerOutcome, Approvals, Resolution, ServerRequest, Taken};
use super::ended_ids::EndedIds;
use super::error::SessionError;
use super::quota::{Owner, Quota, Usage};
use crate::rpc::messages::{ApproveParams, ExitReason};

mod action;
mod requests;
mod slots;
pub use action::{Action, EndCause};

/// The driver's handles the table carries without looking inside.
pub trait Handles {
    /// One session, as the connections hold it.
    type Session: Clone;
    /// A spawned process.
    type Process: Clone;
    /// A start waiting for approval.
    type Pending: Clone;
    /// A connection holding a session.
    type Conn: Clone;
    /// What a start spawns, handed back in [`Action::Spawn`].
    type Spec;
}

/// The server's bounds the table enforces.
#[derive(Debug, Clone)]
pub struct Limits {
    /// `max_sessions`.
    pub max_sessions: usize,
    /// `max_processes` (per session).
    pub max_processes: usize,
    /// `max_sessions_per_key`.
    pub max_sessions_per_key: usize,
    /// `max_sessions_per_address`.
    pub max_sessions_per_address: usize,
    /// `max_processes_per_key`.
    pub max_processes_per_key: usize,
    /// `max_processes_per_address`.
    pub max_processes_per_address: usize,
    /// `exited_retention_ms`: how long an exited process stays after its exit notice was
    /// written, for a client without acks.
    pub exited_retention: Duration,
    /// `approval_timeout_ms`.
    pub approval_timeout: Duration,
}

/// A process slot: the id is taken in every state.
pub enum Slot<H: Handles> {
    /// Being spawned: nothing to show yet.
    Starting,
    /// Waiting for the client's approval (`process/list` shows it as `pendingApproval`).
    Pending(H::Pending),
    /// Spawned.
    Ready(H::Process),
}

impl<H: Handles> Clone for Slot<H> {
    fn clone(&self) -> Self {
        match self {
            Slot::Starting => Slot::Starting,
            Slot::Pending(p) => Slot::Pending(p.clone()),
            Slot::Ready(p) => Slot::Ready(p.clone()),
        }
    }
}

struct SlotEntry<H: Handles> {
    slot: Slot<H>,
    /// Unique in the table: tells this slot from a later one with the same id.
    serial: u64,
    /// The retention deadline, once its exit notice was delivered.
    reap: Option<TimerKey>,
    /// The process's last accepted writeIds, once its exit notice was delivered: kept with
    /// its id when it is forgotten, so a repeat of one is still answered `accepted`.
    written: Vec<Arc<str>>,
    /// The connections whose starts wait for this spawn: each opens delivery itself once
    /// it wrote its start result (so the result comes first).
    starters: Vec<u64>,
}

/// The connection that holds a session.
pub struct Holder<C> {
    /// Its id (unique per server).
    pub conn_id: u64,
    /// The driver's handle.
    pub conn: C,
    /// It declared it can answer `process/approve`.
    pub can_answer: bool,
}

struct Entry<H: Handles> {
    handle: H::Session,
    token: Vec<u8>,
    owner: Owner,
    holder: Option<Holder<H::Conn>>,
    ttl: Duration,
    expiry: Option<TimerKey>,
    slots: HashMap<String, SlotEntry<H>>,
    approvals: Approvals,
    /// The deadline of each pending approval, by its number.
    approval_timers: HashMap<String, TimerKey>,
    /// The processes it forgot after they ended.
    ended: EndedIds,
}

/// A deadline's place in the timer queue.
type TimerKey = (Instant, u64);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Timer {
    Expire { session: String },
    Reap { session: String, process: String },
    Approval { session: String, request: String },
}

/// Where a newly registered approval request went.
#[derive(Debug)]
pub enum Registered {
    /// To the holder, now ([`Action::Request`]).
    Send(ServerRequest),
    /// Nowhere yet: the session is detached; the connection that resumes it gets it.
    Held(ServerRequest),
    /// Refused at once ([`Action::Resolve`]): the holder cannot answer.
    Refused(ServerRequest),
}

/// The session table (module docs).
pub struct SessionTable<H: Handles> {
    limits: Limits,
    sessions: HashMap<String, Entry<H>>,
    timers: BTreeMap<TimerKey, Timer>,
    next_serial: u64,
    actions: std::collections::VecDeque<Action<H>>,
}

impl<H: Handles> SessionTable<H> {
    /// An empty table enforcing `limits`.
    pub fn new(limits: Limits) -> Self {
        SessionTable {
            limits,
            sessions: HashMap::new(),
            timers: BTreeMap::new(),
            next_serial: 1,
            actions: Default::default(),
        }
    }

    fn serial(&mut self) -> u64 {
        let s = self.next_serial;
        self.next_serial += 1;
        s
    }

    /// Arm a deadline; the timer is told ([`Action::Arm`]) when it is the earliest.
    fn arm(&mut self, at: Instant, timer: Timer) -> TimerKey {
        let key = (at, self.serial());
        if self.poll_timeout().is_none_or(|first| at < first) {
            self.actions.push_back(Action::Arm(at));
        }
        self.timers.insert(key, timer);
        key
    }

    fn disarm(&mut self, key: Option<TimerKey>) {
        if let Some(k) = key {
            self.timers.remove(&k);
        }
    }

    // ---- sessions ------------------------------------------------------------------------

    /// Add session `id`, held by `holder`, if `maxSessions` and its owner's session quotas
    /// allow. `token` is its resume secret; `ttl` how long it survives detached.
    pub fn create(
        &mut self,
        id: &str,
        handle: H::Session,
        token: Vec<u8>,
        owner: Owner,
        holder: Holder<H::Conn>,
        ttl: Duration,
    ) -> Result<(), SessionError> {
        if self.sessions.len() >= self.limits.max_sessions {
            return Err(SessionError::TooManySessions(self.limits.max_sessions));
        }
        let (per_key, per_address) = (
            Quota {
                limit: "maxSessionsPerKey",
                value: self.limits.max_sessions_per_key,
            },
            Quota {
                limit: "maxSessionsPerAddress",
                value: self.limits.max_sessions_per_address,
            },
        );
        self.usage(&owner, |_| 1)
            .admit(&owner, per_key, per_address)
            .map_err(quota_error)?;
        self.sessions.insert(
            id.to_string(),
            Entry {
                handle,
                token,
                owner,
                holder: Some(holder),
                ttl,
                expiry: None,
                slots: HashMap::new(),
                approvals: Approvals::default(),
                approval_timers: HashMap::new(),
                ended: EndedIds::default(),
            },
        );
        Ok(())
    }

    /// Check `token` and the client's key against session `id` (in constant time; an unknown
    /// id, a wrong token and a wrong key are one error), then [`attach`](Self::attach) it to
    /// `holder`.
    pub fn resume(
        &mut self,
        id: &str,
        token: &[u8],
        peer_key: Option<&[u8]>,
        holder: Holder<H::Conn>,
    ) -> Result<H::Session, SessionError> {
        let e = self.sessions.get(id).ok_or(SessionError::UnknownSession)?;
        let token_ok: bool = e.token.as_slice().ct_eq(token).into();
        let key_ok = match (&e.owner.key, peer_key) {
            (None, None) => true,
            (Some(a), Some(b)) => bool::from(a.as_slice().ct_eq(b)),
            _ => false,
        };
        if !token_ok || !key_ok {
            return Err(SessionError::UnknownSession);
        }
        let handle = e.handle.clone();
        if !self.attach(id, holder) {
            return Err(SessionError::UnknownSession);
        }
        Ok(handle)
    }

    /// Attach session `id` to `holder`, the expiry deadline disarmed. In order: the previous
    /// holder is evicted (unless it is the same connection), the pending requests sent to
    /// `holder` again (same ids), then every spawned process delivered to it with its
    /// unacknowledged events first; then the pending requests nobody can answer now (the
    /// new holder cannot) are refused. `false` if the session is gone.
    pub fn attach(&mut self, id: &str, holder: Holder<H::Conn>) -> bool {
        let Some(e) = self.sessions.get_mut(id) else {
            return false;
        };
        let evicted = match e.holder.take() {
            Some(old) if old.conn_id != holder.conn_id => Some(old.conn),
            _ => None,
        };
        let (resend, withdrawn) = if holder.can_answer {
            (e.approvals.pending(), Vec::new())
        } else {
            (Vec::new(), e.approvals.take_all())
        };
        if !holder.can_answer {
            let timers: Vec<TimerKey> = e.approval_timers.drain().map(|(_, k)| k).collect();
            for k in timers {
                self.timers.remove(&k);
            }
        }
        let Some(e) = self.sessions.get_mut(id) else {
            return false;
        };
        let expiry = e.expiry.take();
        let processes = ready(&e.slots);
        let conn = holder.conn.clone();
        e.holder = Some(holder);
        self.disarm(expiry);
        if let Some(old) = evicted {
            self.actions.push_back(Action::Evict(old));
        }
        for request in resend {
            self.actions.push_back(Action::Request {
                to: conn.clone(),
                request,
            });
        }
        for process in processes {
            self.actions.push_back(Action::Deliver {
                process,
                to: Some(conn.clone()),
                replay: true,
            });
        }
        self.resolve_all(withdrawn, reason::RESUMED_WITHOUT_CAPABILITY);
        true
    }

    /// Refuse every request of `taken` with `why`.
    fn resolve_all(&mut self, taken: Vec<Taken>, why: &'static str) {
        for request in taken {
            self.actions.push_back(Action::Resolve {
                request,
                resolution: Resolution::Refused { reason: why },
            });
        }
    }

    /// Connection `conn_id` ended: if it held session `id`, the session is detached and
    /// expires at `now` + its TTL, and its processes deliver to nobody. Returns whether it
    /// held it.
    pub fn detach(&mut self, now: Instant, id: &str, conn_id: u64) -> bool {
        let Some(e) = self.sessions.get_mut(id) else {
            return false;
        };
        if e.holder.as_ref().is_none_or(|h| h.conn_id != conn_id) {
            return false;
        }
        e.holder = None;
        let (old, at) = (e.expiry.take(), now + e.ttl);
        let processes = ready(&e.slots);
        self.disarm(old);
        for process in processes {
            self.actions.push_back(Action::Deliver {
                process,
                to: None,
                replay: false,
            });
        }
        let key = self.arm(
            at,
            Timer::Expire {
                session: id.to_string(),
            },
        );
        if let Some(e) = self.sessions.get_mut(id) {
            e.expiry = Some(key);
        }
        true
    }

    /// Close session `id` (`session/close`, the end of a stdio connection, shutdown); see
    /// [`end`](Self::end). `false` if it was gone already (close is idempotent).
    pub fn close(&mut self, id: &str) -> bool {
        self.end(id, EndCause::Closed)
    }

    /// Take session `id` out: unknown to resume at once, its slots free, its deadlines gone.
    /// Queues exactly one [`Action::SignalScope`] (its processes end with `cause`), the
    /// refusal of each pending approval, then [`Action::Forget`] with the ids it ended.
    fn end(&mut self, id: &str, cause: EndCause) -> bool {
        let Some(mut e) = self.sessions.remove(id) else {
            return false;
        };
        self.disarm(e.expiry.take());
        for s in e.slots.values_mut() {
            if let Some(k) = s.reap.take() {
                self.timers.remove(&k);
            }
        }
        for (_, k) in e.approval_timers.drain() {
            self.timers.remove(&k);
        }
        let mut ended = std::mem::take(&mut e.ended);
        for (id, s) in &e.slots {
            if matches!(s.slot, Slot::Ready(_)) {
                ended.insert(id.clone());
            }
        }
        self.actions.push_back(Action::SignalScope {
            session: e.handle.clone(),
            processes: ready(&e.slots),
            cause,
        });
        self.resolve_all(e.approvals.take_all(), cause.refusal());
        self.actions.push_back(Action::Forget {
            session: e.handle,
            ended,
        });
        true
    }

    /// Session `id`'s handle, if it is open.
    pub fn session(&self, id: &str) -> Option<H::Session> {
        self.sessions.get(id).map(|e| e.handle.clone())
    }

    /// Every open session's handle.
    pub fn sessions(&self) -> Vec<H::Session> {
        self.sessions.values().map(|e| e.handle.clone()).collect()
    }

    /// How many sessions are open.
    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    /// The connection holding session `id`, if any.
    pub fn holder(&self, id: &str) -> Option<&Holder<H::Conn>> {
        self.sessions.get(id)?.holder.as_ref()
    }

    /// How long session `id` survives detached.
    pub fn ttl(&self, id: &str) -> Option<Duration> {
        self.sessions.get(id).map(|e| e.ttl)
    }

    /// Set how long session `id` survives detached (from its next detach on).
    pub fn set_ttl(&mut self, id: &str, ttl: Duration) {
        if let Some(e) = self.sessions.get_mut(id) {
            e.ttl = ttl;
        }
    }

    // ---- time ----------------------------------------------------------------------------

    /// The next deadline, if any.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.keys().next().map(|(at, _)| *at)
    }

    /// Fire every deadline due at `now`: an expired session is taken out (as
    /// [`end`](Self::end) with [`EndCause::Expired`]), a retained exited process forgotten, a
    /// pending approval refused as timed out; what the driver must do is queued for
    /// [`poll_action`](Self::poll_action).
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some((&key, _)) = self.timers.first_key_value() {
            if key.0 > now {
                break;
            }
            let Some(timer) = self.timers.remove(&key) else {
                break;
            };
            match timer {
                Timer::Expire { session } => {
                    if let Some(e) = self.sessions.get_mut(&session) {
                        e.expiry = None;
                    }
                    self.end(&session, EndCause::Expired);
                }
                Timer::Reap { session, process } => {
                    if let Some(e) = self.sessions.get_mut(&session) {
                        if e.slots.get(&process).is_some_and(|s| s.reap == Some(key)) {
                            if let Some(s) = e.slots.remove(&process) {
                                e.ended.insert_with_writes(process, s.written);
                            }
                        }
                    }
                }
                Timer::Approval { session, request } => {
                    if let Some(e) = self.sessions.get_mut(&session) {
                        e.approval_timers.remove(&request);
                        if let Some(t) = e.approvals.take_id(&request) {
                            self.resolve_all(vec![t], reason::TIMED_OUT);
                        }
                    }
                }
            }
        }
    }

    /// The next thing the driver must do, if any.
    pub fn poll_action(&mut self) -> Option<Action<H>> {
        self.actions.pop_front()
    }

    /// What the sessions of `owner`'s key and of its address hold, counting `count(entry)`
    /// each.
    fn usage(&self, owner: &Owner, count: impl Fn(&Entry<H>) -> usize) -> Usage {
        let mut usage = Usage {
            by_key: 0,
            by_address: 0,
        };
        for e in self.sessions.values() {
            let same_key = owner.key.is_some() && e.owner.key == owner.key;
            let same_address = owner.address.is_some() && e.owner.address == owner.address;
            if same_key || same_address {
                let n = count(e);
                if same_key {
                    usage.by_key += n;
                }
                if same_address {
                    usage.by_address += n;
                }
            }
        }
        usage
    }
}

fn ready<H: Handles>(slots: &HashMap<String, SlotEntry<H>>) -> Vec<H::Process> {
    slots
        .values()
        .filter_map(|s| match &s.slot {
            Slot::Ready(p) => Some(p.clone()),
            Slot::Starting | Slot::Pending(_) => None,
        })
        .collect()
}

fn quota_error(q: Quota) -> SessionError {
    SessionError::QuotaReached {
        limit: q.limit,
        value: q.value,
    }
}

#[cfg(test)]
mod tests;
