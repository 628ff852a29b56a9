//! execrelay-relay: the frame codec of physical links (`secure-transport.md` §5).
//!
//! # Layout
//!
//! - [`frame`]: the 44-byte header frame codec, sans-IO, shared by the exec server, the client
//!   and (later) the relay server, which routes frames by stream id without reading payloads.
#![warn(missing_docs)]
// No unwrap/expect in library code: nothing a peer sends may panic the process. Tests may.
#![warn(clippy::unwrap_used, clippy::expect_used)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod frame;
