//! Relay harness (`secure-transport.md` §6): a relay in this process (`RelayServer`) or the
//! `execrelay-relay` binary, exec servers registered with it (in process through
//! `Listener::Relay`, or `execrelay serve --relay`), and a TCP proxy that records every byte
//! it carries.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::{Child, ChildStderr, ChildStdout, Command};
use tokio_util::sync::CancellationToken;

use execrelay::config::ServerConfig;
use execrelay::link::environment::RelayDial;
use execrelay::link::server::NoiseServerConfig;
use execrelay::noise::authorizer::Authorizer;
use execrelay::noise::keys::{public_line, Keypair};
use execrelay::server::{Listener, Server};
use execrelay::session::SessionRegistry;
use execrelay_io::tls::TlsListener;
use execrelay_protocol::keys::environments::EnvironmentsFile;
use execrelay_relay::server::settings::RelaySettings;
use execrelay_relay::server::{RelayServer, RelayServerConfig};

use super::binary::first_line;
use super::{bin, eventually, PROMPT};

/// The `execrelay-relay` binary, next to `execrelay`, brought up to date once per test
/// binary: `cargo test --workspace` builds it (the relay package has tests of its own), but
/// `cargo test -p execrelay` or `--test NAME` does not, and would otherwise run a missing or
/// stale relay (a no-op build when it is fresh).
pub fn relay_bin() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let path = Path::new(bin()).with_file_name("execrelay-relay");
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let status = std::process::Command::new(cargo)
                .args([
                    "build",
                    "--quiet",
                    "-p",
                    "execrelay-relay",
                    "--bin",
                    "execrelay-relay",
                ])
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .status()
                .expect("run cargo build for execrelay-relay");
            assert!(status.success(), "cargo build -p execrelay-relay failed");
            assert!(path.exists(), "{} after the build", path.display());
            path
        })
        .clone()
}

/// An environments file listing `(id, key)` pairs.
pub fn environments_file(dir: &Path, envs: &[(&str, &Keypair)]) -> PathBuf {
    let path = dir.join("environments");
    write_environments(&path, envs);
    path
}

