//! Binary output messages (`protocol.md` §5.1) end to end, on one server with a plain
//! WebSocket and a Noise listener, driven by raw connections that see every message's form.
//!
//! - A client that asks for binary output and one that does not, running the same command:
//!   byte-identical output, the same seqs, the same exit notice; deltas of every stream kind,
//!   of the largest chunk, under a 256-byte process id (WebSocket and Noise).
//! - A resume in the middle of a large output, from JSON to binary and from binary to JSON:
//!   the replay starts right after the last ack, comes in the new connection's form, and the
//!   output is complete and in order (WebSocket and Noise).
//! - `stdio` answers `binaryOutput: false` and keeps sending JSON lines (the built binary).
//! - A malformed binary message from a fake server is refused by the client library with a
//!   clear error, for every way it can be malformed.

mod common;
use common::noise::{pattern, TestAuth, Verdict};
use common::*;

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use execrelay::client::{Client, ClientOptions, StartOptions, Target};
use execrelay::config::{ServerConfig, MAX_PROCESS_ID_BYTES, PUMP_CHUNK_BYTES};
use execrelay::link::client::{ClientLink, NoiseClientConfig};
use execrelay::link::server::NoiseServerConfig;
use execrelay::noise::keys::Keypair;
use execrelay::rpc::binary_output::{
    decode_output_message, encode_output_message, is_binary_message,
};
use execrelay::rpc::messages::StreamName;
use execrelay::server::{Listener, Server};
use execrelay::transport::websocket::connect_websocket;
use execrelay::transport::Transport;

// ---------------------------------------------------------------------------------------------
// One server, two listeners.

/// An in-process server with a `ws://` and a `noise+ws://` listener sharing one registry.
struct Both {
    ws_url: String,
    noise_url: String,
    noise: NoiseClientConfig,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Both {
    async fn start(config: ServerConfig) -> Both {
        let server_keys = Keypair::generate().unwrap();
        let client_keys = Keypair::generate().unwrap();
        let (auth, _entered) = TestAuth::new(&[(&client_keys, Verdict::Allow)]);
        let ws = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let noise = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let ws_url = format!("ws://{}", ws.local_addr().unwrap());
        let noise_url = format!("noise+ws://{}", noise.local_addr().unwrap());
        let listeners = vec![
            Listener::Ws(ws),
            Listener::Noise(
                noise,
                Arc::new(NoiseServerConfig {
                    keys: server_keys.clone(),
                    authorizer: auth,
                    env_id: String::new(),
                }),
            ),
        ];
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(
            Server::new(Arc::new(config))
                .expect("server starts")
                .run(listeners, shutdown.clone()),
        );
        Both {
            ws_url,
            noise_url,
            noise: NoiseClientConfig::new(client_keys, server_keys.public),
            shutdown,
            task,
        }
    }

    /// A new raw connection over plain WebSocket (`noise`: false) or a Noise stream on a link
    /// of its own.
    async fn open(&self, noise: bool) -> Raw {
        let t = if noise {
            let link = ClientLink::connect(&self.noise_url, self.noise.clone())
                .await
                .expect("link");
            link.open_stream().await.expect("stream")
        } else {
            connect_websocket(&self.ws_url, execrelay::config::MAX_MESSAGE_BYTES)
                .await
                .expect("connect")
        };
        assert!(t.binary_messages);
        Raw {
            t,
            next_id: 0,
            events: Vec::new(),
        }
    }

    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(PROMPT, self.task)
            .await
            .expect("server did not stop (hang guard)")
            .expect("server panicked");
    }
}

// ---------------------------------------------------------------------------------------------
// A raw connection that keeps every event with the form it arrived in.

/// An event as it arrived.
#[derive(Debug, Clone)]
enum Ev {
    Output {
        process_id: String,
        seq: u64,
        stream: StreamName,
        data: Bytes,
        /// Arrived as a binary message (else as JSON with base64).
        binary: bool,
    },
    Exited(Value),
    /// `process/outputOmitted` (always JSON).
    Omitted(Value),
}

impl Ev {
    fn seq(&self) -> u64 {
        match self {
            Ev::Output { seq, .. } => *seq,
            Ev::Exited(p) | Ev::Omitted(p) => p["seq"].as_u64().expect("seq"),
        }
    }
}

struct Raw {
    t: Transport,
    next_id: u64,
    /// Events received so far, in arrival order.
    events: Vec<Ev>,
}

