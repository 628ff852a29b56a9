//! The exec server's side of a physical link (`noise+ws://`, path `/v1/link`): frames in,
//! handshakes, authorization, one `ConnectionProcessor` per virtual stream, budgets.
//!
//! Two tasks per link: the reader (this module's loop) and the writer. The reader never waits
//! on the writer or on a stream's consumer: control frames and inbound messages are queued
//! with `try_send`, and a stream whose inbound queue is full is reset alone. Authorization runs
//! in its own task per stream. A stream's `ConnectionProcessor` shares the server's
//! `SessionRegistry`; its session is bound to the client's static key.
//!
//! Accepting links (the HTTP front, `max_links`) and shutting them down belong to the
//! composition root (`server.rs`); this module drives one link it is handed.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use super::virtual_stream::{data_frame, open_stream, InboundSender};
use crate::bounds::{ByteBudget, IdleTimer};
use crate::config::ServerConfig;
use crate::connection::{ConnectionOptions, ConnectionProcessor};
use crate::metrics::GaugeGuard;
use crate::noise::authorizer::{AuthRequest, Authorizer};
use crate::noise::budget::FailureBudget;
use crate::noise::handshake::{read_hello, PendingHandshake};
use crate::noise::keys::{fingerprint, Keypair};
use crate::noise::record::{Opened, RecordError, RecordOpener, RecordSealer};
use crate::noise::timestamp::{unix_micros, Admission, SharedHelloTimestamps};
use crate::session::SessionRegistry;
use crate::sync::lock;
use execrelay_relay::frame::{Frame, FrameType, StreamId};

/// The path physical links connect to.
pub const LINK_PATH: &str = "/v1/link";
/// Whole inbound messages queued per stream before its processor takes them; a stream that
/// overflows it is reset (its peer ignored its own flow of replies).
pub const STREAM_INBOUND_QUEUE: usize = 1024;
/// Frames queued for the link writer from all streams.
pub const LINK_SEND_QUEUE: usize = 1024;
/// Control frames (ACCEPT, RESET) queued for the writer; a link that lets it fill is closed.
pub const LINK_CONTROL_QUEUE: usize = 256;
/// How long a closing link waits for its close frame to go out before the socket is dropped.
pub const LINK_CLOSE_TIMEOUT: Duration = Duration::from_secs(1);

/// The link settings of [`ServerConfig`] as one link uses them (every one is a config field,
/// with a flag and a TOML key; see `config.rs` for what each bounds).
#[derive(Debug, Clone)]
pub struct LinkLimits {
    /// `max_pending_authorizations`.
    pub max_pending_authorizations: usize,
    /// `max_streams_per_link`.
    pub max_streams_per_link: usize,
    /// `handshake_failure_burst`.
    pub failure_burst: u32,
    /// `handshake_failure_refill_ms`.
    pub failure_refill: Duration,
    /// `keepalive_interval_ms`.
    pub keepalive_interval: Duration,
    /// `pong_timeout_ms`.
    pub pong_timeout: Duration,
}

impl LinkLimits {
    /// The link limits of `config`.
    pub fn from_config(config: &ServerConfig) -> LinkLimits {
        LinkLimits {
            max_pending_authorizations: config.max_pending_authorizations,
            max_streams_per_link: config.max_streams_per_link,
            failure_burst: config.handshake_failure_burst,
            failure_refill: Duration::from_millis(config.handshake_failure_refill_ms),
            keepalive_interval: Duration::from_millis(config.keepalive_interval_ms.max(1)),
            pong_timeout: Duration::from_millis(config.pong_timeout_ms.max(1)),
        }
    }
}

/// What a Noise listener needs besides the [`ServerConfig`] (whose link settings it uses).
pub struct NoiseServerConfig {
    /// The server's static key.
    pub keys: Keypair,
    /// Who may open streams.
    pub authorizer: Arc<dyn Authorizer>,
    /// Environment id bound into the prologue (empty for a direct listener).
    pub env_id: String,
}

enum Entry {
    /// Authorization under way; its message-1 timestamp is held until then.
    Pending(Admission),
    /// Established.
    Open {
        inbound: Option<InboundSender>,
        opener: crate::noise::record::RecordOpener,
        sealer: Arc<Mutex<RecordSealer>>,
        /// Keeps the open-streams gauge raised while the entry exists.
        _live: GaugeGuard,
    },
}

