//! Containment primitives against real processes, checked through `/proc` and pidfds:
//! session scopes on every backend this machine offers (cgroup v2, cgroup v1, none), the
//! subreaper, pidfd signalling, group signals after the leader was reaped, `pids.max`, and
//! the crash sweep.
//!
//! This binary makes itself a child subreaper and runs the reaper, so every child it starts
//! goes through `spawn.rs` (registered) or stays in the test's own session (never reaped by
//! the reaper). Shutdown's `kill_everything` kills every process the binary started, so it
//! has its own binary (`containment_shutdown.rs`).
//!
//! cgroup tests need a writable cgroup (root, or a delegated subtree). Where there is none
//! they print `SKIPPED` and pass, unless `EXECRELAY_REQUIRE_CGROUPS=1`, which makes a missing
//! backend a failure (the CI job that runs as root sets it).

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

use execrelay::process::containment::cgroup::{self, Cgroup};
use execrelay::process::containment::procfs::{self, ProcStat};
use execrelay::process::containment::{
    subreaper, BackendChoice, Containment, ContainmentConfig, ContainmentError, Delivery, Pidfd,
    SessionScope,
};
use execrelay::process::spawn::{
    clone3_usable, spawn_into, spawn_with, CloneMethod, ClonePreference, OutputReader, SpawnSpec,
    Spawned,
};
use nix::sys::signal::Signal;
use tokio::io::{AsyncBufReadExt, BufReader};

/// Hang guard for anything that waits on the wall clock (never a synchronisation).
const HANG_GUARD: Duration = Duration::from_secs(60);

fn setup() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| subreaper::start_reaper().expect("become a subreaper"));
    assert!(subreaper::is_subreaper().unwrap());
}

fn required() -> bool {
    std::env::var("EXECRELAY_REQUIRE_CGROUPS").is_ok_and(|v| v == "1")
}

/// A containment for one test (its own instance name), or `None` (with a loud line) when the
/// backend is unavailable and not required.
fn open(kind: BackendChoice, tag: &str, pids_max: Option<u64>) -> Option<Containment> {
    setup();
    let cfg = ContainmentConfig {
        backend: kind,
        cgroup_name: format!("execrelay-test-{tag}"),
        session_pids_max: pids_max,
    };
    match Containment::new(&cfg) {
        Ok(c) => {
            // Leftovers of an earlier, killed run of this very test.
            let r = c.sweep_stale();
            assert!(r.failures.is_empty(), "{r:?}");
            Some(c)
        }
        Err(e) if kind != BackendChoice::None && !required() => {
            eprintln!(
                "SKIPPED: {kind:?} containment unavailable here ({e}); \
                 EXECRELAY_REQUIRE_CGROUPS=1 makes this a failure"
            );
            None
        }
        Err(e) => panic!("{kind:?} containment unavailable: {e}"),
    }
}

fn spec(argv: &[&str]) -> SpawnSpec {
    SpawnSpec::command(argv)
}

/// A spawned child with its stdout as lines (stderr kept open so it never gets SIGPIPE).
struct Child {
    sp: Spawned,
    out: BufReader<OutputReader>,
    _err: Option<OutputReader>,
}

impl Child {
    fn start(argv: &[&str], scope: Option<&SessionScope>) -> Child {
        Child::start_with(argv, scope, ClonePreference::Auto)
    }

    /// Start through the clone `pref` allows.
    fn start_with(argv: &[&str], scope: Option<&SessionScope>, pref: ClonePreference) -> Child {
        let mut sp = spawn_with(&spec(argv), scope, pref).expect("spawn");
        let mut outs = std::mem::take(&mut sp.outputs).into_iter();
        let (_, out) = outs.next().unwrap();
        let err = outs.next().map(|(_, e)| e);
        Child {
            sp,
            out: BufReader::new(out),
            _err: err,
        }
    }

    fn pid(&self) -> u32 {
        self.sp.pid
    }

    /// Check the child was created the way `pref` asks for in a scope of `kind`: inside a v2
    /// scope's cgroup by `clone3` wherever it is usable, else by `clone` (the child wrote
    /// itself into its cgroup).
    fn assert_method(&self, kind: BackendChoice, pref: ClonePreference) {
        let want =
            if kind == BackendChoice::Cgroup2 && pref == ClonePreference::Auto && clone3_usable() {
                CloneMethod::Clone3IntoCgroup
            } else {
                CloneMethod::CloneVfork
            };
        assert_eq!(self.sp.method, want, "{kind:?} {pref:?}");
    }

