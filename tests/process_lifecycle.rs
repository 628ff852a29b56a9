//! Process lifecycle over a real `ConnectionProcessor`: drain deadlines, output caps, death
//! by signal, timeouts, terminate (with descendants and with a child ignoring SIGTERM), spawn
//! failures and `process/list`. `processes.md` §1–§4, `protocol.md` §4–§5. (Stdin, PTYs, the
//! environment and the child's start-up contract are in `process_io.rs`.)

mod common;
use common::process::*;
use common::*;

use serde_json::{json, Value};

// 1. ------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_deadline_cuts_output_held_open_by_a_descendant() {
    let mut ip = connect().await;
    let c = &mut ip.client;
    let (pid, got) = run_checked(
        c,
        json!({"processId": "drain", "argv": ["sh", "-c", "sleep 30 & echo hi"],
               "drainTimeoutMs": 500}),
    )
    .await;
    assert_eq!(got.stdout, b"hi\n");
    assert!(got.stderr.is_empty(), "stderr: {}", text(&got.stderr));
    let e = &got.exit;
    assert_eq!(e["exitCode"], 0, "{e}");
    assert_eq!(e["signal"], Value::Null, "{e}");
    assert_eq!(e["timedOut"], false, "{e}");
    assert_eq!(e["reason"], "exited", "{e}");
    assert_eq!(e["outputDrainTimedOut"], true, "{e}");
    assert_eq!(e["stdoutBytes"], 3, "{e}");
    assert_eq!(e["droppedBytes"], 0, "{e}");
    let d = duration_ms(e);
    assert!((500..30_000).contains(&d), "durationMs {d}");

    // The background sleep is still in the group; terminate kills it.
    assert!(group_alive(pid), "the descendant keeps the group alive");
    let r = c.terminate("drain", Some(200)).await;
    assert_eq!(r, json!({"running": false}), "the direct child had exited");
    eventually("the drained process group is gone", || !group_alive(pid)).await;
}

// 2. ------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn descendant_that_closes_its_output_does_not_delay_the_exit_notice() {
    let mut ip = connect().await;
    let c = &mut ip.client;
    let (pid, got) = run_checked(
        c,
        json!({"processId": "bg", "argv": ["sh", "-c", "sleep 30 >/dev/null 2>&1 & echo hi"],
               "drainTimeoutMs": 10000}),
    )
    .await;
    assert_eq!(got.stdout, b"hi\n");
    assert!(got.stderr.is_empty());
    let e = &got.exit;
    assert_eq!(e["exitCode"], 0, "{e}");
    assert_eq!(e["outputDrainTimedOut"], false, "{e}");
    // End of file, not the 10 s deadline (the largest the server allows), ended the drain.
    assert!(duration_ms(e) < 10_000, "{e}");

    assert!(group_alive(pid), "the background sleep is still running");
    let r = c.terminate("bg", Some(200)).await;
    assert_eq!(r, json!({"running": false}));
    eventually("the process group is gone", || !group_alive(pid)).await;
}

// 3. ------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_cap_delivers_exactly_the_cap_and_counts_the_rest() {
    let mut ip = connect().await;
    let c = &mut ip.client;
    let (_, got) = run_checked(
        c,
        json!({"processId": "cap", "argv": ["head", "-c", "10485760", "/dev/zero"],
               "outputBytesCap": 1048576}),
    )
    .await;
    assert_eq!(got.stdout.len(), 1 << 20, "exactly the cap is delivered");
    assert!(got.stdout.iter().all(|&b| b == 0));
    assert!(got.stderr.is_empty());
    let e = &got.exit;
    assert_eq!(e["exitCode"], 0, "{e}");
    assert_eq!(e["signal"], Value::Null, "{e}");
    assert_eq!(e["droppedBytes"], 9437184, "{e}");
    assert_eq!(e["stdoutBytes"], 10485760, "{e}");
    assert_eq!(e["stderrBytes"], 0, "{e}");
    assert_eq!(e["outputDrainTimedOut"], false, "{e}");
}

