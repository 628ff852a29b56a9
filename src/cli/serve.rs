//! `execrelay serve`: parse the flags (one per setting, from `config/`, plus `--config
//! FILE`, whose keys also give the listen addresses and the files; every error about a file
//! names its flag or key), start the server (its process containment: [`Server::new`]),
//! bind the listeners (metrics and health included), print the bound URL as the first line
//! of stdout, and hand everything to the composition root ([`Server::run`]). Nothing else
//! lives here.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use clap::{Args, ValueEnum};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::{ConfigFlags, ServerConfig};
use crate::link::environment::RelayDial;
use crate::link::server::NoiseServerConfig;
use crate::policy::PolicyFile;
use crate::server::{bound_noise_url, bound_url, parse_listen, ListenAddr, Listener, Server};
use execrelay_io::http::{METRICS_PATH, READYZ_PATH};
use execrelay_io::service::spawn_signal_handler;

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
    /// printed first) [default: stdio, unless --relay is given].
    #[arg(long)]
    pub listen: Option<String>,
    /// Also (or only) serve through a relay: its base URL, `ws://RELAY:PORT` or
    /// `wss://RELAY:PORT`; the server dials `URL/v1/env/ID` and keeps that link up. Needs
    /// --environment-id, --relay-key, --key and --authorized-keys.
    #[arg(long, value_name = "URL")]
    pub relay: Option<String>,
    /// --relay: this environment's id (as listed in the relay's environments file).
    #[arg(long, value_name = "ID")]
    pub environment_id: Option<String>,
    /// --relay: the relay's public key (a `.pub` file or the key line itself), pinned.
    #[arg(long, value_name = "KEY_OR_FILE")]
    pub relay_key: Option<String>,
    /// --relay with wss://: trust only the CA certificates (PEM) in this file instead of the
    /// platform's roots.
    #[arg(long, value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
    /// Allow plain `ws://` on a non-loopback address (traffic is unencrypted).
    #[arg(long)]
    pub danger_plaintext: bool,
    /// Serve Prometheus metrics on `HOST:PORT` (`GET /metrics`, and the health routes
    /// `/readyz`, `/livez`, `/status`; port 0 picks one, and the URL is printed to stderr as
    /// `execrelay metrics: http://HOST:PORT/metrics`). Off by default.
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics_listen: Option<String>,
    /// Serve the health routes alone on `HOST:PORT`: `GET /readyz` (200 while the server
    /// accepts and, with --relay, while its link to the relay is up and authenticated; 503
    /// with the reason otherwise), `/livez`, `/status` (JSON). The URL is printed to stderr as
    /// `execrelay health: http://HOST:PORT/readyz`. Off by default.
    #[arg(long, value_name = "HOST:PORT")]
    pub health_listen: Option<String>,
    /// TOML file with the same settings as the flags, by the same names in snake_case (flags
    /// win; relative paths in it are relative to the file).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Log format on stderr.
    #[arg(long, value_enum, default_value_t)]
    pub log_format: LogFormat,
    /// noise+ws and --relay: the server's private key file (from `execrelay keygen`).
    #[arg(long)]
    pub key: Option<PathBuf>,
    /// noise+ws and --relay: the authorized-keys file (re-read when it changes).
    #[arg(long)]
    pub authorized_keys: Option<PathBuf>,
    /// noise+ws and --relay: also require this token (read from the file) in every handshake.
    #[arg(long)]
    pub auth_token_file: Option<PathBuf>,
    /// The exec policy: a TOML file of rules that allow, deny or ask (the client) about each
    /// process by its program (re-read when it changes). Also `exec_policy = "FILE"` in the
    /// `--config` file (this flag wins).
    #[arg(long, value_name = "FILE")]
    pub exec_policy: Option<PathBuf>,
    /// The longest `sessionTtlMs` a client may ask for, as a duration (`24h`, `90m`; the
    /// same setting as --max-session-ttl-ms) [default: 24h].
    #[arg(long, value_name = "DURATION", value_parser = super::duration::parse_duration,
          help_heading = "Limits", conflicts_with = "max_session_ttl_ms")]
    pub max_session_ttl: Option<std::time::Duration>,
    /// Every limit of `config/`.
    #[command(flatten, next_help_heading = "Limits")]
    pub settings: ConfigFlags,
}

/// A value given as a flag or in the `--config` file, and where it came from (`--key`, or
/// `key (in --config FILE)`), for messages.
#[derive(Debug, Clone)]
struct Located<T> {
    value: T,
    origin: String,
}

