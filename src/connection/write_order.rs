//! The order of a process's writes once one of them was refused for a limit, so that a client
//! may send a refused write again instead of giving up on its input.
//!
//! A client pipelines its writes (several in flight), and the server refuses a write that finds
//! a limit full (`-32004`: the connection's or the server's request bytes, the connection's
//! request slots) before it reaches its process. Without a rule, the writes behind a refused one
//! could be applied (the limit freed a moment later), and sending the refused one again would
//! put its bytes after theirs. So, per connection: once a write of process `P` with `writeId` `W`
//! is refused, every later write of `P` is refused too (`-32004`, `data.limit`
//! [`WRITE_ORDER_LIMIT`], `data.writeId` `W`), until a write of `P` with `writeId` `W` comes again.
//! The client then sends `W` and everything after it again, in order; nothing is applied out of
//! order, nothing twice (`writeId` dedupe). The server says it keeps this rule with
//! `capabilities.retryRefusedWrites` (README, "Decisions where the spec is silent").
//!
//! # What this module owns
//!
//! [`WriteOrder`], one per network connection: the processes with a refused write not yet sent
//! again, each with that write's id. An entry goes when its write comes again, or when a
//! `process/start` names its process id (a new process under a reused id starts with nothing
//! held: its writer numbers its writes afresh). At most `max_processes` entries
//! ([`MAX_HELD_PROCESSES`] by default), each at most 256 + 256 bytes of ids: when the table
//! is full, the entries of processes the session no longer has (ended and released, or never
//! there) are dropped first ([`WriteOrder::retain`]), so a session's own processes always find
//! room, and made-up process ids cannot crowd them out.
//!
//! # What it must never do
//!
//! - Hold a write that has no `writeId`: such a write cannot be named again, so it is refused
//!   alone, as before.
//! - Touch another connection's writes, or anything but writes: a session is served by one
//!   connection at a time, and a resumed connection starts with nothing held (its client sends
//!   every unanswered write again, in order, anyway).
//! - Perform I/O, block, or read a clock: the processor's reader calls it in message order.

use std::collections::HashMap;

use crate::config::{MAX_PROCESS_ID_BYTES, MAX_WRITE_ID_BYTES};
use crate::rpc::RpcError;

/// Processes per connection that may have a refused write held at once, by default: the most
/// processes a session can have by default (`max_processes`, which sizes the table).
pub const MAX_HELD_PROCESSES: usize = crate::config::MAX_PROCESSES;

/// `data.limit` of the `-32004` that refuses a write behind a refused one
/// ([`RpcError::write_order`]).
pub const WRITE_ORDER_LIMIT: &str = "writeOrder";

/// The refused writes of one connection not yet sent again (see the module docs).
#[derive(Debug)]
pub struct WriteOrder {
    /// Process id → the `writeId` of its refused write.
    held: HashMap<String, String>,
    /// The most entries (the session's `max_processes`).
    limit: usize,
}

impl Default for WriteOrder {
    fn default() -> Self {
        WriteOrder::new(MAX_HELD_PROCESSES)
    }
}

impl WriteOrder {
    /// A table of at most `limit` processes (at least one).
    pub fn new(limit: usize) -> WriteOrder {
        WriteOrder {
            held: HashMap::new(),
            limit: limit.max(1),
        }
    }

    /// Whether one more process could not be held now: the caller drops the entries of
    /// processes that are gone ([`WriteOrder::retain`]) before [`WriteOrder::refused`].
    pub fn is_full(&self) -> bool {
        self.held.len() >= self.limit
    }

    /// Keep only the entries of processes for which `live` holds.
    pub fn retain(&mut self, mut live: impl FnMut(&str) -> bool) {
        self.held.retain(|process, _| live(process));
    }

    /// A `process/start` names `process`: whatever was held under that id belonged to an
    /// earlier process (or to none), and the new one's writes start afresh.
    pub fn forget(&mut self, process: &str) {
        self.held.remove(process);
    }

    /// A write of `process` was refused for a limit: hold the process's later writes until
    /// `write_id` comes again. A write without an id, or ids past their limits (a peer's, never
    /// kept), or one more process than the table's limit (after [`WriteOrder::retain`], only
    /// a session with more live processes than `max_processes`, which it cannot have), holds
    /// nothing.
    pub fn refused(&mut self, process: &str, write_id: Option<&str>) {
        let Some(write_id) = write_id else { return };
        if process.len() > MAX_PROCESS_ID_BYTES || write_id.len() > MAX_WRITE_ID_BYTES {
            return;
        }
        // A write behind one already held is refused by `check` and never reaches here; a
        // second refusal of the held write itself keeps it held.
        if self.held.contains_key(process) {
            return;
        }
        if self.is_full() {
            tracing::debug!("write refused, not held: too many processes with refused writes");
            return;
        }
        self.held.insert(process.to_string(), write_id.to_string());
    }

