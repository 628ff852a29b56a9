//! The forwarding side of a relay's cluster membership: the relay-to-relay link this relay
//! dials to the holder of an environment it does not hold, registered with the hub in the
//! place of the environment's link, and when it is given up (the environment arrived here,
//! or its last client link here ended).
//!
//! It must never serve a client before the holder proved its node key, and never keep a
//! forwarding link that no client link of its environment uses.

use std::sync::Arc;

use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;

use super::super::directory::Holder;
use super::super::relay_link::{self, RELAY_PATH_PREFIX};
use super::{bump, ClusterNode};
use execrelay_io::driver::{
    link_websocket_config_with, recv_frame, send_frame, ReadAhead, RelayHub,
};
use execrelay_protocol::env_handshake::LinkRefusal;
use execrelay_protocol::reason::CloseReason;
use execrelay_protocol::router::LinkId;
use execrelay_protocol::sync::lock;

impl ClusterNode {
    /// Whether `link` is this relay's forwarding link for `env`.
    pub fn is_forward(&self, env: &str, link: LinkId) -> bool {
        lock(&self.forwards).get(env) == Some(&link)
    }

    /// A real environment link for `env` arrived here: close the forwarding link that stood
    /// for it (its clients stay: the environment is here now).
    pub fn yield_forward(&self, hub: &RelayHub, env: &str) {
        let link = lock(&self.forwards).remove(env);
        if let Some(link) = link {
            if hub.environment_link(env) == Some(link) {
                hub.close_environment(env, CloseReason::Moved);
            }
        }
    }

    /// The last client link of `env` here ended: its forwarding link is no longer needed.
    pub fn client_gone(&self, hub: &RelayHub, env: &str) {
        if hub.client_link_count(env) > 0 {
            return;
        }
        let link = lock(&self.forwards).remove(env);
        if let Some(link) = link {
            if hub.environment_link(env) == Some(link) {
                hub.close_environment(env, CloseReason::Local);
            }
        }
    }

    /// Dial `holder` for `env`, prove this relay's node key and check the holder's, and register
    /// the link with `hub` in the place of the environment's link; it is served in the
    /// background until it ends. `Ok` also when another client link got there first.
    pub async fn forward(
        self: &Arc<Self>,
        hub: &RelayHub,
        env: &str,
        holder: &Holder,
    ) -> Result<(), ForwardError> {
        let Some(holder_key) = self.spec.keys.key(&holder.node).copied() else {
            bump(&self.stats.forward_failures);
            return Err(ForwardError::UnknownNode(holder.node.clone()));
        };
        let Ok(permit) = self.links_out.clone().try_acquire_owned() else {
            bump(&self.stats.forward_failures);
            return Err(ForwardError::TooMany);
        };
        let deadline = self.limits.dial_timeout;
        let dialled = tokio::time::timeout(deadline, self.dial(&holder_key, env, holder)).await;
        let ws = match dialled {
            Ok(Ok(ws)) => ws,
            Ok(Err(e)) => {
                bump(&self.stats.forward_failures);
                return Err(e);
            }
            Err(_) => {
                bump(&self.stats.forward_failures);
                return Err(ForwardError::Dial(format!(
                    "no answer from {} within {} ms",
                    holder.addr,
                    deadline.as_millis()
                )));
            }
        };
        let pending = match hub.add_forward_environment(env) {
            Ok(p) => p,
            // Another client link's forwarding link (or the environment itself) got here
            // first: it serves this client too.
            Err(execrelay_protocol::router::AddLinkError::Held { .. }) => return Ok(()),
            Err(e) => {
                bump(&self.stats.forward_failures);
                return Err(ForwardError::Dial(e.to_string()));
            }
        };
        bump(&self.stats.forward_links);
        let link = pending.id();
        lock(&self.forwards).insert(env.to_string(), link);
        tracing::info!(env, holder = %holder.node, addr = %holder.addr, link, "relay-to-relay link up (forwarding)");
        let (me, hub, env) = (self.clone(), hub.clone(), env.to_string());
        tokio::spawn(async move {
            let _permit: OwnedSemaphorePermit = permit;
            let reason = pending.serve(ws).await;
            {
                let mut f = lock(&me.forwards);
                if f.get(&env) == Some(&link) {
                    f.remove(&env);
                }
            }
            // The holder is gone or let the environment go: this relay's clients of it must
            // dial again (unless the environment itself is here now).
            if hub.environment_link(&env).is_none() {
                let n = hub.close_clients(&env, CloseReason::Moved);
                tracing::info!(env = %env, %reason, clients = n, "relay-to-relay link closed; its client links closed (moved)");
            }
        });
        Ok(())
    }

    async fn dial(
        &self,
        holder_key: &[u8; 32],
        env: &str,
        holder: &Holder,
    ) -> Result<tokio_tungstenite::WebSocketStream<ReadAhead<TcpStream>>, ForwardError> {
        let base = super::super::parse_advertise(&holder.addr)
            .map_err(|_| ForwardError::Dial(format!("bad holder address {:?}", holder.addr)))?;
        let hostport = base.trim_start_matches("ws://").to_string();
        let tcp = TcpStream::connect(&hostport)
            .await
            .map_err(|e| ForwardError::Dial(format!("{hostport}: {e}")))?;
        let _ = tcp.set_nodelay(true);
        let url = format!("{base}{RELAY_PATH_PREFIX}{env}");
        let (mut ws, _) = tokio_tungstenite::client_async_with_config(
            url.as_str(),
            // Reads stop at the end of the HTTP head and of each frame: the driver takes the
            // socket over after the handshake without losing a byte.
            ReadAhead::websocket_client(tcp),
            Some(link_websocket_config_with(self.limits.max_frame_bytes)),
        )
        .await
        .map_err(|e| ForwardError::Dial(format!("{url}: {e}")))?;
        let (hs, open) = relay_link::start(&self.spec.node_keys, holder_key, env, self.next_ts())
            .map_err(ForwardError::Handshake)?;
        let t = self.limits.dial_timeout;
        send_frame(&mut ws, &open, t)
            .await
            .map_err(|e| ForwardError::Dial(e.to_string()))?;
        let answer = recv_frame(&mut ws, t)
            .await
            .map_err(|e| ForwardError::Dial(e.to_string()))?;
        hs.finish(&answer).map_err(ForwardError::Handshake)?;
        Ok(ws)
    }
}

/// A relay-to-relay link that could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ForwardError {
    /// The directory named a node the cluster keys file does not list.
    #[error("the directory named relay {0:?}, which the cluster keys file does not list")]
    UnknownNode(String),
    /// Too many relay-to-relay links.
    #[error("too many relay-to-relay links (max_relay_links)")]
    TooMany,
    /// The holder could not be reached.
    #[error("cannot reach the holder: {0}")]
    Dial(String),
    /// The handshake failed (the holder refused us, or did not prove its key).
    #[error("relay-to-relay handshake failed: {0}")]
    Handshake(LinkRefusal),
}
