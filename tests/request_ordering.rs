//! Ordering of concurrent requests on one connection (`protocol.md` §6, `processes.md` §6):
//! exclusive requests are FIFO per process, reads share and never overtake an earlier
//! exclusive request, control requests are never queued, events of one process reach the wire
//! in seq order after the start result, and a closed connection skips what it had queued.
//!
//! Every wait is on a protocol message (or, for states outside the protocol, `eventually`);
//! deadlines are hang guards only.

mod common;
use common::fifo::{held_cat, make_fifo, release};
use common::process::stdin_pipe_fill;
use common::*;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use serde_json::{json, Value};

use execrelay::connection::ConnectionEnd;
use execrelay::session::SessionRegistry;

/// The bytes of a base64 `chunk` member.
fn decode(chunk: &Value) -> Vec<u8> {
    unb64(chunk.as_str().expect("chunk"))
}

/// Whether a response to `id` is already waiting in the backlog.
fn answered(c: &RawClient, id: u64) -> bool {
    c.backlog
        .iter()
        .any(|m| m["id"] == id && m.get("method").is_none())
}

/// A session whose process "p" reads nothing until [`Held::release_and_resume`] (then copies
/// stdin to stdout, `held_cat`): a 4 MiB write to it cannot complete meanwhile.
struct Held {
    _dir: tempfile::TempDir,
    fifo: PathBuf,
    registry: Arc<SessionRegistry>,
    sid: String,
    token: String,
    /// The process's pid (also its process group).
    pid: Value,
}

/// A [`Held`] session and its (first) connection.
async fn held_session() -> (Held, InProcess) {
    let dir = tempfile::tempdir().expect("tempdir");
    let fifo = make_fifo(dir.path());
    let registry = new_registry(cfg());
    let (mut conn, sid, token) = open_session(&registry).await;
    let r = conn
        .client
        .start(json!({"processId": "p", "argv": held_cat(&fifo), "pipeStdin": true}))
        .await;
    let held = Held {
        _dir: dir,
        fifo,
        registry,
        sid,
        token,
        pid: r["pid"].clone(),
    };
    (held, conn)
}

impl Held {
    /// Let the child go on, then resume the session on a new connection; also the
    /// `initialize` result.
    async fn release_and_resume(&self) -> (InProcess, Value) {
        release(&self.fifo).await;
        let mut b = connect_to(&self.registry);
        let r = b.client.resume(&self.sid, &self.token).await;
        (b, r)
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

    c.terminate("x", None).await;
    assert_eq!(c.collect("x").await.exit["signal"], "SIGTERM");
    kill_group(&pid);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_does_not_block_other_requests() {
    let mut t = ready_with(cfg()).await;
    let c = &mut t.client;
    let r = c
        .start(json!({"processId": "slow", "argv": ["sleep", "100"]}))
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
        .start(json!({"processId": "other", "argv": ["echo", "x"]}))
        .await;
    assert_eq!(r["processId"], "other");
    let other = c.collect("other").await;
    other.assert_seqs_contiguous();
    assert_eq!(other.stdout, b"x\n");
    assert_eq!(other.exit["exitCode"], 0);
    assert!(other.other.is_empty(), "{:?}", other.other);
    assert!(!answered(c, read), "the poll cannot have ended yet");

    // Ending the polled process ends the poll with its exit.
    assert_eq!(c.terminate("slow", None).await["running"], true);
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
        ids.push(c.request_write("cat", chunk.as_bytes()).await);
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
    let all = c.collect_all(&ids).await;
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
        .start(json!({"processId": "t", "pipeStdin": true,
                   "argv": ["sh", "-c", r#"trap "" TERM; echo ready; exec sleep 100"#]}))
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
    let write = c.request_write("t", &big).await;
    // A write queued behind it, for the same process.
    let write2 = c.request_write("t", b"x").await;

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
            json!({"processId": "t", "graceMs": 10000}),
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
    // A child that reads nothing until released: a 4 MiB write to it cannot complete, and a
    // write sent after it waits in the process's FIFO queue.
    let (h, mut conn) = held_session().await;
    let client = &mut conn.client;
    let big = vec![b'a'; 4 << 20];
    let w1 = client.request_write("p", &big).await;
    let w2 = client.request_write("p", b"MARKER").await;
    // The reader takes requests in wire order: once this is answered both writes are queued.
    client.call("server/info", json!({})).await;
    assert!(!answered(client, w1) && !answered(client, w2));

    assert_eq!(conn.hang_up().await, ConnectionEnd::PeerClosed);

    // The session is detached, not closed: its process keeps running.
    let session = h.registry.session(&h.sid).expect("the session survives");
    assert!(!session.is_attached());
    let proc = session.get("p").expect("the process is still known");
    assert!(proc.is_running());
    assert!(group_alive(h.pid.as_i64().unwrap() as i32));

    // Let the child copy its stdin, resume, close stdin, and look at everything it got.
    let (mut b, r) = h.release_and_resume().await;
    assert_eq!(r["resumed"], true);
    b.client.close_stdin("p").await;
    let done = b.client.collect("p").await;
    done.assert_seqs_contiguous();
    assert_eq!(done.exit["exitCode"], 0);
    assert!(
        !done.stdout.windows(6).any(|w| w == b"MARKER"),
        "a write queued on a closed connection was applied"
    );
    assert!(done.stdout.len() <= big.len());
    assert!(done.stdout.iter().all(|b| *b == b'a'));
    kill_group(&h.pid);
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
        .start(json!({"processId": "c", "argv": ["cat"], "pipeStdin": true}))
        .await;
    let pid = r["pid"].clone();
    let read = c
        .request("process/read", json!({"processId": "c", "waitMs": 30000}))
        .await;
    let write = c.request_write("c", b"hello\n").await;
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
// ConnectionProcessor::spawn_request (src/connection/processor/mod.rs) races every request against
// the connection's cancel token, so a running `process/write` is dropped inside
// `ManagedProcess::write` after part of the chunk went into the pipe, and the `writeId` is
// only remembered after a complete write. The client never got an answer, so it must retry
// (that is what `writeId` is for, protocol.md §4), and the retry duplicates bytes. Expected:
// a write that has started is finished (only *queued* requests are skipped, processes.md §6),
// or its id is remembered with the progress made, so the retry completes it exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_cut_by_a_closed_connection_is_not_duplicated_by_its_retry() {
    let (h, mut conn) = held_session().await;
    let big = vec![b'a'; 4 << 20];
    let write = json!({"processId": "p", "chunk": b64(&big), "writeId": "w-1"});
    conn.client.request("process/write", write.clone()).await;
    // The write has started: part of it sits in the child's stdin pipe.
    let os_pid = h.pid.as_i64().unwrap() as i32;
    eventually("the write fills the stdin pipe", || {
        stdin_pipe_fill(os_pid).is_some_and(|(queued, _)| queued > 0)
    })
    .await;

    assert_eq!(conn.hang_up().await, ConnectionEnd::PeerClosed);

    // The client resumes and retries the unanswered write with the same writeId.
    let (mut b, _) = h.release_and_resume().await;
    let r = b.client.call("process/write", write).await;
    assert_eq!(r["status"], "accepted");
    b.client.close_stdin("p").await;
    let done = b.client.collect("p").await;
    kill_group(&h.pid);
    assert_eq!(done.exit["exitCode"], 0);
    assert_eq!(
        done.stdout.len(),
        big.len(),
        "the child must receive the 4 MiB chunk exactly once (got {} extra bytes)",
        done.stdout.len() as i64 - big.len() as i64
    );
}
