//! The HTTP front (`execrelay_io::http`) over real sockets: what plain requests get (`/readyz`,
//! `/metrics`, `403` for a cross-origin upgrade, `404`, `405`, `431`), WebSocket upgrades handed
//! to the caller, and every limit at its edge: head bytes, header fields, handshake slots, slots
//! per peer address, the total head deadline against trickling clients and the
//! reply bound; a TLS listener (`wss://`): its routes over TLS, plain text refused, a
//! stalled TLS handshake cut at the same head deadline, and a `wss://` JSON-RPC connection
//! (both ends of `execrelay::transport::websocket`) carrying messages of every size.
//!
//! Waits are on bytes and closes; wall-clock timeouts are hang guards only. Tests of deadlines
//! run on paused time.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::http::{header, StatusCode};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_util::sync::CancellationToken;

use execrelay::config::{
    ServerConfig, MAX_PENDING_HANDSHAKES, MAX_PENDING_HANDSHAKES_PER_ADDRESS,
    REQUEST_HEAD_TIMEOUT_MS,
};
use execrelay_io::http::{
    serve, Front, FrontLimits, Health, MetricsRenderer, PathPattern, Routes, Upgrade, UpgradeRoute,
    MAX_REQUEST_HEADERS, MAX_REQUEST_HEAD_BYTES,
};
use execrelay_io::tls::{CertificateFiles, TlsListener};

/// Hang guard on every wait.
const GUARD: Duration = Duration::from_secs(30);

const UPGRADE: &str = "GET /rpc HTTP/1.1\r\nHost: 127.0.0.1\r\n\
    Upgrade: websocket\r\nConnection: Upgrade\r\n\
    Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n";

async fn guard<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(GUARD, f)
        .await
        .unwrap_or_else(|_| panic!("hang guard: {what}"))
}

struct TestFront {
    addr: SocketAddr,
    upgrades: mpsc::UnboundedReceiver<Upgrade<&'static str>>,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
}

impl TestFront {
    /// A front upgrading `ws://` on any path, with `/readyz`, and `metrics` if given.
    async fn start(limits: FrontLimits, metrics: Option<MetricsRenderer>) -> TestFront {
        Self::start_with(limits, rpc_routes(metrics)).await
    }

    async fn start_with(limits: FrontLimits, routes: Routes<&'static str>) -> TestFront {
        Self::start_with_tls(limits, routes, None).await
    }

    async fn start_with_tls(
        limits: FrontLimits,
        routes: Routes<&'static str>,
        tls: Option<TlsListener>,
    ) -> TestFront {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (tx, upgrades) = mpsc::unbounded_channel();
        let shutdown = CancellationToken::new();
        let front = Front {
            routes,
            limits,
            websocket: WebSocketConfig::default(),
            on_upgrade: Arc::new(move |up| {
                let _ = tx.send(up);
            }),
            tls,
        };
        let task = tokio::spawn(serve(listener, front, shutdown.clone()));
        TestFront {
            addr,
            upgrades,
            shutdown,
            task,
        }
    }

    async fn stop(self) -> mpsc::UnboundedReceiver<Upgrade<&'static str>> {
        self.shutdown.cancel();
        guard("front stops", self.task).await.expect("front task");
        self.upgrades
    }
}

/// Upgrades on any path to the `rpc` route, `/readyz`, and `metrics` if given.
fn rpc_routes(metrics: Option<MetricsRenderer>) -> Routes<&'static str> {
    Routes {
        health: Health::always(),
        metrics,
        not_found_hint: None,
        upgrades: vec![UpgradeRoute {
            path: PathPattern::Any,
            route: "rpc",
            capacity: None,
        }],
    }
}

fn default_limits() -> FrontLimits {
    ServerConfig::default().websocket_front_limits()
}

/// Send `request`, read until the server closes; the response as text.
async fn exchange(addr: SocketAddr, request: &[u8]) -> String {
    let mut tcp = guard("connect", TcpStream::connect(addr))
        .await
        .expect("connect");
    guard("write", tcp.write_all(request)).await.expect("write");
    read_all(&mut tcp).await
}

