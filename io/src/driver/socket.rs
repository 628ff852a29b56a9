//! [`LinkSocket`]: a link's WebSocket once its driver takes it over from tungstenite (after
//! the HTTP upgrade, and the environment link's handshake on stream id 0): the raw stream and
//! the sans-IO codec of `execrelay_protocol::websocket`, with no buffer of tungstenite's in
//! between.
//!
//! Owns the socket's two halves: [`FrameReader`] reads into one large buffer (up to
//! [`LINK_READ_BYTES`] per system call, never zero-filled) and hands each message's payload
//! on as a slice of it; [`FrameWriter`] writes each batch of messages with one vectored
//! write (WebSocket header, link frame header, payload: no copy into a write buffer; a
//! client's frames are masked into one scratch buffer, the one copy RFC 6455 forces).
//!
//! The two halves are public so that `io/benches/ws_codec.rs` measures the very code the
//! links run beside other WebSocket crates; nothing outside the driver uses them otherwise.
//!
//! Never: holds a read buffer while the link is idle (it is released whenever it is drained
//! and the socket has nothing more), decides anything about frames (the core does), or
//! waits on anything but its own socket.
//!
//! # Bounds
//!
//! Per connection, while data flows: the read buffer, at most [`LINK_READ_BYTES`] plus one
//! frame ([`MAX_FRAME_BYTES`]: the room kept to complete a frame in place, `read_plan.rs`);
//! the writer's headers and, for a client, its masked copy of one batch
//! ([`WRITE_BATCH_BYTES`](super::WRITE_BATCH_BYTES) plus a frame).
//! Idle: neither (the read buffer is released when drained, the writer's when it sleeps).

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use futures_util::SinkExt;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio_tungstenite::WebSocketStream;

use super::read_ahead::{Arrivals, ReadAhead};
use super::read_plan::plan_read;
use super::LINK_CLOSE_TIMEOUT;
use execrelay_protocol::frame::{WireParts, MAX_FRAME_BYTES};
use execrelay_protocol::websocket::{
    apply_mask, encode_header, Decoder, MaskKeys, Message, Opcode, Role, WsError, MAX_HEADER_BYTES,
};

/// Most bytes read from the socket in one system call: a full frame (64 KiB) and its
/// headers at once, and more under load.
pub const LINK_READ_BYTES: usize = 128 << 10;

/// Messages shorter than this are copied out of the read buffer; longer ones are slices of
/// it. A slice keeps its whole read buffer (at most [`LINK_READ_BYTES`] and a frame) alive
/// while it waits in a queue: from this size up that is at most six times the message, and
/// the data path (full 64 KiB frames) is never copied.
pub const SHARE_FROM_BYTES: usize = 32 << 10;

/// At most this many slices per vectored write (Linux's `IOV_MAX` is 1024).
const MAX_IOVECS: usize = 1024;

/// A link's WebSocket, taken over from tungstenite.
pub struct LinkSocket<S> {
    io: S,
    role: Role,
    decoder: Decoder,
    arrivals: Option<Arc<Arrivals>>,
}

