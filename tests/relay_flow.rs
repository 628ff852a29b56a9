//! Flow control end to end through the relay (`secure-transport.md` §7): a
//! client that stops reading while its process writes 200 MB, beside a second client on the
//! same environment. The second client completes a fixed amount while the first is stalled;
//! the first process is held back (its stream is never reset); the relay's and the exec
//! server's peak RSS stay within bounds far below what they carried; and when the first
//! client reads again it receives every byte.
//!
//! The relay and the exec server are the real binaries (their RSS is their own); the clients
//! are library streams in this process, so the test decides when one stops reading.

mod common;
use common::noise::{drain_binary, flow_stream, running, TransportRpc};
use common::noise_bin::keygen;
use common::relay::{BinEnv, BinRelay};
use common::GUARD;

use futures_util::StreamExt;
use serde_json::json;

use execrelay::link::client::{ClientLink, NoiseClientConfig};
use execrelay::noise::keys::{load_public, Keypair};
use execrelay::rpc::binary_output::{decode_output_message, is_binary_message};

/// What the first process writes (the number).
const BIG: u64 = 200_000_000;
/// What the second client must complete while the first is stalled.
const SMALL: u64 = 20_000_000;
/// Peak RSS the relay may reach carrying this: its queues hold at most one window (1 MiB)
/// per stream per direction, so anything near the bytes carried would be a leak.
const RELAY_RSS_BOUND_KIB: u64 = 64 << 10;
/// Peak RSS the exec server may reach: one held-back process keeps at most its delivery
/// queue and its retention (`delivery_queue_bytes` + `retained_output_bytes`, 9 MiB) plus a
/// window per stream; the rest is the server itself.
const SERVER_RSS_BOUND_KIB: u64 = 96 << 10;

fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .expect("VmHWM in /proc/PID/status")
}

/// A stream on a link of its own, initialized for binary output and acks.
async fn open(url: &str, cfg: NoiseClientConfig) -> TransportRpc {
    let link = ClientLink::connect(url, cfg).await.unwrap();
    flow_stream(&link).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_reader_holds_back_its_process_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let relay_keys = keygen(dir.path(), "relay").await;
    let server = keygen(dir.path(), "server").await;
    let (c1, c2) = (
        keygen(dir.path(), "c1").await,
        keygen(dir.path(), "c2").await,
    );
    let envs = dir.path().join("environments");
    std::fs::write(&envs, format!("env {}\n", server.public_line())).unwrap();
    let auth = dir.path().join("auth");
    std::fs::write(
        &auth,
        format!("{}\n{}\n", c1.public_line(), c2.public_line()),
    )
    .unwrap();
    let relay = BinRelay::start(
        &relay_keys.private,
        &envs,
        &[],
        &dir.path().join("relay.log"),
    )
    .await;
    let env = BinEnv::start(
        &relay.url,
        "env",
        &relay_keys.public,
        &server.private,
        &auth,
        &[],
        &dir.path().join("server.log"),
    )
    .await;
    let server_public = load_public(server.pubs()).unwrap();
    let cfg = |k: &common::noise_bin::Keys| {
        NoiseClientConfig::new(Keypair::load(&k.private).unwrap(), server_public)
    };

    // The first client starts 200 MB, reads the first output, then stops reading.
    let mut first = open(&env.client_url, cfg(&c1)).await;
    let start = json!({"processId": "big", "argv": ["head", "-c", BIG.to_string(), "/dev/zero"]});
    first.call("process/start", start).await;
    let m = tokio::time::timeout(GUARD, first.t.incoming.next())
        .await
        .expect("first output (hang guard)")
        .unwrap()
        .unwrap();
    assert!(is_binary_message(&m), "output first");
    let head = decode_output_message(m).unwrap().data.len() as u64;

    // The second client, on the same environment, completes a fixed amount meanwhile.
    let mut second = open(&env.client_url, cfg(&c2)).await;
    let start =
        json!({"processId": "small", "argv": ["head", "-c", SMALL.to_string(), "/dev/zero"]});
    second.call("process/start", start).await;
    let (got, exit) = drain_binary(&mut second, "small", 0).await;
    assert_eq!(got, SMALL);
    assert_eq!(exit["exitCode"], 0, "{exit}");

    // The first process is still there, held back: its output waits unread (200 MB fit in
    // none of the queues between it and its client).
    assert!(
        running(&["head", "-c", &BIG.to_string(), "/dev/zero"]),
        "the first process is held back, not finished or killed"
    );
    let relay_rss = peak_rss_kib(relay.pid());
    let server_rss = peak_rss_kib(env.pid());
    assert!(
        relay_rss < RELAY_RSS_BOUND_KIB,
        "relay peak RSS {relay_rss} KiB after carrying {} MB",
        (head + SMALL) / 1_000_000
    );
    assert!(
        server_rss < SERVER_RSS_BOUND_KIB,
        "server peak RSS {server_rss} KiB"
    );

    // Reading again, the first client gets every byte, then the exit notice.
    let (got, exit) = drain_binary(&mut first, "big", head).await;
    assert_eq!(got, BIG, "every byte of the held-back process");
    assert_eq!(exit["exitCode"], 0, "{exit}");
    assert_eq!(exit["stdoutBytes"], BIG, "{exit}");
    // Carrying 200 MB more did not grow either process past its bound.
    assert!(peak_rss_kib(relay.pid()) < RELAY_RSS_BOUND_KIB);
    assert!(peak_rss_kib(env.pid()) < SERVER_RSS_BOUND_KIB);
    drop(env);
    drop(relay);
}
