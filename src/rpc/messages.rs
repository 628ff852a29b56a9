//! Typed params and results of the methods in `protocol.md` §4, shared by server and client.
//!
//! Field names are camelCase on the wire; unknown members are ignored and optional members
//! take their documented defaults.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Protocol version spoken by this build.
pub const PROTOCOL_VERSION: u32 = 1;

/// `initialize` params.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InitializeParams {
    /// Free-form client name.
    #[serde(default)]
    pub client_name: Option<String>,
    /// Free-form client version.
    #[serde(default)]
    pub client_version: Option<String>,
    /// Resume an existing session instead of creating one.
    #[serde(default)]
    pub resume: Option<ResumeParams>,
    /// Optional features the client supports.
    #[serde(default)]
    pub capabilities: Capabilities,
    /// How long the session may stay detached before it expires (`protocol.md` §3); absent:
    /// the server's default. At most the server's `max_session_ttl_ms`, else `-32602`. A
    /// resume may set it again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_ttl_ms: Option<u64>,
}

/// Which session to resume.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResumeParams {
    /// The session id returned by the first `initialize`.
    pub session_id: String,
    /// The secret returned with it.
    pub resume_token: String,
}

/// Capabilities: what a client asks for in `initialize`, and in its result what the server
/// will do for this connection (`protocol.md` §3, §5.1).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Capabilities {
    /// The client acknowledges events with `process/ack`; retention waits for acks.
    #[serde(default)]
    pub acks: bool,
    /// The server requests the client can answer (`protocol.md` §7).
    #[serde(default, skip_serializing_if = "ServerRequests::is_empty")]
    pub server_requests: ServerRequests,
    /// Output deltas as binary messages (`protocol.md` §5.1) instead of JSON with base64.
    #[serde(default)]
    pub binary_output: bool,
    /// The client may send `process/write` as binary messages (`protocol.md` §5.2).
    #[serde(default)]
    pub binary_input: bool,
    /// In a result only (a project extension; README, "Decisions where the spec is silent"):
    /// once a write is refused for a limit (`-32004`), this connection refuses the process's
    /// later writes until that write comes again (`data.limit` `writeOrder`), so a client may
    /// send a refused write again, then the writes after it, and nothing is applied out of
    /// order. Absent (false) from servers that predate it, and in process.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub retry_refused_writes: bool,
}

/// `capabilities.serverRequests`: on the wire a list of method names
/// (`["process/approve"]`); names this build does not know are ignored.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServerRequests {
    /// `process/approve`.
    pub approve: bool,
}

impl ServerRequests {
    /// The wire name of `process/approve` (also in `rpc::method`'s table).
    pub const APPROVE: &'static str = "process/approve";

    /// None declared.
    pub fn is_empty(&self) -> bool {
        !self.approve
    }
}

impl Serialize for ServerRequests {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let names: Vec<&str> = if self.approve {
            vec![Self::APPROVE]
        } else {
            Vec::new()
        };
        names.serialize(s)
    }
}

impl<'de> Deserialize<'de> for ServerRequests {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Bounded by the message size like every other member.
        let names = Vec::<String>::deserialize(d)?;
        Ok(ServerRequests {
            approve: names.iter().any(|n| n == Self::APPROVE),
        })
    }
}

/// `process/approve` params: the server asks the client whether a process may start
/// (`protocol.md` §7). Environment values are not sent (they may hold secrets): only names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApproveParams {
    /// The process waiting for the answer.
    pub process_id: String,
    /// What it would run.
    pub argv: Vec<String>,
    /// Its working directory (the server's own when the start named none).
    pub cwd: String,
    /// Names of the variables the start sets, sorted.
    pub env_names: Vec<String>,
    /// Whether it would run on a PTY.
    pub tty: bool,
    /// Which policy rule asked: its `reason`, `program = "GLOB"`, or `default`.
    pub rule: String,
}

/// A client's answer to `process/approve`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ApprovalDecision {
    /// Start it.
    Approve,
    /// Do not: its `process/start` fails with `-32006`.
    Deny,
}