// 4. ------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn death_by_signal_is_reported_by_name() {
    let mut ip = connect().await;
    let c = &mut ip.client;
    let pid = start_checked(c, json!({"processId": "s", "argv": ["sleep", "100"]})).await;

    let e = c
        .call_err(
            "process/signal",
            json!({"processId": "s", "signal": "SIGBOGUS"}),
        )
        .await;
    assert_eq!(e["code"], -32602, "{e}");
    let e = c
        .call_err(
            "process/signal",
            json!({"processId": "nope", "signal": "SIGKILL"}),
        )
        .await;
    assert_eq!(e["code"], -32001, "{e}");
    assert_eq!(
        list_entry(c, "s").await.expect("listed")["state"],
        "running",
        "a rejected signal changes nothing"
    );

    let r = c.signal("s", "SIGKILL").await;
    assert_eq!(r, json!({}));
    let got = collect_checked(c, "s").await;
    assert_eq!(got.seqs, vec![1], "no output, only the exit notice");
    let x = &got.exit;
    assert_eq!(x["signal"], "SIGKILL", "{x}");
    assert_eq!(x["exitCode"], Value::Null, "{x}");
    assert_eq!(x["timedOut"], false, "{x}");

    // Exited: `{}` and nothing sent.
    let r = c.signal("s", "SIGTERM").await;
    assert_eq!(r, json!({}));
    eventually("the group is gone", || !group_alive(pid)).await;

    // Reported faithfully: no invented 128+N for a signal, the real code otherwise.
    let (_, got) = run_checked(
        c,
        json!({"processId": "self", "argv": ["sh", "-c", "kill -TERM $$"]}),
    )
    .await;
    assert_eq!(got.exit["signal"], "SIGTERM", "{}", got.exit);
    assert_eq!(got.exit["exitCode"], Value::Null, "{}", got.exit);
    let (_, got) = run_checked(
        c,
        json!({"processId": "three", "argv": ["sh", "-c", "exit 3"]}),
    )
    .await;
    assert_eq!(got.exit["exitCode"], 3, "{}", got.exit);
    assert_eq!(got.exit["signal"], Value::Null, "{}", got.exit);
}

// 5. ------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_terminates_and_marks_timed_out() {
    let mut ip = connect().await;
    let c = &mut ip.client;
    let (_, got) = run_checked(
        c,
        json!({"processId": "t", "argv": ["sleep", "100"], "timeoutMs": 300}),
    )
    .await;
    let e = &got.exit;
    assert_eq!(e["timedOut"], true, "{e}");
    assert_eq!(e["reason"], "timeout", "{e}");
    assert_eq!(e["signal"], "SIGTERM", "{e}");
    assert_eq!(e["exitCode"], Value::Null, "{e}");
    let d = duration_ms(e);
    assert!((300..100_000).contains(&d), "durationMs {d}");

    // A child ignoring SIGTERM is killed `killGraceMs` after the timeout.
    let (pid, got) = run_checked(
        c,
        json!({"processId": "t2",
               "argv": ["sh", "-c", "trap '' TERM; echo ready; sleep 100"],
               "timeoutMs": 300, "killGraceMs": 200}),
    )
    .await;
    assert_eq!(got.stdout, b"ready\n");
    let e = &got.exit;
    assert_eq!(e["timedOut"], true, "{e}");
    assert_eq!(e["signal"], "SIGKILL", "{e}");
    assert_eq!(e["exitCode"], Value::Null, "{e}");
    assert!(duration_ms(e) >= 500, "timeout + grace: {e}");
    eventually("the group is gone", || !group_alive(pid)).await;
}

