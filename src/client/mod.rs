//! The Rust client: connect to an exec server, start processes, stream their events, and
//! survive transport failures by resuming the session.
//!
//! Layout: [`rpc_connection`] is one JSON-RPC connection; this module owns the session
//! (`initialize`, resume with backoff inside the server's TTL), its options, errors and
//! targets, and starting processes. `event_stream.rs` holds the per-process event streams that
//! hand out every event exactly once and in order (deduplicated by `seq`, gaps filled with
//! `process/read`) and the acks; `process_handle.rs` holds [`ProcessHandle`] and
//! [`ProcessController`], the application's grip on one process. It must never show a byte
//! twice or skip one silently: a range the server no longer retains is surfaced as
//! [`ProcessEvent::Lost`].
//!
//! ```no_run
//! # async fn demo() -> Result<(), execrelay::client::ClientError> {
//! use execrelay::client::{Client, ClientOptions, ProcessEvent, Target};
//! let client = Client::connect(Target::Ws("ws://127.0.0.1:7000".into()), ClientOptions::default()).await?;
//! let mut p = client.start(execrelay::client::StartOptions::new("p1", ["echo", "hi"])).await?;
//! while let Some(ev) = p.next_event().await {
//!     if let ProcessEvent::Exited(info) = ev { println!("exit {:?}", info.exit_code); }
//! }
//! # Ok(()) }
//! ```

mod event_stream;
mod process_handle;
pub mod rpc_connection;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;

use crate::config::MAX_MESSAGE_BYTES;
use crate::rpc::messages::{InitializeResult, StartParams, StartResult};
use crate::rpc::Method;
use crate::sync::lock;
use crate::transport::stdio::line_transport;
use crate::transport::Transport;
use event_stream::ProcSlot;
use rpc_connection::{Notification, RpcConnection};

pub use event_stream::{ProcessEvent, ACK_EVERY_BYTES};
pub use process_handle::{ProcessController, ProcessHandle};

/// First reconnect delay; doubles up to [`RECONNECT_MAX_DELAY`].
pub const RECONNECT_INITIAL_DELAY: Duration = Duration::from_millis(50);
/// Longest reconnect delay.
pub const RECONNECT_MAX_DELAY: Duration = Duration::from_secs(2);

/// Client failures.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The server answered with a JSON-RPC error.
    #[error("server error {code}: {message}")]
    Rpc {
        /// JSON-RPC code.
        code: i64,
        /// Message.
        message: String,
        /// Data member.
        data: Option<Value>,
    },
    /// The connection dropped while a call was in flight.
    #[error("connection lost")]
    ConnectionLost,
    /// The transport could not be set up.
    #[error("cannot connect: {0}")]
    Connect(String),
    /// The server sent something this client does not understand.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The server refused this client (handshake or authorization); not retried.
    #[error("{0}")]
    Refused(String),
    /// The session could not be resumed within its TTL.
    #[error("session lost: {0}")]
    SessionLost(String),
}

impl ClientError {
    pub(crate) fn from_error_object(v: Value) -> ClientError {
        ClientError::Rpc {
            code: v.get("code").and_then(Value::as_i64).unwrap_or(0),
            message: v
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            data: v.get("data").cloned(),
        }
    }

    /// The JSON-RPC code, if this is a server error.
    pub fn code(&self) -> Option<i64> {
        match self {
            ClientError::Rpc { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// Where the server is.
#[derive(Debug, Clone)]
pub enum Target {
    /// Spawn `program args…` and speak over its stdin/stdout (e.g. `execrelay serve --listen
    /// stdio`). The server lives as long as the connection: no reconnection.
    Spawn {
        /// Program.
        program: PathBuf,
        /// Arguments.
        args: Vec<String>,
    },
    /// A plain WebSocket URL, `ws://HOST:PORT`.
    Ws(String),
    /// A Noise-encrypted server, `noise+ws://HOST:PORT`: one virtual stream on a physical
    /// link shared with every other client of the same `pool` talking to the same server
    /// with the same keys (clones of a target share its pool).
    Noise {
        /// `noise+ws://HOST:PORT`.
        url: String,
        /// Keys and pinned server key.
        config: Arc<crate::link::client::NoiseClientConfig>,
        /// The links this client may share (a fresh pool: a link of its own).
        pool: crate::link::client::LinkPool,
    },
}

impl Target {
    /// Spawn this very binary as a stdio server (`execrelay run --local`).
    pub fn local() -> Result<Target, ClientError> {
        let exe = std::env::current_exe().map_err(|e| ClientError::Connect(e.to_string()))?;
        Ok(Target::Spawn {
            program: exe,
            args: vec!["serve".into(), "--listen".into(), "stdio".into()],
        })
    }

    fn can_reconnect(&self) -> bool {
        matches!(self, Target::Ws(_) | Target::Noise { .. })
    }
}

/// Client settings.
#[derive(Debug, Clone)]
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
    /// Resume automatically after a transport failure.
    pub reconnect: bool,
    /// Give up resuming after this long (default: the server's TTL).
    pub reconnect_deadline: Option<Duration>,
    /// Largest message accepted from the server.
    pub max_message_bytes: usize,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            client_name: "execrelay-client".into(),
            acks: true,
            binary_output: true,
            reconnect: true,
            reconnect_deadline: None,
            max_message_bytes: MAX_MESSAGE_BYTES,
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
            },
        }
    }
}

