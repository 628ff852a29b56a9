//! One Noise virtual stream as a [`Transport`], over a stream handle of the link engine
//! (`execrelay_io::driver::StreamHandle`).
//!
//! # Where the work runs
//!
//! - **Outbound** ([`NoiseSink`]): the connection's writer task calls the sink; the sink copies
//!   each message (behind its 4-byte length) into the record under assembly, and when a record
//!   is full (or on flush) it waits for window credit, takes the `seq` the engine gives it,
//!   seals the record **in place** with that `seq` as nonce, and hands it to the engine's
//!   queue. The link writer takes it from there: one task hop from a stream's sink to the
//!   socket, no channel in between, each plaintext byte copied once. Small messages written
//!   back to back share a record (one AEAD pass, one frame, one window slot).
//! - **Inbound** ([`NoiseIncoming`]): the link reader only moves ciphertext into the stream's
//!   bounded queue; this stream's consumer (the connection's reader task) decrypts and
//!   reassembles messages when it polls, so several streams decrypt on several cores. The
//!   opener charges each unfinished message to the budget it is given (on the exec server
//!   the link's reassembly budget; unlimited on a client) before it grows, and a completed
//!   message keeps its charge until the consumer takes it from the transport.
//!
//! Flow control is the engine's: a consumer that stops polling stops acknowledging, so its
//! peer's sender waits for credit; a writer whose peer stops acknowledging waits in
//! `poll_ready`/`poll_flush` — and with it whatever feeds it (for the exec server: the
//! connection writer, then the process's log, then the child).
//!
//! # Ending
//!
//! A record that fails to decrypt (or does not reassemble) ends the inbound stream with an
//! error and marks the stream failed; the sink then resets it (`bad_record`) instead of
//! writing. So does an unfinished message over its budget (`busy`). When the sink is dropped it hands its sending half back through
//! [`StreamEnd`], so the exec server can send the authenticated close record (§4) before
//! the stream's `RESET` (§8).

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{Sink, Stream};
use tokio::sync::oneshot;

use crate::bounds::{ByteBudget, Charge};
use crate::sync::lock;
use crate::transport::{FramingError, OutMessage, Transport};
use execrelay_io::driver::{FlowProbe, StreamHandle, StreamReceiver, StreamSender};
use execrelay_protocol::noise::handshake::TransportKeys;
use execrelay_protocol::noise::record::{
    length_prefix, Opened, RecordError, RecordOpener, KIND_CLOSE, KIND_STREAM, MAX_CLOSE_REASON,
    MAX_RECORD_BODY, TAG_BYTES,
};
use execrelay_protocol::reason::Reason;

/// Largest record plaintext (kind byte and body) assembled by a sink.
const RECORD_PLAINTEXT: usize = 1 + MAX_RECORD_BODY;

/// How long the exec server waits for window credit to send its authenticated close record
/// when a stream's connection ends. A peer that has not read for this long gets the `RESET`
/// without the record (it learns its stream is gone either way).
pub const CLOSE_RECORD_TIMEOUT: Duration = Duration::from_secs(5);

/// State shared by the two halves of one stream.
#[derive(Debug, Default)]
struct Flags {
    /// The inbound half failed (`bad_record`: a record that does not open or reassemble;
    /// `busy`: an unfinished message over its budget): the stream is reset with it, never
    /// written to again.
    failed: Mutex<Option<Reason>>,
}

impl Flags {
    fn failed(&self) -> Option<Reason> {
        *lock(&self.failed)
    }

    fn fail(&self, reason: Reason) {
        lock(&self.failed).get_or_insert(reason);
    }
}

/// What the sink hands back when it is dropped: the sending half (unless the stream was
/// reset), to close the stream properly.
pub struct SinkReturn {
    sender: Option<StreamSender>,
    keys: TransportKeys,
    failed: Option<Reason>,
}

/// The owner's grip on a stream's end: receives the sending half back from the sink.
pub struct StreamEnd {
    rx: oneshot::Receiver<SinkReturn>,
}