// 6. ------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminate_kills_background_children_of_the_group() {
    let mut ip = connect().await;
    let c = &mut ip.client;
    let pid = start_checked(
        c,
        json!({"processId": "g", "argv": ["sh", "-c", "sleep 100 & echo $!; wait"]}),
    )
    .await;
    let mut acc = Collected::default();
    read_until(c, "g", &mut acc, "the background pid", |a| {
        a.stdout.contains(&b'\n')
    })
    .await;
    let line = text(&acc.stdout);
    let bg: i32 = line.trim().parse().expect("a pid line");
    assert_ne!(bg, pid);
    assert!(pid_exists(bg), "the background sleep runs");

    let r = c.terminate("g", None).await;
    assert_eq!(r, json!({"running": true}));
    let got = finish(c, "g", acc).await;
    got.assert_seqs_contiguous();
    assert_eq!(got.exit["signal"], "SIGTERM", "{}", got.exit);
    assert_eq!(got.exit["exitCode"], Value::Null);
    assert_eq!(got.exit["timedOut"], false);
    assert_eq!(got.exit["reason"], "terminated", "{}", got.exit);
    eventually("the background sleep is gone", || !pid_exists(bg)).await;
    eventually("the group is gone", || !group_alive(pid)).await;

    let r = c.terminate("unknown", None).await;
    assert_eq!(r, json!({"running": false}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminate_escalates_to_sigkill_after_the_grace() {
    let mut ip = connect().await;
    let c = &mut ip.client;
    let pid = start_checked(
        c,
        json!({"processId": "stubborn",
               "argv": ["sh", "-c", "trap \"\" TERM; echo ready; sleep 100"]}),
    )
    .await;
    let mut acc = Collected::default();
    read_until(c, "stubborn", &mut acc, "ready", |a| {
        contains(&a.stdout, b"ready\n")
    })
    .await;
    let r = c.terminate("stubborn", Some(200)).await;
    assert_eq!(r, json!({"running": true}));
    let got = finish(c, "stubborn", acc).await;
    got.assert_seqs_contiguous();
    assert_eq!(got.stdout, b"ready\n");
    let e = &got.exit;
    assert_eq!(e["signal"], "SIGKILL", "SIGTERM was ignored: {e}");
    assert_eq!(e["exitCode"], Value::Null, "{e}");
    assert_eq!(e["timedOut"], false, "{e}");
    assert!(duration_ms(e) >= 200, "{e}");
    eventually("the group is gone", || !group_alive(pid)).await;
}

// 10. -----------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawn_failures_say_what_failed_and_leave_nothing_behind() {
    let mut ip = connect().await;
    let c = &mut ip.client;
    let start_error = |e: &Value| (e["code"].clone(), e["data"].clone(), e["message"].clone());

    // A program not found in PATH: `-32007`, what the client maps to 127.
    let e = c
        .call_err(
            "process/start",
            json!({"processId": "p", "argv": ["nosuchprog-i19"]}),
        )
        .await;
    assert_eq!(
        start_error(&e),
        (
            json!(-32007),
            json!({"what": "program", "path": "nosuchprog-i19", "errno": "ENOENT"}),
            json!("program \"nosuchprog-i19\" not found in PATH")
        )
    );
    assert!(list_entry(c, "p").await.is_none(), "no entry left behind");
    assert!(c.backlog.is_empty(), "no event for a failed start");

    // The id is free again.
    let (_, got) = run_checked(c, json!({"processId": "p", "argv": ["true"]})).await;
    assert_eq!(got.exit["exitCode"], 0);

    // A path that does not exist.
    let e = c
        .call_err(
            "process/start",
            json!({"processId": "q", "argv": ["/nonexistent/prog"]}),
        )
        .await;
    assert_eq!(
        start_error(&e),
        (
            json!(-32007),
            json!({"what": "program", "path": "/nonexistent/prog", "errno": "ENOENT"}),
            json!("program \"/nonexistent/prog\": no such file")
        )
    );

    // A missing working directory is not a missing program.
    let e = c
        .call_err(
            "process/start",
            json!({"processId": "q", "argv": ["true"], "cwd": "/nonexistent-dir"}),
        )
        .await;
    assert_eq!(
        start_error(&e),
        (
            json!(-32007),
            json!({"what": "cwd", "path": "/nonexistent-dir", "errno": "ENOENT"}),
            json!("cwd \"/nonexistent-dir\": no such directory")
        )
    );
    assert!(list_entry(c, "q").await.is_none());

    // A file without an execute bit: `EACCES`, what the client maps to 126.
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("not-executable");
    std::fs::write(&script, "echo hi\n").unwrap();
    let script = script.to_str().unwrap();
    let e = c
        .call_err("process/start", json!({"processId": "q", "argv": [script]}))
        .await;
    assert_eq!(
        start_error(&e),
        (
            json!(-32007),
            json!({"what": "program", "path": script, "errno": "EACCES"}),
            json!(format!(
                "program {script:?}: permission denied (not executable)"
            ))
        )
    );

    // The same on a terminal.
    let e = c
        .call_err(
            "process/start",
            json!({"processId": "q", "argv": ["/nonexistent/prog"], "tty": true}),
        )
        .await;
    assert_eq!(e["code"], -32007, "{e}");
    assert_eq!(e["data"]["what"], "program", "{e}");
    assert_eq!(e["data"]["errno"], "ENOENT", "{e}");
    assert!(list_entry(c, "q").await.is_none());

    let e = c
        .call_err("process/start", json!({"processId": "r", "argv": []}))
        .await;
    assert_eq!(e["code"], -32602, "{e}");
    let e = c
        .call_err(
            "process/start",
            json!({"processId": "r", "argv": ["true"], "cwd": "relative"}),
        )
        .await;
    assert_eq!(e["code"], -32602, "{e}");
    assert!(list_entry(c, "r").await.is_none());
    let ids: Vec<Value> = c.call("process/list", json!({})).await["processes"]
        .as_array()
        .expect("array")
        .iter()
        .map(|p| p["processId"].clone())
        .collect();
    assert_eq!(ids, vec![json!("p")]);
}

// 11. -----------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_shows_running_then_exited() {
    let mut ip = connect().await;
    let c = &mut ip.client;
    let pid = start_checked(
        c,
        json!({"processId": "l", "argv": ["cat"], "pipeStdin": true}),
    )
    .await;
    let e = list_entry(c, "l").await.expect("listed");
    assert_eq!(e["state"], "running", "{e}");
    assert_eq!(e["pid"], pid, "{e}");
    assert_eq!(e["argv"], json!(["cat"]), "{e}");
    assert_eq!(e["tty"], false, "{e}");
    assert_eq!(e["exitCode"], Value::Null, "{e}");
    assert_eq!(e["signal"], Value::Null, "{e}");
    assert_eq!(e["nextSeq"], 1, "{e}");

    c.close_stdin("l").await;
    let got = collect_checked(c, "l").await;
    let e = list_entry(c, "l").await.expect("still listed after exit");
    assert_eq!(e["state"], "exited", "{e}");
    assert_eq!(e["exitCode"], 0, "{e}");
    assert_eq!(e["signal"], Value::Null, "{e}");
    assert_eq!(
        e["nextSeq"].as_u64(),
        got.exit["seq"].as_u64().map(|s| s + 1),
        "{e}"
    );
}
