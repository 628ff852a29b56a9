//! The shared state of one [`EndpointLink`](super::EndpointLink): the [`Endpoint`] core
//! behind its lock, a slot per open stream beside it, the graveyard of handles dropped while
//! the lock may have been held, and what the core's events become for the application (new
//! [`OpenRequest`]s, [`Accepted`] streams, records in a stream's queue, wakers, end reasons).
//! The I/O loop drives it through [`LinkCore`]; the stream handles through [`StreamLink`].
//!
//! It never awaits and never holds its lock across a call out of the link: a handle's `Drop`
//! only queues (see `endpoint.rs`, "Who owns what").

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};

use super::stream::{
    EndCell, LinkRef, StreamError, StreamHandle, StreamLink, StreamReceiver, StreamSender,
};
use super::{now, LinkCore, LinkSignals};
use execrelay_protocol::batch::Batch;
use execrelay_protocol::endpoint::{
    Endpoint, Event, RecvFlow, ResetCause, SendError, StreamFlow, UseError,
};
use execrelay_protocol::frame::StreamId;
use execrelay_protocol::reason::{CloseReason, Reason};
use execrelay_protocol::sync::lock;
use execrelay_protocol::transmit::Transmit;

/// A handle dropped while the core's lock may have been held; processed by the next holder.
#[derive(Debug)]
pub(crate) enum Dropped {
    /// A receiver, with the last `seq` it discarded.
    Receiver(StreamId, Option<u64>),
    Sender(StreamId),
    /// An `OpenRequest` never answered, with its generation.
    Unanswered(StreamId, u64),
    /// An `Opening` abandoned before its answer.
    Opening(StreamId),
}

pub(super) type OpenReply = oneshot::Sender<Result<Accepted, StreamError>>;

pub(crate) struct Slot {
    inbound: Option<mpsc::Sender<(u64, Bytes)>>,
    pub(crate) send_waker: Option<Waker>,
    end: EndCell,
    halves: u8,
}

pub(crate) struct Inner {
    pub(crate) ep: Endpoint,
    pub(crate) slots: HashMap<StreamId, Slot>,
    pub(super) openings: HashMap<StreamId, OpenReply>,
    pub(super) incoming: Option<mpsc::Sender<OpenRequest>>,
    /// Server: the `OPEN`s reported and not yet answered, each with the generation of its
    /// [`OpenRequest`] and the sender whose drop tells it the stream is gone.
    pub(super) pending: HashMap<StreamId, PendingOpen>,
    /// The generation of the next [`OpenRequest`].
    pub(super) next_generation: u64,
}

/// One unanswered `OPEN`, beside the core.
pub(super) struct PendingOpen {
    generation: u64,
    /// Dropped when the stream ends before its answer (peer `RESET`, a broken rule, the link
    /// closing): [`OpenRequest::cancelled`] resolves.
    _cancel: oneshot::Sender<()>,
}

/// The state of one link shared by its tasks and handles.
pub(crate) struct Shared {
    /// Itself, for the handles and requests it hands out (they hold the link alive).
    pub(super) me: Weak<Shared>,
    pub(super) inner: Mutex<Inner>,
    pub(super) graveyard: Mutex<Vec<Dropped>>,
    pub(super) signals: LinkSignals,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").finish_non_exhaustive()
    }
}

impl Shared {
    /// Run `f` on the core, then: report its events to the handles, signal a close, wake the
    /// writer if there is something to write.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        let mut inner = lock(&self.inner);
        let buried: Vec<Dropped> = std::mem::take(&mut *lock(&self.graveyard));
        for d in buried {
            inner.bury(d);
        }
        let r = f(&mut inner);
        inner.dispatch(&self.me);
        if let Some(reason) = inner.ep.is_closed() {
            self.signals.close(reason);
        } else if inner.ep.has_transmit() {
            self.signals.writer.notify_one();
        }
        r
    }

    pub(crate) fn bury(&self, d: Dropped) {
        lock(&self.graveyard).push(d);
        self.signals.writer.notify_one();
    }
}

impl StreamLink for Shared {
    fn consumed(&self, id: StreamId, seq: u64) {
        // Only fails if the stream is already gone: nothing to acknowledge then.
        self.with(|inner| {
            let _ = inner.ep.consumed(&id, seq);
        });
    }

