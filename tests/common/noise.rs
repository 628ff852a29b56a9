//! Noise harness (`secure-transport.md`): an in-process Noise server (`Server::run`) with a scripted
//! authorizer, a counting TCP forwarder, a raw link client that crafts every frame byte itself
//! (so that it can misbehave), and a JSON-RPC speaker over one library virtual stream.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use tokio_util::sync::CancellationToken;

use execrelay::client::Target;
use execrelay::config::{ServerConfig, MAX_MESSAGE_BYTES};
use execrelay::link::client::{LinkPool, NoiseClientConfig};
use execrelay::link::server::NoiseServerConfig;
use execrelay::noise::authorizer::{AuthDenied, AuthRequest, Authorizer};
use execrelay::noise::handshake::{prologue, ClientHandshake, NOISE_PARAMS};
use execrelay::noise::keys::{Keypair, KEY_BYTES};
use execrelay::noise::record::{Opened, RecordOpener, RecordSealer};
use execrelay::noise::suite::NoiseSuite;
use execrelay::noise::timestamp::next_hello_ts;
use execrelay::server::{Listener, Server};
use execrelay::transport::Transport;
use execrelay_protocol::frame::{Frame, FrameType, StreamId};

use super::{GUARD, PROMPT};

// ---------------------------------------------------------------------------------------------
// A scripted authorizer.

/// What the test authorizer answers for a key; keys not listed are refused.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Verdict {
    Allow,
    /// Never answers (an outside authority that hangs).
    Block,
}

/// An authorizer that answers by a fixed list and records every call.
pub struct TestAuth {
    rules: Vec<([u8; KEY_BYTES], Verdict)>,
    /// Every call, in order.
    calls: Mutex<Vec<[u8; KEY_BYTES]>>,
    /// Told of every call as it starts, so a test can wait for "authorization is pending".
    entered: mpsc::UnboundedSender<[u8; KEY_BYTES]>,
}

impl TestAuth {
    /// The authorizer, and a receiver told of every call as it starts.
    pub fn new(
        rules: &[(&Keypair, Verdict)],
    ) -> (Arc<TestAuth>, mpsc::UnboundedReceiver<[u8; KEY_BYTES]>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let auth = TestAuth {
            rules: rules.iter().map(|(k, v)| (k.public, *v)).collect(),
            calls: Mutex::new(Vec::new()),
            entered: tx,
        };
        (Arc::new(auth), rx)
    }

    /// How many times `key` was asked about.
    pub fn calls_for(&self, key: &Keypair) -> usize {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|k| **k == key.public)
            .count()
    }

    /// How many calls there were in all.
    pub fn total_calls(&self) -> usize {
        self.calls.lock().unwrap().len()
    }
}

impl Authorizer for TestAuth {
    fn authorize(
        self: Arc<Self>,
        req: AuthRequest,
    ) -> Pin<Box<dyn Future<Output = Result<(), AuthDenied>> + Send>> {
        self.calls.lock().unwrap().push(req.client_key);
        let _ = self.entered.send(req.client_key);
        let verdict = self
            .rules
            .iter()
            .find(|(k, _)| *k == req.client_key)
            .map(|(_, v)| *v);
        Box::pin(async move {
            match verdict {
                Some(Verdict::Allow) => Ok(()),
                Some(Verdict::Block) => std::future::pending().await,
                None => Err(AuthDenied("not in the test's list".into())),
            }
        })
    }
}

