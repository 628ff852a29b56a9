//! A process's exclusive requests in flight (its start, writes, `closeStdin`, `resize`):
//! counted per process, shared by its slot, its controllers and the connection's table of
//! calls awaiting an answer.
//!
//! Why: a `process/read` waits behind them on the server (`protocol.md` §6), for as long as a
//! child leaves its stdin unread or a person takes to approve a start, so the silence watch
//! (`silence.rs`) must not ask about a process meanwhile, nor take an unanswered question for
//! a wedged connection when one of them began while it was on its way.
//!
//! Owns only the two counters and the guard that keeps one request counted. It must never
//! block, and a guard must live as long as its request can still hold the server's queue: the
//! caller's future may be dropped while the request is on the wire, so the connection keeps a
//! guard with the pending call from the moment it is handed to the transport until it is
//! answered or the connection ends (`rpc_connection.rs`; a request dropped before it was
//! sent takes its guard with it). One exclusive request goes uncounted: the
//! `process/closeStdin` that follows a JSON write closing stdin, which the server carries out
//! as soon as that write is answered (closing a pipe waits for nothing); the write keeps its
//! own guard from the moment it is on the wire, whatever becomes of the follow-up.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// A process's exclusive requests: how many are in flight, and how many ever began. The
/// silence watch asks about a process only with none in flight, and does not take the
/// connection for wedged when one began while its question was on the way: the question
/// then waits behind it (`protocol.md` §6).
#[derive(Debug, Default)]
pub(crate) struct ExclusiveCounts {
    in_flight: AtomicUsize,
    begun: AtomicU64,
}

impl ExclusiveCounts {
    /// Whether none is in flight now.
    pub(crate) fn idle(&self) -> bool {
        self.in_flight.load(Ordering::SeqCst) == 0
    }

    /// How many began so far: read before [`idle`](Self::idle) and compared after a question
    /// to the server.
    pub(crate) fn begun(&self) -> u64 {
        self.begun.load(Ordering::SeqCst)
    }
}

/// Counts one exclusive request of a process in flight while it lives
/// (`ProcSlot::exclusive_in_flight`).
pub(crate) struct ExclusiveInFlight(Arc<ExclusiveCounts>);

impl ExclusiveInFlight {
    /// One more exclusive request of the process behind `counts` in flight.
    pub(crate) fn new(counts: &Arc<ExclusiveCounts>) -> Self {
        // In flight first, then begun; the watch reads them the other way round (`begun`,
        // then `idle`, `silence.rs`). A request that begins around the check is then either
        // seen in flight (the process is skipped) or counted as begun after the watch read
        // `begun` (the question is excused): never neither, which would condemn a healthy
        // connection (review R3). SeqCst: the argument needs one order of all four accesses.
        counts.in_flight.fetch_add(1, Ordering::SeqCst);
        counts.begun.fetch_add(1, Ordering::SeqCst);
        ExclusiveInFlight(counts.clone())
    }

    /// One more guard counting the same process's requests: the one the connection keeps
    /// with the pending call, which outlives the caller's future if that is dropped.
    pub(crate) fn another(&self) -> ExclusiveInFlight {
        ExclusiveInFlight::new(&self.0)
    }
}

impl Drop for ExclusiveInFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}
