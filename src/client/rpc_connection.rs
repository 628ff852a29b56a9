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
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

mod local_router;
mod network;
mod notification;
#[cfg(test)]
mod tests;

pub use notification::{FastPath, Notification, NotificationSink};

use super::exclusive::ExclusiveInFlight;
use super::ClientError;
use crate::connection::json_codec::{call_value, decode_call, decode_reply, reply_value};
use crate::connection::local::LocalClientEnd;
use crate::connection::message::{Call, Inbound as Typed, Note, Reply, RequestId, WriteCall};
use crate::rpc::binary_write::{encode_write_head, fits_binary_write};
use crate::rpc::jsonrpc::{encode_error, encode_notification, encode_request, encode_response};
use crate::rpc::messages::{ApprovalDecision, ApproveParams, ApproveResult};
use crate::rpc::write_request::encode_write_request;
use crate::rpc::{Method, RpcError};
use crate::session::ApprovalAnswer;
use crate::sync::lock;
use crate::transport::{FlowProbe, OutMessage, Transport};

/// Outbound messages queued for the writer task. Bounded so a dead peer cannot make the
/// client buffer without limit.
const OUTBOUND_QUEUE: usize = 256;

/// A result as it arrived: JSON from a network connection, typed from an in-process one.
enum Answer {
    Json(Value),
    Typed(Reply),
}

/// A call awaiting its response: where the answer goes, and, for an exclusive request of a
/// process (`exclusive.rs`), the guard that keeps it counted until the server answered or the
/// connection ended, even when the caller stopped waiting: the request still holds the
/// process's queue on the server.
struct Waiting {
    tx: oneshot::Sender<Result<Answer, ClientError>>,
    _held: Option<ExclusiveInFlight>,
}

impl Waiting {
    /// Hand the answer to the caller, if it still waits; the guard goes with this.
    fn answer(self, a: Result<Answer, ClientError>) {
        let _ = self.tx.send(a);
    }
}

type Pending = Arc<Mutex<HashMap<u64, Waiting>>>;

/// A request's entry in the table of calls awaiting an answer while it is not yet handed to
/// the transport: dropped unsent (an error, or the caller's future dropped while it waited for
/// room in the outbound queue), it takes the entry, and its exclusive guard, out of the table.
/// An unsent request holds nothing on the server, so its guard must not keep the silence
/// watch away from its process until the connection ends (review R1).
struct Unsent<'a> {
    pending: &'a Pending,
    id: u64,
}

impl<'a> Unsent<'a> {
    fn insert(pending: &'a Pending, id: u64, waiting: Waiting) -> Self {
        lock(pending).insert(id, waiting);
        Unsent { pending, id }
    }

    /// Handed to the transport: the entry stays until the answer or the connection's end.
    fn sent(self) {
        std::mem::forget(self);
    }
}

impl Drop for Unsent<'_> {
    fn drop(&mut self) {
        // Taken out of the table first, dropped after the lock is released.
        let entry = lock(self.pending).remove(&self.id);
        drop(entry);
    }
}

/// A request sent by [`RpcConnection::start_write`], awaiting its response.
pub struct PendingCall {
    id: u64,
    rx: oneshot::Receiver<Result<Answer, ClientError>>,
    conn: RpcConnection,
}

impl PendingCall {
    /// The response's result as JSON, or why there is none (the connection's failure, if it
    /// broke).
    pub async fn outcome(self) -> Result<Value, ClientError> {
        let PendingCall { id, rx, conn } = self;
        let answer = tokio::select! {
            biased;
            r = rx => r.unwrap_or(Err(ClientError::ConnectionLost)),
            _ = conn.closed.cancelled() => {
                lock(&conn.pending).remove(&id);
                Err(conn.failure().unwrap_or(ClientError::ConnectionLost))
            }
        }?;
        Ok(match answer {
            Answer::Json(v) => v,
            Answer::Typed(r) => reply_value(&r),
        })
    }
}

/// Called on the reader task for each `process/approve` the server sends (its id, its
/// params), with a [`Responder`] for this connection. It must not block: answer from a task
/// of its own.
pub type RequestHandler = Arc<dyn Fn(Responder, String, ApproveParams) + Send + Sync>;

/// Answers server requests on the connection that received them.
#[derive(Clone)]
pub struct Responder {
    out: Out,
}

