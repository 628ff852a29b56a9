//! Plain WebSocket transport (`ws://`): the listener that gates HTTP requests before the
//! upgrade, and the framing that turns a WebSocket into a [`Transport`].
//!
//! # What this module owns
//!
//! - **The pre-upgrade HTTP gate.** It reads the request head itself (at most 16 KiB, within
//!   10 s), answers `GET /readyz` with 200, refuses any upgrade request that carries an
//!   `Origin` header with 403 (secure-transport.md §1), answers other plain requests with 404,
//!   and hands every WebSocket upgrade to tungstenite by replaying the bytes it already read.
//! - **WebSocket framing** (protocol.md §1): one message per text or binary message, the
//!   `maxMessageBytes` limit enforced by tungstenite before more than the limit of one message
//!   is buffered, and the mapping of tungstenite's errors onto [`FramingError`].
//! - The client side of the same framing ([`connect_websocket`]).
//!
//! # What it must never do
//!
//! - Interpret JSON-RPC: messages are opaque bytes here.
//! - Upgrade a request that carries an `Origin` header: that is how a web page open in a
//!   browser on the same host would drive a local server.
//! - Log message contents (they carry process output and stdin), or panic on anything a peer
//!   sends.
//! - Decide who may connect. This transport encrypts nothing; refusing non-loopback addresses
//!   without `--danger-plaintext` belongs to whoever binds the listener.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{Sink, SinkExt, Stream, StreamExt};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::error::{Error as WsError, ProtocolError};
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::{header, StatusCode};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, warn, Instrument};

use super::{FramingError, Transport};

/// Largest request head (request line plus header fields) read before the upgrade: 16 KiB.
///
/// HTTP sets no maximum. A WebSocket handshake from a real client is well under 1 KiB and
/// 16 KiB is what common servers allow; a longer head is answered with 431 and closed, so a
/// peer cannot make us buffer an unbounded head. Bytes a client pipelines after the head count
/// against the same buffer.
const MAX_REQUEST_HEAD_BYTES: usize = 16 * 1024;

/// Most header fields accepted in a request head: 64. More is answered with 431.
///
/// A WebSocket handshake needs about six. The cap also bounds how often a head delivered
/// line by line is re-parsed (see [`MAX_HEAD_PARSES`]).
const MAX_REQUEST_HEADERS: usize = 64;

/// Most times one request head is parsed while it arrives: `MAX_REQUEST_HEADERS + 3`.
///
/// The head is parsed only after a read that contains a line feed, so a legitimate head is
/// parsed at most once per line: one optional empty line before the request line, the request
/// line, the header fields and the blank line. A peer trickling line feeds one byte at a time
/// would otherwise make us re-parse up to 16 KiB thousands of times.
const MAX_HEAD_PARSES: usize = MAX_REQUEST_HEADERS + 3;

/// How long a new connection may take to deliver its request head and finish the upgrade:
/// 10 s. Past it the connection is closed without a reply, so a slow peer cannot hold a
/// handshake slot for ever.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections accepted but not yet upgraded (or answered) at once: 256.
///
/// Each holds at most [`MAX_REQUEST_HEAD_BYTES`] for at most [`HANDSHAKE_TIMEOUT`] (plus
/// [`CLOSE_GRACE`] when refused). Beyond the cap a new connection is closed at once, which
/// bounds what a flood of idle connections can take (256 × 16 KiB = 4 MiB). Real clients
/// finish their handshake in milliseconds, so the cap is reached only under such a flood.
const MAX_PENDING_HANDSHAKES: usize = 256;

/// After an HTTP reply (200, 403, 404, 431, …): how long we keep discarding what the peer still
/// sends before closing, 1 s.
///
/// Closing a socket that still has unread input makes the kernel send a reset, which can
/// destroy our reply before the peer has read it (typically a 431 sent while the peer is still
/// sending its oversized head).
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// Most bytes discarded during [`CLOSE_GRACE`]: 64 KiB, so a refused peer cannot keep us
/// reading for the whole grace period at full speed.
const CLOSE_DRAIN_BYTES: usize = 64 * 1024;

/// Pause after a failed `accept`: 100 ms. Failures such as running out of file descriptors
/// repeat immediately; without a pause the accept loop would spin a core while they last.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(100);

/// The readiness probe path (secure-transport.md §1).
const READYZ_PATH: &str = "/readyz";

/// Accepts plain WebSocket connections on `listener` and calls `on_connection` with a framed
/// [`Transport`] for each upgraded WebSocket, until `shutdown` is cancelled.
///
/// Every accepted connection gets its own task that reads the HTTP request head, answers
/// `GET /readyz` (200), refuses upgrades carrying an `Origin` header (403), answers other plain
/// requests (404) and upgrades the rest, on any path. `on_connection` is called from that task
/// and should hand the transport off quickly (typically by spawning the connection processor).
///
/// Inbound messages larger than `max_message_bytes` end the connection with
/// [`FramingError::TooLarge`]. On cancellation the function stops accepting, abandons the
/// handshakes in progress and returns once their tasks have ended; connections already handed
/// to `on_connection` are the caller's to shut down.
pub async fn serve_websocket<F>(
    listener: TcpListener,
    max_message_bytes: usize,
    shutdown: CancellationToken,
    on_connection: F,
) where
    F: Fn(Transport) + Send + Sync + 'static,
{
    serve_upgrades(
        listener,
        websocket_config(max_message_bytes),
        None,
        shutdown,
        move |ws, peer| on_connection(framed(ws, max_message_bytes, peer.to_string())),
    )
    .await
}

