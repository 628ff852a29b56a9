//! Sessions outlive connections: resume, eviction, lossless retention while detached, expiry,
//! and the client library's reconnection.

mod common;
use common::process::wchan;
use common::*;

use std::sync::Arc;
use std::time::Duration;

use execrelay::client::{Client, ClientOptions, ProcessEvent, StartOptions, Target};
use execrelay::config::ServerConfig;
use execrelay::connection::handlers::start_spec;
use execrelay::connection::ConnectionEnd;
use execrelay::process::ReadySet;
use execrelay::rpc::messages::ExitReason;
use execrelay::session::{ConnHandle, SessionError, SessionRegistry};
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// A registry with `cfg`, shared by the connections of a test.
fn shared(cfg: ServerConfig) -> Arc<SessionRegistry> {
    new_registry(cfg)
}

/// A registry whose detached sessions expire after `ms`.
fn with_ttl(ms: u64) -> Arc<SessionRegistry> {
    shared(ServerConfig {
        detached_session_ttl_ms: ms,
        ..cfg()
    })
}

/// `initialize` resuming `sid` with `token`, acks on; the whole response (it may be an error).
async fn resume(c: &mut RawClient, sid: &str, token: &str) -> serde_json::Value {
    let id = c
        .request(
            "initialize",
            json!({"resume": {"sessionId": sid, "resumeToken": token}, "capabilities": {"acks": true}}),
        )
        .await;
    c.response(id).await
}

/// A new connection on `reg` that resumed `sid` (asserting `resumed`) and sent `initialized`;
/// also the `initialize` response.
async fn resumed(
    reg: &Arc<SessionRegistry>,
    sid: &str,
    token: &str,
) -> (InProcess, serde_json::Value) {
    let mut b = connect_to(reg);
    let r = resume(&mut b.client, sid, token).await;
    assert_eq!(r["result"]["resumed"], true);
    b.client.notify("initialized", json!({})).await;
    (b, r)
}

