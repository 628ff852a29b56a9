//! The child's half of a spawn: everything between `clone` and `execve`.
//!
//! The child shares the server's memory (`CLONE_VM`) and runs on a stack of its own while
//! the thread that cloned it is suspended (`CLONE_VFORK`) until it execs or exits. So the
//! child must not allocate, take a lock, touch a thread-local, unwind or call anything that
//! is not async-signal-safe: every byte it needs — the program paths to try, argv, envp, the
//! directory, the descriptors — is prepared in a [`ChildPlan`] before the clone, and the one
//! thing it hands back (the errno of the step that failed) is stored in the plan before it
//! calls `_exit`. It must never return into Rust code of the parent.
//!
//! The steps, in order (`processes.md` §1, and what `std::process::Command` did before):
//! every signal back to its default (caught and ignored alike), stdio onto 0–2, `chdir`, into
//! the session's cgroup (unless the kernel already put it there: `CLONE_INTO_CGROUP`),
//! `setsid`, the terminal as controlling tty, the parent-death signal, every other descriptor
//! close-on-exec, the descriptor limit the server was started with, an empty signal mask,
//! then `execve` over the `PATH` candidates as `execvp` does (`ENOEXEC` runs the file with
//! `/bin/sh`).

use std::cell::Cell;
use std::collections::BTreeMap;
use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::RawFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::ptr;
use std::sync::atomic::{AtomicI32, AtomicPtr, Ordering};

use libc::{c_char, c_int, c_void};

use super::SpawnSpec;
use crate::policy::resolve::{DEFAULT_EXEC_PATH, MAX_LOOKUP_NAME_BYTES};
use crate::process::containment::MAX_PLACEMENT_FDS;

/// The shell that runs a file `execve` refused with `ENOEXEC` (a script without `#!`), as
/// `execvp` does.
const SCRIPT_SHELL: &[u8] = b"/bin/sh\0";

/// The highest signal number plus one (Linux: 64 signals).
const NSIG: c_int = 65;

/// The kernel's `sigset_t` size, which `rt_sigaction` checks (64 signals).
const KERNEL_SIGSET_BYTES: libc::size_t = 8;

/// Everything the child needs, prepared by the parent before the clone. The pointers point
/// into `_strings` and `cwd`, which live as long as the plan.
pub(super) struct ChildPlan {
    _strings: Vec<CString>,
    /// The program as given (a name with a `/` is run as it is).
    program: CString,
    /// For a name without a `/`: the `PATH` to search (the child's own, or the default), each
    /// entry joined to the name in `scratch` in turn, as `execvp` does, the whole `PATH`
    /// (its length is bounded by the request's), nothing allocated per entry.
    search: Option<Vec<u8>>,
    /// Room for the longest entry, a `/`, the name and a NUL; written by the child only.
    scratch: Box<[Cell<u8>]>,
    /// The name is longer than `execvp` looks up: fail with `ENAMETOOLONG`.
    name_too_long: bool,
    /// Null-terminated.
    argv: Vec<*const c_char>,
    /// `/bin/sh`, the candidate (stored by the child), `argv[1..]`, null.
    sh_argv: Box<[AtomicPtr<c_char>]>,
    /// Null-terminated.
    envp: Vec<*const c_char>,
    cwd: Option<CString>,
    /// Descriptors to put on 0, 1 and 2 (they may repeat: a terminal's slave).
    stdio: [RawFd; 3],
    /// `cgroup.procs` descriptors the child writes `"0"` to (-1: none).
    cgroup_fds: [RawFd; MAX_PLACEMENT_FDS],
    /// Make fd 0 the controlling terminal after `setsid`.
    tty: bool,
    /// The server's pid, to notice a parent that died before the parent-death signal was set.
    parent: libc::pid_t,
    /// The descriptor limit the program starts with: the soft one the server was started with
    /// (before it raised its own), under the server's hard one. `None`: the server never
    /// raised it, so the program inherits it as it is.
    nofile: Option<libc::rlimit>,
    /// 0, or the errno of the step that failed (stored by the child before it exits).
    errno: AtomicI32,
}

/// The limit a program gets back if the server raised its own (see [`ChildPlan::nofile`]).
fn started_nofile() -> Option<libc::rlimit> {
    let soft = crate::bounds::descriptors::started_nofile_soft()?;
    let now = crate::bounds::descriptors::nofile_limit().ok()?;
    Some(libc::rlimit {
        rlim_cur: soft.min(now.hard),
        rlim_max: now.hard,
    })
}