impl Responder {
    /// Answer approval request `id` (dropped if the connection is gone).
    pub fn decide(&self, id: &str, decision: ApprovalDecision) {
        match &self.out {
            Out::Json(out) => {
                let result =
                    serde_json::to_value(ApproveResult { decision }).unwrap_or(Value::Null);
                send_json(out, encode_response(&Value::from(id), &result));
            }
            Out::Local { requests, .. } => {
                let answer = match decision {
                    ApprovalDecision::Approve => ApprovalAnswer::Approve,
                    ApprovalDecision::Deny => ApprovalAnswer::Deny,
                };
                let msg = Typed::Response {
                    id: Some(RequestId::Str(id.to_string())),
                    answer,
                };
                let requests = requests.clone();
                // An answer is not dropped on a full queue: it waits for room.
                tokio::spawn(async move {
                    let _ = requests.send(msg).await;
                });
            }
        }
    }

    /// Refuse a request this client cannot serve (JSON connections; an in-process server
    /// sends only approvals).
    fn error(&self, id: &Value, error: &RpcError) {
        if let Out::Json(out) = &self.out {
            send_json(out, encode_error(id, error));
        }
    }
}

/// Queue a JSON text from a task: never from the reader, the outbound queue may be full.
fn send_json(out: &mpsc::Sender<OutMessage>, text: String) {
    let out = out.clone();
    tokio::spawn(async move {
        let _ = out.send(OutMessage::Text(text)).await;
    });
}

/// Where requests go.
#[derive(Clone)]
enum Out {
    /// Messages for the writer task of a network transport: JSON texts, and binary writes
    /// (`protocol.md` §5.2) once negotiated. One queue, so requests keep their order.
    Json(mpsc::Sender<OutMessage>),
    /// Typed messages into an in-process server's request queue.
    Local {
        requests: mpsc::Sender<Typed>,
        /// The queue's capacity (for the overload error).
        capacity: usize,
    },
}

/// A live connection.
#[derive(Clone)]
pub struct RpcConnection {
    out: Out,
    pending: Pending,
    next_id: Arc<AtomicU64>,
    closed: CancellationToken,
    failure: Arc<Mutex<Option<ClientError>>>,
    /// The transport's flow control, where it has one of its own (a Noise stream).
    flow: Option<Arc<dyn FlowProbe>>,
    /// The server accepted binary writes (`capabilities.binaryInput`, §5.2) on this connection.
    binary_input: Arc<AtomicBool>,
    /// The server keeps a process's writes in order after refusing one
    /// (`capabilities.retryRefusedWrites`): a refused write may be sent again.
    retry_refused_writes: Arc<AtomicBool>,
    /// The server's `maxMessageBytes` ([`set_max_message`](Self::set_max_message)); no
    /// limit until `initialize` tells it.
    max_message: Arc<AtomicUsize>,
}

impl RpcConnection {
    /// The most the server reads in one message (`initialize`'s `limits.maxMessageBytes`):
    /// a larger request is refused here, not sent (the server would close the connection on
    /// it, and a client that resends on a new connection would loop). A limit of 0 says
    /// nothing a client can use (no request is that small): it is taken as unknown, and
    /// nothing is refused here, as in the Python package.
    pub fn set_max_message(&self, bytes: usize) {
        let limit = if bytes == 0 { usize::MAX } else { bytes };
        self.max_message.store(limit, Ordering::Relaxed);
    }

    /// The server's `maxMessageBytes` as [`set_max_message`](Self::set_max_message) took it
    /// (`usize::MAX`: none known).
    pub fn max_message(&self) -> usize {
        self.max_message.load(Ordering::Relaxed)
    }

    /// The error for a `method` request of `bytes` over the server's limit, if it is.
    fn over_limit(&self, method: &str, bytes: usize) -> Option<ClientError> {
        let limit = self.max_message();
        (bytes > limit).then(|| ClientError::RequestTooLarge {
            method: method.to_string(),
            bytes,
            limit,
        })
    }

    /// Whether writes go as binary messages (the server said `binaryInput: true`).
    pub fn binary_input(&self) -> bool {
        self.binary_input.load(Ordering::Relaxed)
    }

    /// Record what `initialize`'s result said about binary writes: from now on
    /// [`start_write`](Self::start_write) sends binary messages (a network connection only).
    pub fn set_binary_input(&self, on: bool) {
        let network = matches!(self.out, Out::Json(_));
        self.binary_input.store(on && network, Ordering::Relaxed);
    }

