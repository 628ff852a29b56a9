//! The raw system calls of containment: `pidfd_open`, `pidfd_send_signal`, `waitid` on a
//! pidfd, the child-subreaper flag and `poll` on descriptors.
//!
//! Together with `process/spawn/`, this is the only place of the server with `unsafe`.
//! Each function is a thin, typed wrapper: it must never keep state, allocate in the child,
//! or interpret what it returns beyond errno.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::ExitStatusExt as _;
use std::process::ExitStatus;
use std::time::Duration;

/// `pidfd_open(pid, 0)`: a descriptor that refers to this process (not to its number) for
/// as long as the descriptor is open. `ESRCH` if no such process exists (or it was reaped).
pub(crate) fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    let pid = libc::pid_t::try_from(pid)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "pid out of range"))?;
    // SAFETY: a plain syscall with integer arguments; the kernel returns a new descriptor
    // (close-on-exec) that we take ownership of.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0 as libc::c_uint) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = RawFd::try_from(fd).map_err(|_| io::Error::other("pidfd out of range"))?;
    // SAFETY: `fd` was just returned by the kernel and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `pidfd_send_signal(fd, sig, NULL, 0)`. Signal 0 checks that the process has not been
/// reaped yet (a zombie still counts). `ESRCH` once it has been reaped.
pub(crate) fn pidfd_send_signal(fd: BorrowedFd<'_>, sig: libc::c_int) -> io::Result<()> {
    // SAFETY: the descriptor is borrowed for the call; a null siginfo is allowed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0 as libc::c_uint,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `waitid(P_PIDFD, fd, WEXITED | WNOHANG)`: reap the process if it is our child and has
/// exited. `Ok(true)`: reaped now; `Ok(false)`: still running; `ECHILD`: not our child (or
/// already reaped).
pub(crate) fn reap_pidfd(fd: BorrowedFd<'_>) -> io::Result<bool> {
    Ok(reap_pidfd_status(fd)?.is_some())
}

/// As [`reap_pidfd`], with the exit status of a process reaped now.
pub(crate) fn reap_pidfd_status(fd: BorrowedFd<'_>) -> io::Result<Option<ExitStatus>> {
    // SAFETY: siginfo_t is plain data; zeroed is a valid value and lets us read si_pid
    // afterwards (WNOHANG leaves it zero when nothing was reaped).
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let id = libc::id_t::try_from(fd.as_raw_fd())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "bad descriptor"))?;
    // SAFETY: `info` is a valid, writable siginfo_t for the duration of the call.
    let r = unsafe { libc::waitid(libc::P_PIDFD, id, &mut info, libc::WEXITED | libc::WNOHANG) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: for a waitid result the kernel filled the child fields of the union.
    let (pid, status) = unsafe { (info.si_pid(), info.si_status()) };
    if pid == 0 {
        return Ok(None);
    }
    // The wait status `waitpid` would have given, which `ExitStatus` decodes.
    let raw = match info.si_code {
        libc::CLD_EXITED => (status & 0xff) << 8,
        libc::CLD_DUMPED => (status & 0x7f) | 0x80,
        _ => status & 0x7f,
    };
    Ok(Some(ExitStatus::from_raw(raw)))
}

/// `prctl(PR_SET_CHILD_SUBREAPER, 1)`: orphaned descendants are re-parented to this process
/// instead of init.
pub(crate) fn set_child_subreaper() -> io::Result<()> {
    // SAFETY: plain prctl with integer arguments.
    let r = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `prctl(PR_GET_CHILD_SUBREAPER)`.
pub(crate) fn is_child_subreaper() -> io::Result<bool> {
    let mut flag: libc::c_int = 0;
    // SAFETY: the kernel writes one int through the pointer, which is valid and ours.
    let r = unsafe { libc::prctl(libc::PR_GET_CHILD_SUBREAPER, &mut flag as *mut libc::c_int) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(flag != 0)
}

/// `getsid(0)`: this process's session id.
pub(crate) fn own_session_id() -> u32 {
    // SAFETY: getsid(0) cannot fail for the calling process.
    let sid = unsafe { libc::getsid(0) };
    u32::try_from(sid).unwrap_or(0)
}

/// `poll` the descriptors for readability (a pidfd is readable once its process exited),
/// waiting at most `timeout`. Returns, for each descriptor, whether it is readable.
/// `EINTR` counts as "nothing ready yet".
pub(crate) fn poll_readable(fds: &[BorrowedFd<'_>], timeout: Duration) -> io::Result<Vec<bool>> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|fd| libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    let n = libc::nfds_t::try_from(pfds.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "too many descriptors"))?;
    // SAFETY: `pfds` is a valid array of `n` pollfd structs for the duration of the call.
    let r = unsafe { libc::poll(pfds.as_mut_ptr(), n, ms) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EINTR) {
            return Ok(vec![false; pfds.len()]);
        }
        return Err(e);
    }
    Ok(pfds
        .iter()
        .map(|p| p.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0)
        .collect())
}

/// Wait until `fd` is readable, through the tokio reactor (a pidfd: until its process
/// exited). Takes its own descriptor (a duplicate), registered only for this wait.
pub(crate) async fn wait_readable(fd: OwnedFd) -> io::Result<()> {
    // SAFETY: the AsyncFd owns `fd`, which stays open and unchanged until it is dropped at
    // the end of this function.
    let afd = unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
    }
    .map_err(|e| io::Error::other(e.to_string()))?;
    let _ready = afd.readable().await?;
    Ok(())
}
