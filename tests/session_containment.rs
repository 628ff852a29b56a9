//! The end of a session, through a real `ConnectionProcessor` in this process (the
//! server's own registry and containment, started as the composition root starts them):
//! everything a session started is gone when the session is closed or expires, checked in
//! `/proc` by pid and start time, on the backend `auto` picks here and on `none`.
//!
//! - item 1: `sh -c 'sleep 1000 & …; exit 0'`, the job holding stdout or not, after
//!   `session/close` and after the detached TTL, with and without acks, once the exited
//!   process's entry is gone;
//! - item 2: `bash -i` on a PTY with `sleep 1000 &` typed into it (job control gives the job
//!   its own process group), after `session/close` and after the TTL;
//! - item 4: `process/terminate` of an exited process signals no process group that reused
//!   its number;
//! - item 5: a client's `killGraceMs` above `max_kill_grace_ms` is refused, and a child that
//!   ignores SIGTERM is gone within the cap after expiry or `session/close`.
//!
//! The server process dying (SIGTERM, SIGKILL and a restart) is in `server_containment.rs`.
//! Waits on `/proc` are bounded by a hang guard and never stand in for synchronisation.

mod common;

use std::os::unix::process::CommandExt;
use std::time::Duration;

use serde_json::{json, Value};

use common::contain::{
    all_gone, assert_gone, number_after, start_pty_job, start_stubborn_child, Tracked,
};
use common::*;
use execrelay::config::{BackendChoice, ServerConfig};

/// The detached TTL of these tests.
const TTL_MS: u64 = 300;

fn config(backend: BackendChoice) -> ServerConfig {
    ServerConfig {
        detached_session_ttl_ms: TTL_MS,
        // Without acks, an exited process's entry goes 50 ms after its exit notice was
        // written: before the session ends (the situation of item 1).
        exited_retention_ms: 50,
        containment_backend: backend,
        ..cfg()
    }
}

/// `initialize` (with or without acks) + `initialized`.
async fn init(c: &mut RawClient, acks: bool) {
    c.call(
        "initialize",
        json!({"clientName": "test", "capabilities": {"acks": acks}}),
    )
    .await;
    c.notify("initialized", json!({})).await;
}

/// Wait (hang guard) until `process/list` is empty: the session no longer knows any process.
async fn until_no_process_is_known(c: &mut RawClient) {
    let deadline = tokio::time::Instant::now() + GUARD;
    loop {
        let list = c.call("process/list", json!({})).await;
        if list["processes"].as_array().is_some_and(Vec::is_empty) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the exited process stays listed: {list}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// How the session ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// `session/close`: answered once everything is gone.
    Close,
    /// The connection goes away and the detached TTL passes.
    Expiry,
}

/// End the session of `t` as `end` says, then check that none of `procs` is left.
async fn end_and_check(t: InProcess, end: End, procs: &[Tracked]) {
    let mut t = t;
    match end {
        End::Close => {
            assert_eq!(t.client.call("session/close", json!({})).await, json!({}));
            // The reply comes once the session's processes are gone: no waiting here.
            assert_gone("right after session/close answered", procs);
            t.hang_up().await;
        }
        End::Expiry => {
            assert!(procs.iter().all(Tracked::alive), "alive while attached");
            t.hang_up().await;
            all_gone("after the detached TTL", procs).await;
        }
    }
}

// Item 1 -------------------------------------------------------------------------------------

/// `sh -c 'sleep 1000 & echo JOB:$!; exit 0'`: the shell exits at once and its exit notice is
/// delivered (and acknowledged, with acks), so the session forgets the process; the
/// background `sleep` must still end with the session.
async fn background_job(backend: BackendChoice, hold_stdout: bool, acks: bool, end: End) {
    let reg = new_registry(config(backend));
    let mut t = connect_to(&reg);
    init(&mut t.client, acks).await;
    let script = if hold_stdout {
        "sleep 1000 & echo JOB:$!; exit 0"
    } else {
        "sleep 1000 >/dev/null 2>&1 & echo JOB:$!; exit 0"
    };
    let got = t
        .client
        .run(json!({"processId": "p", "argv": ["sh", "-c", script], "drainTimeoutMs": 200}))
        .await;
    assert_eq!(got.exit["exitCode"], 0, "{}", got.exit);
    // Holding stdout, the job keeps the pipe open until the drain deadline cuts it.
    assert_eq!(got.exit["outputDrainTimedOut"], hold_stdout, "{}", got.exit);
    let job = Tracked::of(number_after(&text(&got.stdout), "JOB:").expect("the job's pid"));
    if acks {
        let seq = *got.seqs.last().expect("the exit notice's seq");
        t.client
            .notify("process/ack", json!({"processId": "p", "seq": seq}))
            .await;
    }
    until_no_process_is_known(&mut t.client).await;
    assert!(job.alive(), "the background job outlived its shell");
    end_and_check(t, end, &[job]).await;
}

macro_rules! background_job_tests {
    ($($name:ident: $backend:ident, $hold:expr, $acks:expr, $end:ident;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            background_job(BackendChoice::$backend, $hold, $acks, End::$end).await
        }
    )*};
}

