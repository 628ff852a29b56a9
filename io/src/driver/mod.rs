//! The thin tokio driver of a link: the only module of this crate that imports tokio.
//!
//! One link = two tasks around a sans-IO core behind a `std::sync::Mutex` (never held across
//! an `.await`):
//!
//! ```text
//!  WebSocket ──▶ reader task ──lock──▶ core.handle_frame / handle_pong / handle_timeout
//!                  │  (never awaits anything but the socket, its timer and the close signal)
//!                  └──▶ events: try_send into bounded per-stream queues, wake wakers, wake writer
//!  WebSocket ◀── writer task ◀─lock── core.poll_transmit (ping, control, ACKs, DATA round robin)
//!                  (each feed/flush under the write deadline; sleeps on a Notify)
//! ```
//!
//! - [`endpoint`]: the exec server's and the client's link ([`EndpointLink`]), with per-stream
//!   handles ([`StreamHandle`]).
//! - [`relay`]: the relay's links around one shared [`Router`](execrelay_protocol::router::Router)
//!   ([`RelayHub`]).
//!
//! # Invariants
//!
//! - **The reader never awaits a destination.** It hands each frame to the core, and the
//!   core's output to bounded queues with `try_send`; a full stream queue means the peer broke
//!   its window (the core checks the window first, so this is a second line), and that stream
//!   alone is reset `window_exceeded`.
//! - **Reading is never tied to writing.** A peer that does not read blocks only the writer,
//!   and only until the write deadline, which kills the link.
//! - **Keepalive is the core's**: the reader's timer runs the core's `handle_timeout`; pings
//!   and their pongs are WebSocket pings, answered by the peer's WebSocket layer. Inbound
//!   frames never count as a pong.
//! - Every queue is bounded: per-stream inbound by the window, the writer's batch by
//!   [`WRITE_BATCH_BYTES`], the reader's by [`READ_BATCH_BYTES`] and [`READ_BATCH_FRAMES`],
//!   the read buffer by [`LINK_READ_BYTES`] (none while idle).
//! - **tungstenite does the upgrade, the driver the frames.** Each link's WebSocket is taken
//!   over ([`LinkSocket`]) when its driver starts: frames are read and written by
//!   [`socket`] with `execrelay_protocol::websocket`, no copy of a payload on the way through
//!   a relay. Pings from the peer are answered by the writer (the latest one); a peer's close
//!   is answered with its code; a WebSocket rule the peer broke closes with its RFC 6455 code.
//! - **Batches under load, one at a time when idle.** The reader hands the core every
//!   message that has already arrived as one batch (one lock, one wake of each destination's
//!   writer); the writer writes each batch it takes with one vectored write, so nothing waits
//!   in a buffer while the link is idle.

