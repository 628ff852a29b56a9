//! The client library against servers that say odd things, or at odd moments: a fake server
//! scripted per test makes each moment exact (review of 2026-12-05, R2 R4 R5 R7, and a
//! `toSeq` that does not move).
//!
//! - A `maxMessageBytes` smaller than a stdin write: the pipelined writer reports
//!   `RequestTooLarge` at once (it sent the write again on each new connection, at full speed).
//! - A `maxMessageBytes` of 0: unknown, nothing refused locally, full-size pieces.
//! - A start dropped by its caller while it waits to be tried again frees its id.
//! - A start applied on a lost connection and refused for a limit on the next is not started
//!   a second time once the first has run.
//! - A `-32005` whose `toSeq` does not move past what was asked ends the gap's reads.

mod common;
use common::fake_server::{answer, fake_server, initialized, Act, Seen};
use common::GUARD;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use bytes::Bytes;
use execrelay::client::{
    Client, ClientError, ClientOptions, ProcessEvent, StartOptions, StdinRefused, Target,
    STDIN_WRITE_BYTES,
};
use serde_json::{json, Value};
use tokio::sync::mpsc;

fn started(request: &Value, pid: u32) -> Act {
    Act::Send(vec![answer(
        request,
        json!({"processId": request["params"]["processId"], "pid": pid}),
    )])
}

/// `-32004` for a limit that empties by itself (`maxPendingRequests`).
fn refused(request: &Value) -> Act {
    Act::Send(vec![
        json!({"jsonrpc": "2.0", "id": request["id"], "error": {
        "code": -32004, "message": "too many requests in flight",
        "data": {"limit": "maxPendingRequests", "value": 1}}}),
    ])
}

/// `server/info` answered (the tests' round trip); anything else the client sends
/// (`initialized`, acks) needs no answer.
fn otherwise(request: &Value) -> Act {
    match request["method"].as_str() {
        Some("server/info") => Act::Send(vec![answer(request, json!({"serverVersion": "fake"}))]),
        _ => Act::Send(vec![]),
    }
}

async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(GUARD, f).await.expect("hang guard")
}

async fn client(url: &str) -> Client {
    Client::connect(Target::Ws(url.to_string()), ClientOptions::default())
        .await
        .unwrap()
}

/// The methods seen so far, in order.
fn drain(seen: &mut mpsc::UnboundedReceiver<Seen>) -> Vec<Seen> {
    let mut all = Vec::new();
    while let Ok(s) = seen.try_recv() {
        all.push(s);
    }
    all
}

#[tokio::test]
async fn a_stdin_write_larger_than_the_servers_messages_is_refused_at_once() {
    // The first connection takes large messages; the resumed one only 80 bytes, less than
    // any write request (the pieces are then one byte, their requests about 100).
    let writes = Arc::new(AtomicUsize::new(0));
    let w = writes.clone();
    let (url, mut seen) = fake_server(move |conn, v| match v["method"].as_str() {
        Some("initialize") => initialized(conn, v, if conn == 1 { 1 << 24 } else { 80 }),
        Some("process/start") => started(v, 7),
        Some("server/info") if conn == 1 => Act::Drop,
        Some("process/write") => {
            w.fetch_add(1, Ordering::SeqCst);
            Act::Drop
        }
        _ => otherwise(v),
    })
    .await;
    let c = client(&url).await;
    let h = c.start(StartOptions::new("p", ["cat"])).await.unwrap();
    // A request that ends the first connection: answered on the second, resumed.
    within(c.server_info())
        .await
        .expect("answered after the resume");
    assert_eq!(c.connection_count(), 2);
    let mut stdin = h.stdin_writer();
    let r = within(async {
        stdin.write(Bytes::from(vec![b'x'; 100])).await?;
        stdin.flush().await
    })
    .await;
    match r {
        Err(StdinRefused::Error(ClientError::RequestTooLarge {
            method,
            bytes,
            limit,
        })) => {
            assert_eq!((method.as_str(), limit), ("process/write", 80));
            assert!(bytes > 80, "{bytes}");
        }
        other => panic!("expected RequestTooLarge, got {other:?}"),
    }
    assert_eq!(writes.load(Ordering::SeqCst), 0, "never sent");
    assert_eq!(c.connection_count(), 2, "no connection was given up for it");
    // Stopped: the next write says the same, and sends nothing.
    assert!(matches!(
        stdin.write(Bytes::from_static(b"y")).await,
        Err(StdinRefused::Error(ClientError::RequestTooLarge { .. }))
    ));
    assert!(drain(&mut seen).iter().all(|(_, m)| m != "process/write"));
}

