//! The fuzz targets' seed corpus from real traffic (`soak capture`, `fuzz/seeds/README.md`):
//! an exec server and a relay in this process, the client library driving a varied session
//! (output in both forms, stdin, a terminal, signals, a terminate, reads, lists, errors, a
//! broken connection and its resume) over plain WebSocket, a direct Noise link and through
//! the relay, and a tap on every TCP connection. The tap's bytes are cut into WebSocket
//! messages (the client's unmasked) and those into what each fuzz target takes:
//!
//! - `frame`: every link frame seen (direct, client link, environment link);
//! - `handshake`: message 1 and message 2 as they crossed, and their payloads after
//!   decryption (the keys are the fuzz targets' own fixed keys, so the server and the client
//!   here use them too);
//! - `record`, `stream`: the sessions' messages in order, in each target's input format (the
//!   messages inside a Noise stream are exactly those of a plain WebSocket connection);
//! - `jsonrpc`: every JSON-RPC message, as a line;
//! - `binary_output`: every binary output message.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use execrelay::client::{Client, ClientOptions, ProcessEvent, StartOptions, Target};
use execrelay::config::ServerConfig;
use execrelay::link::client::{LinkPool, NoiseClientConfig};
use execrelay::link::dial::TlsRoots;
use execrelay::link::environment::RelayDial;
use execrelay::link::server::NoiseServerConfig;
use execrelay::noise::authorizer::KeysAuthorizer;
use execrelay::noise::handshake::{prologue, read_hello, NOISE_PARAMS};
use execrelay::noise::keys::{public_line, AuthorizedKeys, Keypair};
use execrelay::rpc::messages::TermSize;
use execrelay::server::{Listener, Server};
use execrelay_protocol::frame::{Frame, FrameType};
use execrelay_protocol::keys::environments::EnvironmentsFile;
use execrelay_relay::server::settings::RelaySettings;
use execrelay_relay::server::{RelayServer, RelayServerConfig};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// `soak capture`'s flags.
#[derive(Debug, Clone, clap::Args)]
pub struct CaptureArgs {
    /// The corpus directory (one subdirectory per target; files `real-*` are replaced).
    #[arg(long, default_value = "fuzz/seeds")]
    pub out: PathBuf,
}

/// The fuzz targets' fixed keys (`fuzz/fuzz_targets/handshake.rs`, `record.rs`).
const CLIENT_PRIVATE: [u8; 32] = [1; 32];
const SERVER_PRIVATE: [u8; 32] = [2; 32];

/// What one tapped connection carried, each direction in order.
#[derive(Default, Clone)]
struct Tapped {
    what: &'static str,
    up: Vec<u8>,
    down: Vec<u8>,
}

type Taps = Arc<Mutex<Vec<Arc<Mutex<Tapped>>>>>;

/// A proxy on 127.0.0.1 that records every byte it carries to `upstream`.
async fn tap(what: &'static str, upstream: std::net::SocketAddr, taps: Taps) -> Result<String> {
    let l = TcpListener::bind("127.0.0.1:0").await?;
    let addr = l.local_addr()?;
    tokio::spawn(async move {
        while let Ok((down, _)) = l.accept().await {
            let Ok(up) = TcpStream::connect(upstream).await else {
                continue;
            };
            let rec = Arc::new(Mutex::new(Tapped {
                what,
                ..Default::default()
            }));
            taps.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(rec.clone());
            let (mut dr, mut dw) = down.into_split();
            let (mut ur, mut uw) = up.into_split();
            let r1 = rec.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                while let Ok(n) = dr.read(&mut buf).await {
                    if n == 0 || uw.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                    r1.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .up
                        .extend_from_slice(&buf[..n]);
                }
                let _ = uw.shutdown().await;
            });
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                while let Ok(n) = ur.read(&mut buf).await {
                    if n == 0 || dw.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                    rec.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .down
                        .extend_from_slice(&buf[..n]);
                }
                let _ = dw.shutdown().await;
            });
        }
    });
    Ok(addr.to_string())
}

