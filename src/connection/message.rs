//! The typed messages of one connection: what a client sends ([`Inbound`], its requests as
//! [`Call`]s) and what the server sends on the control lane ([`Outbound`], its results as
//! [`Reply`]s). Events (output deltas, exit notices) are not messages here: the writer pulls
//! them from the event logs and hands each to its [`Outlet`](super::outlet::Outlet).
//!
//! The [`ConnectionProcessor`](super::ConnectionProcessor) runs on these alone. A network
//! connection turns bytes into them and back with the JSON codec at its edge
//! (`json_codec.rs`); the in-process transport (`local.rs`) moves them through bounded
//! channels as they are: no JSON, no base64 (a write's data and an output chunk are `Bytes`).
//!
//! It must never hold a JSON value (`serde_json::Value`) or base64 text.

use std::sync::Arc;

use bytes::Bytes;

use crate::process::event_log::Event;
use crate::process::managed_process::WriteStatus;
use crate::rpc::messages::{
    AckParams, ApproveParams, InitializeParams, InitializeResult, ProcessRef, ReadParams,
    ResizeParams, SignalParams, StartParams, StartResult, TerminateParams,
};
use crate::rpc::{Method, RpcError};
use crate::session::{ApprovalAnswer, ListedProcess};

/// A JSON-RPC id, echoed unchanged: an integer or a string.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RequestId {
    /// An integer that fits `i64`.
    Int(i64),
    /// A larger non-negative integer.
    UInt(u64),
    /// A string.
    Str(String),
}

impl RequestId {
    /// The string, for ids that are one (server request ids, `s-N`).
    pub fn as_str(&self) -> Option<&str> {
        match self {
            RequestId::Str(s) => Some(s),
            _ => None,
        }
    }
}

impl From<u64> for RequestId {
    fn from(n: u64) -> Self {
        match i64::try_from(n) {
            Ok(i) => RequestId::Int(i),
            Err(_) => RequestId::UInt(n),
        }
    }
}

/// One message from the client.
#[derive(Debug)]
pub enum Inbound {
    /// A request: exactly one [`Outbound::Result`] or [`Outbound::Error`] answers it.
    Request {
        /// Echoed in the answer.
        id: RequestId,
        /// What is asked.
        call: Call,
    },
    /// A notification (no answer).
    Notification(Note),
    /// An answer to a server request (`process/approve`), already read as a decision.
    Response {
        /// The server request's id (`None`: an id that was not a string or integer).
        id: Option<RequestId>,
        /// The decision, or unreadable (a denial).
        answer: ApprovalAnswer,
    },
    /// A `process/write` refused for a limit before it was decoded (`request_budget.rs`):
    /// answered with `error`, and its process's later writes wait for it to come again
    /// (`write_order.rs`).
    RefusedWrite {
        /// The id to answer (`None`: `null`).
        id: Option<RequestId>,
        /// The `-32004` naming the limit.
        error: RpcError,
        /// Its process.
        process_id: String,
        /// Its `writeId`, if it had one.
        write_id: Option<String>,
    },
    /// A message that cannot be served (not JSON, not JSON-RPC, a bad id): answered with
    /// `error`, the connection goes on.
    Rejected {
        /// The id to answer (`None`: `null`).
        id: Option<RequestId>,
        /// Why.
        error: RpcError,
    },
}

/// A notification from the client.
#[derive(Debug)]
pub enum Note {
    /// `initialized`.
    Initialized,
    /// `process/ack` (params that did not decode: `None`, ignored).
    Ack(Option<AckParams>),
    /// Anything else: ignored.
    Other(String),
}

/// `process/write` params with the chunk decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteCall {
    /// The process.
    pub process_id: String,
    /// The bytes to write.
    pub data: Bytes,
    /// Idempotency key.
    pub write_id: Option<String>,
    /// Close stdin right after this chunk (the binary write's flag, `protocol.md` §5.2; a
    /// JSON write never sets it).
    pub close_stdin: bool,
}

