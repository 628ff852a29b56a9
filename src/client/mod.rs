//! The Rust client: connect to an exec server, start processes, stream their events, and
//! survive transport failures by resuming the session.
//!
//! Layout: [`rpc_connection`] is one JSON-RPC connection; this module owns the session
//! (resuming another client's session with [`Client::resume`]) and starting processes;
//! `establish.rs` connects and initializes (the first connection's retries of an offline
//! environment, `initialize` and installing the connection); `supervise.rs` keeps it through
//! lost connections (resume with backoff inside the TTL, the [`ConnectionState`], the typed
//! [`Client::loss`]);
//! `options.rs` what an application sets, `error.rs` what it gets back when something fails,
//! `target.rs` where the server is and how one transport to it is opened; `diagnostics.rs`
//! what the client can say about a process whose output stopped; `silence.rs` asks
//! the server about a process that has been quiet for long, so that a client never waits
//! forever on a live connection. `event_stream.rs` holds the per-process event streams that
//! hand out every event exactly once and in order (deduplicated by `seq`, gaps filled with
//! `process/read`) and the acks; `process_handle.rs` holds [`ProcessHandle`] and
//! [`ProcessController`], the application's grip on one process; `stdin_writer.rs` the
//! pipelined [`StdinWriter`], with `write_retry.rs` deciding when a refused write goes
//! again. It must never show a byte
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

mod approval;
mod diagnostics;
mod error;
mod establish;
mod event_stream;
mod exclusive;
mod options;
mod process_handle;
pub mod rpc_connection;
mod silence;
mod start;
mod stdin_writer;
mod supervise;
mod target;
mod write_retry;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;

use crate::config::MAX_MESSAGE_BYTES;
use crate::connection::local::LocalLimits;
use crate::connection::message::{Call, Reply};
use crate::rpc::Method;
use crate::server::LocalServer;
use crate::sync::lock;
use crate::transport::Transport;
use event_stream::ProcSlot;
use rpc_connection::{Notification, RpcConnection};

pub use crate::connection::local::LocalLimits as InProcessLimits;
pub use crate::rpc::messages::{ApprovalDecision, ApproveParams};
pub use approval::{ApprovalHandler, REMEMBERED_APPROVALS};
pub use diagnostics::DeliveryState;
pub use error::ClientError;
pub use event_stream::{ProcessEvent, ACK_EVERY_BYTES};
pub use options::{AckPolicy, ClientOptions, InProcessConfig, StartOptions};
pub use process_handle::{ProcessController, ProcessHandle};
pub use silence::{PROBE_REPLY_TIMEOUT, SILENCE_PROBE_AFTER};
pub use start::START_LOOKUPS;
pub use stdin_writer::{
    StdinRefused, StdinWriter, STDIN_BINARY_WRITES_IN_FLIGHT, STDIN_BINARY_WRITE_BYTES,
    STDIN_WRITES_IN_FLIGHT, STDIN_WRITE_BYTES,
};
pub use target::Target;
pub use write_retry::{WRITE_RETRY_FIRST_MS, WRITE_RETRY_FOR_MS, WRITE_RETRY_MAX_MS};

/// First reconnect delay; doubles up to [`RECONNECT_MAX_DELAY`], each delay less up to a
/// quarter of jitter ([`Backoff`](crate::link::backoff::Backoff)).
pub const RECONNECT_INITIAL_DELAY: Duration = Duration::from_millis(50);
/// Longest reconnect delay.
pub const RECONNECT_MAX_DELAY: Duration = Duration::from_secs(2);
/// How long a first connection waits, in all, for an environment the relay says is offline
/// or moving ([`ClientError::EnvironmentOffline`]) before it gives up: the default of
/// [`ClientOptions::offline_wait`]. A relay cluster moves an environment by closing its link
/// (`moved`) and letting its exec server re-dial its new home, which takes a dial and a
/// handshake (well under a second on a healthy network); a client that connects in that
/// instant would otherwise fail. Five seconds covers it several times over and keeps a
/// client of an environment that really is away from waiting long.
pub const FIRST_CONNECT_OFFLINE_WAIT: Duration = Duration::from_secs(5);
/// First delay before the first connection tries an offline environment again; doubles up
/// to [`OFFLINE_RETRY_MAX_DELAY`], each less up to a quarter of jitter
/// ([`Backoff`](crate::link::backoff::Backoff): tries at about 0, 0.1, 0.3, 0.7, 1.5, 2.5, … s).
pub const OFFLINE_RETRY_INITIAL_DELAY: Duration = Duration::from_millis(100);
/// Longest delay between two tries of an offline environment on the first connection.
pub const OFFLINE_RETRY_MAX_DELAY: Duration = Duration::from_secs(1);

/// The in-process server a client owns (`Client::in_process`).
struct OwnedServer {
    server: LocalServer,
    deadline: Duration,
}

