//! What a request gets, decided from its head alone (sans-IO: no socket, no clock).
//!
//! # What this module owns
//!
//! - The routing rules of the front (secure-transport.md §1): any request that asks for a
//!   protocol switch and carries an `Origin` header is refused with `403`, whatever its path
//!   and whatever it asks to switch to; a WebSocket upgrade goes to the first
//!   [`UpgradeRoute`] whose [`PathPattern`] matches its path (`404` when none does), is
//!   checked against RFC 6455 §4.2.1 and takes a slot of the route's capacity (`503` when
//!   full); where a listener serves [`Health`], `GET /readyz` is `200` while the caller's
//!   [`ReadinessCheck`] says ready and `503` with its reason otherwise, `GET /livez` is
//!   `200`, `GET /status` the caller's JSON; `GET /metrics` (where served) the metrics text;
//!   another method on those paths `405`, anything else `404`.
//! - The plain replies ([`Reply`]) and the `101` of an accepted upgrade.
//!
//! # What it must never do
//!
//! - Let a request carrying an `Origin` header through to an upgrade: that is how a web page
//!   open in a browser on the same host would drive a local server.
//! - Take a label, a log field or a path segment from a peer without bounding it: a captured
//!   id is at most [`MAX_ROUTE_ID_BYTES`] unreserved characters.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Method, Request, Response, StatusCode, Version};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;

use super::limits::MAX_ROUTE_ID_BYTES;

/// The readiness probe path (secure-transport.md §1).
pub const READYZ_PATH: &str = "/readyz";
/// The liveness probe path: `200` whenever the process answers at all.
pub const LIVEZ_PATH: &str = "/livez";
/// The status path: a JSON document of what the process holds (where served).
pub const STATUS_PATH: &str = "/status";
/// The metrics scrape path.
pub const METRICS_PATH: &str = "/metrics";
/// The content type of the OpenMetrics text format, which Prometheus negotiates.
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// Body of the `403` refusal of a cross-origin upgrade.
const FORBIDDEN_BODY: &str = "cross-origin WebSocket requests are refused\n";

/// Renders the metrics text at scrape time.
pub type MetricsRenderer = Arc<dyn Fn() -> String + Send + Sync>;
/// Whether the process is ready now: `Ok`, or why not (one line, for the `503`'s body).
pub type ReadinessCheck = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;
/// Renders the `/status` JSON document at request time.
pub type StatusRenderer = Arc<dyn Fn() -> String + Send + Sync>;

/// The health routes of a listener: `/readyz`, `/livez` and (when given) `/status`.
#[derive(Clone, Default)]
pub struct Health {
    /// Decides `/readyz`; `None`: ready whenever the listener answers.
    pub ready: Option<ReadinessCheck>,
    /// Serves `/status`; `None`: `404`.
    pub status: Option<StatusRenderer>,
}

impl Health {
    /// `/readyz` always `200`, `/livez`, no `/status`: a listener that is ready when it
    /// answers.
    pub fn always() -> Option<Health> {
        Some(Health::default())
    }
}

/// Which request paths a route upgrades.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathPattern {
    /// Every path (a plain `ws://` listener serves one connection per WebSocket on any path).
    Any,
    /// Exactly this path (`/v1/link`).
    Exact(&'static str),
    /// This prefix (ending in `/`) followed by one id segment: `/v1/env/` matches
    /// `/v1/env/ID` and captures `ID` (1 to [`MAX_ROUTE_ID_BYTES`] characters of
    /// `A–Z a–z 0–9 - . _ ~`, so an id never needs decoding and never holds a `/`).
    WithId(&'static str),
}

impl PathPattern {
    /// `None` when `path` does not match; `Some(captured id)` when it does.
    pub fn matches(&self, path: &str) -> Option<Option<String>> {
        match self {
            PathPattern::Any => Some(None),
            PathPattern::Exact(exact) => (path == *exact).then_some(None),
            PathPattern::WithId(prefix) => {
                let id = path.strip_prefix(prefix)?;
                valid_id(id).then(|| Some(id.to_owned()))
            }
        }
    }
}

fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_ROUTE_ID_BYTES
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~'))
}

