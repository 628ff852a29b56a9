//! Starting children: pipes or a PTY, a new session, parent-death signal, no inherited
//! descriptors, without copying the server.
//!
//! With `containment/sys.rs`, this is the only module with `unsafe` (the clone and the
//! child's side in `clone.rs` and `child.rs`, the PTY ioctls here). It owns the child's
//! start-up contract of `processes.md` §1 and hands back plain async readers and writers. It
//! must never read or interpret output, and never reap the child (the process supervisor
//! does that, through `DirectChild::wait` only).
//!
//! | file | owns |
//! |---|---|
//! | `mod.rs` | the spec, pipes or a PTY, the placement and registration around the clone |
//! | `child.rs` | `ChildPlan`: everything prepared for the child, and the child's steps up to `execve` |
//! | `clone.rs` | `clone3(CLONE_INTO_CGROUP)` or `clone(CLONE_VM \| CLONE_VFORK)`, the child's stack, the signal mask around it |
//! | `output_pipe.rs` | [`OutputPipe`]: an output pipe put on the reactor only once a read finds it empty |
//!
//! The child never copies the server's memory: it shares it (`CLONE_VM`) while the
//! cloning thread waits for its exec (`CLONE_VFORK`), so a spawn costs the same whatever the
//! server's size. Its pidfd comes from the clone (`CLONE_PIDFD`) and is registered with the
//! subreaper under its fork gate (`containment/subreaper.rs` explains why before the reaper
//! can look). [`spawn_into`] also places the child in a session scope: created inside the
//! scope's v2 cgroup by the kernel where `clone3` is usable, else written into the scope's
//! cgroup(s) by the child before `setsid` and exec (`containment/mod.rs`, "Placing a child").

mod child;
mod clone;
mod output_pipe;

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt as _;
use std::pin::Pin;
use std::process::ExitStatus;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use nix::fcntl::{fcntl, FcntlArg, FdFlag, OFlag};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::unix::pipe;

pub use clone::{clone3_usable, CloneMethod, ClonePreference, CHILD_STACK_BYTES};
pub use output_pipe::OutputPipe;

use super::containment::{self, subreaper, DirectChild, Pidfd, SessionScope};
pub use super::spawn_spec::SpawnSpec;
use super::start_error::{classify, StartError, StartWhat};
use crate::rpc::messages::{StreamName, TermSize};
use child::ChildPlan;
use clone::{clone_child, CloneError};

/// A started child and its I/O ends.
pub struct Spawned {
    /// The child; the supervisor waits on it.
    pub child: ChildProcess,
    /// Its pid, which is also its process group and session id.
    pub pid: u32,
    /// Output streams, in a fixed order (stdout, stderr; or pty).
    pub outputs: Vec<(StreamName, OutputReader)>,
    /// Where stdin writes go, if the child has a writable stdin.
    pub stdin: Option<InputWriter>,
    /// The PTY master, for resizing.
    pub pty: Option<PtyControl>,
    /// The child by pidfd (opened before anyone could reap it), registered with the
    /// subreaper; signal it and its group through this, never by number.
    pub direct: Arc<DirectChild>,
    /// How it was created.
    pub method: CloneMethod,
}

/// Start a child as `processes.md` §1 requires, in no session scope.
pub fn spawn(spec: &SpawnSpec) -> Result<Spawned, StartError> {
    spawn_into(spec, None)
}

/// Start a child as `processes.md` §1 requires, placed in `scope` (its cgroup, or its part of
/// the process tree) before it runs the program. Fails if the scope was closed. A failure
/// says what failed (`start_error.rs`): the program, the working directory, the terminal.
pub fn spawn_into(spec: &SpawnSpec, scope: Option<&SessionScope>) -> Result<Spawned, StartError> {
    spawn_with(spec, scope, ClonePreference::Auto)
}

/// [`spawn_into`] with a choice of clone: [`ClonePreference::CloneOnly`] runs the fallback
/// path (`clone` and a write into the cgroup from the child) even where `clone3` would do.
pub fn spawn_with(
    spec: &SpawnSpec,
    scope: Option<&SessionScope>,
    pref: ClonePreference,
) -> Result<Spawned, StartError> {
    let program = spec.argv.first().map(String::as_str).unwrap_or("");
    let other = |e: io::Error| StartError::new(StartWhat::Other, program, &e);
    let r = match spec.tty {
        None => spawn_pipes(spec, scope, pref),
        Some(size) => {
            let ws = winsize(size);
            let pty = nix::pty::openpty(Some(&ws), None)
                .map_err(|e| StartError::new(StartWhat::Pty, "", &io::Error::from(e)))?;
            spawn_pty(spec, scope, pty, pref)
        }
    };
    r.map_err(|e| match e {
        Failure::Launch(e) => classify(spec, &e),
        Failure::After(e) => other(e),
    })
}

