//! The `execrelay-relay` command line: flags (one per setting of [`settings`](super::settings),
//! the listen address and the files, each also a key of `--config FILE`), `keygen`, logging,
//! binding (TLS when `wss://`), the bound URL as the first line of stdout, signals, and the
//! hand-off to [`RelayServer::run`]. Every error about a file names its flag (or its key in
//! the `--config` file). Nothing else lives here.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, ValueEnum};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use std::path::Path;

use super::settings::{RelayFlags, RelaySettings};
use super::{bound_tls_url, bound_url, RelayServer, RelayServerConfig};
use crate::cluster::ClusterFlags;
use execrelay_io::http::METRICS_PATH;
use execrelay_io::runtimes::LinkRuntimes;
use execrelay_io::service::{init_logging, spawn_signal_handler};
use execrelay_io::tls::{CertificateFiles, TlsListener};
use execrelay_protocol::keys::environments::EnvironmentsFile;
use execrelay_protocol::keys::Keypair;

/// Log output format.
#[derive(Debug, Clone, Copy, ValueEnum, Default)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// The long help's closing paragraph: what the relay does, beyond its one-line `about`.
const AFTER_HELP: &str = "\
Exec servers dial out to /v1/env/ID and authenticate with the key the environments file lists \
for ID; clients dial /v1/connect/ID and open end-to-end encrypted streams through the relay, \
which sees frame headers and ciphertext only. Every flag except --config may also be given in \
the --config TOML file, by its name in snake_case (flags win; relative paths there are relative \
to the file). Create the relay's key with `execrelay-relay keygen -o FILE`.";

/// The help's first line: what the binary is.
const ABOUT: &str = "The execrelay relay: routes end-to-end encrypted streams between clients and exec servers that accept no inbound connection";

/// What `execrelay-relay` runs.
#[derive(Debug, clap::Subcommand)]
pub enum RelayCommand {
    /// Generate the relay's static X25519 key pair: NAME (private, mode 0600) and NAME.pub
    /// (the line every environment pins with --relay-key).
    Keygen(RelayKeygenArgs),
}

/// Flags of `execrelay-relay keygen`.
#[derive(Debug, clap::Args)]
pub struct RelayKeygenArgs {
    /// Where to write the private key; the public key goes to NAME.pub.
    #[arg(short = 'o', long = "output", value_name = "NAME")]
    pub output: PathBuf,
    /// Comment on the public key line [default: execrelay-relay@HOST].
    // The brackets are clap's help convention, not a link.
    #[allow(rustdoc::broken_intra_doc_links)]
    #[arg(short = 'c', long)]
    pub comment: Option<String>,
    /// Do nothing (and succeed) when NAME exists already: for a service's first start, as
    /// sshd makes its host keys.
    #[arg(long)]
    pub if_missing: bool,
}

