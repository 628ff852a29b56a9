//! The link driver's own WebSocket framing, byte by byte over an in-memory pipe: every rule a
//! peer can break closes the link with its RFC 6455 code and our reason; pings are answered;
//! a peer's close is answered; the driver takes a socket over from tungstenite without losing
//! a byte that tungstenite's reader had already been handed; large frames pass whole.

#[path = "../../protocol/tests/common/mod.rs"]
mod common;

use std::time::Duration;

use common::{relay_cfg, ADDR};
use execrelay_io::driver::{link_websocket_config, ReadAhead, RelayHub};
use execrelay_protocol::frame::MAX_FRAME_BYTES;
use execrelay_protocol::reason::CloseReason;
use execrelay_protocol::websocket::{encode_header, parse_header, Opcode, Role, MAX_HEADER_BYTES};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::time::timeout;
use tokio_tungstenite::tungstenite::protocol::Role as TRole;
use tokio_tungstenite::WebSocketStream;

const GUARD: Duration = Duration::from_secs(600);

/// A relay client link served by `hub`; the raw far end and the link's task.
async fn client_link(hub: &RelayHub) -> (DuplexStream, tokio::task::JoinHandle<CloseReason>) {
    let (far, near) = tokio::io::duplex(1 << 20);
    let ws = WebSocketStream::from_raw_socket(
        ReadAhead::websocket(near, Role::Server),
        TRole::Server,
        Some(link_websocket_config()),
    )
    .await;
    let link = hub.add_client("env1", ADDR).unwrap();
    (far, tokio::spawn(link.serve(ws)))
}

/// A masked client frame (first byte `b0`, zero mask: the payload goes as it is).
fn client_frame(b0: u8, payload: &[u8]) -> Vec<u8> {
    let mut h = [0u8; MAX_HEADER_BYTES];
    let n = encode_header(&mut h, Opcode::Binary, payload.len(), Some([0; 4]));
    h[0] = b0;
    let mut v = h[..n].to_vec();
    v.extend_from_slice(payload);
    v
}

/// Every frame the server sends until it ends the stream: (opcode byte, payload).
async fn server_frames(far: &mut DuplexStream) -> Vec<(u8, Vec<u8>)> {
    let mut all = Vec::new();
    let _ = timeout(GUARD, far.read_to_end(&mut all)).await.unwrap();
    let mut out = Vec::new();
    let mut at = 0;
    while let Ok(Some(h)) = parse_header(&all[at..], Role::Client) {
        let start = at + h.header_len;
        let end = start + h.len as usize;
        if end > all.len() {
            break;
        }
        out.push((all[at] & 0x0F, all[start..end].to_vec()));
        at = end;
    }
    out
}

/// The close frame the server sent: (code, reason).
fn close_of(frames: &[(u8, Vec<u8>)]) -> (u16, String) {
    let (_, p) = frames
        .iter()
        .find(|(op, _)| *op == 0x8)
        .expect("a close frame");
    (
        u16::from_be_bytes([p[0], p[1]]),
        String::from_utf8(p[2..].to_vec()).unwrap(),
    )
}

async fn refused_with(bytes: Vec<u8>) -> (CloseReason, u16, String) {
    let hub = RelayHub::new(relay_cfg()).unwrap();
    let (mut far, task) = client_link(&hub).await;
    far.write_all(&bytes).await.unwrap();
    let frames = server_frames(&mut far).await;
    let reason = timeout(GUARD, task).await.unwrap().unwrap();
    let (code, said) = close_of(&frames);
    (reason, code, said)
}

