//! execrelay-protocol: the sans-IO link engine of execrelay's physical links
//! (`secure-transport.md` §5–§8), built once for its three parties: the exec server, the
//! client and the relay; the Noise record layer of the virtual streams (§2–§4); and the key
//! material they prove themselves with.
//!
//! A physical link is a WebSocket of binary frames carrying many virtual streams. The link
//! engine is everything about such a link that is not cryptography: the frame codec, the
//! stream table, per-stream flow control (§7), budgets against hostile peers (§6.4, §8),
//! keepalive (§6.4) and the relay's routing (§6.3). To the engine, payloads (Noise handshake
//! messages and records) are opaque bytes, so the relay runs it without any key; the exec
//! server and the client seal and open them with the record layer ([`noise`]).
//!
//! Built quinn-proto style: plain structs fed frames and `now`, asked for frames, timers and
//! events. The drivers that do the I/O live in `execrelay-io`.
//!
//! # What this crate must never do
//!
//! Depend on tokio, hyper or clap (directly or through any dependency: `tests/crates.rs` in
//! the workspace root checks the resolved tree), open a socket, spawn a task or read a clock
//! (callers pass `now`). Its one I/O is reading and writing key files with `std::fs`
//! ([`keys`]), because the environment handshake's admission reads the environments file it
//! is given. It depends on no other crate of the workspace.
//!
//! # Layout
//!
//! - [`frame`]: the 44-byte header codec and the field rules of §5.
//! - [`flow`]: one direction of a stream's flow control: [`flow::SendWindow`],
//!   [`flow::RecvWindow`], and the relay's [`flow::RelayFlow`].
//! - [`keepalive`]: when to ping, when a link is dead.
//! - [`bucket`]: the token bucket of every budget. [`closed_set`]: recently closed stream ids.
//! - [`config`]: every limit, as a named constant and a field of [`config::EndpointConfig`] or
//!   [`config::RelayConfig`].
//! - [`reason`]: reset, drop and close reasons, and their [`reason::Counters`].
//! - [`transmit`]: what a core hands its writer (a frame or a ping).
//! - [`endpoint`]: the endpoint role ([`endpoint::Endpoint`], client or server side): streams,
//!   `OPEN`/`ACCEPT`/`RESET`, windows, budgets, keepalive.
//! - [`router`]: the relay role ([`router::Router`]): routing by (environment, stream id)
//!   behind the [`router::RoutingTable`] interface, window accounting, per-link send queues
//!   with a control reserve, limits. [`address`]: the unit of its per-address caps.
//! - [`noise`]: the Noise record layer of virtual streams (§2–§4): suites, the stream
//!   handshake, record keys and AEAD, records and message reassembly against a
//!   [`noise::budget::ReassemblyBudget`]. The relay links it but never opens a record.
//! - [`env_handshake`]: the environment link's Noise handshake (§6.2), both roles, and the
//!   relay's admission of an environment (environments file, message-1 `ts`).
//! - [`replay`]: the replay cache of message-1 stamps (§3), per key; shared by the exec
//!   server (stream handshakes, per client key) and the relay (environment links, per id).
//! - [`keys`]: X25519 key files, public key lines, the authorized-keys file, and the relay's
//!   environments file ([`keys::environments`]). The exec server re-exports it as
//!   `execrelay::noise::keys`.
//! - [`sync`]: the poison-tolerant lock helpers every crate of the workspace takes std locks
//!   with.
//!
//! See `relay/README.md` for the design: state machines, who owns which queue, invariants.
//!
//! # Example
//!
//! Two endpoints back to back, on a clock the caller moves:
//!
//! ```
//! use std::time::Instant;
//! use bytes::Bytes;
//! use execrelay_protocol::config::EndpointConfig;
//! use execrelay_protocol::endpoint::{Endpoint, Event, Side};
//! use execrelay_protocol::transmit::Transmit;
//!
//! let now = Instant::now();
//! let mut client = Endpoint::new(Side::Client, EndpointConfig::default(), now, 1).unwrap();
//! let mut server = Endpoint::new(Side::Server, EndpointConfig::default(), now, 2).unwrap();
//! // Hand every frame one side wants to write to the other.
//! fn pump(from: &mut Endpoint, to: &mut Endpoint, now: Instant) {
//!     while let Some(t) = from.poll_transmit(now) {
//!         if let Transmit::Frame(f) = t {
//!             to.handle_frame(now, f.encode().unwrap());
//!         }
//!     }
//! }
//!
//! let id = [7u8; 16];
//! client.open(id, Bytes::from_static(b"handshake message 1")).unwrap();
//! pump(&mut client, &mut server, now);
//! assert!(matches!(server.poll_event(), Some(Event::OpenRequested { .. })));
//! server.accept(id, Bytes::from_static(b"handshake message 2")).unwrap();
//! pump(&mut server, &mut client, now);
//! assert!(matches!(client.poll_event(), Some(Event::Accepted { .. })));
//!
//! let seq = client.send_ready(&id).unwrap(); // the nonce to seal record 1 with
//! client.send(&id, Bytes::from_static(b"record 1")).unwrap();
//! pump(&mut client, &mut server, now);
//! match server.poll_event() {
//!     Some(Event::Data { seq: got, payload, .. }) => {
//!         assert_eq!((got, &payload[..]), (seq, &b"record 1"[..]));
//!         server.consumed(&id, got).unwrap(); // reopens the client's window
//!     }
//!     other => panic!("{other:?}"),
//! }
//! ```
#![warn(missing_docs)]
#![forbid(unsafe_code)]
// No unwrap/expect in library code: nothing a peer sends may panic the process. Tests may.
#![warn(clippy::unwrap_used, clippy::expect_used)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod address;
pub mod batch;
pub mod bucket;
pub mod closed_set;
pub mod config;
pub mod endpoint;
pub mod env_handshake;
pub mod flow;
pub mod frame;
pub mod keepalive;
pub mod keys;
pub mod noise;
pub mod reason;
pub mod replay;
pub mod router;
pub mod sync;
pub mod transmit;
pub mod websocket;
