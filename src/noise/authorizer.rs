//! Authorization of a client whose handshake succeeded: an async trait, so a deployment can
//! ask an outside authority, and the authorized-keys implementation.
//!
//! The link driver runs each authorization in its own task: while one is pending, other
//! streams and new handshakes proceed.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use subtle::ConstantTimeEq;

use super::keys::{fingerprint, AuthorizedKeys, KEY_BYTES};

/// What the authorizer is asked.
#[derive(Clone)]
pub struct AuthRequest {
    /// The client's static public key, proven by the handshake.
    pub client_key: [u8; KEY_BYTES],
    /// The token from the handshake payload, if any.
    pub token: Option<String>,
    /// The environment id (empty for a direct listener).
    pub env_id: String,
}

impl std::fmt::Debug for AuthRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token.
        f.debug_struct("AuthRequest")
            .field("client", &fingerprint(&self.client_key))
            .field("has_token", &self.token.is_some())
            .finish()
    }
}

/// A refusal. Its text is logged on the server, never sent to the peer.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct AuthDenied(pub String);

/// Decides whether a client may open a stream.
pub trait Authorizer: Send + Sync + 'static {
    /// Authorize `req`. May take as long as it needs; the link keeps working meanwhile.
    fn authorize(
        self: Arc<Self>,
        req: AuthRequest,
    ) -> Pin<Box<dyn Future<Output = Result<(), AuthDenied>> + Send>>;
}

/// The authorized-keys file, plus an optional shared token.
pub struct KeysAuthorizer {
    keys: AuthorizedKeys,
    token: Option<String>,
}

impl KeysAuthorizer {
    /// Authorize keys listed in `keys`; with `token`, also require it in the handshake.
    pub fn new(keys: AuthorizedKeys, token: Option<String>) -> Self {
        KeysAuthorizer { keys, token }
    }
}

impl Authorizer for KeysAuthorizer {
    fn authorize(
        self: Arc<Self>,
        req: AuthRequest,
    ) -> Pin<Box<dyn Future<Output = Result<(), AuthDenied>> + Send>> {
        Box::pin(async move {
            // The file is re-read when it changed: a small blocking read, off the runtime.
            let me = self.clone();
            let key = req.client_key;
            let listed = tokio::task::spawn_blocking(move || me.keys.contains(&key))
                .await
                .unwrap_or(false);
            if !listed {
                return Err(AuthDenied(format!(
                    "key {} is not in the authorized keys",
                    fingerprint(&req.client_key)
                )));
            }
            if let Some(want) = &self.token {
                let ok = req
                    .token
                    .as_deref()
                    .is_some_and(|t| bool::from(t.as_bytes().ct_eq(want.as_bytes())));
                if !ok {
                    return Err(AuthDenied("missing or wrong token".into()));
                }
            }
            Ok(())
        })
    }
}
