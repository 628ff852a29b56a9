//! The HTTP gate in front of a WebSocket upgrade: everything that happens to an accepted
//! connection before tungstenite sees it.
//!
//! # What this module owns
//!
//! - **Reading the request head** under its limits: at most 16 KiB
//!   (`MAX_REQUEST_HEAD_BYTES`), at most 64 header fields (`MAX_REQUEST_HEADERS`), parsed at
//!   most once per line (`MAX_HEAD_PARSES`).
//! - **Routing a request from its head alone** (secure-transport.md §1): `GET /readyz` is
//!   answered with 200, any upgrade request that carries an `Origin` header with 403, other
//!   plain requests with 404 (405 for `/readyz` with another method); WebSocket upgrades pass.
//! - **Plain HTTP replies** and the graceful close after them (`CLOSE_GRACE`).
//! - **[`Rewind`]**, which replays the bytes already read so that tungstenite parses the head
//!   as if it were unread.
//! - The re-check of the `Origin` rule on the request tungstenite actually accepts.
//!
//! # What it must never do
//!
//! - Let a request that carries an `Origin` header through to an upgrade: that is how a web
//!   page open in a browser on the same host would drive a local server.
//! - Buffer more than its limits, or panic on anything a peer sends.
//! - Speak WebSocket or keep time: the accept loop in [`super::websocket`] owns the upgrade,
//!   the handshake deadline and the handshake slots; this module bounds bytes, not time
//!   (except the grace period after a reply).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::{header, StatusCode};
use tracing::debug;

/// Largest request head (request line plus header fields) read before the upgrade: 16 KiB.
///
/// HTTP sets no maximum. A WebSocket handshake from a real client is well under 1 KiB and
/// 16 KiB is what common servers allow; a longer head is answered with 431 and closed, so a
/// peer cannot make us buffer an unbounded head. Bytes a client pipelines after the head count
/// against the same buffer.
pub(super) const MAX_REQUEST_HEAD_BYTES: usize = 16 * 1024;

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

/// After an HTTP reply (200, 403, 404, 431, …): how long we keep discarding what the peer still
/// sends before closing, 1 s.
///
/// Closing a socket that still has unread input makes the kernel send a reset, which can
/// destroy our reply before the peer has read it (typically a 431 sent while the peer is still
/// sending its oversized head).
pub(super) const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// Most bytes discarded during [`CLOSE_GRACE`]: 64 KiB, so a refused peer cannot keep us
/// reading for the whole grace period at full speed.
const CLOSE_DRAIN_BYTES: usize = 64 * 1024;

/// The readiness probe path (secure-transport.md §1).
const READYZ_PATH: &str = "/readyz";

/// Why no usable request head was read.
#[derive(Debug)]
pub(crate) enum HeadError {
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
pub(crate) struct RequestHead {
    pub(crate) method: String,
    /// The request target, query included.
    pub(crate) path: String,
    /// An `Origin` header is present (with any value, even empty).
    has_origin: bool,
    /// The request asks for a protocol switch of any kind (`Upgrade` or `Sec-WebSocket-Key`).
    asks_upgrade: bool,
    /// `Upgrade` lists the `websocket` token.
    websocket_upgrade: bool,
}

/// Reads from `stream` until it holds a complete request head. Returns everything read (the
/// head and whatever the client sent after it) with the parsed head.
pub(crate) async fn read_request_head<S>(
    stream: &mut S,
) -> Result<(Vec<u8>, RequestHead), HeadError>
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
pub(super) enum Route {
    /// Hand the connection to tungstenite.
    Upgrade,
    /// Answer with a plain HTTP response and close.
    Reply(Reply),
}

/// Decides what to do with a request from its head alone.
pub(super) fn route(head: &RequestHead) -> Route {
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
pub(crate) enum Reply {
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
        response(
            status,
            &format!("Content-Type: text/plain; charset=utf-8\r\n{extra_headers}"),
            body,
        )
    }
}

/// A complete `Connection: close` response; `headers` are whole lines, each ending in CRLF.
pub(crate) fn response(status: &str, headers: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// Writes `reply`, then closes without resetting: see [`CLOSE_GRACE`].
pub(crate) async fn reply_and_close(stream: TcpStream, reply: Reply) {
    send_and_close(stream, reply.to_http().as_bytes()).await
}

/// Writes a whole response, then closes without resetting: see [`CLOSE_GRACE`].
pub(crate) async fn send_and_close(mut stream: TcpStream, response: &[u8]) {
    let exchange = async {
        stream.write_all(response).await?;
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
    pub(super) fn new(prefix: Vec<u8>, inner: S) -> Self {
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

/// Second line of defence for the `Origin` rule: [`route`] has already refused such requests,
/// but tungstenite parses the head again itself, so the rule is re-checked on the request it
/// actually accepts.
// The signature is tungstenite's `Callback`; the large error type is theirs to choose.
#[allow(clippy::result_large_err)]
pub(super) fn refuse_cross_origin(
    request: &Request,
    response: Response,
) -> Result<Response, ErrorResponse> {
    if request.headers().contains_key(header::ORIGIN) {
        let mut refusal = ErrorResponse::new(Some(FORBIDDEN_BODY.to_owned()));
        *refusal.status_mut() = StatusCode::FORBIDDEN;
        return Err(refusal);
    }
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same handshake as in the `websocket` tests; repeated so each test module stands
    /// alone.
    const UPGRADE_REQUEST: &str = "GET /rpc HTTP/1.1\r\nHost: 127.0.0.1\r\n\
        Upgrade: websocket\r\nConnection: Upgrade\r\n\
        Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n";

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
