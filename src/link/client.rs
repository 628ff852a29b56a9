//! The client's side of a physical link, on the link engine: many Noise virtual streams over
//! one WebSocket to a server (`noise+ws://`) or to a relay (`relay+ws://RELAY:PORT/ID`,
//! `relay+wss://…`), shared on purpose through a [`LinkPool`] by the clients that talk to the
//! same place with the same keys.
//!
//! `open_stream` sends `OPEN` (handshake message 1, with the environment id in the prologue
//! for a relay target), waits for `ACCEPT`, verifies message 2 and only then hands out a
//! [`Transport`]: the client sends no application data before the server is authenticated.
//! The engine (`execrelay_io::driver::EndpointLink`) owns frames, windows, keepalive and
//! the write deadline; a stream whose consumer stops reading holds back its server's sender
//! and nothing else. There is no process-wide state here except the message-1 timestamp
//! counter ([`next_hello_ts`]): links are shared only through a pool the caller owns.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;

use super::dial::{dial, DialError, LinkTarget, TlsRoots};
use super::virtual_stream::noise_transport;
use crate::bounds::ByteBudget;
use crate::noise::keys::{fingerprint, Keypair, KEY_BYTES};
use crate::noise::timestamp::next_hello_ts;
use crate::sync::lock;
use crate::transport::Transport;
use execrelay_io::driver::{Accepted, EndpointLink, StreamError};
use execrelay_protocol::config::{EndpointConfig, KeepaliveConfig, STREAM_WINDOW_RECORDS};
use execrelay_protocol::noise::handshake::ClientHandshake;
use execrelay_protocol::noise::suite::{NoiseSuite, SuiteChoice};
use execrelay_protocol::reason::{CloseReason, Reason};

/// How long connecting a link, and each `OPEN` waiting for its `ACCEPT`, may take.
pub const OPEN_TIMEOUT: Duration = Duration::from_secs(20);
/// Handshakes a client keeps in flight on one link, below the server's default
/// `MAX_PENDING_AUTHORIZATIONS` (32) so that a burst of streams is not turned away as busy.
pub const MAX_OPENING_STREAMS: usize = 16;
/// Attempts of an OPEN the server answered `busy`, with doubling backoff from 50 ms.
const BUSY_RETRIES: u32 = 6;
/// Fresh handshakes after the server refused one as a replay (`replayed_handshake`). A
/// genuine client meets that when two processes sharing its key stamped the same microsecond,
/// or when it stamped just before the server (re)started; a fresh stamp passes (unless this
/// machine's clock is behind the server's by more than the server's uptime).
const REPLAYED_RETRIES: u32 = 2;

/// Client-side Noise settings.
#[derive(Clone)]
pub struct NoiseClientConfig {
    /// The client's static key.
    pub keys: Keypair,
    /// The pinned server key (for a relay target: the exec server's, not the relay's).
    pub server_public: [u8; KEY_BYTES],
    /// Optional token for servers that require one.
    pub token: Option<String>,
    /// Largest message accepted.
    pub max_message_bytes: usize,
    /// Keepalive and write deadline of the link (§6.4).
    pub keepalive: KeepaliveConfig,
    /// How `relay+wss://` verifies the relay's certificate.
    pub tls: TlsRoots,
    /// The Noise suite of the streams (`secure-transport.md` §3): by CPU features with a
    /// fallback to suite 0 (the default), or pinned.
    pub suite: SuiteChoice,
    /// The receive window each stream advertises, in records of at most 64 KiB
    /// (`secure-transport.md` §7; default [`STREAM_WINDOW_RECORDS`], 1 MiB). A stream moves at
    /// most one window per round trip, so a client far from its server gains throughput with a
    /// larger one, and pays for it in memory: up to this many records per stream are held
    /// until read. At most [`MAX_CLIENT_WINDOW_RECORDS`]; a relay clips it to its own
    /// `max_window_records` (64 by default).
    pub window: u32,
}

/// The largest receive window a client advertises ([`NoiseClientConfig::window`]): 256 records,
/// 16 MiB per stream held at most until read (40 MB/s at a 100 ms round trip through a relay
/// at its default 64, 160 MB/s directly).
pub const MAX_CLIENT_WINDOW_RECORDS: u32 = 256;

/// `window` when it is in `1..=MAX_CLIENT_WINDOW_RECORDS`; otherwise what is wrong and what to give.
pub fn check_window(window: u32) -> Result<u32, String> {
    if (1..=MAX_CLIENT_WINDOW_RECORDS).contains(&window) {
        Ok(window)
    } else {
        Err(format!(
            "a stream window of {window} records is out of range: give 1 to {MAX_CLIENT_WINDOW_RECORDS} (records of at most 64 KiB; the default is {STREAM_WINDOW_RECORDS})"
        ))
    }
}

