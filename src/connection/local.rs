//! The in-process transport: a connection whose client is in the same process, reached
//! through **bounded channels of typed messages** (`message.rs`): no JSON, no base64, an
//! output chunk handed over as the log's own `Bytes`.
//!
//! ```text
//!  client ── requests (Inbound, try_send) ──────────────▶ ConnectionProcessor (run_local)
//!         ◀── control lane (Outbound: results, errors, server requests) ── writer
//!         ◀── events (EventMessage: output deltas, exit notices) ───────── writer
//! ```
//!
//! Three channels, three promises:
//! - **requests** ([`LocalLimits::requests`]): the client never waits to send one; a full
//!   queue is an overload answered at once by the client itself ([`LocalClientEnd::try_send`],
//!   `-32004` with `data.limit = "inProcessQueue"`).
//! - **control** ([`LocalLimits::control`], as large as the processor's control lane): results
//!   travel apart from events, so a reply never waits behind a full, unread event queue.
//! - **events** ([`LocalLimits::events`]): never dropped; when full the writer waits (serving
//!   control meanwhile), the logs fill and the children are held back, as on a network.
//!
//! It must never drop an event or block the client's sender, and never signal a process by a
//! number: its shutdown is the network server's, through containment.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::message::{Inbound, Outbound};
use super::outlet::{EventMessage, LocalOutlet};
use super::processor::{ConnectionOptions, ConnectionProcessor, CONTROL_REQUEST_SLOTS};
use crate::config::{
    ServerConfig, IN_PROCESS_EVENT_QUEUE, IN_PROCESS_REQUEST_QUEUE, SHUTDOWN_DELIVERY_GRACE_MS,
};
use crate::metrics::Metrics;
use crate::policy::PolicyFile;
use crate::process::containment::{start_containment, StartError};
use crate::session::SessionRegistry;

/// The capacities of one in-process connection's channels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalLimits {
    /// Client → server messages queued before [`LocalClientEnd::try_send`] reports an
    /// overload.
    pub requests: usize,
    /// Control-lane messages (results, errors, server requests) queued for the client.
    pub control: usize,
    /// Events queued for the client before the writer waits.
    pub events: usize,
}

impl LocalLimits {
    /// The defaults ([`IN_PROCESS_REQUEST_QUEUE`], [`IN_PROCESS_EVENT_QUEUE`]) and a control
    /// channel as large as the processor's control lane for `config`.
    pub fn for_config(config: &ServerConfig) -> LocalLimits {
        LocalLimits {
            requests: IN_PROCESS_REQUEST_QUEUE,
            control: config.max_pending_requests + CONTROL_REQUEST_SLOTS,
            events: IN_PROCESS_EVENT_QUEUE,
        }
    }
}

/// The server's end, for [`ConnectionProcessor::run_local`](super::ConnectionProcessor::run_local).
pub struct LocalServerEnd {
    pub(super) inbound: mpsc::Receiver<Inbound>,
    pub(super) outlet: LocalOutlet,
}

/// The client's end.
pub struct LocalClientEnd {
    requests: mpsc::Sender<Inbound>,
    /// Results, errors and server requests, in the order the writer sent them.
    pub control: mpsc::Receiver<Outbound>,
    /// Output deltas and exit notices, in `seq` order per process.
    pub events: mpsc::Receiver<EventMessage>,
    limits: LocalLimits,
}

/// Why a message could not be queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LocalSendError {
    /// The request queue is full: the server is behind (`-32004`, `inProcessQueue`).
    #[error("in-process request queue full")]
    Full,
    /// The server end is gone.
    #[error("in-process server gone")]
    Closed,
}

/// A connected pair of ends with `limits` (each at least 1).
pub fn local_pair(limits: LocalLimits) -> (LocalClientEnd, LocalServerEnd) {
    let (req_tx, req_rx) = mpsc::channel(limits.requests.max(1));
    let (ctl_tx, ctl_rx) = mpsc::channel(limits.control.max(1));
    let (ev_tx, ev_rx) = mpsc::channel(limits.events.max(1));
    (
        LocalClientEnd {
            requests: req_tx,
            control: ctl_rx,
            events: ev_rx,
            limits,
        },
        LocalServerEnd {
            inbound: req_rx,
            outlet: LocalOutlet {
                control: ctl_tx,
                events: ev_tx,
                permit: None,
            },
        },
    )
}

impl LocalClientEnd {
    /// Queue a message for the server without waiting.
    pub fn try_send(&self, msg: Inbound) -> Result<(), LocalSendError> {
        self.requests.try_send(msg).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => LocalSendError::Full,
            mpsc::error::TrySendError::Closed(_) => LocalSendError::Closed,
        })
    }

    /// A sender for messages that must not be lost to an overload (acks, approval answers):
    /// they wait for room instead.
    pub fn sender(&self) -> mpsc::Sender<Inbound> {
        self.requests.clone()
    }

    /// The capacities of this connection.
    pub fn limits(&self) -> LocalLimits {
        self.limits
    }

    /// Events queued and not yet taken.
    pub fn events_queued(&self) -> usize {
        self.events.len()
    }
}

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
    /// `limits`; the client end is returned beside it. Containment starts first, as for a
    /// network server ([`start_containment`]: the backend of `config`, the crash sweep, the
    /// subreaper), and its failure is this one's.
    pub fn start(
        config: Arc<ServerConfig>,
        policy: Option<Arc<PolicyFile>>,
        limits: LocalLimits,
    ) -> Result<(LocalServer, LocalClientEnd), StartError> {
        let containment = start_containment(&config)?;
        let registry = SessionRegistry::with_exec_policy(
            config,
            Arc::new(Metrics::new()),
            containment,
            policy,
        );
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