impl Raw {
    async fn send(&mut self, v: Value) {
        self.t
            .outgoing
            .send(v.to_string().into())
            .await
            .expect("send");
    }

    /// Receive one message; events are kept, a JSON message other than an event is returned.
    async fn recv(&mut self) -> Option<Value> {
        let m = tokio::time::timeout(GUARD, self.t.incoming.next())
            .await
            .expect("no message within the hang guard")
            .expect("the connection ended")
            .expect("framing error");
        if is_binary_message(&m) {
            let d = decode_output_message(m).expect("a well-formed binary delta");
            self.events.push(Ev::Output {
                process_id: d.process_id,
                seq: d.seq,
                stream: d.stream,
                data: d.data,
                binary: true,
            });
            return None;
        }
        let v: Value = serde_json::from_slice(&m).expect("JSON text");
        match v["method"].as_str() {
            Some("process/outputDelta") => {
                let p = &v["params"];
                self.events.push(Ev::Output {
                    process_id: p["processId"].as_str().unwrap().to_owned(),
                    seq: p["seq"].as_u64().unwrap(),
                    stream: StreamName::from_wire(p["stream"].as_str().unwrap()).unwrap(),
                    data: Bytes::from(unb64(p["chunk"].as_str().unwrap())),
                    binary: false,
                });
                None
            }
            Some("process/exited") => {
                self.events.push(Ev::Exited(v["params"].clone()));
                None
            }
            Some("process/outputOmitted") => {
                self.events.push(Ev::Omitted(v["params"].clone()));
                None
            }
            _ => Some(v),
        }
    }

    /// A request's whole response (events received meanwhile are kept).
    async fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        loop {
            if let Some(v) = self.recv().await {
                if v["id"] == json!(id) {
                    return v;
                }
            }
        }
    }

    /// `initialize` (acks on) with `binary`, resuming `resume` if given, then `initialized`;
    /// the result.
    async fn init(&mut self, binary: bool, resume: Option<(&str, &str)>) -> Value {
        let mut params = json!({"capabilities": {"acks": true, "binaryOutput": binary}});
        if let Some((sid, token)) = resume {
            params["resume"] = json!({"sessionId": sid, "resumeToken": token});
        }
        let r = self.call("initialize", params).await;
        let result = r["result"].clone();
        assert!(result.is_object(), "initialize failed: {r}");
        self.send(json!({"jsonrpc": "2.0", "method": "initialized"}))
            .await;
        result
    }

    /// Receive until `done` holds for the events so far.
    async fn until(&mut self, mut done: impl FnMut(&[Ev]) -> bool) {
        while !done(&self.events) {
            self.recv().await;
        }
    }

    fn output_bytes(&self) -> usize {
        self.events
            .iter()
            .map(|e| match e {
                Ev::Output { data, .. } => data.len(),
                Ev::Exited(_) | Ev::Omitted(_) => 0,
            })
            .sum()
    }
}

fn exited(events: &[Ev]) -> bool {
    events.iter().any(|e| matches!(e, Ev::Exited(_)))
}

// ---------------------------------------------------------------------------------------------
// The same command in both forms.

/// A child driven in lockstep through its stdin, so that each step is exactly one output
/// chunk and the seqs of two runs agree: `o`/`e` write 4 KiB of the pattern file (one write,
/// atomic on a pipe) to stdout/stderr, `O` writes `PUMP_CHUNK_BYTES` in one write into the
/// empty pipe (the largest chunk the server makes), `q` exits with status 3.
const LOCKSTEP: &str = r#"i=0
while read -r c; do
  case $c in
    o) dd if="$1" bs=4096 skip=$i count=1 status=none ;;
    e) dd if="$1" bs=4096 skip=$i count=1 status=none >&2 ;;
    O) dd if="$1" bs=65024 count=1 status=none ;;
    q) exit 3 ;;
  esac
  i=$((i+1))
done"#;

/// The steps and the bytes each one writes.
const STEPS: [(&str, usize); 6] = [
    ("o", 4096),
    ("e", 4096),
    ("O", PUMP_CHUNK_BYTES),
    ("e", 4096),
    ("o", 4096),
    ("q", 0),
];

