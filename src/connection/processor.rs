//! The `ConnectionProcessor`: one JSON-RPC connection, from framed messages to the session.
//!
//! It owns the connection's state machine (`initialize` → `initialized` → ready), the request
//! classes of `protocol.md` §6 (control requests run at once, per-process requests through the
//! [`Scheduler`]), the per-connection request limit, and the connection's writer task. When the
//! connection ends, queued requests are skipped, in-flight ones (long polls included) end at
//! once, and the session is detached (or closed, for stdio). It must never block its reader on
//! a request: every request runs in its own task. Method names are parsed here, once, into a
//! [`Method`]; everything after routes on the enum.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use serde_json::Value;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::delivery::{run_writer, ControlMessage, OutputForm};
use super::handlers::{self, Ctx, Reply};
use super::scheduler::{Class, Scheduler};
use crate::metrics::GaugeGuard;
use crate::process::ReadySet;
use crate::rpc::jsonrpc::{decode_params, encode_error, encode_response, parse_inbound, Inbound};
use crate::rpc::messages::{
    AdvertisedLimits, Capabilities, InitializeParams, InitializeResult, PROTOCOL_VERSION,
};
use crate::rpc::{Method, MethodClass, RpcError};
use crate::session::{ConnHandle, Session, SessionRegistry};
use crate::transport::{FramingError, Transport};

/// Extra control-lane slots beyond the request limit, for errors the reader sends itself
/// (parse errors, limit errors). When even these are full the reader waits: the client is not
/// reading its responses.
const CONTROL_LANE_SLACK: usize = 64;

/// Control requests (`signal`, `terminate`, `server/info`, `process/list`) in flight per
/// connection, apart from `maxPendingRequests`. They finish at once, so a small pool is
/// plenty; it only stops a client that sends them without reading the answers.
pub const CONTROL_REQUEST_SLOTS: usize = 64;

/// How long a closing connection waits for its writer to flush a final error.
const CLOSE_FLUSH_TIMEOUT: Duration = Duration::from_secs(2);

/// Options of one connection.
#[derive(Clone, Default)]
pub struct ConnectionOptions {
    /// Close the session (terminating its processes) when the connection ends, instead of
    /// detaching it. Stdio mode.
    pub close_session_on_end: bool,
    /// The client's static key on a Noise channel.
    pub peer_key: Option<Vec<u8>>,
    /// The end of the peer's input is a half-close (stdio): requests already read are run and
    /// answered (long polls end at once), for at most [`HALF_CLOSE_DRAIN_TIMEOUT`], before the
    /// connection ends. On a WebSocket the peer is gone and nothing would reach it.
    pub answer_after_eof: bool,
}

/// After a half-close (see [`ConnectionOptions::answer_after_eof`]): how long requests already
/// read may take to finish and be answered before they are abandoned like those of a dead
/// connection. Bounds a write stuck on a child that never reads its stdin.
pub const HALF_CLOSE_DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a connection ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnectionEnd {
    /// The peer closed it.
    PeerClosed,
    /// A framing error (oversized message, transport violation).
    FramingError(String),
    /// The peer sent a response; the server never sends requests.
    UnexpectedResponse,
    /// Another connection resumed the session.
    Evicted,
    /// Server shutdown.
    Shutdown,
}

enum State {
    AwaitInitialize,
    AwaitInitialized(Arc<Session>),
    Ready(Arc<Session>),
}

/// Runs one connection.
pub struct ConnectionProcessor {
    registry: Arc<SessionRegistry>,
    opts: ConnectionOptions,
    conn_id: u64,
    ready: Arc<ReadySet>,
    /// The form of this connection's output deltas, shared with its writer.
    form: Arc<OutputForm>,
    /// The transport carries binary messages (`protocol.md` §5.1): not stdio.
    binary_capable: bool,
    evict: CancellationToken,
    cancel: CancellationToken,
    /// Ends long polls; a child of `cancel`, fired alone on a half-close.
    closing: CancellationToken,
    control: mpsc::Sender<ControlMessage>,
    scheduler: Scheduler,
    pending: Arc<Semaphore>,
    control_pending: Arc<Semaphore>,
    state: State,
}

