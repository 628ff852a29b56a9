//! The server-wide output budget: how much output the children of all sessions may have read
//! into their event logs and not yet written to a client, shared fairly by the processes that
//! are ahead of their clients.
//!
//! # What this module owns
//!
//! - [`OutputBudget`], one per server (`output_budget_bytes`): the total of unwritten output
//!   (each event's bytes plus [`EVENT_OVERHEAD_BYTES`]), the processes that hold some (the
//!   processes *ahead* of their clients), its high-water mark, and the queue of pumps waiting
//!   for room.
//! - [`BudgetShare`], one per process, held by its event log: what that process holds of the
//!   budget, kept equal to the log's unwritten bytes ([`BudgetShare::sync`]), and the admission
//!   rule for its next chunk ([`BudgetShare::admit`], the pure [`admission`]):
//!   1. **Guaranteed share**: a process may always hold [`GUARANTEED_OUTPUT_BYTES`] (one
//!      chunk), budget or no budget, so every process can always make progress, however many
//!      others are chatty.
//!   2. **Fair share**: beyond that, a process may hold at most the budget divided by the
//!      processes ahead (and never less than the guarantee), so a few chatty processes whose
//!      clients are slow cannot take the whole budget from the rest.
//!   3. **The budget**: beyond the guarantee, a chunk is admitted only if the total stays
//!      within the budget (checked and charged in one atomic step).
//!
//! # The bound
//!
//! Unwritten output never exceeds `output_budget_bytes + A × GUARANTEED_OUTPUT_BYTES`, where
//! `A` is the number of processes ahead of their clients (at most the number of processes).
//! Bytes admitted by rule 3 never take the total past the budget; bytes admitted by rule 1
//! are at most one guarantee per process (a process gets them only while it holds less than
//! the guarantee, and its events are written oldest first). The one exception is a resume:
//! it makes already retained events unwritten again (`rewind_delivery`); they are counted, so
//! new output waits for them, but they are memory the server already held, not new memory.
//!
//! # What it must never do
//!
//! - Refuse a process its guaranteed share, or hold a pump back for another process's sake
//!   beyond the rules above.
//! - Lose a wake-up: a release with pumps waiting for room always wakes one ([`BudgetShare`]
//!   passes the wake on when it does not use the room), and a pump registers before it
//!   checks (see `output_pump.rs`).
//! - Block, or read a clock. The tokio [`Notify`] it holds is a plain synchronisation
//!   primitive (no runtime, no timer); the event log that holds a share stays sans-IO.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::futures::Notified;
use tokio::sync::Notify;

use crate::config::MAX_CHUNK_BYTES;

/// Bookkeeping cost charged per event on top of its bytes, so that a log of tiny events is
/// bounded too (an event's allocation, seq and stream tag).
pub const EVENT_OVERHEAD_BYTES: usize = 64;

/// What every process may always hold unwritten, whatever the budget: one chunk (the largest
/// event an output pump appends, with its bookkeeping). One chunk at a time keeps every child
/// moving when the budget is taken; the per-process term of the bound.
pub const GUARANTEED_OUTPUT_BYTES: usize = MAX_CHUNK_BYTES + EVENT_OVERHEAD_BYTES;

/// Why a chunk was not admitted: what the pump waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blocked {
    /// The process's own retention (`retained_output_bytes`) is full: it waits for its own
    /// events to be written (or acknowledged) and released.
    Retention,
    /// The process holds its fair share: it waits for its own events to be written.
    FairShare,
    /// The budget is spent: it waits for any process's events to be written.
    Budget,
}

/// The admission rule, without state: may a process that holds `own` unwritten bytes add a
/// chunk of `cost`, when all processes hold `total` of a budget of `limit` and `ahead`
/// processes hold some? (`Ok` does not charge anything; [`BudgetShare::admit`] does.)
pub fn admission(
    own: usize,
    cost: usize,
    total: usize,
    ahead: usize,
    limit: usize,
) -> Result<(), Blocked> {
    if own.saturating_add(cost) <= GUARANTEED_OUTPUT_BYTES {
        return Ok(());
    }
    if own.saturating_add(cost) > fair_share(limit, ahead) {
        return Err(Blocked::FairShare);
    }
    if total.saturating_add(cost) > limit {
        return Err(Blocked::Budget);
    }
    Ok(())
}

