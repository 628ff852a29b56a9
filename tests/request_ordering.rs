//! Ordering of concurrent requests on one connection (`protocol.md` §6, `processes.md` §6):
//! exclusive requests are FIFO per process, reads share and never overtake an earlier
//! exclusive request, control requests are never queued, events of one process reach the wire
//! in seq order after the start result, and a closed connection skips what it had queued.
//!
//! Every wait is on a protocol message (or, for states outside the protocol, `eventually`);
//! deadlines are hang guards only.

mod common;
use common::*;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::Engine;
use serde_json::{json, Value};

use execrelay::config::ServerConfig;
use execrelay::connection_processor::{ConnectionEnd, ConnectionOptions};
use execrelay::session_registry::SessionRegistry;

/// A connection that completed `initialize` + `initialized`.
async fn ready_with(cfg: ServerConfig) -> InProcess {
    let mut t = in_process(cfg, 1 << 20);
    t.client.handshake().await;
    t
}

/// SIGKILL to a process group we started (hygiene: never leave children behind).
fn kill_group(pid: &Value) {
    let pid = pid.as_i64().expect("pid") as i32;
    assert!(pid > 1);
    unsafe { libc::kill(-pid, libc::SIGKILL) };
}

fn decode(chunk: &Value) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(chunk.as_str().expect("chunk"))
        .expect("base64")
}

/// Collect the notifications of several processes until each has exited, checking that no
/// event follows an exit notice. `RawClient::collect` handles one process and keeps the
/// others' notifications to itself.
async fn collect_all(c: &mut RawClient, ids: &[&str]) -> HashMap<String, Collected> {
    let mut out: HashMap<String, Collected> = HashMap::new();
    let mut exited = 0;
    while exited < ids.len() {
        let n = c
            .next_notification()
            .await
            .expect("connection closed before every process exited");
        let p = &n["params"];
        let id = p["processId"].as_str().expect("processId");
        assert!(ids.contains(&id), "unexpected notification {n}");
        let col = out.entry(id.to_string()).or_default();
        assert!(col.exit.is_null(), "event after the exit notice: {n}");
        col.seqs.push(p["seq"].as_u64().expect("seq"));
        match n["method"].as_str().expect("method") {
            "process/outputDelta" => {
                let data = decode(&p["chunk"]);
                assert!(data.len() <= 64 * 1024, "chunk over MAX_CHUNK_BYTES");
                match p["stream"].as_str().expect("stream") {
                    "stdout" => col.stdout.extend_from_slice(&data),
                    "stderr" => col.stderr.extend_from_slice(&data),
                    "pty" => col.pty.extend_from_slice(&data),
                    s => panic!("unknown stream {s}"),
                }
            }
            "process/exited" => {
                col.exit = p.clone();
                exited += 1;
            }
            m => panic!("unexpected notification {m}"),
        }
    }
    out
}

/// Whether a response to `id` is already waiting in the backlog.
fn answered(c: &RawClient, id: u64) -> bool {
    c.backlog
        .iter()
        .any(|m| m["id"] == id && m.get("method").is_none())
}

/// A named pipe the child blocks on until the test releases it: lets a test hold a child
/// back without the child reading its stdin, and without any sleep.
fn make_fifo(dir: &Path) -> PathBuf {
    let path = dir.join("go");
    let c = std::ffi::CString::new(path.to_str().expect("utf-8 path")).expect("no NUL");
    let r = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    assert_eq!(r, 0, "mkfifo: {}", std::io::Error::last_os_error());
    path
}

/// Let the child blocked in `read -r _ < FIFO` go on.
async fn release(fifo: &Path) {
    let fifo = fifo.to_path_buf();
    let open = tokio::task::spawn_blocking(move || {
        use std::io::Write;
        // Blocks until the child has the FIFO open for reading.
        let mut f = std::fs::OpenOptions::new().write(true).open(&fifo)?;
        f.write_all(b"go\n")
    });
    tokio::time::timeout(GUARD, open)
        .await
        .expect("the child opens the FIFO")
        .expect("join")
        .expect("write to the FIFO");
}

/// argv of a child that waits for [`release`], then copies stdin to stdout.
fn held_cat(fifo: &Path) -> Value {
    json!([
        "sh",
        "-c",
        r#"read -r _ < "$0"; exec cat"#,
        fifo.to_str().unwrap()
    ])
}

