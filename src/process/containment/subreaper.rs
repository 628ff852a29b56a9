//! The server as a child subreaper: orphaned descendants come back to it, and it reaps them
//! without ever stealing the exit status of a child the supervisor waits for.
//!
//! # What it owns
//!
//! - `PR_SET_CHILD_SUBREAPER` for the server ([`start_reaper`]): a process whose parent dies is
//!   re-parented to the closest subreaper ancestor instead of init, so nothing a session
//!   started can leave the server's process tree while the server lives (unless a process
//!   *inside* the tree is itself a subreaper: then orphans stop there, still inside the tree).
//! - The process-wide **registry of direct children**: every child `spawn.rs` starts, with the
//!   pidfd opened right after the fork, registered before the reaper can look.
//! - The **reaper thread**: [`REAPER_COALESCE`] after a `SIGCHLD` (and every
//!   [`REAPER_RESCAN_INTERVAL`] as a safety net) it lists the server's children and reaps
//!   those that are zombies and not registered direct children.
//!
//! It must never reap a registered direct child (its supervisor's `DirectChild::wait` must
//! see its status) unless the child's owner abandoned it,
//! never call `waitpid(-1)` / `waitid(P_ALL)`, and never reap a process it has not identified
//! through a pidfd.
//!
//! # Race analysis
//!
//! The danger is reaping a direct child before the supervisor does: its `DirectChild::wait`
//! would fail with `ECHILD` and the exit status would be lost.
//!
//! 1. **Fork vs. scan.** A direct child exists as our child from `fork` on, but is registered
//!    only after the clone returns. `spawn` holds the *fork gate* (a read lock) from
//!    before the clone until the child is registered; a reaper pass holds it for writing
//!    for its whole duration. So a pass sees every child either registered, or not yet
//!    forked: never forked-but-unregistered. Spawns run concurrently with each other.
//! 2. **No reap before the pidfd.** The pidfd comes from the clone itself (`CLONE_PIDFD`),
//!    so it is the child's, never a successor's.
//! 3. **Registered means unreaped.** A registry entry is trusted only while its pidfd says the
//!    process is unreaped (signal 0 succeeds): an unreaped process pins its pid, so a child
//!    listed under that pid *is* the registered one. After the supervisor reaped it the
//!    entry is stale and pruned, and a later process that reuses the number (possibly an
//!    adopted orphan) is treated on its own merits.
//!    A pass after a `SIGCHLD` prunes by the entry's reap flag (set under the reap gate by
//!    `DirectChild::wait`, the one reap path) rather than asking every registered child's
//!    pidfd: with a thousand children running, that was a thousand system calls per exit.
//!    The periodic pass asks each pidfd, so an entry whose child was reaped behind its back
//!    (by a foreign `waitpid(-1)`, see 5.) is pruned within [`REAPER_RESCAN_INTERVAL`]; until
//!    then an orphan that reused its number is only left a zombie, never reaped wrongly.
//! 4. **Reaping by identity.** For each unregistered child the pass opens a pidfd, reads
//!    `/proc/<pid>/stat` (parent, session), checks the pidfd is still unreaped (so the stat
//!    was this process's), and reaps with `waitid(P_PIDFD, …, WEXITED | WNOHANG)`: only that
//!    process, only if it has exited, only if it is our child.
//! 5. **Children forked outside `spawn.rs`.** The server forks nowhere else, but a test binary
//!    or an embedding program might. Every `spawn.rs` child calls `setsid`, so every process a
//!    session started has a session id different from the server's; the pass never reaps a
//!    child in the server's own session. A foreign child that itself calls `setsid` is not
//!    protected: in a process that runs the reaper, fork only through `spawn.rs` (or register
//!    the child with [`ForkGuard::register`]).
//!
//! Why not `waitid(P_ALL, WNOWAIT)` to peek: it returns one arbitrary waitable child, and a
//! zombie direct child that the supervisor has not reaped yet would hide every other zombie
//! behind it; listing children and reaping each by pidfd has no such head-of-line problem.

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, OnceLock, RwLock, RwLockReadGuard};
use std::time::Duration;

use super::direct_child::DirectChild;
use super::pidfd::Pidfd;
use super::{procfs, sys};
use crate::sync::{lock, read, write};

/// The reaper rescans the server's children at least this often even without `SIGCHLD`.
/// Signals coalesce and a scan covers everything, so this only matters if a `SIGCHLD` was
/// consumed before the reaper's handler existed; one second keeps a missed zombie short-lived
/// at the cost of one `/proc` listing per second.
pub const REAPER_RESCAN_INTERVAL: Duration = Duration::from_secs(1);

