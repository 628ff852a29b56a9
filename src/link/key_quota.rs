//! Streams per client key (`max_streams_per_key`): how many Noise streams one client key holds
//! on the server at once, over all its links (the environment link, which every client of a
//! relay shares, and direct links), so that one key cannot take the environment link's
//! streams (`max_streams_per_link`) from the others.
//!
//! A stream counts from the moment its message 1 decrypted and its `ts` passed (the key is
//! known then) until its task ends; the count is kept by a guard ([`KeyStream`]) the stream's
//! task holds, given back on drop, so no path can leak a slot. Unauthorized keys are counted
//! too, but only for as long as their authorization takes, and against their own quota.
//!
//! The table holds one entry per key with a stream, so it is bounded by the server's streams.
//! It never reads a clock and never logs key material.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::noise::keys::KEY_BYTES;

type ClientKey = [u8; KEY_BYTES];

/// The streams each client key holds, server-wide.
#[derive(Debug)]
pub struct StreamsPerKey {
    limit: usize,
    held: Mutex<HashMap<ClientKey, usize>>,
}

/// One stream counted for its key; given back on drop.
#[derive(Debug)]
pub struct KeyStream {
    table: Arc<StreamsPerKey>,
    key: ClientKey,
}

impl StreamsPerKey {
    /// At most `limit` streams per key.
    pub fn new(limit: usize) -> Arc<StreamsPerKey> {
        Arc::new(StreamsPerKey {
            limit,
            held: Mutex::new(HashMap::new()),
        })
    }

    /// Count a stream of `key`, or `None` when the key holds its limit.
    pub fn try_enter(self: &Arc<Self>, key: &ClientKey) -> Option<KeyStream> {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let n = held.entry(*key).or_insert(0);
        if *n >= self.limit {
            if *n == 0 {
                held.remove(key);
            }
            return None;
        }
        *n += 1;
        Some(KeyStream {
            table: self.clone(),
            key: *key,
        })
    }

    /// Streams `key` holds now.
    pub fn held_by(&self, key: &ClientKey) -> usize {
        let held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        held.get(key).copied().unwrap_or(0)
    }

    /// The limit.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Keys with a stream now.
    pub fn keys(&self) -> usize {
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

impl Drop for KeyStream {
    fn drop(&mut self) {
        let mut held = self
            .table
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = held.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The limit holds at its edge per key; another key is not affected; a stream's end gives
    /// its slot back, and a key with none leaves no entry behind.
    #[test]
    fn each_key_holds_at_most_its_limit_and_gets_slots_back() {
        let t = StreamsPerKey::new(3);
        let (a, b) = ([1; KEY_BYTES], [2; KEY_BYTES]);
        let held: Vec<_> = (0..3).map(|_| t.try_enter(&a).unwrap()).collect();
        assert!(t.try_enter(&a).is_none(), "the fourth of key a");
        let other = t.try_enter(&b).unwrap();
        assert_eq!((t.held_by(&a), t.held_by(&b)), (3, 1));
        drop(held);
        assert_eq!(t.held_by(&a), 0);
        assert_eq!(t.keys(), 1);
        drop(other);
        assert_eq!(t.keys(), 0, "nothing left behind");
        assert!(t.try_enter(&a).is_some());
    }
}