/// The WebSocket messages in one direction's bytes (after the HTTP head): (opcode, payload).
fn ws_messages(bytes: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut out = Vec::new();
    let Some(head) = bytes.windows(4).position(|w| w == b"\r\n\r\n") else {
        return out;
    };
    let mut b = &bytes[head + 4..];
    let mut partial: Option<(u8, Vec<u8>)> = None;
    while b.len() >= 2 {
        let (fin, op) = (b[0] & 0x80 != 0, b[0] & 0x0f);
        let masked = b[1] & 0x80 != 0;
        let mut len = (b[1] & 0x7f) as usize;
        let mut at = 2;
        if len == 126 {
            if b.len() < 4 {
                break;
            }
            len = u16::from_be_bytes([b[2], b[3]]) as usize;
            at = 4;
        } else if len == 127 {
            if b.len() < 10 {
                break;
            }
            len = u64::from_be_bytes(b[2..10].try_into().unwrap_or([0; 8])) as usize;
            at = 10;
        }
        let mask = if masked {
            if b.len() < at + 4 {
                break;
            }
            let m = [b[at], b[at + 1], b[at + 2], b[at + 3]];
            at += 4;
            Some(m)
        } else {
            None
        };
        if b.len() < at + len {
            break;
        }
        let mut payload = b[at..at + len].to_vec();
        if let Some(m) = mask {
            for (i, x) in payload.iter_mut().enumerate() {
                *x ^= m[i % 4];
            }
        }
        b = &b[at + len..];
        match (op, partial.take()) {
            (0, Some((o, mut acc))) => {
                acc.extend_from_slice(&payload);
                if fin {
                    out.push((o, acc));
                } else {
                    partial = Some((o, acc));
                }
            }
            (1 | 2, _) if !fin => partial = Some((op, payload)),
            (1 | 2, _) => out.push((op, payload)),
            _ => {}
        }
    }
    out
}

/// A varied session through `target`: what the library and an application send.
async fn session(target: Target, binary: bool) -> Result<()> {
    let opts = ClientOptions {
        binary_output: binary,
        ..ClientOptions::default()
    };
    let client = Client::connect(target, opts).await?;
    let drain = |mut h: execrelay::client::ProcessHandle| async move {
        while let Some(ev) = h.next_event().await {
            if matches!(ev, ProcessEvent::Exited(_)) {
                break;
            }
        }
    };
    let h = client
        .start(StartOptions::new(
            "hello",
            [
                "sh",
                "-c",
                "echo hello; echo oops >&2; printf '\\000\\001\\377'; exit 3",
            ],
        ))
        .await?;
    drain(h).await;
    let mut s = StartOptions::new("cat", ["cat"]);
    s.params.pipe_stdin = true;
    let mut h = client.start(s).await?;
    h.write(b"a line of stdin\n").await?;
    let mut w = h.stdin_writer();
    w.write(Bytes::from(vec![b'x'; 100_000])).await.ok();
    w.finish().await.ok();
    drain(h).await;
    let mut t = StartOptions::new("tty", ["sh", "-c", "stty size; read x; echo got $x"]);
    t.params.tty = true;
    t.params.pipe_stdin = true;
    t.params.size = Some(TermSize { rows: 24, cols: 80 });
    t.params.env.insert("TERM".into(), Some("xterm".into()));
    let h = client.start(t).await?;
    h.resize(TermSize {
        rows: 50,
        cols: 132,
    })
    .await
    .ok();
    let c = h.controller();
    c.write(b"yes\n", "w-1").await.ok();
    c.signal("SIGWINCH").await.ok();
    drain(h).await;
    let mut s = StartOptions::new("sleeper", ["sleep", "60"]);
    s.params.timeout_ms = Some(30_000);
    s.params.kill_grace_ms = Some(100);
    let h = client.start(s).await?;
    let _ = client.call("process/list", json!({})).await;
    h.terminate(Some(Duration::from_millis(100))).await.ok();
    drain(h).await;
    // Reads, a bad request, an unknown process, a duplicate id, server info.
    let h = client
        .start(StartOptions::new("seq", ["seq", "1", "2000"]))
        .await?;
    let _ = client
        .call(
            "process/read",
            json!({"processId": "seq", "afterSeq": 0, "maxBytes": 4096, "waitMs": 100}),
        )
        .await;
    let _ = client
        .call("process/terminate", json!({"processId": "nobody"}))
        .await;
    let _ = client.call("process/start", json!({"processId": 7})).await;
    let _ = client.start(StartOptions::new("seq", ["true"])).await.err();
    let _ = client.server_info().await;
    // A lost connection, and the resume that replays what was not acknowledged.
    client.break_connection();
    drain(h).await;
    let h = client
        .start(StartOptions::new(
            "big",
            ["head", "-c", "300000", "/dev/zero"],
        ))
        .await?;
    drain(h).await;
    client.shutdown().await;
    Ok(())
}

