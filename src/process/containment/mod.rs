//! Containment: every process a session started, and everything those started, can be found
//! and killed — when the session closes or expires, when the server shuts down, and (for a
//! server that crashed) when it starts again — without ever signalling a process by a pid or
//! group id that may have been reused.
//!
//! # Pieces
//!
//! | file | owns |
//! |---|---|
//! | `pidfd.rs` | [`Pidfd`]: signal a process by identity; `ESRCH` once reaped |
//! | `direct_child.rs` | [`DirectChild`]: a spawned child's pidfd from spawn time, the reap gate, group signals only while the leader is unreaped |
//! | `subreaper.rs` | `PR_SET_CHILD_SUBREAPER`, the registry of direct children, the reaper thread (race analysis in its docs) |
//! | `cgroup.rs` | cgroup v2 / v1 detection and the kill of one cgroup |
//! | `tree.rs` | the verified walk of the server's process tree and attribution to scopes |
//! | `startup.rs` | [`start_containment`]: backend, crash sweep and subreaper, once per server before its first spawn ([`StartError`]) |
//! | `sweep.rs` | crash recovery: instance cgroups of dead servers are killed and removed |
//! | `scope.rs` | [`SessionScope`] (one session's processes) and [`Placement`] |
//! | `config.rs` | [`ContainmentConfig`], [`BackendChoice`], [`ContainmentError`] |
//! | `mod.rs` | [`Containment`]: backend choice, instance cgroups, scopes, shutdown |
//! | `procfs.rs`, `sys.rs` | `/proc` parsers; the raw syscalls (`unsafe` lives only there and in `spawn.rs`) |
//!
//! # Backends
//!
//! [`Containment::new`] picks one by [`BackendChoice`] (`auto` tries them in this order):
//!
//! - **`cgroup2`**: the server's own v2 cgroup gets an instance directory
//!   `<cgroup_name>-<pid>-<start time>-<n>`, and each session scope a child `s<N>` of it. Children
//!   move themselves in between fork and exec; `cgroup.kill` (or freeze + SIGKILL + thaw)
//!   kills the session.
//! - **`cgroup1`**: the same layout in the v1 `freezer` hierarchy (and in `pids` when
//!   `session_pids_max` is set); freeze + SIGKILL by pidfd + thaw.
//! - **`none`**: no cgroup; a session's processes are found by the verified tree walk
//!   (`tree.rs`). What escapes it is documented in SECURITY.md.
//!
//! Every backend also relies on the subreaper ([`subreaper::start_reaper`]) so that orphans
//! stay in the server's tree and their zombies are reaped.
//!
//! # Placing a child
//!
//! `spawn.rs` calls [`SessionScope::begin_placement`] before it forks. That opens the
//! scope's `cgroup.procs` file(s) (close-on-exec) and holds the scope's lock, so a kill that
//! starts meanwhile waits for the child to be in place. In the child, before `setsid` and
//! before exec, the `pre_exec` hook writes `"0"` to each descriptor (`sys::write_in_child`,
//! one `write`, async-signal-safe): the child is in the cgroup before it can run a single
//! instruction of the program, so nothing it forks can start outside. If the write fails the
//! exec is not attempted and the spawn fails with that error. `clone3(CLONE_INTO_CGROUP)`
//! would do the same in the kernel, but std's `Command` cannot use it and it exists only for
//! v2; the pre-exec write works for both hierarchies and keeps std's exec-error reporting.
//!
//! # Who uses what
//!
//! - **Start** ([`start_containment`], called by both composition roots, `server::Server::new`
//!   and the in-process `connection::local::LocalServer::start`, before the first spawn):
//!   [`Containment::new`] from the `containment_backend`, `cgroup_name` and
//!   `session_pids_max` settings ([`ContainmentConfig::from_server`]), then
//!   [`Containment::sweep_stale`], then [`subreaper::start_reaper`]. The `SessionRegistry`
//!   holds the `Containment`.
//! - **Session create**: [`Containment::open_scope`]; the `Session` owns the scope.
//! - **Process start**: `spawn::spawn_into(spec, Some(&scope))`; the supervisor
//!   (`output_pump.rs`) reaps only through [`DirectChild::wait`].
//! - **Signals** (`managed_process.rs`): [`DirectChild::signal_group`] while the leader is
//!   unreaped; after that, for `terminate`, `timeoutMs` and `killProcessGroupOnExit`,
//!   [`SessionScope::signal_group_members`]; `process/signal` and resize send nothing once the
//!   child exited.
//! - **Session close and expiry** (`session.rs`, in tasks the registry tracks):
//!   [`SessionScope::signal_all`] (SIGTERM), [`SessionScope::wait_empty`] for the capped
//!   grace, [`SessionScope::kill_all`], [`SessionScope::remove`].
//! - **Shutdown** (`SessionRegistry::shutdown`, for the network server and, each half cut to
//!   its deadline, the in-process one): after the processes' own capped grace and the exit
//!   notices, [`Containment::kill_everything`].

