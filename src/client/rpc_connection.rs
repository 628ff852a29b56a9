//! One client-side JSON-RPC connection: request/response correlation and notification
//! routing over a [`Transport`].
//!
//! A reader task routes responses to their waiting callers and notifications to one handler;
//! a writer task owns the sink. It knows nothing of sessions or reconnection: the [`Client`]
//! (`client/mod.rs`) builds those on top and replaces a dead connection with a new one.
//!
//! Output deltas arrive in either form (`protocol.md` §5.1), whatever was negotiated: a binary
//! message (told from JSON by its first byte) is decoded by `rpc/binary_output.rs`, a JSON
//! delta by the fast decoder of `rpc/notification.rs`. A malformed binary message ends the
//! connection with a [`ClientError::Protocol`] that names what was wrong
//! ([`RpcConnection::failure`]); the reader never panics on what the server sends.
//!
//! [`Client`]: super::Client

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::ClientError;
use crate::rpc::binary_output::{decode_output_message, is_binary_message};
use crate::rpc::jsonrpc::{encode_notification, encode_request, parse_inbound, Inbound};
use crate::rpc::messages::StreamName;
use crate::rpc::notification::{decode_output_delta, OutputDelta};
use crate::sync::lock;
use crate::transport::Transport;

/// Outbound messages queued for the writer task. Bounded so a dead peer cannot make the
/// client buffer without limit.
const OUTBOUND_QUEUE: usize = 256;

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Result<Value, ClientError>>>>>;

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

/// A live connection.
#[derive(Clone)]
pub struct RpcConnection {
    out: mpsc::Sender<String>,
    pending: Pending,
    next_id: Arc<AtomicU64>,
    closed: CancellationToken,
    failure: Arc<Mutex<Option<ClientError>>>,
}

impl RpcConnection {
    /// Start the reader and writer tasks over `transport`.
    pub fn start(
        transport: Transport,
        notifications: NotificationSink,
        fast: Option<FastPath>,
    ) -> RpcConnection {
        let (out_tx, mut out_rx) = mpsc::channel::<String>(OUTBOUND_QUEUE);
        let pending: Pending = Arc::new(Mutex::new(HashMap::new()));
        let closed = CancellationToken::new();
        let Transport {
            mut incoming,
            mut outgoing,
            ..
        } = transport;

        let c = closed.clone();
        tokio::spawn(async move {
            loop {
                let msg = tokio::select! {
                    _ = c.cancelled() => break,
                    m = out_rx.recv() => m,
                };
                let Some(msg) = msg else { break };
                if outgoing.feed(msg.into()).await.is_err() {
                    break;
                }
                // Batch whatever else is queued before flushing.
                let mut ok = true;
                while let Ok(m) = out_rx.try_recv() {
                    if outgoing.feed(m.into()).await.is_err() {
                        ok = false;
                        break;
                    }
                }
                if !ok || outgoing.flush().await.is_err() {
                    break;
                }
            }
            let _ = outgoing.close().await;
            c.cancel();
        });

        let p = pending.clone();
        let c = closed.clone();
        let failure: Arc<Mutex<Option<ClientError>>> = Arc::default();
        let failed = failure.clone();
        tokio::spawn(async move {
            // Hand an output delta to the fast path, else to the router; false once the
            // router is gone.
            let deliver = |d: OutputDelta| {
                let n = Notification::from(d);
                let n = match &fast {
                    Some(f) => match f(n) {
                        Some(n) => n,
                        None => return true,
                    },
                    None => n,
                };
                notifications.send(n).is_ok()
            };
            loop {
                let item = tokio::select! {
                    _ = c.cancelled() => break,
                    m = incoming.next() => m,
                };
                let Some(Ok(bytes)) = item else { break };
                // Binary output messages (§5.1): decoded and checked, the chunk a slice of the
                // received buffer. A malformed one ends the connection with its reason.
                if is_binary_message(&bytes) {
                    match decode_output_message(bytes::Bytes::from(bytes)) {
                        Ok(d) => {
                            if !deliver(d) {
                                break;
                            }
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "malformed binary message from the server");
                            *lock(&failed) = Some(ClientError::Protocol(format!(
                                "malformed binary output message from the server: {e}"
                            )));
                            break;
                        }
                    }
                    continue;
                }
                // Output deltas as execrelay writes them in JSON take the fast path (no JSON
                // tree); anything else, the general one.
                if let Some(d) = decode_output_delta(&bytes) {
                    if !deliver(d) {
                        break;
                    }
                    continue;
                }
                match parse_inbound(&bytes) {
                    Ok(Inbound::Response { id, outcome }) => {
                        let Some(id) = id.as_u64() else { continue };
                        let tx = lock(&p).remove(&id);
                        if let Some(tx) = tx {
                            let _ = tx.send(outcome.map_err(ClientError::from_error_object));
                        }
                    }
                    Ok(Inbound::Notification { method, params }) => {
                        if notifications
                            .send(Notification::Other { method, params })
                            .is_err()
                        {
                            break;
                        }
                    }
                    Ok(Inbound::Request { .. }) => {}
                    Err(r) => {
                        // A server error not tied to a request (id null), e.g. a framing error.
                        tracing::debug!(error = %r.error, "unparseable message from server");
                    }
                }
            }
            c.cancel();
            // Fail every waiting call: the connection is gone (for the reason it broke, if the
            // server broke the protocol).
            let why = lock(&failed).clone().unwrap_or(ClientError::ConnectionLost);
            for (_, tx) in lock(&p).drain() {
                let _ = tx.send(Err(why.clone()));
            }
        });

        RpcConnection {
            out: out_tx,
            pending,
            next_id: Arc::new(AtomicU64::new(1)),
            closed,
            failure,
        }
    }

    /// Why the connection ended, when the server broke the protocol (a malformed binary
    /// message); `None` while it is open or when it simply closed.
    pub fn failure(&self) -> Option<ClientError> {
        lock(&self.failure).clone()
    }

    /// Send a request and wait for its result.
    pub async fn call(&self, method: &str, params: Value) -> Result<Value, ClientError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        lock(&self.pending).insert(id, tx);
        if self.closed.is_cancelled() {
            lock(&self.pending).remove(&id);
            return Err(ClientError::ConnectionLost);
        }
        let text = encode_request(&Value::from(id), method, &params);
        if self.out.send(text).await.is_err() {
            lock(&self.pending).remove(&id);
            return Err(ClientError::ConnectionLost);
        }
        tokio::select! {
            r = rx => r.unwrap_or(Err(ClientError::ConnectionLost)),
            _ = self.closed.cancelled() => {
                lock(&self.pending).remove(&id);
                Err(self.failure().unwrap_or(ClientError::ConnectionLost))
            }
        }
    }

    /// Send a notification.
    pub async fn notify(&self, method: &str, params: Value) -> Result<(), ClientError> {
        self.out
            .send(encode_notification(method, &params))
            .await
            .map_err(|_| ClientError::ConnectionLost)
    }

    /// Whether the connection is gone.
    pub fn is_closed(&self) -> bool {
        self.closed.is_cancelled()
    }

    /// Resolves when the connection is gone.
    pub async fn closed(&self) {
        self.closed.cancelled().await
    }

    /// Drop the connection now.
    pub fn close(&self) {
        self.closed.cancel();
    }
}
