//! The registry every connection of a server shares: sessions by id, their creation (with a
//! fresh resume token and a containment scope) and resumption (token and client key checked
//! in constant time), the `maxSessions` limit and the per-client quotas of sessions and
//! processes (`quota.rs`), the server's inbound byte budget, the read gauges of the metrics,
//! the tasks that end closing sessions, and shutdown.
//!
//! It never builds its own [`Metrics`] nor its [`Containment`]: the caller (the composition
//! root) passes them in. It must never write to a transport, and never wait on a duration a
//! client chose beyond the server's caps (`max_kill_grace_ms`, `max_drain_timeout_ms`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use base64::Engine;
use subtle::ConstantTimeEq;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::approvals::Approvals;
use super::quota::{AddressKey, Owner, Quota, Usage};
use super::session::{AttachState, ConnHandle, Session};
use super::SessionError;
use crate::bounds::ByteBudget;
use crate::config::ServerConfig;
use crate::metrics::{ContainmentStage, Metrics, StateSnapshot};
use crate::policy::resolve::resolve_program;
use crate::policy::{PolicyFile, Verdict};
use crate::process::containment::Containment;
use crate::process::spawn::SpawnSpec;
use crate::process::{ManagedProcess, OutputBudget};
use crate::rpc::messages::ExitReason;
use crate::sync::lock;