    async fn line(&mut self) -> String {
        let mut l = String::new();
        tokio::time::timeout(HANG_GUARD, self.out.read_line(&mut l))
            .await
            .expect("hang guard: no line from the child")
            .unwrap();
        l
    }

    async fn pids(&mut self) -> Vec<u32> {
        let l = self.line().await;
        let pids: Vec<u32> = l.split_whitespace().map(|p| p.parse().unwrap()).collect();
        assert!(!pids.is_empty(), "no pids in {l:?}");
        pids
    }

    /// Reap the direct child through the reap gate.
    async fn wait(&mut self) -> std::process::ExitStatus {
        tokio::time::timeout(HANG_GUARD, self.sp.child.wait())
            .await
            .expect("hang guard: direct child did not exit")
            .unwrap()
    }
}

/// A process the test saw, held by pidfd.
struct Seen {
    fd: Pidfd,
    stat: ProcStat,
}

fn comm(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// Open a pidfd for `pid` and check it is a live `sleep` (the stat read after the open, the
/// pidfd checked after the read: the stat is this process's). `$!` names the process as
/// soon as the shell forked it: it may take a moment to exec `sleep` (polled, hang guard).
fn see(pid: u32) -> Seen {
    let fd = Pidfd::open(pid).unwrap();
    let deadline = Instant::now() + HANG_GUARD;
    assert!(
        cgroup::wait_until(deadline, || Ok(comm(pid) == "sleep")).unwrap(),
        "{pid} never became sleep"
    );
    let stat = procfs::read_stat(pid).unwrap();
    assert!(fd.is_unreaped() && !stat.is_dead());
    Seen { fd, stat }
}

fn me() -> u32 {
    std::process::id()
}

/// Wait (hang guard only) until the reaper has reaped `fd`'s process, our adopted child.
fn assert_reaped_by_reaper(s: &Seen) {
    let deadline = Instant::now() + HANG_GUARD;
    let ok = cgroup::wait_until(deadline, || Ok(!s.fd.is_unreaped())).unwrap();
    assert!(ok, "orphan {} was never reaped", s.stat.pid);
}

fn kill_by_pidfd(s: &Seen) {
    assert_eq!(s.fd.signal(Signal::SIGKILL).unwrap(), Delivery::Delivered);
    assert_eq!(
        execrelay::process::containment::pidfd::wait_all_exited(&[&s.fd], HANG_GUARD).unwrap(),
        0
    );
}

/// Every cgroup of `scope` appears in the process's `/proc/<pid>/cgroup`.
fn assert_in_scope_cgroups(pid: u32, scope: &SessionScope) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    for dir in scope.cgroup_dirs() {
        let tail: PathBuf = dir
            .iter()
            .rev()
            .take(2)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        let tail = tail.to_string_lossy().to_string();
        assert!(
            text.lines().any(|l| l.ends_with(&format!("/{tail}"))),
            "{pid} not in {tail}: {text}"
        );
    }
}

#[derive(Clone, Copy)]
struct Scenario {
    argv: &'static [&'static str],
    /// The direct child exits on its own after printing.
    leader_exits: bool,
    /// With the `none` backend this process cannot be attributed to its session.
    escapes_none: bool,
    /// What the process tree must look like (pid of the direct child; the seen process).
    check: fn(u32, &ProcStat),
}

const BG_HOLDING_STDOUT: Scenario = Scenario {
    argv: &["sh", "-c", "sleep 1000 & echo $!; exit 0"],
    leader_exits: true,
    escapes_none: false,
    check: |d, st| assert!(st.sid == d && st.pgid == d && st.ppid == me(), "{st:?}"),
};

const BG_ON_DEV_NULL: Scenario = Scenario {
    argv: &["sh", "-c", "sleep 1000 >/dev/null 2>&1 & echo $!; exit 0"],
    leader_exits: true,
    escapes_none: false,
    check: |d, st| assert!(st.sid == d && st.pgid == d && st.ppid == me(), "{st:?}"),
};