/// One kind of WebSocket upgrade a listener accepts.
pub struct UpgradeRoute<R> {
    /// The paths it serves.
    pub path: PathPattern,
    /// The caller's tag for it, handed back with every upgrade.
    pub route: R,
    /// Established WebSockets of this route at once, if capped: each upgrade holds a permit
    /// for as long as the caller keeps it; without one free the request is answered `503`.
    pub capacity: Option<Arc<Semaphore>>,
}

/// What one listener serves besides its upgrades.
pub struct Routes<R> {
    /// Serve `GET /readyz`, `/livez` and `/status` ([`Health`]), or not (`404`).
    pub health: Option<Health>,
    /// Serve `GET /metrics` with this renderer's text.
    pub metrics: Option<MetricsRenderer>,
    /// The upgrades, tried in order.
    pub upgrades: Vec<UpgradeRoute<R>>,
    /// What this listener is and which URL form reaches it, sent as the body of the `404` to
    /// an upgrade on a path it does not serve: a client dialling the wrong URL form (`ws://`
    /// or `noise+ws://` at a relay) can tell its user what to type instead.
    pub not_found_hint: Option<&'static str>,
}

/// A plain HTTP reply, always followed by closing the connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `GET /readyz` or `/livez`: `200 ok`.
    Ready,
    /// `GET /readyz` while not ready: `503` with why.
    NotReady(String),
    /// `GET /status`: `200` with a JSON document.
    Status(String),
    /// `GET /metrics`: `200` with the metrics text.
    Metrics(String),
    /// `400`: an upgrade that breaks RFC 6455 §4.2.1 (why, for the body).
    BadRequest(&'static str),
    /// `403`: an upgrade with an `Origin` header.
    Forbidden,
    /// `404`.
    NotFound,
    /// `404` for an upgrade on a path this listener does not serve, with the listener's hint
    /// ([`Routes::not_found_hint`]) as the body.
    NotServedHere(&'static str),
    /// `405` with `Allow: GET`.
    MethodNotAllowed,
    /// `426` with `Sec-WebSocket-Version: 13`: a WebSocket version we do not speak.
    UpgradeRequired,
    /// `503` with `Retry-After: 1`: the route's capacity is taken.
    Busy,
}

impl Reply {
    /// The status of this reply.
    pub fn status(&self) -> StatusCode {
        match self {
            Reply::Ready | Reply::Metrics(_) | Reply::Status(_) => StatusCode::OK,
            Reply::NotReady(_) => StatusCode::SERVICE_UNAVAILABLE,
            Reply::BadRequest(_) => StatusCode::BAD_REQUEST,
            Reply::Forbidden => StatusCode::FORBIDDEN,
            Reply::NotFound | Reply::NotServedHere(_) => StatusCode::NOT_FOUND,
            Reply::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Reply::UpgradeRequired => StatusCode::UPGRADE_REQUIRED,
            Reply::Busy => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The whole response.
    pub fn into_response(self) -> Response<Full<Bytes>> {
        let status = self.status();
        let (content_type, extra, body): (&str, Option<(header::HeaderName, &str)>, Bytes) =
            match self {
                Reply::Ready => (TEXT, None, Bytes::from_static(b"ok\n")),
                Reply::NotReady(why) => (
                    TEXT,
                    Some((header::RETRY_AFTER, "5")),
                    Bytes::from(format!("not ready: {why}\n")),
                ),
                Reply::Status(json) => (JSON, None, Bytes::from(json)),
                Reply::Metrics(text) => (METRICS_CONTENT_TYPE, None, Bytes::from(text)),
                Reply::BadRequest(why) => (TEXT, None, Bytes::from(format!("{why}\n"))),
                Reply::Forbidden => (TEXT, None, Bytes::from_static(FORBIDDEN_BODY.as_bytes())),
                Reply::NotFound => (TEXT, None, Bytes::from_static(b"not found\n")),
                Reply::NotServedHere(hint) => (TEXT, None, Bytes::from(format!("{hint}\n"))),
                Reply::MethodNotAllowed => (
                    TEXT,
                    Some((header::ALLOW, "GET")),
                    Bytes::from_static(b"method not allowed\n"),
                ),
                Reply::UpgradeRequired => (
                    TEXT,
                    Some((header::SEC_WEBSOCKET_VERSION, "13")),
                    Bytes::from_static(b"only WebSocket version 13 is spoken here\n"),
                ),
                Reply::Busy => (
                    TEXT,
                    Some((header::RETRY_AFTER, "1")),
                    Bytes::from_static(b"too many connections; try again later\n"),
                ),
            };
        let mut response = Response::new(Full::new(body));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
        // One request per connection: hyper closes after a reply that says so.
        headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        if let Some((name, value)) = extra {
            headers.insert(name, HeaderValue::from_static(value));
        }
        response
    }
}

const TEXT: &str = "text/plain; charset=utf-8";
const JSON: &str = "application/json";

/// What the front does with a request.
pub enum Decision<R> {
    /// Answer and close.
    Reply(Reply),
    /// Switch to WebSocket: answer `101` with `accept` and hand the connection to the caller.
    Upgrade(Accepted<R>),
}

/// An upgrade the front accepted, before the `101` is written.
pub struct Accepted<R> {
    /// The caller's tag of the matching route.
    pub route: R,
    /// The id captured from the path, for [`PathPattern::WithId`].
    pub id: Option<String>,
    /// `Sec-WebSocket-Accept` for the `101`.
    pub accept: String,
    /// The slot of the route's capacity, if capped.
    pub permit: Option<OwnedSemaphorePermit>,
    /// The request carried [`FRONT_HEADER`] (whether its peer may say so is the caller's to
    /// check).
    pub via_front: bool,
}

/// The header a relay cluster's load balancer (HAProxy) sets on every request it forwards to
/// a relay (`http-request set-header X-Execrelay-Front 1`): a relay that gets a client link
/// for an environment held elsewhere *through the front* learns that the front now sends the
/// environment's clients to it (a membership change), and asks the environment to move. A
/// client that reaches a relay directly can send it too: the relay honours it only from the
/// addresses of `trusted_front` (`execrelay_relay::cluster::trusted_front`; nobody by default), which
/// the caller checks against the TCP peer; this front only says that it was there.
pub const FRONT_HEADER: &str = "x-execrelay-front";

impl<R> Accepted<R> {
    /// The `101 Switching Protocols` response.
    pub fn response(&self) -> Response<Full<Bytes>> {
        let mut response = Response::new(Full::new(Bytes::new()));
        *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        let headers = response.headers_mut();
        headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        if let Ok(accept) = HeaderValue::from_str(&self.accept) {
            headers.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
        }
        response
    }
}

/// Decide what `request` gets on a listener serving `routes`.
pub fn decide<R: Clone, B>(routes: &Routes<R>, request: &Request<B>) -> Decision<R> {
    let headers = request.headers();
    let asks_upgrade =
        headers.contains_key(header::UPGRADE) || headers.contains_key(header::SEC_WEBSOCKET_KEY);
    // Checked first and for any kind of upgrade: whatever a browser page asks to switch to,
    // it must not reach the server.
    if asks_upgrade && headers.contains_key(header::ORIGIN) {
        return Decision::Reply(Reply::Forbidden);
    }
    let path = request.uri().path();
    if lists_token(headers, &header::UPGRADE, "websocket") {
        let Some((route, id)) = routes
            .upgrades
            .iter()
            .find_map(|r| r.path.matches(path).map(|id| (r, id)))
        else {
            return Decision::Reply(match routes.not_found_hint {
                Some(hint) => Reply::NotServedHere(hint),
                None => Reply::NotFound,
            });
        };
        let accept = match check_websocket_handshake(request.method(), request.version(), headers) {
            Ok(accept) => accept,
            Err(reply) => return Decision::Reply(reply),
        };
        let permit = match &route.capacity {
            None => None,
            Some(slots) => match Arc::clone(slots).try_acquire_owned() {
                Ok(permit) => Some(permit),
                Err(_) => return Decision::Reply(Reply::Busy),
            },
        };
        return Decision::Upgrade(Accepted {
            route: route.route.clone(),
            id,
            accept,
            permit,
            via_front: headers.contains_key(FRONT_HEADER),
        });
    }
    let get = request.method() == Method::GET;
    if let Some(health) = &routes.health {
        let served = match path {
            READYZ_PATH | LIVEZ_PATH => true,
            STATUS_PATH => health.status.is_some(),
            _ => false,
        };
        if served && !get {
            return Decision::Reply(Reply::MethodNotAllowed);
        }
        match (path, &health.ready, &health.status) {
            (READYZ_PATH, Some(ready), _) => {
                return Decision::Reply(match ready() {
                    Ok(()) => Reply::Ready,
                    Err(why) => Reply::NotReady(why),
                })
            }
            (READYZ_PATH | LIVEZ_PATH, _, _) => return Decision::Reply(Reply::Ready),
            (STATUS_PATH, _, Some(render)) => return Decision::Reply(Reply::Status(render())),
            _ => {}
        }
    }
    if let (Some(render), true) = (&routes.metrics, path == METRICS_PATH) {
        return Decision::Reply(if get {
            Reply::Metrics(render())
        } else {
            Reply::MethodNotAllowed
        });
    }
    Decision::Reply(Reply::NotFound)
}

/// The checks of RFC 6455 §4.2.1 on an opening handshake; the `Sec-WebSocket-Accept` value.
fn check_websocket_handshake(
    method: &Method,
    version: Version,
    headers: &HeaderMap,
) -> Result<String, Reply> {
    if method != Method::GET {
        return Err(Reply::MethodNotAllowed);
    }
    if version != Version::HTTP_11 {
        return Err(Reply::BadRequest("a WebSocket upgrade needs HTTP/1.1"));
    }
    if !lists_token(headers, &header::CONNECTION, "upgrade") {
        return Err(Reply::BadRequest(
            "a WebSocket upgrade needs `Connection: Upgrade`",
        ));
    }
    match headers.get(header::SEC_WEBSOCKET_VERSION) {
        Some(v) if v.as_bytes().trim_ascii() == b"13" => {}
        _ => return Err(Reply::UpgradeRequired),
    }
    // An opening handshake has no body (RFC 6455 §4.1): a length or a transfer coding on it
    // is the shape of request smuggling behind a front that reads the body another way.
    let content_length = headers.get(header::CONTENT_LENGTH);
    if headers.contains_key(header::TRANSFER_ENCODING)
        || content_length.is_some_and(|v| v.as_bytes().trim_ascii() != b"0")
        || headers.get_all(header::CONTENT_LENGTH).iter().count() > 1
    {
        return Err(Reply::BadRequest(
            "a WebSocket upgrade carries no body (no Transfer-Encoding, no Content-Length but 0)",
        ));
    }
    // The field must not appear more than once (RFC 6455 §11.3.1): which key would we answer?
    if headers.get_all(header::SEC_WEBSOCKET_KEY).iter().count() > 1 {
        return Err(Reply::BadRequest(
            "a WebSocket upgrade needs exactly one Sec-WebSocket-Key",
        ));
    }
    let key = headers
        .get(header::SEC_WEBSOCKET_KEY)
        .map(|k| k.as_bytes().trim_ascii())
        .filter(|k| is_websocket_key(k))
        .ok_or(Reply::BadRequest(
            "a WebSocket upgrade needs a Sec-WebSocket-Key of 16 bytes in base64",
        ))?;
    Ok(derive_accept_key(key))
}

/// A `Sec-WebSocket-Key` is 16 random bytes in base64 (24 characters).
fn is_websocket_key(key: &[u8]) -> bool {
    use base64::Engine;
    key.len() == 24
        && base64::engine::general_purpose::STANDARD
            .decode(key)
            .is_ok_and(|k| k.len() == 16)
}

/// Whether any `name` field lists `token` in its comma-separated value (ASCII
/// case-insensitive).
fn lists_token(headers: &HeaderMap, name: &header::HeaderName, token: &str) -> bool {
    headers.get_all(name).iter().any(|value| {
        value
            .as_bytes()
            .split(|&b| b == b',')
            .any(|item| item.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
    })
}

#[cfg(test)]
mod tests;
