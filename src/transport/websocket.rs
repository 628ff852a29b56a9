//! Plain WebSocket transport (`ws://`): the framing that turns a WebSocket into a
//! [`Transport`], on both ends.
//!
//! # What this module owns
//!
//! - **WebSocket framing** (protocol.md §1): one message per text or binary message, the
//!   `maxMessageBytes` limit enforced by tungstenite before more than the limit of one message
//!   is buffered, and the mapping of tungstenite's errors onto [`FramingError`]. Outbound, a
//!   JSON text is a text frame and a binary message (§5.1) a binary frame, so the two never
//!   mix up.
//! - The server side ([`framed`], for a WebSocket the HTTP front upgraded) and the client side
//!   ([`connect_websocket`]) of the same framing, with the same [`websocket_config`].
//!
//! # What it must never do
//!
//! - Interpret JSON-RPC: messages are opaque bytes here.
//! - Serve HTTP: accepting connections, the request head, `/readyz`, the `Origin` refusal and
//!   the upgrade belong to the HTTP front (`execrelay_io::http`).
//! - Log message contents (they carry process output and stdin), or panic on anything a peer
//!   sends.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use execrelay_io::driver::{ReadAhead, WS_READ_BUFFER_BYTES};
use execrelay_io::http::DataOpcode;
use execrelay_protocol::config::KeepaliveConfig;
use execrelay_protocol::websocket::Role;
use futures_util::{Sink, SinkExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::error::{Error as WsError, UrlError};
use tokio_tungstenite::tungstenite::handshake::client::Response;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use tracing::debug;

use super::ws_frames::DataFrames;
use super::ws_inbound::WsStream;
use super::ws_keepalive::{KeepaliveState, Shared, WsSink};
use super::{FramingError, OutMessage, Transport};

/// How long a client's connect and WebSocket handshake may take together: 10 s.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Connects to `url` (`ws://host:port/path`) and returns the framed [`Transport`]: as
/// [`connect_websocket_with_tls`] without a TLS config (a `wss://` URL is refused).
pub async fn connect_websocket(
    url: &str,
    max_message_bytes: usize,
) -> Result<Transport, FramingError> {
    connect_websocket_with_tls(url, max_message_bytes, None).await
}

/// Connects to `url` (`ws://host:port/path`, or `wss://` through the rustls `tls` config)
/// and returns the framed [`Transport`].
///
/// Inbound messages larger than `max_message_bytes` end the connection with
/// [`FramingError::TooLarge`]. Connecting and the handshake together must finish within 10 s
/// (else [`FramingError::Io`] with [`io::ErrorKind::TimedOut`]); a refused handshake (for
/// example a 403) is a [`FramingError::Protocol`]. `peer` is the server's socket address.
pub async fn connect_websocket_with_tls(
    url: &str,
    max_message_bytes: usize,
    tls: Option<Arc<rustls::ClientConfig>>,
) -> Result<Transport, FramingError> {
    // JSON-RPC messages are small and latency-sensitive: no Nagle delay (the dialer sets
    // `TCP_NODELAY`). The handshake runs over a read-ahead buffer that stops at the end of the
    // HTTP head, so tungstenite holds no byte of the first frame: the reading half reads
    // everything after it with the crate's own codec (`ws_inbound`).
    if url.starts_with("wss://") && tls.is_none() {
        return Err(FramingError::Protocol(format!(
            "{url}: wss:// needs a TLS configuration (the client library passes the \
             platform's trust roots)"
        )));
    }
    let connect = connect_link_socket(url, websocket_config(max_message_bytes), tls);
    let (ws, _response) = match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
        Ok(Ok(connected)) => connected,
        Ok(Err(WsError::Io(error))) => return Err(FramingError::Io(error)),
        Ok(Err(error)) => return Err(FramingError::Protocol(handshake_error(&error))),
        Err(_elapsed) => {
            return Err(FramingError::Io(io::Error::new(
                io::ErrorKind::TimedOut,
                "WebSocket connect and handshake timed out",
            )))
        }
    };
    let peer = match ws.get_ref().get_ref() {
        MaybeTlsStream::Plain(tcp) => tcp.get_ref().peer_addr().ok().map(|addr| addr.to_string()),
        _ => None,
    }
    .unwrap_or_else(|| url.to_owned());
    debug!(%peer, "connected over plain WebSocket");
    // The client pings too (§6.4): a server that stopped answering is found dead.
    Ok(framed_with_keepalive(
        ws,
        Role::Client,
        max_message_bytes,
        peer,
        Some(KeepaliveConfig::default()),
    ))
}

