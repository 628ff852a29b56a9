//! The `ConnectionProcessor`: one JSON-RPC connection, from framed messages to the session.
//!
//! It owns the connection's state machine (`initialize` → `initialized` → ready), the request
//! classes of `protocol.md` §6 (control requests run at once, per-process requests through the
//! [`Scheduler`]), the per-connection request limits (a count, and a byte budget under the
//! server's: each request's message is charged when read and given back once it is answered
//! or skipped), the idle timeout, and the connection's writer task. When the connection ends,
//! queued requests are skipped, in-flight ones (long polls included) end at once, and the
//! session is detached (or closed, for stdio). It must never block its reader on a request:
//! every request runs in its own task. Method names are parsed here, once, into a
//! [`Method`]; everything after routes on the enum.

use std::borrow::Cow;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::delivery::{run_writer, ControlMessage, OutputForm};
use super::handlers::{self, Ctx, Reply};
use super::scheduler::{Class, Scheduler};
use crate::bounds::{ByteBudget, Charge, IdleTimer, OverBudget};
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

/// A message charged at most this many bytes ([`parse_cost`]) whose method finishes at once
/// (a control request, `process/ack`, `initialize`, `initialized`) is never refused for
/// bytes: it is charged even past the budgets, so that a client whose budget is full of
/// writes stuck on a child can still `terminate` it (such a request is under 1 KiB). Control
/// requests in flight are capped by [`CONTROL_REQUEST_SLOTS`] and the others are answered by
/// the reader itself, so a connection forces at most 65 × 16 KiB past its budget.
pub const SMALL_MESSAGE_BYTES: usize = 16 * 1024;

/// The name clients see in `data.limit` when a connection's request budget is full.
pub const REQUEST_BUDGET_NAME: &str = "maxPendingRequestBytes";

/// What one JSON value can take once parsed, beyond its text, at most: 128 bytes (a 32-byte
/// `Value` in an array that may have doubled, or a map entry with its key and B-tree share,
/// plus the smallest heap block of a short string). A message is charged its length plus this
/// for every `,` `:` `[` `{` in it (each starts at most one value), *before* it is parsed:
/// `[0,0,0,…]` would otherwise turn 16 MiB of text into half a gigabyte of tree. A write of
/// base64 has a dozen such bytes.
pub const PARSED_VALUE_BYTES: usize = 128;

