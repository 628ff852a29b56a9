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
//! | `sweep.rs` | crash recovery: instance cgroups of dead servers are killed and removed |
//! | `procfs.rs`, `sys.rs` | `/proc` parsers; the raw syscalls (`unsafe` lives only there and in `spawn.rs`) |
//!
//! # Backends
//!
//! [`Containment::new`] picks one by [`BackendChoice`] (`auto` tries them in this order):
//!
//! - **`cgroup2`**: the server's own v2 cgroup gets an instance directory
//!   `<cgroup_name>-<pid>-<start time>`, and each session scope a child `s<N>` of it. Children
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
//! # Wiring plan (second step, after the `layers` restructuring lands)
//!
//! See the report of this branch; in short: `Containment` lives beside the session registry;
//! each `Session` owns an `Arc<SessionScope>`; `spawn::spawn_into(spec, Some(&scope))`
//! replaces `spawn(spec)`; the supervisor reaps through [`DirectChild::wait`]; terminate and
//! signal use [`DirectChild::signal_group`] and, once the leader was reaped,
//! [`SessionScope::signal_group_members`]; close and expiry call [`SessionScope::kill_all`]
//! then [`SessionScope::remove`]; shutdown calls [`Containment::kill_everything`]; startup
//! calls [`Containment::new`], [`Containment::sweep_stale`] and [`subreaper::start_reaper`].

pub mod cgroup;
pub mod direct_child;
pub mod pidfd;
pub mod procfs;
pub mod subreaper;
pub mod sweep;
mod sys;
pub mod tree;

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde::Deserialize;

pub use cgroup::Cgroup;
pub use direct_child::DirectChild;
pub use pidfd::{Delivery, Pidfd};
pub use sweep::SweepReport;

use cgroup::Hierarchy;
use tree::Owner;

/// How long a kill waits for a scope (or, at shutdown, everything) to be empty after SIGKILL.
/// SIGKILLed processes die within milliseconds unless stuck in uninterruptible sleep (a
/// dead NFS server); ten seconds is generous on a loaded machine and still bounds session
/// close and shutdown.
pub const KILL_WAIT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest `cgroup_name`, in bytes (a directory name, with `-<pid>-<start>` appended).
pub const MAX_CGROUP_NAME_BYTES: usize = 64;
/// Default `cgroup_name`.
pub const DEFAULT_CGROUP_NAME: &str = "execrelay";

/// Lock a std mutex, recovering from poisoning (every critical section here is a few field
/// updates, consistent at every step).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Which containment backend to use (`containment_backend` in the configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendChoice {
    /// The first of `cgroup2`, `cgroup1`, `none` that works here.
    #[default]
    Auto,
    /// cgroup v2 or fail.
    Cgroup2,
    /// cgroup v1 `freezer` (and `pids`) or fail.
    Cgroup1,
    /// No cgroups: process-tree tracking only.
    None,
}

impl std::str::FromStr for BackendChoice {
    type Err = ContainmentError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "auto" => BackendChoice::Auto,
            "cgroup2" => BackendChoice::Cgroup2,
            "cgroup1" => BackendChoice::Cgroup1,
            "none" => BackendChoice::None,
            _ => {
                return Err(ContainmentError::Config(format!(
                    "unknown containment backend {s:?} (auto, cgroup2, cgroup1, none)"
                )))
            }
        })
    }
}

/// The backend in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// cgroup v2.
    Cgroup2,
    /// cgroup v1 `freezer` (+ `pids`).
    Cgroup1,
    /// Process-tree tracking only.
    None,
}

/// Containment settings (to become `ServerConfig` keys: `containment_backend`,
/// `cgroup_name`, `session_pids_max`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ContainmentConfig {
    /// See [`BackendChoice`].
    pub backend: BackendChoice,
    /// Base name of this server's instance cgroup (`<name>-<pid>-<start time>`); servers that
    /// share a parent cgroup and a name sweep each other's leftovers after a crash.
    pub cgroup_name: String,
    /// `pids.max` of each session's cgroup: most processes (threads count) one session may
    /// have at once. `None` (default): no limit beyond the host's. Needs the `pids`
    /// controller: the v1 `pids` hierarchy, or on v2 a server cgroup that may enable `pids`
    /// for its children (the root cgroup, or one the server is not itself a member of: the
    /// kernel refuses controllers below a non-root cgroup that holds processes). Otherwise
    /// start fails naming the cause; a unit's `TasksMax=` bounds the whole server instead.
    pub session_pids_max: Option<u64>,
}

