//! [`Pidfd`]: a handle on one process that can never be confused with a later process that
//! reuses its pid.
//!
//! A pid number is freed when its process is reaped, and may then be given to any new
//! process; `kill(pid)` after that hits the newcomer. A pidfd refers to the process itself:
//! once it has been reaped, every signal through the pidfd fails with `ESRCH`. This module
//! owns that handle and the only ways the server signals a process it did not just verify:
//! it must never fall back to `kill(pid)`.
//!
//! # Verifying what a pid meant
//!
//! To act on a pid read from `/proc` (a child list, `cgroup.procs`), open its pidfd first,
//! then read what you need from `/proc/<pid>/…`, then check [`Pidfd::is_unreaped`]: if the
//! process behind the pidfd is still unreaped after the read, the number could not have
//! changed hands in between, so what was read belongs to the process the pidfd holds.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use nix::sys::signal::Signal;

use super::sys;

/// What a signal through a pidfd did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// The kernel accepted the signal for the process (it may be a zombie that ignores it).
    Delivered,
    /// The process has been reaped: nothing was signalled (`ESRCH`).
    Gone,
}

/// A pidfd: one process, by identity rather than by number.
#[derive(Debug)]
pub struct Pidfd {
    fd: OwnedFd,
    pid: u32,
}

impl Pidfd {
    /// Open a pidfd for `pid`. Fails with `ESRCH` when no such process exists (or it was
    /// reaped). The result refers to whatever process holds `pid` *now*: see the module docs
    /// for how to check that it is the one you meant.
    pub fn open(pid: u32) -> io::Result<Pidfd> {
        let fd = sys::pidfd_open(pid)?;
        Ok(Pidfd { fd, pid })
    }

    /// A pidfd the kernel gave for `pid` when it created the process (`CLONE_PIDFD`).
    pub(crate) fn from_owned(fd: OwnedFd, pid: u32) -> Pidfd {
        Pidfd { fd, pid }
    }

    /// The pid the process had when the pidfd was opened (it keeps it until reaped).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Send `sig` to the process. [`Delivery::Gone`] when it has been reaped: the signal
    /// cannot reach a process that reused the pid.
    pub fn signal(&self, sig: Signal) -> io::Result<Delivery> {
        self.raw_signal(sig as libc::c_int)
    }

    fn raw_signal(&self, sig: libc::c_int) -> io::Result<Delivery> {
        match sys::pidfd_send_signal(self.fd.as_fd(), sig) {
            Ok(()) => Ok(Delivery::Delivered),
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(Delivery::Gone),
            Err(e) => Err(e),
        }
    }

    /// Whether the process has not been reaped yet (running, stopped, or a zombie). While it
    /// is unreaped its pid (and a process group or session it leads) cannot be reused.
    pub fn is_unreaped(&self) -> bool {
        // EPERM: it exists but belongs to someone else; still unreaped.
        match self.raw_signal(0) {
            Ok(Delivery::Delivered) => true,
            Ok(Delivery::Gone) => false,
            Err(e) => e.raw_os_error() == Some(libc::EPERM),
        }
    }

    /// Whether the process has exited (it may still be an unreaped zombie). Does not block.
    pub fn has_exited(&self) -> io::Result<bool> {
        let ready = sys::poll_readable(&[self.fd.as_fd()], Duration::ZERO)?;
        Ok(ready.first().copied().unwrap_or(false))
    }

    /// Wait until the process has exited (not reaped: see [`try_reap`](Self::try_reap)).
    pub async fn exited(&self) -> io::Result<()> {
        sys::wait_readable(self.fd.try_clone()?).await
    }

    /// Reap the process if it is a child of ours and has exited: `Ok(true)` reaped now,
    /// `Ok(false)` still running, `ECHILD` if it is not our child (or already reaped).
    ///
    /// Only for processes whose exit status nobody else waits for: see `subreaper.rs`.
    pub fn try_reap(&self) -> io::Result<bool> {
        sys::reap_pidfd(self.fd.as_fd())
    }

    /// As [`try_reap`](Self::try_reap), with the exit status when reaped now.
    pub fn try_reap_status(&self) -> io::Result<Option<std::process::ExitStatus>> {
        sys::reap_pidfd_status(self.fd.as_fd())
    }
}

