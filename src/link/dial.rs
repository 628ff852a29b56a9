//! Dialling a physical link: the URL forms of `secure-transport.md` §1 and §6.1, and the
//! WebSocket (`ws://`, or `wss://` through rustls) under a deadline.
//!
//! Both dialers use it: the client's (`noise+ws://HOST:PORT`, `relay+ws://RELAY:PORT/ID`,
//! `relay+wss://…`) and the exec server's environment link (`--relay ws://RELAY:PORT` or
//! `wss://…`, to which `/v1/env/ID` is appended). TLS verifies the relay's certificate against
//! the platform's roots (`rustls-native-certs`) or a private CA (`--ca-file`); the `ring`
//! provider, no OpenSSL.
//!
//! It never reads a payload: what travels on the link is the engine's and the Noise layer's.

use std::time::Duration;

pub use super::dial_error::DialError;
pub use super::trust::{load_ca_file, TlsRoots};

use crate::transport::websocket::{connect_link_socket, LinkClientSocket};
use execrelay_io::driver::link_websocket_config;
use execrelay_io::http::MAX_ROUTE_ID_BYTES;

/// A dialled link's WebSocket (see [`LinkClientSocket`]).
pub type LinkSocket = LinkClientSocket;

/// The path a client link connects to on a relay, before the environment id.
pub const CONNECT_PATH: &str = "/v1/connect/";
/// The path an environment link connects to on a relay, before the environment id.
pub const ENV_PATH: &str = "/v1/env/";

/// Where a client link goes: the WebSocket URL and the environment id bound into every
/// handshake's prologue (empty for a direct `noise+ws://` server).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkTarget {
    /// `ws://HOST:PORT/v1/link`, `ws://RELAY:PORT/v1/connect/ID` or `wss://…`.
    pub ws_url: String,
    /// The environment id (`relay+…` targets), or empty.
    pub env_id: String,
}

/// Check an environment id: 1 to [`MAX_ROUTE_ID_BYTES`] bytes of letters, digits, `.`, `_`,
/// `-` and `~` (URL-unreserved: it travels in a URL path, which the relay's front checks the
/// same way, and in every handshake's prologue).
pub fn check_env_id(id: &str) -> Result<(), DialError> {
    let ok = !id.is_empty()
        && id.len() <= MAX_ROUTE_ID_BYTES
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'~'));
    if ok {
        Ok(())
    } else {
        Err(DialError::Url(format!(
            "bad environment id {id:?}: 1 to {MAX_ROUTE_ID_BYTES} letters, digits, '.', '_', '-' or '~'"
        )))
    }
}

fn host_port(rest: &str, form: &str) -> Result<String, DialError> {
    if rest.is_empty() || rest.contains(['/', '?', '#', ' ']) {
        return Err(DialError::Url(format!("expected {form}")));
    }
    Ok(rest.to_string())
}

impl LinkTarget {
    /// Parse `noise+ws://HOST:PORT`, `relay+ws://RELAY:PORT/ID` or `relay+wss://RELAY:PORT/ID`.
    pub fn parse(url: &str) -> Result<LinkTarget, DialError> {
        if let Some(rest) = url.strip_prefix("noise+ws://") {
            let hp = host_port(rest.trim_end_matches('/'), "noise+ws://HOST:PORT")?;
            return Ok(LinkTarget {
                ws_url: format!("ws://{hp}{}", super::server::LINK_PATH),
                env_id: String::new(),
            });
        }
        let (scheme, rest) = if let Some(rest) = url.strip_prefix("relay+ws://") {
            ("ws", rest)
        } else if let Some(rest) = url.strip_prefix("relay+wss://") {
            ("wss", rest)
        } else {
            return Err(DialError::Url(format!(
                "unsupported link URL {url:?}: expected noise+ws://HOST:PORT, relay+ws://RELAY:PORT/ID or relay+wss://RELAY:PORT/ID"
            )));
        };
        let form = format!("relay+{scheme}://RELAY:PORT/ENVIRONMENT_ID");
        let (hp, id) = rest
            .trim_end_matches('/')
            .split_once('/')
            .ok_or_else(|| DialError::Url(format!("{url:?}: expected {form}")))?;
        let hp = host_port(hp, &form)?;
        check_env_id(id)?;
        Ok(LinkTarget {
            ws_url: format!("{scheme}://{hp}{CONNECT_PATH}{id}"),
            env_id: id.to_string(),
        })
    }