impl NoiseClientConfig {
    /// Settings for `keys` pinning `server_public`, everything else at its default.
    pub fn new(keys: Keypair, server_public: [u8; KEY_BYTES]) -> Self {
        NoiseClientConfig {
            keys,
            server_public,
            token: None,
            max_message_bytes: crate::config::MAX_MESSAGE_BYTES,
            keepalive: KeepaliveConfig::default(),
            tls: TlsRoots::Platform,
            suite: SuiteChoice::Auto,
            window: STREAM_WINDOW_RECORDS,
        }
    }
}

impl std::fmt::Debug for NoiseClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NoiseClientConfig")
            .field("client", &fingerprint(&self.keys.public))
            .field("server", &fingerprint(&self.server_public))
            .field("suite", &self.suite)
            .field("window", &self.window)
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
    /// The server refused message 1 as a replay: its `ts` was already seen for this key, or
    /// earlier than the server's start (retried by `open_stream` with a fresh handshake).
    #[error("the server refused the handshake as a replay: this machine's clock may be behind the server's (a handshake stamped before the server started is refused); check both clocks")]
    Replayed,
    /// The relay has no link from this environment now (`environment_offline`), or it went
    /// away while the handshake was under way (`environment_gone`). Transient: the exec
    /// server reconnects on its own.
    #[error("environment {0:?} is offline: the relay has no link from its exec server ({1})")]
    EnvironmentOffline(String, String),
    /// The relay closed the link because the environment is moving to another relay of its
    /// cluster (close reason `moved`): transient, its exec server is re-dialling its new
    /// home.
    #[error("environment {0:?} is offline: it is moving to another relay (the relay closed the link: moved)")]
    Moved(String),
    /// No answer in time.
    #[error("no answer to the handshake within {0:?}")]
    Timeout(Duration),
    /// The relay no longer lists this environment (`environment_revoked`): it will not come
    /// back, so nothing retries.
    #[error("environment {0:?} was revoked at the relay: its key is no longer listed there")]
    EnvironmentRevoked(String),
    /// The server does not accept this Noise suite (`unsupported_suite`). With
    /// [`SuiteChoice::Auto`] the stream is opened again in suite 0 instead; a pinned suite
    /// fails with this.
    #[error("the server does not accept Noise suite {0} (it answered unsupported_suite): pin another with --noise-suite (chachapoly works everywhere), use --noise-suite auto, or add {0} to the server's noise_suites")]
    UnsupportedSuite(NoiseSuite),
    /// A setting of [`NoiseClientConfig`] is out of range (nothing was dialled).
    #[error("{0}")]
    Config(String),
}

fn explain_reset(reason: &str) -> String {
    match reason {
        "handshake_failed" => "the server refused the handshake: check --server-key (it must be the server's public key) and --key".into(),
        "unauthorized" => "the server refused this client: its key is not authorized (or a required token is missing or wrong)".into(),
        "busy" => format!("the server is busy ({reason}); try again"),
        "too_many_streams" => "the server refused a new stream (too_many_streams): this client key holds its maximum of streams (max_streams_per_key), or the server's link is full; close some streams or try again later".into(),
        "clock_skew" => "the server refused the handshake: this machine's clock and the server's differ by more than the server's clock window (2 minutes by default); fix the clock (see the server's log for the difference)".into(),
        "directory_unavailable" => "the relay this client reached does not hold the environment and cannot ask the cluster's directory (NATS is unreachable) where it is (directory_unavailable); try again, or connect through the cluster's front (HAProxy) so that the environment's own relay is reached".into(),
        "holder_unreachable" => "the relay this client reached does not hold the environment, and the relay that does could not be reached over a relay-to-relay link (holder_unreachable); try again".into(),
        other => format!("the server reset the stream: {other}"),
    }
}

/// One physical link to a server or a relay. Dropping the last handle (the pool holds only
/// weak ones; every stream's transport holds one) closes it.
pub struct ClientLink {
    cfg: NoiseClientConfig,
    url: String,
    target: LinkTarget,
    link: EndpointLink,
    opening: tokio::sync::Semaphore,
    /// Held from stamping a message 1 until its `OPEN` is queued, so that `OPEN`s leave in
    /// the order of their `ts` (the server's replay cache accepts any order; ordered stamps
    /// keep its logs readable).
    stamp_order: Mutex<()>,
    /// The server refused suite 1 on this link (`unsupported_suite`): its later streams open
    /// in suite 0 straight away (only with [`SuiteChoice::Auto`]).
    fell_back: AtomicBool,
}