pub mod endpoint;
mod link_state;
pub mod read_ahead;
pub mod read_plan;
pub mod relay;
pub mod socket;
pub mod stream;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{FutureExt, SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{watch, Notify};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::WebSocketStream;

pub use endpoint::{Accepted, EndpointLink, Incoming, OpenRequest, Opening};
pub use read_ahead::{Arrivals, ReadAhead, READ_AHEAD_BYTES, WS_READ_BUFFER_BYTES};
pub use relay::{PendingLink, RelayHub, RelaySnapshot};
pub use socket::{LinkSocket, LINK_READ_BYTES};
pub use stream::{FlowProbe, StreamError, StreamHandle, StreamReceiver, StreamSender};

use execrelay_protocol::batch::Batch;
use execrelay_protocol::frame::{Frame, FrameError, MAX_FRAME_BYTES};
use execrelay_protocol::reason::CloseReason;
use execrelay_protocol::sync::lock;
use execrelay_protocol::transmit::Transmit;
use execrelay_protocol::websocket::{close_code, close_payload, Message, Opcode, WsError};
use socket::{FrameReader, FrameWriter, Outgoing, ReadEvent};

/// Bytes the writer takes from the core per batch before it flushes the socket: large
/// enough to coalesce many small frames into one write, small enough that a ping or a
/// control frame queued meanwhile waits for at most this much.
pub const WRITE_BATCH_BYTES: usize = 256 << 10;

/// Bytes of messages that have already arrived that the reader hands the core at once (one
/// lock of the core for all of them): it stops taking more once the batch holds this much,
/// so a batch holds less than this plus one frame. Messages are in memory already (the
/// WebSocket decoded them); the bound keeps one link's turn on the core short.
pub const READ_BATCH_BYTES: usize = 256 << 10;

/// Messages the reader hands the core at once, at most (small frames: `ACK`s, `OPEN`s).
pub const READ_BATCH_FRAMES: usize = 64;

/// How long a closing link waits for its close frame to go out (and for its writer to stop)
/// before the socket is dropped: a peer that does not read must not keep a dead link open.
pub const LINK_CLOSE_TIMEOUT: Duration = Duration::from_secs(1);

/// The WebSocket's own write buffer: tungstenite starts writing once this much is buffered.
const WS_WRITE_BUFFER: usize = 128 << 10;

/// WebSocket settings for a physical link: a message (one frame) over [`MAX_FRAME_BYTES`] is
/// refused before it is buffered whole, and the write buffer is bounded (one batch of writes
/// plus two frames).
pub fn link_websocket_config() -> WebSocketConfig {
    link_websocket_config_with(MAX_FRAME_BYTES)
}

/// [`link_websocket_config`] with a lower frame limit (the relay's `--max-frame-bytes`):
/// a message over `max_frame_bytes` (clamped to [`MAX_FRAME_BYTES`]) is refused from its
/// header and closes the link ([`CloseReason::OversizedFrame`]).
pub fn link_websocket_config_with(max_frame_bytes: usize) -> WebSocketConfig {
    let max = max_frame_bytes.min(MAX_FRAME_BYTES);
    WebSocketConfig::default()
        .max_message_size(Some(max))
        .max_frame_size(Some(max))
        .write_buffer_size(WS_WRITE_BUFFER)
        .max_write_buffer_size(WS_WRITE_BUFFER + 2 * MAX_FRAME_BYTES)
        .read_buffer_size(WS_READ_BUFFER_BYTES)
}

/// The clock of the driver: tokio's (so paused test time applies), as the core's `Instant`.
pub(crate) fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// A random seed for keepalive jitter, without a randomness dependency: std's per-process
/// random hash keys, mixed with a counter.
pub(crate) fn seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    h.finish()
}

/// How the I/O loop wakes a link's writer and learns that the link is over.
#[derive(Debug)]
pub(crate) struct LinkSignals {
    pub writer: Notify,
    /// Wakes the reader to recompute its timer: the writer took a ping, which moves the
    /// core's next deadline (the pong timeout) while the reader may be waiting with none.
    pub timer: Notify,
    pub closed: watch::Sender<Option<CloseReason>>,
    /// Why the peer said it closed the link: the reason of its close frame, when it is one of
    /// ours (`moved`, `replaced`, …; any other text is not kept). Set before the link is
    /// marked closed, so whoever sees the close can read it.
    pub peer_said: std::sync::OnceLock<CloseReason>,
    /// The payload of the peer's latest ping, until the writer answers it with a pong.
    pub pong: std::sync::Mutex<Option<Bytes>>,
    /// The close code of a WebSocket rule the peer broke (RFC 6455 §7.4.1), set by the reader
    /// before it closes the link, for the writer's close frame.
    pub ws_close_code: std::sync::OnceLock<u16>,
    /// The peer sent a close frame with this code: the writer answers it.
    pub peer_close_code: std::sync::OnceLock<u16>,
}

impl LinkSignals {
    pub fn new() -> Self {
        LinkSignals {
            writer: Notify::new(),
            timer: Notify::new(),
            closed: watch::channel(None).0,
            peer_said: std::sync::OnceLock::new(),
            pong: std::sync::Mutex::new(None),
            ws_close_code: std::sync::OnceLock::new(),
            peer_close_code: std::sync::OnceLock::new(),
        }
    }

    /// Record the first close reason (later ones are ignored).
    pub fn close(&self, reason: CloseReason) {
        self.closed.send_if_modified(|c| {
            if c.is_none() {
                *c = Some(reason);
                true
            } else {
                false
            }
        });
    }

    /// Wait until the link is closed.
    pub fn wait_closed(&self) -> impl Future<Output = CloseReason> + Send + 'static {
        let mut rx = self.closed.subscribe();
        async move {
            loop {
                if let Some(r) = *rx.borrow_and_update() {
                    return r;
                }
                if rx.changed().await.is_err() {
                    return CloseReason::Local;
                }
            }
        }
    }
}