const SETSID_CHILD: Scenario = Scenario {
    argv: &["sh", "-c", "setsid sleep 1000 & echo $!; wait"],
    leader_exits: false,
    escapes_none: false,
    check: |d, st| {
        assert!(
            st.sid == st.pid && st.pgid == st.pid && st.ppid == d,
            "{st:?}"
        )
    },
};

const OWN_PROCESS_GROUP: Scenario = Scenario {
    // Job control gives the job its own process group, as `bash -i` does.
    argv: &["bash", "-c", "set -m; sleep 1000 & echo $!; exit 0"],
    leader_exits: true,
    escapes_none: false,
    check: |d, st| {
        assert!(
            st.sid == d && st.pgid == st.pid && st.ppid == me(),
            "{st:?}"
        )
    },
};

const DOUBLE_FORK: Scenario = Scenario {
    argv: &["sh", "-c", "(sleep 1000 & echo $!); exit 0"],
    leader_exits: true,
    escapes_none: false,
    check: |d, st| assert!(st.sid == d && st.ppid == me(), "{st:?}"),
};

const SETSID_DOUBLE_FORK: Scenario = Scenario {
    argv: &["sh", "-c", "setsid sh -c 'sleep 1000 & echo $!'; exit 0"],
    leader_exits: true,
    escapes_none: true,
    check: |d, st| assert!(st.sid != d && st.sid != st.pid && st.ppid == me(), "{st:?}"),
};

async fn run_scenario(kind: BackendChoice, tag: &str, sc: Scenario, pref: ClonePreference) {
    let Some(c) = open(kind, tag, None) else {
        return;
    };
    let scope = c.open_scope().unwrap();
    let mut child = Child::start_with(sc.argv, Some(&scope), pref);
    child.assert_method(kind, pref);
    let d = child.pid();
    let pids = child.pids().await;
    let seen: Vec<Seen> = pids.iter().map(|p| see(*p)).collect();
    if sc.leader_exits {
        assert_eq!(child.wait().await.code(), Some(0));
    }
    for s in &seen {
        // Re-read now that the leader is gone: orphans were re-parented to us.
        let st = procfs::read_stat(s.stat.pid).unwrap();
        assert!(s.fd.is_unreaped());
        (sc.check)(d, &st);
        if kind != BackendChoice::None {
            assert_in_scope_cgroups(st.pid, &scope);
        }
    }
    assert!(!scope.is_empty().unwrap() || (kind == BackendChoice::None && sc.escapes_none));

    let report = tokio::time::timeout(HANG_GUARD, scope.kill_all())
        .await
        .expect("hang guard")
        .unwrap();
    assert!(report.emptied, "{report:?}");
    if !sc.leader_exits {
        assert_eq!(child.wait().await.signal(), Some(libc::SIGKILL));
    }
    let escapes = kind == BackendChoice::None && sc.escapes_none;
    for s in &seen {
        // kill_all returned only after everything exited: no waiting here.
        assert_eq!(
            s.fd.has_exited().unwrap(),
            !escapes,
            "{:?} after kill_all ({kind:?})",
            s.stat
        );
    }
    if escapes {
        // What the `none` backend cannot do (SECURITY.md): an orphan that started its own
        // session belongs to no known session. Shutdown kills it (containment_shutdown.rs).
        assert!(scope.is_empty().unwrap());
        for s in &seen {
            assert_eq!(procfs::read_stat(s.stat.pid).unwrap().ppid, me());
            kill_by_pidfd(s);
        }
    }
    for s in &seen {
        assert_reaped_by_reaper(s);
    }
    assert!(scope.is_empty().unwrap());
    let dirs = scope.cgroup_dirs();
    scope.remove().unwrap();
    for d in dirs {
        assert!(!d.exists(), "{} left behind", d.display());
    }
    // Nothing can be placed in a removed scope.
    match spawn_into(&spec(&["true"]), Some(&scope)) {
        Err(e) => assert!(e.to_string().contains("closed"), "{e}"),
        Ok(_) => panic!("spawned into a removed scope"),
    }
}

