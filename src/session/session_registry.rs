//! The registry every connection of a server shares: sessions by id, their creation (with a
//! fresh resume token and a containment scope) and resumption (token and client key checked
//! in constant time), the `maxSessions` limit and the per-client quotas of sessions and
//! processes (`quota.rs`), the server's inbound byte budget, the read gauges of the metrics,
//! the tasks that end closing sessions, and shutdown.
//!
//! It never builds its own [`Metrics`] nor its [`Containment`]: the caller (the composition
//! root) passes them in. It must never write to a transport, and never wait on a duration a
//! client chose beyond the server's caps (`max_kill_grace_ms`, `max_drain_timeout_ms`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::driver::spawn_timers;
use super::error::SessionError;
use super::quota::{AddressKey, Owner};
use super::session::{ConnHandle, Session, Shared};
use super::table::{Limits, SessionTable};
use crate::bounds::ByteBudget;
use crate::config::ServerConfig;
use crate::metrics::{ContainmentStage, Metrics, StateSnapshot};
use crate::policy::PolicyFile;
use crate::process::containment::Containment;
use crate::process::{ManagedProcess, OutputBudget};
use crate::rpc::messages::ExitReason;
use crate::sync::lock;

/// All sessions of one server.
pub struct SessionRegistry {
    shared: Arc<Shared>,
    started: Instant,
    next_conn: AtomicU64,
    /// `max_inbound_bytes`: every connection's request budget and every link's reassembly
    /// budget is a child of it.
    inbound: ByteBudget,
    containment: Containment,
    /// The tasks ending closed sessions (`Session::close`).
    closing: TaskTracker,
    /// The timer task and the stall watchdog start with the first session (on the runtime
    /// that serves it: a registry may be built before its runtime runs).
    tasks: std::sync::Once,
}