struct Shared {
    target: Target,
    opts: ClientOptions,
    conn: Mutex<Option<RpcConnection>>,
    session: Mutex<Option<(String, String, u64)>>,
    procs: Mutex<HashMap<String, ProcSlot>>,
    reconnected: Notify,
    shutdown: CancellationToken,
    lost: Mutex<Option<String>>,
    connects: std::sync::atomic::AtomicU64,
}

/// A connected client. Cheap to clone; every clone shares the session.
#[derive(Clone)]
pub struct Client {
    shared: Arc<Shared>,
}

async fn open_transport(target: &Target, max: usize) -> Result<Transport, ClientError> {
    match target {
        Target::Spawn { program, args } => {
            let mut cmd = tokio::process::Command::new(program);
            cmd.args(args);
            // A local server is plumbing: keep its logs to warnings unless asked otherwise.
            if std::env::var_os("RUST_LOG").is_none() {
                cmd.env("RUST_LOG", "warn");
            }
            // Its own process group: a Ctrl-C at the terminal is the client's to forward,
            // not a shutdown request for the server.
            cmd.process_group(0);
            let mut child = cmd
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .kill_on_drop(true)
                .spawn()
                .map_err(|e| ClientError::Connect(format!("{}: {e}", program.display())))?;
            let stdin = child
                .stdin
                .take()
                .ok_or_else(|| ClientError::Connect("no stdin".into()))?;
            let stdout = child
                .stdout
                .take()
                .ok_or_else(|| ClientError::Connect("no stdout".into()))?;
            // Reap the server when it exits; kill_on_drop covers an abandoned client.
            tokio::spawn(async move {
                let _ = child.wait().await;
            });
            Ok(line_transport(stdout, stdin, max, "spawned server"))
        }
        Target::Ws(url) => crate::transport::websocket::connect_websocket(url, max)
            .await
            .map_err(|e| ClientError::Connect(e.to_string())),
        Target::Noise { url, config, pool } => {
            use crate::link::client::NoiseError;
            let link = pool
                .link(url, config)
                .await
                .map_err(|e| ClientError::Connect(e.to_string()))?;
            match link.open_stream().await {
                Ok(t) => Ok(t),
                // A refusal is final: retrying the same keys will not help.
                Err(e @ (NoiseError::Refused(_) | NoiseError::ServerKey)) => {
                    Err(ClientError::Refused(e.to_string()))
                }
                Err(e) => Err(ClientError::Connect(e.to_string())),
            }
        }
    }
}

impl Client {
    /// A client with no connection and no session yet: the state both `connect*` functions
    /// start from before `initialize`.
    fn unconnected(target: Target, opts: ClientOptions) -> Client {
        let shared = Arc::new(Shared {
            target,
            opts,
            conn: Mutex::new(None),
            session: Mutex::new(None),
            procs: Mutex::new(HashMap::new()),
            reconnected: Notify::new(),
            shutdown: CancellationToken::new(),
            lost: Mutex::new(None),
            connects: std::sync::atomic::AtomicU64::new(0),
        });
        Client { shared }
    }

    /// Connect and `initialize` a new session.
    pub async fn connect(target: Target, opts: ClientOptions) -> Result<Client, ClientError> {
        let client = Client::unconnected(target, opts);
        client.establish(None).await?;
        let c = client.clone();
        if client.shared.opts.reconnect && client.shared.target.can_reconnect() {
            tokio::spawn(async move { c.supervise().await });
        } else {
            // Nothing to resume: when the connection ends, so do the event streams.
            tokio::spawn(async move {
                let conn = lock(&c.shared.conn).clone();
                if let Some(conn) = conn {
                    conn.closed().await;
                    if !c.shared.shutdown.is_cancelled() {
                        let why = match conn.failure() {
                            Some(e) => e.to_string(),
                            None => "the connection to the server was lost".into(),
                        };
                        c.fail(why).await;
                    }
                }
            });
        }
        Ok(client)
    }

