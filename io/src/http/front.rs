//! The accept loop of one HTTP listener and the life of one connection up to its upgrade or
//! its reply, on hyper's HTTP/1.1 server.
//!
//! # What this module owns
//!
//! - **Admission**: at most [`FrontLimits::pending`] connections of a listener before their
//!   upgrade or reply, at most [`FrontLimits::pending_per_address`] of them from one peer
//!   address ([`AddressSlots`]); a connection over either cap is closed at once, unread.
//! - **Time**: one deadline per connection for its whole request head, fixed at accept
//!   ([`FrontLimits::head_timeout`]: a client trickling bytes is cut at it however slowly it
//!   sends); then [`REPLY_TIMEOUT_MS`] for the reply (or the `101`) and the graceful close.
//! - **Bytes**: hyper reads at most [`MAX_REQUEST_HEAD_BYTES`] of head and
//!   [`MAX_REQUEST_HEADERS`] fields (`431` beyond, `400` for a malformed head); it re-parses a
//!   partial head only when the new bytes may end it, so a trickled head costs linear time.
//! - **TLS** (a `wss://` listener, [`Front::tls`]): the handshake runs in the connection's
//!   task, inside the same head deadline and holding the same slots, so a peer that stalls
//!   its `ClientHello` costs what one that stalls its request head costs.
//! - **The hand-off**: an accepted upgrade becomes a `WebSocketStream` on the connection
//!   ([`FrontIo`]: TCP, or TLS over it) under a read-ahead buffer ([`FrontStream`]: hyper's wrappers are gone from the data path;
//!   the buffer only makes tungstenite's 4 KiB reads cheap) with the listener's
//!   `WebSocketConfig`, and goes to the caller's [`OnUpgrade`] with its route, captured id and
//!   capacity permit.
//!
//! # What it must never do
//!
//! - Speak JSON-RPC or Noise, or know sessions: what happens after the upgrade is the caller's.
//! - Keep a connection past its deadlines, or a slot past its connection.
//! - Panic on anything a peer sends.

use std::convert::Infallible;
use std::future::ready;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::Request;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_tungstenite::WebSocketStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, warn, Instrument};

use super::address_slots::AddressSlots;
use super::frame_queue::FrameQueue;
use super::limits::{
    CLOSE_DRAIN_BYTES, MAX_METRICS_SCRAPES, MAX_METRICS_SCRAPES_PER_ADDRESS, MAX_REQUEST_HEADERS,
    MAX_REQUEST_HEAD_BYTES, REPLY_TIMEOUT_MS,
};
use super::routes::{decide, Accepted, Decision, Routes};
use super::stream::FrontIo;
use crate::driver::ReadAhead;
use crate::runtimes::LinkRuntimes;
use crate::tls::TlsListener;

/// Pause after a failed `accept`: 100 ms. Failures such as running out of file descriptors
/// repeat immediately; without a pause the accept loop would spin a core while they last.
pub const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(100);

/// How much one listener lets connections take before their upgrade or reply.
#[derive(Debug, Clone)]
pub struct FrontLimits {
    /// The whole request head (and the upgrade) must arrive within this, from accept.
    pub head_timeout: Duration,
    /// Connections not yet upgraded or answered.
    pub pending: usize,
    /// The same, from one address ([`AddressSlots`]).
    pub pending_per_address: usize,
}

impl FrontLimits {
    /// The limits of a WebSocket listener (`ws://`, `noise+ws://`, the relay's): the caller's
    /// settings (the exec server's and the relay's configurations each have all three).
    pub fn websocket(head_timeout: Duration, pending: usize, pending_per_address: usize) -> Self {
        FrontLimits {
            head_timeout,
            pending,
            pending_per_address,
        }
    }

    /// The limits of a metrics listener: [`MAX_METRICS_SCRAPES`] at once,
    /// [`MAX_METRICS_SCRAPES_PER_ADDRESS`] of them from one address.
    pub fn metrics(head_timeout: Duration) -> FrontLimits {
        FrontLimits {
            head_timeout,
            pending: MAX_METRICS_SCRAPES,
            pending_per_address: MAX_METRICS_SCRAPES_PER_ADDRESS,
        }
    }
}

