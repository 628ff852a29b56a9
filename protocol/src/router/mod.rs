//! The relay role (`secure-transport.md` §6.3, §6.4, §7), sans-IO: routing frames between
//! client links and environment links by (environment id, stream id), the relay's window
//! accounting, per-link send queues with a control reserve, budgets and keepalive.
//!
//! - In: [`Router::add_environment_link`], [`Router::add_client_link`],
//!   [`Router::handle_frame`], [`Router::handle_pong`], [`Router::handle_timeout`],
//!   [`Router::link_closed`], [`Router::remove_environment`], [`Router::probe`].
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
//!   [`RelayConfig::max_window_records`], and forwarded clipped, so an honest sender never
//!   learns of more); past it the stream is reset (`window_exceeded`) on both links and nothing
//!   else is touched.
//! - **Control frames are never stuck behind data**: each link serves control, then
//!   coalesced `ACK`s, then `DATA` round robin; `OPEN` is refused `busy` rather than let the
//!   control lane grow past its reserve.
//! - **An `OPEN` for a routed id never disturbs the holder**; a client link's streams,
//!   budgets and death affect only that link and the streams it opened.
//! - **Budgets are charged to who spends them** (§6.4, §8): an environment's `RESET` that
//!   answers an `OPEN` with a handshake-failure reason is charged to the client link that sent
//!   the `OPEN` and to its address, never to the environment; an empty bucket closes that
//!   link. An address's `OPEN`s awaiting an answer never outnumber its tokens, so what one
//!   address can make an environment's handshakes fail is bounded exactly.
//! - **Every byte queued for a client link counts against its share** (all but its `DATA`,
//!   which the windows bound) **and the total**; a frame that would pass the share closes the
//!   link: it is not reading.
//! - **A client link that holds nothing is reaped**: no stream for `idle_link_timeout`.
//! - **The live holder of an environment id keeps it**: a second link for the id is refused
//!   while the first answers a probe (two exec servers share a key); a holder that does not
//!   answer is closed and the newcomer takes the id.
//! - Every reset and drop is counted by reason ([`Counters`]); resets once per stream.

mod budgets;
mod inbound;
mod links;
mod queue;
mod table;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Instant;

pub use budgets::{HANDSHAKE_FAILURE_REASONS, MAX_TRACKED_ADDRESSES};
pub use table::{LinkId, MemoryTable, Route, RouteKey, RoutingTable};

use crate::address::AddressKey;
use crate::bucket::TokenBucket;
use crate::closed_set::ClosedSet;
use crate::config::{ConfigError, RelayConfig};
use crate::frame::{Frame, StreamId};
use crate::keepalive::Keepalive;
use crate::reason::{CloseReason, Counters, Reason};
use crate::transmit::Transmit;
use budgets::{AddrState, Settle, PRUNE_ADDRESSES_FROM};
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
pub enum RouterEvent {
    /// `link` has something to write (or a ping due): wake its writer.
    Wake {
        /// The link.
        link: LinkId,
    },
    /// `link`'s timer moved (another link's event made it idle): its reader must look at
    /// [`Router::poll_timeout`] again.
    Rearm {
        /// The link.
        link: LinkId,
    },
    /// `link` answered a probe ([`Router::probe`]): it is alive.
    ProbeAnswered {
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
    /// The environment has a live link: only one link holds an id. Probe the holder
    /// ([`Router::probe`]); if it does not answer, it is closed and the id is free.
    #[error("the environment id is held by another link")]
    Held {
        /// The link that holds the id.
        holder: LinkId,
    },
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
    /// Client link: handshake failures its `OPEN`s caused.
    failures: Option<TokenBucket>,
    /// Client link: since when it holds no stream (`None` while it holds one).
    idle_since: Option<Instant>,
    keepalive: Keepalive,
    /// A `Wake` was emitted and the writer has not yet found the queue empty.
    wake_pending: bool,
    /// One end of a relay-to-relay link (cluster): never reaped for idleness (its life
    /// follows the misrouted client links it carries), and its `OPEN`s and `DATA` bytes are
    /// counted as forwarded ([`Forwarded`]).
    forward: bool,
}

/// Traffic across relay-to-relay links (cluster), counted by the router where it crosses a
/// link marked as one ([`Router::add_forward_environment_link`],
/// [`Router::add_relay_client_link`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Forwarded {
    /// Streams opened across a relay-to-relay link (counted by the forwarding relay).
    pub streams: u64,
    /// `DATA` payload bytes sent or received on relay-to-relay links (both relays count).
    pub bytes: u64,
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
    /// Per client address (IPv4 address or IPv6 /64, as the HTTP front counts them: one
    /// host owns a whole /64): its links, its handshake-failure bucket, its pending `OPEN`s.
    /// Kept while it has a link, a pending `OPEN` or a bucket not yet full again, so that
    /// closing every link does not refill the bucket.
    per_addr: HashMap<AddressKey, AddrState>,
    /// The size of `per_addr` at which it is next swept for addresses with nothing to keep.
    prune_addresses_at: usize,
    /// Streams per (address, environment).
    addr_env_streams: HashMap<(AddressKey, Arc<str>), usize>,
    next_id: LinkId,
    queued_bytes: usize,
    events: VecDeque<RouterEvent>,
    counters: Counters,
    /// Environments revoked since this relay started and not listed again, oldest first (at
    /// most [`REVOKED_REMEMBERED`]): their `OPEN`s are refused `environment_revoked`, not
    /// `environment_offline`, so a client stops instead of waiting for a link that will not
    /// come.
    revoked: VecDeque<Arc<str>>,
    /// The latest `now` any input brought (time only moves forward through inputs); used
    /// where an effect of one link's input starts another link's clock.
    clock: Option<Instant>,
    /// Traffic across relay-to-relay links.
    forwarded: Forwarded,
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
            prune_addresses_at: PRUNE_ADDRESSES_FROM,
            addr_env_streams: HashMap::new(),
            next_id: 1,
            queued_bytes: 0,
            events: VecDeque::new(),
            counters: Counters::default(),
            revoked: VecDeque::new(),
            clock: None,
            forwarded: Forwarded::default(),
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

