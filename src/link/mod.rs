//! Noise physical links (layer 5): the drivers that carry many encrypted virtual streams over
//! one WebSocket (`secure-transport.md` §2–§5, §8).
//!
//! # Layout
//!
//! - [`server`]: the exec server's link driver (`noise+ws://`, `/v1/link`): one
//!   `ConnectionProcessor` per stream.
//! - [`client`]: the client's link, shared by the streams of one process.
//! - [`virtual_stream`]: a stream as a [`Transport`](crate::transport::Transport).
//!
//! The cryptography (keys, handshake, records) lives in [`crate::noise`], the frame codec in
//! `execrelay_relay::frame`. These drivers never tie reading to writing.

pub mod client;
pub mod server;
pub mod virtual_stream;