/// What the I/O loop needs from a link's core (an endpoint, or one link of a relay).
pub(crate) trait LinkCore: Send + Sync + 'static {
    fn signals(this: &Arc<Self>) -> &LinkSignals;
    fn on_frame(this: &Arc<Self>, now: Instant, msg: Bytes);
    /// Every message of `batch`, in order, leaving it empty. A core that can take them
    /// under one lock does.
    fn on_frames(this: &Arc<Self>, now: Instant, batch: &mut Batch<Bytes>) {
        for msg in batch.drain() {
            Self::on_frame(this, now, msg);
        }
    }
    fn on_pong(this: &Arc<Self>, now: Instant, payload: &[u8]);
    fn on_timer(this: &Arc<Self>, now: Instant);
    fn next_timer(this: &Arc<Self>) -> Option<Instant>;
    /// Transmits in order, while `out` has room ([`Batch::has_room`]) and the core has any.
    fn poll_batch(this: &Arc<Self>, now: Instant, out: &mut Batch<Transmit>);
    /// The driver saw the link end; idempotent.
    fn on_closed(this: &Arc<Self>, reason: CloseReason);
    fn write_timeout(this: &Arc<Self>) -> Duration;
    /// How long one WebSocket message may take to arrive from its first byte (with the
    /// socket's [`Arrivals`]); `None`: no deadline.
    fn message_timeout(_this: &Arc<Self>) -> Option<Duration> {
        None
    }
}

/// Run a link until it ends: the writer in its own task, the reader here. Returns why it
/// ended. With `arrivals` (the socket's, [`ReadAhead::arrivals`]) and a
/// [`LinkCore::message_timeout`], a message that takes longer to arrive closes the link
/// (`message_timeout`).
pub(crate) async fn run_io<S, C>(
    sock: LinkSocket<S>,
    core: Arc<C>,
    arrivals: Option<Arc<Arrivals>>,
) -> CloseReason
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    C: LinkCore,
{
    let (reader, writer) = sock.split();
    let mut writer = tokio::spawn(write_loop(writer, core.clone()));
    let deadline = C::message_timeout(&core).and_then(|t| arrivals.map(|a| (a, t)));
    let reason = read_loop(reader, &core, deadline).await;
    C::on_closed(&core, reason);
    // The writer sees the close signal; bound the wait in case it is stuck in a write.
    if tokio::time::timeout(LINK_CLOSE_TIMEOUT * 2, &mut writer)
        .await
        .is_err()
    {
        writer.abort();
    }
    reason
}

async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

async fn read_loop<R, C>(
    mut reader: FrameReader<R>,
    core: &Arc<C>,
    message_deadline: Option<(Arc<Arrivals>, Duration)>,
) -> CloseReason
where
    R: AsyncRead + Unpin,
    C: LinkCore,
{
    let mut closed = C::signals(core).closed.subscribe();
    let never = Arrivals::default();
    let arrivals = message_deadline.as_ref().map_or(&never, |(a, _)| &**a);
    let mut batch = Batch::new(READ_BATCH_BYTES, READ_BATCH_FRAMES);
    loop {
        if let Some(r) = *closed.borrow_and_update() {
            return r;
        }
        let timer = C::next_timer(core).map(tokio::time::Instant::from_std);
        let message_due = message_deadline
            .as_ref()
            .and_then(|(a, t)| a.pending_since().map(|s| s + *t));
        tokio::select! {
            biased;
            r = closed.changed() => {
                if r.is_err() {
                    return CloseReason::Local;
                }
            }
            // Cancel-safe: bytes read go into the reader's buffer as they come.
            ev = reader.next() => match ev {
                ReadEvent::Message(Message::Binary(b)) => {
                    read_batch(&mut reader, core, &mut batch, b);
                }
                other => on_event(core, other),
            },
            _ = sleep_until_some(timer) => C::on_timer(core, now()),
            _ = sleep_until_some(message_due) => {
                // Still unfinished (the mark is cleared with each message, and a new mark is
                // later): the deadline holds.
                let late = message_deadline.as_ref().is_some_and(|(a, t)| {
                    a.pending_since()
                        .is_some_and(|s| tokio::time::Instant::now() >= s + *t)
                });
                if late {
                    tracing::debug!("a WebSocket message took too long to arrive");
                    C::on_closed(core, CloseReason::MessageTimeout);
                }
            }
            // The writer took a ping: the next deadline moved; look again.
            _ = C::signals(core).timer.notified() => {}
            // Bytes of a new message: arm its deadline.
            _ = arrivals.marked.notified() => {}
        }
    }
}

