//! One message, routed: the connection's state rules (`initialize` first and once, then
//! `initialized`), the method's class (`protocol.md` §6), the request slots of its pool, the
//! per-process queue, and then the request itself, run on the reader until its first wait
//! (`inline.rs`). Responses to the server's own requests (approvals) and notifications (acks)
//! are settled here too. It never writes to the transport: every answer goes through
//! [`ConnectionProcessor::send`] or the request's hand-over.

use std::sync::Arc;

use tokio::sync::OwnedSemaphorePermit;
use tracing::Instrument;

use super::super::delivery::{hand_over, ControlMessage};
use super::super::handlers::{self, Ctx, Handled};
use super::super::message::{Call, Inbound, Note, Outbound, Reply, RequestId};
use super::super::scheduler::Class;
use super::{
    counted_error, inline, ConnectionEnd, ConnectionProcessor, State, CONTROL_REQUEST_SLOTS,
};
use crate::bounds::Charge;
use crate::rpc::{MethodClass, RpcError};
use crate::session::{AnswerOutcome, ApprovalAnswer, Session};

impl ConnectionProcessor {
    /// Serve one message. `charge` holds its bytes: a request keeps it until it is answered
    /// or skipped; anything answered by the reader itself gives it back on return.
    pub(super) async fn handle_message(
        &mut self,
        inbound: Inbound,
        charge: Charge,
    ) -> Option<ConnectionEnd> {
        match inbound {
            Inbound::Rejected { id, error } => {
                self.send(self.error(id, &error)).await;
                None
            }
            Inbound::RefusedWrite {
                id,
                error,
                process_id,
                write_id,
            } => {
                // A write behind a held one is answered for the held one (and holds nothing).
                let held = self.check_write_order(&process_id, write_id.as_deref());
                if held.is_ok() {
                    self.hold_writes_behind(&process_id, write_id.as_deref());
                }
                self.send(self.error(id, &held.err().unwrap_or(error)))
                    .await;
                None
            }
            Inbound::Response { id, answer } => self.handle_response(id.as_ref(), answer),
            Inbound::Notification(note) => {
                self.handle_notification(note);
                None
            }
            Inbound::Request { id, call } => {
                self.handle_request(id, call, charge).await;
                None
            }
        }
    }

    /// A response to a server request (`process/approve`): the session takes the first
    /// answer and ignores late ones; an id it never sent closes this connection (only).
    fn handle_response(
        &mut self,
        id: Option<&RequestId>,
        answer: ApprovalAnswer,
    ) -> Option<ConnectionEnd> {
        let session = match &self.state {
            State::AwaitInitialize => None,
            State::AwaitInitialized(s) | State::Ready(s) => Some(s.clone()),
        };
        let outcome = match (session, id.and_then(RequestId::as_str)) {
            (Some(s), Some(id)) => s.answer(id, answer),
            _ => AnswerOutcome::NeverSent,
        };
        if outcome == AnswerOutcome::NeverSent {
            tracing::warn!("client sent a response to a request the server never sent");
            return Some(ConnectionEnd::UnexpectedResponse);
        }
        None
    }

    fn handle_notification(&mut self, note: Note) {
        match (&self.state, note) {
            (State::AwaitInitialized(s), Note::Initialized) => {
                self.state = State::Ready(s.clone());
            }
            (State::Ready(s), Note::Ack(params)) => handlers::ack(s, params),
            (_, note) => tracing::debug!(?note, "notification ignored"),
        }
    }

