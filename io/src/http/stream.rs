//! [`FrontIo`]: the byte stream of one accepted connection, plain TCP or TLS over it, so that
//! everything above (hyper, the hand-off, the WebSocket and the link drivers) is one type
//! whatever the listener speaks.
//!
//! It only forwards: no buffering, no policy (the front decides, `tls` handshakes).
//!
//! A connection can change runtimes between two uses ([`FrontIo::detach`], then
//! [`Detached::attach`] on the runtime it goes to): its socket leaves one runtime's reactor and
//! is registered with the other's, and a TLS session's state goes with it untouched. A
//! detached connection cannot be read or written: the type says so.

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
    Tls(Box<TlsStream<MovableTcp>>),
}

/// A connection between two runtimes ([`FrontIo::detach`]): its socket is registered with no
/// reactor, so nothing can read or write it until [`Detached::attach`].
#[derive(Debug)]
pub enum Detached {
    /// A plain TCP connection.
    Plain(std::net::TcpStream),
    /// A TLS connection, its session state as it was.
    Tls(Box<TlsStream<MovableTcp>>),
}

impl Detached {
    /// Register the socket with the reactor of the runtime this is called on (it must be
    /// called from inside one): the connection is usable there.
    pub fn attach(self) -> io::Result<FrontIo> {
        match self {
            Detached::Plain(tcp) => Ok(FrontIo::Plain(TcpStream::from_std(tcp)?)),
            Detached::Tls(mut tls) => {
                tls.get_mut().0.attach()?;
                Ok(FrontIo::Tls(tls))
            }
        }
    }
}

/// The TCP stream under a TLS session, which can leave its runtime's reactor
/// ([`FrontIo::detach`]) and join another's ([`Detached::attach`]) while the session
/// above it stays as it is (tokio-rustls gives no way to take a session apart and build it
/// again). Reads and writes of a detached stream fail with `NotConnected`; the front never
/// makes them.
#[derive(Debug)]
pub struct MovableTcp(Movable);

#[derive(Debug)]
enum Movable {
    Registered(TcpStream),
    Detached(std::net::TcpStream),
    /// Taking it off its reactor failed: the socket is gone.
    Lost,
}

impl MovableTcp {
    /// `tcp`, registered where it is.
    pub fn new(tcp: TcpStream) -> MovableTcp {
        MovableTcp(Movable::Registered(tcp))
    }

    /// Take the socket off its runtime's reactor.
    fn detach(&mut self) -> io::Result<()> {
        match std::mem::replace(&mut self.0, Movable::Lost) {
            Movable::Registered(tcp) => {
                self.0 = Movable::Detached(tcp.into_std()?);
                Ok(())
            }
            other => {
                self.0 = other;
                Err(not_registered())
            }
        }
    }

    /// Register the socket with the current runtime's reactor.
    fn attach(&mut self) -> io::Result<()> {
        match std::mem::replace(&mut self.0, Movable::Lost) {
            Movable::Detached(tcp) => {
                self.0 = Movable::Registered(TcpStream::from_std(tcp)?);
                Ok(())
            }
            other => {
                self.0 = other;
                Err(io::Error::other("the socket is not detached"))
            }
        }
    }

    fn stream(self: Pin<&mut Self>) -> io::Result<Pin<&mut TcpStream>> {
        match &mut self.get_mut().0 {
            Movable::Registered(tcp) => Ok(Pin::new(tcp)),
            _ => Err(not_registered()),
        }
    }
}

fn not_registered() -> io::Error {
    io::Error::new(
        io::ErrorKind::NotConnected,
        "the connection is between two runtimes",
    )
}

impl AsyncRead for MovableTcp {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.stream() {
            Ok(tcp) => tcp.poll_read(cx, buf),
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

impl AsyncWrite for MovableTcp {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.stream() {
            Ok(tcp) => tcp.poll_write(cx, buf),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.stream() {
            Ok(tcp) => tcp.poll_write_vectored(cx, bufs),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn is_write_vectored(&self) -> bool {
        // A TCP stream's answer, also while detached (nothing writes it then).
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.stream() {
            Ok(tcp) => tcp.poll_flush(cx),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.stream() {
            Ok(tcp) => tcp.poll_shutdown(cx),
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

impl FrontIo {
    /// Whether the connection is encrypted by the listener's TLS.
    pub fn is_tls(&self) -> bool {
        matches!(self, FrontIo::Tls(_))
    }

    /// Take the connection off this runtime's reactor, to [`attach`](Detached::attach) it on
    /// another runtime. Fails (and the connection is gone) only if the socket cannot be
    /// taken off its reactor.
    pub fn detach(self) -> io::Result<Detached> {
        match self {
            FrontIo::Plain(tcp) => Ok(Detached::Plain(tcp.into_std()?)),
            FrontIo::Tls(mut tls) => {
                tls.get_mut().0.detach()?;
                Ok(Detached::Tls(tls))
            }
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