impl<T> Located<T> {
    fn flag(value: T, flag: &str) -> Located<T> {
        Located {
            value,
            origin: format!("--{flag}"),
        }
    }
}

/// Pick the flag's value, else the `--config` file's.
fn locate<T: Clone>(
    flag: &str,
    given: &Option<T>,
    file: Option<&ConfigFile>,
    in_file: impl Fn(&FileLocations) -> &Option<T>,
) -> Option<Located<T>> {
    if let Some(v) = given {
        return Some(Located::flag(v.clone(), flag));
    }
    let file = file?;
    in_file(&file.locations).clone().map(|value| Located {
        value,
        origin: format!(
            "{} (in --config {})",
            flag.replace('-', "_"),
            file.path.display()
        ),
    })
}

impl ServeArgs {
    /// The Noise listener's keys and authorizer (loaded and checked here, at start), for
    /// environment `env_id` (empty for a direct `noise+ws://` listener). Errors name the flag.
    pub fn noise_config(&self, env_id: &str) -> anyhow::Result<NoiseServerConfig> {
        use crate::noise::authorizer::KeysAuthorizer;
        use crate::noise::keys::{AuthorizedKeys, Keypair};
        let file = self.config_file()?;
        let file = file.as_ref();
        let key = locate("key", &self.key, file, |l| &l.key).ok_or_else(|| {
            anyhow::anyhow!(
                "noise+ws and --relay need --key (create one with `execrelay keygen -o FILE`)"
            )
        })?;
        let keys = Keypair::load(&key.value).map_err(|e| anyhow::anyhow!("{}: {e}", key.origin))?;
        let auth = locate("authorized-keys", &self.authorized_keys, file, |l| {
            &l.authorized_keys
        })
        .ok_or_else(|| anyhow::anyhow!("noise+ws and --relay need --authorized-keys FILE"))?;
        let authorized = AuthorizedKeys::load(&auth.value)
            .map_err(|e| anyhow::anyhow!("{}: {e}", auth.origin))?;
        let token = match locate("auth-token-file", &self.auth_token_file, file, |l| {
            &l.auth_token_file
        }) {
            Some(p) => {
                let t = std::fs::read_to_string(&p.value)
                    .map_err(|e| anyhow::anyhow!("{} {}: {e}", p.origin, p.value.display()))?;
                let t = t.trim().to_string();
                if t.is_empty() {
                    anyhow::bail!("{} {}: empty token", p.origin, p.value.display());
                }
                Some(t)
            }
            None => None,
        };
        Ok(NoiseServerConfig {
            keys,
            authorizer: Arc::new(KeysAuthorizer::new(authorized, token)),
            env_id: env_id.to_string(),
        })
    }

    /// The `--listen` address: the flag (or `listen` in the `--config` file), or `stdio`
    /// unless `--relay` is given.
    pub fn listen(&self) -> anyhow::Result<Option<ListenAddr>> {
        let file = self.config_file()?;
        let file = file.as_ref();
        let listen = locate("listen", &self.listen, file, |l| &l.listen);
        let relay = locate("relay", &self.relay, file, |l| &l.relay);
        match (listen, relay) {
            (Some(l), _) => Ok(Some(
                parse_listen(&l.value, self.danger_plaintext)
                    .map_err(|e| anyhow::anyhow!("{}: {e}", l.origin))?,
            )),
            (None, Some(_)) => Ok(None),
            (None, None) => Ok(Some(ListenAddr::Stdio)),
        }
    }

