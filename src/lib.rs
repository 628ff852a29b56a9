//! execrelay: a process-execution relay server.
//!
//! Clients start processes on a host over JSON-RPC and stream their output back; sessions
//! outlive connections. See `ARCHITECTURE.md` for the map.
//!
//! # Layout
//!
//! - [`rpc`]: the JSON-RPC envelope, error codes (mapped in one place) and typed messages.
//! - [`transport`]: framing over stdio and WebSocket.
//! - [`connection_processor`]: one connection's state machine and request ordering
//!   ([`request_scheduler`]), its writer ([`delivery`]) and method [`handlers`].
//! - [`session_registry`]: sessions shared by all connections of a server.
//! - [`process`]: spawning, output pumps, drain deadlines and the event log.
//! - [`server`]: listeners and shutdown; [`client`]: the Rust client; [`cli`]: the binary.
#![warn(missing_docs)]
// No unwrap/expect in library code: nothing a peer sends may panic the process. Tests may.
#![warn(clippy::unwrap_used, clippy::expect_used)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]
// Every `unsafe` block says why it is sound (`// SAFETY: …`); every `unsafe fn` has a
// `# Safety` section (tests/unsafe_docs.rs: clippy checks only public ones).
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod cli;
pub mod client;
pub mod config;
pub mod connection_processor;
pub mod delivery;
pub mod handlers;
pub mod metrics;
pub mod noise;
pub mod process;
pub mod request_scheduler;
pub mod rpc;
pub mod server;
pub mod session_registry;
pub mod transport;
