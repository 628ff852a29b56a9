//! The `execrelay-relay` command line: flags (one per setting of [`settings`](super::settings),
//! plus `--config FILE`), logging, binding, the bound URL as the first line of stdout, signals,
//! and the hand-off to [`RelayServer::run`]. Nothing else lives here.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use clap::{Parser, ValueEnum};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::settings::{RelayFlags, RelaySettings};
use super::{bound_url, RelayServer, RelayServerConfig};
use crate::http::METRICS_PATH;
use crate::keys::environments::EnvironmentsFile;
use crate::keys::Keypair;

/// Log output format.
#[derive(Debug, Clone, Copy, ValueEnum, Default)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// execrelay-relay: lets clients reach exec servers that accept no inbound connection. Exec
/// servers dial out to `/v1/env/ID` and authenticate with the key the environments file lists
/// for ID; clients dial `/v1/connect/ID` and open end-to-end encrypted streams through it. The
/// relay sees frame headers and ciphertext only.
#[derive(Debug, Parser)]
#[command(name = "execrelay-relay", version, about, long_about = None)]
pub struct RelayArgs {
    /// Where to listen: `ws://HOST:PORT` (port 0 picks one; the bound URL is printed as the
    /// first line of stdout). For `wss://`, put a TLS-terminating proxy in front.
    #[arg(long, value_name = "ws://HOST:PORT")]
    pub listen: String,
    /// The relay's private key file (from `execrelay keygen`); environments pin its public key.
    #[arg(long, value_name = "FILE")]
    pub key: PathBuf,
    /// The environments file: one `ID execrelay-x25519 <base64> [comment]` line per
    /// environment; re-read when it changes (a removed line closes that environment's link).
    #[arg(long, value_name = "FILE")]
    pub environments: PathBuf,
    /// Serve Prometheus metrics on `HOST:PORT` (`GET /metrics`; port 0 picks one, and the URL is
    /// printed to stderr as `execrelay-relay metrics: http://HOST:PORT/metrics`). Off by default.
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics_listen: Option<String>,
    /// TOML file with the same settings as the flags below, by the same names in snake_case
    /// (flags win).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Log format on stderr (the filter is `RUST_LOG`, default `info`).
    #[arg(long, value_enum, default_value_t)]
    pub log_format: LogFormat,
    /// Every limit.
    #[command(flatten)]
    pub settings: RelayFlags,
}

/// A `--listen` that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("unsupported --listen {0:?}: expected ws://HOST:PORT (for TLS, put a TLS-terminating proxy in front of the relay)")]
pub struct ListenError(pub String);

/// Parse `--listen ws://HOST:PORT` (`localhost` means 127.0.0.1; a trailing `/` is fine).
/// Any address is allowed: the relay carries only frame headers and ciphertext.
pub fn parse_listen(s: &str) -> Result<SocketAddr, ListenError> {
    let rest = s
        .strip_prefix("ws://")
        .ok_or_else(|| ListenError(s.to_string()))?;
    rest.trim_end_matches('/')
        .replace("localhost", "127.0.0.1")
        .parse()
        .map_err(|_| ListenError(s.to_string()))
}

/// Parse `--metrics-listen HOST:PORT` (`localhost:PORT` means 127.0.0.1:PORT).
pub fn parse_metrics_listen(s: &str) -> anyhow::Result<SocketAddr> {
    let s = match s.strip_prefix("localhost:") {
        Some(port) => format!("127.0.0.1:{port}"),
        None => s.to_string(),
    };
    s.parse().map_err(|_| {
        anyhow::anyhow!("bad --metrics-listen {s:?}: expected HOST:PORT, e.g. 127.0.0.1:9465")
    })
}

impl RelayArgs {
    /// The settings: defaults, then the `--config` file, then flags.
    pub fn settings(&self) -> anyhow::Result<RelaySettings> {
        let mut s = match &self.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
                RelaySettings::from_toml(&text)
                    .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
            }
            None => RelaySettings::default(),
        };
        self.settings.apply(&mut s);
        s.validate()?;
        Ok(s)
    }

    /// Everything the relay needs, loaded and checked (keys, environments file, settings).
    pub fn server_config(&self) -> anyhow::Result<RelayServerConfig> {
        let keys = Keypair::load(&self.key)?;
        let environments = EnvironmentsFile::load(&self.environments)?;
        Ok(RelayServerConfig {
            keys,
            environments,
            settings: self.settings()?,
        })
    }
}

/// Install the tracing subscriber: stderr, `RUST_LOG` (default `default`), text or JSON. The
/// exec server's binary uses it too, so both log alike.
pub fn init_logging(default: &str, json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

/// Raise the soft open files limit to the hard one (distributions ship a soft 1024 for
/// `select()`'s sake, which the relay never uses) and log both; the caps are derived from
/// the result.
fn raise_descriptor_limit() {
    match crate::descriptors::raise_nofile_limit() {
        Ok((before, after)) if after.soft > before.soft => tracing::info!(
            "open files: soft limit raised from {} to {} (the hard limit)",
            before.soft,
            after.soft
        ),
        Ok((_, after)) => tracing::info!(
            "open files: soft limit {} (hard limit {})",
            after.soft,
            after.hard
        ),
        Err(e) => tracing::warn!("cannot raise the open files limit: {e}"),
    }
}

/// After the relay has finished, how long remaining runtime threads get before the process
/// exits anyway.
const RUNTIME_SHUTDOWN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// Run `execrelay-relay` with the process's arguments; returns the exit code (2: bad flags or
/// files, 1: cannot bind, 0: shut down by a signal).
pub fn main() -> i32 {
    let args = match RelayArgs::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { 2 } else { 0 };
        }
    };
    run(args)
}

