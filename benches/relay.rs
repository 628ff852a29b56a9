//! The relay alone (`cargo bench --bench relay`, also run by `benches/run.sh`): the
//! `execrelay-relay` binary as a separate process, between fake environments and fake clients
//! driven by the engine's `EndpointLink` in this process. Records are opaque to the relay (it
//! reads frame headers only), so fake payloads measure exactly the relay's own cost. Prints
//! `KEY VALUE` lines:
//!
//! - `relay_idle_streams`, `relay_rss_idle_links_KiB`, `relay_rss_with_idle_streams_KiB`,
//!   `relay_rss_per_idle_stream_KiB` (target ≤ 16): `BENCH_IDLE_STREAMS` (default 10,000)
//!   streams opened through one relay from 10 client links to 10 environments, left idle;
//!   the relay's resident set before and after, per stream.
//! - `relay_MBps`, `relay_cpu_s_per_GB` (target ≤ 0.3), `relay_peak_rss_KiB`:
//!   `BENCH_BYTES` (default 1 GiB) of full-size `DATA` records from a fake environment to a
//!   fake client over `BENCH_RELAY_STREAMS` streams (default 1), through the relay; its CPU
//!   (user + system, from /proc) per GB moved and its peak resident set.
//!
//! The full path (exec server and client through the relay, beside Noise direct and OpenSSH)
//! is `bench.rs`'s.

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Instant;

use bytes::Bytes;
use execrelay_relay::config::EndpointConfig;
use execrelay_relay::driver::{
    link_websocket_config, recv_frame, send_frame, EndpointLink, Incoming, StreamHandle,
};
use execrelay_relay::env_handshake::EnvironmentHandshake;
use execrelay_relay::frame::MAX_PAYLOAD_BYTES;
use execrelay_relay::keys::{public_line, Keypair};
use tokio::io::AsyncBufReadExt;
use tokio::net::TcpStream;

/// Fake environments and client links of the idle-stream run: 10 × 1000 streams by default.
const IDLE_LINKS: usize = 10;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn relay_bin() -> std::path::PathBuf {
    if let Ok(p) = std::env::var("EXECRELAY_RELAY_BIN") {
        return p.into();
    }
    let mut p = std::env::current_exe().expect("current exe");
    p.pop();
    if p.ends_with("deps") {
        p.pop();
    }
    p.join("execrelay-relay")
}

fn proc_field(pid: u32, file: &str, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/{file}"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn rss_kib(pid: u32) -> u64 {
    proc_field(pid, "status", "VmRSS:")
}

fn peak_rss_kib(pid: u32) -> u64 {
    proc_field(pid, "status", "VmHWM:")
}

/// CPU seconds (user, system) of a live process, from /proc/PID/stat.
fn cpu_secs(pid: u32) -> (f64, f64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    // SAFETY: sysconf only reads a configuration value.
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let field = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (field(11) / tick, field(12) / tick)
}

struct Relay {
    child: tokio::process::Child,
    addr: SocketAddr,
    keys: Keypair,
    envs: Vec<(String, Keypair)>,
    _dir: tempfile::TempDir,
}

impl Relay {
    fn pid(&self) -> u32 {
        self.child.id().unwrap_or(0)
    }
}

async fn start_relay(environments: usize, extra: &[&str]) -> Relay {
    let dir = tempfile::tempdir().expect("tempdir");
    let keys = Keypair::generate().expect("keygen");
    keys.write(&dir.path().join("relay"), "bench").expect("key");
    let envs: Vec<(String, Keypair)> = (0..environments)
        .map(|i| (format!("bench-{i}"), Keypair::generate().expect("keygen")))
        .collect();
    let text: String = envs
        .iter()
        .map(|(id, k)| format!("{id} {}\n", public_line(&k.public, "bench")))
        .collect();
    std::fs::write(dir.path().join("environments"), text).expect("environments");
    let mut child = tokio::process::Command::new(relay_bin())
        .arg("--listen")
        .arg("ws://127.0.0.1:0")
        .arg("--key")
        .arg(dir.path().join("relay"))
        .arg("--environments")
        .arg(dir.path().join("environments"))
        .args(extra)
        .env(
            "RUST_LOG",
            std::env::var("BENCH_RELAY_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start execrelay-relay (build it: cargo build --release -p execrelay-relay)");
    let out = child.stdout.take().expect("stdout");
    let url = tokio::io::BufReader::new(out)
        .lines()
        .next_line()
        .await
        .expect("url")
        .expect("url line");
    let addr = url
        .strip_prefix("ws://")
        .and_then(|a| a.parse().ok())
        .expect("ws://ADDR");
    Relay {
        child,
        addr,
        keys,
        envs,
        _dir: dir,
    }
}

async fn ws(addr: SocketAddr, path: &str) -> tokio_tungstenite::WebSocketStream<TcpStream> {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    tcp.set_nodelay(true).expect("nodelay");
    tokio_tungstenite::client_async_with_config(
        format!("ws://{addr}{path}"),
        tcp,
        Some(link_websocket_config()),
    )
    .await
    .expect("upgrade")
    .0
}

fn now_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_micros() as u64
}