struct Link {
    cfg: Arc<NoiseServerConfig>,
    limits: LinkLimits,
    registry: Arc<SessionRegistry>,
    timestamps: SharedHelloTimestamps,
    shutdown: CancellationToken,
    tasks: TaskTracker,
    peer: SocketAddr,
    ctrl: mpsc::Sender<Vec<u8>>,
    data: mpsc::Sender<Vec<u8>>,
    streams: HashMap<StreamId, Entry>,
    pending: usize,
    budget: FailureBudget,
    auth_tx: mpsc::Sender<(StreamId, Result<PendingHandshake, String>)>,
    ended_tx: mpsc::UnboundedSender<StreamId>,
    /// Cancelled when the link ends: pending authorizations are abandoned.
    closed: CancellationToken,
    /// `max_link_reassembly_bytes` under the server's inbound budget: every stream's
    /// unfinished messages are charged here (a stream that cannot grow is reset `busy`).
    reassembly: ByteBudget,
}

/// The name clients and logs see when a link's reassembly budget is full.
pub const REASSEMBLY_BUDGET_NAME: &str = "maxLinkReassemblyBytes";

fn short(sid: &StreamId) -> String {
    sid.iter().take(4).map(|b| format!("{b:02x}")).collect()
}

/// Why the reader closes a link.
#[derive(Debug)]
enum Close {
    Budget,
    Protocol(&'static str),
    ControlQueueFull,
    /// No stream for `idle_link_timeout_ms`.
    Idle,
}

impl Close {
    fn describe(&self) -> &'static str {
        match self {
            Close::Budget => "handshake failure budget exhausted",
            Close::Protocol(why) => why,
            Close::ControlQueueFull => "peer does not read its control frames",
            Close::Idle => "no stream within the idle timeout",
        }
    }

    /// The metrics label of a link closed for this reason (budget closes are counted where
    /// the budget runs out).
    fn reason(&self) -> Option<&'static str> {
        match self {
            Close::Budget | Close::Idle => None,
            Close::Protocol(_) => Some("link_protocol"),
            Close::ControlQueueFull => Some("link_control_queue_full"),
        }
    }
}

