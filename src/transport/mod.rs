//! Transports (layer 1): how JSON-RPC messages reach a connection
//! (`connection::ConnectionProcessor`, a higher layer this module never imports).
//!
//! A transport turns a byte pipe (stdio, a WebSocket, later a Noise virtual stream) into a
//! [`Transport`]: a stream of whole inbound messages and a sink of outbound messages. It owns
//! framing and the message size limit. It must never interpret JSON-RPC: that is the
//! connection processor's job.

use std::io;
use std::pin::Pin;

use futures_util::{Sink, Stream};

pub mod line_codec;
pub mod stdio;
pub mod websocket;

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
pub type MessageStream = Pin<Box<dyn Stream<Item = Result<Vec<u8>, FramingError>> + Send>>;

/// Outbound half: one JSON text per item. `poll_flush` pushes buffered messages to the peer.
pub type MessageSink = Pin<Box<dyn Sink<String, Error = io::Error> + Send>>;

/// One client connection, framed.
pub struct Transport {
    /// Messages from the peer.
    pub incoming: MessageStream,
    /// Messages to the peer.
    pub outgoing: MessageSink,
    /// A human-readable peer description for logs (`stdio`, `127.0.0.1:5555`).
    pub peer: String,
}
