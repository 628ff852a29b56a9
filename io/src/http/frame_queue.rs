//! [`FrameQueue`]: a server's WebSocket data frames written from the buffers they are already
//! in, around tungstenite's write buffer.
//!
//! tungstenite copies every frame it sends into its write buffer (`Frame::format_into_buf`,
//! whatever `WebSocketConfig` says: `write_buffer_size` only decides when that buffer is
//! written, never whether a payload is copied into it). For the exec server that is a copy of
//! every byte of output, after the copy that joined a binary message's head and chunk into the
//! one payload tungstenite takes. This stream sits under tungstenite; the server's outgoing
//! half hands it whole data frames as a header it encodes here and the payload's own buffers
//! (a JSON `String` turned `Bytes`, a binary head and the output chunk shared with the
//! process's log), and they reach the socket by vectored writes, without a copy.
//!
//! # Order and what tungstenite still writes
//!
//! tungstenite still writes the control frames (its pongs, the keepalive's pings, the close
//! handshake) and any message not queued here, through this stream's `poll_write`, which first
//! writes every queued frame to the end. So a frame is never cut by another, and everything
//! leaves in the order the two writers handed it over at this level; the queue's owner keeps
//! data from being queued after a close frame (`src/transport/websocket.rs`).
//!
//! # Bounds
//!
//! The queue holds references, not copies. Its owner writes it out once it holds
//! [`FRAME_QUEUE_BYTES`] or more and takes no more frames until it is below again (as
//! tungstenite does with its own buffer), so at most `FRAME_QUEUE_BYTES` plus one message is
//! queued per connection. Reads pass straight through.
//!
//! # What it must never do
//!
//! - Mask: only a server's frames go here (RFC 6455 §5.1: a server never masks), so only the
//!   front's accepted connections carry one.
//! - Interpret what it writes beyond the frame header it encodes.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Queued frame bytes at which the queue is written out: tungstenite's own default write
/// buffer size (128 KiB), so that a stream of output messages leaves in writes as large as
/// before.
pub const FRAME_QUEUE_BYTES: usize = 128 << 10;

/// Payload parts shorter than this are copied into the queue (beside the frame headers, in
/// one buffer) rather than referenced: a write of many small buffers costs more than copying
/// them (a JSON-RPC response, a binary message's head), and small messages are still
/// written together.
pub const COPY_BELOW_BYTES: usize = 4096;

/// Most buffers handed to one vectored write (the kernel takes up to 1,024).
const MAX_IOVECS: usize = 64;

/// The opcode of a data frame (RFC 6455 §5.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataOpcode {
    /// A text frame: the payload is UTF-8 (the caller's promise: a JSON `String`).
    Text,
    /// A binary frame.
    Binary,
}

/// Append the header of an unmasked, final data frame of `len` payload bytes (RFC 6455 §5.2).
fn put_frame_header(out: &mut BytesMut, opcode: DataOpcode, len: usize) {
    out.put_u8(
        0x80 | match opcode {
            DataOpcode::Text => 0x1,
            DataOpcode::Binary => 0x2,
        },
    );
    if len < 126 {
        out.put_u8(len as u8);
    } else if let Ok(short) = u16::try_from(len) {
        out.put_u8(126);
        out.put_u16(short);
    } else {
        out.put_u8(127);
        out.put_u64(len as u64);
    }
}

/// A stream whose writes are preceded by the data frames queued on it (see the module docs).
#[derive(Debug)]
pub struct FrameQueue<S> {
    inner: S,
    /// Buffers to write, in order: copied headers and small parts, and large parts as given.
    pieces: VecDeque<Bytes>,
    /// Headers and small parts queued after the last piece, not yet made a piece.
    tail: BytesMut,
    /// Bytes in `pieces` and `tail` not yet written.
    queued: usize,
}