/// Drive one physical link until it closes or `shutdown` fires. Every task it starts (stream
/// processors, authorizations) goes on `tasks`, which the caller waits for at shutdown.
pub async fn run_link(
    ws: WebSocketStream<TcpStream>,
    peer: SocketAddr,
    cfg: Arc<NoiseServerConfig>,
    registry: Arc<SessionRegistry>,
    timestamps: SharedHelloTimestamps,
    shutdown: CancellationToken,
    tasks: TaskTracker,
) {
    let _live = GaugeGuard::new(&registry.metrics().noise_links);
    let (mut sink, mut stream) = ws.split();
    let (ctrl_tx, mut ctrl_rx) = mpsc::channel::<Vec<u8>>(LINK_CONTROL_QUEUE);
    let (data_tx, mut data_rx) = mpsc::channel::<Vec<u8>>(LINK_SEND_QUEUE);
    let dead = CancellationToken::new();
    let limits = LinkLimits::from_config(registry.config());
    let keepalive = limits.keepalive_interval;

    // Writer: control frames first, then data; pings on the keepalive interval.
    let d = dead.clone();
    let writer = tokio::spawn(
        async move {
            let mut ping = tokio::time::interval(keepalive);
            ping.tick().await;
            loop {
                let msg = tokio::select! {
                    biased;
                    _ = d.cancelled() => break,
                    m = ctrl_rx.recv() => m.map(Message::Binary),
                    m = data_rx.recv() => m.map(Message::Binary),
                    _ = ping.tick() => Some(Message::Ping(Vec::new())),
                };
                let Some(msg) = msg else { break };
                if sink.feed(msg).await.is_err() {
                    break;
                }
                while let Ok(m) = ctrl_rx.try_recv().or_else(|_| data_rx.try_recv()) {
                    if sink.feed(Message::Binary(m)).await.is_err() {
                        d.cancel();
                        return;
                    }
                }
                if sink.flush().await.is_err() {
                    break;
                }
            }
            // A peer that does not read must not keep a closing link alive.
            let _ = tokio::time::timeout(LINK_CLOSE_TIMEOUT, sink.close()).await;
            d.cancel();
        }
        .in_current_span(),
    );

    let registry_reassembly = registry.inbound_budget().child(
        REASSEMBLY_BUDGET_NAME,
        registry.config().max_link_reassembly_bytes,
    );
    let idle_link_timeout = registry.config().idle_link_timeout();
    let (auth_tx, mut auth_rx) = mpsc::channel(limits.max_pending_authorizations + 1);
    let (ended_tx, mut ended_rx) = mpsc::unbounded_channel();
    let mut link = Link {
        budget: FailureBudget::new(limits.failure_burst, limits.failure_refill, budget_now()),
        limits,
        cfg,
        registry,
        timestamps,
        shutdown,
        tasks,
        peer,
        ctrl: ctrl_tx,
        data: data_tx,
        streams: HashMap::new(),
        pending: 0,
        auth_tx,
        ended_tx,
        closed: dead.clone(),
        reassembly: registry_reassembly,
    };
    tracing::info!("link open");
    let pong_timeout = link.limits.pong_timeout;
    let mut last_heard = tokio::time::Instant::now();
    // A link that holds no stream (pending or open) for the idle timeout is closed.
    let mut idle = IdleTimer::new(idle_link_timeout, budget_now());
    let close = loop {
        let silence = tokio::time::sleep_until(last_heard + pong_timeout);
        let idle_deadline = tokio::time::Instant::from_std(idle.deadline());
        let r = tokio::select! {
            _ = link.shutdown.cancelled() => break None,
            _ = dead.cancelled() => break None,
            _ = silence => break Some(Close::Protocol("no traffic or pong within the timeout")),
            _ = tokio::time::sleep_until(idle_deadline) => {
                idle.observe(budget_now(), !link.streams.is_empty());
                if idle.expired(budget_now()) {
                    break Some(Close::Idle);
                }
                Ok(())
            }
            m = stream.next() => {
                last_heard = tokio::time::Instant::now();
                match m {
                    None | Some(Err(_)) | Some(Ok(Message::Close(_))) => break None,
                    Some(Ok(Message::Binary(b))) => link.on_frame(b),
                    Some(Ok(Message::Text(_))) => Err(Close::Protocol("text message on a link")),
                    Some(Ok(_)) => Ok(()),
                }
            }
            Some((sid, res)) = auth_rx.recv() => link.on_auth(sid, res),
            Some(sid) = ended_rx.recv() => { link.on_ended(sid); Ok(()) }
        };
        if let Err(c) = r {
            break Some(c);
        }
        idle.observe(budget_now(), !link.streams.is_empty());
    };
    if let Some(Close::Idle) = &close {
        tracing::info!(reason = Close::Idle.describe(), "closing link");
    } else if let Some(c) = &close {
        tracing::warn!(reason = c.describe(), "closing link");
        if let Some(r) = c.reason() {
            link.registry.metrics().noise_failure(r);
        }
    } else {
        tracing::info!("link closed");
    }
    // Dropping the streams' inbound senders ends their processors; sessions detach.
    link.streams.clear();
    dead.cancel();
    // The writer may be stuck writing to a peer that stopped reading: bound the wait, then
    // drop both halves so the socket closes whatever the peer does.
    let mut writer = writer;
    if tokio::time::timeout(LINK_CLOSE_TIMEOUT * 2, &mut writer)
        .await
        .is_err()
    {
        writer.abort();
    }
}

/// The failure budget's clock: tokio's, like the keepalive's, so that paused-time tests
/// drive both.
fn budget_now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

impl Link {
    fn send_ctrl(&self, frame: Frame) -> Result<(), Close> {
        let bytes = frame
            .encode()
            .map_err(|_| Close::Protocol("frame encode"))?;
        self.ctrl
            .try_send(bytes)
            .map_err(|_| Close::ControlQueueFull)
    }

    /// Reset a stream for a failure, counted by `reason`.
    fn reset(&mut self, sid: StreamId, reason: &'static str) -> Result<(), Close> {
        tracing::debug!(stream = %short(&sid), reason, "reset stream");
        self.streams.remove(&sid);
        self.refuse(sid, reason)
    }

    /// Refuse a frame for a stream we hold nothing for, counted by `reason`.
    fn refuse(&self, sid: StreamId, reason: &'static str) -> Result<(), Close> {
        self.registry.metrics().noise_failure(reason);
        self.send_ctrl(Frame::reset(sid, reason))
    }