/// After a `SIGCHLD` the reaper waits this long before its pass. Nearly every `SIGCHLD` is a
/// direct child's exit, which its supervisor reaps; passing at once made every exit cost a
/// pass (a `/proc` listing of all the server's children, under the exclusive fork gate that
/// holds back every spawn meanwhile) run on a second thread at the very moment the
/// supervisor reports the exit. Waiting lets a burst of exits (a fan-in of a thousand
/// processes) share one pass, and keeps the pass off the exec's critical path. An orphan
/// stays a zombie at most this much longer; exits during the wait are covered by the pass
/// (signals coalesce, and the pass lists everything).
pub const REAPER_COALESCE: Duration = Duration::from_millis(100);

struct Registry {
    /// Read: a spawn between fork and registration. Write: a reaper pass.
    fork_gate: RwLock<()>,
    children: Mutex<HashMap<u32, Arc<DirectChild>>>,
    /// Registry size after the last pruning; the next registration prunes again once the
    /// registry has doubled, so pruning stays amortised O(1) per spawn even when no reaper
    /// runs (each entry holds a descriptor).
    pruned_len: Mutex<usize>,
}

static REGISTRY: LazyLock<Registry> = LazyLock::new(|| Registry {
    fork_gate: RwLock::new(()),
    children: Mutex::new(HashMap::new()),
    pruned_len: Mutex::new(0),
});

/// Orphans reaped by this process (all passes).
static ORPHANS_REAPED: AtomicU64 = AtomicU64::new(0);

/// Held by `spawn.rs` from before the fork until the child is registered: no reaper pass runs
/// meanwhile.
pub struct ForkGuard {
    _gate: RwLockReadGuard<'static, ()>,
}

/// Hold the fork gate exclusively: while held, no spawn is between its fork and its
/// registration (nor starts one), so every child of the server is either a registered direct
/// child or not one of ours. A reaper pass holds it; so does the tree part of
/// `Containment::kill_everything`, which must not take another containment's child in the
/// instant after its `setsid` and before its registration for an unattributed process.
pub(crate) fn fork_exclusive() -> std::sync::RwLockWriteGuard<'static, ()> {
    write(&REGISTRY.fork_gate)
}

/// Take the fork gate (shared between spawns; excludes reaper passes).
pub fn fork_guard() -> ForkGuard {
    ForkGuard {
        _gate: read(&REGISTRY.fork_gate),
    }
}

impl ForkGuard {
    /// Register a direct child; its exit status is then left to its owner.
    pub fn register(&self, child: Arc<DirectChild>) {
        let len = {
            let mut map = lock(&REGISTRY.children);
            map.insert(child.pid(), child);
            map.len()
        };
        let mut pruned = lock(&REGISTRY.pruned_len);
        if len >= (*pruned * 2).max(64) {
            let mut map = lock(&REGISTRY.children);
            map.retain(|_, c| !c.is_reaped());
            *pruned = map.len();
        }
    }
}

/// The registered, still unreaped direct child with this pid, if any.
pub fn direct_child(pid: u32) -> Option<Arc<DirectChild>> {
    lock(&REGISTRY.children)
        .get(&pid)
        .filter(|c| !c.is_reaped())
        .cloned()
}

/// How many orphans this process has reaped.
pub fn orphans_reaped() -> u64 {
    ORPHANS_REAPED.load(Ordering::Relaxed)
}

/// One reaper pass: reap every exited child of the server that is not a registered direct
/// child and not in the server's own session. Returns how many were reaped.
pub fn reap_orphans() -> io::Result<usize> {
    reap_orphans_with(Prune::AskEachPidfd)
}

/// How a pass tells a stale registry entry (its child reaped, its number free for another
/// process) from a live one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Prune {
    /// By the entry's own reap flag, set by [`DirectChild::wait`] (the one reap path): no
    /// system call per registered child. A child reaped behind its `DirectChild`'s back (a
    /// foreign `waitpid(-1)`, which the module docs rule out) stays registered until the
    /// next [`AskEachPidfd`](Prune::AskEachPidfd) pass: at worst an orphan that reused its
    /// number stays a zombie that long, and nothing is ever reaped that should not be.
    ReapFlag,
    /// Ask each entry's pidfd too (one `pidfd_send_signal(0)` per registered child): the
    /// periodic pass, and [`reap_orphans`].
    AskEachPidfd,
}

fn reap_orphans_with(prune: Prune) -> io::Result<usize> {
    let _gate = fork_exclusive();
    let me = std::process::id();
    let own_sid = sys::own_session_id();
    let kids = procfs::children(me)?;
    let mut map = lock(&REGISTRY.children);
    match prune {
        Prune::ReapFlag => map.retain(|_, c| !c.reaped_through_wait()),
        Prune::AskEachPidfd => map.retain(|_, c| !c.is_reaped()),
    }
    let mut reaped = 0;
    for pid in kids {
        if let Some(child) = map.get(&pid) {
            // A direct child whose owner will never wait: reap it through its own gate.
            if child.is_abandoned() && matches!(child.try_wait(), Ok(Some(_))) {
                reaped += 1;
            }
            continue;
        }
        let Ok(fd) = Pidfd::open(pid) else { continue };
        let Ok(st) = procfs::read_stat(pid) else {
            continue;
        };
        if st.ppid != me || st.sid == own_sid || !st.is_dead() || !fd.is_unreaped() {
            continue;
        }
        match fd.try_reap() {
            Ok(true) => reaped += 1,
            Ok(false) => {}
            Err(e) => tracing::debug!(pid, error = %e, "reaping an orphan failed"),
        }
    }
    ORPHANS_REAPED.fetch_add(reaped as u64, Ordering::Relaxed);
    Ok(reaped)
}

