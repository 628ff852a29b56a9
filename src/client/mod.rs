//! The Rust client: connect to an exec server, start processes, stream their events, and
//! survive transport failures by resuming the session.
//!
//! Layout: [`rpc_connection`] is one JSON-RPC connection; this module adds the session
//! (`initialize`, resume with backoff inside the server's TTL), per-process event streams
//! that hand out every event exactly once and in order (deduplicated by `seq`, gaps filled
//! with `process/read`), and acks. It must never show a byte twice or skip one silently: a
//! range the server no longer retains is surfaced as [`ProcessEvent::Lost`].
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

pub mod rpc_connection;

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use serde_json::{json, Value};
use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;

use crate::config::MAX_MESSAGE_BYTES;
use crate::process::event_log::StreamName;
use crate::process::managed_process::lock;
use crate::rpc::messages::{ExitInfo, InitializeResult, StartParams, StartResult, TermSize};
use crate::transport::stdio::line_transport;
use crate::transport::Transport;
use rpc_connection::{Notification, RpcConnection};

/// Notifications queued between a connection's reader and its router task.
pub const NOTIFICATION_QUEUE: usize = 64;
/// Output bytes consumed by the application before an ack is sent.
pub const ACK_EVERY_BYTES: u64 = 256 * 1024;
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
    /// link shared with every other client of this process talking to the same server.
    Noise {
        /// `noise+ws://HOST:PORT`.
        url: String,
        /// Keys and pinned server key.
        config: Arc<crate::noise::link_client::NoiseClientConfig>,
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

/// An event of one process, handed out exactly once, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum ProcessEvent {
    /// Output bytes.
    Output {
        /// Which stream.
        stream: StreamName,
        /// The bytes.
        data: Bytes,
    },
    /// The server no longer had events `from..=to` (only possible without acks).
    Lost {
        /// First missing seq.
        from: u64,
        /// Last missing seq.
        to: u64,
    },
    /// The exit notice; the last event.
    Exited(ExitInfo),
}

/// Client-side state of one process: events received but not yet consumed.
///
/// The connection's reader never waits for the application (so responses keep flowing while
/// output piles up); the buffer is bounded by the server instead: with acks, the server stops
/// reading the child once `retainedOutputBytes` are unacknowledged, and this client
/// acknowledges only what the application consumed.
struct ProcSlot {
    buf: VecDeque<(u64, ProcessEvent)>,
    /// Highest seq received (deduplication of replays).
    received: u64,
    /// Highest seq handed to the application.
    consumed: u64,
    unacked_bytes: u64,
    /// The exit notice was received.
    done: bool,
    notify: Arc<Notify>,
}