macro_rules! scenario_tests {
    ($($name:ident: $sc:expr;)*) => {$(
        mod $name {
            use super::*;
            #[tokio::test]
            async fn cgroup2() {
                let tag = concat!(stringify!($name), "-v2");
                run_scenario(BackendChoice::Cgroup2, tag, $sc, ClonePreference::Auto).await
            }
            /// The fallback: `clone`, the child writing itself into the v2 cgroup.
            #[tokio::test]
            async fn cgroup2_clone_only() {
                let tag = concat!(stringify!($name), "-v2c");
                run_scenario(BackendChoice::Cgroup2, tag, $sc, ClonePreference::CloneOnly).await
            }
            #[tokio::test]
            async fn cgroup1() {
                let tag = concat!(stringify!($name), "-v1");
                run_scenario(BackendChoice::Cgroup1, tag, $sc, ClonePreference::Auto).await
            }
            #[tokio::test]
            async fn none() {
                let tag = concat!(stringify!($name), "-none");
                run_scenario(BackendChoice::None, tag, $sc, ClonePreference::Auto).await
            }
        }
    )*};
}

scenario_tests! {
    background_holding_stdout: BG_HOLDING_STDOUT;
    background_on_dev_null: BG_ON_DEV_NULL;
    setsid_child: SETSID_CHILD;
    own_process_group: OWN_PROCESS_GROUP;
    double_fork: DOUBLE_FORK;
    setsid_double_fork: SETSID_DOUBLE_FORK;
}

/// A session that keeps forking while it is killed: nothing of it is left afterwards.
async fn run_fork_storm(kind: BackendChoice, tag: &str) {
    let Some(c) = open(kind, tag, None) else {
        return;
    };
    let scope = c.open_scope().unwrap();
    let mut child = Child::start(
        &[
            "sh",
            "-c",
            "echo go; i=0; while [ $i -lt 300 ]; do sleep 1000 & i=$((i+1)); done; wait",
        ],
        Some(&scope),
    );
    let d = child.pid();
    assert_eq!(child.line().await.trim(), "go");
    let report = tokio::time::timeout(HANG_GUARD, scope.kill_all())
        .await
        .expect("hang guard")
        .unwrap();
    assert!(report.emptied, "{report:?}");
    assert_eq!(child.wait().await.signal(), Some(libc::SIGKILL));
    // No live process of that session anywhere on the host.
    for pid in procfs::all_pids().unwrap() {
        if let Ok(st) = procfs::read_stat(pid) {
            assert!(st.sid != d || st.is_dead(), "left alive: {st:?}");
        }
    }
    assert!(scope.is_empty().unwrap());
    scope.remove().unwrap();
}

#[tokio::test]
async fn fork_storm_cgroup2() {
    run_fork_storm(BackendChoice::Cgroup2, "storm-v2").await
}

#[tokio::test]
async fn fork_storm_cgroup1() {
    run_fork_storm(BackendChoice::Cgroup1, "storm-v1").await
}

#[tokio::test]
async fn fork_storm_none() {
    run_fork_storm(BackendChoice::None, "storm-none").await
}

/// After the leader was reaped, `killpg` is refused; the scope reaches the group's members
/// by pidfd, and only them.
async fn run_group_after_leader(kind: BackendChoice, tag: &str) {
    let Some(c) = open(kind, tag, None) else {
        return;
    };
    let scope = c.open_scope().unwrap();
    let mut child = Child::start(
        &[
            "bash",
            "-c",
            "sleep 1000 & a=$!; set -m; sleep 1000 & echo $a $!; exit 0",
        ],
        Some(&scope),
    );
    let d = child.pid();
    let pids = child.pids().await;
    let (in_group, own_group) = (see(pids[0]), see(pids[1]));
    assert_eq!(in_group.stat.pgid, d);
    assert_eq!(own_group.stat.pgid, own_group.stat.pid);
    assert_eq!(child.wait().await.code(), Some(0));
    let direct = child.sp.direct.clone();
    assert!(direct.is_reaped());
    assert_eq!(
        direct.signal_group(Signal::SIGTERM).unwrap(),
        Delivery::Gone
    );
    assert_eq!(direct.signal(Signal::SIGTERM).unwrap(), Delivery::Gone);
    assert_eq!(scope.signal_group_members(d, None).unwrap(), 1);
    assert_eq!(
        scope
            .signal_group_members(d, Some(Signal::SIGKILL))
            .unwrap(),
        1
    );
    assert_eq!(
        execrelay::process::containment::pidfd::wait_all_exited(&[&in_group.fd], HANG_GUARD)
            .unwrap(),
        0
    );
    assert!(
        !own_group.fd.has_exited().unwrap(),
        "the other group was hit"
    );
    assert_eq!(scope.signal_group_members(d, None).unwrap(), 0);
    let report = scope.kill_all().await.unwrap();
    assert!(report.emptied);
    assert!(own_group.fd.has_exited().unwrap());
    scope.remove().unwrap();
}

