//! The `ConnectionProcessor`: one JSON-RPC connection, from framed messages to the session.
//!
//! It owns the connection's state machine (`initialize` → `initialized` → ready), the request
//! classes of `protocol.md` §6 (control requests run at once, per-process requests through the
//! [`Scheduler`]; both routed in `routing.rs`), the per-connection request limits (a count, and on a network connection a
//! byte budget under the server's, `request_budget.rs`: each request's message is charged when
//! read and given back once it is answered or skipped), the idle timeout, and the connection's
//! writer task. When the connection ends, queued requests are skipped, in-flight ones (long
//! polls included) end at once, and the session is detached (or closed, for stdio). It must
//! never block its reader on a request: a request runs on the reader only until its first wait,
//! then in a task of its own (`inline.rs`). Method names are parsed here, once, into a
//! [`Method`](crate::rpc::Method); everything after routes on the enum. Replies go through
//! the writer's control lane, or, to an in-process client that installed a receiver, straight
//! to it from where they are made (`local.rs`, "Handed over directly").

mod initialize;
mod inlet;
mod inline;
mod routing;

use std::net::IpAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::delivery::{hand_over, run_writer, ControlMessage};
use super::local::LocalServerEnd;
use super::message::{Outbound, RequestId};
use super::outlet::{Outlet, OutputForm, ReceiverSlot};
use super::request_budget::REQUEST_BUDGET_NAME;
use super::scheduler::Scheduler;
use super::write_order::WriteOrder;
use crate::bounds::IdleTimer;
use crate::metrics::GaugeGuard;
use crate::process::ReadySet;
use crate::rpc::RpcError;
use crate::session::{Session, SessionRegistry};
use crate::transport::{FlowProbe, FramingError, Transport};
use inlet::Inlet;