fn cstring(bytes: impl Into<Vec<u8>>) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "nul byte found in provided data",
        )
    })
}

impl ChildPlan {
    /// Prepare the start of `spec` with `stdio` on 0–2, writing itself into `cgroup_fds`.
    pub(super) fn new(
        spec: &SpawnSpec,
        stdio: [RawFd; 3],
        cgroup_fds: [RawFd; MAX_PLACEMENT_FDS],
        tty: bool,
    ) -> io::Result<ChildPlan> {
        let program = spec
            .argv
            .first()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "argv is empty"))?;
        let env = child_env(spec);
        let mut strings: Vec<CString> = Vec::with_capacity(spec.argv.len() * 2 + env.len() + 4);
        let mut argv = Vec::with_capacity(spec.argv.len() + 1);
        for a in &spec.argv {
            let c = cstring(a.as_bytes())?;
            argv.push(c.as_ptr());
            strings.push(c);
        }
        argv.push(ptr::null());
        let mut envp = Vec::with_capacity(env.len() + 1);
        let mut path_var: Option<OsString> = None;
        for (k, v) in env {
            if k == "PATH" {
                path_var = Some(v.clone());
            }
            let mut kv = k.into_vec();
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            let c = cstring(kv)?;
            envp.push(c.as_ptr());
            strings.push(c);
        }
        envp.push(ptr::null());
        let name_too_long = !program.contains('/') && program.len() > MAX_LOOKUP_NAME_BYTES;
        let search = (!program.contains('/') && !program.is_empty()).then(|| {
            path_var
                .map(OsString::into_vec)
                .unwrap_or_else(|| DEFAULT_EXEC_PATH.as_bytes().to_vec())
        });
        let longest = search.as_deref().map_or(0, |p| {
            p.split(|b| *b == b':').map(<[u8]>::len).max().unwrap_or(0)
        });
        let scratch_len = if search.is_some() && !name_too_long {
            longest + 1 + program.len() + 1
        } else {
            0
        };
        let scratch: Box<[Cell<u8>]> = (0..scratch_len).map(|_| Cell::new(0)).collect();
        let program_c = cstring(program.as_bytes())?;
        let mut sh_argv = Vec::with_capacity(argv.len() + 1);
        sh_argv.push(AtomicPtr::new(SCRIPT_SHELL.as_ptr().cast_mut().cast()));
        sh_argv.push(AtomicPtr::new(ptr::null_mut()));
        for a in &argv[1..] {
            sh_argv.push(AtomicPtr::new(a.cast_mut()));
        }
        let cwd = spec
            .cwd
            .as_ref()
            .map(|c| cstring(c.as_bytes()))
            .transpose()?;
        Ok(ChildPlan {
            _strings: strings,
            program: program_c,
            search,
            scratch,
            name_too_long,
            argv,
            sh_argv: sh_argv.into_boxed_slice(),
            envp,
            cwd,
            stdio,
            cgroup_fds,
            tty,
            // SAFETY: getpid has no preconditions.
            parent: unsafe { libc::getpid() },
            nofile: started_nofile(),
            errno: AtomicI32::new(0),
        })
    }

    /// The kernel places the child in its cgroup (`CLONE_INTO_CGROUP`): no write in the
    /// child.
    pub(super) fn skip_cgroup_writes(&mut self) {
        self.cgroup_fds = [-1; MAX_PLACEMENT_FDS];
    }

    /// What the child stored: `None` if it reached `execve` of the program (or exited
    /// without a failure to report), else the errno of the failed step. Read it only after
    /// the clone returned (`CLONE_VFORK`: the child has exec'd or exited by then).
    pub(super) fn failure(&self) -> Option<io::Error> {
        match self.errno.load(Ordering::Acquire) {
            0 => None,
            n => Some(io::Error::from_raw_os_error(n)),
        }
    }
}

/// The child's environment, sorted by name as `std::process::Command` builds it: the
/// server's own (if inherited) with the overlay applied in order.
fn child_env(spec: &SpawnSpec) -> BTreeMap<OsString, OsString> {
    let mut env: BTreeMap<OsString, OsString> = if spec.inherit_env {
        std::env::vars_os().collect()
    } else {
        BTreeMap::new()
    };
    for (k, v) in &spec.env {
        match v {
            Some(v) => env.insert(OsStr::new(k).to_owned(), OsStr::new(v).to_owned()),
            None => env.remove(OsStr::new(k)),
        };
    }
    env
}