    /// May this write of `process` go on to its limits? `Err`: a refused write of the process
    /// has not come again, and this is not it (the `-32004` to answer). The refused write
    /// itself lets its process go (if a limit refuses it again, [`WriteOrder::refused`] holds
    /// it again).
    pub fn check(&mut self, process: &str, write_id: Option<&str>) -> Result<(), RpcError> {
        let Some(held) = self.held.get(process) else {
            return Ok(());
        };
        if write_id == Some(held.as_str()) {
            self.held.remove(process);
            return Ok(());
        }
        Err(RpcError::write_order(held))
    }

    /// Processes with a refused write held now.
    pub fn held(&self) -> usize {
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_behind_a_refused_one_are_refused_until_it_comes_again() {
        let mut order = WriteOrder::default();
        assert!(order.check("p", Some("s-1")).is_ok());
        order.refused("p", Some("s-2"));
        for later in ["s-3", "s-4"] {
            let e = order.check("p", Some(later)).unwrap_err();
            assert_eq!(e.code.code(), -32004);
            assert_eq!(
                e.data,
                Some(serde_json::json!({"limit": "writeOrder", "writeId": "s-2"}))
            );
        }
        // A write without an id is behind it too.
        assert!(order.check("p", None).is_err());
        // Another process's writes are not.
        assert!(order.check("q", Some("s-3")).is_ok());
        // The refused write comes again: it goes on, and so does everything after it.
        assert!(order.check("p", Some("s-2")).is_ok());
        assert_eq!(order.held(), 0);
        assert!(order.check("p", Some("s-3")).is_ok());
    }

    #[test]
    fn a_refused_write_refused_again_stays_the_one_held() {
        let mut order = WriteOrder::default();
        order.refused("p", Some("s-2"));
        assert!(order.check("p", Some("s-2")).is_ok());
        order.refused("p", Some("s-2"));
        assert!(order.check("p", Some("s-3")).is_err());
        // A later refusal (of a write the rule already refused) does not move it.
        order.refused("p", Some("s-3"));
        assert!(order.check("p", Some("s-2")).is_ok());
    }

    #[test]
    fn a_write_without_an_id_or_with_ids_past_their_limits_holds_nothing() {
        let mut order = WriteOrder::default();
        order.refused("p", None);
        order.refused(&"p".repeat(MAX_PROCESS_ID_BYTES + 1), Some("w"));
        order.refused("p", Some(&"w".repeat(MAX_WRITE_ID_BYTES + 1)));
        assert_eq!(order.held(), 0);
        // At the limits, it does.
        order.refused(
            &"p".repeat(MAX_PROCESS_ID_BYTES),
            Some(&"w".repeat(MAX_WRITE_ID_BYTES)),
        );
        assert_eq!(order.held(), 1);
    }

    #[test]
    fn a_start_under_the_id_forgets_what_was_held_and_gone_processes_make_room() {
        let mut order = WriteOrder::new(2);
        order.refused("p", Some("s-3"));
        // A new process under the id p: its own s-1 is not behind the old s-3.
        order.forget("p");
        assert!(order.check("p", Some("s-1")).is_ok());
        order.refused("a", Some("w"));
        order.refused("b", Some("w"));
        assert!(order.is_full());
        // b is gone: dropped, and c finds room; a, still there, stays held.
        order.retain(|p| p != "b");
        order.refused("c", Some("w"));
        assert_eq!(order.held(), 2);
        assert!(order.check("a", Some("x")).is_err());
        assert!(order.check("c", Some("x")).is_err());
        assert!(order.check("b", Some("x")).is_ok());
    }

    #[test]
    fn at_most_max_held_processes_are_held() {
        let mut order = WriteOrder::default();
        for i in 0..MAX_HELD_PROCESSES + 10 {
            order.refused(&format!("p{i}"), Some("w"));
        }
        assert_eq!(order.held(), MAX_HELD_PROCESSES);
        // One past the bound holds nothing: its later writes go on.
        assert!(order
            .check(&format!("p{MAX_HELD_PROCESSES}"), Some("x"))
            .is_ok());
        assert!(order.check("p0", Some("x")).is_err());
    }
}
