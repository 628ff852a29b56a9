//! cgroup directories: detection of the v2 and v1 (`freezer`, `pids`) hierarchies this
//! process is in, and the blocking operations on one cgroup: create, place (the descriptor a
//! child writes itself into), kill everything inside, wait until empty, remove.
//!
//! Kill strategies (each ends by waiting, bounded, until the cgroup is empty):
//! - **v2 with `cgroup.kill`** (Linux ≥ 5.14): one write; the kernel SIGKILLs every member and
//!   every process forking into it meanwhile, recursively.
//! - **v2 without `cgroup.kill`** (≥ 5.2): `cgroup.freeze`, wait for `frozen 1`, SIGKILL every
//!   member by pidfd (fatal signals reach frozen v2 tasks), thaw.
//! - **v1 `freezer`**: `FROZEN`, wait for it, SIGKILL every member by pidfd (a frozen v1 task
//!   cannot exit, fork or hand its pid on, so the list is exact), `THAWED` so they can die.
//!
//! A zombie is not a member (the kernel drops an exiting task from its cgroup before it is
//! reaped), so "empty" does not wait for anyone's parent to reap.
//!
//! This module never decides *which* cgroup belongs to whom (`containment/mod.rs` does) and
//! never signals a pid it did not open as a pidfd and verify as a member.

use std::io::{self, Write as _};
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::pidfd::{Delivery, Pidfd};
use super::procfs;

/// How long a freeze may take before the kill goes ahead anyway (tasks in uninterruptible
/// sleep, e.g. on a dead NFS server, delay a freeze). Killing an unfrozen cgroup is still
/// correct, only racier against forks, and the kill loop repeats.
pub const FREEZE_TIMEOUT: Duration = Duration::from_secs(5);
/// First and longest pause between two looks at a cgroup's state while waiting for it (the
/// kernel offers no notification for v1 files; v2's would need inotify). Short at first
/// because SIGKILLed processes are usually gone within a millisecond.
pub const POLL_BACKOFF: (Duration, Duration) =
    (Duration::from_millis(1), Duration::from_millis(20));
/// Freeze–kill–thaw rounds before giving up on a cgroup that keeps gaining members (a process
/// forking while the freeze was not complete).
pub const MAX_FREEZE_KILL_ROUNDS: usize = 16;

/// A cgroup directory, and its path as `/proc/<pid>/cgroup` shows it (to verify membership).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cgroup {
    /// The directory in the cgroup filesystem.
    pub dir: PathBuf,
    /// The path inside the hierarchy (`/a/b`), as this process's namespace sees it.
    pub rel: String,
}

impl Cgroup {
    /// A child cgroup (not created).
    pub fn child(&self, name: &str) -> Cgroup {
        Cgroup {
            dir: self.dir.join(name),
            rel: if self.rel.ends_with('/') {
                format!("{}{name}", self.rel)
            } else {
                format!("{}/{name}", self.rel)
            },
        }
    }

    /// `mkdir`.
    pub fn create(&self) -> io::Result<()> {
        std::fs::create_dir(&self.dir)
    }

    /// Whether the directory exists.
    pub fn exists(&self) -> bool {
        self.dir.is_dir()
    }

    /// Whether the cgroup has this interface file.
    pub fn has(&self, file: &str) -> bool {
        self.dir.join(file).exists()
    }

