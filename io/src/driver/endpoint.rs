//! The exec server's and the client's link: an [`Endpoint`] core driven by the I/O loop, with
//! the application's handles (open requests, openings, streams).
//!
//! # Who owns what
//!
//! The state below lives in `link_state.rs`; this file is the application's API.
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
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::WebSocketStream;

use super::{LinkSocket, ReadAhead};

pub use super::link_state::{Accepted, OpenRequest};
use super::link_state::{Dropped, Inner, Shared};
use super::stream::StreamError;
use super::{now, run_io, seed, LinkCore, LinkSignals};
use execrelay_protocol::config::{ConfigError, EndpointConfig};
use execrelay_protocol::endpoint::{Endpoint, Side};
use execrelay_protocol::frame::StreamId;
use execrelay_protocol::reason::{CloseReason, Counters};
use execrelay_protocol::sync::lock;

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
        ws: WebSocketStream<ReadAhead<S>>,
        side: Side,
        cfg: EndpointConfig,
        incoming: Option<mpsc::Sender<OpenRequest>>,
    ) -> Result<Self, ConfigError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let ep = Endpoint::new(side, cfg, now(), seed())?;
        let shared = Arc::new_cyclic(|me| Shared {
            me: me.clone(),
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
        let core = shared.clone();
        tokio::spawn(async move {
            let sock = LinkSocket::from_websocket(ws).await;
            run_io(sock, core, None).await
        });
        Ok(EndpointLink { shared })
    }

    /// Drive a client link over `ws` (already upgraded over [`ReadAhead::websocket_client`]
    /// or [`ReadAhead::websocket`], configured with
    /// [`link_websocket_config`](super::link_websocket_config)); the driver takes the socket
    /// over from tungstenite ([`LinkSocket`]).
    pub fn spawn_client<S>(
        ws: WebSocketStream<ReadAhead<S>>,
        cfg: EndpointConfig,
    ) -> Result<Self, ConfigError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        EndpointLink::spawn(ws, Side::Client, cfg, None)
    }

    /// Drive a server link over `ws` (upgraded over [`ReadAhead::websocket`] when accepted,
    /// [`ReadAhead::websocket_client`] when dialled to a relay); the peer's `OPEN`s arrive
    /// on the [`Incoming`].
    pub fn spawn_server<S>(
        ws: WebSocketStream<ReadAhead<S>>,
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
        self.shared.with(|i| {
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

    /// The reason the peer gave in its close frame, when it gave one of ours (a relay closes
    /// a client link `moved` when its environment moves between relays): why the link ended,
    /// as the other end saw it. `None` while the link is up, and when the peer gave none.
    pub fn peer_close_reason(&self) -> Option<CloseReason> {
        self.shared.signals.peer_said.get().copied()
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
