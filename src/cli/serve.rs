//! `execrelay serve`: parse the flags (one per setting, from `config.rs`, plus `--config
//! FILE`), bind the listeners, print the bound URL as the first line of stdout, and hand
//! everything to the composition root ([`crate::server::run`]). Nothing else lives here.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use clap::{Args, ValueEnum};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::{ConfigFlags, ServerConfig};
use crate::link::server::NoiseServerConfig;
use crate::server::{bound_noise_url, bound_url, parse_listen, ListenAddr, Listener};
use execrelay_relay::http::METRICS_PATH;

/// Log output format.
#[derive(Debug, Clone, Copy, ValueEnum, Default)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Flags of `execrelay serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// `stdio`, `ws://HOST:PORT` or `noise+ws://HOST:PORT` (port 0 picks one; the bound URL is
    /// printed first).
    #[arg(long, default_value = "stdio")]
    pub listen: String,
    /// Allow plain `ws://` on a non-loopback address (traffic is unencrypted).
    #[arg(long)]
    pub danger_plaintext: bool,
    /// Serve Prometheus metrics on `HOST:PORT` (`GET /metrics`; port 0 picks one, and the URL
    /// is printed to stderr as `execrelay metrics: http://HOST:PORT/metrics`). Off by default.
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics_listen: Option<String>,
    /// TOML file with the same settings as the flags below, by the same names in snake_case
    /// (flags win).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Log format on stderr.
    #[arg(long, value_enum, default_value_t)]
    pub log_format: LogFormat,
    /// noise+ws: the server's private key file (from `execrelay keygen`).
    #[arg(long)]
    pub key: Option<PathBuf>,
    /// noise+ws: the authorized-keys file (re-read when it changes).
    #[arg(long)]
    pub authorized_keys: Option<PathBuf>,
    /// noise+ws: also require this token (read from the file) in every handshake.
    #[arg(long)]
    pub auth_token_file: Option<PathBuf>,
    /// Every limit of `config.rs`.
    #[command(flatten)]
    pub settings: ConfigFlags,
}

impl ServeArgs {
    /// The Noise listener's keys and authorizer (loaded and checked here, at start).
    pub fn noise_config(&self) -> anyhow::Result<NoiseServerConfig> {
        use crate::noise::authorizer::KeysAuthorizer;
        use crate::noise::keys::{AuthorizedKeys, Keypair};
        let key = self.key.as_ref().ok_or_else(|| {
            anyhow::anyhow!("noise+ws needs --key (create one with `execrelay keygen -o FILE`)")
        })?;
        let keys = Keypair::load(key)?;
        let auth = self
            .authorized_keys
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("noise+ws needs --authorized-keys FILE"))?;
        let authorized = AuthorizedKeys::load(auth)?;
        let token = match &self.auth_token_file {
            Some(p) => {
                let t = std::fs::read_to_string(p)
                    .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", p.display()))?;
                let t = t.trim().to_string();
                if t.is_empty() {
                    anyhow::bail!("{}: empty token", p.display());
                }
                Some(t)
            }
            None => None,
        };
        Ok(NoiseServerConfig {
            keys,
            authorizer: Arc::new(KeysAuthorizer::new(authorized, token)),
            env_id: String::new(),
        })
    }

    /// Build the configuration: defaults, then the file, then flags.
    pub fn config(&self) -> anyhow::Result<ServerConfig> {
        let mut c = match &self.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
                ServerConfig::from_toml(&text)?
            }
            None => ServerConfig::default(),
        };
        self.settings.apply(&mut c);
        c.validate()?;
        Ok(c)
    }
}

