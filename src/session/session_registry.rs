//! Sessions and the registry every connection of a server shares.
//!
//! The registry owns sessions; a session owns its processes and knows which connection (if
//! any) it is attached to. It owns the lifecycle of `processes.md` §5: create on
//! `initialize`, detach when a connection ends, resume (evicting a connection that still holds
//! the session), expire after `detachedSessionTtlMs` detached, and close (terminating every
//! process group). It must never write to a transport: delivery goes through the attached
//! connection's [`ReadySet`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use base64::Engine;
use subtle::ConstantTimeEq;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::ServerConfig;
use crate::metrics::{Metrics, StateSnapshot};
use crate::process::event_log::LogLimits;
use crate::process::output_pump::start_process;
use crate::process::spawn::SpawnSpec;
use crate::process::ReadySet;
use crate::process::{ManagedProcess, ProcessOptions};
use crate::sync::lock;

/// Failures of session and process bookkeeping; mapped to JSON-RPC codes in
/// `connection/error_map.rs`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    /// Unknown or expired session, or a wrong token (deliberately one variant).
    #[error("unknown or expired session, or wrong resume token")]
    UnknownSession,
    /// `maxSessions` reached.
    #[error("too many sessions ({0})")]
    TooManySessions(usize),
    /// `maxProcesses` reached for this session.
    #[error("too many processes ({0})")]
    TooManyProcesses(usize),
    /// The process id is taken.
    #[error("process id {0:?} already exists")]
    ProcessExists(String),
    /// No such process.
    #[error("unknown process id {0:?}")]
    UnknownProcess(String),
    /// The OS refused to start the child.
    #[error("spawn failed: {0}")]
    Spawn(std::io::Error),
}

/// A validated `process/start`: what to spawn and how to run it. The connection's handler
/// decodes and validates the params and applies the defaults; the session never sees JSON.
#[derive(Debug, Clone)]
pub struct StartSpec {
    /// The client-chosen id (1 to `MAX_PROCESS_ID_BYTES` bytes).
    pub process_id: String,
    /// What to spawn.
    pub spawn: SpawnSpec,
    /// How to run it (timeouts, caps, grace).
    pub options: ProcessOptions,
}

/// What a connection brings when it attaches a session.
#[derive(Clone)]
pub struct ConnHandle {
    /// Unique per server.
    pub conn_id: u64,
    /// Where the session's events go while attached.
    pub ready: Arc<ReadySet>,
    /// Cancelled when another connection takes the session over.
    pub evict: CancellationToken,
    /// The client's static public key on a Noise channel (sessions are bound to it).
    pub peer_key: Option<Vec<u8>>,
}

enum Slot {
    Starting,
    Ready(Arc<ManagedProcess>),
}

struct AttachState {
    current: Option<ConnHandle>,
    /// Bumped on every attach and detach, so an old expiry timer can tell it is stale.
    generation: u64,
}

/// A session: processes and their retained output, outliving connections.
pub struct Session {
    /// Public id.
    pub id: String,
    token: Vec<u8>,
    /// The client acknowledges events.
    pub acks: bool,
    peer_key: Option<Vec<u8>>,
    config: Arc<ServerConfig>,
    processes: Mutex<HashMap<String, Slot>>,
    attach: Mutex<AttachState>,
    registry: Weak<SessionRegistry>,
    closed: CancellationToken,
}

/// All sessions of one server.
pub struct SessionRegistry {
    config: Arc<ServerConfig>,
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    started: Instant,
    next_conn: AtomicU64,
    metrics: Arc<Metrics>,
}

fn random_bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    // The OS generator failing is not recoverable for a server that must issue secrets.
    if let Err(e) = getrandom::getrandom(&mut b) {
        panic!("OS random generator failed: {e}");
    }
    b
}

impl SessionRegistry {
    /// A fresh registry counting into `metrics` (one per server: the caller builds it, the
    /// metrics endpoint renders it).
    pub fn new(config: Arc<ServerConfig>, metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(SessionRegistry {
            config,
            sessions: Mutex::new(HashMap::new()),
            started: Instant::now(),
            next_conn: AtomicU64::new(1),
            metrics,
        })
    }