/// Everything the server sends until it closes (a reset after some bytes counts as a close).
async fn read_all(tcp: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match guard("read", tcp.read(&mut chunk)).await {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&chunk[..n]),
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A connection from `source` (any 127.0.0.0/8 address is this machine).
async fn connect_from(source: &str, addr: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().expect("socket");
    socket
        .bind(format!("{source}:0").parse().expect("source"))
        .expect("bind source");
    guard("connect", socket.connect(addr))
        .await
        .expect("connect")
}

/// A WebSocket client upgrade from `source`; `Ok` once the 101 is read.
async fn ws_from(source: &str, addr: SocketAddr) -> Result<(), WsError> {
    let tcp = connect_from(source, addr).await;
    let url = format!("ws://{addr}/rpc");
    guard("upgrade", tokio_tungstenite::client_async(url, tcp))
        .await
        .map(|_| ())
}

/// A request head of exactly `len` bytes for `GET /readyz`.
fn readyz_head_of(len: usize) -> Vec<u8> {
    let start = b"GET /readyz HTTP/1.1\r\nX-Padding: ";
    let end = b"\r\n\r\n";
    let mut head = start.to_vec();
    head.resize(len - end.len(), b'a');
    head.extend_from_slice(end);
    assert_eq!(head.len(), len);
    head
}

#[tokio::test]
async fn readyz_is_200_other_paths_404_other_methods_405() {
    let front = TestFront::start(default_limits(), None).await;
    let r = exchange(front.addr, b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
    assert!(r.contains("Connection: close\r\n"), "{r}");
    assert!(r.ends_with("\r\n\r\nok\n"), "{r}");
    let r = exchange(front.addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(r.starts_with("HTTP/1.1 404 Not Found\r\n"), "{r}");
    let r = exchange(front.addr, b"POST /readyz HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(r.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"), "{r}");
    assert!(r.contains("Allow: GET\r\n"), "{r}");
    // A malformed head (a TLS client hello, say) is 400.
    let r = exchange(front.addr, b"\x16\x03\x01 not http\r\n\r\n").await;
    assert!(r.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{r}");
    assert!(front.stop().await.try_recv().is_err(), "nothing upgraded");
}

#[tokio::test]
async fn an_upgrade_with_an_origin_is_403_and_never_reaches_the_caller() {
    let front = TestFront::start(default_limits(), None).await;
    let request = format!("{UPGRADE}Origin: http://localhost:8080\r\n\r\n");
    let r = exchange(front.addr, request.as_bytes()).await;
    assert!(r.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{r}");

    // The same through a real client.
    let mut request =
        tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(format!(
            "ws://{}/",
            front.addr
        ))
        .expect("request");
    request.headers_mut().insert(
        header::ORIGIN,
        header::HeaderValue::from_static("https://evil.example"),
    );
    match guard("connect", tokio_tungstenite::connect_async(request)).await {
        Err(WsError::Http(response)) => assert_eq!(response.status(), StatusCode::FORBIDDEN),
        other => panic!("expected a 403, got {other:?}"),
    }
    assert!(front.stop().await.try_recv().is_err(), "nothing upgraded");
}

#[tokio::test]
async fn an_upgrade_is_handed_over_on_the_bare_stream_and_speaks_websocket() {
    let mut front = TestFront::start(default_limits(), None).await;
    // A head longer than one read of 4 KiB.
    let padding = "p".repeat(8 * 1024);
    let request = format!("{UPGRADE}X-Padding: {padding}\r\n\r\n");
    let mut tcp = TcpStream::connect(front.addr).await.expect("connect");
    tcp.write_all(request.as_bytes()).await.expect("write");
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        let n = guard("101", tcp.read(&mut byte)).await.expect("read");
        assert_eq!(n, 1, "closed during the handshake");
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 101 "), "{head}");
    // RFC 6455 §1.3's accept value for this key.
    assert!(
        head.contains("sec-websocket-accept: s3pplmbitxaq9kygzzhzrbk+xoo=\r\n"),
        "{head}"
    );
    assert!(!head.contains("close"), "a 101 must not say close: {head}");
    let mut up = guard("upgrade", front.upgrades.recv())
        .await
        .expect("handed over");
    assert_eq!(up.route, "rpc");
    assert!(up.peer.ip().is_loopback());
    // A masked text frame carrying "hi".
    let mask = [1u8, 2, 3, 4];
    let mut frame = vec![0x81, 0x80 | 2];
    frame.extend_from_slice(&mask);
    frame.extend_from_slice(&[b'h' ^ mask[0], b'i' ^ mask[1]]);
    tcp.write_all(&frame).await.expect("frame");
    match guard("message", up.ws.next()).await {
        Some(Ok(Message::Text(t))) => assert_eq!(t, "hi"),
        other => panic!("expected hi, got {other:?}"),
    }
    up.ws.send(Message::Text("yo".into())).await.expect("send");
    front.stop().await;
}

#[tokio::test]
async fn data_before_the_101_closes_the_connection() {
    let front = TestFront::start(default_limits(), None).await;
    let mut request = format!("{UPGRADE}\r\n").into_bytes();
    request.extend_from_slice(&[0x81, 0x80, 1, 2, 3, 4]);
    let r = exchange(front.addr, &request).await;
    assert!(r.starts_with("HTTP/1.1 101 "), "{r}");
    assert!(front.stop().await.try_recv().is_err(), "not handed over");
}

#[tokio::test]
async fn the_request_head_limit_holds_at_its_edge() {
    let front = TestFront::start(default_limits(), None).await;
    let r = exchange(front.addr, &readyz_head_of(MAX_REQUEST_HEAD_BYTES)).await;
    assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "at the limit: {r}");
    let r = exchange(front.addr, &readyz_head_of(MAX_REQUEST_HEAD_BYTES + 1)).await;
    assert!(
        r.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"),
        "one over: {r}"
    );
    // Far over, sent at once: the 431 still arrives (the rest is drained, not reset).
    let r = exchange(front.addr, &readyz_head_of(MAX_REQUEST_HEAD_BYTES + 20_000)).await;
    assert!(r.starts_with("HTTP/1.1 431 "), "far over: {r}");
    front.stop().await;
}

#[tokio::test]
async fn the_header_count_limit_holds_at_its_edge() {
    let front = TestFront::start(default_limits(), None).await;
    let with = |n: usize| {
        let mut head = String::from("GET /readyz HTTP/1.1\r\n");
        for i in 0..n {
            head.push_str(&format!("X-{i}: y\r\n"));
        }
        head.push_str("\r\n");
        head
    };
    let r = exchange(front.addr, with(MAX_REQUEST_HEADERS).as_bytes()).await;
    assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "at the limit: {r}");
    let r = exchange(front.addr, with(MAX_REQUEST_HEADERS + 1).as_bytes()).await;
    assert!(r.starts_with("HTTP/1.1 431 "), "one over: {r}");
    front.stop().await;
}

#[tokio::test]
async fn handshake_slots_are_capped_and_freed() {
    let limits = FrontLimits {
        pending: 2,
        pending_per_address: 2,
        ..default_limits()
    };
    let front = TestFront::start(limits, None).await;
    // Two connections that have not sent their head hold both slots (accepted in order).
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(TcpStream::connect(front.addr).await.expect("connect"));
    }
    // One more is closed without an answer.
    let r = exchange(front.addr, b"GET /readyz HTTP/1.1\r\n\r\n").await;
    assert_eq!(r, "", "over the cap: no reply");
    // The held ones are live: each is answered when its head arrives...
    for mut tcp in held {
        tcp.write_all(b"GET /readyz HTTP/1.1\r\n\r\n")
            .await
            .expect("write");
        assert!(read_all(&mut tcp).await.starts_with("HTTP/1.1 200 "));
    }
    // ...and their slots are free again.
    let r = exchange(front.addr, b"GET /readyz HTTP/1.1\r\n\r\n").await;
    assert!(r.starts_with("HTTP/1.1 200 "), "{r}");
    front.stop().await;
}

/// 300 connections from one address trickling their heads do not keep a
/// client from another address out; with the per-address cap as large as the listener's
/// slots, they do (so the cap, not luck, lets the client in).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hundred_tricklers_from_one_address_do_not_lock_others_out() {
    const TRICKLERS: usize = 300;
    const { assert!(MAX_PENDING_HANDSHAKES < TRICKLERS) };
    for capped in [true, false] {
        let limits = FrontLimits {
            pending_per_address: if capped {
                MAX_PENDING_HANDSHAKES_PER_ADDRESS
            } else {
                MAX_PENDING_HANDSHAKES
            },
            ..default_limits()
        };
        let front = TestFront::start(limits, None).await;
        let mut tricklers = Vec::new();
        for _ in 0..TRICKLERS {
            let mut tcp = connect_from("127.0.0.2", front.addr).await;
            // The start of a head, never finished.
            let _ = tcp.write_all(b"GET / HTTP/1.1\r\nX: ").await;
            tricklers.push(tcp);
        }
        // The server accepts in order: the tricklers were all taken (or refused) before this.
        let legit = ws_from("127.0.0.1", front.addr).await;
        if capped {
            legit.expect("a client from another address gets through");
            // Those over the address's cap were closed at once; the first ones are held.
            for tcp in &mut tricklers[MAX_PENDING_HANDSHAKES_PER_ADDRESS..] {
                assert_eq!(read_all(tcp).await, "", "closed without a reply");
            }
            let mut probe = [0u8; 1];
            for tcp in &tricklers[..MAX_PENDING_HANDSHAKES_PER_ADDRESS] {
                assert!(
                    matches!(tcp.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
                    "a trickler within the cap is still held"
                );
            }
        } else {
            assert!(legit.is_err(), "without the cap, the slots are all taken");
        }
        front.stop().await;
    }
}

/// The head deadline is fixed at accept: a client that keeps sending a byte well within any
/// per-read timeout is still cut at it, and once the trickle is cut, the same address gets
/// through on the same listener.
#[tokio::test(start_paused = true)]
async fn a_trickled_head_is_cut_at_the_deadline_and_the_address_gets_back_in() {
    let limits = FrontLimits {
        pending_per_address: 4,
        ..default_limits()
    };
    let deadline = Duration::from_millis(REQUEST_HEAD_TIMEOUT_MS);
    assert_eq!(limits.head_timeout, deadline);
    let front = TestFront::start(limits, None).await;
    let mut tricklers = Vec::new();
    for _ in 0..4 {
        let tcp = TcpStream::connect(front.addr).await.expect("connect");
        tricklers.push(tokio::spawn(trickle(tcp)));
    }
    // The address is at its cap: one more is closed unanswered.
    let r = exchange(front.addr, b"GET /readyz HTTP/1.1\r\n\r\n").await;
    assert_eq!(r, "", "over the address's cap");
    // Each trickler is cut although it never stopped sending.
    for t in tricklers {
        let (sent, response) = guard("trickler cut", t).await.expect("trickler");
        assert_eq!(response, "", "cut without a reply");
        // One byte per 100 ms: far more than the deadline's worth were sent (or tried).
        assert!(
            sent as u128 >= deadline.as_millis() / 100 / 2,
            "sent {sent}"
        );
    }
    let r = exchange(front.addr, b"GET /readyz HTTP/1.1\r\n\r\n").await;
    assert!(r.starts_with("HTTP/1.1 200 "), "after the trickle: {r}");
    front.stop().await;
}

/// Sends a head that never ends, one byte per 100 ms, until the server closes; how many bytes
/// it sent and what it received.
async fn trickle(mut tcp: TcpStream) -> (usize, String) {
    let mut sent = 0;
    let mut bytes = b"GET /readyz HTTP/1.1\r\nX: "
        .iter()
        .chain(std::iter::repeat(&b'a'));
    let mut buf = [0u8; 1024];
    let mut received = Vec::new();
    loop {
        tokio::select! {
            read = tcp.read(&mut buf) => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => received.extend_from_slice(&buf[..n]),
            },
            () = tokio::time::sleep(Duration::from_millis(100)) => {
                let byte = [*bytes.next().unwrap_or(&b'a')];
                if tcp.write_all(&byte).await.is_err() {
                    break;
                }
                sent += 1;
            }
        }
    }
    (sent, String::from_utf8_lossy(&received).into_owned())
}

