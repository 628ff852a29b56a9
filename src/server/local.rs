//! The in-process exec server (`Client::in_process`): the registry the composition root
//! builds ([`compose`](super::compose)) and one connection over the in-process transport
//! (`connection/local.rs`), whose client end the caller holds.
//!
//! It must never signal a process by a number: its shutdown is the network server's,
//! through containment.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::{ServerConfig, SHUTDOWN_DELIVERY_GRACE_MS};
use crate::connection::local::{local_pair, LocalClientEnd, LocalLimits};
use crate::connection::{ConnectionOptions, ConnectionProcessor};
use crate::policy::PolicyFile;
use crate::process::containment::StartError;
use crate::session::SessionRegistry;

/// An exec server in this process: its own [`SessionRegistry`] (with its own containment, as
/// a network server has) and one connection ([`ConnectionProcessor::run_local`]) whose client
/// end the caller holds. The session lives as long as the connection (as on stdio): when it
/// ends, everything it started is ended.
pub struct LocalServer {
    registry: Arc<SessionRegistry>,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl LocalServer {
    /// Start a server with `config` (and `policy`), its connection's channels sized by
    /// `limits`; the client end is returned beside it. It is composed as a network server is
    /// ([`compose`](super::compose): containment first), and containment's failure is this
    /// one's.
    pub fn start(
        config: Arc<ServerConfig>,
        policy: Option<Arc<PolicyFile>>,
        limits: LocalLimits,
    ) -> Result<(LocalServer, LocalClientEnd), StartError> {
        let registry = super::compose(config, policy)?;
        let (client, server) = local_pair(limits);
        let stop = CancellationToken::new();
        let opts = ConnectionOptions {
            close_session_on_end: true,
            peer_key: None,
            answer_after_eof: false,
            // In process: no peer address for quotas, and the application decides how long
            // its client lives (it never idles out).
            peer_addr: None,
            idle_timeout: None,
        };
        let task = tokio::spawn({
            let (registry, stop) = (registry.clone(), stop.clone());
            async move {
                ConnectionProcessor::run_local(server, registry, opts, stop).await;
            }
        });
        Ok((
            LocalServer {
                registry,
                stop,
                task,
            },
            client,
        ))
    }

    /// The server's registry (its sessions and metrics).
    pub fn registry(&self) -> &Arc<SessionRegistry> {
        &self.registry
    }

    /// Shut down within `deadline`, whatever the client does (it may have stopped reading
    /// with both queues full), by the network server's sequence
    /// ([`SessionRegistry::shutdown`]) with its waits cut to the deadline: `SIGTERM` to every
    /// process (`SIGKILL` after its capped `killGraceMs`) and up to half the deadline for the
    /// exit notices; then everything any session started is killed through containment (each
    /// session's cgroup, by `cgroup.kill` where the kernel has it, and what the tree walk
    /// attributes to this server), never by a process-group number; then the connection ends
    /// and its session is closed, its scope and the instance cgroup removed. When this
    /// returns, no process of this server runs (unless one resisted `SIGKILL` past the
    /// deadline, which only an uninterruptible sleep can do; it is logged).
    pub async fn shutdown(self, deadline: Duration) {
        let end = Instant::now() + deadline;
        let half = Instant::now() + deadline / 2;
        let delivery_grace = Duration::from_millis(SHUTDOWN_DELIVERY_GRACE_MS);
        // An application that stopped reading never lets the exit notices out: half the
        // deadline is all they get.
        let _ = tokio::time::timeout_at(half, self.registry.terminate_all(delivery_grace)).await;
        if tokio::time::timeout_at(end, self.registry.kill_everything())
            .await
            .is_err()
        {
            tracing::warn!("in-process shutdown: killing every process outlived the deadline");
        }
        // Pumps waiting for room in a log nobody reads quit with their closed session.
        self.stop.cancel();
        if tokio::time::timeout_at(end, self.registry.close_all())
            .await
            .is_err()
        {
            tracing::warn!("in-process shutdown: closing the session outlived the deadline");
        }
        let mut task = self.task;
        if tokio::time::timeout_at(end, &mut task).await.is_err() {
            task.abort();
        }
    }
}
