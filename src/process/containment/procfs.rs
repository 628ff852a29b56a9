//! Reading `/proc`: a process's parent, group, session, state and start time; its children;
//! the cgroups it is in; and the cgroup mounts.
//!
//! The parsers are sans-IO (plain functions over the file text, tested on strings); the
//! readers are one `read_to_string` each. Nothing here decides anything: what a pid read here
//! means must be confirmed through a pidfd (see `pidfd.rs`).

use std::collections::BTreeSet;
use std::io;
use std::path::{Path, PathBuf};

/// The fields of `/proc/<pid>/stat` containment uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// Process id.
    pub pid: u32,
    /// State letter (`R`, `S`, `D`, `T`, `Z`, …).
    pub state: char,
    /// Parent pid.
    pub ppid: u32,
    /// Process group id.
    pub pgid: u32,
    /// Session id.
    pub sid: u32,
    /// Start time in clock ticks since boot: with the pid, unique for this boot.
    pub starttime: u64,
}

impl ProcStat {
    /// A zombie (exited, not reaped) or dead process: nothing left to kill.
    pub fn is_dead(&self) -> bool {
        matches!(self.state, 'Z' | 'X' | 'x')
    }
}

/// Parse `/proc/<pid>/stat`. The command name (field 2) is in parentheses and may itself
/// contain spaces and parentheses, so fields are counted from the last `)`.
pub fn parse_stat(text: &str) -> Option<ProcStat> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let pid = text.get(..open)?.trim().parse().ok()?;
    let rest = text.get(close + 1..)?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state(3) ppid(4) pgrp(5) session(6) … starttime(22).
    Some(ProcStat {
        pid,
        state: f.first()?.chars().next()?,
        ppid: f.get(1)?.parse().ok()?,
        pgid: f.get(2)?.parse().ok()?,
        sid: f.get(3)?.parse().ok()?,
        starttime: f.get(19)?.parse().ok()?,
    })
}

/// Read `/proc/<pid>/stat`. `NotFound` when there is no such process.
pub fn read_stat(pid: u32) -> io::Result<ProcStat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    parse_stat(&text).ok_or_else(|| io::Error::other(format!("unparsable /proc/{pid}/stat")))
}

/// Parse a `children` file: pids separated by spaces.
pub fn parse_pid_list(text: &str) -> impl Iterator<Item = u32> + '_ {
    text.split_whitespace().filter_map(|s| s.parse().ok())
}

/// The children of `pid`: the union of `/proc/<pid>/task/<tid>/children` over its threads
/// (a child is listed under the thread that forked it, or the thread it was re-parented
/// to). Falls back to scanning every process's parent when the kernel lacks that file
/// (`CONFIG_PROC_CHILDREN`). An exiting process reads as having no children.
pub fn children(pid: u32) -> io::Result<BTreeSet<u32>> {
    let mut out = BTreeSet::new();
    let tasks = match std::fs::read_dir(format!("/proc/{pid}/task")) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    for t in tasks {
        let t = t?;
        match std::fs::read_to_string(t.path().join("children")) {
            Ok(text) => out.extend(parse_pid_list(&text)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if !t.path().exists() {
                    continue; // the thread ended while we listed
                }
                return children_by_scan(pid);
            }
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// Every process whose parent is `pid`, by reading every `/proc/<n>/stat`.
fn children_by_scan(pid: u32) -> io::Result<BTreeSet<u32>> {
    let mut out = BTreeSet::new();
    for n in all_pids()? {
        if let Ok(st) = read_stat(n) {
            if st.ppid == pid {
                out.insert(n);
            }
        }
    }
    Ok(out)
}

/// Every pid in `/proc`.
pub fn all_pids() -> io::Result<Vec<u32>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc")? {
        if let Some(n) = e?.file_name().to_str().and_then(|s| s.parse().ok()) {
            out.push(n);
        }
    }
    Ok(out)
}

/// One line of `/proc/<pid>/cgroup`: `ID:CONTROLLERS:PATH`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupLine {
    /// Hierarchy id (0 for cgroup v2).
    pub id: u32,
    /// Controllers bound to the hierarchy (empty for v2; `name=systemd` for named ones).
    pub controllers: Vec<String>,
    /// Path inside the hierarchy, from its root as this process's cgroup namespace sees it.
    pub path: String,
}

