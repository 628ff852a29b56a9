//! The soak's own parts (`benches/soak/`), tested where `cargo test` runs them: the seeded
//! stream every child writes and the check that finds a lost or repeated byte in it; the
//! fault proxy (bytes carried intact, a cut closes both sides, a half cut only the downstream
//! one, and the same seed gives every connection the same faults); and the verdict on a
//! finished process (complete, a byte short, a wrong status, a terminated prefix).

#[path = "../benches/soak/child.rs"]
#[allow(dead_code)]
mod child;
#[path = "../benches/soak/proxy.rs"]
#[allow(dead_code)]
mod proxy;
#[path = "../benches/soak/rng.rs"]
#[allow(dead_code)]
mod rng;
#[path = "../benches/soak/verify.rs"]
#[allow(dead_code)]
mod verify;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use execrelay::client::ProcessEvent;
use execrelay::rpc::messages::{ExitInfo, StreamName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use proxy::{FaultLog, FaultPlan, Proxy};
use rng::{stream_bytes, StreamCheck};
use verify::{check, Delivery, Expect, Kind};

/// Hang guard of every wait here.
const GUARD: Duration = Duration::from_secs(30);

#[test]
fn any_range_of_the_stream_is_the_same_bytes() {
    let mut whole = vec![0u8; 1000];
    stream_bytes(7, 0, &mut whole);
    for (off, len) in [(0, 1), (3, 17), (8, 8), (999, 1), (13, 500)] {
        let mut part = vec![0u8; len];
        stream_bytes(7, off as u64, &mut part);
        assert_eq!(part, whole[off..off + len]);
    }
    let mut other = vec![0u8; 1000];
    stream_bytes(8, 0, &mut other);
    assert_ne!(whole, other, "another seed, another stream");
}

#[test]
fn the_check_finds_a_lost_and_a_repeated_byte() {
    let mut whole = vec![0u8; 100];
    stream_bytes(3, 0, &mut whole);
    let mut ok = StreamCheck::new(3);
    ok.push(&whole[..40]);
    ok.push(&whole[40..]);
    assert_eq!((ok.matched, ok.diverged), (100, None));
    let mut lost = StreamCheck::new(3);
    lost.push(&whole[..40]);
    lost.push(&whole[41..]);
    assert_eq!(lost.diverged.map(|d| d.0), Some(40));
    let mut dup = StreamCheck::new(3);
    dup.push(&whole[..40]);
    dup.push(&whole[30..]);
    assert_eq!(dup.diverged.map(|d| d.0), Some(40));
    assert_eq!(dup.received(), 110);
}

// ---------------------------------------------------------------------------------------------
// The fault proxy.

const LOOPBACK: ([u8; 4], u16) = ([127, 0, 0, 1], 0);

/// A plan with only the kinds whose weight is given (cut, reset, half-cut, short stall, long
/// stall, delay, trickle), every `gap` on average.
fn plan(gap: Duration, weights: [u32; 7]) -> FaultPlan {
    let mut p = FaultPlan::new(gap, Duration::from_millis(200));
    p.weights = weights;
    p
}

/// An upstream that accepts one connection and hands it over.
async fn upstream() -> (SocketAddr, tokio::task::JoinHandle<TcpStream>) {
    let l = TcpListener::bind(SocketAddr::from(LOOPBACK)).await.unwrap();
    let addr = l.local_addr().unwrap();
    (
        addr,
        tokio::spawn(async move { l.accept().await.unwrap().0 }),
    )
}

async fn proxy(
    dir: &std::path::Path,
    name: &str,
    up: SocketAddr,
    seed: u64,
    plan: FaultPlan,
) -> (Proxy, Arc<FaultLog>) {
    let log = FaultLog::create(&dir.join(format!("{name}.log")), Instant::now()).unwrap();
    let p = Proxy::start(
        name,
        SocketAddr::from(LOOPBACK),
        up,
        seed,
        plan,
        log.clone(),
    )
    .await
    .unwrap();
    (p, log)
}

/// Read until the end of the stream (within the guard); what was read.
async fn read_to_end(s: &mut TcpStream) -> Vec<u8> {
    let mut v = Vec::new();
    tokio::time::timeout(GUARD, s.read_to_end(&mut v))
        .await
        .expect("the end of the stream (hang guard)")
        .ok();
    v
}

#[tokio::test]
async fn without_faults_every_byte_crosses_both_ways() {
    let dir = tempfile::tempdir().unwrap();
    let (up, accepted) = upstream().await;
    let never = plan(Duration::from_secs(100_000), [1, 0, 0, 0, 0, 0, 0]);
    let (p, _) = proxy(dir.path(), "pass", up, 1, never).await;
    let mut client = TcpStream::connect(p.addr).await.unwrap();
    let mut server = accepted.await.unwrap();
    let mut data = vec![0u8; 3 << 20];
    stream_bytes(11, 0, &mut data);
    let (to_server, to_client) = (data.clone(), data.clone());
    let send = tokio::spawn(async move {
        client.write_all(&to_server).await.unwrap();
        client.shutdown().await.unwrap();
        read_to_end(&mut client).await
    });
    let got = read_to_end(&mut server).await;
    assert!(
        got == data,
        "upstream got {} of {} bytes intact",
        got.len(),
        data.len()
    );
    server.write_all(&to_client).await.unwrap();
    server.shutdown().await.unwrap();
    let back = send.await.unwrap();
    assert!(
        back == data,
        "downstream got {} of {} bytes intact",
        back.len(),
        data.len()
    );
    assert_eq!(p.bytes(), 2 * data.len() as u64);
}

#[tokio::test]
async fn a_cut_closes_both_sides() {
    let dir = tempfile::tempdir().unwrap();
    let (up, accepted) = upstream().await;
    let cut = plan(Duration::from_millis(5), [1, 0, 0, 0, 0, 0, 0]);
    let (p, log) = proxy(dir.path(), "cut", up, 2, cut).await;
    let mut client = TcpStream::connect(p.addr).await.unwrap();
    let mut server = accepted.await.unwrap();
    read_to_end(&mut client).await;
    read_to_end(&mut server).await;
    assert_eq!(log.counts().get("cut"), Some(&1));
    assert!(
        p.quiet_since().unwrap().is_some(),
        "a cut disturbs the path"
    );
}

#[tokio::test]
async fn a_half_cut_leaves_the_upstream_side_open_until_its_peer_closes() {
    let dir = tempfile::tempdir().unwrap();
    let (up, accepted) = upstream().await;
    let half = plan(Duration::from_millis(5), [0, 0, 1, 0, 0, 0, 0]);
    let (p, log) = proxy(dir.path(), "half", up, 3, half).await;
    let mut client = TcpStream::connect(p.addr).await.unwrap();
    let mut server = accepted.await.unwrap();
    read_to_end(&mut client).await;
    // The upstream side is still open: what it sends is taken and dropped, and it sees its
    // end only after it closes its own side.
    server.write_all(b"anyone there?").await.unwrap();
    server.shutdown().await.unwrap();
    assert_eq!(read_to_end(&mut server).await, b"");
    log.flush();
    let text = std::fs::read_to_string(dir.path().join("half.log")).unwrap();
    let half_at = text.find("half-cut").expect("logged");
    let closed_at = text.find("half-cut upstream closed").unwrap_or(usize::MAX);
    assert!(half_at < closed_at, "{text}");
    assert_eq!(log.counts().get("half-cut"), Some(&1));
}

/// The faults of one connection, without their times.
fn faults_of(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| l.contains(" conn=0 ") && !l.ends_with("closed"))
        .map(|l| {
            l.split_once(' ')
                .map(|(_, r)| r.to_string())
                .unwrap_or_default()
        })
        .collect()
}

