//! Starting the child without copying the server: `clone(CLONE_VM | CLONE_VFORK)` on a small
//! stack of its own, so the kernel copies no page table and no page is faulted
//! copy-on-write (a `fork` of a server holding hundreds of MB did both, for every child).
//! Where the session scope is a v2 cgroup and the kernel has `clone3`, the child is created
//! directly in that cgroup (`CLONE_INTO_CGROUP`): no migration, no write in the child. The
//! child's pidfd comes from the same call (`CLONE_PIDFD`).
//!
//! This module owns the clone itself: the stack, the blocked signal mask around it, the
//! choice between `clone3` and `clone`, and reaping a child that failed before exec. What
//! the child does is `child.rs`. It must never let the child return into the caller's
//! frames (the child calls `_exit` or execs), and never leave the caller's signal mask
//! changed.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use libc::{c_int, c_void};

use super::child::{child_main, ChildPlan};
use crate::sync::lock;

/// The child's stack. The child runs only `child.rs` (plain system calls, a few hundred
/// bytes of locals); 64 KiB leaves room for any C library's wrappers, and a guard page below
/// turns an overflow into a crash of the child rather than a write into the server's memory.
pub const CHILD_STACK_BYTES: usize = 64 * 1024;

/// Child stacks kept mapped between spawns, at most this many (each [`CHILD_STACK_BYTES`]
/// and a guard page of address space; only the few pages a child touched are resident).
/// Mapping, guarding and unmapping a stack per spawn cost three calls that take the server's
/// address-space lock for writing, page faults in the child while the cloning thread
/// waits, and, at the unmap, a TLB shootdown on every core running a server thread. Spawns
/// run concurrently on the runtime's threads; beyond this many at once, a spawn maps its
/// own stack and unmaps it afterwards, as before.
pub const CHILD_STACK_POOL: usize = 8;

/// The kept stacks (see [`CHILD_STACK_POOL`]).
static STACKS: Mutex<Kept<Stack>> = Mutex::new(Kept::new(CHILD_STACK_POOL));

/// `CLONE_INTO_CGROUP` (Linux 5.7, `clone3` only).
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// Set once `clone3` was refused as unknown or not permitted (old kernel, seccomp filter):
/// later spawns go straight to `clone`.
static CLONE3_UNUSABLE: AtomicBool = AtomicBool::new(false);

/// How a child was created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloneMethod {
    /// `clone3(CLONE_VM | CLONE_VFORK | CLONE_PIDFD | CLONE_INTO_CGROUP)`: created inside
    /// the session's v2 cgroup.
    Clone3IntoCgroup,
    /// `clone(CLONE_VM | CLONE_VFORK | CLONE_PIDFD)`: the child writes itself into its
    /// cgroup(s), if any, before exec.
    CloneVfork,
}

/// Which clone a spawn may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClonePreference {
    /// `clone3` into the cgroup when the scope is a v2 cgroup and the kernel allows it,
    /// else `clone`.
    #[default]
    Auto,
    /// Always `clone` (the fallback path; tests run the containment suite through both).
    CloneOnly,
}

/// Whether `clone3` is usable here (not refused by an earlier spawn; x86-64 only, where
/// the entry sequence below exists).
pub fn clone3_usable() -> bool {
    cfg!(target_arch = "x86_64") && !CLONE3_UNUSABLE.load(Ordering::Relaxed)
}

/// A started child: its pid and pidfd.
pub(super) struct Cloned {
    pub pid: u32,
    pub pidfd: OwnedFd,
    pub method: CloneMethod,
}

/// Why [`clone_child`] started no child.
pub(super) enum CloneError {
    /// `clone3` is unknown or not permitted here (remembered: later spawns use `clone`);
    /// retry with [`ClonePreference::CloneOnly`], the child writing itself into its cgroup.
    Clone3Refused,
    /// The clone failed, or the child failed before exec (the errno it met; it is reaped).
    Io(io::Error),
}