#[tokio::test]
async fn a_max_message_of_zero_is_no_limit() {
    let pieces = Arc::new(std::sync::Mutex::new(Vec::new()));
    let p = pieces.clone();
    let (url, _seen) = fake_server(move |conn, v| match v["method"].as_str() {
        Some("initialize") => initialized(conn, v, 0),
        Some("process/start") => started(v, 7),
        Some("process/write") => {
            let chunk = v["params"]["chunk"].as_str().unwrap_or("");
            p.lock().unwrap().push(B64.decode(chunk).unwrap().len());
            Act::Send(vec![answer(v, json!({"status": "accepted"}))])
        }
        _ => otherwise(v),
    })
    .await;
    let c = client(&url).await;
    let mut h = c
        .start(StartOptions::new("p", ["cat"]))
        .await
        .expect("a start is not refused locally");
    assert_eq!(within(h.write(b"abc")).await.unwrap(), "accepted");
    let mut stdin = h.stdin_writer();
    within(async {
        stdin
            .write(Bytes::from(vec![b'x'; 2 * STDIN_WRITE_BYTES]))
            .await?;
        stdin.flush().await
    })
    .await
    .expect("written");
    assert_eq!(
        *pieces.lock().unwrap(),
        [3, STDIN_WRITE_BYTES, STDIN_WRITE_BYTES],
        "full-size pieces, not one-byte ones"
    );
}

#[tokio::test]
async fn a_start_its_caller_drops_while_it_is_refused_frees_its_id() {
    let starts = Arc::new(AtomicUsize::new(0));
    let s = starts.clone();
    let (url, mut seen) = fake_server(move |conn, v| match v["method"].as_str() {
        Some("initialize") => initialized(conn, v, 1 << 24),
        Some("process/start") if s.fetch_add(1, Ordering::SeqCst) == 0 => refused(v),
        Some("process/start") => started(v, 8),
        _ => otherwise(v),
    })
    .await;
    let c = client(&url).await;
    {
        let start = c.start(StartOptions::new("p", ["true"]));
        tokio::pin!(start);
        // Until the server has seen (and so refuses) the start; then the caller gives up on
        // it (a timeout around it, say): while its refusal is on the way, or in the pause
        // before it goes again, whichever this run reaches (the claim on the id is freed on
        // every end but success, so both are the same case).
        loop {
            tokio::select! {
                r = &mut start => panic!("the refused start ended by itself: {:?}", r.err()),
                s = seen.recv() => if s.expect("the server runs").1 == "process/start" { break },
            }
        }
    }
    let h = within(c.start(StartOptions::new("p", ["true"])))
        .await
        .expect("the id is free again");
    assert_eq!((h.pid, starts.load(Ordering::SeqCst)), (8, 2));
}

/// Connection 1 takes the start and drops unanswered (applied); connection 2 refuses the
/// start for a limit, then lists the process as `listed` says, after sending `before`.
async fn applied_then_refused(
    listed: Value,
    before: Vec<Value>,
) -> (String, mpsc::UnboundedReceiver<Seen>) {
    fake_server(move |conn, v| match (conn, v["method"].as_str()) {
        (_, Some("initialize")) => {
            let Act::Send(mut msgs) = initialized(conn, v, 1 << 24) else {
                unreachable!()
            };
            if conn > 1 {
                msgs.extend(before.iter().cloned());
            }
            Act::Send(msgs)
        }
        (1, Some("process/start")) => Act::Drop,
        (_, Some("process/start")) => refused(v),
        (_, Some("process/list")) => Act::Send(vec![answer(v, listed.clone())]),
        _ => otherwise(v),
    })
    .await
}

fn starts(seen: &mut mpsc::UnboundedReceiver<Seen>) -> Vec<usize> {
    drain(seen)
        .into_iter()
        .filter(|(_, m)| m == "process/start")
        .map(|(conn, _)| conn)
        .collect()
}

