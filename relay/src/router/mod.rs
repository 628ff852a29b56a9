//! The relay role (`secure-transport.md` §6.3, §6.4, §7), sans-IO: routing frames between
//! client links and environment links by (environment id, stream id), the relay's window
//! accounting, per-link send queues with a control reserve, budgets and keepalive.
//!
//! - In: [`Router::add_environment_link`], [`Router::add_client_link`],
//!   [`Router::handle_frame`], [`Router::handle_pong`], [`Router::handle_timeout`],
//!   [`Router::link_closed`], [`Router::remove_environment`].
//! - Out: [`Router::poll_transmit`] per link, [`Router::poll_timeout`] per link,
//!   [`Router::poll_event`] (which link's writer to wake, which link to close).
//!
//! It reads frame headers only; payloads are forwarded untouched (the relay holds no keys).
//! The environment link's own handshake on stream id 0 (§6.2) happens before the driver
//! registers the link here; stream id 0 is never routed.
//!
//! # Invariants
//!
//! - **The reader never waits on a destination**: `handle_frame` only queues; a frame that
//!   cannot be queued within its rules resets its stream (or is refused), never blocks.
//! - **A stream's queue on a link never holds more than one window**: `DATA` is admitted only
//!   in order and inside the receiver's last report (its window clipped to
//!   [`RelayConfig::max_window_records`]); past it the stream is reset (`window_exceeded`) on both
//!   links and nothing else is touched.
//! - **Control frames are never stuck behind data**: each link serves control, then
//!   coalesced `ACK`s, then `DATA` round robin; `OPEN` is refused `busy` rather than let the
//!   control lane grow past its reserve.
//! - **An `OPEN` for a routed id never disturbs the holder**; a client link's streams,
//!   budgets and death affect only that link and the streams it opened.
//! - Every reset and drop is counted by reason ([`Counters`]); resets once per stream.

mod inbound;
mod queue;
mod table;

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

pub use table::{LinkId, MemoryTable, Route, RouteKey, RoutingTable};

use crate::bucket::TokenBucket;
use crate::closed_set::ClosedSet;
use crate::config::{ConfigError, RelayConfig};
use crate::frame::{Frame, StreamId};
use crate::http::AddressKey;
use crate::keepalive::Keepalive;
use crate::reason::{CloseReason, Counters, Reason};
use crate::transmit::Transmit;
use queue::OutQueue;

/// Which side of the relay a link is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkKind {
    /// Opens streams to an environment (`/v1/connect/ID`).
    Client,
    /// An exec server's link (`/v1/env/ID`), after its handshake.
    Environment,
}

/// What happened to a routed stream (for the driver's logs; the counters are the router's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StreamChange {
    /// A client's `OPEN` was routed and forwarded to the environment.
    Opened,
    /// The environment's `ACCEPT` was forwarded to the client.
    Accepted,
    /// A client's `OPEN` was refused without being routed.
    Refused(Reason),
    /// The relay reset the stream (both ends told), or one of its links died.
    Reset(Reason),
    /// One end reset the stream; the `RESET` was forwarded to the other.
    PeerReset {
        /// The end that sent it.
        from: LinkKind,
    },
}

/// What the driver must do.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RouterEvent {
    /// `link` has something to write (or a ping due): wake its writer.
    Wake {
        /// The link.
        link: LinkId,
    },
    /// The relay closed `link`: close its socket. Its streams are already reset.
    Close {
        /// The link.
        link: LinkId,
        /// Why.
        reason: CloseReason,
    },
    /// A stream opened by client link `client` changed (for logs only: nothing to do).
    Stream {
        /// The client link that opened (or tried to open) it.
        client: LinkId,
        /// The stream id.
        stream: StreamId,
        /// What happened.
        change: StreamChange,
    },
}

/// A link the relay will not take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AddLinkError {
    /// The relay serves its maximum of environments.
    #[error("too many environments")]
    TooManyEnvironments,
    /// The address holds its maximum of client links.
    #[error("too many client links from this address")]
    TooManyLinksFromAddress,
}

#[derive(Debug)]
struct Link {
    kind: LinkKind,
    env: Arc<str>,
    addr: Option<AddressKey>,
    /// Client link: the streams it opened.
    streams: HashSet<StreamId>,
    out: OutQueue,
    closed_streams: ClosedSet,
    malformed: TokenBucket,
    unknown: TokenBucket,
    /// Client link: `OPEN`s per second.
    opens: Option<TokenBucket>,
    keepalive: Keepalive,
    /// A `Wake` was emitted and the writer has not yet found the queue empty.
    wake_pending: bool,
}

