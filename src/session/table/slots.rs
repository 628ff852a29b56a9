//! The session table's process slots: a start takes its id (under `maxProcesses` and the
//! owner's quotas) and queues its spawn, the spawn's result fills or frees the slot, an exit
//! delivered schedules its forgetting, and the ids of the forgotten ones are kept.
//!
//! Part of the sans-IO core (`table.rs`): it queues actions and never performs them.

use std::sync::Arc;
use std::time::Instant;

use super::{
    quota_error, ready, Action, Handles, Quota, SessionError, SessionTable, Slot, SlotEntry, Timer,
};

impl<H: Handles> SessionTable<H> {
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
                starters: Vec::new(),
            },
        );
        // A new start takes an ended id back: it names a live process again.
        e.ended.remove(process);
        Ok(serial)
    }

    /// A start of process `process` of session `id` for connection(s) `starters`: take the
    /// id (as [`reserve`](Self::reserve)) and queue its [`Action::Spawn`]. Returns the slot's
    /// serial; an error (over a quota, a taken id, a closed session) spawns nothing.
    pub fn start(
        &mut self,
        id: &str,
        process: &str,
        spec: H::Spec,
        starters: Vec<u64>,
    ) -> Result<u64, SessionError> {
        let serial = self.reserve(id, process, Slot::Starting)?;
        self.spawn(id, process, serial, spec, starters);
        Ok(serial)
    }

    /// The start waiting for approval in slot `process` (`serial`) of session `id` was
    /// approved: it is [`Slot::Starting`] now and its [`Action::Spawn`] is queued. `false`
    /// (nothing spawned) if the slot is no longer its own: the session was closed.
    pub fn approved(
        &mut self,
        id: &str,
        process: &str,
        serial: u64,
        spec: H::Spec,
        starters: Vec<u64>,
    ) -> bool {
        match self.slot_mut(id, process, serial) {
            Some(s) if matches!(s.slot, Slot::Pending(_)) => s.slot = Slot::Starting,
            _ => return false,
        }
        self.spawn(id, process, serial, spec, starters);
        true
    }

    fn spawn(&mut self, id: &str, process: &str, serial: u64, spec: H::Spec, starters: Vec<u64>) {
        let Some(e) = self.sessions.get_mut(id) else {
            return;
        };
        let session = e.handle.clone();
        if let Some(s) = e.slots.get_mut(process) {
            s.starters = starters;
        }
        self.actions.push_back(Action::Spawn {
            session,
            process: process.to_string(),
            serial,
            spec,
        });
    }

    /// What became of [`Action::Spawn`] for slot `process` (`serial`) of session `id`: the
    /// process (`None`: the spawn failed, and the slot is freed). A spawned process is
    /// [`Slot::Ready`], delivered at once to the holder unless that is one of its starters
    /// (they open delivery after writing their start result); a process whose slot is gone
    /// (the session closed meanwhile) is abandoned ([`Action::Abandon`]). Returns whether
    /// the slot was still this start's.
    pub fn handle_spawned(
        &mut self,
        id: &str,
        process: &str,
        serial: u64,
        spawned: Option<H::Process>,
    ) -> bool {
        let Some(p) = spawned else {
            return self.free(id, process, serial).is_some();
        };
        let Some(s) = self.slot_mut(id, process, serial) else {
            self.actions.push_back(Action::Abandon(p));
            return false;
        };
        s.slot = Slot::Ready(p.clone());
        let starters = std::mem::take(&mut s.starters);
        // The session moved to another connection while it spawned: the start result will
        // never reach that client's stream in order anyway, so deliver there now.
        if let Some(h) = self.holder(id) {
            if !starters.contains(&h.conn_id) {
                let to = Some(h.conn.clone());
                self.actions.push_back(Action::Deliver {
                    process: p,
                    to,
                    replay: false,
                });
            }
        }
        true
    }

    /// Connection `conn_id` wrote the start result of `process` (of session `id`): deliver
    /// its events there from now on, if it still holds the session.
    pub fn enable_delivery(&mut self, id: &str, conn_id: u64, process: H::Process) {
        if let Some(h) = self.holder(id).filter(|h| h.conn_id == conn_id) {
            let to = Some(h.conn.clone());
            self.actions.push_back(Action::Deliver {
                process,
                to,
                replay: false,
            });
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
}
