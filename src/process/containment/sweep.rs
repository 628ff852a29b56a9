//! Crash recovery: at start, find the instance cgroups of servers that died without cleaning
//! up (SIGKILL, OOM kill, power to the process cut) and kill and remove them.
//!
//! An instance cgroup is named `<cgroup_name>-<pid>-<start time>-<n>` and sits in the server's
//! own cgroup. Its server is alive when a process with that pid *and* that start time exists
//! (a pid and a start time name one process per boot, and cgroups do not survive a reboot).
//! Otherwise everything in it — the grandchildren that the parent-death signal could not
//! reach — is killed (`cgroup.kill`, or freeze + SIGKILL by pidfd + thaw) and the directories
//! are removed, deepest first.
//!
//! It must never touch a directory whose name does not parse with the configured
//! `cgroup_name` exactly, nor one whose server is alive (its own instance included). Servers
//! that share a parent cgroup must share a pid namespace, or each would take the other for
//! dead.

use std::time::Instant;

use super::cgroup::{self, Cgroup, Hierarchy};
use super::KILL_WAIT_TIMEOUT;

/// Most directories one sweep looks at in one parent cgroup. A parent holding more entries
/// than this is not ours to walk (and a sweep must not delay start-up without bound); the
/// rest are left for the next start and counted in [`SweepReport::skipped`].
pub const MAX_SWEEP_ENTRIES: usize = 4096;

/// What a sweep did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Instance cgroups of dead servers that were removed.
    pub instances_removed: usize,
    /// Processes found in them (killed).
    pub processes_killed: usize,
    /// Instance cgroups of dead servers that could not be emptied or removed (with why).
    pub failures: Vec<String>,
    /// Entries not examined because of [`MAX_SWEEP_ENTRIES`].
    pub skipped: usize,
}

impl SweepReport {
    pub(super) fn merge(&mut self, o: SweepReport) {
        self.instances_removed += o.instances_removed;
        self.processes_killed += o.processes_killed;
        self.failures.extend(o.failures);
        self.skipped += o.skipped;
    }
}

/// Sweep `parent` (a server's own cgroup in hierarchy `h`) for dead instances named with
/// `base`.
pub fn sweep(parent: &Cgroup, h: Hierarchy, base: &str) -> SweepReport {
    let mut report = SweepReport::default();
    let entries = match std::fs::read_dir(&parent.dir) {
        Ok(e) => e,
        Err(e) => {
            report
                .failures
                .push(format!("cannot list {}: {e}", parent.dir.display()));
            return report;
        }
    };
    for (i, e) in entries.enumerate() {
        if i >= MAX_SWEEP_ENTRIES {
            report.skipped += 1;
            continue;
        }
        let Ok(e) = e else { continue };
        let Some(name) = e.file_name().to_str().map(str::to_string) else {
            continue;
        };
        let Some((pid, start)) = cgroup::parse_instance_name(&name, base) else {
            continue;
        };
        let inst = parent.child(&name);
        if !cgroup::is_cgroup_dir(&inst.dir) || cgroup::instance_owner_alive(pid, start) {
            continue;
        }
        match sweep_instance(&inst, h) {
            Ok(killed) => {
                report.instances_removed += 1;
                report.processes_killed += killed;
                // Processes outlived their server: worth an operator's attention. An empty
                // directory (a server killed after its sessions had ended) is housekeeping.
                if killed > 0 {
                    tracing::warn!(
                        cgroup = %inst.dir.display(),
                        killed,
                        "killed what a server that did not shut down cleanly left running"
                    );
                } else {
                    tracing::debug!(
                        cgroup = %inst.dir.display(),
                        "removed the empty cgroup of a server that did not shut down cleanly"
                    );
                }
            }
            Err(why) => {
                tracing::error!(cgroup = %inst.dir.display(), error = %why, "crash sweep failed");
                report
                    .failures
                    .push(format!("{}: {why}", inst.dir.display()));
            }
        }
    }
    report
}

/// Kill everything in a dead server's instance cgroup and remove it. Returns how many
/// processes were in it.
fn sweep_instance(inst: &Cgroup, h: Hierarchy) -> Result<usize, String> {
    let deadline = Instant::now() + KILL_WAIT_TIMEOUT;
    let killed = match h {
        Hierarchy::V2 => {
            let k = cgroup::kill_v2(inst, true, deadline).map_err(|e| e.to_string())?;
            if !k.emptied {
                return Err("processes left after the kill".into());
            }
            k.members_before
        }
        Hierarchy::V1Freezer => {
            let k = cgroup::kill_v1(inst, deadline).map_err(|e| e.to_string())?;
            if !k.emptied {
                return Err("processes left after the kill".into());
            }
            k.members_before
        }
        // The v1 pids hierarchy cannot freeze; the freezer sweep (same processes, swept
        // first) has killed them already. Anything left is killed by pidfd, unfrozen.
        Hierarchy::V1Pids => {
            let n = cgroup::kill_members(inst, h).map_err(|e| e.to_string())?;
            let empty = cgroup::wait_until(deadline, || Ok(inst.procs_recursive()?.is_empty()))
                .map_err(|e| e.to_string())?;
            if !empty {
                return Err("processes left after the kill".into());
            }
            n
        }
    };
    inst.remove_tree().map_err(|e| e.to_string())?;
    Ok(killed)
}
