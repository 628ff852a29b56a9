//! The tokio driver over in-memory WebSockets (`tokio::io::duplex` +
//! `WebSocketStream::from_raw_socket`) with paused time: stalls stay per stream, keepalive and
//! write deadlines kill links, and a relay hub routes between real endpoint links.

// The sans-IO test helpers of the link engine's own tests (endpoints and routers on a clock).
#[path = "../../protocol/tests/common/mod.rs"]
mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::{cfg, relay_cfg, sid, ADDR};
use execrelay_io::driver::{
    link_websocket_config, recv_frame, send_frame, EndpointLink, Incoming, ReadAhead, RelayHub,
    StreamError, StreamHandle,
};
use execrelay_protocol::config::EndpointConfig;
use execrelay_protocol::frame::{Frame, FrameType, MAX_PAYLOAD_BYTES};
use execrelay_protocol::reason::CloseReason;
use execrelay_protocol::websocket::Role as WsRole;
use tokio::io::DuplexStream;
use tokio::time::{timeout, Instant};
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::WebSocketStream;

/// Hang guard on every wait (paused time: it only fires if the test would hang).
const GUARD: Duration = Duration::from_secs(600);

type Ws = WebSocketStream<ReadAhead<DuplexStream>>;

/// A connected pair: (client role, server role).
async fn ws_pair() -> (Ws, Ws) {
    let (a, b) = tokio::io::duplex(64 << 10);
    let c = Some(link_websocket_config());
    (
        WebSocketStream::from_raw_socket(ReadAhead::websocket(a, WsRole::Client), Role::Client, c)
            .await,
        WebSocketStream::from_raw_socket(ReadAhead::websocket(b, WsRole::Server), Role::Server, c)
            .await,
    )
}

fn record(stream: u8, n: u64) -> Bytes {
    Bytes::from(format!("stream {stream} record {n} ").repeat(50))
}

/// Accept `n` streams on `incoming`, in order.
fn acceptor(
    mut incoming: Incoming,
    n: usize,
) -> tokio::task::JoinHandle<(Vec<StreamHandle>, Incoming)> {
    tokio::spawn(async move {
        let mut v = Vec::new();
        for _ in 0..n {
            let req = incoming.next().await.expect("an OPEN");
            assert_eq!(&req.payload()[..], b"msg1");
            v.push(req.accept(Bytes::from_static(b"msg2")).expect("accepted"));
        }
        (v, incoming)
    })
}

/// Send `count` records on a stream, publishing how many were taken.
fn sender(
    mut s: execrelay_io::driver::StreamSender,
    id: u8,
    count: u64,
    sent: Arc<AtomicU64>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        for n in 1..=count {
            let seq = s.send(record(id, n)).await.expect("send");
            assert_eq!(seq, n);
            sent.store(n, Ordering::SeqCst);
        }
        // Keep the stream open until the test ends.
        std::future::pending::<()>().await;
    })
}

async fn expect_records(
    rx: &mut execrelay_io::driver::StreamReceiver,
    id: u8,
    range: std::ops::RangeInclusive<u64>,
) {
    for n in range {
        let (seq, p) = timeout(GUARD, rx.recv())
            .await
            .expect("hang")
            .expect("record");
        assert_eq!(seq, n, "stream {id}: in order, nothing lost or repeated");
        assert_eq!(p, record(id, n), "stream {id}: exact bytes");
    }
}