/// The most a process may hold when `ahead` processes hold some of a budget of `limit`: an
/// equal part, never less than the guarantee.
pub fn fair_share(limit: usize, ahead: usize) -> usize {
    (limit / ahead.max(1)).max(GUARANTEED_OUTPUT_BYTES)
}

/// The server-wide output budget, shared (`Arc`) by every process's [`BudgetShare`].
#[derive(Debug)]
pub struct OutputBudget {
    limit: usize,
    /// Unwritten bytes of every process (with per-event overhead).
    total: AtomicUsize,
    /// Processes holding unwritten bytes.
    ahead: AtomicUsize,
    /// The largest `total` ever reached.
    peak: AtomicUsize,
    /// Pumps waiting for [`Blocked::Budget`].
    waiting: AtomicUsize,
    /// Woken, one waiter at a time in the order they came, when room is released.
    room: Notify,
}

impl OutputBudget {
    /// A budget of `limit` bytes of unwritten output (`output_budget_bytes`).
    pub fn new(limit: usize) -> Arc<OutputBudget> {
        Arc::new(OutputBudget {
            limit,
            total: AtomicUsize::new(0),
            ahead: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            room: Notify::new(),
        })
    }

    /// A budget that never binds (tests of a lone event log).
    pub fn unlimited() -> Arc<OutputBudget> {
        OutputBudget::new(usize::MAX)
    }

    /// The limit.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Unwritten bytes of every process, now.
    pub fn unwritten(&self) -> usize {
        self.total.load(Ordering::Relaxed)
    }

    /// Processes holding unwritten bytes, now.
    pub fn ahead(&self) -> usize {
        self.ahead.load(Ordering::Relaxed)
    }

    /// The largest total of unwritten bytes reached so far.
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }

    /// A share for a new process, holding nothing.
    pub fn share(self: &Arc<Self>) -> BudgetShare {
        BudgetShare {
            budget: self.clone(),
            held: 0,
        }
    }

    /// A future that resolves when room is released (or at once if a wake-up is stored).
    /// Register it (`enable`) and [`begin_wait`](Self::begin_wait) *before* checking
    /// admission, so that a release in between is not missed.
    pub fn room_released(&self) -> Notified<'_> {
        self.room.notified()
    }

    /// A pump starts waiting for [`Blocked::Budget`]; the guard counts it until dropped.
    pub fn begin_wait(self: &Arc<Self>) -> WaitGuard {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        WaitGuard {
            budget: self.clone(),
        }
    }

    /// Wake the next waiter, if any: room was released, or a waiter woken for room it did not
    /// use passes the wake on.
    pub fn wake_one(&self) {
        if self.waiting.load(Ordering::SeqCst) > 0 {
            self.room.notify_one();
        }
    }

    fn add(&self, n: usize) {
        let now = self.total.fetch_add(n, Ordering::SeqCst) + n;
        self.peak.fetch_max(now, Ordering::Relaxed);
    }

    /// Charge `n` only if the total stays within the limit (one atomic step).
    fn add_within_limit(&self, n: usize) -> bool {
        let mut current = self.total.load(Ordering::SeqCst);
        loop {
            let Some(next) = current.checked_add(n).filter(|&next| next <= self.limit) else {
                return false;
            };
            match self.total.compare_exchange_weak(
                current,
                next,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => {
                    self.peak.fetch_max(next, Ordering::Relaxed);
                    return true;
                }
                Err(seen) => current = seen,
            }
        }
    }

    fn sub(&self, n: usize) {
        self.total.fetch_sub(n, Ordering::SeqCst);
        self.wake_one();
    }
}

/// Counts a pump as waiting for room while it lives.
#[derive(Debug)]
pub struct WaitGuard {
    budget: Arc<OutputBudget>,
}