/// A WebSocket accepted by [`serve_upgrades`].
pub type UpgradedWebSocket = WebSocketStream<Rewind<TcpStream>>;

/// The accept loop shared by plain `ws://` and `noise+ws://` listeners: the HTTP gate
/// (`/readyz`, `Origin` → 403, 404), then the upgrade with `config`, only on `path` when one is
/// given. `on_upgrade` receives the raw WebSocket.
pub async fn serve_upgrades<F>(
    listener: TcpListener,
    config: WebSocketConfig,
    path: Option<&'static str>,
    shutdown: CancellationToken,
    on_upgrade: F,
) where
    F: Fn(UpgradedWebSocket, SocketAddr) + Send + Sync + 'static,
{
    let on_connection = Arc::new(on_upgrade);
    let pending = Arc::new(Semaphore::new(MAX_PENDING_HANDSHAKES));
    let handshakes = TaskTracker::new();
    debug!(local = ?listener.local_addr().ok(), "serving plain WebSocket");

    loop {
        let accepted = tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                warn!(%error, "accepting a WebSocket connection failed; backing off");
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    () = tokio::time::sleep(ACCEPT_ERROR_BACKOFF) => continue,
                }
            }
        };
        let Ok(permit) = Arc::clone(&pending).try_acquire_owned() else {
            debug!(%peer, "too many pending WebSocket handshakes; closing new connection");
            continue;
        };
        let on_connection = Arc::clone(&on_connection);
        let shutdown = shutdown.clone();
        let span = tracing::debug_span!("ws_connection", %peer);
        handshakes.spawn(
            async move {
                debug!("accepted");
                let transport = tokio::select! {
                    () = shutdown.cancelled() => {
                        debug!("shutting down before the upgrade completed");
                        None
                    }
                    ws = establish(stream, config, path) => ws,
                };
                // The handshake slot is free once the connection is handed off or closed.
                drop(permit);
                if let Some(ws) = transport {
                    on_connection(ws, peer);
                }
            }
            .instrument(span),
        );
    }

    handshakes.close();
    handshakes.wait().await;
    debug!("plain WebSocket listener stopped");
}

/// Connects to `url` (`ws://host:port/path`) and returns the framed [`Transport`].
///
/// Inbound messages larger than `max_message_bytes` end the connection with
/// [`FramingError::TooLarge`]. Connecting and the handshake together must finish within 10 s
/// (else [`FramingError::Io`] with [`io::ErrorKind::TimedOut`]); a refused handshake (for
/// example a 403) is a [`FramingError::Protocol`]. `peer` is the server's socket address.
pub async fn connect_websocket(
    url: &str,
    max_message_bytes: usize,
) -> Result<Transport, FramingError> {
    let connect = tokio_tungstenite::connect_async_with_config(
        url,
        Some(websocket_config(max_message_bytes)),
        // JSON-RPC messages are small and latency-sensitive: do not wait to coalesce them.
        true,
    );
    let (ws, _response) = match tokio::time::timeout(HANDSHAKE_TIMEOUT, connect).await {
        Ok(Ok(connected)) => connected,
        Ok(Err(WsError::Io(error))) => return Err(FramingError::Io(error)),
        Ok(Err(error)) => return Err(FramingError::Protocol(error.to_string())),
        Err(_elapsed) => {
            return Err(FramingError::Io(io::Error::new(
                io::ErrorKind::TimedOut,
                "WebSocket connect and handshake timed out",
            )))
        }
    };
    let peer = match ws.get_ref() {
        MaybeTlsStream::Plain(tcp) => tcp.peer_addr().ok().map(|addr| addr.to_string()),
        _ => None,
    }
    .unwrap_or_else(|| url.to_owned());
    debug!(%peer, "connected over plain WebSocket");
    Ok(framed(ws, max_message_bytes, peer))
}

/// Takes one accepted connection from its first byte to either an upgraded WebSocket or a
/// close.
async fn establish(
    mut stream: TcpStream,
    config: WebSocketConfig,
    path: Option<&'static str>,
) -> Option<UpgradedWebSocket> {
    if let Err(error) = stream.set_nodelay(true) {
        debug!(%error, "could not disable Nagle's algorithm");
    }
    // One deadline for the head and the upgrade together, so a peer cannot reset the clock
    // by trickling bytes.
    let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
    let (buffered, head) =
        match tokio::time::timeout_at(deadline, read_request_head(&mut stream)).await {
            Ok(Ok(read)) => read,
            Ok(Err(HeadError::TooLarge)) => {
                debug!("request head too large");
                reply_and_close(stream, Reply::HeadTooLarge).await;
                return None;
            }
            Ok(Err(HeadError::Malformed(error))) => {
                debug!(%error, "malformed request head");
                reply_and_close(stream, Reply::BadRequest).await;
                return None;
            }
            Ok(Err(HeadError::Closed)) => {
                debug!("peer closed before completing its request head");
                return None;
            }
            Ok(Err(HeadError::Io(error))) => {
                debug!(%error, "reading the request head failed");
                return None;
            }
            Err(_elapsed) => {
                debug!("no complete request head in time; closing");
                return None;
            }
        };

    let route = match (route(&head), path) {
        (Route::Upgrade, Some(only)) if head.path.split('?').next() != Some(only) => {
            Route::Reply(Reply::NotFound)
        }
        (r, _) => r,
    };
    match route {
        Route::Upgrade => {}
        Route::Reply(reply) => {
            debug!(?reply, method = %head.method, "answering plain HTTP request");
            reply_and_close(stream, reply).await;
            return None;
        }
    }

    // tungstenite parses the head again from the replayed bytes. It refuses bytes sent after
    // the head ("junk after client request"): RFC 6455 §4.1 has the client wait for the 101
    // before it sends frames.
    let handshake = tokio_tungstenite::accept_hdr_async_with_config(
        Rewind::new(buffered, stream),
        refuse_cross_origin,
        Some(config),
    );
    match tokio::time::timeout_at(deadline, handshake).await {
        Ok(Ok(ws)) => {
            debug!("upgraded to WebSocket");
            Some(ws)
        }
        Ok(Err(error)) => {
            debug!(%error, "WebSocket handshake failed");
            None
        }
        Err(_elapsed) => {
            debug!("WebSocket handshake did not finish in time; closing");
            None
        }
    }
}

