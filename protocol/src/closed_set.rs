//! The ids of streams a link closed recently, so that frames already in flight when a stream
//! was reset are dropped quietly rather than charged to the unknown-stream budget.
//!
//! Bounded: the oldest id is forgotten first. Every operation is O(1) (amortized): a peer can
//! make a link insert and remove ids at its frame rate (an `OPEN` of a remembered id removes
//! it, its refusal inserts it again), so a removal must not scan the set (it used to: up to
//! [`CLOSED_STREAMS_REMEMBERED`](crate::config::CLOSED_STREAMS_REMEMBERED) comparisons per
//! `OPEN`, under the relay's one lock). A removed id leaves a stale entry in the order queue,
//! skipped when it reaches the front; the queue holds at most twice the cap (beyond it the
//! oldest entries go first, live or stale). Sans-IO.

use std::collections::{HashMap, VecDeque};

use crate::frame::StreamId;

/// A bounded first-in-first-out set of stream ids.
#[derive(Debug, Clone)]
pub struct ClosedSet {
    cap: usize,
    /// Ids in insertion order, each with the number of its insertion (an entry whose number
    /// is not the id's current one in `set` is stale).
    order: VecDeque<(StreamId, u64)>,
    set: HashMap<StreamId, u64>,
    inserted: u64,
}

impl ClosedSet {
    /// Remembers at most `cap` ids.
    pub fn new(cap: usize) -> Self {
        ClosedSet {
            cap,
            order: VecDeque::new(),
            set: HashMap::new(),
            inserted: 0,
        }
    }

    /// Remember `id`, forgetting the oldest beyond the cap.
    pub fn insert(&mut self, id: StreamId) {
        if self.cap == 0 || self.set.contains_key(&id) {
            return;
        }
        self.inserted += 1;
        self.set.insert(id, self.inserted);
        self.order.push_back((id, self.inserted));
        while self.set.len() > self.cap || self.order.len() > 2 * self.cap {
            let Some((old, n)) = self.order.pop_front() else {
                break;
            };
            if self.set.get(&old) == Some(&n) {
                self.set.remove(&old);
            }
        }
    }

    /// Whether `id` closed recently.
    pub fn contains(&self, id: &StreamId) -> bool {
        self.set.contains_key(id)
    }

    /// Forget `id` (it is in use again).
    pub fn remove(&mut self, id: &StreamId) {
        self.set.remove(id);
    }

    /// Ids remembered.
    pub fn len(&self) -> usize {
        self.set.len()
    }

    /// Whether none is remembered.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }

    /// Entries of the order queue, live and stale (at most twice the cap).
    pub fn queued_entries(&self) -> usize {
        self.order.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forgets_the_oldest_beyond_the_cap() {
        let mut s = ClosedSet::new(2);
        s.insert([1; 16]);
        s.insert([2; 16]);
        s.insert([2; 16]);
        assert_eq!(s.len(), 2);
        s.insert([3; 16]);
        assert!(!s.contains(&[1; 16]));
        assert!(s.contains(&[2; 16]) && s.contains(&[3; 16]));
        s.remove(&[2; 16]);
        assert!(!s.contains(&[2; 16]));
        assert_eq!(s.len(), 1);
        // Removed then inserted again: it is the newest, and its stale entry forgets nothing.
        s.insert([2; 16]);
        s.insert([4; 16]);
        assert!(s.contains(&[2; 16]) && s.contains(&[4; 16]) && !s.contains(&[3; 16]));
    }

    #[test]
    fn removals_and_reinsertions_at_a_peers_rate_stay_bounded() {
        let mut s = ClosedSet::new(4);
        for n in 0..4u8 {
            s.insert([n; 16]);
        }
        for _ in 0..10_000 {
            s.remove(&[9; 16]);
            s.insert([9; 16]);
        }
        assert!(s.queued_entries() <= 8, "{}", s.queued_entries());
        assert!(s.len() <= 4);
        assert!(s.contains(&[9; 16]));
    }
}
