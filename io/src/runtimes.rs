//! Link runtimes: several single-threaded tokio runtimes, each on a thread of its own, among
//! which a listener spreads its accepted connections ([`crate::http::serve_spread`]): each
//! connection goes to the runtime that runs the fewest tasks, or after its upgrade to the one
//! its caller names as its home ([`LinkRuntimes::place_on`]), and it and every task it spawns
//! (a link's reader and writer) stay there for its whole life.
//!
//! Why not tokio's multi-threaded runtime: there, a task made runnable by another one wakes an
//! idle worker thread to steal it (a futex wake, a context switch, and often the task moving
//! to a cold cache), which for a relay, where every frame read wakes a writer, was a tenth of
//! its CPU. A single-threaded runtime wakes nobody for a task it runs itself; tasks that wake
//! each other all the time (a relay's route) belong on one runtime, which is what a home is
//! for; links on different runtimes still reach each other (wakers work across runtimes), and
//! with one runtime per core the links of a busy relay are spread over every core.
//!
//! # What this module owns
//!
//! - The threads and their runtimes, from [`LinkRuntimes::start`] to [`LinkRuntimes::shutdown`]
//!   (or the last handle's drop, which stops them without waiting).
//! - The placement rule (fewest alive tasks; ties go round robin) and its figures.
//!
//! # What it must never do
//!
//! - Stop a runtime before its caller has ended the links on it: a stopped runtime drops its
//!   tasks unfinished. The caller's shutdown closes links first, then calls
//!   [`LinkRuntimes::shutdown`].
//! - Block on one of its own threads (shutdown refuses to join the thread it is called from).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::runtime::{Builder, Handle};
use tokio_util::sync::CancellationToken;

/// The most link runtimes (threads) a process may ask for: far above any core count this
/// software meets, low enough that a typo (`--runtime-threads 100000`) is refused rather than
/// spawning a hundred thousand threads.
pub const MAX_RUNTIME_THREADS: usize = 256;

/// How long a stopping runtime gives its remaining tasks (those its caller did not end, or
/// their blocking work) before its thread exits anyway.
pub const RUNTIME_STOP_TIMEOUT: Duration = Duration::from_secs(1);

/// How many runtimes "one per core" means here: the CPUs this process may run on (cgroup
/// quota and affinity included, as `std::thread::available_parallelism` reads them), 1 if
/// that cannot be read, at most [`MAX_RUNTIME_THREADS`].
pub fn available_cores() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, MAX_RUNTIME_THREADS)
}

thread_local! {
    /// On a link runtime's thread: its index in its set.
    static CURRENT: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// The index of the link runtime the caller runs on, or `None` off every link runtime. (A
/// process runs one set of link runtimes; the index is within it.)
pub fn current_index() -> Option<usize> {
    CURRENT.with(std::cell::Cell::get)
}

/// A runtime count outside `1..=MAX_RUNTIME_THREADS`.
#[derive(Debug, thiserror::Error)]
#[error("{0} link runtimes: expected 1 to {MAX_RUNTIME_THREADS}")]
pub struct BadRuntimeCount(pub usize);

/// One runtime of the set.
struct Member {
    handle: Handle,
    /// Connections placed on it since the start.
    placed: AtomicU64,
}

struct Inner {
    members: Vec<Member>,
    /// Where the next tie is broken from.
    next: AtomicUsize,
    stop: CancellationToken,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Never a join here: the last handle may be dropped on one of the threads.
        self.stop.cancel();
    }
}

/// The link runtimes (cheap to clone: every clone is the same set).
#[derive(Clone)]
pub struct LinkRuntimes {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for LinkRuntimes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkRuntimes")
            .field("runtimes", &self.inner.members.len())
            .finish()
    }
}

/// One runtime's figures ([`LinkRuntimes::figures`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuntimeFigures {
    /// Tasks alive on it now (a link is two: its reader and its writer).
    pub alive_tasks: usize,
    /// Connections placed on it since the start: at accept, or moved there after their
    /// upgrade ([`LinkRuntimes::place_on`]).
    pub connections_placed: u64,
}

