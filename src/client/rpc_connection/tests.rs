//! The table of calls awaiting an answer, driven without a server: a transport whose sink
//! never takes a message, so the outbound queue fills and stays full.

use futures_util::FutureExt;
use tokio::sync::mpsc;

use super::*;
use crate::client::exclusive::ExclusiveCounts;

/// A connection over a transport that never sends and never receives.
fn stuck() -> RpcConnection {
    over(tokio::sync::Semaphore::new(0).into())
}

/// A connection whose transport takes one message per permit of `permits` and never answers.
fn over(permits: std::sync::Arc<tokio::sync::Semaphore>) -> RpcConnection {
    let outgoing = futures_util::sink::unfold(permits, |permits, _m: OutMessage| async move {
        match permits.acquire().await {
            Ok(p) => p.forget(),
            Err(_) => std::future::pending().await,
        }
        Ok::<_, std::io::Error>(permits)
    });
    let transport = Transport {
        incoming: Box::pin(futures_util::stream::pending()),
        outgoing: Box::pin(outgoing),
        peer: "stuck".into(),
        binary_messages: true,
        flow: None,
    };
    let (ntx, _nrx) = mpsc::unbounded_channel();
    RpcConnection::start_with(transport, ntx, None, None)
}

/// Fill the outbound queue: the writer holds one message, the queue the rest.
async fn fill(conn: &RpcConnection) {
    let mut sent = 0;
    loop {
        let note = conn.notify("process/ack", serde_json::json!({}));
        match note.now_or_never() {
            Some(r) => r.expect("queued"),
            None => break,
        }
        sent += 1;
        // The writer task takes the first message off the queue and blocks in the sink.
        tokio::task::yield_now().await;
        assert!(sent <= OUTBOUND_QUEUE + 1, "the queue never filled");
    }
}

/// A request dropped while it waits for room in the queue was never sent: it leaves no entry,
/// and its process's exclusive guard goes with it (review R1: it stayed until the connection
/// ended, and the silence watch never asked about that process again).
#[tokio::test]
async fn a_request_dropped_before_it_was_sent_takes_its_guard_with_it() {
    let conn = stuck();
    fill(&conn).await;
    let counts = std::sync::Arc::new(ExclusiveCounts::default());
    let data = bytes::Bytes::from_static(b"x");

    let held = ExclusiveInFlight::new(&counts);
    let write = conn.start_write_held("p", "w-1", &data, false, Some(held));
    assert!(write.now_or_never().is_none(), "waits for room");
    assert!(counts.idle(), "the unsent write's guard is gone");
    assert!(lock(&conn.pending).is_empty());

    let held = ExclusiveInFlight::new(&counts);
    let resize = conn.call_typed_held(
        Call::Resize(crate::rpc::messages::ResizeParams {
            process_id: "p".into(),
            rows: 5,
            cols: 5,
        }),
        Some(held),
    );
    assert!(resize.now_or_never().is_none(), "waits for room");
    assert!(counts.idle(), "the unsent resize's guard is gone");
    assert!(lock(&conn.pending).is_empty());
}

/// A request handed to the transport keeps its entry and guard when its caller stops
/// waiting: the server may hold it (a child not reading its stdin) until it answers.
#[tokio::test]
async fn a_request_sent_keeps_its_guard_after_its_caller_is_gone() {
    let conn = over(tokio::sync::Semaphore::new(1 << 20).into());
    let counts = std::sync::Arc::new(ExclusiveCounts::default());
    let data = bytes::Bytes::from_static(b"x");
    let held = ExclusiveInFlight::new(&counts);
    let call = conn
        .start_write_held("p", "w-1", &data, false, Some(held))
        .await
        .expect("sent");
    drop(call);
    assert!(!counts.idle(), "still counted: the server may hold it");
    assert_eq!(lock(&conn.pending).len(), 1);
}

/// A JSON write that closes stdin is followed by its own `process/closeStdin`: a caller that
/// stops waiting while that follow-up waits for room leaves the write, already on the wire,
/// counted (review S1: the guard of R1 took it out with the unsent follow-up).
#[tokio::test]
async fn a_write_sent_keeps_its_guard_while_its_close_waits_for_room() {
    let permits = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let conn = over(permits.clone());
    fill(&conn).await;
    let room = || match &conn.out {
        Out::Json(tx) => tx.capacity(),
        Out::Local { .. } => 0,
    };
    // Let the transport take a message: the writer frees a slot or two and waits again.
    permits.add_permits(1);
    let mut turns = 0;
    while room() == 0 || turns < 100 {
        tokio::task::yield_now().await;
        turns += 1;
        assert!(turns < 10_000, "the writer never took a message");
    }
    // Exactly one slot left: the write takes it, its follow-up finds none.
    while room() > 1 {
        let note = conn.notify("process/ack", serde_json::json!({}));
        note.now_or_never().expect("room").expect("queued");
    }
    let counts = std::sync::Arc::new(ExclusiveCounts::default());
    let ids_before = conn.next_id.load(Ordering::SeqCst);
    let writing = {
        let (conn, held) = (conn.clone(), ExclusiveInFlight::new(&counts));
        tokio::spawn(async move {
            let data = bytes::Bytes::from_static(b"x");
            conn.start_write_held("p", "w-1", &data, true, Some(held))
                .await
                .map(|_| ())
        })
    };
    let mut turns = 0;
    while conn.next_id.load(Ordering::SeqCst) < ids_before + 2 {
        tokio::task::yield_now().await;
        turns += 1;
        assert!(turns < 10_000, "the write never went out");
    }
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert_eq!(room(), 0);
    assert!(!writing.is_finished(), "the follow-up waits for room");
    writing.abort();
    assert!(writing.await.is_err_and(|e| e.is_cancelled()));
    assert!(!counts.idle(), "the write on the wire is still counted");
    assert_eq!(lock(&conn.pending).len(), 1);
}
