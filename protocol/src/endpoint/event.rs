//! What an endpoint reports to its application, and the errors of its API.

use bytes::Bytes;

use crate::frame::StreamId;
use crate::reason::{CloseReason, Reason};

/// Something the application must know; drain with
/// [`Endpoint::poll_event`](super::Endpoint::poll_event) after every call that feeds the
/// endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Server: the peer wants to open `stream` with this `OPEN` payload (handshake message 1).
    /// Answer with [`accept`](super::Endpoint::accept), [`refuse`](super::Endpoint::refuse)
    /// or [`handshake_failed`](super::Endpoint::handshake_failed).
    OpenRequested {
        /// The stream.
        stream: StreamId,
        /// The `OPEN`'s flags (bits 0–1: the Noise suite the client chose).
        flags: u16,
        /// The `OPEN` payload.
        payload: Bytes,
    },
    /// Client: the server accepted `stream` with this `ACCEPT` payload (handshake message 2).
    Accepted {
        /// The stream.
        stream: StreamId,
        /// The `ACCEPT` payload.
        payload: Bytes,
    },
    /// A record, in order. Call [`consumed`](super::Endpoint::consumed) with its `seq` once
    /// the application has it: that is what opens the peer's window again.
    Data {
        /// The stream.
        stream: StreamId,
        /// The record number (from 1).
        seq: u64,
        /// The record (opaque: a ciphertext).
        payload: Bytes,
    },
    /// A stream that was refused [`send_ready`](super::Endpoint::send_ready) may send again.
    Writable {
        /// The stream.
        stream: StreamId,
    },
    /// The stream is gone (not reported for resets the application asked for).
    Reset {
        /// The stream.
        stream: StreamId,
        /// Who reset it and why.
        cause: ResetCause,
    },
    /// The link is over; every stream with it. Nothing more happens on this endpoint.
    Closed {
        /// Why.
        reason: CloseReason,
    },
}

/// Who reset a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResetCause {
    /// The peer sent `RESET` with this reason (its words, unauthenticated: log it, never use
    /// it as a metrics label).
    Peer(String),
    /// This endpoint reset it: the peer broke a rule.
    Local(Reason),
}

/// A call the endpoint cannot honour (the application's mistake or a race with the peer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UseError {
    /// The link is closed.
    #[error("the link is closed")]
    LinkClosed,
    /// No such stream (never opened, or already closed).
    #[error("no such stream")]
    UnknownStream,
    /// The call belongs to the other side (a server opening, a client accepting).
    #[error("not allowed on this side of the link")]
    WrongSide,
    /// The stream is not in the state this call needs.
    #[error("the stream is not in a state that allows this")]
    WrongState,
    /// The id is already in use on this link.
    #[error("stream id already in use")]
    Exists,
    /// Stream id 0 is the link's own.
    #[error("stream id 0 is reserved for the link")]
    LinkStream,
    /// The link holds its maximum of streams.
    #[error("too many streams on this link")]
    TooManyStreams,
    /// `consumed` of a record never delivered.
    #[error("record not received")]
    NotReceived,
    /// A payload over one frame's maximum.
    #[error("payload larger than a frame")]
    TooLarge,
    /// `OPEN` flags outside the suite bits.
    #[error("OPEN flags other than the Noise suite bits (0-1)")]
    BadFlags,
}

/// Why a stream cannot send now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// No window credit, or the link's send queue is full: wait for
    /// [`Event::Writable`].
    #[error("no credit: wait for the peer's window or the link's queue")]
    Blocked,
    /// The stream is not open (opening, finishing, reset or unknown).
    #[error("the stream is not open")]
    NotOpen,
    /// The payload is over one frame's maximum.
    #[error("payload larger than a frame")]
    TooLarge,
    /// The link is closed.
    #[error("the link is closed")]
    LinkClosed,
}