/// Where a spawn failed: launching (clone, `chdir`, exec: the errno says what the child
/// met) or around it (descriptors, the scope: the server's own trouble).
enum Failure {
    Launch(io::Error),
    After(io::Error),
}

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Self {
        Failure::After(e)
    }
}

/// A pipe, both ends close-on-exec: (read end, write end).
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(io::Error::from)?;
    Ok((r, w))
}

/// `/dev/null` for reading (close-on-exec), opened once for the process: the stdin of every
/// child without a stdin pipe. The child `dup2`s it onto 0 and never closes it; nothing in
/// the server reads it. One open and close less per spawn.
static DEV_NULL: std::sync::OnceLock<OwnedFd> = std::sync::OnceLock::new();

/// Open the children's shared stdin (`DEV_NULL`) now rather than at the first spawn: the
/// composition root calls this at start, so that a server's descriptors at rest are the same
/// before its first spawn and after its last (what a leak check compares). A failure here is
/// only logged; the first spawn tries again and reports its own error.
pub fn open_shared_stdin() {
    if let Err(e) = dev_null() {
        tracing::warn!(error = %e, "cannot open /dev/null for children's stdin; spawns will try again");
    }
}

/// [`DEV_NULL`], opened on first use (a failed open is retried by the next spawn).
fn dev_null() -> io::Result<&'static OwnedFd> {
    if let Some(fd) = DEV_NULL.get() {
        return Ok(fd);
    }
    let null = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC)
        .open("/dev/null")?;
    // Two first spawns at once: one keeps its descriptor, the other's is closed here.
    let _ = DEV_NULL.set(OwnedFd::from(null));
    DEV_NULL
        .get()
        .ok_or_else(|| io::Error::other("/dev/null was not kept"))
}

/// A child on pipes.
fn spawn_pipes(
    spec: &SpawnSpec,
    scope: Option<&SessionScope>,
    pref: ClonePreference,
) -> Result<Spawned, Failure> {
    let (in_child, in_parent) = if spec.pipe_stdin {
        let (r, w) = pipe()?;
        (Some(r), Some(w))
    } else {
        (None, None)
    };
    let stdin_fd = match &in_child {
        Some(r) => r.as_raw_fd(),
        None => dev_null()?.as_raw_fd(),
    };
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    let stdio = [stdin_fd, out_w.as_raw_fd(), err_w.as_raw_fd()];
    let (direct, method) = launch(spec, stdio, false, scope, pref)?;
    // Our copies of the child's ends must go, or we never see end of file.
    drop((in_child, out_w, err_w));
    // Not on the reactor yet: a child that has already ended never needs to be.
    let stdout = OutputPipe::new(out_r)?;
    let stderr = OutputPipe::new(err_r)?;
    let stdin = match in_parent {
        Some(w) => Some(InputWriter::Pipe(pipe::Sender::from_owned_fd(w)?)),
        None => None,
    };
    Ok(Spawned {
        pid: direct.pid(),
        child: ChildProcess::new(direct.clone()),
        outputs: vec![
            (StreamName::Stdout, OutputReader::Stdout(stdout)),
            (StreamName::Stderr, OutputReader::Stderr(stderr)),
        ],
        stdin,
        pty: None,
        direct,
        method,
    })
}