    fn send_ready(&self, id: StreamId, waker: &Waker) -> Poll<Result<u64, SendError>> {
        self.with(|inner| match inner.ep.send_ready(&id) {
            Ok(seq) => Poll::Ready(Ok(seq)),
            Err(SendError::Blocked) => match inner.slots.get_mut(&id) {
                Some(slot) => {
                    slot.send_waker = Some(waker.clone());
                    Poll::Pending
                }
                None => Poll::Ready(Err(SendError::NotOpen)),
            },
            Err(e) => Poll::Ready(Err(e)),
        })
    }

    fn send(&self, id: StreamId, record: Bytes) -> Result<u64, SendError> {
        self.with(|inner| inner.ep.send(&id, record))
    }

    fn end(&self, id: StreamId, reason: Reason, reset: bool) {
        self.with(|inner| {
            let _ = if reset {
                inner.ep.reset(id, reason)
            } else {
                inner.ep.finish(id, reason)
            };
            inner.end_slot(&id, StreamError::Closed);
        });
    }

    fn stream_flow(&self, id: StreamId) -> Option<StreamFlow> {
        self.with(|inner| inner.ep.stream_flow(&id))
    }

    fn stream_recv_flow(&self, id: StreamId) -> Option<RecvFlow> {
        self.with(|inner| inner.ep.stream_recv_flow(&id))
    }

    fn receiver_dropped(&self, id: StreamId, last: Option<u64>) {
        self.bury(Dropped::Receiver(id, last));
    }

    fn sender_dropped(&self, id: StreamId) {
        self.bury(Dropped::Sender(id));
    }
}

impl Inner {
    fn new_handle(&mut self, link: LinkRef, id: StreamId) -> StreamHandle {
        let (tx, rx) = mpsc::channel(self.ep.config().window as usize);
        let end: EndCell = Arc::new(Mutex::new(None));
        self.slots.insert(
            id,
            Slot {
                inbound: Some(tx),
                send_waker: None,
                end: end.clone(),
                halves: 2,
            },
        );
        StreamHandle {
            receiver: StreamReceiver {
                link: link.clone(),
                id,
                rx,
                end: end.clone(),
            },
            sender: StreamSender {
                link,
                id,
                end,
                live: true,
            },
        }
    }

    /// The stream ended: its handles learn `why` (the receiver after its queued records).
    pub(crate) fn end_slot(&mut self, id: &StreamId, why: StreamError) {
        if let Some(mut slot) = self.slots.remove(id) {
            *lock(&slot.end) = Some(why);
            if let Some(w) = slot.send_waker.take() {
                w.wake();
            }
        }
    }

    fn bury(&mut self, d: Dropped) {
        match d {
            Dropped::Receiver(id, last) => {
                if let Some(seq) = last {
                    let _ = self.ep.consumed(&id, seq);
                }
                if let Some(slot) = self.slots.get_mut(&id) {
                    slot.inbound = None;
                }
                self.half_gone(id);
            }
            Dropped::Sender(id) => self.half_gone(id),
            Dropped::Unanswered(id, generation) => {
                if self.take_pending(&id, generation) {
                    let _ = self.ep.refuse(id, Reason::Closed);
                }
            }
            Dropped::Opening(id) => {
                if self.openings.remove(&id).is_some() {
                    let _ = self.ep.reset(id, Reason::Closed);
                }
            }
        }
    }

    /// Whether `generation` is the unanswered `OPEN` of `id` now (not a request for an
    /// earlier stream that used the same id and was reset meanwhile); if so, it is answered.
    fn take_pending(&mut self, id: &StreamId, generation: u64) -> bool {
        if self
            .pending
            .get(id)
            .is_some_and(|p| p.generation == generation)
        {
            self.pending.remove(id);
            true
        } else {
            false
        }
    }

    fn half_gone(&mut self, id: StreamId) {
        if let Some(slot) = self.slots.get_mut(&id) {
            slot.halves = slot.halves.saturating_sub(1);
            if slot.halves == 0 {
                self.slots.remove(&id);
                let _ = self.ep.finish(id, Reason::Closed);
            }
        }
    }

