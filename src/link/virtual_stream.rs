//! One virtual stream as a [`Transport`]: inbound messages arrive through a bounded channel fed
//! by the link reader; outbound messages are sealed into records and `DATA` frames and queued
//! on the link's send queue.
//!
//! The sink seals in the writer's task, so encryption cost lands on the connection that
//! produces the data, not on the shared link reader.

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::Sink;
use tokio::sync::mpsc;
use tokio_util::sync::PollSender;

use crate::bounds::Charge;
use crate::noise::handshake::TransportKeys;
use crate::noise::record::{RecordOpener, RecordSealer};
use crate::sync::lock;
use crate::transport::{FramingError, Transport};
use execrelay_relay::frame::{Frame, FrameError, FrameType, StreamId};

/// Where a link reader delivers a stream's whole inbound messages, each with its charge.
pub type InboundSender = mpsc::Sender<Result<(Vec<u8>, Charge), FramingError>>;

/// The parts of a stream the link driver keeps, beside the [`Transport`] it hands out.
pub struct StreamParts {
    /// For the connection (server) or the client library.
    pub transport: Transport,
    /// Where the link reader delivers whole inbound messages, each with its charge (from
    /// [`RecordOpener::take_charge`]), given back when the connection takes the message.
    pub inbound: InboundSender,
    /// Decrypts this stream's inbound records.
    pub opener: RecordOpener,
    /// Shared with the sink: the authenticated close uses the same record numbering.
    pub sealer: Arc<Mutex<RecordSealer>>,
}

/// Build a stream over the link's send queue `out`.
pub fn open_stream(
    stream: StreamId,
    keys: TransportKeys,
    max_message_bytes: usize,
    out: mpsc::Sender<Vec<u8>>,
    inbound_capacity: usize,
    peer: String,
) -> StreamParts {
    let (tx, mut rx) = mpsc::channel(inbound_capacity);
    let sealer = Arc::new(Mutex::new(RecordSealer::new(keys.clone())));
    // A message's charge is given back as its connection takes it (and charges it anew).
    let incoming = futures_util::stream::poll_fn(move |cx| {
        rx.poll_recv(cx)
            .map(|m| m.map(|r: Result<(Vec<u8>, Charge), _>| r.map(|(msg, _charge)| msg)))
    });
    let sink = StreamSink {
        stream,
        sealer: sealer.clone(),
        out: PollSender::new(out),
        backlog: VecDeque::new(),
    };
    StreamParts {
        transport: Transport {
            incoming: Box::pin(incoming),
            outgoing: Box::pin(sink),
            peer,
        },
        inbound: tx,
        opener: RecordOpener::new(keys, max_message_bytes),
        sealer,
    }
}

/// Encode a `DATA` frame for record `n`. A record that does not fit a frame is an error for
/// the caller to handle: an empty (or truncated) frame never goes on the wire.
pub fn data_frame(stream: StreamId, n: u64, ciphertext: Vec<u8>) -> Result<Vec<u8>, FrameError> {
    Frame::new(FrameType::Data, stream, n, Bytes::from(ciphertext)).encode()
}

struct StreamSink {
    stream: StreamId,
    sealer: Arc<Mutex<RecordSealer>>,
    out: PollSender<Vec<u8>>,
    backlog: VecDeque<Vec<u8>>,
}

fn gone() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "the link is gone")
}

impl StreamSink {
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some(front) = self.backlog.pop_front() {
            match self.out.poll_reserve(cx) {
                Poll::Ready(Ok(())) => {
                    if self.out.send_item(front).is_err() {
                        return Poll::Ready(Err(gone()));
                    }
                }
                Poll::Ready(Err(_)) => return Poll::Ready(Err(gone())),
                Poll::Pending => {
                    self.backlog.push_front(front);
                    return Poll::Pending;
                }
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl Sink<String> for StreamSink {
    type Error = io::Error;

    /// Ready only once every frame of the previous message is on the link's queue: the
    /// backlog holds at most one message (≤ `maxMessageBytes` of records), and a stream whose
    /// link is busy pushes back on its connection's writer, so output waits, unwritten, in the
    /// process's bounded log (and the child is held back) rather than piling up here sealed.
    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().poll_drain(cx)
    }

    fn start_send(self: Pin<&mut Self>, item: String) -> io::Result<()> {
        let me = self.get_mut();
        let frames = lock(&me.sealer)
            .seal_message_frames(&me.stream, item.as_bytes())
            .map_err(|e| io::Error::other(e.to_string()))?;
        me.backlog.extend(frames);
        Ok(())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().poll_drain(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        let r = me.poll_drain(cx);
        if r.is_ready() {
            me.out.close();
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::noise::cipher;

    fn poll_ready(t: &mut Transport) -> Poll<io::Result<()>> {
        let mut cx = Context::from_waker(futures_util::task::noop_waker_ref());
        t.outgoing.as_mut().poll_ready(&mut cx)
    }

    /// A record too large for a frame is an error, not an empty frame.
    #[test]
    fn a_record_that_does_not_fit_a_frame_is_an_error() {
        use execrelay_relay::frame::{MAX_FRAME_BYTES, MAX_PAYLOAD_BYTES};
        let f = data_frame([1; 16], 7, vec![0xab; MAX_PAYLOAD_BYTES]).unwrap();
        assert_eq!(f.len(), MAX_FRAME_BYTES);
        let decoded = Frame::decode(&f).unwrap();
        assert_eq!((decoded.ftype, decoded.seq), (FrameType::Data, 7));
        assert!(data_frame([1; 16], 8, vec![0; MAX_PAYLOAD_BYTES + 1]).is_err());
    }

    /// A stream whose link queue is full takes no second message: its connection's writer
    /// waits (and output stays unwritten in the process's bounded log) instead of sealed
    /// frames piling up in the sink.
    #[tokio::test]
    async fn a_busy_link_pushes_back_after_one_message() {
        let keys = Arc::new(cipher::TransportKeys::from_split(false, [1; 32], [2; 32]).unwrap());
        let (out, mut link) = mpsc::channel(1);
        let mut parts = open_stream([7; 16], keys, 1 << 20, out, 8, "t".into());
        let t = &mut parts.transport;
        assert!(matches!(poll_ready(t), Poll::Ready(Ok(()))));
        // 200 KB: four records, of which the link queue takes one.
        t.outgoing.as_mut().start_send("x".repeat(200_000)).unwrap();
        assert!(
            poll_ready(t).is_pending(),
            "a second message while three frames wait"
        );
        let mut frames = 0;
        while frames < 4 {
            assert!(link.recv().await.is_some());
            frames += 1;
            let _ = poll_ready(t); // moves the next frame onto the queue
        }
        assert!(matches!(poll_ready(t), Poll::Ready(Ok(()))));
    }
}