impl CloneError {
    pub(super) fn into_io(self) -> io::Error {
        match self {
            CloneError::Clone3Refused => io::Error::from_raw_os_error(libc::ENOSYS),
            CloneError::Io(e) => e,
        }
    }
}

/// Start the child `plan` describes. `cgroup_dir`: the session's v2 cgroup directory, for
/// `clone3(CLONE_INTO_CGROUP)` (the plan's cgroup writes are then skipped).
pub(super) fn clone_child(
    plan: &mut ChildPlan,
    cgroup_dir: Option<BorrowedFd<'_>>,
    pref: ClonePreference,
) -> Result<Cloned, CloneError> {
    let kept = lock(&STACKS).take();
    let stack = match kept {
        Some(stack) => stack,
        None => Stack::new().map_err(CloneError::Io)?,
    };
    let into = cgroup_dir.filter(|_| pref == ClonePreference::Auto && clone3_usable());
    if into.is_some() {
        plan.skip_cgroup_writes();
    }
    let (result, method) = {
        let _mask = BlockedSignals::block_all().map_err(CloneError::Io)?;
        match into {
            Some(dir) => (
                clone3_into(plan, &stack, dir),
                CloneMethod::Clone3IntoCgroup,
            ),
            None => (clone_vfork(plan, &stack), CloneMethod::CloneVfork),
        }
    };
    // The child exec'd or exited before the clone returned (`CLONE_VFORK`): nothing runs on
    // the stack any more. Kept for the next spawn, or unmapped if the pool is full.
    let spare = lock(&STACKS).keep(stack);
    drop(spare);
    let (pid, pidfd) = match result {
        Ok(r) => r,
        Err(e) if method == CloneMethod::Clone3IntoCgroup && refused_as_unsupported(&e) => {
            CLONE3_UNUSABLE.store(true, Ordering::Relaxed);
            tracing::info!(error = %e, "clone3 unavailable; children write themselves into their cgroup");
            return Err(CloneError::Clone3Refused);
        }
        Err(e) => return Err(CloneError::Io(e)),
    };
    if let Some(e) = plan.failure() {
        reap_failed(pidfd.as_raw_fd());
        return Err(CloneError::Io(e));
    }
    Ok(Cloned { pid, pidfd, method })
}

/// `clone3` errors that mean "not this way here" rather than "no child now".
fn refused_as_unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOSYS | libc::E2BIG | libc::EINVAL | libc::EPERM | libc::EOPNOTSUPP)
    )
}

/// Reap a child that exited before exec (it has: `CLONE_VFORK` returned). Blocking, but the
/// child is already past `_exit`.
fn reap_failed(pidfd: RawFd) {
    loop {
        // SAFETY: siginfo_t is plain data; zeroed is a valid value.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `info` is valid and writable; `pidfd` is our child's pidfd.
        let r =
            unsafe { libc::waitid(libc::P_PIDFD, pidfd as libc::id_t, &mut info, libc::WEXITED) };
        if r == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return;
        }
    }
}

/// Up to `cap` things kept for reuse (sans-IO: the stack pool's rule, tested on its own).
struct Kept<T> {
    items: Vec<T>,
    cap: usize,
}

impl<T> Kept<T> {
    const fn new(cap: usize) -> Kept<T> {
        Kept {
            items: Vec::new(),
            cap,
        }
    }

    /// One kept thing, if any.
    fn take(&mut self) -> Option<T> {
        self.items.pop()
    }

    /// Keep `t` if there is room; else hand it back (for the caller to drop).
    fn keep(&mut self, t: T) -> Option<T> {
        if self.items.len() < self.cap {
            self.items.push(t);
            None
        } else {
            Some(t)
        }
    }
}

/// The child's stack: an anonymous mapping with a guard page at its low end.
struct Stack {
    base: *mut c_void,
    len: usize,
    guard: usize,
}

// SAFETY: a `Stack` is the sole owner of its mapping (nothing else holds the pointer), and a
// mapping is not tied to the thread that made it: any thread may clone on it or unmap it.
unsafe impl Send for Stack {}

