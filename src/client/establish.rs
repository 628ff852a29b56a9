//! Establishing a connection: the first connect (tried again while the relay says the
//! environment is offline or moving, within
//! [`ClientOptions::offline_wait`](super::ClientOptions::offline_wait)), opening a
//! transport and starting an [`RpcConnection`] over it with the client's fast path and
//! approval handler, then `initialize` (resuming a session if asked) and `initialized`, and
//! installing the connection with its router task.
//!
//! It must never retry anything but an offline environment, and only on the first
//! connection (a lost connection is `supervise.rs`'s), and never install a connection whose
//! `initialize` failed.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::rpc_connection::{self, Notification, RpcConnection};
use super::target::open_transport;
use super::{
    approval, AckPolicy, Client, ClientError, OFFLINE_RETRY_INITIAL_DELAY, OFFLINE_RETRY_MAX_DELAY,
};
use crate::connection::message::{Call, Note, Reply};
use crate::link::backoff::{random, Backoff};
use crate::rpc::messages::{
    AckParams, Capabilities, InitializeParams, ResumeParams, ServerRequests,
};
use crate::sync::lock;
use crate::transport::Transport;

impl Client {
    /// The first connection: [`establish`](Self::establish), tried again while the relay
    /// says the environment is offline or moving, for at most `offline_wait` in all (with
    /// backoff). Any other failure is returned at once.
    pub(super) async fn establish_first(
        &self,
        resume: Option<(String, String)>,
    ) -> Result<(), ClientError> {
        let wait = self.shared.opts.offline_wait;
        let deadline = tokio::time::Instant::now() + wait;
        // The environment link's own schedule (jittered, so clients of one moving
        // environment do not all come back in the same instant); no link lives here, so it
        // never resets.
        let mut backoff = Backoff::new(
            OFFLINE_RETRY_INITIAL_DELAY,
            OFFLINE_RETRY_MAX_DELAY,
            Duration::MAX,
        );
        let mut attempts = 1u32;
        loop {
            match self.establish(resume.clone()).await {
                Err(ClientError::EnvironmentOffline { environment, why }) => {
                    let now = tokio::time::Instant::now();
                    if now >= deadline {
                        let why = if wait.is_zero() {
                            why
                        } else {
                            format!(
                                "{why}; still offline after {attempts} tries over {:.1} s: check that its exec server is running (`execrelay serve --relay … --environment-id {environment}`) and reaches the relay",
                                wait.as_secs_f64()
                            )
                        };
                        return Err(ClientError::EnvironmentOffline { environment, why });
                    }
                    tracing::debug!(
                        %environment,
                        attempts,
                        "the environment is offline (or moving); trying again"
                    );
                    let delay = backoff.delay(None, random());
                    tokio::time::sleep(delay.min(deadline - now)).await;
                    attempts += 1;
                }
                other => return other,
            }
        }
    }

    /// Connect, initialize (resuming `resume` if given) and install the connection.
    pub(super) async fn establish(
        &self,
        resume: Option<(String, String)>,
    ) -> Result<(), ClientError> {
        let transport =
            open_transport(&self.shared.target, self.shared.opts.max_message_bytes).await?;
        self.establish_over(transport, resume).await
    }

    pub(super) async fn establish_over(
        &self,
        transport: Transport,
        resume: Option<(String, String)>,
    ) -> Result<(), ClientError> {
        let (ntx, nrx) = mpsc::unbounded_channel::<Notification>();
        let conn = RpcConnection::start_with(
            transport,
            ntx,
            Some(self.fast_path()),
            Some(self.request_handler()),
        );
        self.initialize_on(conn, nrx, resume).await
    }

    /// In-order output handled on the connection's reader.
    pub(super) fn fast_path(&self) -> rpc_connection::FastPath {
        let shared = Arc::downgrade(&self.shared);
        Arc::new(move |n| {
            let Some(shared) = shared.upgrade() else {
                return Some(n);
            };
            Client::fast_deliver(&shared, n)
        })
    }

