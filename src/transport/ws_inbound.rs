//! The reading half of a plain WebSocket (`ws://`): the socket read with the crate's own
//! sans-IO codec (`execrelay_protocol::websocket::Decoder`), as a link's driver reads it, and
//! every control frame the peer sends answered here.
//!
//! # What this module owns
//!
//! - **Reading**: large reads (up to `LINK_READ_BYTES`) straight into the decoder's buffer,
//!   never zero-filled first, messages handed on as slices of it; the buffer released whenever
//!   it is drained and the socket has nothing more, so an idle connection holds none.
//!   (tungstenite read 4 KiB per call and zero-filled its buffer before each read: 13 % of a
//!   plain WebSocket client's CPU in a 1 GiB transfer.)
//! - **The peer's control frames**: a ping is answered with a pong carrying its bytes (only the
//!   latest one is kept while the writer's data is in the way, as RFC 6455 §5.5.3 allows); a
//!   pong goes to the keepalive; a close is answered with a close echoing its code, after which
//!   no data frame is queued and the stream ends.
//! - **Keepalive** (`secure-transport.md` §6.4): the reader sends the pings and declares the
//!   peer dead (the schedule is `execrelay_protocol::keepalive::Keepalive`'s).
//!
//! Control frames go out through tungstenite's writer (it masks a client's), which never
//! reads: tungstenite is the writing half's business only.
//!
//! # What it must never do
//!
//! - Hold more than one message (the `maxMessageBytes` limit, refused from a frame's header)
//!   and one read, or any buffer while idle; queue more than one pong.
//! - Interpret JSON-RPC, log message contents, or panic on anything a peer sends.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use execrelay_io::driver::socket::{poll_fill, SHARE_FROM_BYTES};
use execrelay_protocol::websocket::{CloseFrame, Decoder, Message, Role, WsError};
use futures_util::{Sink, Stream};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame as TungsteniteClose;
use tokio_tungstenite::tungstenite::Message as Outbound;
use tracing::debug;

use super::ws_frames::DataFrames;
use super::ws_keepalive::{now, Both, KeepaliveState, Shared};
use super::FramingError;
use crate::sync::lock as locked;

/// Control frames waiting to go out through tungstenite.
#[derive(Default)]
struct Replies {
    /// The pong for the latest ping (a newer ping replaces it).
    pong: Option<Bytes>,
    /// Our close reply: the peer's code echoed (`None`: the peer gave none).
    close: Option<Option<u16>>,
    /// Something was handed to tungstenite and is not flushed yet.
    unflushed: bool,
}

/// Where the stream is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Open,
    /// The peer closed: our reply is going out, then the stream ends.
    Closing,
    Ended,
}

/// The reading half (and the keepalive).
pub struct WsStream<S> {
    shared: Arc<Shared<S>>,
    decoder: Decoder,
    limit: usize,
    keepalive: Option<KeepaliveState>,
    replies: Replies,
    phase: Phase,
}