    /// Whether a write the server refused for a limit may be sent again, then the writes after
    /// it (the server said `retryRefusedWrites: true`; a network connection only).
    pub fn retry_refused_writes(&self) -> bool {
        self.retry_refused_writes.load(Ordering::Relaxed)
    }

    /// Record what `initialize`'s result said about refused writes.
    pub fn set_retry_refused_writes(&self, on: bool) {
        let network = matches!(self.out, Out::Json(_));
        self.retry_refused_writes
            .store(on && network, Ordering::Relaxed);
    }

    /// Start the reader and writer tasks over `transport`.
    pub fn start(
        transport: Transport,
        notifications: NotificationSink,
        fast: Option<FastPath>,
    ) -> RpcConnection {
        Self::start_with(transport, notifications, fast, None)
    }

    /// [`start`](Self::start), with `requests` answering the server's requests (without it,
    /// they are answered `-32601`).
    pub fn start_with(
        transport: Transport,
        notifications: NotificationSink,
        fast: Option<FastPath>,
        requests: Option<RequestHandler>,
    ) -> RpcConnection {
        network::start(transport, notifications, fast, requests)
    }

    /// A connection over the client end of an in-process transport: typed messages both
    /// ways. Replies and events are handed to this connection straight from the server's side
    /// (a [`LocalReceiver`](crate::connection::local::LocalReceiver) installed on `end` before anything is sent: no channel and no
    /// reader task between, `connection/local.rs`); the reader task serves the channels only
    /// for what was queued before that (nothing, here) and ends with them.
    pub fn start_local(
        end: LocalClientEnd,
        notifications: NotificationSink,
        fast: Option<FastPath>,
        requests: Option<RequestHandler>,
    ) -> RpcConnection {
        local_router::start(end, notifications, fast, requests)
    }

    /// Send a typed request and wait for its typed result. Over a network connection it is
    /// encoded (and the result decoded) by the JSON codec; in process it travels as it is. A
    /// full in-process queue is `-32004` (`inProcessQueue`) at once.
    pub async fn call_typed(&self, call: Call) -> Result<Reply, ClientError> {
        self.call_typed_held(call, None).await
    }

    /// [`call_typed`](Self::call_typed) of an exclusive request of a process, counted by
    /// `held` until the server answers it or the connection ends, even if this future is
    /// dropped first (`exclusive.rs`).
    pub(crate) async fn call_typed_held(
        &self,
        call: Call,
        held: Option<ExclusiveInFlight>,
    ) -> Result<Reply, ClientError> {
        match &self.out {
            Out::Json(_) => {
                let (method, params) = call_value(&call).map_err(ClientError::from_rpc)?;
                match self
                    .request(RequestBody::Json(method.as_str(), params), held)
                    .await?
                {
                    Answer::Json(v) => decode_reply(method, v).map_err(|e| {
                        ClientError::Protocol(format!("bad {} result: {e}", method.as_str()))
                    }),
                    Answer::Typed(r) => Ok(r),
                }
            }
            Out::Local { .. } => match self.request(RequestBody::Typed(call), held).await? {
                Answer::Typed(r) => Ok(r),
                Answer::Json(_) => Err(ClientError::Protocol(
                    "JSON from an in-process server".into(),
                )),
            },
        }
    }

    /// Send a typed notification (`initialized`, `process/ack`).
    pub async fn notify_typed(&self, note: Note) -> Result<(), ClientError> {
        match &self.out {
            Out::Json(_) => {
                let (method, params) = match note {
                    Note::Initialized => (Method::Initialized.as_str().to_string(), json_empty()),
                    Note::Ack(p) => (
                        Method::ProcessAck.as_str().to_string(),
                        serde_json::to_value(p).unwrap_or(Value::Null),
                    ),
                    Note::Other(m) => (m, json_empty()),
                };
                self.notify_json(&method, params).await
            }
            Out::Local { requests, .. } => requests
                .send(Typed::Notification(note))
                .await
                .map_err(|_| ClientError::ConnectionLost),
        }
    }