/// Wait until the authorizer has been asked about `key`.
pub async fn wait_entered(rx: &mut mpsc::UnboundedReceiver<[u8; KEY_BYTES]>, key: &Keypair) {
    loop {
        let k = tokio::time::timeout(PROMPT, rx.recv())
            .await
            .expect("the authorizer was never called (hang guard)")
            .expect("authorizer gone");
        if k == key.public {
            return;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// In-process server.

/// A Noise server (`Server::run` with one `noise+ws://` listener) in this process, on a port
/// of its own.
pub struct TestServer {
    pub port: u16,
    pub url: String,
    pub keys: Keypair,
    pub shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

/// Start a server with fresh keys, `auth` and `config` (its link settings among them).
pub async fn start_server(auth: Arc<dyn Authorizer>, config: ServerConfig) -> TestServer {
    start_server_on(Server::new(Arc::new(config)).expect("server starts"), auth).await
}

/// Start `server` (built by the caller: an exec policy, say) with fresh keys and `auth`.
pub async fn start_server_on(server: Server, auth: Arc<dyn Authorizer>) -> TestServer {
    let keys = Keypair::generate().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let cfg = Arc::new(NoiseServerConfig {
        keys: keys.clone(),
        authorizer: auth,
        env_id: String::new(),
    });
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(server.run(vec![Listener::Noise(listener, cfg)], shutdown.clone()));
    TestServer {
        port,
        url: format!("noise+ws://127.0.0.1:{port}"),
        keys,
        shutdown,
        task,
    }
}

/// A server with `config` whose authorizer allows exactly `keys`.
pub async fn serve_allowing(
    keys: &[&Keypair],
    config: ServerConfig,
) -> (Arc<TestAuth>, TestServer) {
    let rules: Vec<(&Keypair, Verdict)> = keys.iter().map(|k| (*k, Verdict::Allow)).collect();
    let (auth, _rx) = TestAuth::new(&rules);
    let srv = start_server(auth.clone(), config).await;
    (auth, srv)
}

/// A server with `config` that allows one freshly generated client key; the key, the
/// authorizer and the server.
pub async fn serve_one(config: ServerConfig) -> (Keypair, Arc<TestAuth>, TestServer) {
    let key = Keypair::generate().unwrap();
    let (auth, srv) = serve_allowing(&[&key], config).await;
    (key, auth, srv)
}

/// Two fresh keys and an authorizer that never answers for the first and allows the second;
/// also the receiver told of every call as it starts.
pub fn block_a_allow_b() -> (
    Keypair,
    Keypair,
    Arc<TestAuth>,
    mpsc::UnboundedReceiver<[u8; KEY_BYTES]>,
) {
    let a = Keypair::generate().unwrap();
    let b = Keypair::generate().unwrap();
    let (auth, entered) = TestAuth::new(&[(&a, Verdict::Block), (&b, Verdict::Allow)]);
    (a, b, auth, entered)
}

impl TestServer {
    /// A client configuration for `keys`, pinning this server.
    pub fn client_config(&self, keys: &Keypair) -> NoiseClientConfig {
        NoiseClientConfig::new(keys.clone(), self.keys.public)
    }

    /// A `Target::Noise` for `keys` to this server, with a link pool of its own (its clones
    /// share it).
    pub fn target(&self, keys: &Keypair) -> Target {
        Target::Noise {
            url: self.url.clone(),
            config: Arc::new(self.client_config(keys)),
            pool: LinkPool::new(),
        }
    }

    /// A `Target::Noise` for `keys` pinning this server, reached through local `port` (a
    /// forwarder in front of it), with a link pool of its own (its clones share it).
    pub fn target_at(&self, port: u16, keys: &Keypair) -> Target {
        Target::Noise {
            url: format!("noise+ws://127.0.0.1:{port}"),
            config: Arc::new(self.client_config(keys)),
            pool: LinkPool::new(),
        }
    }

    /// Shut down and require the server to return (no authorization may be left blocked).
    pub async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(PROMPT, self.task)
            .await
            .expect("the server did not return after shutdown (hang guard)")
            .expect("the server panicked");
    }
}

/// A configuration with a link failure budget of `burst` that does not refill during a test.
pub fn quick_budget(burst: u32) -> ServerConfig {
    ServerConfig {
        handshake_failure_burst: burst,
        handshake_failure_refill_ms: 3_600_000,
        ..Default::default()
    }
}

/// A TCP forwarder in front of `port` that counts the connections (physical links) it
/// carries; returns its port.
pub async fn counting_proxy(port: u16) -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let front = listener.local_addr().unwrap().port();
    let count = Arc::new(AtomicUsize::new(0));
    let c = count.clone();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            c.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                if let Ok(mut out) = TcpStream::connect(("127.0.0.1", port)).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                }
            });
        }
    });
    (front, count)
}

// ---------------------------------------------------------------------------------------------
// A raw link client: every byte under the test's control.

