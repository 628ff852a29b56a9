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

use tokio::sync::watch;

use super::rpc_connection::Responder;
use crate::rpc::messages::{ApprovalDecision, ApproveParams};
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

/// Handle one approval request (`id`, `request`) that arrived on the connection of
/// `responder`: ask the handler once per id, answer every copy.
pub(super) fn on_server_request(
    memo: &Arc<Mutex<Approvals>>,
    handler: Option<&Arc<dyn ApprovalHandler>>,
    responder: Responder,
    id: String,
    request: ApproveParams,
) {
    let Some(handler) = handler else {
        // Not declared, so not sent by a conforming server: a denial.
        responder.decide(&id, ApprovalDecision::Deny);
        return;
    };
    let mut decision = {
        let mut m = lock(memo);
        match m.by_id.get(&id) {
            Some(d) => d.clone(),
            None => {
                let (tx, rx) = watch::channel(None);
                let fut = handler.decide(request);
                tokio::spawn(async move {
                    let d = fut.await;
                    let _ = tx.send(Some(d));
                });
                m.by_id.insert(id.clone(), rx.clone());
                m.order.push_back(id.clone());
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
            Err(_) => None,
        };
        // On the connection that received this copy; if it died, the server sends the
        // request again on the next one and this decision answers it there.
        responder.decide(&id, d.unwrap_or(ApprovalDecision::Deny));
    });
}