impl Default for ContainmentConfig {
    fn default() -> Self {
        ContainmentConfig {
            backend: BackendChoice::Auto,
            cgroup_name: DEFAULT_CGROUP_NAME.to_string(),
            session_pids_max: None,
        }
    }
}

impl ContainmentConfig {
    /// Check the settings.
    pub fn validate(&self) -> Result<(), ContainmentError> {
        let n = &self.cgroup_name;
        let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
        if n.is_empty()
            || n.len() > MAX_CGROUP_NAME_BYTES
            || !n.chars().all(ok_char)
            || n.starts_with('.')
            || n.starts_with('-')
        {
            return Err(ContainmentError::Config(format!(
                "cgroup_name must be 1 to {MAX_CGROUP_NAME_BYTES} bytes of [A-Za-z0-9_.-], \
                 not starting with '.' or '-'"
            )));
        }
        if self.session_pids_max == Some(0) {
            return Err(ContainmentError::Config(
                "session_pids_max must be at least 1".into(),
            ));
        }
        Ok(())
    }
}

/// Containment failures.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ContainmentError {
    /// Bad settings.
    #[error("containment configuration: {0}")]
    Config(String),
    /// The requested backend cannot work here.
    #[error("containment backend {backend:?} unavailable: {reason}")]
    Unavailable {
        /// What was asked for.
        backend: BackendChoice,
        /// Why each candidate failed.
        reason: String,
    },
    /// The scope was killed or removed: nothing may be placed in it any more.
    #[error("session scope is closed")]
    ScopeClosed,
    /// Processes are left in the scope.
    #[error("session scope still has processes")]
    NotEmpty,
    /// An OS call failed.
    #[error("containment: {0}")]
    Io(#[from] std::io::Error),
}

/// Identifies a session scope, unique in the process (across [`Containment`]s).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ScopeId(u64);

static NEXT_SCOPE: AtomicU64 = AtomicU64::new(1);

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
        let name = cgroup::instance_name(&cfg.cgroup_name, me.pid, me.starttime);
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
                    return Ok(Containment {
                        shared: Arc::new(Shared {
                            backend: *kind,
                            tree,
                            pids_max: cfg.session_pids_max,
                            sessions: Mutex::new(HashMap::new()),
                            sessions_pruned_len: Mutex::new(0),
                            scopes: Mutex::new(HashMap::new()),
                            sweep_roots,
                            cgroup_name: cfg.cgroup_name.clone(),
                        }),
                    });
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
        let id = ScopeId(NEXT_SCOPE.fetch_add(1, Ordering::Relaxed));
        let name = format!("s{}", id.0);
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
        let scope = Arc::new(SessionScope {
            id,
            shared: self.shared.clone(),
            cgroups,
            state: Mutex::new(ScopeState::default()),
        });
        lock(&self.shared.scopes).insert(id, Arc::downgrade(&scope));
        Ok(scope)
    }

    /// Shutdown: close every scope, kill everything any session started (all scopes, and
    /// every unattributed process in the server's tree), wait (bounded by
    /// [`KILL_WAIT_TIMEOUT`]) and remove the scopes' and the instance's cgroups.
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
        lock(&s.state).closed = true;
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
    // spawned without a scope, and anything that left its cgroup.
    let t = tree::kill(&|| shared.sessions(), &|o| o != Owner::Foreign, deadline)?;
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

enum ScopeCgroups {
    V2 {
        cg: Cgroup,
        kill_file: bool,
    },
    V1 {
        freezer: Cgroup,
        pids: Option<Cgroup>,
    },
    None,
}

#[derive(Default)]
struct ScopeState {
    /// No more placements: the scope is being killed or was removed.
    closed: bool,
}

/// The processes of one session: a cgroup (or, with `none`, the session's part of the
/// server's process tree).
pub struct SessionScope {
    id: ScopeId,
    shared: Arc<Shared>,
    cgroups: ScopeCgroups,
    state: Mutex<ScopeState>,
}

/// A placement in progress: holds the scope's lock from before the fork until the child is
/// recorded, and the `cgroup.procs` descriptors the child writes itself into.
pub struct Placement<'a> {
    scope: &'a SessionScope,
    _state: MutexGuard<'a, ScopeState>,
    fds: Vec<OwnedFd>,
}

/// Most `cgroup.procs` descriptors one placement uses (v1: `freezer` and `pids`).
pub const MAX_PLACEMENT_FDS: usize = 2;