/// The WebSocket of a raw link.
pub type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// A fresh random stream id.
pub fn random_sid() -> StreamId {
    let mut sid = [0u8; 16];
    getrandom::getrandom(&mut sid).unwrap();
    sid
}

/// What happened next on a stream.
#[derive(Debug)]
pub enum Ev {
    /// A whole JSON-RPC message.
    Msg(Value),
    /// The authenticated close record: its record number and reason.
    Close(u64, String),
    /// A `RESET` frame with its reason.
    Reset(String),
}

/// The receive window a raw link advertises (§7), as the library does.
pub const RAW_WINDOW: u32 = 16;

/// One established stream of a raw link. It keeps the flow control of §7 as a well-behaved
/// peer does: its `OPEN` advertises [`RAW_WINDOW`], every `DATA` it sends carries its report,
/// and it sends a bare `ACK` once it has consumed half a window since its last report.
pub struct RawStream {
    pub sid: StreamId,
    pub sealer: RecordSealer,
    pub opener: RecordOpener,
    /// Highest record of the server consumed (opened) in order.
    pub consumed: u64,
    /// The last `ack` reported to the server.
    pub reported: u64,
    inbox: VecDeque<Value>,
    /// Messages received while waiting for a response (notifications).
    pub other: Vec<Value>,
    pub next_id: u64,
}

/// A physical link to `/v1/link` (or a relay's `/v1/connect/ID`) driven frame by frame.
pub struct RawLink {
    ws: Ws,
    /// Frames read while waiting for another stream's.
    pub backlog: VecDeque<Frame>,
    /// The environment id of its handshakes' prologue (empty for a direct server).
    pub env_id: String,
    /// Per stream, the last record the server accepts: the largest `ack + window` it reported
    /// (§7; in `ACCEPT`, `DATA` and bare `ACK` frames).
    send_limits: HashMap<StreamId, u64>,
}

impl RawLink {
    /// Open a link to the server on `port`.
    pub async fn connect(port: u16) -> RawLink {
        RawLink::connect_path(port, "/v1/link", "").await
    }

    /// [`RawLink::connect_path`] from the loopback address `source` (127.0.0.2, …): another
    /// client address on one host.
    pub async fn connect_from(
        source: std::net::Ipv4Addr,
        port: u16,
        path: &str,
        env_id: &str,
    ) -> RawLink {
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.bind((source, 0).into()).unwrap();
        let tcp = tokio::time::timeout(PROMPT, sock.connect(([127, 0, 0, 1], port).into()))
            .await
            .expect("connect (hang guard)")
            .expect("connect");
        let url = format!("ws://127.0.0.1:{port}{path}");
        let (ws, _) = tokio::time::timeout(
            PROMPT,
            tokio_tungstenite::client_async(url, MaybeTlsStream::Plain(tcp)),
        )
        .await
        .expect("upgrade (hang guard)")
        .expect("upgrade the raw link");
        RawLink {
            ws,
            backlog: VecDeque::new(),
            env_id: env_id.to_string(),
            send_limits: HashMap::new(),
        }
    }

    /// Open a link to `path` on `port` whose handshakes name environment `env_id` (a relay's
    /// client link: `/v1/connect/ID`).
    pub async fn connect_path(port: u16, path: &str, env_id: &str) -> RawLink {
        let url = format!("ws://127.0.0.1:{port}{path}");
        let (ws, _) = tokio::time::timeout(PROMPT, tokio_tungstenite::connect_async(url))
            .await
            .expect("connect (hang guard)")
            .expect("connect the raw link");
        RawLink {
            ws,
            backlog: VecDeque::new(),
            env_id: env_id.to_string(),
            send_limits: HashMap::new(),
        }
    }

    /// Send one WebSocket message as it is.
    pub async fn send_msg(&mut self, m: Message) {
        self.ws.send(m).await.expect("send on the link");
    }

    /// Send one frame.
    pub async fn send_frame(&mut self, f: &Frame) {
        self.send_msg(Message::Binary(f.encode().unwrap().into()))
            .await;
    }