/// Bytes waiting in the pipe that is `pid`'s stdin (opened through `/proc`, never read).
fn stdin_pipe_fill(pid: i32) -> usize {
    let path = std::ffi::CString::new(format!("/proc/{pid}/fd/0")).unwrap();
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_NONBLOCK);
        if fd < 0 {
            return 0;
        }
        let mut n: libc::c_int = 0;
        let r = libc::ioctl(fd, libc::FIONREAD, &mut n);
        libc::close(fd);
        if r < 0 {
            0
        } else {
            n as usize
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_starts_with_the_same_id_exactly_one_wins() {
    let mut t = ready_with(cfg()).await;
    let c = &mut t.client;
    let params = json!({"processId": "x", "argv": ["sleep", "100"]});
    let first = c.request("process/start", params.clone()).await;
    let second = c.request("process/start", params).await;
    let r1 = c.response(first).await;
    let r2 = c.response(second).await;

    // FIFO per processId: the first in wire order wins.
    let pid = r1["result"]["pid"].clone();
    assert!(pid.is_u64(), "{r1}");
    assert_eq!(r1["result"]["processId"], "x");
    assert!(r2.get("result").is_none(), "{r2}");
    assert_eq!(r2["error"]["code"], -32002, "{r2}");
    assert_eq!(r2["error"]["message"], r#"process id "x" already exists"#);

    let list = c.call("process/list", json!({})).await;
    assert_eq!(list["processes"].as_array().unwrap().len(), 1, "{list}");
    assert_eq!(list["processes"][0]["pid"], pid);

    c.call("process/terminate", json!({"processId": "x"})).await;
    assert_eq!(c.collect("x").await.exit["signal"], "SIGTERM");
    kill_group(&pid);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_does_not_block_other_requests() {
    let mut t = ready_with(cfg()).await;
    let c = &mut t.client;
    let r = c
        .call(
            "process/start",
            json!({"processId": "slow", "argv": ["sleep", "100"]}),
        )
        .await;
    let pid = r["pid"].clone();

    let read = c
        .request(
            "process/read",
            json!({"processId": "slow", "waitMs": 30000}),
        )
        .await;

    // A control request sent after the poll is answered first.
    let info = c.request("server/info", json!({})).await;
    let m = c.response(info).await;
    assert_eq!(m["result"]["protocolVersion"], 1, "{m}");
    assert!(!answered(c, read), "the poll cannot have ended yet");

    // Another process starts, runs and exits entirely while the poll waits.
    let r = c
        .call(
            "process/start",
            json!({"processId": "other", "argv": ["echo", "x"]}),
        )
        .await;
    assert_eq!(r["processId"], "other");
    let other = c.collect("other").await;
    other.assert_seqs_contiguous();
    assert_eq!(other.stdout, b"x\n");
    assert_eq!(other.exit["exitCode"], 0);
    assert!(other.other.is_empty(), "{:?}", other.other);
    assert!(!answered(c, read), "the poll cannot have ended yet");

    // Ending the polled process ends the poll with its exit.
    let r = c
        .call("process/terminate", json!({"processId": "slow"}))
        .await;
    assert_eq!(r["running"], true);
    let m = c.response(read).await;
    let res = &m["result"];
    assert_eq!(res["exited"], true, "{m}");
    assert_eq!(res["running"], false, "{m}");
    let events = res["events"].as_array().unwrap();
    assert_eq!(events.len(), 1, "{m}");
    assert_eq!(events[0]["seq"], 1);
    assert_eq!(events[0]["type"], "exited");
    assert_eq!(events[0]["signal"], "SIGTERM");
    assert_eq!(res["nextSeq"], 2);
    assert_eq!(c.collect("slow").await.exit["seq"], 1);
    kill_group(&pid);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_are_applied_and_answered_in_request_order() {
    let mut t = ready_with(cfg()).await;
    let c = &mut t.client;
    // Everything back to back: start, 100 writes, closeStdin, without waiting for anything.
    let mut ids = vec![
        c.request(
            "process/start",
            json!({"processId": "cat", "argv": ["cat"], "pipeStdin": true}),
        )
        .await,
    ];
    let mut expected = Vec::new();
    for i in 0..100 {
        let chunk = format!("{i}\n");
        expected.extend_from_slice(chunk.as_bytes());
        ids.push(
            c.request(
                "process/write",
                json!({"processId": "cat", "chunk": b64(chunk.as_bytes())}),
            )
            .await,
        );
    }
    ids.push(
        c.request("process/closeStdin", json!({"processId": "cat"}))
            .await,
    );

    let mut order = Vec::new();
    let mut stdout = Vec::new();
    let mut exit = Value::Null;
    while exit.is_null() || order.len() < ids.len() {
        let m = c.read_message().await.expect("connection open");
        match m["method"].as_str() {
            Some("process/outputDelta") => stdout.extend(decode(&m["params"]["chunk"])),
            Some("process/exited") => exit = m["params"].clone(),
            Some(other) => panic!("unexpected {other}"),
            None => {
                let id = m["id"].as_u64().expect("an id");
                assert!(m.get("result").is_some(), "{m}");
                if id != ids[0] && id != *ids.last().unwrap() {
                    assert_eq!(m["result"]["status"], "accepted", "{m}");
                }
                order.push(id);
            }
        }
    }
    assert_eq!(
        order, ids,
        "exclusive requests of one process answer in wire order"
    );
    assert_eq!(
        String::from_utf8_lossy(&stdout),
        String::from_utf8_lossy(&expected)
    );
    assert_eq!(exit["exitCode"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_process_keeps_seq_order_on_the_wire_while_interleaving() {
    let mut t = ready_with(cfg()).await;
    let c = &mut t.client;
    let ids = ["s1", "s2", "s3", "s4"];
    let mut starts = Vec::new();
    for id in ids {
        starts.push(
            c.request(
                "process/start",
                json!({"processId": id, "argv": ["seq", "1", "20000"]}),
            )
            .await,
        );
    }
    let all = collect_all(c, &ids).await;
    for id in starts {
        assert!(c.response(id).await.get("result").is_some());
    }
    let expected: String = (1..=20000).map(|i| format!("{i}\n")).collect();
    for id in ids {
        let col = &all[id];
        col.assert_seqs_contiguous();
        assert!(col.seqs.len() >= 2, "{id}: output and exit");
        assert_eq!(col.stdout.len(), expected.len(), "{id}");
        assert!(col.stdout == expected.as_bytes(), "{id}: stdout differs");
        assert!(col.stderr.is_empty(), "{id}");
        assert_eq!(col.exit["exitCode"], 0, "{id}");
        assert_eq!(col.exit["stdoutBytes"], expected.len(), "{id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_start_result_precedes_the_process_output() {
    let mut t = ready_with(cfg()).await;
    let c = &mut t.client;
    let mut by_request = HashMap::new();
    for i in 0..10 {
        let pid = format!("e{i}");
        let id = c
            .request(
                "process/start",
                json!({"processId": pid, "argv": ["echo", "hi"]}),
            )
            .await;
        by_request.insert(id, pid);
    }
    let mut first_mention: HashMap<String, &str> = HashMap::new();
    let mut exited = 0;
    let mut stdout: HashMap<String, Vec<u8>> = HashMap::new();
    while exited < by_request.len() {
        let m = c.read_message().await.expect("connection open");
        let (pid, what) = match m["method"].as_str() {
            None => {
                let id = m["id"].as_u64().expect("id");
                assert!(m.get("result").is_some(), "{m}");
                (by_request[&id].clone(), "response")
            }
            Some(method) => {
                let pid = m["params"]["processId"].as_str().unwrap().to_string();
                if method == "process/exited" {
                    exited += 1;
                    (pid, "exited")
                } else {
                    stdout
                        .entry(pid.clone())
                        .or_default()
                        .extend(decode(&m["params"]["chunk"]));
                    (pid, "output")
                }
            }
        };
        first_mention.entry(pid).or_insert(what);
    }
    assert_eq!(first_mention.len(), by_request.len());
    for (pid, what) in &first_mention {
        assert_eq!(*what, "response", "{pid}: the start result must come first");
        assert_eq!(stdout[pid], b"hi\n", "{pid}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_does_not_overtake_an_earlier_start() {
    let mut t = ready_with(cfg()).await;
    let c = &mut t.client;
    let start = c
        .request(
            "process/start",
            json!({"processId": "p", "argv": ["echo", "hi"]}),
        )
        .await;
    let read = c
        .request("process/read", json!({"processId": "p", "waitMs": 30000}))
        .await;
    let r = c.response(read).await;
    assert!(
        r.get("result").is_some(),
        "the read ran before the start: {r}"
    );
    let events = r["result"]["events"].as_array().unwrap();
    assert!(!events.is_empty(), "{r}");
    assert_eq!(events[0]["seq"], 1);
    assert!(c.response(start).await.get("result").is_some());
    assert_eq!(c.collect("p").await.stdout, b"hi\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_requests_are_not_queued_behind_a_blocked_write() {
    let mut t = ready_with(cfg()).await;
    let c = &mut t.client;
    // The whole group ignores SIGTERM and never reads stdin, so nothing but SIGKILL from the
    // test ends the write below: the order of the answers does not depend on timing.
    let r = c
        .call(
            "process/start",
            json!({"processId": "t", "pipeStdin": true,
                   "argv": ["sh", "-c", r#"trap "" TERM; echo ready; exec sleep 100"#]}),
        )
        .await;
    let pid = r["pid"].clone();
    let mut out = Vec::new();
    while !out.ends_with(b"ready\n") {
        let n = c.next_notification().await.expect("connection open");
        assert_eq!(n["method"], "process/outputDelta", "{n}");
        out.extend(decode(&n["params"]["chunk"]));
    }

    // 4 MiB cannot fit in the pipe: this write blocks.
    let big = vec![b'w'; 4 << 20];
    let write = c
        .request(
            "process/write",
            json!({"processId": "t", "chunk": b64(&big)}),
        )
        .await;
    // A write queued behind it, for the same process.
    let write2 = c
        .request(
            "process/write",
            json!({"processId": "t", "chunk": b64(b"x")}),
        )
        .await;

    let signal = c
        .request(
            "process/signal",
            json!({"processId": "t", "signal": "SIGTERM"}),
        )
        .await;
    let m = c.response(signal).await;
    assert_eq!(m["result"], json!({}), "{m}");
    assert!(!answered(c, write), "the write cannot have ended");

    let terminate = c
        .request(
            "process/terminate",
            json!({"processId": "t", "graceMs": 60000}),
        )
        .await;
    let m = c.response(terminate).await;
    assert_eq!(m["result"], json!({"running": true}), "{m}");
    let list = c.call("process/list", json!({})).await;
    assert_eq!(list["processes"][0]["state"], "running");
    assert!(!answered(c, write), "the write cannot have ended");

    // Only now does the process die; the blocked write and the one behind it answer `exited`.
    kill_group(&pid);
    let m = c.response(write).await;
    assert_eq!(m["result"]["status"], "exited", "{m}");
    let m = c.response(write2).await;
    assert_eq!(m["result"]["status"], "exited", "{m}");
    let done = c.collect("t").await;
    assert_eq!(done.exit["signal"], "SIGKILL");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_requests_are_skipped_when_the_connection_closes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fifo = make_fifo(dir.path());
    let registry = SessionRegistry::new(Arc::new(cfg()));
    let InProcess {
        mut client, end, ..
    } = in_process_with(registry.clone(), 1 << 20, ConnectionOptions::default());
    let init = client.handshake().await;
    let sid = init["sessionId"].as_str().unwrap().to_string();
    let token = init["resumeToken"].as_str().unwrap().to_string();

    // A child that reads nothing until released: a 4 MiB write to it cannot complete, and a
    // write sent after it waits in the process's FIFO queue.
    let r = client
        .call(
            "process/start",
            json!({"processId": "p", "argv": held_cat(&fifo), "pipeStdin": true}),
        )
        .await;
    let pid = r["pid"].clone();
    let big = vec![b'a'; 4 << 20];
    let w1 = client
        .request(
            "process/write",
            json!({"processId": "p", "chunk": b64(&big)}),
        )
        .await;
    let w2 = client
        .request(
            "process/write",
            json!({"processId": "p", "chunk": b64(b"MARKER")}),
        )
        .await;
    // The reader takes requests in wire order: once this is answered both writes are queued.
    client.call("server/info", json!({})).await;
    assert!(!answered(&client, w1) && !answered(&client, w2));

    drop(client);
    let end = tokio::time::timeout(GUARD, end)
        .await
        .expect("connection ends")
        .expect("join");
    assert_eq!(end, ConnectionEnd::PeerClosed);

    // The session is detached, not closed: its process keeps running.
    let session = registry.session(&sid).expect("the session survives");
    assert!(!session.is_attached());
    let proc = session.get("p").expect("the process is still known");
    assert!(proc.is_running());
    assert!(group_alive(pid.as_i64().unwrap() as i32));

    // Let the child copy its stdin, resume, close stdin, and look at everything it got.
    release(&fifo).await;
    let mut b = in_process_with(registry.clone(), 1 << 20, ConnectionOptions::default());
    let r = b
        .client
        .call(
            "initialize",
            json!({"resume": {"sessionId": sid, "resumeToken": token}}),
        )
        .await;
    assert_eq!(r["resumed"], true);
    b.client.notify("initialized", json!({})).await;
    b.client
        .call("process/closeStdin", json!({"processId": "p"}))
        .await;
    let done = b.client.collect("p").await;
    done.assert_seqs_contiguous();
    assert_eq!(done.exit["exitCode"], 0);
    assert!(
        !done.stdout.windows(6).any(|w| w == b"MARKER"),
        "a write queued on a closed connection was applied"
    );
    assert!(done.stdout.len() <= big.len());
    assert!(done.stdout.iter().all(|b| *b == b'a'));
    kill_group(&pid);
}

// Regression guard: a long poll must not hold back a later exclusive request of the same
// process (protocol.md §4: "A long poll must never block other requests on the connection").
// With a FIFO that made the write wait for the earlier read, the interactive pattern (poll
// for output, write the input that produces it) only ended at `waitMs`, empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_does_not_hold_back_a_later_write_to_the_same_process() {
    let mut t = ready_with(cfg()).await;
    let c = &mut t.client;
    let r = c
        .call(
            "process/start",
            json!({"processId": "c", "argv": ["cat"], "pipeStdin": true}),
        )
        .await;
    let pid = r["pid"].clone();
    let read = c
        .request("process/read", json!({"processId": "c", "waitMs": 30000}))
        .await;
    let write = c
        .request(
            "process/write",
            json!({"processId": "c", "chunk": b64(b"hello\n")}),
        )
        .await;
    let m = c.response(read).await;
    let events = m["result"]["events"].as_array().expect("events").clone();
    let w = c.response(write).await;
    assert_eq!(w["result"]["status"], "accepted", "{w}");
    assert!(
        !events.is_empty(),
        "the poll timed out empty: the write waited behind it ({m})"
    );
    assert_eq!(events[0]["type"], "output", "{m}");
    assert_eq!(decode(&events[0]["chunk"]), b"hello\n");
    kill_group(&pid);
}

// Regression (fixed): a write in progress when the connection closes is cut off mid-way, and its retry with
// the same `writeId` is written again in full, so the child receives the cut-off prefix twice.
// ConnectionProcessor::spawn_request (src/connection_processor.rs) races every request against
// the connection's cancel token, so a running `process/write` is dropped inside
// `ManagedProcess::write` after part of the chunk went into the pipe, and the `writeId` is
// only remembered after a complete write. The client never got an answer, so it must retry
// (that is what `writeId` is for, protocol.md §4), and the retry duplicates bytes. Expected:
// a write that has started is finished (only *queued* requests are skipped, processes.md §6),
// or its id is remembered with the progress made, so the retry completes it exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_cut_by_a_closed_connection_is_not_duplicated_by_its_retry() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fifo = make_fifo(dir.path());
    let registry = SessionRegistry::new(Arc::new(cfg()));
    let InProcess {
        mut client, end, ..
    } = in_process_with(registry.clone(), 1 << 20, ConnectionOptions::default());
    let init = client.handshake().await;
    let sid = init["sessionId"].as_str().unwrap().to_string();
    let token = init["resumeToken"].as_str().unwrap().to_string();
    let r = client
        .call(
            "process/start",
            json!({"processId": "p", "argv": held_cat(&fifo), "pipeStdin": true}),
        )
        .await;
    let pid = r["pid"].clone();
    let big = vec![b'a'; 4 << 20];
    let write = json!({"processId": "p", "chunk": b64(&big), "writeId": "w-1"});
    client.request("process/write", write.clone()).await;
    // The write has started: part of it sits in the child's stdin pipe.
    let os_pid = pid.as_i64().unwrap() as i32;
    eventually("the write fills the stdin pipe", || {
        stdin_pipe_fill(os_pid) > 0
    })
    .await;

    drop(client);
    let end = tokio::time::timeout(GUARD, end)
        .await
        .expect("connection ends")
        .expect("join");
    assert_eq!(end, ConnectionEnd::PeerClosed);

    // The client resumes and retries the unanswered write with the same writeId.
    release(&fifo).await;
    let mut b = in_process_with(registry.clone(), 1 << 20, ConnectionOptions::default());
    b.client
        .call(
            "initialize",
            json!({"resume": {"sessionId": sid, "resumeToken": token}}),
        )
        .await;
    b.client.notify("initialized", json!({})).await;
    let r = b.client.call("process/write", write).await;
    assert_eq!(r["status"], "accepted");
    b.client
        .call("process/closeStdin", json!({"processId": "p"}))
        .await;
    let done = b.client.collect("p").await;
    kill_group(&pid);
    assert_eq!(done.exit["exitCode"], 0);
    assert_eq!(
        done.stdout.len(),
        big.len(),
        "the child must receive the 4 MiB chunk exactly once (got {} extra bytes)",
        done.stdout.len() as i64 - big.len() as i64
    );
}
