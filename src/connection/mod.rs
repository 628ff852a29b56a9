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
//! - [`local`]: the in-process transport (bounded channels of typed messages, or a
//!   receiver the client installed, handed replies and events directly).
//! - [`handlers`]: validate typed params, call the session or process, shape typed results.
//! - [`error_map`]: the one place where `ProcessError` and `SessionError` become JSON-RPC
//!   errors.
//!
//! It must never block its reader on a request, and never reorder the requests of one
//! process.
//!
//! # The typed connection core
//!
//! ```text
//!  network transport ─▶ json_codec::decode_inbound ─┐                 ┌─▶ Outlet::Json ─▶ json_codec::encode_outbound
//!    (bytes)                                         ├─▶ Inbound ─▶ ConnectionProcessor ─▶ writer ─┤        / encode_event ─▶ sink
//!  in-process client ─▶ LocalClientEnd::try_send ───┘   (typed)   (scheduler, limits,   (delivery) └─▶ Outlet::Local ─▶ control channel
//!    (typed Inbound; full → -32004 inProcessQueue)                  teardown: one code)                              ─▶ event channel
//! ```
//!
//! An in-process client that installed a `LocalReceiver` (the library's does) is handed replies
//! by the processor itself and events by the writer, instead of through the two channels.
//!
//! **Architecture Invariant: one connection core.** Request classes, the scheduler, the
//! control lane's priority, request limits and teardown are the same code for every edge;
//! only the inlet (`Inlet::Json` / `Inlet::Local`) and the `Outlet` differ, and JSON exists only
//! in `json_codec.rs` (and `rpc/`). The request byte budgets (`request_budget.rs`) belong to
//! `Inlet::Json`: a network message is charged `parse_cost` before `decode_inbound` sees it, so
//! the bound holds however the params decode; in-process messages are the application's own
//! typed values (no peer bytes) and are bounded by the request queue and the request slots.
//! Checks on typed values (a `writeId` over `MAX_WRITE_ID_BYTES`, an argv over
//! `MAX_ARGV_BYTES`, durations over the server's caps, environment names, terminal sizes) run in
//! `handlers.rs`, after both inlets. What an answer can echo is bounded where it is made: a
//! string request id by `MAX_REQUEST_ID_BYTES` (`rpc/jsonrpc.rs`, network inlet), an error
//! message by `MAX_ERROR_MESSAGE_BYTES` (`RpcError::new`); a `process/list` answer shares the
//! processes' argv (`Arc<[String]>`) as a `process/read` answer shares their output.

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
pub mod write_order;

pub use processor::{
    ConnectionEnd, ConnectionOptions, ConnectionProcessor, HALF_CLOSE_DRAIN_TIMEOUT,
};
pub use request_budget::parse_cost;