pub mod cgroup;
pub mod config;
pub mod direct_child;
pub mod pidfd;
pub mod procfs;
pub mod scope;
pub mod startup;
pub mod subreaper;
pub mod sweep;
mod sys;
pub mod tree;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

pub use cgroup::Cgroup;
pub use config::{
    BackendChoice, BackendKind, ContainmentConfig, ContainmentError, DEFAULT_CGROUP_NAME,
    MAX_CGROUP_NAME_BYTES,
};
pub use direct_child::DirectChild;
pub use pidfd::{Delivery, Pidfd};
pub(crate) use scope::enter_in_child;
pub use scope::{Placement, SessionScope, EMPTY_POLL_BACKOFF, MAX_PLACEMENT_FDS};

use scope::ScopeCgroups;
pub use startup::{start_containment, StartError};
pub use sweep::SweepReport;

use cgroup::Hierarchy;
use tree::Owner;

/// How long a kill waits for a scope (or, at shutdown, everything) to be empty after SIGKILL.
/// SIGKILLed processes die within milliseconds unless stuck in uninterruptible sleep (a
/// dead NFS server); ten seconds is generous on a loaded machine and still bounds session
/// close and shutdown.
pub const KILL_WAIT_TIMEOUT: Duration = Duration::from_secs(10);
/// Lock a std mutex, recovering from poisoning (every critical section here is a few field
/// updates, consistent at every step).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Identifies a session scope, unique in the process (across [`Containment`]s), and the
/// containment that opened it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ScopeId {
    /// The opening containment's number (`NEXT_INSTANCE`).
    instance: u64,
    /// Unique in the process (`NEXT_SCOPE`).
    n: u64,
}

/// Every live containment of the process, so that a tree walk attributes the orphans of
/// *every* containment's sessions (one server's shutdown must not take another's processes
/// for unattributed). Pruned of dead entries whenever a containment is created.
static LIVE: Mutex<Vec<Weak<Shared>>> = Mutex::new(Vec::new());

/// The session map (session id → scope) of every live containment of the process.
fn all_sessions() -> HashMap<u32, ScopeId> {
    let live: Vec<Arc<Shared>> = lock(&LIVE).iter().filter_map(Weak::upgrade).collect();
    let mut out = HashMap::new();
    for s in live {
        out.extend(s.sessions());
    }
    out
}

static NEXT_SCOPE: AtomicU64 = AtomicU64::new(1);
/// Numbers the containments of this process (part of the instance cgroup's name).
static NEXT_INSTANCE: AtomicU64 = AtomicU64::new(0);

enum Tree {
    V2 {
        instance: Cgroup,
        kill_file: bool,
    },
    V1 {
        freezer: Cgroup,
        pids: Option<Cgroup>,
    },
    None,
}

struct Shared {
    /// This containment's number: part of its instance cgroup's name and of its scopes' ids.
    instance: u64,
    backend: BackendKind,
    tree: Tree,
    pids_max: Option<u64>,
    /// Session id (a direct child's pid) → the scope it was placed in; see `tree.rs`.
    sessions: Mutex<HashMap<u32, ScopeId>>,
    /// Size of `sessions` after its last pruning.
    sessions_pruned_len: Mutex<usize>,
    scopes: Mutex<HashMap<ScopeId, Weak<SessionScope>>>,
    /// Parents and base name for the crash sweep, per hierarchy.
    sweep_roots: Vec<(Cgroup, Hierarchy)>,
    cgroup_name: String,
}

impl Shared {
    fn sessions(&self) -> HashMap<u32, ScopeId> {
        lock(&self.sessions).clone()
    }

