//! The `writeId`s a process remembers, so that a write repeated after a resume is
//! acknowledged without writing twice (`protocol.md` §4), sans-IO.
//!
//! At most [`RETAINED_WRITE_IDS`] ids, oldest forgotten first; each id's bytes are stored
//! once, shared by the lookup set and the age queue (an id is at most `MAX_WRITE_ID_BYTES`,
//! checked by the connection before it gets here), so a process holds at most
//! 4096 × 256 bytes of ids. It must never hold an id it was not told to remember.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use crate::config::RETAINED_WRITE_IDS;

/// Remembered `writeId`s of one process.
#[derive(Debug, Default)]
pub struct WriteIds {
    ids: HashSet<Arc<str>>,
    order: VecDeque<Arc<str>>,
}

impl WriteIds {
    /// Whether `id` was remembered (and not yet forgotten).
    pub fn contains(&self, id: &str) -> bool {
        self.ids.contains(id)
    }

    /// Remember `id`, forgetting the oldest beyond [`RETAINED_WRITE_IDS`].
    pub fn remember(&mut self, id: &str) {
        if self.ids.contains(id) {
            return;
        }
        let id: Arc<str> = Arc::from(id);
        self.ids.insert(id.clone());
        self.order.push_back(id);
        while self.order.len() > RETAINED_WRITE_IDS {
            if let Some(old) = self.order.pop_front() {
                self.ids.remove(&old);
            }
        }
    }

    /// The `n` most recently remembered ids, oldest first.
    pub fn newest(&self, n: usize) -> Vec<Arc<str>> {
        let skip = self.order.len().saturating_sub(n);
        self.order.iter().skip(skip).cloned().collect()
    }

    /// How many ids are remembered.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Bytes of id text held: each id counted once, however many places refer to it.
    pub fn stored_bytes(&self) -> usize {
        let mut seen: HashSet<*const u8> = HashSet::new();
        self.ids
            .iter()
            .chain(self.order.iter())
            .filter(|id| seen.insert(id.as_ptr()))
            .map(|id| id.len())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_id_is_stored_once() {
        let mut w = WriteIds::default();
        let id = "x".repeat(256);
        w.remember(&id);
        w.remember(&id);
        assert_eq!(w.len(), 1);
        assert_eq!(
            w.stored_bytes(),
            256,
            "one copy, shared by the set and the queue"
        );
    }

    #[test]
    fn the_oldest_is_forgotten_beyond_the_limit() {
        let mut w = WriteIds::default();
        for i in 0..=RETAINED_WRITE_IDS {
            w.remember(&format!("w-{i}"));
        }
        assert_eq!(w.len(), RETAINED_WRITE_IDS);
        assert!(!w.contains("w-0"), "the oldest is forgotten");
        assert!(w.contains("w-1"));
        assert!(w.contains(&format!("w-{RETAINED_WRITE_IDS}")));
        let text: usize = (1..=RETAINED_WRITE_IDS)
            .map(|i| format!("w-{i}").len())
            .sum();
        assert_eq!(w.stored_bytes(), text);
    }
}
