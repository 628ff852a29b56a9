//! `initialize` (`protocol.md` §3): the capabilities a connection asked for, the session it
//! creates or resumes, and what the result promises. The output form (§5.1) is fixed here,
//! before the session is attached, and the connection's server-request sink (§7) is made
//! here. It never sends anything itself: the result goes back through the processor.

use std::sync::Arc;

use tokio::sync::mpsc;

use super::super::delivery::ControlMessage;
use super::super::handlers::within_cap;
use super::super::message::Outbound;
use super::{ConnectionProcessor, State};
use crate::rpc::messages::{
    AdvertisedLimits, Capabilities, InitializeParams, InitializeResult, PROTOCOL_VERSION,
};
use crate::rpc::RpcError;
use crate::session::{ConnHandle, RequestSink, ServerRequest};

impl ConnectionProcessor {
    pub(super) fn initialize(&mut self, p: InitializeParams) -> Result<InitializeResult, RpcError> {
        let can_approve = p.capabilities.server_requests.approve;
        // Checked before anything is created or resumed: a refused TTL changes nothing.
        if let Some(ttl) = p.session_ttl_ms {
            let cap = self.registry.config().max_session_ttl_ms;
            within_cap("sessionTtlMs", ttl, "max_session_ttl_ms", cap)?;
        }
        // Decided before the session is attached, so that every delta of this connection,
        // replays included, goes out in this form (§5.1). stdio cannot carry binary messages
        // and answers `false`.
        let binary = p.capabilities.binary_output && self.binary_capable;
        self.form.set_binary(binary);
        // Binary writes (§5.2): the inlet decodes them from the next message on (the reader
        // runs this before it reads another). A new `initialize` cannot change it: it is
        // refused once the connection is initialized.
        let binary_input = p.capabilities.binary_input && self.binary_capable;
        self.binary_input
            .store(binary_input, std::sync::atomic::Ordering::Relaxed);
        let conn = ConnHandle {
            conn_id: self.conn_id,
            ready: self.ready.clone(),
            evict: self.evict.clone(),
            peer_key: self.opts.peer_key.clone(),
            peer_addr: self.opts.peer_addr,
            requests: can_approve.then(|| request_sink(self.control.clone())),
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
        if let Some(ttl) = p.session_ttl_ms {
            session.set_detached_ttl(std::time::Duration::from_millis(ttl));
        }
        tracing::info!(session = %session.id, resumed, binary, binary_input, "initialized");
        self.can_approve = can_approve;
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
                detached_session_ttl_ms: u64::try_from(session.detached_ttl().as_millis())
                    .unwrap_or(u64::MAX),
            },
            capabilities: Capabilities {
                // A resumed session keeps the acks it was created with.
                acks: session.acks,
                binary_output: binary,
                binary_input,
                // The server requests this connection will receive (`protocol.md` §7).
                server_requests: p.capabilities.server_requests,
                retry_refused_writes: self.write_order.is_some(),
            },
        };
        self.state = State::AwaitInitialized(session);
        Ok(result)
    }
}

/// Server requests of the session this connection holds go out on its control lane, so they
/// never wait behind output (and, queued before a resume's replay starts, precede it). The
/// lane is bounded; a request that finds it full (a client that reads nothing) stays pending
/// in the session, to be sent again on resume or to time out.
fn request_sink(control: mpsc::Sender<ControlMessage>) -> RequestSink {
    Arc::new(move |r: ServerRequest| {
        let id = r.id.clone();
        let msg = Outbound::Request {
            id: r.id,
            params: r.params,
        };
        if control.try_send(ControlMessage::new(msg)).is_err() {
            tracing::warn!(request = %id, "control lane full or closed: server request not sent");
        }
    })
}
