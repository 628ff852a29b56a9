//! Noise physical links (layer 5): the exec server's and the client's ends of links that
//! carry many encrypted virtual streams over one WebSocket (`secure-transport.md` §2–§8),
//! built on the link engine of the `relay/` crate (`execrelay_io::driver::EndpointLink`).
//!
//! # Layout
//!
//! - [`server`]: the exec server's end of one link (direct `noise+ws://` on `/v1/link`, or the
//!   environment link): handshakes, `ts`, authorization, one `ConnectionProcessor` per stream.
//! - [`key_quota`]: streams per client key (`max_streams_per_key`), server-wide.
//! - [`client`]: the client's link (direct or through a relay), shared through a
//!   [`client::LinkPool`].
//! - [`virtual_stream`]: one stream as a [`Transport`](crate::transport::Transport): sealing
//!   in the writer's task, decryption in the reader's task.
//! - [`dial`]: URL forms and dialling (`ws://`, `wss://` through rustls).
//! - `dial_error.rs`: why a dial failed ([`DialError`](dial::DialError)), beneath both.
//! - [`trust`]: what a `wss://` dialer trusts: the platform's roots, or a `--ca-file` whose
//!   certificates are CAs or pinned certificates (a self-signed relay certificate).
//! - [`health`]: the environment link's health (`/readyz`, `/status`, its metrics).
//!
//! The engine owns frames, windows (§7), keepalive and write deadlines (§6.4) and budgets
//! (§8); the cryptography (keys, handshake, records) lives in [`crate::noise`]. Nothing here
//! ties reading to writing, and no reader waits on a stream's consumer.

pub mod backoff;
pub mod client;
pub mod dial;
mod dial_error;
pub mod environment;
pub mod health;
pub mod key_quota;
pub mod server;
pub mod trust;
pub mod virtual_stream;
