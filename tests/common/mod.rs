//! Test harness: a real `ConnectionProcessor` (in process, over an in-memory pipe, or the
//! built binary) driven by a raw JSON-RPC client that records every message in wire order.
//!
//! Submodules, each for the test binaries that need it: `binary` (running the built binary),
//! `contain` (processes recorded by pid and start time, checked in `/proc`; whether cgroups
//! are here), `fifo` (holding a child back), `interop` (the Python clients written from the spec, in their own venv), `process` (one process from start to exit notice, checked,
//! and what `/proc` says about it), `noise` and `noise_bin` (Noise servers, raw links, key
//! files), `pty` (a terminal for `run -t`), `ws_server` (the server on a `ws://` listener, for the client library). Every test binary compiles all of them, hence
//! `dead_code` is allowed for the whole module.
#![allow(dead_code)]

pub mod binary;
pub mod contain;
pub mod cut_proxy;
pub mod fake_server;
pub mod fifo;
pub mod interop;
pub mod local;
pub mod noise;
pub mod noise_bin;
pub mod process;
pub mod pty;
pub mod relay;
pub mod ws_server;

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use base64::Engine;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use execrelay::config::ServerConfig;
use execrelay::connection::{ConnectionEnd, ConnectionOptions, ConnectionProcessor};
use execrelay::metrics::Metrics;
use execrelay::session::SessionRegistry;
use execrelay::transport::stdio::line_transport;

/// Hang guard for waits that should complete (not a synchronisation device: tests wait on
/// the messages themselves).
pub const GUARD: Duration = Duration::from_secs(60);

/// Hang guard for things that should happen at once (a refused handshake, a process exit).
/// Shorter than [`GUARD`] so a hang fails in reasonable time; a correct run takes
/// milliseconds.
pub const PROMPT: Duration = Duration::from_secs(20);

/// A raw client speaking newline-framed JSON-RPC.
pub struct RawClient {
    reader: Box<dyn tokio::io::AsyncBufRead + Unpin + Send>,
    pub writer: Box<dyn tokio::io::AsyncWrite + Unpin + Send>,
    /// Messages received but not yet consumed by `response`/`next_notification`.
    pub backlog: VecDeque<Value>,
    next_id: u64,
}

impl RawClient {
    /// A client reading from `reader` and writing to `writer`.
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

    /// Send one message.
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

    /// Send a notification.
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

    /// Read the next line from the wire without parsing it (a test that only counts large
    /// answers); its length, `None` at end of stream.
    pub async fn skip_line(&mut self, buf: &mut Vec<u8>) -> Option<usize> {
        buf.clear();
        let n = tokio::time::timeout(GUARD, self.reader.read_until(b'\n', buf))
            .await
            .expect("timed out waiting for a message")
            .expect("read");
        (n > 0).then_some(n)
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
            if n["params"]["processId"] != pid {
                c.other.push(n.clone());
                continue;
            }
            if c.absorb(&n) {
                return c;
            }
        }
    }

    /// Collect the notifications of several processes until each has exited, checking that
    /// no event follows an exit notice (`collect` handles one process and keeps the others'
    /// notifications to itself).
    pub async fn collect_all(&mut self, ids: &[&str]) -> HashMap<String, Collected> {
        let mut out: HashMap<String, Collected> = HashMap::new();
        let mut exited = 0;
        while exited < ids.len() {
            let n = self
                .next_notification()
                .await
                .expect("connection closed before every process exited");
            let id = n["params"]["processId"].as_str().expect("processId");
            assert!(ids.contains(&id), "unexpected notification {n}");
            let col = out.entry(id.to_string()).or_default();
            assert!(col.exit.is_null(), "event after the exit notice: {n}");
            if col.absorb(&n) {
                exited += 1;
            }
        }
        out
    }

    /// `process/start` with `params`, then everything of that process through its exit
    /// notice (`collect`).
    pub async fn run(&mut self, params: Value) -> Collected {
        let id = params["processId"].as_str().expect("processId").to_string();
        self.start(params).await;
        self.collect(&id).await
    }

    /// `process/start` with `params` (must succeed); its result.
    pub async fn start(&mut self, params: Value) -> Value {
        self.call("process/start", params).await
    }

    /// `process/write` of `data` to `pid`'s stdin; its result.
    pub async fn write(&mut self, pid: &str, data: &[u8]) -> Value {
        self.call(
            "process/write",
            json!({"processId": pid, "chunk": b64(data)}),
        )
        .await
    }

    /// Send a `process/write` of `data` to `pid` without waiting; its request id.
    pub async fn request_write(&mut self, pid: &str, data: &[u8]) -> u64 {
        self.request(
            "process/write",
            json!({"processId": pid, "chunk": b64(data)}),
        )
        .await
    }

    /// `process/closeStdin` of `pid`; its result.
    pub async fn close_stdin(&mut self, pid: &str) -> Value {
        self.call("process/closeStdin", json!({"processId": pid}))
            .await
    }

    /// `process/terminate` of `pid`, with `graceMs` when given; its result.
    pub async fn terminate(&mut self, pid: &str, grace_ms: Option<u64>) -> Value {
        let params = match grace_ms {
            Some(g) => json!({"processId": pid, "graceMs": g}),
            None => json!({"processId": pid}),
        };
        self.call("process/terminate", params).await
    }

    /// `process/signal` of `signal` to `pid`; its result.
    pub async fn signal(&mut self, pid: &str, signal: &str) -> Value {
        self.call(
            "process/signal",
            json!({"processId": pid, "signal": signal}),
        )
        .await
    }

    /// `initialize` resuming `sid` with `token` (must succeed) + `initialized`; the result.
    pub async fn resume(&mut self, sid: &str, token: &str) -> Value {
        let r = self
            .call(
                "initialize",
                json!({"resume": {"sessionId": sid, "resumeToken": token}}),
            )
            .await;
        self.notify("initialized", json!({})).await;
        r
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
    /// `process/outputOmitted` notices: the stream, `omittedBytes`, and how many bytes of
    /// that stream had arrived before it (where the head ends and the kept tail begins).
    pub omitted: Vec<(String, u64, usize)>,
}

