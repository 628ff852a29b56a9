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
//! **Handed over directly.** A client that routes what it receives itself (the library's
//! `RpcConnection::start_local`) installs a [`LocalReceiver`] on its end before it sends its
//! first request ([`LocalClientEnd::receive_directly`]). From then on replies are handed to it
//! by whoever makes them (the connection's reader for a request that did not wait, the
//! request's task otherwise) and events by the writer, with no channel and no client reader
//! task between: each of those was one more task made runnable per message, and on tokio's
//! multi-threaded runtime a second runnable task wakes an idle worker to steal it (a context
//! switch on each side; README, "Fewer thread hand-offs per exec"). The promises stay: a reply
//! never waits behind events (it does not pass the writer at all), a start's output still
//! follows its result (the action that opens delivery runs after the receiver took the
//! result), events of one process keep their order (one writer hands them over). Without a
//! receiver (tests that drive the raw end) everything travels through the channels.
//!
//! It must never drop an event or block the client's sender, and a [`LocalReceiver`] must
//! never block (it runs on the server's reader and writer). The in-process server that owns
//! the other end is `server::local::LocalServer`.

use std::sync::Arc;

use tokio::sync::mpsc;

use super::message::{Inbound, Outbound};
pub use super::outlet::LocalReceiver;
use super::outlet::{EventMessage, LocalOutlet, ReceiverSlot};
use crate::config::{
    ServerConfig, CONTROL_REQUEST_SLOTS, IN_PROCESS_EVENT_QUEUE, IN_PROCESS_REQUEST_QUEUE,
};

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
    pub(super) receiver: ReceiverSlot,
}

/// The client's end.
pub struct LocalClientEnd {
    requests: mpsc::Sender<Inbound>,
    /// Results, errors and server requests, in the order the writer sent them.
    pub control: mpsc::Receiver<Outbound>,
    /// Output deltas and exit notices, in `seq` order per process.
    pub events: mpsc::Receiver<EventMessage>,
    limits: LocalLimits,
    receiver: ReceiverSlot,
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
    let receiver = ReceiverSlot::default();
    (
        LocalClientEnd {
            requests: req_tx,
            control: ctl_rx,
            events: ev_rx,
            limits,
            receiver: receiver.clone(),
        },
        LocalServerEnd {
            inbound: req_rx,
            outlet: LocalOutlet {
                control: ctl_tx,
                events: ev_tx,
                permit: None,
                receiver: receiver.clone(),
            },
            receiver,
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

    /// Take replies and events through `receiver` from now on instead of the channels (see
    /// the module docs). Install it before sending anything: what was queued before stays in
    /// the channels. `false` if a receiver was installed already (it stays).
    pub fn receive_directly(&self, receiver: Arc<dyn LocalReceiver>) -> bool {
        self.receiver.set(receiver).is_ok()
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
