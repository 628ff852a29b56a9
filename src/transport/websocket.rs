//! Plain WebSocket transport (`ws://`): the listener that accepts connections and upgrades
//! them, and the framing that turns a WebSocket into a [`Transport`].
//!
//! # What this module owns
//!
//! - **The accept loop** shared by `ws://` and `noise+ws://` listeners: one task per accepted
//!   connection, at most 256 of them not yet upgraded (`MAX_PENDING_HANDSHAKES`), and one
//!   deadline (`HANDSHAKE_TIMEOUT`, 10 s) for the request head and the upgrade together. What
//!   each request gets before the upgrade (`/readyz`, `Origin` → 403, 404) is decided by the
//!   HTTP gate in [`super::http_gate`]; every WebSocket upgrade it lets through goes to
//!   tungstenite with the bytes already read replayed.
//! - **WebSocket framing** (protocol.md §1): one message per text or binary message, the
//!   `maxMessageBytes` limit enforced by tungstenite before more than the limit of one message
//!   is buffered, and the mapping of tungstenite's errors onto [`FramingError`].
//! - The client side of the same framing ([`connect_websocket`]).
//!
//! # What it must never do
//!
//! - Interpret JSON-RPC: messages are opaque bytes here.
//! - Upgrade a request the gate has not let through (a request that carries an `Origin`
//!   header never is: that is how a web page open in a browser on the same host would drive a
//!   local server).
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
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::error::{Error as WsError, ProtocolError};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, warn, Instrument};

use super::http_gate::{
    read_request_head, refuse_cross_origin, reply_and_close, route, HeadError, Reply, Route,
};
use super::{FramingError, Transport};

/// Replays the request head to tungstenite; part of [`UpgradedWebSocket`]. It lives with the
/// gate that reads the head and is re-exported here, so `websocket::Rewind` keeps working.
pub use super::http_gate::Rewind;

/// How long a new connection may take to deliver its request head and finish the upgrade:
/// 10 s. Past it the connection is closed without a reply, so a slow peer cannot hold a
/// handshake slot for ever.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections accepted but not yet upgraded (or answered) at once: 256.
///
/// Each holds at most [`MAX_REQUEST_HEAD_BYTES`](super::http_gate::MAX_REQUEST_HEAD_BYTES) for
/// at most [`HANDSHAKE_TIMEOUT`] (plus [`CLOSE_GRACE`](super::http_gate::CLOSE_GRACE) when
/// refused). Beyond the cap a new connection is closed at once, which bounds what a flood of
/// idle connections can take (256 × 16 KiB = 4 MiB). Real clients finish their handshake in
/// milliseconds, so the cap is reached only under such a flood.
const MAX_PENDING_HANDSHAKES: usize = 256;

/// Pause after a failed `accept`: 100 ms. Failures such as running out of file descriptors
/// repeat immediately; without a pause the accept loop would spin a core while they last.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(100);

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

#[cfg(test)]
mod tests {
    use std::future::Future;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::sync::mpsc;
    use tokio::task::JoinHandle;
    use tokio_tungstenite::tungstenite::http::{header, StatusCode};
    use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data as OpData, OpCode};
    use tokio_tungstenite::tungstenite::protocol::frame::Frame;

    use super::super::http_gate::MAX_REQUEST_HEAD_BYTES;
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
}