impl ConnectionProcessor {
    /// Serve `transport` until it closes, the session is resumed elsewhere, or `shutdown`
    /// fires.
    pub async fn run(
        transport: Transport,
        registry: Arc<SessionRegistry>,
        opts: ConnectionOptions,
        shutdown: CancellationToken,
    ) -> ConnectionEnd {
        let conn_id = registry.next_conn_id();
        let _live = GaugeGuard::new(&registry.metrics().connections);
        let span = tracing::info_span!("connection", id = conn_id, peer = %transport.peer);
        async move {
            let cfg = registry.config().clone();
            let (control, control_rx) = mpsc::channel(
                cfg.max_pending_requests + CONTROL_REQUEST_SLOTS + CONTROL_LANE_SLACK,
            );
            let ready = Arc::new(ReadySet::default());
            let form = Arc::new(OutputForm::default());
            let writer_cancel = CancellationToken::new();
            let cancel = CancellationToken::new();
            let binary_capable = transport.binary_messages;
            let writer = tokio::spawn(
                run_writer(
                    transport.outgoing,
                    control_rx,
                    ready.clone(),
                    form.clone(),
                    writer_cancel.clone(),
                )
                .in_current_span(),
            );
            let mut cp = ConnectionProcessor {
                registry,
                opts,
                conn_id,
                ready,
                form,
                binary_capable,
                evict: CancellationToken::new(),
                cancel: cancel.clone(),
                closing: cancel.child_token(),
                control,
                scheduler: Scheduler::default(),
                pending: Arc::new(Semaphore::new(cfg.max_pending_requests)),
                control_pending: Arc::new(Semaphore::new(CONTROL_REQUEST_SLOTS)),
                state: State::AwaitInitialize,
            };
            tracing::debug!("connection open");
            let end = cp.read_loop(transport.incoming, &shutdown).await;
            if end == ConnectionEnd::PeerClosed && cp.opts.answer_after_eof {
                cp.finish_read_requests(&shutdown).await;
            }
            tracing::info!(?end, "connection closing");
            cp.teardown(&end);
            let ConnectionProcessor { control, .. } = cp;
            drop(control);
            let mut writer = writer;
            if matches!(end, ConnectionEnd::Evicted) {
                writer_cancel.cancel();
            }
            if tokio::time::timeout(CLOSE_FLUSH_TIMEOUT, &mut writer)
                .await
                .is_err()
            {
                writer_cancel.cancel();
                writer.abort();
            }
            end
        }
        .instrument(span)
        .await
    }

    async fn read_loop(
        &mut self,
        mut incoming: crate::transport::MessageStream,
        shutdown: &CancellationToken,
    ) -> ConnectionEnd {
        let evict = self.evict.clone();
        loop {
            let msg = tokio::select! {
                biased;
                _ = evict.cancelled() => return ConnectionEnd::Evicted,
                _ = shutdown.cancelled() => return ConnectionEnd::Shutdown,
                m = incoming.next() => m,
            };
            match msg {
                None => return ConnectionEnd::PeerClosed,
                Some(Err(FramingError::TooLarge { limit })) => {
                    let e = RpcError::invalid_request(format!(
                        "message exceeds the limit of {limit} bytes"
                    ));
                    self.send(self.error(&Value::Null, &e)).await;
                    return ConnectionEnd::FramingError(e.message);
                }
                Some(Err(e)) => return ConnectionEnd::FramingError(e.to_string()),
                Some(Ok(bytes)) => {
                    if let Some(end) = self.handle_message(&bytes).await {
                        return end;
                    }
                }
            }
        }
    }

    async fn send(&self, text: String) {
        let _ = self.control.send(ControlMessage::new(text)).await;
    }

    async fn handle_message(&mut self, bytes: &[u8]) -> Option<ConnectionEnd> {
        let inbound = match parse_inbound(bytes) {
            Ok(i) => i,
            Err(r) => {
                self.send(self.error(&r.id, &r.error)).await;
                return None;
            }
        };
        match inbound {
            Inbound::Response { .. } => {
                tracing::warn!("client sent a response; the server sends no requests");
                Some(ConnectionEnd::UnexpectedResponse)
            }
            Inbound::Notification { method, params } => {
                self.handle_notification(&method, params);
                None
            }
            Inbound::Request { id, method, params } => {
                self.handle_request(id, method, params).await;
                None
            }
        }
    }