impl AsFd for Pidfd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Wait (blocking, at most `timeout`) until every pidfd's process has exited. Returns how
/// many had not exited by the deadline. Meant for `spawn_blocking`.
pub fn wait_all_exited(pidfds: &[&Pidfd], timeout: Duration) -> io::Result<usize> {
    let deadline = std::time::Instant::now() + timeout;
    let mut pending: Vec<&Pidfd> = pidfds.to_vec();
    // Look at least once, even with a zero timeout.
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let fds: Vec<BorrowedFd<'_>> = pending.iter().map(|p| p.as_fd()).collect();
        let ready = sys::poll_readable(&fds, left)?;
        pending = pending
            .into_iter()
            .zip(ready)
            .filter_map(|(p, r)| (!r).then_some(p))
            .collect();
        if pending.is_empty() || left.is_zero() {
            return Ok(pending.len());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    fn sleeper() -> std::process::Child {
        Command::new("sleep")
            .arg("1000")
            .stdin(Stdio::null())
            .spawn()
            .unwrap()
    }

    #[test]
    fn signal_after_reap_is_gone_and_never_reaches_the_number() {
        let mut child = sleeper();
        let pid = child.id();
        let fd = Pidfd::open(pid).unwrap();
        assert!(fd.is_unreaped());
        assert!(!fd.has_exited().unwrap());
        assert_eq!(fd.signal(Signal::SIGKILL).unwrap(), Delivery::Delivered);
        // Exited but not reaped: a zombie is still "unreaped" and pins the pid.
        assert_eq!(
            wait_all_exited(&[&fd], Duration::from_secs(30)).unwrap(),
            0,
            "SIGKILLed child did not exit"
        );
        assert!(fd.has_exited().unwrap());
        assert!(fd.is_unreaped());
        let status = child.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc::SIGKILL)
        );
        // Reaped: every signal fails cleanly, whatever process holds `pid` now.
        assert!(!fd.is_unreaped());
        assert_eq!(fd.signal(Signal::SIGTERM).unwrap(), Delivery::Gone);
        assert_eq!(fd.signal(Signal::SIGKILL).unwrap(), Delivery::Gone);
    }

    #[test]
    fn a_pidfd_of_a_reaped_process_does_not_follow_its_number() {
        // The best stand-in for a reuse we can force: the pidfd was opened for one process;
        // a live process that we signal by pidfd is unaffected by signals to another's pidfd.
        let mut a = sleeper();
        let mut b = sleeper();
        let fa = Pidfd::open(a.id()).unwrap();
        let fb = Pidfd::open(b.id()).unwrap();
        a.kill().unwrap();
        a.wait().unwrap();
        assert_eq!(fa.signal(Signal::SIGKILL).unwrap(), Delivery::Gone);
        assert!(fb.is_unreaped());
        assert!(!fb.has_exited().unwrap(), "b must not have been signalled");
        b.kill().unwrap();
        b.wait().unwrap();
    }

    #[test]
    fn opening_a_missing_process_is_esrch() {
        let mut child = sleeper();
        let pid = child.id();
        child.kill().unwrap();
        child.wait().unwrap();
        // The pid may have been reused in between by another process: then open succeeds
        // and refers to that one, which is exactly why callers verify after opening.
        match Pidfd::open(pid) {
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::ESRCH)),
            Ok(fd) => assert_eq!(fd.pid(), pid),
        }
    }

    #[test]
    fn try_reap_reaps_only_exited_children() {
        let mut child = sleeper();
        let fd = Pidfd::open(child.id()).unwrap();
        assert!(!fd.try_reap().unwrap(), "a running child is not reaped");
        fd.signal(Signal::SIGKILL).unwrap();
        assert_eq!(wait_all_exited(&[&fd], Duration::from_secs(30)).unwrap(), 0);
        assert!(fd.try_reap().unwrap());
        assert!(!fd.is_unreaped());
        // std's own wait now finds nothing to reap.
        assert!(child.wait().is_err());
    }

    #[test]
    fn wait_all_exited_looks_once_with_a_zero_timeout() {
        let mut a = sleeper();
        let fa = Pidfd::open(a.id()).unwrap();
        assert_eq!(wait_all_exited(&[&fa], Duration::ZERO).unwrap(), 1);
        a.kill().unwrap();
        a.wait().unwrap();
        assert_eq!(wait_all_exited(&[&fa], Duration::ZERO).unwrap(), 0);
        assert_eq!(wait_all_exited(&[], Duration::ZERO).unwrap(), 0);
    }

    #[tokio::test]
    async fn exited_resolves_when_the_process_exits() {
        let mut child = sleeper();
        let fd = Pidfd::open(child.id()).unwrap();
        fd.signal(Signal::SIGKILL).unwrap();
        tokio::time::timeout(Duration::from_secs(30), fd.exited())
            .await
            .expect("hang guard")
            .unwrap();
        child.wait().unwrap();
    }
}
