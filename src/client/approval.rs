//! Answering the server's `process/approve` requests (`protocol.md` §7) with the
//! application's [`ApprovalHandler`].
//!
//! # What this module owns
//!
//! - [`ApprovalHandler`], the async decision the application provides
//!   (`ClientOptions::approval_handler`); without one the client does not declare
//!   `serverRequests` and the server denies every `ask` itself.
//! - The memory of decisions by request id ([`Approvals`]): a request the server sends again
//!   after a resume (same id) is answered with the decision already taken, or the one being
//!   taken, never asked twice; the answer goes out on the connection that received that copy.
//!
//! # What it must never do
//!
//! - Block the connection's reader: the handler runs in its own task.
//! - Ask the application twice about one request.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use tokio::sync::watch;

use super::rpc_connection::Responder;
use crate::rpc::messages::{ApprovalDecision, ApproveParams, ApproveResult};
use crate::rpc::{Method, RpcError};
use crate::sync::lock;

/// Request ids whose decision the client remembers, per session: 256. A server re-sends only
/// requests still pending, at most `maxProcesses` of them, and a remembered decision is only
/// needed until its answer got through; the oldest are forgotten first.
pub const REMEMBERED_APPROVALS: usize = 256;

/// The application's decision on `process/approve`. Implemented for every
/// `Fn(ApproveParams) -> impl Future<Output = ApprovalDecision>`.
pub trait ApprovalHandler: Send + Sync + 'static {
    /// Decide whether the process described by `request` may start. May take as long as a
    /// person takes; the server withdraws the request after its `approval_timeout_ms`.
    fn decide(
        &self,
        request: ApproveParams,
    ) -> Pin<Box<dyn Future<Output = ApprovalDecision> + Send + 'static>>;
}

impl<F, Fut> ApprovalHandler for F
where
    F: Fn(ApproveParams) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ApprovalDecision> + Send + 'static,
{
    fn decide(
        &self,
        request: ApproveParams,
    ) -> Pin<Box<dyn Future<Output = ApprovalDecision> + Send + 'static>> {
        Box::pin(self(request))
    }
}

type Decision = watch::Receiver<Option<ApprovalDecision>>;

/// Decisions by request id, taken or being taken, for one client.
#[derive(Default)]
pub(super) struct Approvals {
    by_id: HashMap<String, Decision>,
    order: VecDeque<String>,
}

/// Handle one server request that arrived on the connection of `responder`.
pub(super) fn on_server_request(
    memo: &Arc<Mutex<Approvals>>,
    handler: Option<&Arc<dyn ApprovalHandler>>,
    responder: Responder,
    id: Value,
    method: &str,
    params: Value,
) {
    let (Some(Method::ProcessApprove), Some(handler)) = (Method::parse(method), handler) else {
        responder.error(&id, &RpcError::method_not_found(method));
        return;
    };
    let Some(key) = id.as_str().map(str::to_string) else {
        responder.error(
            &id,
            &RpcError::invalid_request("server request ids are strings"),
        );
        return;
    };
    let request: ApproveParams = match serde_json::from_value(params) {
        Ok(r) => r,
        Err(e) => {
            responder.error(
                &id,
                &RpcError::invalid_params(format!("invalid params: {e}")),
            );
            return;
        }
    };
    let mut decision = {
        let mut m = lock(memo);
        match m.by_id.get(&key) {
            Some(d) => d.clone(),
            None => {
                let (tx, rx) = watch::channel(None);
                let fut = handler.decide(request);
                tokio::spawn(async move {
                    let d = fut.await;
                    let _ = tx.send(Some(d));
                });
                m.by_id.insert(key.clone(), rx.clone());
                m.order.push_back(key);
                while m.order.len() > REMEMBERED_APPROVALS {
                    if let Some(old) = m.order.pop_front() {
                        m.by_id.remove(&old);
                    }
                }
                rx
            }
        }
    };
    tokio::spawn(async move {
        let d = match decision.wait_for(Option::is_some).await {
            Ok(d) => *d,
            // The handler's task panicked: a denial.
            Err(_) => Some(ApprovalDecision::Deny),
        };
        let result = ApproveResult {
            decision: d.unwrap_or(ApprovalDecision::Deny),
        };
        // On the connection that received this copy; if it died, the server sends the
        // request again on the next one and this decision answers it there.
        responder.result(&id, &json!(result));
    });
}
