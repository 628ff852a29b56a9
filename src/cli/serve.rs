//! `execrelay serve`: flags (one per limit, plus `--config FILE`), logging, signals.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use clap::{Args, ValueEnum};
use tokio_util::sync::CancellationToken;

use crate::config::ServerConfig;
use crate::server::{bound_url, parse_listen, run_stdio, run_ws, ListenAddr};

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
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("execrelay serve: cannot start runtime: {e}");
            return 1;
        }
    };
    rt.block_on(async move {
        let shutdown = CancellationToken::new();
        spawn_signal_handler(shutdown.clone());
        match listen {
            ListenAddr::Stdio => {
                run_stdio(config, shutdown).await;
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
                match run_ws(listener, config, shutdown).await {
                    Ok(()) => 0,
                    Err(e) => {
                        eprintln!("execrelay serve: {e}");
                        1
                    }
                }
            }
        }
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