impl Placement<'_> {
    /// The descriptors the child must write `"0"` to, padded with -1.
    pub fn child_fds(&self) -> [RawFd; MAX_PLACEMENT_FDS] {
        let mut out = [-1; MAX_PLACEMENT_FDS];
        for (o, fd) in out.iter_mut().zip(&self.fds) {
            *o = fd.as_raw_fd();
        }
        out
    }

    /// The scope.
    pub fn scope_id(&self) -> ScopeId {
        self.scope.id
    }

    /// The child was spawned: record its session for attribution.
    pub fn placed(self, child: &DirectChild) {
        self.scope.shared.record_session(child.pid(), self.scope.id);
    }
}

/// Run in the child between fork and exec: write `"0"` to each placement descriptor.
/// Async-signal-safe.
pub(crate) fn enter_in_child(fds: &[RawFd; MAX_PLACEMENT_FDS]) -> std::io::Result<()> {
    for &fd in fds {
        if fd >= 0 {
            sys::write_in_child(fd, b"0")?;
        }
    }
    Ok(())
}

impl SessionScope {
    /// This scope's id.
    pub fn id(&self) -> ScopeId {
        self.id
    }

    /// The scope's cgroup directories (empty for `none`).
    pub fn cgroup_dirs(&self) -> Vec<PathBuf> {
        match &self.cgroups {
            ScopeCgroups::V2 { cg, .. } => vec![cg.dir.clone()],
            ScopeCgroups::V1 { freezer, pids } => {
                let mut v = vec![freezer.dir.clone()];
                v.extend(pids.iter().map(|p| p.dir.clone()));
                v
            }
            ScopeCgroups::None => Vec::new(),
        }
    }

    /// Begin placing a child (called by `spawn.rs` before it forks). Fails once the scope
    /// was killed or removed.
    pub fn begin_placement(&self) -> Result<Placement<'_>, ContainmentError> {
        let state = lock(&self.state);
        if state.closed {
            return Err(ContainmentError::ScopeClosed);
        }
        let fds = match &self.cgroups {
            ScopeCgroups::V2 { cg, .. } => vec![cg.open_procs()?],
            ScopeCgroups::V1 { freezer, pids } => {
                let mut v = vec![freezer.open_procs()?];
                if let Some(p) = pids {
                    v.push(p.open_procs()?);
                }
                v
            }
            ScopeCgroups::None => Vec::new(),
        };
        Ok(Placement {
            scope: self,
            _state: state,
            fds,
        })
    }

    /// Close the scope to new processes, SIGKILL everything in it, and wait (at most
    /// [`KILL_WAIT_TIMEOUT`]) until nothing is left alive.
    pub async fn kill_all(self: &Arc<Self>) -> Result<KillReport, ContainmentError> {
        lock(&self.state).closed = true;
        let me = self.clone();
        tokio::task::spawn_blocking(move || {
            me.kill_all_blocking(Instant::now() + KILL_WAIT_TIMEOUT)
        })
        .await
        .map_err(|e| ContainmentError::Io(std::io::Error::other(e.to_string())))?
    }

    fn kill_all_blocking(&self, deadline: Instant) -> Result<KillReport, ContainmentError> {
        let mut report = KillReport {
            emptied: true,
            ..KillReport::default()
        };
        match &self.cgroups {
            ScopeCgroups::V2 { cg, kill_file } => {
                report.add_cgroup(cgroup::kill_v2(cg, *kill_file, deadline)?)
            }
            ScopeCgroups::V1 { freezer, .. } => {
                report.add_cgroup(cgroup::kill_v1(freezer, deadline)?)
            }
            ScopeCgroups::None => {
                let id = self.id;
                let t = tree::kill(
                    &|| self.shared.sessions(),
                    &|o| o == Owner::Scope(id),
                    deadline,
                )?;
                report.signalled = t.signalled;
                report.emptied = t.emptied;
            }
        }
        Ok(report)
    }

    /// Whether nothing of the scope is alive (zombies do not count).
    pub fn is_empty(&self) -> Result<bool, ContainmentError> {
        Ok(match &self.cgroups {
            ScopeCgroups::V2 { cg, .. } => !cg.exists() || cgroup::v2_is_empty(cg)?,
            ScopeCgroups::V1 { freezer, .. } => {
                !freezer.exists() || freezer.procs_recursive()?.is_empty()
            }
            ScopeCgroups::None => {
                let id = self.id;
                tree::walk(&self.shared.sessions(), &|o| o == Owner::Scope(id))?
                    .members
                    .is_empty()
            }
        })
    }

    /// Send `sig` (`None`: only count) to every live process of the scope in process group
    /// `pgid`, each by pidfd after verifying its group and membership. For a group whose
    /// leader (the direct child) was already reaped, where `killpg` would be unsafe. Returns
    /// how many processes were reached.
    pub fn signal_group_members(
        &self,
        pgid: u32,
        sig: Option<Signal>,
    ) -> Result<usize, ContainmentError> {
        let (cg, h) = match &self.cgroups {
            ScopeCgroups::V2 { cg, .. } => (cg, Hierarchy::V2),
            ScopeCgroups::V1 { freezer, .. } => (freezer, Hierarchy::V1Freezer),
            ScopeCgroups::None => {
                let id = self.id;
                return Ok(tree::signal_group(
                    &self.shared.sessions(),
                    &|o| o == Owner::Scope(id),
                    pgid,
                    sig,
                )?);
            }
        };
        let mut n = 0;
        for pid in cg.procs_recursive()? {
            let Ok(fd) = Pidfd::open(pid) else { continue };
            let Ok(st) = procfs::read_stat(pid) else {
                continue;
            };
            if st.pgid != pgid || st.is_dead() || !cgroup::is_member(pid, cg, h) {
                continue;
            }
            let reached = match sig {
                Some(s) => fd.signal(s)? == Delivery::Delivered,
                None => fd.is_unreaped(),
            };
            if reached {
                n += 1;
            }
        }
        Ok(n)
    }

    /// Remove the scope's cgroups and forget it. Fails with [`ContainmentError::NotEmpty`]
    /// while a process is left (call [`kill_all`](Self::kill_all) first). The scope is closed
    /// to new processes either way.
    pub fn remove(&self) -> Result<(), ContainmentError> {
        lock(&self.state).closed = true;
        if !self.is_empty()? {
            return Err(ContainmentError::NotEmpty);
        }
        self.remove_dirs().map_err(|e| match e.raw_os_error() {
            Some(libc::EBUSY) => ContainmentError::NotEmpty,
            _ => ContainmentError::Io(e),
        })?;
        lock(&self.shared.scopes).remove(&self.id);
        lock(&self.shared.sessions).retain(|_, s| *s != self.id);
        Ok(())
    }

    fn remove_dirs(&self) -> std::io::Result<()> {
        match &self.cgroups {
            ScopeCgroups::V2 { cg, .. } => cg.remove_tree(),
            ScopeCgroups::V1 { freezer, pids } => {
                freezer.remove_tree()?;
                if let Some(p) = pids {
                    p.remove_tree()?;
                }
                Ok(())
            }
            ScopeCgroups::None => Ok(()),
        }
    }
}