/// Second line of defence for the `Origin` rule: [`route`] has already refused such requests,
/// but tungstenite parses the head again itself, so the rule is re-checked on the request it
/// actually accepts.
// The signature is tungstenite's `Callback`; the large error type is theirs to choose.
#[allow(clippy::result_large_err)]
fn refuse_cross_origin(request: &Request, response: Response) -> Result<Response, ErrorResponse> {
    if request.headers().contains_key(header::ORIGIN) {
        let mut refusal = ErrorResponse::new(Some(FORBIDDEN_BODY.to_owned()));
        *refusal.status_mut() = StatusCode::FORBIDDEN;
        return Err(refusal);
    }
    Ok(response)
}

/// Tungstenite settings shared by both ends.
pub fn websocket_config(max_message_bytes: usize) -> WebSocketConfig {
    WebSocketConfig {
        // Both limits sit exactly at the protocol limit. tungstenite checks a frame's declared
        // length before reading its payload, and a fragmented message's running total before
        // appending a fragment, so it never accumulates more than the limit of one message
        // and reports the overrun as `Error::Capacity`.
        max_message_size: Some(max_message_bytes),
        max_frame_size: Some(max_message_bytes),
        ..WebSocketConfig::default()
    }
}

/// Splits an upgraded WebSocket into the two halves of a [`Transport`].
fn framed<S>(ws: WebSocketStream<S>, limit: usize, peer: String) -> Transport
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // Split rather than drive both directions from one future: each half takes the shared lock
    // only for the duration of one poll, so a write blocked on a slow peer never stops the
    // reader (which keeps answering pings), and vice versa.
    let (sink, stream) = ws.split();
    Transport {
        incoming: Box::pin(Incoming {
            inner: stream,
            limit,
            ended: false,
        }),
        outgoing: Box::pin(Outgoing { inner: sink }),
        peer,
    }
}

/// Inbound half: text and binary messages as bytes; control frames are tungstenite's business.
struct Incoming<S> {
    inner: SplitStream<WebSocketStream<S>>,
    limit: usize,
    /// Set once the stream has ended or failed; every later poll yields `None`, since every
    /// [`FramingError`] ends the connection.
    ended: bool,
}

impl<S> Stream for Incoming<S>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    type Item = Result<Vec<u8>, FramingError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        while !this.ended {
            match ready!(this.inner.poll_next_unpin(cx)) {
                Some(Ok(Message::Text(text))) => return Poll::Ready(Some(Ok(text.into_bytes()))),
                Some(Ok(Message::Binary(bytes))) => return Poll::Ready(Some(Ok(bytes))),
                // tungstenite queues the pong reply itself and writes it on the next read or
                // flush, which the next turn of this loop performs.
                Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => {}
                // The peer is closing. Keep polling: the next read flushes tungstenite's close
                // reply and then reports the end of the stream (`None`).
                Some(Ok(Message::Close(_))) => debug!("peer sent a close frame"),
                Some(Err(error)) => {
                    this.ended = true;
                    if let Some(error) = framing_error(error, this.limit) {
                        return Poll::Ready(Some(Err(error)));
                    }
                }
                None => this.ended = true,
            }
        }
        Poll::Ready(None)
    }
}

/// Maps a tungstenite read error onto a [`FramingError`], or `None` when it only says that the
/// peer has gone.
fn framing_error(error: WsError, limit: usize) -> Option<FramingError> {
    match error {
        // An end without a close handshake is still the peer closing the connection: it is
        // how clients that are killed or simply drop the socket go away.
        WsError::ConnectionClosed
        | WsError::AlreadyClosed
        | WsError::Protocol(ProtocolError::ResetWithoutClosingHandshake) => {
            debug!("WebSocket closed by the peer");
            None
        }
        WsError::Capacity(_) => Some(FramingError::TooLarge { limit }),
        WsError::Io(error) => Some(FramingError::Io(error)),
        // tungstenite's messages name the rule broken, never the payload.
        other => Some(FramingError::Protocol(other.to_string())),
    }
}

/// Outbound half: each `String` becomes one text message.
struct Outgoing<S> {
    inner: SplitSink<WebSocketStream<S>, Message>,
}