/// The child's entry point (on its own stack, right after the clone). Never returns.
///
/// # Safety
///
/// `arg` must point to a [`ChildPlan`] that stays alive and unchanged until the child has
/// exec'd or exited (the parent is suspended by `CLONE_VFORK` meanwhile), and this must run
/// only as the entry of a `clone` child, with every signal blocked.
pub(super) unsafe extern "C" fn child_main(arg: *mut c_void) -> c_int {
    // SAFETY: the caller guarantees `arg` is a live plan; the child only reads it and
    // stores through its atomics.
    let plan = unsafe { &*(arg as *const ChildPlan) };
    // SAFETY: we are the clone child the plan was made for.
    let err = unsafe { run(plan) };
    plan.errno
        .store(if err == 0 { libc::EIO } else { err }, Ordering::Release);
    // SAFETY: `_exit` ends the child without running anything of the parent's.
    unsafe { libc::_exit(127) }
}

/// The calling thread's errno.
fn errno() -> c_int {
    // SAFETY: __errno_location returns this thread's errno slot, always valid.
    unsafe { *libc::__errno_location() }
}

/// Retry `f` while it fails with `EINTR`; `Err(errno)` on another failure.
fn retry(mut f: impl FnMut() -> c_int) -> Result<c_int, c_int> {
    loop {
        let r = f();
        if r >= 0 {
            return Ok(r);
        }
        let e = errno();
        if e != libc::EINTR {
            return Err(e);
        }
    }
}

/// The child's steps. Returns the errno of the step that failed (it returns only on a
/// failure).
///
/// # Safety
///
/// Only in a `clone` child between the clone and `execve`, with every signal blocked: it
/// changes signal dispositions, descriptors, the session and the working directory of the
/// calling process, and uses only async-signal-safe calls without allocating.
unsafe fn run(p: &ChildPlan) -> c_int {
    // SAFETY: (the whole function) plain system calls on values prepared by the parent; every
    // pointer passed points into the plan, which outlives the child's use of it.
    unsafe {
        // 1. Every signal back to its default. No handler of the server may run in the child
        // (execve would reset those too, but a signal between the mask reset and execve would
        // run the server's handler on the server's memory). Ignored ones are reset as well:
        // how the server was started (`nohup` ignores SIGHUP, `cmd &` in a script ignores
        // SIGINT and SIGQUIT, the Rust runtime ignores SIGPIPE) must not decide whether a
        // client's command can trap or be stopped by a signal it is sent.
        // The raw system call, not the C library's `sigaction`: that one refuses the signals
        // it reserves for itself (32 and 33 in glibc), which can be ignored all the same and
        // would then stay ignored across `execve`. An all-zero kernel `sigaction` is SIG_DFL
        // with no flags and an empty mask, whatever the field order of the architecture.
        let dfl = [0u64; 4];
        for sig in 1..NSIG {
            if sig == libc::SIGKILL || sig == libc::SIGSTOP {
                continue;
            }
            libc::syscall(
                libc::SYS_rt_sigaction,
                libc::c_long::from(sig),
                dfl.as_ptr(),
                ptr::null_mut::<c_void>(),
                KERNEL_SIGSET_BYTES,
            );
        }

        // 2. stdio. A source below 3 that is not its own target is moved out of the way
        // first, so that no dup2 overwrites a source still needed.
        let mut fds = p.stdio;
        for (t, fd) in (0..).zip(fds.iter_mut()) {
            if *fd >= 0 && *fd < 3 && *fd != t {
                match retry(|| libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, 3)) {
                    Ok(n) => *fd = n,
                    Err(e) => return e,
                }
            }
        }
        for (t, &fd) in (0..).zip(fds.iter()) {
            let r = if fd == t {
                retry(|| libc::fcntl(t, libc::F_SETFD, 0))
            } else {
                retry(|| libc::dup2(fd, t))
            };
            if let Err(e) = r {
                return e;
            }
        }

        // 3. The working directory.
        if let Some(cwd) = &p.cwd {
            if let Err(e) = retry(|| libc::chdir(cwd.as_ptr())) {
                return e;
            }
        }

        // 4. Into the session's cgroup, before anything of the program can run.
        for &fd in &p.cgroup_fds {
            if fd >= 0 {
                match retry(|| libc::write(fd, b"0".as_ptr().cast(), 1) as c_int) {
                    Ok(1) => {}
                    Ok(_) => return libc::EIO,
                    Err(e) => return e,
                }
            }
        }

        // 5. A session (and process group) of its own.
        if libc::setsid() < 0 {
            return errno();
        }
        // 6. The terminal becomes the controlling tty of that session.
        if p.tty && libc::ioctl(0, libc::TIOCSCTTY as _, 0) < 0 {
            return errno();
        }
        // 7. SIGKILL when the thread that cloned us exits. That is the thread, not the
        // process: spawns run on runtime workers, never on `spawn_blocking` threads.
        if libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        ) < 0
        {
            return errno();
        }
        // The parent may have died before prctl took effect.
        if libc::getppid() != p.parent {
            libc::_exit(1);
        }
        // 8. Nothing else of the server's crosses exec.
        mark_inherited_fds_cloexec();
        // 9. The descriptor limit the server was started with, not the one it raised for
        // its own connections.
        if let Some(lim) = &p.nofile {
            if libc::setrlimit(libc::RLIMIT_NOFILE, lim) != 0 {
                return errno();
            }
        }
        // 10. An empty signal mask for the program.
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::sigprocmask(libc::SIG_SETMASK, &none, ptr::null_mut());
        // 11. exec, as execvp: keep looking on the errors that say "not here", remember a
        // permission problem, stop on any other.
        if p.name_too_long {
            return libc::ENAMETOOLONG;
        }
        let Some(path) = &p.search else {
            // A name with a `/`: that file only.
            return try_exec(p, p.program.as_ptr());
        };
        let name = p.program.as_bytes_with_nul();
        let mut got_eacces = false;
        let mut last = libc::ENOENT;
        for dir in path.split(|b| *b == b':') {
            // `dir/name\0` (an empty entry is the working directory: `name\0`).
            let Some(room) = p
                .scratch
                .get(..dir.len() + usize::from(!dir.is_empty()) + name.len())
            else {
                continue;
            };
            let (head, tail) = room.split_at(room.len() - name.len());
            for (c, b) in head.iter().zip(dir.iter().chain(std::iter::once(&b'/'))) {
                c.set(*b);
            }
            for (c, b) in tail.iter().zip(name) {
                c.set(*b);
            }
            let e = try_exec(p, room.as_ptr().cast());
            match e {
                libc::EACCES => got_eacces = true,
                libc::ENOENT
                | libc::ESTALE
                | libc::ENOTDIR
                | libc::ENODEV
                | libc::EHOSTDOWN
                | libc::ETIMEDOUT => {}
                other => return other,
            }
            last = e;
        }
        if got_eacces {
            libc::EACCES
        } else {
            last
        }
    }
}