/// The stream under an upgraded WebSocket: the connection (TCP, or TLS over it), read through
/// a read-ahead buffer (`crate::driver::read_ahead`), over a queue on which the exec server
/// writes its data frames without copying them (`super::frame_queue`).
pub type FrontStream = ReadAhead<FrameQueue<FrontIo>>;

/// An upgraded WebSocket, handed to the caller.
pub struct Upgrade<R> {
    /// The WebSocket, on the connection under a read-ahead buffer ([`FrontStream`]).
    pub ws: WebSocketStream<FrontStream>,
    /// The peer's address.
    pub peer: SocketAddr,
    /// The caller's tag of the route it came in by.
    pub route: R,
    /// The id captured from its path, if the route has one.
    pub id: Option<String>,
    /// Its slot of the route's capacity, if capped: hold it as long as the connection lives.
    pub permit: Option<OwnedSemaphorePermit>,
    /// The request came through the cluster's load balancer ([`super::routes::FRONT_HEADER`]).
    pub via_front: bool,
}

/// Receives every upgrade; called from the connection's task, so it should hand the
/// WebSocket off quickly (typically by spawning).
pub type OnUpgrade<R> = Arc<dyn Fn(Upgrade<R>) + Send + Sync>;

/// One listener's front: what it serves, how much it admits, and who takes its upgrades.
pub struct Front<R> {
    /// What requests get.
    pub routes: Routes<R>,
    /// Admission and time limits.
    pub limits: FrontLimits,
    /// The WebSocket settings of its upgrades (message and frame size limits).
    pub websocket: WebSocketConfig,
    /// Who takes the upgrades.
    pub on_upgrade: OnUpgrade<R>,
    /// TLS on every connection (`wss://`), or none (`ws://`).
    pub tls: Option<TlsListener>,
}

/// Accept connections on `listener` and serve each as `front` says, until `shutdown`. On
/// cancellation it stops accepting, abandons the connections not yet upgraded or answered
/// and returns once their tasks have ended; upgraded connections are the caller's.
pub async fn serve<R>(listener: TcpListener, front: Front<R>, shutdown: CancellationToken)
where
    R: Clone + Send + Sync + 'static,
{
    serve_on(listener, front, None, shutdown).await
}

/// A route's home runtime: given an upgrade's route and id, the index of the runtime of
/// [`Spread::runtimes`] its connection should live on (typically where the peer it will
/// talk to lives), or `None` for wherever it was placed.
pub type HomeOf<R> = Arc<dyn Fn(&R, Option<&str>) -> Option<usize> + Send + Sync>;

/// How [`serve_spread`] spreads connections over runtimes.
pub struct Spread<R> {
    /// The runtimes.
    pub runtimes: LinkRuntimes,
    /// After the upgrade, where its route lives, if anywhere in particular.
    pub home: Option<HomeOf<R>>,
}

/// [`serve`], each accepted connection moved to the least loaded of `spread`'s runtimes
/// ([`LinkRuntimes::place`]): its TLS handshake and request run there; after the upgrade it
/// moves to its route's home runtime ([`Spread::home`]) if that is another one (plain TCP
/// only), and whatever [`Front::on_upgrade`] spawns from it runs where it is. The accept
/// loop runs where this future is polled.
pub async fn serve_spread<R>(
    listener: TcpListener,
    front: Front<R>,
    spread: Spread<R>,
    shutdown: CancellationToken,
) where
    R: Clone + Send + Sync + 'static,
{
    serve_on(listener, front, Some(Arc::new(spread)), shutdown).await
}

