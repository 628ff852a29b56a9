//! A stream must never stop for good while its client reads: the regressions of the stall
//! seen after a reader paused under load, driven through a real server.
//!
//! The cause was a log that landed on its retention limit to the byte with every event
//! written (no acks): it neither released (only past the limit) nor admitted (only under it),
//! so its pump waited for room no one would make. Here the limit is one 4 KiB chunk, and the
//! child's first write is one atomic 4 KiB pipe write, read whole before the test lets the child
//! go on: the log is exactly full, deterministically.

mod common;
use common::*;

use execrelay::config::ServerConfig;
use execrelay::process::event_log::output_cost;
use serde_json::json;

/// Everything the client owes is paid (all written, no acks) while the log sits exactly at its
/// limit: the next output must still come.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_exactly_at_its_limit_with_everything_written_keeps_flowing() {
    let cfg = ServerConfig {
        retained_output_bytes: output_cost(4096),
        ..cfg()
    };
    let mut t = in_process(cfg, 1 << 20);
    let init = t.client.handshake().await;
    let sid = init["sessionId"].as_str().unwrap().to_string();
    // One write of 4096 bytes (atomic on a pipe: PIPE_BUF), then wait for stdin, then more.
    t.client
        .start(json!({
            "processId": "p",
            "argv": ["sh", "-c", "printf '%4096s' x; read go; echo done; read stop"],
            "pipeStdin": true,
        }))
        .await;
    let first = t.client.next_notification().await.expect("first delta");
    assert_eq!(first["method"], "process/outputDelta", "{first}");
    assert_eq!(
        unb64(first["params"]["chunk"].as_str().unwrap()).len(),
        4096
    );
    // The delta reached us, so it was written: the log holds exactly its limit, owed nothing.
    {
        let init_sid = "";
        let _ = init_sid;
    }
    let stats = t.registry.session(&sid).unwrap().get("p").unwrap().stats();
    // Exactly one 4 KiB event, written: the log reached its limit to the byte and is owed
    // nothing (before the fix it stayed there, full: retained 4160 of 4160).
    assert_eq!(
        (stats.next_seq, stats.written_through, stats.unwritten_bytes),
        (2, 1, 0),
        "{stats:?}"
    );
    t.client.write("p", b"go\n").await;
    let next = tokio::time::timeout(GUARD, t.client.next_notification())
        .await
        .expect("the output after a full, fully written log arrives (it stopped for good)")
        .expect("connection open");
    assert_eq!(next["method"], "process/outputDelta", "{next}");
    assert_eq!(unb64(next["params"]["chunk"].as_str().unwrap()), b"done\n");
    t.client.write("p", b"stop\n").await;
    let c = t.client.collect("p").await;
    assert_eq!(c.exit["exitCode"], 0, "{}", c.exit);
    assert_eq!(c.exit["outputDrainTimedOut"], false, "{}", c.exit);
}

// ---------------------------------------------------------------------------------------------
// The stall watchdog: wake-ups broken on purpose (debug builds' `EXECRELAY_DEBUG_FAULTS`), seen.