/// `process/approve` result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApproveResult {
    /// The answer.
    pub decision: ApprovalDecision,
}

/// Limits advertised in the `initialize` result.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdvertisedLimits {
    /// Largest message accepted.
    pub max_message_bytes: u64,
    /// Processes per session.
    pub max_processes: u64,
    /// Retained output per process.
    pub retained_output_bytes: u64,
    /// How long this session survives detached: what `sessionTtlMs` asked for, or the
    /// server's default.
    pub detached_session_ttl_ms: u64,
}

/// `initialize` result.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InitializeResult {
    /// Always [`PROTOCOL_VERSION`].
    pub protocol_version: u32,
    /// The server's version.
    pub server_version: String,
    /// The session now attached to this connection.
    pub session_id: String,
    /// The secret needed to resume it.
    pub resume_token: String,
    /// Whether an existing session was resumed.
    pub resumed: bool,
    /// Limits in force.
    pub limits: AdvertisedLimits,
    /// What the server does for this connection: acks as the session was created with, and
    /// binary output where asked for and the transport carries it (absent from servers that
    /// predate it: nothing).
    #[serde(default)]
    pub capabilities: Capabilities,
}

/// Which output stream a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamName {
    /// Standard output of a pipe process.
    Stdout,
    /// Standard error of a pipe process.
    Stderr,
    /// The merged terminal stream of a PTY process.
    Pty,
}

impl StreamName {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            StreamName::Stdout => "stdout",
            StreamName::Stderr => "stderr",
            StreamName::Pty => "pty",
        }
    }

    /// Parse a wire name; `None` for anything else.
    pub fn from_wire(name: &str) -> Option<StreamName> {
        match name {
            "stdout" => Some(StreamName::Stdout),
            "stderr" => Some(StreamName::Stderr),
            "pty" => Some(StreamName::Pty),
            _ => None,
        }
    }
}

/// Terminal size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TermSize {
    /// Rows.
    pub rows: u16,
    /// Columns.
    pub cols: u16,
}

impl Default for TermSize {
    fn default() -> Self {
        TermSize { rows: 24, cols: 80 }
    }
}

fn default_true() -> bool {
    true
}

/// `process/start` params.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StartParams {
    /// Client-chosen id, 1–256 bytes.
    pub process_id: String,
    /// Program and arguments; non-empty.
    pub argv: Vec<String>,
    /// Absolute working directory.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Environment overlay; `null` removes a variable.
    #[serde(default)]
    pub env: BTreeMap<String, Option<String>>,
    /// Start from the server's environment (default true).
    #[serde(default = "default_true")]
    pub inherit_env: bool,
    /// Run on a PTY.
    #[serde(default)]
    pub tty: bool,
    /// Keep stdin writable without a tty.
    #[serde(default)]
    pub pipe_stdin: bool,
    /// PTY size.
    #[serde(default)]
    pub size: Option<TermSize>,
    /// Terminate after this long.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Per-stream delivered-bytes cap.
    #[serde(default)]
    pub output_bytes_cap: Option<u64>,
    /// Drain budget after the child exits.
    #[serde(default)]
    pub drain_timeout_ms: Option<u64>,
    /// Grace between SIGTERM and SIGKILL.
    #[serde(default)]
    pub kill_grace_ms: Option<u64>,
    /// Terminate the process group once the exit notice is ready.
    #[serde(default)]
    pub kill_process_group_on_exit: bool,
    /// What `outputBytesCap` keeps: the head (default), or the head and the tail.
    #[serde(default, skip_serializing_if = "OutputCapKeep::is_head")]
    pub output_cap_keep: OutputCapKeep,
}

/// `outputCapKeep` of `process/start` (`protocol.md` §5): which bytes of a capped stream reach
/// the client.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum OutputCapKeep {
    /// The first `outputBytesCap` bytes; the rest is read and dropped.
    #[default]
    Head,
    /// The first half of the cap live, the last half kept in a ring and sent when the stream
    /// ends, after a `process/outputOmitted` event counting what fell between them.
    HeadAndTail,
}

