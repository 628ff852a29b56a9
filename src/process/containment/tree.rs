//! The server's process tree, walked from `/proc` with every link verified through a
//! pidfd, and the processes in it attributed to session scopes. This is how the `none`
//! backend finds a session's processes, and how shutdown finds everything the server started
//! on any backend.
//!
//! # Verified walk
//!
//! For each child `c` listed under a node `p`: open a pidfd for `c`, read `/proc/c/stat`,
//! require `ppid == p`, then require that both `c`'s and `p`'s pidfds are still unreaped. A
//! process keeps its pid until it is reaped, so the stat we read was `c`'s and, at that
//! moment, `c`'s parent was `p`, which we had verified the same way: every process found is a
//! descendant of the server. The walk never reaches a process outside the server's tree.
//!
//! # Attribution
//!
//! - A child of the server that is a registered direct child belongs to the scope it was
//!   placed in (`subreaper::direct_child`).
//! - Another child of the server (an orphan re-parented to us, the subreaper) belongs to the
//!   scope whose direct child's pid equals its **session id**: every direct child starts its
//!   own session, and a process can only leave a session by starting its own. The map from
//!   session id to scope is kept by [`Containment`](super::Containment) (latest registration
//!   wins: a pid can become a direct child again only once the previous session of that
//!   number had no member left).
//! - A child of the server in the server's own session is **foreign** (not started through
//!   `spawn.rs`): never touched.
//! - Anything else at the top is **unattributed**: only shutdown kills it.
//! - Below the top, a process belongs to its parent's owner.
//!
//! What this cannot attribute is listed in SECURITY.md ("Process containment").

use std::collections::{HashMap, HashSet};
use std::io;
use std::time::Instant;

use nix::sys::signal::Signal;

use super::pidfd::{wait_all_exited, Delivery, Pidfd};
use super::procfs::{self, ProcStat};
use super::{subreaper, sys, ScopeId};

/// Most processes one walk keeps (wanted members, each holding a pidfd until the kill is
/// over). Processes the walk looks at and does not want are closed at once and not counted.
/// A walk that reaches the limit reports itself truncated and the kill loop goes round again
/// after killing what it holds.
pub const MAX_WALK_PROCESSES: usize = 4096;
/// Stop–collect rounds (walk, SIGSTOP the new ones, walk again) and kill rounds before a
/// kill gives up on a tree that keeps growing.
pub const MAX_TREE_KILL_ROUNDS: usize = 16;

/// Who a process in the server's tree belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Owner {
    /// A session scope.
    Scope(ScopeId),
    /// Started by a session, but which one is unknown (see the module docs).
    Unattributed,
    /// Not started through `spawn.rs` (the server's own session).
    Foreign,
}

/// One verified process of the tree.
#[derive(Debug)]
pub struct Member {
    /// Its pidfd, opened before its stat was read.
    pub pidfd: Pidfd,
    /// Its stat as read during the walk.
    pub stat: ProcStat,
    /// Its owner.
    pub owner: Owner,
    /// Distance from the server (its children are 1).
    pub depth: usize,
}

/// The result of one walk.
#[derive(Debug, Default)]
pub struct Walk {
    /// Live (not zombie) processes whose owner was wanted.
    pub members: Vec<Member>,
    /// The walk stopped at [`MAX_WALK_PROCESSES`].
    pub truncated: bool,
}

