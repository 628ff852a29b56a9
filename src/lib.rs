//! execrelay: a process-execution relay server.
//!
//! Clients start processes on a host over JSON-RPC and stream their output back; sessions
//! outlive connections. See `ARCHITECTURE.md` for the map.
//!
//! # Layout
//!
//! Modules are in layers; a module uses only modules of strictly lower layers (checked by
//! `tests/layers.rs`; the rule is in `ARCHITECTURE.md`).
//!
//! 0. `sync` (the poison-tolerant lock), `faults` (what a debug build injects for tests),
//!    [`config`] (every limit, declared once as field,
//!    flag and TOML key), [`bounds`] (byte budgets, descriptor limits, the idle rule).
//! 1. [`metrics`] (counters, a leaf passed in); [`rpc`] (wire types, error codes, both
//!    directions of every codec, the [`Method`](rpc::Method) enum); [`transport`] (framing
//!    over stdio and WebSocket); [`noise`] (keys, handshake, records: crypto only); [`policy`]
//!    (the exec policy: rules, the resolved path, the file re-read on change).
//!
//! Beneath every layer, the `execrelay-relay` crate (`relay/`): the link engine, the HTTP
//! front of every TCP listener (`execrelay_io::http`: `/readyz`, `/metrics`, the Origin
//! refusal, WebSocket upgrades; routes injected by the caller), the key files
//! (`execrelay_protocol::keys`, re-exported as [`noise::keys`]) and the relay server itself.
//! 2. [`process`]: spawning, output pumps, drain deadlines, the event log, the ready queue.
//! 3. [`session`]: sessions shared by all connections of a server.
//! 4. [`connection`]: one connection's state machine, request ordering, writer, handlers,
//!    and the one mapping of typed errors to JSON-RPC.
//! 5. [`link`]: the Noise physical-link drivers and virtual streams.
//! 6. [`server`]: the composition root (every listener, the metrics endpoint's renderer and
//!    the one shutdown sequence); [`client`]: the Rust client.
//! 7. [`cli`]: the binary (thin).
#![warn(missing_docs)]
// No unwrap/expect in library code: nothing a peer sends may panic the process. Tests may.
#![warn(clippy::unwrap_used, clippy::expect_used)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]
// Every `unsafe` block says why it is sound (`// SAFETY: …`); every `unsafe fn` has a
// `# Safety` section (tests/unsafe_docs.rs: clippy checks only public ones).
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod bounds;
pub mod cli;
pub mod client;
pub mod config;
pub mod connection;
#[doc(hidden)]
pub mod faults;
pub mod link;
pub mod metrics;
pub mod noise;
pub mod policy;
pub mod process;
pub mod rpc;
pub mod server;
pub mod session;
pub(crate) mod sync;
pub mod transport;