/// A scraper that does not read a large reply loses its connection (and slot) at the reply
/// bound instead of holding it.
#[tokio::test(start_paused = true)]
async fn a_reply_the_peer_does_not_read_is_abandoned_at_its_bound() {
    const BODY: usize = 32 * 1024 * 1024;
    let render: MetricsRenderer = Arc::new(|| "m".repeat(BODY));
    let limits = FrontLimits {
        pending: 1,
        pending_per_address: 1,
        ..default_limits()
    };
    let front = TestFront::start(limits, Some(render)).await;
    let mut slow = TcpStream::connect(front.addr).await.expect("connect");
    slow.write_all(b"GET /metrics HTTP/1.1\r\n\r\n")
        .await
        .expect("write");
    // Not reading: the server's write blocks on full socket buffers until the bound.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let got = read_all(&mut slow).await;
    assert!(got.starts_with("HTTP/1.1 200 "), "the reply had started");
    assert!(got.len() < BODY, "cut before the end: {} bytes", got.len());
    // The only slot is free again.
    let r = exchange(front.addr, b"GET /metrics HTTP/1.1\r\n\r\n").await;
    assert!(r.starts_with("HTTP/1.1 200 "));
    front.stop().await;
}

#[tokio::test]
async fn routes_with_ids_and_exact_paths() {
    let routes = Routes {
        health: None,
        metrics: None,
        not_found_hint: None,
        upgrades: vec![
            UpgradeRoute {
                path: PathPattern::Exact("/v1/link"),
                route: "link",
                capacity: None,
            },
            UpgradeRoute {
                path: PathPattern::WithId("/v1/env/"),
                route: "env",
                capacity: None,
            },
        ],
    };
    let mut front = TestFront::start_with(default_limits(), routes).await;
    let (_ws, _) = guard(
        "env upgrade",
        tokio_tungstenite::connect_async(format!("ws://{}/v1/env/abc-1", front.addr)),
    )
    .await
    .expect("upgrade");
    let up = guard("handed over", front.upgrades.recv())
        .await
        .expect("upgrade");
    assert_eq!((up.route, up.id.as_deref()), ("env", Some("abc-1")));
    match guard(
        "wrong path",
        tokio_tungstenite::connect_async(format!("ws://{}/v1/other", front.addr)),
    )
    .await
    {
        Err(WsError::Http(response)) => assert_eq!(response.status(), StatusCode::NOT_FOUND),
        other => panic!("expected a 404, got {other:?}"),
    }
    // readyz is off on this listener.
    let r = exchange(front.addr, b"GET /readyz HTTP/1.1\r\n\r\n").await;
    assert!(r.starts_with("HTTP/1.1 404 "), "{r}");
    front.stop().await;
}

