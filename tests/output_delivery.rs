//! Delivery under backpressure: nothing dropped, control replies never stuck behind output,
//! drain deadlines extended by time spent blocked on a slow client.

mod common;
use common::process::wchan;
use common::*;

use execrelay::config::ServerConfig;
use serde_json::json;

/// Small queues everywhere, so that they are truly full in these tests.
fn small_queues() -> ServerConfig {
    ServerConfig {
        retained_output_bytes: 128 * 1024,
        output_budget_bytes: 64 * 1024,
        ..cfg()
    }
}

/// A file of `len` non-repeating bytes, and the bytes.
fn random_file(len: usize) -> (tempfile::NamedTempFile, Vec<u8>) {
    let mut data = vec![0u8; len];
    getrandom_fill(&mut data);
    (file_with(&data), data)
}

fn getrandom_fill(buf: &mut [u8]) {
    // A cheap deterministic generator is enough: the point is non-repeating content.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for b in buf.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_written_while_client_reads_nothing_arrives_whole_once_it_reads() {
    let (file, data) = random_file(512 * 1024);
    // 16 KiB of in-memory transport: the writer blocks almost at once.
    let mut s = in_process(small_queues(), 16 * 1024);
    s.client.handshake().await;
    let id = s
        .client
        .request(
            "process/start",
            json!({"processId": "p", "argv": ["cat", file.path()]}),
        )
        .await;
    // Only the start result is read; the output stays unread.
    let r = s.client.response(id).await;
    let pid = r["result"]["pid"].as_u64().unwrap();
    assert!(s.client.backlog.is_empty(), "the start result comes first");
    // Every queue is full: the child cannot make progress and sits in write().
    eventually("child blocked writing its pipe", || {
        wchan(pid).ends_with("pipe_write")
    })
    .await;
    let session_id = s.registry.process_count();
    assert_eq!(session_id, 1);

    let c = s.client.collect("p").await;
    assert_eq!(sha256(&c.stdout), sha256(&data), "every byte, in order");
    assert_eq!(c.exit["exitCode"], 0);
    assert_eq!(c.exit["outputDrainTimedOut"], false);
    assert_eq!(c.exit["stdoutBytes"], 512 * 1024);
    c.assert_seqs_contiguous();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resize_and_terminate_answer_before_pending_output() {
    let mut s = in_process(cfg(), 64 * 1024);
    let init = s.client.handshake().await;
    let sid = init["sessionId"].as_str().unwrap().to_string();
    let id = s
        .client
        .request(
            "process/start",
            json!({"processId": "big", "argv": ["sh", "-c",
                "head -c 1048576 /dev/zero & head -c 1048576 /dev/zero >&2; wait; exec sleep 100"]}),
        )
        .await;
    s.client.response(id).await;
    // Wait (without reading) until the server holds the megabytes of each stream unread.
    let session = s.registry.session(&sid).unwrap();
    let proc = session.get("big").unwrap();
    eventually("1 MiB of output pending in the server", || {
        proc.stats().unwritten_bytes >= 900 * 1024
    })
    .await;

    // The promise is about replies the server has made: from the moment one is queued it
    // overtakes every output event not yet handed to the transport. How long the server takes
    // to read a request and run its handler is scheduling (a runtime worker, on a loaded
    // machine, may get no CPU for milliseconds), and meanwhile the writer rightly goes on
    // delivering output at hundreds of MB/s; counting from the moment the requests were sent
    // measured that latency, not the promise. So the client reads nothing until both replies
    // are queued: the writer then holds them, behind only what was already in flight (the
    // client's buffer, the 64 KiB pipe, the transport's write buffer and one event).
    let responses = || s.registry.metrics().rpc_responses.get();
    let before = responses();
    let resize = s
        .client
        .request(
            "process/resize",
            json!({"processId": "big", "rows": 10, "cols": 10}),
        )
        .await;
    let term = s
        .client
        .request(
            "process/terminate",
            json!({"processId": "big", "graceMs": 5000}),
        )
        .await;
    eventually("both replies queued", || responses() >= before + 2).await;
    // Read in wire order and count the output that came before both replies.
    let mut output_before = 0usize;
    let mut got = Vec::new();
    while got.len() < 2 {
        let m = s.client.read_message().await.expect("connection open");
        if m.get("method").is_some() {
            output_before += m["params"]["chunk"].as_str().map_or(0, |c| c.len() * 3 / 4);
            s.client.backlog.push_back(m);
        } else {
            got.push(m);
        }
    }
    assert!(
        output_before < 512 * 1024,
        "replies waited behind {output_before} bytes of output"
    );
    // The two replies may come in either order (both bypass the output); find each by id.
    got.sort_by_key(|m| m["id"].as_u64());
    let (r1, r2) = (&got[0], &got[1]);
    assert_eq!(r1["id"], resize);
    assert_eq!(r1["error"]["code"], -32602, "resize of a pipe process");
    assert_eq!(r2["id"], term);
    assert_eq!(r2["result"]["running"], true);

    let c = s.client.collect("big").await;
    // Everything the server had read (the pending megabyte among it) is still delivered.
    assert_eq!(
        c.stdout.len() as u64,
        c.exit["stdoutBytes"].as_u64().unwrap()
    );
    assert_eq!(
        c.stderr.len() as u64,
        c.exit["stderrBytes"].as_u64().unwrap()
    );
    assert!(c.stdout.len() + c.stderr.len() >= 900 * 1024);
    assert_eq!(c.exit["signal"], "SIGTERM");
    assert!(c.exit["exitCode"].is_null());
    c.assert_seqs_contiguous();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_reader_longer_than_the_drain_deadline_loses_nothing() {
    let (file, data) = random_file(4 * 1024 * 1024);
    let mut s = in_process(small_queues(), 16 * 1024);
    s.client.handshake().await;
    s.client
        .start(json!({"processId": "p", "argv": ["cat", file.path()], "drainTimeoutMs": 100}))
        .await;
    let mut stdout = Vec::new();
    let started = std::time::Instant::now();
    let exit = loop {
        let n = s.client.next_notification().await.unwrap();
        let p = &n["params"];
        if n["method"] == "process/exited" {
            break p.clone();
        }
        stdout.extend(unb64(p["chunk"].as_str().unwrap()));
        // The slowness under test: a client that takes its time with every chunk.
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    };
    assert!(
        started.elapsed() > std::time::Duration::from_millis(500),
        "the client must have been slower than several drain deadlines"
    );
    assert_eq!(stdout.len(), data.len());
    assert_eq!(sha256(&stdout), sha256(&data));
    assert_eq!(exit["exitCode"], 0);
    assert_eq!(exit["outputDrainTimedOut"], false);
}

/// `execrelay serve` whose output pumps first look at their streams only after the drain
/// deadline (the debug build's `late-pump` fault: what an overloaded runtime did to pumps it
/// first polled seconds after their child exited), and a client of it. The child is kept so
/// that the server lives as long as the test; [`stop`] ends it the way an operator does.
async fn late_pump_server() -> (tokio::process::Child, RawClient) {
    use common::binary::{first_line, serve_cmd, ws_client};
    let mut c = serve_cmd("ws://127.0.0.1:0", std::process::Stdio::null());
    c.env("EXECRELAY_DEBUG_FAULTS", "late-pump");
    let mut child = c.spawn().expect("spawn serve");
    let (url, lines) = first_line(&mut child, PROMPT).await;
    let url = url.expect("serve prints its URL");
    tokio::spawn(async move {
        let mut lines = lines;
        while let Ok(Some(_)) = lines.next_line().await {}
    });
    let t = execrelay::transport::websocket::connect_websocket(&url, 1 << 24)
        .await
        .expect("connect");
    let mut client = ws_client(t);
    client.handshake().await;
    (child, client)
}

/// The drain deadline ends the wait for more output, not the reading of what the child left:
/// a pump first run after the deadline (a loaded server) still delivers the child's output,
/// on a pipe and on a terminal, and the stream ended, so the drain did not time out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_left_by_an_exited_child_survives_a_pump_run_after_the_drain_deadline() {
    let (server, mut client) = late_pump_server().await;
    client
        .start(
            json!({"processId": "pipe", "argv": ["sh", "-c", "printf out; printf err >&2"],
                      "drainTimeoutMs": 50}),
        )
        .await;
    let c = client.collect("pipe").await;
    assert_eq!(text(&c.stdout), "out", "{}", c.exit);
    assert_eq!(text(&c.stderr), "err", "{}", c.exit);
    assert_eq!(c.exit["stdoutBytes"], 3, "{}", c.exit);
    assert_eq!(c.exit["outputDrainTimedOut"], false, "{}", c.exit);

    client
        .start(
            json!({"processId": "tty", "argv": ["printf", "on a terminal"], "tty": true,
                      "drainTimeoutMs": 50}),
        )
        .await;
    let c = client.collect("tty").await;
    assert_eq!(text(&c.pty), "on a terminal", "{}", c.exit);
    assert_eq!(c.exit["outputDrainTimedOut"], false, "{}", c.exit);
    stop(server).await;
}

/// SIGTERM to the server, and its exit: its shutdown ends what its sessions started.
async fn stop(mut server: tokio::process::Child) {
    let pid = server.id().expect("serve still runs") as i32;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM to serve");
    tokio::time::timeout(PROMPT, server.wait())
        .await
        .expect("serve did not exit on SIGTERM (hang guard)")
        .expect("wait for serve");
}

/// Past the deadline the pump takes what is there and stops at the first wait: a descendant
/// that holds the pipe open still has its stream cut at the deadline, with the child's
/// output delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_pump_still_cuts_a_stream_a_descendant_holds_open() {
    let (server, mut client) = late_pump_server().await;
    client
        .start(
            json!({"processId": "p", "argv": ["sh", "-c", "printf before; sleep 30 &"],
                      "drainTimeoutMs": 50}),
        )
        .await;
    let c = client.collect("p").await;
    assert_eq!(text(&c.stdout), "before", "{}", c.exit);
    assert_eq!(c.exit["outputDrainTimedOut"], true, "{}", c.exit);
    // The `sleep` is ended with the server.
    stop(server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_are_numbered_without_gaps_and_exit_is_last() {
    let mut s = in_process(cfg(), 1 << 20);
    s.client.handshake().await;
    let c = s
        .client
        .run(json!({"processId": "p", "argv": ["sh", "-c",
                "for i in $(seq 1 200); do echo out$i; echo err$i >&2; done"]}))
        .await;
    c.assert_seqs_contiguous();
    let expected_out: String = (1..=200).map(|i| format!("out{i}\n")).collect();
    let expected_err: String = (1..=200).map(|i| format!("err{i}\n")).collect();
    assert_eq!(String::from_utf8(c.stdout).unwrap(), expected_out);
    assert_eq!(String::from_utf8(c.stderr).unwrap(), expected_err);

    // process/read sees the same numbering.
    let r = s
        .client
        .call("process/read", json!({"processId": "p", "afterSeq": 0}))
        .await;
    let seqs: Vec<u64> = r["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, c.seqs);
    assert_eq!(
        r["events"].as_array().unwrap().last().unwrap()["type"],
        "exited"
    );
    assert_eq!(r["exited"], true);
    assert_eq!(r["running"], false);
    assert_eq!(r["nextSeq"], c.seqs.len() as u64 + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_long_polls_until_output_and_respects_after_seq() {
    let mut s = in_process(cfg(), 1 << 20);
    s.client.handshake().await;
    s.client
        .start(json!({"processId": "p", "argv": ["cat"], "pipeStdin": true}))
        .await;
    let read = s
        .client
        .request(
            "process/read",
            json!({"processId": "p", "afterSeq": 0, "waitMs": 30000}),
        )
        .await;
    s.client.write("p", b"ping").await;
    let r = s.client.response(read).await;
    let ev = &r["result"]["events"][0];
    assert_eq!(ev["seq"], 1);
    assert_eq!(ev["type"], "output");
    assert_eq!(ev["chunk"], b64(b"ping"));
    assert_eq!(r["result"]["running"], true);
    // Nothing after seq 1 yet: a zero-wait read returns at once, empty.
    let r = s
        .client
        .call("process/read", json!({"processId": "p", "afterSeq": 1}))
        .await;
    assert_eq!(r["events"], json!([]));
    assert_eq!(r["nextSeq"], 2);
    s.client.close_stdin("p").await;
    let c = s.client.collect("p").await;
    assert_eq!(c.exit["exitCode"], 0);
}