/// Connection 0 of a proxy named `name` seeded `seed`, until it logged `n` faults.
async fn schedule(dir: &std::path::Path, name: &str, seed: u64, n: usize) -> Vec<String> {
    let (up, accepted) = upstream().await;
    // Short stalls, delays and trickles only: none of them ends the connection.
    let mut p = plan(Duration::from_millis(2), [0, 0, 0, 1, 0, 1, 1]);
    p.pong_timeout = Duration::from_millis(10);
    p.spell_ms = (1, 5);
    p.latency_ms = (1, 3);
    let file = format!("{name}-{seed}");
    let (px, log) = proxy(dir, name, up, seed, p).await;
    let _client = TcpStream::connect(px.addr).await.unwrap();
    let _server = accepted.await.unwrap();
    let deadline = tokio::time::Instant::now() + GUARD;
    loop {
        log.flush();
        let text = std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default();
        let f = faults_of(&text);
        if f.len() >= n {
            std::fs::rename(dir.join(format!("{name}.log")), dir.join(file)).unwrap();
            px.shutdown();
            return f[..n].to_vec();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{n} faults (hang guard)"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn the_same_seed_gives_a_connection_the_same_faults() {
    let dir = tempfile::tempdir().unwrap();
    let a = schedule(dir.path(), "replay", 7, 12).await;
    let b = schedule(dir.path(), "replay", 7, 12).await;
    let c = schedule(dir.path(), "replay", 8, 12).await;
    assert_eq!(a, b, "a replay");
    assert_ne!(a, c, "another seed");
    for kind in ["stall-short", "delay", "trickle"] {
        assert!(a.iter().any(|l| l.contains(kind)), "{kind} in {a:?}");
    }
}

#[tokio::test]
async fn the_proxy_serves_loopback_only() {
    let dir = tempfile::tempdir().unwrap();
    let log = FaultLog::create(&dir.path().join("l.log"), Instant::now()).unwrap();
    let never = plan(Duration::from_secs(100), [1, 0, 0, 0, 0, 0, 0]);
    let err = Proxy::start(
        "wide",
        SocketAddr::from(([0, 0, 0, 0], 0)),
        SocketAddr::from(([127, 0, 0, 1], 9)),
        1,
        never,
        log,
    )
    .await
    .err()
    .expect("refused");
    assert!(err.to_string().contains("loopback only"), "{err}");
}

// ---------------------------------------------------------------------------------------------
// The verdict on a finished process.

fn info(stdout: u64, stderr: u64, code: Option<i32>, signal: Option<&str>) -> ExitInfo {
    serde_json::from_value(serde_json::json!({
        "exitCode": code,
        "signal": signal,
        "timedOut": false,
        "outputDrainTimedOut": false,
        "stdoutBytes": stdout,
        "stderrBytes": stderr,
        "droppedBytes": 0,
        "durationMs": 1,
    }))
    .unwrap()
}

/// The notice of a process its client terminated (every notice carries a `reason`; without
/// one in the JSON it reads `exited`).
fn terminated(mut info: ExitInfo) -> ExitInfo {
    info.reason = execrelay::rpc::messages::ExitReason::Terminated;
    info
}

fn expect(kind: Kind, bytes: u64, stdin: Option<(u64, u64)>, counts_term: bool) -> Expect {
    Expect {
        kind,
        seed: 5,
        bytes,
        stdin,
        exit: 3,
        pty: false,
        counts_term,
    }
}

fn out(seed: u64, from: u64, len: usize) -> ProcessEvent {
    let mut v = vec![0u8; len];
    stream_bytes(seed, from, &mut v);
    ProcessEvent::Output {
        stream: StreamName::Stdout,
        data: Bytes::from(v),
    }
}

fn err(text: &str) -> ProcessEvent {
    ProcessEvent::Output {
        stream: StreamName::Stderr,
        data: Bytes::from(text.as_bytes().to_vec()),
    }
}

#[test]
fn a_complete_process_passes_and_a_missing_byte_fails() {
    let trailer = child::stdin_trailer(10, &verify::stream_hash(9, 10));
    let mut d = Delivery::new(expect(Kind::Plain, 1000, Some((9, 10)), false));
    d.event(&out(5, 0, 600));
    d.event(&out(5, 600, 400));
    d.event(&err(&trailer));
    d.event(&ProcessEvent::Exited(info(
        1000,
        trailer.len() as u64,
        Some(3),
        None,
    )));
    let v = check(&d, false);
    assert!(v.problems.is_empty(), "{:?}", v.problems);

    let mut short = Delivery::new(expect(Kind::Plain, 1000, None, false));
    short.event(&out(5, 0, 600));
    short.event(&out(5, 601, 399));
    short.event(&ProcessEvent::Exited(info(1000, 0, Some(3), None)));
    let v = check(&short, false);
    assert_eq!(v.lost, 1);
    assert!(
        v.problems.iter().any(|p| p.contains("differs")),
        "{:?}",
        v.problems
    );
}

#[test]
fn a_wrong_status_or_a_second_notice_fails() {
    let mut d = Delivery::new(expect(Kind::Plain, 10, None, false));
    d.event(&out(5, 0, 10));
    d.event(&ProcessEvent::Exited(info(10, 0, Some(0), None)));
    d.event(&ProcessEvent::Exited(info(10, 0, Some(0), None)));
    let v = check(&d, false);
    assert!(
        v.problems.iter().any(|p| p.contains("expected exit 3")),
        "{:?}",
        v.problems
    );
    assert!(
        v.problems.iter().any(|p| p.contains("2 exit notices")),
        "{:?}",
        v.problems
    );
}

#[test]
fn a_terminated_process_owes_the_prefix_it_wrote() {
    // It counted SIGTERM: `term K` with K the bytes that arrived.
    let mut d = Delivery::new(expect(Kind::Terminated, 1 << 20, None, true));
    d.event(&out(5, 0, 5000));
    d.event(&err("term 5000\n"));
    d.event(&ProcessEvent::Exited(terminated(info(
        5000,
        10,
        Some(143),
        None,
    ))));
    let v = check(&d, true);
    assert!(v.problems.is_empty(), "{:?}", v.problems);
    // It says it wrote more than arrived.
    let mut d = Delivery::new(expect(Kind::Terminated, 1 << 20, None, true));
    d.event(&out(5, 0, 5000));
    d.event(&err("term 6000\n"));
    d.event(&ProcessEvent::Exited(terminated(info(
        5000,
        10,
        Some(143),
        None,
    ))));
    let v = check(&d, true);
    assert_eq!(v.lost, 1000, "{:?}", v.problems);
    // Died of SIGTERM.
    let mut d = Delivery::new(expect(Kind::Terminated, 1 << 20, None, false));
    d.event(&out(5, 0, 7000));
    d.event(&ProcessEvent::Exited(terminated(info(
        7000,
        0,
        None,
        Some("SIGTERM"),
    ))));
    assert!(check(&d, true).problems.is_empty());
}