impl Stack {
    fn new() -> io::Result<Stack> {
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
            .ok()
            .filter(|p| *p > 0)
            .unwrap_or(4096);
        let len = CHILD_STACK_BYTES + page;
        // SAFETY: a fresh anonymous private mapping; no existing memory is touched.
        let base = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let stack = Stack {
            base,
            len,
            guard: page,
        };
        // SAFETY: the first page of our own mapping.
        if unsafe { libc::mprotect(base, page, libc::PROT_NONE) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(stack)
    }

    /// The highest address (stacks grow down on every architecture this runs on), 16-byte
    /// aligned as the ABIs require at a call.
    fn top(&self) -> *mut c_void {
        let top = self.base as usize + self.len;
        (top & !15) as *mut c_void
    }

    /// The usable part, from its low end.
    fn usable(&self) -> (u64, u64) {
        let low = self.base as usize + self.guard;
        (low as u64, (self.top() as usize - low) as u64)
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: our own mapping; the child no longer runs on it (it exec'd or exited
        // before the clone returned).
        unsafe { libc::munmap(self.base, self.len) };
    }
}

/// Every signal blocked in the calling thread until dropped: no signal handler of the
/// server may run in the child on the server's memory before the child resets its
/// dispositions.
struct BlockedSignals {
    old: libc::sigset_t,
}

impl BlockedSignals {
    fn block_all() -> io::Result<BlockedSignals> {
        // SAFETY: sigset_t is plain data; sigfillset initialises it.
        let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: valid sigset pointers for the calls.
        let r = unsafe {
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old)
        };
        if r != 0 {
            return Err(io::Error::from_raw_os_error(r));
        }
        Ok(BlockedSignals { old })
    }
}

impl Drop for BlockedSignals {
    fn drop(&mut self) {
        // SAFETY: restores the mask saved by `block_all` on this same thread.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.old, ptr::null_mut()) };
    }
}

/// `clone(CLONE_VM | CLONE_VFORK | CLONE_PIDFD | SIGCHLD)` through the C library's wrapper,
/// which starts the child on `stack` in [`child_main`].
fn clone_vfork(plan: &ChildPlan, stack: &Stack) -> io::Result<(u32, OwnedFd)> {
    let mut pidfd: c_int = -1;
    let flags = libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD | libc::SIGCHLD;
    // SAFETY: the child runs `child_main` on its own stack with the plan, which outlives it
    // (we are suspended until it exec'd or exited); every signal is blocked (the caller
    // holds `BlockedSignals`); with CLONE_PIDFD the kernel stores the pidfd through the
    // parent-tid pointer, which points to our local.
    let pid = unsafe {
        libc::clone(
            child_main_c,
            stack.top(),
            flags,
            plan as *const ChildPlan as *mut c_void,
            &mut pidfd as *mut c_int,
        )
    };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    own_child(pid as i64, pidfd)
}

/// [`child_main`] as the plain `extern "C" fn` type `clone` takes.
extern "C" fn child_main_c(arg: *mut c_void) -> c_int {
    // SAFETY: only ever passed to `clone` with a live plan, which is child_main's contract.
    unsafe { child_main(arg) }
}

fn own_child(pid: i64, pidfd: c_int) -> io::Result<(u32, OwnedFd)> {
    if pidfd < 0 {
        return Err(io::Error::other("clone returned no pidfd"));
    }
    // SAFETY: the kernel just gave us this descriptor; nobody else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    let pid = u32::try_from(pid).map_err(|_| io::Error::other("pid out of range"))?;
    Ok((pid, fd))
}

/// `struct clone_args` (Linux 5.7 layout, with `cgroup`).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// `clone3(CLONE_VM | CLONE_VFORK | CLONE_PIDFD | CLONE_INTO_CGROUP)` into `cgroup_dir`.
#[cfg(target_arch = "x86_64")]
fn clone3_into(
    plan: &ChildPlan,
    stack: &Stack,
    cgroup_dir: BorrowedFd<'_>,
) -> io::Result<(u32, OwnedFd)> {
    let mut pidfd: c_int = -1;
    let (low, size) = stack.usable();
    let mut args = CloneArgs {
        flags: (libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD) as u64 | CLONE_INTO_CGROUP,
        pidfd: &mut pidfd as *mut c_int as u64,
        exit_signal: libc::SIGCHLD as u64,
        stack: low,
        stack_size: size,
        cgroup: cgroup_dir.as_raw_fd() as u64,
        ..CloneArgs::default()
    };
    // SAFETY: as for `clone_vfork`; `args` and `pidfd` are live locals; the child starts on
    // the new stack and never returns into our frames (see `clone3_raw`).
    let r = unsafe {
        clone3_raw(
            &mut args,
            child_main_c,
            plan as *const ChildPlan as *mut c_void,
        )
    };
    if r < 0 {
        return Err(io::Error::from_raw_os_error((-r) as i32));
    }
    own_child(r, pidfd)
}

#[cfg(not(target_arch = "x86_64"))]
fn clone3_into(
    _plan: &ChildPlan,
    _stack: &Stack,
    _cgroup_dir: BorrowedFd<'_>,
) -> io::Result<(u32, OwnedFd)> {
    Err(io::Error::from_raw_os_error(libc::ENOSYS))
}

/// The `clone3` system call with a new stack. The C library has no wrapper, and a plain
/// `syscall()` cannot be used: the child would return from it into the parent's frames on
/// its new, empty stack. So the child's side is written here: on a zero return it calls
/// `entry(arg)` on the new stack (16-byte aligned by `Stack::top`) and then `exit`s with its
/// result (`entry` does not return in practice: it execs or `_exit`s). Returns the child's
/// pid, or `-errno`.
///
/// # Safety
///
/// `args` must describe a stack the child may use exclusively and `CLONE_VFORK` (or the
/// caller must otherwise keep `arg` alive while the child runs); `entry` must be safe to run
/// in the child with `arg`.
#[cfg(target_arch = "x86_64")]
unsafe fn clone3_raw(
    args: &mut CloneArgs,
    entry: extern "C" fn(*mut c_void) -> c_int,
    arg: *mut c_void,
) -> i64 {
    let ret: i64;
    // SAFETY: the caller's contract. The parent returns from the syscall with the child's
    // pid (or -errno) in rax and only rcx and r11 clobbered; the child gets 0 on the new
    // stack, with r12/r13 (entry, arg) preserved by the kernel, and leaves by `exit`.
    unsafe {
        std::arch::asm!(
            "syscall",
            "test rax, rax",
            "jnz 2f",
            "xor ebp, ebp",
            "mov rdi, r13",
            "call r12",
            "mov edi, eax",
            "mov eax, {exit}",
            "syscall",
            "ud2",
            "2:",
            exit = const libc::SYS_exit,
            inlateout("rax") libc::SYS_clone3 => ret,
            in("rdi") args as *mut CloneArgs,
            in("rsi") std::mem::size_of::<CloneArgs>(),
            in("r12") entry,
            in("r13") arg,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_holds_up_to_its_cap_and_hands_back_the_rest() {
        let mut k = Kept::new(2);
        assert_eq!(k.take(), None, "nothing kept yet");
        assert_eq!(k.keep(1), None);
        assert_eq!(k.keep(2), None);
        assert_eq!(k.keep(3), Some(3), "full: handed back to be dropped");
        assert_eq!(k.take(), Some(2));
        assert_eq!(k.keep(4), None, "room again after a take");
        assert_eq!(k.take(), Some(4));
        assert_eq!(k.take(), Some(1));
        assert_eq!(k.take(), None);
    }

    #[test]
    fn a_kept_stack_is_reused_as_it_was_mapped() {
        let s = Stack::new().expect("map a stack");
        let (low, size) = s.usable();
        let mut k = Kept::new(1);
        assert!(k.keep(s).is_none());
        let again = k.take().expect("kept");
        assert_eq!(
            again.usable(),
            (low, size),
            "the same mapping, not a new one"
        );
        assert_eq!(size as usize % 16, 0);
        assert!(size as usize >= CHILD_STACK_BYTES - 16);
    }
}
