//! The reading half against a peer that writes raw frames: reads of any size, the peer's
//! control frames, broken rules, and the memory it holds.

use std::time::Duration;

use bytes::Bytes;
use execrelay_io::driver::ReadAhead;
use execrelay_io::http::{DataOpcode, FrameQueue};
use execrelay_protocol::websocket::{apply_mask, encode_header, Opcode, Role, MAX_HEADER_BYTES};
use futures_util::{FutureExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio_tungstenite::tungstenite::protocol::Role as TungsteniteRole;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use super::super::websocket::split;
use super::super::ws_keepalive::WsSink;
use super::*;

/// Upper bound on any single awaited step, so a regression fails instead of hanging. It is
/// a guard, never a means of synchronisation.
const STEP_GUARD: Duration = Duration::from_secs(10);

async fn step<T>(future: impl Future<Output = T>) -> T {
    tokio::time::timeout(STEP_GUARD, future)
        .await
        .expect("test step did not finish in time")
}

const MASK: [u8; 4] = [0x12, 0x34, 0x56, 0x78];

/// One whole frame as a peer writes it: masked with `mask`, or not.
fn frame(op: Opcode, payload: &[u8], mask: Option<[u8; 4]>) -> Vec<u8> {
    let mut h = [0u8; MAX_HEADER_BYTES];
    let n = encode_header(&mut h, op, payload.len(), mask);
    let mut out = h[..n].to_vec();
    let start = out.len();
    out.extend_from_slice(payload);
    if let Some(m) = mask {
        apply_mask(&mut out[start..], m);
    }
    out
}

type ServerSide = ReadAhead<FrameQueue<DuplexStream>>;

/// The server's two halves over an in-memory pipe of `pipe` bytes, as the HTTP front builds
/// them, and the client's raw end.
async fn server(
    pipe: usize,
    limit: usize,
) -> (WsSink<ServerSide>, WsStream<ServerSide>, DuplexStream) {
    let (ours, peer) = tokio::io::duplex(pipe);
    let ws = WebSocketStream::from_raw_socket(
        ReadAhead::new(FrameQueue::new(ours)),
        TungsteniteRole::Server,
        None,
    )
    .await;
    let (sink, stream) = split(ws, Role::Server, limit, None);
    (sink, stream, peer)
}

/// The server's (unmasked) frames in `bytes`, as (opcode bits, payload).
fn server_frames(mut bytes: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        assert_eq!(bytes[1] & 0x80, 0, "a server frame is masked");
        let (len, at) = match bytes[1] & 0x7f {
            126 => (u16::from_be_bytes([bytes[2], bytes[3]]) as usize, 4),
            127 => (
                u64::from_be_bytes(bytes[2..10].try_into().unwrap()) as usize,
                10,
            ),
            n => (n as usize, 2),
        };
        out.push((bytes[0] & 0x0f, bytes[at..at + len].to_vec()));
        bytes = &bytes[at + len..];
    }
    out
}

