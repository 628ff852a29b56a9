//! Ordering of concurrent requests on one connection (`protocol.md` §6).
//!
//! Per `processId`, requests form a FIFO queue: an *exclusive* request (start, write,
//! closeStdin, resize) runs once every earlier exclusive request of that process is done; a
//! *shared* request (read) runs once every earlier exclusive one is done, alongside other
//! reads. An exclusive request does not wait for earlier reads: a read may be a long poll,
//! and a long poll must never hold up anything else (a write to the same process, say). Control requests never enter a queue. [`Queues`] is the sans-IO core; [`Scheduler`]
//! wraps it with wake-ups for tasks. Tickets are taken in wire order by the connection's
//! reader, so the order is the order the client sent.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use crate::sync::lock;

/// How a request is ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Runs alone, in FIFO order.
    Exclusive,
    /// Runs with other shared requests, never before an earlier exclusive one.
    Shared,
}

/// A place in a queue.
pub type Ticket = u64;

#[derive(Debug)]
struct Entry {
    ticket: Ticket,
    class: Class,
    running: bool,
}

/// The sans-IO queues.
#[derive(Debug, Default)]
pub struct Queues {
    queues: HashMap<String, VecDeque<Entry>>,
    next: Ticket,
}

impl Queues {
    /// Enqueue a request; returns its ticket and whether it may run now.
    pub fn enqueue(&mut self, key: &str, class: Class) -> (Ticket, bool) {
        self.next += 1;
        let ticket = self.next;
        let q = self.queues.entry(key.to_string()).or_default();
        q.push_back(Entry {
            ticket,
            class,
            running: false,
        });
        let started = Self::runnable(q);
        (ticket, started.contains(&ticket))
    }

    /// A request finished (or was skipped); returns the tickets that may run now.
    pub fn complete(&mut self, key: &str, ticket: Ticket) -> Vec<Ticket> {
        let Some(q) = self.queues.get_mut(key) else {
            return Vec::new();
        };
        q.retain(|e| e.ticket != ticket);
        if q.is_empty() {
            self.queues.remove(key);
            return Vec::new();
        }
        Self::runnable(q)
    }

    /// Mark and return the entries that may start now and have not yet.
    fn runnable(q: &mut VecDeque<Entry>) -> Vec<Ticket> {
        let mut out = Vec::new();
        for e in q.iter_mut() {
            match e.class {
                Class::Exclusive => {
                    // The first exclusive entry runs (reads before it do not hold it back);
                    // everything after it waits for it.
                    if !e.running {
                        e.running = true;
                        out.push(e.ticket);
                    }
                    break;
                }
                Class::Shared => {
                    if !e.running {
                        e.running = true;
                        out.push(e.ticket);
                    }
                }
            }
        }
        out
    }

    /// Number of process keys with queued or running requests.
    pub fn len(&self) -> usize {
        self.queues.len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.queues.is_empty()
    }
}

#[derive(Default)]
struct SchedInner {
    queues: Queues,
    waiting: HashMap<Ticket, oneshot::Sender<()>>,
}

/// The async scheduler of one connection.
#[derive(Clone, Default)]
pub struct Scheduler {
    inner: Arc<Mutex<SchedInner>>,
}

/// A request's place. Dropping it (finished, failed, or skipped because the connection
/// closed) lets the next requests of that process run.
pub struct Slot {
    sched: Scheduler,
    key: String,
    ticket: Ticket,
    turn: Option<oneshot::Receiver<()>>,
}

impl Scheduler {
    /// Take a place in `key`'s queue. Call in wire order.
    pub fn enqueue(&self, key: &str, class: Class) -> Slot {
        let mut inner = lock(&self.inner);
        let (ticket, now) = inner.queues.enqueue(key, class);
        let turn = if now {
            None
        } else {
            let (tx, rx) = oneshot::channel();
            inner.waiting.insert(ticket, tx);
            Some(rx)
        };
        Slot {
            sched: self.clone(),
            key: key.to_string(),
            ticket,
            turn,
        }
    }
}

