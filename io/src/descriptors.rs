//! File descriptors: the process's `RLIMIT_NOFILE`, raised to its hard limit at start, the
//! count of descriptors open now, the exec server's reserve kept for spawns, and the relay's
//! caps derived from the limit. Shared by both binaries (the main crate re-exports this module
//! as `execrelay::bounds::descriptors`).
//!
//! **Exec server.** Every connection and link holds a socket, and every process three or four
//! descriptors (pipes or a PTY, its pidfd), plus a few more while it is being spawned. When
//! they run out, whatever asks next fails: if that is a spawn, a client gets `-32603` for
//! another client's connections. So the server refuses a new connection or link while fewer
//! than [`DescriptorReserve`]'s reserve are free: connections are turned away before any spawn
//! can fail for want of a descriptor.
//!
//! **Relay.** Every link and every connection before its upgrade holds one socket. The relay
//! sizes its caps from the limit ([`RelayDescriptorPlan::derive`]) so that client links and
//! connections before their upgrade can never take the descriptors kept for environment links
//! (a restarting exec server must get back in) and for the metrics listener, whatever clients
//! do: the caps are counted by construction, so no descriptor count is read per connection.
//!
//! It never reads a clock; [`RelayDescriptorPlan::derive`] is a plain function of its inputs.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

/// The descriptor limits of this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NofileLimit {
    /// The soft limit: what `open`, `accept`, `pipe` are held to.
    pub soft: u64,
    /// The hard limit: how far an unprivileged process may raise the soft one.
    pub hard: u64,
}

/// This process's `RLIMIT_NOFILE`.
pub fn nofile_limit() -> io::Result<NofileLimit> {
    use nix::sys::resource::{getrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(io::Error::from)?;
    Ok(NofileLimit { soft, hard })
}

/// The most descriptors the kernel lets one process have (`/proc/sys/fs/nr_open`): a hard
/// limit of "infinity" cannot be used as a soft limit above it.
fn nr_open() -> Option<u64> {
    std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

/// Raise the soft `RLIMIT_NOFILE` to the hard limit (capped by `nr_open`). Returns the limits
/// before and after. Distributions ship a soft limit of 1024 for `select()`'s sake, which
/// this server never uses; the hard limit is what the operator allowed.
pub fn raise_nofile_limit() -> io::Result<(NofileLimit, NofileLimit)> {
    use nix::sys::resource::{setrlimit, Resource};
    let before = nofile_limit()?;
    let mut target = before.hard;
    if let Some(max) = nr_open() {
        target = target.min(max);
    }
    if target > before.soft {
        setrlimit(Resource::RLIMIT_NOFILE, target, before.hard).map_err(io::Error::from)?;
        // Only the first raise knows the limit the process was started with.
        let _ = STARTED_SOFT.compare_exchange(0, before.soft, Ordering::Relaxed, Ordering::Relaxed);
    }
    Ok((before, nofile_limit()?))
}

/// The soft limit this process was started with, once [`raise_nofile_limit`] raised it (0:
/// never raised).
static STARTED_SOFT: AtomicU64 = AtomicU64::new(0);

/// The soft `RLIMIT_NOFILE` this process was started with, if [`raise_nofile_limit`] has
/// raised it since; `None` if it was never raised.
///
/// The exec server's children get this one back: the raise is for the server's own
/// connections, and a program started with a soft limit of a million would pay for it in
/// every loop that closes descriptors up to the limit, and could be handed descriptors that
/// `select()` cannot take. Programs that need more raise it themselves, as under systemd.
pub fn started_nofile_soft() -> Option<u64> {
    match STARTED_SOFT.load(Ordering::Relaxed) {
        0 => None,
        soft => Some(soft),
    }
}

/// How many descriptors this process has open now (`/proc/self/fd`, not counting the one
/// that reads it). Costs one directory read: called once per new connection or link, never
/// on a data path.
pub fn open_descriptors() -> io::Result<usize> {
    // The directory's own descriptor is listed too.
    Ok(listed_descriptors()?.len().saturating_sub(1))
}

/// The descriptor numbers `/proc/self/fd` lists, the one that reads it included.
fn listed_descriptors() -> io::Result<Vec<i32>> {
    let mut fds = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd")? {
        if let Some(fd) = entry?.file_name().to_str().and_then(|n| n.parse().ok()) {
            fds.push(fd);
        }
    }
    Ok(fds)
}

/// Fewer descriptors are free than the reserve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{free} file descriptors free, below the reserve of {reserve}")]
pub struct LowOnDescriptors {
    /// Free descriptors (the soft limit minus those open), 0 if they could not be counted.
    pub free: u64,
    /// The reserve.
    pub reserve: u64,
}

/// Descriptors kept free for spawns: a new connection or link is admitted only while more
/// than `reserve` descriptors are free.
#[derive(Debug, Clone, Copy)]
pub struct DescriptorReserve {
    reserve: u64,
}

impl DescriptorReserve {
    /// Keep `reserve` descriptors free.
    pub fn new(reserve: usize) -> DescriptorReserve {
        DescriptorReserve {
            reserve: reserve as u64,
        }
    }

    /// The rule, sans-IO: admit while more than the reserve is free.
    pub fn admits(&self, limit: u64, open: u64) -> Result<(), LowOnDescriptors> {
        let free = limit.saturating_sub(open);
        if free > self.reserve {
            Ok(())
        } else {
            Err(LowOnDescriptors {
                free,
                reserve: self.reserve,
            })
        }
    }

    /// Whether a new connection or link may be admitted now. A process that cannot even
    /// read its descriptor table is out of descriptors: refused.
    pub fn check(&self) -> Result<(), LowOnDescriptors> {
        let counted = nofile_limit().and_then(|l| Ok((l.soft, open_descriptors()?)));
        match counted {
            Ok((limit, open)) => self.admits(limit, open as u64),
            Err(_) => Err(LowOnDescriptors {
                free: 0,
                reserve: self.reserve,
            }),
        }
    }
}

/// Descriptors the relay keeps for itself whatever its caps: standard streams, its listeners,
/// the runtime's epoll and wake-up descriptors, reads of the environments file and of
/// `/proc`, log files. Generous: the real count is about 15.
pub const RELAY_FIXED_DESCRIPTORS: u64 = 64;

/// What the relay's configuration asks of the descriptor limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelayDescriptorNeeds {
    /// `max_client_links`.
    pub client_links: u64,
    /// `max_pending_handshakes`: connections of the relay's listener before their upgrade.
    pub pending_handshakes: u64,
    /// The metrics listener: its socket and its scrapes at once (`MAX_METRICS_SCRAPES` + 1).
    pub metrics: u64,
    /// `descriptor_reserve`: descriptors that client links and connections before their
    /// upgrade never take, kept for environment links (admitted, or in their link handshake).
    pub reserve: u64,
}

