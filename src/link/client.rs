//! The client's side of a physical link: many virtual streams over one WebSocket, shared on
//! purpose through a [`LinkPool`] by the clients that talk to the same server with the same
//! keys.
//!
//! `open_stream` sends `OPEN` (handshake message 1), waits for `ACCEPT`, verifies message 2
//! and only then hands out a [`Transport`]: the client sends no application data before the
//! server is authenticated. There is no process-wide state here except the message-1
//! timestamp counter ([`next_hello_ts`]): links are shared only through a pool the caller
//! owns, so two pools (two tests in one process, say) never share a link by accident.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

use super::virtual_stream::open_stream;
use crate::noise::handshake::ClientHandshake;
use crate::noise::keys::{fingerprint, Keypair, KEY_BYTES};
use crate::noise::record::{Opened, RecordOpener};
use crate::noise::timestamp::next_hello_ts;
use crate::sync::lock;
use crate::transport::websocket::websocket_config;
use crate::transport::Transport;
use execrelay_relay::frame::{Frame, FrameType, StreamId, MAX_FRAME_BYTES};

/// How long `open_stream` waits for `ACCEPT`.
pub const OPEN_TIMEOUT: Duration = Duration::from_secs(20);
/// Handshakes a client keeps in flight on one link, below the server's default
/// `MAX_PENDING_AUTHORIZATIONS` (32) so that a burst of streams is not turned away as busy.
pub const MAX_OPENING_STREAMS: usize = 16;
/// Attempts of an OPEN the server answered `busy`, with doubling backoff from 50 ms.
const BUSY_RETRIES: u32 = 6;
/// Fresh handshakes after the server refused one as a replay (`replayed_handshake`). A
/// genuine client meets that only when another link with the same key (another process, or
/// another pool) had a handshake stamped later accepted before this one was checked; the next
/// handshake, stamped after that, passes.
const REPLAYED_RETRIES: u32 = 2;
/// Frames queued for the link writer.
const SEND_QUEUE: usize = 1024;
/// Inbound messages queued per stream.
const INBOUND_QUEUE: usize = 1024;

/// Client-side Noise settings.
#[derive(Clone)]
pub struct NoiseClientConfig {
    /// The client's static key.
    pub keys: Keypair,
    /// The pinned server key.
    pub server_public: [u8; KEY_BYTES],
    /// Optional token for servers that require one.
    pub token: Option<String>,
    /// Environment id (empty for a direct connection).
    pub env_id: String,
    /// Largest message accepted.
    pub max_message_bytes: usize,
}

impl std::fmt::Debug for NoiseClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NoiseClientConfig")
            .field("client", &fingerprint(&self.keys.public))
            .field("server", &fingerprint(&self.server_public))
            .finish_non_exhaustive()
    }
}

/// Why a stream could not be opened.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum NoiseError {
    /// The WebSocket could not be established.
    #[error("cannot connect to {0}: {1}")]
    Connect(String, String),
    /// The server refused the handshake; the reason is the server's (unauthenticated) word.
    #[error("{0}")]
    Refused(String),
    /// Message 2 did not verify: this is not the server whose key was pinned.
    #[error(
        "the server's handshake did not verify: its key is not the one given with --server-key"
    )]
    ServerKey,
    /// The link died.
    #[error("the link to the server was lost")]
    LinkLost,
    /// The server had too many handshakes pending (retried by `open_stream`).
    #[error("the server is busy; try again")]
    Busy,
    /// The server refused message 1 as a replay: its `ts` was not above one it had already
    /// accepted for this key (retried by `open_stream` with a fresh handshake).
    #[error("the server refused the handshake as a replay (a later one with the same key was accepted first)")]
    Replayed,
    /// No answer in time.
    #[error("no answer to the handshake within {0:?}")]
    Timeout(Duration),
}

fn explain_reset(reason: &str) -> String {
    match reason {
        "handshake_failed" => "the server refused the handshake: check --server-key (it must be the server's public key) and --key".into(),
        "unauthorized" => "the server refused this client: its key is not authorized (or a required token is missing or wrong)".into(),
        "busy" | "too_many_streams" => format!("the server is busy ({reason}); try again"),
        "clock_skew" => "the server refused the handshake: this machine's clock and the server's differ by more than 10 minutes; fix the clock (see the server's log for the difference)".into(),
        other => format!("the server reset the stream: {other}"),
    }
}