#[tokio::test]
async fn group_members_after_the_leader_was_reaped_cgroup2() {
    run_group_after_leader(BackendChoice::Cgroup2, "group-v2").await
}

#[tokio::test]
async fn group_members_after_the_leader_was_reaped_cgroup1() {
    run_group_after_leader(BackendChoice::Cgroup1, "group-v1").await
}

#[tokio::test]
async fn group_members_after_the_leader_was_reaped_none() {
    run_group_after_leader(BackendChoice::None, "group-none").await
}

#[tokio::test]
async fn group_signal_only_while_the_leader_is_unreaped() {
    setup();
    let mut child = Child::start(&["sh", "-c", "sleep 1000 & echo $!; wait"], None);
    let sleeper = see(child.pids().await[0]);
    let direct = child.sp.direct.clone();
    assert_eq!(direct.pid(), child.pid());
    assert_eq!(
        direct.signal_group(Signal::SIGKILL).unwrap(),
        Delivery::Delivered
    );
    assert_eq!(child.wait().await.signal(), Some(libc::SIGKILL));
    assert!(
        sleeper.fd.has_exited().unwrap() || {
            execrelay::process::containment::pidfd::wait_all_exited(&[&sleeper.fd], HANG_GUARD)
                .unwrap()
                == 0
        }
    );
    // Reaped: neither the pid nor the group id may be used any more.
    assert!(direct.is_reaped());
    assert_eq!(
        direct.signal_group(Signal::SIGTERM).unwrap(),
        Delivery::Gone
    );
    assert_eq!(direct.signal(Signal::SIGTERM).unwrap(), Delivery::Gone);
    assert_reaped_by_reaper(&sleeper);
}

