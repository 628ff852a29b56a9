//! A stream must never stop for good while its client reads: the regressions of the stall
//! seen after a reader paused under load, driven through a real server.
//!
//! The cause was a log that landed on its retention limit to the byte with every event
//! written (no acks): it neither released (only past the limit) nor admitted (only under it),
//! so its pump waited for room no one would make. Here the limit is one 4 KiB chunk, and the
//! child's first write is one atomic 4 KiB pipe write, read whole before the test lets the child
//! go on: the log is exactly full, deterministically.

mod common;
use common::*;

use execrelay::config::ServerConfig;
use execrelay::process::event_log::output_cost;
use serde_json::json;

/// Everything the client owes is paid (all written, no acks) while the log sits exactly at its
/// limit: the next output must still come.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_exactly_at_its_limit_with_everything_written_keeps_flowing() {
    let cfg = ServerConfig {
        retained_output_bytes: output_cost(4096),
        ..cfg()
    };
    let mut t = in_process(cfg, 1 << 20);
    let init = t.client.handshake().await;
    let sid = init["sessionId"].as_str().unwrap().to_string();
    // One write of 4096 bytes (atomic on a pipe: PIPE_BUF), then wait for stdin, then more.
    t.client
        .start(json!({
            "processId": "p",
            "argv": ["sh", "-c", "printf '%4096s' x; read go; echo done; read stop"],
            "pipeStdin": true,
        }))
        .await;
    let first = t.client.next_notification().await.expect("first delta");
    assert_eq!(first["method"], "process/outputDelta", "{first}");
    assert_eq!(
        unb64(first["params"]["chunk"].as_str().unwrap()).len(),
        4096
    );
    // The delta reached us, so it was written: the log holds exactly its limit, owed nothing.
    {
        let init_sid = "";
        let _ = init_sid;
    }
    let stats = t.registry.session(&sid).unwrap().get("p").unwrap().stats();
    // Exactly one 4 KiB event, written: the log reached its limit to the byte and is owed
    // nothing (before the fix it stayed there, full: retained 4160 of 4160).
    assert_eq!(
        (stats.next_seq, stats.written_through, stats.unwritten_bytes),
        (2, 1, 0),
        "{stats:?}"
    );
    t.client.write("p", b"go\n").await;
    let next = tokio::time::timeout(GUARD, t.client.next_notification())
        .await
        .expect("the output after a full, fully written log arrives (it stopped for good)")
        .expect("connection open");
    assert_eq!(next["method"], "process/outputDelta", "{next}");
    assert_eq!(unb64(next["params"]["chunk"].as_str().unwrap()), b"done\n");
    t.client.write("p", b"stop\n").await;
    let c = t.client.collect("p").await;
    assert_eq!(c.exit["exitCode"], 0, "{}", c.exit);
    assert_eq!(c.exit["outputDrainTimedOut"], false, "{}", c.exit);
}
