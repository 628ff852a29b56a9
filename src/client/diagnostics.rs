//! What the client can say about a process whose output stopped: its side of the delivery
//! (what arrived, what the application took, what was acknowledged) and the flow control of
//! the connection's transport in both directions. With the server's side (the stall
//! watchdog's report, or `execrelay serve`'s `stream state:` lines on `SIGUSR1`) it tells
//! who waits for whom.
//!
//! It only reads: it never sends, acknowledges or wakes anything.

use std::time::Duration;

use super::Client;
use crate::sync::lock;

/// The client's side of one process's delivery ([`Client::delivery_state`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryState {
    /// Highest event `seq` received (deduplicated).
    pub received_seq: u64,
    /// Highest `seq` the application took.
    pub consumed_seq: u64,
    /// Highest `seq` acknowledged to the server (`process/ack`).
    pub acked_seq: u64,
    /// Events received and not yet taken by the application.
    pub buffered_events: usize,
    /// The exit notice arrived.
    pub exit_received: bool,
    /// Since the last event arrived (or the start, or the last silence probe).
    pub since_last_event: Duration,
    /// Connections established so far (1 + resumes).
    pub connection: u64,
    /// The current connection's transport flow control in words, where it has one (a Noise
    /// stream); `None` otherwise, or while no connection is up.
    pub transport: Option<String>,
}

impl std::fmt::Display for DeliveryState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "received seq {} consumed {} acked {} buffered {} events{}; last event {:?} ago; \
             connection {}; transport: {}",
            self.received_seq,
            self.consumed_seq,
            self.acked_seq,
            self.buffered_events,
            if self.exit_received {
                ", exit received"
            } else {
                ""
            },
            self.since_last_event,
            self.connection,
            self.transport
                .as_deref()
                .unwrap_or("no flow control of its own, or no connection"),
        )
    }
}

impl Client {
    /// The client's side of the delivery of `process_id`, while a handle of it is alive (its
    /// exit notice not yet taken); `None` otherwise.
    pub fn delivery_state(&self, process_id: &str) -> Option<DeliveryState> {
        let mut state = lock(&self.shared.procs).get(process_id)?.delivery();
        state.connection = self.connection_count();
        state.transport = lock(&self.shared.conn)
            .as_ref()
            .filter(|c| !c.is_closed())
            .and_then(|c| c.flow_state());
        Some(state)
    }
}