impl StreamEnd {
    /// Once the transport's sink is gone: send the authenticated close record with `reason`
    /// (waiting at most [`CLOSE_RECORD_TIMEOUT`] for credit), then finish the stream (its
    /// `RESET` follows the record). A stream whose inbound half failed is reset with the
    /// failure's reason instead (if the sink did not already), which is returned.
    pub async fn close_with_record(self, reason: &str) -> Option<Reason> {
        let Ok(ret) = self.rx.await else { return None };
        if let Some(failed) = ret.failed {
            if let Some(sender) = ret.sender {
                sender.reset(failed);
            }
            return Some(failed);
        }
        let mut sender = ret.sender?;
        let mut end = reason.len().min(MAX_CLOSE_REASON);
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        let body = &reason.as_bytes()[..end];
        let credit = tokio::time::timeout(
            CLOSE_RECORD_TIMEOUT,
            std::future::poll_fn(|cx| sender.poll_ready(cx)),
        )
        .await;
        match credit {
            Ok(Ok(seq)) => match seal(&ret.keys, seq, KIND_CLOSE, body) {
                Ok(record) => {
                    if sender.start_send(record).is_ok() {
                        sender.finish(Reason::Closed);
                    }
                }
                Err(_) => sender.reset(Reason::Closed),
            },
            // The stream or the link is already gone.
            Ok(Err(_)) => {}
            Err(_) => sender.reset(Reason::Closed),
        }
        None
    }
}

/// Seal one record: `kind ‖ body`, nonce `seq`.
fn seal(keys: &TransportKeys, seq: u64, kind: u8, body: &[u8]) -> Result<Bytes, RecordError> {
    let mut buf = Vec::with_capacity(1 + body.len() + TAG_BYTES);
    buf.push(kind);
    buf.extend_from_slice(body);
    let tag = keys
        .seal_in_place(seq, &mut buf[..])
        .map_err(|_| RecordError::Seal)?;
    buf.extend_from_slice(tag.as_ref());
    Ok(Bytes::from(buf))
}

/// Build the transport of an established stream. Unfinished inbound messages are charged to
/// `budget` (see the module docs); `peer` names the stream in logs.
pub fn noise_transport(
    handle: StreamHandle,
    keys: TransportKeys,
    max_message_bytes: usize,
    budget: ByteBudget,
    peer: String,
) -> (Transport, StreamEnd) {
    let (receiver, sender) = handle.split();
    let probe = NoiseFlow(sender.probe());
    let flags = Arc::new(Flags::default());
    let (tx, rx) = oneshot::channel();
    let incoming = NoiseIncoming {
        receiver,
        opener: RecordOpener::with_budget(keys.clone(), max_message_bytes, budget),
        queue: VecDeque::new(),
        done: false,
        flags: flags.clone(),
    };
    let sink = NoiseSink {
        sender: Some(sender),
        keys,
        buf: Vec::new(),
        pending: None,
        flags,
        ret: Some(tx),
    };
    (
        Transport {
            incoming: Box::pin(incoming),
            outgoing: Box::pin(sink),
            peer,
            binary_messages: true,
            flow: Some(Arc::new(probe)),
        },
        StreamEnd { rx },
    )
}

/// The stream's sending direction as the engine's flow control sees it, for the stall
/// watchdog.
struct NoiseFlow(FlowProbe);

impl crate::transport::FlowProbe for NoiseFlow {
    fn snapshot(&self) -> Option<crate::transport::FlowSnapshot> {
        self.0.flow().map(|f| crate::transport::FlowSnapshot {
            can_send: f.can_send(),
            sent: f.sent,
            link_queued_bytes: f.link_queued_bytes as u64,
        })
    }

    fn describe(&self) -> String {
        // Both directions: a sender waiting for credit is explained by what its peer last
        // reported, and this side's receiving half says what it still owes its peer.
        match (self.0.flow(), self.0.recv_flow()) {
            (Some(send), Some(recv)) => format!("send: {send}; receive: {recv}"),
            _ => "stream gone".into(),
        }
    }
}

/// The inbound half: decrypts and reassembles in the task that polls it.
pub struct NoiseIncoming {
    receiver: StreamReceiver,
    opener: RecordOpener<ByteBudget>,
    /// Messages one record completed, each with its charge (given back as it is taken).
    queue: VecDeque<(Vec<u8>, Charge)>,
    done: bool,
    flags: Arc<Flags>,
}

