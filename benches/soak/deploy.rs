//! The deployment a soak runs against, as separate processes of the built binaries: a relay
//! (`execrelay-relay`, restartable on the same ports) and exec servers (`execrelay serve`),
//! each with a direct Noise listener and an environment link to the relay through a fault
//! proxy. Also what the end checks read from outside: metrics and `/status` over HTTP, RSS
//! and descriptors from `/proc`, every process left with the run's tag in its environment.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use execrelay::noise::keys::{public_line, Keypair};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

/// Where the binaries are.
#[derive(Debug, Clone)]
pub struct Bins {
    /// `execrelay`.
    pub execrelay: PathBuf,
    /// `execrelay-relay`.
    pub relay: PathBuf,
}

impl Bins {
    /// Both binaries in `dir` (`target/release`, `target/debug`).
    pub fn in_dir(dir: &Path) -> Result<Bins> {
        let b = Bins {
            execrelay: dir.join("execrelay"),
            relay: dir.join("execrelay-relay"),
        };
        for p in [&b.execrelay, &b.relay] {
            if !p.exists() {
                bail!(
                    "{} is missing: build it first (benches/soak.sh does: cargo build --release \
                     -p execrelay --bin execrelay -p execrelay-relay --bin execrelay-relay)",
                    p.display()
                );
            }
        }
        Ok(b)
    }
}

/// A free port on 127.0.0.1 (bound, then let go: the process started next binds it).
pub fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// Write `keys` to `dir/name` (0600) and `dir/name.pub`.
pub fn write_key(dir: &Path, name: &str, keys: &Keypair) -> Result<PathBuf> {
    let path = dir.join(name);
    keys.write(&path, name)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// Settings every process of the deployment shares.
#[derive(Debug, Clone)]
pub struct LinkTimes {
    /// Keepalive ping interval (ms).
    pub keepalive_ms: u64,
    /// Pong timeout (ms).
    pub pong_timeout_ms: u64,
}

/// The relay, restartable on the same ports.
pub struct RelayProc {
    /// `ws://` port.
    pub port: u16,
    /// Metrics and health port.
    pub metrics_port: u16,
    child: Option<Child>,
    args: Vec<String>,
    bin: PathBuf,
    log: PathBuf,
    /// Incarnations started.
    pub starts: u64,
}

impl RelayProc {
    /// Start a relay with its key, its environments file, on fresh ports.
    pub async fn start(
        bins: &Bins,
        dir: &Path,
        key: &Path,
        environments: &Path,
        times: &LinkTimes,
    ) -> Result<RelayProc> {
        let (port, metrics_port) = (free_port()?, free_port()?);
        let args = vec![
            format!("--listen=ws://127.0.0.1:{port}"),
            format!("--key={}", key.display()),
            format!("--environments={}", environments.display()),
            format!("--metrics-listen=127.0.0.1:{metrics_port}"),
            format!("--keepalive-interval-ms={}", times.keepalive_ms),
            format!("--pong-timeout-ms={}", times.pong_timeout_ms),
        ];
        let mut r = RelayProc {
            port,
            metrics_port,
            child: None,
            args,
            bin: bins.relay.clone(),
            log: dir.join("relay.log"),
            starts: 0,
        };
        r.spawn().await?;
        Ok(r)
    }

    async fn spawn(&mut self) -> Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        // A restart binds the ports its predecessor just left; try for a while.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let mut child = Command::new(&self.bin)
                .args(&self.args)
                .env("RUST_LOG", "info")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::from(log.try_clone()?))
                .kill_on_drop(true)
                .spawn()
                .with_context(|| format!("starting {}", self.bin.display()))?;
            let stdout = child.stdout.take().context("relay stdout")?;
            let mut lines = BufReader::new(stdout).lines();
            let first = tokio::time::timeout(Duration::from_secs(20), lines.next_line()).await;
            match first {
                Ok(Ok(Some(url))) if url.starts_with("ws://") => {
                    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
                    self.child = Some(child);
                    self.starts += 1;
                    break;
                }
                _ => {
                    let _ = child.kill().await;
                    if tokio::time::Instant::now() > deadline {
                        bail!(
                            "the relay did not start on port {} (see {})",
                            self.port,
                            self.log.display()
                        );
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        wait_ready(self.metrics_addr(), Duration::from_secs(20)).await
    }

    /// Its metrics address.
    pub fn metrics_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.metrics_port))
    }

    /// Its listening address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// The running incarnation's pid.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(|c| c.id())
    }

    /// Stop it: SIGTERM (a clean shutdown) or SIGKILL (a crash); waits for it.
    pub async fn stop(&mut self, kill: bool) {
        if let Some(mut c) = self.child.take() {
            if let Some(pid) = c.id() {
                let sig = if kill { libc::SIGKILL } else { libc::SIGTERM };
                // SAFETY: signalling our own child, which we have not reaped yet.
                unsafe { libc::kill(pid as i32, sig) };
            }
            if tokio::time::timeout(Duration::from_secs(20), c.wait())
                .await
                .is_err()
            {
                let _ = c.kill().await;
            }
        }
    }

    /// Start it again on the same ports.
    pub async fn restart(&mut self) -> Result<()> {
        self.spawn().await
    }
}

