//! The network connection's two tasks, over a [`Transport`]: the writer owns the sink and
//! batches what is queued before each flush; the reader routes responses to their waiting
//! callers, notifications (output deltas on the fast path first) to the router, and the
//! server's requests to the request handler. This is [`RpcConnection::start_with`]'s body.
//!
//! It must never wait on the notification path or the outbound queue from the reader (the
//! router may be waiting for a response only the reader can deliver; answers go from tasks of
//! their own), and never panic on what the server sends: a malformed binary message ends the
//! connection with its reason ([`RpcConnection::failure`]).

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use futures_util::{SinkExt, StreamExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{
    Answer, FastPath, Notification, NotificationSink, Out, Pending, RequestHandler, Responder,
    RpcConnection, OUTBOUND_QUEUE,
};
use crate::client::ClientError;
use crate::rpc::binary_output::{decode_output_message, is_binary_message};
use crate::rpc::jsonrpc::{parse_inbound, Inbound};
use crate::rpc::notification::{decode_output_delta, OutputDelta};
use crate::rpc::{Method, RpcError};
use crate::sync::lock;
use crate::transport::{OutMessage, Transport};

/// Start the writer and reader tasks over `transport` ([`RpcConnection::start_with`]).
pub(super) fn start(
    transport: Transport,
    notifications: NotificationSink,
    fast: Option<FastPath>,
    requests: Option<RequestHandler>,
) -> RpcConnection {
    let (out_tx, mut out_rx) = mpsc::channel::<OutMessage>(OUTBOUND_QUEUE);
    let pending: Pending = Arc::new(Mutex::new(HashMap::new()));
    let closed = CancellationToken::new();
    let Transport {
        mut incoming,
        mut outgoing,
        flow,
        ..
    } = transport;

    let c = closed.clone();
    tokio::spawn(async move {
        loop {
            let msg = tokio::select! {
                _ = c.cancelled() => break,
                m = out_rx.recv() => m,
            };
            let Some(msg) = msg else { break };
            if outgoing.feed(msg).await.is_err() {
                break;
            }
            // Batch whatever else is queued before flushing.
            let mut ok = true;
            while let Ok(m) = out_rx.try_recv() {
                if outgoing.feed(m).await.is_err() {
                    ok = false;
                    break;
                }
            }
            if !ok || outgoing.flush().await.is_err() {
                break;
            }
        }
        let _ = outgoing.close().await;
        c.cancel();
    });

    let p = pending.clone();
    let c = closed.clone();
    let responder = Responder {
        out: Out::Json(out_tx.clone()),
    };
    let failure: Arc<Mutex<Option<ClientError>>> = Arc::default();
    let failed = failure.clone();
    tokio::spawn(async move {
        // Hand an output delta to the fast path, else to the router; false once the
        // router is gone.
        let deliver = |d: OutputDelta| {
            let n = Notification::from(d);
            let n = match &fast {
                Some(f) => match f(n) {
                    Some(n) => n,
                    None => return true,
                },
                None => n,
            };
            notifications.send(n).is_ok()
        };
        loop {
            let item = tokio::select! {
                _ = c.cancelled() => break,
                m = incoming.next() => m,
            };
            let Some(Ok(bytes)) = item else { break };
            // Binary output messages (§5.1): decoded and checked, the chunk a slice of the
            // received buffer. A malformed one ends the connection with its reason.
            if is_binary_message(&bytes) {
                match decode_output_message(bytes) {
                    Ok(d) => {
                        if !deliver(d) {
                            break;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "malformed binary message from the server");
                        *lock(&failed) = Some(ClientError::Protocol(format!(
                            "malformed binary output message from the server: {e}"
                        )));
                        break;
                    }
                }
                continue;
            }
            // Output deltas as execrelay writes them in JSON take the fast path (no JSON
            // tree); anything else, the general one.
            if let Some(d) = decode_output_delta(&bytes) {
                if !deliver(d) {
                    break;
                }
                continue;
            }
            match parse_inbound(&bytes) {
                Ok(Inbound::Response { id, outcome }) => {
                    let Some(id) = id.as_u64() else { continue };
                    let waiting = lock(&p).remove(&id);
                    if let Some(w) = waiting {
                        w.answer(
                            outcome
                                .map(Answer::Json)
                                .map_err(ClientError::from_error_object),
                        );
                    }
                }
                Ok(Inbound::Notification { method, params }) => {
                    if notifications
                        .send(Notification::Other { method, params })
                        .is_err()
                    {
                        break;
                    }
                }
                Ok(Inbound::Request { id, method, params }) => {
                    let approve = (Method::parse(&method) == Some(Method::ProcessApprove))
                        .then_some(requests.as_ref())
                        .flatten();
                    match (approve, id.as_str()) {
                        (Some(h), Some(sid)) => match serde_json::from_value(params) {
                            Ok(req) => h(responder.clone(), sid.to_string(), req),
                            Err(e) => responder.error(
                                &id,
                                &RpcError::invalid_params(format!("invalid params: {e}")),
                            ),
                        },
                        _ => responder.error(&id, &RpcError::method_not_found(&method)),
                    }
                }
                Err(r) => {
                    // A server error not tied to a request (id null), e.g. a framing error.
                    tracing::debug!(error = %r.error, "unparseable message from server");
                }
            }
        }
        c.cancel();
        // Fail every waiting call: the connection is gone (for the reason it broke, if the
        // server broke the protocol).
        let why = lock(&failed).clone().unwrap_or(ClientError::ConnectionLost);
        let waiting: Vec<_> = lock(&p).drain().collect();
        for (_, w) in waiting {
            w.answer(Err(why.clone()));
        }
    });

    RpcConnection {
        out: Out::Json(out_tx),
        pending,
        next_id: Arc::new(AtomicU64::new(1)),
        closed,
        failure,
        flow,
        binary_input: Arc::default(),
        retry_refused_writes: Arc::default(),
        max_message: Arc::new(std::sync::atomic::AtomicUsize::new(usize::MAX)),
    }
}