    /// This server's metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Count what the registry holds now (the read gauges of the metrics).
    pub fn stats(&self) -> StateSnapshot {
        let sessions: Vec<Arc<Session>> = lock(&self.sessions).values().cloned().collect();
        let mut st = StateSnapshot::default();
        for s in sessions {
            if s.is_attached() {
                st.sessions_attached += 1;
            } else {
                st.sessions_detached += 1;
            }
            for p in s.processes() {
                let ps = p.stats();
                if ps.exited {
                    st.processes_exited += 1;
                } else {
                    st.processes_running += 1;
                }
                st.retained_output_bytes += ps.retained_bytes;
            }
        }
        st
    }

    /// The configuration in force.
    pub fn config(&self) -> &Arc<ServerConfig> {
        &self.config
    }

    /// A new connection id.
    pub fn next_conn_id(&self) -> u64 {
        self.next_conn.fetch_add(1, Ordering::Relaxed)
    }

    /// Time since the registry was created.
    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    /// Look a session up by id (operators' tools and tests; clients resume instead).
    pub fn session(&self, id: &str) -> Option<Arc<Session>> {
        lock(&self.sessions).get(id).cloned()
    }

    /// Number of sessions.
    pub fn session_count(&self) -> usize {
        lock(&self.sessions).len()
    }

    /// Number of processes known across sessions.
    pub fn process_count(&self) -> usize {
        let sessions: Vec<Arc<Session>> = lock(&self.sessions).values().cloned().collect();
        sessions.iter().map(|s| s.process_count()).sum()
    }

    /// Create a session attached to `conn`. Returns it and its resume token (the only time
    /// the token leaves the server).
    pub fn create(
        self: &Arc<Self>,
        acks: bool,
        conn: &ConnHandle,
    ) -> Result<(Arc<Session>, String), SessionError> {
        let token = random_bytes::<32>();
        let id = format!("s-{}", hex(&random_bytes::<16>()));
        let session = Arc::new(Session {
            id: id.clone(),
            token: token.to_vec(),
            acks,
            peer_key: conn.peer_key.clone(),
            config: self.config.clone(),
            processes: Mutex::new(HashMap::new()),
            attach: Mutex::new(AttachState {
                current: Some(conn.clone()),
                generation: 1,
            }),
            registry: Arc::downgrade(self),
            closed: CancellationToken::new(),
        });
        {
            let mut sessions = lock(&self.sessions);
            if sessions.len() >= self.config.max_sessions {
                return Err(SessionError::TooManySessions(self.config.max_sessions));
            }
            sessions.insert(id, session.clone());
        }
        let token = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(token);
        Ok((session, token))
    }

    /// Re-attach a session to `conn`, evicting the connection that holds it, if any.
    pub fn resume(
        &self,
        session_id: &str,
        token: &str,
        conn: &ConnHandle,
    ) -> Result<Arc<Session>, SessionError> {
        let session = lock(&self.sessions).get(session_id).cloned();
        // Decode failures and unknown ids take the same path as a wrong token.
        let given = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(token)
            .unwrap_or_default();
        let Some(session) = session else {
            return Err(SessionError::UnknownSession);
        };
        let token_ok: bool = session.token.as_slice().ct_eq(given.as_slice()).into();
        let key_ok = match (&session.peer_key, &conn.peer_key) {
            (None, None) => true,
            (Some(a), Some(b)) => bool::from(a.as_slice().ct_eq(b.as_slice())),
            _ => false,
        };
        if !token_ok || !key_ok || session.closed.is_cancelled() {
            return Err(SessionError::UnknownSession);
        }
        session.attach(conn);
        Ok(session)
    }

    fn remove(&self, id: &str) {
        lock(&self.sessions).remove(id);
    }

    /// Close every session (stdio end, server shutdown): every process group is terminated.
    pub fn close_all(&self) {
        let sessions: Vec<Arc<Session>> = lock(&self.sessions).drain().map(|(_, s)| s).collect();
        for s in sessions {
            s.close();
        }
    }

