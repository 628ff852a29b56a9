//! The HTTP front: the one HTTP server of execrelay, on hyper's HTTP/1.1 server.
//!
//! Every TCP listener (`ws://`, `noise+ws://`, the metrics endpoint, later the relay's) is a
//! [`Front`]: it admits connections under its limits ([`FrontLimits`]: handshake slots, slots
//! per peer address, one deadline for the whole request head), answers `GET /readyz`,
//! `GET /metrics`, `403` to any upgrade with an `Origin` header, `404`/`405`, and hands each
//! WebSocket upgrade its [`Routes`] accept to the caller's [`OnUpgrade`], with the route's tag,
//! the id captured from its path and a slot of the route's capacity.
//!
//! It is layer 1: it must never import sessions, connections, links or processes. What the
//! paths mean and who takes the upgrades is injected by the caller (the composition root,
//! `server.rs`).

mod address_slots;
mod front;
mod routes;

pub use address_slots::{AddressKey, AddressSlot, AddressSlots};
pub use front::{serve, Front, FrontLimits, OnUpgrade, Upgrade, ACCEPT_ERROR_BACKOFF};
pub use routes::{
    decide, Accepted, Decision, MetricsRenderer, PathPattern, Reply, Routes, UpgradeRoute,
    METRICS_CONTENT_TYPE, METRICS_PATH, READYZ_PATH,
};
