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
//! - `relay_tls_MBps`, `relay_tls_cpu_s_per_GB` (with `_user_…`, `_sys_…`): the same
//!   transfer with the relay on its own TLS (`--listen wss://…`, a certificate made here for
//!   `localhost`), both links over it: the relay decrypts and encrypts every byte once.
//!   `BENCH_RELAY_TLS=0` skips it.
//!
//! - `haproxy_tcp_cpu_s_per_GB`, `haproxy_tcp_splice_cpu_s_per_GB`, `socat_cpu_s_per_GB`
//!   (with `_MBps`, `_user_…`, `_sys_…`) and `relay_vs_haproxy_tcp_cpu_ratio` (target ≤ 1.25):
//!   the same `BENCH_BYTES` through a plain TCP proxy in its own process, from a socket of this
//!   process to another, its CPU per GB read the same way: HAProxy in TCP mode without splice
//!   (`nosplice`) and with it (`option splice-request`/`splice-response`), and `socat` with
//!   256 KiB buffers. `benches/tcp_proxies.sh` installs them (apt) when missing; a proxy that
//!   is still missing is skipped with a line saying so. `BENCH_TCP_PROXIES=0` skips them.
//!
//! The full path (exec server and client through the relay, beside Noise direct and OpenSSH)
//! is `bench.rs`'s.

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Instant;

use bytes::Bytes;
use execrelay_io::driver::{
    link_websocket_config, recv_frame, send_frame, EndpointLink, Incoming, ReadAhead, StreamHandle,
};
use execrelay_protocol::config::EndpointConfig;
use execrelay_protocol::env_handshake::EnvironmentHandshake;
use execrelay_protocol::frame::MAX_PAYLOAD_BYTES;
use execrelay_protocol::keys::{public_line, Keypair};
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

/// The stream under a fake link's WebSocket: TCP, or TLS over it.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static> Io for T {}

type Ws = tokio_tungstenite::WebSocketStream<ReadAhead<Box<dyn Io>>>;

/// The relay's TLS for the `wss://` run: its certificate files and a client that trusts it.
struct RelayTls {
    _dir: tempfile::TempDir,
    cert: std::path::PathBuf,
    key: std::path::PathBuf,
    connector: tokio_rustls::TlsConnector,
}

