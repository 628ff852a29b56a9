//! [`FrontIo`]: the byte stream of one accepted connection, plain TCP or TLS over it, so that
//! everything above (hyper, the hand-off, the WebSocket and the link drivers) is one type
//! whatever the listener speaks.
//!
//! It only forwards: no buffering, no policy (the front decides, `tls` handshakes).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

/// One connection of a listener: TCP, or TLS over TCP (`wss://`).
#[derive(Debug)]
pub enum FrontIo {
    /// A plain TCP connection (`ws://`).
    Plain(TcpStream),
    /// A TLS connection (`wss://`); boxed, as its state is large.
    Tls(Box<TlsStream<TcpStream>>),
}

impl FrontIo {
    /// Whether the connection is encrypted by the listener's TLS.
    pub fn is_tls(&self) -> bool {
        matches!(self, FrontIo::Tls(_))
    }

    /// The TCP stream under it.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            FrontIo::Plain(s) => s,
            FrontIo::Tls(s) => s.get_ref().0,
        }
    }
}

impl AsyncRead for FrontIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            FrontIo::Plain(s) => Pin::new(s).poll_read(cx, buf),
            FrontIo::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for FrontIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            FrontIo::Plain(s) => Pin::new(s).poll_write(cx, buf),
            FrontIo::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            FrontIo::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            FrontIo::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            FrontIo::Plain(s) => s.is_write_vectored(),
            FrontIo::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            FrontIo::Plain(s) => Pin::new(s).poll_flush(cx),
            FrontIo::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            FrontIo::Plain(s) => Pin::new(s).poll_shutdown(cx),
            FrontIo::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