impl<S> std::fmt::Debug for LinkSocket<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkSocket")
            .field("role", &self.role)
            .field("buffered", &self.decoder.buffered())
            .finish()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> LinkSocket<S> {
    /// Take `ws` over. Its stream must keep frame boundaries ([`ReadAhead::websocket`] or
    /// [`ReadAhead::websocket_client`], which also say which end this is), so that
    /// tungstenite holds no byte of the next message; what the read-ahead buffer holds is
    /// kept. A pong tungstenite still has to send goes out first. Its message size limit
    /// carries over.
    pub async fn from_websocket(mut ws: WebSocketStream<ReadAhead<S>>) -> Self {
        let cfg = ws.get_config();
        let max = cfg
            .max_message_size
            .unwrap_or(MAX_FRAME_BYTES)
            .min(cfg.max_frame_size.unwrap_or(MAX_FRAME_BYTES))
            .min(MAX_FRAME_BYTES);
        // A failure here is the socket's: the reader meets it at once.
        let _ = tokio::time::timeout(LINK_CLOSE_TIMEOUT, ws.flush()).await;
        let ahead = ws.into_inner();
        debug_assert!(
            ahead.keeps_boundaries(),
            "a link's WebSocket must be built over ReadAhead::websocket*"
        );
        // Without boundaries (a caller's mistake): the accepting end, as most links are.
        let role = ahead.role().unwrap_or(Role::Server);
        let (io, buffered, arrivals) = ahead.into_parts();
        LinkSocket {
            io,
            role,
            decoder: Decoder::with_buffered(role, max, buffered).share_from(SHARE_FROM_BYTES),
            arrivals,
        }
    }

    /// A fresh stream, right after its upgrade, as the `role` end, refusing messages over
    /// `max_message` bytes (clamped to [`MAX_FRAME_BYTES`]).
    pub fn from_raw(io: S, role: Role, max_message: usize) -> Self {
        LinkSocket {
            io,
            role,
            decoder: Decoder::new(role, max_message.min(MAX_FRAME_BYTES))
                .share_from(SHARE_FROM_BYTES),
            arrivals: None,
        }
    }

    /// Which end this is.
    pub fn role(&self) -> Role {
        self.role
    }

    /// The arrivals handle of the stream it was built on, if someone asked for one.
    pub fn arrivals(&self) -> Option<Arc<Arrivals>> {
        self.arrivals.clone()
    }

    /// Its two halves (the driver runs each in its own task; `benches/ws_codec.rs` drives
    /// them directly to measure the framing alone).
    pub fn split(
        self,
    ) -> (
        FrameReader<tokio::io::ReadHalf<S>>,
        FrameWriter<tokio::io::WriteHalf<S>>,
    ) {
        let (r, w) = tokio::io::split(self.io);
        (
            FrameReader {
                io: r,
                decoder: self.decoder,
                arrivals: self.arrivals,
            },
            FrameWriter::new(w, self.role),
        )
    }
}

/// What the reader got from the socket.
#[derive(Debug)]
pub enum ReadEvent {
    /// A whole message.
    Message(Message),
    /// A WebSocket rule broken by the peer.
    Error(WsError),
    /// The stream ended (without a close frame) or failed.
    Ended,
}

/// The reading half: bytes into the decoder's buffer, messages out.
pub struct FrameReader<R> {
    io: R,
    decoder: Decoder,
    arrivals: Option<Arc<Arrivals>>,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    /// The next message already in the buffer, without reading.
    pub fn buffered_message(&mut self) -> Option<ReadEvent> {
        match self.decoder.decode() {
            Ok(Some(m)) => {
                if let Some(a) = &self.arrivals {
                    a.message_done();
                }
                Some(ReadEvent::Message(m))
            }
            Ok(None) => None,
            Err(e) => Some(ReadEvent::Error(e)),
        }
    }

    /// The next message, reading as needed. Cancel-safe: a read that is dropped loses
    /// nothing (bytes go into the decoder's buffer as they come).
    pub async fn next(&mut self) -> ReadEvent {
        loop {
            if let Some(ev) = self.buffered_message() {
                return ev;
            }
            match std::future::poll_fn(|cx| self.poll_fill(cx)).await {
                Ok(0) | Err(_) => return ReadEvent::Ended,
                Ok(_) => {
                    // Part of a message is here and it is not whole yet: its deadline runs
                    // from now (never earlier than the truth).
                    if let Some(a) = &self.arrivals {
                        if self.decoder.mid_message() {
                            a.bytes_arrived();
                        }
                    }
                }
            }
        }
    }

    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        poll_fill(&mut self.decoder, Pin::new(&mut self.io), cx)
    }
}

/// One read of `io` into `decoder`'s buffer, up to [`LINK_READ_BYTES`] (more when a frame
/// needs it, but never more than doubling what has arrived: a frame's declared length alone
/// reserves nothing). A frame in progress that fits where it is gets exactly its rest, so
/// that nothing is moved between buffers ([`plan_read`]). While it would block with nothing
/// buffered, the buffer's memory is released: an idle connection holds none. The read is
/// never zero-filled first.
///
/// Shared by the links' [`FrameReader`] and the plain WebSocket JSON-RPC transport, so both
/// read the same way.
pub fn poll_fill<R: AsyncRead + Unpin + ?Sized>(
    decoder: &mut Decoder,
    io: Pin<&mut R>,
    cx: &mut Context<'_>,
) -> Poll<io::Result<usize>> {
    let remaining = decoder.frame_remaining();
    let buffered = decoder.buffered();
    let buf = decoder.read_buffer();
    let plan = plan_read(
        buffered,
        remaining,
        buf.capacity() - buf.len(),
        LINK_READ_BYTES,
    );
    if let Some(capacity) = plan.fresh {
        // A buffer of exactly this much, not `reserve`'s doubling: the bound in SECURITY.md
        // holds. The old buffer stays alive only through the slices handed on from it.
        let mut fresh = BytesMut::with_capacity(capacity);
        fresh.extend_from_slice(buf);
        *buf = fresh;
    }
    let r = tokio_util::io::poll_read_buf(io, cx, &mut (&mut *buf).limit(plan.limit));
    if !matches!(r, Poll::Ready(Ok(n)) if n > 0) {
        decoder.release_if_empty();
    }
    r
}

