//! Protocol errors (`protocol.md` §1–§3): every error code of the table, the exact id it is
//! answered to, and whether the connection survives it, over the real `ConnectionProcessor`
//! and over the built binary (stdio and WebSocket). (Limits at their edges, framing errors
//! among them, are in `protocol_limits.rs`.)

mod common;
use common::binary::{first_line, http_exchange, serve_cmd, ws_client};
use common::*;

use std::process::Stdio;

use serde_json::{json, Value};

use execrelay::connection::ConnectionEnd;

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
    let registry = new_registry(cfg());
    let (mut a, sid, token) = open_session(&registry).await;

    // The same token with one character changed: still valid base64 of the same length.
    let mut wrong = token.clone().into_bytes();
    wrong[0] = if wrong[0] == b'A' { b'B' } else { b'A' };
    let wrong = String::from_utf8(wrong).unwrap();

    let mut b = connect_to(&registry);
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
        assert_eq!(
            connection_end(end).await,
            ConnectionEnd::UnexpectedResponse,
            "{msg}"
        );
    }
}

// --- The built binary -----------------------------------------------------------------------

/// `initialize` + `initialized`, then `echo hi` as process "e": its output and exit 0 arrive
/// with contiguous seqs. Returns what was collected.
async fn handshake_and_echo_hi(c: &mut RawClient) -> Collected {
    c.handshake().await;
    let done = c
        .run(json!({"processId": "e", "argv": ["echo", "hi"]}))
        .await;
    done.assert_seqs_contiguous();
    assert_eq!(done.stdout, b"hi\n");
    assert_eq!(done.exit["exitCode"], 0);
    done
}

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

    let done = handshake_and_echo_hi(&mut c).await;
    assert_eq!(done.exit["signal"], Value::Null);

    c.send_raw(b"this is not json").await;
    let m = c.read_message().await.expect("a parse error");
    assert_eq!(m["id"], Value::Null);
    assert_eq!(error_of(&m)["code"], -32700);

    // A process still running when stdin closes is terminated with the server.
    let r = c
        .start(json!({"processId": "s", "argv": ["sleep", "100"]}))
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_over_websocket() {
    let mut child = serve_cmd("ws://127.0.0.1:0", Stdio::null())
        .spawn()
        .expect("spawn execrelay serve");
    let server_pid = child.id().expect("pid") as i32;
    let (url, _stdout) = first_line(&mut child, GUARD).await;
    let url = url.expect("the URL is printed");
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
    handshake_and_echo_hi(&mut c).await;
    c.send_raw(b"{not json").await;
    let m = c.read_message().await.expect("a parse error");
    assert_eq!(error_of(&m)["code"], -32700);

    // Shutdown with a process running: it is terminated, its exit notice reaches the attached
    // client, then the server exits 0.
    let r = c
        .start(json!({"processId": "s", "argv": ["sleep", "100"]}))
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

/// A raw WebSocket upgrade on `addr`: the TCP stream, past the `101` head.
async fn raw_upgrade(addr: &str) -> tokio::net::TcpStream {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    tcp.write_all(
        b"GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
          Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
    )
    .await
    .expect("upgrade request");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        tcp.read_exact(&mut byte).await.expect("101 head");
        head.push(byte[0]);
    }
    assert!(head.starts_with(b"HTTP/1.1 101 "), "{head:?}");
    tcp
}

/// A masked client frame (mask all zero bits but one, so the payload is really masked).
fn masked(first: u8, payload: &[u8]) -> Vec<u8> {
    assert!(payload.len() < 126);
    let mask = [0x5a, 0, 0xa5, 1];
    let mut f = vec![first, 0x80 | payload.len() as u8];
    f.extend_from_slice(&mask);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    f
}

/// Hostile peers on the plain WebSocket: a flood of 20,000 pings from a peer that never
/// reads its pongs is read to the end (the server keeps one pong waiting, not one per ping),
/// a close with a code that may not be sent ends that connection, and a second client's
/// work goes on throughout, unharmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ping_flood_and_a_bad_close_harm_no_other_connection() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut child = serve_cmd("ws://127.0.0.1:0", Stdio::null())
        .spawn()
        .expect("spawn execrelay serve");
    let (url, _stdout) = first_line(&mut child, GUARD).await;
    let url = url.expect("the URL is printed");
    let addr = url.strip_prefix("ws://").expect("ws:// URL").to_owned();

    let mut flooder = raw_upgrade(&addr).await;
    let ping = masked(0x89, &[7u8; 125]);
    let flood: Vec<u8> = ping
        .iter()
        .copied()
        .cycle()
        .take(ping.len() * 20_000)
        .collect();
    // 2.6 MB of pings, far more than both socket buffers hold: the writes complete only if
    // the server keeps reading while its pongs back up.
    tokio::time::timeout(GUARD, flooder.write_all(&flood))
        .await
        .expect("the server stopped reading the flood (hang guard)")
        .expect("flood written");

    let transport = execrelay::transport::websocket::connect_websocket(&url, 16 << 20)
        .await
        .expect("WebSocket connect");
    let mut c = ws_client(transport);
    handshake_and_echo_hi(&mut c).await;

    // Close code 1005 may never be sent (RFC 6455 §7.4.1): the connection ends.
    flooder
        .write_all(&masked(0x88, &1005u16.to_be_bytes()))
        .await
        .expect("bad close");
    let mut wire = Vec::new();
    tokio::time::timeout(GUARD, flooder.read_to_end(&mut wire))
        .await
        .expect("the connection did not end (hang guard)")
        .expect("read to the end");
    // What came back was pongs (at most as many as fit in the socket buffers, far fewer than
    // 20,000), and no close echoing the bad code.
    let pong = [0x8a, 125];
    let pongs = wire.windows(2).filter(|w| *w == pong).count();
    assert!(pongs >= 1, "no pong at all");
    assert!(pongs < 20_000, "{pongs} pongs: one per ping was kept");

    // The other client is still served.
    let again = c
        .run(json!({"processId": "e2", "argv": ["echo", "still"]}))
        .await;
    assert_eq!(again.stdout, b"still\n");
    let _ = child.kill().await;
}
