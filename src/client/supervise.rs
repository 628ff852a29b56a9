//! Keeping a session through lost connections: after the first connection, watch it; when it
//! is lost, resume the session with backoff within its TTL (`RECONNECT_INITIAL_DELAY` doubling
//! to `RECONNECT_MAX_DELAY`, jittered: the link's [`Backoff`], so clients that lost one relay
//! together do not all come back in the same instant), telling the application where it stands
//! ([`ConnectionState`]); stop at once on what retrying cannot mend (a session the server no
//! longer knows, a refused key, a revoked environment, a server that broke the protocol),
//! recording why ([`Client::loss`]) and ending every event stream.

use std::time::Duration;

use super::{Client, ClientError, ConnectionState, RECONNECT_INITIAL_DELAY, RECONNECT_MAX_DELAY};
use crate::link::backoff::{random, Backoff};
use crate::sync::lock;

impl Client {
    /// After the first connection: resume it when it is lost (or, for a target that cannot
    /// be reached again, end the event streams).
    pub(super) fn watch_connection(&self) {
        let c = self.clone();
        if self.shared.opts.reconnect && self.shared.target.can_reconnect() {
            tokio::spawn(async move { c.supervise().await });
        } else {
            // Nothing to resume: when the connection ends, so do the event streams.
            tokio::spawn(async move {
                let conn = lock(&c.shared.conn).clone();
                if let Some(conn) = conn {
                    conn.closed().await;
                    if !c.shared.shutdown.is_cancelled() {
                        let why = match conn.failure() {
                            Some(e) => e,
                            None => ClientError::SessionLost(
                                "the connection to the server was lost".into(),
                            ),
                        };
                        c.fail(why).await;
                    }
                }
            });
        }
    }

    /// Watch the connection; on loss, resume with backoff until the deadline.
    async fn supervise(&self) {
        loop {
            let conn = lock(&self.shared.conn).clone();
            let Some(conn) = conn else { return };
            tokio::select! {
                _ = conn.closed() => {}
                _ = self.shared.shutdown.cancelled() => return,
            }
            if self.shared.shutdown.is_cancelled() {
                return;
            }
            // A server that broke the protocol (a malformed binary message) is not resumed:
            // it would only send the same again.
            if let Some(e) = conn.failure() {
                self.fail(e).await;
                return;
            }
            let Some((sid, tok, ttl)) = lock(&self.shared.session).clone() else {
                return;
            };
            self.shared.state.send_replace(ConnectionState::Resuming);
            let window = self
                .shared
                .opts
                .reconnect_deadline
                .unwrap_or(Duration::from_millis(ttl));
            let deadline = tokio::time::Instant::now() + window;
            // A resume that came up and then failed is one more failed attempt: the schedule
            // never resets within one loss.
            let mut backoff =
                Backoff::new(RECONNECT_INITIAL_DELAY, RECONNECT_MAX_DELAY, Duration::MAX);
            let mut attempt = 0u32;
            loop {
                attempt += 1;
                match self.establish(Some((sid.clone(), tok.clone()))).await {
                    Ok(()) => {
                        tracing::info!(attempt, "session resumed");
                        self.shared.state.send_replace(ConnectionState::Connected);
                        break;
                    }
                    Err(ClientError::Rpc { code: -32003, .. }) => {
                        self.fail(ClientError::SessionExpired).await;
                        return;
                    }
                    // Final: a server that broke the protocol, a key no longer authorized, an
                    // environment the relay revoked. Retrying would only meet the same.
                    Err(
                        e @ (ClientError::Protocol(_)
                        | ClientError::Refused(_)
                        | ClientError::Revoked(_)),
                    ) => {
                        self.fail(e).await;
                        return;
                    }
                    Err(e) => {
                        tracing::debug!(attempt, error = %e, "reconnect failed");
                        let delay = backoff.delay(None, random());
                        if tokio::time::Instant::now() + delay > deadline {
                            self.fail(ClientError::SessionLost(format!(
                                "could not resume within {} ms: {e}",
                                window.as_millis()
                            )))
                            .await;
                            return;
                        }
                        tokio::select! {
                            _ = tokio::time::sleep(delay) => {}
                            _ = self.shared.shutdown.cancelled() => return,
                        }
                    }
                }
            }
        }
    }

    pub(super) async fn fail(&self, why: ClientError) {
        // The application is told (`loss`, the ended event streams) and says it its way.
        tracing::info!(%why, "session lost");
        *lock(&self.shared.lost) = Some(why);
        self.shared.state.send_replace(ConnectionState::Lost);
        // Ending every event stream tells the application.
        for slot in lock(&self.shared.procs).values() {
            slot.notify.notify_waiters();
        }
        self.shared.reconnected.notify_waiters();
    }
}