/// One exec server: a direct Noise listener and an environment link (through its proxy).
pub struct ServerProc {
    /// Its environment id.
    pub env_id: String,
    /// Direct `noise+ws://` port.
    pub noise_port: u16,
    /// Metrics and health port.
    pub metrics_port: u16,
    /// Its public key.
    pub public: [u8; 32],
    child: Child,
    /// Its log (stderr).
    pub log: PathBuf,
}

impl ServerProc {
    /// Start `execrelay serve` for `env_id`, dialling the relay at `relay_via` (its proxy),
    /// with `extra` flags.
    #[allow(clippy::too_many_arguments)]
    pub async fn start(
        bins: &Bins,
        dir: &Path,
        env_id: &str,
        keys: &Keypair,
        key_path: &Path,
        relay_pub: &Path,
        authorized: &Path,
        relay_via: SocketAddr,
        times: &LinkTimes,
        extra: &[String],
        envs: &[(String, String)],
    ) -> Result<ServerProc> {
        let metrics_port = free_port()?;
        let log = dir.join(format!("server-{env_id}.log"));
        let f = std::fs::File::create(&log)?;
        let mut cmd = Command::new(&bins.execrelay);
        cmd.arg("serve")
            .arg("--listen=noise+ws://127.0.0.1:0")
            .arg(format!("--relay=ws://{relay_via}"))
            .arg(format!("--environment-id={env_id}"))
            .arg(format!("--relay-key={}", relay_pub.display()))
            .arg(format!("--key={}", key_path.display()))
            .arg(format!("--authorized-keys={}", authorized.display()))
            .arg(format!("--metrics-listen=127.0.0.1:{metrics_port}"))
            .arg(format!("--keepalive-interval-ms={}", times.keepalive_ms))
            .arg(format!("--pong-timeout-ms={}", times.pong_timeout_ms))
            .args(extra)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(f))
            .kill_on_drop(true);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().context("starting execrelay serve")?;
        let stdout = child.stdout.take().context("server stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .ok()
            .and_then(|l| l.ok().flatten())
            .with_context(|| format!("execrelay serve printed no URL (see {})", log.display()))?;
        let noise_port = first
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .with_context(|| format!("no port in {first:?}"))?;
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let metrics = SocketAddr::from(([127, 0, 0, 1], metrics_port));
        // Ready: accepting, and its environment link up.
        wait_ready(metrics, Duration::from_secs(60)).await?;
        Ok(ServerProc {
            env_id: env_id.to_string(),
            noise_port,
            metrics_port,
            public: keys.public,
            child,
            log,
        })
    }

