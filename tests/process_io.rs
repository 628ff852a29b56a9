//! A process's input and surroundings over a real `ConnectionProcessor`: PTY sessions and
//! resizing, stdin (writes, `closeStdin`, write ids, a write blocked on a full pipe),
//! environment and working directory, and the child's start-up contract (closed descriptors,
//! own session). `processes.md` §1–§4, `protocol.md` §4–§5. (Exit, deadlines, terminate and
//! spawn failures are in `process_lifecycle.rs`.)

mod common;
use common::process::*;
use common::*;

use serde_json::{json, Value};

/// The whitespace-separated numbers of `out`.
fn numbers<T: std::str::FromStr>(out: &str) -> Vec<T> {
    out.split_whitespace()
        .map(|s| s.parse().ok().expect("a number"))
        .collect()
}

// 7. ------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pty_session_sizes_resize_and_echo() {
    let mut ip = connect().await;
    let c = &mut ip.client;
    let pid = start_checked(
        c,
        json!({"processId": "tty", "argv": ["sh"], "tty": true,
               "size": {"rows": 24, "cols": 80},
               "env": {"PS1": "$ "}, "inheritEnv": true}),
    )
    .await;
    let r = c.write("tty", b"stty size\n").await;
    assert_eq!(r, json!({"status": "accepted"}));
    let mut acc = Collected::default();
    read_until(c, "tty", &mut acc, "24 80", |a| contains(&a.pty, b"24 80")).await;
    assert!(contains(&acc.pty, b"stty size"), "input is echoed");

    let r = c
        .call(
            "process/resize",
            json!({"processId": "tty", "rows": 50, "cols": 132}),
        )
        .await;
    assert_eq!(r, json!({}));
    let mark = acc.pty.len();
    let r = c.write("tty", b"stty size\n").await;
    assert_eq!(r, json!({"status": "accepted"}));
    read_until(c, "tty", &mut acc, "50 132", |a| {
        contains(&a.pty[mark..], b"50 132")
    })
    .await;

    let r = c.write("tty", b"exit 0\n").await;
    assert_eq!(r, json!({"status": "accepted"}));
    let got = finish(c, "tty", acc).await;
    got.assert_seqs_contiguous();
    assert!(
        got.stdout.is_empty() && got.stderr.is_empty(),
        "a tty has only the pty stream"
    );
    assert!(contains(&got.pty, b"exit 0"), "{}", text(&got.pty));
    let e = &got.exit;
    assert_eq!(e["exitCode"], 0, "{e}");
    assert_eq!(e["signal"], Value::Null, "{e}");
    assert_eq!(e["stderrBytes"], 0, "{e}");
    assert_eq!(
        e["stdoutBytes"].as_u64(),
        Some(got.pty.len() as u64),
        "pty bytes count as stdoutBytes: {e}"
    );
    eventually("the tty group is gone", || !group_alive(pid)).await;

    // Resize is for tty processes only.
    start_checked(c, json!({"processId": "notty", "argv": ["true"]})).await;
    let e = c
        .call_err(
            "process/resize",
            json!({"processId": "notty", "rows": 50, "cols": 132}),
        )
        .await;
    assert_eq!(e["code"], -32602, "{e}");
    let got = collect_checked(c, "notty").await;
    assert_eq!(got.exit["exitCode"], 0);

    // closeStdin on a tty sends end of file through the line discipline.
    start_checked(
        c,
        json!({"processId": "ttycat", "argv": ["cat"], "tty": true}),
    )
    .await;
    let r = c.write("ttycat", b"abc\n").await;
    assert_eq!(r, json!({"status": "accepted"}));
    let r = c.close_stdin("ttycat").await;
    assert_eq!(r, json!({}));
    let got = collect_checked(c, "ttycat").await;
    assert_eq!(text(&got.pty), "abc\r\nabc\r\n", "echo, then cat's copy");
    assert_eq!(got.exit["exitCode"], 0, "{}", got.exit);
    let r = c.write("ttycat", b"x").await;
    assert_eq!(r, json!({"status": "exited"}));
}

