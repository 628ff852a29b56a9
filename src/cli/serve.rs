//! `execrelay serve`: flags (one per limit, plus `--config FILE`), logging, signals.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use clap::{Args, ValueEnum};
use tokio_util::sync::CancellationToken;

use crate::config::ServerConfig;
use crate::server::{
    bound_url, parse_listen, run_stdio_with_registry, run_ws_with_registry, ListenAddr,
};
use crate::session::SessionRegistry;

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
    /// `stdio` or `ws://HOST:PORT` (port 0 picks one; the bound URL is printed first).
    #[arg(long, default_value = "stdio")]
    pub listen: String,
    /// Allow plain `ws://` on a non-loopback address (traffic is unencrypted).
    #[arg(long)]
    pub danger_plaintext: bool,
    /// Serve Prometheus metrics on `HOST:PORT` (`GET /metrics`; port 0 picks one, and the URL
    /// is printed to stderr as `execrelay metrics: http://HOST:PORT/metrics`). Off by default.
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics_listen: Option<String>,
    /// TOML file with the same settings as the flags below (flags win).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Log format on stderr.
    #[arg(long, value_enum, default_value_t)]
    pub log_format: LogFormat,
    /// Largest JSON-RPC message, bytes [default: 16777216].
    #[arg(long)]
    pub max_message_bytes: Option<usize>,
    /// Processes per session [default: 256].
    #[arg(long)]
    pub max_processes: Option<usize>,
    /// Sessions per server [default: 64].
    #[arg(long)]
    pub max_sessions: Option<usize>,
    /// Retained output per process, bytes [default: 8388608].
    #[arg(long)]
    pub retained_output_bytes: Option<usize>,
    /// Unwritten output per process before the child is held back, bytes [default: 1048576].
    #[arg(long)]
    pub delivery_queue_bytes: Option<usize>,
    /// How long a detached session survives, ms [default: 60000].
    #[arg(long)]
    pub detached_session_ttl_ms: Option<u64>,
    /// Longest `process/read` long poll, ms [default: 60000].
    #[arg(long)]
    pub max_read_wait_ms: Option<u64>,
    /// How long an exited process stays known without acks, ms [default: 300000].
    #[arg(long)]
    pub exited_retention_ms: Option<u64>,
    /// Requests in flight per connection [default: 1024].
    #[arg(long)]
    pub max_pending_requests: Option<usize>,
    /// noise+ws: the server's private key file (from `execrelay keygen`).
    #[arg(long)]
    pub key: Option<PathBuf>,
    /// noise+ws: the authorized-keys file (re-read when it changes).
    #[arg(long)]
    pub authorized_keys: Option<PathBuf>,
    /// noise+ws: also require this token (read from the file) in every handshake.
    #[arg(long)]
    pub auth_token_file: Option<PathBuf>,
    /// noise+ws: handshakes waiting for authorization per link [default: 32].
    #[arg(long)]
    pub max_pending_authorizations: Option<usize>,
    /// noise+ws: established streams per link [default: 1024].
    #[arg(long)]
    pub max_streams_per_link: Option<usize>,
    /// noise+ws: handshake failures tolerated back to back per link [default: 8].
    #[arg(long)]
    pub handshake_failure_burst: Option<u32>,
    /// noise+ws: one handshake failure forgiven per this many ms [default: 2000].
    #[arg(long)]
    pub handshake_failure_refill_ms: Option<u64>,
    /// noise+ws: WebSocket ping interval, ms [default: 15000].
    #[arg(long)]
    pub keepalive_interval_ms: Option<u64>,
    /// noise+ws: a link silent for this long is dead, ms [default: 30000].
    #[arg(long)]
    pub pong_timeout_ms: Option<u64>,
}

impl ServeArgs {
    /// The Noise listener's configuration (keys are loaded and checked here, at start).
    pub fn noise_config(&self) -> anyhow::Result<crate::link::server::NoiseServerConfig> {
        use crate::link::server::{LinkLimits, NoiseServerConfig};
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
        let mut limits = LinkLimits::default();
        if let Some(v) = self.max_pending_authorizations {
            limits.max_pending_authorizations = v;
        }
        if let Some(v) = self.max_streams_per_link {
            limits.max_streams_per_link = v;
        }
        if let Some(v) = self.handshake_failure_burst {
            limits.failure_burst = v;
        }
        if let Some(v) = self.handshake_failure_refill_ms {
            limits.failure_refill = std::time::Duration::from_millis(v);
        }
        if let Some(v) = self.keepalive_interval_ms {
            limits.keepalive_interval = std::time::Duration::from_millis(v.max(1));
        }
        if let Some(v) = self.pong_timeout_ms {
            limits.pong_timeout = std::time::Duration::from_millis(v.max(1));
        }
        Ok(NoiseServerConfig {
            keys,
            authorizer: std::sync::Arc::new(KeysAuthorizer::new(authorized, token)),
            env_id: String::new(),
            limits,
        })
    }
}