impl Collected {
    /// Record one notification of this process: its seq, and its bytes (an output delta) or
    /// its exit params (returns true for the exit notice).
    pub fn absorb(&mut self, n: &Value) -> bool {
        let p = &n["params"];
        self.seqs.push(p["seq"].as_u64().expect("seq"));
        match n["method"].as_str().expect("method") {
            "process/outputDelta" => {
                let data = unb64(p["chunk"].as_str().expect("chunk"));
                assert!(data.len() <= 64 * 1024, "chunk over MAX_CHUNK_BYTES");
                match p["stream"].as_str().expect("stream") {
                    "stdout" => self.stdout.extend_from_slice(&data),
                    "stderr" => self.stderr.extend_from_slice(&data),
                    "pty" => self.pty.extend_from_slice(&data),
                    s => panic!("unknown stream {s}"),
                }
                false
            }
            "process/exited" => {
                self.exit = p.clone();
                true
            }
            "process/outputOmitted" => {
                let stream = p["stream"].as_str().expect("stream").to_string();
                let at = match stream.as_str() {
                    "stdout" => self.stdout.len(),
                    "stderr" => self.stderr.len(),
                    "pty" => self.pty.len(),
                    s => panic!("unknown stream {s}"),
                };
                let n = p["omittedBytes"].as_u64().expect("omittedBytes");
                self.omitted.push((stream, n, at));
                false
            }
            m => panic!("unexpected notification {m}"),
        }
    }

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

/// A registry for `cfg` as the composition root makes one: its own metrics, and process
/// containment started (`server::start_containment`: backend, crash sweep, subreaper).
pub fn new_registry(cfg: ServerConfig) -> Arc<SessionRegistry> {
    let containment = execrelay::server::start_containment(&cfg).expect("containment starts");
    SessionRegistry::new(Arc::new(cfg), Arc::new(Metrics::new()), containment)
}

/// Start a connection over a duplex with `cfg`; `pipe_bytes` is the in-memory transport's
/// buffer (small values make the transport itself fill up).
pub fn in_process(cfg: ServerConfig, pipe_bytes: usize) -> InProcess {
    let registry = new_registry(cfg);
    in_process_with(registry, pipe_bytes, ConnectionOptions::default())
}

/// Start a connection on `registry` over a duplex of `pipe_bytes` (with `opts`).
pub fn in_process_with(
    registry: Arc<SessionRegistry>,
    pipe_bytes: usize,
    opts: ConnectionOptions,
) -> InProcess {
    in_process_wrapped(registry, pipe_bytes, opts, |w| w)
}

/// Like [`in_process`], but the client ignores write errors: when the server closes the
/// connection on a framing error it may do so while the client is still writing the line.
pub fn in_process_lenient(cfg: ServerConfig) -> InProcess {
    let registry = new_registry(cfg);
    in_process_wrapped(registry, 1 << 20, ConnectionOptions::default(), Lenient)
}

/// The connection of [`in_process_with`], the client's writer wrapped by `wrap`.
fn in_process_wrapped<W: AsyncWrite + Unpin + Send + 'static>(
    registry: Arc<SessionRegistry>,
    pipe_bytes: usize,
    opts: ConnectionOptions,
    wrap: impl FnOnce(tokio::io::WriteHalf<tokio::io::DuplexStream>) -> W,
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
        client: RawClient::new(cr, wrap(cw)),
        registry,
        end,
        shutdown,
    }
}