/// `execve(file)`; on `ENOEXEC` run it with `/bin/sh` as `execvp` does. Returns the errno
/// of the failure (it returns only on one).
///
/// # Safety
///
/// As [`run`]: only in the clone child, `file` a NUL-terminated path that stays valid.
unsafe fn try_exec(p: &ChildPlan, file: *const c_char) -> c_int {
    // SAFETY: the caller's contract; argv and envp are the plan's null-terminated arrays.
    unsafe {
        libc::execve(file, p.argv.as_ptr(), p.envp.as_ptr());
        if errno() != libc::ENOEXEC {
            return errno();
        }
        if let Some(slot) = p.sh_argv.get(1) {
            slot.store(file.cast_mut(), Ordering::Relaxed);
        }
        // AtomicPtr<c_char> has the layout of *mut c_char.
        libc::execve(
            SCRIPT_SHELL.as_ptr().cast(),
            p.sh_argv.as_ptr().cast(),
            p.envp.as_ptr(),
        );
        // The shell could not run: report the file's own error.
        libc::ENOEXEC
    }
}

/// Mark every descriptor above stderr close-on-exec (`close_range`, or a walk of the table
/// on kernels before 5.11). Not closed outright: a descriptor the child still needs
/// (the `cgroup.procs` ones are already written) must not vanish under it.
///
/// # Safety
///
/// Only in a child between clone and exec, where no other thread of the process exists: it
/// changes the flags of every descriptor above 2, including ones other code holds. It calls
/// only async-signal-safe functions and does not allocate.
unsafe fn mark_inherited_fds_cloexec() {
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    // SAFETY: close_range only changes descriptor flags.
    let r = unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, CLOSE_RANGE_CLOEXEC) };
    if r == 0 {
        return;
    }
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