enum Entry {
    Opening {
        hs: Box<ClientHandshake>,
        reply: oneshot::Sender<Result<Transport, NoiseError>>,
    },
    Open {
        inbound: super::virtual_stream::InboundSender,
        opener: RecordOpener,
    },
}

/// One physical link to a server.
pub struct ClientLink {
    cfg: NoiseClientConfig,
    url: String,
    ctrl: mpsc::Sender<Vec<u8>>,
    data: mpsc::Sender<Vec<u8>>,
    streams: Mutex<HashMap<StreamId, Entry>>,
    dead: CancellationToken,
    opening: tokio::sync::Semaphore,
    /// Held from stamping a message 1 until its `OPEN` is queued, so that `OPEN`s leave in
    /// the order of their `ts`: the server refuses a `ts` below one it has seen.
    stamp_order: tokio::sync::Mutex<()>,
}

type LinkKey = (String, [u8; KEY_BYTES], [u8; KEY_BYTES]);

#[derive(Default)]
struct PoolInner {
    links: Mutex<HashMap<LinkKey, Weak<ClientLink>>>,
    /// One connect at a time, so that concurrent clients end up on one link.
    connecting: tokio::sync::Mutex<()>,
}

/// The physical links a group of clients share: one per (server URL, client key, server
/// key), kept while any of its streams lives. The caller owns the pool and decides who shares
/// it (clone it to share: clones are the same pool); nothing is shared outside a pool.
#[derive(Clone, Default)]
pub struct LinkPool {
    inner: Arc<PoolInner>,
}

impl std::fmt::Debug for LinkPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkPool")
            .field("links", &lock(&self.inner.links).len())
            .finish()
    }
}

impl LinkPool {
    /// An empty pool.
    pub fn new() -> LinkPool {
        LinkPool::default()
    }

    /// The pool's live link to `url` with these keys, or a new one.
    pub async fn link(
        &self,
        url: &str,
        cfg: &NoiseClientConfig,
    ) -> Result<Arc<ClientLink>, NoiseError> {
        let key = (url.to_string(), cfg.keys.public, cfg.server_public);
        let live = |key: &LinkKey| {
            lock(&self.inner.links)
                .get(key)
                .and_then(Weak::upgrade)
                .filter(|l| !l.dead.is_cancelled())
        };
        if let Some(l) = live(&key) {
            return Ok(l);
        }
        let _guard = self.inner.connecting.lock().await;
        if let Some(l) = live(&key) {
            return Ok(l);
        }
        let link = ClientLink::connect(url, cfg.clone()).await?;
        let mut links = lock(&self.inner.links);
        // Forget links that are gone, so the map holds no more entries than live links.
        links.retain(|_, l| l.upgrade().is_some_and(|l| !l.dead.is_cancelled()));
        links.insert(key, Arc::downgrade(&link));
        Ok(link)
    }

    /// Live links in the pool.
    pub fn live_links(&self) -> usize {
        lock(&self.inner.links)
            .values()
            .filter(|l| l.upgrade().is_some_and(|l| !l.dead.is_cancelled()))
            .count()
    }
}

/// `noise+ws://HOST:PORT` → `ws://HOST:PORT/v1/link`.
pub fn link_url(url: &str) -> Option<String> {
    let rest = url.strip_prefix("noise+ws://")?;
    let hostport = rest.trim_end_matches('/');
    Some(format!("ws://{hostport}{}", super::server::LINK_PATH))
}

