//! The session table: the sans-IO core of `session/`, in the shape of the link engine
//! (`handle_*` fed `now`, `poll_timeout`, `poll_action`).
//!
//! It owns the bookkeeping of every session of a server: create (with `maxSessions` and the
//! per-key and per-address quotas), resume (token and client key compared in constant time),
//! attach and evict, detach and the expiry deadline, close, the process slots (with
//! `maxProcesses` and the process quotas, counted and taken in one step), the pending
//! approvals and their deadlines, the retention deadline of an exited process, and the ids of
//! the processes it forgot (acknowledged, retained out, or ended by close:
//! [`EndedIds`]), so that a control request crossing that is answered as for an exited one.
//!
//! It holds the driver's handles (a process, a pending start, a connection, the session
//! itself: [`Handles`]) as opaque values, hands them back in its answers and [`Action`]s,
//! and never calls them. It must never spawn, signal, sleep, read a clock, lock or touch a
//! transport: the driver (`session.rs`, `session_registry.rs`) does all of that under the
//! one lock that guards the table, and feeds it `now` and what happened.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use subtle::ConstantTimeEq;

use super::approvals::{AnswerOutcome, Approvals, ServerRequest, Taken};
use super::ended_ids::EndedIds;
use super::error::SessionError;
use super::quota::{Owner, Quota, Usage};
use crate::rpc::messages::ApproveParams;

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

/// What the driver must do for the table.
pub enum Action<H: Handles> {
    /// The detached session's TTL passed: it was closed ([`Closed`]); end what it started.
    Expired(Closed<H>),
    /// A pending approval's deadline passed: resolve it as timed out.
    ApprovalTimedOut(Taken),
}

/// A session taken out of the table (closed or expired): what the driver must end.
pub struct Closed<H: Handles> {
    /// The session.
    pub session: H::Session,
    /// Its spawned processes.
    pub processes: Vec<H::Process>,
    /// Its pending approvals, to withdraw.
    pub withdrawn: Vec<Taken>,
    /// The processes it forgot, and the ones the close ends: a request already on its way
    /// for one of them (a stdin pump's last write crossing `session/close`) is answered as
    /// for an exited process.
    pub ended: EndedIds,
}

/// What an attach did.
pub struct Attached<H: Handles> {
    /// The connection that held the session before, if another: evict it.
    pub evicted: Option<H::Conn>,
    /// The pending requests to send again, same ids, before any replayed event.
    pub resend: Vec<ServerRequest>,
    /// The pending requests nobody can answer now (the new holder cannot): refuse them.
    pub withdrawn: Vec<Taken>,
    /// The session's spawned processes: deliver them to the new holder.
    pub processes: Vec<H::Process>,
}

/// Where a newly registered approval request goes.
pub enum Registered {
    /// To the holder, now.
    Send(ServerRequest),
    /// Nowhere yet: the session is detached; the connection that resumes it gets it.
    Held(ServerRequest),
    /// Refused at once (`reason`): the holder cannot answer.
    Refused(ServerRequest, Taken),
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

