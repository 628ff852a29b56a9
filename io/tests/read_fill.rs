//! `poll_fill` (the links' and the WebSocket JSON transport's reader) against a scripted
//! socket that hands out its bytes in pieces of chosen sizes: every message arrives whole and
//! in order, and a frame left half read at the end of a buffer is completed in place, not
//! moved into the next buffer (`io/src/driver/read_plan.rs`).

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use execrelay_io::driver::read_plan::FRAME_HEADROOM_BYTES;
use execrelay_io::driver::socket::poll_fill;
use execrelay_io::driver::LINK_READ_BYTES;
use execrelay_protocol::frame::MAX_FRAME_BYTES;
use execrelay_protocol::websocket::{
    apply_mask, encode_header, Decoder, Message, Opcode, Role, MAX_HEADER_BYTES,
};
use tokio::io::{AsyncRead, ReadBuf};

/// A socket holding `data`, handing out at most the next of `pieces` bytes per read (then
/// whatever is asked), and recording how much room each read offered.
struct Scripted {
    data: Bytes,
    pieces: VecDeque<usize>,
    offered: Vec<usize>,
}

impl AsyncRead for Scripted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.offered.push(buf.remaining());
        let piece = self.pieces.pop_front().unwrap_or(usize::MAX);
        let n = buf.remaining().min(piece).min(self.data.len());
        let chunk = self.data.split_to(n);
        buf.put_slice(&chunk);
        Poll::Ready(Ok(()))
    }
}

/// One masked binary message (as a client sends it) of `len` bytes of `fill`.
fn masked(len: usize, fill: u8, key: [u8; 4]) -> (Vec<u8>, Vec<u8>) {
    let payload = vec![fill; len];
    let mut head = [0u8; MAX_HEADER_BYTES];
    let n = encode_header(&mut head, Opcode::Binary, len, Some(key));
    let mut wire = head[..n].to_vec();
    let mut body = payload.clone();
    apply_mask(&mut body, key);
    wire.extend_from_slice(&body);
    (wire, payload)
}

/// `count` masked binary messages of `len` bytes each, message `i` filled with byte `i`.
fn masked_messages(count: usize, len: usize) -> (Bytes, Vec<Vec<u8>>) {
    let mut wire = Vec::new();
    let mut sent = Vec::new();
    for i in 0..count {
        let (w, payload) = masked(len, i as u8, [0x37, 0xfa, 0x21, i as u8]);
        wire.extend_from_slice(&w);
        sent.push(payload);
    }
    (Bytes::from(wire), sent)
}

/// Read everything through `poll_fill`, decoding as a server does; returns the messages and
/// how many buffered bytes were moved into a fresh buffer on the way.
fn read_all(socket: &mut Scripted) -> (Vec<Vec<u8>>, usize) {
    let waker = futures_util::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    let mut decoder = Decoder::new(Role::Server, 1 << 20);
    let mut got = Vec::new();
    let mut moved = 0;
    loop {
        while let Some(m) = decoder.decode().expect("a well-formed stream") {
            match m {
                Message::Binary(b) => got.push(b.to_vec()),
                other => panic!("unexpected {other:?}"),
            }
        }
        let buffered = decoder.buffered();
        let before = decoder.read_buffer().as_ptr();
        match poll_fill(&mut decoder, Pin::new(&mut *socket), &mut cx) {
            Poll::Ready(Ok(0)) => break,
            Poll::Ready(Ok(_)) => {}
            other => panic!("read: {other:?}"),
        }
        if buffered > 0 && decoder.read_buffer().as_ptr() != before {
            moved += buffered;
        }
    }
    assert_eq!(decoder.buffered(), 0, "nothing left half read at the end");
    (got, moved)
}

#[test]
fn link_frames_read_in_pieces_that_split_them_are_completed_in_place() {
    // Full link frames, read 93,000 bytes at a time (what a busy relay's reads averaged):
    // nearly every read ends inside a frame.
    let (wire, sent) = masked_messages(64, MAX_FRAME_BYTES);
    let mut socket = Scripted {
        data: wire,
        pieces: std::iter::repeat_n(93_000, 10_000).collect(),
        offered: Vec::new(),
    };
    let (got, moved) = read_all(&mut socket);
    assert_eq!(got.len(), sent.len());
    assert!(got == sent, "every message whole and in order");
    assert_eq!(moved, 0, "no frame was moved between buffers");
    // The reads that completed a frame asked for its rest exactly, and no read offered more
    // than a read's worth.
    assert!(socket.offered.iter().all(|&o| o <= LINK_READ_BYTES));
    assert!(
        socket.offered.iter().any(|&o| o < LINK_READ_BYTES),
        "some read asked for the rest of a frame: {:?}",
        &socket.offered[..8]
    );
}

#[test]
fn messages_read_in_ragged_pieces_arrive_whole_and_in_order() {
    // Sizes across the header forms (7-bit, 16-bit, 64-bit lengths) and the share threshold,
    // cut into pieces of 1 to 70,000 bytes by a fixed pseudo-random sequence.
    let mut wire = Vec::new();
    let mut sent = Vec::new();
    for (i, len) in [
        0usize, 1, 125, 126, 4_000, 40_000, 65_535, 65_536, 200_000, 3,
    ]
    .into_iter()
    .cycle()
    .take(60)
    .enumerate()
    {
        let (w, payload) = masked(len, i as u8, [1, 2, 3, i as u8]);
        wire.extend_from_slice(&w);
        sent.push(payload);
    }
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let pieces = (0..100_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            1 + (x % 70_000) as usize
        })
        .collect();
    let mut socket = Scripted {
        data: Bytes::from(wire),
        pieces,
        offered: Vec::new(),
    };
    let (got, _) = read_all(&mut socket);
    assert_eq!(got.len(), sent.len());
    for (i, (g, s)) in got.iter().zip(&sent).enumerate() {
        assert!(g == s, "message {i} ({} bytes) arrived intact", s.len());
    }
    // A buffer never offers more than a read's worth plus one frame, or twice a large
    // message's arrived part.
    assert!(socket
        .offered
        .iter()
        .all(|&o| o <= (LINK_READ_BYTES + FRAME_HEADROOM_BYTES).max(2 * 200_014)));
}
