//! Binary writes (`protocol.md` §5.2, `capabilities.binaryInput`): negotiated on WebSocket and
//! Noise streams, refused on stdio; a binary write means exactly the JSON `process/write` with
//! its fields (same ordering among all requests, same `writeId` dedupe), answered by an
//! ordinary JSON response; its close-stdin flag closes stdin right after the chunk; every
//! malformed layout, and a binary message on a connection that did not negotiate them, is
//! answered `-32700` with id `null` and the connection carries on. The client library sends
//! its stdin as binary writes where negotiated, and a resume in the middle of a binary upload
//! loses and repeats nothing.
//!
//! Every wait is on a message, bounded by a hang guard.

mod common;
use common::noise::{pattern, TestAuth, Verdict};
use common::*;

use std::sync::Arc;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use execrelay::client::{Client, ClientOptions, StartOptions, Target};
use execrelay::config::MAX_CHUNK_BYTES;
use execrelay::link::client::{ClientLink, NoiseClientConfig};
use execrelay::link::server::NoiseServerConfig;
use execrelay::noise::keys::Keypair;
use execrelay::rpc::binary_output::{decode_output_message, is_binary_message};
use execrelay::rpc::binary_write::encode_write_head;
use execrelay::server::{Listener, Server};
use execrelay::transport::websocket::connect_websocket;
use execrelay::transport::{OutMessage, Transport};

