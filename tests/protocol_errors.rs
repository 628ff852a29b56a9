//! Protocol errors (`protocol.md` §1–§3): every error code of the table, the exact id it is
//! answered to, and whether the connection survives it, over the real `ConnectionProcessor`
//! and over the built binary (stdio and WebSocket).

mod common;
use common::*;

use std::collections::HashMap;
use std::pin::Pin;
use std::process::Stdio;
use std::sync::Arc;
use std::task::{Context, Poll};

use base64::Engine;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio_util::sync::CancellationToken;

use execrelay::config::ServerConfig;
use execrelay::connection_processor::{ConnectionEnd, ConnectionOptions, ConnectionProcessor};
use execrelay::session_registry::SessionRegistry;
use execrelay::transport::stdio::line_transport;
use execrelay::transport::Transport;

/// A connection that completed `initialize` + `initialized`.
async fn ready_with(cfg: ServerConfig) -> InProcess {
    let mut t = in_process(cfg, 1 << 20);
    t.client.handshake().await;
    t
}

/// Like `in_process`, but the client ignores write errors: when the server closes the
/// connection on a framing error it may do so while the client is still writing the line.
fn in_process_lenient(cfg: ServerConfig) -> InProcess {
    let registry = SessionRegistry::new(Arc::new(cfg));
    let (client_end, server_end) = tokio::io::duplex(1 << 20);
    let (sr, sw) = tokio::io::split(server_end);
    let (cr, cw) = tokio::io::split(client_end);
    let max = registry.config().max_message_bytes;
    let transport = line_transport(sr, sw, max, "test");
    let shutdown = CancellationToken::new();
    let end = tokio::spawn(ConnectionProcessor::run(
        transport,
        registry.clone(),
        ConnectionOptions::default(),
        shutdown.clone(),
    ));
    InProcess {
        client: RawClient::new(cr, Lenient(cw)),
        registry,
        end,
        shutdown,
    }
}

/// A writer that reports success after its peer went away.
struct Lenient<W>(W);

impl<W: AsyncWrite + Unpin> AsyncWrite for Lenient<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match Pin::new(&mut self.0).poll_write(cx, buf) {
            Poll::Ready(Err(_)) => Poll::Ready(Ok(buf.len())),
            other => other,
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match Pin::new(&mut self.0).poll_flush(cx) {
            Poll::Ready(Err(_)) => Poll::Ready(Ok(())),
            other => other,
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match Pin::new(&mut self.0).poll_shutdown(cx) {
            Poll::Ready(Err(_)) => Poll::Ready(Ok(())),
            other => other,
        }
    }
}

/// The `error` member of a response (panics on a success).
fn error_of(r: &Value) -> &Value {
    r.get("error")
        .unwrap_or_else(|| panic!("expected an error response, got {r}"))
}

/// SIGKILL to a process group we started (hygiene: never leave children behind).
fn kill_group(pid: &Value) {
    let pid = pid.as_i64().expect("pid") as i32;
    assert!(pid > 1);
    unsafe { libc::kill(-pid, libc::SIGKILL) };
}

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

/// Collect the notifications of several processes until each has exited (`RawClient::collect`
/// handles one process and keeps the others' notifications to itself).
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
                let data = base64::engine::general_purpose::STANDARD
                    .decode(p["chunk"].as_str().expect("chunk"))
                    .expect("base64");
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