impl Drop for SessionScope {
    /// Best effort: an empty scope's cgroups go with it; a scope with processes left keeps
    /// them until shutdown or the next start's sweep.
    fn drop(&mut self) {
        let _ = self.remove_dirs();
        lock(&self.shared.scopes).remove(&self.id);
        lock(&self.shared.sessions).retain(|_, s| *s != self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_validation_edges() {
        ContainmentConfig::default().validate().unwrap();
        let with = |name: &str| ContainmentConfig {
            cgroup_name: name.into(),
            ..ContainmentConfig::default()
        };
        with(&"a".repeat(MAX_CGROUP_NAME_BYTES)).validate().unwrap();
        assert!(with(&"a".repeat(MAX_CGROUP_NAME_BYTES + 1))
            .validate()
            .is_err());
        for bad in ["", ".", "..", "-x", "a/b", "a b", "é"] {
            assert!(with(bad).validate().is_err(), "{bad:?}");
        }
        with("execrelay-test_1.x").validate().unwrap();
        let pids = |n| ContainmentConfig {
            session_pids_max: n,
            ..ContainmentConfig::default()
        };
        assert!(pids(Some(0)).validate().is_err());
        pids(Some(1)).validate().unwrap();
    }

    #[test]
    fn backend_names() {
        assert_eq!(
            "auto".parse::<BackendChoice>().unwrap(),
            BackendChoice::Auto
        );
        assert_eq!(
            "cgroup2".parse::<BackendChoice>().unwrap(),
            BackendChoice::Cgroup2
        );
        assert_eq!(
            "cgroup1".parse::<BackendChoice>().unwrap(),
            BackendChoice::Cgroup1
        );
        assert_eq!(
            "none".parse::<BackendChoice>().unwrap(),
            BackendChoice::None
        );
        assert!("v2".parse::<BackendChoice>().is_err());
        let c: ContainmentConfig =
            toml::from_str("backend = \"cgroup1\"\nsession_pids_max = 64\n").unwrap();
        assert_eq!(c.backend, BackendChoice::Cgroup1);
        assert_eq!(c.session_pids_max, Some(64));
        assert!(toml::from_str::<ContainmentConfig>("backend = \"v2\"\n").is_err());
    }
}
