//! Transports (layer 1): how JSON-RPC messages reach a connection
//! (`connection::ConnectionProcessor`, a higher layer this module never imports).
//!
//! A transport turns a byte pipe (stdio, a WebSocket, a Noise virtual stream) into a
//! [`Transport`]: a stream of whole inbound messages and a sink of outbound messages
//! ([`OutMessage`]: a JSON text, or a binary output message of `protocol.md` §5.1 where the
//! transport can carry one, which [`Transport::binary_messages`] says). It owns framing and
//! the message size limit. It must never interpret JSON-RPC, nor look inside a binary
//! message: that is the connection processor's and `rpc/`'s job.

use std::io;
use std::pin::Pin;

use bytes::Bytes;
use futures_util::{Sink, Stream};

pub mod line_codec;
pub mod stdio;
pub mod websocket;
pub mod ws_frames;
pub mod ws_inbound;
pub mod ws_keepalive;

/// Why an inbound message could not be framed. Every variant ends the connection.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FramingError {
    /// The peer sent a message over the configured `maxMessageBytes`. Detected before more
    /// than the limit was buffered.
    #[error("message exceeds the limit of {limit} bytes")]
    TooLarge {
        /// The limit in force.
        limit: usize,
    },
    /// The peer broke the transport's own rules (for example a WebSocket protocol violation).
    #[error("transport protocol error: {0}")]
    Protocol(String),
    /// The underlying I/O failed.
    #[error("transport I/O error: {0}")]
    Io(#[from] io::Error),
}

/// Inbound half: whole messages, in order. `None` means the peer closed the connection.
/// Each message is `Bytes`: a WebSocket hands its payload over as it split it off its read
/// buffer, so the consumer slices it (a binary chunk) without a copy.
pub type MessageStream = Pin<Box<dyn Stream<Item = Result<Bytes, FramingError>> + Send>>;

/// One outbound message.
///
/// A binary message is kept in two parts so that its wire form is built once and its payload
/// (an output chunk, shared with the process's event log) is copied only where the transport's
/// framing needs it: a Noise stream seals both parts straight into its records, a WebSocket
/// joins them into its one binary frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutMessage {
    /// A JSON text: a text frame on a WebSocket, a line on stdio, a length-prefixed message on
    /// a Noise stream.
    Text(String),
    /// A binary message (`protocol.md` §5.1): the bytes of `head` followed by those of
    /// `payload`, carried as one message. Only for a transport whose
    /// [`Transport::binary_messages`] is true; another refuses it with
    /// [`io::ErrorKind::InvalidInput`].
    Binary {
        /// The first bytes (for an output delta: kind, stream, seq and process id).
        head: Bytes,
        /// The rest (for an output delta: the raw chunk).
        payload: Bytes,
    },
}

impl OutMessage {
    /// Bytes of the message (without the transport's framing).
    pub fn len(&self) -> usize {
        match self {
            OutMessage::Text(text) => text.len(),
            OutMessage::Binary { head, payload } => head.len() + payload.len(),
        }
    }

    /// Whether the message has no bytes at all.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl From<String> for OutMessage {
    fn from(text: String) -> Self {
        OutMessage::Text(text)
    }
}

/// The error of a transport asked to carry a binary message it cannot carry (a caller's bug:
/// binary output is only negotiated where [`Transport::binary_messages`] is true).
pub fn binary_unsupported(transport: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{transport} cannot carry binary messages"),
    )
}

/// Outbound half: one message per item. `poll_flush` pushes buffered messages to the peer.
pub type MessageSink = Pin<Box<dyn Sink<OutMessage, Error = io::Error> + Send>>;

/// What a transport can say about its own sending side, for the stall watchdog
/// (`process::stall_watch`): whether it would take a message now, and its flow-control state
/// in words for the log. Only a transport with flow control of its own (a Noise virtual
/// stream, `secure-transport.md` §7) has one.
pub trait FlowProbe: Send + Sync {
    /// Whether the transport would accept another message now (window credit and queue
    /// room), or `None` once it is gone.
    fn can_send(&self) -> Option<bool> {
        self.snapshot().map(|s| s.can_send)
    }
    /// The sending side now, or `None` once it is gone.
    fn snapshot(&self) -> Option<FlowSnapshot>;
    /// Its flow-control state for the log (`sent 12 acked 8 window 16 …`).
    fn describe(&self) -> String;
}

/// One look at a transport's sending side (a [`FlowProbe`]'s), for the stall watchdog.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowSnapshot {
    /// It would take a message now: window credit, and room in the link's queue.
    pub can_send: bool,
    /// Records (or messages) it sent so far: any change is progress.
    pub sent: u64,
    /// Bytes queued on the link the transport shares with other streams, all streams'
    /// (0 for a transport of its own).
    pub link_queued_bytes: u64,
}

/// One client connection, framed.
pub struct Transport {
    /// Messages from the peer.
    pub incoming: MessageStream,
    /// Messages to the peer.
    pub outgoing: MessageSink,
    /// A human-readable peer description for logs (`stdio`, `127.0.0.1:5555`).
    pub peer: String,
    /// Whether `outgoing` carries [`OutMessage::Binary`] (`protocol.md` §5.1): a WebSocket as
    /// binary frames, a Noise stream as a length-prefixed message whose first byte is `0x00`;
    /// not stdio, whose framing is lines of JSON.
    pub binary_messages: bool,
    /// The sending side's flow-control state, where the transport has one (Noise streams).
    pub flow: Option<std::sync::Arc<dyn FlowProbe>>,
}
