//! Idle timeouts, on tokio's paused clock: a `ws://` connection (or a Noise
//! stream) with no inbound message, no request in flight and no process of its session
//! running or with output left to write is closed after `idle_connection_timeout_ms`, and
//! never while a process runs; a Noise link that holds no stream is closed after
//! `idle_link_timeout_ms`, and never while a stream is open.

mod common;
use common::noise::*;
use common::*;

use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;

use execrelay::config::ServerConfig;
use execrelay::connection::{ConnectionEnd, ConnectionOptions};
use execrelay_protocol::frame::Frame;

const T: Duration = Duration::from_secs(10);

/// A connection with an idle timeout of [`T`], as the `ws://` listener makes them.
fn idle_connection() -> InProcess {
    let registry = new_registry(cfg());
    let opts = ConnectionOptions {
        idle_timeout: Some(T),
        peer_addr: Some("127.0.0.1".parse().unwrap()),
        ..ConnectionOptions::default()
    };
    in_process_with(registry, 1 << 20, opts)
}

#[tokio::test(start_paused = true)]
async fn an_idle_connection_is_closed_at_the_timeout_and_messages_defer_it() {
    let mut t = idle_connection();
    t.client.handshake().await;
    // A message every 0.6 T keeps it open well past T.
    for _ in 0..5 {
        tokio::time::sleep(T * 6 / 10).await;
        t.client.call("server/info", json!({})).await;
    }
    let last = Instant::now();
    let end = connection_end(t.end).await;
    assert_eq!(end, ConnectionEnd::Idle);
    let idle = last.elapsed();
    assert!(idle >= T && idle < T + Duration::from_secs(1), "{idle:?}");
    assert!(t.client.read_message().await.is_none(), "closed");
}

#[tokio::test(start_paused = true)]
async fn a_connection_that_never_initializes_is_closed_too() {
    let t = idle_connection();
    let start = Instant::now();
    assert_eq!(connection_end(t.end).await, ConnectionEnd::Idle);
    assert!(start.elapsed() >= T);
}

/// Runs on real time while the child process must do something (a paused clock would jump
/// ahead while the runtime waits for it), and on the paused clock to let timeouts pass.
#[tokio::test]
async fn a_running_process_keeps_its_connection_open() {
    let mut t = idle_connection();
    t.client.handshake().await;
    let pid = t
        .client
        .start(json!({"processId": "p", "argv": ["sleep", "1000"]}))
        .await["pid"]
        .clone();
    // Ten timeouts without a message: the process runs, so the connection stays.
    tokio::time::pause();
    tokio::time::sleep(T * 10).await;
    assert!(!t.end.is_finished(), "closed while its process runs");
    tokio::time::resume();
    // The process ends (not through the protocol): idleness starts once that is seen.
    kill_group(&pid);
    let done = t.client.collect("p").await;
    assert_eq!(done.exit["signal"], "SIGKILL");
    let exited = Instant::now();
    tokio::time::pause();
    assert_eq!(connection_end(t.end).await, ConnectionEnd::Idle);
    let idle = exited.elapsed();
    // At least one timeout after the end, at most a quarter later (the busy check).
    assert!(
        idle >= T && idle <= T * 5 / 4 + Duration::from_secs(1),
        "{idle:?}"
    );
}

/// A Noise server whose links close after [`T`] without a stream, whose streams close after
/// `stream_idle` idle, and whose keepalive never fires during a test.
async fn idle_noise(stream_idle: Duration) -> (execrelay::noise::keys::Keypair, TestServer) {
    let config = ServerConfig {
        idle_link_timeout_ms: T.as_millis() as u64,
        idle_connection_timeout_ms: stream_idle.as_millis() as u64,
        keepalive_interval_ms: 7 * 24 * 3600 * 1000,
        pong_timeout_ms: 14 * 24 * 3600 * 1000,
        ..ServerConfig::default()
    };
    let (key, _auth, srv) = serve_one(config).await;
    (key, srv)
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_link_without_a_stream_is_closed_at_the_timeout() {
    let (_key, srv) = idle_noise(Duration::from_secs(3600)).await;
    let start = Instant::now();
    let mut link = RawLink::connect(srv.port).await;
    assert!(
        link.until_closed().await.is_empty(),
        "closed without a frame"
    );
    let waited = start.elapsed();
    assert!(
        waited >= T && waited < T + Duration::from_secs(1),
        "{waited:?}"
    );
    srv.stop().await;
}

/// Frames are exchanged on real time (on a paused clock a frame the client writes after its
/// last read may wait for the next timer), and the timeouts pass on the paused clock.
#[tokio::test]
async fn a_link_with_a_stream_stays_and_is_closed_once_its_streams_are_gone() {
    let (key, srv) = idle_noise(Duration::from_secs(3600)).await;
    let mut link = RawLink::connect(srv.port).await;
    let mut st = link.open_ready(&key, &srv.keys.public).await;
    // Five timeouts with a stream open (and idle): the link stays.
    tokio::time::pause();
    tokio::time::sleep(T * 5).await;
    tokio::time::resume();
    link.assert_alive(&mut st).await;
    // The client resets its stream: the link holds nothing, and is closed one timeout later.
    link.send_frame(&Frame::reset(st.sid, "closed")).await;
    let reset = Instant::now();
    tokio::time::pause();
    link.until_closed().await;
    let waited = reset.elapsed();
    // (At most a busy check later, should the reset be seen only then.)
    assert!(
        waited >= T && waited <= T * 5 / 4 + Duration::from_secs(1),
        "{waited:?}"
    );
    srv.stop().await;
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_idle_stream_is_closed_and_then_its_link() {
    let stream_idle = T * 3;
    let (key, srv) = idle_noise(stream_idle).await;
    let mut link = RawLink::connect(srv.port).await;
    let mut st = link.open_ready(&key, &srv.keys.public).await;
    let opened = Instant::now();
    // The stream's connection ends for idleness: authenticated close, then RESET.
    match link.next_ev(&mut st).await {
        Ev::Close(_, reason) => assert_eq!(reason, "closed"),
        ev => panic!("expected the close record, got {ev:?}"),
    }
    link.expect_reset(&st.sid, "closed").await;
    let closed = opened.elapsed();
    assert!(
        closed >= stream_idle && closed < stream_idle + Duration::from_secs(1),
        "{closed:?}"
    );
    // Then the link, empty, one link timeout later.
    link.until_closed().await;
    let gone = opened.elapsed();
    assert!(
        gone >= stream_idle + T && gone < stream_idle + T + Duration::from_secs(1),
        "{gone:?}"
    );
    srv.stop().await;
}
