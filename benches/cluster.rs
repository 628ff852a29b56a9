//! Relays past one machine (`cargo bench --bench cluster`, also run by `benches/run.sh`):
//! the real binaries (`execrelay serve --relay`, two `execrelay-relay` in a cluster), Debian's
//! `haproxy` and `nats-server`, and the client library in this process, measuring in one run,
//! for one environment held by relay-1, three paths:
//!
//! - `direct`: the client straight to relay-1 (one relay, as without a cluster);
//! - `haproxy`: through HAProxy (consistent hash on the id, `/readyz` checks) to relay-1;
//! - `misroute`: straight to relay-2, which forwards over a relay-to-relay link to relay-1.
//!
//! Per path it prints `KEY VALUE` lines: `cluster_PATH_MBps` (`BENCH_BYTES`, default 256 MiB,
//! of `head -c N /dev/zero`, binary output), `cluster_PATH_exec_p50_ms` / `_p99_ms` (`true` →
//! exit notice on one connection, `BENCH_EXEC_RUNS`, default 300), `cluster_PATH_connect_p50_ms`
//! / `_p99_ms` (a fresh link, Noise handshake, `initialize`, `true`, `BENCH_CONNECT_RUNS`,
//! default 40), and the CPU seconds per GB moved of each node during the throughput run:
//! `cluster_PATH_cpu_s_per_GB_relay1`, `_relay2`, `_haproxy`.

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::{Duration, Instant};

use execrelay::client::{Client, ClientOptions, Target};
use execrelay::link::client::{LinkPool, NoiseClientConfig};
use execrelay::noise::keys::{public_line, Keypair};
use tokio::io::AsyncBufReadExt;
use tokio::process::{Child, Command};

mod common;
use common::{bin, drain, env_u64, proc_own_cpu_secs};

