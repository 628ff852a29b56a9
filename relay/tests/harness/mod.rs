//! Harness of the relay server's tests: a relay in-process on real sockets, fake environments
//! and clients on the engine's `EndpointLink` (payloads are opaque: the relay never reads
//! them), raw links for hand-written frames, metrics over HTTP, and the relay's log captured.
#![allow(dead_code)]

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use execrelay_io::driver::{
    link_websocket_config, recv_frame, send_frame, EndpointLink, Incoming, ReadAhead, StreamHandle,
};
use execrelay_protocol::config::EndpointConfig;
use execrelay_protocol::env_handshake::{EnvironmentHandshake, LinkRefusal};
use execrelay_protocol::frame::{Frame, FrameType, StreamId};
use execrelay_protocol::keys::environments::EnvironmentsFile;
use execrelay_protocol::keys::{public_line, Keypair};
use execrelay_relay::server::settings::RelaySettings;
use execrelay_relay::server::{RelayServer, RelayServerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;
use tokio_util::sync::CancellationToken;

/// Hang guard on every wait: generous, only fires if a test would hang.
pub const GUARD: Duration = Duration::from_secs(30);

pub async fn guard<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(GUARD, f)
        .await
        .unwrap_or_else(|_| panic!("hang guard: {what}"))
}

pub type Ws = WebSocketStream<ReadAhead<TcpStream>>;

