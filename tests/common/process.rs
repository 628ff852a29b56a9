//! One process over a [`RawClient`]: a checked start, its events read in steps or through its
//! exit notice, and what `/proc` says about it (for states outside the protocol).

use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;

use serde_json::{json, Value};

use super::{cfg, in_process, Collected, InProcess, RawClient};

/// A connection that went through `initialize` + `initialized` (protocol version 1).
pub async fn connect() -> InProcess {
    let mut ip = in_process(cfg(), 1 << 20);
    let init = ip.client.handshake().await;
    assert_eq!(init["protocolVersion"], 1);
    ip
}

/// `process/start`; checks the echoed id and that no event of the process reached the wire
/// before the start result. Returns the pid (also the process group id).
pub async fn start_checked(client: &mut RawClient, params: Value) -> i32 {
    let id = params["processId"].clone();
    let r = client.call("process/start", params).await;
    assert_eq!(r["processId"], id, "start result echoes the id: {r}");
    assert!(
        !client
            .backlog
            .iter()
            .any(|m| m.get("method").is_some() && m["params"]["processId"] == id),
        "an event of {id} arrived before its start result"
    );
    let pid = r["pid"].as_i64().expect("pid is an integer");
    assert!(pid > 1, "bad pid {pid}");
    i32::try_from(pid).expect("pid fits i32")
}

/// Every event of `pid` through its exit notice, checking that the seqs are 1..n.
pub async fn collect_checked(client: &mut RawClient, pid: &str) -> Collected {
    let got = client.collect(pid).await;
    got.assert_seqs_contiguous();
    got
}

/// [`start_checked`], then every event through the exit notice, checking that the seqs are 1..n.
/// Returns the pid and what was collected.
pub async fn run_checked(client: &mut RawClient, params: Value) -> (i32, Collected) {
    let id = params["processId"].as_str().expect("processId").to_string();
    let pid = start_checked(client, params).await;
    (pid, collect_checked(client, &id).await)
}

/// The next notification of `pid`, leaving every other message in the backlog in order.
pub async fn next_event(client: &mut RawClient, pid: &str) -> Value {
    if let Some(pos) = client
        .backlog
        .iter()
        .position(|m| m.get("method").is_some() && m["params"]["processId"] == pid)
    {
        return client.backlog.remove(pos).expect("position is valid");
    }
    loop {
        let m = client
            .read_message()
            .await
            .unwrap_or_else(|| panic!("connection closed while waiting for {pid}"));
        if m.get("method").is_some() && m["params"]["processId"] == pid {
            return m;
        }
        client.backlog.push_back(m);
    }
}

/// Read output notifications of `pid` into `acc` until `done(acc)` holds. The exit notice
/// must not come first.
pub async fn read_until(
    client: &mut RawClient,
    pid: &str,
    acc: &mut Collected,
    what: &str,
    done: impl Fn(&Collected) -> bool,
) {
    while !done(acc) {
        let n = next_event(client, pid).await;
        assert_eq!(
            n["method"], "process/outputDelta",
            "{pid} ended before {what}: {n}"
        );
        acc.absorb(&n);
    }
}

/// Collect the rest of `pid`'s events (through its exit notice) on top of `acc`.
pub async fn finish(client: &mut RawClient, pid: &str, mut acc: Collected) -> Collected {
    let rest = client.collect(pid).await;
    for (stream, n, at) in rest.omitted {
        let before = match stream.as_str() {
            "stdout" => acc.stdout.len(),
            "stderr" => acc.stderr.len(),
            _ => acc.pty.len(),
        };
        acc.omitted.push((stream, n, before + at));
    }
    acc.seqs.extend(rest.seqs);
    acc.stdout.extend(rest.stdout);
    acc.stderr.extend(rest.stderr);
    acc.pty.extend(rest.pty);
    acc.other.extend(rest.other);
    acc.exit = rest.exit;
    acc
}