/// Run the lockstep child over `c` (already initialized) under `id`; the events received.
async fn lockstep_run(c: &mut Raw, id: &str, file: &str) -> Vec<Ev> {
    let r = c
        .call(
            "process/start",
            json!({"processId": id, "argv": ["sh", "-c", LOCKSTEP, "lockstep", file], "pipeStdin": true}),
        )
        .await;
    assert_eq!(r["result"]["processId"], id, "{r}");
    let mut expected = 0;
    for (step, bytes) in STEPS {
        let w = c
            .call(
                "process/write",
                json!({"processId": id, "chunk": b64(format!("{step}\n").as_bytes())}),
            )
            .await;
        assert_eq!(w["result"]["status"], "accepted", "{w}");
        expected += bytes;
        while c.output_bytes() < expected {
            c.recv().await;
        }
    }
    c.until(exited).await;
    c.events.clone()
}

/// The exit notice without its timing (the one field two runs cannot share).
fn exit_without_duration(p: &Value) -> Value {
    let mut p = p.clone();
    p.as_object_mut().unwrap().remove("durationMs");
    p
}

async fn same_command_in_both_forms(noise: bool) {
    let data = pattern(1 << 20, 7);
    let file = file_with(&data);
    let path = file.path().display().to_string();
    let server = Both::start(cfg()).await;
    // The longest process id the protocol allows, in multi-byte characters.
    let id = "é".repeat(MAX_PROCESS_ID_BYTES / 2);
    let mut runs = Vec::new();
    for binary in [true, false] {
        let mut c = server.open(noise).await;
        let init = c.init(binary, None).await;
        assert_eq!(
            init["capabilities"],
            json!({"acks": true, "binaryOutput": binary, "binaryInput": false,
                "retryRefusedWrites": true}),
            "the result says what the server will do"
        );
        runs.push(lockstep_run(&mut c, &id, &path).await);
    }
    let (bin, text) = (&runs[0], &runs[1]);
    // Each form is the one asked for: binary deltas, JSON exit notice; or JSON throughout.
    for (events, binary) in [(bin, true), (text, false)] {
        for e in events.iter() {
            if let Ev::Output { binary: b, .. } = e {
                assert_eq!(*b, binary, "{e:?}");
            }
        }
    }
    // One event per step, the exit notice last: the same seqs, streams and bytes.
    assert_eq!(bin.len(), STEPS.len(), "{bin:?}");
    assert_eq!(text.len(), STEPS.len(), "{text:?}");
    let mut offset = 0;
    for (i, ((b, t), (step, bytes))) in bin.iter().zip(text.iter()).zip(STEPS).enumerate() {
        assert_eq!(b.seq(), i as u64 + 1);
        assert_eq!(t.seq(), i as u64 + 1);
        match (b, t) {
            (
                Ev::Output {
                    process_id: bp,
                    stream: bs,
                    data: bd,
                    ..
                },
                Ev::Output {
                    process_id: tp,
                    stream: ts,
                    data: td,
                    ..
                },
            ) => {
                assert_eq!((bp, tp), (&id, &id));
                let stream = if step == "e" {
                    StreamName::Stderr
                } else {
                    StreamName::Stdout
                };
                assert_eq!((*bs, *ts), (stream, stream));
                let want = if step == "O" {
                    &data[..bytes]
                } else {
                    &data[offset..offset + bytes]
                };
                assert_eq!(&bd[..], want, "step {i} in binary");
                assert_eq!(&td[..], want, "step {i} in JSON");
            }
            (Ev::Exited(bx), Ev::Exited(tx)) => {
                assert_eq!(bx["exitCode"], 3);
                assert_eq!(exit_without_duration(bx), exit_without_duration(tx));
            }
            other => panic!("step {i}: different events {other:?}"),
        }
        offset += 4096;
    }
    server.stop().await;
}

/// The lockstep script writes the largest chunk with `dd bs=65024`: it must be the server's.
const _: () = assert!(PUMP_CHUNK_BYTES == 65_024);

/// The server's largest binary delta, with the longest head and its length prefix, is one
/// Noise record: a bulk stream costs one record per chunk.
const _: () = assert!(
    4 + execrelay::rpc::binary_output::MAX_HEAD_BYTES + PUMP_CHUNK_BYTES
        <= execrelay::noise::record::MAX_RECORD_BODY
);

#[tokio::test]
async fn binary_and_json_clients_get_the_same_output_over_websocket() {
    same_command_in_both_forms(false).await;
}

#[tokio::test]
async fn binary_and_json_clients_get_the_same_output_over_noise() {
    same_command_in_both_forms(true).await;
}

