//! The ready queue of one connection: processes with unwritten events, in the order they
//! became ready.
//!
//! Owned by `process/` because the pumps and the supervisor push into it (through
//! `ManagedProcess::notify_delivery`) and a process remembers which set it delivers to; the
//! connection's writer only creates one per connection and pops from it. It holds no events
//! (they stay in each process's log) and must never block: a push is a short lock and a wake.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::sync::futures::Notified;
use tokio::sync::Notify;

use super::ManagedProcess;
use crate::sync::lock;

/// Processes of one connection that have unwritten events, in the order they became ready.
#[derive(Default)]
pub struct ReadySet {
    inner: Mutex<ReadyInner>,
    notify: Notify,
}

#[derive(Default)]
struct ReadyInner {
    queue: VecDeque<Arc<ManagedProcess>>,
    queued: HashSet<usize>,
}

impl ReadySet {
    /// Queue `p` once (repeated pushes before the writer takes it are merged).
    pub fn push(&self, p: Arc<ManagedProcess>) {
        let key = Arc::as_ptr(&p) as usize;
        let mut inner = lock(&self.inner);
        if inner.queued.insert(key) {
            inner.queue.push_back(p);
            drop(inner);
            self.notify.notify_one();
        }
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