/// One message to send.
#[derive(Debug)]
pub enum Outgoing {
    /// A link frame (a binary message).
    Frame(WireParts),
    /// A control frame (payload at most 125 bytes).
    Control(Opcode, Bytes),
}

/// The writing half: batches of messages, each batch one vectored write.
pub struct FrameWriter<W> {
    io: W,
    role: Role,
    keys: MaskKeys,
    /// Headers of the batch being written (WebSocket header and its length).
    headers: Vec<([u8; MAX_HEADER_BYTES], usize)>,
    /// A client's masked batch, or the whole batch for a stream that cannot write vectored.
    scratch: BytesMut,
}

impl<W: AsyncWrite + Unpin> FrameWriter<W> {
    fn new(io: W, role: Role) -> Self {
        FrameWriter {
            io,
            role,
            keys: MaskKeys::default(),
            headers: Vec::new(),
            scratch: BytesMut::new(),
        }
    }

    /// Write every message of `batch` (in order) and flush.
    pub async fn write_batch(&mut self, batch: &[Outgoing]) -> io::Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        self.headers.clear();
        let mut masks = Vec::new();
        for m in batch {
            let (op, len) = match m {
                Outgoing::Frame(p) => (Opcode::Binary, p.len()),
                Outgoing::Control(op, p) => (*op, p.len()),
            };
            let mask = (self.role == Role::Client).then(|| self.keys.next_key());
            let mut h = [0u8; MAX_HEADER_BYTES];
            let n = encode_header(&mut h, op, len, mask);
            self.headers.push((h, n));
            masks.push(mask);
        }
        if self.role == Role::Client || !self.io.is_write_vectored() {
            // One contiguous copy of the batch: masked for a client (RFC 6455 forces a copy),
            // plain for a stream that would write one slice per system call.
            self.scratch.clear();
            for ((m, (h, n)), mask) in batch.iter().zip(&self.headers).zip(&masks) {
                self.scratch.extend_from_slice(&h[..*n]);
                let start = self.scratch.len();
                match m {
                    Outgoing::Frame(WireParts::Whole(b)) | Outgoing::Control(_, b) => {
                        self.scratch.extend_from_slice(b)
                    }
                    Outgoing::Frame(WireParts::Split(fh, p)) => {
                        self.scratch.extend_from_slice(fh);
                        self.scratch.extend_from_slice(p);
                    }
                }
                if let Some(k) = mask {
                    apply_mask(&mut self.scratch[start..], *k);
                }
            }
            self.io.write_all(&self.scratch).await?;
        } else {
            let mut slices = Vec::with_capacity(batch.len() * 3);
            for (m, (h, n)) in batch.iter().zip(&self.headers) {
                slices.push(IoSlice::new(&h[..*n]));
                match m {
                    Outgoing::Frame(WireParts::Whole(b)) | Outgoing::Control(_, b) => {
                        slices.push(IoSlice::new(b))
                    }
                    Outgoing::Frame(WireParts::Split(fh, p)) => {
                        slices.push(IoSlice::new(fh));
                        slices.push(IoSlice::new(p));
                    }
                }
            }
            write_all_vectored(&mut self.io, &mut slices).await?;
        }
        self.io.flush().await
    }

    /// The link has nothing to send: give the scratch buffer's memory back (an idle link
    /// holds none; a busy one keeps it from batch to batch).
    pub fn release_scratch(&mut self) {
        self.scratch = BytesMut::new();
        self.headers = Vec::new();
    }

    /// End the stream's writing side.
    pub async fn shutdown(&mut self) -> io::Result<()> {
        self.io.shutdown().await
    }
}

/// Write every byte of `slices`, as few system calls as the socket allows.
async fn write_all_vectored<W: AsyncWrite + Unpin>(
    w: &mut W,
    mut slices: &mut [IoSlice<'_>],
) -> io::Result<()> {
    while !slices.is_empty() {
        let end = slices.len().min(MAX_IOVECS);
        let n = w.write_vectored(&slices[..end]).await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut slices, n);
    }
    Ok(())
}
