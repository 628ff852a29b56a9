//! The ready queue of one connection: processes with unwritten events, in the order they
//! became ready; and what that connection's writer is doing, for the stall watchdog
//! (`stall_watch.rs`): its phase, and the transport's flow-control probe where it has one.
//!
//! Owned by `process/` because the pumps and the supervisor push into it (through
//! `ManagedProcess::notify_delivery`) and a process remembers which set it delivers to; the
//! connection's writer only creates one per connection and pops from it. It holds no events
//! (they stay in each process's log) and must never block: a push is a short lock and a wake.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::futures::Notified;
use tokio::sync::Notify;

use super::ManagedProcess;
use crate::sync::lock;
use crate::transport::FlowProbe;

/// What a connection's writer is doing (set by the writer, read by the stall watchdog).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriterPhase {
    /// Working (popping, encoding, copying): nothing awaited.
    Busy,
    /// Asleep until a process becomes ready or a control message comes.
    Idle,
    /// Waiting for its outlet to take a message (window credit, a socket, a full channel):
    /// the client's side, or the network, holds it.
    Outlet,
    /// Gone: its connection is ending (the session detaches from it next).
    Closed,
}

impl WriterPhase {
    fn from_u8(v: u8) -> WriterPhase {
        match v {
            1 => WriterPhase::Idle,
            2 => WriterPhase::Outlet,
            3 => WriterPhase::Closed,
            _ => WriterPhase::Busy,
        }
    }
}

/// Processes of one connection that have unwritten events, in the order they became ready.
#[derive(Default)]
pub struct ReadySet {
    inner: Mutex<ReadyInner>,
    notify: Notify,
    /// The writer's [`WriterPhase`], as a `u8`.
    phase: AtomicU8,
    /// The transport's flow-control state, set once by the connection (Noise streams).
    flow: OnceLock<Arc<dyn FlowProbe>>,
}

#[derive(Default)]
struct ReadyInner {
    queue: VecDeque<Arc<ManagedProcess>>,
    queued: HashSet<usize>,
}

impl ReadySet {
    /// Queue `p` once (repeated pushes before the writer takes it are merged).
    pub fn push(&self, p: Arc<ManagedProcess>) {
        if crate::faults::active(crate::faults::Fault::LoseReadyPush) {
            return;
        }
        let key = Arc::as_ptr(&p) as usize;
        let mut inner = lock(&self.inner);
        if inner.queued.insert(key) {
            inner.queue.push_back(p);
            drop(inner);
            self.notify.notify_one();
        }
    }

    /// Whether `p` is queued (the watchdog's account of a stall).
    pub fn contains(&self, p: &Arc<ManagedProcess>) -> bool {
        lock(&self.inner)
            .queued
            .contains(&(Arc::as_ptr(p) as usize))
    }

    /// The writer says what it is doing.
    pub fn set_phase(&self, phase: WriterPhase) {
        self.phase.store(phase as u8, Ordering::Relaxed);
    }

    /// What the writer says it is doing.
    pub fn phase(&self) -> WriterPhase {
        WriterPhase::from_u8(self.phase.load(Ordering::Relaxed))
    }

    /// The connection's transport has flow control of its own: this reads it.
    pub fn set_flow(&self, flow: Arc<dyn FlowProbe>) {
        let _ = self.flow.set(flow);
    }

    /// The transport's flow-control probe, if it has one.
    pub fn flow(&self) -> Option<&Arc<dyn FlowProbe>> {
        self.flow.get()
    }

    /// Take the process that became ready first, if any.
    pub fn pop(&self) -> Option<Arc<ManagedProcess>> {
        let mut inner = lock(&self.inner);
        let p = inner.queue.pop_front()?;
        inner.queued.remove(&(Arc::as_ptr(&p) as usize));
        Some(p)
    }

    /// Resolves after the next [`push`](Self::push) that queued a process (or at once if one
    /// happened since the last wait: the wake-up is stored).
    pub fn notified(&self) -> Notified<'_> {
        self.notify.notified()
    }
}
