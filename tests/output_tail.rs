//! `outputCapKeep: "headAndTail"` (`protocol.md` §5): the first half of `outputBytesCap`
//! live, a `process/outputOmitted` event (its own seq) counting what fell between, then the
//! last half, all before the exit notice; `droppedBytes` counts the omitted bytes. Checked
//! byte for byte on 50 MB of output with a 1 MiB cap, on one connection and across a resume,
//! with the requests the server refuses.
//!
//! Over a real `ConnectionProcessor` in this process; every wait is on an event or bounded.

mod common;
use common::process::*;
use common::*;

use serde_json::{json, Value};

/// `seq 1 N` writes this many numbers: a little over 50 MB of text, every line different.
const LINES: &str = "6500000";
const CAP: usize = 1024 * 1024;
const HALF: usize = CAP / 2;

/// What `seq 1 LINES` writes, run here.
fn expected_output() -> Vec<u8> {
    let out = std::process::Command::new("seq")
        .args(["1", LINES])
        .output()
        .expect("run seq here");
    assert!(out.status.success());
    assert!(out.stdout.len() > 50_000_000, "{} bytes", out.stdout.len());
    out.stdout
}

fn start_params(id: &str) -> Value {
    json!({"processId": id, "argv": ["seq", "1", LINES],
           "outputBytesCap": CAP, "outputCapKeep": "headAndTail"})
}

/// The head, the omitted count, the tail and the exit notice of a 50 MB stream, checked.
fn check_head_and_tail(got: &Collected, all: &[u8]) {
    got.assert_seqs_contiguous();
    let total = all.len() as u64;
    let omitted = total - CAP as u64;
    assert_eq!(
        got.omitted,
        vec![("stdout".to_string(), omitted, HALF)],
        "one notice, after exactly the head"
    );
    assert_eq!(got.stdout.len(), CAP, "head and tail, nothing else");
    assert!(
        got.stdout[..HALF] == all[..HALF],
        "the first 512 KiB exactly"
    );
    assert!(
        got.stdout[HALF..] == all[all.len() - HALF..],
        "the last 512 KiB exactly"
    );
    assert!(got.stderr.is_empty());
    let e = &got.exit;
    assert_eq!(e["exitCode"], 0, "{e}");
    assert_eq!(e["reason"], "exited", "{e}");
    assert_eq!(e["stdoutBytes"], total, "{e}");
    assert_eq!(e["droppedBytes"], omitted, "{e}");
    assert_eq!(e["outputDrainTimedOut"], false, "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_megabytes_keep_their_first_and_last_half_megabyte() {
    let all = expected_output();
    let mut ip = connect().await;
    let (_, got) = run_checked(&mut ip.client, start_params("t")).await;
    check_head_and_tail(&got, &all);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_omitted_notice_and_the_tail_are_replayed_on_resume() {
    let all = expected_output();
    let mut ip = in_process(cfg(), 1 << 20);
    let init = ip.client.handshake().await;
    let (sid, token) = credentials(&init);
    start_checked(&mut ip.client, start_params("r")).await;
    // Some of the head on the first connection, then the connection is lost.
    let mut first = Collected::default();
    read_until(&mut ip.client, "r", &mut first, "some output", |a| {
        !a.stdout.is_empty()
    })
    .await;
    let registry = ip.registry.clone();
    let p = registry.session(&sid).unwrap().get("r").unwrap();
    ip.hang_up().await;
    // The rest is produced while detached (1 MiB is well within the retention).
    tokio::time::timeout(GUARD, p.wait_finished())
        .await
        .expect("the process ends while detached (hang guard)");
    let mut again = connect_to(&registry);
    again.client.resume(&sid, &token).await;
    // Without acks nothing was released (1 MiB is within the retention): the new connection
    // is sent the whole stream again from seq 1, the notice and the tail with their seqs.
    let replay = again.client.collect("r").await;
    assert!(
        replay.seqs.starts_with(&first.seqs),
        "the replay starts with what the first connection got"
    );
    assert!(replay.stdout.starts_with(&first.stdout));
    check_head_and_tail(&replay, &all);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_within_the_cap_arrives_whole_without_a_notice() {
    let mut ip = connect().await;
    let (_, got) = run_checked(
        &mut ip.client,
        json!({"processId": "s", "argv": ["sh", "-c", "printf 0123456789; printf abc >&2"],
               "outputBytesCap": 10, "outputCapKeep": "headAndTail"}),
    )
    .await;
    assert_eq!(got.stdout, b"0123456789");
    assert_eq!(got.stderr, b"abc");
    assert!(got.omitted.is_empty(), "{:?}", got.omitted);
    assert_eq!(got.exit["droppedBytes"], 0);
    // One byte over: the head is 5 bytes, the tail 5, one omitted, per stream.
    let (_, got) = run_checked(
        &mut ip.client,
        json!({"processId": "o", "argv": ["sh", "-c", "printf 0123456789X"],
               "outputBytesCap": 10, "outputCapKeep": "headAndTail"}),
    )
    .await;
    got.assert_seqs_contiguous();
    assert_eq!(got.stdout, b"012346789X");
    assert_eq!(got.omitted, vec![("stdout".to_string(), 1, 5)]);
    assert_eq!(got.exit["droppedBytes"], 1);
    assert_eq!(got.exit["stdoutBytes"], 11);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tail_without_a_cap_or_above_the_server_bound_is_refused() {
    let mut config = cfg();
    config.max_output_tail_bytes = 1000;
    let mut ip = ready_with(config).await;
    let c = &mut ip.client;
    let e = c
        .call_err(
            "process/start",
            json!({"processId": "a", "argv": ["true"], "outputCapKeep": "headAndTail"}),
        )
        .await;
    assert_eq!(e["code"], -32602, "{e}");
    assert_eq!(
        e["message"],
        "outputCapKeep \"headAndTail\" needs outputBytesCap"
    );
    // A 2000-byte cap keeps a 1000-byte tail: the most; 2002 keeps 1001.
    let (_, got) = run_checked(
        c,
        json!({"processId": "b", "argv": ["true"], "outputBytesCap": 2000,
               "outputCapKeep": "headAndTail"}),
    )
    .await;
    assert_eq!(got.exit["exitCode"], 0);
    let e = c
        .call_err(
            "process/start",
            json!({"processId": "c", "argv": ["true"], "outputBytesCap": 2002,
                   "outputCapKeep": "headAndTail"}),
        )
        .await;
    assert_eq!(e["code"], -32602, "{e}");
    assert_eq!(
        e["message"],
        "outputBytesCap 2002 with outputCapKeep \"headAndTail\" keeps a tail of 1001 bytes, above this server's max_output_tail_bytes (1000)"
    );
    let e = c
        .call_err(
            "process/start",
            json!({"processId": "d", "argv": ["true"], "outputBytesCap": 10,
                   "outputCapKeep": "middle"}),
        )
        .await;
    assert_eq!(e["code"], -32602, "{e}");
    assert!(list_entry(c, "c").await.is_none());
}