async fn serve_on<R>(
    listener: TcpListener,
    front: Front<R>,
    spread: Option<Arc<Spread<R>>>,
    shutdown: CancellationToken,
) where
    R: Clone + Send + Sync + 'static,
{
    let front = Arc::new(front);
    let pending = Arc::new(Semaphore::new(front.limits.pending));
    let per_address = AddressSlots::new(front.limits.pending_per_address);
    let connections = TaskTracker::new();
    debug!(local = ?listener.local_addr().ok(), "serving HTTP");
    loop {
        let accepted = tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                warn!(%error, "accepting a connection failed; backing off");
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    () = tokio::time::sleep(ACCEPT_ERROR_BACKOFF) => continue,
                }
            }
        };
        // Closed unread when over a cap: no reply, so a flood costs us nothing more.
        let Ok(slot) = Arc::clone(&pending).try_acquire_owned() else {
            debug!(%peer, "too many connections before their upgrade; closing a new one");
            continue;
        };
        let Some(address_slot) = per_address.try_take(peer.ip()) else {
            debug!(%peer, "too many connections from this address before their upgrade; closing");
            continue;
        };
        let front = Arc::clone(&front);
        let shutdown = shutdown.clone();
        let Some(spread) = &spread else {
            connections.spawn(
                connection(stream, peer, front, shutdown, (slot, address_slot), None)
                    .instrument(tracing::debug_span!("http", %peer)),
            );
            continue;
        };
        // Off this runtime's reactor, onto the chosen one's (registered again there).
        let stream = match stream.into_std() {
            Ok(stream) => stream,
            Err(error) => {
                debug!(%peer, %error, "cannot move a connection to a link runtime; closing it");
                continue;
            }
        };
        let (index, handle) = spread.runtimes.place();
        let spread = Some((Arc::clone(spread), connections.clone()));
        let moved = async move {
            match TcpStream::from_std(stream) {
                Ok(stream) => {
                    connection(stream, peer, front, shutdown, (slot, address_slot), spread).await
                }
                Err(error) => {
                    debug!(%error, "cannot register a connection on its link runtime; closing it")
                }
            }
        };
        handle.spawn(
            connections.track_future(
                moved.instrument(tracing::debug_span!("http", %peer, runtime = index)),
            ),
        );
    }
    connections.close();
    connections.wait().await;
    debug!("HTTP listener stopped");
}

/// One accepted connection, holding its admission `slots` until it is handed off or closed.
/// With `spread`, an upgrade whose route has a home runtime elsewhere is moved there first
/// (TCP or TLS: the session's state moves with its socket, [`FrontIo::detach`]).
async fn connection<R>(
    stream: TcpStream,
    peer: SocketAddr,
    front: Arc<Front<R>>,
    shutdown: CancellationToken,
    slots: (OwnedSemaphorePermit, super::address_slots::AddressSlot),
    spread: Option<(Arc<Spread<R>>, TaskTracker)>,
) where
    R: Clone + Send + Sync + 'static,
{
    let upgraded = tokio::select! {
        () = shutdown.cancelled() => None,
        upgraded = exchange(stream, &front) => upgraded,
    };
    // The slots are free once the connection is handed off or closed.
    drop(slots);
    let Some((stream, accepted)) = upgraded else {
        return;
    };
    let target = spread.as_ref().and_then(|(spread, tracker)| {
        let home = spread
            .home
            .as_ref()
            .and_then(|home| home(&accepted.route, accepted.id.as_deref()))
            .filter(|&home| crate::runtimes::current_index() != Some(home))?;
        Some((home, spread.runtimes.place_on(home)?, tracker.clone()))
    });
    let Some((home, handle, tracker)) = target else {
        return hand_off(stream, accepted, peer, &front).await;
    };
    // Off this runtime's reactor, onto the home runtime's (registered again there); a TLS
    // session's state goes with its socket.
    let detached = match stream.detach() {
        Ok(detached) => detached,
        Err(error) => {
            return debug!(%error, "cannot move a connection to its home runtime; closing it")
        }
    };
    debug!(runtime = home, "moving to the runtime of its route's home");
    let moved = async move {
        match detached.attach() {
            Ok(stream) => hand_off(stream, accepted, peer, &front).await,
            Err(error) => {
                debug!(%error, "cannot register a connection on its home runtime; closing it")
            }
        }
    };
    handle.spawn(tracker.track_future(moved.in_current_span()));
}