fn write_seeds(dir: &std::path::Path, prefix: &str, seeds: &BTreeSet<Vec<u8>>) -> Result<usize> {
    std::fs::create_dir_all(dir)?;
    for e in std::fs::read_dir(dir)?.flatten() {
        if e.file_name().to_string_lossy().starts_with(prefix) {
            std::fs::remove_file(e.path())?;
        }
    }
    for (i, s) in seeds.iter().enumerate() {
        std::fs::write(dir.join(format!("{prefix}{i:03}")), s)?;
    }
    Ok(seeds.len())
}

/// Sequences of messages in a target's input format: `op LEN:u16 BYTES` each (`op` 1 for the
/// record target: a message sealed into frames), `per` messages a seed.
fn sequences(msgs: &[Vec<u8>], op: Option<u8>, per: usize, limit: usize) -> BTreeSet<Vec<u8>> {
    let mut out = BTreeSet::new();
    for chunk in msgs.chunks(per) {
        let mut s = Vec::new();
        for m in chunk {
            let m = &m[..m.len().min(u16::MAX as usize)];
            if let Some(op) = op {
                s.push(op);
            }
            s.extend_from_slice(&(m.len() as u16).to_be_bytes());
            s.extend_from_slice(m);
        }
        out.insert(s);
        if out.len() >= limit {
            break;
        }
    }
    out
}