/// Run with parsed arguments.
pub fn run(args: RelayArgs) -> i32 {
    init_logging("info", matches!(args.log_format, LogFormat::Json));
    // Before the server sizes its caps from it (`RelayDescriptorPlan`).
    raise_descriptor_limit();
    let prepared = (|| -> anyhow::Result<_> {
        let listen = parse_listen(&args.listen)?;
        let metrics = args
            .metrics_listen
            .as_deref()
            .map(parse_metrics_listen)
            .transpose()?;
        let server = RelayServer::new(args.server_config()?)?;
        Ok((listen, metrics, server))
    })();
    let (listen, metrics, server) = match prepared {
        Ok(p) => p,
        Err(e) => {
            eprintln!("execrelay-relay: {e}");
            return 2;
        }
    };
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("execrelay-relay: cannot start runtime: {e}");
            return 1;
        }
    };
    let code = rt.block_on(async move {
        // Installed before the URL is printed: a supervisor may signal as soon as it reads it.
        let shutdown = CancellationToken::new();
        spawn_signal_handler(shutdown.clone());
        let metrics = match metrics {
            Some(addr) => match TcpListener::bind(addr).await {
                Ok(l) => {
                    if let Ok(local) = l.local_addr() {
                        eprintln!("execrelay-relay metrics: http://{local}{METRICS_PATH}");
                    }
                    Some(l)
                }
                Err(e) => {
                    eprintln!("execrelay-relay: cannot bind --metrics-listen {addr}: {e}");
                    return 1;
                }
            },
            None => None,
        };
        let listener = match TcpListener::bind(listen).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("execrelay-relay: cannot bind {listen}: {e}");
                return 1;
            }
        };
        let url = match listener.local_addr() {
            Ok(a) => bound_url(a),
            Err(e) => {
                eprintln!("execrelay-relay: {e}");
                return 1;
            }
        };
        let mut out = std::io::stdout();
        let _ = writeln!(out, "{url}");
        let _ = out.flush();
        tracing::info!(%url, "listening");
        server.run(listener, metrics, shutdown).await;
        0
    });
    rt.shutdown_timeout(RUNTIME_SHUTDOWN_TIMEOUT);
    code
}

/// Cancel `shutdown` on SIGTERM or SIGINT. The handlers are registered before this returns,
/// so a signal sent right after is never lost to the default action.
/// Cancel `shutdown` on SIGTERM or SIGINT (both binaries' graceful shutdown). The handlers are
/// registered before this returns (not in the spawned task), so a signal sent right after is
/// never lost to the default action.
pub fn spawn_signal_handler(shutdown: CancellationToken) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::warn!("cannot install signal handlers");
        return;
    };
    let shutdown = Arc::new(shutdown);
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::info!("signal received: shutting down");
        shutdown.cancel();
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn listen_addresses() {
        assert_eq!(
            parse_listen("ws://127.0.0.1:0").unwrap(),
            "127.0.0.1:0".parse().unwrap()
        );
        assert_eq!(
            parse_listen("ws://localhost:8080/").unwrap(),
            "127.0.0.1:8080".parse().unwrap()
        );
        assert!(parse_listen("ws://[::1]:9").is_ok());
        assert!(parse_listen("ws://0.0.0.0:443").is_ok(), "any address");
        for bad in [
            "wss://127.0.0.1:1",
            "127.0.0.1:1",
            "ws://host",
            "noise+ws://1.2.3.4:5",
        ] {
            let err = parse_listen(bad).unwrap_err().to_string();
            assert!(err.contains("ws://HOST:PORT"), "{bad}: {err}");
        }
    }

    #[test]
    fn every_setting_has_a_flag_with_its_default_in_the_help() {
        RelayArgs::command().debug_assert();
        let help = RelayArgs::command().render_long_help().to_string();
        for s in super::super::settings::SETTINGS {
            assert!(
                help.contains(&format!("--{}", s.flag())),
                "no flag for {}",
                s.name
            );
        }
        let args = RelayArgs::try_parse_from([
            "execrelay-relay",
            "--listen",
            "ws://127.0.0.1:0",
            "--key",
            "k",
            "--environments",
            "e",
            "--pong-timeout-ms",
            "700",
            "--max-environments",
            "2",
        ])
        .unwrap();
        let s = args.settings().unwrap();
        assert_eq!((s.pong_timeout_ms, s.max_environments), (700, 2));
        assert_eq!(s.keepalive_interval_ms, 15_000);
    }

    #[test]
    fn flags_win_over_the_config_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("relay.toml");
        std::fs::write(&path, "max_environments = 5\nopens_per_second = 9\n").unwrap();
        let args = RelayArgs::try_parse_from([
            "execrelay-relay",
            "--listen",
            "ws://127.0.0.1:0",
            "--key",
            "k",
            "--environments",
            "e",
            "--config",
            path.to_str().unwrap(),
            "--opens-per-second",
            "3",
        ])
        .unwrap();
        let s = args.settings().unwrap();
        assert_eq!((s.max_environments, s.opens_per_second), (5, 3));
        std::fs::write(&path, "no_such_key = 1\n").unwrap();
        let err = args.settings().unwrap_err().to_string();
        assert!(
            err.contains("relay.toml") && err.contains("no_such_key"),
            "{err}"
        );
    }
}