/// A PTY's output arrives as binary deltas of the `pty` stream.
#[tokio::test]
async fn pty_output_comes_as_binary_pty_deltas() {
    let server = Both::start(cfg()).await;
    let mut c = server.open(false).await;
    c.init(true, None).await;
    let r = c
        .call(
            "process/start",
            json!({"processId": "t", "argv": ["printf", "on a terminal"], "tty": true}),
        )
        .await;
    assert!(r["result"]["pid"].is_u64(), "{r}");
    c.until(exited).await;
    let mut out = Vec::new();
    for e in &c.events {
        if let Ev::Output {
            stream,
            data,
            binary,
            ..
        } = e
        {
            assert_eq!((*stream, *binary), (StreamName::Pty, true));
            out.extend_from_slice(data);
        }
    }
    assert_eq!(text(&out), "on a terminal");
    server.stop().await;
}

/// `outputCapKeep: "headAndTail"` on a binary connection: the head and the tail come as binary
/// deltas, the `process/outputOmitted` notice between them as JSON, with its own seq.
#[tokio::test]
async fn the_omitted_notice_is_json_between_binary_deltas() {
    let server = Both::start(cfg()).await;
    let mut c = server.open(false).await;
    c.init(true, None).await;
    let r = c
        .call(
            "process/start",
            json!({"processId": "h", "argv": ["sh", "-c", "printf 0123456789ABCDEFGHIJ"],
                   "outputBytesCap": 8, "outputCapKeep": "headAndTail"}),
        )
        .await;
    assert!(r["result"]["pid"].is_u64(), "{r}");
    c.until(exited).await;
    let seqs: Vec<u64> = c.events.iter().map(Ev::seq).collect();
    assert_eq!(
        seqs,
        (1..=seqs.len() as u64).collect::<Vec<_>>(),
        "one seq each"
    );
    let mut head = Vec::new();
    let mut tail = Vec::new();
    let mut notices = 0;
    for e in &c.events {
        match e {
            Ev::Output { data, binary, .. } => {
                assert!(*binary, "deltas in the connection's form");
                if notices == 0 { &mut head } else { &mut tail }.extend_from_slice(data);
            }
            Ev::Omitted(p) => {
                notices += 1;
                assert_eq!(p["stream"], "stdout", "{p}");
                assert_eq!(p["omittedBytes"], 12, "{p}");
            }
            Ev::Exited(p) => assert_eq!(p["droppedBytes"], 12, "{p}"),
        }
    }
    assert_eq!(
        (text(&head), notices, text(&tail)),
        ("0123".into(), 1, "GHIJ".into())
    );
    server.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Resume across forms.

async fn resume_switching_form(noise: bool, first_binary: bool) {
    const TOTAL: usize = 4 << 20;
    const RETAINED: usize = 512 << 10;
    let data = pattern(TOTAL, 11);
    let file = file_with(&data);
    // With acks, at most RETAINED bytes go unacknowledged: the child is held back in the
    // middle of its output until the second connection acknowledges.
    let server = Both::start(ServerConfig {
        retained_output_bytes: RETAINED,
        ..cfg()
    })
    .await;

    let mut a = server.open(noise).await;
    let init = a.init(first_binary, None).await;
    let (sid, token) = credentials(&init);
    let r = a
        .call(
            "process/start",
            json!({"processId": "big", "argv": ["cat", file.path()]}),
        )
        .await;
    assert!(r["result"]["pid"].is_u64(), "{r}");
    // Part of the output, then an ack of what arrived, made certain by a round trip.
    while a.output_bytes() < RETAINED / 2 {
        a.recv().await;
    }
    let acked = a.events.last().map(Ev::seq).expect("events");
    a.send(json!({"jsonrpc": "2.0", "method": "process/ack", "params": {"processId": "big", "seq": acked}}))
        .await;
    a.call("process/list", json!({})).await;
    let before = std::mem::take(&mut a.events);
    assert!(!exited(&before), "the child is held back by the retention");
    drop(a);

    let mut b = server.open(noise).await;
    let init = b.init(!first_binary, Some((&sid, &token))).await;
    assert_eq!(init["resumed"], true);
    assert_eq!(init["capabilities"]["binaryOutput"], !first_binary);
    // Acknowledge as output arrives, so that the retention lets the child go on.
    let mut acked_b = 0;
    while !exited(&b.events) {
        b.recv().await;
        let last = b.events.last().map_or(0, Ev::seq);
        if last > acked_b {
            acked_b = last;
            b.send(json!({"jsonrpc": "2.0", "method": "process/ack", "params": {"processId": "big", "seq": last}}))
                .await;
        }
    }
    let after = std::mem::take(&mut b.events);

    // Each connection got its own form, replays included.
    for (events, binary) in [(&before, first_binary), (&after, !first_binary)] {
        for e in events {
            if let Ev::Output { binary: b, .. } = e {
                assert_eq!(*b, binary);
            }
        }
    }
    // The replay starts right after the last ack: nothing acknowledged comes again.
    assert_eq!(after.first().map(Ev::seq), Some(acked + 1));
    // Within each connection, seqs are contiguous.
    for events in [&before, &after] {
        for w in events.windows(2) {
            assert_eq!(w[1].seq(), w[0].seq() + 1);
        }
    }
    // An event seen on both connections (sent, not yet acknowledged) is the same event.
    let mut by_seq: BTreeMap<u64, Ev> = BTreeMap::new();
    for e in before.iter().chain(after.iter()) {
        if let Some(seen) = by_seq.get(&e.seq()) {
            match (seen, e) {
                (Ev::Output { data: x, .. }, Ev::Output { data: y, .. }) => assert_eq!(x, y),
                (Ev::Exited(x), Ev::Exited(y)) => assert_eq!(x, y),
                other => panic!("seq {} differs: {other:?}", e.seq()),
            }
        } else {
            by_seq.insert(e.seq(), e.clone());
        }
    }
    // Complete and in order, the exit notice last.
    let seqs: Vec<u64> = by_seq.keys().copied().collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
    let mut out = Vec::with_capacity(TOTAL);
    let mut last_exit = false;
    for e in by_seq.values() {
        match e {
            Ev::Output { data, .. } => {
                assert!(!last_exit, "output after the exit notice");
                out.extend_from_slice(data);
            }
            Ev::Exited(p) => {
                assert_eq!(p["exitCode"], 0);
                last_exit = true;
            }
            Ev::Omitted(p) => panic!("no cap was asked for: {p}"),
        }
    }
    assert!(last_exit);
    assert_eq!(out.len(), TOTAL);
    assert!(out == data, "the output differs from the file");
    server.stop().await;
}

#[tokio::test]
async fn resume_from_json_to_binary_over_websocket() {
    resume_switching_form(false, false).await;
}

#[tokio::test]
async fn resume_from_binary_to_json_over_websocket() {
    resume_switching_form(false, true).await;
}

#[tokio::test]
async fn resume_from_json_to_binary_over_noise() {
    resume_switching_form(true, false).await;
}

#[tokio::test]
async fn resume_from_binary_to_json_over_noise() {
    resume_switching_form(true, true).await;
}

// ---------------------------------------------------------------------------------------------
// stdio.

/// The next line of a stdio server, as JSON (every line must be).
async fn next_line(lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>) -> Value {
    let line = tokio::time::timeout(GUARD, lines.next_line())
        .await
        .expect("no line (hang guard)")
        .expect("read")
        .expect("stdout ended");
    serde_json::from_str::<Value>(&line).expect("every line is JSON")
}

/// `stdio` cannot carry binary messages: a client that asks is told `false` and gets JSON
/// lines, its output in base64.
#[tokio::test]
async fn stdio_answers_false_and_keeps_sending_json_lines() {
    let mut child = tokio::process::Command::new(bin())
        .args(["serve", "--listen", "stdio"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn");
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let send = |v: Value| format!("{v}\n");
    stdin
        .write_all(
            send(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"capabilities": {"acks": true, "binaryOutput": true}}}))
            .as_bytes(),
        )
        .await
        .unwrap();
    let init = next_line(&mut lines).await;
    assert_eq!(
        init["result"]["capabilities"],
        json!({"acks": true, "binaryOutput": false, "binaryInput": false,
            "retryRefusedWrites": true})
    );
    // Bytes that would break a line if they were sent raw.
    let payload = "a\\nb\\0c\\377";
    stdin
        .write_all(
            (send(json!({"jsonrpc": "2.0", "method": "initialized"}))
                + &send(json!({"jsonrpc": "2.0", "id": 2, "method": "process/start",
                    "params": {"processId": "p", "argv": ["printf", payload]}})))
                .as_bytes(),
        )
        .await
        .unwrap();
    let mut out = Vec::new();
    loop {
        let v = next_line(&mut lines).await;
        match v["method"].as_str() {
            Some("process/outputDelta") => {
                out.extend(unb64(v["params"]["chunk"].as_str().unwrap()))
            }
            Some("process/exited") => break,
            _ => {}
        }
    }
    assert_eq!(out, b"a\nb\0c\xff");
    drop(stdin);
    let _ = tokio::time::timeout(GUARD, child.wait()).await;
}