/// The relay's caps, derived from its descriptor limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelayDescriptorPlan {
    /// The soft `RLIMIT_NOFILE` they were derived from.
    pub limit: u64,
    /// Client links at once (at most `max_client_links`).
    pub client_links: u64,
    /// Connections before their upgrade (at most `max_pending_handshakes`).
    pub pending_handshakes: u64,
    /// Kept for environment links (at most `descriptor_reserve`).
    pub reserve: u64,
}

/// The descriptor limit cannot hold even one client link beside the fixed needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the open files limit ({limit}) is too low for a relay: it needs more than {needed} \
     (raise `ulimit -n`, or the service's LimitNOFILE)"
)]
pub struct TooFewDescriptors {
    /// The limit.
    pub limit: u64,
    /// The least that works.
    pub needed: u64,
}

impl RelayDescriptorPlan {
    /// The caps for `limit` descriptors. The fixed needs ([`RELAY_FIXED_DESCRIPTORS`] and the
    /// metrics listener's) come first; of the rest (`B`), the environments' reserve and the
    /// connections before their upgrade may each take at most a quarter when the limit is
    /// tight, and client links what is left:
    ///
    /// ```text
    /// B            = limit − fixed − metrics
    /// reserve      = min(descriptor_reserve, B / 4)
    /// pending      = min(max_pending_handshakes, B / 4)
    /// client_links = min(max_client_links, B − reserve − pending)
    /// ```
    ///
    /// so `fixed + metrics + pending + client_links + reserve ≤ limit` always: client links
    /// and pending connections together never take the reserve or the metrics listener's
    /// share.
    pub fn derive(
        limit: u64,
        needs: RelayDescriptorNeeds,
    ) -> Result<RelayDescriptorPlan, TooFewDescriptors> {
        let fixed = RELAY_FIXED_DESCRIPTORS + needs.metrics;
        // At least a handful of each kind, or the relay is useless.
        let needed = fixed + 8;
        let budget = limit
            .checked_sub(fixed)
            .filter(|b| *b >= 8)
            .ok_or(TooFewDescriptors { limit, needed })?;
        let reserve = needs.reserve.min(budget / 4);
        let pending = needs.pending_handshakes.min(budget / 4).max(1);
        let client_links = needs
            .client_links
            .min(budget.saturating_sub(reserve + pending))
            .max(1);
        Ok(RelayDescriptorPlan {
            limit,
            client_links,
            pending_handshakes: pending,
            reserve,
        })
    }

