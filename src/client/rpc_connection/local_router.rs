//! The in-process connection's receiving end: what the server's side hands over directly
//! (a [`LocalReceiver`], `connection/local.rs`) or what the connection's reader task took from
//! the channels, routed to the caller waiting for it, the approval handler or the
//! notification path. It never waits: it runs on the server's reader, a request's task or
//! the server's writer.
//!
//! It also starts the in-process connection ([`RpcConnection::start_local`]): the router
//! installed on the client end, and the reader task over the channels. That task must never
//! outlive its connection holding the router's links ([`LocalRouter::release`] drops them).

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

use super::{
    local_id, Answer, FastPath, Notification, NotificationSink, Out, Pending, RequestHandler,
    Responder, RpcConnection,
};
use crate::client::ClientError;
use crate::connection::local::{LocalClientEnd, LocalReceiver};
use crate::connection::message::Outbound;
use crate::connection::outlet::EventMessage;
use crate::process::event_log::EventBody;
use crate::sync::lock;

/// What an in-process connection receives, routed: results and errors to their waiting
/// callers, server requests to the handler, events through the fast path (or to the
/// notification sink). Called by the server's side directly ([`LocalReceiver`]) or by the
/// connection's reader task for what came through the channels; it never waits.
pub(super) struct LocalRouter {
    pub(super) pending: Pending,
    pub(super) closed: CancellationToken,
    pub(super) requests: Option<RequestHandler>,
    pub(super) fast: Option<FastPath>,
    /// Dropped when the connection ends ([`release`](Self::release)): the server's side holds
    /// this router as long as it lives, and must not keep the server's own request queue
    /// open (the responder's sender) or the client's notification queue.
    pub(super) links: Mutex<Option<RouterLinks>>,
}

pub(super) struct RouterLinks {
    pub(super) responder: Responder,
    pub(super) notifications: NotificationSink,
}

impl LocalRouter {
    pub(super) fn release(&self) {
        lock(&self.links).take();
    }

    pub(super) fn route_control(&self, m: Outbound) {
        match m {
            Outbound::Result { id, reply } => {
                if let Some(w) = local_id(&id).and_then(|n| lock(&self.pending).remove(&n)) {
                    w.answer(Ok(Answer::Typed(reply)));
                }
            }
            Outbound::Error { id, error } => {
                let waiting = id
                    .as_ref()
                    .and_then(local_id)
                    .and_then(|n| lock(&self.pending).remove(&n));
                if let Some(w) = waiting {
                    w.answer(Err(ClientError::from_rpc(error)));
                }
            }
            Outbound::Request { id, params } => {
                let responder = lock(&self.links).as_ref().map(|l| l.responder.clone());
                if let (Some(h), Some(responder)) = (&self.requests, responder) {
                    h(responder, id, (*params).clone());
                }
            }
        }
    }

    /// `false` when nothing takes notifications any more.
    pub(super) fn route_event(&self, e: EventMessage) -> bool {
        let n = match e.body {
            EventBody::Output { stream, chunk } => Notification::Output {
                process_id: e.process_id,
                seq: e.seq,
                stream,
                data: chunk,
            },
            EventBody::Omitted {
                stream,
                omitted_bytes,
            } => Notification::Omitted {
                process_id: e.process_id,
                seq: e.seq,
                stream,
                omitted_bytes,
            },
            EventBody::Exited(info) => Notification::Exited {
                process_id: e.process_id,
                seq: e.seq,
                info,
            },
        };
        let n = match &self.fast {
            Some(f) => match f(n) {
                Some(n) => n,
                None => return true,
            },
            None => n,
        };
        match lock(&self.links).as_ref() {
            Some(l) => l.notifications.send(n).is_ok(),
            None => false,
        }
    }
}

impl LocalReceiver for LocalRouter {
    fn control(&self, m: Outbound) -> bool {
        if self.closed.is_cancelled() {
            return false;
        }
        self.route_control(m);
        true
    }

    fn event(&self, e: EventMessage) -> bool {
        if self.closed.is_cancelled() {
            return false;
        }
        if self.route_event(e) {
            return true;
        }
        // Nothing takes notifications: the connection is done, as its reader would decide.
        self.closed.cancel();
        false
    }
}

/// Start an in-process connection over `end` ([`RpcConnection::start_local`]): the router
/// installed on `end` before anything is sent, and the task that serves the channels for what
/// was queued before that, failing every waiting call when they end.
pub(super) fn start(
    end: LocalClientEnd,
    notifications: NotificationSink,
    fast: Option<FastPath>,
    requests: Option<RequestHandler>,
) -> RpcConnection {
    let pending: Pending = Arc::new(Mutex::new(HashMap::new()));
    let closed = CancellationToken::new();
    let out = Out::Local {
        requests: end.sender(),
        capacity: end.limits().requests,
    };
    let router = Arc::new(LocalRouter {
        pending: pending.clone(),
        closed: closed.clone(),
        requests,
        fast,
        links: Mutex::new(Some(RouterLinks {
            responder: Responder { out: out.clone() },
            notifications,
        })),
    });
    end.receive_directly(router.clone());
    let LocalClientEnd {
        mut control,
        mut events,
        ..
    } = end;
    let p = pending.clone();
    let c = closed.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                biased;
                _ = c.cancelled() => break,
                m = control.recv() => match m {
                    None => break,
                    Some(m) => router.route_control(m),
                },
                e = events.recv() => {
                    let Some(e) = e else { break };
                    if !router.route_event(e) {
                        break;
                    }
                }
            }
        }
        c.cancel();
        router.release();
        let waiting: Vec<_> = lock(&p).drain().collect();
        for (_, w) in waiting {
            w.answer(Err(ClientError::ConnectionLost));
        }
    });
    RpcConnection {
        out,
        pending,
        next_id: Arc::new(AtomicU64::new(1)),
        closed,
        failure: Arc::default(),
        flow: None,
        binary_input: Arc::default(),
        retry_refused_writes: Arc::default(),
        max_message: Arc::new(std::sync::atomic::AtomicUsize::new(usize::MAX)),
    }
}