pub use crate::config::{CONTROL_LANE_SLACK, CONTROL_REQUEST_SLOTS};

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
    /// The peer's IP address (a `ws://` connection's, a Noise link's), for the per-address
    /// quotas of sessions and processes. `None` on stdio and in process.
    pub peer_addr: Option<IpAddr>,
    /// Close the connection once it has been idle this long (`idle_connection_timeout_ms`):
    /// no inbound message, no request in flight, no process of its session running or with
    /// output left to write. `None` (stdio, in process) never closes for idleness.
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
    /// The peer sent a response to a request the server never sent (a protocol error).
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
    /// The connection negotiated binary writes (§5.2); shared with the inlet, which decodes
    /// them.
    binary_input: Arc<AtomicBool>,
    evict: CancellationToken,
    cancel: CancellationToken,
    /// Ends long polls; a child of `cancel`, fired alone on a half-close.
    closing: CancellationToken,
    control: mpsc::Sender<ControlMessage>,
    /// The in-process client's receiver slot: replies go to it directly once installed.
    receiver: Option<ReceiverSlot>,
    scheduler: Scheduler,
    pending: Arc<Semaphore>,
    control_pending: Arc<Semaphore>,
    state: State,
    /// The client declared `serverRequests: ["process/approve"]`.
    can_approve: bool,
    /// The refused writes whose processes' later writes wait for them (`write_order.rs`);
    /// `None` in process, where a full request queue refuses a write in the client, before
    /// this reader could see it, so the rule cannot be kept (`retryRefusedWrites` false).
    write_order: Option<WriteOrder>,
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
        let form = Arc::new(OutputForm::default());
        let outlet = Outlet::Json {
            sink: transport.outgoing,
            form: form.clone(),
        };
        let binary_input = Arc::new(AtomicBool::new(false));
        let inlet = Inlet::Json {
            binary_input: binary_input.clone(),
            incoming: transport.incoming,
            budget: registry.inbound_budget().child(
                REQUEST_BUDGET_NAME,
                registry.config().max_pending_request_bytes,
            ),
        };
        let edge = Edge {
            inlet,
            outlet,
            form,
            binary_capable: transport.binary_messages,
            binary_input,
            peer: transport.peer,
            flow: transport.flow,
            receiver: None,
        };
        Self::serve(edge, registry, opts, shutdown).await
    }

    /// Serve the server end of an in-process transport (`local.rs`): the same processor,
    /// on typed messages.
    pub async fn run_local(
        end: LocalServerEnd,
        registry: Arc<SessionRegistry>,
        opts: ConnectionOptions,
        shutdown: CancellationToken,
    ) -> ConnectionEnd {
        let edge = Edge {
            inlet: Inlet::Local(end.inbound),
            outlet: Outlet::Local(end.outlet),
            form: Arc::new(OutputForm::default()),
            // Events travel typed; "binary" means nothing here.
            binary_capable: false,
            binary_input: Arc::new(AtomicBool::new(false)),
            peer: "in-process".to_string(),
            flow: None,
            receiver: Some(end.receiver),
        };
        Self::serve(edge, registry, opts, shutdown).await
    }

    async fn serve(
        edge: Edge,
        registry: Arc<SessionRegistry>,
        opts: ConnectionOptions,
        shutdown: CancellationToken,
    ) -> ConnectionEnd {
        let conn_id = registry.next_conn_id();
        let _live = GaugeGuard::new(&registry.metrics().connections);
        let span = tracing::info_span!("connection", id = conn_id, peer = %edge.peer);
        let Edge {
            inlet,
            outlet,
            form,
            binary_capable,
            binary_input,
            flow,
            receiver,
            ..
        } = edge;
        // Only the in-process transport has a receiver slot.
        let in_process = receiver.is_some();
        async move {
            let cfg = registry.config().clone();
            let (control, control_rx) = mpsc::channel(
                cfg.max_pending_requests + CONTROL_REQUEST_SLOTS + CONTROL_LANE_SLACK,
            );
            let ready = Arc::new(ReadySet::default());
            if let Some(flow) = flow {
                ready.set_flow(flow);
            }
            let writer_cancel = CancellationToken::new();
            let cancel = CancellationToken::new();
            let writer = tokio::spawn(
                run_writer(outlet, control_rx, ready.clone(), writer_cancel.clone())
                    .in_current_span(),
            );
            let mut cp = ConnectionProcessor {
                registry,
                opts,
                conn_id,
                ready,
                form,
                binary_capable,
                binary_input,
                evict: CancellationToken::new(),
                cancel: cancel.clone(),
                closing: cancel.child_token(),
                control,
                receiver,
                scheduler: Scheduler::default(),
                pending: Arc::new(Semaphore::new(cfg.max_pending_requests)),
                control_pending: Arc::new(Semaphore::new(CONTROL_REQUEST_SLOTS)),
                state: State::AwaitInitialize,
                can_approve: false,
                write_order: (!in_process).then(|| WriteOrder::new(cfg.max_processes)),
            };
            tracing::debug!("connection open");
            let end = cp.read_loop(inlet, &shutdown).await;
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
        mut incoming: Inlet,
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
                    self.send(self.error(None, &e)).await;
                    return ConnectionEnd::FramingError(e.message);
                }
                Some(Err(e)) => return ConnectionEnd::FramingError(e.to_string()),
                Some(Ok(None)) => {}
                Some(Ok(Some((inbound, charge)))) => {
                    if let Some(end) = self.handle_message(inbound, charge).await {
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

    async fn send(&self, msg: Outbound) {
        let response = matches!(msg, Outbound::Result { .. } | Outbound::Error { .. });
        let sent = hand_over(
            &self.control,
            self.receiver.as_ref(),
            ControlMessage::new(msg),
        )
        .await;
        if sent && response {
            self.registry.metrics().rpc_responses.inc();
        }
    }

    /// An error response, counted by code.
    fn error(&self, id: Option<RequestId>, e: &RpcError) -> Outbound {
        counted_error(&self.registry, id, e)
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

/// Every error response of a connection is made here, so each is counted once by code.
fn counted_error(registry: &SessionRegistry, id: Option<RequestId>, e: &RpcError) -> Outbound {
    registry.metrics().rpc_error(e.code.code());
    if e.code == crate::rpc::ErrorCode::LimitReached {
        let limit = e.data.as_ref().and_then(|d| d.get("limit"));
        registry
            .metrics()
            .limit_refusal(limit.and_then(serde_json::Value::as_str));
    }
    tracing::debug!(code = e.code.code(), error = %e.message, "error response");
    Outbound::Error {
        id,
        error: e.clone(),
    }
}

/// The two ends of a connection and what the processor must know of them.
struct Edge {
    inlet: Inlet,
    outlet: Outlet,
    form: Arc<OutputForm>,
    binary_capable: bool,
    binary_input: Arc<AtomicBool>,
    peer: String,
    /// The transport's flow-control state, for the stall watchdog (Noise streams).
    flow: Option<Arc<dyn FlowProbe>>,
    /// The in-process transport's receiver slot.
    receiver: Option<ReceiverSlot>,
}