/// The relay's log, captured for this test's thread (the runtime is current-thread).
#[derive(Clone, Default)]
pub struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    /// Wait until the log holds every one of `needles` on one line.
    pub async fn wait_for(&self, needles: &[&str]) -> String {
        let deadline = tokio::time::Instant::now() + GUARD;
        loop {
            let text = self.text();
            if let Some(line) = text.lines().find(|l| needles.iter().all(|n| l.contains(n))) {
                return line.to_string();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no log line with {needles:?} in:\n{text}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Capture `tracing` output of this thread until the guard drops.
pub fn capture_logs() -> (Logs, tracing::subscriber::DefaultGuard) {
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("debug"))
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    (logs, tracing::subscriber::set_default(subscriber))
}

static TS: AtomicU64 = AtomicU64::new(0);

/// A fresh message-1 `ts`: now, strictly above every earlier one of this process.
pub fn next_ts() -> u64 {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    let prev = TS.fetch_max(now, Ordering::SeqCst);
    if prev >= now {
        TS.fetch_add(1, Ordering::SeqCst) + 1
    } else {
        now
    }
}

/// A relay running in this test's runtime.
pub struct Relay {
    pub addr: SocketAddr,
    pub metrics: SocketAddr,
    pub keys: Keypair,
    pub dir: tempfile::TempDir,
    pub environments: PathBuf,
    pub shutdown: CancellationToken,
    pub task: JoinHandle<()>,
}

/// Test settings: the environments file polled every 20 ms.
pub fn settings() -> RelaySettings {
    RelaySettings {
        environments_poll_ms: 20,
        ..RelaySettings::default()
    }
}

pub fn environments_text(entries: &[(&str, &Keypair)]) -> String {
    entries
        .iter()
        .map(|(id, kp)| format!("{id} {}\n", public_line(&kp.public, "test")))
        .collect()
}

impl Relay {
    pub async fn start(settings: RelaySettings, entries: &[(&str, &Keypair)]) -> Relay {
        Relay::start_with(settings, entries, Keypair::generate().unwrap()).await
    }

    /// [`Relay::start`] with the relay's key `keys` (a restarted relay keeps its key).
    pub async fn start_with(
        settings: RelaySettings,
        entries: &[(&str, &Keypair)],
        keys: Keypair,
    ) -> Relay {
        Relay::start_inner(settings, entries, keys, None, None).await
    }

    /// [`Relay::start`] with its links on `runtimes` (as the binary runs them); the test
    /// stops `runtimes` after the relay.
    pub async fn start_on(
        settings: RelaySettings,
        entries: &[(&str, &Keypair)],
        runtimes: execrelay_io::runtimes::LinkRuntimes,
    ) -> Relay {
        Relay::start_inner(
            settings,
            entries,
            Keypair::generate().unwrap(),
            Some(runtimes),
            None,
        )
        .await
    }

    /// [`Relay::start_on`] speaking TLS on its links' listener (`wss://`) with `tls`.
    pub async fn start_tls_on(
        settings: RelaySettings,
        entries: &[(&str, &Keypair)],
        runtimes: execrelay_io::runtimes::LinkRuntimes,
        tls: execrelay_io::tls::TlsListener,
    ) -> Relay {
        Relay::start_inner(
            settings,
            entries,
            Keypair::generate().unwrap(),
            Some(runtimes),
            Some(tls),
        )
        .await
    }

    async fn start_inner(
        settings: RelaySettings,
        entries: &[(&str, &Keypair)],
        keys: Keypair,
        runtimes: Option<execrelay_io::runtimes::LinkRuntimes>,
        tls: Option<execrelay_io::tls::TlsListener>,
    ) -> Relay {
        let dir = tempfile::tempdir().unwrap();
        let environments = dir.path().join("environments");
        std::fs::write(&environments, environments_text(entries)).unwrap();
        let server = RelayServer::new(RelayServerConfig {
            keys: keys.clone(),
            environments: EnvironmentsFile::load(&environments).unwrap(),
            settings,
        })
        .unwrap();
        let server = match runtimes {
            Some(r) => server.with_runtimes(r),
            None => server,
        };
        let server = match tls {
            Some(t) => server.with_tls(t),
            None => server,
        };
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let metrics_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (addr, metrics) = (
            listener.local_addr().unwrap(),
            metrics_listener.local_addr().unwrap(),
        );
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(server.run(listener, Some(metrics_listener), shutdown.clone()));
        Relay {
            addr,
            metrics,
            keys,
            dir,
            environments,
            shutdown,
            task,
        }
    }

    /// Rewrite the environments file the way editors do (a new file renamed over it).
    pub fn write_environments(&self, entries: &[(&str, &Keypair)]) {
        let tmp = self.dir.path().join("environments.new");
        std::fs::write(&tmp, environments_text(entries)).unwrap();
        std::fs::rename(&tmp, &self.environments).unwrap();
    }

    /// A WebSocket to `path` on the relay.
    pub async fn ws(&self, path: &str) -> Ws {
        connect(self.addr, path).await
    }

    /// The metrics text.
    pub async fn metrics(&self) -> String {
        let (status, body) = http_get(self.metrics, "/metrics").await;
        assert_eq!(status, 200, "{body}");
        body
    }

    /// One metric's value (`name{labels}` exactly as rendered), 0 if absent.
    pub async fn metric(&self, series: &str) -> u64 {
        metric_of(&self.metrics().await, series)
    }

    /// Wait until `series` reaches at least `at_least`; its value.
    pub async fn wait_metric(&self, series: &str, at_least: u64) -> u64 {
        let deadline = tokio::time::Instant::now() + GUARD;
        loop {
            let text = self.metrics().await;
            let v = metric_of(&text, series);
            if v >= at_least {
                return v;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{series} stayed below {at_least} in:\n{text}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub async fn stop(self) {
        self.shutdown.cancel();
        guard("relay stops", self.task).await.unwrap();
    }
}

pub fn metric_of(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.trim().parse::<f64>().unwrap() as u64)
        .unwrap_or(0)
}

pub async fn connect(addr: SocketAddr, path: &str) -> Ws {
    let tcp = guard("connect", TcpStream::connect(addr)).await.unwrap();
    let (ws, _) = guard(
        "upgrade",
        tokio_tungstenite::client_async_with_config(
            format!("ws://{addr}{path}"),
            ReadAhead::websocket_client(tcp),
            Some(link_websocket_config()),
        ),
    )
    .await
    .unwrap();
    ws
}

/// A WebSocket to the relay from `source` (another loopback address: another peer address).
pub async fn ws_from(source: std::net::Ipv4Addr, relay: &Relay, path: &str) -> Ws {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket
        .bind(std::net::SocketAddr::from((source, 0)))
        .unwrap();
    let tcp = guard("connect", socket.connect(relay.addr)).await.unwrap();
    let (ws, _) = guard(
        "upgrade",
        tokio_tungstenite::client_async_with_config(
            format!("ws://{}{path}", relay.addr),
            ReadAhead::websocket_client(tcp),
            Some(execrelay_io::driver::link_websocket_config()),
        ),
    )
    .await
    .unwrap();
    ws
}

/// `GET path` with `Connection: close`: (status, body).
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut tcp = guard("connect", TcpStream::connect(addr)).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: relay\r\nConnection: close\r\n\r\n");
    tcp.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    guard("http reply", tcp.read_to_end(&mut out))
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

/// The environment side of the link handshake over `ws` (already at `/v1/env/ID`).
pub async fn env_handshake<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    ws: &mut WebSocketStream<ReadAhead<S>>,
    keys: &Keypair,
    relay_public: &[u8; 32],
    id: &str,
    ts: u64,
) -> Result<(), LinkRefusal> {
    let (hs, open) = EnvironmentHandshake::start(keys, relay_public, id, ts).unwrap();
    send_frame(ws, &open, GUARD).await.unwrap();
    let answer = recv_frame(ws, GUARD).await.expect("the relay's answer");
    hs.finish(&answer).map(|_| ())
}

/// An environment link up on the relay, as the engine's server endpoint.
pub async fn environment(
    relay: &Relay,
    keys: &Keypair,
    id: &str,
    cfg: EndpointConfig,
) -> (EndpointLink, Incoming) {
    let mut ws = relay.ws(&format!("/v1/env/{id}")).await;
    env_handshake(&mut ws, keys, &relay.keys.public, id, next_ts())
        .await
        .expect("environment admitted");
    EndpointLink::spawn_server(ws, cfg).unwrap()
}

/// Accept every `OPEN` with payload `msg2`, and echo every record of every stream back.
pub fn echo_environment(mut incoming: Incoming) -> JoinHandle<()> {
    tokio::spawn(async move {
        while let Some(req) = incoming.next().await {
            let Ok(stream) = req.accept(Bytes::from_static(b"msg2")) else {
                continue;
            };
            tokio::spawn(async move {
                let (mut rx, mut tx) = stream.split();
                while let Ok((_, rec)) = rx.recv().await {
                    if tx.send(rec).await.is_err() {
                        break;
                    }
                }
            });
        }
    })
}

/// A client link on the relay for environment `id`.
pub async fn client(relay: &Relay, id: &str) -> EndpointLink {
    let ws = relay.ws(&format!("/v1/connect/{id}")).await;
    EndpointLink::spawn_client(ws, EndpointConfig::default()).unwrap()
}

static STREAM: AtomicU64 = AtomicU64::new(1);

/// A fresh stream id.
pub fn stream_id() -> StreamId {
    let n = STREAM.fetch_add(1, Ordering::SeqCst);
    let mut id = [0xa5u8; 16];
    id[..8].copy_from_slice(&n.to_be_bytes());
    id
}

/// Open a stream and check the environment's `msg2` came back.
pub async fn open(link: &EndpointLink) -> StreamHandle {
    let accepted = guard(
        "open",
        link.open(stream_id(), Bytes::from_static(b"msg1")).unwrap(),
    )
    .await
    .expect("accepted");
    assert_eq!(&accepted.payload[..], b"msg2");
    accepted.stream
}

/// One record there and back through an echoing environment.
pub async fn round_trip(stream: &mut StreamHandle, what: &str) {
    let rec = Bytes::from(format!("ping {what}"));
    guard("send", stream.sender.send(rec.clone()))
        .await
        .unwrap();
    let (_, got) = guard("echo", stream.receiver.recv()).await.unwrap();
    assert_eq!(got, rec, "{what}");
}

/// A raw frame, as a binary message.
pub async fn send_raw(ws: &mut Ws, f: &Frame) {
    send_frame(ws, f, GUARD).await.unwrap();
}

pub async fn send_bytes(ws: &mut Ws, b: Vec<u8>) {
    use futures_util::SinkExt;
    guard("send", ws.send(Message::Binary(b.into())))
        .await
        .unwrap();
}

pub fn open_frame(id: StreamId, window: u32) -> Frame {
    let mut f = Frame::new(FrameType::Open, id, 0, Bytes::from_static(b"msg1"));
    f.window = window;
    f
}

pub fn data_frame(id: StreamId, seq: u64, payload: &'static [u8]) -> Frame {
    let mut f = Frame::new(FrameType::Data, id, seq, Bytes::from_static(payload));
    f.window = 16;
    f
}

/// Read frames until one satisfies `pred` (skipping the others); `None` if the link closed.
pub async fn recv_until(ws: &mut Ws, pred: impl Fn(&Frame) -> bool) -> Option<Frame> {
    loop {
        match recv_frame(ws, GUARD).await {
            Ok(f) if pred(&f) => return Some(f),
            Ok(_) => continue,
            Err(execrelay_io::driver::FrameIoError::Timeout(_)) => panic!("hang guard: frame"),
            Err(_) => return None,
        }
    }
}

/// Wait until the relay closes `ws` (skipping frames).
pub async fn wait_closed(ws: &mut Ws) {
    assert!(recv_until(ws, |_| false).await.is_none());
}