    /// Its pid.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Its metrics address.
    pub fn metrics_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.metrics_port))
    }

    /// Its direct listener.
    pub fn noise_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.noise_port))
    }

    /// Whether it is still running (a crash is a failure of the soak).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// SIGTERM, and wait (SIGKILL after 30 s).
    pub async fn stop(&mut self) {
        if let Some(pid) = self.child.id() {
            // SAFETY: our own unreaped child.
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        }
        if tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

/// `GET path` on `addr` (HTTP/1.0, connection closed): status and body.
pub async fn http_get(addr: SocketAddr, path: &str) -> Result<(u16, String)> {
    let fut = async {
        let mut s = TcpStream::connect(addr).await?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await?;
        let text = String::from_utf8_lossy(&buf).to_string();
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default();
        anyhow::Ok((status, body))
    };
    tokio::time::timeout(Duration::from_secs(10), fut)
        .await
        .context("HTTP request timed out")?
}

/// Wait until `GET /readyz` answers 200.
pub async fn wait_ready(addr: SocketAddr, within: Duration) -> Result<()> {
    let deadline = tokio::time::Instant::now() + within;
    let mut last;
    loop {
        match http_get(addr, "/readyz").await {
            Ok((200, _)) => return Ok(()),
            Ok((s, body)) => last = format!("{s} {}", body.trim()),
            Err(e) => last = e.to_string(),
        }
        if tokio::time::Instant::now() > deadline {
            bail!("http://{addr}/readyz not ready within {within:?}: {last}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A Prometheus text page, summed by metric name and by `name{labels}`.
pub fn parse_metrics(text: &str) -> HashMap<String, f64> {
    let mut m = HashMap::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let Some((key, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(v) = value.parse::<f64>() else {
            continue;
        };
        let name = key.split('{').next().unwrap_or(key).to_string();
        *m.entry(name).or_insert(0.0) += v;
        if key.contains('{') {
            *m.entry(key.to_string()).or_insert(0.0) += v;
        }
    }
    m
}

/// The metrics of the server or relay at `addr`.
pub async fn metrics(addr: SocketAddr) -> Result<HashMap<String, f64>> {
    let (status, body) = http_get(addr, "/metrics").await?;
    if status != 200 {
        bail!("GET http://{addr}/metrics: {status}");
    }
    Ok(parse_metrics(&body))
}

/// The `/status` document at `addr`.
pub async fn status(addr: SocketAddr) -> Result<serde_json::Value> {
    let (code, body) = http_get(addr, "/status").await?;
    if code != 200 {
        bail!("GET http://{addr}/status: {code}");
    }
    Ok(serde_json::from_str(&body)?)
}

/// Resident set size of `pid`, KiB.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

/// Open descriptors of `pid`.
pub fn fd_count(pid: u32) -> Option<usize> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count())
}

/// What `/proc/PID/fd` of `pid` points at, by kind (`socket`, `pipe`, `anon_inode:[eventfd]`,
/// a path…), for the report of a leak.
pub fn fd_kinds(pid: u32) -> Vec<(String, usize)> {
    let mut kinds: HashMap<String, usize> = HashMap::new();
    if let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
        for e in dir.flatten() {
            let target = std::fs::read_link(e.path())
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            let kind = target.split(':').next().unwrap_or("").to_string();
            *kinds.entry(kind).or_default() += 1;
        }
    }
    let mut v: Vec<_> = kinds.into_iter().collect();
    v.sort();
    v
}

/// Every process whose environment holds `tag` (`NAME=VALUE`): what the soak started, and
/// anything those started, wherever it was re-parented.
pub fn tagged_processes(tag: &str) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return found;
    };
    let needle = tag.as_bytes();
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        if env.split(|&b| b == 0).any(|v| v == needle) {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
                .unwrap_or_default();
            found.push((pid, cmd));
        }
    }
    found
}

/// Every descendant of `root` (by `/proc/PID/stat`'s parent pid).
pub fn descendants(root: u32) -> Vec<u32> {
    let mut parent: HashMap<u32, u32> = HashMap::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            // The command is in parentheses and may hold spaces: the fields after the last ')'.
            let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
                continue;
            };
            if let Some(ppid) = rest.split_whitespace().nth(1).and_then(|p| p.parse().ok()) {
                parent.insert(pid, ppid);
            }
        }
    }
    parent
        .keys()
        .copied()
        .filter(|&pid| {
            let mut p = pid;
            for _ in 0..64 {
                match parent.get(&p) {
                    Some(&pp) if pp == root => return true,
                    Some(&pp) if pp > 1 => p = pp,
                    _ => return false,
                }
            }
            false
        })
        .collect()
}

/// The authorized keys file for `clients`.
pub fn authorized_keys(dir: &Path, clients: &[Keypair]) -> Result<PathBuf> {
    let path = dir.join("authorized_keys");
    let mut text = String::new();
    for (i, k) in clients.iter().enumerate() {
        text.push_str(&public_line(&k.public, &format!("client-{i}")));
        text.push('\n');
    }
    std::fs::write(&path, text)?;
    Ok(path)
}

/// The relay's environments file for `servers` (`(id, public key)`).
pub fn environments(dir: &Path, servers: &[(String, [u8; 32])]) -> Result<PathBuf> {
    let path = dir.join("environments");
    let mut text = String::new();
    for (id, public) in servers {
        text.push_str(&format!("{id} {}\n", public_line(public, id)));
    }
    std::fs::write(&path, text)?;
    Ok(path)
}
