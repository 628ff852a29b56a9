//! [`ReadAhead`]: a read buffer under a WebSocket, so that the socket is read in large reads.
//!
//! tungstenite reads its socket [`WS_READ_BUFFER_BYTES`] (4 KiB, the size 0.24 had fixed and
//! the crates configure) at a time: a frame of 64 KiB would cost sixteen `recv` system calls,
//! each through the reactor. Under it, this
//! adapter reads up to [`READ_AHEAD_BYTES`] per system call and hands tungstenite its small
//! reads from memory: one `recv` per frame or more, for one extra copy of each byte within
//! the cache.
//!
//! # Bounds
//!
//! At most [`READ_AHEAD_BYTES`] are buffered per connection, and only while data flows: the
//! buffer is released as soon as it is drained and the socket has nothing more (a read would
//! block), so an idle connection holds none. Nothing is read that tungstenite did not ask for
//! beyond that one buffer: its own limits (`max_message_size`, `max_frame_size`) apply to
//! what it takes from here exactly as they applied to the socket.
//!
//! Writes go straight through (tungstenite buffers its own writes).
//!
//! # Under a link's WebSocket
//!
//! Built with [`ReadAhead::websocket`] or [`ReadAhead::websocket_client`], it hands
//! tungstenite at most up to the end of the HTTP response head and then of each frame
//! (`execrelay_protocol::websocket::Boundaries`): tungstenite never holds a byte past the
//! message it returned, so a link's driver can take the socket over
//! ([`LinkSocket`](super::LinkSocket)) with [`ReadAhead::into_parts`] and lose nothing. From
//! then on the driver reads the socket itself, into its own large buffer; this one is only
//! under tungstenite for the upgrade and the environment link's handshake.
//!
//! # What it costs (measured)
//!
//! Plain-WebSocket JSON output (`execrelay run --json-output`, the client under callgrind,
//! 32 MiB): 386.3 M instructions in the client with the buffer, 384.7 M without; its own copy
//! is 4.5 M of them (1.2 %), and the client's `recv` calls fall from about 44,000 to 1,400 per
//! 128 MiB. What the JSON read path does spend is tungstenite 0.24's handling of each text
//! message (the 4 KiB chunk copy into its read buffer, the payload copy out of it, the copy
//! into the message's `String`, its UTF-8 check): a third of the client's instructions, with
//! or without this buffer. Releasing the buffer at every would-block costs nothing in the
//! binaries and benches, which keep freed memory (`execrelay::cli::tune_allocator`, the
//! relay's `main`); a program embedding the client library with glibc's default thresholds
//! faults the buffer's pages in again at each refill (12,900 page faults per 128 MiB in the
//! client; 2,000 were the buffer kept, 27,500 without the buffer).
//!
//! # Arrivals
//!
//! On request ([`ReadAhead::arrivals`]) it also tells when bytes first arrived after the
//! reader last finished a message ([`Arrivals`]): the relay's driver closes a client link
//! whose message takes longer than its deadline to arrive (a peer trickling one message).

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::{Buf, BytesMut};
use execrelay_protocol::sync::lock;
use execrelay_protocol::websocket::{Boundaries, Role};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;

/// When the bytes of an unfinished WebSocket message started to arrive. The socket side
/// ([`ReadAhead`]) marks the first bytes read from the socket after the reader finished a
/// message; the reader clears the mark with each message it completes. Bytes of the next
/// message read together with the end of the last are not marked until more arrive, so the
/// mark is never earlier than the truth (a deadline on it never closes a link early).
#[derive(Debug, Default)]
pub struct Arrivals {
    since: Mutex<Option<tokio::time::Instant>>,
    /// Wakes the reader when a mark appears, so that it arms its deadline.
    pub marked: Notify,
}

impl Arrivals {
    /// Bytes came from the socket now.
    pub(crate) fn bytes_arrived(&self) {
        let mut since = lock(&self.since);
        if since.is_none() {
            *since = Some(tokio::time::Instant::now());
            self.marked.notify_one();
        }
    }

    /// The reader finished a message: nothing is pending.
    pub fn message_done(&self) {
        *lock(&self.since) = None;
    }