impl<S> WsStream<S>
where
    S: AsyncRead + AsyncWrite + Unpin + DataFrames,
{
    /// The reading half over `shared`, as the `role` end, refusing messages over `limit`.
    pub(super) fn new(
        shared: Arc<Shared<S>>,
        role: Role,
        limit: usize,
        keepalive: Option<KeepaliveState>,
    ) -> Self {
        WsStream {
            shared,
            // A small message is copied out of the read buffer rather than pinning it while
            // it waits in a queue (as on a link).
            decoder: Decoder::new(role, limit).share_from(SHARE_FROM_BYTES),
            limit,
            keepalive,
            replies: Replies::default(),
            phase: Phase::Open,
        }
    }

    /// Run the keepalive's clock: `Err` once the peer is dead. A due ping is taken from the
    /// core for [`poll_replies`](Self::poll_replies) to send.
    fn poll_keepalive(&mut self, cx: &mut Context<'_>) -> Result<(), FramingError> {
        let Some(ka) = self.keepalive.as_mut() else {
            return Ok(());
        };
        loop {
            let t = now();
            ka.core.handle_timeout(t);
            if ka.core.is_dead() {
                return Err(FramingError::Io(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the peer did not answer a ping within the pong timeout",
                )));
            }
            if ka.ping.is_none() {
                ka.ping = ka.core.poll_ping(t);
            }
            if let Some(at) = ka.core.poll_timeout() {
                ka.timer.as_mut().reset(tokio::time::Instant::from_std(at));
                if ka.timer.as_mut().poll(cx).is_ready() {
                    continue; // already due: handle it now
                }
            }
            return Ok(());
        }
    }

    /// Hand the waiting control frames to tungstenite and push them out, one at a time (the
    /// next only once the last is flushed: tungstenite's buffer never holds more than one of
    /// ours), with a waker that wakes both halves so the writer's own wake-up is never lost.
    /// What cannot go yet (the writer's data is in the way) waits for the wake-up; a newer
    /// ping's pong replaces the waiting one. `Err`: the socket failed.
    fn poll_replies(&mut self, cx: &mut Context<'_>) -> Result<(), FramingError> {
        let ping = self.keepalive.as_ref().and_then(|k| k.ping);
        let r = &mut self.replies;
        if ping.is_none() && r.pong.is_none() && r.close.is_none() && !r.unflushed {
            return Ok(());
        }
        // Until they are all out, a write the writer drives wakes us too.
        *locked(&self.shared.reader) = Some(cx.waker().clone());
        let writer = locked(&self.shared.writer).clone();
        let waker = Waker::from(Arc::new(Both(cx.waker().clone(), writer)));
        let mut wcx = Context::from_waker(&waker);
        let mut ws = locked(&self.shared.ws);
        let mut ws = Pin::new(&mut *ws);
        loop {
            if r.unflushed {
                match Sink::poll_flush(ws.as_mut(), &mut wcx) {
                    Poll::Ready(Ok(())) => r.unflushed = false,
                    Poll::Ready(Err(e)) if is_closed(&e) => r.unflushed = false,
                    Poll::Ready(Err(e)) => return Err(write_failed(e)),
                    Poll::Pending => return Ok(()),
                }
            }
            // Pongs and pings first; the close last, as nothing may follow it.
            let next = if let Some(p) = r.pong.take() {
                Outbound::Pong(p)
            } else if let Some(p) = self.keepalive.as_mut().and_then(|k| k.ping.take()) {
                Outbound::Ping(Bytes::copy_from_slice(&p))
            } else if let Some(code) = r.close.take() {
                Outbound::Close(code.map(|c| TungsteniteClose {
                    code: CloseCode::from(c),
                    reason: "".into(),
                }))
            } else {
                *locked(&self.shared.reader) = None;
                return Ok(());
            };
            match Sink::poll_ready(ws.as_mut(), &mut wcx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => return Err(write_failed(e)),
                Poll::Pending => {
                    put_back(r, self.keepalive.as_mut(), next);
                    return Ok(());
                }
            }
            match ws.as_mut().start_send(next) {
                Ok(()) => r.unflushed = true,
                // Our own close went out first (the writer closed): the handshake needs no
                // reply, and nothing else may follow it.
                Err(e) if is_closed(&e) => {}
                Err(e) => return Err(write_failed(e)),
            }
        }
    }

    /// All replies are out (the close reply included).
    fn replies_done(&self) -> bool {
        self.replies.pong.is_none() && self.replies.close.is_none() && !self.replies.unflushed
    }

    /// What to do with one message the decoder returned; `Some`: hand it on.
    fn on_message(&mut self, message: Message) -> Option<Bytes> {
        match message {
            Message::Text(bytes) | Message::Binary(bytes) => return Some(bytes),
            Message::Ping(payload) => self.replies.pong = Some(payload),
            Message::Pong(payload) => {
                if let Some(ka) = self.keepalive.as_mut() {
                    ka.core.on_pong(&payload);
                }
            }
            Message::Close(frame) => {
                debug!("peer sent a close frame");
                // Under the socket's lock, as the writer checks it: no data frame is queued
                // after this, and the close reply is the last frame we send.
                let _ws = locked(&self.shared.ws);
                self.shared.closed.store(true, Ordering::Relaxed);
                self.replies.pong = None;
                self.replies.close = Some(frame.map(|CloseFrame { code, .. }| code));
                self.phase = Phase::Closing;
            }
        }
        None
    }

    /// Nothing more is read. `closed`: the peer went away, so no data frame is queued either;
    /// after an error the writer may still send the peer the reason (protocol.md §1).
    fn end(&mut self, closed: bool) {
        self.phase = Phase::Ended;
        if closed {
            self.shared.closed.store(true, Ordering::Relaxed);
        }
        // The buffer's memory goes now.
        self.decoder = Decoder::new(Role::Server, 0);
    }
}