// ---------------------------------------------------------------------------------------------
// A fake server that sends a malformed binary message.

/// A WebSocket server that answers `initialize` and `process/start` like a real one, then
/// sends `bad` as a binary frame. Returns its URL.
async fn fake_server(bad: Vec<u8>) -> String {
    use tokio_tungstenite::tungstenite::Message;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let mut ws = tokio_tungstenite::accept_async(tcp).await.unwrap();
        while let Some(Ok(m)) = ws.next().await {
            let Message::Text(text) = m else { continue };
            let v: Value = serde_json::from_str(&text).unwrap();
            let reply = match v["method"].as_str() {
                Some("initialize") => json!({"jsonrpc": "2.0", "id": v["id"], "result": {
                    "protocolVersion": 1, "serverVersion": "fake", "sessionId": "s",
                    "resumeToken": "t", "resumed": false,
                    "limits": {"maxMessageBytes": 16777216, "maxProcesses": 8,
                        "retainedOutputBytes": 8388608, "detachedSessionTtlMs": 60000},
                    "capabilities": {"acks": true, "binaryOutput": true}}}),
                Some("process/start") => {
                    json!({"jsonrpc": "2.0", "id": v["id"], "result": {"processId": "p", "pid": 1}})
                }
                _ => continue,
            };
            ws.send(Message::Text(reply.to_string().into()))
                .await
                .unwrap();
            if v["method"] == "process/start" {
                // A good delta first, so the bad one is not the first thing the client sees.
                let good = encode_output_message("p", 1, StreamName::Stdout, b"fine\n");
                ws.send(Message::Binary(good.into())).await.unwrap();
                ws.send(Message::Binary(bad.clone().into())).await.unwrap();
            }
        }
    });
    url
}