struct Shared {
    target: Target,
    opts: ClientOptions,
    conn: Mutex<Option<RpcConnection>>,
    session: Mutex<Option<(String, String, u64)>>,
    procs: Mutex<HashMap<String, ProcSlot>>,
    reconnected: Notify,
    shutdown: CancellationToken,
    lost: Mutex<Option<ClientError>>,
    connects: std::sync::atomic::AtomicU64,
    /// Decisions on the server's approval requests, by id (a re-sent request is not asked
    /// again).
    approvals: Arc<Mutex<approval::Approvals>>,
    /// The server, when it runs in this process.
    local: Mutex<Option<OwnedServer>>,
    /// The server's `maxMessageBytes`, from its last `initialize` result.
    server_max_message: std::sync::atomic::AtomicUsize,
    /// The server's `retainedOutputBytes`, from its last `initialize` result.
    server_retained: std::sync::atomic::AtomicU64,
    /// How long the session survives detached, as the server granted it.
    granted_ttl_ms: std::sync::atomic::AtomicU64,
    /// `capabilities.binaryOutput` of the last `initialize` result.
    granted_binary_output: std::sync::atomic::AtomicBool,
    /// The connection's state, for an application that shows it (`execrelay run`).
    state: tokio::sync::watch::Sender<ConnectionState>,
}

/// Where a client's connection stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnectionState {
    /// Connected (the first connection, or a resumed one).
    Connected,
    /// The connection was lost; resuming the session.
    Resuming,
    /// Given up: the session is lost ([`Client::lost_reason`] says why).
    Lost,
}