    /// The environment link (`--relay`), checked at start: its flags, the relay's key, the
    /// URL and the CA file.
    pub fn relay_dial(&self) -> anyhow::Result<Option<RelayDial>> {
        use crate::link::dial::{check_env_id, environment_url, TlsRoots};
        let file = self.config_file()?;
        let file = file.as_ref();
        let environment_id = locate("environment-id", &self.environment_id, file, |l| {
            &l.environment_id
        });
        let relay_key = locate("relay-key", &self.relay_key, file, |l| &l.relay_key);
        let Some(relay) = locate("relay", &self.relay, file, |l| &l.relay) else {
            if environment_id.is_some() || relay_key.is_some() {
                anyhow::bail!("--environment-id and --relay-key go with --relay URL");
            }
            return Ok(None);
        };
        let env_id =
            environment_id.ok_or_else(|| anyhow::anyhow!("--relay needs --environment-id ID"))?;
        check_env_id(&env_id.value).map_err(|e| anyhow::anyhow!("{}: {e}", env_id.origin))?;
        let relay_key = relay_key.ok_or_else(|| {
            anyhow::anyhow!(
                "--relay needs --relay-key (the relay's public key: a .pub file or the key line)"
            )
        })?;
        let relay_public = crate::noise::keys::load_public(&relay_key.value)
            .map_err(|e| anyhow::anyhow!("{}: {e}", relay_key.origin))?;
        environment_url(&relay.value, &env_id.value)
            .map_err(|e| anyhow::anyhow!("{}: {e}", relay.origin))?;
        let tls = match locate("ca-file", &self.ca_file, file, |l| &l.ca_file) {
            Some(p) => {
                let roots = TlsRoots::CaFile(p.value.clone());
                roots.client_config()?;
                roots
            }
            None => TlsRoots::Platform,
        };
        Ok(Some(RelayDial {
            relay_url: relay.value,
            env_id: env_id.value,
            relay_public,
            tls,
        }))
    }

    /// `--metrics-listen` and `--health-listen` (flags, or the `--config` file's keys).
    pub fn probe_listeners(&self) -> anyhow::Result<(Option<SocketAddr>, Option<SocketAddr>)> {
        let file = self.config_file()?;
        let file = file.as_ref();
        let parse = |l: Option<Located<String>>| {
            l.map(|l| parse_probe_listen(&l.value, &l.origin))
                .transpose()
        };
        Ok((
            parse(locate("metrics-listen", &self.metrics_listen, file, |l| {
                &l.metrics_listen
            }))?,
            parse(locate("health-listen", &self.health_listen, file, |l| {
                &l.health_listen
            }))?,
        ))
    }

    /// Build the configuration: defaults, then the file, then flags.
    pub fn config(&self) -> anyhow::Result<ServerConfig> {
        let mut c = match self.config_file()? {
            Some(file) => ServerConfig::from_toml_table(file.settings)
                .map_err(|e| anyhow::anyhow!("--config {}: {e}", file.path.display()))?,
            None => ServerConfig::default(),
        };
        self.settings.apply(&mut c);
        if let Some(ttl) = self.max_session_ttl {
            c.max_session_ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        }
        c.validate()?;
        Ok(c)
    }

    /// The exec policy (`--exec-policy`, else `exec_policy` in the `--config` file), loaded and
    /// checked now: a bad file stops the server before it serves.
    pub fn exec_policy(&self) -> anyhow::Result<Option<Arc<PolicyFile>>> {
        let file = self.config_file()?;
        match locate("exec-policy", &self.exec_policy, file.as_ref(), |l| {
            &l.exec_policy
        }) {
            Some(p) => Ok(Some(Arc::new(
                PolicyFile::load(&p.value).map_err(|e| anyhow::anyhow!("{}: {e}", p.origin))?,
            ))),
            None => Ok(None),
        }
    }

    /// The `--config` file, if any: its settings and the keys that are not settings (the
    /// listen addresses and files; relative paths made relative to the file).
    fn config_file(&self) -> anyhow::Result<Option<ConfigFile>> {
        let Some(path) = &self.config else {
            return Ok(None);
        };
        let at = |e: &dyn std::fmt::Display| anyhow::anyhow!("--config {}: {e}", path.display());
        let text = std::fs::read_to_string(path).map_err(|e| at(&e))?;
        let mut settings: toml::Table = toml::from_str(&text).map_err(|e| at(&e))?;
        let mut located = toml::Table::new();
        for key in FileLocations::KEYS {
            if let Some(v) = settings.remove(key) {
                located.insert(key.to_string(), v);
            }
        }
        let mut locations: FileLocations =
            toml::Value::Table(located).try_into().map_err(|e| at(&e))?;
        // Relative to the configuration file, as a reader of the file expects.
        let dir = path.parent().unwrap_or(std::path::Path::new(""));
        for p in [
            &mut locations.key,
            &mut locations.authorized_keys,
            &mut locations.auth_token_file,
            &mut locations.ca_file,
            &mut locations.exec_policy,
        ]
        .into_iter()
        .flatten()
        {
            if p.is_relative() {
                *p = dir.join(&*p);
            }
        }
        if let Some(k) = &mut locations.relay_key {
            // A key line stays as it is; a file name is relative to the configuration file.
            let is_line = k
                .trim_start()
                .starts_with(crate::noise::keys::PUBLIC_KEY_TAG);
            if !is_line && std::path::Path::new(k.as_str()).is_relative() {
                *k = dir.join(k.as_str()).display().to_string();
            }
        }
        Ok(Some(ConfigFile {
            path: path.clone(),
            settings,
            locations,
        }))
    }
}

