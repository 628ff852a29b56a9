//! The ids of a session's processes that ended and were forgotten (their exit acknowledged,
//! retained for `exited_retention_ms` without acks, or ended by `session/close`), so that a
//! control request that crossed that on the wire is answered as for an exited process
//! (`closeStdin` `{}`, `write` `exited`, `signal` `{}`), not `-32001`.
//!
//! Why: a client's stdin pump may send its `process/closeStdin` while its event loop, on
//! another task, acknowledges the exit notice: nothing orders the two, and a normal run must
//! not end in an "unknown process" error (nor count one in the server's metrics).
//!
//! Owns only the bounded list of ids, oldest first. It must never hold a process or its
//! output: a forgotten process's memory is released at once.

use std::collections::{HashSet, VecDeque};

/// How many ended ids a session remembers; the oldest is forgotten first. A request for an
/// id older than that is answered `-32001`, as for an id never seen.
pub const ENDED_PROCESS_IDS: usize = 1024;

/// The last [`ENDED_PROCESS_IDS`] ids of processes forgotten by one session.
#[derive(Debug, Default)]
pub struct EndedIds {
    order: VecDeque<String>,
    set: HashSet<String>,
}

impl EndedIds {
    /// Remember `id` as ended, forgetting the oldest past the bound.
    pub fn insert(&mut self, id: String) {
        if self.set.contains(&id) {
            return;
        }
        if self.order.len() >= ENDED_PROCESS_IDS {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
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
    }

    /// Whether `id` is a remembered ended process.
    pub fn contains(&self, id: &str) -> bool {
        self.set.contains(id)
    }

    /// How many ids are remembered.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
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
}