impl RelayTls {
    fn new() -> RelayTls {
        let key = rcgen::KeyPair::generate().expect("TLS key");
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
            .expect("certificate parameters")
            .self_signed(&key)
            .expect("certificate");
        let dir = tempfile::tempdir().expect("tempdir");
        let (cert_path, key_path) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
        std::fs::write(&cert_path, cert.pem()).expect("cert.pem");
        std::fs::write(&key_path, key.serialize_pem()).expect("key.pem");
        std::fs::set_permissions(
            &key_path,
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .expect("key mode");
        // Trusted as `execrelay` dialers trust it (`--ca-file` holding the certificate: pinned).
        let config = execrelay::link::trust::TlsRoots::CaFile(cert_path.clone())
            .client_config()
            .expect("the relay's certificate as --ca-file");
        RelayTls {
            _dir: dir,
            cert: cert_path,
            key: key_path,
            connector: tokio_rustls::TlsConnector::from(config),
        }
    }
}

struct Relay {
    child: tokio::process::Child,
    addr: SocketAddr,
    tls: Option<tokio_rustls::TlsConnector>,
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
    start_relay_on(environments, extra, None).await
}

/// [`start_relay`], on `wss://` with `tls`'s certificate when given.
async fn start_relay_on(environments: usize, extra: &[&str], tls: Option<&RelayTls>) -> Relay {
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
    let mut command = tokio::process::Command::new(relay_bin());
    match tls {
        None => command.arg("--listen").arg("ws://127.0.0.1:0"),
        Some(t) => command
            .arg("--listen")
            .arg("wss://127.0.0.1:0")
            .arg("--tls-cert")
            .arg(&t.cert)
            .arg("--tls-key")
            .arg(&t.key),
    };
    let mut child = command
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
        .or_else(|| url.strip_prefix("wss://"))
        .and_then(|a| a.parse().ok())
        .expect("ws://ADDR or wss://ADDR");
    Relay {
        child,
        addr,
        tls: tls.map(|t| t.connector.clone()),
        keys,
        envs,
        _dir: dir,
    }
}

async fn ws(relay: &Relay, path: &str) -> Ws {
    let addr = relay.addr;
    let tcp = TcpStream::connect(addr).await.expect("connect");
    tcp.set_nodelay(true).expect("nodelay");
    let (io, scheme): (Box<dyn Io>, _) = match &relay.tls {
        None => (Box::new(tcp), "ws"),
        Some(connector) => {
            let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
            let tls = connector.connect(name, tcp).await.expect("TLS handshake");
            (Box::new(tls), "wss")
        }
    };
    tokio_tungstenite::client_async_with_config(
        format!("{scheme}://localhost:{}{path}", addr.port()),
        ReadAhead::websocket_client(io),
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
    let mut w = ws(relay, &format!("/v1/env/{id}")).await;
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
            ws(&relay, &format!("/v1/connect/{id}")).await,
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

/// `bytes` of full-size records environment → client over `streams` streams, through a relay
/// on `ws://` or, with `tls`, on `wss://` (figures then named `relay_tls_…`).
async fn throughput(bytes: u64, streams: usize, tls: Option<&RelayTls>) -> f64 {
    let name = if tls.is_some() { "relay_tls" } else { "relay" };
    let relay = start_relay_on(1, &[], tls).await;
    let pid = relay.pid();
    let (_env, incoming) = environment(&relay, 0, streams).await;
    let mut accepted = acceptor(incoming);
    let id = relay.envs[0].0.clone();
    let client = EndpointLink::spawn_client(
        ws(&relay, &format!("/v1/connect/{id}")).await,
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
    println!("{name}_MBps {:.1}", moved as f64 / 1e6 / took);
    println!("{name}_cpu_s_per_GB {:.3}", cpu / gb);
    // The split: system time is the kernel's TCP receive and send of every byte (twice through
    // the socket layer), which no relay avoids; user time is the relay's own work.
    println!("{name}_user_cpu_s_per_GB {:.3}", user / gb);
    println!("{name}_sys_cpu_s_per_GB {:.3}", sys / gb);
    println!("{name}_peak_rss_KiB {}", peak_rss_kib(pid));
    eprintln!(
        "[relay-bench] {name}: {moved} bytes over {streams} stream(s) in {took:.2} s; relay CPU {cpu:.2} s"
    );
    cpu / gb
}

/// A plain TCP proxy started for one measurement.
struct Proxy {
    child: std::process::Child,
    _config: Option<tempfile::NamedTempFile>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Start `name` proxying 127.0.0.1:`front` to 127.0.0.1:`back`, or `None` if it is not
/// installed.
fn start_proxy(name: &str, front: u16, back: u16) -> Option<Proxy> {
    let (program, args, config) = match name {
        "haproxy_tcp" | "haproxy_tcp_splice" => {
            let splice = name.ends_with("splice");
            let text = format!(
                "global\n    maxconn 64\n{global}\ndefaults\n    mode tcp\n    timeout connect 5s\n    \
                 timeout client 120s\n    timeout server 120s\n{opts}\nfrontend f\n    \
                 bind 127.0.0.1:{front}\n    default_backend b\nbackend b\n    \
                 server s 127.0.0.1:{back}\n",
                global = if splice { "" } else { "    nosplice\n" },
                opts = if splice {
                    "    option splice-request\n    option splice-response\n"
                } else {
                    ""
                },
            );
            let mut f = tempfile::NamedTempFile::new().expect("haproxy config");
            std::io::Write::write_all(&mut f, text.as_bytes()).expect("write haproxy config");
            let path = f.path().display().to_string();
            (
                "haproxy",
                vec!["-db".to_string(), "-f".to_string(), path],
                Some(f),
            )
        }
        _ => (
            "socat",
            vec![
                "-b".to_string(),
                "262144".to_string(),
                format!("TCP-LISTEN:{front},bind=127.0.0.1,reuseaddr"),
                format!("TCP:127.0.0.1:{back}"),
            ],
            None,
        ),
    };
    let child = std::process::Command::new(program)
        .args(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn();
    match child {
        Ok(child) => Some(Proxy {
            child,
            _config: config,
        }),
        Err(e) => {
            eprintln!("[relay-bench] SKIPPED {name}: cannot start {program} ({e}); benches/tcp_proxies.sh installs it");
            None
        }
    }
}

/// `bytes` through the TCP proxy `name` (see [`start_proxy`]): its CPU per GB, as the
/// relay's is measured. Returns the CPU-s/GB, if the proxy ran.
async fn tcp_proxy(name: &str, bytes: u64) -> Option<f64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let backend = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let back = backend.local_addr().expect("addr").port();
    let front = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let proxy = start_proxy(name, front, back)?;
    let pid = proxy.child.id();
    // The proxy listens once it has started: connect until it does (hang guard: 10 s).
    let deadline = Instant::now() + std::time::Duration::from_secs(10);
    let mut up = loop {
        match TcpStream::connect(("127.0.0.1", front)).await {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await
            }
            Err(e) => panic!("{name} does not listen on {front}: {e}"),
        }
    };
    let (mut down, _) = backend.accept().await.expect("proxied connection");
    let chunk = vec![0x42u8; 256 << 10];
    let cpu0 = cpu_secs(pid);
    let t0 = Instant::now();
    let send = tokio::spawn(async move {
        let mut left = bytes;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            up.write_all(&chunk[..n]).await.expect("send");
            left -= n as u64;
        }
        up.shutdown().await.expect("shutdown");
        up
    });
    let mut buf = vec![0u8; 256 << 10];
    let mut moved = 0u64;
    while moved < bytes {
        let n = down.read(&mut buf).await.expect("receive");
        if n == 0 {
            break;
        }
        moved += n as u64;
    }
    let took = t0.elapsed().as_secs_f64();
    let (user1, sys1) = cpu_secs(pid);
    let _up = send.await.expect("sender");
    assert_eq!(moved, bytes, "{name} lost bytes");
    let (user, sys) = (user1 - cpu0.0, sys1 - cpu0.1);
    let gb = moved as f64 / 1e9;
    println!("{name}_MBps {:.1}", moved as f64 / 1e6 / took);
    println!("{name}_cpu_s_per_GB {:.3}", (user + sys) / gb);
    println!("{name}_user_cpu_s_per_GB {:.3}", user / gb);
    println!("{name}_sys_cpu_s_per_GB {:.3}", sys / gb);
    drop(proxy);
    Some((user + sys) / gb)
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
        let relay = throughput(bytes, streams, None).await;
        if env_u64("BENCH_RELAY_TLS", 1) > 0 {
            throughput(bytes, streams, Some(&RelayTls::new())).await;
        }
        if env_u64("BENCH_TCP_PROXIES", 1) > 0 {
            let haproxy = tcp_proxy("haproxy_tcp", bytes).await;
            tcp_proxy("haproxy_tcp_splice", bytes).await;
            tcp_proxy("socat", bytes).await;
            if let Some(h) = haproxy {
                println!("relay_vs_haproxy_tcp_cpu_ratio {:.2}", relay / h);
            }
        }
    }
}
