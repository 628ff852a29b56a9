//! [`DirectChild`]: a child the server spawned, held by pidfd from spawn time, with the one
//! safe way to signal its process group.
//!
//! The child's pid is also its process group and session id (`spawn.rs` calls `setsid`). The
//! number cannot be reused while the child is unreaped (running or a zombie), and a session
//! leader can never change its group, so while the child is unreaped `killpg(pid)` reaches
//! exactly the group the child created. Once it is reaped, the number may belong to anyone:
//! group signals must then stop. This type makes that rule hold: the reap and every group
//! signal take the same lock, and the reap marks the child reaped under it.
//!
//! It must never signal by number after the reap, and nothing may reap the child through any
//! other path than [`DirectChild::wait`] (the process supervisor's only reap; the subreaper
//! never reaps a registered direct child, unless its owner abandoned it). The group signal also checks the pidfd, for a
//! child reaped by some other path against that rule.

use std::io;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

use super::pidfd::{Delivery, Pidfd};
use super::ScopeId;
use crate::sync::lock;

/// A child spawned by `spawn.rs`: its pidfd (opened before anyone could reap it), the scope
/// it was placed in, and the reap gate.
#[derive(Debug)]
pub struct DirectChild {
    pidfd: Pidfd,
    scope: Option<ScopeId>,
    /// `true` once reaped through [`wait`](Self::wait); group signals check it under the
    /// same lock.
    reaped: Mutex<bool>,
    /// Its owner dropped it unreaped: the subreaper may reap it.
    abandoned: AtomicBool,
}

impl DirectChild {
    pub(crate) fn new(pidfd: Pidfd, scope: Option<ScopeId>) -> Self {
        DirectChild {
            pidfd,
            scope,
            reaped: Mutex::new(false),
            abandoned: AtomicBool::new(false),
        }
    }

    /// The child's pid (also its process group and session id).
    pub fn pid(&self) -> u32 {
        self.pidfd.pid()
    }

    /// The child's pidfd.
    pub fn pidfd(&self) -> &Pidfd {
        &self.pidfd
    }

    /// The session scope it was placed in, if any.
    pub fn scope(&self) -> Option<ScopeId> {
        self.scope
    }

    /// Signal the child alone, by pidfd. [`Delivery::Gone`] once reaped.
    pub fn signal(&self, sig: Signal) -> io::Result<Delivery> {
        self.pidfd.signal(sig)
    }

    /// Signal the child's process group, only while the child is unreaped (its number then
    /// cannot name anyone else's group). [`Delivery::Gone`] once it was reaped: members left
    /// in the group must then be reached through the session scope
    /// ([`SessionScope::signal_group_members`](super::SessionScope::signal_group_members)).
    pub fn signal_group(&self, sig: Signal) -> io::Result<Delivery> {
        let reaped = lock(&self.reaped);
        if *reaped || !self.pidfd.is_unreaped() {
            return Ok(Delivery::Gone);
        }
        let pgid = i32::try_from(self.pid()).map_err(|_| io::Error::other("pid out of range"))?;
        let r = killpg(Pid::from_raw(pgid), sig);
        drop(reaped);
        match r {
            Ok(()) => Ok(Delivery::Delivered),
            Err(nix::errno::Errno::ESRCH) => Ok(Delivery::Gone),
            Err(e) => Err(e.into()),
        }
    }

    /// Whether the child has been reaped (through [`wait`](Self::wait) or otherwise).
    pub fn is_reaped(&self) -> bool {
        *lock(&self.reaped) || !self.pidfd.is_unreaped()
    }

    /// Whether the child was reaped through [`wait`](Self::wait) or
    /// [`try_wait`](Self::try_wait) (the reap flag alone, no system call): unlike
    /// [`is_reaped`](Self::is_reaped) it does not see a reap by some other path.
    pub(crate) fn reaped_through_wait(&self) -> bool {
        *lock(&self.reaped)
    }

    /// Wait for the child to exit and reap it, under the reap gate so that no group signal
    /// can run after the reap. Fails with `ECHILD` if it was already reaped.
    ///
    /// It looks before it waits: a short child has often exited by the time its supervisor
    /// first runs (the cloning thread sleeps until the exec, and on a busy machine the child
    /// may run to its end before that thread gets a CPU back). Registering an exited child's
    /// pidfd with the reactor would make it readable at once, waking the worker parked in it
    /// for nothing, besides the `dup`, two `epoll_ctl` and the `close` it costs.
    pub async fn wait(&self) -> io::Result<ExitStatus> {
        loop {
            if let Some(status) = self.try_wait()? {
                return Ok(status);
            }
            self.pidfd.exited().await?;
        }
    }

    /// Reap the child if it has exited, under the reap gate: `Ok(None)` while it runs,
    /// `ECHILD` if it was already reaped.
    pub fn try_wait(&self) -> io::Result<Option<ExitStatus>> {
        let mut reaped = lock(&self.reaped);
        if *reaped {
            return Err(io::Error::from_raw_os_error(libc::ECHILD));
        }
        let status = self.pidfd.try_reap_status()?;
        if status.is_some() {
            *reaped = true;
        }
        Ok(status)
    }

    /// Nobody will wait for this child any more (its [`ChildProcess`](crate::process::spawn::ChildProcess)
    /// was dropped unreaped): the subreaper reaps it once it exits.
    pub(crate) fn abandon(&self) {
        self.abandoned.store(true, Ordering::Release);
    }

    /// Whether `abandon` was called.
    pub fn is_abandoned(&self) -> bool {
        self.abandoned.load(Ordering::Acquire)
    }
}
