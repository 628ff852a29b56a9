//! Starting children: pipes or a PTY, a new session, parent-death signal, no inherited
//! descriptors.
//!
//! With `containment/sys.rs`, this is the only module with `unsafe` (the `pre_exec` hook and
//! the PTY ioctls). It owns the child's start-up contract of `processes.md` §1 and hands back
//! plain async readers and writers. It must never read or interpret output, and never reap
//! the child (the process supervisor does that, through `DirectChild::wait` only).
//!
//! Every child is opened as a pidfd right after the fork and registered with the subreaper
//! under its fork gate (`containment/subreaper.rs` explains why both must happen before the
//! reaper can look). [`spawn_into`] also places the child in a session scope: the child
//! writes itself into the scope's cgroup before `setsid` and exec
//! (`containment/mod.rs`, "Placing a child").

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::process::Stdio;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::process::{ChildStderr, ChildStdin, ChildStdout, Command};

use super::containment::{self, subreaper, DirectChild, Pidfd, SessionScope};
use super::start_error::{classify, StartError, StartWhat};
use crate::rpc::messages::{StreamName, TermSize};

/// What to start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpawnSpec {
    /// Program and arguments (non-empty).
    pub argv: Vec<String>,
    /// Working directory, absolute.
    pub cwd: Option<String>,
    /// Overlay: `Some` sets, `None` removes.
    pub env: Vec<(String, Option<String>)>,
    /// Start from the server's environment.
    pub inherit_env: bool,
    /// Run on a PTY of this size.
    pub tty: Option<TermSize>,
    /// Give the child a stdin pipe (ignored with a PTY, where stdin is the terminal).
    pub pipe_stdin: bool,
}

/// A started child and its I/O ends.
pub struct Spawned {
    /// The child; the supervisor waits on it.
    pub child: tokio::process::Child,
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
}

/// Start a child as `processes.md` §1 requires, in no session scope.
pub fn spawn(spec: &SpawnSpec) -> Result<Spawned, StartError> {
    spawn_into(spec, None)
}

/// Start a child as `processes.md` §1 requires, placed in `scope` (its cgroup, or its part of
/// the process tree) before it runs the program. Fails if the scope was closed. A failure
/// says what failed (`start_error.rs`): the program, the working directory, the terminal.
pub fn spawn_into(spec: &SpawnSpec, scope: Option<&SessionScope>) -> Result<Spawned, StartError> {
    let program = spec.argv.first().map(String::as_str).unwrap_or("");
    let other = |e: io::Error| StartError::new(StartWhat::Other, program, &e);
    match spec.tty {
        None => spawn_pipes(spec, scope).map_err(|e| match e {
            Failure::Launch(e) => classify(spec, &e),
            Failure::After(e) => other(e),
        }),
        Some(size) => {
            let ws = winsize(size);
            let pty = nix::pty::openpty(Some(&ws), None)
                .map_err(|e| StartError::new(StartWhat::Pty, "", &io::Error::from(e)))?;
            spawn_pty(spec, scope, pty).map_err(|e| match e {
                Failure::Launch(e) => classify(spec, &e),
                Failure::After(e) => other(e),
            })
        }
    }
}

/// Where a spawn failed: launching (fork, `chdir`, exec: the errno says what the child met)
/// or around it (descriptors, the pidfd: the server's own trouble).
enum Failure {
    Launch(io::Error),
    After(io::Error),
}

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Self {
        Failure::After(e)
    }
}

/// The command for `spec`: program, arguments, environment, working directory.
fn command(spec: &SpawnSpec) -> Result<Command, Failure> {
    let (program, args) = spec
        .argv
        .split_first()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "argv is empty"))?;
    let mut cmd = Command::new(program);
    cmd.args(args);
    if !spec.inherit_env {
        cmd.env_clear();
    }
    for (k, v) in &spec.env {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    if let Some(cwd) = &spec.cwd {
        cmd.current_dir(cwd);
    }
    cmd.kill_on_drop(false);
    Ok(cmd)
}