#[tokio::test(start_paused = true)]
async fn one_stalled_stream_does_not_stall_another() {
    let (cws, sws) = ws_pair().await;
    let (_server, incoming) = EndpointLink::spawn_server(sws, cfg()).unwrap();
    let client = EndpointLink::spawn_client(cws, cfg()).unwrap();
    let acc = acceptor(incoming, 2);
    let a = client
        .open(sid(1), Bytes::from_static(b"msg1"))
        .unwrap()
        .await
        .unwrap();
    let b = client
        .open(sid(2), Bytes::from_static(b"msg1"))
        .unwrap()
        .await
        .unwrap();
    assert_eq!(&a.payload[..], b"msg2");
    let (mut streams, _incoming) = acc.await.unwrap();
    let (_, b_tx) = streams.pop().unwrap().split();
    let (_, a_tx) = streams.pop().unwrap().split();

    let (sent_a, sent_b) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let _ta = sender(a_tx, 1, 64, sent_a.clone());
    let _tb = sender(b_tx, 2, 300, sent_b.clone());
    // The client reads B to the end while nobody reads A.
    let (mut b_rx, _b_tx) = b.stream.split();
    expect_records(&mut b_rx, 2, 1..=300).await;
    assert_eq!(sent_b.load(Ordering::SeqCst), 300);
    assert_eq!(
        sent_a.load(Ordering::SeqCst),
        16,
        "A is held at exactly its window"
    );
    // A reads now: every record arrives, and its sender is released.
    let (mut a_rx, _a_tx) = a.stream.split();
    expect_records(&mut a_rx, 1, 1..=64).await;
    assert_eq!(sent_a.load(Ordering::SeqCst), 64);
    assert_eq!(client.close_reason(), None);
}

#[tokio::test(start_paused = true)]
async fn a_peer_that_sends_but_never_answers_pings_is_dead_at_the_pong_timeout() {
    let (mut raw, sws) = ws_pair().await;
    let scfg = EndpointConfig {
        window: 64,
        ..cfg()
    };
    let (server, mut incoming) = EndpointLink::spawn_server(sws, scfg).unwrap();
    let t0 = Instant::now();
    // A hand-driven client: OPEN, read the ACCEPT, then only write, never read again (so its
    // WebSocket layer never sees, let alone answers, a ping).
    let mut open = Frame::new(FrameType::Open, sid(1), 0, Bytes::from_static(b"msg1"));
    open.window = 16;
    send_frame(&mut raw, &open, GUARD).await.unwrap();
    let req = timeout(GUARD, incoming.next()).await.unwrap().unwrap();
    let mut stream = req.accept(Bytes::from_static(b"msg2")).unwrap();
    let accept = recv_frame(&mut raw, GUARD).await.unwrap();
    assert_eq!(accept.ftype, FrameType::Accept);
    let received = Arc::new(AtomicU64::new(0));
    let r = received.clone();
    tokio::spawn(async move {
        while let Ok((seq, _)) = stream.receiver.recv().await {
            r.store(seq, Ordering::SeqCst);
        }
    });
    let writer = tokio::spawn(async move {
        for seq in 1..=60u64 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let f = Frame::new(FrameType::Data, sid(1), seq, Bytes::from_static(b"tick"));
            if send_frame(&mut raw, &f, GUARD).await.is_err() {
                break;
            }
        }
        raw
    });
    let reason = timeout(GUARD, server.closed()).await.unwrap();
    let elapsed = t0.elapsed();
    assert_eq!(reason, CloseReason::KeepaliveTimeout);
    // First ping at 15 s, unanswered: dead at 45 s.
    assert!(
        elapsed >= Duration::from_secs(45) && elapsed < Duration::from_secs(46),
        "{elapsed:?}"
    );
    assert!(
        received.load(Ordering::SeqCst) >= 44,
        "data flowed until the end"
    );
    drop(writer);
}

#[tokio::test(start_paused = true)]
async fn a_silent_link_whose_peer_answers_pings_lives_on() {
    let (cws, sws) = ws_pair().await;
    let (server, incoming) = EndpointLink::spawn_server(sws, cfg()).unwrap();
    let client = EndpointLink::spawn_client(cws, cfg()).unwrap();
    let acc = acceptor(incoming, 1);
    let a = client
        .open(sid(1), Bytes::from_static(b"msg1"))
        .unwrap()
        .await
        .unwrap();
    let (mut s, _incoming) = acc.await.unwrap();
    tokio::time::sleep(Duration::from_secs(4 * 15 + 5)).await;
    assert_eq!((client.close_reason(), server.close_reason()), (None, None));
    let (mut rx, _tx) = a.stream.split();
    s[0].sender.send(record(1, 1)).await.unwrap();
    expect_records(&mut rx, 1, 1..=1).await;
}