impl Drop for WaitGuard {
    fn drop(&mut self) {
        self.budget.waiting.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One process's part of the [`OutputBudget`]: what it holds, kept equal to its event log's
/// unwritten bytes. Dropping it (with the log) gives everything back.
#[derive(Debug)]
pub struct BudgetShare {
    budget: Arc<OutputBudget>,
    held: usize,
}

impl BudgetShare {
    /// What this process holds.
    pub fn held(&self) -> usize {
        self.held
    }

    /// The budget this share belongs to.
    pub fn budget(&self) -> &Arc<OutputBudget> {
        &self.budget
    }

    /// Whether a chunk of `cost` would be admitted now, charging nothing (a pump asks before
    /// it reads a whole chunk, so that it never holds one it may not append).
    pub fn would_admit(&self, cost: usize) -> Result<(), Blocked> {
        let b = &self.budget;
        admission(
            self.held,
            cost,
            b.total.load(Ordering::SeqCst),
            b.ahead.load(Ordering::SeqCst),
            b.limit,
        )
    }

    /// Admit a chunk of `cost` and charge it, or say why not ([`admission`]). The caller
    /// appends the chunk at once (its unwritten bytes then equal [`held`](Self::held) again).
    pub fn admit(&mut self, cost: usize) -> Result<(), Blocked> {
        let b = &self.budget;
        admission(
            self.held,
            cost,
            b.total.load(Ordering::SeqCst),
            b.ahead.load(Ordering::SeqCst),
            b.limit,
        )?;
        if self.held.saturating_add(cost) <= GUARANTEED_OUTPUT_BYTES {
            // The guaranteed share: charged whatever the total.
            b.add(cost);
        } else if !b.add_within_limit(cost) {
            // Another process took the room between the check and the charge.
            return Err(Blocked::Budget);
        }
        self.set_held(self.held + cost);
        Ok(())
    }

    /// The log's unwritten bytes are now `unwritten` (events appended outside admission, such
    /// as the exit notice; events written; events made unwritten again by a resume): charge
    /// or release the difference. A release wakes a pump waiting for room.
    pub fn sync(&mut self, unwritten: usize) {
        match unwritten.cmp(&self.held) {
            std::cmp::Ordering::Greater => self.budget.add(unwritten - self.held),
            std::cmp::Ordering::Less => self.budget.sub(self.held - unwritten),
            std::cmp::Ordering::Equal => return,
        }
        self.set_held(unwritten);
    }

    /// Record the new holding, counting the process in or out of those ahead.
    fn set_held(&mut self, held: usize) {
        match (self.held == 0, held == 0) {
            (true, false) => {
                self.budget.ahead.fetch_add(1, Ordering::SeqCst);
            }
            (false, true) => {
                self.budget.ahead.fetch_sub(1, Ordering::SeqCst);
            }
            _ => {}
        }
        self.held = held;
    }
}

impl Drop for BudgetShare {
    fn drop(&mut self) {
        self.sync(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: usize = GUARANTEED_OUTPUT_BYTES;
    const CHUNK: usize = MAX_CHUNK_BYTES + EVENT_OVERHEAD_BYTES;

    #[test]
    fn the_guaranteed_share_is_admitted_whatever_the_total() {
        // Exactly the guarantee, with the budget long spent.
        assert_eq!(admission(0, G, usize::MAX / 2, 1000, 1), Ok(()));
        assert_eq!(admission(G - 1, 1, usize::MAX / 2, 1000, 1), Ok(()));
        // One byte more is no longer guaranteed.
        assert_eq!(
            admission(G, 1, usize::MAX / 2, 1000, 1),
            Err(Blocked::FairShare)
        );
    }

    #[test]
    fn the_budget_is_checked_at_its_edge() {
        let limit = 10 * G;
        // A process alone: its fair share is the whole budget.
        assert_eq!(admission(G, 100, limit - 100, 1, limit), Ok(()));
        assert_eq!(
            admission(G, 100, limit - 99, 1, limit),
            Err(Blocked::Budget)
        );
    }

    #[test]
    fn the_fair_share_divides_the_budget_among_those_ahead() {
        let limit = 100 * G;
        assert_eq!(fair_share(limit, 0), limit);
        assert_eq!(fair_share(limit, 1), limit);
        assert_eq!(fair_share(limit, 4), 25 * G);
        // Never below the guarantee, however many are ahead.
        assert_eq!(fair_share(limit, 1_000_000), G);
        // At the fair share's edge, with room in the budget.
        assert_eq!(admission(25 * G - 7, 7, 0, 4, limit), Ok(()));
        assert_eq!(
            admission(25 * G - 6, 7, 0, 4, limit),
            Err(Blocked::FairShare)
        );
    }

    #[test]
    fn a_share_follows_its_log_and_gives_everything_back() {
        let budget = OutputBudget::new(4 * G);
        let mut a = budget.share();
        let mut b = budget.share();
        a.admit(CHUNK).unwrap();
        assert_eq!((budget.unwritten(), budget.ahead()), (CHUNK, 1));
        b.sync(64); // an exit notice
        assert_eq!((budget.unwritten(), budget.ahead()), (CHUNK + 64, 2));
        a.sync(0); // written
        assert_eq!((budget.unwritten(), budget.ahead()), (64, 1));
        b.sync(3 * CHUNK); // a resume made retained events unwritten again
        assert_eq!(budget.unwritten(), 3 * CHUNK);
        drop(b);
        assert_eq!((budget.unwritten(), budget.ahead()), (0, 0));
        assert_eq!(budget.peak(), 3 * CHUNK);
    }

    /// A budget of four chunks: a process alone may take it all, a second one still gets its
    /// guarantee (past the budget), then a chunk within its fair share waits for the budget,
    /// and one beyond its fair share waits for its own writes.
    #[test]
    fn chunks_beyond_the_guarantee_stop_at_the_budget() {
        let budget = OutputBudget::new(4 * CHUNK);
        let mut a = budget.share();
        let mut b = budget.share();
        for _ in 0..4 {
            a.admit(CHUNK).unwrap(); // alone: its fair share is the whole budget
        }
        // Alone, its fair share is the budget: one byte more is beyond both.
        assert_eq!(a.admit(1), Err(Blocked::FairShare));
        a.sync(3 * CHUNK); // one chunk written
        b.admit(CHUNK).unwrap(); // b's guarantee
        assert_eq!(budget.unwritten(), 4 * CHUNK);
        assert_eq!(
            b.admit(CHUNK),
            Err(Blocked::Budget),
            "within b's fair share"
        );
        assert_eq!(
            a.admit(1),
            Err(Blocked::FairShare),
            "a holds more than half"
        );
        a.sync(CHUNK); // two more of a's chunks written
        b.admit(CHUNK).unwrap();
        assert_eq!(b.admit(1), Err(Blocked::FairShare));
        assert_eq!(budget.unwritten(), 3 * CHUNK);
        assert_eq!(budget.peak(), 4 * CHUNK);
    }

    /// Many processes against a small budget: every one gets its guaranteed chunk, none gets
    /// more than its fair share, and the total stays within the bound
    /// `limit + ahead × guarantee`.
    #[test]
    fn many_processes_stay_within_the_bound() {
        let limit = 8 * CHUNK;
        let budget = OutputBudget::new(limit);
        let mut shares: Vec<BudgetShare> = (0..1000).map(|_| budget.share()).collect();
        // Every process tries to take ten chunks, round after round.
        for _ in 0..10 {
            for s in shares.iter_mut() {
                let _ = s.admit(CHUNK);
            }
        }
        assert!(
            shares.iter().all(|s| s.held() >= CHUNK),
            "every one progressed"
        );
        assert!(budget.unwritten() <= limit + budget.ahead() * G);
        assert!(budget.peak() <= limit + 1000 * G);
        // Three chatty processes whose clients keep up, and the rest stuck: the chatty ones
        // are held to their share of the room, the others keep their guarantee.
        for s in shares.iter_mut().skip(3) {
            s.sync(CHUNK);
        }
        for s in shares.iter_mut().take(3) {
            s.sync(0);
        }
        for s in shares.iter_mut().take(3) {
            let _ = s.admit(CHUNK);
            assert_eq!(s.admit(CHUNK), Err(Blocked::FairShare));
        }
    }

    /// A release wakes one waiting pump; nobody waiting, nothing is stored for later.
    #[tokio::test]
    async fn a_release_wakes_one_waiter() {
        let budget = OutputBudget::new(CHUNK);
        let mut a = budget.share();
        a.admit(CHUNK).unwrap();
        // Nobody waits: the release stores no wake-up.
        a.sync(0);
        {
            let idle = budget.room_released();
            tokio::pin!(idle);
            assert!(futures_util::poll!(idle.as_mut()).is_pending());
        }
        a.admit(CHUNK).unwrap();
        let _guard = budget.begin_wait();
        let first = budget.room_released();
        let second = budget.room_released();
        tokio::pin!(first);
        tokio::pin!(second);
        first.as_mut().enable();
        second.as_mut().enable();
        a.sync(0);
        assert!(
            futures_util::poll!(first.as_mut()).is_ready(),
            "the first waiter"
        );
        assert!(
            futures_util::poll!(second.as_mut()).is_pending(),
            "only one"
        );
        budget.wake_one();
        assert!(futures_util::poll!(second.as_mut()).is_ready(), "passed on");
    }
}