    fn dispatch(&mut self, link: &Weak<Shared>) {
        while let Some(ev) = self.ep.poll_event() {
            match ev {
                Event::OpenRequested {
                    stream,
                    flags,
                    payload,
                } => {
                    // Gone only while the last handle drops: nobody to answer it then.
                    let Some(link) = link.upgrade() else {
                        let _ = self.ep.refuse(stream, Reason::Closed);
                        continue;
                    };
                    let generation = self.next_generation;
                    self.next_generation += 1;
                    let (cancel, cancelled) = oneshot::channel();
                    self.pending.insert(
                        stream,
                        PendingOpen {
                            generation,
                            _cancel: cancel,
                        },
                    );
                    let req = OpenRequest {
                        link,
                        stream,
                        generation,
                        flags,
                        payload,
                        cancelled: Some(cancelled),
                        answered: false,
                    };
                    let refused = match &self.incoming {
                        Some(tx) => tx.try_send(req).err().map(|e| match e {
                            mpsc::error::TrySendError::Full(r)
                            | mpsc::error::TrySendError::Closed(r) => r,
                        }),
                        None => Some(req),
                    };
                    if let Some(mut req) = refused {
                        req.answered = true;
                        self.pending.remove(&stream);
                        let _ = self.ep.refuse(stream, Reason::Busy);
                    }
                }
                Event::Accepted { stream, payload } => match self.openings.remove(&stream) {
                    Some(reply) => {
                        let Some(link) = link.upgrade() else {
                            let _ = self.ep.reset(stream, Reason::Closed);
                            continue;
                        };
                        let handle = self.new_handle(link, stream);
                        // If the opener left, the handle's drop finishes the stream.
                        let _ = reply.send(Ok(Accepted {
                            payload,
                            stream: handle,
                        }));
                    }
                    None => {
                        let _ = self.ep.reset(stream, Reason::Closed);
                    }
                },
                Event::Data {
                    stream,
                    seq,
                    payload,
                } => {
                    let inbound = self.slots.get(&stream).and_then(|s| s.inbound.as_ref());
                    match inbound.map(|tx| tx.try_send((seq, payload))) {
                        Some(Ok(())) => {}
                        Some(Err(mpsc::error::TrySendError::Full(_))) => {
                            // The core checked the window; a full queue means it was broken.
                            let _ = self.ep.reset(stream, Reason::WindowExceeded);
                            self.end_slot(&stream, StreamError::LocalReset(Reason::WindowExceeded));
                        }
                        // Nobody reads: consume, so the peer is not held back.
                        Some(Err(mpsc::error::TrySendError::Closed(_))) | None => {
                            let _ = self.ep.consumed(&stream, seq);
                        }
                    }
                }
                Event::Writable { stream } => {
                    if let Some(w) = self
                        .slots
                        .get_mut(&stream)
                        .and_then(|s| s.send_waker.take())
                    {
                        w.wake();
                    }
                }
                Event::Reset { stream, cause } => {
                    let why = match cause {
                        ResetCause::Peer(r) => StreamError::PeerReset(r),
                        ResetCause::Local(r) => StreamError::LocalReset(r),
                    };
                    if let Some(reply) = self.openings.remove(&stream) {
                        let _ = reply.send(Err(why.clone()));
                    }
                    // An unanswered OPEN: its request learns it is gone.
                    self.pending.remove(&stream);
                    self.end_slot(&stream, why);
                }
                Event::Closed { reason } => {
                    let ids: Vec<StreamId> = self.slots.keys().copied().collect();
                    for id in ids {
                        self.end_slot(&id, StreamError::LinkClosed(reason));
                    }
                    for (_, reply) in self.openings.drain() {
                        let _ = reply.send(Err(StreamError::LinkClosed(reason)));
                    }
                    self.pending.clear();
                    self.incoming = None;
                }
            }
        }
    }
}

impl LinkCore for Shared {
    fn signals(this: &Arc<Self>) -> &LinkSignals {
        &this.signals
    }

    fn on_frame(this: &Arc<Self>, now: Instant, msg: Bytes) {
        this.with(|i| i.ep.handle_frame(now, msg));
    }

    fn on_pong(this: &Arc<Self>, now: Instant, payload: &[u8]) {
        this.with(|i| i.ep.handle_pong(now, payload));
    }

    fn on_timer(this: &Arc<Self>, now: Instant) {
        this.with(|i| i.ep.handle_timeout(now));
    }

