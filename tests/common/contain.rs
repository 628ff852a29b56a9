//! What `/proc` says about processes a test recorded (by pid *and* start time, so a reused
//! pid is never taken for the process it replaced), and whether this machine offers a
//! cgroup backend (tests that need one print `SKIPPED` without it, unless
//! `EXECRELAY_REQUIRE_CGROUPS=1`).

use std::time::Duration;

use serde_json::{json, Value};

use execrelay::config::BackendChoice;
use execrelay::process::containment::procfs::{self, ProcStat};
use execrelay::process::containment::{BackendKind, Containment, ContainmentConfig};

use super::process::{contains, read_until, sleeping_with_term_ignored};
use super::{eventually, text, Collected, RawClient, GUARD};

/// A process a test saw running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tracked {
    /// Its pid.
    pub pid: u32,
    /// Its start time: with the pid, it names this process for the whole boot.
    pub starttime: u64,
}

impl Tracked {
    /// Record `pid`, which must be running now.
    pub fn of(pid: u32) -> Tracked {
        let st = procfs::read_stat(pid).unwrap_or_else(|e| panic!("process {pid}: {e}"));
        assert!(!st.is_dead(), "process {pid} is not running: {st:?}");
        Tracked {
            pid,
            starttime: st.starttime,
        }
    }

    /// Its `/proc` stat, while it is this process and not a zombie.
    pub fn stat(&self) -> Option<ProcStat> {
        procfs::read_stat(self.pid)
            .ok()
            .filter(|st| st.starttime == self.starttime && !st.is_dead())
    }

    /// Whether it still runs (not gone, not a zombie, not replaced by a process that reused
    /// the pid).
    pub fn alive(&self) -> bool {
        self.stat().is_some()
    }
}

/// The first run of decimal digits after `tag` in `text` (a pid a script printed).
pub fn number_after(text: &str, tag: &str) -> Option<u32> {
    let mut rest = text;
    while let Some(i) = rest.find(tag) {
        rest = &rest[i + tag.len()..];
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        if let Ok(n) = digits.parse() {
            return Some(n);
        }
    }
    None
}

/// Wait, at most [`GUARD`] (a hang guard, not a synchronisation), until none of `procs` is
/// alive; panics naming `what` and the survivors otherwise.
pub async fn all_gone(what: &str, procs: &[Tracked]) {
    let deadline = tokio::time::Instant::now() + GUARD;
    loop {
        let left: Vec<&Tracked> = procs.iter().filter(|p| p.alive()).collect();
        if left.is_empty() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: still running: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Panics naming `what` if any of `procs` is alive now.
pub fn assert_gone(what: &str, procs: &[Tracked]) {
    let left: Vec<&Tracked> = procs.iter().filter(|p| p.alive()).collect();
    assert!(left.is_empty(), "{what}: still running: {left:?}");
}

/// Whether cgroups are required (CI): a missing backend is then a failure.
pub fn cgroups_required() -> bool {
    std::env::var("EXECRELAY_REQUIRE_CGROUPS").is_ok_and(|v| v == "1")
}

/// Whether `auto` finds a cgroup backend here (probed by opening a containment, which is
/// removed again at once). Without one, a test that needs cgroups prints `SKIPPED` and
/// returns, unless [`cgroups_required`].
pub fn cgroups_here(test: &str) -> bool {
    let probe = Containment::new(&ContainmentConfig {
        backend: BackendChoice::Auto,
        cgroup_name: "execrelay-probe".into(),
        session_pids_max: None,
    })
    .expect("auto containment always starts");
    if probe.backend() != BackendKind::None {
        return true;
    }
    assert!(
        !cgroups_required(),
        "{test}: EXECRELAY_REQUIRE_CGROUPS=1 but no cgroup backend works here"
    );
    eprintln!(
        "SKIPPED {test}: no writable cgroup here; EXECRELAY_REQUIRE_CGROUPS=1 makes this a failure"
    );
    false
}

/// Start `bash -i` on a PTY as process `id` (SIGTERM is ignored by an interactive shell, so it
/// dies by SIGKILL after `kill_grace_ms`), type `sleep 1000 &` into it, and return the shell
/// and the job. Checks the premise of the containment tests: job control put the job in a process
/// group of its own (no signal to the shell's group reaches it), in the shell's session.
pub async fn start_pty_job(c: &mut RawClient, id: &str, kill_grace_ms: u64) -> (Tracked, Tracked) {
    let r = c
        .call(
            "process/start",
            json!({
                "processId": id,
                "argv": ["bash", "--norc", "--noprofile", "-i"],
                "tty": true,
                "killGraceMs": kill_grace_ms,
                "env": {"PS1": "$ ", "TERM": "dumb", "HISTFILE": "/dev/null"},
            }),
        )
        .await;
    let shell = Tracked::of(r["pid"].as_u64().expect("pid") as u32);
    c.write(id, b"sleep 1000 & echo JOB:$!\n").await;
    let mut acc = Collected::default();
    read_until(c, id, &mut acc, "the job's pid", |a| {
        number_after(&text(&a.pty), "JOB:").is_some()
    })
    .await;
    let job = Tracked::of(number_after(&text(&acc.pty), "JOB:").expect("the job's pid"));
    let st = job.stat().expect("the job runs");
    assert_ne!(
        st.pgid, shell.pid,
        "job control gives the job its own process group"
    );
    assert_eq!(st.sid, shell.pid, "the job stays in the shell's session");
    (shell, job)
}

/// A child that ignores SIGTERM (the `exec`ed `sleep` keeps the ignored disposition), started
/// with the largest grace the server allows (`cap_ms`, its `max_kill_grace_ms`) and with
/// `extra` fields in its params, after a start with a huge grace was refused naming the cap.
/// Returns once the `sleep` runs with SIGTERM ignored.
pub async fn start_stubborn_child(c: &mut RawClient, cap_ms: u64, extra: Value) -> Tracked {
    let script = "trap '' TERM; echo ready; exec sleep 1000";
    let e = c
        .call_err(
            "process/start",
            json!({"processId": "s", "argv": ["sh", "-c", script],
                   "killGraceMs": 1_000_000_000_000u64}),
        )
        .await;
    assert_eq!(e["code"], -32602, "{e}");
    let msg = e["message"].as_str().expect("message");
    assert!(
        msg.contains("killGraceMs")
            && msg.contains("max_kill_grace_ms")
            && msg.contains(&cap_ms.to_string()),
        "the refusal names the cap: {msg}"
    );
    let mut params = json!({"processId": "s", "argv": ["sh", "-c", script], "killGraceMs": cap_ms});
    if let (Some(p), Value::Object(more)) = (params.as_object_mut(), extra) {
        p.extend(more);
    }
    let r = c.start(params).await;
    let mut acc = Collected::default();
    read_until(c, "s", &mut acc, "ready", |a| {
        contains(&a.stdout, b"ready\n")
    })
    .await;
    let child = Tracked::of(r["pid"].as_u64().expect("pid") as u32);
    // "ready" comes just before the `exec`: wait (hang guard) until `sleep` runs.
    eventually("the sleep runs with SIGTERM ignored", || {
        sleeping_with_term_ignored(child.pid as i32)
    })
    .await;
    child
}