#[derive(Debug, Default)]
struct EnvState {
    link: Option<LinkId>,
    streams: HashSet<StreamId>,
}

/// The relay's routing core.
#[derive(Debug)]
pub struct Router<T: RoutingTable = MemoryTable> {
    cfg: RelayConfig,
    table: T,
    links: HashMap<LinkId, Link>,
    envs: HashMap<Arc<str>, EnvState>,
    /// Client links per address (IPv4 address or IPv6 /64, as the HTTP front counts them:
    /// one host owns a whole /64).
    per_addr: HashMap<AddressKey, usize>,
    next_id: LinkId,
    queued_bytes: usize,
    events: VecDeque<RouterEvent>,
    counters: Counters,
    /// Environments revoked since this relay started and not listed again, oldest first (at
    /// most [`REVOKED_REMEMBERED`]): their `OPEN`s are refused `environment_revoked`, not
    /// `environment_offline`, so a client stops instead of waiting for a link that will not
    /// come.
    revoked: VecDeque<Arc<str>>,
}

/// Revoked environment ids the router remembers (each a short string): beyond it the oldest
/// is forgotten and its `OPEN`s read `environment_offline` again, as after a restart.
pub const REVOKED_REMEMBERED: usize = 4096;

impl Router<MemoryTable> {
    /// A relay with an in-memory routing table.
    pub fn new(cfg: RelayConfig) -> Result<Self, ConfigError> {
        Router::with_table(cfg, MemoryTable::default())
    }
}

impl<T: RoutingTable> Router<T> {
    /// A relay over `table`.
    pub fn with_table(cfg: RelayConfig, table: T) -> Result<Self, ConfigError> {
        cfg.validate()?;
        Ok(Router {
            cfg,
            table,
            links: HashMap::new(),
            envs: HashMap::new(),
            per_addr: HashMap::new(),
            next_id: 1,
            queued_bytes: 0,
            events: VecDeque::new(),
            counters: Counters::default(),
            revoked: VecDeque::new(),
        })
    }

    /// Settings.
    pub fn config(&self) -> &RelayConfig {
        &self.cfg
    }

    /// Counters of resets (once per stream), drops, closes and frames.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Bytes queued on every link together.
    pub fn queued_bytes(&self) -> usize {
        self.queued_bytes
    }

    /// Bytes queued for `link`.
    pub fn link_queued_bytes(&self, link: LinkId) -> usize {
        self.links.get(&link).map_or(0, |l| l.out.bytes())
    }

    /// `DATA` bytes queued on `link` for `stream`.
    pub fn stream_queued_bytes(&self, link: LinkId, stream: &StreamId) -> usize {
        self.links
            .get(&link)
            .map_or(0, |l| l.out.stream_bytes(stream))
    }

    /// Routed streams.
    pub fn route_count(&self) -> usize {
        self.table.len()
    }

    /// Live links.
    pub fn link_count(&self) -> usize {
        self.links.len()
    }

    /// The deepest send queue of any link, in bytes (a metrics figure: O(links)).
    pub fn deepest_link_queue_bytes(&self) -> usize {
        self.links
            .values()
            .map(|l| l.out.bytes())
            .max()
            .unwrap_or(0)
    }

    /// Environments with a live link.
    pub fn environment_count(&self) -> usize {
        self.envs.values().filter(|e| e.link.is_some()).count()
    }

    /// The current link of environment `env`.
    pub fn environment_link(&self, env: &str) -> Option<LinkId> {
        self.envs.get(env).and_then(|e| e.link)
    }

    /// Whether `link` is live.
    pub fn is_live(&self, link: LinkId) -> bool {
        self.links.contains_key(&link)
    }

    /// The next event for the driver.
    pub fn poll_event(&mut self) -> Option<RouterEvent> {
        self.events.pop_front()
    }

    fn new_link(
        &mut self,
        kind: LinkKind,
        env: Arc<str>,
        addr: Option<AddressKey>,
        now: Instant,
        seed: u64,
    ) -> LinkId {
        let id = self.next_id;
        self.next_id += 1;
        let opens = (kind == LinkKind::Client)
            .then(|| TokenBucket::per_second(self.cfg.opens_per_second, now));
        self.links.insert(
            id,
            Link {
                kind,
                env,
                addr,
                streams: HashSet::new(),
                out: OutQueue::default(),
                closed_streams: ClosedSet::new(self.cfg.closed_streams_remembered),
                malformed: TokenBucket::new(self.cfg.malformed_frames, now),
                unknown: TokenBucket::new(self.cfg.unknown_stream_frames, now),
                opens,
                keepalive: Keepalive::new(self.cfg.keepalive, now, seed),
                wake_pending: false,
            },
        );
        id
    }

