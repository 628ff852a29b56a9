//! Bytes one client can make the server hold, at their edges, over the
//! real `ConnectionProcessor` and the Noise link driver: the length of a `writeId`, the bytes
//! of requests read and not yet answered per connection (`max_pending_request_bytes`) and
//! server-wide (`max_inbound_bytes`), and the unfinished Noise messages of one link
//! (`max_link_reassembly_bytes`). The memory these bounds add up to, measured on the built
//! binary, is `memory_bounds.rs`.

mod common;
use common::noise::*;
use common::*;

use bytes::Bytes;
use serde_json::{json, Value};

use execrelay::config::ServerConfig;
use execrelay::connection::parse_cost;
use execrelay_protocol::frame::{Frame, FrameType};

/// A `process/write` of `data` to `pid` with request id `id`, as the bytes sent.
fn write_message(id: u64, pid: &str, data: &[u8]) -> Vec<u8> {
    json!({"jsonrpc": "2.0", "id": id, "method": "process/write",
           "params": {"processId": pid, "chunk": b64(data)}})
    .to_string()
    .into_bytes()
}

/// Bytes a child that never reads cannot take: more than a pipe holds (64 KiB), so the
/// first write blocks and the next ones queue behind it.
const STUCK_WRITE: usize = 150_000;

/// A configuration whose connections may hold `per_connection` writes of [`STUCK_WRITE`]
/// (request ids of three digits) and the server `server_wide` of them.
fn budget_cfg(per_connection: usize, server_wide: usize) -> (ServerConfig, usize) {
    let cost = parse_cost(&write_message(100, "p", &[b'x'; STUCK_WRITE]));
    let c = ServerConfig {
        max_message_bytes: 256 * 1024,
        max_pending_request_bytes: per_connection * cost,
        max_inbound_bytes: server_wide * cost,
        ..cfg()
    };
    c.validate().expect("a valid configuration");
    (c, cost)
}

/// Start `sleep 1000` as `pid`, with a stdin it never reads.
async fn start_stuck(c: &mut RawClient, pid: &str) -> Value {
    c.start(json!({"processId": pid, "argv": ["sleep", "1000"], "pipeStdin": true}))
        .await["pid"]
        .clone()
}

/// The next message on the wire must be the `-32004` refusal of request `id`, naming `limit`
/// with `value` (the writes before it are stuck, so nothing else can come first).
async fn expect_refused(c: &mut RawClient, id: u64, limit: &str, value: usize) {
    let m = c.read_message().await.expect("the refusal");
    assert_eq!(m["id"], id, "{m}");
    let e = error_of(&m);
    assert_eq!(e["code"], -32004, "{m}");
    assert_eq!(e["data"]["limit"], limit, "{m}");
    assert_eq!(e["data"]["value"], value as u64, "{m}");
}