    /// Send a `DATA` frame of stream `sid` with record number `seq` and `payload` as it is.
    pub async fn send_data(&mut self, sid: StreamId, seq: u64, payload: impl Into<Bytes>) {
        self.send_frame(&Frame::new(FrameType::Data, sid, seq, payload.into()))
            .await;
    }

    /// Send an `OPEN` frame for `sid` carrying `msg1` and the initial window.
    pub async fn send_open(&mut self, sid: StreamId, msg1: Vec<u8>) {
        self.send_open_flags(sid, 0, msg1).await;
    }

    /// Send an `OPEN` frame for `sid` with `flags` (bits 0–1: the Noise suite).
    pub async fn send_open_flags(&mut self, sid: StreamId, flags: u16, msg1: Vec<u8>) {
        let mut f = Frame::new(FrameType::Open, sid, 0, Bytes::from(msg1));
        f.window = RAW_WINDOW;
        f.flags = flags;
        self.send_frame(&f).await;
    }

    /// The next frame off the wire other than a bare `ACK`; `None` once the link has ended.
    pub async fn read_frame(&mut self) -> Option<Frame> {
        // One deadline for the whole wait: the server's keepalive pings must not re-arm it.
        let deadline = tokio::time::Instant::now() + GUARD;
        loop {
            let f = self.read_any(deadline).await?;
            // Bare ACKs only report the server's consumption (§7), recorded by `read_any`.
            if f.ftype != FrameType::Ack {
                return Some(f);
            }
        }
    }

    /// The next frame off the wire, bare `ACK`s included, with the server's window reports
    /// recorded; `None` once the link has ended. Panics at `deadline` (hang guard).
    async fn read_any(&mut self, deadline: tokio::time::Instant) -> Option<Frame> {
        loop {
            let m = tokio::time::timeout_at(deadline, self.ws.next())
                .await
                .expect("no frame and no close within the hang guard");
            match m {
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return None,
                Some(Ok(Message::Binary(b))) => {
                    let f = Frame::decode(&b).expect("the server sent a malformed frame");
                    if matches!(
                        f.ftype,
                        FrameType::Accept | FrameType::Data | FrameType::Ack
                    ) {
                        let limit = f.ack.saturating_add(u64::from(f.window));
                        let known = self.send_limits.entry(f.stream).or_insert(0);
                        *known = (*known).max(limit);
                    }
                    return Some(f);
                }
                Some(Ok(Message::Text(t))) => panic!("the server sent a text message: {t:?}"),
                Some(Ok(_)) => continue, // ping, pong
            }
        }
    }

    /// The next frame of stream `sid` (others are kept for later).
    pub async fn frame_for(&mut self, sid: &StreamId) -> Frame {
        if let Some(pos) = self.backlog.iter().position(|f| f.stream == *sid) {
            return self.backlog.remove(pos).unwrap();
        }
        loop {
            let f = self
                .read_frame()
                .await
                .expect("the link ended while a frame of a stream was awaited");
            if f.stream == *sid {
                return f;
            }
            self.backlog.push_back(f);
        }
    }

    /// Read until the link ends; returns the frames seen meanwhile.
    pub async fn until_closed(&mut self) -> Vec<Frame> {
        let mut seen: Vec<Frame> = self.backlog.drain(..).collect();
        while let Some(f) = self.read_frame().await {
            seen.push(f);
        }
        seen
    }

    /// Handshake a stream with `client` against `server`; panics unless ACCEPTed.
    pub async fn open(&mut self, client: &Keypair, server: &[u8; KEY_BYTES]) -> RawStream {
        self.open_suite(NoiseSuite::ChaChaPoly, client, server)
            .await
    }