    fn arm(&mut self, at: Instant, timer: Timer) -> TimerKey {
        let key = (at, self.serial());
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
    /// id, a wrong token and a wrong key are one error), then attach it to `holder`.
    pub fn resume(
        &mut self,
        id: &str,
        token: &[u8],
        peer_key: Option<&[u8]>,
        holder: Holder<H::Conn>,
    ) -> Result<(H::Session, Attached<H>), SessionError> {
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
        let attached = self
            .attach(id, holder)
            .ok_or(SessionError::UnknownSession)?;
        Ok((handle, attached))
    }

    /// Attach session `id` to `holder`: the previous holder is evicted (unless it is the
    /// same connection), the expiry deadline disarmed, pending requests sent again (or
    /// withdrawn when the new holder cannot answer them). `None` if the session is gone.
    pub fn attach(&mut self, id: &str, holder: Holder<H::Conn>) -> Option<Attached<H>> {
        let e = self.sessions.get_mut(id)?;
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
        let e = self.sessions.get_mut(id)?;
        e.holder = Some(holder);
        let expiry = e.expiry.take();
        let processes = ready(&e.slots);
        self.disarm(expiry);
        Some(Attached {
            evicted,
            resend,
            withdrawn,
            processes,
        })
    }

    /// Connection `conn_id` ended: if it held session `id`, the session is detached and
    /// expires at `now` + its TTL; its processes are returned (deliver them nowhere).
    pub fn detach(&mut self, now: Instant, id: &str, conn_id: u64) -> Option<Vec<H::Process>> {
        let e = self.sessions.get_mut(id)?;
        if e.holder.as_ref().is_none_or(|h| h.conn_id != conn_id) {
            return None;
        }
        e.holder = None;
        let (old, at) = (e.expiry.take(), now + e.ttl);
        let processes = ready(&e.slots);
        self.disarm(old);
        let key = self.arm(
            at,
            Timer::Expire {
                session: id.to_string(),
            },
        );
        if let Some(e) = self.sessions.get_mut(id) {
            e.expiry = Some(key);
        }
        Some(processes)
    }

    /// Take session `id` out: unknown to resume at once, its slots free, its timers gone.
    /// `None` if it was gone already (close is idempotent).
    pub fn close(&mut self, id: &str) -> Option<Closed<H>> {
        let mut e = self.sessions.remove(id)?;
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
        Some(Closed {
            session: e.handle,
            processes: ready(&e.slots),
            withdrawn: e.approvals.take_all(),
            ended,
        })
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

    // ---- process slots -------------------------------------------------------------------

    /// Take process id `process` of session `id` as `slot`, if it may be taken now: under
    /// the owner's per-key and per-address process quotas, unknown, and under
    /// `maxProcesses`. Counted and taken in one step, so two starts cannot both take the
    /// owner's last slot. Returns the slot's serial.
    pub fn reserve(&mut self, id: &str, process: &str, slot: Slot<H>) -> Result<u64, SessionError> {
        let owner = self
            .sessions
            .get(id)
            .ok_or(SessionError::UnknownSession)?
            .owner
            .clone();
        if owner.key.is_some() || owner.address.is_some() {
            let per_key = Quota {
                limit: "maxProcessesPerKey",
                value: self.limits.max_processes_per_key,
            };
            let per_address = Quota {
                limit: "maxProcessesPerAddress",
                value: self.limits.max_processes_per_address,
            };
            self.usage(&owner, |e| e.slots.len())
                .admit(&owner, per_key, per_address)
                .map_err(quota_error)?;
        }
        let serial = self.serial();
        let max = self.limits.max_processes;
        let e = self
            .sessions
            .get_mut(id)
            .ok_or(SessionError::UnknownSession)?;
        if e.slots.contains_key(process) {
            return Err(SessionError::ProcessExists(process.to_string()));
        }
        if e.slots.len() >= max {
            return Err(SessionError::TooManyProcesses(max));
        }
        e.slots.insert(
            process.to_string(),
            SlotEntry {
                slot,
                serial,
                reap: None,
                written: Vec::new(),
            },
        );
        // A new start takes an ended id back: it names a live process again.
        e.ended.remove(process);
        Ok(serial)
    }

    /// Replace slot `process` of session `id`, if it is still the one with `serial`. Returns
    /// whether it was (a closed session, or a slot taken again, answers `false`).
    pub fn replace(&mut self, id: &str, process: &str, serial: u64, slot: Slot<H>) -> bool {
        match self.slot_mut(id, process, serial) {
            Some(s) => {
                s.slot = slot;
                true
            }
            None => false,
        }
    }

    /// Free slot `process` of session `id`, if it is still the one with `serial`.
    pub fn free(&mut self, id: &str, process: &str, serial: u64) -> Option<Slot<H>> {
        self.slot_mut(id, process, serial)?;
        let s = self.sessions.get_mut(id)?.slots.remove(process)?;
        self.disarm(s.reap);
        Some(s.slot)
    }

    fn slot_mut(&mut self, id: &str, process: &str, serial: u64) -> Option<&mut SlotEntry<H>> {
        self.sessions
            .get_mut(id)?
            .slots
            .get_mut(process)
            .filter(|s| s.serial == serial)
    }

    /// The exit notice of process `process` (slot `serial`) of session `id` was delivered
    /// (acknowledged with acks, written without): it is forgotten now with acks, or
    /// `exitedRetentionMs` after `now` without. `written`: its last accepted writeIds (final
    /// once the child exited), remembered with its id once it is forgotten.
    pub fn exit_delivered(
        &mut self,
        now: Instant,
        id: &str,
        process: &str,
        serial: u64,
        acks: bool,
        written: Vec<Arc<str>>,
    ) {
        if acks {
            if self.free(id, process, serial).is_some() {
                self.forgot(id, process, written);
            }
            return;
        }
        match self.slot_mut(id, process, serial) {
            Some(s) => s.written = written,
            None => return,
        }
        let key = self.arm(
            now + self.limits.exited_retention,
            Timer::Reap {
                session: id.to_string(),
                process: process.to_string(),
            },
        );
        if let Some(s) = self.slot_mut(id, process, serial) {
            let old = s.reap.replace(key);
            self.disarm(old);
        }
    }

    fn forgot(&mut self, id: &str, process: &str, written: Vec<Arc<str>>) {
        if let Some(e) = self.sessions.get_mut(id) {
            e.ended.insert_with_writes(process.to_string(), written);
        }
    }

    /// Whether `process` is a process of session `id` that ended and was forgotten after it
    /// accepted the write `write_id`.
    pub fn ended_wrote(&self, id: &str, process: &str, write_id: &str) -> bool {
        self.sessions
            .get(id)
            .is_some_and(|e| e.ended.wrote(process, write_id))
    }

    /// Whether `process` names a process of session `id` that ended and was forgotten (see
    /// [`EndedIds`]).
    pub fn is_ended(&self, id: &str, process: &str) -> bool {
        self.sessions
            .get(id)
            .is_some_and(|e| e.ended.contains(process))
    }

    /// Slot `process` of session `id`, with its serial.
    pub fn slot(&self, id: &str, process: &str) -> Option<(&Slot<H>, u64)> {
        let s = self.sessions.get(id)?.slots.get(process)?;
        Some((&s.slot, s.serial))
    }

    /// Every slot of session `id`.
    pub fn slots(&self, id: &str) -> Vec<(String, Slot<H>)> {
        self.sessions.get(id).map_or_else(Vec::new, |e| {
            e.slots
                .iter()
                .map(|(k, s)| (k.clone(), s.slot.clone()))
                .collect()
        })
    }

    /// The spawned processes of session `id`.
    pub fn processes(&self, id: &str) -> Vec<H::Process> {
        self.sessions
            .get(id)
            .map_or_else(Vec::new, |e| ready(&e.slots))
    }

    /// How many process ids session `id` has taken.
    pub fn slot_count(&self, id: &str) -> usize {
        self.sessions.get(id).map_or(0, |e| e.slots.len())
    }

    // ---- approvals -----------------------------------------------------------------------

    /// Register an approval request of session `id`, due at `now` + `approval_timeout`; its
    /// `callback` gets exactly one resolution. `None` if the session is gone.
    pub fn register_approval(
        &mut self,
        now: Instant,
        id: &str,
        params: ApproveParams,
        callback: impl FnOnce(super::approvals::Resolution) + Send + 'static,
    ) -> Option<Registered> {
        let e = self.sessions.get_mut(id)?;
        let request = e.approvals.register(params, callback);
        let can_answer = e.holder.as_ref().map(|h| h.can_answer);
        match can_answer {
            Some(false) => {
                let taken = e.approvals.take_last()?;
                Some(Registered::Refused(request, taken))
            }
            other => {
                let key = self.arm(
                    now + self.limits.approval_timeout,
                    Timer::Approval {
                        session: id.to_string(),
                        request: request.id.clone(),
                    },
                );
                if let Some(e) = self.sessions.get_mut(id) {
                    e.approval_timers.insert(request.id.clone(), key);
                }
                Some(match other {
                    Some(_) => Registered::Send(request),
                    None => Registered::Held(request),
                })
            }
        }
    }

    /// A response from the client to request `request` of session `id`: only the first
    /// answer to a pending request takes it.
    pub fn answer(&mut self, id: &str, request: &str) -> (AnswerOutcome, Option<Taken>) {
        let Some(e) = self.sessions.get_mut(id) else {
            return (AnswerOutcome::LateOrDuplicate, None);
        };
        let out = e.approvals.take_by_id(request);
        let key = e.approval_timers.remove(request);
        self.disarm(key);
        out
    }

    // ---- time ----------------------------------------------------------------------------

    /// The next deadline, if any.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.keys().next().map(|(at, _)| *at)
    }

    /// Fire every deadline due at `now`: an expired session is taken out, a retained exited
    /// process forgotten, a pending approval taken out; what the driver must do is queued
    /// for [`poll_action`](Self::poll_action).
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
                    if let Some(closed) = self.close(&session) {
                        self.actions.push_back(Action::Expired(closed));
                    }
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
                            self.actions.push_back(Action::ApprovalTimedOut(t));
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