impl Drop for ClientLink {
    fn drop(&mut self) {
        self.link.close();
    }
}

type LinkKey = (String, [u8; KEY_BYTES], [u8; KEY_BYTES]);

#[derive(Default)]
struct PoolInner {
    links: Mutex<HashMap<LinkKey, Weak<ClientLink>>>,
    /// One connect at a time, so that concurrent clients end up on one link.
    connecting: tokio::sync::Mutex<()>,
}

/// The physical links a group of clients share: one per (URL, client key, server key), kept
/// while any of its streams lives. The caller owns the pool and decides who shares it (clone
/// it to share: clones are the same pool); nothing is shared outside a pool.
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
                .filter(|l| !l.is_dead())
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
        links.retain(|_, l| l.upgrade().is_some_and(|l| !l.is_dead()));
        links.insert(key, Arc::downgrade(&link));
        Ok(link)
    }

    /// Live links in the pool.
    pub fn live_links(&self) -> usize {
        lock(&self.inner.links)
            .values()
            .filter(|l| l.upgrade().is_some_and(|l| !l.is_dead()))
            .count()
    }
}

/// `noise+ws://HOST:PORT` → `ws://HOST:PORT/v1/link`; `relay+ws://RELAY:PORT/ID` →
/// `ws://RELAY:PORT/v1/connect/ID`; `relay+wss://…` → `wss://…`.
pub fn link_url(url: &str) -> Option<String> {
    LinkTarget::parse(url).ok().map(|t| t.ws_url)
}

impl ClientLink {
    /// A new link of its own.
    pub async fn connect(url: &str, cfg: NoiseClientConfig) -> Result<Arc<ClientLink>, NoiseError> {
        let target =
            LinkTarget::parse(url).map_err(|e| NoiseError::Connect(url.into(), e.to_string()))?;
        let window = check_window(cfg.window).map_err(NoiseError::Config)?;
        let ws = match dial(&target.ws_url, &cfg.tls, OPEN_TIMEOUT).await {
            Ok(ws) => ws,
            Err(DialError::Timeout(_, d)) => return Err(NoiseError::Timeout(d)),
            Err(e) => return Err(NoiseError::Connect(url.into(), e.to_string())),
        };
        let ecfg = EndpointConfig {
            keepalive: cfg.keepalive,
            window,
            ..EndpointConfig::default()
        };
        let link = EndpointLink::spawn_client(ws, ecfg)
            .map_err(|e| NoiseError::Connect(url.into(), e.to_string()))?;
        tracing::debug!(%url, "noise link connected");
        Ok(Arc::new(ClientLink {
            cfg,
            url: url.to_string(),
            target,
            link,
            opening: tokio::sync::Semaphore::new(MAX_OPENING_STREAMS),
            stamp_order: Mutex::new(()),
            fell_back: AtomicBool::new(false),
        }))
    }

    /// The suite a stream opened with `choice` starts in on this link: the choice's, or
    /// suite 0 once the server refused another one here (and the choice allows falling back).
    pub fn suite_for(&self, choice: SuiteChoice) -> NoiseSuite {
        if choice.may_fall_back() && self.fell_back.load(Ordering::Relaxed) {
            NoiseSuite::ChaChaPoly
        } else {
            choice.preferred()
        }
    }

    /// Open a new virtual stream: handshake, then a transport. At most
    /// [`MAX_OPENING_STREAMS`] handshakes are in flight per link; an OPEN the server turns
    /// away as busy is retried with backoff, one refused as a replay is retried at once with
    /// a fresh handshake (`REPLAYED_RETRIES`), and one refused `unsupported_suite` is opened
    /// again in suite 0 when the suite was chosen automatically (the link remembers it).
    pub async fn open_stream(self: &Arc<Self>) -> Result<Transport, NoiseError> {
        self.open_stream_with(self.cfg.suite).await
    }