/// Why the runtimes could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The count is out of bounds.
    #[error(transparent)]
    Count(#[from] BadRuntimeCount),
    /// The OS refused a thread, or tokio its runtime.
    #[error("cannot start link runtime {index}: {error}")]
    Io {
        /// Which runtime.
        index: usize,
        /// The OS's error.
        error: std::io::Error,
    },
}

impl LinkRuntimes {
    /// Start `count` runtimes, each on a thread named `{name}-{i}`, each with its I/O driver
    /// and timer; they run until [`shutdown`](Self::shutdown) or the last clone's drop.
    pub fn start(count: usize, name: &str) -> Result<LinkRuntimes, StartError> {
        if !(1..=MAX_RUNTIME_THREADS).contains(&count) {
            return Err(BadRuntimeCount(count).into());
        }
        let stop = CancellationToken::new();
        let mut members = Vec::with_capacity(count);
        let mut threads = Vec::with_capacity(count);
        let started = (0..count).try_for_each(|index| {
            let (tx, rx) = std::sync::mpsc::channel();
            let thread_stop = stop.clone();
            // The runtime is built, run and dropped on its own thread: never dropped inside
            // the caller's runtime, which tokio forbids.
            let thread = std::thread::Builder::new()
                .name(format!("{name}-{index}"))
                .spawn(move || {
                    CURRENT.with(|c| c.set(Some(index)));
                    let rt = match Builder::new_current_thread().enable_all().build() {
                        Ok(rt) => rt,
                        Err(e) => {
                            let _ = tx.send(Err(e));
                            return;
                        }
                    };
                    let _ = tx.send(Ok(rt.handle().clone()));
                    rt.block_on(thread_stop.cancelled());
                    rt.shutdown_timeout(RUNTIME_STOP_TIMEOUT);
                })
                .map_err(|error| StartError::Io { index, error })?;
            threads.push(thread);
            let handle = rx
                .recv()
                .map_err(|_| StartError::Io {
                    index,
                    error: std::io::Error::other("the runtime's thread ended at its start"),
                })?
                .map_err(|error| StartError::Io { index, error })?;
            members.push(Member {
                handle,
                placed: AtomicU64::new(0),
            });
            Ok(())
        });
        if let Err(e) = started {
            // Those already started stop on their own.
            stop.cancel();
            return Err(e);
        }
        Ok(LinkRuntimes {
            inner: Arc::new(Inner {
                members,
                next: AtomicUsize::new(0),
                stop,
                threads: Mutex::new(threads),
            }),
        })
    }

    /// How many runtimes the set has.
    pub fn len(&self) -> usize {
        self.inner.members.len()
    }

    /// Never: a set has at least one runtime (for clippy's `len_without_is_empty`).
    pub fn is_empty(&self) -> bool {
        self.inner.members.is_empty()
    }

    /// The runtime for a new connection: the one with the fewest alive tasks, ties broken
    /// round robin (so an idle relay's first connections go to different runtimes); its
    /// index and handle. Counted as placed there.
    pub fn place(&self) -> (usize, Handle) {
        let members = &self.inner.members;
        let start = self.inner.next.fetch_add(1, Ordering::Relaxed) % members.len();
        let mut best = start;
        let mut fewest = usize::MAX;
        for offset in 0..members.len() {
            let i = (start + offset) % members.len();
            let alive = members[i].handle.metrics().num_alive_tasks();
            if alive < fewest {
                (best, fewest) = (i, alive);
            }
        }
        members[best].placed.fetch_add(1, Ordering::Relaxed);
        (best, members[best].handle.clone())
    }

    /// Runtime `index`'s handle, counted as placed there (a connection moved to its route's
    /// home); `None` if there is no such runtime.
    pub fn place_on(&self, index: usize) -> Option<Handle> {
        let member = self.inner.members.get(index)?;
        member.placed.fetch_add(1, Ordering::Relaxed);
        Some(member.handle.clone())
    }

