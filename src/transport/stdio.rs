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
pub fn stdio_transport(max_message_bytes: usize) -> Transport {
    line_transport(
        tokio::io::stdin(),
        tokio::io::stdout(),
        max_message_bytes,
        "stdio",
    )
}