    /// Write one value to an interface file (no create, no truncate).
    pub fn write(&self, file: &str, value: &str) -> io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(self.dir.join(file))?;
        f.write_all(value.as_bytes())
    }

    /// Read an interface file.
    pub fn read(&self, file: &str) -> io::Result<String> {
        std::fs::read_to_string(self.dir.join(file))
    }

    /// Open `cgroup.procs` for writing, close-on-exec: a child writes `"0"` to it between fork
    /// and exec to move itself in before it can run anything.
    pub fn open_procs(&self) -> io::Result<OwnedFd> {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(self.dir.join("cgroup.procs"))?;
        Ok(f.into())
    }

    /// Member processes of this cgroup alone.
    pub fn procs(&self) -> io::Result<Vec<u32>> {
        Ok(procfs::parse_pid_list(&self.read("cgroup.procs")?).collect())
    }

    /// Child cgroups.
    pub fn subdirs(&self) -> io::Result<Vec<Cgroup>> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(&self.dir)? {
            let e = e?;
            if e.file_type()?.is_dir() {
                if let Some(name) = e.file_name().to_str() {
                    out.push(self.child(name));
                }
            }
        }
        Ok(out)
    }

    /// Member processes of this cgroup and every cgroup below it.
    pub fn procs_recursive(&self) -> io::Result<Vec<u32>> {
        let mut out = self.procs()?;
        for c in self.subdirs()? {
            out.extend(c.procs_recursive()?);
        }
        Ok(out)
    }

    /// `rmdir` this cgroup and every cgroup below it (deepest first). Missing is fine;
    /// `EBUSY` means a member is left.
    pub fn remove_tree(&self) -> io::Result<()> {
        match self.subdirs() {
            Ok(subs) => {
                for c in subs {
                    c.remove_tree()?;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        }
        match std::fs::remove_dir(&self.dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// Which kind of hierarchy a [`Cgroup`] is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hierarchy {
    /// The unified hierarchy.
    V2,
    /// The v1 hierarchy with the `freezer` controller.
    V1Freezer,
    /// The v1 hierarchy with the `pids` controller.
    V1Pids,
}

/// The cgroups this process is in, where they are mounted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Detected {
    /// The server's own v2 cgroup.
    pub v2: Option<Cgroup>,
    /// The server's own v1 `freezer` cgroup.
    pub freezer: Option<Cgroup>,
    /// The server's own v1 `pids` cgroup.
    pub pids: Option<Cgroup>,
}

/// Find the server's cgroups from `/proc/self/mountinfo` and `/proc/self/cgroup`.
pub fn detect() -> Detected {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mine = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    detect_from(&mounts, &mine)
}

/// [`detect`] over the two files' text.
pub fn detect_from(mountinfo: &str, self_cgroup: &str) -> Detected {
    let mounts = procfs::parse_cgroup_mounts(mountinfo);
    let lines = procfs::parse_cgroup_file(self_cgroup);
    let find = |pred: &dyn Fn(&procfs::CgroupMount) -> bool, path: Option<&str>| {
        let path = path?;
        mounts.iter().filter(|m| pred(m)).find_map(|m| {
            procfs::cgroup_dir(m, path).map(|dir| Cgroup {
                dir,
                rel: path.to_string(),
            })
        })
    };
    let v1 = |ctl: &'static str| {
        move |m: &procfs::CgroupMount| m.fstype == "cgroup" && m.options.iter().any(|o| o == ctl)
    };
    Detected {
        v2: find(&|m| m.fstype == "cgroup2", procfs::v2_path(&lines)),
        freezer: find(&v1("freezer"), procfs::v1_path(&lines, "freezer")),
        pids: find(&v1("pids"), procfs::v1_path(&lines, "pids")),
    }
}

/// Whether process `pid` is in `cg` or below it, per `/proc/<pid>/cgroup`.
pub fn is_member(pid: u32, cg: &Cgroup, h: Hierarchy) -> bool {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
        return false;
    };
    let lines = procfs::parse_cgroup_file(&text);
    let path = match h {
        Hierarchy::V2 => procfs::v2_path(&lines),
        Hierarchy::V1Freezer => procfs::v1_path(&lines, "freezer"),
        Hierarchy::V1Pids => procfs::v1_path(&lines, "pids"),
    };
    path.is_some_and(|p| p == cg.rel || p.starts_with(&format!("{}/", cg.rel)))
}

/// SIGKILL every current member of `cg` (and below) by pidfd, each verified a member after
/// its pidfd was opened. Returns how many were signalled.
pub fn kill_members(cg: &Cgroup, h: Hierarchy) -> io::Result<usize> {
    let mut n = 0;
    for pid in cg.procs_recursive()? {
        let Ok(fd) = Pidfd::open(pid) else { continue };
        if is_member(pid, cg, h)
            && fd.is_unreaped()
            && fd.signal(Signal::SIGKILL)? == Delivery::Delivered
        {
            n += 1;
        }
    }
    Ok(n)
}

/// Poll `done` until it holds or `deadline` passes, with a short growing pause. Returns
/// whether it held.
pub fn wait_until(
    deadline: Instant,
    mut done: impl FnMut() -> io::Result<bool>,
) -> io::Result<bool> {
    let mut pause = POLL_BACKOFF.0;
    loop {
        if done()? {
            return Ok(true);
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(false);
        }
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(POLL_BACKOFF.1);
    }
}