    /// Each runtime's figures, in order.
    pub fn figures(&self) -> Vec<RuntimeFigures> {
        self.inner
            .members
            .iter()
            .map(|m| RuntimeFigures {
                alive_tasks: m.handle.metrics().num_alive_tasks(),
                connections_placed: m.placed.load(Ordering::Relaxed),
            })
            .collect()
    }

    /// Stop every runtime (each gives what still runs on it [`RUNTIME_STOP_TIMEOUT`]) and wait
    /// for their threads. Call it once the links on them have ended, from outside them (from
    /// one of them it only asks them to stop). Idempotent.
    pub fn shutdown(&self) {
        self.inner.stop.cancel();
        let threads = std::mem::take(&mut *execrelay_protocol::sync::lock(&self.inner.threads));
        let me = std::thread::current().id();
        for t in threads {
            if t.thread().id() != me {
                let _ = t.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_outside_the_bounds_are_refused() {
        for bad in [0, MAX_RUNTIME_THREADS + 1] {
            let e = LinkRuntimes::start(bad, "t").unwrap_err();
            assert!(matches!(e, StartError::Count(BadRuntimeCount(n)) if n == bad));
            assert!(e
                .to_string()
                .contains(&format!("expected 1 to {MAX_RUNTIME_THREADS}")));
        }
    }

    #[test]
    fn placement_spreads_then_follows_the_load() {
        let rts = LinkRuntimes::start(3, "place-test").unwrap();
        // Three idle runtimes: three different ones, by the round robin of ties.
        let first: Vec<usize> = (0..3).map(|_| rts.place().0).collect();
        let mut sorted = first.clone();
        sorted.sort();
        assert_eq!(sorted, vec![0, 1, 2]);
        // Load runtime 1 with a task that waits; new connections avoid it.
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let handle = rts.inner.members[1].handle.clone();
        let task = handle.spawn(async move {
            let _ = rx.await;
        });
        assert_eq!(rts.figures()[1].alive_tasks, 1);
        for _ in 0..6 {
            assert_ne!(rts.place().0, 1);
        }
        let placed: Vec<u64> = rts.figures().iter().map(|f| f.connections_placed).collect();
        assert_eq!(placed.iter().sum::<u64>(), 9);
        assert_eq!(placed[1], 1);
        // Threads carry the set's name.
        let (ntx, nrx) = std::sync::mpsc::channel();
        handle.spawn(async move {
            let _ = ntx.send(std::thread::current().name().map(String::from));
        });
        assert_eq!(nrx.recv().unwrap().as_deref(), Some("place-test-1"));
        // Each thread knows its index; other threads have none.
        let (itx, irx) = std::sync::mpsc::channel();
        rts.place_on(2).unwrap().spawn(async move {
            let _ = itx.send(current_index());
        });
        assert_eq!(irx.recv().unwrap(), Some(2));
        // Placed by hand (a connection moved to its home): counted there.
        assert_eq!(rts.figures()[2].connections_placed, placed[2] + 1);
        assert_eq!(current_index(), None);
        assert!(rts.place_on(3).is_none());
        let _ = tx.send(());
        rts.shutdown();
        drop(task);
    }

    #[test]
    fn shutdown_stops_every_thread_and_drops_what_still_runs() {
        let rts = LinkRuntimes::start(2, "stop-test").unwrap();
        let (dropped_tx, dropped_rx) = std::sync::mpsc::channel::<()>();
        struct Tell(std::sync::mpsc::Sender<()>);
        impl Drop for Tell {
            fn drop(&mut self) {
                let _ = self.0.send(());
            }
        }
        for i in 0..2 {
            let tell = Tell(dropped_tx.clone());
            rts.inner.members[i].handle.spawn(async move {
                let _tell = tell;
                std::future::pending::<()>().await;
            });
        }
        drop(dropped_tx);
        rts.shutdown();
        // Both pending tasks were dropped: the channel is closed after two drops.
        assert_eq!(dropped_rx.iter().count(), 2);
        assert!(rts.inner.threads.lock().unwrap().is_empty());
        // Again: nothing to do.
        rts.shutdown();
    }
}
