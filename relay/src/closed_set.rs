//! The ids of streams a link closed recently, so that frames already in flight when a stream
//! was reset are dropped quietly rather than charged to the unknown-stream budget.
//!
//! Bounded: the oldest id is forgotten first. Sans-IO.

use std::collections::{HashSet, VecDeque};

use crate::frame::StreamId;

/// A bounded first-in-first-out set of stream ids.
#[derive(Debug, Clone)]
pub struct ClosedSet {
    cap: usize,
    order: VecDeque<StreamId>,
    set: HashSet<StreamId>,
}

impl ClosedSet {
    /// Remembers at most `cap` ids.
    pub fn new(cap: usize) -> Self {
        ClosedSet {
            cap,
            order: VecDeque::new(),
            set: HashSet::new(),
        }
    }

    /// Remember `id`, forgetting the oldest beyond the cap.
    pub fn insert(&mut self, id: StreamId) {
        if self.cap == 0 || !self.set.insert(id) {
            return;
        }
        self.order.push_back(id);
        while self.order.len() > self.cap {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
    }

    /// Whether `id` closed recently.
    pub fn contains(&self, id: &StreamId) -> bool {
        self.set.contains(id)
    }

    /// Forget `id` (it is in use again).
    pub fn remove(&mut self, id: &StreamId) {
        if self.set.remove(id) {
            self.order.retain(|x| x != id);
        }
    }

    /// Ids remembered.
    pub fn len(&self) -> usize {
        self.set.len()
    }

    /// Whether none is remembered.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
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
    }
}