    /// [`open_stream`](Self::open_stream) with the suite chosen by `choice` instead of the
    /// link's configuration (a pooled link serves clients whose choices differ).
    pub async fn open_stream_with(
        self: &Arc<Self>,
        choice: SuiteChoice,
    ) -> Result<Transport, NoiseError> {
        let _slot = self
            .opening
            .acquire()
            .await
            .map_err(|_| NoiseError::LinkLost)?;
        let mut delay = Duration::from_millis(50);
        let (mut busy, mut replayed) = (0, 0);
        loop {
            match self.open_stream_once(self.suite_for(choice)).await {
                Err(NoiseError::Busy) if busy < BUSY_RETRIES => {
                    busy += 1;
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
                Err(NoiseError::Replayed) if replayed < REPLAYED_RETRIES => replayed += 1,
                Err(NoiseError::UnsupportedSuite(suite))
                    if suite != NoiseSuite::ChaChaPoly && choice.may_fall_back() =>
                {
                    tracing::info!(
                        url = %self.url,
                        refused = %suite,
                        "the server does not accept this Noise suite; using chachapoly on this link"
                    );
                    self.fell_back.store(true, Ordering::Relaxed);
                }
                other => return other,
            }
        }
    }

    fn refusal(&self, suite: NoiseSuite, e: StreamError) -> NoiseError {
        match e {
            StreamError::PeerReset(reason) => match reason.as_str() {
                "busy" => NoiseError::Busy,
                "unsupported_suite" => NoiseError::UnsupportedSuite(suite),
                "replayed_handshake" => NoiseError::Replayed,
                "environment_offline" | "environment_gone" => {
                    NoiseError::EnvironmentOffline(self.target.env_id.clone(), reason)
                }
                "environment_revoked" => NoiseError::EnvironmentRevoked(self.target.env_id.clone()),
                _ => NoiseError::Refused(explain_reset(&reason)),
            },
            _ => self.lost(),
        }
    }

    /// Why the link is gone, as far as the client can tell: the environment is moving (the
    /// relay said `moved`), or just lost.
    fn lost(&self) -> NoiseError {
        match self.link.peer_close_reason() {
            Some(CloseReason::Moved) => NoiseError::Moved(self.target.env_id.clone()),
            _ => NoiseError::LinkLost,
        }
    }

    async fn open_stream_once(
        self: &Arc<Self>,
        suite: NoiseSuite,
    ) -> Result<Transport, NoiseError> {
        if self.is_dead() {
            return Err(self.lost());
        }
        let mut sid = [0u8; 16];
        getrandom::getrandom(&mut sid)
            .map_err(|e| NoiseError::Connect(self.url.clone(), e.to_string()))?;
        let (hs, opening) = {
            // Stamp and queue under one lock: OPENs leave in the order of their `ts`.
            let _order = lock(&self.stamp_order);
            let (hs, msg1) = ClientHandshake::start_suite(
                suite,
                &self.cfg.keys,
                &self.cfg.server_public,
                &self.target.env_id,
                &sid,
                self.cfg.token.as_deref(),
                next_hello_ts(),
            )
            .map_err(|e| NoiseError::Refused(e.to_string()))?;
            let opening = self
                .link
                .open_with_flags(sid, suite.number(), Bytes::from(msg1))
                .map_err(|e| self.refusal(suite, e))?;
            (hs, opening)
        };
        let Accepted { payload, stream } = match tokio::time::timeout(OPEN_TIMEOUT, opening).await {
            Ok(Ok(a)) => a,
            Ok(Err(e)) => return Err(self.refusal(suite, e)),
            // Dropping the opening abandons the stream.
            Err(_) => return Err(NoiseError::Timeout(OPEN_TIMEOUT)),
        };
        let keys = match hs.finish(&payload) {
            Ok((keys, _welcome)) => keys,
            Err(_) => {
                stream.sender.reset(Reason::HandshakeFailed);
                return Err(NoiseError::ServerKey);
            }
        };
        // The server's messages are bounded by this client's own requests: no budget.
        let (mut t, _end) = noise_transport(
            stream,
            keys,
            self.cfg.max_message_bytes,
            ByteBudget::unlimited(),
            self.url.clone(),
        );
        // The link lives as long as any of its streams.
        let keep = self.clone();
        t.incoming = Box::pin(t.incoming.map(move |m| {
            let _ = &keep;
            m
        }));
        Ok(t)
    }

    /// Whether the link is gone.
    pub fn is_dead(&self) -> bool {
        self.link.close_reason().is_some()
    }

    /// Drop the physical link (tests: a network failure).
    pub fn kill(&self) {
        self.link.close();
    }

    /// A copy of the link's counters (frames and bytes by type and direction, resets, drops).
    pub fn counters(&self) -> execrelay_protocol::reason::Counters {
        self.link.counters()
    }

    /// The environment id this link's handshakes are bound to (empty for a direct server).
    pub fn env_id(&self) -> &str {
        &self.target.env_id
    }
}