/// `process/list` entry of `id`, if listed.
pub async fn list_entry(client: &mut RawClient, id: &str) -> Option<Value> {
    let r = client.call("process/list", json!({})).await;
    r["processes"]
        .as_array()
        .expect("processes is an array")
        .iter()
        .find(|p| p["processId"] == id)
        .cloned()
}

/// The exit notice's `durationMs`.
pub fn duration_ms(exit: &Value) -> u64 {
    exit["durationMs"].as_u64().expect("durationMs")
}

/// Whether `needle` occurs in `hay`.
pub fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Processes whose command line has `arg` as an argument.
///
/// A child that was just started may not show yet: the start is answered once the child is
/// past `exec`, but the kernel releases the cloning thread (`CLONE_VFORK`) before it has set
/// up the new program's arguments, and `/proc/PID/cmdline` reads empty in between. Use
/// [`exec_done`] on a pid just started before counting it here.
pub fn running_with_arg(arg: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        if cmd.split(|b| *b == 0).any(|a| a == arg.as_bytes()) {
            out.push(pid);
        }
    }
    out
}

/// Waits (bounded by [`super::GUARD`]) until `pid`'s command line shows, so that
/// [`running_with_arg`] sees it: the kernel fills it in a moment after the start is answered.
/// There is no event to wait on for this, hence the short poll.
pub async fn exec_done(pid: i32) {
    let deadline = tokio::time::Instant::now() + super::GUARD;
    while std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.is_empty()) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{pid} never showed its arguments"
        );
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
}

/// Whether a single process exists (zombies included): `kill(pid, 0)` does not fail with
/// `ESRCH`.
pub fn pid_exists(pid: i32) -> bool {
    // SAFETY: signal 0 only checks for existence and permission.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// Bytes queued in the stdin pipe of `pid`, and the pipe's capacity. Opens another read end
/// of the pipe through /proc for a moment (it reads nothing).
pub fn stdin_pipe_fill(pid: i32) -> Option<(i64, i64)> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(format!("/proc/{pid}/fd/0"))
        .ok()?;
    let fd = f.as_raw_fd();
    // SAFETY: F_GETPIPE_SZ and FIONREAD on a descriptor we own, into an int we own.
    let (cap, queued) = unsafe {
        let cap = libc::fcntl(fd, libc::F_GETPIPE_SZ);
        let mut n: libc::c_int = 0;
        if libc::ioctl(fd, libc::FIONREAD, &mut n) < 0 {
            return None;
        }
        (cap, n)
    };
    (cap > 0).then_some((i64::from(queued), i64::from(cap)))
}

/// Whether the stdin pipe of `pid` is full (a write to it blocks).
pub fn stdin_pipe_full(pid: i32) -> bool {
    stdin_pipe_fill(pid).is_some_and(|(queued, cap)| queued >= cap)
}

/// Whether `pid` runs `sleep` with SIGTERM ignored (from /proc/<pid>/comm and SigIgn).
pub fn sleeping_with_term_ignored(pid: i32) -> bool {
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let ignored = status
        .lines()
        .find_map(|l| l.strip_prefix("SigIgn:"))
        .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
        .unwrap_or(0);
    comm.trim() == "sleep" && ignored & (1 << (libc::SIGTERM - 1)) != 0
}

/// What the kernel says `pid` waits in (`/proc/PID/wchan`; empty if gone).
pub fn wchan(pid: u64) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/wchan")).unwrap_or_default()
}

/// Start `sh -c script` as `id` (the script prints `ready` once it is set up), send it
/// `signal` once `ready` arrived, and collect everything through its exit notice.
pub async fn signalled_when_ready(
    client: &mut RawClient,
    id: &str,
    script: &str,
    signal: &str,
) -> Collected {
    start_checked(
        client,
        json!({"processId": id, "argv": ["sh", "-c", script]}),
    )
    .await;
    let mut acc = Collected::default();
    read_until(client, id, &mut acc, "ready", |a| {
        contains(&a.stdout, b"ready\n")
    })
    .await;
    assert_eq!(client.signal(id, signal).await, json!({}));
    finish(client, id, acc).await
}