#[tokio::test(start_paused = true)]
async fn a_write_blocked_past_the_deadline_kills_the_link() {
    let (mut raw, sws) = ws_pair().await;
    let (server, mut incoming) = EndpointLink::spawn_server(sws, cfg()).unwrap();
    let t0 = Instant::now();
    let mut open = Frame::new(FrameType::Open, sid(1), 0, Bytes::from_static(b"msg1"));
    open.window = 16;
    send_frame(&mut raw, &open, GUARD).await.unwrap();
    let req = timeout(GUARD, incoming.next()).await.unwrap().unwrap();
    let stream = req.accept(Bytes::from_static(b"msg2")).unwrap();
    assert_eq!(
        recv_frame(&mut raw, GUARD).await.unwrap().ftype,
        FrameType::Accept
    );
    // The peer stops reading; a window of full records (1 MiB) cannot fit the pipe.
    let (_rx, mut tx) = stream.split();
    let big = Bytes::from(vec![5u8; MAX_PAYLOAD_BYTES]);
    for _ in 0..16 {
        tx.send(big.clone()).await.unwrap();
    }
    let reason = timeout(GUARD, server.closed()).await.unwrap();
    let elapsed = t0.elapsed();
    assert_eq!(reason, CloseReason::WriteTimeout);
    assert!(
        elapsed >= Duration::from_secs(30) && elapsed < Duration::from_secs(31),
        "{elapsed:?}"
    );
    assert!(matches!(
        tx.send(big).await,
        Err(StreamError::LinkClosed(CloseReason::WriteTimeout))
    ));
    drop(raw);
}

#[tokio::test(start_paused = true)]
async fn dropping_both_halves_finishes_the_stream_after_its_records() {
    let (cws, sws) = ws_pair().await;
    let (_server, incoming) = EndpointLink::spawn_server(sws, cfg()).unwrap();
    let client = EndpointLink::spawn_client(cws, cfg()).unwrap();
    let acc = acceptor(incoming, 1);
    let mut a = client
        .open(sid(1), Bytes::from_static(b"msg1"))
        .unwrap()
        .await
        .unwrap();
    let (mut s, _incoming) = acc.await.unwrap();
    a.stream.sender.send(record(1, 1)).await.unwrap();
    drop(a);
    let rx = &mut s[0].receiver;
    expect_records(rx, 1, 1..=1).await;
    let end = timeout(GUARD, rx.recv()).await.unwrap();
    assert_eq!(end, Err(StreamError::PeerReset("closed".into())));
    assert_eq!(client.stream_count(), 0);
}

/// A relay hub with one environment link and one client link, over in-memory WebSockets.
async fn relay_net() -> (RelayHub, EndpointLink, Incoming, EndpointLink) {
    relay_net_with(relay_cfg()).await
}