/// A control frame that could not be handed to tungstenite yet goes back where it was.
fn put_back(r: &mut Replies, keepalive: Option<&mut KeepaliveState>, m: Outbound) {
    match m {
        Outbound::Pong(p) => r.pong = Some(p),
        Outbound::Ping(p) => {
            if let (Some(ka), Ok(p)) = (keepalive, <[u8; 8]>::try_from(&p[..])) {
                ka.ping = Some(p);
            }
        }
        Outbound::Close(c) => r.close = Some(c.map(|c| u16::from(c.code))),
        _ => {}
    }
}

fn is_closed(e: &tokio_tungstenite::tungstenite::Error) -> bool {
    use tokio_tungstenite::tungstenite::error::{Error as E, ProtocolError};
    matches!(
        e,
        E::ConnectionClosed | E::AlreadyClosed | E::Protocol(ProtocolError::SendAfterClosing)
    )
}

fn write_failed(e: tokio_tungstenite::tungstenite::Error) -> FramingError {
    match e {
        tokio_tungstenite::tungstenite::Error::Io(e) => FramingError::Io(e),
        other => FramingError::Io(io::Error::other(other.to_string())),
    }
}

/// A WebSocket rule the peer broke, as the transport reports it.
fn decode_error(e: WsError, limit: usize) -> FramingError {
    match e {
        WsError::Oversized { .. } => FramingError::TooLarge { limit },
        // The codec's messages name the rule broken, never the payload.
        other => FramingError::Protocol(other.to_string()),
    }
}

impl<S> Stream for WsStream<S>
where
    S: AsyncRead + AsyncWrite + Unpin + DataFrames,
{
    type Item = Result<Bytes, FramingError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let me = self.get_mut();
        loop {
            if me.phase == Phase::Ended {
                return Poll::Ready(None);
            }
            let step = me.poll_keepalive(cx).and_then(|()| me.poll_replies(cx));
            if let Err(e) = step {
                me.end(false);
                return Poll::Ready(Some(Err(e)));
            }
            if me.phase == Phase::Closing {
                if me.replies_done() {
                    me.end(true);
                    return Poll::Ready(None);
                }
                // The flush's wake-up brings us back.
                return Poll::Pending;
            }
            match me.decoder.decode() {
                Ok(Some(m)) => {
                    if let Some(bytes) = me.on_message(m) {
                        return Poll::Ready(Some(Ok(bytes)));
                    }
                    continue;
                }
                Ok(None) => {}
                Err(e) => {
                    let error = decode_error(e, me.limit);
                    me.end(false);
                    return Poll::Ready(Some(Err(error)));
                }
            }
            let read = {
                let mut ws = locked(&me.shared.ws);
                poll_fill(&mut me.decoder, Pin::new(ws.get_mut()), cx)
            };
            match read {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(0)) => {
                    // An end without a close handshake is still the peer closing: it is how
                    // clients that are killed or simply drop the socket go away.
                    debug!("WebSocket closed by the peer");
                    me.end(true);
                    return Poll::Ready(None);
                }
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(e)) => {
                    me.end(false);
                    return Poll::Ready(Some(Err(FramingError::Io(e))));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