/// `execrelay serve --listen LISTEN --metrics-listen 127.0.0.1:0 --stall-watchdog-ms 400
/// EXTRA…` (EXTRA may set the watchdog's bound itself) with `faults` injected; `abort`: whether the debug build may stop at a stall.
/// Returns the child, its listener URL, its metrics address and its log file.
async fn faulty_server(
    dir: &std::path::Path,
    listen: &str,
    faults: &str,
    abort: bool,
    extra: &[&str],
) -> (tokio::process::Child, String, String, std::path::PathBuf) {
    use common::binary::{first_line, serve_cmd};
    let log = dir.join("server.log");
    let mut c = serve_cmd(listen, std::fs::File::create(&log).unwrap());
    c.args(["--metrics-listen", "127.0.0.1:0"]);
    if !extra.contains(&"--stall-watchdog-ms") {
        c.args(["--stall-watchdog-ms", "400"]);
    }
    c.args(extra)
        .env("RUST_LOG", "info")
        .env("EXECRELAY_DEBUG_FAULTS", faults);
    if !abort {
        c.env("EXECRELAY_STALL_ABORT", "0");
    }
    let mut child = c.spawn().expect("spawn serve");
    let (url, lines) = first_line(&mut child, PROMPT).await;
    let url = url.expect("serve prints its URL");
    // Keep stdout open.
    tokio::spawn(async move {
        let mut lines = lines;
        while let Ok(Some(_)) = lines.next_line().await {}
    });
    let mut metrics = None;
    eventually("the metrics address in the log", || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        metrics = text
            .lines()
            .find_map(|l| l.split("metrics: http://").nth(1))
            .map(|a| a.trim_end_matches("/metrics").trim().to_string());
        metrics.is_some()
    })
    .await;
    (child, url, metrics.unwrap(), log)
}

/// `GET /metrics`: the value of `name` (a line `name value`).
async fn metric(addr: &str, name: &str) -> Option<f64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .ok()?;
    let mut out = Vec::new();
    tokio::time::timeout(PROMPT, s.read_to_end(&mut out))
        .await
        .ok()?
        .ok()?;
    String::from_utf8_lossy(&out)
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name} "))?.parse().ok())
}

/// A plain `ws://` client to `url`, initialized.
async fn ws_session(url: &str) -> RawClient {
    let t = execrelay::transport::websocket::connect_websocket(url, 1 << 24)
        .await
        .expect("connect");
    let mut c = common::binary::ws_client(t);
    c.handshake().await;
    c
}

/// A lost wake-up between the pump and the writer (the ready queue drops its pushes): the
/// output waits unwritten while the writer sleeps. The watchdog reports it once, with the
/// log's counters and the writer's phase, and counts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_reports_a_lost_wakeup_between_pump_and_writer() {
    let dir = tempfile::tempdir().unwrap();
    let (mut srv, url, metrics, log) = faulty_server(
        dir.path(),
        "ws://127.0.0.1:0",
        "lose-ready-push",
        false,
        &[],
    )
    .await;
    assert_eq!(
        metric(&metrics, "execrelay_stalled_streams").await,
        Some(0.0)
    );
    let mut c = ws_session(&url).await;
    c.start(json!({"processId": "lost", "argv": ["sh", "-c", "echo hello; sleep 600"]}))
        .await;
    let mut text = String::new();
    eventually("the watchdog's report", || {
        text = std::fs::read_to_string(&log).unwrap_or_default();
        text.contains("stalled stream")
    })
    .await;
    let line = text.lines().find(|l| l.contains("stalled stream")).unwrap();
    assert!(line.contains("ERROR"), "{line}");
    assert!(
        line.contains("events wait and the transport has room, nothing is written"),
        "{line}"
    );
    assert!(line.contains("process \"lost\""), "{line}");
    assert!(line.contains("written 0"), "{line}");
    assert!(line.contains("writer Idle"), "{line}");
    assert!(line.contains("process queued for it: false"), "{line}");
    assert_eq!(
        metric(&metrics, "execrelay_stalled_streams").await,
        Some(1.0)
    );
    assert_eq!(metric(&metrics, "execrelay_stalls_total").await, Some(1.0));
    assert_eq!(
        text.matches("stalled stream").count(),
        1,
        "reported once: {text}"
    );
    c.terminate("lost", Some(0)).await;
    srv.kill().await.unwrap();
}