#[tokio::test]
async fn every_websocket_rule_a_peer_breaks_closes_with_its_code() {
    let mut oversized = vec![0x82, 0x80 | 127];
    oversized.extend_from_slice(&(MAX_FRAME_BYTES as u64 + 1).to_be_bytes());
    oversized.extend_from_slice(&[0; 4]);
    let cases: Vec<(&str, Vec<u8>, CloseReason, u16)> = vec![
        (
            "bad opcode",
            client_frame(0x83, b"x"),
            CloseReason::Protocol,
            1002,
        ),
        (
            "reserved bit",
            client_frame(0xC2, b"x"),
            CloseReason::Protocol,
            1002,
        ),
        (
            "unmasked client frame",
            vec![0x82, 1, b'x'],
            CloseReason::Protocol,
            1002,
        ),
        (
            "oversized frame (header only)",
            oversized,
            CloseReason::OversizedFrame,
            1009,
        ),
        (
            "fragmented ping",
            client_frame(0x09, b"p"),
            CloseReason::Protocol,
            1002,
        ),
        (
            "ping over 125 bytes",
            client_frame(0x89, &[0; 126]),
            CloseReason::Protocol,
            1002,
        ),
        (
            "one-byte close payload",
            client_frame(0x88, &[3]),
            CloseReason::Protocol,
            1002,
        ),
        (
            "reserved close code",
            client_frame(0x88, &1005u16.to_be_bytes()),
            CloseReason::Protocol,
            1002,
        ),
        (
            "close reason not UTF-8",
            client_frame(0x88, &[0x03, 0xE8, 0xFF]),
            CloseReason::Protocol,
            1007,
        ),
        (
            "text not UTF-8",
            client_frame(0x81, &[0xC3, 0x28]),
            CloseReason::Protocol,
            1007,
        ),
        (
            "a text message at all",
            client_frame(0x81, b"{}"),
            CloseReason::Protocol,
            1003,
        ),
        (
            "continuation without a message",
            client_frame(0x80, b"x"),
            CloseReason::Protocol,
            1002,
        ),
    ];
    for (what, bytes, want_reason, want_code) in cases {
        let (reason, code, said) = refused_with(bytes).await;
        assert_eq!(reason, want_reason, "{what}");
        assert_eq!(code, want_code, "{what}");
        assert_eq!(said, want_reason.as_str(), "{what}");
    }
}

#[tokio::test]
async fn a_ping_is_answered_and_a_close_is_echoed() {
    let hub = RelayHub::new(relay_cfg()).unwrap();
    let (mut far, task) = client_link(&hub).await;
    let mut bytes = client_frame(0x89, b"hello");
    bytes.extend(client_frame(0x88, &[0x03, 0xE9]));
    far.write_all(&bytes).await.unwrap();
    let frames = server_frames(&mut far).await;
    assert_eq!(frames[0], (0xA, b"hello".to_vec()), "the pong first");
    assert_eq!(close_of(&frames), (1001, String::new()), "its close echoed");
    let reason = timeout(GUARD, task).await.unwrap().unwrap();
    assert_eq!(reason, CloseReason::Transport);
}

/// A frame split anywhere across reads is reassembled, and a frame already handed to
/// tungstenite's reader before the takeover (tungstenite held none of its bytes: the
/// read-ahead buffer stopped at the end of the frame before) is not lost.
#[tokio::test]
async fn frames_split_across_reads_and_bytes_read_ahead_survive_the_takeover() {
    let hub = RelayHub::new(relay_cfg()).unwrap();
    let (mut far, near) = tokio::io::duplex(1 << 20);
    let mut ws = WebSocketStream::from_raw_socket(
        ReadAhead::websocket(near, Role::Server),
        TRole::Server,
        Some(link_websocket_config()),
    )
    .await;
    // Before the takeover: a ping, then the start of a protocol violation, in one write.
    let mut early = client_frame(0x89, b"early");
    early.extend(client_frame(0x88, &[0x03, 0xE8]));
    far.write_all(&early).await.unwrap();
    // tungstenite reads the ping (and only the ping).
    let m = futures_util::StreamExt::next(&mut ws)
        .await
        .unwrap()
        .unwrap();
    assert!(m.is_ping());
    let link = hub.add_client("env1", ADDR).unwrap();
    let task = tokio::spawn(link.serve(ws));
    let frames = server_frames(&mut far).await;
    // tungstenite's pong (flushed at the takeover), then the close the driver read from the
    // bytes tungstenite never saw.
    assert_eq!(frames[0], (0xA, b"early".to_vec()));
    assert_eq!(close_of(&frames), (1000, String::new()));
    let reason = timeout(GUARD, task).await.unwrap().unwrap();
    assert_eq!(reason, CloseReason::Transport);
}
