//! The exec server's and the client's link: an [`Endpoint`] core driven by the I/O loop, with
//! the application's handles (open requests, openings, streams).
//!
//! # Who owns what
//!
//! - The core (`Endpoint`) owns the stream table, the flow-control state and the send queue
//!   (`DATA` waiting for the writer). It sits in `Shared::inner` behind a `std::sync::Mutex`
//!   that no one holds across an `.await`.
//! - Each open stream has a *slot* beside the core: the sender of its inbound queue (bounded
//!   by the window), the waker of a sender waiting for credit, and the cell its handles read
//!   the end reason from.
//! - Handles never take the core's lock in `Drop` (a drop may happen while it is held):
//!   they push onto a small graveyard, processed by the next holder of the lock, and wake the
//!   writer so that happens soon.
//!
//! # Using it
//!
//! ```text
//! server: let (link, mut incoming) = EndpointLink::spawn_server(ws, cfg)?;
//!         while let Some(req) = incoming.next().await {      // one per OPEN
//!             // check req.payload() (handshake message 1), authorize, then:
//!             let stream = req.accept(msg2)?;               // or req.refuse / handshake_failed
//!         }
//! client: let link = EndpointLink::spawn_client(ws, cfg)?;
//!         let Accepted { payload: msg2, stream } = link.open(id, msg1)?.await?;
//! both:   stream.sender.send_with(|seq| seal(seq, plaintext)).await?;
//!         let (seq, ciphertext) = stream.receiver.recv().await?;
//! ```

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::WebSocketStream;

use super::stream::{EndCell, StreamError, StreamHandle, StreamReceiver, StreamSender};
use super::{now, run_io, seed, LinkCore, LinkSignals};
use crate::config::{ConfigError, EndpointConfig};
use crate::endpoint::{Endpoint, Event, ResetCause, Side, UseError};
use crate::frame::StreamId;
use crate::reason::{CloseReason, Counters, Reason};
use crate::transmit::Transmit;

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

type OpenReply = oneshot::Sender<Result<Accepted, StreamError>>;

pub(crate) struct Slot {
    inbound: Option<mpsc::Sender<(u64, Bytes)>>,
    pub(crate) send_waker: Option<Waker>,
    end: EndCell,
    halves: u8,
}

pub(crate) struct Inner {
    pub(crate) ep: Endpoint,
    pub(crate) slots: HashMap<StreamId, Slot>,
    openings: HashMap<StreamId, OpenReply>,
    incoming: Option<mpsc::Sender<OpenRequest>>,
    /// Server: the `OPEN`s reported and not yet answered, each with the generation of its
    /// [`OpenRequest`] and the sender whose drop tells it the stream is gone.
    pending: HashMap<StreamId, PendingOpen>,
    /// The generation of the next [`OpenRequest`].
    next_generation: u64,
}

/// One unanswered `OPEN`, beside the core.
struct PendingOpen {
    generation: u64,
    /// Dropped when the stream ends before its answer (peer `RESET`, a broken rule, the link
    /// closing): [`OpenRequest::cancelled`] resolves.
    _cancel: oneshot::Sender<()>,
}

/// The state of one link shared by its tasks and handles.
pub(crate) struct Shared {
    inner: Mutex<Inner>,
    graveyard: Mutex<Vec<Dropped>>,
    signals: LinkSignals,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock cannot leave the core half-updated in a way worse than
    // stopping; keep serving rather than poisoning every later caller.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    /// Run `f` on the core, then: report its events to the handles, signal a close, wake the
    /// writer if there is something to write.
    pub(crate) fn with<R>(this: &Arc<Self>, f: impl FnOnce(&mut Inner) -> R) -> R {
        let mut inner = lock(&this.inner);
        let buried: Vec<Dropped> = std::mem::take(&mut *lock(&this.graveyard));
        for d in buried {
            inner.bury(d);
        }
        let r = f(&mut inner);
        inner.dispatch(this);
        if let Some(reason) = inner.ep.is_closed() {
            this.signals.close(reason);
        } else if inner.ep.has_transmit() {
            this.signals.writer.notify_one();
        }
        r
    }

    pub(crate) fn bury(&self, d: Dropped) {
        lock(&self.graveyard).push(d);
        self.signals.writer.notify_one();
    }
}

