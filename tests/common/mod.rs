//! Test harness: a real `ConnectionProcessor` (in process, over an in-memory pipe, or the
//! built binary) driven by a raw JSON-RPC client that records every message in wire order.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio_util::sync::CancellationToken;

use execrelay::config::ServerConfig;
use execrelay::connection_processor::{ConnectionEnd, ConnectionOptions, ConnectionProcessor};
use execrelay::session_registry::SessionRegistry;
use execrelay::transport::stdio::line_transport;

/// Hang guard for waits that should complete (not a synchronisation device: tests wait on
/// the messages themselves).
pub const GUARD: Duration = Duration::from_secs(60);

/// A raw client speaking newline-framed JSON-RPC.
pub struct RawClient {
    reader: Box<dyn tokio::io::AsyncBufRead + Unpin + Send>,
    pub writer: Box<dyn tokio::io::AsyncWrite + Unpin + Send>,
    /// Messages received but not yet consumed by `response`/`next_notification`.
    pub backlog: VecDeque<Value>,
    next_id: u64,
}

impl RawClient {
    pub fn new(
        reader: impl tokio::io::AsyncRead + Unpin + Send + 'static,
        writer: impl tokio::io::AsyncWrite + Unpin + Send + 'static,
    ) -> Self {
        RawClient {
            reader: Box::new(BufReader::with_capacity(1 << 20, reader)),
            writer: Box::new(writer),
            backlog: VecDeque::new(),
            next_id: 1000,
        }
    }

    /// Send raw bytes (a line terminator is added).
    pub async fn send_raw(&mut self, line: &[u8]) {
        self.writer.write_all(line).await.expect("write");
        self.writer.write_all(b"\n").await.expect("write");
        self.writer.flush().await.expect("flush");
    }

    pub async fn send(&mut self, v: &Value) {
        self.send_raw(v.to_string().as_bytes()).await
    }

    /// Send a request; returns its id.
    pub async fn request(&mut self, method: &str, params: Value) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        id
    }

    pub async fn notify(&mut self, method: &str, params: Value) {
        self.send(&json!({"jsonrpc": "2.0", "method": method, "params": params}))
            .await;
    }

    /// Read the next message from the wire (`None` at end of stream).
    pub async fn read_message(&mut self) -> Option<Value> {
        let mut line = String::new();
        let n = tokio::time::timeout(GUARD, self.reader.read_line(&mut line))
            .await
            .expect("timed out waiting for a message")
            .expect("read");
        if n == 0 {
            return None;
        }
        Some(serde_json::from_str(&line).expect("server sent invalid JSON"))
    }

    /// The next message, from the backlog first.
    pub async fn next_message(&mut self) -> Option<Value> {
        if let Some(v) = self.backlog.pop_front() {
            return Some(v);
        }
        self.read_message().await
    }

    /// Wait for the response with `id`, keeping everything else in the backlog.
    pub async fn response(&mut self, id: impl Into<Value>) -> Value {
        let id = id.into();
        if let Some(pos) = self.backlog.iter().position(|m| m.get("id") == Some(&id)) {
            return self.backlog.remove(pos).unwrap();
        }
        loop {
            let m = self
                .read_message()
                .await
                .unwrap_or_else(|| panic!("connection closed before response {id}"));
            if m.get("id") == Some(&id) && m.get("method").is_none() {
                return m;
            }
            self.backlog.push_back(m);
        }
    }

    /// `request` + `response`, returning `result` (panics on an error response).
    pub async fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.request(method, params).await;
        let r = self.response(id).await;
        match r.get("result") {
            Some(v) => v.clone(),
            None => panic!("{method} failed: {r}"),
        }
    }

    /// `request` + `response`, returning the error object (panics on success).
    pub async fn call_err(&mut self, method: &str, params: Value) -> Value {
        let id = self.request(method, params).await;
        let r = self.response(id).await;
        match r.get("error") {
            Some(e) => e.clone(),
            None => panic!("{method} unexpectedly succeeded: {r}"),
        }
    }

    /// `initialize` + `initialized`.
    pub async fn handshake(&mut self) -> Value {
        let r = self.call("initialize", json!({"clientName": "test"})).await;
        self.notify("initialized", json!({})).await;
        r
    }

    /// Next notification, skipping nothing (responses stay in the backlog).
    pub async fn next_notification(&mut self) -> Option<Value> {
        if let Some(pos) = self.backlog.iter().position(|m| m.get("method").is_some()) {
            return self.backlog.remove(pos);
        }
        loop {
            let m = self.read_message().await?;
            if m.get("method").is_some() {
                return Some(m);
            }
            self.backlog.push_back(m);
        }
    }

    /// Collect `pid`'s notifications until its exit notice. Returns (bytes per stream in
    /// order as (stream, bytes)), the exit params, and every seq seen in order.
    pub async fn collect(&mut self, pid: &str) -> Collected {
        let mut c = Collected::default();
        loop {
            let n = self
                .next_notification()
                .await
                .unwrap_or_else(|| panic!("connection closed before {pid} exited"));
            let p = &n["params"];
            if p["processId"] != pid {
                c.other.push(n.clone());
                continue;
            }
            c.seqs.push(p["seq"].as_u64().unwrap());
            match n["method"].as_str().unwrap() {
                "process/outputDelta" => {
                    let data = base64::engine::general_purpose::STANDARD
                        .decode(p["chunk"].as_str().unwrap())
                        .unwrap();
                    assert!(data.len() <= 64 * 1024, "chunk over MAX_CHUNK_BYTES");
                    match p["stream"].as_str().unwrap() {
                        "stdout" => c.stdout.extend_from_slice(&data),
                        "stderr" => c.stderr.extend_from_slice(&data),
                        "pty" => c.pty.extend_from_slice(&data),
                        s => panic!("unknown stream {s}"),
                    }
                }
                "process/exited" => {
                    c.exit = p.clone();
                    return c;
                }
                m => panic!("unexpected notification {m}"),
            }
        }
    }
}