    /// Record that session `sid` (a new direct child's pid) belongs to `scope`. Once the map
    /// has doubled since it was last pruned, forget sessions that are over: the direct child
    /// was reaped and no process on the host has that session id any more (a session cannot
    /// gain a member once it has none). Amortised O(1) per spawn.
    fn record_session(&self, sid: u32, scope: ScopeId) {
        let len = {
            let mut m = lock(&self.sessions);
            m.insert(sid, scope);
            m.len()
        };
        let mut pruned = lock(&self.sessions_pruned_len);
        if len < (*pruned * 2).max(SESSION_PRUNE_MIN) {
            return;
        }
        let live: std::collections::HashSet<u32> = procfs::all_pids()
            .unwrap_or_default()
            .into_iter()
            .filter_map(|p| procfs::read_stat(p).ok())
            .filter(|st| !st.is_dead())
            .map(|st| st.sid)
            .collect();
        let mut m = lock(&self.sessions);
        m.retain(|sid, _| subreaper::direct_child(*sid).is_some() || live.contains(sid));
        *pruned = m.len();
    }
}

/// The session map is first pruned when it reaches this many entries (then whenever it has
/// doubled): below it, a pruning `/proc` scan costs more than the entries.
pub const SESSION_PRUNE_MIN: usize = 256;

impl Drop for Shared {
    /// Best effort: the instance cgroups go when the last handle (and every scope) is gone,
    /// if nothing is left in them; otherwise the next start's sweep removes them.
    fn drop(&mut self) {
        match &self.tree {
            Tree::V2 { instance, .. } => {
                let _ = instance.remove_tree();
            }
            Tree::V1 { freezer, pids } => {
                let _ = freezer.remove_tree();
                if let Some(p) = pids {
                    let _ = p.remove_tree();
                }
            }
            Tree::None => {}
        }
    }
}

/// Server-wide containment: the backend, this server's instance cgroup(s), and every scope.
/// The instance cgroups are removed when the last clone and every scope are dropped (if
/// empty), or by [`kill_everything`](Self::kill_everything).
#[derive(Clone)]
pub struct Containment {
    shared: Arc<Shared>,
}

/// What a kill did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KillReport {
    /// Processes signalled one by one (by pidfd). `cgroup.kill` signals inside the kernel and
    /// counts 0 here; see `members_before`.
    pub signalled: usize,
    /// Members the cgroup(s) had when the kill began (cgroup backends).
    pub members_before: usize,
    /// Nothing was left alive by the deadline.
    pub emptied: bool,
}

impl KillReport {
    fn add_cgroup(&mut self, k: cgroup::CgroupKill) {
        self.signalled += k.signalled;
        self.members_before += k.members_before;
        self.emptied &= k.emptied;
    }
}

impl Containment {
    /// Detect and set up the backend: create this server's instance cgroup(s). Does not
    /// sweep ([`sweep_stale`](Self::sweep_stale)) and does not start the reaper
    /// ([`subreaper::start_reaper`]).
    pub fn new(cfg: &ContainmentConfig) -> Result<Containment, ContainmentError> {
        cfg.validate()?;
        let detected = cgroup::detect();
        let me = procfs::read_stat(std::process::id())?;
        let seq = NEXT_INSTANCE.fetch_add(1, Ordering::Relaxed);
        let name = cgroup::instance_name(&cfg.cgroup_name, me.pid, me.starttime, seq);
        let mut sweep_roots = Vec::new();
        if let Some(v2) = &detected.v2 {
            sweep_roots.push((v2.clone(), Hierarchy::V2));
        }
        if let Some(f) = &detected.freezer {
            sweep_roots.push((f.clone(), Hierarchy::V1Freezer));
        }
        if let Some(p) = &detected.pids {
            sweep_roots.push((p.clone(), Hierarchy::V1Pids));
        }
        let order: &[BackendKind] = match cfg.backend {
            BackendChoice::Auto => &[
                BackendKind::Cgroup2,
                BackendKind::Cgroup1,
                BackendKind::None,
            ],
            BackendChoice::Cgroup2 => &[BackendKind::Cgroup2],
            BackendChoice::Cgroup1 => &[BackendKind::Cgroup1],
            BackendChoice::None => &[BackendKind::None],
        };
        let mut reasons = Vec::new();
        for kind in order {
            let tree = match kind {
                BackendKind::Cgroup2 => setup_v2(&detected, &name, cfg.session_pids_max),
                BackendKind::Cgroup1 => setup_v1(&detected, &name, cfg.session_pids_max),
                BackendKind::None => Ok(Tree::None),
            };
            match tree {
                Ok(tree) => {
                    tracing::info!(backend = ?kind, "process containment ready");
                    let shared = Arc::new(Shared {
                        instance: seq,
                        backend: *kind,
                        tree,
                        pids_max: cfg.session_pids_max,
                        sessions: Mutex::new(HashMap::new()),
                        sessions_pruned_len: Mutex::new(0),
                        scopes: Mutex::new(HashMap::new()),
                        sweep_roots,
                        cgroup_name: cfg.cgroup_name.clone(),
                    });
                    {
                        let mut live = lock(&LIVE);
                        live.retain(|w| w.strong_count() > 0);
                        live.push(Arc::downgrade(&shared));
                    }
                    return Ok(Containment { shared });
                }
                Err(e) => reasons.push(format!("{kind:?}: {e}")),
            }
        }
        Err(ContainmentError::Unavailable {
            backend: cfg.backend,
            reason: reasons.join("; "),
        })
    }

