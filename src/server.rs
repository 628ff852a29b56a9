//! Listeners and server lifecycle: `stdio` (one connection, then exit) and `ws://` (one
//! connection per WebSocket), with graceful shutdown.
//!
//! Thin: parses the listen address, owns the [`SessionRegistry`], and hands every framed
//! connection to a [`ConnectionProcessor`]. Prints the bound URL as the first line of stdout.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{ServerConfig, SHUTDOWN_DELIVERY_GRACE_MS};
use crate::connection::{ConnectionEnd, ConnectionOptions, ConnectionProcessor};
use crate::metrics::Metrics;
use crate::session::SessionRegistry;
use crate::transport::stdio::stdio_transport;
use crate::transport::websocket::serve_websocket;

/// Where to listen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    /// The server's own stdin/stdout.
    Stdio,
    /// Plain WebSocket.
    Ws(SocketAddr),
    /// Noise-encrypted physical links (`/v1/link`).
    Noise(SocketAddr),
}

/// A listen address that cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ListenError {
    /// Not `stdio`, `ws://HOST:PORT` nor `noise+ws://HOST:PORT`.
    #[error("unsupported --listen {0:?}: expected stdio, ws://HOST:PORT or noise+ws://HOST:PORT")]
    Unsupported(String),
    /// Plain text off loopback without the danger flag.
    #[error(
        "refusing to serve plain ws:// on non-loopback address {0}: use a loopback address, or pass --danger-plaintext if you really mean it"
    )]
    NotLoopback(SocketAddr),
}

/// Parse `--listen`. A non-loopback plain address is refused unless `danger_plaintext`.
pub fn parse_listen(s: &str, danger_plaintext: bool) -> Result<ListenAddr, ListenError> {
    if s == "stdio" {
        return Ok(ListenAddr::Stdio);
    }
    if let Some(rest) = s.strip_prefix("noise+ws://") {
        let addr: SocketAddr = rest
            .trim_end_matches('/')
            .replace("localhost", "127.0.0.1")
            .parse()
            .map_err(|_| ListenError::Unsupported(s.to_string()))?;
        // Encrypted and authenticated: any address is fine.
        return Ok(ListenAddr::Noise(addr));
    }
    let rest = s
        .strip_prefix("ws://")
        .ok_or_else(|| ListenError::Unsupported(s.to_string()))?;
    let hostport = rest.trim_end_matches('/');
    let addr: SocketAddr = hostport
        .replace("localhost", "127.0.0.1")
        .parse()
        .map_err(|_| ListenError::Unsupported(s.to_string()))?;
    if !addr.ip().is_loopback() && !danger_plaintext {
        return Err(ListenError::NotLoopback(addr));
    }
    Ok(ListenAddr::Ws(addr))
}

/// Serve one connection on stdin/stdout; when it ends, terminate every process and return.
pub async fn run_stdio(config: Arc<ServerConfig>, shutdown: CancellationToken) -> ConnectionEnd {
    let registry = SessionRegistry::new(config, Arc::new(Metrics::new()));
    run_stdio_with_registry(registry, shutdown).await
}

/// [`run_stdio`] with a caller-supplied registry (the metrics endpoint reads it too).
///
/// On `shutdown` (SIGTERM, SIGINT) the processes are terminated first and their exit notices
/// written to stdout (bounded, as for WebSocket connections); only then does the connection
/// end.
pub async fn run_stdio_with_registry(
    registry: Arc<SessionRegistry>,
    shutdown: CancellationToken,
) -> ConnectionEnd {
    let config = registry.config().clone();
    let transport = stdio_transport(config.max_message_bytes);
    let conn_stop = CancellationToken::new();
    let mut conn = tokio::spawn(ConnectionProcessor::run(
        transport,
        registry.clone(),
        ConnectionOptions {
            close_session_on_end: true,
            peer_key: None,
            answer_after_eof: true,
        },
        conn_stop.clone(),
    ));
    let joined = tokio::select! {
        end = &mut conn => end,
        _ = shutdown.cancelled() => {
            tracing::info!("shutting down: terminating processes");
            registry
                .shutdown(Duration::from_millis(SHUTDOWN_DELIVERY_GRACE_MS))
                .await;
            conn_stop.cancel();
            conn.await
        }
    };
    registry.close_all();
    // The processor does not panic on peer input; a panic elsewhere still ends the connection.
    joined.unwrap_or(ConnectionEnd::Shutdown)
}

/// Serve plain WebSocket connections on `listener` until `shutdown` fires, then terminate
/// every process, let exit notices reach attached clients (bounded), and return.
pub async fn run_ws(
    listener: TcpListener,
    config: Arc<ServerConfig>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let registry = SessionRegistry::new(config.clone(), Arc::new(Metrics::new()));
    run_ws_with_registry(listener, registry, shutdown).await
}

/// [`run_ws`] with a caller-supplied registry (tests and the metrics endpoint read it).
pub async fn run_ws_with_registry(
    listener: TcpListener,
    registry: Arc<SessionRegistry>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let conn_shutdown = CancellationToken::new();
    let accept_stop = shutdown.clone();
    let reg = registry.clone();
    let cs = conn_shutdown.clone();
    let max = registry.config().max_message_bytes;
    let tracker = TaskTracker::new();
    let t = tracker.clone();
    serve_websocket(listener, max, accept_stop, move |transport| {
        let reg = reg.clone();
        let cs = cs.clone();
        t.spawn(async move {
            ConnectionProcessor::run(transport, reg, ConnectionOptions::default(), cs).await;
        });
    })
    .await;
    tracing::info!("shutting down: terminating processes");
    registry
        .shutdown(Duration::from_millis(SHUTDOWN_DELIVERY_GRACE_MS))
        .await;
    // Exit notices are written; let every connection flush and close before returning.
    conn_shutdown.cancel();
    tracker.close();
    tracker.wait().await;
    Ok(())
}

/// The URL to print for a bound listener.
pub fn bound_url(addr: SocketAddr) -> String {
    format!("ws://{addr}")
}

/// The URL to print for a bound Noise listener.
pub fn bound_noise_url(addr: SocketAddr) -> String {
    format!("noise+ws://{addr}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses() {
        assert_eq!(parse_listen("stdio", false).unwrap(), ListenAddr::Stdio);
        assert!(matches!(
            parse_listen("ws://127.0.0.1:0", false).unwrap(),
            ListenAddr::Ws(_)
        ));
        assert!(matches!(
            parse_listen("ws://0.0.0.0:80", false),
            Err(ListenError::NotLoopback(_))
        ));
        assert!(parse_listen("ws://0.0.0.0:80", true).is_ok());
        assert!(parse_listen("tcp://127.0.0.1:1", false).is_err());
    }
}