/// A child on the terminal `pty` (opened by the caller).
fn spawn_pty(
    spec: &SpawnSpec,
    scope: Option<&SessionScope>,
    pty: nix::pty::OpenptyResult,
    pref: ClonePreference,
) -> Result<Spawned, Failure> {
    set_cloexec(pty.master.as_raw_fd())?;
    set_cloexec(pty.slave.as_raw_fd())?;
    let slave = pty.slave.as_raw_fd();
    let (direct, method) = launch(spec, [slave; 3], true, scope, pref)?;
    // Our copy of the slave must go, or the master never sees end of file.
    drop(pty.slave);
    let child = ChildProcess::new(direct.clone());
    set_nonblocking(pty.master.as_raw_fd())?;
    let master = Arc::new(pty.master);
    // SAFETY: each AsyncFd owns its OwnedFd, which stays open and unchanged until
    // the AsyncFd is dropped.
    let reader = unsafe { AsyncFd::register(master.try_clone()?) }
        .map_err(|e| io::Error::other(e.to_string()))?;
    // SAFETY: as for the reader: this AsyncFd owns its own duplicate of the master.
    let writer = unsafe { AsyncFd::register(master.try_clone()?) }
        .map_err(|e| io::Error::other(e.to_string()))?;
    Ok(Spawned {
        pid: direct.pid(),
        child,
        outputs: vec![(StreamName::Pty, OutputReader::Pty(reader))],
        stdin: Some(InputWriter::Pty(writer)),
        pty: Some(PtyControl { master }),
        direct,
        method,
    })
}

/// A containment failure around a spawn as an I/O error that keeps the OS errno: running out
/// of descriptors while opening a scope's `cgroup.procs` must read as `EMFILE` (out of file
/// descriptors) to the client, not as an unknown error.
fn scope_error(e: containment::ContainmentError) -> io::Error {
    match e {
        containment::ContainmentError::Io(io) => io,
        other => io::Error::other(other.to_string()),
    }
}

/// Clone and exec `spec` with `stdio` on 0–2: placed in `scope` (by the kernel, or by the
/// child before exec), its pidfd (from the clone) registered with the subreaper before the
/// reaper can see it (the fork gate is held across all three). A failed clone or a failure
/// of the child before exec is [`Failure::Launch`] (its errno is the child's); the rest
/// [`Failure::After`].
fn launch(
    spec: &SpawnSpec,
    stdio: [RawFd; 3],
    tty: bool,
    scope: Option<&SessionScope>,
    pref: ClonePreference,
) -> Result<(Arc<DirectChild>, CloneMethod), Failure> {
    let scope_err = scope_error;
    // Held until the child is recorded: a scope kill that starts meanwhile waits for it.
    let mut placement = scope
        .map(|s| s.begin_placement())
        .transpose()
        .map_err(scope_err)?;
    let cgroup_dir = placement.as_ref().and_then(|p| p.cgroup_dir());
    let kernel_places = cgroup_dir.is_some() && pref == ClonePreference::Auto && clone3_usable();
    if !kernel_places {
        if let Some(p) = placement.as_mut() {
            p.open_procs().map_err(scope_err)?;
        }
    }
    let fds = placement
        .as_ref()
        .map(|p| p.child_fds())
        .unwrap_or([-1; containment::MAX_PLACEMENT_FDS]);
    let mut plan = ChildPlan::new(spec, stdio, fds, tty).map_err(Failure::Launch)?;
    let gate = subreaper::fork_guard();
    let first = clone_child(
        &mut plan,
        placement.as_ref().and_then(|p| p.cgroup_dir()),
        pref,
    );
    let cloned = match first {
        Err(CloneError::Clone3Refused) => {
            // The kernel refused clone3 (now remembered): the child writes itself in.
            if let Some(p) = placement.as_mut() {
                p.open_procs().map_err(scope_err)?;
            }
            let fds = placement
                .as_ref()
                .map(|p| p.child_fds())
                .unwrap_or([-1; containment::MAX_PLACEMENT_FDS]);
            plan = ChildPlan::new(spec, stdio, fds, tty).map_err(Failure::Launch)?;
            clone_child(&mut plan, None, ClonePreference::CloneOnly)
        }
        other => other,
    }
    .map_err(|e| Failure::Launch(e.into_io()))?;
    let direct = Arc::new(DirectChild::new(
        Pidfd::from_owned(cloned.pidfd, cloned.pid),
        placement.as_ref().map(|p| p.scope_id()),
    ));
    gate.register(direct.clone());
    // Its session is attributed before the gate opens: a tree walk under the exclusive gate
    // (shutdown) sees the child and its session's orphans as the scope's.
    if let Some(p) = placement {
        p.placed(&direct);
    }
    drop(gate);
    Ok((direct, cloned.method))
}

/// The direct child, to wait for. Dropped unreaped (a spawn abandoned half-way, a test),
/// it is left to the subreaper, which reaps it once it exits.
pub struct ChildProcess {
    direct: Arc<DirectChild>,
}

impl ChildProcess {
    fn new(direct: Arc<DirectChild>) -> ChildProcess {
        ChildProcess { direct }
    }