/// `max_message_bytes` of 128 KiB: small, but valid (`validate()` wants one base64 chunk).
fn small_limit_cfg() -> ServerConfig {
    let c = ServerConfig {
        max_message_bytes: 128 * 1024,
        ..cfg()
    };
    c.validate().expect("a realistic configuration");
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_json_is_a_parse_error_with_null_id_and_the_connection_stays_open() {
    let mut t = in_process(cfg(), 1 << 20);
    let c = &mut t.client;

    // Before the handshake too: a parse error does not close anything.
    c.send_raw(b"{nope").await;
    let m = c.read_message().await.expect("an error");
    assert_eq!(m["jsonrpc"], "2.0");
    assert_eq!(m["id"], Value::Null);
    assert_eq!(error_of(&m)["code"], -32700);

    c.handshake().await;
    for garbage in [&b"{nope"[..], b"\xff\xfe\x00", b"{\"id\":1,", b"nul"] {
        c.send_raw(garbage).await;
        let m = c.read_message().await.expect("an error");
        assert_eq!(m["id"], Value::Null, "{m}");
        assert_eq!(error_of(&m)["code"], -32700, "{m}");
    }
    // Nesting deeper than the parser allows is refused as a parse error, not a crash.
    c.send_raw("[".repeat(100_000).as_bytes()).await;
    let m = c.read_message().await.expect("an error");
    assert_eq!(m["id"], Value::Null, "{m}");
    assert_eq!(error_of(&m)["code"], -32700, "{m}");

    let info = c.call("server/info", json!({})).await;
    assert_eq!(info["protocolVersion"], 1);
    assert!(!t.end.is_finished());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_and_scalars_are_invalid_requests_with_null_id() {
    let mut t = ready_with(cfg()).await;
    let c = &mut t.client;
    for msg in [
        r#"[{"jsonrpc":"2.0","id":1,"method":"server/info"}]"#,
        "[]",
        "42",
        r#""server/info""#,
        "null",
        "true",
    ] {
        c.send_raw(msg.as_bytes()).await;
        // The very next message is the error: the request inside the batch is not run.
        let m = c.read_message().await.expect("an error");
        assert_eq!(m["id"], Value::Null, "{msg}: {m}");
        assert_eq!(error_of(&m)["code"], -32600, "{msg}: {m}");
    }
    assert_eq!(c.call("server/info", json!({})).await["protocolVersion"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_method_is_answered_to_the_request_id_unchanged() {
    let mut t = ready_with(cfg()).await;
    let c = &mut t.client;
    let ids: Vec<Value> = vec![
        json!("abc"),
        json!(7),
        json!(0),
        json!(-5),
        json!(""),
        json!(u64::MAX),
        json!("with \"quotes\" and ünïcode"),
    ];
    for id in &ids {
        c.send(&json!({"jsonrpc": "2.0", "id": id, "method": "no/such", "params": {}}))
            .await;
        let m = c.read_message().await.expect("a response");
        assert_eq!(&m["id"], id, "{m}");
        let e = error_of(&m);
        assert_eq!(e["code"], -32601, "{m}");
        assert!(e["message"].as_str().unwrap().contains("no/such"), "{m}");
    }
    // Without the `jsonrpc` member and without params.
    c.send(&json!({"id": "bare", "method": "no/such"})).await;
    let m = c.read_message().await.expect("a response");
    assert_eq!(m["id"], "bare");
    assert_eq!(error_of(&m)["code"], -32601);

    // An unknown notification gets no answer: the next message answers the next request.
    c.notify("no/such", json!({})).await;
    c.send(&json!({"jsonrpc": "2.0", "id": "after", "method": "server/info"}))
        .await;
    let m = c.read_message().await.expect("a response");
    assert_eq!(m["id"], "after");
    assert!(m.get("result").is_some(), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_envelopes_are_answered_without_closing() {
    let mut t = ready_with(cfg()).await;
    let c = &mut t.client;
    // (message, expected id, expected code)
    let cases = [
        (
            r#"{"jsonrpc":"2.0","id":1.5,"method":"server/info"}"#,
            Value::Null,
            -32600,
        ),
        (
            r#"{"jsonrpc":"2.0","id":null,"method":"server/info"}"#,
            Value::Null,
            -32600,
        ),
        (
            r#"{"jsonrpc":"2.0","id":{"a":1},"method":"server/info"}"#,
            Value::Null,
            -32600,
        ),
        (
            r#"{"jsonrpc":"1.0","id":"v","method":"server/info"}"#,
            json!("v"),
            -32600,
        ),
        (
            r#"{"jsonrpc":"2.0","id":"m","method":7}"#,
            json!("m"),
            -32600,
        ),
        (r#"{"jsonrpc":"2.0","id":"n"}"#, json!("n"), -32600),
        (
            r#"{"jsonrpc":"2.0","id":"p","method":"server/info","params":[1]}"#,
            json!("p"),
            -32602,
        ),
        (
            r#"{"jsonrpc":"2.0","id":"q","method":"server/info","params":5}"#,
            json!("q"),
            -32602,
        ),
    ];
    for (msg, id, code) in cases {
        c.send_raw(msg.as_bytes()).await;
        let m = c.read_message().await.expect("an error");
        assert_eq!(m["id"], id, "{msg}: {m}");
        assert_eq!(error_of(&m)["code"], code, "{msg}: {m}");
    }
    assert_eq!(c.call("server/info", json!({})).await["protocolVersion"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_and_mistyped_params_are_invalid_params_naming_the_member() {
    let mut t = ready_with(cfg()).await;
    let c = &mut t.client;

    let e = c.call_err("process/start", json!({})).await;
    assert_eq!(e["code"], -32602, "{e}");
    let msg = e["message"].as_str().unwrap();
    assert!(msg.contains("missing field"), "{msg}");
    assert!(msg.contains("processId"), "{msg}");

    let e = c.call_err("process/start", json!({"processId": "p"})).await;
    assert_eq!(e["code"], -32602, "{e}");
    let msg = e["message"].as_str().unwrap();
    assert!(msg.contains("missing field argv"), "{msg}");

    let e = c.call_err("process/read", json!({})).await;
    assert_eq!(e["code"], -32602, "{e}");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("missing field processId"),
        "{e}"
    );
    // Absent params decode as `{}`.
    let id = c.request("process/read", Value::Null).await;
    let e = error_of(&c.response(id).await).clone();
    assert_eq!(e["code"], -32602, "{e}");
    assert!(e["message"].as_str().unwrap().contains("processId"), "{e}");

    let e = c
        .call_err("process/start", json!({"processId": "p", "argv": "ls"}))
        .await;
    assert_eq!(e["code"], -32602, "{e}");
    let e = c
        .call_err("process/start", json!({"processId": 5, "argv": ["true"]}))
        .await;
    assert_eq!(e["code"], -32602, "{e}");
    let e = c
        .call_err("process/start", json!({"processId": "p", "argv": []}))
        .await;
    assert_eq!(e["code"], -32602, "{e}");
    let e = c
        .call_err(
            "process/start",
            json!({"processId": "p", "argv": ["true"], "cwd": "relative"}),
        )
        .await;
    assert_eq!(e["code"], -32602, "{e}");
    let e = c
        .call_err("process/read", json!({"processId": "p", "afterSeq": "x"}))
        .await;
    assert_eq!(e["code"], -32602, "{e}");
    let e = c
        .call_err("process/signal", json!({"processId": "p"}))
        .await;
    assert_eq!(e["code"], -32602, "{e}");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("missing field signal"),
        "{e}"
    );

    // Nothing was started by any of these, and the connection still works.
    let list = c.call("process/list", json!({})).await;
    assert_eq!(list["processes"], json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_over_the_limit_is_a_framing_error_that_closes_the_connection() {
    let InProcess {
        mut client, end, ..
    } = in_process_lenient(small_limit_cfg());
    client.handshake().await;
    let line = padded_request(1, "server/info", 200 * 1024);
    client.send_raw(&line).await;
    let m = client.read_message().await.expect("the framing error");
    assert_eq!(m["id"], Value::Null, "{m}");
    assert_eq!(error_of(&m)["code"], -32600, "{m}");
    assert!(
        client.read_message().await.is_none(),
        "connection must close"
    );
    let end = tokio::time::timeout(GUARD, end)
        .await
        .expect("connection ends")
        .expect("join");
    assert!(matches!(end, ConnectionEnd::FramingError(_)), "{end:?}");
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
    let m = client.read_message().await.expect("the framing error");
    assert_eq!(m["id"], Value::Null, "{m}");
    assert_eq!(error_of(&m)["code"], -32600, "{m}");
    assert!(
        client.read_message().await.is_none(),
        "connection must close"
    );
    let end = tokio::time::timeout(GUARD, end)
        .await
        .expect("connection ends")
        .expect("join");
    assert!(matches!(end, ConnectionEnd::FramingError(_)), "{end:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_before_the_handshake_are_rejected_in_wire_order() {
    let mut t = in_process(cfg(), 1 << 20);
    let c = &mut t.client;

    // Before `initialize`: three requests back to back, answered in order.
    let before = ["b1", "b2", "b3"];
    for (id, method) in before
        .iter()
        .zip(["server/info", "process/list", "no/such"])
    {
        c.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": {}}))
            .await;
    }
    for id in before {
        let m = c.read_message().await.expect("an error");
        assert_eq!(m["id"], id, "wire order: {m}");
        let e = error_of(&m);
        assert_eq!(e["code"], -32600, "{m}");
        assert!(e["message"].as_str().unwrap().contains("initialize"), "{m}");
    }

    // `initialize` and three requests back to back, before `initialized`.
    c.send(
        &json!({"jsonrpc": "2.0", "id": "init", "method": "initialize",
        "params": {"clientName": "t"}}),
    )
    .await;
    let after = ["a1", "a2", "a3"];
    for (id, method) in after
        .iter()
        .zip(["server/info", "process/start", "process/read"])
    {
        c.send(&json!({"jsonrpc": "2.0", "id": id, "method": method,
            "params": {"processId": "p", "argv": ["true"]}}))
            .await;
    }
    let m = c.read_message().await.expect("initialize result");
    assert_eq!(m["id"], "init");
    assert!(m["result"]["sessionId"].is_string(), "{m}");
    for id in after {
        let m = c.read_message().await.expect("an error");
        assert_eq!(m["id"], id, "wire order: {m}");
        let e = error_of(&m);
        assert_eq!(e["code"], -32600, "{m}");
        assert_eq!(e["message"], "client must send initialized first", "{m}");
    }

    c.notify("initialized", json!({})).await;
    assert_eq!(c.call("server/info", json!({})).await["protocolVersion"], 1);
    // Nothing was started before `initialized`.
    assert_eq!(
        c.call("process/list", json!({})).await["processes"],
        json!([])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initialize_succeeds_once_and_a_failed_one_may_be_retried() {
    let mut t = in_process(cfg(), 1 << 20);
    let c = &mut t.client;

    let e = c.call_err("initialize", json!({"resume": 5})).await;
    assert_eq!(e["code"], -32602, "{e}");
    let e = c
        .call_err("initialize", json!({"resume": {"sessionId": "s"}}))
        .await;
    assert_eq!(e["code"], -32602, "{e}");
    assert!(
        e["message"].as_str().unwrap().contains("resumeToken"),
        "{e}"
    );
    assert_eq!(
        t.registry.session_count(),
        0,
        "failed initializes create nothing"
    );

    let r = c.call("initialize", json!({"clientName": "t"})).await;
    assert_eq!(r["protocolVersion"], 1);
    assert_eq!(r["resumed"], false);
    assert!(
        r["resumeToken"].as_str().unwrap().len() >= 22,
        "at least 128 bits"
    );

    // A second one, before and after `initialized`.
    let e = c.call_err("initialize", json!({"clientName": "t"})).await;
    assert_eq!(e["code"], -32600, "{e}");
    c.notify("initialized", json!({})).await;
    let e = c.call_err("initialize", json!({"clientName": "t"})).await;
    assert_eq!(e["code"], -32600, "{e}");
    assert_eq!(t.registry.session_count(), 1);
    assert_eq!(c.call("server/info", json!({})).await["sessions"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_failures_are_indistinguishable() {
    let registry = SessionRegistry::new(Arc::new(cfg()));
    let mut a = in_process_with(registry.clone(), 1 << 20, ConnectionOptions::default());
    let init = a.client.handshake().await;
    let sid = init["sessionId"].as_str().unwrap().to_string();
    let token = init["resumeToken"].as_str().unwrap().to_string();

    // The same token with one character changed: still valid base64 of the same length.
    let mut wrong = token.clone().into_bytes();
    wrong[0] = if wrong[0] == b'A' { b'B' } else { b'A' };
    let wrong = String::from_utf8(wrong).unwrap();

    let mut b = in_process_with(registry.clone(), 1 << 20, ConnectionOptions::default());
    let mut errors = Vec::new();
    for (session_id, resume_token) in [
        (sid.as_str(), wrong.as_str()),
        (sid.as_str(), "not base64 at all!"),
        (sid.as_str(), ""),
        ("s-00000000000000000000000000000000", token.as_str()),
        ("", token.as_str()),
    ] {
        let e = b
            .client
            .call_err(
                "initialize",
                json!({"resume": {"sessionId": session_id, "resumeToken": resume_token}}),
            )
            .await;
        assert_eq!(e["code"], -32003, "{e}");
        errors.push(e);
    }
    for e in &errors {
        assert_eq!(e, &errors[0], "a probe must learn nothing");
    }

    // The failed attempts did not disturb the owner, and B may still initialize afresh.
    assert!(registry.session(&sid).expect("session").is_attached());
    assert_eq!(a.client.call("server/info", json!({})).await["sessions"], 1);
    let r = b.client.handshake().await;
    assert_ne!(r["sessionId"], sid.as_str());
    assert_eq!(registry.session_count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_process_ids_are_reported_as_such() {
    let mut t = ready_with(cfg()).await;
    let c = &mut t.client;
    let cases = [
        ("process/read", json!({"processId": "x"})),
        ("process/read", json!({"processId": "x", "waitMs": 10000})),
        (
            "process/write",
            json!({"processId": "x", "chunk": b64(b"hi")}),
        ),
        ("process/closeStdin", json!({"processId": "x"})),
        (
            "process/resize",
            json!({"processId": "x", "rows": 10, "cols": 10}),
        ),
        (
            "process/signal",
            json!({"processId": "x", "signal": "SIGTERM"}),
        ),
    ];
    for (method, params) in cases {
        let e = c.call_err(method, params).await;
        assert_eq!(e["code"], -32001, "{method}: {e}");
        assert_eq!(e["message"], r#"unknown process id "x""#, "{method}: {e}");
    }
    // The id is quoted as JSON.
    let e = c
        .call_err("process/closeStdin", json!({"processId": "a\"b"}))
        .await;
    assert_eq!(e["message"], r#"unknown process id "a\"b""#, "{e}");

    let r = c.call("process/terminate", json!({"processId": "x"})).await;
    assert_eq!(r, json!({"running": false}));
    let r = c
        .call("process/terminate", json!({"processId": "x", "graceMs": 0}))
        .await;
    assert_eq!(r, json!({"running": false}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_from_the_client_closes_the_connection() {
    for msg in [
        json!({"jsonrpc": "2.0", "id": 1, "result": {}}),
        json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32000, "message": "x"}}),
    ] {
        let InProcess {
            mut client, end, ..
        } = ready_with(cfg()).await;
        client.send(&msg).await;
        assert!(
            client.read_message().await.is_none(),
            "connection must close"
        );
        let end = tokio::time::timeout(GUARD, end)
            .await
            .expect("connection ends")
            .expect("join");
        assert_eq!(end, ConnectionEnd::UnexpectedResponse, "{msg}");
    }
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
        let r = c
            .call(
                "process/start",
                json!({"processId": good, "argv": ["true"]}),
            )
            .await;
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
            .call(
                "process/start",
                json!({"processId": id, "argv": ["sleep", "100"]}),
            )
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
        let r = c.call("process/terminate", json!({"processId": id})).await;
        assert_eq!(r["running"], true);
    }
    for (id, done) in collect_all(c, &["a", "b"]).await {
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
        .call(
            "process/start",
            json!({"processId": "p", "argv": ["sleep", "100"]}),
        )
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
    let registry = SessionRegistry::new(Arc::new(ServerConfig {
        max_sessions: 1,
        ..cfg()
    }));
    let mut a = in_process_with(registry.clone(), 1 << 20, ConnectionOptions::default());
    a.client.handshake().await;
    let mut b = in_process_with(registry.clone(), 1 << 20, ConnectionOptions::default());
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
    c.call(
        "process/start",
        json!({"processId": "z", "argv": ["head", "-c", "1000000", "/dev/zero"]}),
    )
    .await;
    let done = c.collect("z").await;
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

// --- The built binary -----------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_over_stdio_serves_one_connection_and_exits_cleanly() {
    let mut child = tokio::process::Command::new(bin())
        .args(["serve", "--listen", "stdio"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn execrelay serve");
    let stdout = child.stdout.take().unwrap();
    let stdin = child.stdin.take().unwrap();
    let mut c = RawClient::new(stdout, stdin);

    c.handshake().await;
    c.call(
        "process/start",
        json!({"processId": "e", "argv": ["echo", "hi"]}),
    )
    .await;
    let done = c.collect("e").await;
    done.assert_seqs_contiguous();
    assert_eq!(done.stdout, b"hi\n");
    assert_eq!(done.exit["exitCode"], 0);
    assert_eq!(done.exit["signal"], Value::Null);

    c.send_raw(b"this is not json").await;
    let m = c.read_message().await.expect("a parse error");
    assert_eq!(m["id"], Value::Null);
    assert_eq!(error_of(&m)["code"], -32700);

    // A process still running when stdin closes is terminated with the server.
    let r = c
        .call(
            "process/start",
            json!({"processId": "s", "argv": ["sleep", "100"]}),
        )
        .await;
    let sleeper = r["pid"].as_i64().unwrap() as i32;

    drop(c); // closes the server's stdin
    let status = tokio::time::timeout(GUARD, child.wait())
        .await
        .expect("server exits when stdin closes")
        .expect("wait");
    assert_eq!(status.code(), Some(0), "{status:?}");
    eventually("the stdio session's process is gone", || {
        !process_running(sleeper)
    })
    .await;
    unsafe { libc::kill(-sleeper, libc::SIGKILL) };
}

/// Whether `pid` exists and is not a zombie (a dead child whose parent is gone may stay a
/// zombie for a while if init is slow to reap it).
fn process_running(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        Ok(stat) => {
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next());
            !matches!(state, Some('Z') | Some('X'))
        }
    }
}

#[test]
fn binary_refuses_plaintext_off_loopback_without_the_danger_flag() {
    let out = std::process::Command::new(bin())
        .args(["serve", "--listen", "ws://0.0.0.0:0"])
        .stdin(Stdio::null())
        .output()
        .expect("run execrelay serve");
    assert!(!out.status.success(), "{:?}", out.status);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--danger-plaintext"), "{stderr}");
    assert!(
        out.stdout.is_empty(),
        "no URL may be printed: {:?}",
        out.stdout
    );
}

/// A `RawClient` over a WebSocket transport: a pair of tasks turn messages into lines.
fn ws_client(t: Transport) -> RawClient {
    let (near, far) = tokio::io::duplex(1 << 20);
    let (far_r, mut far_w) = tokio::io::split(far);
    let Transport {
        mut incoming,
        mut outgoing,
        ..
    } = t;
    tokio::spawn(async move {
        while let Some(Ok(m)) = incoming.next().await {
            if far_w.write_all(&m).await.is_err() || far_w.write_all(b"\n").await.is_err() {
                break;
            }
        }
        let _ = far_w.shutdown().await;
    });
    tokio::spawn(async move {
        let mut lines = BufReader::new(far_r).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if outgoing.send(line).await.is_err() {
                break;
            }
        }
        let _ = outgoing.close().await;
    });
    let (r, w) = tokio::io::split(near);
    RawClient::new(r, w)
}

async fn http_exchange(addr: &str, request: &str) -> String {
    let mut tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    tcp.write_all(request.as_bytes()).await.expect("write");
    let mut response = Vec::new();
    tokio::time::timeout(GUARD, tcp.read_to_end(&mut response))
        .await
        .expect("the server answers and closes")
        .expect("read");
    String::from_utf8_lossy(&response).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_over_websocket() {
    let mut child = tokio::process::Command::new(bin())
        .args(["serve", "--listen", "ws://127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn execrelay serve");
    let server_pid = child.id().expect("pid") as i32;
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut url = String::new();
    tokio::time::timeout(GUARD, stdout.read_line(&mut url))
        .await
        .expect("the URL is printed")
        .expect("read");
    let url = url.trim_end().to_string();
    let addr = url
        .strip_prefix("ws://127.0.0.1:")
        .map(|port| format!("127.0.0.1:{port}"))
        .unwrap_or_else(|| panic!("first line must be ws://127.0.0.1:PORT, got {url:?}"));
    let port: u16 = addr.rsplit(':').next().unwrap().parse().expect("a port");
    assert_ne!(port, 0);

    let ready = http_exchange(&addr, "GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(ready.starts_with("HTTP/1.1 200 "), "{ready}");

    let cross_origin = http_exchange(
        &addr,
        "GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
         Origin: https://evil.example\r\n\r\n",
    )
    .await;
    assert!(cross_origin.starts_with("HTTP/1.1 403 "), "{cross_origin}");

    let transport = execrelay::transport::websocket::connect_websocket(&url, 16 << 20)
        .await
        .expect("WebSocket connect");
    let mut c = ws_client(transport);
    c.handshake().await;
    c.call(
        "process/start",
        json!({"processId": "e", "argv": ["echo", "hi"]}),
    )
    .await;
    let done = c.collect("e").await;
    done.assert_seqs_contiguous();
    assert_eq!(done.stdout, b"hi\n");
    assert_eq!(done.exit["exitCode"], 0);
    c.send_raw(b"{not json").await;
    let m = c.read_message().await.expect("a parse error");
    assert_eq!(error_of(&m)["code"], -32700);

    // Shutdown with a process running: it is terminated, its exit notice reaches the attached
    // client, then the server exits 0.
    let r = c
        .call(
            "process/start",
            json!({"processId": "s", "argv": ["sleep", "100"]}),
        )
        .await;
    let sleeper = r["pid"].clone();
    unsafe { libc::kill(server_pid, libc::SIGTERM) };
    let done = c.collect("s").await;
    assert_eq!(done.exit["signal"], "SIGTERM");
    let status = tokio::time::timeout(GUARD, child.wait())
        .await
        .expect("server exits on SIGTERM")
        .expect("wait");
    assert_eq!(status.code(), Some(0), "{status:?}");
    kill_group(&sleeper);
}