impl ClientLink {
    /// A new link of its own.
    pub async fn connect(url: &str, cfg: NoiseClientConfig) -> Result<Arc<ClientLink>, NoiseError> {
        let ws_url = link_url(url).ok_or_else(|| {
            NoiseError::Connect(url.into(), "expected noise+ws://HOST:PORT".into())
        })?;
        let connect = tokio_tungstenite::connect_async_with_config(
            ws_url.as_str(),
            Some(websocket_config(MAX_FRAME_BYTES)),
            true,
        );
        let (ws, _) = tokio::time::timeout(OPEN_TIMEOUT, connect)
            .await
            .map_err(|_| NoiseError::Timeout(OPEN_TIMEOUT))?
            .map_err(|e| NoiseError::Connect(url.into(), e.to_string()))?;
        let (mut sink, mut stream) = ws.split();
        let (ctrl_tx, mut ctrl_rx) = mpsc::channel::<Vec<u8>>(SEND_QUEUE);
        let (data_tx, mut data_rx) = mpsc::channel::<Vec<u8>>(SEND_QUEUE);
        let link = Arc::new(ClientLink {
            cfg,
            url: url.to_string(),
            ctrl: ctrl_tx,
            data: data_tx,
            streams: Mutex::new(HashMap::new()),
            dead: CancellationToken::new(),
            opening: tokio::sync::Semaphore::new(MAX_OPENING_STREAMS),
            stamp_order: tokio::sync::Mutex::new(()),
        });

        // Writer: never tied to the reader.
        let dead = link.dead.clone();
        tokio::spawn(async move {
            loop {
                let m = tokio::select! {
                    biased;
                    _ = dead.cancelled() => break,
                    m = ctrl_rx.recv() => m,
                    m = data_rx.recv() => m,
                };
                let Some(m) = m else { break };
                if sink.feed(Message::Binary(m)).await.is_err() {
                    break;
                }
                let mut ok = true;
                while let Ok(m) = ctrl_rx.try_recv().or_else(|_| data_rx.try_recv()) {
                    if sink.feed(Message::Binary(m)).await.is_err() {
                        ok = false;
                        break;
                    }
                }
                if !ok || sink.flush().await.is_err() {
                    break;
                }
            }
            let _ = tokio::time::timeout(super::server::LINK_CLOSE_TIMEOUT, sink.close()).await;
            dead.cancel();
        });

        // Reader.
        let weak = Arc::downgrade(&link);
        let dead = link.dead.clone();
        tokio::spawn(async move {
            loop {
                let m = tokio::select! {
                    _ = dead.cancelled() => break,
                    m = stream.next() => m,
                };
                let bytes = match m {
                    Some(Ok(Message::Binary(b))) => b,
                    Some(Ok(Message::Ping(_))) | Some(Ok(Message::Pong(_))) => continue,
                    _ => break,
                };
                let Some(link) = weak.upgrade() else { break };
                let Ok(frame) = Frame::decode_owned(bytes) else {
                    continue;
                };
                link.on_frame(frame).await;
            }
            dead.cancel();
            if let Some(link) = weak.upgrade() {
                // Ending every stream: their transports report the loss.
                let entries: Vec<Entry> = lock(&link.streams).drain().map(|(_, e)| e).collect();
                for e in entries {
                    if let Entry::Opening { reply, .. } = e {
                        let _ = reply.send(Err(NoiseError::LinkLost));
                    }
                }
            }
        });
        tracing::debug!(%url, "noise link connected");
        Ok(link)
    }

    async fn on_frame(&self, frame: Frame) {
        let sid = frame.stream;
        match frame.ftype {
            FrameType::Accept => {
                let entry = lock(&self.streams).remove(&sid);
                let Some(Entry::Opening { hs, reply }) = entry else {
                    return;
                };
                match hs.finish(&frame.payload) {
                    Ok((keys, _welcome)) => {
                        let parts = open_stream(
                            sid,
                            keys,
                            self.cfg.max_message_bytes,
                            self.data.clone(),
                            INBOUND_QUEUE,
                            self.url.clone(),
                        );
                        lock(&self.streams).insert(
                            sid,
                            Entry::Open {
                                inbound: parts.inbound,
                                opener: parts.opener,
                            },
                        );
                        let _ = reply.send(Ok(parts.transport));
                    }
                    Err(_) => {
                        let _ = reply.send(Err(NoiseError::ServerKey));
                        if let Ok(r) = Frame::reset(sid, "handshake_failed").encode() {
                            let _ = self.ctrl.try_send(r);
                        }
                    }
                }
            }
            FrameType::Data => {
                let delivery = {
                    let mut streams = lock(&self.streams);
                    match streams.get_mut(&sid) {
                        Some(Entry::Open { inbound, opener }) => {
                            match opener.open_owned(frame.seq, frame.payload) {
                                Ok(Opened::Messages(m)) => Some((inbound.clone(), m)),
                                Ok(Opened::Close(_)) | Err(_) => {
                                    // Closed on purpose, or garbage: the stream is over.
                                    streams.remove(&sid);
                                    None
                                }
                            }
                        }
                        _ => None,
                    }
                };
                if let Some((tx, msgs)) = delivery {
                    for m in msgs {
                        // The client's opener has no budget: nothing to carry.
                        if tx
                            .send(Ok((m, crate::bounds::Charge::none())))
                            .await
                            .is_err()
                        {
                            break;
                        }
                    }
                }
            }
            FrameType::Reset => {
                let entry = lock(&self.streams).remove(&sid);
                if let Some(Entry::Opening { reply, .. }) = entry {
                    let reason = frame.reset_reason();
                    let err = match reason.as_str() {
                        "busy" => NoiseError::Busy,
                        "replayed_handshake" => NoiseError::Replayed,
                        _ => NoiseError::Refused(explain_reset(&reason)),
                    };
                    let _ = reply.send(Err(err));
                }
                // An open stream's inbound sender is dropped: its transport ends.
            }
            _ => {}
        }
    }