    /// Charge the failure budget; an empty bucket closes a direct link.
    fn charge(&mut self) -> Result<(), Close> {
        if self.budget.charge(budget_now()) {
            Ok(())
        } else {
            self.registry.metrics().noise_failure("budget_exhausted");
            Err(Close::Budget)
        }
    }

    fn on_frame(&mut self, bytes: Vec<u8>) -> Result<(), Close> {
        let frame = match Frame::decode_owned(bytes) {
            Ok(f) => f,
            Err(e) => {
                tracing::debug!(error = %e, "malformed frame");
                self.registry.metrics().noise_failure("malformed_frame");
                return self.charge();
            }
        };
        let sid = frame.stream;
        match frame.ftype {
            FrameType::Open => self.on_open(sid, &frame.payload),
            FrameType::Data => match self.streams.get_mut(&sid) {
                None => {
                    // Not charged: data in flight when we reset a stream lands here.
                    self.send_ctrl(Frame::reset(sid, "unknown_stream"))
                }
                Some(Entry::Pending(_)) => {
                    self.reset(sid, "data_before_accept")?;
                    self.charge()
                }
                Some(Entry::Open {
                    inbound, opener, ..
                }) => match opener.open_owned(frame.seq, frame.payload) {
                    Ok(Opened::Messages(msgs)) => {
                        let Some(tx) = inbound.as_ref() else {
                            return Ok(());
                        };
                        for m in msgs {
                            // The message stays charged until its connection takes it.
                            if tx.try_send(Ok((m, opener.take_charge()))).is_err() {
                                return self.reset(sid, "inbound_overflow");
                            }
                        }
                        Ok(())
                    }
                    Ok(Opened::Close(_)) => {
                        // The client closed on purpose: end its processor (the session detaches).
                        *inbound = None;
                        Ok(())
                    }
                    Err(RecordError::OverBudget(e)) => {
                        // An unfinished message that cannot get its bytes: this stream alone.
                        tracing::info!(stream = %short(&sid), "stream reset: {e}");
                        self.reset(sid, "busy")
                    }
                    Err(e) => {
                        // Garbage on an established stream resets that stream alone.
                        tracing::debug!(stream = %short(&sid), error = %e, "bad record");
                        self.reset(sid, "bad_record")
                    }
                },
            },
            FrameType::Reset => {
                if let Some(Entry::Open { inbound, .. }) = self.streams.get_mut(&sid) {
                    *inbound = None;
                } else {
                    self.streams.remove(&sid);
                }
                Ok(())
            }
            // The reliability layer (acks, resume) is not implemented yet: ignored.
            FrameType::Ack | FrameType::Resume => Ok(()),
            FrameType::Accept => {
                self.registry.metrics().noise_failure("unexpected_accept");
                self.charge()
            }
        }
    }