    /// Register an environment link whose handshake (§6.2) succeeded. A previous link of the
    /// same environment is replaced: closed, its streams reset (`environment_gone`).
    pub fn add_environment_link(
        &mut self,
        now: Instant,
        env: &str,
        seed: u64,
    ) -> Result<LinkId, AddLinkError> {
        let env: Arc<str> = Arc::from(env);
        match self.envs.get(&env).and_then(|e| e.link) {
            Some(old) => self.close_link(old, CloseReason::Replaced),
            None => {
                if self.environment_count() >= self.cfg.max_environments {
                    return Err(AddLinkError::TooManyEnvironments);
                }
            }
        }
        let id = self.new_link(LinkKind::Environment, env.clone(), None, now, seed);
        self.revoked.retain(|r| *r != env);
        self.envs.entry(env).or_default().link = Some(id);
        Ok(id)
    }

    /// Register a client link for environment `env` from `addr` (the environment need not be
    /// online: its `OPEN`s are then refused `environment_offline`).
    pub fn add_client_link(
        &mut self,
        now: Instant,
        env: &str,
        addr: IpAddr,
        seed: u64,
    ) -> Result<LinkId, AddLinkError> {
        let addr = AddressKey::of(addr);
        let n = self.per_addr.get(&addr).copied().unwrap_or(0);
        if n >= self.cfg.max_client_links_per_address {
            return Err(AddLinkError::TooManyLinksFromAddress);
        }
        self.per_addr.insert(addr, n + 1);
        Ok(self.new_link(LinkKind::Client, Arc::from(env), Some(addr), now, seed))
    }

    /// The environment is no longer listed: close its link at once (its streams reset
    /// `environment_revoked`), and refuse its `OPEN`s so from now on.
    pub fn remove_environment(&mut self, env: &str) {
        if !self.revoked.iter().any(|r| &**r == env) {
            if self.revoked.len() >= REVOKED_REMEMBERED {
                self.revoked.pop_front();
            }
            self.revoked.push_back(Arc::from(env));
        }
        if let Some(link) = self.envs.get(env).and_then(|e| e.link) {
            self.close_link(link, CloseReason::Revoked);
        }
    }

    /// Whether `env` was revoked (and not listed again since).
    pub fn is_revoked(&self, env: &str) -> bool {
        self.revoked.iter().any(|r| &**r == env)
    }

    /// The driver saw `link` end (socket closed, write deadline, shutdown): reset its streams
    /// on the other side and forget it. Idempotent.
    pub fn link_closed(&mut self, link: LinkId, reason: CloseReason) {
        self.teardown(link, reason);
    }

    // ---- timers --------------------------------------------------------------------------

    /// When [`handle_timeout`](Self::handle_timeout) must next be called for `link`.
    pub fn poll_timeout(&self, link: LinkId) -> Option<Instant> {
        self.links
            .get(&link)
            .and_then(|l| l.keepalive.poll_timeout())
    }

    /// Advance `link`'s keepalive to `now`: a ping may become due (its writer is woken), or
    /// the link dead (closed).
    pub fn handle_timeout(&mut self, now: Instant, link: LinkId) {
        let Some(l) = self.links.get_mut(&link) else {
            return;
        };
        l.keepalive.handle_timeout(now);
        if l.keepalive.is_dead() {
            self.close_link(link, CloseReason::KeepaliveTimeout);
        } else if l.keepalive.wants_ping() {
            self.wake(link);
        }
    }

    /// A WebSocket pong arrived on `link`.
    pub fn handle_pong(&mut self, link: LinkId, payload: &[u8]) {
        if let Some(l) = self.links.get_mut(&link) {
            l.keepalive.on_pong(payload);
        }
    }

    // ---- writers -------------------------------------------------------------------------

    /// Whether [`poll_transmit`](Self::poll_transmit) has something for `link`.
    pub fn has_transmit(&self, link: LinkId) -> bool {
        self.links
            .get(&link)
            .is_some_and(|l| l.keepalive.wants_ping() || !l.out.is_empty())
    }