    /// Graceful shutdown: terminate every process with its grace period, wait (bounded) for
    /// exit notices to reach attached clients, then close everything.
    pub async fn shutdown(&self, delivery_grace: Duration) {
        let sessions: Vec<Arc<Session>> = lock(&self.sessions).values().cloned().collect();
        let mut waits = Vec::new();
        let mut longest = Duration::ZERO;
        for s in &sessions {
            for p in s.processes() {
                p.terminate(None);
                longest = longest.max(p.opts.kill_grace + p.opts.drain_timeout);
                let attached = s.is_attached();
                waits.push(async move {
                    p.wait_finished().await;
                    if attached {
                        // Written to the transport is enough here: the server is going away,
                        // so an ack could not release anything anyway.
                        p.wait_exit_delivered(false).await;
                    }
                });
            }
        }
        let all = futures_util::future::join_all(waits);
        let _ = tokio::time::timeout(longest + delivery_grace, all).await;
        self.close_all();
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl Session {
    /// Whether a connection holds the session.
    pub fn is_attached(&self) -> bool {
        lock(&self.attach).current.is_some()
    }

    /// Whether `conn_id` holds the session.
    pub fn is_attached_to(&self, conn_id: u64) -> bool {
        lock(&self.attach)
            .current
            .as_ref()
            .is_some_and(|c| c.conn_id == conn_id)
    }

    /// Attach to `conn`: evict the previous holder, re-deliver every unacknowledged retained
    /// event, then live ones.
    fn attach(&self, conn: &ConnHandle) {
        let mut st = lock(&self.attach);
        if let Some(old) = st.current.take() {
            if old.conn_id != conn.conn_id {
                old.evict.cancel();
            }
        }
        st.current = Some(conn.clone());
        st.generation += 1;
        for p in self.processes() {
            p.attach_delivery(Some(conn.ready.clone()), true);
        }
    }

    /// The connection `conn_id` ended. If it still held the session, detach and arm the
    /// expiry timer.
    pub fn detach(self: &Arc<Self>, conn_id: u64) {
        if self.closed.is_cancelled() {
            return; // closed on purpose (`session/close`): nothing to keep
        }
        let generation = {
            let mut st = lock(&self.attach);
            match &st.current {
                Some(c) if c.conn_id == conn_id => {}
                _ => return,
            }
            st.current = None;
            st.generation += 1;
            for p in self.processes() {
                p.set_delivery(None);
            }
            st.generation
        };
        let ttl = self.config.detached_ttl();
        // The deadline is fixed now, not when the timer task first runs.
        let deadline = Instant::now() + ttl;
        let me = Arc::downgrade(self);
        tracing::info!(session = %self.id, ttl_ms = ttl.as_millis() as u64, "session detached");
        tokio::spawn(async move {
            tokio::time::sleep_until(deadline).await;
            let Some(s) = me.upgrade() else { return };
            let stale = {
                let st = lock(&s.attach);
                st.generation != generation || st.current.is_some()
            };
            if !stale {
                tracing::info!(session = %s.id, "detached session expired");
                s.close();
            }
        });
    }

    /// Close: terminate every process group, free the session.
    pub fn close(&self) {
        self.closed.cancel();
        if let Some(r) = self.registry.upgrade() {
            r.remove(&self.id);
        }
        let procs: Vec<Arc<ManagedProcess>> = lock(&self.processes)
            .drain()
            .filter_map(|(_, s)| match s {
                Slot::Ready(p) => Some(p),
                Slot::Starting => None,
            })
            .collect();
        for p in procs {
            p.abandon();
        }
    }

    /// Whether the session was closed.
    pub fn is_closed(&self) -> bool {
        self.closed.is_cancelled()
    }

    /// Resolves when the session is closed.
    pub async fn closed(&self) {
        self.closed.cancelled().await
    }

    /// Processes currently known.
    pub fn processes(&self) -> Vec<Arc<ManagedProcess>> {
        lock(&self.processes)
            .values()
            .filter_map(|s| match s {
                Slot::Ready(p) => Some(p.clone()),
                Slot::Starting => None,
            })
            .collect()
    }

    /// How many process ids are taken.
    pub fn process_count(&self) -> usize {
        lock(&self.processes).len()
    }

    /// Find a process.
    pub fn get(&self, id: &str) -> Result<Arc<ManagedProcess>, SessionError> {
        match lock(&self.processes).get(id) {
            Some(Slot::Ready(p)) => Ok(p.clone()),
            _ => Err(SessionError::UnknownProcess(id.to_string())),
        }
    }

    /// Start a process for connection `conn_id`. Its events are not delivered until
    /// [`enable_delivery`](Self::enable_delivery) (after the start result is written).
    pub fn start(
        self: &Arc<Self>,
        start: StartSpec,
        conn_id: u64,
    ) -> Result<Arc<ManagedProcess>, SessionError> {
        let StartSpec {
            process_id: id,
            spawn: spec,
            options: opts,
        } = start;
        // The registry outlives its sessions except while the server shuts down.
        let metrics = match self.registry.upgrade() {
            Some(r) => r.metrics.clone(),
            None => return Err(SessionError::UnknownSession),
        };
        {
            let mut procs = lock(&self.processes);
            if procs.contains_key(&id) {
                return Err(SessionError::ProcessExists(id));
            }
            if procs.len() >= self.config.max_processes {
                return Err(SessionError::TooManyProcesses(self.config.max_processes));
            }
            procs.insert(id.clone(), Slot::Starting);
        }
        let limits = LogLimits {
            retained_bytes: self.config.retained_output_bytes,
            delivery_queue_bytes: self.config.delivery_queue_bytes,
        };
        let proc = match start_process(id.clone(), &spec, opts, limits, self.acks, metrics) {
            Ok(p) => p,
            Err(e) => {
                lock(&self.processes).remove(&id);
                return Err(SessionError::Spawn(e));
            }
        };
        {
            let st = lock(&self.attach);
            let mut procs = lock(&self.processes);
            if self.closed.is_cancelled() {
                drop(procs);
                drop(st);
                proc.abandon();
                return Err(SessionError::UnknownSession);
            }
            procs.insert(id.clone(), Slot::Ready(proc.clone()));
            // If the session moved to another connection while we spawned, the start result
            // will never reach that client's stream in order anyway: deliver there now.
            if let Some(cur) = &st.current {
                if cur.conn_id != conn_id {
                    proc.set_delivery(Some(cur.ready.clone()));
                }
            }
        }
        self.spawn_reaper(proc.clone());
        Ok(proc)
    }

    /// Open event delivery of `p` to connection `conn_id`, if it still holds the session.
    pub fn enable_delivery(&self, p: &Arc<ManagedProcess>, conn_id: u64) {
        let st = lock(&self.attach);
        if let Some(cur) = &st.current {
            if cur.conn_id == conn_id {
                p.set_delivery(Some(cur.ready.clone()));
            }
        }
    }

    /// Remove an exited process once its exit notice was acknowledged (acks) or
    /// `exitedRetentionMs` after it was written (no acks).
    fn spawn_reaper(self: &Arc<Self>, p: Arc<ManagedProcess>) {
        let me = Arc::downgrade(self);
        let acks = self.acks;
        let retention = Duration::from_millis(self.config.exited_retention_ms);
        let closed = self.closed.clone();
        tokio::spawn(async move {
            let wait = async {
                p.wait_finished().await;
                p.wait_exit_delivered(acks).await;
                if !acks {
                    tokio::time::sleep(retention).await;
                }
            };
            tokio::select! {
                _ = wait => {}
                _ = closed.cancelled() => return,
            }
            if let Some(s) = me.upgrade() {
                let mut procs = lock(&s.processes);
                if let Some(Slot::Ready(cur)) = procs.get(&p.id) {
                    if Arc::ptr_eq(cur, &p) {
                        procs.remove(&p.id);
                    }
                }
            }
        });
    }
}