// 8. ------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdin_writes_close_and_write_ids() {
    let mut ip = connect().await;
    let c = &mut ip.client;
    start_checked(
        c,
        json!({"processId": "cat", "argv": ["cat"], "pipeStdin": true}),
    )
    .await;
    for part in [&b"hello "[..], b"world"] {
        let r = c.write("cat", part).await;
        assert_eq!(r, json!({"status": "accepted"}));
    }
    let r = c.close_stdin("cat").await;
    assert_eq!(r, json!({}));
    let r = c.close_stdin("cat").await;
    assert_eq!(r, json!({}), "closeStdin is idempotent");
    let got = collect_checked(c, "cat").await;
    assert_eq!(got.stdout, b"hello world");
    assert!(got.stderr.is_empty());
    assert_eq!(got.exit["exitCode"], 0, "{}", got.exit);
    assert_eq!(got.exit["stdoutBytes"], 11);

    // A repeated writeId is written once.
    start_checked(
        c,
        json!({"processId": "dedup", "argv": ["cat"], "pipeStdin": true}),
    )
    .await;
    for _ in 0..2 {
        let r = c
            .call(
                "process/write",
                json!({"processId": "dedup", "chunk": b64(b"chunk-1;"), "writeId": "w-1"}),
            )
            .await;
        assert_eq!(r, json!({"status": "accepted"}));
    }
    let r = c
        .call(
            "process/write",
            json!({"processId": "dedup", "chunk": b64(b"chunk-2;"), "writeId": "w-2"}),
        )
        .await;
    assert_eq!(r, json!({"status": "accepted"}));
    c.close_stdin("dedup").await;
    let got = collect_checked(c, "dedup").await;
    assert_eq!(got.stdout, b"chunk-1;chunk-2;", "{}", text(&got.stdout));
    assert_eq!(got.exit["exitCode"], 0);

    // A write repeated after the child took its bytes and exited (the first answer lost with
    // a connection, say) is answered as the first time; a new one is `exited`.
    start_checked(
        c,
        json!({"processId": "once", "argv": ["head", "-c", "5"], "pipeStdin": true}),
    )
    .await;
    let write =
        |id: &'static str| json!({"processId": "once", "chunk": b64(b"12345"), "writeId": id});
    let r = c.call("process/write", write("w-1")).await;
    assert_eq!(r, json!({"status": "accepted"}));
    let got = collect_checked(c, "once").await;
    assert_eq!(got.stdout, b"12345");
    assert_eq!(got.exit["exitCode"], 0);
    let r = c.call("process/write", write("w-1")).await;
    assert_eq!(
        r,
        json!({"status": "accepted"}),
        "the repeat of a write that was done"
    );
    let r = c.call("process/write", write("w-2")).await;
    assert_eq!(
        r,
        json!({"status": "exited"}),
        "a new write to an exited process"
    );

    // Without pipeStdin there is nothing to write to.
    let pid = start_checked(c, json!({"processId": "nostdin", "argv": ["sleep", "100"]})).await;
    let r = c.write("nostdin", b"x").await;
    assert_eq!(r, json!({"status": "stdinClosed"}));
    let r = c.terminate("nostdin", Some(200)).await;
    assert_eq!(r, json!({"running": true}));
    let got = collect_checked(c, "nostdin").await;
    assert_eq!(got.exit["signal"], "SIGTERM");
    eventually("the group is gone", || !group_alive(pid)).await;
}

// 9. ------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocked_write_does_not_delay_terminate() {
    let mut ip = connect().await;
    let c = &mut ip.client;
    // `sleep 100` never reads stdin. It ignores SIGTERM (an ignored signal survives exec) so
    // that the write stays blocked after terminate's SIGTERM, until the SIGKILL `graceMs`
    // later: the terminate reply can then only come first if the blocked write did not hold
    // it up. With a plain `sleep 100` the SIGTERM itself ends the write, and on a loaded
    // machine the write's `exited` reply may legitimately overtake the terminate reply (the
    // terminating thread is preempted right after kill()).
    let pid = start_checked(
        c,
        json!({"processId": "sink", "argv": ["sh", "-c", "trap '' TERM; exec sleep 100"],
               "pipeStdin": true}),
    )
    .await;
    eventually("the child is sleep, ignoring SIGTERM", || {
        sleeping_with_term_ignored(pid)
    })
    .await;
    let big = vec![b'x'; 4 << 20];
    let write_id = c.request_write("sink", &big).await;
    // The write is really stuck: the child's stdin pipe is full (4 MiB > its capacity).
    eventually("the stdin pipe is full", || stdin_pipe_full(pid)).await;
    let term_id = c
        .request(
            "process/terminate",
            json!({"processId": "sink", "graceMs": 2000}),
        )
        .await;

    let mut order = Vec::new();
    let mut responses = Vec::new();
    while order.len() < 2 {
        let m = c.read_message().await.expect("connection open");
        if m.get("method").is_some() {
            c.backlog.push_back(m);
            continue;
        }
        let id = m["id"].as_u64().expect("numeric id");
        assert!(id == write_id || id == term_id, "unexpected response {m}");
        order.push(id);
        responses.push(m);
    }
    assert_eq!(
        order,
        vec![term_id, write_id],
        "terminate must be answered before the blocked write: {responses:?}"
    );
    assert_eq!(responses[0]["result"], json!({"running": true}));
    let status = responses[1]["result"]["status"].clone();
    assert!(
        status == "exited" || status == "stdinClosed",
        "write status {status}"
    );
    eprintln!("blocked write answered {status}");

    let got = collect_checked(c, "sink").await;
    assert_eq!(got.exit["signal"], "SIGKILL", "{}", got.exit);
    assert_eq!(got.exit["exitCode"], Value::Null);
    eventually("the group is gone", || !group_alive(pid)).await;
}