impl Slot {
    /// Wait for this request's turn. Cancel-safe: a wait dropped before the turn came keeps
    /// the place, and the next call waits again.
    pub async fn ready(&mut self) {
        if let Some(rx) = self.turn.as_mut() {
            // The sender is only dropped after it was sent to, or with the scheduler.
            let _ = rx.await;
            self.turn = None;
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut inner = lock(&self.sched.inner);
        inner.waiting.remove(&self.ticket);
        let next = inner.queues.complete(&self.key, self.ticket);
        for t in next {
            if let Some(tx) = inner.waiting.remove(&t) {
                let _ = tx.send(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt;

    #[test]
    fn exclusive_requests_run_one_at_a_time_in_order() {
        let mut q = Queues::default();
        let (a, a_now) = q.enqueue("p", Class::Exclusive);
        let (b, b_now) = q.enqueue("p", Class::Exclusive);
        assert!(a_now);
        assert!(!b_now);
        assert_eq!(q.complete("p", a), vec![b]);
        assert_eq!(q.complete("p", b), Vec::<Ticket>::new());
        assert!(q.is_empty());
    }

    #[test]
    fn reads_share_but_never_overtake_an_earlier_exclusive() {
        let mut q = Queues::default();
        let (r1, r1_now) = q.enqueue("p", Class::Shared);
        let (r2, r2_now) = q.enqueue("p", Class::Shared);
        let (w, w_now) = q.enqueue("p", Class::Exclusive);
        let (r3, r3_now) = q.enqueue("p", Class::Shared);
        assert!(r1_now && r2_now, "reads run together");
        assert!(
            w_now,
            "a write does not wait for earlier reads (they may be long polls)"
        );
        assert!(!r3_now, "a read waits for an earlier write");
        let (w2, w2_now) = q.enqueue("p", Class::Exclusive);
        assert!(!w2_now, "writes stay FIFO");
        assert!(q.complete("p", r2).is_empty());
        assert!(q.complete("p", r1).is_empty());
        assert_eq!(q.complete("p", w), vec![r3, w2]);
    }

    #[test]
    fn processes_do_not_wait_for_each_other() {
        let mut q = Queues::default();
        let (_a, a_now) = q.enqueue("p", Class::Exclusive);
        let (_b, b_now) = q.enqueue("q", Class::Exclusive);
        assert!(a_now && b_now);
        assert_eq!(q.len(), 2);
    }

    /// Polled by hand (no runtime, no spawned task), so each "must wait" is checked against
    /// the scheduler's state, never against a task that has not run yet, and nothing can hang.
    #[test]
    fn dropping_a_slot_lets_the_next_one_run() {
        let s = Scheduler::default();
        let first = s.enqueue("p", Class::Exclusive);
        let mut second = s.enqueue("p", Class::Exclusive);
        let mut third = s.enqueue("p", Class::Exclusive);
        assert!(first.turn.is_none(), "the first runs at once");
        assert!(
            second.ready().now_or_never().is_none(),
            "second must wait for first"
        );
        assert!(third.ready().now_or_never().is_none(), "third waits too");
        drop(first);
        assert!(
            second.ready().now_or_never().is_some(),
            "second runs once first is done"
        );
        assert!(
            third.ready().now_or_never().is_none(),
            "third waits for second"
        );
        drop(second);
        assert!(third.ready().now_or_never().is_some(), "then third runs");
    }

    /// The wake-up reaches a wait already parked on its turn (hang guard: a generous
    /// timeout, only reached when the scheduler fails to wake it).
    #[tokio::test]
    async fn a_parked_wait_is_woken_when_its_turn_comes() {
        let s = Scheduler::default();
        let first = s.enqueue("p", Class::Exclusive);
        let mut second = s.enqueue("p", Class::Exclusive);
        let mut wait = std::pin::pin!(second.ready());
        assert!(
            futures_util::poll!(wait.as_mut()).is_pending(),
            "parked behind first"
        );
        drop(first);
        tokio::time::timeout(std::time::Duration::from_secs(30), wait)
            .await
            .expect("the parked wait was never woken");
    }

    #[test]
    fn a_skipped_slot_releases_its_place() {
        let s = Scheduler::default();
        let first = s.enqueue("p", Class::Exclusive);
        let skipped = s.enqueue("p", Class::Exclusive);
        let mut third = s.enqueue("p", Class::Exclusive);
        drop(skipped); // never ran: connection closed while queued
        assert!(
            third.ready().now_or_never().is_none(),
            "third still waits for first"
        );
        drop(first);
        assert!(
            third.ready().now_or_never().is_some(),
            "the skipped slot no longer holds third back"
        );
    }
}