/// An in-process server with a `ws://` and a `noise+ws://` listener.
struct Both {
    ws_url: String,
    noise_url: String,
    noise: NoiseClientConfig,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Both {
    async fn start() -> Both {
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
            Server::new(Arc::new(cfg()))
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
        Raw {
            t,
            next_id: 0,
            stdout: Vec::new(),
            exited: false,
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

/// A raw connection: JSON requests, binary writes, and the output of its processes.
struct Raw {
    t: Transport,
    next_id: u64,
    stdout: Vec<u8>,
    exited: bool,
}

impl Raw {
    async fn send(&mut self, m: OutMessage) {
        self.t.outgoing.send(m).await.expect("send");
    }

    async fn request(&mut self, method: &str, params: Value) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        let v = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.send(v.to_string().into()).await;
        id
    }

    /// A binary write as request `id` (the caller's choice of id).
    async fn binary_write(&mut self, id: u64, pid: &str, write_id: &str, close: bool, data: &[u8]) {
        self.send(OutMessage::Binary {
            head: encode_write_head(id, close, pid, write_id),
            payload: Bytes::copy_from_slice(data),
        })
        .await;
    }

    /// A binary message as it is.
    async fn raw_binary(&mut self, bytes: Vec<u8>) {
        self.send(OutMessage::Binary {
            head: Bytes::from(bytes),
            payload: Bytes::new(),
        })
        .await;
    }

    /// One message: a JSON message other than an output delta or exit notice is returned;
    /// those are kept (output appended, the exit noted).
    async fn recv_one(&mut self) -> Option<Value> {
        let m = tokio::time::timeout(GUARD, self.t.incoming.next())
            .await
            .expect("no message within the hang guard")
            .expect("the connection ended")
            .expect("framing error");
        if is_binary_message(&m) {
            let d = decode_output_message(m).expect("a binary delta");
            self.stdout.extend_from_slice(&d.data);
            return None;
        }
        let v: Value = serde_json::from_slice(&m).expect("JSON");
        match v["method"].as_str() {
            Some("process/outputDelta") => {
                self.stdout
                    .extend(unb64(v["params"]["chunk"].as_str().unwrap_or_default()));
                None
            }
            Some("process/exited") => {
                self.exited = true;
                None
            }
            _ => Some(v),
        }
    }

    /// The next JSON message that is not an output delta or exit notice.
    async fn next_json(&mut self) -> Value {
        loop {
            if let Some(v) = self.recv_one().await {
                return v;
            }
        }
    }

    /// Responses (and errors) by id, in whatever order they come, for `n` of them.
    async fn responses(&mut self, n: usize) -> Vec<Value> {
        let mut got = Vec::new();
        while got.len() < n {
            got.push(self.next_json().await);
        }
        got
    }

    async fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.request(method, params).await;
        let r = self.next_json().await;
        assert_eq!(r["id"], json!(id), "{r}");
        r
    }

    async fn init(&mut self, binary_input: bool) -> Value {
        let r = self
            .call(
                "initialize",
                json!({"capabilities": {"binaryInput": binary_input}}),
            )
            .await;
        self.send(
            json!({"jsonrpc": "2.0", "method": "initialized"})
                .to_string()
                .into(),
        )
        .await;
        r["result"].clone()
    }

    async fn until_exited(&mut self) {
        while !self.exited {
            if let Some(v) = self.recv_one().await {
                panic!("unexpected message before the exit: {v}");
            }
        }
    }

    async fn start_cat(&mut self, pid: &str) {
        let r = self
            .call(
                "process/start",
                json!({"processId": pid, "argv": ["cat"], "pipeStdin": true}),
            )
            .await;
        assert!(r["result"].is_object(), "{r}");
    }
}

fn status(r: &Value) -> &str {
    r["result"]["status"].as_str().unwrap_or("")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_input_is_negotiated_on_websocket_and_noise() {
    let both = Both::start().await;
    for noise in [false, true] {
        let mut c = both.open(noise).await;
        let result = c.init(true).await;
        assert_eq!(result["capabilities"]["binaryInput"], true, "{result}");
        let mut c = both.open(noise).await;
        let result = c.init(false).await;
        assert_eq!(result["capabilities"]["binaryInput"], false, "{result}");
        // Not negotiated: a binary write is a parse error, id null, and nothing else happens.
        c.start_cat("p").await;
        c.binary_write(50, "p", "", false, b"never\n").await;
        let r = c.next_json().await;
        assert_eq!(r["id"], Value::Null, "{r}");
        assert_eq!(r["error"]["code"], -32700, "{r}");
        let msg = r["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains("binaryInput"), "{msg}");
        let r = c
            .call(
                "process/write",
                json!({"processId": "p", "chunk": b64(b"json\n")}),
            )
            .await;
        assert_eq!(status(&r), "accepted", "{r}");
        let r = c
            .call("process/closeStdin", json!({"processId": "p"}))
            .await;
        assert!(r["result"].is_object(), "{r}");
        c.until_exited().await;
        assert_eq!(
            text(&c.stdout),
            "json\n",
            "the refused binary write wrote nothing"
        );
    }
    both.stop().await;
}

/// stdio cannot carry binary messages: it answers `false`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_answers_false() {
    let mut t = in_process(cfg(), 1 << 20);
    let r = t
        .client
        .call("initialize", json!({"capabilities": {"binaryInput": true}}))
        .await;
    assert_eq!(r["capabilities"]["binaryInput"], false, "{r}");
}

/// Binary and JSON writes sent back to back, without waiting, on one process: the child
/// gets them in request order, each answered by its id; a `writeId` seen in either form is
/// not written again in the other; the close flag closes stdin after its chunk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_and_json_writes_interleave_in_order_and_share_write_ids() {
    let both = Both::start().await;
    for noise in [false, true] {
        let mut c = both.open(noise).await;
        c.init(true).await;
        c.start_cat("p").await;
        let mut expected = Vec::new();
        let mut ids = Vec::new();
        for i in 0..40u64 {
            let piece = format!("{i:02}:").into_bytes();
            let piece = [piece, pattern(i as usize * 1500 + 1, i)].concat();
            let write_id = format!("w-{i}");
            if i % 2 == 0 {
                let id = 10_000 + i;
                c.binary_write(id, "p", &write_id, false, &piece).await;
                ids.push(id);
            } else {
                let params = json!({"processId": "p", "chunk": b64(&piece), "writeId": write_id});
                ids.push(c.request("process/write", params).await);
            }
            expected.extend_from_slice(&piece);
        }
        // The same writeIds again, each in the other form: accepted, not written twice.
        for i in [0u64, 1, 38, 39] {
            let write_id = format!("w-{i}");
            if i % 2 == 1 {
                c.binary_write(20_000 + i, "p", &write_id, false, b"DUPLICATE")
                    .await;
                ids.push(20_000 + i);
            } else {
                let params =
                    json!({"processId": "p", "chunk": b64(b"DUPLICATE"), "writeId": write_id});
                ids.push(c.request("process/write", params).await);
            }
        }
        // The last chunk closes stdin: cat ends.
        c.binary_write(30_000, "p", "last", true, b"end\n").await;
        ids.push(30_000);
        expected.extend_from_slice(b"end\n");
        let answers = c.responses(ids.len()).await;
        let answered: Vec<u64> = answers
            .iter()
            .map(|r| {
                assert_eq!(status(r), "accepted", "{r}");
                r["id"].as_u64().expect("a number id, as sent")
            })
            .collect();
        // Per-process requests are answered in request order.
        assert_eq!(answered, ids, "answers in request order");
        c.until_exited().await;
        assert_eq!(c.stdout.len(), expected.len());
        assert!(
            c.stdout == expected,
            "the child got every write once, in order"
        );
        // After the close flag, stdin is closed for JSON writes too.
        let r = c
            .call(
                "process/write",
                json!({"processId": "p", "chunk": b64(b"x")}),
            )
            .await;
        assert!(matches!(status(&r), "stdinClosed" | "exited"), "{r}");
    }
    both.stop().await;
}

/// Every malformed layout is answered `-32700`, id `null`, with words naming what is wrong;
/// the connection carries on and nothing reaches the child.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_malformed_binary_write_gets_its_error_and_the_connection_carries_on() {
    let both = Both::start().await;
    let mut c = both.open(false).await;
    c.init(true).await;
    c.start_cat("p").await;
    let good = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut v = encode_write_head(5, false, "p", "w").to_vec();
        v.extend_from_slice(b"bad!");
        f(&mut v);
        v
    };
    let mut oversize = encode_write_head(6, false, "p", "").to_vec();
    oversize.resize(oversize.len() + MAX_CHUNK_BYTES + 1, b'x');
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (good(&|v| v.truncate(9)), "shorter than its 13-byte head"),
        (good(&|v| v[0] = 0x03), "unknown binary message kind 0x03"),
        (good(&|v| v[1] = 0x04), "reserved bits"),
        (
            good(&|v| v[2..10].copy_from_slice(&u64::MAX.to_be_bytes())),
            "above 2^53",
        ),
        (
            good(&|v| v[10..12].copy_from_slice(&[0, 0])),
            "process id length 0",
        ),
        (
            good(&|v| v[10..12].copy_from_slice(&[1, 1])),
            "process id length 257",
        ),
        (good(&|v| v[12] = 100), "do not add up"),
        (good(&|v| v[13] = 0xff), "process id is not UTF-8"),
        (good(&|v| v[14] = 0xfe), "writeId is not UTF-8"),
        (oversize, "exceeds 65536"),
    ];
    for (bytes, words) in cases {
        c.raw_binary(bytes).await;
        let r = c.next_json().await;
        assert_eq!(r["id"], Value::Null, "{words}: {r}");
        assert_eq!(r["error"]["code"], -32700, "{words}: {r}");
        let msg = r["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains(words), "{words:?} not in {msg:?}");
    }
    // Still serving, and nothing malformed was written.
    c.binary_write(7, "p", "", true, b"ok\n").await;
    let r = c.next_json().await;
    assert_eq!((r["id"].as_u64(), status(&r)), (Some(7), "accepted"), "{r}");
    c.until_exited().await;
    assert_eq!(text(&c.stdout), "ok\n");
    both.stop().await;
}

