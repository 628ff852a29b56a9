//! execrelay: a process-execution relay server.
//!
//! Clients start processes on a host over JSON-RPC and stream their output back; sessions
//! outlive connections. See `ARCHITECTURE.md` for the map.
//!
//! # Layout
//!
//! - [`rpc`]: the JSON-RPC envelope, error codes (mapped in one place) and typed messages.
//! - [`transport`]: framing over stdio and WebSocket.
//! - [`connection`]: one connection's state machine and request ordering, its writer and
//!   method handlers.
//! - [`session`]: sessions shared by all connections of a server.
//! - [`process`]: spawning, output pumps, drain deadlines and the event log.
//! - [`noise`]: Noise crypto; [`link`]: the Noise link drivers.
//! - [`server`]: listeners and shutdown; [`client`]: the Rust client; [`cli`]: the binary.
#![warn(missing_docs)]
// No unwrap/expect in library code: nothing a peer sends may panic the process. Tests may.
#![warn(clippy::unwrap_used, clippy::expect_used)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod cli;
pub mod client;
pub mod config;
pub mod connection;
pub mod link;
pub mod metrics;
pub mod metrics_endpoint;
pub mod noise;
pub mod process;
pub mod rpc;
pub mod server;
pub mod session;
pub(crate) mod sync;
pub mod transport;