// 12. -----------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn environment_and_working_directory() {
    let mut ip = connect().await;
    let c = &mut ip.client;
    let (_, got) = run_checked(
        c,
        json!({"processId": "env", "argv": ["/usr/bin/env"], "inheritEnv": false,
               "env": {"A": "1"}}),
    )
    .await;
    assert_eq!(text(&got.stdout), "A=1\n");
    assert_eq!(got.exit["exitCode"], 0);

    let (_, got) = run_checked(
        c,
        json!({"processId": "home", "argv": ["sh", "-c", "echo ${HOME-unset} ${PATH:+path}"],
               "inheritEnv": true, "env": {"HOME": null}}),
    )
    .await;
    assert_eq!(
        text(&got.stdout),
        "unset path\n",
        "HOME removed, PATH inherited"
    );

    let (_, got) = run_checked(
        c,
        json!({"processId": "pwd", "argv": ["pwd"], "cwd": "/tmp"}),
    )
    .await;
    assert_eq!(text(&got.stdout), "/tmp\n");
    assert_eq!(got.exit["exitCode"], 0);
}

// 13. -----------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_has_only_stdio_and_its_own_session() {
    let mut ip = connect().await;
    let c = &mut ip.client;
    // Descriptors this test process holds above stderr must not leak into the child.
    let _held = std::fs::File::open("/dev/null").expect("open /dev/null");
    let (_, got) = run_checked(
        c,
        json!({"processId": "fds", "argv": ["sh", "-c", "ls /proc/self/fd"]}),
    )
    .await;
    assert_eq!(got.exit["exitCode"], 0, "{}", text(&got.stderr));
    let out = text(&got.stdout);
    let fds: Vec<u32> = numbers(&out);
    for fd in [0, 1, 2] {
        assert!(fds.contains(&fd), "stdio fd {fd} missing: {out:?}");
    }
    assert!(
        fds.iter().all(|&fd| fd <= 3),
        "inherited descriptors leaked: {out:?}"
    );

    let (pid, got) = run_checked(
        c,
        json!({"processId": "sid", "argv": ["sh", "-c", "ps -o pid=,sid=,pgid= -p $$"]}),
    )
    .await;
    assert_eq!(got.exit["exitCode"], 0, "{}", text(&got.stderr));
    let out = text(&got.stdout);
    let ids: Vec<i32> = numbers(&out);
    assert_eq!(ids, vec![pid, pid, pid], "pid == sid == pgid: {out:?}");

    // The same on a PTY, which is also the child's controlling terminal.
    let (pid, got) = run_checked(
        c,
        json!({"processId": "ttyfds", "tty": true,
               "argv": ["sh", "-c", "ls /proc/self/fd; ps -o pid=,sid=,pgid=,tty= -p $$"]}),
    )
    .await;
    assert_eq!(got.exit["exitCode"], 0, "{}", text(&got.pty));
    let out = text(&got.pty);
    let mut lines = out.lines();
    let fds: Vec<u32> = numbers(lines.next().expect("fd line"));
    assert!(
        [0, 1, 2].iter().all(|fd| fds.contains(fd)) && fds.iter().all(|&fd| fd <= 3),
        "tty child descriptors: {out:?}"
    );
    let ps: Vec<&str> = lines.next().expect("ps line").split_whitespace().collect();
    let want = pid.to_string();
    assert_eq!(ps[..3], [&want[..]; 3], "pid == sid == pgid: {out:?}");
    assert!(
        ps.get(3).is_some_and(|t| t.starts_with("pts/")),
        "controlling terminal: {out:?}"
    );
}