/// `terminate` `pid` (it must get through whatever the budgets hold), then the answers of the
/// stuck writes `ids`: each `exited`.
async fn terminate_and_drain(c: &mut RawClient, pid: &str, ids: &[u64]) {
    assert_eq!(c.terminate(pid, Some(0)).await["running"], true);
    for id in ids {
        let r = c.response(*id).await;
        assert_eq!(r["result"]["status"], "exited", "{r}");
    }
    c.collect(pid).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_bytes_per_connection_at_their_edge() {
    let (config, cost) = budget_cfg(4, 100);
    let mut t = ready_with(config.clone()).await;
    let c = &mut t.client;
    let pgid = start_stuck(c, "p").await;
    let data = vec![b'x'; STUCK_WRITE];
    // Four writes are exactly the budget: every one is taken (the first blocks, three queue).
    for id in 101..=104 {
        c.send_raw(&write_message(id, "p", &data)).await;
    }
    let budget = t.registry.inbound_budget().clone();
    eventually("four writes charged", || budget.used() == 4 * cost).await;
    // One byte more would not fit: the fifth is refused at once, unparsed.
    c.send_raw(&write_message(105, "p", &data)).await;
    expect_refused(
        c,
        105,
        "maxPendingRequestBytes",
        config.max_pending_request_bytes,
    )
    .await;
    // A small control request still gets through, and everything is given back once answered.
    terminate_and_drain(c, "p", &[101, 102, 103, 104]).await;
    eventually("every charge given back", || budget.used() == 0).await;
    // The budget is whole again: four more fit, the fifth does not.
    let pgid2 = start_stuck(c, "q").await;
    for id in 201..=204 {
        c.send_raw(&write_message(id, "q", &data)).await;
    }
    c.send_raw(&write_message(205, "q", &data)).await;
    expect_refused(
        c,
        205,
        "maxPendingRequestBytes",
        config.max_pending_request_bytes,
    )
    .await;
    terminate_and_drain(c, "q", &[201, 202, 203, 204]).await;
    kill_group(&pgid);
    kill_group(&pgid2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_bytes_server_wide_at_their_edge() {
    let (config, cost) = budget_cfg(2, 3);
    let registry = new_registry(config.clone());
    let (mut a, _, _) = open_session(&registry).await;
    let (mut b, _, _) = open_session(&registry).await;
    let pa = start_stuck(&mut a.client, "p").await;
    let pb = start_stuck(&mut b.client, "p").await;
    let data = vec![b'x'; STUCK_WRITE];
    for id in [101, 102] {
        a.client.send_raw(&write_message(id, "p", &data)).await;
    }
    // A's own budget is full: refused by it, not by the server's.
    a.client.send_raw(&write_message(103, "p", &data)).await;
    expect_refused(&mut a.client, 103, "maxPendingRequestBytes", 2 * cost).await;
    // B has room of its own, and the server one write more: exactly the server's budget.
    b.client.send_raw(&write_message(104, "p", &data)).await;
    let budget = registry.inbound_budget().clone();
    eventually("three writes charged", || budget.used() == 3 * cost).await;
    b.client.send_raw(&write_message(105, "p", &data)).await;
    expect_refused(
        &mut b.client,
        105,
        "maxInboundBytes",
        config.max_inbound_bytes,
    )
    .await;
    // Control still gets through for both; once A's writes are answered, B has room again.
    terminate_and_drain(&mut a.client, "p", &[101, 102]).await;
    eventually("A's charges given back", || budget.used() == cost).await;
    b.client.send_raw(&write_message(106, "p", &data)).await;
    eventually("B's second write taken", || budget.used() == 2 * cost).await;
    terminate_and_drain(&mut b.client, "p", &[104, 106]).await;
    kill_group(&pa);
    kill_group(&pb);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_id_length_is_checked_at_its_edge() {
    let mut t = ready_with(cfg()).await;
    let c = &mut t.client;
    c.start(json!({"processId": "cat", "argv": ["cat"], "pipeStdin": true}))
        .await;
    let longest = "w".repeat(256);
    let write =
        |data: &[u8], id: &str| json!({"processId": "cat", "chunk": b64(data), "writeId": id});
    let r = c.call("process/write", write(b"a", &longest)).await;
    assert_eq!(r["status"], "accepted");
    // The same id again is acknowledged without writing.
    let r = c.call("process/write", write(b"b", &longest)).await;
    assert_eq!(r["status"], "accepted");
    // One byte more is refused, and nothing is written (counted in bytes: 129 × 2 bytes).
    for too_long in ["w".repeat(257), "é".repeat(129)] {
        let e = c.call_err("process/write", write(b"c", &too_long)).await;
        assert_eq!(e["code"], -32602, "{e}");
        assert_eq!(e["message"], "writeId must be at most 256 bytes", "{e}");
    }
    c.close_stdin("cat").await;
    let done = c.collect("cat").await;
    assert_eq!(text(&done.stdout), "a");
    assert_eq!(done.exit["exitCode"], 0);
}

/// Seal `msg` for `st` and send all its records but the last: the server holds an
/// unfinished message of `msg.len()` bytes. Returns the last record's frame.
async fn send_all_but_last(link: &mut RawLink, st: &mut RawStream, msg: &[u8]) -> Frame {
    let mut records = st.sealer.seal_message(msg).unwrap();
    let (n, ct) = records.pop().expect("at least one record");
    for (n, ct) in records {
        link.wait_credit(&st.sid, n).await;
        link.send_frame(&Frame::new(FrameType::Data, st.sid, n, Bytes::from(ct)))
            .await;
    }
    Frame::new(FrameType::Data, st.sid, n, Bytes::from(ct))
}

/// A `server/info` request of exactly `total` bytes (its params padded).
fn padded_info(id: u64, total: usize) -> Vec<u8> {
    let head = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"server/info","params":{{"pad":""#);
    let tail = r#""}}"#;
    let mut v = head.into_bytes();
    v.resize(total - tail.len(), b'a');
    v.extend_from_slice(tail.as_bytes());
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfinished_noise_messages_are_bounded_per_link() {
    const M: usize = 1 << 20;
    let config = ServerConfig {
        max_message_bytes: M,
        max_link_reassembly_bytes: 2 * M,
        ..cfg()
    };
    let (key, _auth, srv) = serve_one(config).await;
    let mut link = RawLink::connect(srv.port).await;
    let mut a = link.open_ready(&key, &srv.keys.public).await;
    let mut b = link.open_ready(&key, &srv.keys.public).await;
    let mut c = link.open_ready(&key, &srv.keys.public).await;
    // A and B each hold a whole message but its last record: the link's budget, exactly.
    let last_a = send_all_but_last(&mut link, &mut a, &padded_info(1, M)).await;
    let last_b = send_all_but_last(&mut link, &mut b, &padded_info(1, M)).await;
    // C cannot get a byte more: it alone is reset.
    link.send_json(
        &mut c,
        &json!({"jsonrpc": "2.0", "id": 9, "method": "server/info"}),
    )
    .await;
    link.expect_reset(&c.sid, "busy").await;
    // Another link has a budget of its own.
    let mut other = RawLink::connect(srv.port).await;
    let mut d = other.open_ready(&key, &srv.keys.public).await;
    other.assert_alive(&mut d).await;
    // A and B finish their messages and are answered.
    for (st, last) in [(&mut a, last_a), (&mut b, last_b)] {
        link.wait_credit(&st.sid, last.seq).await;
        link.send_frame(&last).await;
        loop {
            match link.next_ev(st).await {
                Ev::Msg(m) if m["id"] == 1 => {
                    assert!(m["result"]["serverVersion"].is_string(), "{m}");
                    break;
                }
                Ev::Msg(_) => {}
                ev => panic!("the stream ended: {ev:?}"),
            }
        }
    }
    // Their bytes are given back: a new stream may hold a whole message again.
    let mut e = link.open_ready(&key, &srv.keys.public).await;
    link.send_json(
        &mut e,
        &serde_json::from_slice::<Value>(&padded_info(5, M)).unwrap(),
    )
    .await;
    loop {
        match link.next_ev(&mut e).await {
            Ev::Msg(m) if m["id"] == 5 => break,
            Ev::Msg(_) => {}
            ev => panic!("the stream ended: {ev:?}"),
        }
    }
    srv.stop().await;
}
