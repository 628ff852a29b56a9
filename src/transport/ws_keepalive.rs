//! Keepalive and a write deadline for a plain WebSocket (`ws://`, `secure-transport.md` §6.4):
//! the socket both halves share and the writing half (`websocket::split` makes both).
//!
//! A JSON-RPC WebSocket has no task of its own: the connection's reader polls the inbound
//! half (`ws_inbound`) and its writer the outbound half, and the writer sleeps while there is
//! nothing to write. So the **reader** runs the keepalive (its poll also waits on the keepalive
//! timer) and answers the peer's control frames: it queues pings, pongs and its close reply on
//! the shared socket and pushes them out, with a waker that wakes both halves (`Both`) so the
//! writer's own wake-up is never lost. A pong echoing one of our pings is the only answer; a
//! peer that keeps sending data but never answers is dead at the pong timeout, and its reader
//! ends with [`io::ErrorKind::TimedOut`]. The **writer** gets a deadline: a write (ready,
//! flush, close) that has waited the write timeout fails with [`io::ErrorKind::TimedOut`].
//!
//! The socket sits behind a `std::sync::Mutex` held only for one poll, never across an
//! `.await`. tungstenite only ever writes (data frames of a client, every control frame); the
//! reader reads the stream under it with the crate's own codec. The schedule and the death
//! rule are the link engine's (`execrelay_protocol::keepalive::Keepalive`), so plain
//! WebSockets and links behave alike.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll, Wake, Waker};
use std::time::Instant;

use bytes::Bytes;
use futures_util::Sink;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Sleep;
use tokio_tungstenite::tungstenite::error::Error as WsError;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use execrelay_io::http::{DataOpcode, FRAME_QUEUE_BYTES};
use execrelay_protocol::config::KeepaliveConfig;
use execrelay_protocol::keepalive::Keepalive;

use super::ws_frames::DataFrames;

/// The socket both halves share.
pub(super) struct Shared<S> {
    pub(super) ws: Mutex<WebSocketStream<S>>,
    /// The writer's last waker, so a flush started by the reader wakes it too.
    pub(super) writer: Mutex<Option<Waker>>,
    /// The reader's waker while a control frame of its waits for the socket's write side, so
    /// a write the writer drives (which takes over tungstenite's one write waker) wakes it
    /// too.
    pub(super) reader: Mutex<Option<Waker>>,
    /// No more data frames may be queued on the stream ([`DataFrames`]): the peer's close
    /// frame (or the end of the stream) was read, or our close was started. Set under `ws`'s
    /// lock before a close frame is handed to tungstenite, and read under it, so a frame is
    /// never queued after a close frame.
    pub(super) closed: AtomicBool,
}

// A poll that panicked leaves the socket as tungstenite left it: `lock` keeps going.
use crate::sync::lock as locked;

pub(super) fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

fn timed_out(what: &str) -> WsError {
    WsError::Io(io::Error::new(io::ErrorKind::TimedOut, what.to_string()))
}

impl<S> Shared<S> {
    /// The shared state of a fresh socket: neither half waiting, nothing closed.
    pub(super) fn new(ws: WebSocketStream<S>) -> Arc<Self> {
        Arc::new(Shared {
            ws: Mutex::new(ws),
            writer: Mutex::new(None),
            reader: Mutex::new(None),
            closed: AtomicBool::new(false),
        })
    }
}

impl KeepaliveState {
    /// A keepalive on `cfg`, its first ping an interval from now, its ping payloads from a
    /// random seed (a peer cannot predict them to answer pings it never read).
    pub(super) fn new(cfg: KeepaliveConfig) -> Self {
        let seed = {
            let mut b = [0u8; 8];
            let _ = getrandom::getrandom(&mut b);
            u64::from_le_bytes(b)
        };
        KeepaliveState {
            core: Keepalive::new(cfg, now(), seed),
            timer: Box::pin(tokio::time::sleep(cfg.interval)),
            ping: None,
        }
    }
}