/// Walk the server's tree, descending only into subtrees whose owner `want` accepts.
/// `sessions` maps session ids to scopes (see the module docs).
pub fn walk(sessions: &HashMap<u32, ScopeId>, want: &dyn Fn(Owner) -> bool) -> io::Result<Walk> {
    let me = std::process::id();
    let own_sid = sys::own_session_id();
    let mut out = Walk::default();
    // (pid, its pidfd unless it is the server, owner, depth); pidfds of nodes to expand are
    // kept in `out.members` (live) or here (zombies have no children: never expanded).
    let mut stack: Vec<(u32, Option<usize>, Owner, usize)> = vec![(me, None, Owner::Foreign, 0)];
    while let Some((pid, idx, owner, depth)) = stack.pop() {
        let kids = procfs::children(pid)?;
        for c in kids {
            if out.members.len() >= MAX_WALK_PROCESSES {
                out.truncated = true;
                return Ok(out);
            }
            let Ok(fd) = Pidfd::open(c) else { continue };
            let Ok(st) = procfs::read_stat(c) else {
                continue;
            };
            if st.ppid != pid || !fd.is_unreaped() {
                continue;
            }
            if let Some(i) = idx {
                if !out.members[i].pidfd.is_unreaped() {
                    break; // the parent is gone: its list is stale
                }
            }
            let child_owner = if depth == 0 {
                top_owner(c, &st, own_sid, sessions)
            } else {
                owner
            };
            if !want(child_owner) || st.is_dead() {
                continue;
            }
            out.members.push(Member {
                pidfd: fd,
                stat: st,
                owner: child_owner,
                depth: depth + 1,
            });
            stack.push((c, Some(out.members.len() - 1), child_owner, depth + 1));
        }
    }
    Ok(out)
}

fn top_owner(pid: u32, st: &ProcStat, own_sid: u32, sessions: &HashMap<u32, ScopeId>) -> Owner {
    if let Some(d) = subreaper::direct_child(pid) {
        return d.scope().map(Owner::Scope).unwrap_or(Owner::Unattributed);
    }
    if st.sid == own_sid {
        return Owner::Foreign;
    }
    match sessions.get(&st.sid) {
        Some(s) => Owner::Scope(*s),
        None => Owner::Unattributed,
    }
}

/// What a tree kill did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TreeKill {
    /// Processes sent SIGKILL.
    pub signalled: usize,
    /// Whether a final walk found none left (alive) by the deadline.
    pub emptied: bool,
    /// Some walk hit [`MAX_WALK_PROCESSES`].
    pub truncated: bool,
}

/// Kill every process of the tree whose owner `want` accepts: stop them all (SIGSTOP, so
/// none can fork or be re-parented while we look), walking again until no new one appears,
/// then SIGKILL deepest first, wait for them to exit, and check with a fresh walk.
pub fn kill(
    sessions: &dyn Fn() -> HashMap<u32, ScopeId>,
    want: &dyn Fn(Owner) -> bool,
    deadline: Instant,
) -> io::Result<TreeKill> {
    let mut report = TreeKill::default();
    for _ in 0..MAX_TREE_KILL_ROUNDS {
        let mut held: Vec<Member> = Vec::new();
        let mut seen: HashSet<(u32, u64)> = HashSet::new();
        for _ in 0..MAX_TREE_KILL_ROUNDS {
            let w = walk(&sessions(), want)?;
            report.truncated |= w.truncated;
            let mut new = 0;
            for m in w.members {
                if seen.insert((m.stat.pid, m.stat.starttime)) {
                    let _ = m.pidfd.signal(Signal::SIGSTOP);
                    held.push(m);
                    new += 1;
                }
            }
            if new == 0 || held.len() >= MAX_WALK_PROCESSES {
                break;
            }
        }
        if held.is_empty() {
            report.emptied = true;
            return Ok(report);
        }
        held.sort_by_key(|m| std::cmp::Reverse(m.depth));
        for m in &held {
            if m.pidfd.signal(Signal::SIGKILL)? == Delivery::Delivered {
                report.signalled += 1;
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let refs: Vec<&Pidfd> = held.iter().map(|m| &m.pidfd).collect();
        wait_all_exited(&refs, left)?;
        if Instant::now() >= deadline {
            break;
        }
    }
    report.emptied = walk(&sessions(), want)?.members.is_empty();
    Ok(report)
}

/// Send `sig` (`None`: only count) to every live process of the tree owned as `want` accepts
/// whose process group is `pgid`. Returns how many were reached.
pub fn signal_group(
    sessions: &HashMap<u32, ScopeId>,
    want: &dyn Fn(Owner) -> bool,
    pgid: u32,
    sig: Option<Signal>,
) -> io::Result<usize> {
    let w = walk(sessions, want)?;
    let mut n = 0;
    for m in w.members.iter().filter(|m| m.stat.pgid == pgid) {
        let reached = match sig {
            Some(s) => m.pidfd.signal(s)? == Delivery::Delivered,
            None => m.pidfd.is_unreaped(),
        };
        if reached {
            n += 1;
        }
    }
    Ok(n)
}
