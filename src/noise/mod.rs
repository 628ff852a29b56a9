//! The exec server's side of Noise for virtual streams (`secure-transport.md` §3, §8): what
//! needs a clock, a lock or a runtime around the sans-IO record layer (layer 1). The record
//! layer itself (suites, the stream handshake, record keys and AEAD, records and message
//! reassembly) is in the protocol crate (`execrelay_protocol::noise`), re-exported here so
//! that `execrelay::noise::…` names all of it. The link drivers that use them are in
//! [`crate::link`].
//!
//! # Layout
//!
//! - [`timestamp`]: the `ts` of handshake message 1 around the protocol crate's one replay
//!   check (`execrelay_protocol::replay`): the client's increasing stamp (read from the
//!   system clock) and the listener's shared cache of accepted stamps per client key.
//! - [`authorizer`]: the async authorization trait and the authorized-keys implementation.
//! - Re-exported from `execrelay_protocol`: [`keys`], [`suite`], [`handshake`], [`cipher`],
//!   [`record`], [`budget`] (the exec server's byte budget implements its trait in
//!   [`crate::bounds::reassembly`]).
//!
//! # What it must never do
//!
//! Log key material or plaintext, or hold a lock across an await.

pub mod authorizer;
pub use execrelay_protocol::keys;
pub use execrelay_protocol::noise::{budget, cipher, handshake, record, suite};
pub mod timestamp;