static REAPER: OnceLock<io::Result<()>> = OnceLock::new();

/// Make the server a child subreaper and start the reaper thread (once per process; later
/// calls return the first call's outcome).
///
/// Call it at server start, before the first spawn, and only in a process that forks through
/// `spawn.rs` alone (see the race analysis above).
pub fn start_reaper() -> io::Result<()> {
    let r = REAPER.get_or_init(|| {
        sys::set_child_subreaper()?;
        std::thread::Builder::new()
            .name("execrelay-reaper".into())
            .spawn(reaper_thread)?;
        Ok(())
    });
    match r {
        Ok(()) => Ok(()),
        Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
    }
}

/// Whether this process is a child subreaper.
pub fn is_subreaper() -> io::Result<bool> {
    sys::is_child_subreaper()
}

/// The reaper: its own thread with a one-thread runtime, so that it outlives any particular
/// runtime of the program (tests create one per test) and never competes with request tasks.
fn reaper_thread() {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "the reaper cannot start; orphans stay zombies");
            return;
        }
    };
    rt.block_on(async {
        let mut sigchld =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child()) {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::error!(error = %e, "no SIGCHLD handler; the reaper polls");
                    None
                }
            };
        let mut prune = Prune::AskEachPidfd;
        loop {
            match reap_orphans_with(prune) {
                Ok(0) => {}
                Ok(n) => tracing::debug!(reaped = n, "reaped orphans"),
                Err(e) => tracing::warn!(error = %e, "reaper pass failed"),
            }
            let tick = tokio::time::sleep(REAPER_RESCAN_INTERVAL);
            prune = match sigchld.as_mut() {
                Some(s) => {
                    tokio::select! {
                        _ = s.recv() => {
                            // Asleep outside the runtime, not in it: every runtime's signal
                            // driver watches tokio's one signal pipe, so a thread parked in
                            // this runtime would be woken by each `SIGCHLD` of the burst it
                            // is waiting out (a context switch per exit, beside the
                            // supervisor's, on the cores the exits compete for). Nothing else
                            // runs on this thread; what arrives meanwhile stays recorded and
                            // the next `recv` sees it at once.
                            std::thread::sleep(REAPER_COALESCE);
                            Prune::ReapFlag
                        }
                        _ = tick => Prune::AskEachPidfd,
                    }
                }
                None => {
                    tick.await;
                    Prune::AskEachPidfd
                }
            };
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::spawn::{spawn, SpawnSpec};
    use nix::sys::signal::Signal;
    use std::os::unix::process::ExitStatusExt;

    fn spec(argv: &[&str]) -> SpawnSpec {
        SpawnSpec::command(argv)
    }

    fn registered(child: &Arc<DirectChild>) -> bool {
        lock(&REGISTRY.children)
            .get(&child.pid())
            .is_some_and(|c| Arc::ptr_eq(c, child))
    }

    /// The pass a `SIGCHLD` triggers prunes by the reap flag alone: a child its supervisor
    /// reaped leaves the registry, one still running or an unreaped zombie stays, and the
    /// zombie's status is left to its own wait.
    #[tokio::test]
    async fn a_pass_by_the_reap_flag_prunes_the_reaped_and_leaves_the_zombie_to_its_wait() {
        let done = spawn(&spec(&["true"])).expect("spawn true");
        let running = spawn(&spec(&["sleep", "1000"])).expect("spawn sleep");
        let mut done_child = done.child;
        let status = tokio::time::timeout(Duration::from_secs(60), done_child.wait())
            .await
            .expect("hang guard")
            .expect("wait");
        assert_eq!(status.code(), Some(0));
        assert!(
            registered(&done.direct),
            "registered until a pass prunes it"
        );
        assert!(registered(&running.direct));

        reap_orphans_with(Prune::ReapFlag).expect("pass");
        assert!(!registered(&done.direct), "reaped through its wait: pruned");
        assert!(registered(&running.direct), "running: still registered");

        // Killed and not yet waited for: a zombie the pass must leave alone.
        running.direct.signal(Signal::SIGKILL).expect("kill");
        tokio::time::timeout(Duration::from_secs(60), running.direct.pidfd().exited())
            .await
            .expect("hang guard")
            .expect("exited");
        reap_orphans_with(Prune::ReapFlag).expect("pass");
        assert!(
            registered(&running.direct),
            "an unreaped zombie stays registered"
        );
        let mut running_child = running.child;
        let status = running_child.wait().await.expect("its status is its own");
        assert_eq!(status.signal(), Some(libc::SIGKILL));
    }
}