/// A connection on `registry` with the defaults (1 MiB pipe, default options).
pub fn connect_to(registry: &Arc<SessionRegistry>) -> InProcess {
    in_process_with(registry.clone(), 1 << 20, ConnectionOptions::default())
}

/// A connection that completed `initialize` + `initialized`.
pub async fn ready_with(cfg: ServerConfig) -> InProcess {
    let mut t = in_process(cfg, 1 << 20);
    t.client.handshake().await;
    t
}

/// A new session on `registry`: a connection after `initialize` + `initialized`, with the
/// session id and resume token.
pub async fn open_session(registry: &Arc<SessionRegistry>) -> (InProcess, String, String) {
    let mut t = connect_to(registry);
    let init = t.client.handshake().await;
    let (sid, token) = credentials(&init);
    (t, sid, token)
}

/// `sessionId` and `resumeToken` of an `initialize` result.
pub fn credentials(init: &Value) -> (String, String) {
    (
        init["sessionId"].as_str().unwrap().to_string(),
        init["resumeToken"].as_str().unwrap().to_string(),
    )
}

/// How a connection ended, within [`GUARD`].
pub async fn connection_end(end: JoinHandle<ConnectionEnd>) -> ConnectionEnd {
    tokio::time::timeout(GUARD, end)
        .await
        .expect("connection ends")
        .expect("join")
}

impl InProcess {
    /// Close the client's side and wait (within [`GUARD`]) for the connection to end.
    pub async fn hang_up(self) -> ConnectionEnd {
        drop(self.client);
        connection_end(self.end).await
    }
}

/// A writer that reports success after its peer went away.
pub struct Lenient<W>(pub W);

impl<W: AsyncWrite + Unpin> AsyncWrite for Lenient<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match Pin::new(&mut self.0).poll_write(cx, buf) {
            Poll::Ready(Err(_)) => Poll::Ready(Ok(buf.len())),
            other => other,
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match Pin::new(&mut self.0).poll_flush(cx) {
            Poll::Ready(Err(_)) => Poll::Ready(Ok(())),
            other => other,
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match Pin::new(&mut self.0).poll_shutdown(cx) {
            Poll::Ready(Err(_)) => Poll::Ready(Ok(())),
            other => other,
        }
    }
}

/// The `error` member of a response (panics on a success).
pub fn error_of(r: &Value) -> &Value {
    r.get("error")
        .unwrap_or_else(|| panic!("expected an error response, got {r}"))
}

/// A default configuration.
pub fn cfg() -> ServerConfig {
    ServerConfig::default()
}

/// Standard base64 of `data`.
pub fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// Bytes of standard base64 `s` (panics on invalid base64).
pub fn unb64(s: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .expect("base64")
}

/// Bytes as text, invalid UTF-8 replaced.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Hex SHA-256 of `data`.
pub fn sha256(data: &[u8]) -> String {
    use sha2::Digest;
    let d = sha2::Sha256::digest(data);
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// A temporary file holding `data`.
pub fn file_with(data: &[u8]) -> tempfile::NamedTempFile {
    use std::io::Write;
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(data).unwrap();
    f.flush().unwrap();
    f
}

/// Whether a process (group) exists.
pub fn group_alive(pgid: i32) -> bool {
    let r = unsafe { libc::kill(-pgid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// SIGKILL to a process group we started (hygiene: never leave children behind).
pub fn kill_group(pid: &Value) {
    let pid = pid.as_i64().expect("pid") as i32;
    assert!(pid > 1);
    unsafe { libc::kill(-pid, libc::SIGKILL) };
}

/// Wait until `registry`'s server has answered `n` more requests than when called: a count of
/// rounds of a client's silence watch, when one quiet process is all it asks about.
pub async fn answered_more(registry: &execrelay::session::SessionRegistry, n: u64, what: &str) {
    let responses = || registry.metrics().rpc_responses.get();
    let before = responses();
    eventually(what, || responses() - before >= n).await;
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

/// A library client's process: its stdout until the exit notice, and its exit code. Nothing
/// may be lost or omitted on the way (no cap was asked for), and each event comes within the
/// hang guard.
pub async fn stdout_and_code(p: &mut execrelay::client::ProcessHandle) -> (Vec<u8>, Option<i32>) {
    use execrelay::client::ProcessEvent;
    let mut out = Vec::new();
    loop {
        let ev = tokio::time::timeout(GUARD, p.next_event())
            .await
            .expect("no event (hang guard)");
        match ev {
            Some(ProcessEvent::Output { data, .. }) => out.extend_from_slice(&data),
            Some(ProcessEvent::Exited(info)) => return (out, info.exit_code),
            Some(ProcessEvent::Lost { from, to }) => panic!("lost {from}..={to}"),
            Some(ProcessEvent::Omitted { .. }) => panic!("no cap was asked for"),
            None => panic!("the event stream ended without an exit notice"),
        }
    }
}

/// The built binary.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_execrelay")
}