// Regression (fixed): a write blocked on a full stdin pipe when the child dies answers `stdinClosed`, not
// `exited` as `protocol.md` §4 requires ("if the process exits meanwhile the write answers
// `exited`"). `ManagedProcess::write` (src/process/managed_process.rs) races the child's
// death: the kernel closes the dead child's descriptors (the writer gets EPIPE) before the
// supervisor has reaped it, so `is_running()` is still true in the `Err(_)` arm and the
// status is `StdinClosed`. Whichever of the EPIPE and the reaping the write task sees first
// decides; here about half of the attempts answer `stdinClosed`. The loop stops at the first
// wrong answer (so a fixed server runs all rounds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_blocked_when_the_child_dies_answers_exited() {
    let mut ip = connect().await;
    let c = &mut ip.client;
    for round in 0..40 {
        let id = format!("victim-{round}");
        let pid = start_checked(
            c,
            json!({"processId": id, "argv": ["sleep", "100"], "pipeStdin": true}),
        )
        .await;
        let write_id = c.request_write(&id, &vec![b'x'; 1 << 20]).await;
        eventually("the stdin pipe is full", || stdin_pipe_full(pid)).await;
        let r = c.signal(&id, "SIGKILL").await;
        assert_eq!(r, json!({}));
        let w = c.response(write_id).await;
        let got = collect_checked(c, &id).await;
        assert_eq!(
            got.exit["signal"], "SIGKILL",
            "the child died: {}",
            got.exit
        );
        assert_eq!(
            w["result"],
            json!({"status": "exited"}),
            "round {round}: the child was killed while the write waited for pipe space"
        );
    }
}

// A control request that crosses the exit's acknowledgement ----------------------------------

/// `initialize` with acks, then `initialized`.
async fn initialized_with_acks(c: &mut RawClient) {
    c.call(
        "initialize",
        json!({"clientName": "test", "capabilities": {"acks": true}}),
    )
    .await;
    c.notify("initialized", json!({})).await;
}

/// Acknowledge `id`'s exit notice (`seq`) and wait until the session forgot it (the ack is a
/// notification: it is applied after this returns).
async fn ack_until_forgotten(c: &mut RawClient, id: &str, seq: u64) {
    c.notify("process/ack", json!({"processId": id, "seq": seq}))
        .await;
    let deadline = tokio::time::Instant::now() + GUARD;
    while list_entry(c, id).await.is_some() {
        assert!(tokio::time::Instant::now() < deadline, "{id} still listed");
        tokio::task::yield_now().await;
    }
}

/// A client's stdin pump may send `process/closeStdin` (or a last write) while its event
/// loop acknowledges the exit notice: the session forgets the process on the ack, and the
/// request that arrives just after is answered as for an exited process, not `-32001`
/// (every `execrelay run` counted one such error, now and then). An id never started is still
/// unknown, and a new start may take the ended id again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_requests_after_the_exit_was_acknowledged_answer_as_exited() {
    let mut ip = in_process(cfg(), 1 << 20);
    let c = &mut ip.client;
    initialized_with_acks(c).await;
    start_checked(
        c,
        json!({"processId": "done", "argv": ["true"], "pipeStdin": true}),
    )
    .await;
    let got = collect_checked(c, "done").await;
    assert_eq!(got.exit["exitCode"], 0, "{}", got.exit);
    let seq = *got.seqs.last().expect("the exit notice's seq");
    ack_until_forgotten(c, "done", seq).await;

    assert_eq!(c.close_stdin("done").await, json!({}));
    assert_eq!(c.write("done", b"late").await, json!({"status": "exited"}));
    assert_eq!(
        c.call(
            "process/signal",
            json!({"processId": "done", "signal": "SIGTERM"})
        )
        .await,
        json!({})
    );
    assert_eq!(
        c.call(
            "process/resize",
            json!({"processId": "done", "rows": 30, "cols": 90})
        )
        .await,
        json!({})
    );
    assert_eq!(c.terminate("done", None).await, json!({"running": false}));

    // An id this session never started is unknown, as before.
    let e = c
        .call_err("process/closeStdin", json!({"processId": "never"}))
        .await;
    assert_eq!(e["code"], -32001, "{e}");
    let e = c
        .call_err(
            "process/write",
            json!({"processId": "never", "chunk": b64(b"x")}),
        )
        .await;
    assert_eq!(e["code"], -32001, "{e}");

    // The ended id may be started again, and is then a live process like any other.
    start_checked(
        c,
        json!({"processId": "done", "argv": ["cat"], "pipeStdin": true}),
    )
    .await;
    assert_eq!(
        c.write("done", b"again").await,
        json!({"status": "accepted"})
    );
    assert_eq!(c.close_stdin("done").await, json!({}));
    let got = collect_checked(c, "done").await;
    assert_eq!(got.stdout, b"again");
}

