//! One JSON-RPC connection (layer 4): from framed messages to the session and back.
//!
//! # Layout
//!
//! - [`processor`]: the [`ConnectionProcessor`], its `initialize` state machine, request
//!   classes and limits, and teardown.
//! - [`scheduler`]: FIFO per `processId` for exclusive requests, shared reads.
//! - [`delivery`]: the connection writer (control lane before event lane), one for both edges.
//! - [`message`]: the typed messages the processor runs on (`Inbound`/`Call`, `Outbound`/
//!   `Reply`): no JSON in them.
//! - [`json_codec`]: the JSON edge of network connections, both directions.
//! - [`request_budget`]: the byte budget of a network connection's requests, charged at the
//!   JSON edge before parsing (`-32004` `maxPendingRequestBytes`/`maxInboundBytes`).
//! - [`outlet`]: where the writer sends (a network sink through the codec, or the in-process
//!   channels).
//! - [`local`]: the in-process transport (bounded channels of typed messages).
//! - [`handlers`]: validate typed params, call the session or process, shape typed results.
//! - [`error_map`]: the one place where `ProcessError` and `SessionError` become JSON-RPC
//!   errors.
//!
//! It must never block its reader on a request, and never reorder the requests of one
//! process.

pub mod delivery;
pub mod error_map;
pub mod handlers;
pub mod json_codec;
pub mod local;
pub mod message;
pub mod outlet;
pub mod processor;
pub mod request_budget;
pub mod scheduler;

pub use processor::{
    ConnectionEnd, ConnectionOptions, ConnectionProcessor, HALF_CLOSE_DRAIN_TIMEOUT,
};
pub use request_budget::parse_cost;