impl Stream for NoiseIncoming {
    type Item = Result<Bytes, FramingError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let me = self.get_mut();
        loop {
            // The consumer takes the message (and charges it to its own budget): its charge
            // here is given back.
            if let Some((m, _charge)) = me.queue.pop_front() {
                return Poll::Ready(Some(Ok(Bytes::from(m))));
            }
            if me.done {
                return Poll::Ready(None);
            }
            match ready!(me.receiver.poll_recv(cx)) {
                Ok((seq, payload)) => match me.opener.open_owned(seq, payload) {
                    Ok(Opened::Messages(msgs)) => {
                        // In order: each message takes the oldest charge.
                        for m in msgs {
                            let charge = me.opener.take_charge();
                            me.queue.push_back((m, charge));
                        }
                    }
                    // The peer closed on purpose: the end of its messages.
                    Ok(Opened::Close(_)) => me.done = true,
                    Err(RecordError::OverBudget(e)) => {
                        // An unfinished message that cannot get its bytes: this stream alone.
                        me.done = true;
                        me.flags.fail(Reason::Busy);
                        return Poll::Ready(Some(Err(FramingError::Protocol(format!(
                            "stream reset: {e}"
                        )))));
                    }
                    Err(e) => {
                        me.done = true;
                        me.flags.fail(Reason::BadRecord);
                        return Poll::Ready(Some(Err(FramingError::Protocol(format!(
                            "bad record: {e}"
                        )))));
                    }
                },
                // Reset by the peer (or the relay), or the link is gone: the path is gone.
                Err(_) => me.done = true,
            }
        }
    }
}

/// A message not yet copied whole into a record: its length prefix and its one or two parts
/// (a JSON text; or a binary message's head and payload, `protocol.md` §5.1, never joined
/// first), and how far into `prefix ‖ parts[0] ‖ parts[1]` the copy got.
struct Pending {
    prefix: [u8; 4],
    parts: [Bytes; 2],
    off: usize,
}

impl Pending {
    fn total(&self) -> usize {
        4 + self.parts[0].len() + self.parts[1].len()
    }

    /// Append `take` bytes from `off` on to `out`.
    fn copy_to(&mut self, out: &mut Vec<u8>, take: usize) {
        let mut at = self.off;
        let end = self.off + take;
        let mut base = 0;
        for piece in [&self.prefix[..], &self.parts[0][..], &self.parts[1][..]] {
            let (lo, hi) = (base, base + piece.len());
            if at < hi && at < end {
                let stop = end.min(hi);
                out.extend_from_slice(&piece[at - lo..stop - lo]);
                at = stop;
            }
            base = hi;
        }
        self.off = end;
    }
}

/// The outbound half: assembles, seals and queues records in the writer's task.
pub struct NoiseSink {
    /// `None` once reset (a bad record) or handed back.
    sender: Option<StreamSender>,
    keys: TransportKeys,
    /// The record under assembly: the kind byte, then up to [`MAX_RECORD_BODY`] bytes. Empty
    /// (and unallocated) between records, so an idle stream holds no buffer.
    buf: Vec<u8>,
    /// The rest of the last message, when it did not fit the record under assembly. At most
    /// one message waits here: `poll_ready` is not ready until it is in records.
    pending: Option<Pending>,
    flags: Arc<Flags>,
    ret: Option<oneshot::Sender<SinkReturn>>,
}

fn gone() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "the stream is gone")
}

impl NoiseSink {
    /// Copy as much of the pending message as fits into the record under assembly.
    fn fill(&mut self) {
        let Some(p) = self.pending.as_mut() else {
            return;
        };
        if self.buf.is_empty() {
            // Allocate for what is known to come, at most one record (plus its tag).
            let want = 1 + (p.total() - p.off).min(MAX_RECORD_BODY) + TAG_BYTES;
            self.buf.reserve_exact(want);
            self.buf.push(KIND_STREAM);
        }
        let room = RECORD_PLAINTEXT - self.buf.len();
        let take = (p.total() - p.off).min(room);
        if take > 0 {
            let need = self.buf.len() + take + TAG_BYTES;
            if self.buf.capacity() < need {
                // Grow by doubling, never past one record.
                let target = (self.buf.capacity() * 2)
                    .max(need)
                    .min(RECORD_PLAINTEXT + TAG_BYTES);
                self.buf.reserve_exact(target - self.buf.len());
            }
            p.copy_to(&mut self.buf, take);
        }
        if p.off == p.total() {
            self.pending = None;
        }
    }

