//! The ids of a session's processes that ended and were forgotten (their exit acknowledged,
//! retained for `exited_retention_ms` without acks, or ended by `session/close`), so that a
//! control request that crossed that on the wire is answered as for an exited process
//! (`closeStdin` `{}`, `write` `exited`, `signal` `{}`), not `-32001`; and the last
//! `writeId`s such a process accepted, so that a write repeated after a resume (its answer
//! lost with the connection, the child meanwhile exited and forgotten) is answered
//! `accepted`, as it would have been before the process was forgotten: it did its work.
//!
//! Why: a client's stdin pump may send its `process/closeStdin` while its event loop, on
//! another task, acknowledges the exit notice: nothing orders the two, and a normal run must
//! not end in an "unknown process" error (nor count one in the server's metrics).
//!
//! Owns only the bounded list of ids, oldest first, and the bounded list of write ids. It
//! must never hold a process or its output: a forgotten process's memory is released at
//! once.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

/// How many ended ids a session remembers; the oldest is forgotten first. A request for an
/// id older than that is answered `-32001`, as for an id never seen.
pub const ENDED_PROCESS_IDS: usize = 1024;

/// How many of an ended process's last accepted `writeId`s are kept: what a client may have
/// in flight and repeat after a resume. The client library pipelines up to 64 binary writes
/// (as many as the records of the largest window, `MAX_NOISE_WINDOW_RECORDS`) and the write
/// that closes stdin; with 16, the chaos soak saw the oldest repeats of a cut upload answered
/// `exited` although the child had read every byte. Twice the window, so that a client with
/// a deeper pipeline of small writes is covered too.
pub const ENDED_WRITE_IDS: usize = 2 * crate::config::MAX_NOISE_WINDOW_RECORDS as usize;

// A client's whole pipeline of binary writes (one per window record) and its close must fit.
const _: () = assert!(ENDED_WRITE_IDS > crate::config::MAX_NOISE_WINDOW_RECORDS as usize);

/// Bytes of ended processes' `writeId`s one session keeps, each id counted with what holding
/// it costs ([`ENDED_WRITE_ID_OVERHEAD`] beside its text, at most 256 bytes): the oldest
/// process's ids are forgotten first. A repeat of a forgotten one is answered `exited`, as
/// before this memory existed. About 38 processes' full pipelines of 128 short ids (`s-123`);
/// 16 MiB for a server with the default `max_sessions` of 64.
pub const ENDED_WRITE_ID_BYTES: usize = 256 * 1024;

/// What one remembered id costs beside its text: its shared allocation's counts (16 bytes,
/// the allocation rounded up) and its slot in the list (16). Counted so that a peer's
/// one-byte ids cannot hold many times the bytes the bound names.
pub const ENDED_WRITE_ID_OVERHEAD: usize = 48;

/// What `ids` cost against [`ENDED_WRITE_ID_BYTES`].
fn charge(ids: &[Arc<str>]) -> usize {
    ids.iter().map(|w| w.len() + ENDED_WRITE_ID_OVERHEAD).sum()
}

/// The last [`ENDED_PROCESS_IDS`] ids of processes forgotten by one session, with the last
/// `writeId`s they accepted (within [`ENDED_WRITE_ID_BYTES`]).
#[derive(Debug, Default)]
pub struct EndedIds {
    order: VecDeque<String>,
    set: HashSet<String>,
    /// Process id and its last accepted write ids, oldest process first.
    writes: VecDeque<(String, Vec<Arc<str>>)>,
    write_bytes: usize,
}

impl EndedIds {
    /// Remember `id` as ended, forgetting the oldest past the bound.
    pub fn insert(&mut self, id: String) {
        self.insert_with_writes(id, Vec::new());
    }