/// Messages that arrive in pieces of every size, several per write or one spread over many
/// reads (a text larger than one read of the socket), come out whole and in order.
#[tokio::test]
async fn messages_in_pieces_of_any_size_come_out_whole_and_in_order() {
    let (_sink, mut stream, mut peer) = server(4096, 1 << 20).await;
    let big: Vec<u8> = (0..300_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    let mut wire = Vec::new();
    wire.extend(frame(Opcode::Text, b"one", Some(MASK)));
    wire.extend(frame(Opcode::Binary, &[0, 0xff, 7], Some(MASK)));
    wire.extend(frame(Opcode::Text, &big, Some(MASK)));
    wire.extend(frame(Opcode::Binary, b"", Some(MASK)));
    let writer = tokio::spawn(async move {
        // Odd piece sizes, so headers and payloads split everywhere.
        for piece in wire.chunks(1021) {
            peer.write_all(piece).await.expect("write");
        }
        peer
    });
    let mut got = Vec::new();
    for _ in 0..4 {
        got.push(
            step(stream.next())
                .await
                .expect("a message")
                .expect("framed"),
        );
    }
    assert_eq!(got[0], &b"one"[..]);
    assert_eq!(got[1], &[0, 0xff, 7][..]);
    assert_eq!(got[2], &big[..]);
    assert!(got[3].is_empty());
    let _peer = step(writer).await.expect("writer");
}

/// Once every byte has been handed on and the socket has nothing more, the reading half
/// holds no read buffer: an idle connection costs no read memory.
#[tokio::test]
async fn an_idle_connection_holds_no_read_buffer() {
    let (_sink, mut stream, mut peer) = server(1 << 20, 1 << 20).await;
    peer.write_all(&frame(Opcode::Binary, &[9u8; 50_000], Some(MASK)))
        .await
        .expect("write");
    let got = step(stream.next())
        .await
        .expect("a message")
        .expect("framed");
    assert_eq!(got.len(), 50_000);
    drop(got);
    // Nothing more to read: the poll waits, and the buffer is gone.
    assert!(stream.next().now_or_never().is_none());
    assert_eq!(stream.decoder.buffered(), 0);
    assert_eq!(stream.decoder.read_buffer().capacity(), 0);
}

/// A frame whose header declares more than the limit is refused from the header, before its
/// payload arrives (nothing of it is buffered), as `TooLarge`, and the stream ends.
#[tokio::test]
async fn an_oversized_frame_is_refused_from_its_header() {
    const LIMIT: usize = 1000;
    let (_sink, mut stream, mut peer) = server(4096, LIMIT).await;
    let mut h = [0u8; MAX_HEADER_BYTES];
    // A header alone, declaring 1 GiB.
    let n = encode_header(&mut h, Opcode::Binary, 1 << 30, Some(MASK));
    peer.write_all(&h[..n]).await.expect("write");
    match step(stream.next()).await {
        Some(Err(FramingError::TooLarge { limit })) => assert_eq!(limit, LIMIT),
        other => panic!("expected TooLarge, got {other:?}"),
    }
    assert!(step(stream.next()).await.is_none());
}

/// A server refuses a client's unmasked frame (RFC 6455 §5.1), and a client a server's
/// masked one, as protocol errors that name the rule.
#[tokio::test]
async fn masking_in_the_wrong_direction_is_a_protocol_error() {
    let (_sink, mut stream, mut peer) = server(4096, 1024).await;
    peer.write_all(&frame(Opcode::Text, b"{}", None))
        .await
        .expect("write");
    match step(stream.next()).await {
        Some(Err(FramingError::Protocol(why))) => assert!(why.contains("not masked"), "{why}"),
        other => panic!("expected a protocol error, got {other:?}"),
    }

    let (ours, mut peer) = tokio::io::duplex(4096);
    let ws = WebSocketStream::from_raw_socket(
        MaybeTlsStream::Plain(ours),
        TungsteniteRole::Client,
        None,
    )
    .await;
    let (_sink, mut stream) = split(ws, Role::Client, 1024, None);
    peer.write_all(&frame(Opcode::Text, b"{}", Some(MASK)))
        .await
        .expect("write");
    match step(stream.next()).await {
        Some(Err(FramingError::Protocol(why))) => assert!(why.contains("masked"), "{why}"),
        other => panic!("expected a protocol error, got {other:?}"),
    }
}

/// The peer's close is answered with a close echoing its code, the stream ends, and no data
/// message can be queued behind the reply.
#[tokio::test]
async fn a_close_is_answered_with_its_code_and_ends_the_stream() {
    let (mut sink, mut stream, mut peer) = server(4096, 1024).await;
    let mut payload = 4000u16.to_be_bytes().to_vec();
    payload.extend_from_slice(b"bye");
    peer.write_all(&frame(Opcode::Text, b"last", Some(MASK)))
        .await
        .expect("write");
    peer.write_all(&frame(Opcode::Close, &payload, Some(MASK)))
        .await
        .expect("write");
    assert_eq!(
        step(stream.next())
            .await
            .expect("a message")
            .expect("framed"),
        &b"last"[..]
    );
    assert!(step(stream.next()).await.is_none());
    assert!(step(stream.next()).await.is_none(), "the end is for good");
    assert!(sink
        .start_send_data(DataOpcode::Text, Bytes::new(), Bytes::from_static(b"{}"))
        .is_err());
    // The stream ended only once the reply was flushed: with both halves gone, the peer
    // reads the reply and then the end.
    drop((sink, stream));
    let mut wire = Vec::new();
    step(peer.read_to_end(&mut wire)).await.expect("read");
    let frames = server_frames(&wire);
    assert_eq!(frames, vec![(0x8, 4000u16.to_be_bytes().to_vec())]);
}

/// The HTTP front's read-ahead buffer cuts reads at frame ends (for a link's driver); once
/// split, the reading half reads with its own codec and the cuts end, so one read takes as
/// many frames as have arrived.
#[tokio::test]
async fn the_split_ends_the_read_ahead_frame_cuts() {
    let (ours, _peer) = tokio::io::duplex(64);
    let ws = WebSocketStream::from_raw_socket(
        ReadAhead::websocket(FrameQueue::new(ours), Role::Server),
        TungsteniteRole::Server,
        None,
    )
    .await;
    assert!(ws.get_ref().keeps_boundaries());
    let (_sink, stream) = split(ws, Role::Server, 1024, None);
    assert!(!locked(&stream.shared.ws).get_ref().keeps_boundaries());
}

/// Pings that keep coming while the writer's data is stuck (the peer reads nothing) are
/// read on: later data still arrives, and at most one pong waits (a newer ping replaces the
/// older pong, RFC 6455 §5.5.3). Once the peer reads, it gets every data message in order
/// and a pong for the latest ping last of all.
#[tokio::test]
async fn pings_while_the_writer_is_stuck_keep_one_pong_waiting() {
    const MESSAGE: usize = 40 * 1024;
    let (mut sink, mut stream, mut peer) = server(4096, 1024).await;
    let waker = futures_util::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    let mut sent = 0u8;
    while let Poll::Ready(r) = Pin::new(&mut sink).poll_ready(&mut cx) {
        r.expect("ready");
        sink.start_send_data(
            DataOpcode::Binary,
            Bytes::new(),
            Bytes::from(vec![sent; MESSAGE]),
        )
        .expect("queued");
        sent += 1;
        assert!(sent < 100, "the queue never filled");
    }
    const PINGS: u32 = 500;
    let pings = tokio::spawn(async move {
        for i in 0..PINGS {
            peer.write_all(&frame(Opcode::Ping, &i.to_be_bytes(), Some(MASK)))
                .await
                .expect("ping");
        }
        peer.write_all(&frame(Opcode::Text, b"after the pings", Some(MASK)))
            .await
            .expect("text");
        peer
    });
    assert_eq!(
        step(stream.next())
            .await
            .expect("a message")
            .expect("framed"),
        &b"after the pings"[..]
    );
    let mut peer = step(pings).await.expect("pinger");
    assert!(stream.replies.pong.is_some(), "the latest pong waits");
    // Keep reading (the reader sends the pong once the writer's data is out), and let the
    // peer read everything.
    let reader = tokio::spawn(async move { while let Some(Ok(_)) = stream.next().await {} });
    let flush = tokio::spawn(async move {
        std::future::poll_fn(|cx| Pin::new(&mut sink).poll_flush(cx))
            .await
            .expect("flushed");
        sink
    });
    let mut wire = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    let last_pong = (PINGS - 1).to_be_bytes().to_vec();
    loop {
        let n = step(peer.read(&mut buf)).await.expect("read");
        assert!(n > 0, "the server closed early");
        wire.extend_from_slice(&buf[..n]);
        if wire.ends_with(&last_pong) && server_frames_complete(&wire) {
            break;
        }
    }
    let frames = server_frames(&wire);
    let data: Vec<_> = frames.iter().filter(|(op, _)| *op == 0x2).collect();
    let pongs: Vec<_> = frames.iter().filter(|(op, _)| *op == 0xA).collect();
    assert_eq!(data.len(), sent as usize);
    for (i, (_, payload)) in data.iter().enumerate() {
        assert!(payload.len() == MESSAGE && payload.iter().all(|&b| b == i as u8));
    }
    // The first ping's pong, handed over before the data stuck, and the latest one.
    assert!(
        !pongs.is_empty() && pongs.len() <= 2,
        "{} pongs",
        pongs.len()
    );
    assert_eq!(pongs.last().map(|(_, p)| p.clone()), Some(last_pong));
    let _sink = step(flush).await.expect("flush");
    drop(peer);
    step(reader).await.expect("reader");
}

/// Whether `bytes` ends at a frame boundary.
fn server_frames_complete(mut bytes: &[u8]) -> bool {
    while bytes.len() >= 2 {
        let (len, at) = match bytes[1] & 0x7f {
            126 if bytes.len() >= 4 => (u16::from_be_bytes([bytes[2], bytes[3]]) as usize, 4),
            127 if bytes.len() >= 10 => (
                u64::from_be_bytes(bytes[2..10].try_into().unwrap()) as usize,
                10,
            ),
            126 | 127 => return false,
            n => (n as usize, 2),
        };
        if bytes.len() < at + len {
            return false;
        }
        bytes = &bytes[at + len..];
    }
    bytes.is_empty()
}

/// Every rule a peer can break in a frame's first bytes ends the stream with a protocol
/// error and nothing after it: a continuation with no message to continue, a fragmented
/// ping, a ping over 125 bytes, a reserved bit, a text that is not UTF-8, a close code that
/// may not be sent, an opcode that does not exist. A message before the broken frame still
/// arrives whole.
#[tokio::test]
async fn each_broken_rule_ends_the_stream_with_a_protocol_error() {
    let mut fragmented_ping = frame(Opcode::Ping, b"p", Some(MASK));
    fragmented_ping[0] &= 0x7f;
    let mut reserved_bit = frame(Opcode::Text, b"{}", Some(MASK));
    reserved_bit[0] |= 0x40;
    let mut unknown_opcode = frame(Opcode::Binary, b"x", Some(MASK));
    unknown_opcode[0] = (unknown_opcode[0] & 0xf0) | 0x3;
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "continuation without a start",
            frame(Opcode::Continuation, b"x", Some(MASK)),
        ),
        ("fragmented ping", fragmented_ping),
        (
            "ping of 126 bytes",
            frame(Opcode::Ping, &[0; 126], Some(MASK)),
        ),
        ("reserved bit", reserved_bit),
        (
            "text not UTF-8",
            frame(Opcode::Text, &[0xff, 0xfe], Some(MASK)),
        ),
        (
            "close code 1005",
            frame(Opcode::Close, &1005u16.to_be_bytes(), Some(MASK)),
        ),
        ("unknown opcode", unknown_opcode),
    ];
    for (what, broken) in cases {
        let (_sink, mut stream, mut peer) = server(4096, 1024).await;
        let mut wire = frame(Opcode::Text, b"before", Some(MASK));
        wire.extend_from_slice(&broken);
        wire.extend_from_slice(&frame(Opcode::Text, b"after", Some(MASK)));
        peer.write_all(&wire).await.expect("write");
        let first = step(stream.next()).await;
        assert_eq!(
            first.expect("a message").expect("framed"),
            &b"before"[..],
            "{what}"
        );
        match step(stream.next()).await {
            Some(Err(FramingError::Protocol(_))) => {}
            other => panic!("{what}: expected a protocol error, got {other:?}"),
        }
        assert!(
            step(stream.next()).await.is_none(),
            "{what}: data after the error"
        );
    }
}

/// A peer that goes away in the middle of a frame (its header, or its payload) ends the
/// stream; the part of the message it sent is never handed on as a message.
#[tokio::test]
async fn a_peer_gone_mid_frame_ends_the_stream_without_a_partial_message() {
    let whole = frame(Opcode::Text, &[b'a'; 300], Some(MASK));
    for cut in [1, 3, 7, whole.len() - 1] {
        let (_sink, mut stream, mut peer) = server(4096, 1024).await;
        peer.write_all(&whole[..cut]).await.expect("write");
        drop(peer);
        match step(stream.next()).await {
            None | Some(Err(_)) => {}
            Some(Ok(m)) => panic!("cut at {cut}: a partial message of {} bytes", m.len()),
        }
        assert!(step(stream.next()).await.is_none(), "cut at {cut}");
    }
}
