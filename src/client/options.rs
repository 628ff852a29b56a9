//! What an application sets: the client's options ([`ClientOptions`]), what to start
//! ([`StartOptions`]) and an in-process server's configuration ([`InProcessConfig`]).

use std::sync::Arc;
use std::time::Duration;

use super::ApprovalHandler;
use crate::config::{ServerConfig, IN_PROCESS_SHUTDOWN_MS, MAX_MESSAGE_BYTES};
use crate::connection::local::LocalLimits;
use crate::policy::PolicyFile;
use crate::rpc::messages::StartParams;

/// An exec server in this process (`Client::in_process`): its configuration, exec policy,
/// channel capacities and shutdown deadline.
#[derive(Debug, Clone)]
pub struct InProcessConfig {
    /// The server's limits.
    pub server: ServerConfig,
    /// Its exec policy (`None`: everything is allowed).
    pub policy: Option<Arc<PolicyFile>>,
    /// The transport's channel capacities (`None`: [`LocalLimits::for_config`]).
    pub limits: Option<LocalLimits>,
    /// How long [`Client::shutdown`](super::Client::shutdown) may take at most (default `IN_PROCESS_SHUTDOWN_MS`).
    pub shutdown_deadline: Duration,
}

impl Default for InProcessConfig {
    fn default() -> Self {
        InProcessConfig {
            server: ServerConfig::default(),
            policy: None,
            limits: None,
            shutdown_deadline: Duration::from_millis(IN_PROCESS_SHUTDOWN_MS),
        }
    }
}

/// Client settings.
#[derive(Clone)]
pub struct ClientOptions {
    /// Sent in `initialize`.
    pub client_name: String,
    /// Declare `capabilities.acks` (lossless retention across reconnects).
    pub acks: bool,
    /// Ask for output deltas as binary messages (`capabilities.binaryOutput`, `protocol.md`
    /// §5.1): no base64 and no JSON on the output path. On by default; the server answers
    /// `false` where the transport cannot carry them (stdio), and the client accepts both
    /// forms either way.
    pub binary_output: bool,
    /// Offer binary writes (`capabilities.binaryInput`, `protocol.md` §5.2): where the server
    /// answers `true`, stdin goes as binary messages (no base64, no JSON on the input path),
    /// else as JSON. On by default.
    pub binary_input: bool,
    /// Resume automatically after a transport failure.
    pub reconnect: bool,
    /// Give up resuming after this long (default: the server's TTL).
    pub reconnect_deadline: Option<Duration>,
    /// Largest message accepted from the server.
    pub max_message_bytes: usize,
    /// Answers the server's `process/approve` requests (`protocol.md` §7). With one, the
    /// client declares `serverRequests: ["process/approve"]`; without, it does not, and the
    /// server denies every start its exec policy would ask about.
    pub approval_handler: Option<Arc<dyn ApprovalHandler>>,
    /// A running process that delivers nothing for this long on a live connection, while the
    /// application waits for it, is asked about (`process/read` after the last event
    /// received): output the server holds arrives that way even if its delivery stopped, and
    /// a connection that does not answer within [`PROBE_REPLY_TIMEOUT`](super::PROBE_REPLY_TIMEOUT)
    /// is closed and resumed. `None`: never ask. Default
    /// [`SILENCE_PROBE_AFTER`](super::SILENCE_PROBE_AFTER).
    pub silence_probe: Option<Duration>,
    /// How long the answer to a silence probe may take before the connection is taken for
    /// wedged (closed, then resumed). Default
    /// [`PROBE_REPLY_TIMEOUT`](super::PROBE_REPLY_TIMEOUT).
    pub probe_reply_timeout: Duration,
    /// How long the session may stay detached (`sessionTtlMs`, `protocol.md` §3); `None`:
    /// the server's default. Sent again on every resume. Above the server's
    /// `max_session_ttl_ms`, `initialize` fails with `-32602` (its `data.max` says the most).
    pub session_ttl: Option<Duration>,
    /// When consumed events are acknowledged (with [`acks`](Self::acks)).
    pub ack_policy: AckPolicy,
    /// How long the first connection ([`Client::connect`](super::Client::connect),
    /// [`Client::resume`](super::Client::resume)) waits for an environment the relay says is
    /// offline or moving ([`ClientError::EnvironmentOffline`](super::ClientError)), trying
    /// again with backoff ([`OFFLINE_RETRY_INITIAL_DELAY`](super::OFFLINE_RETRY_INITIAL_DELAY)
    /// doubling to [`OFFLINE_RETRY_MAX_DELAY`](super::OFFLINE_RETRY_MAX_DELAY)); then it
    /// fails with that error. `Duration::ZERO`: fail at the first refusal. Default
    /// [`FIRST_CONNECT_OFFLINE_WAIT`](super::FIRST_CONNECT_OFFLINE_WAIT). A lost connection
    /// is resumed as always, within [`reconnect_deadline`](Self::reconnect_deadline).
    pub offline_wait: Duration,
    /// How long a [`StdinWriter`](super::StdinWriter) keeps sending a write the server refused
    /// for a limit (`-32004`) again (alone; once it is accepted, the writes after it follow,
    /// in order) before it reports the input lost, counted from the first refusal in a row,
    /// round trips included: only on a server that keeps a process's writes in order after a
    /// refusal (`capabilities.retryRefusedWrites`; elsewhere the first refusal is reported).
    /// Pauses from [`WRITE_RETRY_FIRST_MS`](super::WRITE_RETRY_FIRST_MS) doubling to
    /// [`WRITE_RETRY_MAX_MS`](super::WRITE_RETRY_MAX_MS); an accepted write starts over.
    /// `Duration::ZERO`: report the first refusal. Default
    /// [`WRITE_RETRY_FOR_MS`](super::WRITE_RETRY_FOR_MS).
    pub write_retry_for: Duration,
}