/// The same for `session/close`: a stdin pump's write that crosses the close (`execrelay run`
/// closes its session as soon as the exit is shown) is answered `exited`, not `-32001`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_that_crosses_session_close_answers_exited() {
    let mut ip = connect().await;
    let c = &mut ip.client;
    start_checked(
        c,
        json!({"processId": "cat", "argv": ["cat"], "pipeStdin": true}),
    )
    .await;
    assert_eq!(c.call("session/close", json!({})).await, json!({}));
    assert_eq!(c.write("cat", b"late").await, json!({"status": "exited"}));
    assert_eq!(c.close_stdin("cat").await, json!({}));
    let e = c
        .call_err(
            "process/write",
            json!({"processId": "never", "chunk": b64(b"x")}),
        )
        .await;
    assert_eq!(e["code"], -32001, "{e}");
}

/// The client library keeps up to `STDIN_BINARY_WRITES_IN_FLIGHT` writes in flight and sends
/// them all again after a resume: every one of them, the oldest too, is still known as
/// accepted once its process was forgotten. (Found by the CI soak: the session kept the last
/// 16, the pipeline had grown to 64, and the oldest repeats of a finished upload were answered
/// `exited`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_pipeline_of_writes_repeated_after_its_process_was_forgotten_is_accepted() {
    let pipeline = execrelay::client::STDIN_BINARY_WRITES_IN_FLIGHT + 1; // and the close
    let mut ip = in_process(cfg(), 1 << 20);
    let c = &mut ip.client;
    initialized_with_acks(c).await;
    // One byte per write: the child exits once it read them all.
    start_checked(
        c,
        json!({"processId": "up", "argv": ["head", "-c", pipeline.to_string()], "pipeStdin": true}),
    )
    .await;
    let write =
        |i: usize| json!({"processId": "up", "chunk": b64(b"x"), "writeId": format!("s-{i}")});
    for i in 1..=pipeline {
        assert_eq!(
            c.call("process/write", write(i)).await,
            json!({"status": "accepted"}),
            "write {i}"
        );
    }
    let got = collect_checked(c, "up").await;
    assert_eq!(got.stdout, vec![b'x'; pipeline]);
    let seq = *got.seqs.last().expect("the exit notice's seq");
    ack_until_forgotten(c, "up", seq).await;

    for i in 1..=pipeline {
        assert_eq!(
            c.call("process/write", write(i)).await,
            json!({"status": "accepted"}),
            "the repeat of write {i} of {pipeline}, which the process took"
        );
    }
    assert_eq!(
        c.call("process/write", write(pipeline + 1)).await,
        json!({"status": "exited"}),
        "a write it never took"
    );
}

/// A write whose answer was lost with its connection is repeated after the resume; meanwhile
/// the child took the bytes and exited, and the client acknowledged the exit notice, so the
/// session forgot the process. The repeat did its work and is answered `accepted`, as it
/// was while the process was still known; a write id it never accepted is `exited`. (Found
/// by the chaos soak: a terminal's last stdin writes were answered `exited` after a link cut,
/// although the child had read every byte.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_repeated_after_its_process_was_forgotten_is_accepted() {
    let mut ip = in_process(cfg(), 1 << 20);
    let c = &mut ip.client;
    initialized_with_acks(c).await;
    // `head -c 5` exits once it read its five bytes: the write is what ends it.
    start_checked(
        c,
        json!({"processId": "reader", "argv": ["head", "-c", "5"], "pipeStdin": true}),
    )
    .await;
    let write = |id: &str| json!({"processId": "reader", "chunk": b64(b"12345"), "writeId": id});
    assert_eq!(
        c.call("process/write", write("s-1")).await,
        json!({"status": "accepted"})
    );
    let got = collect_checked(c, "reader").await;
    assert_eq!(got.stdout, b"12345");
    let seq = *got.seqs.last().expect("the exit notice's seq");
    ack_until_forgotten(c, "reader", seq).await;

    assert_eq!(
        c.call("process/write", write("s-1")).await,
        json!({"status": "accepted"}),
        "the repeat of a write the process took"
    );
    assert_eq!(
        c.call("process/write", write("s-2")).await,
        json!({"status": "exited"}),
        "a write it never took"
    );
    assert_eq!(
        c.write("reader", b"no id").await,
        json!({"status": "exited"})
    );

    // A new start of the id does not inherit the old process's write ids.
    start_checked(
        c,
        json!({"processId": "reader", "argv": ["cat"], "pipeStdin": true}),
    )
    .await;
    assert_eq!(
        c.call("process/write", write("s-1")).await,
        json!({"status": "accepted"})
    );
    assert_eq!(c.close_stdin("reader").await, json!({}));
    let got = collect_checked(c, "reader").await;
    assert_eq!(got.stdout, b"12345", "written by the new process, once");
}
