//! What the server sends unasked, as the client's reader hands it on: [`Notification`],
//! and the two ways it leaves the reader task ([`NotificationSink`], [`FastPath`]).
//!
//! Owns only these types. It must never decode or route: the reader tasks (`network.rs`,
//! `local_router.rs`) build them, `event_stream.rs` consumes them.

use std::sync::Arc;

use serde_json::Value;
use tokio::sync::mpsc;

use crate::rpc::messages::{ExitInfo, StreamName};
use crate::rpc::notification::OutputDelta;

/// A notification from the server. Output deltas are decoded on the reader task without
/// building a JSON tree (they carry almost every byte).
#[derive(Debug)]
pub enum Notification {
    /// `process/outputDelta`, decoded.
    Output {
        /// The process.
        process_id: String,
        /// Its seq.
        seq: u64,
        /// `stdout`, `stderr` or `pty`.
        stream: StreamName,
        /// Raw bytes.
        data: bytes::Bytes,
    },
    /// `process/outputOmitted`, typed (from an in-process connection).
    Omitted {
        /// The process.
        process_id: String,
        /// Its seq.
        seq: u64,
        /// Which stream.
        stream: StreamName,
        /// Bytes not kept.
        omitted_bytes: u64,
    },
    /// `process/exited`, typed (from an in-process connection).
    Exited {
        /// The process.
        process_id: String,
        /// Its seq.
        seq: u64,
        /// The exit notice.
        info: ExitInfo,
    },
    /// Any other notification.
    Other {
        /// Method.
        method: String,
        /// Params.
        params: Value,
    },
}

impl From<OutputDelta> for Notification {
    fn from(d: OutputDelta) -> Self {
        Notification::Output {
            process_id: d.process_id,
            seq: d.seq,
            stream: d.stream,
            data: d.data,
        }
    }
}

/// Receives every notification, in wire order, from the reader task, which never waits for
/// it: the router may itself be waiting for a response (filling a gap with `process/read`)
/// that only the reader can deliver. The queue is bounded by the server instead: with acks it
/// sends at most `retainedOutputBytes` per process beyond what this client acknowledged.
pub type NotificationSink = mpsc::UnboundedSender<Notification>;

/// Called on the reader task for each notification before it is queued: returns `None` when
/// it handled it (the common case of in-order output, saving a task hop per message).
pub type FastPath = Arc<dyn Fn(Notification) -> Option<Notification> + Send + Sync>;