    /// Queue a typed notification without waiting, where that can be done without a task
    /// (an in-process connection with room in its queue; a closed one drops it, as
    /// [`notify_typed`](Self::notify_typed) would fail). Otherwise it is given back, for
    /// [`notify_typed`](Self::notify_typed) from a task.
    pub fn try_notify_typed(&self, note: Note) -> Result<(), Note> {
        match &self.out {
            Out::Json(_) => Err(note),
            Out::Local { requests, .. } => match requests.try_send(Typed::Notification(note)) {
                Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => Ok(()),
                Err(mpsc::error::TrySendError::Full(msg)) => match msg {
                    Typed::Notification(note) => Err(note),
                    _ => Ok(()),
                },
            },
        }
    }

    async fn request(
        &self,
        body: RequestBody<'_>,
        held: Option<ExclusiveInFlight>,
    ) -> Result<Answer, ClientError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let unsent = Unsent::insert(&self.pending, id, Waiting { tx, _held: held });
        if self.closed.is_cancelled() {
            return Err(ClientError::ConnectionLost);
        }
        let sent = match (&self.out, body) {
            (Out::Json(out), RequestBody::Json(method, params)) => {
                let text = encode_request(&Value::from(id), method, &params);
                match self.over_limit(method, text.len()) {
                    Some(e) => Err(e),
                    None => out
                        .send(text.into())
                        .await
                        .map_err(|_| ClientError::ConnectionLost),
                }
            }
            (Out::Local { requests, capacity }, RequestBody::Typed(call)) => requests
                .try_send(Typed::Request {
                    id: RequestId::from(id),
                    call,
                })
                .map_err(|e| match e {
                    mpsc::error::TrySendError::Full(_) => ClientError::from_rpc(
                        RpcError::limit_reached(IN_PROCESS_QUEUE_LIMIT, *capacity as u64),
                    ),
                    mpsc::error::TrySendError::Closed(_) => ClientError::ConnectionLost,
                }),
            _ => Err(ClientError::Protocol("request of the wrong kind".into())),
        };
        sent?;
        unsent.sent();
        tokio::select! {
            r = rx => r.unwrap_or(Err(ClientError::ConnectionLost)),
            _ = self.closed.cancelled() => {
                lock(&self.pending).remove(&id);
                Err(self.failure().unwrap_or(ClientError::ConnectionLost))
            }
        }
    }

    /// The transport's flow-control state in both directions, in words (`send: sent 12 acked
    /// 8 window 16 …; receive: received …`), where it has flow control of its own (a Noise
    /// stream); `None` otherwise.
    pub fn flow_state(&self) -> Option<String> {
        self.flow.as_ref().map(|f| f.describe())
    }

    /// Why the connection ended, when the server broke the protocol (a malformed binary
    /// message); `None` while it is open or when it simply closed.
    pub fn failure(&self) -> Option<ClientError> {
        lock(&self.failure).clone()
    }

    /// Send a request by name with JSON params and wait for its result as JSON: the generic
    /// path. In process, the params are read into a typed [`Call`] and the result shown as
    /// JSON (the library's own requests use [`call_typed`](Self::call_typed)).
    pub async fn call(&self, method: &str, params: Value) -> Result<Value, ClientError> {
        match &self.out {
            Out::Json(_) => match self
                .request(RequestBody::Json(method, params), None)
                .await?
            {
                Answer::Json(v) => Ok(v),
                Answer::Typed(r) => Ok(reply_value(&r)),
            },
            Out::Local { .. } => match decode_call(method, params) {
                Call::Invalid { error, .. } => Err(ClientError::from_rpc(error)),
                Call::NotFound(name) => {
                    Err(ClientError::from_rpc(RpcError::method_not_found(&name)))
                }
                call => self.call_typed(call).await.map(|r| reply_value(&r)),
            },
        }
    }

    async fn notify_json(&self, method: &str, params: Value) -> Result<(), ClientError> {
        match &self.out {
            Out::Json(out) => out
                .send(encode_notification(method, &params).into())
                .await
                .map_err(|_| ClientError::ConnectionLost),
            Out::Local { .. } => Err(ClientError::Protocol("JSON to an in-process server".into())),
        }
    }

    /// Send `process/write` of `data` to `process_id` with `write_id` without waiting for its
    /// response: the request is queued, in the order of these calls, when this returns, and
    /// the returned [`PendingCall`] resolves to its outcome (the pipelined stdin writer). Over
    /// a network connection it is encoded by hand (`rpc/write_request.rs`); in process it
    /// travels typed and, being part of a bounded pipeline, waits for room in the queue
    /// rather than failing.
    pub async fn start_write(
        &self,
        process_id: &str,
        write_id: &str,
        data: &bytes::Bytes,
        close_stdin: bool,
    ) -> Result<PendingCall, ClientError> {
        self.start_write_held(process_id, write_id, data, close_stdin, None)
            .await
    }

    /// [`start_write`](Self::start_write), counted among the process's exclusive requests by
    /// `held` until the server answers it or the connection ends.
    pub(crate) async fn start_write_held(
        &self,
        process_id: &str,
        write_id: &str,
        data: &bytes::Bytes,
        close_stdin: bool,
        held: Option<ExclusiveInFlight>,
    ) -> Result<PendingCall, ClientError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let mut unsent = Some(Unsent::insert(
            &self.pending,
            id,
            Waiting { tx, _held: held },
        ));
        if self.closed.is_cancelled() {
            return Err(self.failure().unwrap_or(ClientError::ConnectionLost));
        }
        let sent = match &self.out {
            Out::Json(out) => {
                let binary = self.binary_input.load(Ordering::Relaxed)
                    && fits_binary_write(id, process_id, write_id, data.len());
                let (msg, bytes) = if binary {
                    // The chunk goes as the message's second part: not copied here.
                    let head = encode_write_head(id, close_stdin, process_id, write_id);
                    let bytes = head.len() + data.len();
                    let payload = data.clone();
                    (OutMessage::Binary { head, payload }, bytes)
                } else {
                    let text = encode_write_request(id, process_id, write_id, data);
                    let bytes = text.len();
                    (OutMessage::Text(text), bytes)
                };
                // Checked as any request is: sent anyway, it would close the connection, and
                // the writer would send it again on each new one (review R2).
                if let Some(e) = self.over_limit(Method::ProcessWrite.as_str(), bytes) {
                    return Err(e);
                }
                let sent = out.send(msg).await.is_ok();
                if sent {
                    // On the wire: whatever happens to the follow-up below (or to the caller's
                    // future while it waits for room), the write keeps its entry and guard.
                    if let Some(u) = unsent.take() {
                        u.sent();
                    }
                }
                if sent && close_stdin && !binary {
                    // The flag has no JSON form: the same request, then its closeStdin (a few
                    // hundred bytes at most: a process id is at most 256).
                    let close = serde_json::json!({"processId": process_id});
                    let close_id = self.next_id.fetch_add(1, Ordering::Relaxed);
                    let text = encode_request(&Value::from(close_id), "process/closeStdin", &close);
                    out.send(text.into()).await.is_ok()
                } else {
                    sent
                }
            }
            Out::Local { requests, .. } => requests
                .send(Typed::Request {
                    id: RequestId::from(id),
                    call: Call::Write(WriteCall {
                        process_id: process_id.to_string(),
                        data: data.clone(),
                        write_id: Some(write_id.to_string()),
                        close_stdin,
                    }),
                })
                .await
                .is_ok(),
        };
        if !sent {
            return Err(self.failure().unwrap_or(ClientError::ConnectionLost));
        }
        if let Some(u) = unsent.take() {
            u.sent();
        }
        Ok(PendingCall {
            id,
            rx,
            conn: self.clone(),
        })
    }

    /// Send a notification by name with JSON params.
    pub async fn notify(&self, method: &str, params: Value) -> Result<(), ClientError> {
        match &self.out {
            Out::Json(_) => self.notify_json(method, params).await,
            Out::Local { .. } => {
                let note = match Method::parse(method) {
                    Some(Method::Initialized) => Note::Initialized,
                    Some(Method::ProcessAck) => Note::Ack(serde_json::from_value(params).ok()),
                    _ => Note::Other(method.to_string()),
                };
                self.notify_typed(note).await
            }
        }
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

/// `data.limit` of the overload error of a full in-process request queue.
pub const IN_PROCESS_QUEUE_LIMIT: &str = "inProcessQueue";

enum RequestBody<'a> {
    Json(&'a str, Value),
    Typed(Call),
}

fn json_empty() -> Value {
    Value::Object(serde_json::Map::new())
}

/// Our own request ids are `u64`s.
fn local_id(id: &RequestId) -> Option<u64> {
    match id {
        RequestId::Int(i) => u64::try_from(*i).ok(),
        RequestId::UInt(u) => Some(*u),
        RequestId::Str(_) => None,
    }
}