/// When a client acknowledges the events its application consumed (`process/ack`): what the
/// server may release, and so what another client resuming the session can still be shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AckPolicy {
    /// Every `ACK_EVERY_BYTES` of output and at the exit notice: the server holds little.
    #[default]
    Eager,
    /// Only when half the server's `retainedOutputBytes` were consumed since the last ack,
    /// and never the exit notice: the server keeps what it can, so a later client resuming
    /// the session (`execrelay attach`) is shown it again; the process stays known (exited)
    /// until its session is closed.
    Lazy,
}

impl std::fmt::Debug for ClientOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientOptions")
            .field("client_name", &self.client_name)
            .field("acks", &self.acks)
            .field("binary_output", &self.binary_output)
            .field("binary_input", &self.binary_input)
            .field("reconnect", &self.reconnect)
            .field("reconnect_deadline", &self.reconnect_deadline)
            .field("max_message_bytes", &self.max_message_bytes)
            .field("approval_handler", &self.approval_handler.is_some())
            .field("silence_probe", &self.silence_probe)
            .field("probe_reply_timeout", &self.probe_reply_timeout)
            .field("session_ttl", &self.session_ttl)
            .field("ack_policy", &self.ack_policy)
            .field("offline_wait", &self.offline_wait)
            .field("write_retry_for", &self.write_retry_for)
            .finish()
    }
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            client_name: "execrelay-client".into(),
            acks: true,
            binary_output: true,
            binary_input: true,
            reconnect: true,
            reconnect_deadline: None,
            max_message_bytes: MAX_MESSAGE_BYTES,
            approval_handler: None,
            silence_probe: Some(super::SILENCE_PROBE_AFTER),
            probe_reply_timeout: super::PROBE_REPLY_TIMEOUT,
            session_ttl: None,
            ack_policy: AckPolicy::Eager,
            offline_wait: super::FIRST_CONNECT_OFFLINE_WAIT,
            write_retry_for: Duration::from_millis(super::WRITE_RETRY_FOR_MS),
        }
    }
}

/// What to start; see `process/start`.
#[derive(Debug, Clone)]
pub struct StartOptions {
    /// The params sent.
    pub params: StartParams,
}

impl StartOptions {
    /// A process `id` running `argv` with every other setting at its default.
    pub fn new<I, S>(id: &str, argv: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        StartOptions {
            params: StartParams {
                process_id: id.to_string(),
                argv: argv.into_iter().map(Into::into).collect(),
                cwd: None,
                env: Default::default(),
                inherit_env: true,
                tty: false,
                pipe_stdin: false,
                size: None,
                timeout_ms: None,
                output_bytes_cap: None,
                drain_timeout_ms: None,
                kill_grace_ms: None,
                kill_process_group_on_exit: false,
                output_cap_keep: Default::default(),
            },
        }
    }
}