    fn on_open(&mut self, sid: StreamId, payload: &[u8]) -> Result<(), Close> {
        if self.streams.contains_key(&sid) {
            // A second OPEN on a pending or open stream.
            self.reset(sid, "duplicate_open")?;
            return self.charge();
        }
        if self.pending >= self.limits.max_pending_authorizations {
            return self.refuse(sid, "busy");
        }
        if self.streams.len() >= self.limits.max_streams_per_link {
            return self.refuse(sid, "too_many_streams");
        }
        let pending = match read_hello(&self.cfg.keys, &self.cfg.env_id, &sid, payload) {
            Ok(p) => p,
            Err(e) => {
                tracing::info!(stream = %short(&sid), error = %e, "handshake failed");
                self.refuse(sid, "handshake_failed")?;
                return self.charge();
            }
        };
        // After decryption and the payload's shape, before authorization: a replayed message
        // 1 learns nothing about the key's authorization and takes no slot.
        let now = unix_micros(SystemTime::now());
        let admission =
            match Admission::admit(&self.timestamps, &pending.client_key, pending.hello.ts, now) {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(
                        stream = %short(&sid),
                        client = %fingerprint(&pending.client_key),
                        "handshake refused: {e}"
                    );
                    self.refuse(sid, e.reset_reason())?;
                    return self.charge();
                }
            };
        let req = AuthRequest {
            client_key: pending.client_key,
            token: pending.hello.token.clone(),
            env_id: self.cfg.env_id.clone(),
        };
        tracing::debug!(stream = %short(&sid), client = %fingerprint(&req.client_key), "authorizing");
        self.streams.insert(sid, Entry::Pending(admission));
        self.pending += 1;
        let authorizer = self.cfg.authorizer.clone();
        let tx = self.auth_tx.clone();
        let closed = self.closed.clone();
        self.tasks.spawn(
            async move {
                // An authorizer that never answers must not outlive its link (nor hold up
                // shutdown, which waits for these tasks).
                let res = tokio::select! {
                    r = authorizer.authorize(req) => r.map_err(|e| e.0),
                    _ = closed.cancelled() => return,
                };
                let _ = tx.send((sid, res.map(|()| pending))).await;
            }
            .in_current_span(),
        );
        Ok(())
    }

    fn on_auth(
        &mut self,
        sid: StreamId,
        res: Result<PendingHandshake, String>,
    ) -> Result<(), Close> {
        self.pending = self.pending.saturating_sub(1);
        let admission = match self.streams.remove(&sid) {
            Some(Entry::Pending(a)) => a,
            Some(other) => {
                self.streams.insert(sid, other);
                return Ok(());
            }
            None => return Ok(()), // reset while waiting
        };
        let pending = match res {
            Ok(p) => p,
            Err(why) => {
                tracing::info!(stream = %short(&sid), %why, "authorization refused");
                drop(admission);
                self.reset(sid, "unauthorized")?;
                return self.charge();
            }
        };
        admission.accept();
        let client_key = pending.client_key;
        let (msg2, keys) = match pending.accept(env!("CARGO_PKG_VERSION")) {
            Ok(x) => x,
            Err(_) => return self.reset(sid, "handshake_failed"),
        };
        let accept = Frame::new(FrameType::Accept, sid, 0, bytes::Bytes::from(msg2));
        self.send_ctrl(accept)?;
        let max = self.registry.config().max_message_bytes;
        let peer = format!("{}/{}", self.peer, short(&sid));
        // Unfinished messages of the stream are charged to the link's reassembly budget.
        let opener = RecordOpener::with_budget(keys.clone(), max, self.reassembly.clone());
        let parts = open_stream(
            sid,
            keys,
            max,
            self.data.clone(),
            STREAM_INBOUND_QUEUE,
            peer,
        );
        self.streams.insert(
            sid,
            Entry::Open {
                inbound: Some(parts.inbound),
                opener,
                sealer: parts.sealer,
                _live: GaugeGuard::new(&self.registry.metrics().noise_streams),
            },
        );
        tracing::info!(stream = %short(&sid), client = %fingerprint(&client_key), "stream open");
        let registry = self.registry.clone();
        let shutdown = self.shutdown.clone();
        let ended = self.ended_tx.clone();
        let peer_ip = self.peer.ip();
        let idle_timeout = self.registry.config().idle_connection_timeout();
        self.tasks.spawn(
            async move {
                ConnectionProcessor::run(
                    parts.transport,
                    registry,
                    ConnectionOptions {
                        close_session_on_end: false,
                        peer_key: Some(client_key.to_vec()),
                        peer_addr: Some(peer_ip),
                        idle_timeout: Some(idle_timeout),
                        ..ConnectionOptions::default()
                    },
                    shutdown,
                )
                .await;
                let _ = ended.send(sid);
            }
            .in_current_span(),
        );
        Ok(())
    }

    /// The stream's processor ended: authenticated close, then RESET, so the client always
    /// learns its stream is gone.
    fn on_ended(&mut self, sid: StreamId) {
        let Some(Entry::Open { sealer, .. }) = self.streams.remove(&sid) else {
            return;
        };
        let close = lock(&sealer)
            .seal_close("closed")
            .map_err(|e| e.to_string())
            .and_then(|(n, ct)| data_frame(sid, n, ct).map_err(|e| e.to_string()));
        let data = self.data.clone();
        self.tasks.spawn(async move {
            match close {
                Ok(frame) => {
                    let _ = data.send(frame).await;
                }
                // The RESET below still tells the client its stream is gone.
                Err(e) => tracing::warn!(stream = %short(&sid), error = %e, "no close record"),
            }
            if let Ok(reset) = Frame::reset(sid, "closed").encode() {
                let _ = data.send(reset).await;
            }
        });
    }
}