impl<S> FrameQueue<S> {
    /// A stream with nothing queued.
    pub fn new(inner: S) -> Self {
        FrameQueue {
            inner,
            pieces: VecDeque::new(),
            tail: BytesMut::new(),
            queued: 0,
        }
    }

    /// The stream itself.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The stream itself.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Queue one whole data frame whose payload is `parts` in order. Nothing is written until
    /// [`poll_write_queued`](Self::poll_write_queued) or a write through the stream.
    pub fn queue_frame<const N: usize>(&mut self, opcode: DataOpcode, parts: [Bytes; N]) {
        let len: usize = parts.iter().map(Bytes::len).sum();
        let before = self.tail.len();
        put_frame_header(&mut self.tail, opcode, len);
        self.queued += self.tail.len() - before + len;
        for part in parts {
            if part.len() < COPY_BELOW_BYTES {
                self.tail.extend_from_slice(&part);
            } else {
                if !self.tail.is_empty() {
                    self.pieces.push_back(self.tail.split().freeze());
                }
                self.pieces.push_back(part);
            }
        }
    }

    /// Bytes queued and not yet written.
    pub fn queued_bytes(&self) -> usize {
        self.queued
    }
}

impl<S: AsyncWrite + Unpin> FrameQueue<S> {
    /// Write the queued frames out, as far as the socket takes them; ready once the queue is
    /// empty.
    pub fn poll_write_queued(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.tail.is_empty() {
            self.pieces.push_back(self.tail.split().freeze());
        }
        while let Some(first) = self.pieces.front() {
            let n = if self.pieces.len() == 1 || !self.inner.is_write_vectored() {
                ready!(Pin::new(&mut self.inner).poll_write(cx, first))?
            } else {
                let slices: Vec<IoSlice<'_>> = self
                    .pieces
                    .iter()
                    .take(MAX_IOVECS)
                    .map(|p| IoSlice::new(p))
                    .collect();
                ready!(Pin::new(&mut self.inner).poll_write_vectored(cx, &slices))?
            };
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.consume(n);
        }
        Poll::Ready(Ok(()))
    }