    /// Seal the record under assembly and queue it, once the window has room.
    fn poll_emit(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let sender = self.sender.as_mut().ok_or_else(gone)?;
        let seq = ready!(sender.poll_ready(cx)).map_err(|e| io::Error::other(e.to_string()))?;
        let mut buf = std::mem::take(&mut self.buf);
        let tag = self
            .keys
            .seal_in_place(seq, &mut buf[..])
            .map_err(|_| io::Error::other("record cannot be sealed"))?;
        buf.extend_from_slice(tag.as_ref());
        sender
            .start_send(Bytes::from(buf))
            .map_err(|e| io::Error::other(e.to_string()))?;
        Poll::Ready(Ok(()))
    }

    /// The inbound half failed: reset the stream now, with its reason.
    fn check_failed(&mut self) -> io::Result<()> {
        if let Some(reason) = self.flags.failed() {
            if let Some(s) = self.sender.take() {
                s.reset(reason);
            }
            return Err(gone());
        }
        Ok(())
    }

    /// Move the pending message into records until the record under assembly has room for
    /// more (`flush`: until every byte is queued, the last partial record included).
    fn poll_drive(&mut self, cx: &mut Context<'_>, flush: bool) -> Poll<io::Result<()>> {
        self.check_failed()?;
        loop {
            self.fill();
            let body = self.buf.len() > 1;
            let full = self.buf.len() == RECORD_PLAINTEXT;
            if !(full || flush && body) {
                // `fill` leaves a message pending only behind a full record.
                debug_assert!(self.pending.is_none());
                return Poll::Ready(Ok(()));
            }
            ready!(self.poll_emit(cx))?;
        }
    }
}

impl Sink<OutMessage> for NoiseSink {
    type Error = io::Error;

    /// Ready once the previous message is all in records (the last one may still be under
    /// assembly): a stream whose peer does not acknowledge holds back its writer here, so
    /// output waits unwritten in the process's bounded log rather than sealed in memory.
    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().poll_drive(cx, false)
    }

    /// A JSON text is one length-prefixed message; so is a binary message (its first byte,
    /// `0x00`, tells the two apart; the record layer does not care), head and payload copied
    /// straight into the record.
    fn start_send(self: Pin<&mut Self>, item: OutMessage) -> io::Result<()> {
        let me = self.get_mut();
        me.check_failed()?;
        let parts = match item {
            OutMessage::Text(text) => [Bytes::from(text.into_bytes()), Bytes::new()],
            OutMessage::Binary { head, payload } => [head, payload],
        };
        let len = parts[0].len() + parts[1].len();
        let prefix = length_prefix(len).map_err(|e| io::Error::other(e.to_string()))?;
        me.pending = Some(Pending {
            prefix,
            parts,
            off: 0,
        });
        me.fill();
        Ok(())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().poll_drive(cx, true)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().poll_drive(cx, true)
    }
}