    /// The next thing to write on `link`: a due ping, control frames, coalesced `ACK`s, then
    /// `DATA` round robin. `None` means the writer may sleep until the next `Wake`.
    pub fn poll_transmit(&mut self, now: Instant, link: LinkId) -> Option<Transmit> {
        let l = self.links.get_mut(&link)?;
        if let Some(p) = l.keepalive.poll_ping(now) {
            return Some(Transmit::Ping(p));
        }
        match l.out.pop() {
            Some(f) => {
                self.queued_bytes -= f.wire_len();
                self.counters.frames_out[f.ftype as usize] += 1;
                if f.ftype == crate::frame::FrameType::Data {
                    self.counters.data_bytes_out += f.payload.len() as u64;
                }
                Some(Transmit::Frame(f))
            }
            None => {
                l.wake_pending = false;
                None
            }
        }
    }

    // ---- internals -----------------------------------------------------------------------

    fn wake(&mut self, link: LinkId) {
        if let Some(l) = self.links.get_mut(&link) {
            if !l.wake_pending {
                l.wake_pending = true;
                self.events.push_back(RouterEvent::Wake { link });
            }
        }
    }

    fn stream_event(&mut self, client: LinkId, stream: StreamId, change: StreamChange) {
        self.events.push_back(RouterEvent::Stream {
            client,
            stream,
            change,
        });
    }

    fn enqueue(&mut self, link: LinkId, f: Frame, lane: Lane) {
        let Some(l) = self.links.get_mut(&link) else {
            return;
        };
        self.queued_bytes += match lane {
            Lane::Control => l.out.push_control(f),
            Lane::Ack => l.out.push_ack(f),
            Lane::Data => l.out.push_data(f),
            Lane::AfterData => l.out.push_reset_after_data(f),
        };
        self.wake(link);
    }

    /// Close a link on the relay's own initiative; the driver is told to close the socket.
    fn close_link(&mut self, link: LinkId, reason: CloseReason) {
        if self.teardown(link, reason) {
            self.events.push_back(RouterEvent::Close { link, reason });
        }
    }

    /// Forget `link`, resetting its streams on the other side. False if it was gone.
    fn teardown(&mut self, link: LinkId, reason: CloseReason) -> bool {
        let Some(l) = self.links.remove(&link) else {
            return false;
        };
        self.counters.closed(reason);
        self.queued_bytes -= l.out.bytes();
        if let Some(addr) = l.addr {
            if let Some(n) = self.per_addr.get_mut(&addr) {
                *n -= 1;
                if *n == 0 {
                    self.per_addr.remove(&addr);
                }
            }
        }
        match l.kind {
            LinkKind::Client => {
                for s in l.streams {
                    let key = RouteKey {
                        env: l.env.clone(),
                        stream: s,
                    };
                    if let Some(route) = self.table.remove(&key) {
                        if let Some(e) = self.envs.get_mut(&l.env) {
                            e.streams.remove(&s);
                        }
                        if let Some(e) = self.links.get_mut(&route.env_link) {
                            e.closed_streams.insert(s);
                        }
                        self.counters.reset(Reason::ClientGone);
                        self.stream_event(link, s, StreamChange::Reset(Reason::ClientGone));
                        let reset = Frame::reset(s, Reason::ClientGone.as_str());
                        self.enqueue(route.env_link, reset, Lane::AfterData);
                    }
                }
            }
            LinkKind::Environment => {
                let streams = match self.envs.get_mut(&l.env) {
                    Some(e) if e.link == Some(link) => {
                        e.link = None;
                        std::mem::take(&mut e.streams)
                    }
                    _ => HashSet::new(),
                };
                let why = if self.is_revoked(&l.env) {
                    Reason::EnvironmentRevoked
                } else {
                    Reason::EnvironmentGone
                };
                for s in streams {
                    let key = RouteKey {
                        env: l.env.clone(),
                        stream: s,
                    };
                    if let Some(route) = self.table.remove(&key) {
                        if let Some(c) = self.links.get_mut(&route.client) {
                            c.streams.remove(&s);
                            c.closed_streams.insert(s);
                        }
                        self.counters.reset(why);
                        self.stream_event(route.client, s, StreamChange::Reset(why));
                        let reset = Frame::reset(s, why.as_str());
                        self.enqueue(route.client, reset, Lane::AfterData);
                    }
                }
            }
        }
        if self
            .envs
            .get(&l.env)
            .is_some_and(|e| e.link.is_none() && e.streams.is_empty())
        {
            self.envs.remove(&l.env);
        }
        true
    }
}

/// Which lane of a link's queue a frame takes.
#[derive(Debug, Clone, Copy)]
enum Lane {
    Control,
    Ack,
    Data,
    /// A `RESET` behind its stream's queued `DATA`.
    AfterData,
}