/// Hand the core `first` and every binary message that has already arrived behind it, as one
/// batch (bounded by [`READ_BATCH_BYTES`] and [`READ_BATCH_FRAMES`]); a message of another
/// kind (a ping, a close, an error) ends the batch and is handled after it, in order. Never
/// waits: a message still on its way is left for the next turn of the read loop.
fn read_batch<R, C>(
    reader: &mut FrameReader<R>,
    core: &Arc<C>,
    batch: &mut Batch<Bytes>,
    first: Bytes,
) where
    R: AsyncRead + Unpin,
    C: LinkCore,
{
    let n = first.len();
    batch.push(first, n);
    let mut after = None;
    while batch.has_room() {
        match reader.next().now_or_never() {
            Some(ReadEvent::Message(Message::Binary(b))) => {
                let n = b.len();
                batch.push(b, n);
            }
            Some(other) => {
                after = Some(other);
                break;
            }
            None => break,
        }
    }
    C::on_frames(core, now(), batch);
    if let Some(ev) = after {
        on_event(core, ev);
    }
}

/// One event of the WebSocket, handed to the core.
fn on_event<C: LinkCore>(core: &Arc<C>, ev: ReadEvent) {
    let signals = C::signals(core);
    match ev {
        ReadEvent::Message(Message::Binary(b)) => C::on_frame(core, now(), b),
        ReadEvent::Message(Message::Pong(p)) => C::on_pong(core, now(), &p),
        // Answered by the writer; only the latest ping needs its pong (RFC 6455 §5.5.3).
        ReadEvent::Message(Message::Ping(p)) => {
            *lock(&signals.pong) = Some(p);
            signals.writer.notify_one();
        }
        ReadEvent::Message(Message::Text(_)) => {
            tracing::debug!("a text message on a link");
            let _ = signals.ws_close_code.set(close_code::UNSUPPORTED);
            C::on_closed(core, CloseReason::Protocol)
        }
        ReadEvent::Message(Message::Close(frame)) => {
            // Only a reason of ours is kept, never the peer's own words.
            let code = frame.as_ref().map_or(close_code::NORMAL, |f| f.code);
            if let Some(said) = frame.and_then(|f| {
                CloseReason::ALL
                    .into_iter()
                    .find(|r| r.as_str() == f.reason.as_str())
            }) {
                let _ = signals.peer_said.set(said);
            }
            // The closing handshake: the writer answers with a close frame of this code.
            let _ = signals.peer_close_code.set(code);
            C::on_closed(core, CloseReason::Transport)
        }
        // Refused from the header, before the payload is buffered.
        ReadEvent::Error(e @ WsError::Oversized { .. }) => {
            tracing::debug!(error = %e, "link read refused");
            let _ = signals.ws_close_code.set(e.close_code());
            C::on_closed(core, CloseReason::OversizedFrame)
        }
        ReadEvent::Error(e) => {
            tracing::debug!(error = %e, "WebSocket protocol error on a link");
            let _ = signals.ws_close_code.set(e.close_code());
            C::on_closed(core, CloseReason::Protocol)
        }
        // The peer's TCP connection ended (or failed) without a close frame.
        ReadEvent::Ended => C::on_closed(core, CloseReason::Transport),
    }
}