impl<S> Sink<String> for Outgoing<S>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    type Error = io::Error;

    fn poll_ready(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.inner.poll_ready_unpin(cx).map_err(into_io)
    }

    fn start_send(mut self: Pin<&mut Self>, item: String) -> io::Result<()> {
        self.inner
            .start_send_unpin(Message::Text(item))
            .map_err(into_io)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.inner.poll_flush_unpin(cx).map_err(into_io)
    }

    /// Sends a close frame and flushes it. The rest of the close handshake (the peer's reply)
    /// arrives on the inbound half.
    fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match ready!(self.inner.poll_close_unpin(cx)) {
            // Closing a connection that is already closed has nothing left to do.
            Ok(()) | Err(WsError::ConnectionClosed | WsError::AlreadyClosed) => Poll::Ready(Ok(())),
            Err(error) => Poll::Ready(Err(into_io(error))),
        }
    }
}

/// The outbound half reports plain I/O errors ([`super::MessageSink`]).
fn into_io(error: WsError) -> io::Error {
    match error {
        WsError::Io(error) => error,
        WsError::ConnectionClosed | WsError::AlreadyClosed => io::Error::new(
            io::ErrorKind::BrokenPipe,
            "the WebSocket connection is closed",
        ),
        other => io::Error::other(other.to_string()),
    }
}

/// Why no usable request head was read.
#[derive(Debug)]
enum HeadError {
    /// Over [`MAX_REQUEST_HEAD_BYTES`], [`MAX_REQUEST_HEADERS`] or [`MAX_HEAD_PARSES`].
    TooLarge,
    /// Not HTTP/1.x.
    Malformed(httparse::Error),
    /// The peer closed before the head was complete.
    Closed,
    /// The socket failed.
    Io(io::Error),
}

impl From<io::Error> for HeadError {
    fn from(error: io::Error) -> Self {
        HeadError::Io(error)
    }
}

/// What the gate needs to know about a request, copied out of the read buffer.
#[derive(Debug)]
struct RequestHead {
    method: String,
    /// The request target, query included.
    path: String,
    /// An `Origin` header is present (with any value, even empty).
    has_origin: bool,
    /// The request asks for a protocol switch of any kind (`Upgrade` or `Sec-WebSocket-Key`).
    asks_upgrade: bool,
    /// `Upgrade` lists the `websocket` token.
    websocket_upgrade: bool,
}

/// Reads from `stream` until it holds a complete request head. Returns everything read (the
/// head and whatever the client sent after it) with the parsed head.
async fn read_request_head<S>(stream: &mut S) -> Result<(Vec<u8>, RequestHead), HeadError>
where
    S: AsyncRead + Unpin,
{
    let mut buffer = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    let mut parses = 0;
    loop {
        let room = MAX_REQUEST_HEAD_BYTES - buffer.len();
        if room == 0 {
            return Err(HeadError::TooLarge);
        }
        let want = room.min(chunk.len());
        let read = stream.read(&mut chunk[..want]).await?;
        if read == 0 {
            return Err(HeadError::Closed);
        }
        let fresh = &chunk[..read];
        buffer.extend_from_slice(fresh);
        // A head can only have become complete (or provably invalid) once a line has ended.
        if fresh.contains(&b'\n') {
            parses += 1;
            if parses > MAX_HEAD_PARSES {
                return Err(HeadError::TooLarge);
            }
            if let Some(head) = parse_head(&buffer)? {
                return Ok((buffer, head));
            }
        }
    }
}

/// Parses `buffer` as an HTTP/1.x request head: `Ok(None)` while it is incomplete.
fn parse_head(buffer: &[u8]) -> Result<Option<RequestHead>, HeadError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_REQUEST_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(buffer) {
        Ok(httparse::Status::Partial) => Ok(None),
        Ok(httparse::Status::Complete(_head_len)) => {
            let mut head = RequestHead {
                method: request.method.unwrap_or_default().to_owned(),
                path: request.path.unwrap_or_default().to_owned(),
                has_origin: false,
                asks_upgrade: false,
                websocket_upgrade: false,
            };
            for field in request.headers.iter() {
                if field.name.eq_ignore_ascii_case("origin") {
                    head.has_origin = true;
                } else if field.name.eq_ignore_ascii_case("upgrade") {
                    head.asks_upgrade = true;
                    head.websocket_upgrade |= has_token(field.value, b"websocket");
                } else if field.name.eq_ignore_ascii_case("sec-websocket-key") {
                    head.asks_upgrade = true;
                }
            }
            Ok(Some(head))
        }
        Err(httparse::Error::TooManyHeaders) => Err(HeadError::TooLarge),
        Err(error) => Err(HeadError::Malformed(error)),
    }
}

/// Whether a comma-separated header value lists `token` (ASCII case-insensitive).
fn has_token(value: &[u8], token: &[u8]) -> bool {
    value
        .split(|&byte| byte == b',')
        .any(|item| item.trim_ascii().eq_ignore_ascii_case(token))
}

/// What to do with a request.
#[derive(Debug, PartialEq, Eq)]
enum Route {
    /// Hand the connection to tungstenite.
    Upgrade,
    /// Answer with a plain HTTP response and close.
    Reply(Reply),
}