    /// Open a new virtual stream: handshake, then a transport. At most
    /// [`MAX_OPENING_STREAMS`] handshakes are in flight per link; an OPEN the server turns
    /// away as busy is retried with backoff, one refused as a replay is retried at once with
    /// a fresh handshake ([`REPLAYED_RETRIES`]).
    pub async fn open_stream(self: &Arc<Self>) -> Result<Transport, NoiseError> {
        let _slot = self
            .opening
            .acquire()
            .await
            .map_err(|_| NoiseError::LinkLost)?;
        let mut delay = Duration::from_millis(50);
        let (mut busy, mut replayed) = (0, 0);
        loop {
            match self.open_stream_once().await {
                Err(NoiseError::Busy) if busy < BUSY_RETRIES => {
                    busy += 1;
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
                Err(NoiseError::Replayed) if replayed < REPLAYED_RETRIES => replayed += 1,
                other => return other,
            }
        }
    }

    async fn open_stream_once(self: &Arc<Self>) -> Result<Transport, NoiseError> {
        if self.dead.is_cancelled() {
            return Err(NoiseError::LinkLost);
        }
        let mut sid = [0u8; 16];
        getrandom::getrandom(&mut sid)
            .map_err(|e| NoiseError::Connect(self.url.clone(), e.to_string()))?;
        let order = self.stamp_order.lock().await;
        let (hs, msg1) = ClientHandshake::start(
            &self.cfg.keys,
            &self.cfg.server_public,
            &self.cfg.env_id,
            &sid,
            self.cfg.token.as_deref(),
            next_hello_ts(),
        )
        .map_err(|e| NoiseError::Refused(e.to_string()))?;
        let open = Frame::new(FrameType::Open, sid, 0, bytes::Bytes::from(msg1))
            .encode()
            .map_err(|e| NoiseError::Refused(e.to_string()))?;
        let (tx, rx) = oneshot::channel();
        lock(&self.streams).insert(
            sid,
            Entry::Opening {
                hs: Box::new(hs),
                reply: tx,
            },
        );
        if self.ctrl.send(open).await.is_err() {
            return Err(NoiseError::LinkLost);
        }
        drop(order);
        match tokio::time::timeout(OPEN_TIMEOUT, rx).await {
            Ok(Ok(Ok(mut t))) => {
                // The link lives as long as any of its streams.
                let keep = self.clone();
                t.incoming = Box::pin(t.incoming.map(move |m| {
                    let _ = &keep;
                    m
                }));
                Ok(t)
            }
            Ok(Ok(Err(e))) => Err(e),
            Ok(Err(_)) => Err(NoiseError::LinkLost),
            Err(_) => {
                lock(&self.streams).remove(&sid);
                Err(NoiseError::Timeout(OPEN_TIMEOUT))
            }
        }
    }

    /// Whether the link is gone.
    pub fn is_dead(&self) -> bool {
        self.dead.is_cancelled()
    }

    /// Drop the physical link (tests: a network failure).
    pub fn kill(&self) {
        self.dead.cancel();
    }
}