/// A binary write to an unknown process is answered like the JSON one (by its id).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binary_write_is_answered_as_the_json_one_would_be() {
    let both = Both::start().await;
    let mut c = both.open(true).await;
    c.init(true).await;
    c.binary_write(3, "nobody", "", false, b"x").await;
    let binary = c.next_json().await;
    let json = c
        .call(
            "process/write",
            json!({"processId": "nobody", "chunk": b64(b"x")}),
        )
        .await;
    assert_eq!(binary["id"], 3);
    assert_eq!(binary["error"], json["error"], "{binary} vs {json}");
    both.stop().await;
}

async fn sha256sum_output(p: &mut execrelay::client::ProcessHandle) -> String {
    let (out, code) = stdout_and_code(p).await;
    assert_eq!(code, Some(0));
    text(&out)
}

/// The library's stdin over binary writes, on both transports, with the connection killed
/// again and again in the middle of the upload: every byte arrives exactly once, in order,
/// and the last write's close flag ends the child's input.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_in_the_middle_of_a_binary_upload_loses_and_repeats_nothing() {
    let both = Both::start().await;
    for noise in [false, true] {
        let target = if noise {
            Target::Noise {
                url: both.noise_url.clone(),
                config: Arc::new(both.noise.clone()),
                pool: Default::default(),
            }
        } else {
            Target::Ws(both.ws_url.clone())
        };
        let client = Client::connect(target, ClientOptions::default())
            .await
            .unwrap();
        let data = pattern(16 << 20, 7);
        let mut opts = StartOptions::new("sum", ["sha256sum"]);
        opts.params.pipe_stdin = true;
        let mut p = client.start(opts).await.unwrap();
        let mut w = p.stdin_writer();
        assert!(w.binary_writes().await, "binary writes negotiated");
        for (i, piece) in data.chunks(100_000).enumerate() {
            w.write(Bytes::copy_from_slice(piece)).await.unwrap();
            if i % 30 == 15 {
                client.break_connection();
            }
        }
        w.finish().await.unwrap();
        assert_eq!(
            sha256sum_output(&mut p).await,
            format!("{}  -\n", sha256(&data))
        );
        assert!(client.connection_count() >= 5, "killed and resumed");
        client.shutdown().await;
    }
    both.stop().await;
}
