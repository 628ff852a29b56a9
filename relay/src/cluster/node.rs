//! One relay's membership of a cluster (tokio): its NATS connection, one subscription per
//! environment link it holds, lookups for the environments it does not hold, and the
//! relay-to-relay links it dials (forwarding) and admits (holding).
//!
//! The link engine does the data: a forwarding link is registered with the hub in the place
//! of the environment's link ([`RelayHub::add_forward_environment`]), and the holder serves
//! it as one more client link ([`RelayHub::add_relay_client`]).
//!
//! Lifetimes, so nothing goes stale:
//! - a holding (subscription) lives from the environment link's admission to its end;
//! - a forwarding link lives while this relay has client links of its environment (the last
//!   one to end closes it), and when it ends (the holder died or let the environment go) the
//!   client links it served are closed (`moved`): their clients dial again and are found
//!   the environment's new holder;
//! - when a holder's environment link ends, its client links for that environment are closed
//!   (`moved`), relay links included (which ends the forwarders' links in turn): a client
//!   link looks for its environment only when it is made, so its client dials again.
//!
//! It never reads a payload and never awaits NATS on a link's reader.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;

use super::directory::{newest_wins, subject, DirectoryMessage, Holder, Verdict};
use super::relay_link;
use super::ClusterSpec;
use execrelay_io::driver::RelayHub;
use execrelay_protocol::bucket::TokenBucket;
use execrelay_protocol::env_handshake::{LinkRefusal, LinkTimestamps};
use execrelay_protocol::frame::Frame;
use execrelay_protocol::reason::CloseReason;
use execrelay_protocol::router::LinkId;
use execrelay_protocol::sync::lock;

mod forward;

pub use forward::ForwardError;

/// The `RESET` reason of a misrouted stream while the directory (NATS) is unreachable.
pub const REASON_DIRECTORY_UNAVAILABLE: &str = "directory_unavailable";
/// The `RESET` reason of a misrouted stream whose holder could not be reached.
pub const REASON_HOLDER_UNREACHABLE: &str = "holder_unreachable";

/// The bounds of a node, from the relay's settings.
#[derive(Debug, Clone, Copy)]
pub struct NodeLimits {
    /// How long a lookup waits for the holder's answer.
    pub lookup_timeout: Duration,
    /// Lookups in flight at once.
    pub max_lookups: usize,
    /// Lookups started per second (burst the same).
    pub lookups_per_second: u32,
    /// Relay-to-relay links each way.
    pub max_relay_links: usize,
    /// Dial and handshake deadline of a relay-to-relay link.
    pub dial_timeout: Duration,
    /// The relay's frame limit (the relay link's WebSocket).
    pub max_frame_bytes: usize,
    /// Environment links asked to move per second, at most.
    pub moves_per_second: u32,
    /// An environment link younger than this is never asked to move.
    pub move_min_link_age: Duration,
}

/// Counters of one node (its metrics).
#[derive(Debug, Default)]
pub struct ClusterStats {
    /// Lookups asked.
    pub lookups: AtomicU64,
    /// Lookups that found no holder (no answer in time, or no subscriber).
    pub lookup_misses: AtomicU64,
    /// Lookups that could not be asked (NATS unreachable, or a bound).
    pub lookup_failures: AtomicU64,
    /// Lookups answered by this relay (it held the environment).
    pub lookups_answered: AtomicU64,
    /// Relay-to-relay links dialled (forwarding).
    pub forward_links: AtomicU64,
    /// Relay-to-relay links that could not be dialled or were refused by the holder.
    pub forward_failures: AtomicU64,
    /// Relay-to-relay links admitted (holding).
    pub relay_links_admitted: AtomicU64,
    /// Relay-to-relay links refused (bad handshake, unknown key, bound).
    pub relay_links_refused: AtomicU64,
    /// This relay's environment links closed because a newer link elsewhere claimed the id.
    pub takeovers: AtomicU64,
    /// Environment links asked to re-dial because their home moved.
    pub moves: AtomicU64,
    /// Directory messages ignored (too large, unparsable).
    pub directory_ignored: AtomicU64,
    /// Client links that carried the front's header from a peer not in `trusted_front`: the
    /// header was ignored.
    pub front_header_ignored: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// Where an environment is, as the directory says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Located {
    /// A relay holds it.
    Holder(Holder),
    /// Nobody answered: no relay holds it.
    Nowhere,
    /// The directory cannot be asked (NATS unreachable): a misroute fails fast.
    Unavailable(String),
    /// A bound of this relay refused the lookup.
    Busy,
}