    /// [`RawLink::open`] in `suite` (its number in the `OPEN`'s flags).
    pub async fn open_suite(
        &mut self,
        suite: NoiseSuite,
        client: &Keypair,
        server: &[u8; KEY_BYTES],
    ) -> RawStream {
        let sid = random_sid();
        let (hs, m1) = ClientHandshake::start_suite(
            suite,
            client,
            server,
            &self.env_id,
            &sid,
            None,
            next_hello_ts(),
        )
        .unwrap();
        self.send_open_flags(sid, suite.number(), m1).await;
        let f = self.frame_for(&sid).await;
        assert_eq!(
            f.ftype,
            FrameType::Accept,
            "expected ACCEPT, got {:?} ({:?})",
            f.ftype,
            f.reset_reason()
        );
        let (keys, welcome) = hs.finish(&f.payload).expect("message 2 verifies");
        assert_eq!(welcome.version, 1);
        RawStream {
            sid,
            sealer: RecordSealer::new(keys.clone()),
            opener: RecordOpener::new(keys, MAX_MESSAGE_BYTES),
            consumed: 0,
            reported: 0,
            inbox: VecDeque::new(),
            other: Vec::new(),
            next_id: 0,
        }
    }

    /// [`RawLink::open`] + [`RawLink::init`]: a stream ready for requests.
    pub async fn open_ready(&mut self, client: &Keypair, server: &[u8; KEY_BYTES]) -> RawStream {
        let mut st = self.open(client, server).await;
        self.init(&mut st).await;
        st
    }

    /// Start a handshake of `client` on a new stream (`OPEN` with a genuine message 1) and
    /// leave it pending; returns the stream id and message 1.
    pub async fn send_hello(
        &mut self,
        client: &Keypair,
        server: &[u8; KEY_BYTES],
    ) -> (StreamId, Vec<u8>) {
        let sid = random_sid();
        let (_hs, m1) =
            ClientHandshake::start(client, server, &self.env_id, &sid, None, next_hello_ts())
                .unwrap();
        self.send_open(sid, m1.clone()).await;
        (sid, m1)
    }

    /// Read until the link ends, asserting that nothing but `RESET`s came before (`what`
    /// says which).
    pub async fn expect_closed_after_resets(&mut self, what: &str) {
        let rest = self.until_closed().await;
        assert!(
            rest.iter().all(|f| f.ftype == FrameType::Reset),
            "{what}: {rest:?}"
        );
    }

    /// Wait until the server's window lets record `seq` of `sid` out (§7): frames read
    /// meanwhile are kept for later. A well-behaved peer never sends past `ack + window`.
    pub async fn wait_credit(&mut self, sid: &StreamId, seq: u64) {
        let deadline = tokio::time::Instant::now() + GUARD;
        while self.send_limits.get(sid).copied().unwrap_or(0) < seq {
            let f = self
                .read_any(deadline)
                .await
                .expect("the link ended while waiting for the server's window");
            if f.ftype != FrameType::Ack {
                self.backlog.push_back(f);
            }
        }
    }

    /// The last record of `sid` the server accepts now: the largest `ack + window` it
    /// reported.
    pub fn send_limit(&self, sid: &StreamId) -> u64 {
        self.send_limits.get(sid).copied().unwrap_or(0)
    }

    /// Wait until the server reported `sid`'s records up to `seq` consumed (its `ack` reached
    /// `seq`: credit up to `seq + window`), or reset the stream; true if consumed. Other
    /// frames are kept for later.
    pub async fn wait_consumed(&mut self, sid: &StreamId, seq: u64, window: u64) -> bool {
        let deadline = tokio::time::Instant::now() + GUARD;
        if self
            .backlog
            .iter()
            .any(|f| f.stream == *sid && f.ftype == FrameType::Reset)
        {
            return false;
        }
        while self.send_limit(sid) < seq + window {
            let f = self
                .read_any(deadline)
                .await
                .expect("the link ended while waiting for the server to consume");
            let reset = f.stream == *sid && f.ftype == FrameType::Reset;
            if f.ftype != FrameType::Ack {
                self.backlog.push_back(f);
            }
            if reset {
                return false;
            }
        }
        true
    }

    /// Seal `v` as records of `st` and send their DATA frames (each carrying the stream's
    /// report), each once the server's window allows it.
    pub async fn send_json(&mut self, st: &mut RawStream, v: &Value) {
        let records = st.sealer.seal_message(v.to_string().as_bytes()).unwrap();
        for (n, ct) in records {
            self.wait_credit(&st.sid, n).await;
            let mut f = Frame::new(FrameType::Data, st.sid, n, Bytes::from(ct));
            (f.ack, f.window) = (st.consumed, RAW_WINDOW);
            st.reported = st.consumed;
            self.send_frame(&f).await;
        }
    }