    /// Remember `id` as ended with the last `writeId`s it accepted (only the last
    /// [`ENDED_WRITE_IDS`] are kept), forgetting the oldest past the bounds.
    pub fn insert_with_writes(&mut self, id: String, mut write_ids: Vec<Arc<str>>) {
        if write_ids.len() > ENDED_WRITE_IDS {
            write_ids.drain(..write_ids.len() - ENDED_WRITE_IDS);
        }
        if !write_ids.is_empty() && !self.writes.iter().any(|(p, _)| *p == id) {
            self.write_bytes += charge(&write_ids);
            self.writes.push_back((id.clone(), write_ids));
            while self.write_bytes > ENDED_WRITE_ID_BYTES {
                let Some((_, old)) = self.writes.pop_front() else {
                    break;
                };
                self.write_bytes -= charge(&old);
            }
        }
        if self.set.contains(&id) {
            return;
        }
        if self.order.len() >= ENDED_PROCESS_IDS {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
                self.forget_writes(&old);
            }
        }
        self.set.insert(id.clone());
        self.order.push_back(id);
    }

    /// `id` names a process again (a new start took it): it is no longer an ended one.
    pub fn remove(&mut self, id: &str) {
        if self.set.remove(id) {
            self.order.retain(|o| o != id);
        }
        self.forget_writes(id);
    }

    fn forget_writes(&mut self, id: &str) {
        if let Some(i) = self.writes.iter().position(|(p, _)| p == id) {
            if let Some((_, old)) = self.writes.remove(i) {
                self.write_bytes -= charge(&old);
            }
        }
    }

    /// Whether `id` is a remembered ended process.
    pub fn contains(&self, id: &str) -> bool {
        self.set.contains(id)
    }

    /// Whether the ended process `id` accepted the write `write_id` (and it is remembered).
    pub fn wrote(&self, id: &str, write_id: &str) -> bool {
        self.writes
            .iter()
            .any(|(p, ws)| p == id && ws.iter().any(|w| &**w == write_id))
    }

    /// How many ids are remembered.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// What the `writeId`s held cost (their text and [`ENDED_WRITE_ID_OVERHEAD`] each).
    pub fn write_id_bytes(&self) -> usize {
        self.write_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_up_to_the_bound_and_forgets_the_oldest() {
        let mut e = EndedIds::default();
        for i in 0..ENDED_PROCESS_IDS {
            e.insert(format!("p{i}"));
        }
        assert_eq!(e.len(), ENDED_PROCESS_IDS);
        assert!(e.contains("p0"));
        e.insert("one-more".into());
        assert_eq!(e.len(), ENDED_PROCESS_IDS);
        assert!(!e.contains("p0"), "the oldest goes first");
        assert!(e.contains("p1"));
        assert!(e.contains("one-more"));
    }

    #[test]
    fn a_repeated_id_is_held_once_and_a_new_start_takes_it_back() {
        let mut e = EndedIds::default();
        e.insert("a".into());
        e.insert("a".into());
        assert_eq!(e.len(), 1);
        e.remove("a");
        assert!(!e.contains("a"));
        assert!(e.is_empty());
        e.remove("never");
        assert!(e.is_empty());
    }

    /// A peer's one-byte ids are charged what holding them costs, not one byte each.
    #[test]
    fn short_ids_are_charged_what_they_cost() {
        let mut e = EndedIds::default();
        let per_process = ENDED_WRITE_IDS * (1 + ENDED_WRITE_ID_OVERHEAD);
        let fit = ENDED_WRITE_ID_BYTES / per_process;
        for p in 0..fit + 3 {
            let ids: Vec<Arc<str>> = (0..ENDED_WRITE_IDS).map(|_| Arc::from("x")).collect();
            e.insert_with_writes(format!("p{p}"), ids);
            assert!(e.write_id_bytes() <= ENDED_WRITE_ID_BYTES);
        }
        assert_eq!(e.write_id_bytes(), fit * per_process);
        assert!(!e.wrote("p2", "x"), "the oldest processes' ids went first");
        assert!(e.wrote(&format!("p{}", fit + 2), "x"));
    }

    #[test]
    fn an_ended_process_keeps_its_last_write_ids_within_both_bounds() {
        let mut e = EndedIds::default();
        let ids: Vec<Arc<str>> = (0..ENDED_WRITE_IDS + 4)
            .map(|i| Arc::from(format!("s-{i}")))
            .collect();
        e.insert_with_writes("p".into(), ids);
        assert!(e.wrote("p", &format!("s-{}", ENDED_WRITE_IDS + 3)));
        assert!(e.wrote("p", "s-4"), "the last {ENDED_WRITE_IDS} are kept");
        assert!(!e.wrote("p", "s-3"), "older ones are not");
        assert!(!e.wrote("q", "s-4"), "another process's ids are its own");

        // Bytes: 256-byte ids, ENDED_WRITE_IDS per process; the oldest processes' ids go first.
        let big = |p: usize| -> Vec<Arc<str>> {
            (0..ENDED_WRITE_IDS)
                .map(|i| Arc::from(format!("{p:03}-{i:03}-{}", "x".repeat(248))))
                .collect()
        };
        let per_process = ENDED_WRITE_IDS * (256 + ENDED_WRITE_ID_OVERHEAD);
        let fit = ENDED_WRITE_ID_BYTES / per_process;
        for p in 0..fit + 1 {
            e.insert_with_writes(format!("big{p}"), big(p));
            assert!(e.write_id_bytes() <= ENDED_WRITE_ID_BYTES);
        }
        assert!(
            !e.wrote("p", "s-4"),
            "the oldest process's ids were forgotten"
        );
        assert!(e.wrote(&format!("big{fit}"), &big(fit)[0]));
        assert!(e.contains("p"), "its id is still an ended one");

        // A new start of the id takes it back, write ids and all.
        e.remove(&format!("big{fit}"));
        assert!(!e.wrote(&format!("big{fit}"), &big(fit)[0]));
        assert!(e.write_id_bytes() <= ENDED_WRITE_ID_BYTES - per_process);
    }
}