/// An environment link this relay holds, as the directory knows it.
struct Holding {
    link: LinkId,
    started: Instant,
    task: JoinHandle<()>,
    /// Our own claim has come back through the subscription: NATS has the subscription in
    /// place, so lookups for the environment are answered from now on.
    live: Arc<AtomicBool>,
}

/// One relay's membership.
pub struct ClusterNode {
    spec: ClusterSpec,
    limits: NodeLimits,
    client: async_nats::Client,
    holdings: Mutex<HashMap<String, Holding>>,
    /// Forwarding links by environment: the hub link standing for the environment here.
    forwards: Mutex<HashMap<String, LinkId>>,
    lookups: Arc<Semaphore>,
    lookup_rate: Mutex<TokenBucket>,
    links_out: Arc<Semaphore>,
    links_in: Arc<Semaphore>,
    stamps: Mutex<LinkTimestamps>,
    last_ts: AtomicU64,
    /// Moves waiting for their turn (at most [`super::MAX_PENDING_MOVES`]; one per
    /// environment).
    moves: tokio::sync::mpsc::Sender<(String, LinkId)>,
    pending_moves: Mutex<std::collections::HashSet<String>>,
    /// Counters.
    pub stats: ClusterStats,
}

impl std::fmt::Debug for ClusterNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterNode")
            .field("node", &self.spec.node_id)
            .finish_non_exhaustive()
    }
}

/// Reconnection delay to NATS after `attempts` failures: 100 ms doubling to 2 s, so that a
/// directory that comes back is used again within 2 s.
fn reconnect_delay(attempts: usize) -> Duration {
    let ms = 100u64.saturating_mul(1u64 << attempts.min(5));
    Duration::from_millis(ms.min(2_000))
}

impl ClusterNode {
    /// Join: connect to NATS in the background (the relay serves affine traffic without it).
    pub async fn start(
        spec: ClusterSpec,
        limits: NodeLimits,
        stamps: LinkTimestamps,
        hub: RelayHub,
    ) -> Result<Arc<ClusterNode>, async_nats::ConnectError> {
        let node = spec.node_id.clone();
        let url = spec.nats_url.clone();
        // Said once per outage (a warning naming the URL and what to check), then quietly:
        // the client retries every 2 s at most, and the log would be that and nothing else.
        let said = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let client = async_nats::ConnectOptions::new()
            .name(format!("execrelay-relay/{node}"))
            .retry_on_initial_connect()
            .max_reconnects(None)
            .connection_timeout(Duration::from_millis(super::NATS_CONNECT_TIMEOUT_MS))
            .reconnect_delay_callback(reconnect_delay)
            .event_callback(move |ev| {
                let (node, url, said) = (node.clone(), url.clone(), said.clone());
                async move {
                    match ev {
                        async_nats::Event::Connected => {
                            said.store(false, Ordering::Relaxed);
                            tracing::info!(%node, %url, "cluster directory (NATS) connected")
                        }
                        async_nats::Event::ClientError(e) if !said.swap(true, Ordering::Relaxed) => {
                            tracing::warn!(
                                %node,
                                error = %e,
                                "cluster directory (NATS) at {url} cannot be reached: misrouted client links are refused (directory_unavailable) until it can, affine ones keep working; check --cluster (is nats-server running there, on that port?) — retrying every 2 s at most"
                            )
                        }
                        async_nats::Event::ClientError(e) => {
                            tracing::debug!(%node, error = %e, "cluster directory (NATS) still unreachable")
                        }
                        async_nats::Event::Disconnected => tracing::warn!(
                            %node,
                            "cluster directory (NATS) disconnected: affine links keep working, misrouted clients are refused until it is back"
                        ),
                        other => tracing::info!(%node, event = %other, "cluster directory (NATS)"),
                    }
                }
            })
            .connect(spec.nats_url.as_str())
            .await?;
        let (moves, moves_rx) = tokio::sync::mpsc::channel(super::MAX_PENDING_MOVES);
        let node = Arc::new(ClusterNode {
            moves,
            pending_moves: Mutex::new(std::collections::HashSet::new()),
            lookups: Arc::new(Semaphore::new(limits.max_lookups)),
            lookup_rate: Mutex::new(TokenBucket::per_second(
                limits.lookups_per_second,
                Instant::now(),
            )),
            links_out: Arc::new(Semaphore::new(limits.max_relay_links)),
            links_in: Arc::new(Semaphore::new(limits.max_relay_links)),
            spec,
            limits,
            client,
            holdings: Mutex::new(HashMap::new()),
            forwards: Mutex::new(HashMap::new()),
            stamps: Mutex::new(stamps),
            last_ts: AtomicU64::new(0),
            stats: ClusterStats::default(),
        });
        tokio::spawn(mover(Arc::downgrade(&node), hub, moves_rx));
        Ok(node)
    }