/// hyper's settings for one connection: bounded head, no timer of its own (the
/// deadlines are ours, so paused-time tests drive them).
fn http1_builder() -> http1::Builder {
    let mut builder = http1::Builder::new();
    // Keep-alive stays on in hyper: with it off, hyper appends `close` to the `Connection`
    // header of the 101 and clients refuse the upgrade. Every plain reply says
    // `Connection: close` instead, so each connection still serves one request.
    builder
        // A client may send its request and shut its side down (`nc -N`): still answer.
        .half_close(true)
        // `Content-Type`, `Allow`: what every existing client and test reads.
        .title_case_headers(true)
        .max_headers(MAX_REQUEST_HEADERS)
        .max_header_size(MAX_REQUEST_HEAD_BYTES)
        // The read buffer never holds more than one head (and its minimum is 8 KiB).
        .max_buf_size(MAX_REQUEST_HEAD_BYTES.max(8192))
        .header_read_timeout(None);
    builder
}

/// What the service decided, sent from inside hyper to the connection's task.
type Decided<R> = Option<(Accepted<R>, hyper::upgrade::OnUpgrade)>;

/// One connection from accept to an upgrade (returned) or a closed socket (`None`).
async fn exchange<R>(stream: TcpStream, front: &Arc<Front<R>>) -> Option<(FrontIo, Accepted<R>)>
where
    R: Clone + Send + Sync + 'static,
{
    let head_deadline = Instant::now() + front.limits.head_timeout;
    if let Err(error) = stream.set_nodelay(true) {
        debug!(%error, "could not disable Nagle's algorithm");
    }
    let stream = match &front.tls {
        None => FrontIo::Plain(stream),
        Some(tls) => match tokio::time::timeout_at(head_deadline, tls.accept(stream)).await {
            Ok(Ok(tls)) => FrontIo::Tls(Box::new(tls)),
            Ok(Err(error)) => {
                debug!(%error, "TLS handshake failed");
                return None;
            }
            Err(_elapsed) => {
                tls.handshake_timed_out();
                debug!("no TLS handshake in time; closing");
                return None;
            }
        },
    };
    let (back_tx, back_rx) = oneshot::channel();
    let io = TokioIo::new(Returning {
        stream: Some(stream),
        back: Some(back_tx),
    });
    let (decided_tx, mut decided_rx) = oneshot::channel::<Decided<R>>();
    // hyper calls the service through `&self`; it is called once (no keep-alive).
    let decided_tx = std::sync::Mutex::new(Some(decided_tx));
    let service_front = Arc::clone(front);
    let service = service_fn(move |mut request: Request<Incoming>| {
        let (response, upgrade) = match decide(&service_front.routes, &request) {
            Decision::Reply(reply) => {
                debug!(method = %request.method(), status = %reply.status(), "plain reply");
                (reply.into_response(), None)
            }
            Decision::Upgrade(accepted) => {
                let on_upgrade = hyper::upgrade::on(&mut request);
                (accepted.response(), Some((accepted, on_upgrade)))
            }
        };
        let tx = execrelay_protocol::sync::lock(&decided_tx).take();
        if let Some(tx) = tx {
            let _ = tx.send(upgrade);
        }
        ready(Ok::<_, Infallible>(response))
    });
    let mut conn = http1_builder()
        .serve_connection(io, service)
        .with_upgrades();

    // The head, by the deadline fixed at accept.
    let (ended, decided) = tokio::select! {
        biased;
        decided = &mut decided_rx => (None, decided.ok().flatten()),
        result = &mut conn => (Some(result), decided_rx.try_recv().ok().flatten()),
        () = tokio::time::sleep_until(head_deadline) => {
            debug!("no complete request head in time; closing");
            return None;
        }
    };
    // Then the reply (or the 101) and the close, within their own bound.
    let reply_deadline = Instant::now() + Duration::from_millis(REPLY_TIMEOUT_MS);
    let result = match ended {
        Some(result) => result,
        None => match tokio::time::timeout_at(reply_deadline, &mut conn).await {
            Ok(result) => result,
            Err(_elapsed) => {
                debug!("the reply was not taken in time; closing");
                return None;
            }
        },
    };
    if let Err(error) = &result {
        // A malformed or oversized head (hyper answered 400 or 431), or a peer gone.
        debug!(%error, "HTTP connection ended");
    }
    match decided {
        Some((accepted, on_upgrade)) if result.is_ok() => {
            drop(conn);
            let upgraded = tokio::time::timeout_at(reply_deadline, on_upgrade).await;
            let upgraded = match upgraded {
                Ok(Ok(upgraded)) => upgraded,
                Ok(Err(error)) => {
                    debug!(%error, "the upgrade failed");
                    return None;
                }
                Err(_elapsed) => return None,
            };
            let parts = match upgraded.downcast::<TokioIo<Returning>>() {
                Ok(parts) => parts,
                Err(_) => {
                    warn!("upgraded connection of an unexpected type; closing");
                    return None;
                }
            };
            // RFC 6455 §4.1: a client waits for the 101 before it sends frames.
            if !parts.read_buf.is_empty() {
                debug!("data sent before the 101; closing");
                return None;
            }
            let stream = parts.io.into_inner().into_stream()?;
            Some((stream, accepted))
        }
        other => {
            // Nothing may still hold the stream (a pending upgrade would), or it never comes
            // back; the deadline bounds the wait whatever happens.
            drop(other);
            drop(conn);
            let _ = tokio::time::timeout_at(reply_deadline, async {
                if let Ok(stream) = back_rx.await {
                    close_gracefully(stream).await;
                }
            })
            .await;
            None
        }
    }
}

