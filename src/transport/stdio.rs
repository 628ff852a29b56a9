//! Line-framed transports over byte streams: the server's own stdin/stdout, a child's pipes
//! (the client spawning `execrelay serve --listen stdio`), or an in-memory duplex in tests.

use futures_util::StreamExt;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_util::codec::{FramedRead, FramedWrite};

use super::line_codec::LineCodec;
use super::Transport;

/// Frame `reader`/`writer` as one message per line.
pub fn line_transport<R, W>(reader: R, writer: W, max_message_bytes: usize, peer: &str) -> Transport
where
    R: AsyncRead + Send + 'static,
    W: AsyncWrite + Send + 'static,
{
    let incoming = FramedRead::with_capacity(reader, LineCodec::new(max_message_bytes), 64 * 1024);
    let mut outgoing = FramedWrite::new(writer, LineCodec::new(max_message_bytes));
    // Large enough that a batch of output notifications goes out in few writes.
    outgoing.set_backpressure_boundary(256 * 1024);
    Transport {
        incoming: Box::pin(incoming.map(|m| m.map(bytes::Bytes::from)).fuse()),
        outgoing: Box::pin(outgoing),
        peer: peer.to_string(),
        binary_messages: false,
        flow: None,
    }
}

/// The server's own stdin and stdout.
///
/// When they are pipes (a client spawned us, the usual case), they are driven by the reactor
/// like sockets: a duplicate of each descriptor is registered with epoll. tokio's
/// `stdin()`/`stdout()` would instead hand every read and write to a blocking-pool thread, a
/// copy and a thread hop per message, which cost a third of stdio throughput. Registering a
/// pipe sets O_NONBLOCK on its open file description, which is shared with every process that
/// holds the same pipe (a shell pipeline may hand it on to the next command): the original
/// flags are put back when the transport is dropped. Anything else (a terminal, a file) keeps
/// tokio's blocking adapters.
pub fn stdio_transport(max_message_bytes: usize) -> Transport {
    use std::os::fd::AsFd;
    use tokio::net::unix::pipe;
    let reader = stdin_reader();
    let writer: Box<dyn AsyncWrite + Send + Unpin> = {
        let flags = RestoreFlags::save(std::io::stdout().as_fd());
        match std::io::stdout()
            .as_fd()
            .try_clone_to_owned()
            .and_then(pipe::Sender::from_owned_fd)
        {
            Ok(w) => Box::new(Restoring {
                inner: w,
                _flags: flags,
            }),
            Err(_) => Box::new(tokio::io::stdout()),
        }
    };
    line_transport(reader, writer, max_message_bytes, "stdio")
}

/// What `execrelay run` asks of the kernel for a stdin pipe: 1 MiB, the most an unprivileged
/// process may set by default (`/proc/sys/fs/pipe-max-size`).
pub const STDIN_PIPE_BYTES: usize = 1024 * 1024;

/// Grow the pipe `fd` to at least `bytes` of buffer (`F_SETPIPE_SZ`); never shrink it, and
/// leave it as it is when the kernel refuses (a lower `/proc/sys/fs/pipe-max-size`) or `fd` is
/// not a pipe. The new size, if it changed.
///
/// `execrelay run` grows its stdin so: a pipe holds 64 KiB by default, and an upload whose
/// writes are answered in bursts frees several write slots at once. Reading a 64 KiB pipe that
/// fast finds only what the producer wrote in between: short pieces, each taking a record of
/// the stream's window (which counts records) and a slot of the write pipeline. With a larger
/// buffer the producer runs ahead while the writes are in flight, and each read finds a whole
/// piece.
pub fn grow_pipe(fd: std::os::fd::BorrowedFd<'_>, bytes: usize) -> Option<usize> {
    use nix::fcntl::{fcntl, FcntlArg};
    use std::os::fd::AsRawFd;
    let fd = fd.as_raw_fd();
    let now = usize::try_from(fcntl(fd, FcntlArg::F_GETPIPE_SZ).ok()?).ok()?;
    if now >= bytes {
        return None;
    }
    let want = i32::try_from(bytes).ok()?;
    usize::try_from(fcntl(fd, FcntlArg::F_SETPIPE_SZ(want)).ok()?).ok()
}

/// This process's stdin as an async reader: on the reactor when it is a pipe (its flags put
/// back when the reader is dropped, see [`stdio_transport`]), else tokio's blocking adapter.
/// On the reactor, a read that finds nothing returns at once, so a caller can take what is
/// readable now without waiting (`execrelay run` gathers stdin into large writes that way).
pub fn stdin_reader() -> Box<dyn AsyncRead + Send + Unpin> {
    use std::os::fd::AsFd;
    use tokio::net::unix::pipe;
    let flags = RestoreFlags::save(std::io::stdin().as_fd());
    match std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .and_then(pipe::Receiver::from_owned_fd)
    {
        Ok(r) => Box::new(Restoring {
            inner: r,
            _flags: flags,
        }),
        Err(_) => Box::new(tokio::io::stdin()),
    }
}

/// A descriptor's file status flags as they were, put back on drop.
struct RestoreFlags {
    fd: std::os::fd::OwnedFd,
    flags: nix::fcntl::OFlag,
}

impl RestoreFlags {
    fn save(fd: std::os::fd::BorrowedFd<'_>) -> Option<Self> {
        use std::os::fd::AsRawFd;
        let bits = nix::fcntl::fcntl(fd.as_raw_fd(), nix::fcntl::FcntlArg::F_GETFL).ok()?;
        Some(RestoreFlags {
            // Our own reference to the description, valid however long we live.
            fd: fd.try_clone_to_owned().ok()?,
            flags: nix::fcntl::OFlag::from_bits_truncate(bits),
        })
    }
}

impl Drop for RestoreFlags {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd;
        let _ = nix::fcntl::fcntl(
            self.fd.as_raw_fd(),
            nix::fcntl::FcntlArg::F_SETFL(self.flags),
        );
    }
}

/// An async pipe end that restores the pipe's flags when dropped.
struct Restoring<T> {
    inner: T,
    _flags: Option<RestoreFlags>,
}

impl<T: AsyncRead + Unpin> AsyncRead for Restoring<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Restoring<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::fcntl::{fcntl, FcntlArg};
    use std::os::fd::{AsFd, AsRawFd};

    #[test]
    fn a_pipe_grows_never_shrinks_and_anything_else_is_left_alone() {
        let (r, _w) = nix::unistd::pipe().unwrap();
        let size = |fd: &std::os::fd::OwnedFd| fcntl(fd.as_raw_fd(), FcntlArg::F_GETPIPE_SZ);
        // 256 KiB: under every default `pipe-max-size` (1 MiB).
        let grown = grow_pipe(r.as_fd(), 256 * 1024).expect("the pipe grows");
        assert!(grown >= 256 * 1024, "{grown}");
        assert_eq!(size(&r).unwrap() as usize, grown);
        assert_eq!(grow_pipe(r.as_fd(), 128 * 1024), None, "never smaller");
        assert_eq!(size(&r).unwrap() as usize, grown);
        let file = tempfile::tempfile().unwrap();
        assert_eq!(grow_pipe(file.as_fd(), 256 * 1024), None, "not a pipe");
    }
}