    fn handle_notification(&mut self, method: &str, params: Value) {
        match (&self.state, Method::parse(method)) {
            (State::AwaitInitialized(s), Some(Method::Initialized)) => {
                self.state = State::Ready(s.clone());
            }
            (State::Ready(s), Some(Method::ProcessAck)) => handlers::ack(s, params),
            _ => tracing::debug!(method, "notification ignored"),
        }
    }

    async fn handle_request(&mut self, id: Value, name: String, params: Value) {
        // The one place a method name is parsed.
        let method = Method::parse(&name);
        let session = match (&self.state, method) {
            (State::AwaitInitialize, Some(Method::Initialize)) => {
                let reply = self.initialize(params);
                let text = match reply {
                    Ok(v) => encode_response(&id, &v),
                    Err(e) => self.error(&id, &e),
                };
                self.send(text).await;
                return;
            }
            (State::AwaitInitialize, _) => {
                let e = RpcError::invalid_request("client must send initialize first");
                self.send(self.error(&id, &e)).await;
                return;
            }
            (_, Some(Method::Initialize)) => {
                let e = RpcError::invalid_request("initialize may succeed only once");
                self.send(self.error(&id, &e)).await;
                return;
            }
            (State::AwaitInitialized(_), _) => {
                let e = RpcError::invalid_request("client must send initialized first");
                self.send(self.error(&id, &e)).await;
                return;
            }
            (State::Ready(s), _) => s.clone(),
        };

        let (method, class) = match method.map(|m| (m, m.class())) {
            Some((m, MethodClass::Control)) => (m, None),
            Some((m, MethodClass::Exclusive)) => (m, Some(Class::Exclusive)),
            Some((m, MethodClass::Shared)) => (m, Some(Class::Shared)),
            Some((_, MethodClass::Ack)) => {
                handlers::ack(&session, params);
                self.send(encode_response(&id, &serde_json::json!({})))
                    .await;
                return;
            }
            // Unknown, or not something a client may call (`initialized` as a request, a
            // server notification).
            Some((_, MethodClass::Setup | MethodClass::ServerToClient)) | None => {
                self.send(self.error(&id, &RpcError::method_not_found(&name)))
                    .await;
                return;
            }
        };

        // Control requests draw from their own small pool, so that a connection whose
        // request slots are all taken by long polls can still terminate its processes.
        let pool = if class.is_none() {
            &self.control_pending
        } else {
            &self.pending
        };
        let Ok(permit) = pool.clone().try_acquire_owned() else {
            let (name, value) = if class.is_none() {
                ("maxPendingControlRequests", CONTROL_REQUEST_SLOTS as u64)
            } else {
                (
                    "maxPendingRequests",
                    self.registry.config().max_pending_requests as u64,
                )
            };
            let e = RpcError::limit_reached(name, value);
            self.send(self.error(&id, &e)).await;
            return;
        };

        // Per-process requests need their processId before they can queue.
        let slot = match class {
            None => None,
            Some(class) => match params.get("processId").and_then(Value::as_str) {
                Some(pid) => Some(self.scheduler.enqueue(pid, class)),
                None => {
                    let e = match decode_params::<crate::rpc::messages::ProcessRef>(params) {
                        Err(e) => e,
                        Ok(_) => RpcError::invalid_params("invalid params: processId"),
                    };
                    self.send(self.error(&id, &e)).await;
                    return;
                }
            },
        };
        self.spawn_request(id, method, params, session, slot, permit);
    }

    /// Encode an error response, counting it by code.
    fn error(&self, id: &Value, e: &RpcError) -> String {
        counted_error(&self.registry, id, e)
    }

    fn spawn_request(
        &self,
        id: Value,
        method: Method,
        params: Value,
        session: Arc<Session>,
        slot: Option<super::scheduler::Slot>,
        permit: OwnedSemaphorePermit,
    ) {
        let ctx = Ctx {
            session,
            registry: self.registry.clone(),
            conn_id: self.conn_id,
            cancel: self.closing.clone(),
        };
        let control = self.control.clone();
        let cancel = self.cancel.clone();
        let span = tracing::debug_span!("request", %method);
        tokio::spawn(
            async move {
                let _permit = permit;
                let mut slot = slot;
                if let Some(s) = slot.as_mut() {
                    tokio::select! {
                        biased;
                        // Closed connection: queued requests are skipped, never run.
                        _ = cancel.cancelled() => return,
                        _ = s.ready() => {}
                    }
                }
                if cancel.is_cancelled() {
                    return;
                }
                // A request that has started runs to its end even if the connection closes
                // meanwhile: a write cut half-way could not be retried exactly once. Long
                // polls watch the connection's token themselves and end at once.
                let reply = handlers::dispatch(&ctx, method, params).await;
                let msg = match reply {
                    Ok(Reply {
                        result,
                        after_write,
                    }) => ControlMessage {
                        text: encode_response(&id, &result),
                        after_write,
                    },
                    Err(e) => ControlMessage::new(counted_error(&ctx.registry, &id, &e)),
                };
                let _ = control.send(msg).await;
                drop(slot);
            }
            .instrument(span),
        );
    }

