//! [`WriteSlot`]: where a link's writing half waits while its writer task sleeps, so that
//! another task (the relay's reader of the link a frame came in on) can write to it in its
//! own turn, without waking the writer task on another thread.
//!
//! Owns the hand-over of the [`FrameWriter`] between the link's writer task and whoever writes
//! directly ([`write_now`]): exactly one of them holds it at a time, and what one stages the
//! other writes first, so the order of a link's messages is the order the core handed them
//! out. A direct write never waits: it takes the writer only if the writer task is asleep and
//! nothing is left unwritten, hands the core's transmits to the socket with non-blocking
//! writes, and leaves whatever the socket would not take (and any further transmits) to the
//! writer task, which it wakes; that task writes the rest under the write deadline.
//!
//! Never: waits for a socket or a lock held by another (`try_lock` only), takes more than one
//! batch ([`WRITE_BATCH_BYTES`](super::WRITE_BATCH_BYTES)) per call, or decides what to send
//! (the core's `poll_transmit` does, as for the writer task).

use std::sync::{Mutex, TryLockError};

use tokio::io::AsyncWrite;

use super::socket::FrameWriter;
use super::{outgoing, LinkSignals, WRITE_BATCH_BYTES};
use execrelay_protocol::batch::Batch;
use execrelay_protocol::sync::lock;
use execrelay_protocol::transmit::Transmit;

/// What a direct write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direct {
    /// Everything the core had is written: the writer task need not wake.
    Done,
    /// The writer task must wake: it holds the writer, or something is left (unwritten
    /// bytes, more transmits than one batch), or the link is closing.
    WakeWriter,
}

/// A link's writer, type-erased so that a relay can reach every link's writer from one map.
pub(crate) trait DirectWrite: Send + Sync + std::fmt::Debug {
    /// Take one batch from `poll` (the core's transmits for this link) and write it without
    /// waiting, if the writer task is asleep. The ping flag of the result is true when the
    /// batch held a ping (the link's reader must re-read its timer).
    fn write_now(&self, poll: &mut dyn FnMut(&mut Batch<Transmit>)) -> (Direct, bool);
}

struct SlotState<W> {
    /// The writer, while the writer task sleeps; `None` while it writes.
    writer: Option<FrameWriter<W>>,
    /// Reused from one direct write to the next (its items move out each time).
    batch: Batch<Transmit>,
}

/// A link's writing half, between its writer task and direct writes.
pub(crate) struct WriteSlot<W> {
    state: Mutex<SlotState<W>>,
}

impl<W> std::fmt::Debug for WriteSlot<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteSlot").finish_non_exhaustive()
    }
}

impl<W: AsyncWrite + Unpin + Send> WriteSlot<W> {
    pub fn new(writer: FrameWriter<W>) -> Self {
        WriteSlot {
            state: Mutex::new(SlotState {
                writer: Some(writer),
                batch: Batch::new(WRITE_BATCH_BYTES, usize::MAX),
            }),
        }
    }

    /// The writer task takes the writer (it is always there for it: a direct write holds
    /// the lock, not the writer, and only while it runs).
    pub fn take(&self) -> Option<FrameWriter<W>> {
        lock(&self.state).writer.take()
    }

    /// The writer task goes to sleep: the writer waits here.
    pub fn put(&self, w: FrameWriter<W>) {
        lock(&self.state).writer = Some(w);
    }
}

impl<W: AsyncWrite + Unpin + Send> DirectWrite for WriteSlot<W> {
    fn write_now(&self, poll: &mut dyn FnMut(&mut Batch<Transmit>)) -> (Direct, bool) {
        let mut guard = match self.state.try_lock() {
            Ok(g) => g,
            Err(TryLockError::WouldBlock) => return (Direct::WakeWriter, false),
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
        };
        let SlotState { writer, batch } = &mut *guard;
        let Some(w) = writer.as_mut() else {
            return (Direct::WakeWriter, false);
        };
        if w.has_staged() {
            // Bytes of an earlier write wait: the writer task finishes them first.
            return (Direct::WakeWriter, false);
        }
        poll(batch);
        if batch.is_empty() {
            return (Direct::Done, false);
        }
        let ping = batch.any(|t| matches!(t, Transmit::Ping(_)));
        // Full: the core may hold more than one batch; the writer task takes the rest.
        let more = !batch.has_room();
        w.stage(batch.drain().filter_map(outgoing));
        match w.try_write() {
            Ok(true) if !more => (Direct::Done, ping),
            // Would block, or more to come: the writer task goes on (a write error too: it
            // meets it at once and closes the link, as it would have).
            Ok(_) | Err(_) => (Direct::WakeWriter, ping),
        }
    }
}