/// The execrelay relay: routes end-to-end encrypted streams between clients and exec servers
/// that accept no inbound connection.
#[derive(Debug, Parser)]
#[command(
    name = "execrelay-relay",
    version,
    about = ABOUT,
    long_about = None,
    after_help = AFTER_HELP,
    args_conflicts_with_subcommands = true
)]
pub struct RelayArgs {
    /// A command instead of serving.
    #[command(subcommand)]
    pub command: Option<RelayCommand>,
    /// Where to listen: `ws://HOST:PORT`, or `wss://HOST:PORT` with --tls-cert and --tls-key
    /// (port 0 picks one; the bound URL is printed as the first line of stdout).
    #[arg(long, value_name = "ws[s]://HOST:PORT")]
    pub listen: Option<String>,
    /// The relay's private key file (from `execrelay-relay keygen`); environments pin its
    /// public key.
    #[arg(long, value_name = "FILE")]
    pub key: Option<PathBuf>,
    /// The environments file: one `ID execrelay-x25519 <base64> [comment]` line per
    /// environment; re-read when it changes (a removed line closes that environment's link).
    #[arg(long, value_name = "FILE")]
    pub environments: Option<PathBuf>,
    /// With `--listen wss://`: the certificate chain (PEM, the relay's certificate first);
    /// re-read when it changes (a file that does not load keeps the previous certificate).
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// With `--listen wss://`: the certificate's private key (PEM: PKCS#8, PKCS#1 or SEC1);
    /// re-read with the certificate.
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// Serve Prometheus metrics on `HOST:PORT` (`GET /metrics`, and `/readyz`, `/livez`,
    /// `/status`; port 0 picks one, and the URL is printed to stderr as `execrelay-relay
    /// metrics: http://HOST:PORT/metrics`). Off by default.
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics_listen: Option<String>,
    /// TOML file with the same settings as the flags, by the same names in snake_case
    /// (flags win).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Join a cluster of relays: the NATS server (`nats://HOST:PORT`) every relay of the
    /// cluster uses as its directory of which relay holds which environment. Without it the
    /// relay is standalone. Needs --node-id, --advertise and --cluster-keys.
    #[arg(long, value_name = "nats://HOST:PORT")]
    pub cluster: Option<String>,
    /// This relay's id in the cluster: its line in --cluster-keys.
    #[arg(long, value_name = "ID")]
    pub node_id: Option<String>,
    /// Where other relays of the cluster dial this one (`ws://HOST:PORT`, reachable from
    /// them) for relay-to-relay links.
    #[arg(long, value_name = "ws://HOST:PORT")]
    pub advertise: Option<String>,
    /// The cluster keys file: one `NODE_ID execrelay-x25519 <base64>` line per relay (each
    /// relay's public key line from `execrelay-relay keygen`), the same file on every relay.
    #[arg(long, value_name = "FILE")]
    pub cluster_keys: Option<PathBuf>,
    /// This relay's own key for relay-to-relay links (its line in --cluster-keys), when its
    /// --key is shared by every relay behind one front (environments pin one key whichever
    /// relay the front sends them to) [default: --key].
    #[arg(long, value_name = "FILE")]
    pub node_key: Option<PathBuf>,
    /// Log format on stderr (the filter is `RUST_LOG`, default `info,async_nats=warn`).
    #[arg(long, value_enum, default_value_t)]
    pub log_format: LogFormat,
    /// Every limit.
    #[command(flatten)]
    pub settings: RelayFlags,
}

/// A `--listen` that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("unsupported --listen {0:?}: expected ws://HOST:PORT, or wss://HOST:PORT with --tls-cert and --tls-key")]
pub struct ListenError(pub String);

/// A parsed `--listen`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listen {
    /// The address to bind.
    pub addr: SocketAddr,
    /// `wss://`: TLS on every connection.
    pub tls: bool,
}

