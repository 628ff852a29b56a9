//! The start of containment, once per server, before its first spawn: the backend, the crash
//! sweep, and the subreaper. The composition root (`server::compose`) calls it for the network
//! server (`server::Server::new`) and the in-process one (`server::LocalServer::start`), so
//! every server, wherever it runs, places and kills its sessions the same way.
//!
//! It must never fall back silently: a cgroup backend named explicitly that cannot work here
//! is an error, and so is a subreaper that cannot start.

use super::{subreaper, Containment, ContainmentConfig, ContainmentError};
use crate::config::ServerConfig;

/// Why a server cannot start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The containment backend cannot work here (a cgroup backend named explicitly and
    /// unavailable, or bad containment settings).
    #[error(transparent)]
    Containment(#[from] ContainmentError),
    /// The server cannot become a child subreaper, or its reaper thread cannot start.
    #[error("cannot become a child subreaper: {0}")]
    Subreaper(std::io::Error),
}

/// Set up process containment before the first spawn: the backend of `containment_backend`
/// (a cgroup backend named explicitly that cannot work here is an error, never a silent
/// fallback), the crash sweep (instance cgroups of servers of the same `cgroup_name` that
/// died are killed and removed, with everything left in them), and the subreaper with its
/// reaper thread (once per process).
pub fn start_containment(config: &ServerConfig) -> Result<Containment, StartError> {
    let containment = Containment::new(&ContainmentConfig::from_server(config))?;
    let swept = containment.sweep_stale();
    if swept.processes_killed > 0 || !swept.failures.is_empty() || swept.skipped > 0 {
        tracing::warn!(
            instances = swept.instances_removed,
            killed = swept.processes_killed,
            failures = ?swept.failures,
            skipped = swept.skipped,
            "crash sweep: killed what servers that died left running"
        );
    } else if swept.instances_removed > 0 {
        tracing::info!(
            instances = swept.instances_removed,
            "crash sweep: removed empty cgroups of servers that died"
        );
    }
    subreaper::start_reaper().map_err(StartError::Subreaper)?;
    Ok(containment)
}