fn pseudo_random(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_with_the_right_token_keeps_the_session_and_its_processes() {
    let reg = shared(cfg());
    let (mut a, sid, token) = open_session(&reg).await;
    assert!(token.len() >= 22, "at least 128 bits of token");
    let start = a
        .client
        .start(json!({"processId": "sleeper", "argv": ["sleep", "100"]}))
        .await;
    let pid = start["pid"].as_i64().unwrap() as i32;
    assert_eq!(a.hang_up().await, ConnectionEnd::PeerClosed);

    let (mut b, r) = resumed(&reg, &sid, &token).await;
    assert_eq!(r["result"]["sessionId"], sid.as_str());
    let list = b.client.call("process/list", json!({})).await;
    assert_eq!(list["processes"][0]["processId"], "sleeper");
    assert_eq!(list["processes"][0]["state"], "running");
    assert!(group_alive(pid));
    b.client.terminate("sleeper", None).await;
    let c = b.client.collect("sleeper").await;
    assert_eq!(c.exit["signal"], "SIGTERM");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_token_and_unknown_session_look_the_same() {
    let reg = shared(cfg());
    let (mut a, sid, token) = open_session(&reg).await;

    let mut b = connect_to(&reg);
    let wrong = resume(
        &mut b.client,
        &sid,
        "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
    )
    .await;
    let unknown = resume(&mut b.client, "s-nope", &token).await;
    assert_eq!(wrong["error"]["code"], -32003);
    assert_eq!(unknown["error"]["code"], -32003);
    assert_eq!(wrong["error"]["message"], unknown["error"]["message"]);
    // A failed resume left `a` attached and untouched.
    assert!(a.client.call("server/info", json!({})).await["sessions"] == 1);
    assert!(reg.session(&sid).unwrap().is_attached());
}

/// Paused time: an expired session is refused as an unknown one (the same error as a wrong
/// token, so a client learns nothing from it), at its TTL and not before; its end is driven
/// by the registry's one timer task.
#[tokio::test(start_paused = true)]
async fn an_expired_session_resumes_as_an_unknown_one() {
    let reg = with_ttl(200);
    let c1 = conn(&reg);
    let (session, token) = reg.create(false, &c1).unwrap();
    let sid = session.id.clone();
    let wrong = reg
        .resume(
            &sid,
            "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
            &conn(&reg),
        )
        .err()
        .expect("a wrong token is refused");
    session.detach(c1.conn_id);
    tokio::time::advance(Duration::from_millis(199)).await;
    settle().await;
    assert!(reg.session(&sid).is_some(), "not before its TTL");
    tokio::time::advance(Duration::from_millis(1)).await;
    settle().await;
    assert!(reg.session(&sid).is_none(), "expired at its TTL");
    assert!(session.is_closed());
    let expired = reg
        .resume(&sid, &token, &conn(&reg))
        .err()
        .expect("an expired session is refused");
    assert!(matches!(expired, SessionError::UnknownSession), "{expired}");
    assert_eq!(expired.to_string(), wrong.to_string());
    // Everything it started ends (here, an empty scope). No timeout around it: paused time
    // would run past one while the end's blocking signal call runs.
    session.terminated().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_on_a_dead_connection_does_not_hold_the_session() {
    let reg = shared(cfg());
    let (mut a, sid, token) = open_session(&reg).await;
    a.client
        .start(json!({"processId": "p", "argv": ["sleep", "100"]}))
        .await;
    let _poll = a
        .client
        .request(
            "process/read",
            json!({"processId": "p", "afterSeq": 0, "waitMs": 30000}),
        )
        .await;
    // The old processor ends although its long poll had 30 s to go.
    assert_eq!(a.hang_up().await, ConnectionEnd::PeerClosed);

    let (mut b, _) = resumed(&reg, &sid, &token).await;
    let t = b.client.terminate("p", None).await;
    assert_eq!(t["running"], true);
    let c = b.client.collect("p").await;
    assert_eq!(c.exit["signal"], "SIGTERM");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_evicts_a_half_open_connection_and_takes_over_its_events() {
    let reg = shared(cfg());
    let (mut a, sid, token) = open_session(&reg).await;
    a.client
        .start(json!({"processId": "cat", "argv": ["cat"], "pipeStdin": true}))
        .await;
    a.client.write("cat", b"one\n").await;

    // `a` is still open (half-open from the server's point of view) when `b` resumes.
    let (mut b, _) = resumed(&reg, &sid, &token).await;
    assert_eq!(connection_end(a.end).await, ConnectionEnd::Evicted);
    // The evicted connection is closed: whatever it had buffered, it ends without answering
    // a new request.
    let late = json!({"jsonrpc": "2.0", "id": "late", "method": "server/info"});
    let _ =
        tokio::io::AsyncWriteExt::write_all(&mut a.client.writer, format!("{late}\n").as_bytes())
            .await;
    while let Some(m) = a.client.read_message().await {
        assert_ne!(
            m["id"], "late",
            "an evicted connection must not serve requests"
        );
    }

    b.client.write("cat", b"two\n").await;
    b.client.close_stdin("cat").await;
    // Retained events are replayed first (seq 1 = "one"), then live ones, in seq order.
    let c = b.client.collect("cat").await;
    assert_eq!(c.stdout, b"one\ntwo\n");
    c.assert_seqs_contiguous();
    assert_eq!(c.exit["exitCode"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_produced_while_detached_is_held_not_lost() {
    let data = pseudo_random(2 * 1024 * 1024);
    let file = file_with(&data);
    let reg = shared(ServerConfig {
        retained_output_bytes: 256 * 1024,
        output_budget_bytes: 64 * 1024,
        ..cfg()
    });
    let mut a = connect_to(&reg);
    let id = a
        .client
        .request("initialize", json!({"capabilities": {"acks": true}}))
        .await;
    let init = a.client.response(id).await["result"].clone();
    a.client.notify("initialized", json!({})).await;
    let (sid, token) = credentials(&init);
    let start = a
        .client
        .start(json!({"processId": "p", "argv": ["cat", file.path()], "drainTimeoutMs": 100}))
        .await;
    let pid = start["pid"].as_u64().unwrap();
    a.hang_up().await;
    // Detached: the log fills to its retention and the child is held in write().
    let proc = reg.session(&sid).unwrap().get("p").unwrap();
    // Held back at the output budget (64 KiB: one chunk), well inside the retention. The
    // child can block on a full pipe before the pump has logged its first chunk, so the
    // held state is both at once.
    eventually("child blocked while detached, one chunk logged", || {
        wchan(pid).ends_with("pipe_write")
            && proc.stats().retained_bytes >= execrelay::config::PUMP_CHUNK_BYTES
    })
    .await;
    assert!(proc.stats().retained_bytes < 256 * 1024);
    assert_eq!(
        proc.stats().released_through,
        0,
        "nothing released while detached"
    );

    let (mut b, _) = resumed(&reg, &sid, &token).await;
    // Read everything, acknowledging as we go (the log only shrinks on acks).
    let mut got = Vec::new();
    let mut expected_seq = 1;
    let exit = loop {
        let n = b.client.next_notification().await.unwrap();
        let p = n["params"].clone();
        let seq = p["seq"].as_u64().unwrap();
        assert_eq!(seq, expected_seq, "replayed in seq order, no gap");
        expected_seq += 1;
        b.client
            .notify("process/ack", json!({"processId": "p", "seq": seq}))
            .await;
        if n["method"] == "process/exited" {
            break p;
        }
        got.extend(unb64(p["chunk"].as_str().unwrap()));
    };
    assert_eq!(got.len(), data.len());
    assert_eq!(sha256(&got), sha256(&data));
    assert_eq!(exit["exitCode"], 0);
    assert_eq!(exit["outputDrainTimedOut"], false);
}

/// End to end, on the real clock: the driver wires the table's expiry to real processes
/// (the table's side, every deadline and action, is tested on a simulated clock in
/// `session/table/tests.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_session_takes_its_process_groups_with_it() {
    let reg = with_ttl(300);
    let (mut a, sid, _) = open_session(&reg).await;
    let start = a
        .client
        .start(json!({"processId": "p", "argv": ["sh", "-c", "sleep 100 & sleep 100"]}))
        .await;
    let pgid = start["pid"].as_i64().unwrap() as i32;
    assert!(group_alive(pgid));
    let session = reg.session(&sid).unwrap();
    let p = session.get("p").unwrap();
    a.hang_up().await;
    eventually("session expired", || reg.session(&sid).is_none()).await;
    eventually("process group gone", || !group_alive(pgid)).await;
    assert_eq!(reg.process_count(), 0);
    tokio::time::timeout(GUARD, p.wait_finished())
        .await
        .expect("its exit notice is ready (hang guard)");
    assert_eq!(
        p.info().exit.expect("exit notice").reason,
        ExitReason::SessionExpired
    );
    tokio::time::timeout(GUARD, session.terminated())
        .await
        .expect("the session's end completes (hang guard)");
}

fn conn(reg: &SessionRegistry) -> ConnHandle {
    ConnHandle {
        conn_id: reg.next_conn_id(),
        ready: Arc::new(ReadySet::default()),
        evict: CancellationToken::new(),
        peer_key: None,
        peer_addr: None,
        requests: None,
    }
}

/// Let spawned timer tasks run after the clock moved.
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_stale_expiry_timer_never_closes_a_resumed_session() {
    let reg = with_ttl(500);
    let c1 = conn(&reg);
    let (session, token) = reg.create(false, &c1).unwrap();
    let sid = session.id.clone();
    session.detach(c1.conn_id); // t=0: first timer due at 500
    tokio::time::advance(Duration::from_millis(300)).await;
    let c2 = conn(&reg);
    reg.resume(&sid, &token, &c2).unwrap(); // t=300
    tokio::time::advance(Duration::from_millis(100)).await;
    session.detach(c2.conn_id); // t=400: second timer due at 900
    tokio::time::advance(Duration::from_millis(200)).await; // t=600
    settle().await;
    assert!(reg.session(&sid).is_some(), "the first timer is stale");
    assert!(!session.is_closed());
    tokio::time::advance(Duration::from_millis(400)).await; // t=1000
    settle().await;
    assert!(reg.session(&sid).is_none(), "the second timer expires it");
    assert!(session.is_closed());
}

#[tokio::test(start_paused = true)]
async fn a_session_resumed_in_time_is_not_expired_at_all() {
    let reg = with_ttl(500);
    let c1 = conn(&reg);
    let (session, token) = reg.create(false, &c1).unwrap();
    session.detach(c1.conn_id);
    tokio::time::advance(Duration::from_millis(499)).await;
    let c2 = conn(&reg);
    reg.resume(&session.id, &token, &c2).unwrap();
    tokio::time::advance(Duration::from_millis(10_000)).await;
    settle().await;
    assert!(!session.is_closed());
    assert!(session.is_attached_to(c2.conn_id));
}

/// `sessionTtlMs` keeps a detached session past the server's default TTL (here 60 s, the
/// protocol's default), and no longer than it asked.
#[tokio::test(start_paused = true)]
async fn a_session_ttl_asked_for_keeps_a_detached_session_past_the_default() {
    let reg = with_ttl(60_000);
    let c1 = conn(&reg);
    let (session, _token) = reg.create(false, &c1).unwrap();
    session.set_detached_ttl(Duration::from_secs(3600));
    session.detach(c1.conn_id);
    tokio::time::advance(Duration::from_secs(61)).await;
    settle().await;
    assert!(!session.is_closed(), "kept past the default 60 s");
    tokio::time::advance(Duration::from_secs(3600 - 61 - 1)).await;
    settle().await;
    assert!(!session.is_closed(), "kept until its own TTL");
    tokio::time::advance(Duration::from_secs(2)).await;
    settle().await;
    assert!(session.is_closed(), "expired at its own TTL");
    assert!(reg.session(&session.id).is_none());
}

/// `initialize` grants `sessionTtlMs` up to `max_session_ttl_ms` (the result's
/// `limits.detachedSessionTtlMs` says what), refuses more with `-32602` naming the bound and
/// carrying it, and a resume may set it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initialize_grants_a_session_ttl_up_to_the_servers_max() {
    let reg = shared(ServerConfig {
        max_session_ttl_ms: 600_000,
        ..cfg()
    });
    let mut t = connect_to(&reg);
    let e = t
        .client
        .call_err("initialize", json!({"sessionTtlMs": 600_001}))
        .await;
    assert_eq!(e["code"], -32602, "{e}");
    assert_eq!(
        e["message"],
        "sessionTtlMs 600001 is above this server's max_session_ttl_ms (600000)"
    );
    assert_eq!(e["data"], json!({"member": "sessionTtlMs", "max": 600_000}));
    assert_eq!(reg.session_count(), 0, "a refused TTL creates nothing");
    // A failed initialize may be retried.
    let init = t
        .client
        .call("initialize", json!({"sessionTtlMs": 600_000}))
        .await;
    assert_eq!(init["limits"]["detachedSessionTtlMs"], 600_000, "{init}");
    t.client.notify("initialized", json!({})).await;
    let (sid, token) = credentials(&init);
    assert_eq!(
        reg.session(&sid).unwrap().detached_ttl(),
        Duration::from_secs(600)
    );
    drop(t.client);
    // Without it, the server's default.
    let mut u = connect_to(&reg);
    let other = u.client.handshake().await;
    assert_eq!(other["limits"]["detachedSessionTtlMs"], 60_000, "{other}");
    // A resume sets it again; without it, the session keeps what it had.
    let mut v = connect_to(&reg);
    let r = v
        .client
        .call(
            "initialize",
            json!({"resume": {"sessionId": sid, "resumeToken": token}, "sessionTtlMs": 5000}),
        )
        .await;
    assert_eq!(r["limits"]["detachedSessionTtlMs"], 5000, "{r}");
    drop(v.client);
    let mut w = connect_to(&reg);
    let r = w.client.resume(&sid, &token).await;
    assert_eq!(r["limits"]["detachedSessionTtlMs"], 5000, "{r}");
}

/// A WebSocket server in this process, for the client library.
async fn ws_server(cfg: ServerConfig) -> (String, Arc<SessionRegistry>, CancellationToken) {
    let server = execrelay::server::Server::new(Arc::new(cfg)).expect("server starts");
    let reg = server.registry().clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    let stop = CancellationToken::new();
    tokio::spawn(server.run(
        vec![execrelay::server::Listener::Ws(listener)],
        stop.clone(),
    ));
    (url, reg, stop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_survives_killed_links_without_loss_or_duplicates() {
    const TOTAL: usize = 50 * 1024 * 1024;
    let data = pseudo_random(TOTAL);
    let file = file_with(&data);
    let (url, _reg, stop) = ws_server(ServerConfig {
        retained_output_bytes: 1024 * 1024,
        ..cfg()
    })
    .await;
    let client = Client::connect(Target::Ws(url), ClientOptions::default())
        .await
        .unwrap();
    let mut p = client
        .start(StartOptions::new(
            "big",
            ["cat".to_string(), file.path().display().to_string()],
        ))
        .await
        .unwrap();
    // Kill the link at 7 offsets spread at random over the stream.
    let mut kills: Vec<usize> = (0..7)
        .map(|i| {
            let r = pseudo_random(8 + i)[i] as usize;
            (i * TOTAL / 7) + r * 997 % (TOTAL / 7)
        })
        .collect();
    kills.sort();
    let mut got = Vec::with_capacity(TOTAL);
    let mut killed = 0;
    let exit = loop {
        let ev = tokio::time::timeout(GUARD, p.next_event())
            .await
            .expect("no event within the hang guard: output stalled after a reconnect");
        match ev.expect("stream ended early") {
            ProcessEvent::Output { data, .. } => {
                got.extend_from_slice(&data);
                while killed < kills.len() && got.len() >= kills[killed] {
                    client.break_connection();
                    killed += 1;
                }
            }
            ProcessEvent::Exited(info) => break info,
            ProcessEvent::Lost { from, to } => panic!("lost events {from}..={to}"),
            ProcessEvent::Omitted { .. } => panic!("no cap was asked for"),
        }
    };
    assert_eq!(killed, 7);
    assert!(
        client.connection_count() >= 6,
        "the client reconnected after the kills ({} connections)",
        client.connection_count()
    );
    assert_eq!(got.len(), TOTAL);
    assert!(got == data, "bytes differ from what the child wrote");
    assert_eq!(exit.exit_code, Some(0));
    client.close();
    stop.cancel();
}

/// Regression: an ack lost with its connection was never repeated. After the resume the server
/// replayed only events the client had already consumed (dropped as duplicates, so they never
/// counted towards a new ack) and, its retention full of them, waited for an ack forever
/// (the resume benchmark hung about one run in six).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_lost_with_a_connection_are_repeated_after_the_resume() {
    let (url, reg, stop) = ws_server(cfg()).await;
    let client = Client::connect(Target::Ws(url), ClientOptions::default())
        .await
        .unwrap();
    // 400,000 bytes, then, once the test says so on stdin, one more byte. The client acks
    // what it consumed before it waits for more, so by the time the last byte arrives
    // everything before it may be acknowledged; that byte alone is an event of its own (the
    // child writes it only after the client has received the rest, so no read of the server
    // can join it to earlier output) and costs far less than an ack's threshold
    // (`ACK_EVERY_BYTES`), so it is consumed and not acknowledged. The child then stays alive,
    // so no exit ack follows either. (Without the handshake on stdin the last event could be a
    // full chunk, whose cost reaches the threshold: the client then acked the tail too.)
    let mut opts = StartOptions::new(
        "a",
        [
            "sh",
            "-c",
            "head -c 400000 /dev/zero; read go; printf t; exec sleep 30",
        ],
    );
    opts.params.pipe_stdin = true;
    let mut p = client.start(opts).await.unwrap();
    let mut got = 0;
    while got < 400_000 {
        match tokio::time::timeout(GUARD, p.next_event()).await.unwrap() {
            Some(ProcessEvent::Output { data, .. }) => got += data.len(),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(got, 400_000, "the tail comes only after the go-ahead");
    p.write(b"go\n").await.unwrap();
    match tokio::time::timeout(GUARD, p.next_event()).await.unwrap() {
        Some(ProcessEvent::Output { data, .. }) => assert_eq!(&data[..], b"t"),
        other => panic!("unexpected {other:?}"),
    }
    let session = reg.session(&client.session_id().unwrap()).unwrap();
    let proc = session.get("a").unwrap();
    let last = proc.stats().next_seq - 1;
    assert_eq!(p.consumed_seq(), last, "the client consumed everything");
    assert!(
        proc.stats().acked_through < last,
        "the tail is not acknowledged yet"
    );
    // The link dies: what the client consumed since its last ack must be acknowledged again
    // over the new connection, or nothing would ever release it.
    client.break_connection();
    eventually("the resumed client acknowledges all it consumed", || {
        proc.stats().acked_through == last
    })
    .await;
    client.shutdown().await;
    stop.cancel();
}

/// Regression: a writer of the previous connection that finished a write after a resume moved
/// the new connection's delivery cursor past events it never sent (the client then saw a gap
/// and, filling it, deadlocked). The cursor now belongs to the current attachment only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_writer_cannot_move_the_cursor_of_a_resumed_session() {
    let reg = shared(cfg());
    let a = conn(&reg);
    let (session, token) = reg.create(true, &a).unwrap();
    let params = serde_json::from_value(json!({"processId": "p", "argv": ["echo", "hi"]})).unwrap();
    let p = session
        .start(start_spec(params, reg.config()).unwrap(), a.conn_id)
        .unwrap();
    session.enable_delivery(&p, a.conn_id);
    p.wait_finished().await;
    let last = p.stats().next_seq - 1;
    assert_eq!(last, 2, "one output event and the exit notice");
    assert!(!p.mark_written_by(&a.ready, last));
    assert_eq!(p.stats().written_through, last);

    let b = conn(&reg);
    reg.resume(&session.id, &token, &b).unwrap();
    assert_eq!(p.stats().written_through, 0, "rewound to the last ack");
    // The old connection's writer completes a write now: it must change nothing.
    assert!(!p.mark_written_by(&a.ready, last));
    assert_eq!(p.stats().written_through, 0);
    // The new connection's writer moves it.
    assert!(p.mark_written_by(&b.ready, 1));
    assert_eq!(p.stats().written_through, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_close_ends_the_session_and_its_processes_at_once() {
    let reg = shared(cfg());
    let (mut a, sid, token) = open_session(&reg).await;
    let start = a
        .client
        .start(json!({"processId": "s", "argv": ["sleep", "100"]}))
        .await;
    let pgid = start["pid"].as_i64().unwrap() as i32;
    assert_eq!(a.client.call("session/close", json!({})).await, json!({}));
    assert!(reg.session(&sid).is_none(), "gone at once, not detached");
    eventually("process group terminated", || !group_alive(pgid)).await;
    a.hang_up().await;
    let mut b = connect_to(&reg);
    let r = resume(&mut b.client, &sid, &token).await;
    assert_eq!(r["error"]["code"], -32003);
}