#[tokio::test]
async fn shutdown_stops_listening_and_abandons_stalled_handshakes() {
    let front = TestFront::start(default_limits(), None).await;
    let addr = front.addr;
    let mut stalled = TcpStream::connect(addr).await.expect("connect");
    stalled
        .write_all(b"GET / HTTP/1.1\r\n")
        .await
        .expect("write");
    front.stop().await;
    assert_eq!(read_all(&mut stalled).await, "");
    assert!(TcpStream::connect(addr).await.is_err());
}

/// A TLS listener with a fresh self-signed certificate for `localhost` in `dir`, and the
/// certificate's path (a client pins it as its `--ca-file`).
fn tls_listener(dir: &std::path::Path) -> (TlsListener, std::path::PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .expect("params")
        .self_signed(&key)
        .expect("certificate");
    let files = CertificateFiles {
        cert: dir.join("cert.pem"),
        key: dir.join("key.pem"),
    };
    std::fs::write(&files.cert, cert.pem()).expect("write");
    std::fs::write(&files.key, key.serialize_pem()).expect("write");
    std::fs::set_permissions(&files.key, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let cert = files.cert.clone();
    (TlsListener::new(files).expect("TLS listener"), cert)
}

fn health_routes() -> Routes<&'static str> {
    Routes {
        health: Health::always(),
        metrics: None,
        not_found_hint: None,
        upgrades: Vec::new(),
    }
}