impl Drop for NoiseSink {
    fn drop(&mut self) {
        let ret = SinkReturn {
            sender: self.sender.take(),
            keys: self.keys.clone(),
            failed: self.flags.failed(),
        };
        if let Some(tx) = self.ret.take() {
            // Nobody waiting: dropping the sender finishes the stream (`RESET closed`).
            if let Err(ret) = tx.send(ret) {
                if let (Some(s), Some(failed)) = (ret.sender, ret.failed) {
                    s.reset(failed);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use execrelay_io::driver::{link_websocket_config, Accepted, EndpointLink, ReadAhead};
    use execrelay_protocol::config::EndpointConfig;
    use execrelay_protocol::noise::cipher;
    use execrelay_protocol::websocket::Role as WsRole;
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::protocol::Role;
    use tokio_tungstenite::WebSocketStream;

    /// Two engine links over an in-memory pipe and one stream between them, as transports
    /// (client end, server end) and the client link (for its counters).
    async fn pair() -> (Transport, Transport, EndpointLink) {
        let (a, b) = tokio::io::duplex(1 << 20);
        let wa = WebSocketStream::from_raw_socket(
            ReadAhead::websocket(a, WsRole::Client),
            Role::Client,
            Some(link_websocket_config()),
        )
        .await;
        let wb = WebSocketStream::from_raw_socket(
            ReadAhead::websocket(b, WsRole::Server),
            Role::Server,
            Some(link_websocket_config()),
        )
        .await;
        let client = EndpointLink::spawn_client(wa, EndpointConfig::default()).unwrap();
        let (_server, mut incoming) =
            EndpointLink::spawn_server(wb, EndpointConfig::default()).unwrap();
        let opening = client.open([7; 16], Bytes::from_static(b"m1")).unwrap();
        let req = incoming.next().await.unwrap();
        let server_handle = req.accept(Bytes::from_static(b"m2")).unwrap();
        let Accepted { stream, .. } = opening.await.unwrap();
        let ck = Arc::new(cipher::TransportKeys::from_split(true, [1; 32], [2; 32]).unwrap());
        let sk = Arc::new(cipher::TransportKeys::from_split(false, [1; 32], [2; 32]).unwrap());
        let (ct, _) = noise_transport(stream, ck, 1 << 24, ByteBudget::unlimited(), "c".into());
        let (st, _) = noise_transport(
            server_handle,
            sk,
            1 << 24,
            ByteBudget::unlimited(),
            "s".into(),
        );
        (ct, st, client)
    }

    async fn next(t: &mut Transport) -> Bytes {
        tokio::time::timeout(Duration::from_secs(20), t.incoming.next())
            .await
            .expect("a message (hang guard)")
            .expect("not ended")
            .expect("framed")
    }

    /// Small messages written back to back share records (one AEAD pass and one window slot
    /// for many), and each arrives whole and in order.
    #[tokio::test]
    async fn small_messages_share_records() {
        let (mut c, mut s, link) = pair().await;
        for i in 0..100 {
            c.outgoing
                .feed(OutMessage::Text(format!("{{\"n\":{i}}}")))
                .await
                .unwrap();
        }
        c.outgoing.flush().await.unwrap();
        for i in 0..100 {
            assert_eq!(next(&mut s).await, format!("{{\"n\":{i}}}").into_bytes());
        }
        let data_frames = link.counters().frames_out[3];
        assert!(
            data_frames <= 2,
            "100 small messages in {data_frames} records"
        );
    }

    /// A binary message is one length-prefixed message, its head and payload copied straight
    /// into the records; a payload larger than a record spans several, and a text sent after
    /// it arrives after it.
    #[tokio::test]
    async fn a_binary_message_is_one_message_across_records() {
        let (mut c, mut s, _link) = pair().await;
        let payload = Bytes::from((0..200_000u32).map(|i| i as u8).collect::<Vec<u8>>());
        let head = Bytes::from_static(&[0, 2, 9]);
        c.outgoing
            .feed(OutMessage::Binary {
                head: head.clone(),
                payload: payload.clone(),
            })
            .await
            .unwrap();
        c.outgoing
            .feed(OutMessage::Text("{}".into()))
            .await
            .unwrap();
        c.outgoing.flush().await.unwrap();
        let mut expected = head.to_vec();
        expected.extend_from_slice(&payload);
        assert_eq!(next(&mut s).await, expected);
        assert_eq!(next(&mut s).await, b"{}".to_vec());
    }

    /// Without the receiver reading, the sender stops at the window: its flush waits (the
    /// connection writer behind it waits too), and resumes as the receiver reads. On paused
    /// time the sleep below ends only once every task is idle, i.e. once the sender is stuck.
    #[tokio::test(start_paused = true)]
    async fn a_sender_waits_at_the_window_until_the_receiver_reads() {
        let (mut c, mut s, _link) = pair().await;
        let big = "x".repeat(60_000);
        // 40 records' worth: more than the window of 16.
        let send = tokio::spawn(async move {
            for _ in 0..40 {
                c.outgoing
                    .feed(OutMessage::Text(big.clone()))
                    .await
                    .unwrap();
            }
            c.outgoing.flush().await.unwrap();
            c
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!send.is_finished(), "held at the window while nobody reads");
        for _ in 0..40 {
            assert_eq!(next(&mut s).await.len(), 60_000);
        }
        tokio::time::timeout(Duration::from_secs(20), send)
            .await
            .expect("released as the receiver read (hang guard)")
            .unwrap();
    }
}