/// The upgraded connection as a WebSocket, handed to [`Front::on_upgrade`] (which spawns on
/// the runtime this runs on).
async fn hand_off<R>(stream: FrontIo, accepted: Accepted<R>, peer: SocketAddr, front: &Front<R>)
where
    R: Clone + Send + Sync + 'static,
{
    // Reads stop at each frame's end, so a link's driver can take the socket over.
    let ws = WebSocketStream::from_raw_socket(
        ReadAhead::websocket(
            FrameQueue::new(stream),
            execrelay_protocol::websocket::Role::Server,
        ),
        Role::Server,
        Some(front.websocket),
    )
    .await;
    debug!("upgraded to WebSocket");
    (front.on_upgrade)(Upgrade {
        ws,
        peer,
        route: accepted.route,
        id: accepted.id,
        permit: accepted.permit,
        via_front: accepted.via_front,
    });
}

/// After a plain reply: send our FIN, then read and discard what the peer still sends (at
/// most [`CLOSE_DRAIN_BYTES`]) until it closes. Closing a socket that still has unread input
/// makes the kernel send a reset, which can destroy our reply before the peer has read it
/// (typically a 431 sent while the peer is still sending its oversized head).
async fn close_gracefully(mut stream: FrontIo) {
    let _ = stream.shutdown().await;
    let mut scratch = [0u8; 4096];
    let mut drained = 0;
    while drained < CLOSE_DRAIN_BYTES {
        match stream.read(&mut scratch).await {
            Ok(0) | Err(_) => break,
            Ok(read) => drained += read,
        }
    }
}

/// The connection as hyper sees it before the upgrade. When hyper drops it after a plain
/// reply, it goes back to the connection's task for the graceful close; after an upgrade it is
/// taken out whole, so the WebSocket runs on the bare stream.
struct Returning {
    stream: Option<FrontIo>,
    back: Option<oneshot::Sender<FrontIo>>,
}

impl Returning {
    fn into_stream(mut self) -> Option<FrontIo> {
        self.back = None;
        self.stream.take()
    }

    fn stream(&mut self) -> io::Result<&mut FrontIo> {
        self.stream
            .as_mut()
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotConnected))
    }
}

impl Drop for Returning {
    fn drop(&mut self) {
        if let (Some(stream), Some(back)) = (self.stream.take(), self.back.take()) {
            let _ = back.send(stream);
        }
    }
}

impl AsyncRead for Returning {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.stream() {
            Ok(stream) => Pin::new(stream).poll_read(cx, buf),
            Err(error) => Poll::Ready(Err(error)),
        }
    }
}

impl AsyncWrite for Returning {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.stream() {
            Ok(stream) => Pin::new(stream).poll_write(cx, buf),
            Err(error) => Poll::Ready(Err(error)),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.stream() {
            Ok(stream) => Pin::new(stream).poll_flush(cx),
            Err(error) => Poll::Ready(Err(error)),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.stream() {
            Ok(stream) => Pin::new(stream).poll_shutdown(cx),
            Err(error) => Poll::Ready(Err(error)),
        }
    }
}