    /// The backend in use.
    pub fn backend(&self) -> BackendKind {
        self.shared.backend
    }

    /// This server's instance cgroup directories (empty for `none`).
    pub fn instance_dirs(&self) -> Vec<PathBuf> {
        match &self.shared.tree {
            Tree::V2 { instance, .. } => vec![instance.dir.clone()],
            Tree::V1 { freezer, pids } => {
                let mut v = vec![freezer.dir.clone()];
                v.extend(pids.iter().map(|p| p.dir.clone()));
                v
            }
            Tree::None => Vec::new(),
        }
    }

    /// Crash recovery: kill and remove the instance cgroups (same `cgroup_name`, same parent)
    /// of servers that are no longer running, in every hierarchy present. Call at start.
    pub fn sweep_stale(&self) -> SweepReport {
        let mut total = SweepReport::default();
        for (parent, h) in &self.shared.sweep_roots {
            total.merge(sweep::sweep(parent, *h, &self.shared.cgroup_name));
        }
        total
    }

    /// Open a scope for a new session.
    pub fn open_scope(&self) -> Result<Arc<SessionScope>, ContainmentError> {
        let id = ScopeId {
            instance: self.shared.instance,
            n: NEXT_SCOPE.fetch_add(1, Ordering::Relaxed),
        };
        let name = format!("s{}", id.n);
        let cgroups = match &self.shared.tree {
            Tree::V2 {
                instance,
                kill_file,
            } => {
                let cg = instance.child(&name);
                cg.create()?;
                if let Some(max) = self.shared.pids_max {
                    if let Err(e) = cg.write("pids.max", &max.to_string()) {
                        let _ = cg.remove_tree();
                        return Err(e.into());
                    }
                }
                ScopeCgroups::V2 {
                    cg,
                    kill_file: *kill_file,
                }
            }
            Tree::V1 { freezer, pids } => {
                let f = freezer.child(&name);
                f.create()?;
                let p = match pids {
                    Some(p) => {
                        let p = p.child(&name);
                        let max = self
                            .shared
                            .pids_max
                            .map_or_else(|| "max".to_string(), |m| m.to_string());
                        let made = p.create().and_then(|()| p.write("pids.max", &max));
                        if let Err(e) = made {
                            let _ = p.remove_tree();
                            let _ = f.remove_tree();
                            return Err(e.into());
                        }
                        Some(p)
                    }
                    None => None,
                };
                ScopeCgroups::V1 {
                    freezer: f,
                    pids: p,
                }
            }
            Tree::None => ScopeCgroups::None,
        };
        let scope = SessionScope::new(id, self.shared.clone(), cgroups);
        lock(&self.shared.scopes).insert(id, Arc::downgrade(&scope));
        Ok(scope)
    }

    /// Shutdown: close every scope, kill everything any session of this containment started
    /// (all its scopes, and every unattributed process in the server's tree), wait (bounded
    /// by [`KILL_WAIT_TIMEOUT`]) and remove the scopes' and the instance's cgroups.
    ///
    /// Processes of *another* live containment of the same process (tests, embedders running
    /// several servers) are left alone: its direct children and their subtrees, and orphans
    /// whose session one of its direct children started. What nobody can attribute (a `setsid`
    /// double fork of the `none` backend) is killed by whichever shuts down first.
    pub async fn kill_everything(&self) -> Result<KillReport, ContainmentError> {
        let shared = self.shared.clone();
        tokio::task::spawn_blocking(move || kill_everything_blocking(&shared))
            .await
            .map_err(|e| ContainmentError::Io(std::io::Error::other(e.to_string())))?
    }
}