    fn next_timer(this: &Arc<Self>) -> Option<Instant> {
        lock(&this.inner).ep.poll_timeout()
    }

    fn poll_batch(this: &Arc<Self>, now: Instant, out: &mut Batch<Transmit>) {
        this.with(|i| {
            while out.has_room() {
                let Some(t) = i.ep.poll_transmit(now) else {
                    break;
                };
                let n = match &t {
                    Transmit::Frame(f) => f.wire_len(),
                    Transmit::Ping(p) => p.len(),
                };
                out.push(t, n);
            }
        });
    }

    fn on_closed(this: &Arc<Self>, reason: CloseReason) {
        this.with(|i| i.ep.close(reason));
        this.signals.close(reason);
    }

    fn write_timeout(this: &Arc<Self>) -> Duration {
        lock(&this.inner).ep.write_timeout()
    }
}

/// What an accepted `OPEN` gives the client.
#[derive(Debug)]
pub struct Accepted {
    /// The `ACCEPT` payload (handshake message 2).
    pub payload: Bytes,
    /// The stream.
    pub stream: StreamHandle,
}

/// Server: one `OPEN` of the peer, to accept or refuse. Dropping it unanswered refuses it.
///
/// If the stream ends before it is answered (the peer resets it, breaks a rule on it, or the
/// link closes), [`cancelled`](Self::cancelled) resolves and every answer is a no-op: work
/// done for it (authorization) can stop at once, and an answer that comes late never touches
/// a newer stream that reuses the id.
#[derive(Debug)]
pub struct OpenRequest {
    link: Arc<Shared>,
    stream: StreamId,
    /// Which `OPEN` of `stream` this is (ids may be reused after a reset).
    generation: u64,
    flags: u16,
    payload: Bytes,
    /// Resolves (the sender dropped) once the stream is gone unanswered.
    cancelled: Option<oneshot::Receiver<()>>,
    answered: bool,
}

impl OpenRequest {
    /// The stream id.
    pub fn stream(&self) -> StreamId {
        self.stream
    }

    /// The `OPEN` payload (handshake message 1).
    pub fn payload(&self) -> &Bytes {
        &self.payload
    }

    /// The Noise suite number the client chose (bits 0–1 of the `OPEN`'s flags).
    pub fn suite_bits(&self) -> u16 {
        self.flags & execrelay_protocol::frame::OPEN_SUITE_MASK
    }

    /// Resolves once the stream ended before its answer (the peer reset it, broke a rule on
    /// it, or the link closed); then every answer is a no-op. Cancel-safe; resolves at once
    /// every time after the first.
    pub async fn cancelled(&mut self) {
        if let Some(rx) = self.cancelled.as_mut() {
            let _ = rx.await;
            self.cancelled = None;
        }
    }

    /// Accept with handshake message 2 as payload. `UseError::UnknownStream` if the stream
    /// ended meanwhile ([`cancelled`](Self::cancelled)).
    pub fn accept(mut self, msg2: Bytes) -> Result<StreamHandle, StreamError> {
        self.answered = true;
        let (id, generation) = (self.stream, self.generation);
        let link: LinkRef = self.link.clone();
        self.link.with(|i| {
            if !i.take_pending(&id, generation) {
                return Err(UseError::UnknownStream.into());
            }
            i.ep.accept(id, msg2)?;
            Ok(i.new_handle(link, id))
        })
    }

    /// Refuse without charge (`busy`, limits).
    pub fn refuse(mut self, reason: Reason) {
        self.answered = true;
        let (id, generation) = (self.stream, self.generation);
        self.link.with(|i| {
            if i.take_pending(&id, generation) {
                let _ = i.ep.refuse(id, reason);
            }
        });
    }

    /// The handshake failed (bad message 1, refused authorization): refused and charged to
    /// the link's handshake-failure bucket (§8). A stream that ended meanwhile is not
    /// charged.
    pub fn handshake_failed(mut self, reason: Reason) {
        self.answered = true;
        let (id, generation) = (self.stream, self.generation);
        self.link.with(|i| {
            if i.take_pending(&id, generation) {
                let _ = i.ep.handshake_failed(now(), id, reason);
            }
        });
    }
}

impl Drop for OpenRequest {
    fn drop(&mut self) {
        if !self.answered {
            self.link
                .bury(Dropped::Unanswered(self.stream, self.generation));
        }
    }
}