    /// Since when bytes of an unfinished message have been arriving, if any.
    pub fn pending_since(&self) -> Option<tokio::time::Instant> {
        *lock(&self.since)
    }
}

/// Most bytes read from the socket in one system call, and held per connection while data
/// flows: a full frame (64 KiB) and its WebSocket header at once.
pub const READ_AHEAD_BYTES: usize = 128 << 10;

/// How much tungstenite 0.24 read per call (its `READ_BUFFER_CHUNK_SIZE`), for reference.
pub const TUNGSTENITE_READ_BYTES: usize = 4096;

/// tungstenite's own read buffer (`WebSocketConfig::read_buffer_size`), which it allocates
/// for the life of each connection (default 128 KiB since 0.25): 4 KiB, as 0.24's fixed
/// chunk was, so an idle connection holds what it did; the large socket reads come from this
/// read-ahead buffer under it, which an idle connection releases. Every WebSocket config of
/// the crates sets it.
pub const WS_READ_BUFFER_BYTES: usize = TUNGSTENITE_READ_BYTES;

/// A stream whose reads go through a buffer of up to [`READ_AHEAD_BYTES`], held only while
/// it is not empty or the socket keeps delivering.
#[derive(Debug)]
pub struct ReadAhead<S> {
    inner: S,
    /// Bytes read from `inner` and not yet handed out; empty (unallocated) when idle.
    buf: BytesMut,
    /// Marked when bytes come from the socket, if someone asked ([`ReadAhead::arrivals`]).
    arrivals: Option<Arc<Arrivals>>,
    /// Under a WebSocket that a link's driver takes over ([`ReadAhead::websocket`]): reads
    /// stop at the end of the HTTP head and of each frame, so the WebSocket above never holds
    /// bytes past the message it returned, and [`into_parts`](Self::into_parts) loses none.
    boundaries: Option<Boundaries>,
    /// Which end of the WebSocket reads through it (with `boundaries`).
    role: Option<Role>,
}

impl<S> ReadAhead<S> {
    /// Buffer the reads of `inner` (under TLS, or a WebSocket never taken over).
    pub fn new(inner: S) -> Self {
        ReadAhead {
            inner,
            buf: BytesMut::new(),
            arrivals: None,
            boundaries: None,
            role: None,
        }
    }

    /// Buffer the reads of `inner`, a WebSocket's bytes from its first frame (after the
    /// HTTP upgrade; `role`: which end reads them), handing out at most one frame per read:
    /// the WebSocket above can be taken over by a link's driver
    /// ([`LinkSocket`](super::LinkSocket)).
    pub fn websocket(inner: S, role: Role) -> Self {
        ReadAhead {
            boundaries: Some(Boundaries::frames()),
            role: Some(role),
            ..ReadAhead::new(inner)
        }
    }

    /// [`websocket`](Self::websocket) for the dialling side before its upgrade: `inner`
    /// starts with the HTTP response, which is handed out up to its end and no further.
    pub fn websocket_client(inner: S) -> Self {
        ReadAhead {
            boundaries: Some(Boundaries::http_then_frames()),
            role: Some(Role::Client),
            ..ReadAhead::new(inner)
        }
    }

    /// The end of the WebSocket it was built for ([`websocket`](Self::websocket),
    /// [`websocket_client`](Self::websocket_client)); `None`: no boundaries kept.
    pub fn role(&self) -> Option<Role> {
        self.role
    }

    /// True when reads stop at frame boundaries (built by [`websocket`](Self::websocket) or
    /// [`websocket_client`](Self::websocket_client)).
    pub fn keeps_boundaries(&self) -> bool {
        self.boundaries.is_some()
    }

    /// Stop cutting reads at frame ends: from here on the WebSocket above is read by a codec
    /// of the caller's own, straight from this stream (the plain WebSocket JSON-RPC transport,
    /// right after its handshake, while tungstenite holds no byte past the HTTP head). Bytes
    /// already read ahead are handed out first, as ever.
    pub fn end_boundaries(&mut self) {
        self.boundaries = None;
    }