    fn initialize(&mut self, params: Value) -> Result<Value, RpcError> {
        let p: InitializeParams = decode_params(params)?;
        // Decided before the session is attached, so that every delta of this connection,
        // replays included, goes out in this form (§5.1). stdio cannot carry binary messages
        // and answers `false`.
        let binary = p.capabilities.binary_output && self.binary_capable;
        self.form.set_binary(binary);
        let conn = ConnHandle {
            conn_id: self.conn_id,
            ready: self.ready.clone(),
            evict: self.evict.clone(),
            peer_key: self.opts.peer_key.clone(),
        };
        let (session, token, resumed) = match &p.resume {
            Some(r) => {
                let s = self
                    .registry
                    .resume(&r.session_id, &r.resume_token, &conn)?;
                (s, r.resume_token.clone(), true)
            }
            None => {
                let (s, t) = self.registry.create(p.capabilities.acks, &conn)?;
                (s, t, false)
            }
        };
        tracing::info!(session = %session.id, resumed, binary, "initialized");
        let cfg = self.registry.config();
        let result = InitializeResult {
            protocol_version: PROTOCOL_VERSION,
            server_version: env!("CARGO_PKG_VERSION").to_string(),
            session_id: session.id.clone(),
            resume_token: token,
            resumed,
            limits: AdvertisedLimits {
                max_message_bytes: cfg.max_message_bytes as u64,
                max_processes: cfg.max_processes as u64,
                retained_output_bytes: cfg.retained_output_bytes as u64,
                detached_session_ttl_ms: cfg.detached_session_ttl_ms,
            },
            capabilities: Capabilities {
                // A resumed session keeps the acks it was created with.
                acks: session.acks,
                binary_output: binary,
            },
        };
        self.state = State::AwaitInitialized(session);
        serde_json::to_value(result).map_err(|e| RpcError::internal(e.to_string()))
    }

    /// Let every request already read run and send its answer: long polls end now, queued
    /// requests are not skipped. Bounded by [`HALF_CLOSE_DRAIN_TIMEOUT`] and by shutdown.
    async fn finish_read_requests(&self, shutdown: &CancellationToken) {
        self.closing.cancel();
        let all = |pool: &Arc<Semaphore>, n: usize| {
            let pool = pool.clone();
            async move {
                let n = u32::try_from(n).unwrap_or(u32::MAX);
                let _ = pool.acquire_many_owned(n).await;
            }
        };
        let done = async {
            all(&self.pending, self.registry.config().max_pending_requests).await;
            all(&self.control_pending, CONTROL_REQUEST_SLOTS).await;
        };
        tokio::select! {
            _ = done => {}
            _ = tokio::time::sleep(HALF_CLOSE_DRAIN_TIMEOUT) => {
                tracing::warn!("requests still running after the peer's end of input: abandoned");
            }
            _ = shutdown.cancelled() => {}
        }
    }

    fn teardown(&mut self, end: &ConnectionEnd) {
        self.cancel.cancel();
        let session = match &self.state {
            State::AwaitInitialize => None,
            State::AwaitInitialized(s) | State::Ready(s) => Some(s.clone()),
        };
        if let Some(s) = session {
            if self.opts.close_session_on_end {
                s.close();
            } else if !matches!(end, ConnectionEnd::Evicted) {
                s.detach(self.conn_id);
            }
        }
    }
}

/// Every error response of a connection is encoded here, so each is counted once by code.
fn counted_error(registry: &SessionRegistry, id: &Value, e: &RpcError) -> String {
    registry.metrics().rpc_error(e.code.code());
    encode_error(id, e)
}