    /// The front sends `env`'s clients here while another relay holds it: tell the holder
    /// (a `home` notice; it moves the environment at its bounded rate). Bounded by the
    /// lookup rate.
    pub fn announce_home(&self, env: &str) {
        if !self.directory_up() || !lock(&self.lookup_rate).take(Instant::now()) {
            return;
        }
        let msg = DirectoryMessage::Home {
            node: self.spec.node_id.clone(),
        };
        let (client, subj) = (self.client.clone(), subject(env));
        tokio::spawn(async move {
            let _ = client.publish(subj, msg.encode().into()).await;
        });
    }

    /// A `home` notice for `env` held here by `link`: queue its move (once).
    fn queue_move(&self, env: &str, link: LinkId, age: Duration) {
        if age < self.limits.move_min_link_age {
            tracing::debug!(
                env,
                age_ms = age.as_millis() as u64,
                "home notice: link too young to move"
            );
            return;
        }
        if !lock(&self.pending_moves).insert(env.to_string()) {
            return;
        }
        if self.moves.try_send((env.to_string(), link)).is_err() {
            lock(&self.pending_moves).remove(env);
        }
    }

    /// A client link carried the front's header from a peer that is not a trusted front:
    /// it was ignored (counted, logged at debug).
    pub fn front_header_ignored(&self) {
        bump(&self.stats.front_header_ignored);
    }

    /// This relay's node id.
    pub fn node_id(&self) -> &str {
        &self.spec.node_id
    }

    /// Whether NATS is connected now.
    pub fn directory_up(&self) -> bool {
        self.client.connection_state() == async_nats::connection::State::Connected
    }

    /// Environments held whose directory subscription is in place (lookups find them).
    pub fn holdings(&self) -> usize {
        lock(&self.holdings)
            .values()
            .filter(|h| h.live.load(Ordering::Relaxed))
            .count()
    }

    /// Forwarding links up.
    pub fn forwards(&self) -> usize {
        lock(&self.forwards).len()
    }

