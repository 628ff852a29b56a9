//! What the client library reports when a call, a connection or a session fails.

use serde_json::Value;

use crate::rpc::RpcError;

/// Client failures.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The server answered with a JSON-RPC error.
    #[error("server error {code}: {message}")]
    Rpc {
        /// JSON-RPC code.
        code: i64,
        /// Message.
        message: String,
        /// Data member.
        data: Option<Value>,
    },
    /// The connection dropped while a call was in flight.
    #[error("connection lost")]
    ConnectionLost,
    /// A process id this client still holds a live handle for (its events go to that
    /// handle): drop the handle before starting the id again.
    #[error("process id {0:?} is in use by a live handle of this client")]
    ProcessIdInUse(String),
    /// The transport could not be set up.
    #[error("cannot connect: {0}")]
    Connect(String),
    /// The server sent something this client does not understand.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The server refused this client (handshake or authorization); not retried.
    #[error("{0}")]
    Refused(String),
    /// The session could not be resumed within its TTL.
    #[error("session lost: {0}")]
    SessionLost(String),
    /// The server no longer knows the session (it expired while detached, or was closed):
    /// resuming it was refused with `-32003`.
    #[error("the session expired on the server (or was closed)")]
    SessionExpired,
    /// A request larger than the server's `maxMessageBytes` (`initialize`'s `limits`): not
    /// sent, as the server would close the connection on it, and a repeat on the next one
    /// would fare no better.
    #[error(
        "a {method} request of {bytes} bytes is larger than the server's maxMessageBytes \
         ({limit}): send less in one request (a shorter argv or env), or raise the server's \
         limit"
    )]
    RequestTooLarge {
        /// The method.
        method: String,
        /// The request's size, encoded.
        bytes: usize,
        /// The server's `maxMessageBytes`.
        limit: usize,
    },
    /// The relay revoked the environment (its key is no longer listed): nothing retries.
    #[error("{0}")]
    Revoked(String),
    /// The relay has no link from the environment now: its exec server is away, or the
    /// environment is moving between the relays of a cluster (`environment_offline`,
    /// `environment_gone`, or the link closed `moved`). Transient: the first connection is
    /// retried for [`ClientOptions::offline_wait`](super::ClientOptions::offline_wait), a
    /// resume until its deadline.
    #[error("{why}")]
    EnvironmentOffline {
        /// The environment id.
        environment: String,
        /// What the relay said, in words (names the environment).
        why: String,
    },
}

impl ClientError {
    /// A server error as the client reports it (data included).
    pub(crate) fn from_rpc(e: RpcError) -> ClientError {
        ClientError::Rpc {
            code: e.code.code(),
            message: e.message,
            data: e.data,
        }
    }

    pub(crate) fn from_error_object(v: Value) -> ClientError {
        ClientError::Rpc {
            code: v.get("code").and_then(Value::as_i64).unwrap_or(0),
            message: v
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            data: v.get("data").cloned(),
        }
    }

    /// The JSON-RPC code, if this is a server error (or a local refusal the server would
    /// have answered with that code).
    pub fn code(&self) -> Option<i64> {
        match self {
            ClientError::Rpc { code, .. } => Some(*code),
            // What the server answers for the same mistake (`protocol.md` §2): the id is
            // taken, here by a live handle before the request is even sent.
            ClientError::ProcessIdInUse(_) => Some(-32002),
            _ => None,
        }
    }
}