/// Parse `--listen ws://HOST:PORT` or `wss://HOST:PORT` (`localhost` means 127.0.0.1; a
/// trailing `/` is fine). Any address is allowed: the relay carries only frame headers and
/// ciphertext.
pub fn parse_listen(s: &str) -> Result<Listen, ListenError> {
    let (rest, tls) = if let Some(rest) = s.strip_prefix("ws://") {
        (rest, false)
    } else if let Some(rest) = s.strip_prefix("wss://") {
        (rest, true)
    } else {
        return Err(ListenError(s.to_string()));
    };
    let addr = rest
        .trim_end_matches('/')
        .replace("localhost", "127.0.0.1")
        .parse()
        .map_err(|_| ListenError(s.to_string()))?;
    Ok(Listen { addr, tls })
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

/// The keys of the `--config` file that are not limits: where to listen and which files to
/// read (the flags of the same names win).
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FileLocations {
    listen: Option<String>,
    key: Option<PathBuf>,
    environments: Option<PathBuf>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    metrics_listen: Option<String>,
    cluster: Option<String>,
    node_id: Option<String>,
    advertise: Option<String>,
    cluster_keys: Option<PathBuf>,
    node_key: Option<PathBuf>,
}

/// The `--config` file, read: its locations (paths made relative to its folder) and its
/// settings.
#[derive(Debug)]
struct ConfigFile {
    path: PathBuf,
    locations: FileLocations,
    settings: RelaySettings,
}

/// Where a value came from, for messages: its flag, or its key in the `--config` file.
fn origin(flag: &str, given_as_flag: bool, config: Option<&Path>) -> String {
    match (given_as_flag, config) {
        (false, Some(file)) => format!(
            "{} (in --config {})",
            flag.replace('-', "_"),
            file.display()
        ),
        _ => format!("--{flag}"),
    }
}

/// A value given as a flag or in the `--config` file, with where it came from.
struct Located<T> {
    value: T,
    /// `--key`, or `key (in --config FILE)`.
    origin: String,
}

/// What `execrelay-relay` serves with, every file loaded and checked.
pub struct Prepared {
    /// The links' listener.
    pub listen: Listen,
    /// The metrics listener, if any.
    pub metrics: Option<SocketAddr>,
    /// The relay, TLS included.
    pub server: RelayServer,
}

impl RelayArgs {
    fn config_file(&self) -> anyhow::Result<Option<ConfigFile>> {
        let Some(path) = &self.config else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("--config {}: {e}", path.display()))?;
        let mut table: toml::Table = toml::from_str(&text)
            .map_err(|e| anyhow::anyhow!("--config {}: {e}", path.display()))?;
        let mut located = toml::Table::new();
        for key in [
            "listen",
            "key",
            "environments",
            "tls_cert",
            "tls_key",
            "metrics_listen",
            "cluster",
            "node_id",
            "advertise",
            "cluster_keys",
            "node_key",
        ] {
            if let Some(v) = table.remove(key) {
                located.insert(key.to_string(), v);
            }
        }
        let mut locations: FileLocations = toml::Value::Table(located)
            .try_into()
            .map_err(|e| anyhow::anyhow!("--config {}: {e}", path.display()))?;
        // A number may be written with its unit, as a flag's (`"256MiB"`, `"15s"`).
        execrelay_io::setting::read_units(&mut table, super::settings::SETTINGS)
            .map_err(|e| anyhow::anyhow!("--config {}: {e}", path.display()))?;
        let settings: RelaySettings = toml::Value::Table(table)
            .try_into()
            .map_err(|e| anyhow::anyhow!("--config {}: {e}", path.display()))?;
        // Relative to the configuration file, as a reader of the file expects.
        let dir = path.parent().unwrap_or(Path::new(""));
        for p in [
            &mut locations.key,
            &mut locations.environments,
            &mut locations.tls_cert,
            &mut locations.tls_key,
            &mut locations.cluster_keys,
            &mut locations.node_key,
        ]
        .into_iter()
        .flatten()
        {
            if p.is_relative() {
                *p = dir.join(&*p);
            }
        }
        Ok(Some(ConfigFile {
            path: path.clone(),
            locations,
            settings,
        }))
    }

    /// The settings: defaults, then the `--config` file, then flags.
    pub fn settings(&self) -> anyhow::Result<RelaySettings> {
        let mut s = match self.config_file()? {
            Some(file) => file.settings,
            None => RelaySettings::default(),
        };
        self.settings.apply(&mut s);
        s.validate()?;
        Ok(s)
    }

    /// A location: the flag, else the `--config` file's key.
    fn locate<T: Clone>(
        &self,
        flag: &str,
        given: &Option<T>,
        file: Option<&ConfigFile>,
        in_file: impl Fn(&FileLocations) -> Option<T>,
    ) -> Option<Located<T>> {
        if let Some(v) = given {
            return Some(Located {
                value: v.clone(),
                origin: origin(flag, true, None),
            });
        }
        let file = file?;
        in_file(&file.locations).map(|value| Located {
            value,
            origin: origin(flag, false, Some(&file.path)),
        })
    }

    /// Everything the relay needs, loaded and checked: the listen address, the keys, the
    /// environments file, TLS, the metrics address and the settings. Every error names the
    /// flag (or `--config` key) at fault.
    pub fn prepare(&self) -> anyhow::Result<Prepared> {
        let file = self.config_file()?;
        let file = file.as_ref();
        let need = |what: &str| {
            anyhow::anyhow!(
                "--{what} is required (as a flag, or `{}` in the --config file)",
                what.replace('-', "_")
            )
        };
        let listen = self
            .locate("listen", &self.listen, file, |l| l.listen.clone())
            .ok_or_else(|| need("listen"))?;
        let listen_at = parse_listen(&listen.value)?;
        let key = self
            .locate("key", &self.key, file, |l| l.key.clone())
            .ok_or_else(|| need("key"))?;
        let environments = self
            .locate("environments", &self.environments, file, |l| {
                l.environments.clone()
            })
            .ok_or_else(|| need("environments"))?;
        let cert = self.locate("tls-cert", &self.tls_cert, file, |l| l.tls_cert.clone());
        let tls_key = self.locate("tls-key", &self.tls_key, file, |l| l.tls_key.clone());
        let metrics = self
            .locate("metrics-listen", &self.metrics_listen, file, |l| {
                l.metrics_listen.clone()
            })
            .map(|m| parse_metrics_listen(&m.value))
            .transpose()?;
        let keys = Keypair::load(&key.value).map_err(|e| anyhow::anyhow!("{}: {e}", key.origin))?;
        let envs = EnvironmentsFile::load(&environments.value)
            .map_err(|e| anyhow::anyhow!("{}: {e}", environments.origin))?;
        let tls = match (listen_at.tls, cert, tls_key) {
            (true, Some(cert), Some(key)) => Some(
                TlsListener::new(CertificateFiles {
                    cert: cert.value,
                    key: key.value,
                })?,
            ),
            (true, _, _) => anyhow::bail!(
                "{} is wss://: give the certificate and its key with --tls-cert FILE and --tls-key FILE",
                listen.origin
            ),
            (false, None, None) => None,
            (false, _, _) => anyhow::bail!(
                "--tls-cert and --tls-key go with --listen wss://HOST:PORT ({} is {:?})",
                listen.origin,
                listen.value
            ),
        };
        let cluster = ClusterFlags {
            cluster: self
                .locate("cluster", &self.cluster, file, |l| l.cluster.clone())
                .map(|l| l.value),
            node_id: self
                .locate("node-id", &self.node_id, file, |l| l.node_id.clone())
                .map(|l| l.value),
            advertise: self
                .locate("advertise", &self.advertise, file, |l| l.advertise.clone())
                .map(|l| l.value),
            cluster_keys: self
                .locate("cluster-keys", &self.cluster_keys, file, |l| {
                    l.cluster_keys.clone()
                })
                .map(|l| l.value),
            node_key: self
                .locate("node-key", &self.node_key, file, |l| l.node_key.clone())
                .map(|l| l.value),
        }
        .resolve(&keys)?;
        let settings = self.settings()?;
        let mut server = RelayServer::new(RelayServerConfig {
            keys,
            environments: envs,
            settings,
        })?;
        if let Some(tls) = tls {
            let current = tls.store().current();
            tracing::info!(
                fingerprint = %current.fingerprint,
                not_after = %execrelay_io::tls::validity::utc(current.validity.not_after),
                "TLS certificate loaded"
            );
            server = server.with_tls(tls);
        }
        if let Some(spec) = cluster {
            tracing::info!(
                node = %spec.node_id,
                nats = %spec.nats_url,
                advertise = %spec.advertise,
                relays = spec.keys.len(),
                "cluster configured"
            );
            server = server.with_cluster(spec);
        }
        Ok(Prepared {
            listen: listen_at,
            metrics,
            server,
        })
    }

    /// Everything the relay needs, loaded and checked (keys, environments file, settings;
    /// TLS is [`prepare`](Self::prepare)'s).
    pub fn server_config(&self) -> anyhow::Result<RelayServerConfig> {
        let file = self.config_file()?;
        let file = file.as_ref();
        let key = self
            .locate("key", &self.key, file, |l| l.key.clone())
            .ok_or_else(|| anyhow::anyhow!("--key is required"))?;
        let environments = self
            .locate("environments", &self.environments, file, |l| {
                l.environments.clone()
            })
            .ok_or_else(|| anyhow::anyhow!("--environments is required"))?;
        Ok(RelayServerConfig {
            keys: Keypair::load(&key.value).map_err(|e| anyhow::anyhow!("{}: {e}", key.origin))?,
            environments: EnvironmentsFile::load(&environments.value)
                .map_err(|e| anyhow::anyhow!("{}: {e}", environments.origin))?,
            settings: self.settings()?,
        })
    }
}