/// The keepalive the reading half runs.
pub(super) struct KeepaliveState {
    pub(super) core: Keepalive,
    pub(super) timer: Pin<Box<Sleep>>,
    /// A ping taken from the core, not yet handed to the socket.
    pub(super) ping: Option<[u8; 8]>,
}

/// Wakes the reader and the writer.
pub(super) struct Both(pub(super) Waker, pub(super) Option<Waker>);

impl Wake for Both {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.wake_by_ref();
        if let Some(w) = &self.1 {
            w.wake_by_ref();
        }
    }
}

/// The writing half, with a deadline on every write.
pub struct WsSink<S> {
    shared: Arc<Shared<S>>,
    write_timeout: Option<std::time::Duration>,
    /// Armed while a write waits.
    deadline: Option<Pin<Box<Sleep>>>,
}

impl<S> WsSink<S> {
    /// The writing half of `shared`; with `write_timeout`, a write stuck that long fails.
    pub(super) fn new(shared: Arc<Shared<S>>, write_timeout: Option<std::time::Duration>) -> Self {
        WsSink {
            shared,
            write_timeout,
            deadline: None,
        }
    }
}

impl<S> WsSink<S>
where
    S: AsyncRead + AsyncWrite + Unpin + DataFrames,
{
    /// Whether data messages go to [`start_send_data`](Self::start_send_data) (the stream
    /// takes whole frames, [`DataFrames`]) rather than through tungstenite.
    pub fn takes_frames(&self) -> bool {
        locked(&self.shared.ws).get_ref().takes_frames()
    }

    /// Queue one data message, `head` then `payload`, as a frame on the stream, after
    /// `poll_ready` (like `start_send`). Fails once the connection is closing: no data may
    /// follow a close frame.
    pub fn start_send_data(
        &mut self,
        opcode: DataOpcode,
        head: Bytes,
        payload: Bytes,
    ) -> Result<(), WsError> {
        let mut ws = locked(&self.shared.ws);
        if self.shared.closed.load(Ordering::Relaxed) {
            return Err(WsError::AlreadyClosed);
        }
        ws.get_mut().queue_frame(opcode, head, payload);
        Ok(())
    }

    fn poll_write<F>(&mut self, cx: &mut Context<'_>, op: F) -> Poll<Result<(), WsError>>
    where
        F: FnOnce(Pin<&mut WebSocketStream<S>>, &mut Context<'_>) -> Poll<Result<(), WsError>>,
    {
        *locked(&self.shared.writer) = Some(cx.waker().clone());
        let reader = locked(&self.shared.reader).clone();
        let r = match &reader {
            None => {
                let mut ws = locked(&self.shared.ws);
                op(Pin::new(&mut *ws), cx)
            }
            Some(reader) => {
                let both = Waker::from(Arc::new(Both(cx.waker().clone(), Some(reader.clone()))));
                let mut ws = locked(&self.shared.ws);
                op(Pin::new(&mut *ws), &mut Context::from_waker(&both))
            }
        };
        match r {
            Poll::Ready(r) => {
                self.deadline = None;
                // The socket took our bytes: the reader's waiting frame may go now.
                if let Some(reader) = reader {
                    reader.wake();
                }
                Poll::Ready(r)
            }
            Poll::Pending => {
                let Some(limit) = self.write_timeout else {
                    return Poll::Pending;
                };
                let d = self
                    .deadline
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
                if d.as_mut().poll(cx).is_ready() {
                    self.deadline = None;
                    return Poll::Ready(Err(timed_out(
                        "a write did not complete within the write timeout",
                    )));
                }
                Poll::Pending
            }
        }
    }
}

impl<S> Sink<Message> for WsSink<S>
where
    S: AsyncRead + AsyncWrite + Unpin + DataFrames,
{
    type Error = WsError;

    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), WsError>> {
        self.get_mut().poll_write(cx, |mut ws, cx| {
            // Data frames queued on the stream: written out once there are enough of them,
            // by a flush (tungstenite flushes the stream after its own buffer, with the waker
            // that wakes both halves), and no more taken until they are.
            if ws.get_ref().queued_bytes() >= FRAME_QUEUE_BYTES {
                ready!(ws.as_mut().poll_flush(cx))?;
            }
            ws.poll_ready(cx)
        })
    }

    fn start_send(self: Pin<&mut Self>, item: Message) -> Result<(), WsError> {
        let mut ws = locked(&self.shared.ws);
        Pin::new(&mut *ws).start_send(item)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), WsError>> {
        self.get_mut().poll_write(cx, Sink::poll_flush)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), WsError>> {
        let me = self.get_mut();
        // Our close frame follows every frame queued so far (the stream writes its queue
        // before anything tungstenite writes), and nothing is queued after it.
        me.shared.closed.store(true, Ordering::Relaxed);
        me.poll_write(cx, Sink::poll_close)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use execrelay_io::driver::ReadAhead;
    use execrelay_io::http::FrameQueue;
    use futures_util::{FutureExt, StreamExt};
    use tokio_tungstenite::tungstenite::protocol::Role;

    /// Against a peer that does not read, the writing half takes messages until
    /// `FRAME_QUEUE_BYTES` are queued on the stream and then no more (its `poll_ready` waits):
    /// at most the bound plus one message is held. Once the peer reads, every message arrives
    /// whole and in order.
    #[tokio::test]
    async fn the_frame_queue_takes_no_message_past_its_bound() {
        const MESSAGE: usize = 40 * 1024;
        let (server, client) = tokio::io::duplex(4096);
        let ws = WebSocketStream::from_raw_socket(
            ReadAhead::new(FrameQueue::new(server)),
            Role::Server,
            None,
        )
        .await;
        let (mut sink, _stream) = super::super::websocket::split(
            ws,
            execrelay_protocol::websocket::Role::Server,
            1 << 20,
            None,
        );
        assert!(sink.takes_frames());
        let mut sent = 0u8;
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        loop {
            match Pin::new(&mut sink).poll_ready(&mut cx) {
                Poll::Ready(Ok(())) => {
                    let payload = Bytes::from(vec![sent; MESSAGE]);
                    sink.start_send_data(DataOpcode::Binary, Bytes::from(vec![0xEE]), payload)
                        .expect("queued");
                    sent += 1;
                    assert!(sent < 100, "the queue never filled");
                }
                Poll::Ready(Err(e)) => panic!("poll_ready failed: {e}"),
                Poll::Pending => break,
            }
        }
        let queued = locked(&sink.shared.ws).get_ref().queued_bytes();
        assert!(queued >= FRAME_QUEUE_BYTES, "stopped early at {queued}");
        assert!(
            queued < FRAME_QUEUE_BYTES + MESSAGE + 15,
            "{queued} bytes queued past the bound"
        );
        let reader = tokio::spawn(async move {
            let mut peer = WebSocketStream::from_raw_socket(client, Role::Client, None).await;
            let mut got = Vec::new();
            for _ in 0..sent {
                got.push(peer.next().await.expect("a message").expect("valid"));
            }
            got
        });
        std::future::poll_fn(|cx| Pin::new(&mut sink).poll_flush(cx))
            .await
            .expect("flushed");
        let got = reader.await.expect("reader");
        for (i, m) in got.into_iter().enumerate() {
            let Message::Binary(b) = m else {
                panic!("message {i} is not binary");
            };
            assert_eq!(b.len(), MESSAGE + 1);
            assert_eq!(b[0], 0xEE);
            assert!(b[1..].iter().all(|&x| x == i as u8), "message {i} mixed up");
        }
        assert!(
            std::future::poll_fn(|cx| Pin::new(&mut sink).poll_ready(cx))
                .now_or_never()
                .is_some()
        );
    }
}