/// All sessions of one server.
pub struct SessionRegistry {
    config: Arc<ServerConfig>,
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    started: Instant,
    next_conn: AtomicU64,
    metrics: Arc<Metrics>,
    /// `max_inbound_bytes`: every connection's request budget and every link's reassembly
    /// budget is a child of it.
    inbound: ByteBudget,
    /// Serialises process admissions (quota count + slot), see [`Self::admit_process`].
    process_admission: Mutex<()>,
    /// `--exec-policy`; `None` allows everything.
    policy: Option<Arc<PolicyFile>>,
    /// The server-wide output budget (`output_budget_bytes`) every process draws on.
    budget: Arc<OutputBudget>,
    containment: Containment,
    /// The tasks ending closed sessions (`Session::close`).
    closing: TaskTracker,
    /// The stall watchdog starts with the first session (on the runtime that serves it: a
    /// registry may be built before its runtime runs).
    watchdog: std::sync::Once,
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
        Arc::new(SessionRegistry {
            budget: OutputBudget::new(config.output_budget_bytes),
            sessions: Mutex::new(HashMap::new()),
            started: Instant::now(),
            next_conn: AtomicU64::new(1),
            metrics,
            inbound: ByteBudget::new(INBOUND_BUDGET_NAME, config.max_inbound_bytes),
            process_admission: Mutex::new(()),
            policy,
            config,
            containment,
            closing: TaskTracker::new(),
            watchdog: std::sync::Once::new(),
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

    /// What the exec policy in force says about `spec` (the file is re-read if it changed):
    /// its `argv[0]` and the path `execvp` would resolve it to with the child's `PATH` and
    /// working directory. Everything is allowed without a policy. A `PATH` too long to look
    /// the program up in ([`MAX_PATH_LOOKUP_ENTRIES`]) is denied: the policy cannot be
    /// checked against what the child would run (fail closed).
    ///
    /// [`MAX_PATH_LOOKUP_ENTRIES`]: crate::policy::resolve::MAX_PATH_LOOKUP_ENTRIES
    pub fn exec_verdict(&self, spec: &SpawnSpec) -> Verdict {
        let Some(file) = &self.policy else {
            return crate::policy::ExecPolicy::allow_all().decide("", None);
        };
        let policy = file.current();
        let program = spec.argv.first().map(String::as_str).unwrap_or("");
        let path_var = match spec.env.iter().rev().find(|(k, _)| k == "PATH") {
            Some((_, v)) => v.as_ref().map(std::ffi::OsString::from),
            None if spec.inherit_env => std::env::var_os("PATH"),
            None => None,
        };
        let cwd = match &spec.cwd {
            Some(c) => std::path::PathBuf::from(c),
            None => std::env::current_dir().unwrap_or_else(|_| "/".into()),
        };
        match resolve_program(program, &cwd, path_var.as_deref()) {
            Ok(resolved) => policy.decide(program, resolved.as_deref()),
            Err(e) => Verdict {
                action: crate::policy::Action::Deny,
                rule: e.to_string(),
            },
        }
    }

    /// The server-wide output budget: unwritten output of every process, its peak.
    pub fn output_budget(&self) -> &Arc<OutputBudget> {
        &self.budget
    }

    /// This server's metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Count what the registry holds now (the read gauges of the metrics).
    pub fn stats(&self) -> StateSnapshot {
        let sessions: Vec<Arc<Session>> = lock(&self.sessions).values().cloned().collect();
        let c = &self.config;
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

    /// Every process of every session, with its session's id (the stall watchdog's round).
    pub fn all_processes(&self) -> Vec<(String, Arc<ManagedProcess>)> {
        let sessions: Vec<Arc<Session>> = lock(&self.sessions).values().cloned().collect();
        sessions
            .iter()
            .flat_map(|s| s.processes().into_iter().map(|p| (s.id.clone(), p)))
            .collect()
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
        self.watchdog
            .call_once(|| super::stall_watchdog::spawn(self));
        let token = random_bytes::<32>();
        let id = format!("s-{}", hex(&random_bytes::<16>()));
        let scope = self.containment.open_scope().map_err(|e| {
            self.metrics
                .containment_failure(ContainmentStage::OpenScope);
            SessionError::Containment(e)
        })?;
        let session = Arc::new(Session {
            id: id.clone(),
            token: token.to_vec(),
            acks,
            peer_key: conn.peer_key.clone(),
            owner_address: conn.peer_addr.map(AddressKey::of),
            config: self.config.clone(),
            processes: Mutex::new(HashMap::new()),
            ended: Mutex::new(Default::default()),
            attach: Mutex::new(AttachState {
                current: Some(conn.clone()),
                generation: 1,
            }),
            registry: Arc::downgrade(self),
            closed: CancellationToken::new(),
            approvals: Mutex::new(Approvals::default()),
            scope,
            closing: self.closing.clone(),
            terminated: CancellationToken::new(),
            detached_ttl_ms: AtomicU64::new(self.config.detached_session_ttl_ms),
        });
        {
            let mut sessions = lock(&self.sessions);
            if sessions.len() >= self.config.max_sessions {
                return Err(SessionError::TooManySessions(self.config.max_sessions));
            }
            let owner = session.owner();
            let (per_key, per_address) = self.session_quotas();
            usage_of(&owner, sessions.values(), |_| 1)
                .admit(&owner, per_key, per_address)
                .map_err(quota_error)?;
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

    /// The per-key and per-address session quotas.
    fn session_quotas(&self) -> (Quota, Quota) {
        (
            Quota {
                limit: "maxSessionsPerKey",
                value: self.config.max_sessions_per_key,
            },
            Quota {
                limit: "maxSessionsPerAddress",
                value: self.config.max_sessions_per_address,
            },
        )
    }

    /// Admit one more process of `session` under its owner's quotas: count the processes of
    /// every session of the same key and of the same address. The guard must be held until
    /// the process's slot is taken in its session, so admissions cannot race past a quota.
    pub(super) fn admit_process(
        &self,
        session: &Session,
    ) -> Result<MutexGuard<'_, ()>, SessionError> {
        let guard = lock(&self.process_admission);
        let owner = session.owner();
        if owner.key.is_none() && owner.address.is_none() {
            return Ok(guard);
        }
        let sessions: Vec<Arc<Session>> = lock(&self.sessions).values().cloned().collect();
        let usage = usage_of(&owner, sessions.iter(), |s| s.process_count());
        let per_key = Quota {
            limit: "maxProcessesPerKey",
            value: self.config.max_processes_per_key,
        };
        let per_address = Quota {
            limit: "maxProcessesPerAddress",
            value: self.config.max_processes_per_address,
        };
        usage
            .admit(&owner, per_key, per_address)
            .map_err(quota_error)?;
        Ok(guard)
    }

    pub(super) fn remove(&self, id: &str) {
        lock(&self.sessions).remove(id);
    }

    /// Close every session and wait until each has ended everything it started (SIGTERM,
    /// the capped grace, SIGKILL), along with every session closed before.
    pub async fn close_all(&self) {
        let sessions: Vec<Arc<Session>> = lock(&self.sessions).drain().map(|(_, s)| s).collect();
        for s in sessions {
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
        let sessions: Vec<Arc<Session>> = lock(&self.sessions).values().cloned().collect();
        let max_grace = self.config.max_kill_grace();
        let max_drain = self.config.max_drain_timeout();
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
                self.metrics.containment_failure(ContainmentStage::Shutdown);
                tracing::error!(?r, "processes survived SIGKILL at shutdown")
            }
            Ok(r) => tracing::debug!(?r, "every process of every session is gone"),
            Err(e) => {
                self.metrics.containment_failure(ContainmentStage::Shutdown);
                tracing::error!(error = %e, "killing every session's processes failed")
            }
        }
    }
}

/// What the sessions of `owner`'s key and of its address hold, counting `count(session)` each.
fn usage_of<'a>(
    owner: &Owner,
    sessions: impl Iterator<Item = &'a Arc<Session>>,
    count: impl Fn(&Session) -> usize,
) -> Usage {
    let mut usage = Usage {
        by_key: 0,
        by_address: 0,
    };
    for s in sessions {
        let same_key = owner.key.is_some() && s.peer_key == owner.key;
        let same_address = owner.address.is_some() && s.owner_address == owner.address;
        if same_key || same_address {
            let n = count(s);
            if same_key {
                usage.by_key += n;
            }
            if same_address {
                usage.by_address += n;
            }
        }
    }
    usage
}

fn quota_error(q: Quota) -> SessionError {
    SessionError::QuotaReached {
        limit: q.limit,
        value: q.value,
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