    /// Drop `n` written bytes from the front of the queue.
    fn consume(&mut self, mut n: usize) {
        self.queued -= n;
        while n > 0 {
            let Some(front) = self.pieces.front_mut() else {
                return;
            };
            if n >= front.len() {
                n -= front.len();
                self.pieces.pop_front();
            } else {
                front.advance(n);
                n = 0;
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for FrameQueue<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for FrameQueue<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let me = self.get_mut();
        ready!(me.poll_write_queued(cx))?;
        Pin::new(&mut me.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let me = self.get_mut();
        ready!(me.poll_write_queued(cx))?;
        Pin::new(&mut me.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        ready!(me.poll_write_queued(cx))?;
        Pin::new(&mut me.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        ready!(me.poll_write_queued(cx))?;
        Pin::new(&mut me.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;
    use tokio::io::AsyncWriteExt;
    use tokio_tungstenite::tungstenite::protocol::Role;
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::WebSocketStream;

    /// Payload of `len` bytes that differ from their neighbours (a swapped or lost byte shows).
    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect()
    }

    /// Every header length form at its edges (7-bit, 16-bit, 64-bit lengths), payloads split
    /// into parts, written through a pipe that takes 1,000 bytes at a time (so every piece is
    /// cut somewhere): tungstenite, as the client, reads each message whole and in order.
    #[tokio::test]
    async fn frames_at_every_length_edge_arrive_whole_and_in_order() {
        let (server, client) = tokio::io::duplex(1000);
        let mut q = FrameQueue::new(server);
        let sizes = [0usize, 1, 125, 126, 127, 65_535, 65_536, 200_000];
        let mut sent = Vec::new();
        for (i, &len) in sizes.iter().enumerate() {
            let cut = len / 3;
            let (opcode, body) = if i % 2 == 0 {
                (DataOpcode::Binary, pattern(len, i as u8))
            } else {
                // A text payload must be UTF-8: ASCII digits.
                let digits = pattern(len, i as u8)
                    .iter()
                    .map(|b| b'0' + b % 10)
                    .collect();
                (DataOpcode::Text, digits)
            };
            let body: Vec<u8> = body;
            q.queue_frame(
                opcode,
                [
                    Bytes::copy_from_slice(&body[..cut]),
                    Bytes::new(),
                    Bytes::copy_from_slice(&body[cut..]),
                ],
            );
            sent.push((opcode, body));
        }
        let total: usize = sizes.iter().sum();
        assert!(q.queued_bytes() > total, "headers are counted too");
        let reader = tokio::spawn(async move {
            let mut ws = WebSocketStream::from_raw_socket(client, Role::Client, None).await;
            let mut got = Vec::new();
            for _ in 0..sizes.len() {
                got.push(ws.next().await.expect("a message").expect("a valid frame"));
            }
            got
        });
        std::future::poll_fn(|cx| q.poll_write_queued(cx))
            .await
            .expect("written");
        assert_eq!(q.queued_bytes(), 0);
        let got = reader.await.expect("reader");
        for ((opcode, body), message) in sent.into_iter().zip(got) {
            match (opcode, message) {
                (DataOpcode::Binary, Message::Binary(b)) => assert_eq!(b[..], body[..]),
                (DataOpcode::Text, Message::Text(t)) => assert_eq!(t.as_bytes(), &body[..]),
                (opcode, other) => panic!("{opcode:?} frame arrived as {other:?}"),
            }
        }
    }

    /// What is written through the stream itself (tungstenite's control frames) waits until
    /// every queued frame is out, so it never lands inside one.
    #[tokio::test]
    async fn a_write_through_the_stream_follows_the_queued_frames() {
        let (server, client) = tokio::io::duplex(512);
        let mut q = FrameQueue::new(server);
        let big = pattern(70_000, 7);
        q.queue_frame(DataOpcode::Binary, [Bytes::copy_from_slice(&big)]);
        let reader = tokio::spawn(async move {
            let mut ws = WebSocketStream::from_raw_socket(client, Role::Client, None).await;
            let first = ws.next().await.expect("a message").expect("valid");
            let second = ws.next().await.expect("a message").expect("valid");
            (first, second)
        });
        // A pong with payload "p", as tungstenite would write it (unmasked, final).
        q.write_all(&[0x8A, 0x01, b'p']).await.expect("write");
        q.flush().await.expect("flush");
        assert_eq!(q.queued_bytes(), 0);
        let (first, second) = reader.await.expect("reader");
        assert_eq!(first, Message::Binary(Bytes::from(big)));
        assert_eq!(second, Message::Pong(Bytes::from_static(b"p")));
    }

    /// A peer that stopped reading: nothing is lost, the queue keeps what the socket did not
    /// take and reports pending (no busy loop, no error) until the peer reads again.
    #[tokio::test]
    async fn a_full_socket_keeps_the_rest_queued() {
        let (server, mut client) = tokio::io::duplex(100);
        let mut q = FrameQueue::new(server);
        q.queue_frame(DataOpcode::Binary, [Bytes::from(pattern(1000, 1))]);
        let polled = std::future::poll_fn(|cx| Poll::Ready(q.poll_write_queued(cx))).await;
        assert!(polled.is_pending());
        assert_eq!(q.queued_bytes(), 1004 - 100);
        let reader = tokio::spawn(async move {
            let mut all = Vec::new();
            tokio::io::AsyncReadExt::read_to_end(&mut client, &mut all)
                .await
                .expect("read");
            all
        });
        std::future::poll_fn(|cx| q.poll_write_queued(cx))
            .await
            .expect("written");
        drop(q);
        let all = reader.await.expect("reader");
        assert_eq!(&all[..4], &[0x82, 126, 0x03, 0xE8]);
        assert_eq!(all[4..], pattern(1000, 1)[..]);
    }
}
