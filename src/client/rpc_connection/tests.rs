//! The table of calls awaiting an answer, driven without a server: a transport whose sink
//! never takes a message, so the outbound queue fills and stays full.

use futures_util::FutureExt;
use tokio::sync::mpsc;

use super::*;
use crate::client::exclusive::ExclusiveCounts;

/// A connection over a transport that never sends and never receives.
fn stuck() -> RpcConnection {
    let outgoing = futures_util::sink::unfold((), |(), _m: OutMessage| async {
        std::future::pending::<Result<(), std::io::Error>>().await
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