    async fn handle_request(&mut self, id: RequestId, call: Call, charge: Charge) {
        let method = call.method();
        let session = match (&self.state, call) {
            (State::AwaitInitialize, Call::Initialize(params)) => {
                let msg = match self.initialize(params) {
                    Ok(r) => Outbound::Result {
                        id,
                        reply: Reply::Initialize(r),
                    },
                    Err(e) => self.error(Some(id), &e),
                };
                self.send(msg).await;
                return;
            }
            (
                State::AwaitInitialize,
                Call::Invalid {
                    method: crate::rpc::Method::Initialize,
                    error,
                    ..
                },
            ) => {
                self.send(self.error(Some(id), &error)).await;
                return;
            }
            (State::AwaitInitialize, _) => {
                let e = RpcError::invalid_request("client must send initialize first");
                self.send(self.error(Some(id), &e)).await;
                return;
            }
            (_, Call::Initialize(_))
            | (
                _,
                Call::Invalid {
                    method: crate::rpc::Method::Initialize,
                    ..
                },
            ) => {
                let e = RpcError::invalid_request("initialize may succeed only once");
                self.send(self.error(Some(id), &e)).await;
                return;
            }
            (State::AwaitInitialized(_), _) => {
                let e = RpcError::invalid_request("client must send initialized first");
                self.send(self.error(Some(id), &e)).await;
                return;
            }
            (State::Ready(s), call) => (s.clone(), call),
        };
        let (session, call) = session;

        let class = match (method, method.map(|m| m.class())) {
            (_, Some(MethodClass::Control)) => None,
            (_, Some(MethodClass::Exclusive)) => Some(Class::Exclusive),
            (_, Some(MethodClass::Shared)) => Some(Class::Shared),
            (_, Some(MethodClass::Ack)) => {
                if let Call::Ack(params) = call {
                    handlers::ack(&session, params);
                }
                self.send(Outbound::Result {
                    id,
                    reply: Reply::Empty,
                })
                .await;
                return;
            }
            // Unknown, or not something a client may call (`initialized` as a request, a
            // server notification).
            (_, Some(MethodClass::Setup | MethodClass::ServerToClient))
            | (None, None)
            | (Some(_), None) => {
                let name = match &call {
                    Call::NotFound(n) => n.clone(),
                    _ => method.map(|m| m.as_str().to_string()).unwrap_or_default(),
                };
                self.send(self.error(Some(id), &RpcError::method_not_found(&name)))
                    .await;
                return;
            }
        };

        // Writes keep their order once one was refused (`write_order.rs`): a later one is
        // refused until the refused one comes again. A start under an id begins afresh.
        match &call {
            Call::Write(w) => {
                if let Err(e) = self.check_write_order(&w.process_id, w.write_id.as_deref()) {
                    self.send(self.error(Some(id), &e)).await;
                    return;
                }
            }
            Call::Start(p) => {
                if let Some(order) = &mut self.write_order {
                    order.forget(&p.process_id);
                }
            }
            _ => {}
        }
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
            if let Call::Write(w) = &call {
                self.hold_writes_behind(&w.process_id, w.write_id.as_deref());
            }
            self.send(self.error(Some(id), &e)).await;
            return;
        };

        // Per-process requests need their processId before they can queue.
        let slot = match class {
            None => None,
            Some(class) => match call.process_id() {
                Some(pid) => Some(self.scheduler.enqueue(pid, class)),
                None => {
                    let e = match call {
                        Call::Invalid { error, .. } => error,
                        _ => RpcError::invalid_params("invalid params: processId"),
                    };
                    self.send(self.error(Some(id), &e)).await;
                    return;
                }
            },
        };
        self.spawn_request(id, call, session, slot, (permit, charge));
    }

    /// `Err`: a refused write of `process` has not come again and this is not it.
    fn check_write_order(&mut self, process: &str, write_id: Option<&str>) -> Result<(), RpcError> {
        match &mut self.write_order {
            Some(order) => order.check(process, write_id),
            None => Ok(()),
        }
    }

    /// A write of `process` was refused for a limit: its later writes wait for it. A full
    /// table first drops the processes the session no longer has.
    fn hold_writes_behind(&mut self, process: &str, write_id: Option<&str>) {
        let Some(order) = &mut self.write_order else {
            return;
        };
        if order.is_full() {
            let known: std::collections::HashSet<String> = match &self.state {
                State::AwaitInitialized(s) | State::Ready(s) => {
                    s.processes().iter().map(|p| p.id.clone()).collect()
                }
                State::AwaitInitialize => Default::default(),
            };
            order.retain(|p| known.contains(p));
        }
        order.refused(process, write_id);
    }

    fn spawn_request(
        &self,
        id: RequestId,
        call: Call,
        session: Arc<Session>,
        slot: Option<super::super::scheduler::Slot>,
        held: (OwnedSemaphorePermit, Charge),
    ) {
        let ctx = Ctx {
            session,
            registry: self.registry.clone(),
            conn_id: self.conn_id,
            can_approve: self.can_approve,
            cancel: self.closing.clone(),
        };
        let control = self.control.clone();
        let receiver = self.receiver.clone();
        let cancel = self.cancel.clone();
        let span = tracing::debug_span!("request", method = ?call.method());
        inline::run_until_first_wait(
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
                let reply = handlers::dispatch(&ctx, call).await;
                let msg = match reply {
                    Ok(Handled { reply, after_write }) => ControlMessage {
                        msg: Outbound::Result { id, reply },
                        after_write,
                    },
                    Err(e) => ControlMessage::new(counted_error(&ctx.registry, Some(id), &e)),
                };
                if hand_over(&control, receiver.as_ref(), msg).await {
                    ctx.registry.metrics().rpc_responses.inc();
                }
                drop(slot);
            }
            .instrument(span),
        );
    }
}
