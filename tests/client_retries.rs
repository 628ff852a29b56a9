//! A control request the client library sends again after a reconnect may find its process
//! gone: the first attempt was applied, the process exited, the application took its exit
//! notice (so the server released it), and only the answer was lost with the link. The repeat
//! is then answered `-32001 unknown process`; the library answers what the server says of an
//! exited process instead of failing a request that did its work (found by the soak: a
//! `closeStdin` whose answer was lost in a connection break failed a run that had worked).
//!
//! A fake server makes the race exact: on its first connection it takes the request and drops
//! the connection unanswered; on the resumed one it answers the repeat `-32001`.

mod common;
use common::fake_server::{answer, fake_server as scripted, initialized, Act};
use common::GUARD;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use execrelay::client::{Client, ClientError, ClientOptions, StartOptions, StdinRefused, Target};
use execrelay::rpc::messages::TermSize;
use serde_json::json;

/// A server that answers `initialize` (fresh or resumed) and `process/start`; the first
/// `method` request on the first connection drops that connection unanswered (unless
/// `first_attempt_unknown`), and every other one is answered `-32001`. Counts the `method`
/// requests it saw.
async fn fake_server(
    method: &'static str,
    first_attempt_unknown: bool,
) -> (String, Arc<AtomicUsize>) {
    let seen = Arc::new(AtomicUsize::new(0));
    let seen2 = seen.clone();
    let (url, _requests) = scripted(move |conn, v| match v["method"].as_str() {
        Some("initialize") => initialized(conn, v, 16 << 20),
        Some("process/start") => Act::Send(vec![answer(v, json!({"processId": "p", "pid": 1}))]),
        Some(m) if m == method => {
            seen2.fetch_add(1, Ordering::SeqCst);
            if conn == 1 && !first_attempt_unknown {
                // Applied, and the answer lost with the link.
                return Act::Drop;
            }
            Act::Send(vec![json!({"jsonrpc": "2.0", "id": v["id"], "error": {
                "code": -32001, "message": "unknown process id \"p\""}})])
        }
        _ => Act::Send(vec![]),
    })
    .await;
    (url, seen)
}

async fn client(url: &str) -> Client {
    Client::connect(Target::Ws(url.to_string()), ClientOptions::default())
        .await
        .unwrap()
}

async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(GUARD, f).await.expect("hang guard")
}

#[tokio::test]
async fn a_repeated_close_stdin_that_finds_the_process_gone_succeeds() {
    let (url, seen) = fake_server("process/closeStdin", false).await;
    let c = client(&url).await;
    let h = c.start(StartOptions::new("p", ["cat"])).await.unwrap();
    within(h.close_stdin())
        .await
        .expect("the first attempt did its work");
    assert_eq!(
        seen.load(Ordering::SeqCst),
        2,
        "sent, then sent again after the resume"
    );
    assert_eq!(c.connection_count(), 2);
}

#[tokio::test]
async fn repeated_signal_resize_terminate_and_write_answer_as_for_an_exited_process() {
    for method in [
        "process/signal",
        "process/resize",
        "process/terminate",
        "process/write",
    ] {
        let (url, seen) = fake_server(method, false).await;
        let c = client(&url).await;
        let mut h = c.start(StartOptions::new("p", ["cat"])).await.unwrap();
        match method {
            "process/signal" => within(h.signal("SIGINT")).await.unwrap(),
            "process/resize" => within(h.resize(TermSize { rows: 5, cols: 5 }))
                .await
                .unwrap(),
            "process/terminate" => assert!(!within(h.terminate(None)).await.unwrap()),
            _ => assert_eq!(within(h.write(b"x")).await.unwrap(), "exited"),
        }
        assert_eq!(seen.load(Ordering::SeqCst), 2, "{method}");
    }
}

#[tokio::test]
async fn a_pipelined_write_repeated_into_a_gone_process_is_exited() {
    let (url, _) = fake_server("process/write", false).await;
    let c = client(&url).await;
    let h = c.start(StartOptions::new("p", ["cat"])).await.unwrap();
    let mut w = h.stdin_writer();
    let r = within(async {
        w.write(Bytes::from_static(b"data")).await?;
        w.flush().await
    })
    .await;
    match r {
        Err(StdinRefused::Status(s)) => assert_eq!(s, "exited"),
        other => panic!("expected `exited`, got {other:?}"),
    }
}

/// Not a repeat: an unknown process on the first attempt is still the server's error.
#[tokio::test]
async fn an_unknown_process_on_the_first_attempt_is_still_an_error() {
    let (url, seen) = fake_server("process/signal", true).await;
    let c = client(&url).await;
    let h = c.start(StartOptions::new("p", ["cat"])).await.unwrap();
    match within(h.signal("SIGINT")).await {
        Err(ClientError::Rpc { code: -32001, .. }) => {}
        other => panic!("expected -32001, got {other:?}"),
    }
    assert_eq!(seen.load(Ordering::SeqCst), 1);
}