    /// The stream, the bytes read ahead and not handed out, and the arrivals handle, if any.
    pub fn into_parts(self) -> (S, BytesMut, Option<Arc<Arrivals>>) {
        (self.inner, self.buf, self.arrivals)
    }

    /// Start telling when bytes arrive (see [`Arrivals`]); the same handle on every call.
    pub fn arrivals(&mut self) -> Arc<Arrivals> {
        self.arrivals.get_or_insert_with(Default::default).clone()
    }

    /// The stream itself.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The stream itself.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Bytes read ahead and not yet handed out.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for ReadAhead<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        if out.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        if me.buf.is_empty() {
            if out.remaining() >= READ_AHEAD_BYTES && me.boundaries.is_none() {
                // A caller that reads this much needs no buffer of ours.
                me.buf = BytesMut::new();
                let before = out.filled().len();
                let r = Pin::new(&mut me.inner).poll_read(cx, out);
                if out.filled().len() > before {
                    if let Some(a) = &me.arrivals {
                        a.bytes_arrived();
                    }
                }
                return r;
            }
            // The buffer's capacity is kept across refills while data flows (clear, not free).
            me.buf.clear();
            me.buf.reserve(READ_AHEAD_BYTES);
            match tokio_util::io::poll_read_buf(Pin::new(&mut me.inner), cx, &mut me.buf) {
                Poll::Pending => {
                    // Idle: hold no buffer while waiting.
                    me.buf = BytesMut::new();
                    return Poll::Pending;
                }
                Poll::Ready(Err(e)) => {
                    me.buf = BytesMut::new();
                    return Poll::Ready(Err(e));
                }
                // End of stream: nothing put into `out`.
                Poll::Ready(Ok(0)) => {
                    me.buf = BytesMut::new();
                    return Poll::Ready(Ok(()));
                }
                Poll::Ready(Ok(_)) => {
                    if let Some(a) = &me.arrivals {
                        a.bytes_arrived();
                    }
                }
            }
        }
        let mut n = out.remaining().min(me.buf.len());
        if let Some(b) = &mut me.boundaries {
            n = b.take(&me.buf[..n]);
        }
        out.put_slice(&me.buf[..n]);
        me.buf.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for ReadAhead<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Small reads see every byte in order, across refills; the buffer is gone once drained
    /// and the peer has nothing more (the read would block), and never exceeds its bound.
    #[tokio::test]
    async fn small_reads_see_every_byte_and_idle_holds_no_buffer() {
        let (mut a, b) = tokio::io::duplex(1 << 20);
        let mut r = ReadAhead::new(b);
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        a.write_all(&data).await.unwrap();
        let mut got = Vec::new();
        let mut chunk = [0u8; TUNGSTENITE_READ_BYTES];
        while got.len() < data.len() {
            let n = r.read(&mut chunk).await.unwrap();
            assert!(n > 0);
            assert!(r.buffered() < READ_AHEAD_BYTES);
            got.extend_from_slice(&chunk[..n]);
        }
        assert_eq!(got, data);
        // Drained, and the next read would block: no buffer held.
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        let mut rb = ReadBuf::new(&mut chunk);
        assert!(Pin::new(&mut r).poll_read(&mut cx, &mut rb).is_pending());
        assert_eq!(r.buf.capacity(), 0, "an idle connection holds no buffer");
        // End of stream reads as zero bytes.
        drop(a);
        assert_eq!(r.read(&mut chunk).await.unwrap(), 0);
    }

    /// A read at least as large as the buffer goes straight to the stream.
    #[tokio::test]
    async fn large_reads_bypass_the_buffer() {
        let (mut a, b) = tokio::io::duplex(1 << 20);
        let mut r = ReadAhead::new(b);
        a.write_all(&[7u8; 1000]).await.unwrap();
        let mut big = vec![0u8; READ_AHEAD_BYTES];
        assert_eq!(r.read(&mut big).await.unwrap(), 1000);
        assert_eq!(r.buf.capacity(), 0);
        // Writes pass through.
        r.write_all(b"back").await.unwrap();
        let mut four = [0u8; 4];
        a.read_exact(&mut four).await.unwrap();
        assert_eq!(&four, b"back");
    }
}
