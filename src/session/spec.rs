//! What the session layer is handed: a validated start ([`StartSpec`]) and what a connection
//! brings when it holds a session ([`ConnHandle`]). Plain data: decoded and checked by the
//! connection, never JSON here.

use std::net::IpAddr;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::approvals::RequestSink;
use crate::process::spawn::SpawnSpec;
use crate::process::{ProcessOptions, ReadySet};

/// A validated `process/start`: what to spawn and how to run it. The connection's handler
/// decodes and validates the params and applies the defaults; the session never sees JSON.
#[derive(Debug, Clone, PartialEq)]
pub struct StartSpec {
    /// The client-chosen id (1 to `MAX_PROCESS_ID_BYTES` bytes).
    pub process_id: String,
    /// What to spawn.
    pub spawn: SpawnSpec,
    /// How to run it (timeouts, caps, grace).
    pub options: ProcessOptions,
}

/// What a connection brings when it attaches a session.
#[derive(Clone)]
pub struct ConnHandle {
    /// Unique per server.
    pub conn_id: u64,
    /// Where the session's events go while attached.
    pub ready: Arc<ReadySet>,
    /// Cancelled when another connection takes the session over.
    pub evict: CancellationToken,
    /// The client's static public key on a Noise channel (sessions are bound to it).
    pub peer_key: Option<Vec<u8>>,
    /// The peer's IP address (the `ws://` connection's, or the Noise link's), for the
    /// per-address quotas; `None` on stdio.
    pub peer_addr: Option<IpAddr>,
    /// Where server requests (`process/approve`) go while this connection holds the session;
    /// `None` when the client did not declare it can answer them.
    pub requests: Option<RequestSink>,
}