background_job_tests! {
    job_holding_stdout_dies_with_session_close_acks: Auto, true, true, Close;
    job_holding_stdout_dies_with_session_close_no_acks: Auto, true, false, Close;
    job_holding_stdout_dies_at_expiry_acks: Auto, true, true, Expiry;
    job_holding_stdout_dies_at_expiry_no_acks: Auto, true, false, Expiry;
    job_on_dev_null_dies_with_session_close_acks: Auto, false, true, Close;
    job_on_dev_null_dies_with_session_close_no_acks: Auto, false, false, Close;
    job_on_dev_null_dies_at_expiry_acks: Auto, false, true, Expiry;
    job_on_dev_null_dies_at_expiry_no_acks: Auto, false, false, Expiry;
    none_backend_job_holding_stdout_dies_with_session_close: None, true, true, Close;
    none_backend_job_on_dev_null_dies_at_expiry: None, false, false, Expiry;
}

// Item 2 -------------------------------------------------------------------------------------

/// `bash -i` on a PTY with `sleep 1000 &` typed into it: job control puts the job in a
/// process group of its own, which no signal to the shell's group reaches. The interactive
/// shell ignores SIGTERM, so it takes its (short) grace before SIGKILL.
async fn pty_background_job(backend: BackendChoice, end: End) {
    let reg = new_registry(config(backend));
    let mut t = connect_to(&reg);
    init(&mut t.client, false).await;
    let (shell, job) = start_pty_job(&mut t.client, "sh", 200).await;
    end_and_check(t, end, &[job, shell]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pty_job_control_job_dies_with_session_close() {
    pty_background_job(BackendChoice::Auto, End::Close).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pty_job_control_job_dies_at_expiry() {
    pty_background_job(BackendChoice::Auto, End::Expiry).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn none_backend_pty_job_control_job_dies_at_expiry() {
    pty_background_job(BackendChoice::None, End::Expiry).await
}

// Item 4 -------------------------------------------------------------------------------------

/// Whether `pid` has a SIGTERM pending (`SigPnd` or `ShdPnd` of `/proc/PID/status`): a
/// process that blocks SIGTERM keeps a received one there, so the check does not race the
/// signal's delivery.
fn sigterm_pending(pid: u32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let bit = 1u64 << (libc::SIGTERM - 1);
    status
        .lines()
        .filter_map(|l| {
            l.strip_prefix("SigPnd:")
                .or_else(|| l.strip_prefix("ShdPnd:"))
        })
        .filter_map(|m| u64::from_str_radix(m.trim(), 16).ok())
        .any(|m| m & bit != 0)
}

/// A `sleep` leading a process group of its own (its pgid is its pid), with SIGTERM blocked so
/// that a SIGTERM sent to it stays visible as pending.
fn bystander() -> std::io::Result<std::process::Child> {
    let mut cmd = std::process::Command::new("sleep");
    cmd.arg("1000").process_group(0);
    // SAFETY: between fork and exec the hook only calls sigemptyset, sigaddset and
    // sigprocmask, which are async-signal-safe, on a set on its own stack.
    unsafe {
        cmd.pre_exec(|| {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGTERM);
            if libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn()
}

/// Start a [`bystander`] whose pid (and so process group) is `pid`, by setting the pid
/// namespace's last pid just below it (root only; other forks on the machine may take the
/// number first, hence the attempts). `None` where that is not permitted.
fn bystander_with_pid(pid: u32) -> Option<std::process::Child> {
    const ATTEMPTS: usize = 500;
    for _ in 0..ATTEMPTS {
        if std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string()).is_err() {
            return None;
        }
        let mut child = bystander().expect("spawn the bystander");
        if child.id() == pid {
            return Some(child);
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    panic!("could not start a process with pid {pid} in {ATTEMPTS} attempts");
}

/// `process/terminate` of a process that exited and was reaped must not signal whatever
/// process group now has its number. The test gives that number to a bystander (a group
/// leader that blocks SIGTERM) and checks that nothing reached it; a `killpg` by the old
/// number (the bug) leaves a pending SIGTERM there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminate_after_exit_signals_no_group_that_reused_the_number() {
    let reg = new_registry(cfg());
    let mut t = connect_to(&reg);
    init(&mut t.client, false).await;
    let r = t
        .client
        .start(json!({"processId": "t", "argv": ["true"]}))
        .await;
    let old = r["pid"].as_u64().expect("pid") as u32;
    let got = t.client.collect("t").await;
    assert_eq!(got.exit["exitCode"], 0, "reaped: its number is free");
    let (other, reused) = match bystander_with_pid(old) {
        Some(c) => (c, true),
        None => {
            eprintln!(
                "NOTE: cannot choose pids here (not root); the bystander gets another number"
            );
            (bystander().expect("spawn the bystander"), false)
        }
    };
    // SIGKILLed and reaped however the test ends (it blocks SIGTERM and holds our stdout).
    let mut other = KillOnDrop(other);
    let other = &mut other.0;
    let pgid = procfs_pgid(other.id());
    assert_eq!(pgid, other.id(), "the bystander leads its own group");
    if reused {
        assert_eq!(
            pgid, old,
            "the bystander's group has the exited process's number"
        );
    }
    let r = t.client.terminate("t", Some(100)).await;
    assert_eq!(r, json!({"running": false}));
    assert!(
        !sigterm_pending(other.id()),
        "SIGTERM reached a group that reused the exited process's number"
    );
    assert!(other.try_wait().expect("try_wait").is_none(), "untouched");
}

/// A child SIGKILLed and reaped when dropped.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn procfs_pgid(pid: u32) -> u32 {
    execrelay::process::containment::procfs::read_stat(pid)
        .expect("stat")
        .pgid
}

// Item 5 -------------------------------------------------------------------------------------

/// The cap on `killGraceMs` in these tests.
const CAP_MS: u64 = 1000;

/// A child that ignores SIGTERM (the `exec`ed `sleep` keeps the ignored disposition), started
/// with the largest grace the server allows, after a start with a huge one was refused.
async fn stubborn_child(t: &mut InProcess) -> Tracked {
    start_stubborn_child(&mut t.client, CAP_MS, json!({})).await
}

fn capped() -> ServerConfig {
    ServerConfig {
        max_kill_grace_ms: CAP_MS,
        ..config(BackendChoice::Auto)
    }
}

/// Expiry: nobody can stop such a child any more, so the server must, within its own cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigterm_ignoring_child_is_gone_within_the_cap_after_expiry() {
    let reg = new_registry(capped());
    let mut t = connect_to(&reg);
    init(&mut t.client, true).await;
    let child = stubborn_child(&mut t).await;
    let t0 = tokio::time::Instant::now();
    t.hang_up().await;
    all_gone("the SIGTERM-ignoring child after expiry", &[child]).await;
    let took = t0.elapsed();
    // It ignored SIGTERM, so only the SIGKILL after the grace ended it …
    assert!(
        took >= Duration::from_millis(TTL_MS + CAP_MS),
        "killed before its grace: {took:?}"
    );
    // … and the grace was the server's cap (generous slack for a loaded machine).
    assert!(
        took < Duration::from_millis(TTL_MS + CAP_MS + 8_000),
        "took {took:?}"
    );
}

/// `session/close` answers once the child is gone: after the capped grace, not a client's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_close_ends_a_sigterm_ignoring_child_within_the_cap() {
    let reg = new_registry(capped());
    let mut t = connect_to(&reg);
    init(&mut t.client, false).await;
    let child = stubborn_child(&mut t).await;
    let t0 = tokio::time::Instant::now();
    assert_eq!(t.client.call("session/close", json!({})).await, json!({}));
    let took = t0.elapsed();
    assert_gone("the SIGTERM-ignoring child after session/close", &[child]);
    assert!(took >= Duration::from_millis(CAP_MS), "{took:?}");
    assert!(took < Duration::from_millis(CAP_MS + 8_000), "{took:?}");
}

/// `process/terminate` with a `graceMs` above the cap is refused the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminate_refuses_a_grace_above_the_cap() {
    let reg = new_registry(capped());
    let mut t = connect_to(&reg);
    init(&mut t.client, false).await;
    let child = stubborn_child(&mut t).await;
    let e = t
        .client
        .call_err(
            "process/terminate",
            json!({"processId": "s", "graceMs": CAP_MS + 1}),
        )
        .await;
    assert_eq!(e["code"], -32602, "{e}");
    assert!(
        e["message"]
            .as_str()
            .is_some_and(|m| m.contains("max_kill_grace_ms")),
        "{e}"
    );
    assert!(child.alive(), "a refused terminate does nothing");
    let r: Value = t.client.terminate("s", Some(CAP_MS)).await;
    assert_eq!(r, json!({"running": true}));
    let got = t.client.collect("s").await;
    assert_eq!(got.exit["signal"], "SIGKILL", "{}", got.exit);
    assert_gone("after terminate", &[child]);
}
