//! execrelay-relay: the link engine of execrelay's physical links (`secure-transport.md`
//! §5–§8), built once for its three parties: the exec server, the client and the relay; and
//! what the exec server and the relay binary (`execrelay-relay`) share beside it: the HTTP
//! front, key files and the environment link's handshake. The main crate depends on this one,
//! never the other way.
//!
//! A physical link is a WebSocket of binary frames carrying many virtual streams. Everything
//! about such a link that is not cryptography lives here: the frame codec, the stream table,
//! per-stream flow control (§7), budgets against hostile peers (§6.4, §8), keepalive (§6.4)
//! and the relay's routing (§6.3). Payloads (Noise handshake messages and records) are opaque
//! bytes, so the relay runs the same engine without any key; the main crate seals and opens
//! them above it.
//!
//! Built quinn-proto style: sans-IO cores fed frames and `now`, asked for frames, timers and
//! events; one thin tokio driver per link does the I/O.
//!
//! # Layout
//!
//! Sans-IO (no tokio, no sockets, no clock):
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
//!   with a control reserve, limits.
//! - [`env_handshake`]: the environment link's Noise handshake (§6.2), both roles, and the
//!   relay's admission of an environment (environments file, message-1 `ts`).
//! - [`replay`]: the replay cache of message-1 stamps (§3), per key; shared by the exec
//!   server (stream handshakes, per client key) and the relay (environment links, per id).
//! - [`descriptors`]: `RLIMIT_NOFILE` (raised to the hard limit at start), open descriptors,
//!   the reserve (the exec server's) and the relay's caps derived from the limit.
//!
//! Key files (no tokio, no sockets):
//!
//! - [`keys`]: X25519 key files, public key lines, the authorized-keys file, and the relay's
//!   environments file ([`keys::environments`]). The main crate re-exports it as
//!   `execrelay::noise::keys`.
//!
//! Tokio (the only modules that import it):
//!
//! - [`driver`]: the link drivers, [`driver::EndpointLink`] (exec server and client, with
//!   per-stream handles) and [`driver::RelayHub`] (the relay's links around one router), over any
//!   `WebSocketStream`.
//! - [`http`]: the HTTP front of every TCP listener (exec server and relay), on hyper.
//! - [`tls`]: TLS at the relay's listener (`wss://`): certificate files, their reload when
//!   they change, the server side of the handshake (rustls, `ring`).
//! - [`cluster`]: relays past one machine: NATS core as the directory of which relay holds
//!   which environment, relay-to-relay links for misrouted clients (sans-IO messages and
//!   handshake; a tokio node).
//! - [`server`]: the relay server (`execrelay-relay`): routes, link admission, the
//!   environments-file watcher, metrics, shutdown ([`server::run`]).
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
//! use execrelay_relay::config::EndpointConfig;
//! use execrelay_relay::endpoint::{Endpoint, Event, Side};
//! use execrelay_relay::transmit::Transmit;
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

/// The relay's version, sent in message 2 of every environment link and of every
/// relay-to-relay link.
pub const RELAY_VERSION: &str = env!("CARGO_PKG_VERSION");

pub mod bucket;
pub mod closed_set;
pub mod cluster;
pub mod config;
pub mod descriptors;
pub mod driver;
pub mod endpoint;
pub mod env_handshake;
pub mod flow;
pub mod frame;
pub mod http;
pub mod keepalive;
pub mod keys;
pub mod reason;
pub mod replay;
pub mod router;
pub mod server;
pub mod setting;
pub mod sync;
pub mod tls;
pub mod transmit;