#[tokio::test]
async fn a_start_applied_on_a_lost_connection_is_not_started_twice_when_refused_after() {
    // Still listed: its pid is the answer.
    let listed = json!({"processes": [{"processId": "p", "pid": 4242, "argv": ["true"],
        "tty": false, "state": "exited", "nextSeq": 3, "exitCode": 0}]});
    let (url, mut seen) = applied_then_refused(listed, vec![]).await;
    let c = client(&url).await;
    let h = within(c.start(StartOptions::new("p", ["true"])))
        .await
        .expect("found started");
    assert_eq!(h.pid, 4242);
    assert_eq!(
        starts(&mut seen),
        [1, 2],
        "sent twice, refused the second time"
    );

    // Gone from the list, but its output arrived on the new connection: it ran (and was
    // forgotten after its exit); the start reports it, pid unknown (0), and nothing more.
    let delta = json!({"jsonrpc": "2.0", "method": "process/outputDelta", "params": {
        "processId": "p", "seq": 1, "stream": "stdout", "chunk": "aGkK"}});
    let (url, mut seen) = applied_then_refused(json!({"processes": []}), vec![delta]).await;
    let c = client(&url).await;
    let mut h = within(c.start(StartOptions::new("p", ["true"])))
        .await
        .expect("found started");
    assert_eq!(h.pid, 0);
    match within(h.next_event()).await {
        Some(ProcessEvent::Output { data, .. }) => assert_eq!(&data[..], b"hi\n"),
        other => panic!("expected its output, got {other:?}"),
    }
    assert_eq!(starts(&mut seen), [1, 2]);
}

/// Event 3 of process `p` arrives first, so the client reads the gap after 0, and the server
/// answers every `process/read` with `read(request)`. Checks that it was asked once (two round
/// trips later: the same read went again as soon as each answer came), and that the stream
/// goes on: the gap lost as a whole, then the event that arrived (before, with the loop ended,
/// that event was dropped and the handle waited for ever).
async fn a_gap_read_once(read: fn(&Value) -> Value) {
    let reads = Arc::new(AtomicUsize::new(0));
    let r = reads.clone();
    let (url, mut seen) = fake_server(move |conn, v| match v["method"].as_str() {
        Some("initialize") => initialized(conn, v, 1 << 24),
        Some("process/start") => {
            let Act::Send(mut msgs) = started(v, 9) else {
                unreachable!()
            };
            msgs.push(
                json!({"jsonrpc": "2.0", "method": "process/outputDelta", "params": {
                "processId": "p", "seq": 3, "stream": "stdout", "chunk": "aGkK"}}),
            );
            Act::Send(msgs)
        }
        Some("process/read") => {
            r.fetch_add(1, Ordering::SeqCst);
            Act::Send(vec![read(v)])
        }
        _ => otherwise(v),
    })
    .await;
    let c = client(&url).await;
    let mut h = c.start(StartOptions::new("p", ["true"])).await.unwrap();
    within(async { while seen.recv().await.expect("the server runs").1 != "process/read" {} })
        .await;
    within(c.server_info()).await.unwrap();
    within(c.server_info()).await.unwrap();
    assert_eq!(reads.load(Ordering::SeqCst), 1);
    match within(h.next_event()).await {
        Some(ProcessEvent::Lost { from, to }) => assert_eq!((from, to), (1, 2)),
        other => panic!("expected the gap lost, got {other:?}"),
    }
    match within(h.next_event()).await {
        Some(ProcessEvent::Output { data, .. }) => assert_eq!(&data[..], b"hi\n"),
        other => panic!("expected the event after the gap, got {other:?}"),
    }
}

#[tokio::test]
async fn a_lost_range_that_does_not_move_ends_the_gaps_reads() {
    // The server says 0 to 0 is lost, which is nothing. Taken as it was, the same read went
    // again for ever.
    a_gap_read_once(|v| {
        json!({"jsonrpc": "2.0", "id": v["id"], "error": {
            "code": -32005, "message": "gone",
            "data": {"fromSeq": 1, "toSeq": v["params"]["afterSeq"]}}})
    })
    .await;
}

