//! Flow control on the direct `noise+ws://` listener (`secure-transport.md` §7,
//! on the direct listener too): one client link, two streams. The first stream's reader
//! stops while its process writes far more than every buffer between them; the second stream,
//! on the same link, completes a fixed amount meanwhile; the first process is held back (still
//! running, its stream never reset); when the first reader reads again it receives every
//! byte. `tests/relay_flow.rs` is the same through a relay, with the 200 MB.
//!
//! Every wait is on a message or an exit notice, bounded by a hang guard.

mod common;
use common::noise::{drain_binary, flow_stream, running, serve_one};
use common::GUARD;

use futures_util::StreamExt;
use serde_json::json;

use execrelay::config::ServerConfig;
use execrelay::link::client::{ClientLink, NoiseClientConfig};
use execrelay::rpc::binary_output::{decode_output_message, is_binary_message};

/// What the held-back process writes: more than three times what the buffers between it and
/// its reader hold (its delivery queue and retention, 9 MiB; a window, 1 MiB; the link's
/// send queue, 2 MiB; a pipe), so it cannot finish while its reader does not read. An odd
/// size so that its argv is this test's own.
const BIG: u64 = 40_000_001;
/// What the second stream completes while the first is stalled.
const SMALL: u64 = 4_000_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_stream_holds_back_its_process_and_not_its_link() {
    let (key, _auth, srv) = serve_one(ServerConfig::default()).await;
    let cfg = NoiseClientConfig::new(key.clone(), srv.keys.public);
    let link = ClientLink::connect(&srv.url, cfg).await.unwrap();

    // The first stream starts the big process, reads its first output, then stops reading.
    let mut first = flow_stream(&link).await;
    let big = BIG.to_string();
    let argv = ["head", "-c", big.as_str(), "/dev/zero"];
    first
        .call("process/start", json!({"processId": "big", "argv": argv}))
        .await;
    let m = tokio::time::timeout(GUARD, first.t.incoming.next())
        .await
        .expect("first output (hang guard)")
        .unwrap()
        .unwrap();
    assert!(is_binary_message(&m), "output first");
    let head = decode_output_message(m).unwrap().data.len() as u64;

    // The second stream, on the same link, completes a fixed amount meanwhile.
    let mut second = flow_stream(&link).await;
    let small = SMALL.to_string();
    let start = json!({"processId": "small", "argv": ["head", "-c", small, "/dev/zero"]});
    second.call("process/start", start).await;
    let (got, exit) = drain_binary(&mut second, "small", 0).await;
    assert_eq!(got, SMALL);
    assert_eq!(exit["exitCode"], 0, "{exit}");

    // The first process cannot have finished: its output waits unread.
    assert!(
        running(&argv),
        "the first process is held back, not finished or killed"
    );

    // Reading again, the first stream gets every byte, then the exit notice.
    let (got, exit) = drain_binary(&mut first, "big", head).await;
    assert_eq!(got, BIG, "every byte of the held-back process");
    assert_eq!(exit["exitCode"], 0, "{exit}");
    assert_eq!(exit["stdoutBytes"], BIG, "{exit}");
    srv.stop().await;
}