async fn write_loop<W, C>(mut writer: FrameWriter<W>, core: Arc<C>)
where
    W: AsyncWrite + Unpin,
    C: LinkCore,
{
    let signals = C::signals(&core);
    let signals_closed = signals.closed.subscribe();
    let deadline = C::write_timeout(&core);
    // Bounded in bytes only, as it always was: a batch of `ACK`s is many small frames.
    let mut batch = Batch::new(WRITE_BATCH_BYTES, usize::MAX);
    let mut out: Vec<Outgoing> = Vec::new();
    loop {
        if signals_closed.borrow().is_some() {
            break;
        }
        // Register for a wake-up before looking, so a notify in between is not lost.
        let notified = signals.writer.notified();
        if let Some(p) = lock(&signals.pong).take() {
            out.push(Outgoing::Control(Opcode::Pong, p));
        }
        C::poll_batch(&core, now(), &mut batch);
        if batch.is_empty() && out.is_empty() {
            writer.release_scratch();
            let mut closed = signals_closed.clone();
            tokio::select! {
                _ = notified => {}
                _ = closed.changed() => {}
            }
            continue;
        }
        if batch.any(|t| matches!(t, Transmit::Ping(_))) {
            // While a ping waited for us the core had no deadline for the reader's timer; now
            // it has one (the pong timeout): a silent peer must still be found dead.
            signals.timer.notify_one();
        }
        for t in batch.drain() {
            out.push(match t {
                // A forwarded frame goes out as the message it came in (no copy); one of
                // ours as its header and its payload, side by side in the write.
                Transmit::Frame(f) => match f.into_wire_parts() {
                    Ok(parts) => Outgoing::Frame(parts),
                    Err(_) => continue,
                },
                Transmit::Ping(p) => Outgoing::Control(Opcode::Ping, Bytes::copy_from_slice(&p)),
            });
        }
        // The whole batch in one vectored write: under load the core hands over up to
        // `WRITE_BATCH_BYTES` at a time; idle, each frame goes out at once.
        let r = deadlined(deadline, &signals_closed, writer.write_batch(&out)).await;
        out.clear();
        if let Err(r) = r {
            C::on_closed(&core, r);
            break;
        }
    }
    // Say why in the close frame (a fixed reason of ours, never a peer's words), so the other
    // end can log it: `revoked`, `replaced`, `keepalive_timeout`, …; a WebSocket rule the
    // peer broke with its RFC 6455 code; a peer's close answered with its code.
    let reason = *signals_closed.borrow();
    let close = match (
        reason,
        signals.ws_close_code.get(),
        signals.peer_close_code.get(),
    ) {
        (Some(r), Some(code), _) => Some(close_payload(*code, r.as_str())),
        (None, Some(code), _) => Some(close_payload(*code, "")),
        (None | Some(CloseReason::Transport), None, Some(code)) => Some(close_payload(*code, "")),
        (None | Some(CloseReason::Transport), None, None) => None,
        (Some(CloseReason::Local), None, _) => Some(close_payload(
            close_code::NORMAL,
            CloseReason::Local.as_str(),
        )),
        (Some(r), None, _) => Some(close_payload(close_code::POLICY, r.as_str())),
    };
    // A ping that came with the close is still answered, before it.
    let mut last = Vec::new();
    if let Some(c) = close {
        if let Some(p) = lock(&signals.pong).take() {
            last.push(Outgoing::Control(Opcode::Pong, p));
        }
        last.push(Outgoing::Control(Opcode::Close, c));
    }
    let _ = tokio::time::timeout(LINK_CLOSE_TIMEOUT, async {
        let _ = writer.write_batch(&last).await;
        let _ = writer.shutdown().await;
    })
    .await;
}

/// One write under the deadline; also abandoned when the link closes meanwhile.
async fn deadlined<F, E>(
    deadline: Duration,
    closed: &watch::Receiver<Option<CloseReason>>,
    write: F,
) -> Result<(), CloseReason>
where
    F: Future<Output = Result<(), E>>,
{
    let mut closed = closed.clone();
    tokio::select! {
        r = tokio::time::timeout(deadline, write) => match r {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(CloseReason::Transport),
            Err(_) => Err(CloseReason::WriteTimeout),
        },
        _ = closed.wait_for(|c| c.is_some()) => Err(CloseReason::Local),
    }
}

/// Why a frame could not be exchanged outside a running link (the environment link's
/// handshake on stream id 0, §6.2, before the link is handed to the engine).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FrameIoError {
    /// Nothing within the deadline.
    #[error("no frame within {0:?}")]
    Timeout(Duration),
    /// The socket ended or failed.
    #[error("the link closed")]
    Closed,
    /// A message that is not a valid frame.
    #[error("malformed frame: {0}")]
    Frame(#[from] FrameError),
    /// A text message.
    #[error("text message on a link")]
    Text,
}

/// Send one frame on a link that is not (yet) driven by the engine, under `deadline`.
pub async fn send_frame<S>(
    ws: &mut WebSocketStream<S>,
    frame: &Frame,
    deadline: Duration,
) -> Result<(), FrameIoError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let bytes = frame.encode()?;
    match tokio::time::timeout(deadline, ws.send(WsMessage::Binary(bytes.into()))).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(_)) => Err(FrameIoError::Closed),
        Err(_) => Err(FrameIoError::Timeout(deadline)),
    }
}

/// Receive one frame on a link that is not (yet) driven by the engine, under `deadline`
/// (pings are answered and skipped).
pub async fn recv_frame<S>(
    ws: &mut WebSocketStream<S>,
    deadline: Duration,
) -> Result<Frame, FrameIoError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let read = async {
        loop {
            match ws.next().await {
                Some(Ok(WsMessage::Binary(b))) => return Ok(Frame::decode_owned(b)?),
                Some(Ok(WsMessage::Text(_))) => return Err(FrameIoError::Text),
                Some(Ok(WsMessage::Ping(_) | WsMessage::Pong(_) | WsMessage::Frame(_))) => continue,
                Some(Ok(WsMessage::Close(_))) | Some(Err(_)) | None => {
                    return Err(FrameIoError::Closed)
                }
            }
        }
    };
    tokio::time::timeout(deadline, read)
        .await
        .map_err(|_| FrameIoError::Timeout(deadline))?
}