/// Run the capture; the process exit code.
pub async fn run(args: CaptureArgs) -> Result<i32> {
    let dir = tempfile::tempdir()?;
    let client_keys = Keypair::from_private(CLIENT_PRIVATE)?;
    let server_keys = Keypair::from_private(SERVER_PRIVATE)?;
    let relay_keys = Keypair::generate()?;
    let auth_path = dir.path().join("authorized_keys");
    std::fs::write(&auth_path, public_line(&client_keys.public, "fuzz") + "\n")?;
    let authorizer = || -> Result<_> {
        Ok(Arc::new(KeysAuthorizer::new(
            AuthorizedKeys::load(&auth_path)?,
            None,
        )))
    };
    let taps: Taps = Arc::default();
    let shutdown = CancellationToken::new();

    // The relay, with the exec server's key listed for `fuzz`.
    let envs = dir.path().join("environments");
    std::fs::write(
        &envs,
        format!("fuzz {}\n", public_line(&server_keys.public, "fuzz")),
    )?;
    let relay_l = TcpListener::bind("127.0.0.1:0").await?;
    let relay_addr = relay_l.local_addr()?;
    let relay = RelayServer::new(RelayServerConfig {
        keys: relay_keys.clone(),
        environments: EnvironmentsFile::load(&envs)?,
        settings: RelaySettings::default(),
    })?;
    let relay_task = tokio::spawn(relay.run(relay_l, None, shutdown.clone()));
    let env_tap = tap("env", relay_addr, taps.clone()).await?;
    let client_relay_tap = tap("relay-client", relay_addr, taps.clone()).await?;

    // The exec server: plain WebSocket, a direct Noise listener, the environment link.
    let server = Server::new(Arc::new(ServerConfig::default()))?;
    let ws_l = TcpListener::bind("127.0.0.1:0").await?;
    let noise_l = TcpListener::bind("127.0.0.1:0").await?;
    let (ws_addr, noise_addr) = (ws_l.local_addr()?, noise_l.local_addr()?);
    let direct = Arc::new(NoiseServerConfig {
        keys: server_keys.clone(),
        authorizer: authorizer()?,
        env_id: String::new(),
    });
    let via_relay = Arc::new(NoiseServerConfig {
        keys: server_keys.clone(),
        authorizer: authorizer()?,
        env_id: "fuzz".into(),
    });
    let dial = RelayDial {
        relay_url: format!("ws://{env_tap}"),
        env_id: "fuzz".into(),
        relay_public: relay_keys.public,
        tls: TlsRoots::Platform,
    };
    let server_task = tokio::spawn(server.run(
        vec![
            Listener::Ws(ws_l),
            Listener::Noise(noise_l, direct),
            Listener::Relay(dial, via_relay),
        ],
        shutdown.clone(),
    ));
    let ws_tap = tap("ws", ws_addr, taps.clone()).await?;
    let noise_tap = tap("noise", noise_addr, taps.clone()).await?;

    let noise_cfg = Arc::new(NoiseClientConfig::new(
        client_keys.clone(),
        server_keys.public,
    ));
    for binary in [true, false] {
        session(Target::Ws(format!("ws://{ws_tap}")), binary)
            .await
            .context("plain WebSocket session")?;
        session(
            Target::Noise {
                url: format!("noise+ws://{noise_tap}"),
                config: noise_cfg.clone(),
                pool: LinkPool::new(),
            },
            binary,
        )
        .await
        .context("direct Noise session")?;
    }
    // Through the relay, once its environment link is up.
    let relay_target = Target::Noise {
        url: format!("relay+ws://{client_relay_tap}/fuzz"),
        config: noise_cfg.clone(),
        pool: LinkPool::new(),
    };
    let mut tries = 0;
    while let Err(e) = session(relay_target.clone(), true).await {
        tries += 1;
        if tries > 50 {
            return Err(e).context("session through the relay");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    shutdown.cancel();
    let _ = server_task.await;
    let _ = relay_task.await;
    tokio::time::sleep(Duration::from_millis(100)).await;

    // Cut what was carried into each target's seeds.
    let taps: Vec<Tapped> = taps
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(|t| t.lock().unwrap_or_else(|e| e.into_inner()).clone())
        .collect();
    let mut frames = BTreeSet::new();
    let mut data_frames = 0;
    let mut handshake = BTreeSet::new();
    let mut json_lines = BTreeSet::new();
    let mut binary_msgs = BTreeSet::new();
    let mut sessions: Vec<Vec<Vec<u8>>> = Vec::new();
    for t in &taps {
        let ups = ws_messages(&t.up);
        let downs = ws_messages(&t.down);
        if t.what == "ws" {
            // The messages of one connection, both ways interleaved in order of direction
            // (every client message, then every server message: each is real).
            let mut msgs = Vec::new();
            for (op, m) in ups.iter().chain(&downs) {
                if *op == 1 {
                    let mut line = m.clone();
                    line.push(b'\n');
                    json_lines.insert(line);
                } else if *op == 2 {
                    binary_msgs.insert(m.clone());
                }
                msgs.push(m.clone());
            }
            sessions.push(msgs);
            continue;
        }
        for (dir, msgs) in [("up", &ups), ("down", &downs)] {
            for (op, m) in msgs {
                if *op != 2 {
                    continue;
                }
                let Ok(f) = Frame::decode(m) else { continue };
                if f.ftype == FrameType::Data {
                    // Enough records to start from; they are alike.
                    data_frames += 1;
                    if data_frames % 8 != 0 {
                        continue;
                    }
                }
                frames.insert(m.clone());
                // Handshake messages of the direct link (the prologue's environment is empty).
                if t.what == "noise" && f.stream != [0; 16] {
                    if f.ftype == FrameType::Open && dir == "up" {
                        let mut raw = vec![2u8];
                        raw.extend_from_slice(&f.payload);
                        handshake.insert(raw);
                        if let Some(p) = hello_payload(&server_keys, &f.stream, &f.payload) {
                            let mut s = vec![0u8];
                            s.extend_from_slice(&p);
                            handshake.insert(s);
                            if let Some(w) = welcome_payload(&client_keys, &server_keys, &p) {
                                let mut s = vec![1u8];
                                s.extend_from_slice(&w);
                                handshake.insert(s);
                            }
                        }
                    } else if f.ftype == FrameType::Accept && dir == "down" {
                        let mut raw = vec![5u8];
                        raw.extend_from_slice(&f.payload);
                        handshake.insert(raw);
                    }
                }
            }
        }
    }
    let mut records = BTreeSet::new();
    let mut streams = BTreeSet::new();
    for msgs in &sessions {
        records.extend(sequences(msgs, Some(1), 6, 60));
        streams.extend(sequences(msgs, None, 6, 60));
    }
    let out = &args.out;
    let counts = [
        ("frame", write_seeds(&out.join("frame"), "real-", &frames)?),
        (
            "handshake",
            write_seeds(&out.join("handshake"), "real-", &handshake)?,
        ),
        (
            "record",
            write_seeds(&out.join("record"), "real-", &records)?,
        ),
        (
            "stream",
            write_seeds(&out.join("stream"), "real-", &streams)?,
        ),
        (
            "jsonrpc",
            write_seeds(&out.join("jsonrpc"), "real-", &json_lines)?,
        ),
        (
            "binary_output",
            write_seeds(&out.join("binary_output"), "real-", &binary_msgs)?,
        ),
    ];
    for (t, n) in counts {
        println!("capture: {n:4} seeds for {t} in {}", out.join(t).display());
    }
    Ok(0)
}

/// Message 1's payload, decrypted with the server's key (the prologue: no environment, the
/// frame's stream id).
fn hello_payload(server: &Keypair, stream: &[u8; 16], msg1: &[u8]) -> Option<Vec<u8>> {
    let pro = prologue("", stream);
    let mut hs = snow::Builder::new(NOISE_PARAMS.parse().ok()?)
        .local_private_key(&server.private)
        .ok()?
        .prologue(&pro)
        .ok()?
        .build_responder()
        .ok()?;
    let mut buf = vec![0u8; 65535];
    let n = hs.read_message(msg1, &mut buf).ok()?;
    Some(buf[..n].to_vec())
}

/// The payload of the message 2 the server's own code writes in answer to a message 1
/// carrying `hello` (decrypted by an initiator of our own, which holds its ephemeral key).
fn welcome_payload(client: &Keypair, server: &Keypair, hello: &[u8]) -> Option<Vec<u8>> {
    let sid = [9u8; 16];
    let pro = prologue("", &sid);
    let mut init = snow::Builder::new(NOISE_PARAMS.parse().ok()?)
        .local_private_key(&client.private)
        .ok()?
        .remote_public_key(&server.public)
        .ok()?
        .prologue(&pro)
        .ok()?
        .build_initiator()
        .ok()?;
    let mut m1 = vec![0u8; 65535];
    let n = init.write_message(hello, &mut m1).ok()?;
    // A fresh `ts` would be needed by a server with a replay check; `read_hello` alone has none.
    let (m2, _) = read_hello(server, "", &sid, &m1[..n])
        .ok()?
        .accept("capture")
        .ok()?;
    let mut buf = vec![0u8; 65535];
    let n = init.read_message(&m2, &mut buf).ok()?;
    Some(buf[..n].to_vec())
}
