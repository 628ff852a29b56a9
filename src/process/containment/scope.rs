//! [`SessionScope`]: the processes of one session — a cgroup (v2, or v1 `freezer` + `pids`),
//! or with the `none` backend the session's part of the server's process tree — and the
//! [`Placement`] `spawn.rs` uses to put a child into it before exec.
//!
//! A scope never outlives its [`Containment`](super::Containment)'s shared state and never
//! signals anything but verified members by pidfd.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::cgroup::{self, Cgroup, Hierarchy};
use super::tree::{self, Owner};
use super::{
    lock, procfs, sys, ContainmentError, Delivery, DirectChild, KillReport, Pidfd, ScopeId, Shared,
    KILL_WAIT_TIMEOUT,
};

pub(super) enum ScopeCgroups {
    V2 {
        cg: Cgroup,
        kill_file: bool,
    },
    V1 {
        freezer: Cgroup,
        pids: Option<Cgroup>,
    },
    None,
}

#[derive(Default)]
pub(super) struct ScopeState {
    /// No more placements: the scope is being killed or was removed.
    closed: bool,
}

/// The processes of one session: a cgroup (or, with `none`, the session's part of the
/// server's process tree).
pub struct SessionScope {
    id: ScopeId,
    shared: Arc<Shared>,
    cgroups: ScopeCgroups,
    state: Mutex<ScopeState>,
}

/// A placement in progress: holds the scope's lock from before the fork until the child is
/// recorded, and the `cgroup.procs` descriptors the child writes itself into.
pub struct Placement<'a> {
    scope: &'a SessionScope,
    _state: MutexGuard<'a, ScopeState>,
    fds: Vec<OwnedFd>,
}

/// Most `cgroup.procs` descriptors one placement uses (v1: `freezer` and `pids`).
pub const MAX_PLACEMENT_FDS: usize = 2;

/// First and longest pause between two looks at a scope while [`SessionScope::wait_empty`]
/// waits for its processes to end after SIGTERM (no backend notifies: v1 has no event file,
/// and the `none` backend is a `/proc` walk). Short at first, because most processes die at
/// once on SIGTERM; then at most ten looks a second for one that takes its grace.
pub const EMPTY_POLL_BACKOFF: (Duration, Duration) =
    (Duration::from_millis(5), Duration::from_millis(100));

impl Placement<'_> {
    /// The descriptors the child must write `"0"` to, padded with -1.
    pub fn child_fds(&self) -> [RawFd; MAX_PLACEMENT_FDS] {
        let mut out = [-1; MAX_PLACEMENT_FDS];
        for (o, fd) in out.iter_mut().zip(&self.fds) {
            *o = fd.as_raw_fd();
        }
        out
    }

    /// The scope.
    pub fn scope_id(&self) -> ScopeId {
        self.scope.id
    }

    /// The child was spawned: record its session for attribution.
    pub fn placed(self, child: &DirectChild) {
        self.scope.shared.record_session(child.pid(), self.scope.id);
    }
}

/// Run in the child between fork and exec: write `"0"` to each placement descriptor.
/// Async-signal-safe.
pub(crate) fn enter_in_child(fds: &[RawFd; MAX_PLACEMENT_FDS]) -> std::io::Result<()> {
    for &fd in fds {
        if fd >= 0 {
            sys::write_in_child(fd, b"0")?;
        }
    }
    Ok(())
}

impl SessionScope {
    pub(super) fn new(id: ScopeId, shared: Arc<Shared>, cgroups: ScopeCgroups) -> Arc<Self> {
        Arc::new(SessionScope {
            id,
            shared,
            cgroups,
            state: Mutex::new(ScopeState::default()),
        })
    }

    /// No more placements.
    pub(super) fn close(&self) {
        lock(&self.state).closed = true;
    }

    /// This scope's id.
    pub fn id(&self) -> ScopeId {
        self.id
    }

    /// The scope's cgroup directories (empty for `none`).
    pub fn cgroup_dirs(&self) -> Vec<PathBuf> {
        match &self.cgroups {
            ScopeCgroups::V2 { cg, .. } => vec![cg.dir.clone()],
            ScopeCgroups::V1 { freezer, pids } => {
                let mut v = vec![freezer.dir.clone()];
                v.extend(pids.iter().map(|p| p.dir.clone()));
                v
            }
            ScopeCgroups::None => Vec::new(),
        }
    }