/// The `--config` file: every setting of [`ServerConfig`], plus the keys that are not limits.
struct ConfigFile {
    path: PathBuf,
    settings: toml::Table,
    locations: FileLocations,
}

/// The keys of the `--config` file that are not settings of [`ServerConfig`]: where to
/// listen, which relay to dial, and which files to read (each also a flag, which wins).
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FileLocations {
    listen: Option<String>,
    relay: Option<String>,
    environment_id: Option<String>,
    relay_key: Option<String>,
    ca_file: Option<PathBuf>,
    metrics_listen: Option<String>,
    health_listen: Option<String>,
    key: Option<PathBuf>,
    authorized_keys: Option<PathBuf>,
    auth_token_file: Option<PathBuf>,
    exec_policy: Option<PathBuf>,
}

impl FileLocations {
    const KEYS: [&'static str; 11] = [
        "listen",
        "relay",
        "environment_id",
        "relay_key",
        "ca_file",
        "metrics_listen",
        "health_listen",
        "key",
        "authorized_keys",
        "auth_token_file",
        "exec_policy",
    ];
}

/// Run `serve`; returns the exit code.
pub fn main(args: ServeArgs) -> i32 {
    crate::cli::init_logging("info", matches!(args.log_format, LogFormat::Json));
    let prepared = (|| -> anyhow::Result<_> {
        let config = Arc::new(args.config()?);
        let listen = args.listen()?;
        let relay = args.relay_dial()?;
        // The policy file before containment: a file that does not parse stops the start
        // (naming the file and the rule) before any cgroup is made or swept.
        let policy = args.exec_policy()?;
        if let Some(p) = &policy {
            tracing::info!(path = %p.path().display(), rules = p.current().rule_count(), "exec policy loaded");
        }
        let noise = match listen {
            Some(ListenAddr::Noise(_)) => Some(Arc::new(args.noise_config("")?)),
            _ => None,
        };
        let relay = match relay {
            Some(dial) => {
                let noise = Arc::new(args.noise_config(&dial.env_id)?);
                Some((dial, noise))
            }
            None => None,
        };
        let probes = args.probe_listeners()?;
        // Containment (and its crash sweep) before anything is bound or printed: a backend
        // named explicitly that cannot work here stops the start with its reason.
        let server = Server::with_exec_policy(config, policy)?;
        Ok((server, listen, noise, relay, probes))
    })();
    let (server, listen, noise, relay, probes) = match prepared {
        Ok(prepared) => prepared,
        Err(e) => {
            eprintln!("execrelay serve: {e}");
            return 2;
        }
    };
    if let Err(e) = raise_descriptor_limit(server.registry().config().descriptor_reserve) {
        eprintln!("execrelay serve: {e}");
        return 2;
    }
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
        spawn_state_dump(server.registry());
        let listeners = match bind(listen, noise, relay, probes).await {
            Ok(listeners) => listeners,
            Err(e) => {
                execrelay_io::service::note(format_args!("execrelay serve: {e}"));
                return 1;
            }
        };
        server.run(listeners, shutdown).await;
        0
    });
    // Do not wait for blocking helper threads: one may be parked in a read of a terminal
    // stdin that never ends, which would keep a signalled server alive forever.
    rt.shutdown_timeout(RUNTIME_SHUTDOWN_TIMEOUT);
    code
}

/// `SIGUSR1` logs what every process's output waits for, one `stream state:` line each
/// (`session::stream_state`): for an operator, or a harness that saw output stop from outside.
fn spawn_state_dump(registry: &Arc<crate::session::SessionRegistry>) {
    use tokio::signal::unix::{signal, SignalKind};
    let registry = Arc::downgrade(registry);
    match signal(SignalKind::user_defined1()) {
        Ok(mut sig) => {
            tokio::spawn(async move {
                while sig.recv().await.is_some() {
                    let Some(registry) = registry.upgrade() else {
                        return;
                    };
                    crate::session::stream_state::log_all(registry.all_processes());
                }
            });
        }
        Err(e) => tracing::warn!("cannot listen for SIGUSR1 (the stream state dump): {e}"),
    }
}

