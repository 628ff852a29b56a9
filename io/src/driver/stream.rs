//! The application's handles on one stream of an [`EndpointLink`](super::EndpointLink): a
//! receiver of `(seq, record)` and a sender that waits for credit.
//!
//! # Where the per-stream work runs
//!
//! Records are opaque here, so decryption and sealing run in whichever task holds the
//! handle, never on the link's reader or writer:
//!
//! - **Inbound**: the reader only moves the ciphertext into the stream's bounded queue
//!   (`try_send`). The stream's own task calls [`StreamReceiver::recv`] and decrypts with the
//!   `seq` as nonce, so several streams decrypt on several cores.
//! - **Outbound**: [`StreamSender::send_with`] waits for credit, then calls the closure with
//!   the `seq` the record will carry, in the caller's task: seal there (nonce = `seq`), and
//!   the sealed record goes straight into the link core's queue. The writer picks it up from
//!   the core: one task hop from the stream's sink to the socket, and no channel between.
//!   A `Sink` adapter uses [`StreamSender::poll_ready`] (which yields the next `seq`) and
//!   [`StreamSender::start_send`].
//!
//! Consumption (the `ack` that reopens the peer's window) is reported when `recv` hands a
//! record out, so a task that stops calling `recv` holds its peer back, end to end.
//!
//! The handles reach their link through `StreamLink`, which the link's shared state
//! (`endpoint.rs`) implements: this file imports nothing of the link, the link builds the
//! handles.

use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use tokio::sync::mpsc;

use execrelay_protocol::endpoint::{RecvFlow, SendError, StreamFlow, UseError};
use execrelay_protocol::frame::StreamId;
use execrelay_protocol::reason::{CloseReason, Reason};

/// What a stream's handles ask of their link. Each call takes the link's lock briefly and
/// never waits; none may be made while that lock is held (a handle's `Drop` only queues).
pub(crate) trait StreamLink: Send + Sync + std::fmt::Debug {
    /// Record `seq` of `id` was handed to the application (its window may reopen).
    fn consumed(&self, id: StreamId, seq: u64);
    /// The `seq` the next record of `id` will carry; `Pending` after registering `waker`
    /// for the credit it waits for.
    fn send_ready(&self, id: StreamId, waker: &Waker) -> Poll<Result<u64, SendError>>;
    /// Queue `record` on `id`; returns its `seq`.
    fn send(&self, id: StreamId, record: Bytes) -> Result<u64, SendError>;
    /// End `id` on purpose with `reason`: queued records go out first (`finish`), or are
    /// dropped (`reset`). Its handles then read [`StreamError::Closed`].
    fn end(&self, id: StreamId, reason: Reason, reset: bool);
    /// The sending direction of `id` now, or `None` once it is gone.
    fn stream_flow(&self, id: StreamId) -> Option<StreamFlow>;
    /// The receiving direction of `id` now, or `None` once it is gone.
    fn stream_recv_flow(&self, id: StreamId) -> Option<RecvFlow>;
    /// The receiver of `id` was dropped, having discarded up to `last`. Only queued: a drop
    /// may happen while the link's lock is held.
    fn receiver_dropped(&self, id: StreamId, last: Option<u64>);
    /// The live sender of `id` was dropped. Only queued, as above.
    fn sender_dropped(&self, id: StreamId);
}

/// A handle's link.
pub(crate) type LinkRef = Arc<dyn StreamLink>;

/// Why a stream can no longer be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StreamError {
    /// The peer sent `RESET` (its words, unauthenticated).
    #[error("the peer reset the stream: {0}")]
    PeerReset(String),
    /// This end reset it because the peer broke a rule.
    #[error("the stream was reset: {0}")]
    LocalReset(Reason),
    /// The link ended.
    #[error("the link closed: {0}")]
    LinkClosed(CloseReason),
    /// The stream was finished or reset by this application.
    #[error("the stream is closed")]
    Closed,
    /// A call the engine refused.
    #[error("{0}")]
    Use(#[from] UseError),
}

/// How a stream ended, shared by its handles and the link.
pub(crate) type EndCell = Arc<Mutex<Option<StreamError>>>;

pub(crate) fn ended(cell: &EndCell) -> StreamError {
    match cell.lock() {
        Ok(g) => g.clone().unwrap_or(StreamError::Closed),
        Err(_) => StreamError::Closed,
    }
}

/// Both halves of a stream.
#[derive(Debug)]
pub struct StreamHandle {
    /// Inbound records.
    pub receiver: StreamReceiver,
    /// Outbound records.
    pub sender: StreamSender,
}

impl StreamHandle {
    /// The stream id.
    pub fn id(&self) -> StreamId {
        self.sender.id
    }

    /// The two halves, for two tasks.
    pub fn split(self) -> (StreamReceiver, StreamSender) {
        (self.receiver, self.sender)
    }
}