/// A Debian package's program, installed with apt-get when missing.
fn system_program(name: &str, package: &str) -> std::path::PathBuf {
    let find = || {
        ["/usr/sbin", "/usr/bin", "/sbin", "/bin"]
            .iter()
            .map(|d| std::path::Path::new(d).join(name))
            .find(|p| p.exists())
    };
    if let Some(p) = find() {
        return p;
    }
    let _ = std::process::Command::new("sh")
        .args([
            "-c",
            &format!("(apt-get install -y {package} || (apt-get update && apt-get install -y {package})) >/dev/null 2>&1"),
        ])
        .status();
    find().unwrap_or_else(|| panic!("this benchmark needs {name}: apt-get install -y {package}"))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn wait_http_ok(addr: SocketAddr, path: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(mut s) = tokio::net::TcpStream::connect(addr).await {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
            if s.write_all(req.as_bytes()).await.is_ok() {
                let mut buf = Vec::new();
                let _ = s.read_to_end(&mut buf).await;
                if buf.starts_with(b"HTTP/1.1 200") {
                    return;
                }
            }
        }
        assert!(Instant::now() < deadline, "{addr}{path} never answered 200");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn metric(addr: SocketAddr, name: &str) -> u64 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else {
        return 0;
    };
    let req = "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    let _ = s.write_all(req.as_bytes()).await;
    let mut buf = String::new();
    let _ = s.read_to_string(&mut buf).await;
    buf.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

fn spawn(cmd: &mut Command) -> Child {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn")
}

struct Relay {
    child: Child,
    listen: SocketAddr,
    metrics: SocketAddr,
}

async fn start_relay(dir: &std::path::Path, node: &str, nats: u16) -> Relay {
    let (listen, metrics): (SocketAddr, SocketAddr) = (
        ([127, 0, 0, 1], free_port()).into(),
        ([127, 0, 0, 1], free_port()).into(),
    );
    let mut child = spawn(
        Command::new(bin("execrelay-relay", "EXECRELAY_RELAY_BIN"))
            .env("RUST_LOG", "warn")
            .arg("--listen")
            .arg(format!("ws://{listen}"))
            .arg("--key")
            .arg(dir.join("relay"))
            .arg("--environments")
            .arg(dir.join("environments"))
            .arg("--metrics-listen")
            .arg(metrics.to_string())
            .arg("--cluster")
            .arg(format!("nats://127.0.0.1:{nats}"))
            .arg("--node-id")
            .arg(node)
            .arg("--advertise")
            .arg(format!("ws://{listen}"))
            .arg("--cluster-keys")
            .arg(dir.join("cluster-keys"))
            .arg("--node-key")
            .arg(dir.join(node))
            // HAProxy reaches the relays from loopback: its header is believed from there.
            .arg("--trusted-front")
            .arg("127.0.0.1"),
    );
    let out = child.stdout.take().expect("stdout");
    let mut lines = tokio::io::BufReader::new(out).lines();
    let url = lines
        .next_line()
        .await
        .expect("relay url")
        .expect("relay url");
    assert_eq!(url, format!("ws://{listen}"));
    wait_http_ok(metrics, "/readyz").await;
    Relay {
        child,
        listen,
        metrics,
    }
}

#[tokio::main]
async fn main() {
    execrelay::cli::tune_allocator();
    let bytes = env_u64("BENCH_BYTES", 256 << 20);
    let exec_runs = env_u64("BENCH_EXEC_RUNS", 300);
    let connect_runs = env_u64("BENCH_CONNECT_RUNS", 40);
    let nats_bin = system_program("nats-server", "nats-server");
    let haproxy_bin = system_program("haproxy", "haproxy");

    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    let relay_key = Keypair::generate().unwrap();
    relay_key.write(&dir.join("relay"), "cluster").unwrap();
    let mut cluster_keys = String::new();
    for node in ["relay-1", "relay-2"] {
        let k = Keypair::generate().unwrap();
        k.write(&dir.join(node), node).unwrap();
        cluster_keys.push_str(&format!("{node} {}\n", public_line(&k.public, node)));
    }
    std::fs::write(dir.join("cluster-keys"), cluster_keys).unwrap();
    let server = Keypair::generate().unwrap();
    server.write(&dir.join("server"), "bench").unwrap();
    let client_keys = Keypair::generate().unwrap();
    std::fs::write(
        dir.join("environments"),
        format!("bench {}\n", public_line(&server.public, "bench")),
    )
    .unwrap();
    std::fs::write(
        dir.join("authorized"),
        format!("{}\n", public_line(&client_keys.public, "client")),
    )
    .unwrap();
    std::fs::write(
        dir.join("relay.pub"),
        format!("{}\n", public_line(&relay_key.public, "cluster")),
    )
    .unwrap();

    let nats_port = free_port();
    let _nats =
        spawn(Command::new(&nats_bin).args(["-a", "127.0.0.1", "-p", &nats_port.to_string()]));
    let r1 = start_relay(dir, "relay-1", nats_port).await;
    let r2 = start_relay(dir, "relay-2", nats_port).await;
    for r in [&r1, &r2] {
        let deadline = Instant::now() + Duration::from_secs(30);
        while metric(r.metrics, "execrelay_relay_cluster_directory_up").await != 1 {
            assert!(Instant::now() < deadline, "a relay never reached NATS");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // HAProxy in front of relay-1 alone: "HAProxy + one relay".
    let front: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let cfg = format!(
        "global\n    maxconn 4096\ndefaults\n    mode http\n    timeout connect 2s\n    timeout client 30s\n    timeout server 30s\n    timeout tunnel 1h\nfrontend front\n    bind {front}\n    http-request set-header X-Execrelay-Env %[path,field(4,/)]\n    http-request set-header X-Execrelay-Front 1\n    default_backend relays\nbackend relays\n    source 127.0.0.1\n    balance hdr(X-Execrelay-Env)\n    hash-type consistent\n    option httpchk GET /readyz\n    http-check expect status 200\n    server relay-1 {} check inter 500\n",
        r1.listen
    );
    std::fs::write(dir.join("haproxy.cfg"), cfg).unwrap();
    let haproxy = spawn(
        Command::new(&haproxy_bin)
            .arg("-db")
            .arg("-f")
            .arg(dir.join("haproxy.cfg")),
    );
    wait_http_ok(front, "/readyz").await;

    let _server = spawn(
        Command::new(bin("execrelay", "EXECRELAY_BIN"))
            .env("RUST_LOG", "warn")
            .arg("serve")
            .arg("--relay")
            .arg(format!("ws://{}", r1.listen))
            .arg("--environment-id")
            .arg("bench")
            .arg("--relay-key")
            .arg(dir.join("relay.pub"))
            .arg("--key")
            .arg(dir.join("server"))
            .arg("--authorized-keys")
            .arg(dir.join("authorized")),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while metric(r1.metrics, "execrelay_relay_cluster_environments_held").await != 1 {
        assert!(Instant::now() < deadline, "the environment never linked");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let config = std::sync::Arc::new(NoiseClientConfig::new(client_keys, server.public));
    let pids = [
        ("relay1", r1.child.id().unwrap_or(0)),
        ("relay2", r2.child.id().unwrap_or(0)),
        ("haproxy", haproxy.id().unwrap_or(0)),
    ];
    let paths = [
        ("direct", r1.listen),
        ("haproxy", front),
        ("misroute", r2.listen),
    ];
    println!("cluster_bench_bytes {bytes}");
    for (path, addr) in paths {
        let url = format!("relay+ws://{addr}/bench");
        // The misroute's first connection looks the environment up and dials relay-1.
        let client = {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                match Client::connect(
                    Target::Noise {
                        url: url.clone(),
                        config: config.clone(),
                        pool: LinkPool::new(),
                    },
                    ClientOptions {
                        binary_output: true,
                        ..ClientOptions::default()
                    },
                )
                .await
                {
                    Ok(c) => break c,
                    Err(e) => {
                        assert!(Instant::now() < deadline, "{path}: cannot connect: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        };
        // Throughput, with each node's CPU.
        let cpu0: Vec<f64> = pids.iter().map(|(_, p)| proc_own_cpu_secs(*p)).collect();
        let t0 = Instant::now();
        let (got, _) = drain(
            &client,
            "tp",
            vec![
                "head".into(),
                "-c".into(),
                bytes.to_string(),
                "/dev/zero".into(),
            ],
        )
        .await;
        let took = t0.elapsed().as_secs_f64();
        assert_eq!(got, bytes, "{path}: every byte must arrive");
        println!("cluster_{path}_MBps {:.1}", bytes as f64 / 1e6 / took);
        for ((name, pid), c0) in pids.iter().zip(cpu0) {
            println!(
                "cluster_{path}_cpu_s_per_GB_{name} {:.3}",
                (proc_own_cpu_secs(*pid) - c0) / (bytes as f64 / 1e9)
            );
        }
        // Exec latency on this connection.
        let (p50, p99) = common::exec_latency_on(&client, exec_runs, 20).await;
        println!("cluster_{path}_exec_p50_ms {p50:.3}");
        println!("cluster_{path}_exec_p99_ms {p99:.3}");
        // Connect latency: a fresh link each time (its own pool), handshake, initialize, true.
        let (p50, p99) = common::connect_latency_to(&url, &config, connect_runs).await;
        println!("cluster_{path}_connect_p50_ms {p50:.3}");
        println!("cluster_{path}_connect_p99_ms {p99:.3}");
        client.close();
    }
    let forwarded = metric(r2.metrics, "execrelay_relay_cluster_forwarded_bytes_total").await;
    println!("cluster_misroute_forwarded_bytes_relay2 {forwarded}");
}