/// A child on pipes.
fn spawn_pipes(spec: &SpawnSpec, scope: Option<&SessionScope>) -> Result<Spawned, Failure> {
    let mut cmd = command(spec)?;
    let parent = std::process::id() as libc::pid_t;
    cmd.stdin(if spec.pipe_stdin {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    cmd.stdout(Stdio::piped());
    cmd.stderr(Stdio::piped());
    let (mut child, direct) = launch(&mut cmd, parent, false, scope)?;
    let pid = child
        .id()
        .ok_or_else(|| io::Error::other("child exited before its pid was read"))?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| io::Error::other("no stdout pipe"))?;
    let stderr = child
        .stderr
        .take()
        .ok_or_else(|| io::Error::other("no stderr pipe"))?;
    let stdin = child.stdin.take().map(InputWriter::Pipe);
    Ok(Spawned {
        child,
        pid,
        outputs: vec![
            (StreamName::Stdout, OutputReader::Stdout(stdout)),
            (StreamName::Stderr, OutputReader::Stderr(stderr)),
        ],
        stdin,
        pty: None,
        direct,
    })
}

/// A child on the terminal `pty` (opened by the caller).
fn spawn_pty(
    spec: &SpawnSpec,
    scope: Option<&SessionScope>,
    pty: nix::pty::OpenptyResult,
) -> Result<Spawned, Failure> {
    let mut cmd = command(spec)?;
    let parent = std::process::id() as libc::pid_t;
    set_cloexec(pty.master.as_raw_fd())?;
    set_cloexec(pty.slave.as_raw_fd())?;
    cmd.stdin(Stdio::from(pty.slave.try_clone()?));
    cmd.stdout(Stdio::from(pty.slave.try_clone()?));
    cmd.stderr(Stdio::from(pty.slave.try_clone()?));
    let (child, direct) = launch(&mut cmd, parent, true, scope)?;
    // Our copies of the slave must go, or the master never sees end of file.
    drop(cmd);
    drop(pty.slave);
    let pid = child
        .id()
        .ok_or_else(|| io::Error::other("child exited before its pid was read"))?;
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
        child,
        pid,
        outputs: vec![(StreamName::Pty, OutputReader::Pty(reader))],
        stdin: Some(InputWriter::Pty(writer)),
        pty: Some(PtyControl { master }),
        direct,
    })
}

/// Fork and exec `cmd`: placed in `scope`, opened as a pidfd and registered with the
/// subreaper before the reaper can see it (the fork gate is held across all three). A failed
/// fork or exec is [`Failure::Launch`] (its errno is the child's); the rest
/// [`Failure::After`].
fn launch(
    cmd: &mut Command,
    parent: libc::pid_t,
    tty: bool,
    scope: Option<&SessionScope>,
) -> Result<(tokio::process::Child, Arc<DirectChild>), Failure> {
    // Held until the child is recorded: a scope kill that starts meanwhile waits for it.
    let placement = scope
        .map(|s| s.begin_placement())
        .transpose()
        .map_err(|e| io::Error::other(e.to_string()))?;
    let fds = placement
        .as_ref()
        .map(|p| p.child_fds())
        .unwrap_or([-1; containment::MAX_PLACEMENT_FDS]);
    // SAFETY: the hook only calls async-signal-safe functions (write to the pre-opened
    // cgroup.procs descriptors, setsid, TIOCSCTTY on fd 0 — the slave, already dup'ed by
    // std —, prctl, getppid, close_range/fcntl) and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            containment::enter_in_child(&fds)?;
            child_setup(parent, tty)
        });
    }
    let gate = subreaper::fork_guard();
    let mut child = cmd.spawn().map_err(Failure::Launch)?;
    let pid = child
        .id()
        .ok_or_else(|| io::Error::other("child exited before its pid was read"))?;
    let pidfd = match Pidfd::open(pid) {
        Ok(fd) => fd,
        Err(e) => {
            // Nobody has reaped it (see subreaper.rs), so its pid is still its own.
            let _ = child.start_kill();
            return Err(Failure::After(io::Error::new(
                e.kind(),
                format!("pidfd_open: {e}"),
            )));
        }
    };
    let direct = Arc::new(DirectChild::new(
        pidfd,
        placement.as_ref().map(|p| p.scope_id()),
    ));
    gate.register(direct.clone());
    // Its session is attributed before the gate opens: a tree walk under the exclusive gate
    // (shutdown) sees the child and its session's orphans as the scope's.
    if let Some(p) = placement {
        p.placed(&direct);
    }
    drop(gate);
    Ok((child, direct))
}