/// A v2 cgroup has no live member, here or below (`populated 0` in `cgroup.events`).
pub fn v2_is_empty(cg: &Cgroup) -> io::Result<bool> {
    Ok(events_field(&cg.read("cgroup.events")?, "populated") == Some(0))
}

/// The value of `key` in a flat-keyed cgroup file (`cgroup.events`, `memory.events`).
pub fn events_field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// What one kill of a cgroup did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CgroupKill {
    /// Processes signalled by pidfd (0 with `cgroup.kill`, which signals in the kernel).
    pub signalled: usize,
    /// Members seen before the kill (this cgroup and below).
    pub members_before: usize,
    /// Whether the cgroup was empty by the deadline.
    pub emptied: bool,
}

/// Kill everything in a v2 cgroup and wait (until `deadline`) for it to be empty.
pub fn kill_v2(cg: &Cgroup, use_kill_file: bool, deadline: Instant) -> io::Result<CgroupKill> {
    let members_before = cg.procs_recursive()?.len();
    let mut signalled = 0;
    if use_kill_file && cg.has("cgroup.kill") {
        cg.write("cgroup.kill", "1")?;
    } else {
        for _ in 0..MAX_FREEZE_KILL_ROUNDS {
            cg.write("cgroup.freeze", "1")?;
            let freeze_by = deadline.min(Instant::now() + FREEZE_TIMEOUT);
            wait_until(freeze_by, || {
                Ok(events_field(&cg.read("cgroup.events")?, "frozen") == Some(1))
            })?;
            signalled += kill_members(cg, Hierarchy::V2)?;
            cg.write("cgroup.freeze", "0")?;
            if v2_is_empty(cg)? || cg.procs_recursive()?.is_empty() {
                break;
            }
        }
    }
    let emptied = wait_until(deadline, || v2_is_empty(cg))?;
    Ok(CgroupKill {
        signalled,
        members_before,
        emptied,
    })
}

/// Kill everything in a v1 `freezer` cgroup (freeze, SIGKILL by pidfd, thaw) and wait
/// (until `deadline`) for it to be empty.
pub fn kill_v1(freezer: &Cgroup, deadline: Instant) -> io::Result<CgroupKill> {
    let members_before = freezer.procs_recursive()?.len();
    let mut signalled = 0;
    for _ in 0..MAX_FREEZE_KILL_ROUNDS {
        if freezer.procs_recursive()?.is_empty() {
            break;
        }
        freezer.write("freezer.state", "FROZEN")?;
        let freeze_by = deadline.min(Instant::now() + FREEZE_TIMEOUT);
        wait_until(freeze_by, || {
            Ok(freezer.read("freezer.state")?.trim() == "FROZEN")
        })?;
        signalled += kill_members(freezer, Hierarchy::V1Freezer)?;
        freezer.write("freezer.state", "THAWED")?;
        // Killed tasks leave the cgroup as they exit; a member left after that was forked
        // while the freeze was incomplete: go round again.
        let settle_by = deadline.min(Instant::now() + FREEZE_TIMEOUT);
        if wait_until(settle_by, || Ok(freezer.procs_recursive()?.is_empty()))? {
            break;
        }
        if Instant::now() >= deadline {
            break;
        }
    }
    let emptied = wait_until(deadline, || Ok(freezer.procs_recursive()?.is_empty()))?;
    Ok(CgroupKill {
        signalled,
        members_before,
        emptied,
    })
}

/// Name of a server instance's cgroup: `<base>-<pid>-<start time>-<seq>`, where `seq`
/// numbers the [`Containment`](super::Containment)s of one process (a server has one; tests
/// and embedders may have several).
pub fn instance_name(base: &str, pid: u32, starttime: u64, seq: u64) -> String {
    format!("{base}-{pid}-{starttime}-{seq}")
}