#[derive(Default, Debug)]
pub struct Collected {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub pty: Vec<u8>,
    pub exit: Value,
    pub seqs: Vec<u64>,
    pub other: Vec<Value>,
}

impl Collected {
    /// Seqs are 1, 2, 3, … and the exit notice has the highest.
    pub fn assert_seqs_contiguous(&self) {
        let expected: Vec<u64> = (1..=self.seqs.len() as u64).collect();
        assert_eq!(self.seqs, expected, "seqs must be 1..n with no gap");
        assert_eq!(self.exit["seq"].as_u64(), self.seqs.last().copied());
    }
}

/// A `ConnectionProcessor` in this process over an in-memory pipe.
pub struct InProcess {
    pub client: RawClient,
    pub registry: Arc<SessionRegistry>,
    pub end: tokio::task::JoinHandle<ConnectionEnd>,
    pub shutdown: CancellationToken,
}

/// Start a connection over a duplex with `cfg`; `pipe_bytes` is the in-memory transport's
/// buffer (small values make the transport itself fill up).
pub fn in_process(cfg: ServerConfig, pipe_bytes: usize) -> InProcess {
    let registry = SessionRegistry::new(Arc::new(cfg));
    in_process_with(registry, pipe_bytes, ConnectionOptions::default())
}

pub fn in_process_with(
    registry: Arc<SessionRegistry>,
    pipe_bytes: usize,
    opts: ConnectionOptions,
) -> InProcess {
    let (client_end, server_end) = tokio::io::duplex(pipe_bytes);
    let (sr, sw) = tokio::io::split(server_end);
    let (cr, cw) = tokio::io::split(client_end);
    let max = registry.config().max_message_bytes;
    let transport = line_transport(sr, sw, max, "test");
    let shutdown = CancellationToken::new();
    let end = tokio::spawn(ConnectionProcessor::run(
        transport,
        registry.clone(),
        opts,
        shutdown.clone(),
    ));
    InProcess {
        client: RawClient::new(cr, cw),
        registry,
        end,
        shutdown,
    }
}

/// A default configuration.
pub fn cfg() -> ServerConfig {
    ServerConfig::default()
}

pub fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

pub fn sha256(data: &[u8]) -> String {
    use sha2::Digest;
    let d = sha2::Sha256::digest(data);
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether a process (group) exists.
pub fn group_alive(pgid: i32) -> bool {
    let r = unsafe { libc::kill(-pgid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Wait (bounded) until `f` holds, polling: for conditions that live outside the protocol,
/// like a process group disappearing after SIGKILL.
pub async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + GUARD;
    while !f() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never happened: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The built binary.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_execrelay")
}
