//! Line-framed transports over byte streams: the server's own stdin/stdout, a child's pipes
//! (the client spawning `execrelay serve --listen stdio`), or an in-memory duplex in tests.

use futures_util::StreamExt;
use tokio::io::{AsyncRead, AsyncWrite};
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
        incoming: Box::pin(incoming.fuse()),
        outgoing: Box::pin(outgoing),
        peer: peer.to_string(),
    }
}

/// The server's own stdin and stdout.
///
/// When they are pipes (a client spawned us, the usual case), they are driven by the reactor
/// like sockets: a duplicate of each descriptor is set non-blocking and registered with epoll.
/// tokio's `stdin()`/`stdout()` would instead hand every read and write to a blocking-pool
/// thread, a copy and a thread hop per message, which halved stdio throughput. Anything else
/// (a terminal, a file) keeps tokio's blocking adapters: O_NONBLOCK on a terminal would leak to
/// the shell that shares it.
pub fn stdio_transport(max_message_bytes: usize) -> Transport {
    use std::os::fd::AsFd;
    use tokio::net::unix::pipe;
    let reader: Box<dyn AsyncRead + Send + Unpin> = match std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .and_then(pipe::Receiver::from_owned_fd)
    {
        Ok(r) => Box::new(r),
        Err(_) => Box::new(tokio::io::stdin()),
    };
    let writer: Box<dyn AsyncWrite + Send + Unpin> = match std::io::stdout()
        .as_fd()
        .try_clone_to_owned()
        .and_then(pipe::Sender::from_owned_fd)
    {
        Ok(w) => Box::new(w),
        Err(_) => Box::new(tokio::io::stdout()),
    };
    line_transport(reader, writer, max_message_bytes, "stdio")
}