    /// Whether a cap was lowered below what was configured.
    pub fn lowered(&self, needs: &RelayDescriptorNeeds) -> bool {
        self.client_links < needs.client_links
            || self.pending_handshakes < needs.pending_handshakes
            || self.reserve < needs.reserve
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn needs() -> RelayDescriptorNeeds {
        RelayDescriptorNeeds {
            client_links: 4096,
            pending_handshakes: 1024,
            metrics: 9,
            reserve: 1024,
        }
    }

    /// With a large limit the configured caps stand; with a tight one they shrink, and the
    /// sum of everything the relay may hold never passes the limit, at every limit from the
    /// least that works upwards. Below it, the relay does not start.
    #[test]
    fn the_relays_caps_fit_the_limit_and_keep_the_reserve() {
        let n = needs();
        let big = RelayDescriptorPlan::derive(1 << 20, n).unwrap();
        assert_eq!(
            (big.client_links, big.pending_handshakes, big.reserve),
            (4096, 1024, 1024)
        );
        assert!(!big.lowered(&n));
        let fixed = RELAY_FIXED_DESCRIPTORS + n.metrics;
        for limit in fixed + 8..20_000 {
            let p = RelayDescriptorPlan::derive(limit, n).unwrap();
            assert!(
                fixed + p.pending_handshakes + p.client_links + p.reserve <= limit,
                "{limit}: {p:?}"
            );
            assert!(p.client_links >= 1 && p.pending_handshakes >= 1);
        }
        // The issue's 1024: a quarter each for the reserve and pending connections.
        let tight = RelayDescriptorPlan::derive(1024, n).unwrap();
        assert_eq!((tight.reserve, tight.pending_handshakes), (237, 237));
        assert_eq!(tight.client_links, 1024 - fixed - 2 * 237);
        assert!(tight.lowered(&n));
        let e = RelayDescriptorPlan::derive(fixed + 7, n).unwrap_err();
        assert_eq!(e.needed, fixed + 8);
        assert!(e.to_string().contains("ulimit -n"), "{e}");
    }

    #[test]
    fn the_reserve_admits_only_above_it() {
        let r = DescriptorReserve::new(10);
        assert!(r.admits(100, 89).is_ok(), "11 free");
        assert_eq!(
            r.admits(100, 90),
            Err(LowOnDescriptors {
                free: 10,
                reserve: 10
            })
        );
        assert_eq!(r.admits(100, 150).unwrap_err().free, 0, "never negative");
    }

    #[test]
    fn the_descriptors_held_are_listed_and_counted() {
        use std::os::fd::AsRawFd;
        let files: Vec<std::fs::File> = (0..5)
            .map(|_| std::fs::File::open("/proc/self/status").unwrap())
            .collect();
        // Other test threads open and close descriptors of their own meanwhile, so no count
        // taken before is comparable: only the descriptors this test holds are certain.
        let listed = listed_descriptors().unwrap();
        for f in &files {
            assert!(
                listed.contains(&f.as_raw_fd()),
                "{} in {listed:?}",
                f.as_raw_fd()
            );
        }
        assert!(open_descriptors().unwrap() >= files.len());
    }

    #[test]
    fn the_limit_reads_and_never_goes_down() {
        let l = nofile_limit().unwrap();
        assert!(l.soft <= l.hard);
        let (before, after) = raise_nofile_limit().unwrap();
        assert!(after.soft >= before.soft);
        assert_eq!(after.hard, before.hard);
        if after.soft > before.soft {
            // The first raise of the process (no other test raises it) is remembered.
            assert_eq!(started_nofile_soft(), Some(before.soft));
        }
    }
}