    /// The server's approval requests, to the application's handler.
    pub(super) fn request_handler(&self) -> rpc_connection::RequestHandler {
        let handler = self.shared.opts.approval_handler.clone();
        let memo = self.shared.approvals.clone();
        Arc::new(move |responder, id, request| {
            approval::on_server_request(&memo, handler.as_ref(), responder, id, request)
        })
    }

    /// `initialize` (resuming `resume` if given) + `initialized` on `conn`, and install it.
    pub(super) async fn initialize_on(
        &self,
        conn: RpcConnection,
        nrx: mpsc::UnboundedReceiver<Notification>,
        resume: Option<(String, String)>,
    ) -> Result<(), ClientError> {
        let params = InitializeParams {
            client_name: Some(self.shared.opts.client_name.clone()),
            client_version: Some(env!("CARGO_PKG_VERSION").to_string()),
            resume: resume.as_ref().map(|(sid, tok)| ResumeParams {
                session_id: sid.clone(),
                resume_token: tok.clone(),
            }),
            capabilities: Capabilities {
                acks: self.shared.opts.acks,
                binary_output: self.shared.opts.binary_output,
                binary_input: self.shared.opts.binary_input,
                server_requests: ServerRequests {
                    approve: self.shared.opts.approval_handler.is_some(),
                },
                // A server's promise, never a client's request.
                retry_refused_writes: false,
            },
            session_ttl_ms: self
                .shared
                .opts
                .session_ttl
                .map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
        };
        let init = match conn.call_typed(Call::Initialize(params)).await? {
            Reply::Initialize(init) => init,
            other => {
                return Err(ClientError::Protocol(format!(
                    "bad initialize result: {other:?}"
                )))
            }
        };
        conn.notify_typed(Note::Initialized).await?;
        conn.set_binary_input(init.capabilities.binary_input);
        conn.set_retry_refused_writes(init.capabilities.retry_refused_writes);
        conn.set_max_message(usize::try_from(init.limits.max_message_bytes).unwrap_or(usize::MAX));
        // As the connection took it (0 is unknown: no limit).
        let max_message = conn.max_message();
        self.shared
            .server_max_message
            .store(max_message, std::sync::atomic::Ordering::Relaxed);
        self.shared.server_retained.store(
            init.limits.retained_output_bytes,
            std::sync::atomic::Ordering::Relaxed,
        );
        self.shared.granted_binary_output.store(
            init.capabilities.binary_output,
            std::sync::atomic::Ordering::Relaxed,
        );
        self.shared.granted_ttl_ms.store(
            init.limits.detached_session_ttl_ms,
            std::sync::atomic::Ordering::Relaxed,
        );
        *lock(&self.shared.session) = Some((
            init.session_id,
            init.resume_token,
            init.limits.detached_session_ttl_ms,
        ));
        *lock(&self.shared.conn) = Some(conn.clone());
        // (Lazy acks repeat nothing: what was consumed and not acknowledged is kept on
        // purpose, and its bytes still count towards the next ack, so the server is never
        // left waiting with a full retention.)
        if resume.is_some()
            && self.shared.opts.acks
            && self.shared.opts.ack_policy == AckPolicy::Eager
        {
            // An ack sent on the dead connection may be lost. Were it not repeated, the server
            // would replay only events this client already consumed (and drops as duplicates,
            // so they never count towards a new ack): with its retention full of them, it would
            // wait for an ack forever. Taken after the new connection is installed, so every
            // later ack goes to it.
            let consumed = self.consumed_positions();
            for (pid, seq) in consumed {
                conn.notify_typed(Note::Ack(Some(AckParams {
                    process_id: pid,
                    seq,
                })))
                .await?;
            }
        }
        self.shared
            .connects
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let c = self.clone();
        tokio::spawn(async move { c.route(conn, nrx).await });
        self.shared.reconnected.notify_waiters();
        Ok(())
    }
}
