//! The operators' metrics endpoint (`--metrics-listen ADDR`, `GET /metrics`): a plain HTTP/1.1
//! listener that answers `GET /metrics` with the [`Metrics`](crate::metrics::Metrics) text and
//! closes, under the same request-head limits as the WebSocket gate, a deadline per request,
//! and a cap on concurrent scrapes.
//!
//! A temporary top-level module (layer 6, beside `server`): it reads the session registry at
//! scrape time, so it cannot live in the `metrics` leaf. It is to be replaced by the one HTTP
//! front (issue 8, item 4).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::session::SessionRegistry;
use crate::transport::http_gate::{self, HeadError, Reply};

/// The scrape path.
pub const METRICS_PATH: &str = "/metrics";
/// Scrapes served at once; more connections are closed at once. A Prometheus server scrapes
/// one at a time; a few spare slots let an operator's `curl` in beside it.
pub const MAX_METRICS_CONNECTIONS: usize = 8;
/// A scrape's request head must arrive within this time: a client that connects and says
/// nothing does not hold a slot. Writing the response and closing are bounded by the HTTP
/// gate's close grace (1 s), as for every plain HTTP reply.
pub const METRICS_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The content type of the OpenMetrics text format, which Prometheus negotiates.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Bind the metrics listener.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Serve `GET /metrics` on `listener` until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    registry: Arc<SessionRegistry>,
    shutdown: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(MAX_METRICS_CONNECTIONS));
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => return,
            a = listener.accept() => a,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of descriptors and the like: do not spin.
                tracing::warn!(error = %e, "metrics accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            tracing::debug!(%peer, "metrics: too many scrapes at once, closing");
            continue;
        };
        let reg = registry.clone();
        tokio::spawn(async move {
            let _permit = permit;
            scrape(stream, &reg).await;
        });
    }
}

/// What a request to the metrics listener gets.
fn route(method: &str, path: &str) -> Option<Reply> {
    let path = path.split_once('?').map_or(path, |(p, _)| p);
    match (path == METRICS_PATH, method == "GET") {
        (true, true) => None,
        (true, false) => Some(Reply::MethodNotAllowed),
        (false, _) => Some(Reply::NotFound),
    }
}

async fn scrape(mut stream: TcpStream, registry: &SessionRegistry) {
    let head = tokio::time::timeout(
        METRICS_REQUEST_TIMEOUT,
        http_gate::read_request_head(&mut stream),
    )
    .await;
    let reply = match head {
        Err(_) | Ok(Err(HeadError::Closed)) | Ok(Err(HeadError::Io(_))) => return,
        Ok(Err(HeadError::TooLarge)) => Some(Reply::HeadTooLarge),
        Ok(Err(HeadError::Malformed(_))) => Some(Reply::BadRequest),
        Ok(Ok((_, head))) => route(&head.method, &head.path),
    };
    match reply {
        Some(r) => http_gate::reply_and_close(stream, r).await,
        None => {
            let body = registry.metrics().render(&registry.stats());
            let response = http_gate::response(
                "200 OK",
                &format!("Content-Type: {CONTENT_TYPE}\r\n"),
                &body,
            );
            // Bounded by the gate's close grace, like every plain HTTP reply.
            http_gate::send_and_close(stream, response.as_bytes()).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert_eq!(route("GET", "/metrics"), None);
        assert_eq!(route("GET", "/metrics?x=1"), None);
        assert_eq!(route("POST", "/metrics"), Some(Reply::MethodNotAllowed));
        assert_eq!(route("GET", "/"), Some(Reply::NotFound));
        assert_eq!(route("GET", "/metricsx"), Some(Reply::NotFound));
    }

    /// A client that connects and says nothing loses its slot after the request timeout.
    #[tokio::test(start_paused = true)]
    async fn a_silent_scraper_frees_its_slot_at_the_timeout() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let registry = SessionRegistry::new(
            Arc::new(crate::config::ServerConfig::default()),
            Arc::new(crate::metrics::Metrics::new()),
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        tokio::spawn(serve(listener, registry, stop.clone()));
        let t0 = tokio::time::Instant::now();
        let mut held = Vec::new();
        for _ in 0..MAX_METRICS_CONNECTIONS {
            held.push(TcpStream::connect(addr).await.unwrap());
        }
        for s in &mut held {
            let mut buf = Vec::new();
            assert_eq!(
                s.read_to_end(&mut buf).await.unwrap(),
                0,
                "closed, no reply"
            );
        }
        assert!(t0.elapsed() >= METRICS_REQUEST_TIMEOUT);
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").await.unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.unwrap();
        assert!(out.starts_with(b"HTTP/1.1 200 OK\r\n"));
        stop.cancel();
    }
}