/// The name clients see in `data.limit` when the server's inbound budget is full.
pub const INBOUND_BUDGET_NAME: &str = "maxInboundBytes";

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
    /// metrics endpoint renders it), placing every session's processes in a scope of
    /// `containment` (started by the caller: reaper, crash sweep).
    pub fn new(
        config: Arc<ServerConfig>,
        metrics: Arc<Metrics>,
        containment: Containment,
    ) -> Arc<Self> {
        Self::with_exec_policy(config, metrics, containment, None)
    }

    /// A fresh registry whose starts go through `policy` (`--exec-policy`); see
    /// [`new`](Self::new). An approved start spawns into its session's scope like any other;
    /// a denied or withdrawn one spawns nothing.
    pub fn with_exec_policy(
        config: Arc<ServerConfig>,
        metrics: Arc<Metrics>,
        containment: Containment,
        policy: Option<Arc<PolicyFile>>,
    ) -> Arc<Self> {
        let limits = Limits {
            max_sessions: config.max_sessions,
            max_processes: config.max_processes,
            max_sessions_per_key: config.max_sessions_per_key,
            max_sessions_per_address: config.max_sessions_per_address,
            max_processes_per_key: config.max_processes_per_key,
            max_processes_per_address: config.max_processes_per_address,
            exited_retention: Duration::from_millis(config.exited_retention_ms),
            approval_timeout: config.approval_timeout(),
        };
        Arc::new(SessionRegistry {
            shared: Arc::new(Shared {
                budget: OutputBudget::new(config.output_budget_bytes),
                table: Mutex::new(SessionTable::new(limits)),
                wake: Arc::new(Notify::new()),
                metrics,
                policy,
                config: config.clone(),
            }),
            started: Instant::now(),
            next_conn: AtomicU64::new(1),
            inbound: ByteBudget::new(INBOUND_BUDGET_NAME, config.max_inbound_bytes),
            containment,
            closing: TaskTracker::new(),
            tasks: std::sync::Once::new(),
        })
    }

    /// The server's containment.
    pub fn containment(&self) -> &Containment {
        &self.containment
    }

    /// The server's inbound byte budget (`max_inbound_bytes`): connections charge their
    /// requests, and links their unfinished Noise messages, under children of it.
    pub fn inbound_budget(&self) -> &ByteBudget {
        &self.inbound
    }

    /// The server-wide output budget: unwritten output of every process, its peak.
    pub fn output_budget(&self) -> &Arc<OutputBudget> {
        &self.shared.budget
    }

    /// This server's metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.shared.metrics
    }

    /// Count what the registry holds now (the read gauges of the metrics).
    pub fn stats(&self) -> StateSnapshot {
        let sessions = self.all_sessions();
        let c = &self.shared.config;
        let mut st = StateSnapshot {
            sessions_limit: c.max_sessions,
            processes_limit: c.max_processes,
            connections_limit: c.max_connections,
            links_limit: c.max_links,
            ..StateSnapshot::default()
        };
        for s in sessions {
            if s.is_attached() {
                st.sessions_attached += 1;
            } else {
                st.sessions_detached += 1;
            }
            let processes = s.processes();
            st.largest_session_processes = st.largest_session_processes.max(processes.len());
            for p in processes {
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
        &self.shared.config
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
        lock(&self.shared.table).session(id)
    }

    fn all_sessions(&self) -> Vec<Arc<Session>> {
        lock(&self.shared.table).sessions()
    }

    /// Every process of every session, with its session's id (the stall watchdog's round).
    pub fn all_processes(&self) -> Vec<(String, Arc<ManagedProcess>)> {
        self.all_sessions()
            .iter()
            .flat_map(|s| s.processes().into_iter().map(|p| (s.id.clone(), p)))
            .collect()
    }

    /// Number of sessions.
    pub fn session_count(&self) -> usize {
        lock(&self.shared.table).session_count()
    }

    /// Number of processes known across sessions.
    pub fn process_count(&self) -> usize {
        let sessions = self.all_sessions();
        sessions.iter().map(|s| s.process_count()).sum()
    }

    /// Create a session attached to `conn`. Returns it and its resume token (the only time
    /// the token leaves the server).
    pub fn create(
        self: &Arc<Self>,
        acks: bool,
        conn: &ConnHandle,
    ) -> Result<(Arc<Session>, String), SessionError> {
        self.tasks.call_once(|| {
            spawn_timers(Arc::downgrade(&self.shared), self.shared.wake.clone());
            let weak = Arc::downgrade(self);
            super::stall_watchdog::spawn(
                Duration::from_millis(self.config().stall_watchdog_ms),
                self.metrics().clone(),
                Box::new(move || weak.upgrade().map(|r| r.all_processes())),
            );
        });
        let token = random_bytes::<32>();
        let id = format!("s-{}", hex(&random_bytes::<16>()));
        let scope = self.containment.open_scope().map_err(|e| {
            self.shared
                .metrics
                .containment_failure(ContainmentStage::OpenScope);
            SessionError::Containment(e)
        })?;
        let session = Arc::new(Session {
            id: id.clone(),
            acks,
            shared: Arc::downgrade(&self.shared),
            closed: CancellationToken::new(),
            ended_at_close: Default::default(),
            scope,
            closing: self.closing.clone(),
            terminated: CancellationToken::new(),
        });
        let owner = Owner {
            key: conn.peer_key.clone(),
            address: conn.peer_addr.map(AddressKey::of),
        };
        lock(&self.shared.table).create(
            &id,
            session.clone(),
            token.to_vec(),
            owner,
            conn.holder(),
            Duration::from_millis(self.shared.config.detached_session_ttl_ms),
        )?;
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
        // Decode failures and unknown ids take the same path as a wrong token.
        let given = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(token)
            .unwrap_or_default();
        // Under the table's lock, in the table's order: the previous holder evicted, pending
        // requests sent again, then every process delivered to `conn` (the requests are
        // queued on its control lane, which the writer serves first, so they precede every
        // replayed event); the requests `conn` cannot answer are refused after.
        self.shared
            .drive(|t| t.resume(session_id, &given, conn.peer_key.as_deref(), conn.holder()))
    }

    /// Close every session and wait until each has ended everything it started (SIGTERM,
    /// the capped grace, SIGKILL), along with every session closed before.
    pub async fn close_all(&self) {
        for s in self.all_sessions() {
            s.close();
        }
        self.wait_closing().await;
    }

    /// Wait for the sessions being closed (each is bounded by `max_kill_grace_ms` plus the
    /// kill's own bound). The tracker is closed for good: this is for shutdown, and a session
    /// closed later is still tracked and waited for by the next call.
    async fn wait_closing(&self) {
        self.closing.close();
        self.closing.wait().await;
    }

    /// Graceful shutdown (SIGTERM, SIGINT, the end of stdio), before connections end:
    ///
    /// 1. terminate every process (SIGTERM to its group, SIGKILL after its `killGraceMs`,
    ///    never more than `max_kill_grace_ms`);
    /// 2. wait until exit notices reached attached clients, at most the longest capped grace
    ///    plus the longest capped `drainTimeoutMs` plus `delivery_grace`;
    /// 3. wait for sessions already closing (their own capped grace);
    /// 4. kill everything any session started, whatever it became
    ///    ([`Containment::kill_everything`]).
    ///
    /// Nothing here waits on a client's number beyond the server's caps. The in-process
    /// server (`connection/local.rs`) runs the same two halves,
    /// [`terminate_all`](Self::terminate_all) and [`kill_everything`](Self::kill_everything),
    /// each cut to its own deadline.
    pub async fn shutdown(&self, delivery_grace: Duration) {
        self.terminate_all(delivery_grace).await;
        self.kill_everything().await;
    }

    /// Steps 1 and 2 of [`shutdown`](Self::shutdown): terminate every process, and wait
    /// (bounded by the caps and `delivery_grace`) for exit notices to reach attached clients.
    pub async fn terminate_all(&self, delivery_grace: Duration) {
        let sessions = self.all_sessions();
        let max_grace = self.shared.config.max_kill_grace();
        let max_drain = self.shared.config.max_drain_timeout();
        let mut waits = Vec::new();
        let mut terminations = Vec::new();
        let mut longest = Duration::ZERO;
        for s in &sessions {
            for p in s.processes() {
                let grace = p.opts.kill_grace.min(max_grace);
                p.mark_ending(ExitReason::ServerShutdown);
                let q = p.clone();
                // All at once: an exited process's group is looked up in its scope (a walk).
                terminations.push(async move { q.terminate(Some(grace)).await });
                longest = longest.max(grace + p.opts.drain_timeout.min(max_drain));
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
        futures_util::future::join_all(terminations).await;
        let all = futures_util::future::join_all(waits);
        let _ = tokio::time::timeout(longest + delivery_grace, all).await;
    }

    /// Steps 3 and 4 of [`shutdown`](Self::shutdown): wait for sessions already closing, then
    /// kill everything any session started, whatever it became, through containment (every
    /// scope, `cgroup.kill` where available, and what the tree walk finds unattributed).
    pub async fn kill_everything(&self) {
        self.wait_closing().await;
        match self.containment.kill_everything().await {
            Ok(r) if !r.emptied => {
                self.shared
                    .metrics
                    .containment_failure(ContainmentStage::Shutdown);
                tracing::error!(?r, "processes survived SIGKILL at shutdown")
            }
            Ok(r) => tracing::debug!(?r, "every process of every session is gone"),
            Err(e) => {
                self.shared
                    .metrics
                    .containment_failure(ContainmentStage::Shutdown);
                tracing::error!(error = %e, "killing every session's processes failed")
            }
        }
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
