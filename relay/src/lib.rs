//! execrelay-relay: the frame codec of physical links (`secure-transport.md` §5).
//!
//! # Layout
//!
//! - [`frame`]: the 44-byte header frame codec, sans-IO, shared by the exec server, the client
//!   and (later) the relay server, which routes frames by stream id without reading payloads.
#![warn(missing_docs)]

pub mod frame;