/// A connected client. Cheap to clone; every clone shares the session.
#[derive(Clone)]
pub struct Client {
    shared: Arc<Shared>,
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
            approvals: Arc::new(Mutex::new(approval::Approvals::default())),
            local: Mutex::new(None),
            server_max_message: std::sync::atomic::AtomicUsize::new(MAX_MESSAGE_BYTES),
            server_retained: std::sync::atomic::AtomicU64::new(
                crate::config::RETAINED_OUTPUT_BYTES as u64,
            ),
            granted_ttl_ms: std::sync::atomic::AtomicU64::new(0),
            granted_binary_output: std::sync::atomic::AtomicBool::new(false),
            state: tokio::sync::watch::Sender::new(ConnectionState::Connected),
        });
        Client { shared }
    }

    /// Connect and `initialize` a new session.
    pub async fn connect(target: Target, opts: ClientOptions) -> Result<Client, ClientError> {
        let client = Client::unconnected(target, opts);
        client.establish_first(None).await?;
        tokio::spawn(client.clone().watch_silence());
        client.watch_connection();
        Ok(client)
    }

    /// Connect and resume a session that another client started (its id and resume token,
    /// e.g. kept in a file by `execrelay run --detach`), handing out the events of its
    /// processes `attach`: each a process id and the last seq already shown (0: from the
    /// first event the server still holds; a range it no longer holds is
    /// [`ProcessEvent::Lost`]). One handle per entry of `attach`, in order (their `pid` is 0:
    /// `process/list` has it).
    pub async fn resume(
        target: Target,
        opts: ClientOptions,
        session_id: &str,
        resume_token: &str,
        attach: &[(String, u64)],
    ) -> Result<(Client, Vec<ProcessHandle>), ClientError> {
        let client = Client::unconnected(target, opts);
        let mut handles = Vec::new();
        for (id, after) in attach {
            // Registered before the resume: its replay starts at once.
            let slot = ProcSlot::new(*after);
            let (flags, notify) = (slot.flags(), slot.notify.clone());
            lock(&client.shared.procs).insert(id.clone(), slot);
            handles.push(
                ProcessHandle::new(id.clone(), 0, client.clone(), flags, notify).after(*after),
            );
        }
        client
            .establish_first(Some((session_id.to_string(), resume_token.to_string())))
            .await?;
        client.watch_connection();
        Ok((client, handles))
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
        tokio::spawn(client.clone().watch_silence());
        Ok(client)
    }

    /// A client whose server runs in this process (`connection/local.rs`): its own
    /// `SessionRegistry`, reached through bounded channels of typed messages (no JSON, no
    /// base64), with the same methods, events, errors and ordering as a remote one. A request
    /// that finds the queue full is `-32004` (`data.limit = "inProcessQueue"`) at once. There
    /// is nothing to reconnect to; [`shutdown`](Self::shutdown) ends the server within
    /// `config.shutdown_deadline`, its children with it.
    pub async fn in_process(
        config: InProcessConfig,
        mut opts: ClientOptions,
    ) -> Result<Client, ClientError> {
        opts.reconnect = false;
        let limits = config
            .limits
            .unwrap_or_else(|| LocalLimits::for_config(&config.server));
        let (server, end) = LocalServer::start(Arc::new(config.server), config.policy, limits)
            .map_err(|e| ClientError::Connect(format!("in-process server: {e}")))?;
        let client = Client::unconnected(Target::Ws("in-process".into()), opts);
        *lock(&client.shared.local) = Some(OwnedServer {
            server,
            deadline: config.shutdown_deadline,
        });
        let (ntx, nrx) = mpsc::unbounded_channel::<Notification>();
        let conn = RpcConnection::start_local(
            end,
            ntx,
            Some(client.fast_path()),
            Some(client.request_handler()),
        );
        if let Err(e) = client.initialize_on(conn, nrx, None).await {
            client.shutdown().await;
            return Err(e);
        }
        let c = client.clone();
        tokio::spawn(async move {
            let conn = lock(&c.shared.conn).clone();
            if let Some(conn) = conn {
                conn.closed().await;
                if !c.shared.shutdown.is_cancelled() {
                    c.fail(ClientError::SessionLost(
                        "the in-process server ended".into(),
                    ))
                    .await;
                }
            }
        });
        Ok(client)
    }

    /// The session id.
    pub fn session_id(&self) -> Option<String> {
        lock(&self.shared.session).as_ref().map(|s| s.0.clone())
    }

    /// Where the connection stands now and, through the receiver, each change (a lost
    /// connection being resumed, resumed, or given up).
    pub fn connection_state(&self) -> tokio::sync::watch::Receiver<ConnectionState> {
        self.shared.state.subscribe()
    }

    /// How long the session survives detached, as the server granted it (`limits.
    /// detachedSessionTtlMs` of the last `initialize`).
    pub fn granted_session_ttl(&self) -> Duration {
        Duration::from_millis(
            self.shared
                .granted_ttl_ms
                .load(std::sync::atomic::Ordering::Relaxed),
        )
    }

    /// Whether the server sends output as binary messages (`protocol.md` §5.1): its last
    /// `initialize` granted `binaryOutput` (asked for with [`ClientOptions::binary_output`]).
    pub fn binary_output(&self) -> bool {
        self.shared
            .granted_binary_output
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether stdin writes travel as binary messages (`protocol.md` §5.2): the client asked
    /// for them ([`ClientOptions::binary_input`]), the server's last `initialize` granted
    /// `binaryInput`, and the connection is a network one.
    pub fn binary_input(&self) -> bool {
        lock(&self.shared.conn)
            .as_ref()
            .is_some_and(|c| c.binary_input())
    }

    /// Whether a write the server refuses for a limit is sent again by a
    /// [`StdinWriter`] (within [`ClientOptions::write_retry_for`]): the server's last
    /// `initialize` promised `retryRefusedWrites` (it keeps a process's writes in order after
    /// a refusal), on a network connection.
    pub fn retry_refused_writes(&self) -> bool {
        lock(&self.shared.conn)
            .as_ref()
            .is_some_and(|c| c.retry_refused_writes())
    }

    /// The session's id and resume token: what a later client needs to resume it
    /// ([`ClientOptions`] aside), e.g. after this one is gone.
    pub fn session_credentials(&self) -> Option<(String, String)> {
        lock(&self.shared.session)
            .as_ref()
            .map(|(id, token, _)| (id.clone(), token.clone()))
    }

    /// Why the session was lost, if it was.
    pub fn lost_reason(&self) -> Option<String> {
        lock(&self.shared.lost).as_ref().map(ToString::to_string)
    }

    /// Why the session was lost, typed: [`ClientError::SessionExpired`] (the server no longer
    /// knows it), [`ClientError::Revoked`], [`ClientError::Refused`] (this client's key is no
    /// longer authorized), [`ClientError::SessionLost`] (no resume within the TTL), or the
    /// protocol error of a server that broke the protocol.
    pub fn loss(&self) -> Option<ClientError> {
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
    ///
    /// In process, it shuts the server down within its deadline (every child terminated, then
    /// killed), whatever the queues hold.
    pub async fn shutdown(&self) {
        let local = lock(&self.shared.local).take();
        if let Some(owned) = local {
            self.close();
            owned.server.shutdown(owned.deadline).await;
            return;
        }
        let conn = lock(&self.shared.conn).clone();
        if let Some(conn) = conn {
            let _ =
                tokio::time::timeout(Duration::from_secs(2), conn.call_typed(Call::SessionClose))
                    .await;
        }
        self.close();
    }

    /// Close the client: the server detaches the session (it expires after its TTL).
    pub fn close(&self) {
        self.shared.shutdown.cancel();
        self.break_connection();
    }

    /// Current connection, waiting for a reconnect if one is under way.
    async fn connection(&self) -> Result<RpcConnection, ClientError> {
        loop {
            // Registered before `lost` is looked at: `fail` sets it, then wakes the waiters
            // (`notify_waiters` stores nothing for a waiter that registers later).
            let notified = self.shared.reconnected.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(why) = lock(&self.shared.lost).clone() {
                return Err(why);
            }
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

    /// [`call`](Self::call) with a typed request and result: the library's own requests
    /// (no JSON in process). Retried across reconnects, so only for requests safe to repeat.
    pub(crate) async fn call_typed(&self, call: Call) -> Result<Reply, ClientError> {
        loop {
            let conn = self.connection().await?;
            match conn.call_typed(call.clone()).await {
                Err(ClientError::ConnectionLost)
                    if self.shared.opts.reconnect && self.shared.target.can_reconnect() =>
                {
                    continue
                }
                other => return other,
            }
        }
    }

    /// `server/info`.
    pub async fn server_info(&self) -> Result<Value, ClientError> {
        self.call(Method::ServerInfo.as_str(), json!({})).await
    }
}