/// [`relay_net`] with the relay's settings `rcfg`.
async fn relay_net_with(
    rcfg: execrelay_protocol::config::RelayConfig,
) -> (RelayHub, EndpointLink, Incoming, EndpointLink) {
    let hub = RelayHub::new(rcfg).unwrap();
    let (env_ws, relay_env_ws) = ws_pair().await;
    let (client_ws, relay_client_ws) = ws_pair().await;
    let h = hub.clone();
    tokio::spawn(async move { h.serve_environment(relay_env_ws, "env1").await });
    let (env, incoming) = EndpointLink::spawn_server(env_ws, cfg()).unwrap();
    for _ in 0..100 {
        if hub.snapshot().environments == 1 {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(hub.snapshot().environments, 1);
    let h = hub.clone();
    tokio::spawn(async move { h.serve_client(relay_client_ws, "env1", ADDR).await });
    let client = EndpointLink::spawn_client(client_ws, cfg()).unwrap();
    (hub, env, incoming, client)
}

/// A record large enough that the relay forwards the message it came in as
/// (`KEEP_WIRE_FROM_BYTES`), distinct for each `n`.
fn big_record(n: u64) -> Bytes {
    Bytes::from(format!("{n:07} ").repeat(1200))
}

#[tokio::test(start_paused = true)]
async fn through_a_relay_hub_a_burst_of_large_records_and_the_end_arrive_whole_and_in_order() {
    assert!(big_record(1).len() >= execrelay_protocol::frame::KEEP_WIRE_FROM_BYTES);
    let (hub, _env, incoming, client) = relay_net().await;
    let acc = acceptor(incoming, 1);
    let a = client
        .open(sid(1), Bytes::from_static(b"msg1"))
        .unwrap()
        .await
        .unwrap();
    let (mut streams, _incoming) = acc.await.unwrap();
    let (env_rx, mut env_tx) = streams.pop().unwrap().split();
    // The environment sends as fast as the window lets it, then ends the stream: the relay's
    // reader takes these frames in batches, the RESET in the same batch as the last records.
    let sending = tokio::spawn(async move {
        for n in 1..=100 {
            env_tx.send(big_record(n)).await.expect("send");
        }
        drop(env_tx);
        drop(env_rx);
    });
    let (mut rx, _up) = a.stream.split();
    for n in 1..=100 {
        let (seq, p) = timeout(GUARD, rx.recv())
            .await
            .expect("hang")
            .expect("record");
        assert_eq!(seq, n, "in order, nothing lost or repeated");
        assert_eq!(p, big_record(n), "exact bytes");
    }
    let end = timeout(GUARD, rx.recv()).await.expect("hang");
    assert_eq!(end, Err(StreamError::PeerReset("closed".into())));
    timeout(GUARD, sending).await.expect("hang").unwrap();
    let c = hub.snapshot().counters;
    assert_eq!(c.data_bytes_in, c.data_bytes_out);
    assert_eq!(
        c.data_bytes_out,
        (1..=100).map(|n| big_record(n).len() as u64).sum::<u64>()
    );
}

#[tokio::test(start_paused = true)]
async fn through_a_relay_hub_a_stalled_stream_holds_back_only_its_sender() {
    let (hub, _env, incoming, client) = relay_net().await;
    let acc = acceptor(incoming, 2);
    let a = client
        .open(sid(1), Bytes::from_static(b"msg1"))
        .unwrap()
        .await
        .unwrap();
    let b = client
        .open(sid(2), Bytes::from_static(b"msg1"))
        .unwrap()
        .await
        .unwrap();
    let (mut streams, _incoming) = acc.await.unwrap();
    let (mut b_env_rx, b_tx) = streams.pop().unwrap().split();
    let (_, a_tx) = streams.pop().unwrap().split();
    let (sent_a, sent_b) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let _ta = sender(a_tx, 1, 40, sent_a.clone());
    let _tb = sender(b_tx, 2, 200, sent_b.clone());
    let (mut b_rx, mut b_up) = b.stream.split();
    expect_records(&mut b_rx, 2, 1..=200).await;
    assert_eq!(
        sent_a.load(Ordering::SeqCst),
        16,
        "A is held at its window, end to end"
    );
    assert!(hub.snapshot().queued_bytes <= 16 * (44 + record(1, 1).len()));
    // Upstream through the relay too.
    b_up.send(Bytes::from_static(b"stdin")).await.unwrap();
    let (seq, p) = timeout(GUARD, b_env_rx.recv()).await.unwrap().unwrap();
    assert_eq!((seq, &p[..]), (1, &b"stdin"[..]));
    let (mut a_rx, _a_up) = a.stream.split();
    expect_records(&mut a_rx, 1, 1..=40).await;
    let snap = hub.snapshot();
    assert_eq!((snap.links, snap.streams), (2, 2));
    assert_eq!(
        snap.counters
            .resets(execrelay_protocol::reason::Reason::WindowExceeded),
        0
    );
}

#[tokio::test(start_paused = true)]
async fn through_a_relay_hub_an_environment_link_death_resets_client_streams() {
    let (hub, env, incoming, client) = relay_net().await;
    let acc = acceptor(incoming, 1);
    let a = client
        .open(sid(1), Bytes::from_static(b"msg1"))
        .unwrap()
        .await
        .unwrap();
    let _streams = acc.await.unwrap();
    env.close();
    let (mut rx, _tx) = a.stream.split();
    let end = timeout(GUARD, rx.recv()).await.unwrap();
    assert_eq!(end, Err(StreamError::PeerReset("environment_gone".into())));
    let refused = client
        .open(sid(2), Bytes::from_static(b"msg1"))
        .unwrap()
        .await;
    assert_eq!(
        refused.err(),
        Some(StreamError::PeerReset("environment_offline".into()))
    );
    assert_eq!(hub.snapshot().environments, 0);
    assert_eq!(
        client.close_reason(),
        None,
        "the client link itself lives on"
    );
}

#[tokio::test(start_paused = true)]
async fn a_relay_hub_shutdown_closes_every_link() {
    let hub = RelayHub::new(relay_cfg()).unwrap();
    let (env_ws, relay_env_ws) = ws_pair().await;
    let (client_ws, relay_client_ws) = ws_pair().await;
    let h = hub.clone();
    let env_task = tokio::spawn(async move { h.serve_environment(relay_env_ws, "env1").await });
    let h = hub.clone();
    let client_task =
        tokio::spawn(async move { h.serve_client(relay_client_ws, "env1", ADDR).await });
    let (env, _incoming) = EndpointLink::spawn_server(env_ws, cfg()).unwrap();
    let client = EndpointLink::spawn_client(client_ws, cfg()).unwrap();
    for _ in 0..100 {
        if hub.snapshot().links == 2 {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(hub.snapshot().links, 2);
    hub.shutdown();
    let served = timeout(GUARD, async { (env_task.await, client_task.await) })
        .await
        .unwrap();
    assert!(matches!(
        served,
        (Ok(Ok(CloseReason::Local)), Ok(Ok(CloseReason::Local)))
    ));
    // The endpoints see their socket end.
    assert_eq!(
        timeout(GUARD, env.closed()).await.unwrap(),
        CloseReason::Transport
    );
    assert_eq!(
        timeout(GUARD, client.closed()).await.unwrap(),
        CloseReason::Transport
    );
    assert_eq!(hub.snapshot().links, 0);
}

/// A peer that goes silent (stopped: it neither sends nor answers pings) is dead at the
/// pong timeout too. The reader had no deadline while a ping waited for the writer and, with
/// no frame arriving, never looked again: the link lived forever.
#[tokio::test(start_paused = true)]
async fn a_silent_peer_that_never_answers_pings_is_dead_at_the_pong_timeout() {
    let (mut raw, sws) = ws_pair().await;
    let (server, mut incoming) = EndpointLink::spawn_server(sws, cfg()).unwrap();
    let t0 = Instant::now();
    let mut open = Frame::new(FrameType::Open, sid(1), 0, Bytes::from_static(b"msg1"));
    open.window = 16;
    send_frame(&mut raw, &open, GUARD).await.unwrap();
    let req = timeout(GUARD, incoming.next()).await.unwrap().unwrap();
    let _stream = req.accept(Bytes::from_static(b"msg2")).unwrap();
    // From here the peer does nothing at all (and keeps its socket open).
    let reason = timeout(GUARD, server.closed()).await.unwrap();
    let elapsed = t0.elapsed();
    assert_eq!(reason, CloseReason::KeepaliveTimeout);
    assert!(
        elapsed >= Duration::from_secs(45) && elapsed < Duration::from_secs(46),
        "first ping at 15 s, unanswered: dead at 45 s, not {elapsed:?}"
    );
    drop(raw);
}

/// A pending `OPEN` whose stream ends before it is answered: its request learns it at once
/// (`cancelled`), so authorization work can stop instead of waiting for the link to close;
/// and a late answer never touches a newer stream that reuses the id. Before `cancelled`,
/// a server's authorization of a reset stream ran until the link closed (one task and one
/// authorizer call per reset `OPEN`, beyond the pending-`OPEN` cap), and a late `accept`
/// of the old request answered the new `OPEN` with the old handshake's message 2.
#[tokio::test(start_paused = true)]
async fn a_pending_open_reset_by_the_peer_cancels_its_request_and_a_late_answer_is_a_no_op() {
    let (mut raw, sws) = ws_pair().await;
    let (server, mut incoming) = EndpointLink::spawn_server(sws, cfg()).unwrap();
    let mut open = Frame::new(FrameType::Open, sid(1), 0, Bytes::from_static(b"msg1"));
    open.window = 16;
    send_frame(&mut raw, &open, GUARD).await.unwrap();
    let mut old = timeout(GUARD, incoming.next()).await.unwrap().unwrap();
    // The peer gives up on it.
    send_frame(&mut raw, &Frame::reset(sid(1), "bye"), GUARD)
        .await
        .unwrap();
    timeout(GUARD, old.cancelled())
        .await
        .expect("the request learns its stream is gone");
    // Resolves again at once.
    timeout(Duration::from_millis(1), old.cancelled())
        .await
        .unwrap();
    // The same id again: a new request.
    let mut open2 = open.clone();
    open2.payload = Bytes::from_static(b"msg1 again");
    send_frame(&mut raw, &open2, GUARD).await.unwrap();
    let new = timeout(GUARD, incoming.next()).await.unwrap().unwrap();
    assert_eq!(&new.payload()[..], b"msg1 again");
    // The old request's late answer is refused and sends nothing.
    assert!(old.accept(Bytes::from_static(b"old msg2")).is_err());
    let _stream = new.accept(Bytes::from_static(b"new msg2")).unwrap();
    let f = recv_frame(&mut raw, GUARD).await.unwrap();
    assert_eq!(
        (f.ftype, f.stream, &f.payload[..]),
        (FrameType::Accept, sid(1), &b"new msg2"[..])
    );
    assert_eq!(server.stream_count(), 1);
    // A request dropped after its stream was replaced refuses nothing either.
    let mut open3 = open.clone();
    open3.stream = sid(2);
    send_frame(&mut raw, &open3, GUARD).await.unwrap();
    let third = timeout(GUARD, incoming.next()).await.unwrap().unwrap();
    send_frame(&mut raw, &Frame::reset(sid(2), "bye"), GUARD)
        .await
        .unwrap();
    send_frame(&mut raw, &open3, GUARD).await.unwrap();
    let fourth = timeout(GUARD, incoming.next()).await.unwrap().unwrap();
    drop(third);
    let _s4 = fourth.accept(Bytes::from_static(b"fourth")).unwrap();
    let f = recv_frame(&mut raw, GUARD).await.unwrap();
    assert_eq!(
        (f.ftype, f.stream, &f.payload[..]),
        (FrameType::Accept, sid(2), &b"fourth"[..])
    );
    // The link closing cancels a pending request too.
    let mut open5 = open.clone();
    open5.stream = sid(5);
    send_frame(&mut raw, &open5, GUARD).await.unwrap();
    let mut fifth = timeout(GUARD, incoming.next()).await.unwrap().unwrap();
    drop(raw);
    timeout(GUARD, fifth.cancelled()).await.unwrap();
}

/// The relay's side of a client link as its listener builds it: an in-memory pipe under a
/// read-ahead buffer whose arrivals are tracked, served by `hub` for `env1` from `ADDR`.
/// Returns the raw far end (the test writes WebSocket bytes by hand) and the link's task.
async fn tracked_client_link(
    hub: &RelayHub,
) -> (DuplexStream, tokio::task::JoinHandle<CloseReason>) {
    let (far, near) = tokio::io::duplex(64 << 10);
    let mut near = ReadAhead::websocket(near, WsRole::Server);
    let arrivals = near.arrivals();
    let ws =
        WebSocketStream::from_raw_socket(near, Role::Server, Some(link_websocket_config())).await;
    let link = hub.add_client("env1", ADDR).unwrap();
    let task = tokio::spawn(link.serve_with(ws, Some(arrivals)));
    (far, task)
}

/// A masked client-to-server WebSocket frame header (FIN, `opcode`) for a `len`-byte payload
/// (< 126), with a zero masking key (so the payload goes as it is).
fn ws_header(opcode: u8, len: u8) -> Vec<u8> {
    vec![0x80 | opcode, 0x80 | len, 0, 0, 0, 0]
}

/// Drain what the relay writes to `far` (its pings), so its writes never block.
fn drain_far(far: DuplexStream) -> tokio::io::WriteHalf<DuplexStream> {
    let (mut rd, wr) = tokio::io::split(far);
    tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        while matches!(tokio::io::AsyncReadExt::read(&mut rd, &mut buf).await, Ok(n) if n > 0) {}
    });
    wr
}

/// Finding 4, trickling: a client link that trickles one WebSocket message a byte every 3 s
/// (60 such links were alive after 30 s) is closed `message_timeout` at 10 s from the
/// message's first byte: not before, and without waiting for the keepalive (45 s). A
/// complete message in between starts the clock again.
#[tokio::test(start_paused = true)]
async fn a_client_link_trickling_one_message_is_closed_at_the_message_timeout() {
    use tokio::io::AsyncWriteExt;
    let hub = RelayHub::new(relay_cfg()).unwrap();
    let (far, task) = tracked_client_link(&hub).await;
    let mut w = drain_far(far);
    // A complete ping first, then 8 s later the first bytes of a 100-byte binary message.
    let mut ping = ws_header(0x9, 2);
    ping.extend_from_slice(b"hi");
    w.write_all(&ping).await.unwrap();
    tokio::time::sleep(Duration::from_secs(8)).await;
    let start = Instant::now();
    w.write_all(&ws_header(0x2, 100)).await.unwrap();
    let mut sent = 0;
    loop {
        tokio::time::sleep(Duration::from_secs(3)).await;
        if task.is_finished() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "not closed at 10 s"
        );
        w.write_all(&[0]).await.unwrap();
        sent += 1;
    }
    assert_eq!(sent, 3, "bytes at 3, 6 and 9 s; closed at 10 s");
    let reason = timeout(GUARD, task).await.unwrap().unwrap();
    assert_eq!(reason, CloseReason::MessageTimeout);
    assert_eq!(
        hub.snapshot().counters.closes(CloseReason::MessageTimeout),
        1
    );
}

/// A slow but steady peer is not a trickler: messages that each arrive within the deadline
/// (a 100-byte message over 9 s, then another) keep the link, however long it runs.
#[tokio::test(start_paused = true)]
async fn a_client_link_whose_messages_each_arrive_in_time_is_kept() {
    use tokio::io::AsyncWriteExt;
    let hub = RelayHub::new(relay_cfg()).unwrap();
    let (far, task) = tracked_client_link(&hub).await;
    let mut w = drain_far(far);
    for _ in 0..3 {
        // A ping of 100 bytes is not allowed (control frames ≤ 125): use 100 of them.
        w.write_all(&ws_header(0x9, 100)).await.unwrap();
        for _ in 0..10 {
            tokio::time::sleep(Duration::from_millis(900)).await;
            w.write_all(&[b'x'; 10]).await.unwrap();
        }
        assert!(!task.is_finished());
    }
    assert_eq!(hub.snapshot().links, 1, "alive after 27 s of slow messages");
    assert_eq!(
        hub.snapshot().counters.closes(CloseReason::MessageTimeout),
        0
    );
    drop(w);
    hub.shutdown();
    let reason = timeout(GUARD, task).await.unwrap().unwrap();
    assert_eq!(reason, CloseReason::Local);
}

/// Idleness through the driver: when a client link's last stream ends because its
/// environment went, its reader re-arms its timer at once (the router says so), and the link
/// is closed `idle` one timeout after the stream's end, not at its next keepalive event (an
/// idle timeout of 2 s, below the 15 s ping interval, shows the difference).
#[tokio::test(start_paused = true)]
async fn a_client_link_left_without_a_stream_is_closed_idle_one_timeout_after() {
    let idle = Duration::from_secs(2);
    let (hub, env, incoming, client) = relay_net_with(execrelay_protocol::config::RelayConfig {
        idle_link_timeout: idle,
        ..relay_cfg()
    })
    .await;
    let acc = acceptor(incoming, 1);
    let a = client
        .open(sid(1), Bytes::from_static(b"msg1"))
        .unwrap()
        .await
        .unwrap();
    let _accepted = acc.await.unwrap();
    // Long after the idle timeout, the link with a stream lives on.
    tokio::time::sleep(Duration::from_secs(40)).await;
    assert_eq!(client.close_reason(), None);
    env.close();
    let gone = Instant::now();
    let mut rx = a.stream.receiver;
    let end = timeout(GUARD, rx.recv()).await.unwrap();
    assert!(
        matches!(
            end,
            Err(StreamError::PeerReset(_) | StreamError::LinkClosed(_))
        ),
        "{end:?}"
    );
    timeout(GUARD, client.closed()).await.unwrap();
    let after = gone.elapsed();
    assert!(
        after >= idle && after < idle + Duration::from_secs(1),
        "{after:?}"
    );
    assert_eq!(hub.snapshot().counters.closes(CloseReason::Idle), 1);
}

/// A destination that stops reading holds back only its own route: its socket full, the
/// environment link's reader still forwards every record, in order, to a client on another
/// link that reads (no write to one destination may hold the reader that feeds others), and
/// the stalled client still gets every record it was sent, whole and in order, once it
/// reads again.
#[tokio::test(start_paused = true)]
async fn through_a_relay_hub_a_client_that_stops_reading_holds_back_only_its_route() {
    use execrelay_protocol::websocket::{Decoder, Message};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (hub, _env, incoming, fast) = relay_net().await;
    // The slow client: a raw link over a 1 KiB pipe; the test writes its OPEN by hand and
    // does not read it until the end.
    let (far, near) = tokio::io::duplex(1 << 10);
    let ws = WebSocketStream::from_raw_socket(
        ReadAhead::websocket(near, WsRole::Server),
        Role::Server,
        Some(link_websocket_config()),
    )
    .await;
    let link = hub.add_client("env1", ADDR).unwrap();
    let _slow_task = tokio::spawn(link.serve(ws));
    let (mut far_rd, mut far_wr) = tokio::io::split(far);
    let mut open = Frame::new(FrameType::Open, sid(2), 0, Bytes::from_static(b"msg1"));
    open.window = cfg().window;
    let open = open.encode().unwrap();
    let mut msg = ws_header(0x2, open.len() as u8);
    msg.extend_from_slice(&open);
    far_wr.write_all(&msg).await.unwrap();
    // The slow client's OPEN reaches the environment first, then the fast one's.
    let acc = acceptor(incoming, 2);
    timeout(GUARD, async {
        while hub.snapshot().streams < 1 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("hang");
    let b = fast
        .open(sid(3), Bytes::from_static(b"msg1"))
        .unwrap()
        .await
        .unwrap();
    let (mut streams, _incoming) = acc.await.unwrap();
    let (_b_env_rx, b_tx) = streams.pop().unwrap().split();
    let (_a_env_rx, a_tx) = streams.pop().unwrap().split();
    let window = cfg().window as u64;
    let (sent_a, sent_b) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let _ta = sender(a_tx, 2, window, sent_a.clone());
    let _tb = sender(b_tx, 3, 200, sent_b.clone());
    let (mut b_rx, _b_up) = b.stream.split();
    expect_records(&mut b_rx, 3, 1..=200).await;
    timeout(GUARD, async {
        while sent_a.load(Ordering::SeqCst) < window {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("hang");
    // Now the slow client reads: the ACCEPT, then every record, whole and in order.
    let mut d = Decoder::new(WsRole::Client, MAX_PAYLOAD_BYTES + 1024);
    let mut frames = Vec::new();
    while frames.len() < 1 + window as usize {
        let mut buf = [0u8; 4096];
        let n = timeout(GUARD, far_rd.read(&mut buf))
            .await
            .expect("hang")
            .unwrap();
        assert!(n > 0, "the slow client's link lives on");
        d.read_buffer().extend_from_slice(&buf[..n]);
        while let Some(m) = d.decode().unwrap() {
            match m {
                Message::Binary(b) => frames.push(Frame::decode_owned(b).unwrap()),
                Message::Ping(_) => {}
                other => panic!("unexpected {other:?}"),
            }
        }
    }
    assert_eq!(frames[0].ftype, FrameType::Accept);
    for (n, f) in frames[1..].iter().enumerate() {
        let n = n as u64 + 1;
        assert_eq!((f.ftype, f.seq), (FrameType::Data, n), "in order");
        assert_eq!(f.payload, record(2, n), "exact bytes");
    }
    let _ = far_wr;
}
