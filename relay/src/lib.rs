//! execrelay-relay: the relay server and its binary (`execrelay-relay`). Exec servers dial
//! out to it and register an environment id; clients dial it and open end-to-end encrypted
//! streams to an environment through it. It routes frames by (environment, stream id) and
//! reads none of their payloads: it holds no key but its own.
//!
//! It is built from the link engine of `execrelay-protocol` (the router, the environment
//! handshake's admission) and the shared I/O of `execrelay-io` (the relay hub driver, the HTTP
//! front, TLS). The exec server's library never links this crate; its tests use it as a
//! dev-dependency, and the `execrelay` binary links it only for `execrelay demo` (the `demo`
//! feature, on by default; see the README's "Decisions").
//!
//! # Layout
//!
//! - [`server`]: the relay server: routes, link admission, the environments-file watcher,
//!   metrics, shutdown ([`server::run`]), and the binary's command line ([`server::cli`]).
//! - [`cluster`]: relays past one machine: NATS core as the directory of which relay holds
//!   which environment, relay-to-relay links for misrouted clients (sans-IO messages and
//!   handshake; a tokio node).
//!
//! See `relay/README.md` for the design.
#![warn(missing_docs)]
#![forbid(unsafe_code)]
// No unwrap/expect in library code: nothing a peer sends may panic the process. Tests may.
#![warn(clippy::unwrap_used, clippy::expect_used)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

/// The relay's version, sent in message 2 of every environment link and of every
/// relay-to-relay link.
pub const RELAY_VERSION: &str = env!("CARGO_PKG_VERSION");

pub mod cluster;
pub mod server;
