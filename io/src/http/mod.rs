//! The HTTP front: the one HTTP server of execrelay, on hyper's HTTP/1.1 server, shared by the
//! exec server (`execrelay serve`) and the relay (`execrelay-relay`).
//!
//! Every TCP listener (`ws://`, `noise+ws://`, the metrics endpoint, the relay's listener) is a
//! [`Front`]: it admits connections under its limits ([`FrontLimits`]: handshake slots, slots
//! per peer address, one deadline for the whole request head), optionally speaks TLS
//! (`wss://`, [`crate::tls`]), answers the health routes ([`Health`]: `GET /readyz`,
//! `/livez`, `/status`), `GET /metrics`, `403` to any upgrade with an `Origin` header, `404`/`405`, and hands each
//! WebSocket upgrade its [`Routes`] accept to the caller's [`OnUpgrade`], with the route's tag,
//! the id captured from its path and a slot of the route's capacity. Every accepted WebSocket
//! is read through a read-ahead buffer over a [`FrameQueue`], on which the exec server writes
//! its data frames from the buffers they are already in ([`frame_queue`]).
//!
//! It must never know sessions, connections, links or routing: what the paths mean and who
//! takes the upgrades is injected by the caller (the exec server's composition root
//! `server.rs`, the relay's `server` module). Its fixed limits are in [`limits`].

mod address_slots;
pub mod frame_queue;
mod front;
pub mod limits;
mod routes;
mod stream;

pub use address_slots::{AddressSlot, AddressSlots};
pub use execrelay_protocol::address::AddressKey;
pub use frame_queue::{DataOpcode, FrameQueue, FRAME_QUEUE_BYTES};
pub use front::{
    serve, serve_spread, Front, FrontLimits, FrontStream, HomeOf, OnUpgrade, Spread, Upgrade,
    ACCEPT_ERROR_BACKOFF,
};
pub use limits::{
    CLOSE_DRAIN_BYTES, MAX_METRICS_SCRAPES, MAX_METRICS_SCRAPES_PER_ADDRESS, MAX_REQUEST_HEADERS,
    MAX_REQUEST_HEAD_BYTES, MAX_ROUTE_ID_BYTES, REPLY_TIMEOUT_MS,
};
pub use routes::{
    decide, Accepted, Decision, Health, MetricsRenderer, PathPattern, ReadinessCheck, Reply,
    Routes, StatusRenderer, UpgradeRoute, FRONT_HEADER, LIVEZ_PATH, METRICS_CONTENT_TYPE,
    METRICS_PATH, READYZ_PATH, STATUS_PATH,
};
pub use stream::{Detached, FrontIo, MovableTcp};
