//! execrelay-io: the I/O that the exec server and the relay share around the sans-IO link
//! engine of `execrelay-protocol`: the tokio link drivers, the HTTP front of every TCP
//! listener, TLS at a listener, the open-files limit, how a setting reads in `--help` and
//! config tables, and the binaries' logging and signal set-up.
//!
//! # What this crate must never do
//!
//! Know the relay server, the exec server, sessions or routing policy: it is driven by the
//! crate that composes it (the exec server's `server.rs`, the relay's `server` module). It
//! depends on `execrelay-protocol` and on no other crate of the workspace; it never parses a
//! command line (clap is not among its dependencies; the settings macro expands in the crate
//! that uses it).
//!
//! # Layout
//!
//! - [`driver`]: the link drivers, [`driver::EndpointLink`] (exec server and client, with
//!   per-stream handles) and [`driver::RelayHub`] (the relay's links around one router), over
//!   any `WebSocketStream`.
//! - [`http`]: the HTTP front of every TCP listener (exec server and relay), on hyper.
//! - [`tls`]: TLS at a listener (`wss://`): certificate files, their reload when they change,
//!   the server side of the handshake (rustls, `ring`).
//! - [`descriptors`]: `RLIMIT_NOFILE` (raised to the hard limit at start), open descriptors,
//!   the reserve (the exec server's) and the relay's caps derived from the limit.
//! - [`setting`]: how one setting reads to people, and the one [`settings!`] macro both
//!   servers declare their settings with.
//! - [`service`]: logs on stderr and graceful shutdown on signals, for both binaries.
//! - [`runtimes`]: single-threaded tokio runtimes, one thread each, that a listener spreads its
//!   connections over ([`http::serve_spread`]).
#![warn(missing_docs)]
#![forbid(unsafe_code)]
// No unwrap/expect in library code: nothing a peer sends may panic the process. Tests may.
#![warn(clippy::unwrap_used, clippy::expect_used)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod descriptors;
pub mod driver;
pub mod http;
pub mod runtimes;
pub mod service;
pub mod setting;
pub mod tls;