/// Parse `/proc/<pid>/cgroup`.
pub fn parse_cgroup_file(text: &str) -> Vec<CgroupLine> {
    text.lines()
        .filter_map(|l| {
            let mut it = l.splitn(3, ':');
            let id = it.next()?.parse().ok()?;
            let ctl = it.next()?;
            let path = it.next()?.to_string();
            let controllers = if ctl.is_empty() {
                Vec::new()
            } else {
                ctl.split(',').map(str::to_string).collect()
            };
            Some(CgroupLine {
                id,
                controllers,
                path,
            })
        })
        .collect()
}

/// The v2 path (`0::PATH`) of a parsed cgroup file.
pub fn v2_path(lines: &[CgroupLine]) -> Option<&str> {
    lines
        .iter()
        .find(|l| l.id == 0 && l.controllers.is_empty())
        .map(|l| l.path.as_str())
}

/// The v1 path of the hierarchy holding `controller`.
pub fn v1_path<'a>(lines: &'a [CgroupLine], controller: &str) -> Option<&'a str> {
    lines
        .iter()
        .find(|l| l.controllers.iter().any(|c| c == controller))
        .map(|l| l.path.as_str())
}

/// A cgroup filesystem mount from `/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupMount {
    /// Where it is mounted.
    pub mount_point: PathBuf,
    /// Which directory of the hierarchy is mounted there (usually `/`).
    pub root: String,
    /// `cgroup2` or `cgroup`.
    pub fstype: String,
    /// Super options: for v1, the controllers (`rw,freezer`).
    pub options: Vec<String>,
}

/// Parse `/proc/self/mountinfo`, keeping cgroup mounts. Octal escapes (`\040`) in paths are
/// decoded.
pub fn parse_cgroup_mounts(text: &str) -> Vec<CgroupMount> {
    text.lines()
        .filter_map(|l| {
            // ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTS [OPTIONAL…] - FSTYPE SOURCE SUPER_OPTS
            let (pre, post) = l.split_once(" - ")?;
            let pre: Vec<&str> = pre.split(' ').collect();
            let post: Vec<&str> = post.split(' ').collect();
            let fstype = (*post.first()?).to_string();
            if fstype != "cgroup" && fstype != "cgroup2" {
                return None;
            }
            Some(CgroupMount {
                mount_point: PathBuf::from(unescape(pre.get(4)?)),
                root: unescape(pre.get(3)?),
                fstype,
                options: post
                    .get(2)
                    .map(|o| o.split(',').map(str::to_string).collect())
                    .unwrap_or_default(),
            })
        })
        .collect()
}

fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' {
            if let Some(v) = b
                .get(i + 1..i + 4)
                .and_then(|o| std::str::from_utf8(o).ok())
                .and_then(|o| u8::from_str_radix(o, 8).ok())
            {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The directory of `path` (a cgroup path as `/proc/self/cgroup` shows it) under `mount`,
/// or `None` when the mount does not show that part of the hierarchy.
pub fn cgroup_dir(mount: &CgroupMount, path: &str) -> Option<PathBuf> {
    let root = mount.root.trim_end_matches('/');
    let rel = path.strip_prefix(root)?;
    if !(rel.is_empty() || rel.starts_with('/')) {
        return None;
    }
    let rel = rel.trim_start_matches('/');
    if rel.split('/').any(|c| c == "..") {
        return None;
    }
    Some(if rel.is_empty() {
        mount.mount_point.clone()
    } else {
        mount.mount_point.join(rel)
    })
}

/// Read a small cgroup or proc file as text.
pub fn read_small(path: &Path) -> io::Result<String> {
    std::fs::read_to_string(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_with_hostile_command_names() {
        let s = "4242 (a) b (c) d) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 50 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n";
        let st = parse_stat(s).unwrap();
        assert_eq!(
            st,
            ProcStat {
                pid: 4242,
                state: 'S',
                ppid: 1,
                pgid: 4242,
                sid: 4242,
                starttime: 987654
            }
        );
        assert!(!st.is_dead());
        let z = "7 (sh) Z 6 5 4 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 12 0 0";
        assert!(parse_stat(z).unwrap().is_dead());
        assert!(parse_stat("7 (sh) Z 6 5").is_none());
        assert!(parse_stat("").is_none());
        assert!(parse_stat("x (sh) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 1").is_none());
    }

    #[test]
    fn own_stat_is_readable() {
        let me = read_stat(std::process::id()).unwrap();
        assert_eq!(me.pid, std::process::id());
        assert!(!me.is_dead());
        assert_eq!(me.ppid, std::os::unix::process::parent_id());
    }

    #[test]
    fn cgroup_file_hybrid() {
        let t = "9:name=systemd:/\n8:pids:/a\n6:freezer:/b/c\n1:cpu,cpuacct:/\n0::/srv/x.service\n";
        let l = parse_cgroup_file(t);
        assert_eq!(v2_path(&l), Some("/srv/x.service"));
        assert_eq!(v1_path(&l, "freezer"), Some("/b/c"));
        assert_eq!(v1_path(&l, "pids"), Some("/a"));
        assert_eq!(v1_path(&l, "cpuacct"), Some("/"));
        assert_eq!(v1_path(&l, "memory"), None);
        assert_eq!(v2_path(&parse_cgroup_file("6:freezer:/\n")), None);
    }

    #[test]
    fn mountinfo_cgroup_mounts() {
        let t = "\
35 25 0:30 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n\
36 35 0:31 / /sys/fs/cgroup/unified rw,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate\n\
40 35 0:35 / /sys/fs/cgroup/freezer rw,relatime shared:20 - cgroup cgroup rw,freezer\n\
41 35 0:36 /sub /mnt/my\\040pids rw - cgroup cgroup rw,pids\n";
        let m = parse_cgroup_mounts(t);
        assert_eq!(m.len(), 3);
        assert_eq!(m[0].fstype, "cgroup2");
        assert_eq!(m[0].mount_point, PathBuf::from("/sys/fs/cgroup/unified"));
        assert!(m[1].options.iter().any(|o| o == "freezer"));
        assert_eq!(m[2].mount_point, PathBuf::from("/mnt/my pids"));
        assert_eq!(m[2].root, "/sub");
        assert_eq!(
            cgroup_dir(&m[0], "/srv/x.service"),
            Some(PathBuf::from("/sys/fs/cgroup/unified/srv/x.service"))
        );
        assert_eq!(
            cgroup_dir(&m[0], "/"),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        assert_eq!(
            cgroup_dir(&m[2], "/sub/a"),
            Some(PathBuf::from("/mnt/my pids/a"))
        );
        assert_eq!(cgroup_dir(&m[2], "/subway"), None);
        assert_eq!(cgroup_dir(&m[2], "/other"), None);
        assert_eq!(cgroup_dir(&m[0], "/a/../b"), None);
    }

    #[test]
    fn children_of_self_lists_a_child() {
        let mut c = std::process::Command::new("sleep")
            .arg("1000")
            .spawn()
            .unwrap();
        let kids = children(std::process::id()).unwrap();
        assert!(kids.contains(&c.id()), "{kids:?} lacks {}", c.id());
        c.kill().unwrap();
        c.wait().unwrap();
        assert!(!children(std::process::id()).unwrap().contains(&c.id()));
    }
}