impl OutputCapKeep {
    /// The default (`head`): left out of a request.
    pub fn is_head(&self) -> bool {
        *self == OutputCapKeep::Head
    }
}

/// `process/start` result.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StartResult {
    /// Echo of the id.
    pub process_id: String,
    /// OS pid (also the process group id).
    pub pid: u32,
}

/// Params naming only a process.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessRef {
    /// The process.
    pub process_id: String,
}

/// `process/read` params.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadParams {
    /// The process.
    pub process_id: String,
    /// Return events with `seq > afterSeq`.
    #[serde(default)]
    pub after_seq: u64,
    /// Soft cap on output bytes returned.
    #[serde(default)]
    pub max_bytes: Option<u64>,
    /// Long-poll budget.
    #[serde(default)]
    pub wait_ms: u64,
}

/// `process/write` params.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WriteParams {
    /// The process.
    pub process_id: String,
    /// Base64 bytes.
    pub chunk: String,
    /// Idempotency key.
    #[serde(default)]
    pub write_id: Option<String>,
}

/// `process/resize` params.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResizeParams {
    /// The process.
    pub process_id: String,
    /// Rows.
    pub rows: u16,
    /// Columns.
    pub cols: u16,
}

/// `process/signal` params.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SignalParams {
    /// The process.
    pub process_id: String,
    /// Signal name, e.g. `SIGINT`.
    pub signal: String,
}

/// `process/terminate` params.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TerminateParams {
    /// The process.
    pub process_id: String,
    /// Grace before SIGKILL; default the process's `killGraceMs`.
    #[serde(default)]
    pub grace_ms: Option<u64>,
}

/// `process/ack` params.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AckParams {
    /// The process.
    pub process_id: String,
    /// Every event up to this one was received.
    pub seq: u64,
}

/// Why a process ended (`reason` of the exit notice, `protocol.md` §5).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ExitReason {
    /// It exited on its own, or died of a signal nobody here sent (also what a notice from a
    /// server that predates `reason` reads as).
    #[default]
    Exited,
    /// Its `timeoutMs` passed.
    Timeout,
    /// `process/terminate`, or a terminating `process/signal`, from a client.
    Terminated,
    /// Its session was closed (`session/close`, or the end of a stdio connection).
    SessionClosed,
    /// Its detached session's TTL ran out.
    SessionExpired,
    /// The server shut down.
    ServerShutdown,
    /// The kernel's OOM killer, as the session's cgroup recorded it (cgroup v2 with the
    /// memory controller; elsewhere it cannot be known and reads as `exited`).
    OomKilled,
}

impl ExitReason {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            ExitReason::Exited => "exited",
            ExitReason::Timeout => "timeout",
            ExitReason::Terminated => "terminated",
            ExitReason::SessionClosed => "sessionClosed",
            ExitReason::SessionExpired => "sessionExpired",
            ExitReason::ServerShutdown => "serverShutdown",
            ExitReason::OomKilled => "oomKilled",
        }
    }
}

impl std::fmt::Display for ExitReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The exit notice (`process/exited` params, and the `exited` event of `process/read`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExitInfo {
    /// Exit code for a normal exit.
    pub exit_code: Option<i32>,
    /// Signal name for a death by signal.
    pub signal: Option<String>,
    /// Why it ended.
    #[serde(default)]
    pub reason: ExitReason,
    /// `timeoutMs` passed (`reason == "timeout"`).
    pub timed_out: bool,
    /// Output could still have been pending at the drain deadline.
    pub output_drain_timed_out: bool,
    /// Bytes the child wrote to stdout (or the pty), dropped ones included.
    pub stdout_bytes: u64,
    /// Bytes the child wrote to stderr.
    pub stderr_bytes: u64,
    /// Bytes discarded by `outputBytesCap` (with `headAndTail`: the omitted bytes).
    pub dropped_bytes: u64,
    /// From spawn to exit notice.
    pub duration_ms: u64,
}
