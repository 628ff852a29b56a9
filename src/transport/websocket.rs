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
use futures_util::{Sink, SinkExt, Stream, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::error::{Error as WsError, ProtocolError, UrlError};
use tokio_tungstenite::tungstenite::handshake::client::Response;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{Connector, MaybeTlsStream, WebSocketStream};
use tracing::debug;

use super::ws_frames::DataFrames;
use super::ws_keepalive::{split, WsSink, WsStream};
use super::{FramingError, OutMessage, Transport};

/// How long a client's connect and WebSocket handshake may take together: 10 s.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

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
    // JSON-RPC messages are small and latency-sensitive: no Nagle delay (the dialer sets
    // `TCP_NODELAY`); the socket is read through a read-ahead buffer.
    let connect = connect_websocket_stream(url, websocket_config(max_message_bytes), None);
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
    let peer = match ws.get_ref() {
        MaybeTlsStream::Plain(tcp) => tcp.get_ref().peer_addr().ok().map(|addr| addr.to_string()),
        _ => None,
    }
    .unwrap_or_else(|| url.to_owned());
    debug!(%peer, "connected over plain WebSocket");
    // The client pings too (§6.4): a server that stopped answering is found dead.
    Ok(framed_with_keepalive(
        ws,
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

/// A dialled WebSocket (a plain JSON-RPC client's): TLS for `wss://`, over the TCP
/// stream under a read-ahead buffer (`execrelay_io::driver::read_ahead`: tungstenite reads
/// 4 KiB at a time, which would otherwise be one system call each).
pub type ClientSocket = WebSocketStream<MaybeTlsStream<ReadAhead<TcpStream>>>;

/// A dialled link's WebSocket: as [`ClientSocket`], with a second read-ahead buffer above TLS
/// that stops each read at the end of the HTTP head and of each frame
/// ([`ReadAhead::websocket_client`]), so the link's driver can take the socket over from
/// tungstenite without losing a byte. (The lower buffer steps aside: the driver's and the
/// upper buffer's reads are as large as its own.)
pub type LinkClientSocket = WebSocketStream<ReadAhead<MaybeTlsStream<ReadAhead<TcpStream>>>>;

/// [`connect_websocket_stream`] for a link: TLS (through the rustls `tls` config) for
/// `wss://`, then the handshake over [`ReadAhead::websocket_client`].
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

/// Connect to `url` (`ws://` or `wss://`): TCP (without Nagle's delay: callers write whole
/// batches), then TLS for `wss://` (through `connector`, or tokio-tungstenite's default one),
/// then the WebSocket handshake with `config`; as `tokio_tungstenite::connect_async_tls_with_config`
/// does, with the read-ahead buffer under it all. No deadline: the caller sets one.
pub async fn connect_websocket_stream(
    url: &str,
    config: WebSocketConfig,
    connector: Option<Connector>,
) -> Result<(ClientSocket, Response), WsError> {
    let request = url.into_client_request()?;
    let (_host, tcp) = connect_tcp(&request).await?;
    tokio_tungstenite::client_async_tls_with_config(
        request,
        ReadAhead::new(tcp),
        Some(config),
        connector,
    )
    .await
}

/// Tungstenite settings shared by both ends.
pub fn websocket_config(max_message_bytes: usize) -> WebSocketConfig {
    // Both limits sit exactly at the protocol limit. tungstenite checks a frame's declared
    // length before reading its payload, and a fragmented message's running total before
    // appending a fragment, so it never accumulates more than the limit of one message
    // and reports the overrun as `Error::Capacity`. The write buffer keeps tungstenite's
    // defaults (writes start at 128 KiB buffered; no cap: the sink's own backpressure, one
    // message at a time, bounds it); its read buffer is the small one of every connection.
    WebSocketConfig::default()
        .max_message_size(Some(max_message_bytes))
        .max_frame_size(Some(max_message_bytes))
        .read_buffer_size(WS_READ_BUFFER_BYTES)
}

/// Splits an upgraded WebSocket into the two halves of a [`Transport`], without keepalive.
/// Inbound messages larger than `limit` end the connection with [`FramingError::TooLarge`];
/// `peer` names the peer in logs.
pub fn framed<S>(ws: WebSocketStream<S>, limit: usize, peer: String) -> Transport
where
    S: AsyncRead + AsyncWrite + Unpin + DataFrames + Send + 'static,
{
    framed_with_keepalive(ws, limit, peer, None)
}

/// [`framed`], with keepalive and a write deadline (`secure-transport.md` §6.4): the
/// inbound half pings every `keepalive.interval` and ends with an I/O error
/// ([`io::ErrorKind::TimedOut`]) when a ping goes unanswered for `keepalive.pong_timeout`,
/// even if the peer keeps sending; a write stuck for `keepalive.write_timeout` fails the same
/// way (see `ws_keepalive`).
pub fn framed_with_keepalive<S>(
    ws: WebSocketStream<S>,
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
    let (sink, stream) = split(ws, keepalive);
    let frames = sink.takes_frames();
    Transport {
        incoming: Box::pin(Incoming {
            inner: stream,
            limit,
            ended: false,
        }),
        outgoing: Box::pin(Outgoing {
            inner: sink,
            frames,
        }),
        peer,
        binary_messages: true,
        flow: None,
    }
}

/// Inbound half: text and binary messages as bytes; control frames are tungstenite's business.
struct Incoming<S> {
    inner: WsStream<S>,
    limit: usize,
    /// Set once the stream has ended or failed; every later poll yields `None`, since every
    /// [`FramingError`] ends the connection.
    ended: bool,
}

impl<S> Stream for Incoming<S>
where
    S: AsyncRead + AsyncWrite + Unpin + DataFrames,
{
    type Item = Result<Bytes, FramingError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        while !this.ended {
            match ready!(this.inner.poll_next_unpin(cx)) {
                Some(Ok(Message::Text(text))) => return Poll::Ready(Some(Ok(Bytes::from(text)))),
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