    /// Whether this goes through a relay.
    pub fn is_relay(&self) -> bool {
        !self.env_id.is_empty()
    }
}

/// The environment link's URL: the relay's base URL (`ws://RELAY:PORT` or `wss://…`) with
/// `/v1/env/ID` appended.
pub fn environment_url(relay: &str, env_id: &str) -> Result<String, DialError> {
    check_env_id(env_id)?;
    let base = relay.trim_end_matches('/');
    let rest = base
        .strip_prefix("ws://")
        .or_else(|| base.strip_prefix("wss://"))
        .ok_or_else(|| {
            DialError::Url(format!(
                "unsupported --relay {relay:?}: expected ws://RELAY:PORT or wss://RELAY:PORT"
            ))
        })?;
    if rest.is_empty() || rest.contains(['?', '#', ' ']) {
        return Err(DialError::Url(format!("bad --relay {relay:?}")));
    }
    Ok(format!("{base}{ENV_PATH}{env_id}"))
}

/// Dial `ws_url` (`ws://` or `wss://`) within `deadline`, with the link's WebSocket settings
/// (a frame over the maximum is refused before it is buffered).
pub async fn dial(
    ws_url: &str,
    tls: &TlsRoots,
    deadline: Duration,
) -> Result<LinkSocket, DialError> {
    let tls = if ws_url.starts_with("wss://") {
        Some(tls.client_config()?)
    } else {
        None
    };
    // Frames are written in batches already: no Nagle delay for the last one.
    let connect = connect_link_socket(ws_url, link_websocket_config(), tls);
    match tokio::time::timeout(deadline, connect).await {
        Ok(Ok((ws, _))) => Ok(ws),
        Ok(Err(e)) => {
            // A certificate the dialer does not trust: its own words, not rustls' wrapping.
            let why = match &e {
                tokio_tungstenite::tungstenite::Error::Io(io) => {
                    super::trust::untrusted_certificate(io).map(|w| format!("TLS: {w}"))
                }
                _ => None,
            };
            Err(DialError::Connect {
                url: ws_url.to_string(),
                why: why.unwrap_or_else(|| crate::transport::websocket::handshake_error(&e)),
            })
        }
        Err(_) => Err(DialError::Timeout(ws_url.to_string(), deadline)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_forms() {
        let t = LinkTarget::parse("noise+ws://127.0.0.1:7000").unwrap();
        assert_eq!(t.ws_url, "ws://127.0.0.1:7000/v1/link");
        assert!(!t.is_relay());
        let t = LinkTarget::parse("relay+ws://relay.example:443/env-1").unwrap();
        assert_eq!(t.ws_url, "ws://relay.example:443/v1/connect/env-1");
        assert_eq!(t.env_id, "env-1");
        let t = LinkTarget::parse("relay+wss://r:8443/a.b_c/").unwrap();
        assert_eq!(t.ws_url, "wss://r:8443/v1/connect/a.b_c");
        for bad in [
            "relay+ws://r:1",
            "relay+ws://r:1/",
            "relay+ws://r:1/a/b",
            "relay+ws://r:1/a b",
            "relay+ws:///id",
            "ws://r:1",
            "noise+ws://",
        ] {
            assert!(LinkTarget::parse(bad).is_err(), "{bad}");
        }
        let long = "x".repeat(MAX_ROUTE_ID_BYTES);
        assert!(LinkTarget::parse(&format!("relay+ws://r:1/{long}")).is_ok());
        assert!(LinkTarget::parse(&format!("relay+ws://r:1/{long}x")).is_err());
    }

    #[test]
    fn environment_urls() {
        assert_eq!(
            environment_url("ws://r:9/", "e1").unwrap(),
            "ws://r:9/v1/env/e1"
        );
        assert_eq!(
            environment_url("wss://r:9", "e1").unwrap(),
            "wss://r:9/v1/env/e1"
        );
        assert!(environment_url("http://r:9", "e1").is_err());
        assert!(environment_url("ws://r:9", "").is_err());
        assert!(environment_url("ws://r:9", "a/b").is_err());
    }
}
