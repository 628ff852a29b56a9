//! execrelay-relay: the link engine of execrelay's physical links (`secure-transport.md`
//! §5–§7) for its three parties: the exec server, the client and the relay.
//!
//! (Crate docs are completed below, with the Layout.)
#![warn(missing_docs)]
#![forbid(unsafe_code)]
// No unwrap/expect in library code: nothing a peer sends may panic the process. Tests may.
#![warn(clippy::unwrap_used, clippy::expect_used)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod bucket;
pub mod closed_set;
pub mod config;
pub mod driver;
pub mod endpoint;
pub mod flow;
pub mod frame;
pub mod keepalive;
pub mod reason;
pub mod router;
pub mod transmit;