    /// After consuming a record: a bare `ACK` once half a window is unreported (§7).
    async fn maybe_ack(&mut self, st: &mut RawStream) {
        if st.consumed - st.reported >= u64::from(RAW_WINDOW / 2) {
            let mut f = Frame::new(FrameType::Ack, st.sid, 0, Bytes::new());
            (f.ack, f.window) = (st.consumed, RAW_WINDOW);
            st.reported = st.consumed;
            self.send_frame(&f).await;
        }
    }

    /// The next message, close record or `RESET` of `st`.
    pub async fn next_ev(&mut self, st: &mut RawStream) -> Ev {
        loop {
            if let Some(m) = st.inbox.pop_front() {
                return Ev::Msg(m);
            }
            let f = self.frame_for(&st.sid).await;
            match f.ftype {
                FrameType::Ack => continue,
                FrameType::Data => match st.opener.open(f.seq, &f.payload) {
                    Ok(Opened::Messages(ms)) => {
                        for m in ms {
                            st.inbox.push_back(
                                serde_json::from_slice(&m).expect("server sent invalid JSON"),
                            );
                        }
                        st.consumed = f.seq;
                        self.maybe_ack(st).await;
                    }
                    Ok(Opened::Close(reason)) => return Ev::Close(f.seq, reason),
                    Err(e) => panic!("a record from the server did not open: {e}"),
                },
                FrameType::Reset => return Ev::Reset(f.reset_reason()),
                t => panic!("unexpected {t:?} frame on an established stream"),
            }
        }
    }

    /// Send a request and wait for its response (the whole message).
    pub async fn request(&mut self, st: &mut RawStream, method: &str, params: Value) -> Value {
        st.next_id += 1;
        let id = st.next_id;
        let req = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.send_json(st, &req).await;
        loop {
            match self.next_ev(st).await {
                Ev::Msg(m) if m.get("id") == Some(&json!(id)) && m.get("method").is_none() => {
                    return m
                }
                Ev::Msg(m) => st.other.push(m),
                ev => panic!("the stream ended before the response to {method}: {ev:?}"),
            }
        }
    }

    /// [`RawLink::request`], returning `result` (panics on an error response).
    pub async fn call(&mut self, st: &mut RawStream, method: &str, params: Value) -> Value {
        let r = self.request(st, method, params).await;
        match r.get("result") {
            Some(v) => v.clone(),
            None => panic!("{method} failed: {r}"),
        }
    }

    /// `initialize` + `initialized` on `st`; the initialize result.
    pub async fn init(&mut self, st: &mut RawStream) -> Value {
        let r = self
            .call(st, "initialize", json!({"clientName": "raw-link"}))
            .await;
        let note = json!({"jsonrpc": "2.0", "method": "initialized", "params": {}});
        self.send_json(st, &note).await;
        r
    }

    /// `server/info` answers on `st`: the stream is alive end to end.
    pub async fn assert_alive(&mut self, st: &mut RawStream) {
        let info = self.call(st, "server/info", json!({})).await;
        assert!(info["serverVersion"].is_string(), "{info}");
    }

    /// Expect the next frame of `sid` to be a `RESET` with `reason`.
    pub async fn expect_reset(&mut self, sid: &StreamId, reason: &str) {
        let f = self.frame_for(sid).await;
        assert_eq!(
            (f.ftype, f.reset_reason().as_str()),
            (FrameType::Reset, reason),
            "expected RESET {reason:?}"
        );
    }
}

/// Message 1 with an arbitrary payload, built with snow directly (no size checks of ours).
pub fn raw_msg1(
    client: &Keypair,
    server: &[u8; KEY_BYTES],
    sid: &StreamId,
    payload: &[u8],
) -> Vec<u8> {
    raw_msg1_env(client, server, "", sid, payload)
}