#[tokio::test]
async fn a_read_answered_with_nothing_past_what_was_asked_ends_the_gaps_reads() {
    // Answered with event 0 only (a server that takes `afterSeq` as inclusive, say): asked
    // again, the same answer, for ever. What it would not give is lost, said as such.
    a_gap_read_once(|v| {
        answer(
            v,
            json!({"events": [{"seq": v["params"]["afterSeq"],
                "type": "output", "stream": "stdout", "chunk": "aGkK"}],
                "nextSeq": 4, "running": true, "exited": false}),
        )
    })
    .await;
}

#[tokio::test]
async fn a_start_of_many_short_arguments_that_can_never_fit_is_given_up_at_once() {
    // 2,000 one-letter arguments: 8 KB of text, but the server charges each value 128 bytes
    // more (about 264 KB), over a 64 KiB budget for good. Counted by its text, it looked as if
    // it would fit once the budget emptied, and went again for a minute.
    let (url, mut seen) = fake_server(move |conn, v| match v["method"].as_str() {
        Some("initialize") => initialized(conn, v, 1 << 24),
        Some("process/start") => Act::Send(vec![json!({"jsonrpc": "2.0", "id": v["id"],
            "error": {"code": -32004, "message": "request budget full",
                "data": {"limit": "maxPendingRequestBytes", "value": 65536}}})]),
        _ => otherwise(v),
    })
    .await;
    let c = client(&url).await;
    let argv: Vec<String> = std::iter::once("true".to_string())
        .chain((0..2000).map(|_| "a".to_string()))
        .collect();
    let e = within(c.start(StartOptions::new("p", argv)))
        .await
        .err()
        .expect("refused");
    assert!(matches!(e, ClientError::Rpc { code: -32004, .. }), "{e}");
    assert_eq!(starts(&mut seen), [1], "reported at the first refusal");
}

/// As [`applied_then_refused`], with the lookup's first `process/list` refused for a limit too.
async fn applied_then_refused_and_list_refused_once() -> (String, mpsc::UnboundedReceiver<Seen>) {
    let lists = Arc::new(AtomicUsize::new(0));
    fake_server(move |conn, v| match (conn, v["method"].as_str()) {
        (_, Some("initialize")) => initialized(conn, v, 1 << 24),
        (1, Some("process/start")) => Act::Drop,
        (_, Some("process/start")) => refused(v),
        (_, Some("process/list")) if lists.fetch_add(1, Ordering::SeqCst) == 0 => refused(v),
        (_, Some("process/list")) => Act::Send(vec![answer(
            v,
            json!({"processes": [{"processId": "p", "pid": 4242, "argv": ["true"],
                "tty": false, "state": "running", "nextSeq": 1}]}),
        )]),
        _ => otherwise(v),
    })
    .await
}

#[tokio::test]
async fn a_start_from_a_lost_connection_waits_for_its_lookup_before_it_goes_again() {
    // The lookup refused says nothing: the start is not sent again until a lookup answers
    // (review S2: it went again at once, and would have run twice had the first ended).
    let (url, mut seen) = applied_then_refused_and_list_refused_once().await;
    let c = client(&url).await;
    let h = within(c.start(StartOptions::new("p", ["true"])))
        .await
        .expect("found started");
    assert_eq!(h.pid, 4242);
    assert_eq!(starts(&mut seen), [1, 2]);
}

#[tokio::test]
async fn a_start_from_a_lost_connection_is_looked_up_before_its_refusal_is_reported() {
    // Without retries the refusal is the answer, but not before the lookup (review S3): the
    // process the lost attempt started is running.
    let listed = json!({"processes": [{"processId": "p", "pid": 4242, "argv": ["true"],
        "tty": false, "state": "running", "nextSeq": 1}]});
    let (url, mut seen) = applied_then_refused(listed, vec![]).await;
    let opts = ClientOptions {
        write_retry_for: std::time::Duration::ZERO,
        ..ClientOptions::default()
    };
    let c = Client::connect(Target::Ws(url), opts).await.unwrap();
    let h = within(c.start(StartOptions::new("p", ["true"])))
        .await
        .expect("found started");
    assert_eq!(h.pid, 4242);
    assert_eq!(starts(&mut seen), [1, 2]);
}