/// A request's method and its decoded params.
#[derive(Debug, Clone)]
pub enum Call {
    /// `initialize`.
    Initialize(InitializeParams),
    /// `server/info`.
    ServerInfo,
    /// `session/close`.
    SessionClose,
    /// `process/start`.
    Start(StartParams),
    /// `process/read`.
    Read(ReadParams),
    /// `process/write`.
    Write(WriteCall),
    /// `process/closeStdin`.
    CloseStdin(ProcessRef),
    /// `process/resize`.
    Resize(ResizeParams),
    /// `process/signal`.
    Signal(SignalParams),
    /// `process/terminate`.
    Terminate(TerminateParams),
    /// `process/list`.
    List,
    /// `process/ack` sent as a request (answered `{}`; params that did not decode: `None`).
    Ack(Option<AckParams>),
    /// A known method whose params did not decode: ordered as the method is (by its
    /// `processId` when it had one) and answered with `error` when its turn comes.
    Invalid {
        /// The method.
        method: Method,
        /// Its `processId`, if the params had one.
        process_id: Option<String>,
        /// The `-32602` to answer.
        error: RpcError,
    },
    /// A method this server does not serve to clients: `-32601`.
    NotFound(String),
}

impl Call {
    /// The method, or `None` for one not served.
    pub fn method(&self) -> Option<Method> {
        Some(match self {
            Call::Initialize(_) => Method::Initialize,
            Call::ServerInfo => Method::ServerInfo,
            Call::SessionClose => Method::SessionClose,
            Call::Start(_) => Method::ProcessStart,
            Call::Read(_) => Method::ProcessRead,
            Call::Write(_) => Method::ProcessWrite,
            Call::CloseStdin(_) => Method::ProcessCloseStdin,
            Call::Resize(_) => Method::ProcessResize,
            Call::Signal(_) => Method::ProcessSignal,
            Call::Terminate(_) => Method::ProcessTerminate,
            Call::List => Method::ProcessList,
            Call::Ack(_) => Method::ProcessAck,
            Call::Invalid { method, .. } => *method,
            Call::NotFound(_) => return None,
        })
    }

    /// The process a per-process request is for.
    pub fn process_id(&self) -> Option<&str> {
        match self {
            Call::Start(p) => Some(&p.process_id),
            Call::Read(p) => Some(&p.process_id),
            Call::Write(p) => Some(&p.process_id),
            Call::CloseStdin(p) => Some(&p.process_id),
            Call::Resize(p) => Some(&p.process_id),
            Call::Signal(p) => Some(&p.process_id),
            Call::Terminate(p) => Some(&p.process_id),
            Call::Invalid { process_id, .. } => process_id.as_deref(),
            _ => None,
        }
    }
}

/// `process/read` result.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadReply {
    /// Events after `afterSeq`, oldest first.
    pub events: Vec<Event>,
    /// The `afterSeq` of the next read.
    pub next_seq: u64,
    /// The direct child still runs.
    pub running: bool,
    /// The exit notice is in the log.
    pub exited: bool,
}

/// `server/info` result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerInfo {
    /// This build's version.
    pub server_version: String,
    /// The protocol version.
    pub protocol_version: u32,
    /// The host's name.
    pub hostname: String,
    /// `linux`, …
    pub os: String,
    /// The server's pid.
    pub pid: u32,
    /// Since the registry was created.
    pub uptime_ms: u64,
    /// Sessions now.
    pub sessions: usize,
    /// Processes now.
    pub processes: usize,
}

/// A successful result.
#[derive(Debug, Clone)]
pub enum Reply {
    /// `initialize`.
    Initialize(InitializeResult),
    /// `process/start`.
    Start(StartResult),
    /// `process/read`.
    Read(ReadReply),
    /// `process/write`.
    Write(WriteStatus),
    /// `process/terminate`: whether it was running.
    Terminate {
        /// Running when the request arrived.
        running: bool,
    },
    /// `process/list`.
    List(Vec<ListedProcess>),
    /// `server/info`.
    ServerInfo(ServerInfo),
    /// `{}`: `closeStdin`, `resize`, `signal`, `session/close`, `ack`.
    Empty,
}

/// A message of the control lane, from the server.
#[derive(Debug, Clone)]
pub enum Outbound {
    /// A request's result.
    Result {
        /// The request's id.
        id: RequestId,
        /// The result.
        reply: Reply,
    },
    /// A request's error (or a rejected message's, `id` `None`: `null`).
    Error {
        /// The request's id.
        id: Option<RequestId>,
        /// The error.
        error: RpcError,
    },
    /// A server request (`process/approve`).
    Request {
        /// `s-N`.
        id: String,
        /// What to approve.
        params: Arc<ApproveParams>,
    },
}
