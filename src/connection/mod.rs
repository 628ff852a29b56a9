//! One JSON-RPC connection (layer 4): from framed messages to the session and back.
//!
//! # Layout
//!
//! - [`processor`]: the [`ConnectionProcessor`], its `initialize` state machine, request
//!   classes and limits, and teardown.
//! - [`scheduler`]: FIFO per `processId` for exclusive requests, shared reads.
//! - [`delivery`]: the connection writer (control lane before event lane).
//! - [`handlers`]: decode and validate params, call the session or process, shape results.
//! - [`error_map`]: the one place where `ProcessError` and `SessionError` become JSON-RPC
//!   errors.
//!
//! It must never block its reader on a request, and never reorder the requests of one
//! process.

pub mod delivery;
pub mod error_map;
pub mod handlers;
pub mod processor;
pub mod scheduler;

pub use processor::{
    parse_cost, ConnectionEnd, ConnectionOptions, ConnectionProcessor, HALF_CLOSE_DRAIN_TIMEOUT,
};