fn setup_v2(d: &cgroup::Detected, name: &str, pids_max: Option<u64>) -> Result<Tree, String> {
    let own = d.v2.as_ref().ok_or("no cgroup2 mount holds this process")?;
    let inst = own.child(name);
    inst.create()
        .map_err(|e| format!("cannot create {}: {e}", inst.dir.display()))?;
    let kill_file = inst.has("cgroup.kill");
    if !kill_file && !inst.has("cgroup.freeze") {
        let _ = inst.remove_tree();
        return Err("neither cgroup.kill nor cgroup.freeze (kernel older than 5.2)".into());
    }
    // The memory controller for the sessions, when the server's cgroup has it to give: only
    // so that each session's `memory.events` counts its OOM kills (the exit notice's
    // `oomKilled`). Best effort and no limit is set: without it, an OOM kill reads as a
    // plain SIGKILL (`exited`).
    if own
        .read("cgroup.subtree_control")
        .is_ok_and(|c| c.split_whitespace().any(|c| c == "memory"))
    {
        if let Err(e) = inst.write("cgroup.subtree_control", "+memory") {
            tracing::debug!(error = %e, "memory controller not enabled for sessions: OOM kills will not be told apart");
        }
    }
    if pids_max.is_some() {
        let enable = |cg: &Cgroup| -> std::io::Result<()> {
            if !cg
                .read("cgroup.subtree_control")?
                .split_whitespace()
                .any(|c| c == "pids")
            {
                cg.write("cgroup.subtree_control", "+pids")?;
            }
            Ok(())
        };
        if let Err(e) = enable(own).and_then(|()| enable(&inst)) {
            let _ = inst.remove_tree();
            return Err(format!(
                "session_pids_max needs the pids controller in {}: {e}",
                own.dir.display()
            ));
        }
    }
    Ok(Tree::V2 {
        instance: inst,
        kill_file,
    })
}

fn setup_v1(d: &cgroup::Detected, name: &str, pids_max: Option<u64>) -> Result<Tree, String> {
    let freezer = d.freezer.as_ref().ok_or("no v1 freezer hierarchy")?;
    let inst = freezer.child(name);
    inst.create()
        .map_err(|e| format!("cannot create {}: {e}", inst.dir.display()))?;
    let pids = match (pids_max, &d.pids) {
        (None, _) => None,
        (Some(_), None) => {
            let _ = inst.remove_tree();
            return Err("session_pids_max needs the v1 pids hierarchy".into());
        }
        (Some(_), Some(p)) => {
            let pi = p.child(name);
            if let Err(e) = pi.create() {
                let _ = inst.remove_tree();
                return Err(format!("cannot create {}: {e}", pi.dir.display()));
            }
            Some(pi)
        }
    };
    Ok(Tree::V1 {
        freezer: inst,
        pids,
    })
}

fn kill_everything_blocking(shared: &Arc<Shared>) -> Result<KillReport, ContainmentError> {
    let deadline = Instant::now() + KILL_WAIT_TIMEOUT;
    let scopes: Vec<Arc<SessionScope>> = lock(&shared.scopes)
        .values()
        .filter_map(Weak::upgrade)
        .collect();
    for s in &scopes {
        s.close();
    }
    let mut report = KillReport {
        emptied: true,
        ..KillReport::default()
    };
    match &shared.tree {
        // One write kills every session's cgroup at once.
        Tree::V2 {
            instance,
            kill_file,
        } => report.add_cgroup(cgroup::kill_v2(instance, *kill_file, deadline)?),
        Tree::V1 { freezer, .. } => report.add_cgroup(cgroup::kill_v1(freezer, deadline)?),
        Tree::None => {}
    }
    // Whatever is in the tree outside any cgroup: processes of the `none` backend, children
    // spawned without a scope, and anything that left its cgroup. Attribution uses every live
    // containment's sessions, so that another one's orphans are not taken for unattributed.
    let me = shared.instance;
    let want = |o: Owner| match o {
        Owner::Scope(id) => id.instance == me,
        Owner::Unattributed => true,
        Owner::Foreign => false,
    };
    // No spawn of any containment is between fork and registration meanwhile: a child that
    // has called `setsid` but is not registered yet would look unattributed.
    let gate = subreaper::fork_exclusive();
    let t = tree::kill(&all_sessions, &want, deadline);
    drop(gate);
    let t = t?;
    report.signalled += t.signalled;
    report.emptied &= t.emptied;
    for s in &scopes {
        let _ = s.remove_dirs();
    }
    match &shared.tree {
        Tree::V2 { instance, .. } => instance.remove_tree()?,
        Tree::V1 { freezer, pids } => {
            freezer.remove_tree()?;
            if let Some(p) = pids {
                p.remove_tree()?;
            }
        }
        Tree::None => {}
    }
    Ok(report)
}