/// A failed WebSocket handshake as a person reads it: an HTTP answer by its status and the
/// first line of its body (a listener's hint of what it is and which URL form reaches it, in
/// the `404` to an upgrade on a path it does not serve), anything else as tungstenite says it.
pub fn handshake_error(e: &WsError) -> String {
    match e {
        WsError::Http(response) => {
            let body = response
                .body()
                .as_deref()
                .and_then(|b| std::str::from_utf8(b).ok())
                .and_then(|t| t.lines().next())
                .unwrap_or("")
                .trim();
            match body {
                "" => format!("HTTP {}", response.status()),
                body => format!("HTTP {}: {body}", response.status()),
            }
        }
        e => e.to_string(),
    }
}

/// A dialled WebSocket (a link's, or a plain JSON-RPC client's): TLS for `wss://`, over the
/// TCP stream under a read-ahead buffer, with a second read-ahead buffer above TLS that stops
/// each read at the end of the HTTP head and of each frame ([`ReadAhead::websocket_client`]),
/// so the crate's own codec can take the socket over from tungstenite without losing a byte
/// (a link's driver; a plain client's reading half, once it ends the boundaries). The lower
/// buffer steps aside: the codec's and the upper buffer's reads are as large as its own.
pub type LinkClientSocket = WebSocketStream<ReadAhead<MaybeTlsStream<ReadAhead<TcpStream>>>>;

/// Dials `url`: TLS (through the rustls `tls` config) for `wss://`, then the WebSocket
/// handshake over [`ReadAhead::websocket_client`]. Used by links and by
/// [`connect_websocket`].
pub async fn connect_link_socket(
    url: &str,
    config: WebSocketConfig,
    tls: Option<Arc<rustls::ClientConfig>>,
) -> Result<(LinkClientSocket, Response), WsError> {
    let request = url.into_client_request()?;
    let (host, tcp) = connect_tcp(&request).await?;
    let stream = match (request.uri().scheme_str(), tls) {
        (Some("wss"), Some(tls)) => {
            let name = rustls::pki_types::ServerName::try_from(host)
                .map_err(|_| WsError::Url(UrlError::NoHostName))?;
            let tls = tokio_rustls::TlsConnector::from(tls)
                .connect(name, ReadAhead::new(tcp))
                .await
                .map_err(WsError::Io)?;
            MaybeTlsStream::Rustls(tls)
        }
        (Some("wss"), None) => return Err(WsError::Url(UrlError::TlsFeatureNotEnabled)),
        _ => MaybeTlsStream::Plain(ReadAhead::new(tcp)),
    };
    tokio_tungstenite::client_async_with_config(
        request,
        ReadAhead::websocket_client(stream),
        Some(config),
    )
    .await
}

/// The TCP connection of a WebSocket request (without Nagle's delay: callers write whole
/// batches), and the host it names.
async fn connect_tcp(
    request: &tokio_tungstenite::tungstenite::handshake::client::Request,
) -> Result<(String, TcpStream), WsError> {
    let host = request
        .uri()
        .host()
        .ok_or(WsError::Url(UrlError::NoHostName))?
        .to_string();
    let port = request
        .uri()
        .port_u16()
        .or_else(|| match request.uri().scheme_str() {
            Some("wss") => Some(443),
            Some("ws") => Some(80),
            _ => None,
        })
        .ok_or(WsError::Url(UrlError::UnsupportedUrlScheme))?;
    let tcp = TcpStream::connect(format!("{host}:{port}"))
        .await
        .map_err(WsError::Io)?;
    tcp.set_nodelay(true).map_err(WsError::Io)?;
    Ok((host, tcp))
}

/// Tungstenite settings shared by both ends.
pub fn websocket_config(max_message_bytes: usize) -> WebSocketConfig {
    // A JSON-RPC connection's inbound limit is enforced by its reading half (`ws_inbound`,
    // the crate's decoder: a frame refused from its header, a fragmented message from its
    // running total); tungstenite only reads while a link's upgrade or handshake is in
    // progress, so its limits sit at the same value for that. The write buffer keeps
    // tungstenite's defaults (writes start at 128 KiB buffered; no cap: the sink's own
    // backpressure, one message at a time, bounds it); its read buffer is the small one of
    // every connection, allocated by tungstenite and unused once the codec reads.
    WebSocketConfig::default()
        .max_message_size(Some(max_message_bytes))
        .max_frame_size(Some(max_message_bytes))
        .read_buffer_size(WS_READ_BUFFER_BYTES)
}