/// Decides what to do with a request from its head alone.
fn route(head: &RequestHead) -> Route {
    // Checked first and for any kind of upgrade: whatever a browser page asks to switch to,
    // it must not reach the server.
    if head.asks_upgrade && head.has_origin {
        return Route::Reply(Reply::Forbidden);
    }
    if head.websocket_upgrade {
        // Any path: a plain `ws://` listener serves one connection per WebSocket on any path.
        return Route::Upgrade;
    }
    let path = head
        .path
        .split_once('?')
        .map_or(head.path.as_str(), |(path, _query)| path);
    if path != READYZ_PATH {
        return Route::Reply(Reply::NotFound);
    }
    if head.method == "GET" {
        Route::Reply(Reply::Ready)
    } else {
        Route::Reply(Reply::MethodNotAllowed)
    }
}

/// Body of the 403 reply, also used by [`refuse_cross_origin`].
const FORBIDDEN_BODY: &str = "cross-origin WebSocket requests are refused\n";

/// A plain HTTP reply, always followed by closing the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reply {
    /// `GET /readyz`.
    Ready,
    BadRequest,
    Forbidden,
    NotFound,
    MethodNotAllowed,
    HeadTooLarge,
}

impl Reply {
    /// The complete response: status line, headers and body.
    fn to_http(self) -> String {
        let (status, extra_headers, body) = match self {
            Reply::Ready => ("200 OK", "", "ok\n"),
            Reply::BadRequest => ("400 Bad Request", "", "malformed request\n"),
            Reply::Forbidden => ("403 Forbidden", "", FORBIDDEN_BODY),
            Reply::NotFound => ("404 Not Found", "", "not found\n"),
            Reply::MethodNotAllowed => (
                "405 Method Not Allowed",
                "Allow: GET\r\n",
                "method not allowed\n",
            ),
            Reply::HeadTooLarge => (
                "431 Request Header Fields Too Large",
                "",
                "request head too large\n",
            ),
        };
        format!(
            "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\n\
             Content-Length: {}\r\nConnection: close\r\n{extra_headers}\r\n{body}",
            body.len()
        )
    }
}

/// Writes `reply`, then closes without resetting: see [`CLOSE_GRACE`].
async fn reply_and_close(mut stream: TcpStream, reply: Reply) {
    let exchange = async {
        stream.write_all(reply.to_http().as_bytes()).await?;
        // Our FIN tells the peer the reply is complete even while we keep draining.
        stream.shutdown().await?;
        let mut scratch = [0u8; 4096];
        let mut drained = 0;
        while drained < CLOSE_DRAIN_BYTES {
            let read = stream.read(&mut scratch).await?;
            if read == 0 {
                break;
            }
            drained += read;
        }
        Ok::<(), io::Error>(())
    };
    if let Ok(Err(error)) = tokio::time::timeout(CLOSE_GRACE, exchange).await {
        debug!(%error, "sending the HTTP reply failed");
    }
}

/// A byte stream that first yields bytes already read from it, then reads from the stream
/// itself; writes go straight through.
///
/// The gate reads the request head before tungstenite sees the connection; `Rewind` gives
/// tungstenite those bytes as if unread.
pub struct Rewind<S> {
    prefix: Vec<u8>,
    /// How much of `prefix` has been handed out.
    consumed: usize,
    inner: S,
}

impl<S> Rewind<S> {
    fn new(prefix: Vec<u8>, inner: S) -> Self {
        Rewind {
            prefix,
            consumed: 0,
            inner,
        }
    }
}

impl<S> AsyncRead for Rewind<S>
where
    S: AsyncRead + Unpin,
{
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let rest = &this.prefix[this.consumed..];
        if rest.is_empty() {
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        }
        let n = rest.len().min(buf.remaining());
        buf.put_slice(&rest[..n]);
        this.consumed += n;
        if this.consumed == this.prefix.len() {
            // Release the buffer: the connection may live for hours.
            this.prefix = Vec::new();
            this.consumed = 0;
        }
        Poll::Ready(Ok(()))
    }
}

