//! The JSON-RPC layer: envelope, error codes and the typed messages of `protocol.md`.

pub mod error;
pub mod jsonrpc;
pub mod messages;

pub use error::{ErrorCode, RpcError};