/// [`raw_msg1`] for environment `env_id` (through a relay).
pub fn raw_msg1_env(
    client: &Keypair,
    server: &[u8; KEY_BYTES],
    env_id: &str,
    sid: &StreamId,
    payload: &[u8],
) -> Vec<u8> {
    let pro = prologue(env_id, sid);
    let mut hs = snow::Builder::new(NOISE_PARAMS.parse().unwrap())
        .local_private_key(&client.private)
        .unwrap()
        .remote_public_key(server)
        .unwrap()
        .prologue(&pro)
        .unwrap()
        .build_initiator()
        .unwrap();
    let mut out = vec![0u8; 65_535];
    let n = hs.write_message(payload, &mut out).unwrap();
    out.truncate(n);
    out
}

// ---------------------------------------------------------------------------------------------
// A JSON-RPC speaker over a library `Transport` (one virtual stream of a `ClientLink`).

/// A JSON-RPC speaker over a library `Transport`.
pub struct TransportRpc {
    pub t: Transport,
    pub next_id: u64,
}

impl TransportRpc {
    /// Send one message.
    pub async fn send(&mut self, v: Value) {
        self.t
            .outgoing
            .send(v.to_string().into())
            .await
            .expect("send");
    }

    /// The next message, within [`GUARD`].
    pub async fn recv(&mut self) -> Value {
        let m = tokio::time::timeout(GUARD, self.t.incoming.next())
            .await
            .expect("no message within the hang guard")
            .expect("the stream ended")
            .expect("framing error");
        serde_json::from_slice(&m).expect("invalid JSON")
    }

    /// Send a request and wait for its result (other messages are skipped).
    pub async fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        loop {
            let m = self.recv().await;
            if m["id"] == json!(id) && m.get("method").is_none() {
                return m["result"].clone();
            }
        }
    }
}

/// A stream of `link`, initialized with binary output (`protocol.md` §5.1) and acks. A
/// client that stops reading such a stream stops its window first (1 MiB): that is what holds
/// its process back in the flow-control tests.
pub async fn flow_stream(link: &Arc<execrelay::link::client::ClientLink>) -> TransportRpc {
    let t = tokio::time::timeout(PROMPT, link.open_stream())
        .await
        .expect("open (hang guard)")
        .expect("a stream");
    let mut t = TransportRpc { t, next_id: 0 };
    let init = json!({"clientName": "flow", "capabilities": {"binaryOutput": true, "acks": true}});
    t.call("initialize", init).await;
    t.send(json!({"jsonrpc": "2.0", "method": "initialized", "params": {}}))
        .await;
    t
}

/// Output bytes of `process_id` on `t` until its exit notice, counted from `got` and
/// acknowledged every MiB as they come; returns the total and the notice's params.
pub async fn drain_binary(t: &mut TransportRpc, process_id: &str, mut got: u64) -> (u64, Value) {
    use execrelay::rpc::binary_output::{decode_output_message, is_binary_message};
    let mut acked = got;
    loop {
        let m = tokio::time::timeout(GUARD, t.t.incoming.next())
            .await
            .expect("no message within the hang guard")
            .expect("the stream ended: it was reset")
            .expect("framing error");
        if is_binary_message(&m) {
            let d = decode_output_message(m).expect("a valid binary delta");
            assert_eq!(d.process_id, process_id);
            got += d.data.len() as u64;
            if got - acked >= 1 << 20 {
                acked = got;
                let ack = json!({"processId": process_id, "seq": d.seq});
                t.send(json!({"jsonrpc": "2.0", "method": "process/ack", "params": ack}))
                    .await;
            }
            continue;
        }
        let v: Value = serde_json::from_slice(&m).expect("invalid JSON");
        if v["method"] == "process/exited" {
            return (got, v["params"].clone());
        }
    }
}

/// Whether a process runs with exactly this argv (read from `/proc/PID/cmdline`).
pub fn running(argv: &[&str]) -> bool {
    let want: Vec<u8> = argv
        .iter()
        .flat_map(|a| [a.as_bytes(), b"\0"].concat())
        .collect();
    std::fs::read_dir("/proc")
        .expect("read /proc")
        .flatten()
        .any(|e| std::fs::read(e.path().join("cmdline")).is_ok_and(|c| c == want))
}

/// Bytes that reveal any reordering or loss: a xorshift stream.
pub fn pattern(len: usize, mut seed: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        v.extend_from_slice(&seed.to_le_bytes());
    }
    v.truncate(len);
    v
}