/// Write what the core has for the link of `signals` now, in the caller's turn, if its
/// writer task is asleep; otherwise (or if something is left) wake the writer task. `poll`
/// fills a batch with the core's transmits for that link.
pub(crate) fn write_now(signals: &LinkSignals, poll: &mut dyn FnMut(&mut Batch<Transmit>)) {
    let direct = if signals.closed.borrow().is_some() {
        None
    } else {
        signals.direct.get()
    };
    let (r, ping) = match direct {
        Some(d) => d.write_now(poll),
        None => (Direct::WakeWriter, false),
    };
    if ping {
        // As the writer task does: the core's next deadline (the pong timeout) moved.
        signals.timer.notify_one();
    }
    if r == Direct::WakeWriter {
        signals.writer.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::pin::Pin;
    use std::sync::{Arc, Mutex};
    use std::task::{Context, Poll, Waker};

    use bytes::Bytes;
    use tokio::io::AsyncWrite;

    use super::*;
    use execrelay_protocol::frame::{Frame, FrameType, MAX_FRAME_BYTES};
    use execrelay_protocol::websocket::{Decoder, Message, Role};

    /// A socket that takes at most `room` more bytes, then would block until given more.
    #[derive(Default)]
    struct Pipe {
        wire: Vec<u8>,
        room: usize,
        waker: Option<Waker>,
    }

    #[derive(Clone)]
    struct Sock {
        pipe: Arc<Mutex<Pipe>>,
        vectored: bool,
    }

    impl Sock {
        fn new(room: usize, vectored: bool) -> Self {
            Sock {
                pipe: Arc::new(Mutex::new(Pipe {
                    room,
                    ..Pipe::default()
                })),
                vectored,
            }
        }

        /// Let `n` more bytes in, waking a writer that waits.
        fn give(&self, n: usize) {
            let mut p = self.pipe.lock().unwrap();
            p.room += n;
            if let Some(w) = p.waker.take() {
                w.wake();
            }
        }

        fn wire(&self) -> Vec<u8> {
            self.pipe.lock().unwrap().wire.clone()
        }
    }

    impl AsyncWrite for Sock {
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            let mut p = self.pipe.lock().unwrap();
            if p.room == 0 {
                p.waker = Some(cx.waker().clone());
                return Poll::Pending;
            }
            let n = buf.len().min(p.room);
            p.room -= n;
            p.wire.extend_from_slice(&buf[..n]);
            Poll::Ready(Ok(n))
        }

        fn poll_write_vectored(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            bufs: &[io::IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            let mut p = self.pipe.lock().unwrap();
            if p.room == 0 {
                p.waker = Some(cx.waker().clone());
                return Poll::Pending;
            }
            let mut n = 0;
            for b in bufs {
                let take = b.len().min(p.room);
                p.room -= take;
                p.wire.extend_from_slice(&b[..take]);
                n += take;
                if take < b.len() {
                    break;
                }
            }
            Poll::Ready(Ok(n))
        }

        fn is_write_vectored(&self) -> bool {
            self.vectored
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    fn frame(n: u64, len: usize) -> Frame {
        Frame::new(
            FrameType::Data,
            [7; 16],
            n,
            Bytes::from(vec![(n % 251) as u8; len]),
        )
    }

    /// The frames the far end decodes from `wire`, as (seq, payload length).
    fn decoded(wire: &[u8], role: Role) -> Vec<(u64, usize)> {
        let far = match role {
            Role::Server => Role::Client,
            Role::Client => Role::Server,
        };
        let mut d = Decoder::new(far, MAX_FRAME_BYTES);
        d.read_buffer().extend_from_slice(wire);
        let mut out = Vec::new();
        while let Some(m) = d.decode().expect("valid WebSocket") {
            match m {
                Message::Binary(b) => {
                    let f = Frame::decode_owned(b).expect("a frame");
                    assert!(f.payload.iter().all(|&x| x == (f.seq % 251) as u8));
                    out.push((f.seq, f.payload.len()));
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(d.buffered(), 0, "nothing half written");
        out
    }

    /// Hands out frames `next..=last` while the batch has room.
    fn source(next: &mut u64, last: u64, len: usize) -> impl FnMut(&mut Batch<Transmit>) + '_ {
        move |out| {
            while out.has_room() && *next <= last {
                let f = frame(*next, len);
                let n = f.wire_len();
                out.push(Transmit::Frame(f), n);
                *next += 1;
            }
        }
    }

    /// A direct write the socket takes only in part leaves the rest staged; a second direct
    /// write does not jump ahead of it; the writer task finishes it, then writes what
    /// followed: every frame arrives once, whole, in the core's order. For a server (vectored
    /// slices) and a client (one masked copy).
    #[tokio::test]
    async fn a_direct_write_cut_short_is_finished_by_the_writer_task_in_order() {
        for (role, vectored) in [
            (Role::Server, true),
            (Role::Server, false),
            (Role::Client, true),
        ] {
            let sock = Sock::new(10_000, vectored);
            let slot = WriteSlot::new(FrameWriter::new(sock.clone(), role));
            let mut next = 1;
            // 3 frames of 4 KiB: the socket takes 10,000 bytes of them.
            let (r, ping) = slot.write_now(&mut source(&mut next, 3, 4096));
            assert_eq!((r, ping), (Direct::WakeWriter, false));
            assert_eq!(sock.wire().len(), 10_000);
            // More frames are ready; the slot refuses to write them ahead of the rest.
            let (r, _) = slot.write_now(&mut source(&mut next, 5, 4096));
            assert_eq!(r, Direct::WakeWriter);
            assert_eq!(next, 4, "nothing taken from the core");
            // The writer task: finishes the staged bytes (the socket drains meanwhile), then
            // takes what followed.
            let mut w = slot.take().expect("the writer is in the slot");
            let finishing = {
                let sock = sock.clone();
                tokio::spawn(async move {
                    for _ in 0..20 {
                        tokio::task::yield_now().await;
                        sock.give(1000);
                    }
                    sock.give(1 << 20);
                })
            };
            w.finish().await.unwrap();
            let mut batch = Batch::new(WRITE_BATCH_BYTES, usize::MAX);
            source(&mut next, 5, 4096)(&mut batch);
            w.write_batch(batch.drain().filter_map(outgoing))
                .await
                .unwrap();
            finishing.await.unwrap();
            slot.put(w);
            // The writer asleep, a direct write goes through whole.
            let (r, _) = slot.write_now(&mut source(&mut next, 6, 4096));
            assert_eq!(r, Direct::Done);
            let seqs: Vec<u64> = decoded(&sock.wire(), role).iter().map(|f| f.0).collect();
            assert_eq!(seqs, vec![1, 2, 3, 4, 5, 6], "{role:?} vectored {vectored}");
        }
    }

    /// A direct write never waits: with the socket full it returns at once, and while the
    /// writer task holds the writer it takes nothing from the core.
    #[test]
    fn a_direct_write_never_waits_for_the_socket_or_the_writer_task() {
        let sock = Sock::new(0, true);
        let slot = WriteSlot::new(FrameWriter::new(sock.clone(), Role::Server));
        let mut next = 1;
        let (r, _) = slot.write_now(&mut source(&mut next, 1, 100));
        assert_eq!(r, Direct::WakeWriter);
        assert_eq!(next, 2, "taken and staged for the writer task");
        assert!(sock.wire().is_empty());
        let w = slot.take().expect("the writer");
        let (r, _) = slot.write_now(&mut source(&mut next, 2, 100));
        assert_eq!(r, Direct::WakeWriter);
        assert_eq!(next, 2, "the writer task holds the writer: nothing taken");
        slot.put(w);
    }

    /// One direct write takes at most one batch: the rest stays with the core for the
    /// writer task (a busy route cannot hold the reader of another link for long).
    #[test]
    fn a_direct_write_takes_one_batch_at_most() {
        let sock = Sock::new(usize::MAX, true);
        let slot = WriteSlot::new(FrameWriter::new(sock.clone(), Role::Server));
        let mut next = 1;
        let (r, _) = slot.write_now(&mut source(&mut next, 100, 60 << 10));
        assert_eq!(
            r,
            Direct::WakeWriter,
            "more than a batch: the writer task goes on"
        );
        let written = (next - 1) as usize;
        assert!(written * (60 << 10) <= WRITE_BATCH_BYTES + (61 << 10));
        assert_eq!(decoded(&sock.wire(), Role::Server).len(), written);
    }
}
