//! What a link core hands its writer: a frame, or a keepalive ping (a WebSocket ping, not a
//! frame, so it costs nothing of the frame protocol and the peer's WebSocket layer answers it
//! without involving its application).

use crate::frame::Frame;

/// One thing to write on a link, in the order the core returns them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transmit {
    /// A frame, to be written as one binary WebSocket message.
    Frame(Frame),
    /// A WebSocket ping with this payload (the keepalive counter).
    Ping([u8; 8]),
}