    /// How many processes of the scope the kernel's OOM killer has killed so far: `oom_kill`
    /// of the session cgroup's `memory.events` (cgroup v2 with the memory controller enabled
    /// for it). `None` where it cannot be known: cgroup v1 (its sessions have no memory
    /// cgroup), the `none` backend, or a v2 tree without the memory controller.
    pub fn oom_kills(&self) -> Option<u64> {
        match &self.cgroups {
            ScopeCgroups::V2 { cg, .. } => {
                cgroup::events_field(&cg.read("memory.events").ok()?, "oom_kill")
            }
            ScopeCgroups::V1 { .. } | ScopeCgroups::None => None,
        }
    }

    /// Begin placing a child (called by `spawn.rs` before it forks). Fails once the scope
    /// was killed or removed.
    pub fn begin_placement(&self) -> Result<Placement<'_>, ContainmentError> {
        let state = lock(&self.state);
        if state.closed {
            return Err(ContainmentError::ScopeClosed);
        }
        let fds = match &self.cgroups {
            ScopeCgroups::V2 { cg, .. } => vec![cg.open_procs()?],
            ScopeCgroups::V1 { freezer, pids } => {
                let mut v = vec![freezer.open_procs()?];
                if let Some(p) = pids {
                    v.push(p.open_procs()?);
                }
                v
            }
            ScopeCgroups::None => Vec::new(),
        };
        Ok(Placement {
            scope: self,
            _state: state,
            fds,
        })
    }

    /// Close the scope to new processes, SIGKILL everything in it, and wait (at most
    /// [`KILL_WAIT_TIMEOUT`]) until nothing is left alive.
    pub async fn kill_all(self: &Arc<Self>) -> Result<KillReport, ContainmentError> {
        lock(&self.state).closed = true;
        let me = self.clone();
        tokio::task::spawn_blocking(move || {
            me.kill_all_blocking(Instant::now() + KILL_WAIT_TIMEOUT)
        })
        .await
        .map_err(|e| ContainmentError::Io(std::io::Error::other(e.to_string())))?
    }

    fn kill_all_blocking(&self, deadline: Instant) -> Result<KillReport, ContainmentError> {
        let mut report = KillReport {
            emptied: true,
            ..KillReport::default()
        };
        match &self.cgroups {
            // Removed already (by `Containment::kill_everything`, or an earlier kill and
            // remove): nothing can be in it.
            ScopeCgroups::V2 { cg, .. } | ScopeCgroups::V1 { freezer: cg, .. } if !cg.exists() => {}
            ScopeCgroups::V2 { cg, kill_file } => {
                report.add_cgroup(cgroup::kill_v2(cg, *kill_file, deadline)?)
            }
            ScopeCgroups::V1 { freezer, .. } => {
                report.add_cgroup(cgroup::kill_v1(freezer, deadline)?)
            }
            ScopeCgroups::None => {
                let id = self.id;
                let t = tree::kill(
                    &|| self.shared.sessions(),
                    &|o| o == Owner::Scope(id),
                    deadline,
                )?;
                report.signalled = t.signalled;
                report.emptied = t.emptied;
            }
        }
        Ok(report)
    }

    /// Wait until nothing of the scope is alive, at most `within`: the grace of a session's
    /// end, between SIGTERM ([`signal_all`](Self::signal_all)) and
    /// [`kill_all`](Self::kill_all). Looks every [`EMPTY_POLL_BACKOFF`] (on tokio's clock,
    /// each look off the runtime's threads). Returns whether the scope emptied.
    pub async fn wait_empty(self: &Arc<Self>, within: Duration) -> Result<bool, ContainmentError> {
        let deadline = tokio::time::Instant::now() + within;
        let mut pause = EMPTY_POLL_BACKOFF.0;
        loop {
            let me = self.clone();
            let empty = tokio::task::spawn_blocking(move || me.is_empty())
                .await
                .map_err(|e| ContainmentError::Io(std::io::Error::other(e.to_string())))??;
            if empty {
                return Ok(true);
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            tokio::time::sleep(pause.min(deadline - now)).await;
            pause = (pause * 2).min(EMPTY_POLL_BACKOFF.1);
        }
    }

    /// Whether nothing of the scope is alive (zombies do not count).
    pub fn is_empty(&self) -> Result<bool, ContainmentError> {
        Ok(match &self.cgroups {
            ScopeCgroups::V2 { cg, .. } => !cg.exists() || cgroup::v2_is_empty(cg)?,
            ScopeCgroups::V1 { freezer, .. } => {
                !freezer.exists() || freezer.procs_recursive()?.is_empty()
            }
            ScopeCgroups::None => {
                let id = self.id;
                tree::walk(&self.shared.sessions(), &|o| o == Owner::Scope(id))?
                    .members
                    .is_empty()
            }
        })
    }

    /// Send `sig` to every live process of the scope, each by pidfd after verifying its
    /// membership (the gentle first step of a session's end: SIGTERM to everything, as
    /// systemd's `KillMode=control-group` does, before [`kill_all`](Self::kill_all)). A
    /// process forked meanwhile may be missed; the kill that follows is exhaustive. Returns
    /// how many processes were reached. Blocking (`/proc`, cgroup files): call it from
    /// `spawn_blocking`.
    pub fn signal_all(&self, sig: Signal) -> Result<usize, ContainmentError> {
        let (cg, h) = match &self.cgroups {
            ScopeCgroups::V2 { cg, .. } => (cg, Hierarchy::V2),
            ScopeCgroups::V1 { freezer, .. } => (freezer, Hierarchy::V1Freezer),
            ScopeCgroups::None => {
                let id = self.id;
                let w = tree::walk(&self.shared.sessions(), &|o| o == Owner::Scope(id))?;
                let mut n = 0;
                for m in &w.members {
                    if m.pidfd.signal(sig)? == Delivery::Delivered {
                        n += 1;
                    }
                }
                return Ok(n);
            }
        };
        let pids = match cg.procs_recursive() {
            Ok(p) => p,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(e.into()),
        };
        let mut n = 0;
        for pid in pids {
            let Ok(fd) = Pidfd::open(pid) else { continue };
            if !cgroup::is_member(pid, cg, h) || !fd.is_unreaped() {
                continue;
            }
            if fd.signal(sig)? == Delivery::Delivered {
                n += 1;
            }
        }
        Ok(n)
    }

    /// Send `sig` (`None`: only count) to every live process of the scope in process group
    /// `pgid`, each by pidfd after verifying its group and membership. For a group whose
    /// leader (the direct child) was already reaped, where `killpg` would be unsafe. Returns
    /// how many processes were reached.
    pub fn signal_group_members(
        &self,
        pgid: u32,
        sig: Option<Signal>,
    ) -> Result<usize, ContainmentError> {
        let (cg, h) = match &self.cgroups {
            ScopeCgroups::V2 { cg, .. } => (cg, Hierarchy::V2),
            ScopeCgroups::V1 { freezer, .. } => (freezer, Hierarchy::V1Freezer),
            ScopeCgroups::None => {
                let id = self.id;
                return Ok(tree::signal_group(
                    &self.shared.sessions(),
                    &|o| o == Owner::Scope(id),
                    pgid,
                    sig,
                )?);
            }
        };
        let pids = match cg.procs_recursive() {
            Ok(p) => p,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(e.into()),
        };
        let mut n = 0;
        for pid in pids {
            let Ok(fd) = Pidfd::open(pid) else { continue };
            let Ok(st) = procfs::read_stat(pid) else {
                continue;
            };
            if st.pgid != pgid || st.is_dead() || !cgroup::is_member(pid, cg, h) {
                continue;
            }
            let reached = match sig {
                Some(s) => fd.signal(s)? == Delivery::Delivered,
                None => fd.is_unreaped(),
            };
            if reached {
                n += 1;
            }
        }
        Ok(n)
    }

    /// Remove the scope's cgroups and forget it. Fails with [`ContainmentError::NotEmpty`]
    /// while a process is left (call [`kill_all`](Self::kill_all) first). The scope is closed
    /// to new processes either way.
    pub fn remove(&self) -> Result<(), ContainmentError> {
        lock(&self.state).closed = true;
        if !self.is_empty()? {
            return Err(ContainmentError::NotEmpty);
        }
        self.remove_dirs().map_err(|e| match e.raw_os_error() {
            Some(libc::EBUSY) => ContainmentError::NotEmpty,
            _ => ContainmentError::Io(e),
        })?;
        lock(&self.shared.scopes).remove(&self.id);
        lock(&self.shared.sessions).retain(|_, s| *s != self.id);
        Ok(())
    }

    pub(super) fn remove_dirs(&self) -> std::io::Result<()> {
        match &self.cgroups {
            ScopeCgroups::V2 { cg, .. } => cg.remove_tree(),
            ScopeCgroups::V1 { freezer, pids } => {
                freezer.remove_tree()?;
                if let Some(p) = pids {
                    p.remove_tree()?;
                }
                Ok(())
            }
            ScopeCgroups::None => Ok(()),
        }
    }
}

impl Drop for SessionScope {
    /// Best effort: an empty scope's cgroups go with it; a scope with processes left keeps
    /// them until shutdown or the next start's sweep.
    fn drop(&mut self) {
        let _ = self.remove_dirs();
        lock(&self.shared.scopes).remove(&self.id);
        lock(&self.shared.sessions).retain(|_, s| *s != self.id);
    }
}