/// Environment `i` of the relay up, as an engine server link accepting up to `streams`.
async fn environment(relay: &Relay, i: usize, streams: usize) -> (EndpointLink, Incoming) {
    let (id, keys) = &relay.envs[i];
    let mut w = ws(relay.addr, &format!("/v1/env/{id}")).await;
    let (hs, open) =
        EnvironmentHandshake::start(keys, &relay.keys.public, id, now_micros()).expect("msg1");
    let deadline = std::time::Duration::from_secs(30);
    send_frame(&mut w, &open, deadline).await.expect("send");
    let answer = recv_frame(&mut w, deadline).await.expect("answer");
    hs.finish(&answer).expect("admitted");
    let cfg = EndpointConfig {
        max_streams: streams.max(1),
        max_pending_opens: streams.max(1),
        ..EndpointConfig::default()
    };
    EndpointLink::spawn_server(w, cfg).expect("server link")
}

/// Accept every OPEN; hand the streams out.
fn acceptor(mut incoming: Incoming) -> tokio::sync::mpsc::UnboundedReceiver<StreamHandle> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(req) = incoming.next().await {
            if let Ok(s) = req.accept(Bytes::from_static(b"m2")) {
                if tx.send(s).is_err() {
                    return;
                }
            }
        }
    });
    rx
}

/// A stream id for stream `n` of link `link` (never all zero: that is the link's own id).
fn stream_id(link: usize, n: usize) -> [u8; 16] {
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&(link as u64 + 1).to_be_bytes());
    id[8..].copy_from_slice(&(n as u64).to_be_bytes());
    id
}

/// `total` idle streams through one relay: its RSS per stream.
async fn idle_streams(total: usize) {
    let per_link = total.div_ceil(IDLE_LINKS);
    let rate = (total * 2).to_string();
    // Every fake client is on this host (one address): its share of an environment's
    // streams and its handshakes in flight are raised to the load (the defaults hold one
    // address to 512 streams per environment and 256 pending handshakes).
    let per_env = per_link.to_string();
    let relay = start_relay(
        IDLE_LINKS,
        &[
            "--opens-per-second",
            &rate,
            "--max-streams-per-address-per-environment",
            &per_env,
            "--address-handshake-failure-burst",
            &rate,
        ],
    )
    .await;
    let pid = relay.pid();
    let mut envs = Vec::new();
    let mut clients = Vec::new();
    for i in 0..IDLE_LINKS {
        let (env, incoming) = environment(&relay, i, per_link).await;
        let accepted = acceptor(incoming);
        let id = &relay.envs[i].0;
        let client = EndpointLink::spawn_client(
            ws(relay.addr, &format!("/v1/connect/{id}")).await,
            EndpointConfig {
                max_streams: per_link.max(1),
                ..EndpointConfig::default()
            },
        )
        .expect("client link");
        envs.push((env, accepted));
        clients.push(client);
    }
    // Let the links settle, then take the baseline.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let before = rss_kib(pid);
    let t0 = Instant::now();
    let opens = clients.iter().enumerate().map(|(l, c)| {
        let c = c.clone();
        async move {
            let mut held = Vec::with_capacity(per_link);
            // In batches, so the environment's pending OPENs stay bounded.
            for batch in (0..per_link).collect::<Vec<_>>().chunks(256) {
                let pending: Vec<_> = batch
                    .iter()
                    .map(|n| {
                        c.open(stream_id(l, *n), Bytes::from_static(b"m1"))
                            .expect("open")
                    })
                    .collect();
                for p in futures_util::future::join_all(pending).await {
                    held.push(p.expect("accepted").stream);
                }
            }
            held
        }
    });
    let held: Vec<Vec<StreamHandle>> = futures_util::future::join_all(opens).await;
    let opened: usize = held.iter().map(Vec::len).sum();
    assert_eq!(opened, per_link * IDLE_LINKS);
    let mut env_streams = Vec::new();
    for (_, accepted) in envs.iter_mut() {
        while let Ok(s) = accepted.try_recv() {
            env_streams.push(s);
        }
    }
    eprintln!(
        "[relay-bench] opened {opened} streams in {:.2} s",
        t0.elapsed().as_secs_f64()
    );
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let after = rss_kib(pid);
    let per = (after.saturating_sub(before)) as f64 / opened as f64;
    println!("relay_idle_streams {opened}");
    println!("relay_rss_idle_links_KiB {before}");
    println!("relay_rss_with_idle_streams_KiB {after}");
    println!("relay_rss_per_idle_stream_KiB {per:.2}");
    drop((held, env_streams, clients, envs));
}