impl Inner {
    fn new_handle(&mut self, link: &Arc<Shared>, id: StreamId) -> StreamHandle {
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
                link: link.clone(),
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

    fn dispatch(&mut self, link: &Arc<Shared>) {
        while let Some(ev) = self.ep.poll_event() {
            match ev {
                Event::OpenRequested {
                    stream,
                    flags,
                    payload,
                } => {
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
                        link: link.clone(),
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

    fn on_frame(this: &Arc<Self>, now: Instant, msg: Vec<u8>) {
        Shared::with(this, |i| i.ep.handle_frame(now, msg));
    }

    fn on_pong(this: &Arc<Self>, now: Instant, payload: &[u8]) {
        Shared::with(this, |i| i.ep.handle_pong(now, payload));
    }

    fn on_timer(this: &Arc<Self>, now: Instant) {
        Shared::with(this, |i| i.ep.handle_timeout(now));
    }

    fn next_timer(this: &Arc<Self>) -> Option<Instant> {
        lock(&this.inner).ep.poll_timeout()
    }

    fn poll_batch(this: &Arc<Self>, now: Instant, out: &mut Vec<Transmit>, max_bytes: usize) {
        Shared::with(this, |i| {
            let mut bytes = 0;
            while bytes < max_bytes {
                let Some(t) = i.ep.poll_transmit(now) else {
                    break;
                };
                bytes += match &t {
                    Transmit::Frame(f) => f.wire_len(),
                    Transmit::Ping(p) => p.len(),
                };
                out.push(t);
            }
        });
    }

    fn on_closed(this: &Arc<Self>, reason: CloseReason) {
        Shared::with(this, |i| i.ep.close(reason));
        this.signals.close(reason);
    }

    fn write_timeout(this: &Arc<Self>) -> Duration {
        lock(&this.inner).ep.write_timeout()
    }
}

/// One endpoint link (exec server or client), driven by its own tasks. Cloning shares it.
#[derive(Debug, Clone)]
pub struct EndpointLink {
    shared: Arc<Shared>,
}

/// Server side: the `OPEN`s of the peer, one [`OpenRequest`] each.
#[derive(Debug)]
pub struct Incoming {
    rx: mpsc::Receiver<OpenRequest>,
}

impl Incoming {
    /// The next `OPEN`; `None` once the link is closed.
    pub async fn next(&mut self) -> Option<OpenRequest> {
        self.rx.recv().await
    }
}

impl EndpointLink {
    fn spawn<S>(
        ws: WebSocketStream<S>,
        side: Side,
        cfg: EndpointConfig,
        incoming: Option<mpsc::Sender<OpenRequest>>,
    ) -> Result<Self, ConfigError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let ep = Endpoint::new(side, cfg, now(), seed())?;
        let shared = Arc::new(Shared {
            inner: Mutex::new(Inner {
                ep,
                slots: HashMap::new(),
                openings: HashMap::new(),
                incoming,
                pending: HashMap::new(),
                next_generation: 0,
            }),
            graveyard: Mutex::new(Vec::new()),
            signals: LinkSignals::new(),
        });
        tokio::spawn(run_io(ws, shared.clone(), None));
        Ok(EndpointLink { shared })
    }

    /// Drive a client link over `ws` (already upgraded, configured with
    /// [`link_websocket_config`](super::link_websocket_config)).
    pub fn spawn_client<S>(ws: WebSocketStream<S>, cfg: EndpointConfig) -> Result<Self, ConfigError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        EndpointLink::spawn(ws, Side::Client, cfg, None)
    }

    /// Drive a server link over `ws`; the peer's `OPEN`s arrive on the [`Incoming`].
    pub fn spawn_server<S>(
        ws: WebSocketStream<S>,
        cfg: EndpointConfig,
    ) -> Result<(Self, Incoming), ConfigError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (tx, rx) = mpsc::channel(cfg.max_pending_opens.max(1));
        let link = EndpointLink::spawn(ws, Side::Server, cfg, Some(tx))?;
        Ok((link, Incoming { rx }))
    }

    /// Client: open `stream` with handshake message 1; resolves to the server's message 2 and
    /// the stream, or to the reason it was refused.
    pub fn open(&self, stream: StreamId, msg1: Bytes) -> Result<Opening, StreamError> {
        self.open_with_flags(stream, 0, msg1)
    }

    /// Client: [`open`](Self::open) with `flags` on the `OPEN` (bits 0–1: the Noise suite).
    pub fn open_with_flags(
        &self,
        stream: StreamId,
        flags: u16,
        msg1: Bytes,
    ) -> Result<Opening, StreamError> {
        let (tx, rx) = oneshot::channel();
        Shared::with(&self.shared, |i| {
            if let Some(reason) = i.ep.is_closed() {
                return Err(StreamError::LinkClosed(reason));
            }
            i.ep.open_with_flags(stream, flags, msg1)?;
            i.openings.insert(stream, tx);
            Ok::<_, StreamError>(())
        })?;
        Ok(Opening {
            link: self.shared.clone(),
            stream,
            rx,
            done: false,
        })
    }

    /// Close the link (every stream ends with it).
    pub fn close(&self) {
        <Shared as LinkCore>::on_closed(&self.shared, CloseReason::Local);
    }

    /// Wait until the link is over; why it ended.
    pub fn closed(&self) -> impl Future<Output = CloseReason> + Send + 'static {
        self.shared.signals.wait_closed()
    }

    /// Why the link ended, if it has.
    pub fn close_reason(&self) -> Option<CloseReason> {
        *self.shared.signals.closed.borrow()
    }

    /// A copy of the link's counters.
    pub fn counters(&self) -> Counters {
        lock(&self.shared.inner).ep.counters().clone()
    }

    /// Streams held (any state).
    pub fn stream_count(&self) -> usize {
        lock(&self.shared.inner).ep.stream_count()
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

/// Client: an `OPEN` awaiting its answer. Dropping it abandons the stream.
#[derive(Debug)]
pub struct Opening {
    link: Arc<Shared>,
    stream: StreamId,
    rx: oneshot::Receiver<Result<Accepted, StreamError>>,
    done: bool,
}

impl Future for Opening {
    type Output = Result<Accepted, StreamError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let r = match Pin::new(&mut self.rx).poll(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Ok(r)) => r,
            Poll::Ready(Err(_)) => Err(StreamError::Closed),
        };
        self.done = true;
        Poll::Ready(r)
    }
}

impl Drop for Opening {
    fn drop(&mut self) {
        if !self.done {
            self.link.bury(Dropped::Opening(self.stream));
        }
    }
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
        self.flags & crate::frame::OPEN_SUITE_MASK
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
        let (id, generation, link) = (self.stream, self.generation, self.link.clone());
        Shared::with(&self.link, |i| {
            if !i.take_pending(&id, generation) {
                return Err(UseError::UnknownStream.into());
            }
            i.ep.accept(id, msg2)?;
            Ok(i.new_handle(&link, id))
        })
    }

    /// Refuse without charge (`busy`, limits).
    pub fn refuse(mut self, reason: Reason) {
        self.answered = true;
        let (id, generation) = (self.stream, self.generation);
        Shared::with(&self.link, |i| {
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
        Shared::with(&self.link, |i| {
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