/// The dead end that stopped streams for good, injected again (release only past the
/// limit), seen as such: the child waits for room and the client owes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_reports_the_dead_end_of_a_full_log() {
    let dir = tempfile::tempdir().unwrap();
    let retained = output_cost(4096).to_string();
    let (mut srv, url, metrics, log) = faulty_server(
        dir.path(),
        "ws://127.0.0.1:0",
        "release-past-limit",
        false,
        &["--retained-output-bytes", &retained],
    )
    .await;
    let mut c = ws_session(&url).await;
    c.start(json!({
        "processId": "full",
        "argv": ["sh", "-c", "printf '%4096s' x; read go; echo done; read stop"],
        "pipeStdin": true,
    }))
    .await;
    let first = c.next_notification().await.expect("first delta");
    assert_eq!(
        unb64(first["params"]["chunk"].as_str().unwrap()).len(),
        4096
    );
    c.write("full", b"go\n").await;
    let mut text = String::new();
    eventually("the watchdog's report", || {
        text = std::fs::read_to_string(&log).unwrap_or_default();
        text.contains("stalled stream")
    })
    .await;
    let line = text.lines().find(|l| l.contains("stalled stream")).unwrap();
    assert!(
        line.contains("the child waits for room and the client owes nothing"),
        "{line}"
    );
    assert!(line.contains("pump waiting for Some(Retention)"), "{line}");
    assert!(line.contains(&format!("retained {retained} B")), "{line}");
    assert_eq!(
        metric(&metrics, "execrelay_stalled_streams").await,
        Some(1.0)
    );
    c.terminate("full", Some(0)).await;
    srv.kill().await.unwrap();
}

/// Over Noise the report carries the stream's flow-control state (sent, acked, window,
/// queued); and a debug build stops at a stall (abort, after the report on stderr), so that a
/// test that runs into one fails loudly instead of hanging.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_debug_build_stops_at_a_stall_with_the_streams_flow_state() {
    use common::noise_bin::server_and_client;
    let dir = tempfile::tempdir().unwrap();
    let (server, client, auth) = server_and_client(dir.path()).await;
    let (mut srv, url, _metrics, log) = faulty_server(
        dir.path(),
        "noise+ws://127.0.0.1:0",
        "lose-ready-push",
        true,
        &[
            "--key",
            server.p(),
            "--authorized-keys",
            auth.to_str().unwrap(),
        ],
    )
    .await;
    // `execrelay run` waits for output that never comes; the server stops itself.
    let mut run = tokio::process::Command::new(bin())
        .args([
            "run",
            &url,
            "--server-key",
            server.pubs(),
            "--key",
            client.p(),
        ])
        .args(["--", "sh", "-c", "echo hello; sleep 600"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let status = tokio::time::timeout(GUARD, srv.wait())
        .await
        .expect("the debug server stops at the stall (hang guard)")
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGABRT), "{status:?}");
    let text = std::fs::read_to_string(&log).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with("execrelay (debug build): stalled stream"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains("transport: send: sent "), "{line}");
    assert!(line.contains("; receive: received "), "{line}");
    assert!(line.contains(" acked "), "{line}");
    assert!(line.contains(" window 16 "), "{line}");
    assert!(line.contains(" queued "), "{line}");
    let _ = run.kill().await;
}

// ---------------------------------------------------------------------------------------------
// Wake-ups found by the audit of every wait (`docs/wakeups.md`).

