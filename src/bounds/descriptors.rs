//! File descriptors: the process's `RLIMIT_NOFILE`, raised to its hard limit at start, the
//! count of descriptors open now, and the reserve kept for spawns.
//!
//! Every connection and link holds a socket, and every process three or four descriptors
//! (pipes or a PTY, its pidfd), plus a few more while it is being spawned. When they run out,
//! whatever asks next fails: if that is a spawn, a client gets `-32603` for another client's
//! connections. So the server refuses a new connection or link while fewer than
//! [`DescriptorReserve`]'s reserve are free: connections are turned away before any spawn
//! can fail for want of a descriptor.

use std::io;

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
    }
    Ok((before, nofile_limit()?))
}

/// How many descriptors this process has open now (`/proc/self/fd`, not counting the one
/// that reads it). Costs one directory read: called once per new connection or link, never
/// on a data path.
pub fn open_descriptors() -> io::Result<usize> {
    let entries = std::fs::read_dir("/proc/self/fd")?;
    // The directory's own descriptor is listed too.
    Ok(entries.count().saturating_sub(1))
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn open_descriptors_follow_opens_and_closes() {
        let before = open_descriptors().unwrap();
        let files: Vec<std::fs::File> = (0..5)
            .map(|_| std::fs::File::open("/proc/self/status").unwrap())
            .collect();
        // Other test threads may open descriptors meanwhile: at least ours are counted.
        assert!(open_descriptors().unwrap() >= before + 5);
        drop(files);
    }

    #[test]
    fn the_limit_reads_and_never_goes_down() {
        let l = nofile_limit().unwrap();
        assert!(l.soft <= l.hard);
        let (before, after) = raise_nofile_limit().unwrap();
        assert!(after.soft >= before.soft);
        assert_eq!(after.hard, before.hard);
    }
}