/// Replace the environments file's content (a new inode, as editors do).
pub fn write_environments(path: &Path, envs: &[(&str, &Keypair)]) {
    let mut text = String::from("# id key\n");
    for (id, k) in envs {
        text.push_str(&format!("{id} {}\n", public_line(&k.public, id)));
    }
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Exec-server settings whose relay link redials within 50 to 200 ms (tests restart relays).
pub fn quick_redial(cfg: ServerConfig) -> ServerConfig {
    ServerConfig {
        relay_backoff_initial_ms: 50,
        relay_backoff_max_ms: 200,
        ..cfg
    }
}

/// A relay in this process.
pub struct InRelay {
    pub port: u16,
    pub keys: Keypair,
    /// Its metrics, rendered on demand.
    pub metrics: execrelay_relay::server::MetricsHandle,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl InRelay {
    /// A relay with fresh keys on a port of its own.
    pub async fn start(envs: &Path) -> InRelay {
        InRelay::start_at(
            envs,
            Keypair::generate().unwrap(),
            0,
            RelaySettings::default(),
        )
        .await
    }

    /// A relay with `keys` on `port` (0: any), serving `envs`.
    pub async fn start_at(
        envs: &Path,
        keys: Keypair,
        port: u16,
        settings: RelaySettings,
    ) -> InRelay {
        InRelay::start_full(envs, keys, port, settings, None).await
    }

    /// A relay speaking TLS (`wss://`) with `tls`'s certificate, serving `envs`.
    pub async fn start_tls(envs: &Path, tls: TlsListener) -> InRelay {
        InRelay::start_full(
            envs,
            Keypair::generate().unwrap(),
            0,
            RelaySettings::default(),
            Some(tls),
        )
        .await
    }

    /// A relay with `keys` on `port` (0: any), serving `envs`, with TLS if given.
    pub async fn start_full(
        envs: &Path,
        keys: Keypair,
        port: u16,
        settings: RelaySettings,
        tls: Option<TlsListener>,
    ) -> InRelay {
        // A restarted relay takes its old port back; the old listener's socket may close a
        // moment after its server returned.
        let deadline = tokio::time::Instant::now() + PROMPT;
        let listener = loop {
            match TcpListener::bind(("127.0.0.1", port)).await {
                Ok(l) => break l,
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && port != 0 => {
                    assert!(
                        tokio::time::Instant::now() < deadline,
                        "port {port} stays in use"
                    );
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
                Err(e) => panic!("bind: {e}"),
            }
        };
        let port = listener.local_addr().unwrap().port();
        let config = RelayServerConfig {
            keys: keys.clone(),
            environments: EnvironmentsFile::load(envs).unwrap(),
            settings,
        };
        let shutdown = CancellationToken::new();
        let mut server = RelayServer::new(config).unwrap();
        if let Some(tls) = tls {
            server = server.with_tls(tls);
        }
        let metrics = server.metrics_handle();
        let task = tokio::spawn(server.run(listener, None, shutdown.clone()));
        InRelay {
            port,
            keys,
            metrics,
            shutdown,
            task,
        }
    }

    /// `ws://127.0.0.1:PORT`, what `serve --relay` takes.
    pub fn url(&self) -> String {
        format!("ws://127.0.0.1:{}", self.port)
    }

    /// Environment links refused because a live link holds their id.
    pub fn refusals_in_use(&self) -> u64 {
        self.metrics
            .value("execrelay_relay_environment_handshakes_total{result=\"environment_in_use\"}")
    }

    /// `relay+ws://127.0.0.1:PORT/ENV`, what clients use.
    pub fn client_url(&self, env: &str) -> String {
        format!("relay+ws://127.0.0.1:{}/{env}", self.port)
    }

    /// Shut down (every link closed) and wait for it.
    pub async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(PROMPT, self.task)
            .await
            .expect("the relay did not stop (hang guard)")
            .unwrap();
    }
}

/// An exec server in this process whose only listener is its environment link.
pub struct InEnv {
    pub keys: Keypair,
    pub registry: Arc<SessionRegistry>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl InEnv {
    /// Register `keys` as environment `env` with the relay at `relay_url` (pinning
    /// `relay_public`), authorizing clients with `auth`.
    pub async fn start(
        relay_url: &str,
        relay_public: [u8; 32],
        env: &str,
        keys: Keypair,
        auth: Arc<dyn Authorizer>,
        config: ServerConfig,
    ) -> InEnv {
        let dial = RelayDial {
            relay_url: relay_url.to_string(),
            env_id: env.to_string(),
            relay_public,
            tls: Default::default(),
        };
        InEnv::start_dial(dial, keys, auth, config).await
    }

    /// [`InEnv::start`] with the dial settings given whole (a `wss://` relay, a CA file).
    pub async fn start_dial(
        dial: RelayDial,
        keys: Keypair,
        auth: Arc<dyn Authorizer>,
        config: ServerConfig,
    ) -> InEnv {
        let noise = Arc::new(NoiseServerConfig {
            keys: keys.clone(),
            authorizer: auth,
            env_id: dial.env_id.clone(),
        });
        let server = Server::new(Arc::new(config)).expect("server starts");
        let registry = server.registry().clone();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(server.run(vec![Listener::Relay(dial, noise)], shutdown.clone()));
        InEnv {
            keys,
            registry,
            shutdown,
            task,
        }
    }

    /// Links of this server up now (its environment link: 0 or 1).
    pub fn links(&self) -> i64 {
        self.registry.metrics().noise_links.get()
    }

    /// Streams open on this server now.
    pub fn streams(&self) -> i64 {
        self.registry.metrics().noise_streams.get()
    }

    /// Noise failures of this server counted with `reason` (`busy`, `replayed_handshake`, …).
    pub fn noise_failures(&self, reason: &'static str) -> u64 {
        self.registry
            .metrics()
            .noise_failures
            .get_or_create(&execrelay::metrics::ReasonLabel { reason })
            .get()
    }

    /// Wait until the environment link is up.
    pub async fn registered(&self) {
        eventually("the environment link is up", || self.links() >= 1).await;
    }

    /// Shut down and wait.
    pub async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(PROMPT, self.task)
            .await
            .expect("the exec server did not stop (hang guard)")
            .unwrap();
    }
}

/// The `execrelay-relay` binary, serving on a port of its own.
pub struct BinRelay {
    pub child: Child,
    pub url: String,
    _stdout: Lines<BufReader<ChildStdout>>,
}

impl BinRelay {
    /// `execrelay-relay --listen ws://127.0.0.1:0 --key KEY --environments ENVS EXTRA…`,
    /// stderr to `log`.
    pub async fn start(key: &Path, envs: &Path, extra: &[&str], log: &Path) -> BinRelay {
        BinRelay::start_on("ws://127.0.0.1:0", key, envs, extra, log).await
    }

    /// The same on `listen` (`ws://…` or `wss://…`, whose flags go in `extra`).
    pub async fn start_on(
        listen: &str,
        key: &Path,
        envs: &Path,
        extra: &[&str],
        log: &Path,
    ) -> BinRelay {
        let mut child = Command::new(relay_bin())
            .args(["--listen", listen, "--key"])
            .arg(key)
            .arg("--environments")
            .arg(envs)
            .args(extra)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(log).unwrap())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn execrelay-relay");
        let (url, lines) = first_line(&mut child, PROMPT).await;
        let url = url.unwrap_or_else(|| {
            panic!(
                "the relay exited without a URL: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            )
        });
        let scheme = listen.split("://").next().unwrap_or("ws");
        assert!(url.starts_with(&format!("{scheme}://127.0.0.1:")), "{url}");
        BinRelay {
            child,
            url,
            _stdout: lines,
        }
    }

    /// The relay's pid.
    pub fn pid(&self) -> u32 {
        self.child.id().expect("the relay is running")
    }
}

/// `execrelay serve --relay URL --environment-id ENV --relay-key RELAY_PUB --key KEY
/// --authorized-keys AUTH EXTRA…` with `RUST_LOG=info`; returns once its log says the
/// environment link is up. Its first stdout line is the client URL.
pub struct BinEnv {
    pub child: Child,
    pub client_url: String,
    _stdout: Lines<BufReader<ChildStdout>>,
    _stderr: tokio::task::JoinHandle<()>,
}

impl BinEnv {
    #[allow(clippy::too_many_arguments)]
    pub async fn start(
        relay_url: &str,
        env: &str,
        relay_pub: &Path,
        key: &Path,
        auth: &Path,
        extra: &[&str],
        log: &Path,
    ) -> BinEnv {
        let mut child = Command::new(bin())
            .args([
                "serve",
                "--relay",
                relay_url,
                "--environment-id",
                env,
                "--relay-key",
            ])
            .arg(relay_pub)
            .arg("--key")
            .arg(key)
            .arg("--authorized-keys")
            .arg(auth)
            .args(extra)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn execrelay serve --relay");
        let (url, lines) = first_line(&mut child, PROMPT).await;
        let client_url = url.expect("serve --relay printed its client URL");
        assert_eq!(client_url, format!("relay+{relay_url}/{env}"));
        let (up_tx, up_rx) = tokio::sync::oneshot::channel();
        let stderr_task = tokio::spawn(copy_log(
            child.stderr.take().unwrap(),
            log.to_path_buf(),
            up_tx,
        ));
        tokio::time::timeout(PROMPT, up_rx)
            .await
            .expect("the environment link never came up (hang guard)")
            .expect("serve --relay exited before its link came up");
        BinEnv {
            child,
            client_url,
            _stdout: lines,
            _stderr: stderr_task,
        }
    }

    /// The server's pid.
    pub fn pid(&self) -> u32 {
        self.child.id().expect("serve is running")
    }
}

/// Copy `stderr` to `log` line by line; tell `up` when the environment link first comes up.
///
/// Each line is in the file before anyone hears of it: a `tokio::fs::File` write only hands
/// the bytes to a blocking task, so the line is flushed first, and `up` is told after. (A
/// test that read the log at once after the link came up found the line missing.)
async fn copy_log(stderr: ChildStderr, log: PathBuf, up: tokio::sync::oneshot::Sender<()>) {
    let mut up = Some(up);
    let mut lines = BufReader::new(stderr).lines();
    let mut file = tokio::fs::File::create(&log).await.unwrap();
    while let Ok(Some(line)) = lines.next_line().await {
        let _ = file.write_all(line.as_bytes()).await;
        let _ = file.write_all(b"\n").await;
        let _ = file.flush().await;
        if line.contains("connected to relay ") {
            if let Some(tx) = up.take() {
                let _ = tx.send(());
            }
        }
    }
}

/// Everything a [`capturing_proxy`] carried: one record per connection and direction, so
/// that nothing is split by the interleaving of the two directions.
/// The bytes of one direction of one connection.
pub type Direction = Arc<Mutex<Vec<u8>>>;

#[derive(Clone, Default)]
pub struct Capture {
    pub directions: Arc<Mutex<Vec<Direction>>>,
    pub connections: Arc<AtomicUsize>,
}

impl Capture {
    /// Whether `needle` occurs anywhere in what was carried.
    pub fn contains(&self, needle: &[u8]) -> bool {
        let dirs = self.directions.lock().unwrap();
        dirs.iter().any(|d| {
            let b = d.lock().unwrap();
            b.windows(needle.len()).any(|w| w == needle)
        })
    }

    /// Bytes carried so far.
    pub fn len(&self) -> usize {
        let dirs = self.directions.lock().unwrap();
        dirs.iter().map(|d| d.lock().unwrap().len()).sum()
    }

    fn direction(&self) -> Arc<Mutex<Vec<u8>>> {
        let d = Arc::new(Mutex::new(Vec::new()));
        self.directions.lock().unwrap().push(d.clone());
        d
    }
}

/// A TCP proxy in front of `port` that records every byte it carries, in both directions,
/// into one [`Capture`]; returns its port.
pub async fn capturing_proxy(port: u16) -> (u16, Capture) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let front = listener.local_addr().unwrap().port();
    let cap = Capture::default();
    let c = cap.clone();
    tokio::spawn(async move {
        while let Ok((inbound, _)) = listener.accept().await {
            c.connections.fetch_add(1, Ordering::SeqCst);
            let (up, down) = (c.direction(), c.direction());
            tokio::spawn(async move {
                let Ok(outbound) = TcpStream::connect(("127.0.0.1", port)).await else {
                    return;
                };
                let (ri, wi) = inbound.into_split();
                let (ro, wo) = outbound.into_split();
                let a = tokio::spawn(pump(ri, wo, up));
                let b = tokio::spawn(pump(ro, wi, down));
                let _ = tokio::join!(a, b);
            });
        }
    });
    (front, cap)
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    log: Arc<Mutex<Vec<u8>>>,
) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        log.lock().unwrap().extend_from_slice(&buf[..n]);
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}
