//! Limits at their edges (`protocol.md` §1–§4, `processes.md` §6): the message size limit
//! (exactly the limit is accepted, one byte more is a framing error that closes the
//! connection), the length of a process id, `maxProcesses`, `maxPendingRequests`,
//! `maxSessions`, the exact range reported for output released from retention, and `afterSeq`
//! at its largest, over the real `ConnectionProcessor`. (The other error codes of the table
//! are in `protocol_errors.rs`.)

mod common;
use common::*;

use serde_json::{json, Value};
use tokio::task::JoinHandle;

use execrelay::config::ServerConfig;
use execrelay::connection::ConnectionEnd;

/// A request of exactly `total` bytes (without the line terminator): `method` with params
/// `{"pad": "aaaa…"}`.
fn padded_request(id: u64, method: &str, total: usize) -> Vec<u8> {
    let head = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{{"pad":""#);
    let tail = r#""}}"#;
    let pad = total - head.len() - tail.len();
    let mut v = head.into_bytes();
    v.resize(v.len() + pad, b'a');
    v.extend_from_slice(tail.as_bytes());
    assert_eq!(v.len(), total);
    v
}

/// `max_message_bytes` of 128 KiB: small, but valid (`validate()` wants one base64 chunk).
fn small_limit_cfg() -> ServerConfig {
    let c = ServerConfig {
        max_message_bytes: 128 * 1024,
        ..cfg()
    };
    c.validate().expect("a realistic configuration");
    c
}

/// The framing error (null id, -32600) is the last message: the connection closes and ends
/// with `FramingError`.
async fn expect_framing_close(client: &mut RawClient, end: JoinHandle<ConnectionEnd>) {
    let m = client.read_message().await.expect("the framing error");
    assert_eq!(m["id"], Value::Null, "{m}");
    assert_eq!(error_of(&m)["code"], -32600, "{m}");
    assert!(
        client.read_message().await.is_none(),
        "connection must close"
    );
    let end = connection_end(end).await;
    assert!(matches!(end, ConnectionEnd::FramingError(_)), "{end:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_over_the_limit_is_a_framing_error_that_closes_the_connection() {
    let InProcess {
        mut client, end, ..
    } = in_process_lenient(small_limit_cfg());
    client.handshake().await;
    let line = padded_request(1, "server/info", 200 * 1024);
    client.send_raw(&line).await;
    expect_framing_close(&mut client, end).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_of_exactly_the_limit_is_accepted() {
    let max = small_limit_cfg().max_message_bytes;
    let mut t = ready_with(small_limit_cfg()).await;
    let c = &mut t.client;

    c.send_raw(&padded_request(1, "server/info", max)).await;
    let m = c.read_message().await.expect("a response");
    assert_eq!(m["id"], 1);
    assert_eq!(m["result"]["protocolVersion"], 1, "{m}");

    c.send_raw(&padded_request(2, "no/such", max)).await;
    let m = c.read_message().await.expect("a response");
    assert_eq!(m["id"], 2);
    assert_eq!(error_of(&m)["code"], -32601, "{m}");

    // A trailing `\r` is framing, not message: max bytes + "\r\n" is still exactly the limit.
    let mut crlf = padded_request(3, "server/info", max);
    crlf.push(b'\r');
    c.send_raw(&crlf).await;
    let m = c.read_message().await.expect("a response");
    assert_eq!(m["id"], 3);
    assert_eq!(m["result"]["protocolVersion"], 1, "{m}");
    assert!(!t.end.is_finished());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_of_the_limit_plus_one_is_rejected() {
    let max = small_limit_cfg().max_message_bytes;
    let InProcess {
        mut client, end, ..
    } = in_process_lenient(small_limit_cfg());
    client.handshake().await;
    client
        .send_raw(&padded_request(1, "server/info", max + 1))
        .await;
    expect_framing_close(&mut client, end).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_id_length_is_checked_at_both_edges() {
    let mut t = ready_with(cfg()).await;
    let c = &mut t.client;
    for bad in [String::new(), "x".repeat(257)] {
        let e = c
            .call_err("process/start", json!({"processId": bad, "argv": ["true"]}))
            .await;
        assert_eq!(e["code"], -32602, "{e}");
    }
    // 256 bytes is allowed (and counted in bytes: 128 two-byte characters).
    for good in ["y".repeat(256), "é".repeat(128)] {
        let r = c.start(json!({"processId": good, "argv": ["true"]})).await;
        assert_eq!(r["processId"], good.as_str());
        let done = c.collect(&good).await;
        assert_eq!(done.exit["exitCode"], 0);
    }
    let e = c
        .call_err(
            "process/start",
            json!({"processId": "é".repeat(129), "argv": ["true"]}),
        )
        .await;
    assert_eq!(e["code"], -32602, "258 bytes: {e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_processes_at_its_edge() {
    let mut t = ready_with(ServerConfig {
        max_processes: 2,
        ..cfg()
    })
    .await;
    let c = &mut t.client;
    let mut pids = Vec::new();
    for id in ["a", "b"] {
        let r = c
            .start(json!({"processId": id, "argv": ["sleep", "100"]}))
            .await;
        pids.push(r["pid"].clone());
    }
    let e = c
        .call_err(
            "process/start",
            json!({"processId": "c", "argv": ["sleep", "100"]}),
        )
        .await;
    assert_eq!(e["code"], -32004, "{e}");
    assert_eq!(e["data"]["limit"], "maxProcesses", "{e}");
    assert_eq!(e["data"]["value"], 2, "{e}");

    for id in ["a", "b"] {
        assert_eq!(c.terminate(id, None).await["running"], true);
    }
    for (id, done) in c.collect_all(&["a", "b"]).await {
        assert_eq!(done.exit["signal"], "SIGTERM", "{id}");
    }
    for pid in &pids {
        kill_group(pid);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_pending_requests_at_its_edge() {
    let mut t = ready_with(ServerConfig {
        max_pending_requests: 2,
        ..cfg()
    })
    .await;
    let c = &mut t.client;
    let r = c
        .start(json!({"processId": "p", "argv": ["sleep", "100"]}))
        .await;
    let pid = r["pid"].clone();

    let poll = json!({"processId": "p", "waitMs": 30000});
    let r1 = c.request("process/read", poll.clone()).await;
    let r2 = c.request("process/read", poll.clone()).await;
    let r3 = c.request("process/read", poll.clone()).await;
    // The two polls are pending, so the very next message is the third one's refusal.
    let m = c.read_message().await.expect("the limit error");
    assert_eq!(m["id"], r3, "{m}");
    let e = error_of(&m);
    assert_eq!(e["code"], -32004, "{m}");
    assert_eq!(e["data"]["limit"], "maxPendingRequests", "{m}");
    assert_eq!(e["data"]["value"], 2, "{m}");

    // End the polls from outside the protocol (every slot is taken, including a
    // terminate's), then check both return the exit and the slots come back.
    kill_group(&pid);
    for id in [r1, r2] {
        let m = c.response(id).await;
        let res = &m["result"];
        assert_eq!(res["exited"], true, "{m}");
        let events = res["events"].as_array().unwrap();
        assert_eq!(events.last().unwrap()["type"], "exited", "{m}");
        assert_eq!(events.last().unwrap()["signal"], "SIGKILL", "{m}");
    }
    let done = c.collect("p").await;
    assert_eq!(done.exit["signal"], "SIGKILL");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_sessions_at_its_edge() {
    let registry = new_registry(ServerConfig {
        max_sessions: 1,
        ..cfg()
    });
    let mut a = connect_to(&registry);
    a.client.handshake().await;
    let mut b = connect_to(&registry);
    let e = b
        .client
        .call_err("initialize", json!({"clientName": "b"}))
        .await;
    assert_eq!(e["code"], -32004, "{e}");
    assert_eq!(e["data"]["limit"], "maxSessions", "{e}");
    assert_eq!(e["data"]["value"], 1, "{e}");
    assert_eq!(registry.session_count(), 1);
    // B stays open and may retry; A is untouched.
    let e = b.client.call_err("server/info", json!({})).await;
    assert_eq!(e["code"], -32600, "{e}");
    assert_eq!(a.client.call("server/info", json!({})).await["sessions"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reading_released_output_reports_the_exact_missing_range() {
    let mut t = ready_with(ServerConfig {
        retained_output_bytes: 4096,
        delivery_queue_bytes: 4096,
        ..cfg()
    })
    .await;
    let c = &mut t.client;
    let done = c
        .run(json!({"processId": "z", "argv": ["head", "-c", "1000000", "/dev/zero"]}))
        .await;
    done.assert_seqs_contiguous();
    assert_eq!(done.stdout.len(), 1_000_000);
    assert!(done.stdout.iter().all(|b| *b == 0));
    assert_eq!(done.exit["exitCode"], 0);
    let exit_seq = done.exit["seq"].as_u64().unwrap();

    let first = c
        .call_err("process/read", json!({"processId": "z", "afterSeq": 0}))
        .await;
    assert_eq!(first["code"], -32005, "{first}");
    assert_eq!(first["data"]["fromSeq"], 1, "{first}");
    let to = first["data"]["toSeq"].as_u64().expect("toSeq");
    assert!(
        (1..exit_seq).contains(&to),
        "toSeq {to} must name released output below the exit notice {exit_seq}"
    );

    // Exact: `to` is gone, `to + 1` is the first retained event.
    let r = c
        .call(
            "process/read",
            json!({"processId": "z", "afterSeq": to, "maxBytes": 16 << 20}),
        )
        .await;
    let events = r["events"].as_array().unwrap();
    let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    let expected: Vec<u64> = (to + 1..=exit_seq).collect();
    assert_eq!(seqs, expected);
    assert_eq!(events.last().unwrap()["type"], "exited");
    assert_eq!(r["nextSeq"], exit_seq + 1);
    assert_eq!(r["exited"], true);
    if to >= 2 {
        let e = c
            .call_err(
                "process/read",
                json!({"processId": "z", "afterSeq": to - 1}),
            )
            .await;
        assert_eq!(e["code"], -32005, "{e}");
        assert_eq!(e["data"], json!({"fromSeq": to, "toSeq": to}), "{e}");
    }
    // The error did not change anything: the same read answers the same range again.
    let again = c
        .call_err("process/read", json!({"processId": "z", "afterSeq": 0}))
        .await;
    assert_eq!(again, first);
}

/// `afterSeq` is the client's number: at its largest (2^64−1, which no event can follow) a
/// read answers no events and `nextSeq` 2^64−1 (saturated), for a running process (a long
/// poll that times out) and an exited one, without or with acks. It used to add one
/// unchecked: `nextSeq` 0 in a release build, a panic holding the process lock in a debug one
/// (no answer at all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_after_the_largest_seq_answers_without_overflow() {
    for acks in [false, true] {
        let mut t = in_process(cfg(), 1 << 20);
        let c = &mut t.client;
        c.call(
            "initialize",
            json!({"clientName": "t", "capabilities": {"acks": acks}}),
        )
        .await;
        c.notify("initialized", json!({})).await;
        c.start(json!({"processId": "s", "argv": ["sleep", "30"]}))
            .await;
        let r = c
            .call(
                "process/read",
                json!({"processId": "s", "afterSeq": u64::MAX, "waitMs": 20}),
            )
            .await;
        assert_eq!(r["events"], json!([]), "{r}");
        assert_eq!(r["nextSeq"], u64::MAX, "{r}");
        assert_eq!(r["running"], true, "{r}");
        c.terminate("s", Some(0)).await;

        let done = c
            .run(json!({"processId": "e", "argv": ["echo", "hi"]}))
            .await;
        assert_eq!(done.exit["exitCode"], 0);
        let next = done.exit["seq"].as_u64().unwrap() + 1;
        let r = c
            .call(
                "process/read",
                json!({"processId": "e", "afterSeq": u64::MAX}),
            )
            .await;
        assert_eq!(r["events"], json!([]), "{r}");
        assert_eq!(r["nextSeq"], u64::MAX, "{r}");
        assert_eq!(r["exited"], true, "{r}");
        // The connection is still served and (without acks, where the read released
        // nothing) the process's log is undisturbed. With acks the read acknowledged the
        // exit notice, so the process may already be gone.
        c.call("server/info", json!({})).await;
        if acks {
            continue;
        }
        let list = c.call("process/list", json!({})).await;
        let e = list["processes"]
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["processId"] == "e"))
            .cloned();
        assert_eq!(e.map(|e| e["nextSeq"].clone()), Some(json!(next)), "{list}");
    }
}