/// Raise the soft open files limit to the hard one (distributions ship a soft 1024 for
/// `select()`'s sake, which the relay never uses) and log both; the caps are derived from
/// the result.
fn raise_descriptor_limit() {
    match execrelay_io::descriptors::raise_nofile_limit() {
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

/// The names of the link runtimes' threads: `relay-link-0`, `relay-link-1`, … (`top -H`
/// shows them).
const LINK_THREAD_NAME: &str = "relay-link";

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
    if let Some(RelayCommand::Keygen(k)) = &args.command {
        return keygen(k);
    }
    // The NATS client's own events are said once, in the relay's words (`crate::cluster::node`).
    init_logging(
        "info,async_nats=warn",
        matches!(args.log_format, LogFormat::Json),
    );
    // Before the server sizes its caps from it (`RelayDescriptorPlan`).
    raise_descriptor_limit();
    let Prepared {
        listen,
        metrics,
        server,
    } = match args.prepare() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("execrelay-relay: {e}");
            return 2;
        }
    };
    // The links run on `runtime_threads` single-threaded runtimes; this thread's runtime runs
    // the accept loops, the watchers, the cluster and the shutdown sequence.
    let threads = server.settings().runtime_threads;
    let runtimes = match LinkRuntimes::start(threads.resolve(), LINK_THREAD_NAME) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("execrelay-relay: --runtime-threads {threads}: {e}");
            return 1;
        }
    };
    tracing::info!(
        runtime_threads = runtimes.len(),
        setting = %threads,
        "links run on single-threaded runtimes, one thread each"
    );
    let server = server.with_runtimes(runtimes.clone());
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            runtimes.shutdown();
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
                        execrelay_io::service::note(format_args!(
                            "execrelay-relay metrics: http://{local}{METRICS_PATH}"
                        ));
                    }
                    Some(l)
                }
                Err(e) => {
                    execrelay_io::service::note(format_args!(
                        "execrelay-relay: cannot bind --metrics-listen {addr}: {e}"
                    ));
                    return 1;
                }
            },
            None => None,
        };
        let listener = match TcpListener::bind(listen.addr).await {
            Ok(l) => l,
            Err(e) => {
                execrelay_io::service::note(format_args!(
                    "execrelay-relay: cannot bind {}: {e}",
                    listen.addr
                ));
                return 1;
            }
        };
        let url = match listener.local_addr() {
            Ok(a) if listen.tls => bound_tls_url(a),
            Ok(a) => bound_url(a),
            Err(e) => {
                execrelay_io::service::note(format_args!("execrelay-relay: {e}"));
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
    // Every link has ended (or was left after the server's shutdown timeout): stop their
    // runtimes, then this one.
    runtimes.shutdown();
    rt.shutdown_timeout(RUNTIME_SHUTDOWN_TIMEOUT);
    code
}

/// `execrelay-relay keygen`: the relay's key pair, printed as its public line.
fn keygen(args: &RelayKeygenArgs) -> i32 {
    if args.if_missing && args.output.exists() {
        eprintln!(
            "execrelay-relay keygen: {} exists; kept",
            args.output.display()
        );
        return 0;
    }
    let comment = args.comment.clone().unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "host".into());
        format!("execrelay-relay@{host}")
    });
    let written = Keypair::generate().and_then(|kp| {
        kp.write(&args.output, &comment)?;
        Ok(kp)
    });
    match written {
        Ok(kp) => {
            println!(
                "{}",
                execrelay_protocol::keys::public_line(&kp.public, &comment)
            );
            0
        }
        Err(e) => {
            eprintln!("execrelay-relay keygen: -o {e}");
            1
        }
    }
}

#[cfg(test)]
mod tests;
