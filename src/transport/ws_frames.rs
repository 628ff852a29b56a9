//! Which streams under a WebSocket take whole data frames from the outgoing half
//! ([`DataFrames`]), so that a message's bytes reach the socket from the buffers they are
//! already in instead of being copied into tungstenite's write buffer.
//!
//! # What this module owns
//!
//! - The one stream that does: a server's accepted connection
//!   (`execrelay_io::http::FrontStream`, whose [`FrameQueue`] writes unmasked frames with
//!   vectored writes, ahead of anything tungstenite writes).
//! - That every other stream does not (a client's, whose frames RFC 6455 requires masked, which
//!   is a copy anyway; a test's bare TCP stream): tungstenite writes everything there.
//!
//! # What it must never do
//!
//! - Decide when a frame may be queued (after a close it may not): that is the outgoing half's
//!   (`ws_keepalive`), which checks it under the same lock as the reader that sees the close.

use bytes::Bytes;
use execrelay_io::driver::ReadAhead;
use execrelay_io::http::{DataOpcode, FrameQueue};
use tokio::io::AsyncWrite;
use tokio::net::TcpStream;
use tokio_tungstenite::MaybeTlsStream;

/// A stream under a WebSocket that may take whole data frames from the outgoing half. The
/// defaults describe a stream that does not: everything goes through tungstenite.
pub trait DataFrames {
    /// Whether data frames are queued here rather than sent through tungstenite.
    fn takes_frames(&self) -> bool {
        false
    }

    /// Queue one data frame whose payload is `head` then `payload` (only called when
    /// [`takes_frames`](Self::takes_frames)).
    fn queue_frame(&mut self, _opcode: DataOpcode, _head: Bytes, _payload: Bytes) {}

    /// Bytes queued and not yet written.
    fn queued_bytes(&self) -> usize {
        0
    }

    /// From here on the reading half reads this stream with the crate's own codec: a
    /// read-ahead buffer stops cutting reads at frame ends ([`ReadAhead::end_boundaries`]),
    /// so a read is as large as the codec asks.
    fn end_boundaries(&mut self) {}
}

/// A server's accepted connection: the front builds every one over a [`FrameQueue`].
impl<S: AsyncWrite + Unpin> DataFrames for ReadAhead<FrameQueue<S>> {
    fn takes_frames(&self) -> bool {
        true
    }

    fn queue_frame(&mut self, opcode: DataOpcode, head: Bytes, payload: Bytes) {
        self.get_mut().queue_frame(opcode, [head, payload]);
    }

    fn queued_bytes(&self) -> usize {
        self.get_ref().queued_bytes()
    }

    fn end_boundaries(&mut self) {
        ReadAhead::end_boundaries(self);
    }
}

/// A dialled WebSocket (a client's frames are masked: tungstenite writes them).
impl<S> DataFrames for MaybeTlsStream<S> {}

/// A dialled WebSocket under the read-ahead buffer that keeps its HTTP head's end
/// (`transport::websocket::LinkClientSocket`): as above.
impl<S> DataFrames for ReadAhead<MaybeTlsStream<S>> {
    fn end_boundaries(&mut self) {
        ReadAhead::end_boundaries(self);
    }
}

/// A bare TCP stream (tests, tools).
impl DataFrames for TcpStream {}