/// `bytes` of full-size records environment → client over `streams` streams.
async fn throughput(bytes: u64, streams: usize) {
    let relay = start_relay(1, &[]).await;
    let pid = relay.pid();
    let (_env, incoming) = environment(&relay, 0, streams).await;
    let mut accepted = acceptor(incoming);
    let id = relay.envs[0].0.clone();
    let client = EndpointLink::spawn_client(
        ws(relay.addr, &format!("/v1/connect/{id}")).await,
        EndpointConfig::default(),
    )
    .expect("client link");
    let mut receivers = Vec::new();
    let mut senders = Vec::new();
    for n in 0..streams {
        let a = client
            .open(stream_id(0, n), Bytes::from_static(b"m1"))
            .expect("open")
            .await
            .expect("accepted");
        receivers.push(a.stream.receiver);
        senders.push(accepted.recv().await.expect("env stream").sender);
    }
    let record = Bytes::from(vec![0x42u8; MAX_PAYLOAD_BYTES]);
    let per_stream = bytes / streams as u64;
    let records = per_stream.div_ceil(record.len() as u64);
    let cpu0 = cpu_secs(pid);
    let t0 = Instant::now();
    let sends = senders.into_iter().map(|mut s| {
        let record = record.clone();
        tokio::spawn(async move {
            for _ in 0..records {
                s.send(record.clone()).await.expect("send");
            }
            s
        })
    });
    let recvs = receivers.into_iter().map(|mut r| {
        tokio::spawn(async move {
            let mut got = 0u64;
            for _ in 0..records {
                got += r.recv().await.expect("record").1.len() as u64;
            }
            got
        })
    });
    let recvs: Vec<_> = recvs.collect();
    let _senders = futures_util::future::join_all(sends).await;
    let mut moved = 0u64;
    for r in futures_util::future::join_all(recvs).await {
        moved += r.expect("receiver");
    }
    let took = t0.elapsed().as_secs_f64();
    let (user1, sys1) = cpu_secs(pid);
    let (user, sys) = (user1 - cpu0.0, sys1 - cpu0.1);
    let cpu = user + sys;
    let gb = moved as f64 / 1e9;
    println!("relay_MBps {:.1}", moved as f64 / 1e6 / took);
    println!("relay_cpu_s_per_GB {:.3}", cpu / gb);
    // The split: system time is the kernel's TCP receive and send of every byte (twice through
    // the socket layer), which no relay avoids; user time is the relay's own work.
    println!("relay_user_cpu_s_per_GB {:.3}", user / gb);
    println!("relay_sys_cpu_s_per_GB {:.3}", sys / gb);
    println!("relay_peak_rss_KiB {}", peak_rss_kib(pid));
    eprintln!(
        "[relay-bench] {moved} bytes over {streams} stream(s) in {took:.2} s; relay CPU {cpu:.2} s"
    );
}

#[tokio::main]
async fn main() {
    // `cargo bench` passes `--bench`; nothing else to parse.
    eprintln!("[relay-bench] relay binary: {}", relay_bin().display());
    let idle = env_u64("BENCH_IDLE_STREAMS", 10_000) as usize;
    let bytes = env_u64("BENCH_BYTES", 1 << 30);
    let streams = env_u64("BENCH_RELAY_STREAMS", 1).max(1) as usize;
    if idle > 0 {
        idle_streams(idle).await;
    }
    if bytes > 0 {
        throughput(bytes, streams).await;
    }
}