    /// A stamp for message 1 of a relay link, above every earlier one of this relay.
    fn next_ts(&self) -> u64 {
        let now = execrelay_protocol::replay::unix_micros(std::time::SystemTime::now());
        let prev = self
            .last_ts
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |last| {
                Some(now.max(last + 1))
            })
            .unwrap_or(0);
        now.max(prev + 1)
    }

    // ---- holding ------------------------------------------------------------------------

    /// This relay has just admitted `env`'s environment link `link`: subscribe to its
    /// subject (lookups are answered from now on), and claim it (an older holder elsewhere
    /// yields).
    pub fn hold(self: &Arc<Self>, hub: &RelayHub, env: &str, link: LinkId) {
        let since_us = execrelay_protocol::replay::unix_micros(std::time::SystemTime::now());
        let me = self.clone();
        let (hub, env_owned) = (hub.clone(), env.to_string());
        let live = Arc::new(AtomicBool::new(false));
        let live_here = live.clone();
        let task = tokio::spawn(async move {
            me.serve_subject(hub, env_owned, link, since_us, live_here)
                .await;
        });
        let old = lock(&self.holdings).insert(
            env.to_string(),
            Holding {
                link,
                started: Instant::now(),
                task,
                live,
            },
        );
        if let Some(old) = old {
            old.task.abort();
        }
    }

    /// `env`'s link `link` ended: unsubscribe (if the holding is still this link's), and
    /// close the environment's client links here, relay-to-relay links included (`moved`):
    /// in a cluster the environment may re-dial to another relay, and a client link only
    /// looks for its environment when it is made, so each client dials again (through the
    /// front, resuming its sessions) and is sent to wherever the environment is next.
    pub fn release(&self, hub: &RelayHub, env: &str, link: LinkId) {
        let mut h = lock(&self.holdings);
        if h.get(env).is_some_and(|x| x.link == link) {
            if let Some(x) = h.remove(env) {
                x.task.abort();
            }
        }
        drop(h);
        if hub.environment_link(env).is_none() {
            hub.close_clients(env, CloseReason::Moved);
        }
    }

    async fn serve_subject(
        self: Arc<Self>,
        hub: RelayHub,
        env: String,
        link: LinkId,
        since_us: u64,
        live: Arc<AtomicBool>,
    ) {
        let subj = subject(&env);
        let mut sub = match self.client.subscribe(subj.clone()).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(env = %env, error = %e, "cannot subscribe to the directory: lookups for this environment go unanswered");
                return;
            }
        };
        let claim = DirectoryMessage::Claim {
            node: self.spec.node_id.clone(),
            since_us,
        };
        if let Err(e) = self
            .client
            .publish(subj.clone(), claim.encode().into())
            .await
        {
            tracing::warn!(env = %env, error = %e, "cannot claim the environment in the directory");
        }
        let mut reasserts = 0u32;
        while let Some(msg) = sub.next().await {
            let parsed = match DirectoryMessage::decode(&msg.payload) {
                Ok(m) => m,
                Err(e) => {
                    bump(&self.stats.directory_ignored);
                    tracing::debug!(env = %env, error = %e, "directory message ignored");
                    continue;
                }
            };
            match parsed {
                DirectoryMessage::Lookup => {
                    let Some(reply) = msg.reply else { continue };
                    let age_ms = lock(&self.holdings)
                        .get(&env)
                        .filter(|h| h.link == link)
                        .map(|h| h.started.elapsed().as_millis() as u64);
                    let Some(age_ms) = age_ms else { return };
                    let answer = Holder {
                        node: self.spec.node_id.clone(),
                        addr: self.spec.advertise.clone(),
                        age_ms,
                        since_us,
                    };
                    bump(&self.stats.lookups_answered);
                    let _ = self.client.publish(reply, answer.encode().into()).await;
                }
                DirectoryMessage::Home { node } => {
                    if node == self.spec.node_id || hub.environment_link(&env) != Some(link) {
                        continue;
                    }
                    let age = lock(&self.holdings)
                        .get(&env)
                        .filter(|h| h.link == link)
                        .map(|h| h.started.elapsed());
                    if let Some(age) = age {
                        tracing::info!(env = %env, home = %node, "the front now sends this environment's clients to another relay: moving it there");
                        self.queue_move(&env, link, age);
                    }
                }
                DirectoryMessage::Claim {
                    node,
                    since_us: theirs,
                } => match newest_wins(&self.spec.node_id, since_us, &node, theirs) {
                    Verdict::Keep => {
                        if theirs == since_us {
                            live.store(true, Ordering::Relaxed);
                        }
                    }
                    Verdict::Reassert => {
                        if reasserts < super::MAX_CLAIM_REASSERTS
                            && hub.environment_link(&env) == Some(link)
                        {
                            reasserts += 1;
                            tracing::debug!(env = %env, older = %node, "an older holder claimed this environment: claiming it again so that it yields");
                            let _ = self
                                .client
                                .publish(subj.clone(), claim.encode().into())
                                .await;
                        }
                    }
                    Verdict::Yield if hub.environment_link(&env) == Some(link) => {
                        bump(&self.stats.takeovers);
                        tracing::info!(
                            env = %env,
                            newer = %node,
                            "a newer link of this environment is up on another relay: closing ours (replaced)"
                        );
                        hub.close_environment(&env, CloseReason::Replaced);
                        return;
                    }
                    Verdict::Yield => {}
                },
            }
        }
    }

    // ---- looking up ---------------------------------------------------------------------

    /// Ask the directory where `env` is, within the lookup timeout and bounds.
    pub async fn locate(&self, env: &str) -> Located {
        if !lock(&self.lookup_rate).take(Instant::now()) {
            bump(&self.stats.lookup_failures);
            return Located::Busy;
        }
        let Ok(_permit) = self.lookups.clone().try_acquire_owned() else {
            bump(&self.stats.lookup_failures);
            return Located::Busy;
        };
        if !self.directory_up() {
            bump(&self.stats.lookup_failures);
            return Located::Unavailable("the cluster directory (NATS) is unreachable".into());
        }
        bump(&self.stats.lookups);
        let req = self
            .client
            .request(subject(env), DirectoryMessage::Lookup.encode().into());
        match tokio::time::timeout(self.limits.lookup_timeout, req).await {
            Err(_) => {
                bump(&self.stats.lookup_misses);
                Located::Nowhere
            }
            Ok(Ok(msg)) => match Holder::decode(&msg.payload) {
                Ok(h) => Located::Holder(h),
                Err(e) => {
                    bump(&self.stats.directory_ignored);
                    bump(&self.stats.lookup_misses);
                    tracing::warn!(env, error = %e, "bad directory answer ignored");
                    Located::Nowhere
                }
            },
            Ok(Err(e)) => match e.kind() {
                async_nats::RequestErrorKind::NoResponders
                | async_nats::RequestErrorKind::TimedOut => {
                    bump(&self.stats.lookup_misses);
                    Located::Nowhere
                }
                async_nats::RequestErrorKind::Other => {
                    bump(&self.stats.lookup_failures);
                    Located::Unavailable(format!("the cluster directory (NATS) failed: {e}"))
                }
            },
        }
    }

    // ---- holding's side of relay links ---------------------------------------------------

    /// A slot for one more relay link admitted here.
    pub fn relay_link_slot(&self) -> Option<OwnedSemaphorePermit> {
        self.links_in.clone().try_acquire_owned().ok()
    }

    /// Admit a relay link's message 1 for `env` ([`relay_link::admit`]).
    pub fn admit_relay_link(
        &self,
        env: &str,
        open: &Frame,
    ) -> Result<relay_link::AdmittedRelay, LinkRefusal> {
        let mut stamps = lock(&self.stamps);
        let r = relay_link::admit(
            &self.spec.node_keys,
            &self.spec.node_id,
            env,
            open,
            &self.spec.keys,
            &mut stamps,
            execrelay_protocol::replay::unix_micros(std::time::SystemTime::now()),
            crate::RELAY_VERSION,
        );
        match &r {
            Ok(_) => bump(&self.stats.relay_links_admitted),
            Err(_) => bump(&self.stats.relay_links_refused),
        }
        r
    }

    /// Close the NATS connection (shutdown): subscriptions go with it.
    pub async fn leave(&self) {
        for (_, h) in lock(&self.holdings).drain() {
            h.task.abort();
        }
        let _ = self.client.drain().await;
    }
}

/// Ask queued environments to move, one every `1 / moves_per_second`: their links close
/// (`moved`) and the exec servers re-dial through the front, which sends them home.
async fn mover(
    node: std::sync::Weak<ClusterNode>,
    hub: RelayHub,
    mut rx: tokio::sync::mpsc::Receiver<(String, LinkId)>,
) {
    let per_second = node
        .upgrade()
        .map_or(1, |n| n.limits.moves_per_second.max(1));
    let mut tick = tokio::time::interval(Duration::from_secs(1) / per_second);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while let Some((env, link)) = rx.recv().await {
        tick.tick().await;
        let Some(n) = node.upgrade() else { return };
        lock(&n.pending_moves).remove(&env);
        if hub.environment_link(&env) == Some(link) && !n.is_forward(&env, link) {
            bump(&n.stats.moves);
            tracing::info!(env = %env, "environment link closed (moved): it re-dials to its new home");
            hub.close_environment(&env, CloseReason::Moved);
        }
    }
}