/// Parse an instance name made with `base`: its server's pid and start time.
pub fn parse_instance_name(name: &str, base: &str) -> Option<(u32, u64)> {
    let rest = name.strip_prefix(base)?.strip_prefix('-')?;
    let mut parts = rest.split('-');
    let (pid, start, seq) = (parts.next()?, parts.next()?, parts.next()?);
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if parts.next().is_some() || !digits(pid) || !digits(start) || !digits(seq) {
        return None;
    }
    let _: u64 = seq.parse().ok()?;
    Some((pid.parse().ok()?, start.parse().ok()?))
}

/// Whether the server that made an instance is still running: a process with that pid and
/// that start time exists and has not exited. (A pid and a start time identify one process
/// per boot; cgroups do not survive a reboot.)
pub fn instance_owner_alive(pid: u32, starttime: u64) -> bool {
    procfs::read_stat(pid).is_ok_and(|st| st.starttime == starttime && !st.is_dead())
}

/// Whether `dir` looks like a cgroup directory (it has `cgroup.procs`).
pub fn is_cgroup_dir(dir: &Path) -> bool {
    dir.join("cgroup.procs").exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_the_hybrid_layout_of_these_machines() {
        let mounts = "\
30 25 0:27 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n\
31 30 0:28 / /sys/fs/cgroup/freezer rw - cgroup cgroup rw,freezer\n\
32 30 0:29 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n\
33 30 0:30 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n\
34 30 0:31 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n";
        let mine = "8:pids:/p\n6:freezer:/\n4:memory:/m\n1:cpu,cpuacct:/\n0::/svc\n";
        let d = detect_from(mounts, mine);
        assert_eq!(
            d.v2,
            Some(Cgroup {
                dir: "/sys/fs/cgroup/unified/svc".into(),
                rel: "/svc".into()
            })
        );
        assert_eq!(
            d.freezer,
            Some(Cgroup {
                dir: "/sys/fs/cgroup/freezer".into(),
                rel: "/".into()
            })
        );
        assert_eq!(d.pids.as_ref().map(|c| c.rel.as_str()), Some("/p"));
        let f = d.freezer.unwrap().child("x-1-2");
        assert_eq!(f.rel, "/x-1-2");
        assert_eq!(f.child("s3").rel, "/x-1-2/s3");
        // v2 only, no v1 controllers.
        let d = detect_from(
            "34 30 0:31 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
            "0::/\n",
        );
        assert_eq!(d.v2.map(|c| c.dir), Some(PathBuf::from("/sys/fs/cgroup")));
        assert!(d.freezer.is_none() && d.pids.is_none());
        // Nothing mounted.
        assert_eq!(detect_from("", mine), Detected::default());
    }

    #[test]
    fn instance_names_round_trip_and_reject_lookalikes() {
        let n = instance_name("execrelay", 123, 456789, 0);
        assert_eq!(n, "execrelay-123-456789-0");
        assert_eq!(parse_instance_name(&n, "execrelay"), Some((123, 456789)));
        // A base with dashes is matched exactly, not by prefix.
        let t = instance_name("execrelay-test-a", 9, 10, 2);
        assert_eq!(parse_instance_name(&t, "execrelay-test-a"), Some((9, 10)));
        assert_eq!(parse_instance_name(&t, "execrelay"), None);
        assert_eq!(parse_instance_name(&t, "execrelay-test"), None);
        for bad in [
            "execrelay",
            "execrelay-",
            "execrelay-1",
            "execrelay-1-2",
            "execrelay-1-2-",
            "execrelay--1-2",
            "execrelay-1-2-3-4",
            "execrelay-a-2-3",
            "execrelay-1-2x-3",
            "execrelayx-1-2-3",
            "execrelay-+1-2-3",
            "execrelay-1-2-99999999999999999999999",
        ] {
            assert_eq!(parse_instance_name(bad, "execrelay"), None, "{bad}");
        }
    }

    #[test]
    fn owner_alive_checks_the_start_time() {
        let me = procfs::read_stat(std::process::id()).unwrap();
        assert!(instance_owner_alive(me.pid, me.starttime));
        assert!(!instance_owner_alive(me.pid, me.starttime + 1));
        assert!(!instance_owner_alive(u32::MAX, me.starttime));
    }

    #[test]
    fn events_fields() {
        let t = "populated 1\nfrozen 0\n";
        assert_eq!(events_field(t, "populated"), Some(1));
        assert_eq!(events_field(t, "frozen"), Some(0));
        assert_eq!(events_field(t, "missing"), None);
    }
}