impl ServeArgs {
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
        macro_rules! set {
            ($($f:ident),*) => { $( if let Some(v) = self.$f { c.$f = v; } )* };
        }
        set!(
            max_message_bytes,
            max_processes,
            max_sessions,
            retained_output_bytes,
            delivery_queue_bytes,
            detached_session_ttl_ms,
            max_read_wait_ms,
            exited_retention_ms,
            max_pending_requests
        );
        c.validate()?;
        Ok(c)
    }
}

/// Run `serve`; returns the exit code.
pub fn main(args: ServeArgs) -> i32 {
    crate::cli::init_logging("info", matches!(args.log_format, LogFormat::Json));
    let config = match args.config() {
        Ok(c) => Arc::new(c),
        Err(e) => {
            eprintln!("execrelay serve: {e}");
            return 2;
        }
    };
    let listen = match parse_listen(&args.listen, args.danger_plaintext) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("execrelay serve: {e}");
            return 2;
        }
    };
    let noise = if matches!(listen, ListenAddr::Noise(_)) {
        match args.noise_config() {
            Ok(c) => Some(Arc::new(c)),
            Err(e) => {
                eprintln!("execrelay serve: {e}");
                return 2;
            }
        }
    } else {
        None
    };
    let metrics_addr = match args.metrics_listen.as_deref().map(parse_metrics_listen) {
        None => None,
        Some(Ok(a)) => Some(a),
        Some(Err(e)) => {
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
        let shutdown = CancellationToken::new();
        spawn_signal_handler(shutdown.clone());
        let registry = SessionRegistry::new(config, Arc::new(crate::metrics::Metrics::new()));
        if let Some(addr) = metrics_addr {
            let listener = match crate::metrics_endpoint::bind(addr).await {
                Ok(l) => l,
                Err(e) => {
                    eprintln!("execrelay serve: cannot bind --metrics-listen {addr}: {e}");
                    return 1;
                }
            };
            if let Ok(local) = listener.local_addr() {
                // Not through the log filter: scripts and tests read it, like the bound URL.
                eprintln!(
                    "execrelay metrics: http://{local}{}",
                    crate::metrics_endpoint::METRICS_PATH
                );
            }
            tokio::spawn(crate::metrics_endpoint::serve(
                listener,
                registry.clone(),
                shutdown.clone(),
            ));
        }
        match listen {
            ListenAddr::Stdio => {
                run_stdio_with_registry(registry, shutdown).await;
                0
            }
            ListenAddr::Noise(addr) => {
                let Some(noise) = noise else { return 2 };
                let listener = match tokio::net::TcpListener::bind(addr).await {
                    Ok(l) => l,
                    Err(e) => {
                        eprintln!("execrelay serve: cannot bind {addr}: {e}");
                        return 1;
                    }
                };
                let Ok(local) = listener.local_addr() else {
                    return 1;
                };
                let url = crate::server::bound_noise_url(local);
                let mut out = std::io::stdout();
                let _ = writeln!(out, "{url}");
                let _ = out.flush();
                tracing::info!(%url, "listening (noise)");
                crate::link::server::serve_noise(listener, noise, registry, shutdown).await;
                0
            }
            ListenAddr::Ws(addr) => {
                let listener = match tokio::net::TcpListener::bind(addr).await {
                    Ok(l) => l,
                    Err(e) => {
                        eprintln!("execrelay serve: cannot bind {addr}: {e}");
                        return 1;
                    }
                };
                let local = match listener.local_addr() {
                    Ok(a) => a,
                    Err(e) => {
                        eprintln!("execrelay serve: {e}");
                        return 1;
                    }
                };
                let mut out = std::io::stdout();
                let _ = writeln!(out, "{}", bound_url(local));
                let _ = out.flush();
                tracing::info!(url = %bound_url(local), "listening");
                match run_ws_with_registry(listener, registry, shutdown).await {
                    Ok(()) => 0,
                    Err(e) => {
                        eprintln!("execrelay serve: {e}");
                        1
                    }
                }
            }
        }
    });
    // Do not wait for blocking helper threads: one may be parked in a read of a terminal
    // stdin that never ends, which would keep a signalled server alive forever.
    rt.shutdown_timeout(RUNTIME_SHUTDOWN_TIMEOUT);
    code
}

/// After the server has finished (exit notices written), how long remaining runtime threads
/// get before the process exits anyway.
const RUNTIME_SHUTDOWN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// Parse `--metrics-listen HOST:PORT` (`localhost:PORT` means 127.0.0.1:PORT).
fn parse_metrics_listen(s: &str) -> anyhow::Result<std::net::SocketAddr> {
    let s = match s.strip_prefix("localhost:") {
        Some(port) => format!("127.0.0.1:{port}"),
        None => s.to_string(),
    };
    s.parse().map_err(|_| {
        anyhow::anyhow!("bad --metrics-listen {s:?}: expected HOST:PORT, e.g. 127.0.0.1:9464")
    })
}

fn spawn_signal_handler(shutdown: CancellationToken) {
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            return;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::info!("signal received: shutting down");
        shutdown.cancel();
    });
}