/// The bytes a message is charged: its text, plus [`PARSED_VALUE_BYTES`] per value it can
/// hold (an upper bound of its parsed tree; the text is dropped once parsed).
pub fn parse_cost(bytes: &[u8]) -> usize {
    let values = memchr::memchr3_iter(b',', b':', b'[', bytes).count()
        + memchr::memchr_iter(b'{', bytes).count();
    bytes
        .len()
        .saturating_add(values.saturating_mul(PARSED_VALUE_BYTES))
}

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
    /// The peer's IP address (a `ws://` connection's, a Noise link's), for the per-address
    /// quotas of sessions and processes. `None` on stdio.
    pub peer_addr: Option<IpAddr>,
    /// Close the connection once it has been idle this long (`idle_connection_timeout_ms`):
    /// no inbound message, no request in flight, no process of its session running or with
    /// output left to write. `None` (stdio) never closes for idleness.
    pub idle_timeout: Option<Duration>,
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
    /// Idle past [`ConnectionOptions::idle_timeout`].
    Idle,
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
    /// `max_pending_request_bytes`, a child of the server's inbound budget.
    budget: ByteBudget,
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
            let registry_budget = registry
                .inbound_budget()
                .child(REQUEST_BUDGET_NAME, cfg.max_pending_request_bytes);
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
                budget: registry_budget,
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
        let mut idle = self
            .opts
            .idle_timeout
            .map(|timeout| IdleTimer::new(timeout, idle_now()));
        loop {
            let idle_deadline = idle
                .as_ref()
                .map(|i| tokio::time::Instant::from_std(i.deadline()));
            let msg = tokio::select! {
                biased;
                _ = evict.cancelled() => return ConnectionEnd::Evicted,
                _ = shutdown.cancelled() => return ConnectionEnd::Shutdown,
                m = incoming.next() => m,
                _ = sleep_until_some(idle_deadline) => {
                    if let Some(i) = idle.as_mut() {
                        let now = idle_now();
                        i.observe(now, self.busy());
                        if i.expired(now) {
                            return ConnectionEnd::Idle;
                        }
                    }
                    continue;
                }
            };
            if let Some(i) = idle.as_mut() {
                i.touch(idle_now());
            }
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
                    if let Some(end) = self.handle_message(bytes).await {
                        return end;
                    }
                }
            }
        }
    }

    /// Whether the connection has work: a request in flight, or a process of its session
    /// running or with output not yet written. A busy connection is never idle.
    fn busy(&self) -> bool {
        let requests = self.pending.available_permits()
            < self.registry.config().max_pending_requests
            || self.control_pending.available_permits() < CONTROL_REQUEST_SLOTS;
        if requests {
            return true;
        }
        match &self.state {
            State::AwaitInitialize => false,
            State::AwaitInitialized(s) | State::Ready(s) => s
                .processes()
                .iter()
                .any(|p| p.is_running() || p.stats().unwritten_bytes > 0),
        }
    }

    async fn send(&self, text: String) {
        let _ = self.control.send(ControlMessage::new(text)).await;
    }

    async fn handle_message(&mut self, bytes: Vec<u8>) -> Option<ConnectionEnd> {
        // Charged before it is parsed, for its text and the most its parsed tree can take;
        // held until the request is answered.
        let charge = match self.budget.try_charge(parse_cost(&bytes)) {
            Ok(charge) => charge,
            Err(over) => self.over_budget(&bytes, over).await?,
        };
        let inbound = parse_inbound(&bytes);
        drop(bytes);
        let inbound = match inbound {
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
                self.handle_request(id, method, params, charge).await;
                None
            }
        }
    }

    /// A message that does not fit the connection's budget (or the server's). A small one
    /// that finishes at once is charged anyway ([`SMALL_MESSAGE_BYTES`]); a request is
    /// answered `-32004` naming the full budget, and dropped unparsed; a notification is
    /// dropped.
    async fn over_budget(&self, bytes: &[u8], over: OverBudget) -> Option<Charge> {
        let peek = serde_json::from_slice::<Peek>(bytes).ok();
        let method = peek
            .as_ref()
            .and_then(|p| p.method.as_deref())
            .and_then(Method::parse);
        let finishes_at_once = method.is_some_and(|m| {
            matches!(
                m.class(),
                MethodClass::Control | MethodClass::Ack | MethodClass::Setup
            )
        });
        let cost = parse_cost(bytes);
        if cost <= SMALL_MESSAGE_BYTES && finishes_at_once {
            return Some(self.budget.force_charge(cost));
        }
        match peek.and_then(|p| p.id) {
            Some(id) => {
                tracing::debug!(limit = over.limit, bytes = bytes.len(), "request refused");
                let e = RpcError::limit_reached(over.limit, over.max as u64);
                self.send(self.error(&id, &e)).await;
            }
            None => tracing::debug!(limit = over.limit, "message dropped over budget"),
        }
        None
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

    async fn handle_request(&mut self, id: Value, name: String, params: Value, charge: Charge) {
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
        self.spawn_request(id, method, params, session, slot, (permit, charge));
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
        held: (OwnedSemaphorePermit, Charge),
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
                // The request's slot and bytes are given back when this task ends: answered,
                // or skipped because the connection closed.
                let _held = held;
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
            peer_addr: self.opts.peer_addr,
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

/// The idle clock: tokio's (so paused-time tests drive it), as a std instant for the sans-IO
/// [`IdleTimer`].
fn idle_now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

/// Sleep until `deadline`, or forever without one.
async fn sleep_until_some(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// The envelope of a message that did not fit its budget: enough to answer it, without
/// building its params (serde skips them without allocating).
#[derive(Deserialize)]
struct Peek<'a> {
    #[serde(default)]
    id: Option<Value>,
    #[serde(default, borrow)]
    method: Option<Cow<'a, str>>,
}

/// Every error response of a connection is encoded here, so each is counted once by code.
fn counted_error(registry: &SessionRegistry, id: &Value, e: &RpcError) -> String {
    registry.metrics().rpc_error(e.code.code());
    encode_error(id, e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_costs_its_text_plus_its_values() {
        let write = format!(
            r#"{{"jsonrpc":"2.0","id":7,"method":"process/write","params":{{"processId":"p","chunk":"{}"}}}}"#,
            "QUJD".repeat(1000)
        );
        // `{` ×2, `:` ×6, `,` ×4.
        assert_eq!(
            parse_cost(write.as_bytes()),
            write.len() + 12 * PARSED_VALUE_BYTES
        );
        // A tree of tiny values costs far more than its text.
        let zeros = format!("[{}0]", "0,".repeat(1000));
        assert_eq!(
            parse_cost(zeros.as_bytes()),
            zeros.len() + 1001 * PARSED_VALUE_BYTES
        );
        let terminate = r#"{"jsonrpc":"2.0","id":1,"method":"process/terminate","params":{"processId":"some-process","graceMs":2000}}"#;
        assert!(parse_cost(terminate.as_bytes()) < SMALL_MESSAGE_BYTES);
    }
}