/// An acknowledgement carried by `process/read` (`afterSeq`, acks on) wakes what waits on the
/// log like a `process/ack` does: here the reaper, which removes a process once its exit
/// notice is acknowledged. It used to wake nobody: the process stayed listed, its slot taken,
/// until the session closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_carried_by_a_read_wakes_the_reaper() {
    let mut t = in_process(cfg(), 1 << 20);
    t.client
        .call(
            "initialize",
            json!({"clientName": "test", "capabilities": {"acks": true}}),
        )
        .await;
    t.client.notify("initialized", json!({})).await;
    let c = t
        .client
        .run(json!({"processId": "r", "argv": ["echo", "hi"]}))
        .await;
    let exit_seq = c.exit["seq"].as_u64().expect("exit seq");
    let listed = t.client.call("process/list", json!({})).await;
    assert_eq!(listed["processes"].as_array().unwrap().len(), 1, "{listed}");
    // The exit notice acknowledged by a read, not by process/ack.
    t.client
        .call(
            "process/read",
            json!({"processId": "r", "afterSeq": exit_seq}),
        )
        .await;
    // The reaper runs on its own: poll the list (bounded) until it lets the process go.
    let deadline = tokio::time::Instant::now() + PROMPT;
    loop {
        let listed = t.client.call("process/list", json!({})).await;
        if listed["processes"].as_array().unwrap().is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still listed after its exit notice was acknowledged by a read: {listed}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// The client library against a server that keeps little per process (its retention far
/// below the library's ack interval) and output of tiny events: the server waits for acks
/// once its retention is full, so the library must never wait for output while it owes an
/// ack for everything it consumed. It used to ack only every 64 KiB of bytes consumed: with
/// short lines the server's retention (counting 64 bytes per event) filled first, and both
/// sides waited for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_library_owes_no_ack_while_it_waits_for_output() {
    use execrelay::client::{Client, ClientOptions, InProcessConfig, ProcessEvent, StartOptions};
    for retained in [32 * 1024, 128 * 1024] {
        let config = InProcessConfig {
            server: ServerConfig {
                retained_output_bytes: retained,
                ..cfg()
            },
            ..InProcessConfig::default()
        };
        let client = Client::in_process(config, ClientOptions::default())
            .await
            .unwrap();
        let script = "i=0; while [ $i -lt 20000 ]; do echo $i; i=$((i+1)); done";
        let mut p = client
            .start(StartOptions::new("lines", ["sh", "-c", script]))
            .await
            .unwrap();
        let mut out = Vec::new();
        let exit = loop {
            match tokio::time::timeout(GUARD, p.next_event()).await {
                Ok(Some(ProcessEvent::Output { data, .. })) => out.extend_from_slice(&data),
                Ok(Some(ProcessEvent::Exited(info))) => break info,
                Ok(other) => panic!("{other:?}"),
                Err(_) => panic!(
                    "retention {retained}: no output for {GUARD:?} after {} bytes (both sides \
                     waiting)",
                    out.len()
                ),
            }
        };
        assert_eq!(exit.exit_code, Some(0));
        let expected: String = (0..20000).map(|i| format!("{i}\n")).collect();
        assert_eq!(out, expected.as_bytes(), "retention {retained}");
        client.shutdown().await;
    }
}

