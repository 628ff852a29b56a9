//! The JSON-RPC layer (layer 1): the protocol on the wire, for server and client alike.
//!
//! # Layout
//!
//! - [`jsonrpc`]: the envelope: classify inbound bytes, encode responses, requests and
//!   notifications.
//! - [`error`]: every error code and the [`RpcError`] sent to a peer.
//! - [`messages`]: typed params and results of `protocol.md` §4, and the wire types
//!   ([`StreamName`](messages::StreamName), [`ExitInfo`](messages::ExitInfo),
//!   [`TermSize`](messages::TermSize)).
//! - [`method`]: the [`Method`] enum, parsed once from one table, with each method's class.
//! - [`notification`]: both directions of the event codecs (output delta, exit notice,
//!   `process/read` events), the server's encoder and the client's fast decoder side by side.
//! - [`write_request`]: both directions of `process/write`, the hot path of stdin: the
//!   client's hand-written encoder (SIMD base64 in place) and the server's chunk decoder.
//! - [`binary_output`]: both directions of the binary output message (§5.1): the server's
//!   head encoder and the client's checked decoder.
//! - [`binary_write`]: both directions of the binary write (§5.2): the client's head encoder
//!   and the server's checked decoder.
//!
//! It must never import a layer above it: it knows no process, session or connection.

pub mod binary_output;
pub mod binary_write;
pub mod error;
pub mod jsonrpc;
pub mod messages;
pub mod method;
pub mod notification;
pub mod write_request;

pub use error::{ErrorCode, RpcError};
pub use method::{Method, MethodClass};