/// Raise the soft limit of open files to the hard limit and log both; a
/// limit that leaves nothing above the descriptor reserve would refuse every connection, so
/// it is an error.
fn raise_descriptor_limit(reserve: usize) -> anyhow::Result<()> {
    use crate::bounds::descriptors::raise_nofile_limit;
    match raise_nofile_limit() {
        Ok((before, after)) => {
            if after.soft > before.soft {
                tracing::info!(
                    "open files: soft limit raised from {} to {} (the hard limit)",
                    before.soft,
                    after.soft
                );
            } else {
                tracing::info!(
                    "open files: soft limit {} (hard limit {})",
                    after.soft,
                    after.hard
                );
            }
            if after.soft <= reserve as u64 {
                anyhow::bail!(
                    "the open files limit ({}) is not above --descriptor-reserve ({reserve}): every connection would be refused",
                    after.soft
                );
            }
        }
        Err(e) => tracing::warn!("cannot raise the open files limit: {e}"),
    }
    Ok(())
}

/// Bind every listener; print the metrics URL on stderr and the bound URL as the first line
/// of stdout (scripts and tests read both, so they bypass the log filter). With `--relay`,
/// the URL clients use through the relay (`relay+ws://RELAY:PORT/ID`) follows (or, without
/// `--listen`, is the first line).
async fn bind(
    listen: Option<ListenAddr>,
    noise: Option<Arc<NoiseServerConfig>>,
    relay: Option<(RelayDial, Arc<NoiseServerConfig>)>,
    (metrics, health): (Option<SocketAddr>, Option<SocketAddr>),
) -> anyhow::Result<Vec<Listener>> {
    let mut listeners = Vec::new();
    if let Some(addr) = metrics {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| anyhow::anyhow!("cannot bind --metrics-listen {addr}: {e}"))?;
        let local = listener.local_addr()?;
        execrelay_io::service::note(format_args!(
            "execrelay metrics: http://{local}{METRICS_PATH}"
        ));
        listeners.push(Listener::Metrics(listener));
    }
    if let Some(addr) = health {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| anyhow::anyhow!("cannot bind --health-listen {addr}: {e}"))?;
        let local = listener.local_addr()?;
        execrelay_io::service::note(format_args!(
            "execrelay health: http://{local}{READYZ_PATH}"
        ));
        listeners.push(Listener::Health(listener));
    }
    let mut urls = Vec::new();
    match (listen, noise) {
        (None, _) => {}
        (Some(ListenAddr::Stdio), _) => listeners.push(Listener::Stdio),
        (Some(ListenAddr::Ws(addr)), _) => {
            let tcp = bind_tcp(addr).await?;
            urls.push(bound_url(tcp.local_addr()?));
            listeners.push(Listener::Ws(tcp));
        }
        (Some(ListenAddr::Noise(addr)), Some(noise)) => {
            let tcp = bind_tcp(addr).await?;
            urls.push(bound_noise_url(tcp.local_addr()?));
            listeners.push(Listener::Noise(tcp, noise));
        }
        (Some(ListenAddr::Noise(_)), None) => anyhow::bail!("noise+ws needs --key"),
    }
    if let Some((dial, noise)) = relay {
        urls.push(relay_client_url(&dial.relay_url, &dial.env_id));
        listeners.push(Listener::Relay(dial, noise));
    }
    let mut out = std::io::stdout();
    for url in &urls {
        let _ = writeln!(out, "{url}");
        tracing::info!(%url, "listening");
    }
    let _ = out.flush();
    Ok(listeners)
}

/// The URL clients use to reach this server through the relay: `ws://R` → `relay+ws://R/ID`.
fn relay_client_url(relay: &str, env_id: &str) -> String {
    format!("relay+{}/{env_id}", relay.trim_end_matches('/'))
}

async fn bind_tcp(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot bind {addr}: {e}"))
}

/// After the server has finished (exit notices written), how long remaining runtime threads
/// get before the process exits anyway.
const RUNTIME_SHUTDOWN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// Parse `--metrics-listen` or `--health-listen HOST:PORT` (`localhost:PORT` means
/// 127.0.0.1:PORT); `origin` names the flag (or `--config` key) in the error.
fn parse_probe_listen(s: &str, origin: &str) -> anyhow::Result<SocketAddr> {
    let s = match s.strip_prefix("localhost:") {
        Some(port) => format!("127.0.0.1:{port}"),
        None => s.to_string(),
    };
    s.parse()
        .map_err(|_| anyhow::anyhow!("bad {origin} {s:?}: expected HOST:PORT, e.g. 127.0.0.1:9464"))
}