/// The receiving half. Dropping it discards later records (consuming them, so the peer is
/// never held back by a reader that left); dropping both halves finishes the stream.
#[derive(Debug)]
pub struct StreamReceiver {
    pub(crate) link: LinkRef,
    pub(crate) id: StreamId,
    pub(crate) rx: mpsc::Receiver<(u64, Bytes)>,
    pub(crate) end: EndCell,
}

impl StreamReceiver {
    /// The stream id.
    pub fn id(&self) -> StreamId {
        self.id
    }

    /// The next record and its `seq`, reported consumed as it is handed out. After the stream
    /// ends, the records already queued still come, then the reason.
    pub async fn recv(&mut self) -> Result<(u64, Bytes), StreamError> {
        std::future::poll_fn(|cx| self.poll_recv(cx)).await
    }

    /// Poll form of [`recv`](Self::recv).
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Result<(u64, Bytes), StreamError>> {
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some((seq, payload))) => {
                self.link.consumed(self.id, seq);
                Poll::Ready(Ok((seq, payload)))
            }
            Poll::Ready(None) => Poll::Ready(Err(ended(&self.end))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for StreamReceiver {
    fn drop(&mut self) {
        let mut last = None;
        while let Ok((seq, _)) = self.rx.try_recv() {
            last = Some(seq);
        }
        self.link.receiver_dropped(self.id, last);
    }
}

/// The sending half. Dropping it (with the receiver gone too) finishes the stream: records
/// already queued go out, then `RESET` `closed`.
#[derive(Debug)]
pub struct StreamSender {
    pub(crate) link: LinkRef,
    pub(crate) id: StreamId,
    pub(crate) end: EndCell,
    pub(crate) live: bool,
}

impl StreamSender {
    /// The stream id.
    pub fn id(&self) -> StreamId {
        self.id
    }

    /// A handle that reads this stream's flow-control state (for a watchdog), without sending.
    pub fn probe(&self) -> FlowProbe {
        FlowProbe {
            link: self.link.clone(),
            id: self.id,
        }
    }

    /// Ready when the window and the link's queue take one more record; yields the `seq` it
    /// will carry. Registers for a wake-up otherwise.
    pub fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<u64, StreamError>> {
        match self.link.send_ready(self.id, cx.waker()) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(seq)) => Poll::Ready(Ok(seq)),
            Poll::Ready(Err(e)) => Poll::Ready(Err(self.error(e))),
        }
    }

    /// Queue one record (after [`poll_ready`](Self::poll_ready) said yes); returns its `seq`.
    pub fn start_send(&mut self, record: Bytes) -> Result<u64, StreamError> {
        self.link.send(self.id, record).map_err(|e| self.error(e))
    }

    /// Wait for credit, then send `record`.
    pub async fn send(&mut self, record: Bytes) -> Result<u64, StreamError> {
        std::future::poll_fn(|cx| self.poll_ready(cx)).await?;
        self.start_send(record)
    }

    /// Wait for credit, then build the record for its `seq` in this task (seal it with
    /// `seq` as the nonce) and send it.
    pub async fn send_with<F>(&mut self, build: F) -> Result<u64, StreamError>
    where
        F: FnOnce(u64) -> Bytes,
    {
        let seq = std::future::poll_fn(|cx| self.poll_ready(cx)).await?;
        let sent = self.start_send(build(seq))?;
        debug_assert_eq!(sent, seq, "one sender per stream: the seq cannot move");
        Ok(sent)
    }

    /// Finish the stream: queued records go out, then `RESET` with `reason`.
    pub fn finish(mut self, reason: Reason) {
        self.link.end(self.id, reason, false);
        self.live = false;
    }

    /// Reset the stream now: queued records are dropped, `RESET` with `reason` goes out.
    pub fn reset(mut self, reason: Reason) {
        self.link.end(self.id, reason, true);
        self.live = false;
    }

    fn error(&self, e: SendError) -> StreamError {
        match e {
            SendError::LinkClosed | SendError::NotOpen | SendError::Blocked => ended(&self.end),
            SendError::TooLarge => StreamError::Use(UseError::TooLarge),
        }
    }
}

/// Reads one stream's flow-control state ([`StreamSender::probe`]). It holds the link's
/// state alive, not the stream: a stream that ended reads as `None`.
#[derive(Debug, Clone)]
pub struct FlowProbe {
    link: LinkRef,
    id: StreamId,
}

impl FlowProbe {
    /// The stream's sending direction now, or `None` once it is gone. Takes the link's lock
    /// briefly; never waits.
    pub fn flow(&self) -> Option<StreamFlow> {
        self.link.stream_flow(self.id)
    }

    /// The stream's receiving direction now, or `None` once it is gone. Takes the link's lock
    /// briefly; never waits.
    pub fn recv_flow(&self) -> Option<RecvFlow> {
        self.link.stream_recv_flow(self.id)
    }
}

impl Drop for StreamSender {
    fn drop(&mut self) {
        if self.live {
            self.link.sender_dropped(self.id);
        }
    }
}