impl ProcSlot {
    fn new() -> Self {
        ProcSlot {
            buf: VecDeque::new(),
            received: 0,
            consumed: 0,
            unacked_bytes: 0,
            done: false,
            notify: Arc::new(Notify::new()),
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

/// A started process.
pub struct ProcessHandle {
    /// Its id.
    pub id: String,
    /// Its pid on the server.
    pub pid: u32,
    client: Client,
    write_seq: u64,
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
        Target::Noise { url, config } => {
            use crate::noise::link_client::{ClientLink, NoiseError};
            let link = ClientLink::shared(url, config)
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
    /// Connect and `initialize` a new session.
    pub async fn connect(target: Target, opts: ClientOptions) -> Result<Client, ClientError> {
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
        let client = Client { shared };
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
                        c.fail("the connection to the server was lost".into()).await;
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
        let shared = Arc::new(Shared {
            target: Target::Ws(transport.peer.clone()),
            opts,
            conn: Mutex::new(None),
            session: Mutex::new(None),
            procs: Mutex::new(HashMap::new()),
            reconnected: Notify::new(),
            shutdown: CancellationToken::new(),
            lost: Mutex::new(None),
            connects: std::sync::atomic::AtomicU64::new(0),
        });
        let client = Client { shared };
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
        let (ntx, nrx) = mpsc::channel::<Notification>(NOTIFICATION_QUEUE);
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
            "capabilities": {"acks": self.shared.opts.acks},
        });
        if let Some((sid, tok)) = &resume {
            params["resume"] = json!({"sessionId": sid, "resumeToken": tok});
        }
        let result = conn.call("initialize", params).await?;
        let init: InitializeResult = serde_json::from_value(result)
            .map_err(|e| ClientError::Protocol(format!("bad initialize result: {e}")))?;
        conn.notify("initialized", json!({})).await?;
        *lock(&self.shared.session) = Some((
            init.session_id,
            init.resume_token,
            init.limits.detached_session_ttl_ms,
        ));
        *lock(&self.shared.conn) = Some(conn.clone());
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

    /// In-order output (and replays) handled on the connection's reader; anything else (a gap
    /// to fill, an exit notice) goes to the router task.
    fn fast_deliver(shared: &Shared, n: Notification) -> Option<Notification> {
        let Notification::Output {
            process_id,
            seq,
            stream,
            data,
        } = n
        else {
            return Some(n);
        };
        let mut procs = lock(&shared.procs);
        match procs.get_mut(&process_id) {
            Some(slot) if !slot.done && seq == slot.received + 1 => {
                Self::push(slot, seq, ProcessEvent::Output { stream, data });
                None
            }
            Some(slot) if slot.done || seq <= slot.received => None,
            None => None,
            Some(_) => Some(Notification::Output {
                process_id,
                seq,
                stream,
                data,
            }),
        }
    }

    /// Route notifications of one connection to process streams, deduplicated by seq.
    async fn route(&self, conn: RpcConnection, mut rx: mpsc::Receiver<Notification>) {
        while let Some(n) = rx.recv().await {
            match n {
                Notification::Output {
                    process_id,
                    seq,
                    stream,
                    data,
                } => {
                    let ev = ProcessEvent::Output { stream, data };
                    self.deliver(&conn, &process_id, seq, ev).await;
                }
                Notification::Other { method, params } => {
                    let Some(pid) = params.get("processId").and_then(Value::as_str) else {
                        continue;
                    };
                    let Some(seq) = params.get("seq").and_then(Value::as_u64) else {
                        continue;
                    };
                    let ev = match method.as_str() {
                        "process/outputDelta" => match decode_output(&params) {
                            Some(ev) => ev,
                            None => continue,
                        },
                        "process/exited" => {
                            match serde_json::from_value::<ExitInfo>(params.clone()) {
                                Ok(info) => ProcessEvent::Exited(info),
                                Err(_) => continue,
                            }
                        }
                        _ => continue,
                    };
                    self.deliver(&conn, pid, seq, ev).await;
                }
            }
        }
    }

    async fn deliver(&self, conn: &RpcConnection, pid: &str, seq: u64, ev: ProcessEvent) {
        let gap_from = {
            let mut procs = lock(&self.shared.procs);
            let Some(slot) = procs.get_mut(pid) else {
                return;
            };
            if seq <= slot.received || slot.done {
                return; // a replay after resume
            }
            if seq == slot.received + 1 {
                Self::push(slot, seq, ev);
                return;
            }
            slot.received
        };
        // A gap: fetch what is missing before going on.
        self.fill_gap(conn, pid, gap_from, seq).await;
        let mut procs = lock(&self.shared.procs);
        if let Some(slot) = procs.get_mut(pid) {
            if seq == slot.received + 1 && !slot.done {
                Self::push(slot, seq, ev);
            }
        }
    }

    fn push(slot: &mut ProcSlot, seq: u64, ev: ProcessEvent) {
        if matches!(ev, ProcessEvent::Exited(_)) {
            slot.done = true;
        }
        slot.received = seq;
        slot.buf.push_back((seq, ev));
        slot.notify.notify_waiters();
    }

    async fn fill_gap(&self, conn: &RpcConnection, pid: &str, after: u64, upto: u64) {
        let mut after = after;
        while after + 1 < upto {
            let r = conn
                .call(
                    "process/read",
                    json!({"processId": pid, "afterSeq": after, "maxBytes": 1 << 20}),
                )
                .await;
            let events = match r {
                Ok(v) => v,
                Err(ClientError::Rpc {
                    code: -32005, data, ..
                }) => {
                    let to = data
                        .as_ref()
                        .and_then(|d| d.get("toSeq"))
                        .and_then(Value::as_u64)
                        .unwrap_or(upto - 1);
                    let mut procs = lock(&self.shared.procs);
                    if let Some(slot) = procs.get_mut(pid) {
                        if slot.received == after {
                            // Not a real event: it does not take a seq of its own.
                            slot.buf.push_back((
                                to,
                                ProcessEvent::Lost {
                                    from: after + 1,
                                    to,
                                },
                            ));
                            slot.received = to;
                            slot.notify.notify_waiters();
                        }
                    }
                    after = to;
                    continue;
                }
                Err(_) => return,
            };
            let list = events["events"].as_array().cloned().unwrap_or_default();
            if list.is_empty() {
                return;
            }
            for e in list {
                let Some(seq) = e.get("seq").and_then(Value::as_u64) else {
                    return;
                };
                if seq >= upto {
                    return;
                }
                let ev = if e["type"] == "exited" {
                    match serde_json::from_value::<ExitInfo>(e.clone()) {
                        Ok(i) => ProcessEvent::Exited(i),
                        Err(_) => return,
                    }
                } else {
                    match decode_output(&e) {
                        Some(ev) => ev,
                        None => return,
                    }
                };
                let mut procs = lock(&self.shared.procs);
                if let Some(slot) = procs.get_mut(pid) {
                    if seq == slot.received + 1 {
                        Self::push(slot, seq, ev);
                    }
                }
                after = seq;
            }
        }
    }

    /// The application took events up to `seq` of `pid`: acknowledge now and then, so the
    /// server releases them (and keeps the child going).
    fn consumed(&self, pid: &str, seq: u64, bytes: u64, exited: bool) {
        let ack = {
            let mut procs = lock(&self.shared.procs);
            let Some(slot) = procs.get_mut(pid) else {
                return;
            };
            slot.consumed = seq;
            slot.unacked_bytes += bytes;
            if exited || slot.unacked_bytes >= ACK_EVERY_BYTES {
                slot.unacked_bytes = 0;
                true
            } else {
                false
            }
        };
        if ack {
            if let Some(conn) = lock(&self.shared.conn).clone() {
                let pid = pid.to_string();
                // Fire and forget: a lost ack only means a longer replay after a resume.
                tokio::spawn(async move {
                    let _ = conn
                        .notify("process/ack", json!({"processId": pid, "seq": seq}))
                        .await;
                });
            }
        }
    }

    async fn next_event_of(&self, pid: &str) -> Option<ProcessEvent> {
        loop {
            let notify = {
                let mut procs = lock(&self.shared.procs);
                let slot = procs.get_mut(pid)?;
                if let Some((seq, ev)) = slot.buf.pop_front() {
                    let bytes = match &ev {
                        ProcessEvent::Output { data, .. } => data.len() as u64,
                        _ => 0,
                    };
                    let exited = matches!(ev, ProcessEvent::Exited(_));
                    drop(procs);
                    self.consumed(pid, seq, bytes, exited);
                    if exited {
                        lock(&self.shared.procs).remove(pid);
                    }
                    return Some(ev);
                }
                if lock(&self.shared.lost).is_some() {
                    return None;
                }
                slot.notify.clone()
            };
            let notified = notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            // Re-check after registering, so a push in between is not missed.
            let ready = {
                let procs = lock(&self.shared.procs);
                procs.get(pid).is_none_or(|s| !s.buf.is_empty())
            };
            if !ready && lock(&self.shared.lost).is_none() {
                notified.await;
            }
        }
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
            match conn.call("process/start", params.clone()).await {
                Ok(v) => break v,
                Err(ClientError::ConnectionLost) if self.shared.target.can_reconnect() => {
                    retried = true;
                    continue;
                }
                // The first attempt started it before the link died: find its pid.
                Err(ClientError::Rpc { code: -32002, .. }) if retried => {
                    let list = self.call("process/list", json!({})).await?;
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
        Ok(ProcessHandle {
            id,
            pid: r.pid,
            client: self.clone(),
            write_seq: 0,
        })
    }

    /// `server/info`.
    pub async fn server_info(&self) -> Result<Value, ClientError> {
        self.call("server/info", json!({})).await
    }
}

fn decode_output(params: &Value) -> Option<ProcessEvent> {
    let stream = match params.get("stream")?.as_str()? {
        "stdout" => StreamName::Stdout,
        "stderr" => StreamName::Stderr,
        "pty" => StreamName::Pty,
        _ => return None,
    };
    let data = base64::engine::general_purpose::STANDARD
        .decode(params.get("chunk")?.as_str()?)
        .ok()?;
    Some(ProcessEvent::Output {
        stream,
        data: Bytes::from(data),
    })
}

impl ProcessHandle {
    /// The next event; `None` after the exit notice, or if the session was lost (see
    /// [`Client::lost_reason`]).
    pub async fn next_event(&mut self) -> Option<ProcessEvent> {
        self.client.next_event_of(&self.id).await
    }

    /// Write to stdin. Idempotent across reconnects (each write carries a `writeId`).
    pub async fn write(&mut self, data: &[u8]) -> Result<String, ClientError> {
        self.write_seq += 1;
        let v = self
            .client
            .call(
                "process/write",
                json!({
                    "processId": self.id,
                    "chunk": base64::engine::general_purpose::STANDARD.encode(data),
                    "writeId": format!("w-{}", self.write_seq),
                }),
            )
            .await?;
        Ok(v["status"].as_str().unwrap_or("").to_string())
    }

    /// Close stdin.
    pub async fn close_stdin(&self) -> Result<(), ClientError> {
        self.client
            .call("process/closeStdin", json!({"processId": self.id}))
            .await
            .map(|_| ())
    }

    /// Send a signal by name.
    pub async fn signal(&self, name: &str) -> Result<(), ClientError> {
        self.client
            .call(
                "process/signal",
                json!({"processId": self.id, "signal": name}),
            )
            .await
            .map(|_| ())
    }

    /// Resize the PTY.
    pub async fn resize(&self, size: TermSize) -> Result<(), ClientError> {
        self.client
            .call(
                "process/resize",
                json!({"processId": self.id, "rows": size.rows, "cols": size.cols}),
            )
            .await
            .map(|_| ())
    }

    /// Terminate (SIGTERM, then SIGKILL after `grace`).
    pub async fn terminate(&self, grace: Option<Duration>) -> Result<bool, ClientError> {
        let mut p = json!({"processId": self.id});
        if let Some(g) = grace {
            p["graceMs"] = json!(g.as_millis() as u64);
        }
        let v = self.client.call("process/terminate", p).await?;
        Ok(v["running"].as_bool().unwrap_or(false))
    }

    /// A cloneable controller for this process (signals, writes) usable while another task
    /// consumes events.
    pub fn controller(&self) -> ProcessController {
        ProcessController {
            id: self.id.clone(),
            client: self.client.clone(),
        }
    }
}

impl Drop for ProcessHandle {
    /// Stop buffering this process's events. Its output is no longer acknowledged, so with
    /// acks the server eventually holds the child back: terminate it if it should not run on.
    fn drop(&mut self) {
        lock(&self.client.shared.procs).remove(&self.id);
    }
}

/// Controls a process without owning its event stream.
#[derive(Clone)]
pub struct ProcessController {
    id: String,
    client: Client,
}

impl ProcessController {
    /// Send a signal by name.
    pub async fn signal(&self, name: &str) -> Result<(), ClientError> {
        self.client
            .call(
                "process/signal",
                json!({"processId": self.id, "signal": name}),
            )
            .await
            .map(|_| ())
    }

    /// Resize the PTY.
    pub async fn resize(&self, size: TermSize) -> Result<(), ClientError> {
        self.client
            .call(
                "process/resize",
                json!({"processId": self.id, "rows": size.rows, "cols": size.cols}),
            )
            .await
            .map(|_| ())
    }

    /// Write with an explicit idempotency key.
    pub async fn write(&self, data: &[u8], write_id: &str) -> Result<String, ClientError> {
        let v = self
            .client
            .call(
                "process/write",
                json!({
                    "processId": self.id,
                    "chunk": base64::engine::general_purpose::STANDARD.encode(data),
                    "writeId": write_id,
                }),
            )
            .await?;
        Ok(v["status"].as_str().unwrap_or("").to_string())
    }

    /// Close stdin.
    pub async fn close_stdin(&self) -> Result<(), ClientError> {
        self.client
            .call("process/closeStdin", json!({"processId": self.id}))
            .await
            .map(|_| ())
    }

    /// Terminate.
    pub async fn terminate(&self) -> Result<bool, ClientError> {
        let v = self
            .client
            .call("process/terminate", json!({"processId": self.id}))
            .await?;
        Ok(v["running"].as_bool().unwrap_or(false))
    }
}
