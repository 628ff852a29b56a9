//! The fixed limits of the HTTP front, shared by every listener of the exec server and of the
//! relay. Each is a named constant: what it bounds and why this value. Per-listener limits
//! (head deadline, handshake slots) are the caller's settings, handed in as
//! [`FrontLimits`](super::FrontLimits).

/// Largest HTTP request head (request line and header fields) read before an upgrade or a
/// plain reply: 16 KiB. HTTP sets no maximum; a WebSocket handshake is well under 1 KiB and
/// 16 KiB is what common servers allow. A longer head is answered `431` and closed.
pub const MAX_REQUEST_HEAD_BYTES: usize = 16 * 1024;
/// Most header fields in a request head: 64 (a WebSocket handshake needs about six). More is
/// answered `431`.
pub const MAX_REQUEST_HEADERS: usize = 64;
/// Scrapes of the metrics endpoint served at once; more connections are closed at once. A
/// Prometheus server scrapes one at a time; a few spare slots let an operator's `curl` in.
pub const MAX_METRICS_SCRAPES: usize = 8;
/// Of those, from one address: 4, half. A host that holds connections without sending must
/// not blind the endpoint for everyone (the red team's 8 stalled connections from one address
/// did); a scraper's quick succession of requests still fits (a served connection keeps its
/// slot until its close is seen).
pub const MAX_METRICS_SCRAPES_PER_ADDRESS: usize = MAX_METRICS_SCRAPES / 2;
/// After its request head: how long an HTTP reply (or the `101` of an upgrade) may take to be
/// written, plus the graceful close after a plain reply, 1 s. A peer that does not read its
/// reply does not hold a slot longer.
pub const REPLY_TIMEOUT_MS: u64 = 1_000;
/// Most bytes a refused peer may still send that are read and discarded before closing, 64 KiB:
/// closing a socket with unread input makes the kernel send a reset that can destroy the reply
/// (a `431` sent while the peer is still sending its head); this bounds that courtesy.
pub const CLOSE_DRAIN_BYTES: usize = 64 * 1024;
/// Longest id captured from a routed path (`/v1/env/ID`, `/v1/connect/ID`), in bytes: an
/// environment id's longest (128).
pub const MAX_ROUTE_ID_BYTES: usize =
    execrelay_protocol::keys::environments::MAX_ENVIRONMENT_ID_BYTES;