/// Starting an id that a live handle of this client holds is refused here, and that handle
/// keeps its events: the start used to replace the handle's slot (and remove it when the
/// server refused the duplicate), leaving the handle waiting on a slot no event reached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_start_of_a_live_id_leaves_the_first_handle_its_events() {
    use execrelay::client::{
        Client, ClientError, ClientOptions, InProcessConfig, ProcessEvent, StartOptions,
    };
    let client = Client::in_process(InProcessConfig::default(), ClientOptions::default())
        .await
        .unwrap();
    let mut opts = StartOptions::new("dup", ["sh", "-c", "read x; echo got $x"]);
    opts.params.pipe_stdin = true;
    let mut first = client.start(opts).await.unwrap();
    match client.start(StartOptions::new("dup", ["true"])).await {
        Err(ClientError::ProcessIdInUse(id)) => assert_eq!(id, "dup"),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a second handle for a live id"),
    }
    first.write(b"one\n").await.unwrap();
    let mut out = Vec::new();
    loop {
        match tokio::time::timeout(GUARD, first.next_event())
            .await
            .expect("the first handle still gets its events")
        {
            Some(ProcessEvent::Output { data, .. }) => out.extend_from_slice(&data),
            Some(ProcessEvent::Exited(info)) => {
                assert_eq!(info.exit_code, Some(0));
                break;
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(out, b"got one\n");
    // Its exit taken, the id is free here; the server lets it go once the exit's ack
    // arrives (a moment later): start it again as soon as the server allows.
    let deadline = tokio::time::Instant::now() + PROMPT;
    let mut again = loop {
        match client
            .start(StartOptions::new("dup", ["echo", "again"]))
            .await
        {
            Ok(h) => break h,
            Err(ClientError::Rpc { code: -32002, .. }) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the server kept the id"
                );
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            Err(e) => panic!("{e}"),
        }
    };
    drop(first);
    let mut out = Vec::new();
    while let Some(ev) = tokio::time::timeout(GUARD, again.next_event())
        .await
        .unwrap()
    {
        if let ProcessEvent::Output { data, .. } = ev {
            out.extend_from_slice(&data);
        }
    }
    assert_eq!(
        out, b"again\n",
        "dropping the old handle left the new one its slot"
    );
    client.shutdown().await;
}

/// The client never hangs on a live connection: with the server's delivery broken on purpose
/// (its ready queue drops every push, and the watchdog is off so the debug server runs on),
/// the library asks about a process that stays quiet while it waits, and gets every event
/// that way, in order, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_asks_about_a_quiet_process_and_gets_what_the_server_held() {
    use execrelay::client::{Client, ClientOptions, ProcessEvent, StartOptions, Target};
    let dir = tempfile::tempdir().unwrap();
    let (mut srv, url, _metrics, _log) = faulty_server(
        dir.path(),
        "ws://127.0.0.1:0",
        "lose-ready-push",
        false,
        &["--stall-watchdog-ms", "0"],
    )
    .await;
    let opts = ClientOptions {
        silence_probe: Some(std::time::Duration::from_millis(300)),
        ..ClientOptions::default()
    };
    let client = Client::connect(Target::Ws(url), opts).await.unwrap();
    let mut p = client
        .start(StartOptions::new(
            "quiet",
            ["sh", "-c", "echo one; sleep 0.5; echo two; exit 3"],
        ))
        .await
        .unwrap();
    let mut out = Vec::new();
    let exit = loop {
        match tokio::time::timeout(GUARD, p.next_event())
            .await
            .expect("events arrive although delivery is broken")
        {
            Some(ProcessEvent::Output { data, .. }) => out.extend_from_slice(&data),
            Some(ProcessEvent::Exited(info)) => break info,
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(out, b"one\ntwo\n");
    assert_eq!(exit.exit_code, Some(3));
    client.close();
    srv.kill().await.unwrap();
}

/// A process that is merely silent for longer than the probe interval loses and repeats
/// nothing: the probe finds nothing new, and the output that follows arrives once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_process_is_asked_about_and_nothing_is_repeated() {
    use execrelay::client::{Client, ClientOptions, ProcessEvent, StartOptions, Target};
    let (mut srv, url) = {
        let dir = tempfile::tempdir().unwrap();
        let (srv, url, _m, _l) =
            faulty_server(dir.path(), "ws://127.0.0.1:0", "", false, &[]).await;
        (srv, url)
    };
    let opts = ClientOptions {
        silence_probe: Some(std::time::Duration::from_millis(50)),
        ..ClientOptions::default()
    };
    let client = Client::connect(Target::Ws(url), opts).await.unwrap();
    let mut p = client
        .start(StartOptions::new(
            "silent",
            ["sh", "-c", "echo a; sleep 0.6; echo b; sleep 0.6; echo c"],
        ))
        .await
        .unwrap();
    let mut out = Vec::new();
    while let Some(ev) = tokio::time::timeout(GUARD, p.next_event()).await.unwrap() {
        match ev {
            ProcessEvent::Output { data, .. } => out.extend_from_slice(&data),
            ProcessEvent::Exited(info) => assert_eq!(info.exit_code, Some(0)),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(out, b"a\nb\nc\n");
    client.close();
    srv.kill().await.unwrap();
}