#[tokio::test]
async fn a_malformed_binary_message_is_refused_with_a_clear_error() {
    let good = encode_output_message("p", 2, StreamName::Stdout, b"xyz");
    let with = |at: usize, bytes: &[u8]| {
        let mut m = good.clone();
        m[at..at + bytes.len()].copy_from_slice(bytes);
        m
    };
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("wrong kind", with(0, &[0x01]), "unknown kind 0x01"),
        ("unknown stream", with(1, &[7]), "unknown stream 7"),
        (
            "lengths that do not add up",
            with(10, &[0, 9]),
            "shorter than its head",
        ),
        (
            "process id length 0",
            with(10, &[0, 0]),
            "process id of 0 bytes",
        ),
        (
            "process id over 256 bytes",
            with(10, &[1, 1]),
            "process id of 257 bytes",
        ),
        ("process id not UTF-8", with(12, &[0xff]), "not UTF-8"),
        ("empty chunk", good[..13].to_vec(), "empty chunk"),
        (
            "too short for a head",
            vec![0, 0, 0],
            "shorter than its head",
        ),
    ];
    for (what, bad, reason) in cases {
        let url = fake_server(bad).await;
        let client = Client::connect(
            Target::Ws(url),
            ClientOptions {
                reconnect: false,
                ..ClientOptions::default()
            },
        )
        .await
        .expect("connect to the fake server");
        let mut p = client
            .start(StartOptions::new("p", ["true"]))
            .await
            .expect("start");
        let mut got = Vec::new();
        while let Some(ev) = tokio::time::timeout(GUARD, p.next_event())
            .await
            .expect("the event stream did not end (hang guard)")
        {
            if let execrelay::client::ProcessEvent::Output { data, .. } = ev {
                got.extend_from_slice(&data);
            }
        }
        assert_eq!(got, b"fine\n", "{what}: the good delta before it arrived");
        let why = client.lost_reason().expect("the session is lost");
        assert!(
            why.contains("malformed binary output message") && why.contains(reason),
            "{what}: {why}"
        );
        // Later calls fail with the same reason, not a bare "connection lost".
        let err = client
            .server_info()
            .await
            .expect_err("the connection is gone");
        assert!(
            err.to_string().contains("malformed")
                || matches!(err, execrelay::client::ClientError::SessionLost(_)),
            "{what}: {err}"
        );
    }
}