/// Runs in the child between fork and exec. Only async-signal-safe calls.
fn child_setup(parent: libc::pid_t, tty: bool) -> io::Result<()> {
    // SAFETY: plain syscalls on values we own; no allocation.
    unsafe {
        if libc::setsid() < 0 {
            return Err(io::Error::last_os_error());
        }
        if tty && libc::ioctl(0, libc::TIOCSCTTY as _, 0) < 0 {
            return Err(io::Error::last_os_error());
        }
        // The signal fires when the *thread* that forked us exits, not only the process:
        // spawn from a thread that lives as long as the server (a runtime worker), never from
        // `spawn_blocking` (its threads retire when idle and would SIGKILL their children).
        if libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        ) < 0
        {
            return Err(io::Error::last_os_error());
        }
        // The parent may have died before prctl took effect.
        if libc::getppid() != parent {
            libc::_exit(1);
        }
        mark_inherited_fds_cloexec();
    }
    Ok(())
}

/// Mark every descriptor above stderr close-on-exec. Not closed outright: std reports exec
/// failures through a CLOEXEC pipe that must stay open until exec.
///
/// # Safety
///
/// Call it only in a child between `fork` and `exec` (from a `pre_exec` hook), where no
/// other thread exists: it changes the flags of every descriptor above 2, including ones
/// that other code of the process holds, which only a process about to `exec` may do. It
/// calls only async-signal-safe functions (`close_range`, `getrlimit`, `fcntl`) and does not
/// allocate, as the `pre_exec` contract requires.
unsafe fn mark_inherited_fds_cloexec() {
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    // SAFETY: close_range only changes descriptor flags.
    let r = unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, CLOSE_RANGE_CLOEXEC) };
    if r == 0 {
        return;
    }
    // Kernels before 5.11: walk the descriptor table.
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into our struct.
    let max = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        lim.rlim_cur.min(65_536) as RawFd
    } else {
        1024
    };
    for fd in 3..max {
        // SAFETY: fcntl on a possibly-closed fd just fails with EBADF.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
}

fn set_cloexec(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
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
    /// stdout pipe.
    Stdout(ChildStdout),
    /// stderr pipe.
    Stderr(ChildStderr),
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
                    // SAFETY: reading into an initialized buffer we own.
                    let n = unsafe {
                        libc::read(
                            inner.get_ref().as_raw_fd(),
                            unfilled.as_mut_ptr().cast(),
                            unfilled.len(),
                        )
                    };
                    if n < 0 {
                        Err(io::Error::last_os_error())
                    } else {
                        Ok(n as usize)
                    }
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
    /// A pipe.
    Pipe(ChildStdin),
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
                    // SAFETY: writing from a buffer we borrow to a descriptor we own.
                    let n = unsafe {
                        libc::write(
                            inner.get_ref().as_raw_fd(),
                            data.as_ptr().cast(),
                            data.len(),
                        )
                    };
                    if n < 0 {
                        Err(io::Error::last_os_error())
                    } else {
                        Ok(n as usize)
                    }
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