    /// Bytes queued for `link` (at their memory cost).
    pub fn link_queued_bytes(&self, link: LinkId) -> usize {
        self.links.get(&link).map_or(0, |l| l.out.bytes())
    }

    /// Bytes queued for `link` other than `DATA`: what a client link's share holds.
    pub fn link_share_bytes(&self, link: LinkId) -> usize {
        self.links.get(&link).map_or(0, |l| l.out.non_data_bytes())
    }

    /// Streams `link` holds (a client link: the streams it opened).
    pub fn link_stream_count(&self, link: LinkId) -> usize {
        self.links.get(&link).map_or(0, |l| l.streams.len())
    }

    /// Addresses the relay keeps state for (links, pending `OPEN`s, or a failure bucket not
    /// yet full again).
    pub fn tracked_addresses(&self) -> usize {
        self.per_addr.len()
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

    /// Traffic across relay-to-relay links so far.
    pub fn forwarded(&self) -> Forwarded {
        self.forwarded
    }

    /// Move the router's clock to `now` (never back). Every input that carries `now` does
    /// it; a driver calls it before inputs that do not ([`link_closed`](Self::link_closed),
    /// [`remove_environment`](Self::remove_environment), [`handle_pong`](Self::handle_pong)),
    /// so that an idle clock started by them starts at the right time.
    pub fn tick(&mut self, now: Instant) {
        self.clock = Some(self.clock.map_or(now, |c| c.max(now)));
    }

    /// Ask `link` for proof of life (a ping now); unless it answers within the environment
    /// probe timeout it is closed (`keepalive_timeout`). [`RouterEvent::ProbeAnswered`] says
    /// it answered. For an environment's holder when another link claims its id.
    pub fn probe(&mut self, now: Instant, link: LinkId) {
        self.tick(now);
        let timeout = self.cfg.environment_probe_timeout;
        if let Some(l) = self.links.get_mut(&link) {
            l.keepalive.probe(now, timeout);
            self.wake(link);
            self.events.push_back(RouterEvent::Rearm { link });
        }
    }

    // ---- timers --------------------------------------------------------------------------

    /// When [`handle_timeout`](Self::handle_timeout) must next be called for `link`: its
    /// keepalive, or (a client link holding no stream) its idle deadline.
    pub fn poll_timeout(&self, link: LinkId) -> Option<Instant> {
        let l = self.links.get(&link)?;
        let idle = l.idle_since.map(|t| t + self.cfg.idle_link_timeout);
        [l.keepalive.poll_timeout(), idle]
            .into_iter()
            .flatten()
            .min()
    }

    /// Advance `link`'s timers to `now`: a ping may become due (its writer is woken), or the
    /// link dead (closed), or idle for too long (a client link with no stream: closed).
    pub fn handle_timeout(&mut self, now: Instant, link: LinkId) {
        self.tick(now);
        let Some(l) = self.links.get_mut(&link) else {
            return;
        };
        l.keepalive.handle_timeout(now);
        if l.keepalive.is_dead() {
            self.close_link(link, CloseReason::KeepaliveTimeout);
        } else if l
            .idle_since
            .is_some_and(|t| now >= t + self.cfg.idle_link_timeout)
        {
            self.close_link(link, CloseReason::Idle);
        } else if l.keepalive.wants_ping() {
            self.wake(link);
        }
    }

    /// A WebSocket pong arrived on `link`.
    pub fn handle_pong(&mut self, link: LinkId, payload: &[u8]) {
        if let Some(l) = self.links.get_mut(&link) {
            let probing = l.keepalive.probing();
            l.keepalive.on_pong(payload);
            if probing && !l.keepalive.probing() {
                self.events.push_back(RouterEvent::ProbeAnswered { link });
            }
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
        let before = l.out.bytes();
        match l.out.pop() {
            Some(f) => {
                self.queued_bytes -= before - l.out.bytes();
                self.counters.frames_out[f.ftype as usize] += 1;
                if f.ftype == crate::frame::FrameType::Data {
                    self.counters.data_bytes_out += f.payload.len() as u64;
                    if l.forward {
                        self.forwarded.bytes += f.payload.len() as u64;
                    }
                } else if f.ftype == crate::frame::FrameType::Open && l.forward {
                    self.forwarded.streams += 1;
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

    /// Queue `f` on `link`. On a client link, everything but `DATA` counts against its
    /// share: a frame that would pass it closes the link instead (`control_queue_full`: the
    /// peer is not reading what is queued for it).
    fn enqueue(&mut self, link: LinkId, f: Frame, lane: Lane) {
        let share = self.cfg.client_link_share_bytes;
        let Some(l) = self.links.get_mut(&link) else {
            return;
        };
        if l.kind == LinkKind::Client && !matches!(lane, Lane::Data) {
            let adds = match lane {
                Lane::Ack => l.out.ack_cost(&f.stream),
                _ => queue::cost(&f),
            };
            if l.out.non_data_bytes().saturating_add(adds) > share {
                self.close_link(link, CloseReason::ControlQueueFull);
                return;
            }
        }
        self.queued_bytes += match lane {
            Lane::Control => l.out.push_control(f),
            Lane::Ack => l.out.push_ack(f),
            Lane::Data => l.out.push_data(f),
            Lane::AfterData => l.out.push_reset_after_data(f),
        };
        self.wake(link);
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