#[tokio::test]
async fn a_tls_listener_serves_its_routes_over_tls_and_refuses_plain_text() {
    let dir = tempfile::tempdir().expect("dir");
    let (tls, cert) = tls_listener(dir.path());
    let store = tls.store().clone();
    let front = TestFront::start_with_tls(default_limits(), health_routes(), Some(tls)).await;

    let config = execrelay::link::dial::TlsRoots::CaFile(cert)
        .client_config()
        .expect("client config");
    let tcp = guard("connect", TcpStream::connect(front.addr))
        .await
        .expect("connect");
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let mut tls = guard(
        "TLS handshake",
        tokio_rustls::TlsConnector::from(config).connect(name, tcp),
    )
    .await
    .expect("TLS handshake");
    guard(
        "write",
        tls.write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n"),
    )
    .await
    .expect("write");
    let mut reply = Vec::new();
    // The server closes after its reply (a missing close_notify is not an error here).
    let _ = guard("read", tls.read_to_end(&mut reply)).await;
    let reply = String::from_utf8_lossy(&reply);
    assert!(
        reply.starts_with("HTTP/1.1 200 ") && reply.ends_with("ok\n"),
        "{reply}"
    );

    // Plain HTTP to a TLS listener gets no HTTP answer: the handshake fails, the socket closes.
    let r = exchange(front.addr, b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(!r.contains("HTTP/1.1"), "{r}");
    let figures = store.figures();
    assert_eq!((figures.handshakes, figures.handshake_failures), (1, 1));
    front.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_stalled_tls_handshake_is_cut_at_the_head_deadline() {
    let dir = tempfile::tempdir().expect("dir");
    let (tls, _) = tls_listener(dir.path());
    let store = tls.store().clone();
    let limits = default_limits();
    let head_timeout = limits.head_timeout;
    let front = TestFront::start_with_tls(limits, health_routes(), Some(tls)).await;
    let started = tokio::time::Instant::now();
    let mut tcp = TcpStream::connect(front.addr).await.expect("connect");
    // No ClientHello: the server closes at the head deadline, not before.
    let got = read_all(&mut tcp).await;
    assert_eq!(got, "");
    assert!(started.elapsed() >= head_timeout, "{:?}", started.elapsed());
    assert_eq!(store.figures().handshake_failures, 1);
    front.stop().await;
}

/// A `wss://` JSON-RPC connection: the client dials through its rustls config (the pinned
/// certificate), the server frames the front's upgrade, and both ends read with the crate's
/// own codec over TLS. Messages on both sides of a read's size arrive whole and in order, both
/// ways; without a TLS config a `wss://` URL is refused with words that say so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wss_json_rpc_connection_carries_messages_of_every_size_both_ways() {
    use execrelay::transport::websocket::{connect_websocket, connect_websocket_with_tls, framed};
    use execrelay::transport::FramingError;
    use execrelay_protocol::websocket::Role;
    const LIMIT: usize = 1 << 20;
    let dir = tempfile::tempdir().expect("dir");
    let (tls, cert) = tls_listener(dir.path());
    let mut front = TestFront::start_with_tls(default_limits(), rpc_routes(None), Some(tls)).await;
    let url = format!("wss://localhost:{}/", front.addr.port());

    match guard("refused", connect_websocket(&url, LIMIT)).await {
        Err(FramingError::Protocol(why)) => assert!(why.contains("TLS"), "{why}"),
        Err(other) => panic!("expected a protocol error naming TLS, got {other:?}"),
        Ok(_) => panic!("a wss:// URL was dialled without a TLS configuration"),
    }

    let config = execrelay::link::dial::TlsRoots::CaFile(cert)
        .client_config()
        .expect("client config");
    let mut client = guard(
        "connect",
        connect_websocket_with_tls(&url, LIMIT, Some(config)),
    )
    .await
    .expect("wss:// connect");
    let up = guard("upgrade", front.upgrades.recv())
        .await
        .expect("an upgrade");
    let mut server = framed(up.ws, Role::Server, LIMIT, up.peer.to_string());

    let sizes = [1usize, 125, 126, 65_535, 65_536, 200_000, LIMIT];
    let message = |i: usize, len: usize| -> String {
        (0..len)
            .map(|j| (b'a' + ((i + j) % 26) as u8) as char)
            .collect()
    };
    for (i, &len) in sizes.iter().enumerate() {
        guard("client send", client.outgoing.send(message(i, len).into()))
            .await
            .expect("client send");
    }
    for (i, &len) in sizes.iter().enumerate() {
        let got = guard("server receive", server.incoming.next())
            .await
            .expect("a message")
            .expect("framed");
        assert_eq!(got, message(i, len).as_bytes(), "message {i} to the server");
    }
    for (i, &len) in sizes.iter().enumerate().rev() {
        guard("server send", server.outgoing.send(message(i, len).into()))
            .await
            .expect("server send");
    }
    for (i, &len) in sizes.iter().enumerate().rev() {
        let got = guard("client receive", client.incoming.next())
            .await
            .expect("a message")
            .expect("framed");
        assert_eq!(got, message(i, len).as_bytes(), "message {i} to the client");
    }
    guard("close", client.outgoing.close())
        .await
        .expect("close");
    assert!(guard("server sees the close", server.incoming.next())
        .await
        .is_none());
    front.stop().await;
}