/// Run `serve`; returns the exit code.
pub fn main(args: ServeArgs) -> i32 {
    crate::cli::init_logging("info", matches!(args.log_format, LogFormat::Json));
    let prepared = (|| -> anyhow::Result<_> {
        let config = Arc::new(args.config()?);
        let listen = parse_listen(&args.listen, args.danger_plaintext)?;
        let noise = match listen {
            ListenAddr::Noise(_) => Some(Arc::new(args.noise_config()?)),
            _ => None,
        };
        let metrics = args
            .metrics_listen
            .as_deref()
            .map(parse_metrics_listen)
            .transpose()?;
        Ok((config, listen, noise, metrics))
    })();
    let (config, listen, noise, metrics) = match prepared {
        Ok(prepared) => prepared,
        Err(e) => {
            eprintln!("execrelay serve: {e}");
            return 2;
        }
    };
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("execrelay serve: cannot start runtime: {e}");
            return 1;
        }
    };
    let code = rt.block_on(async move {
        // Installed before the URL is printed: a client may signal us as soon as it reads it.
        let shutdown = CancellationToken::new();
        spawn_signal_handler(shutdown.clone());
        let listeners = match bind(listen, noise, metrics).await {
            Ok(listeners) => listeners,
            Err(e) => {
                eprintln!("execrelay serve: {e}");
                return 1;
            }
        };
        crate::server::run(listeners, config, shutdown).await;
        0
    });
    // Do not wait for blocking helper threads: one may be parked in a read of a terminal
    // stdin that never ends, which would keep a signalled server alive forever.
    rt.shutdown_timeout(RUNTIME_SHUTDOWN_TIMEOUT);
    code
}

/// Bind every listener; print the metrics URL on stderr and the bound URL as the first line
/// of stdout (scripts and tests read both, so they bypass the log filter).
async fn bind(
    listen: ListenAddr,
    noise: Option<Arc<NoiseServerConfig>>,
    metrics: Option<SocketAddr>,
) -> anyhow::Result<Vec<Listener>> {
    let mut listeners = Vec::new();
    if let Some(addr) = metrics {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| anyhow::anyhow!("cannot bind --metrics-listen {addr}: {e}"))?;
        let local = listener.local_addr()?;
        eprintln!("execrelay metrics: http://{local}{METRICS_PATH}");
        listeners.push(Listener::Metrics(listener));
    }
    let (listener, url) = match (listen, noise) {
        (ListenAddr::Stdio, _) => {
            listeners.push(Listener::Stdio);
            return Ok(listeners);
        }
        (ListenAddr::Ws(addr), _) => {
            let tcp = bind_tcp(addr).await?;
            let url = bound_url(tcp.local_addr()?);
            (Listener::Ws(tcp), url)
        }
        (ListenAddr::Noise(addr), Some(noise)) => {
            let tcp = bind_tcp(addr).await?;
            let url = bound_noise_url(tcp.local_addr()?);
            (Listener::Noise(tcp, noise), url)
        }
        (ListenAddr::Noise(_), None) => anyhow::bail!("noise+ws needs --key"),
    };
    let mut out = std::io::stdout();
    let _ = writeln!(out, "{url}");
    let _ = out.flush();
    tracing::info!(%url, "listening");
    listeners.push(listener);
    Ok(listeners)
}

async fn bind_tcp(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot bind {addr}: {e}"))
}

/// After the server has finished (exit notices written), how long remaining runtime threads
/// get before the process exits anyway.
const RUNTIME_SHUTDOWN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// Parse `--metrics-listen HOST:PORT` (`localhost:PORT` means 127.0.0.1:PORT).
fn parse_metrics_listen(s: &str) -> anyhow::Result<SocketAddr> {
    let s = match s.strip_prefix("localhost:") {
        Some(port) => format!("127.0.0.1:{port}"),
        None => s.to_string(),
    };
    s.parse().map_err(|_| {
        anyhow::anyhow!("bad --metrics-listen {s:?}: expected HOST:PORT, e.g. 127.0.0.1:9464")
    })
}

/// Cancel `shutdown` on SIGTERM or SIGINT. The handlers are registered before this returns
/// (not in the spawned task), so a signal sent right after is never lost to the default action.
fn spawn_signal_handler(shutdown: CancellationToken) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::warn!("cannot install signal handlers");
        return;
    };
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::info!("signal received: shutting down");
        shutdown.cancel();
    });
}