/// Split `ws` (the `role` end) into its two halves sharing the socket, the reading one
/// refusing messages over `limit`; with `keepalive`, the reading half pings and declares the
/// peer dead, and the writing half has a deadline.
pub fn split<S>(
    mut ws: WebSocketStream<S>,
    role: Role,
    limit: usize,
    keepalive: Option<KeepaliveConfig>,
) -> (WsSink<S>, WsStream<S>)
where
    S: AsyncRead + AsyncWrite + Unpin + DataFrames,
{
    // tungstenite holds no byte past the handshake: the reading half reads from here.
    ws.get_mut().end_boundaries();
    let shared = Shared::new(ws);
    let stream = WsStream::new(
        shared.clone(),
        role,
        limit,
        keepalive.map(KeepaliveState::new),
    );
    let sink = WsSink::new(shared, keepalive.map(|k| k.write_timeout));
    (sink, stream)
}

/// Splits a WebSocket (the `role` end: [`Role::Server`] for one the HTTP front upgraded) into
/// the two halves of a [`Transport`], without keepalive. Inbound messages larger than `limit`
/// end the connection with [`FramingError::TooLarge`]; `peer` names the peer in logs.
///
/// tungstenite must hold no byte past the handshake (the reading half reads the stream under
/// it from there): a server's `from_raw_socket`, or a client's handshake over a stream that
/// stops at the end of the HTTP head ([`ReadAhead::websocket_client`]).
pub fn framed<S>(ws: WebSocketStream<S>, role: Role, limit: usize, peer: String) -> Transport
where
    S: AsyncRead + AsyncWrite + Unpin + DataFrames + Send + 'static,
{
    framed_with_keepalive(ws, role, limit, peer, None)
}

/// [`framed`], with keepalive and a write deadline (`secure-transport.md` §6.4): the
/// inbound half pings every `keepalive.interval` and ends with an I/O error
/// ([`io::ErrorKind::TimedOut`]) when a ping goes unanswered for `keepalive.pong_timeout`,
/// even if the peer keeps sending; a write stuck for `keepalive.write_timeout` fails the same
/// way (see `ws_keepalive`).
pub fn framed_with_keepalive<S>(
    ws: WebSocketStream<S>,
    role: Role,
    limit: usize,
    peer: String,
    keepalive: Option<KeepaliveConfig>,
) -> Transport
where
    S: AsyncRead + AsyncWrite + Unpin + DataFrames + Send + 'static,
{
    // Split rather than drive both directions from one future: each half takes the shared lock
    // only for the duration of one poll, so a write blocked on a slow peer never stops the
    // reader (which keeps answering pings), and vice versa.
    let (sink, stream) = split(ws, role, limit, keepalive);
    let frames = sink.takes_frames();
    Transport {
        incoming: Box::pin(stream),
        outgoing: Box::pin(Outgoing {
            inner: sink,
            frames,
        }),
        peer,
        binary_messages: true,
        flow: None,
    }
}

/// Outbound half: a JSON text becomes one text message, a binary message one binary message.
struct Outgoing<S> {
    inner: WsSink<S>,
    /// The stream takes whole data frames ([`DataFrames`]: a server's connection): every
    /// message is queued there as it is, its bytes written from its own buffers (the JSON
    /// `String`, the binary head and the output chunk), never copied into tungstenite's write
    /// buffer; tungstenite writes only control frames.
    frames: bool,
}

/// The one binary frame of a binary message, where tungstenite writes it (a client's
/// connection). tungstenite takes a frame's payload as one `Bytes` and copies it into its
/// write buffer, so the two parts are joined here, once, into a buffer of the exact size (a
/// message with no head is passed on as it is).
fn binary_frame(head: &[u8], payload: Bytes) -> Message {
    if head.is_empty() {
        return Message::Binary(payload);
    }
    let mut joined = Vec::with_capacity(head.len() + payload.len());
    joined.extend_from_slice(head);
    joined.extend_from_slice(&payload);
    Message::Binary(joined.into())
}

impl<S> Sink<OutMessage> for Outgoing<S>
where
    S: AsyncRead + AsyncWrite + Unpin + DataFrames,
{
    type Error = io::Error;

    fn poll_ready(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.inner.poll_ready_unpin(cx).map_err(into_io)
    }

    fn start_send(mut self: Pin<&mut Self>, item: OutMessage) -> io::Result<()> {
        if self.frames {
            let (opcode, head, payload) = match item {
                // The `String`'s buffer becomes the payload as it is.
                OutMessage::Text(text) => (DataOpcode::Text, Bytes::new(), Bytes::from(text)),
                OutMessage::Binary { head, payload } => (DataOpcode::Binary, head, payload),
            };
            return self
                .inner
                .start_send_data(opcode, head, payload)
                .map_err(into_io);
        }
        let message = match item {
            // The `String` becomes the message's payload as it is: no copy.
            OutMessage::Text(text) => Message::Text(text.into()),
            OutMessage::Binary { head, payload } => binary_frame(&head, payload),
        };
        self.inner.start_send_unpin(message).map_err(into_io)
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
mod tests;