#[tokio::test]
async fn the_reaper_never_takes_a_direct_or_foreign_childs_status() {
    setup();
    // Each direct child leaves an orphan (re-parented to us) and exits with its own code.
    let mut children = Vec::new();
    let mut orphans = Vec::new();
    for i in 0..24 {
        let code = i % 7 + 1;
        let script = format!("(sleep 1000 & echo $!); exit {code}");
        let mut c = Child::start(&["sh", "-c", &script], None);
        orphans.push(see(c.pids().await[0]));
        children.push((code, c));
    }
    // A foreign child (the test's own session): the reaper must leave it to std.
    let mut foreign = std::process::Command::new("sh")
        .args(["-c", "exit 5"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let foreign_fd = Pidfd::open(foreign.id()).unwrap();
    // Orphans die while every direct child and the foreign one are unreaped zombies; the
    // reaper runs (SIGCHLD) and we force passes too.
    for o in &orphans {
        kill_by_pidfd(o);
    }
    let mut all: Vec<&Pidfd> = children.iter().map(|(_, c)| c.sp.direct.pidfd()).collect();
    all.push(&foreign_fd);
    assert_eq!(
        execrelay::process::containment::pidfd::wait_all_exited(&all, HANG_GUARD).unwrap(),
        0
    );
    for _ in 0..3 {
        subreaper::reap_orphans().unwrap();
    }
    for o in &orphans {
        assert_reaped_by_reaper(o);
    }
    for (i, (code, mut c)) in children.into_iter().enumerate() {
        let status = if i % 2 == 0 {
            c.wait().await
        } else {
            // The direct child's own wait (the same reap gate, reached through the handle).
            tokio::time::timeout(HANG_GUARD, c.sp.direct.wait())
                .await
                .expect("hang guard")
                .expect("the direct child's status was taken")
        };
        assert_eq!(status.code(), Some(code));
    }
    assert_eq!(foreign.wait().unwrap().code(), Some(5));
}

/// The child is in its scope's cgroup when the program starts: it reads its own cgroup.
async fn run_placement_before_exec(kind: BackendChoice, tag: &str, pref: ClonePreference) {
    let Some(c) = open(kind, tag, None) else {
        return;
    };
    let scope = c.open_scope().unwrap();
    let mut child = Child::start_with(&["cat", "/proc/self/cgroup"], Some(&scope), pref);
    child.assert_method(kind, pref);
    let mut text = String::new();
    loop {
        let l = child.line().await;
        if l.is_empty() {
            break;
        }
        text.push_str(&l);
    }
    for dir in scope.cgroup_dirs() {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let inst = dir
            .parent()
            .unwrap()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .to_string();
        assert!(
            text.lines()
                .any(|l| l.ends_with(&format!("/{inst}/{name}"))),
            "{text}"
        );
    }
    assert_eq!(child.wait().await.code(), Some(0));
    scope.remove().unwrap();
}

#[tokio::test]
async fn placement_happens_before_exec_cgroup2() {
    run_placement_before_exec(BackendChoice::Cgroup2, "place-v2", ClonePreference::Auto).await
}

#[tokio::test]
async fn placement_happens_before_exec_cgroup2_clone_only() {
    let pref = ClonePreference::CloneOnly;
    run_placement_before_exec(BackendChoice::Cgroup2, "place-v2c", pref).await
}

#[tokio::test]
async fn placement_happens_before_exec_cgroup1() {
    run_placement_before_exec(BackendChoice::Cgroup1, "place-v1", ClonePreference::Auto).await
}

#[tokio::test]
async fn a_killed_scope_refuses_new_processes_none() {
    let c = open(BackendChoice::None, "closed-none", None).unwrap();
    let scope = c.open_scope().unwrap();
    scope.kill_all().await.unwrap();
    match spawn_into(&spec(&["true"]), Some(&scope)) {
        Err(e) => assert!(e.to_string().contains("closed"), "{e}"),
        Ok(_) => panic!("spawned into a killed scope"),
    }
    assert!(matches!(
        scope.begin_placement(),
        Err(ContainmentError::ScopeClosed)
    ));
}

#[tokio::test]
async fn remove_refuses_a_scope_with_processes() {
    let Some(c) = open(BackendChoice::Cgroup2, "busy-v2", None)
        .or_else(|| open(BackendChoice::None, "busy-none", None))
    else {
        return;
    };
    let scope = c.open_scope().unwrap();
    let mut child = Child::start(&["sh", "-c", "echo ready; exec sleep 1000"], Some(&scope));
    assert_eq!(child.line().await.trim(), "ready");
    assert!(matches!(scope.remove(), Err(ContainmentError::NotEmpty)));
    scope.kill_all().await.unwrap();
    assert_eq!(child.wait().await.signal(), Some(libc::SIGKILL));
    scope.remove().unwrap();
}

/// `pids.max` per session, at its edge: with 4, the shell and 3 sleeps fit and the next
/// fork is refused (counted in `pids.events`).
async fn run_pids_max(kind: BackendChoice, tag: &str, pref: ClonePreference) {
    setup();
    let cfg = ContainmentConfig {
        backend: kind,
        cgroup_name: format!("execrelay-test-{tag}"),
        session_pids_max: Some(4),
    };
    let c = match Containment::new(&cfg) {
        Ok(c) => {
            let r = c.sweep_stale();
            assert!(r.failures.is_empty(), "{r:?}");
            c
        }
        Err(e) => {
            // Only acceptable when the controller is really missing, with a clear error.
            let msg = e.to_string();
            assert!(msg.contains("pids"), "{msg}");
            if required() && kind == BackendChoice::Cgroup1 {
                panic!("{msg}");
            }
            eprintln!("SKIPPED: pids.max on {kind:?} unavailable here: {msg}");
            return;
        }
    };
    let scope = c.open_scope().unwrap();
    let mut child = Child::start_with(
        &[
            "sh",
            "-c",
            "echo go; for i in 1 2 3 4 5 6; do sleep 1000 & done; wait",
        ],
        Some(&scope),
        pref,
    );
    child.assert_method(kind, pref);
    assert_eq!(child.line().await.trim(), "go");
    let dir = scope
        .cgroup_dirs()
        .into_iter()
        .find(|d| d.join("pids.max").exists())
        .expect("a cgroup with pids.max");
    assert_eq!(
        std::fs::read_to_string(dir.join("pids.max"))
            .unwrap()
            .trim(),
        "4"
    );
    let refused = || -> std::io::Result<u64> {
        let ev = std::fs::read_to_string(dir.join("pids.events"))?;
        Ok(ev
            .lines()
            .find_map(|l| l.strip_prefix("max "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0))
    };
    let deadline = Instant::now() + HANG_GUARD;
    assert!(cgroup::wait_until(deadline, || Ok(refused()? >= 1)).unwrap());
    let procs = || -> Vec<u32> {
        procfs::parse_pid_list(
            &std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default(),
        )
        .collect()
    };
    // The forked children exec `sleep` in their own time (polled, hang guard).
    let sleeps = || procs().into_iter().filter(|p| comm(*p) == "sleep").count();
    let deadline = Instant::now() + HANG_GUARD;
    assert!(cgroup::wait_until(deadline, || Ok(sleeps() >= 3)).unwrap());
    assert_eq!(sleeps(), 3, "{:?}", procs());
    assert!(procs().len() <= 4, "{:?}", procs());
    let current: u64 = std::fs::read_to_string(dir.join("pids.current"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(current <= 4, "pids.current {current}");
    assert!(scope.kill_all().await.unwrap().emptied);
    // The shell was SIGKILLed, or gave up after the refused fork.
    let st = child.wait().await;
    assert!(
        st.signal() == Some(libc::SIGKILL) || st.code().is_some(),
        "{st:?}"
    );
    scope.remove().unwrap();
}

#[tokio::test]
async fn pids_max_caps_a_session_cgroup1() {
    run_pids_max(BackendChoice::Cgroup1, "pids-v1", ClonePreference::Auto).await
}

#[tokio::test]
async fn pids_max_caps_a_session_cgroup2() {
    run_pids_max(BackendChoice::Cgroup2, "pids-v2", ClonePreference::Auto).await
}

#[tokio::test]
async fn pids_max_caps_a_session_cgroup2_clone_only() {
    run_pids_max(
        BackendChoice::Cgroup2,
        "pids-v2c",
        ClonePreference::CloneOnly,
    )
    .await
}

/// A dead server's instance cgroup with a live process in it: the sweep kills the process
/// and removes the directories; a live instance and a lookalike name are left alone.
fn run_crash_sweep(
    kind: BackendChoice,
    tag: &str,
    parent_of: fn(&cgroup::Detected) -> Option<Cgroup>,
) {
    let Some(c) = open(kind, tag, None) else {
        return;
    };
    let base = format!("execrelay-test-{tag}");
    let parent = parent_of(&cgroup::detect()).unwrap();
    // A "server" that is dead: its pid and start time no longer name a live process.
    let mut dead = std::process::Command::new("true").spawn().unwrap();
    let dead_stat = procfs::read_stat(dead.id()).unwrap();
    dead.wait().unwrap();
    let inst = parent.child(&cgroup::instance_name(
        &base,
        dead_stat.pid,
        dead_stat.starttime,
        0,
    ));
    inst.create().unwrap();
    let sess = inst.child("s1");
    sess.create().unwrap();
    // What it left running (a child of the test, in the test's session: not the reaper's).
    let mut orphan = std::process::Command::new("sleep")
        .arg("1000")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    sess.write("cgroup.procs", &orphan.id().to_string())
        .unwrap();
    assert_eq!(sess.procs().unwrap(), vec![orphan.id()]);
    let lookalike = parent.child(&format!(
        "{base}x-{}-{}-0",
        dead_stat.pid, dead_stat.starttime
    ));
    lookalike.create().unwrap();

    let r = c.sweep_stale();
    assert!(r.failures.is_empty(), "{r:?}");
    assert_eq!(r.instances_removed, 1, "{r:?}");
    assert_eq!(r.processes_killed, 1, "{r:?}");
    assert_eq!(orphan.wait().unwrap().signal(), Some(libc::SIGKILL));
    assert!(!inst.exists());
    assert!(lookalike.exists(), "a name that is not ours was touched");
    for d in c.instance_dirs() {
        assert!(d.exists(), "the live instance was swept");
    }
    lookalike.remove_tree().unwrap();
    // A second sweep finds nothing.
    let again = c.sweep_stale();
    assert_eq!((again.instances_removed, again.processes_killed), (0, 0));
}

#[test]
fn crash_sweep_kills_a_dead_servers_instance_cgroup2() {
    run_crash_sweep(BackendChoice::Cgroup2, "sweep-v2", |d| d.v2.clone())
}

#[test]
fn crash_sweep_kills_a_dead_servers_instance_cgroup1() {
    run_crash_sweep(BackendChoice::Cgroup1, "sweep-v1", |d| d.freezer.clone())
}

/// The v2 freeze path (kernels without `cgroup.kill`), on the low-level function, with a
/// process that keeps forking while it is killed.
#[tokio::test]
async fn cgroup2_kill_without_the_kill_file() {
    let Some(c) = open(BackendChoice::Cgroup2, "freeze-v2", None) else {
        return;
    };
    let scope = c.open_scope().unwrap();
    let mut child = Child::start(
        &["sh", "-c", "echo go; while :; do sleep 1000 & done"],
        Some(&scope),
    );
    assert_eq!(child.line().await.trim(), "go");
    let dir = scope.cgroup_dirs().remove(0);
    let own = cgroup::detect().v2.unwrap();
    let inst = dir.parent().unwrap().file_name().unwrap().to_str().unwrap();
    let cg = own
        .child(inst)
        .child(dir.file_name().unwrap().to_str().unwrap());
    assert_eq!(cg.dir, dir);
    let deadline = Instant::now() + HANG_GUARD;
    assert!(cgroup::wait_until(deadline, || Ok(cg.procs()?.len() >= 3)).unwrap());
    let k = tokio::task::spawn_blocking(move || {
        cgroup::kill_v2(&cg, false, Instant::now() + HANG_GUARD).unwrap()
    })
    .await
    .unwrap();
    assert!(k.emptied && k.signalled >= 3, "{k:?}");
    assert_eq!(child.wait().await.signal(), Some(libc::SIGKILL));
    assert!(scope.is_empty().unwrap());
    scope.remove().unwrap();
}

#[tokio::test]
async fn scopes_of_one_containment_do_not_touch_each_other() {
    let kinds = [
        BackendChoice::Cgroup2,
        BackendChoice::Cgroup1,
        BackendChoice::None,
    ];
    for kind in kinds {
        let tag = format!("two-{kind:?}").to_lowercase();
        let Some(c) = open(kind, &tag, None) else {
            continue;
        };
        let a: Arc<SessionScope> = c.open_scope().unwrap();
        let b = c.open_scope().unwrap();
        let mut ca = Child::start(&["sh", "-c", "sleep 1000 & echo $!; exit 0"], Some(&a));
        let mut cb = Child::start(&["sh", "-c", "sleep 1000 & echo $!; exit 0"], Some(&b));
        let sa = see(ca.pids().await[0]);
        let sb = see(cb.pids().await[0]);
        ca.wait().await;
        cb.wait().await;
        assert!(a.kill_all().await.unwrap().emptied);
        assert!(sa.fd.has_exited().unwrap());
        assert!(
            !sb.fd.has_exited().unwrap(),
            "{kind:?}: b's process was killed with a"
        );
        assert!(!b.is_empty().unwrap());
        assert!(b.kill_all().await.unwrap().emptied);
        assert!(sb.fd.has_exited().unwrap());
        a.remove().unwrap();
        b.remove().unwrap();
    }
}

/// Several containments in one process (tests, embedders) with the same name each get their
/// own instance cgroup, and one's sweep leaves the other (alive, same pid) alone.
#[test]
fn containments_of_one_process_share_a_name_safely() {
    let Some(first) = open(BackendChoice::Cgroup2, "twice", None)
        .or_else(|| open(BackendChoice::Cgroup1, "twice", None))
    else {
        return;
    };
    let second = open(
        match first.backend() {
            execrelay::process::containment::BackendKind::Cgroup2 => BackendChoice::Cgroup2,
            _ => BackendChoice::Cgroup1,
        },
        "twice",
        None,
    )
    .unwrap();
    let (a, b) = (first.instance_dirs(), second.instance_dirs());
    assert_ne!(a, b);
    assert_eq!(second.sweep_stale().instances_removed, 0);
    assert!(a.iter().chain(&b).all(|d| d.exists()));
    drop(first);
    assert!(
        a.iter().all(|d| !d.exists()),
        "an empty instance goes with its last handle"
    );
    assert!(b.iter().all(|d| d.exists()));
}