    /// A client over an already-open transport (no reconnection: the caller owns the
    /// transport's origin). Used by benchmarks and tests that build transports themselves.
    pub async fn connect_transport(
        transport: Transport,
        mut opts: ClientOptions,
    ) -> Result<Client, ClientError> {
        opts.reconnect = false;
        let client = Client::unconnected(Target::Ws(transport.peer.clone()), opts);
        client.establish_over(transport, None).await?;
        Ok(client)
    }

    /// The session id.
    pub fn session_id(&self) -> Option<String> {
        lock(&self.shared.session).as_ref().map(|s| s.0.clone())
    }

    /// Why the session was lost, if it was.
    pub fn lost_reason(&self) -> Option<String> {
        lock(&self.shared.lost).clone()
    }

    /// How many connections were established (1 + successful resumes).
    pub fn connection_count(&self) -> u64 {
        self.shared
            .connects
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Drop the current transport as if the network failed (tests and benchmarks).
    pub fn break_connection(&self) {
        if let Some(c) = lock(&self.shared.conn).as_ref() {
            c.close();
        }
    }

    /// End the session on the server (`session/close`: its processes are terminated), then
    /// close. For a client that is done; [`close`](Self::close) leaves the session resumable.
    pub async fn shutdown(&self) {
        let conn = lock(&self.shared.conn).clone();
        if let Some(conn) = conn {
            let _ = tokio::time::timeout(
                Duration::from_secs(2),
                conn.call(Method::SessionClose.as_str(), json!({})),
            )
            .await;
        }
        self.close();
    }

    /// Close the client: the server detaches the session (it expires after its TTL).
    pub fn close(&self) {
        self.shared.shutdown.cancel();
        self.break_connection();
    }

    /// Connect, initialize (resuming `resume` if given) and install the connection.
    async fn establish(&self, resume: Option<(String, String)>) -> Result<(), ClientError> {
        let transport =
            open_transport(&self.shared.target, self.shared.opts.max_message_bytes).await?;
        self.establish_over(transport, resume).await
    }

    async fn establish_over(
        &self,
        transport: Transport,
        resume: Option<(String, String)>,
    ) -> Result<(), ClientError> {
        let (ntx, nrx) = mpsc::unbounded_channel::<Notification>();
        let shared = Arc::downgrade(&self.shared);
        let fast: rpc_connection::FastPath = Arc::new(move |n| {
            let Some(shared) = shared.upgrade() else {
                return Some(n);
            };
            Client::fast_deliver(&shared, n)
        });
        let conn = RpcConnection::start(transport, ntx, Some(fast));
        let mut params = json!({
            "clientName": self.shared.opts.client_name,
            "clientVersion": env!("CARGO_PKG_VERSION"),
            "capabilities": {
                "acks": self.shared.opts.acks,
                "binaryOutput": self.shared.opts.binary_output,
            },
        });
        if let Some((sid, tok)) = &resume {
            params["resume"] = json!({"sessionId": sid, "resumeToken": tok});
        }
        let result = conn.call(Method::Initialize.as_str(), params).await?;
        let init: InitializeResult = serde_json::from_value(result)
            .map_err(|e| ClientError::Protocol(format!("bad initialize result: {e}")))?;
        conn.notify(Method::Initialized.as_str(), json!({})).await?;
        *lock(&self.shared.session) = Some((
            init.session_id,
            init.resume_token,
            init.limits.detached_session_ttl_ms,
        ));
        *lock(&self.shared.conn) = Some(conn.clone());
        if resume.is_some() && self.shared.opts.acks {
            // An ack sent on the dead connection may be lost. Were it not repeated, the server
            // would replay only events this client already consumed (and drops as duplicates,
            // so they never count towards a new ack): with its retention full of them, it would
            // wait for an ack forever. Taken after the new connection is installed, so every
            // later ack goes to it.
            let consumed = self.consumed_positions();
            for (pid, seq) in consumed {
                conn.notify(
                    Method::ProcessAck.as_str(),
                    json!({"processId": pid, "seq": seq}),
                )
                .await?;
            }
        }
        self.shared
            .connects
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let c = self.clone();
        tokio::spawn(async move { c.route(conn, nrx).await });
        self.shared.reconnected.notify_waiters();
        Ok(())
    }

    /// Watch the connection; on loss, resume with backoff until the deadline.
    async fn supervise(&self) {
        loop {
            let conn = lock(&self.shared.conn).clone();
            let Some(conn) = conn else { return };
            tokio::select! {
                _ = conn.closed() => {}
                _ = self.shared.shutdown.cancelled() => return,
            }
            if self.shared.shutdown.is_cancelled() {
                return;
            }
            // A server that broke the protocol (a malformed binary message) is not resumed:
            // it would only send the same again.
            if let Some(e) = conn.failure() {
                self.fail(e.to_string()).await;
                return;
            }
            let Some((sid, tok, ttl)) = lock(&self.shared.session).clone() else {
                return;
            };
            let deadline = tokio::time::Instant::now()
                + self
                    .shared
                    .opts
                    .reconnect_deadline
                    .unwrap_or(Duration::from_millis(ttl));
            let mut delay = RECONNECT_INITIAL_DELAY;
            let mut attempt = 0u32;
            loop {
                attempt += 1;
                match self.establish(Some((sid.clone(), tok.clone()))).await {
                    Ok(()) => {
                        tracing::info!(attempt, "session resumed");
                        break;
                    }
                    Err(ClientError::Rpc {
                        code: -32003,
                        message,
                        ..
                    }) => {
                        self.fail(format!("server refused resume: {message}")).await;
                        return;
                    }
                    Err(e @ ClientError::Protocol(_)) => {
                        self.fail(e.to_string()).await;
                        return;
                    }
                    Err(e) => {
                        tracing::debug!(attempt, error = %e, "reconnect failed");
                        if tokio::time::Instant::now() + delay > deadline {
                            self.fail(format!("could not reconnect within the session TTL: {e}"))
                                .await;
                            return;
                        }
                        tokio::select! {
                            _ = tokio::time::sleep(delay) => {}
                            _ = self.shared.shutdown.cancelled() => return,
                        }
                        delay = (delay * 2).min(RECONNECT_MAX_DELAY);
                    }
                }
            }
        }
    }

    async fn fail(&self, why: String) {
        tracing::warn!(%why, "session lost");
        *lock(&self.shared.lost) = Some(why);
        // Ending every event stream tells the application.
        for slot in lock(&self.shared.procs).values() {
            slot.notify.notify_waiters();
        }
        self.shared.reconnected.notify_waiters();
    }

    /// Current connection, waiting for a reconnect if one is under way.
    async fn connection(&self) -> Result<RpcConnection, ClientError> {
        loop {
            if let Some(why) = lock(&self.shared.lost).clone() {
                return Err(ClientError::SessionLost(why));
            }
            let notified = self.shared.reconnected.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let c = lock(&self.shared.conn).clone();
            match c {
                Some(c) if !c.is_closed() => return Ok(c),
                _ if !(self.shared.opts.reconnect && self.shared.target.can_reconnect()) => {
                    return Err(ClientError::ConnectionLost)
                }
                _ => notified.await,
            }
        }
    }

    /// Call a method, retrying across reconnects. Only for requests that are safe to repeat.
    pub async fn call(&self, method: &str, params: Value) -> Result<Value, ClientError> {
        loop {
            let conn = self.connection().await?;
            match conn.call(method, params.clone()).await {
                Err(ClientError::ConnectionLost)
                    if self.shared.opts.reconnect && self.shared.target.can_reconnect() =>
                {
                    continue
                }
                other => return other,
            }
        }
    }

    /// Start a process and get a handle streaming its events.
    pub async fn start(&self, opts: StartOptions) -> Result<ProcessHandle, ClientError> {
        let id = opts.params.process_id.clone();
        lock(&self.shared.procs).insert(id.clone(), ProcSlot::new());
        let params =
            serde_json::to_value(&opts.params).map_err(|e| ClientError::Protocol(e.to_string()))?;
        let mut retried = false;
        let result = loop {
            let conn = match self.connection().await {
                Ok(c) => c,
                Err(e) => {
                    lock(&self.shared.procs).remove(&id);
                    return Err(e);
                }
            };
            match conn
                .call(Method::ProcessStart.as_str(), params.clone())
                .await
            {
                Ok(v) => break v,
                Err(ClientError::ConnectionLost) if self.shared.target.can_reconnect() => {
                    retried = true;
                    continue;
                }
                // The first attempt started it before the link died: find its pid.
                Err(ClientError::Rpc { code: -32002, .. }) if retried => {
                    let list = self.call(Method::ProcessList.as_str(), json!({})).await?;
                    let pid = list["processes"]
                        .as_array()
                        .and_then(|ps| ps.iter().find(|p| p["processId"] == id.as_str()))
                        .and_then(|p| p["pid"].as_u64())
                        .unwrap_or(0);
                    break json!({"processId": id, "pid": pid});
                }
                Err(e) => {
                    lock(&self.shared.procs).remove(&id);
                    return Err(e);
                }
            }
        };
        let r: StartResult =
            serde_json::from_value(result).map_err(|e| ClientError::Protocol(e.to_string()))?;
        Ok(ProcessHandle::new(id, r.pid, self.clone()))
    }

    /// `server/info`.
    pub async fn server_info(&self) -> Result<Value, ClientError> {
        self.call(Method::ServerInfo.as_str(), json!({})).await
    }
}