impl<S> AsyncWrite for Rewind<S>
where
    S: AsyncWrite + Unpin,
{
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;

    use tokio::sync::mpsc;
    use tokio::task::JoinHandle;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data as OpData, OpCode};
    use tokio_tungstenite::tungstenite::protocol::frame::Frame;

    use super::*;

    /// Upper bound on any single awaited step, so a regression fails instead of hanging. It is
    /// a guard, never a means of synchronisation.
    const STEP_GUARD: Duration = Duration::from_secs(10);

    const UPGRADE_REQUEST: &str = "GET /rpc HTTP/1.1\r\nHost: 127.0.0.1\r\n\
        Upgrade: websocket\r\nConnection: Upgrade\r\n\
        Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n";

    async fn step<T>(future: impl Future<Output = T>) -> T {
        tokio::time::timeout(STEP_GUARD, future)
            .await
            .expect("test step did not finish in time")
    }

    struct TestServer {
        addr: SocketAddr,
        transports: mpsc::UnboundedReceiver<Transport>,
        shutdown: CancellationToken,
        task: JoinHandle<()>,
    }

    impl TestServer {
        async fn start(max_message_bytes: usize) -> TestServer {
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let addr = listener.local_addr().expect("local addr");
            let (sender, transports) = mpsc::unbounded_channel();
            let shutdown = CancellationToken::new();
            let task = tokio::spawn(serve_websocket(
                listener,
                max_message_bytes,
                shutdown.clone(),
                move |transport| {
                    let _ = sender.send(transport);
                },
            ));
            TestServer {
                addr,
                transports,
                shutdown,
                task,
            }
        }

        async fn next_transport(&mut self) -> Transport {
            step(self.transports.recv())
                .await
                .expect("server delivered a transport")
        }

        /// Cancels the server and waits for `serve_websocket` to return.
        async fn stop(self) -> mpsc::UnboundedReceiver<Transport> {
            self.shutdown.cancel();
            step(self.task).await.expect("server task panicked");
            self.transports
        }
    }

    /// Sends raw bytes and reads until the server closes.
    async fn raw_exchange(addr: SocketAddr, request: &[u8]) -> String {
        let mut tcp = step(TcpStream::connect(addr)).await.expect("connect");
        step(tcp.write_all(request)).await.expect("write request");
        let mut response = Vec::new();
        step(tcp.read_to_end(&mut response))
            .await
            .expect("read response");
        String::from_utf8_lossy(&response).into_owned()
    }

    #[tokio::test]
    async fn readyz_answers_200_ok_and_closes() {
        let server = TestServer::start(1024).await;
        let response = raw_exchange(
            server.addr,
            b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        )
        .await;
        assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
        assert!(response.ends_with("\r\n\r\nok\n"), "{response}");
        assert!(server.stop().await.try_recv().is_err());
    }

    #[tokio::test]
    async fn upgrade_with_origin_is_refused_with_403() {
        let server = TestServer::start(1024).await;
        let request = format!("{UPGRADE_REQUEST}Origin: http://localhost:8080\r\n\r\n");
        let response = raw_exchange(server.addr, request.as_bytes()).await;
        assert!(
            response.starts_with("HTTP/1.1 403 Forbidden\r\n"),
            "{response}"
        );
        // No WebSocket was handed to the connection processor.
        assert!(server.stop().await.try_recv().is_err());
    }

    #[tokio::test]
    async fn upgrade_with_origin_is_refused_to_a_real_client() {
        let server = TestServer::start(1024).await;
        let mut request =
            tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(
                format!("ws://{}/", server.addr),
            )
            .expect("request");
        request.headers_mut().insert(
            header::ORIGIN,
            header::HeaderValue::from_static("https://evil.example"),
        );
        let result = step(tokio_tungstenite::connect_async(request)).await;
        match result {
            Err(WsError::Http(response)) => assert_eq!(response.status(), StatusCode::FORBIDDEN),
            other => panic!("expected a 403, got {other:?}"),
        }
        assert!(server.stop().await.try_recv().is_err());
    }

    #[tokio::test]
    async fn plain_request_to_another_path_is_404() {
        let server = TestServer::start(1024).await;
        let response = raw_exchange(server.addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(
            response.starts_with("HTTP/1.1 404 Not Found\r\n"),
            "{response}"
        );
        server.stop().await;
    }

    #[tokio::test]
    async fn oversized_request_head_is_431() {
        let server = TestServer::start(1024).await;
        let mut request = b"GET / HTTP/1.1\r\nX-Padding: ".to_vec();
        request.resize(MAX_REQUEST_HEAD_BYTES + 1024, b'a');
        request.extend_from_slice(b"\r\n\r\n");
        let response = raw_exchange(server.addr, &request).await;
        assert!(
            response.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"),
            "{response}"
        );
        server.stop().await;
    }

    #[tokio::test]
    async fn text_message_round_trip() {
        let mut server = TestServer::start(1024).await;
        let mut client = step(connect_websocket(
            &format!("ws://{}/any/path", server.addr),
            1024,
        ))
        .await
        .expect("connect");
        let mut accepted = server.next_transport().await;

        assert_eq!(client.peer, server.addr.to_string());
        let server_peer: SocketAddr = accepted.peer.parse().expect("peer is a socket address");
        assert!(server_peer.ip().is_loopback());

        step(client.outgoing.send(r#"{"id":1}"#.to_owned()))
            .await
            .expect("client send");
        let received = step(accepted.incoming.next()).await;
        assert_eq!(
            received.expect("a message").expect("framed"),
            br#"{"id":1}"#
        );

        step(accepted.outgoing.send(r#"{"id":1,"result":{}}"#.to_owned()))
            .await
            .expect("server send");
        let reply = step(client.incoming.next()).await;
        assert_eq!(
            reply.expect("a message").expect("framed"),
            br#"{"id":1,"result":{}}"#
        );
        server.stop().await;
    }

    #[tokio::test]
    async fn message_over_the_limit_is_too_large() {
        const LIMIT: usize = 1024;
        let mut server = TestServer::start(LIMIT).await;
        let url = format!("ws://{}/", server.addr);
        let mut client = step(connect_websocket(&url, 4 * LIMIT))
            .await
            .expect("connect");
        let mut accepted = server.next_transport().await;

        // Exactly at the limit is fine.
        step(client.outgoing.send("a".repeat(LIMIT)))
            .await
            .expect("send");
        let at_limit = step(accepted.incoming.next()).await;
        assert_eq!(at_limit.expect("a message").expect("framed").len(), LIMIT);

        // One byte more ends the connection.
        step(client.outgoing.send("a".repeat(LIMIT + 1)))
            .await
            .expect("send");
        match step(accepted.incoming.next()).await {
            Some(Err(FramingError::TooLarge { limit })) => assert_eq!(limit, LIMIT),
            other => panic!("expected TooLarge, got {other:?}"),
        }
        assert!(step(accepted.incoming.next()).await.is_none());

        // The server can still tell the client why before closing (protocol.md §1).
        let error = r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32600}}"#;
        step(accepted.outgoing.send(error.to_owned()))
            .await
            .expect("send the framing error");
        step(accepted.outgoing.close()).await.expect("close");
        let told = step(client.incoming.next()).await;
        assert_eq!(told.expect("a message").expect("framed"), error.as_bytes());
        server.stop().await;
    }

    #[tokio::test]
    async fn fragmented_message_over_the_limit_is_too_large() {
        const LIMIT: usize = 1024;
        let mut server = TestServer::start(LIMIT).await;
        let (mut raw, _) = step(tokio_tungstenite::connect_async(format!(
            "ws://{}/",
            server.addr
        )))
        .await
        .expect("connect");
        let mut accepted = server.next_transport().await;

        // Each fragment is under the limit; together they are over it.
        let first = Frame::message(vec![b'a'; 600], OpCode::Data(OpData::Text), false);
        let last = Frame::message(vec![b'a'; 600], OpCode::Data(OpData::Continue), true);
        step(raw.send(Message::Frame(first))).await.expect("send");
        step(raw.send(Message::Frame(last))).await.expect("send");
        match step(accepted.incoming.next()).await {
            Some(Err(FramingError::TooLarge { limit })) => assert_eq!(limit, LIMIT),
            other => panic!("expected TooLarge, got {other:?}"),
        }
        server.stop().await;
    }

    #[tokio::test]
    async fn binary_message_is_accepted() {
        let mut server = TestServer::start(1024).await;
        let (mut raw, _) = step(tokio_tungstenite::connect_async(format!(
            "ws://{}/",
            server.addr
        )))
        .await
        .expect("connect");
        let mut accepted = server.next_transport().await;

        let payload = vec![b'{', 0, 0x9f, 0xff, b'}'];
        step(raw.send(Message::Binary(payload.clone())))
            .await
            .expect("send");
        let received = step(accepted.incoming.next()).await;
        assert_eq!(received.expect("a message").expect("framed"), payload);
        server.stop().await;
    }

    #[tokio::test]
    async fn ping_is_answered_while_the_server_only_reads() {
        let mut server = TestServer::start(1024).await;
        let (mut raw, _) = step(tokio_tungstenite::connect_async(format!(
            "ws://{}/",
            server.addr
        )))
        .await
        .expect("connect");
        let mut accepted = server.next_transport().await;
        let reader = tokio::spawn(async move {
            while let Some(Ok(_)) = accepted.incoming.next().await {}
            accepted
        });

        step(raw.send(Message::Ping(b"are you there".to_vec())))
            .await
            .expect("send ping");
        match step(raw.next()).await {
            Some(Ok(Message::Pong(payload))) => assert_eq!(payload, b"are you there"),
            other => panic!("expected a pong, got {other:?}"),
        }
        drop(raw);
        step(reader).await.expect("reader task");
        server.stop().await;
    }

    #[tokio::test]
    async fn closing_the_sink_ends_the_peers_stream() {
        let mut server = TestServer::start(1024).await;
        // No path at all, as `execrelay serve` prints its URL.
        let mut client = step(connect_websocket(&format!("ws://{}", server.addr), 1024))
            .await
            .expect("connect");
        let mut accepted = server.next_transport().await;

        step(client.outgoing.close()).await.expect("close");
        assert!(step(accepted.incoming.next()).await.is_none());
        // The server answered the close frame; once it drops the connection the client's
        // stream ends cleanly too.
        drop(accepted);
        assert!(step(client.incoming.next()).await.is_none());
        server.stop().await;
    }

    #[tokio::test]
    async fn long_handshake_head_is_replayed_in_full() {
        // Longer than tungstenite's 4 KiB read chunk, so the replay takes several reads.
        let mut server = TestServer::start(1024).await;
        let padding = "p".repeat(8 * 1024);
        let request = format!("{UPGRADE_REQUEST}X-Padding: {padding}\r\n\r\n");
        let mut tcp = step(TcpStream::connect(server.addr))
            .await
            .expect("connect");
        step(tcp.write_all(request.as_bytes()))
            .await
            .expect("write");
        let mut accepted = server.next_transport().await;

        let mut response = Vec::new();
        while !response.ends_with(b"\r\n\r\n") {
            let mut byte = [0u8; 1];
            let read = step(tcp.read(&mut byte)).await.expect("read response");
            assert_eq!(read, 1, "connection closed during the handshake");
            response.extend_from_slice(&byte);
        }
        let response = String::from_utf8_lossy(&response).to_ascii_lowercase();
        assert!(response.starts_with("http/1.1 101 "), "{response}");
        // The accept key RFC 6455 §1.3 gives for this request's key.
        assert!(
            response.contains("sec-websocket-accept: s3pplmbitxaq9kygzzhzrbk+xoo=\r\n"),
            "{response}"
        );

        // A masked text frame carrying "hi".
        let mask = [1u8, 2, 3, 4];
        let mut frame = vec![0x81, 0x80 | 2];
        frame.extend_from_slice(&mask);
        frame.extend_from_slice(&[b'h' ^ mask[0], b'i' ^ mask[1]]);
        step(tcp.write_all(&frame)).await.expect("write frame");
        let received = step(accepted.incoming.next()).await;
        assert_eq!(received.expect("a message").expect("framed"), b"hi");
        server.stop().await;
    }

    #[tokio::test]
    async fn shutdown_stops_listening_and_abandons_stalled_handshakes() {
        let server = TestServer::start(1024).await;
        let addr = server.addr;
        // A client that never finishes its head must not hold shutdown for HANDSHAKE_TIMEOUT.
        let mut stalled = step(TcpStream::connect(addr)).await.expect("connect");
        step(stalled.write_all(b"GET / HTTP/1.1\r\n"))
            .await
            .expect("write");
        server.stop().await;

        let mut scratch = [0u8; 16];
        let after = step(stalled.read(&mut scratch)).await;
        assert!(matches!(after, Ok(0) | Err(_)), "{after:?}");
        assert!(TcpStream::connect(addr).await.is_err());
    }

    #[test]
    fn routes() {
        fn head(text: &str) -> RequestHead {
            match parse_head(text.as_bytes()) {
                Ok(Some(head)) => head,
                other => panic!("{text:?} did not parse: {other:?}"),
            }
        }
        let upgrade = format!("{UPGRADE_REQUEST}\r\n");
        assert_eq!(route(&head(&upgrade)), Route::Upgrade);
        assert_eq!(
            route(&head(&format!("{UPGRADE_REQUEST}origin: null\r\n\r\n"))),
            Route::Reply(Reply::Forbidden)
        );
        // An Origin with only the key (no Upgrade field) is still refused.
        assert_eq!(
            route(&head(
                "GET / HTTP/1.1\r\nSec-WebSocket-Key: a\r\nOrigin: x\r\n\r\n"
            )),
            Route::Reply(Reply::Forbidden)
        );
        assert_eq!(
            route(&head(
                "GET / HTTP/1.1\r\nConnection: upgrade\r\nUpgrade: h2c, WebSocket\r\n\r\n"
            )),
            Route::Upgrade
        );
        assert_eq!(
            route(&head("GET /readyz?probe=1 HTTP/1.1\r\nOrigin: x\r\n\r\n")),
            Route::Reply(Reply::Ready)
        );
        assert_eq!(
            route(&head("POST /readyz HTTP/1.1\r\n\r\n")),
            Route::Reply(Reply::MethodNotAllowed)
        );
        assert_eq!(
            route(&head("GET /readyz/x HTTP/1.1\r\n\r\n")),
            Route::Reply(Reply::NotFound)
        );
        assert_eq!(
            route(&head("GET /readyz HTTP/1.1\r\nUpgrade: h2c\r\n\r\n")),
            Route::Reply(Reply::Ready)
        );
    }

    #[test]
    fn parse_head_outcomes() {
        assert!(matches!(parse_head(b"GET / HTTP/1.1\r\nHost:"), Ok(None)));
        assert!(matches!(
            parse_head(b"\x16\x03\x01\x02\x00\n\n"),
            Err(HeadError::Malformed(_))
        ));
        let mut many = String::from("GET / HTTP/1.1\r\n");
        for i in 0..=MAX_REQUEST_HEADERS {
            many.push_str(&format!("X-{i}: y\r\n"));
        }
        many.push_str("\r\n");
        assert!(matches!(
            parse_head(many.as_bytes()),
            Err(HeadError::TooLarge)
        ));
    }

    /// Yields its input one byte per read, like a peer trickling bytes.
    struct Trickle(Vec<u8>, usize);

    impl AsyncRead for Trickle {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let at = self.1;
            if let Some(&byte) = self.0.get(at) {
                buf.put_slice(&[byte]);
                self.1 += 1;
            }
            Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn request_head_reading_is_bounded() {
        // Bytes after the head are kept for the replay.
        let mut input: &[u8] = b"GET / HTTP/1.1\r\nHost: x\r\n\r\nEXTRA";
        let (buffered, head) = read_request_head(&mut input).await.expect("head");
        assert_eq!(head.method, "GET");
        assert!(buffered.ends_with(b"\r\n\r\nEXTRA"));

        // A head byte by byte is fine...
        let mut trickle = Trickle(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), 0);
        let (_, head) = read_request_head(&mut trickle).await.expect("head");
        assert_eq!(head.path, "/readyz");

        // ...but a stream of line feeds is not re-parsed thousands of times.
        let mut newlines = Trickle(vec![b'\n'; MAX_REQUEST_HEAD_BYTES], 0);
        assert!(matches!(
            read_request_head(&mut newlines).await,
            Err(HeadError::TooLarge)
        ));

        let mut endless: &[u8] = &[b'a'; 2 * MAX_REQUEST_HEAD_BYTES];
        assert!(matches!(
            read_request_head(&mut endless).await,
            Err(HeadError::TooLarge)
        ));

        let mut truncated: &[u8] = b"GET / HTTP/1.1\r\n";
        assert!(matches!(
            read_request_head(&mut truncated).await,
            Err(HeadError::Closed)
        ));
    }

    #[tokio::test]
    async fn rewind_replays_the_prefix_then_reads_through() {
        let mut rewind = Rewind::new(b"abc".to_vec(), &b"def"[..]);
        let mut out = Vec::new();
        let mut small = [0u8; 2];
        loop {
            let read = rewind.read(&mut small).await.expect("read");
            if read == 0 {
                break;
            }
            out.extend_from_slice(&small[..read]);
        }
        assert_eq!(out, b"abcdef");

        let mut rewind = Rewind::new(b"ignored".to_vec(), Vec::new());
        rewind.write_all(b"written").await.expect("write");
        assert_eq!(rewind.inner, b"written");
    }
}