    /// Wait for the child to exit and reap it (through [`DirectChild::wait`], the one reap).
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        self.direct.wait().await
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        if !self.direct.is_reaped() {
            self.direct.abandon();
            // Already over: no SIGCHLD will come for the reaper to notice.
            let _ = self.direct.try_wait();
        }
    }
}

fn set_cloexec(fd: RawFd) -> io::Result<()> {
    fcntl(fd, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))?;
    Ok(())
}

fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    let flags = OFlag::from_bits_retain(fcntl(fd, FcntlArg::F_GETFL)?);
    fcntl(fd, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
    Ok(())
}

fn winsize(size: TermSize) -> nix::pty::Winsize {
    nix::pty::Winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

/// The PTY master, kept to resize the terminal.
#[derive(Clone)]
pub struct PtyControl {
    master: Arc<OwnedFd>,
}

impl PtyControl {
    /// Set the window size; the kernel sends `SIGWINCH` to the foreground process group.
    pub fn resize(&self, size: TermSize) -> io::Result<()> {
        let ws = winsize(size);
        // SAFETY: TIOCSWINSZ reads a winsize struct we own from a descriptor we own.
        if unsafe { libc::ioctl(self.master.as_fd().as_raw_fd(), libc::TIOCSWINSZ, &ws) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// One output stream of a child.
pub enum OutputReader {
    /// stdout pipe (non-blocking, on the reactor once a read finds it empty).
    Stdout(OutputPipe),
    /// stderr pipe (non-blocking, on the reactor once a read finds it empty).
    Stderr(OutputPipe),
    /// The PTY master. `EIO` (every slave closed) reads as end of file.
    Pty(AsyncFd<OwnedFd>),
}

impl AsyncRead for OutputReader {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            OutputReader::Stdout(r) => Pin::new(r).poll_read(cx, buf),
            OutputReader::Stderr(r) => Pin::new(r).poll_read(cx, buf),
            OutputReader::Pty(fd) => loop {
                let mut guard = ready!(fd.poll_read_ready(cx))?;
                let unfilled = buf.initialize_unfilled();
                let res = guard.try_io(|inner| {
                    nix::unistd::read(inner.get_ref().as_raw_fd(), unfilled)
                        .map_err(io::Error::from)
                });
                match res {
                    Ok(Ok(n)) => {
                        buf.advance(n);
                        return Poll::Ready(Ok(()));
                    }
                    Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => {
                        return Poll::Ready(Ok(()));
                    }
                    Ok(Err(e)) => return Poll::Ready(Err(e)),
                    Err(_would_block) => continue,
                }
            },
        }
    }
}

/// The child's stdin.
pub enum InputWriter {
    /// A pipe (non-blocking, on the reactor).
    Pipe(pipe::Sender),
    /// The PTY master.
    Pty(AsyncFd<OwnedFd>),
}

impl AsyncWrite for InputWriter {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            InputWriter::Pipe(w) => Pin::new(w).poll_write(cx, data),
            InputWriter::Pty(fd) => loop {
                let mut guard = ready!(fd.poll_write_ready(cx))?;
                let res = guard.try_io(|inner| {
                    nix::unistd::write(inner.get_ref(), data).map_err(io::Error::from)
                });
                match res {
                    Ok(r) => return Poll::Ready(r),
                    Err(_would_block) => continue,
                }
            },
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            InputWriter::Pipe(w) => Pin::new(w).poll_flush(cx),
            InputWriter::Pty(_) => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            InputWriter::Pipe(w) => Pin::new(w).poll_shutdown(cx),
            InputWriter::Pty(_) => Poll::Ready(Ok(())),
        }
    }
}

impl InputWriter {
    /// Whether this is a terminal (end of file is sent as `^D`, not by closing).
    pub fn is_pty(&self) -> bool {
        matches!(self, InputWriter::Pty(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scope_out_of_descriptors_reads_as_emfile() {
        let e = scope_error(containment::ContainmentError::Io(
            io::Error::from_raw_os_error(libc::EMFILE),
        ));
        assert_eq!(e.raw_os_error(), Some(libc::EMFILE));
        let start = StartError::new(StartWhat::Other, "sleep", &e);
        assert_eq!(start.errno_name(), "EMFILE");
        assert!(start.out_of_descriptors());
        let closed = scope_error(containment::ContainmentError::ScopeClosed);
        assert_eq!(closed.raw_os_error(), None);
        assert_eq!(closed.to_string(), "session scope is closed");
    }
}
