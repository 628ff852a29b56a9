//! Server configuration: every limit of the specification as a named constant with its
//! default (`limits.rs`), gathered in one [`ServerConfig`] that `execrelay serve` fills from
//! flags and an optional TOML file.
//!
//! Relationships between settings are validated once, in [`ServerConfig::validate`].

use std::time::Duration;

use execrelay_io::http::FrontLimits;
use serde::Deserialize;

mod containment;
mod limits;

pub use containment::{check_cgroup_name, BackendChoice};
pub use limits::*;

/// The Noise suites (`secure-transport.md` §3) and the `noise_suites` setting's set of them,
/// declared with the record layer in the protocol crate.
pub use execrelay_protocol::noise::suite::{NoiseSuite, NoiseSuites};

/// How a setting reads (`--help`, the README table): shared with the relay's settings.
pub use execrelay_io::setting::{Setting, Unit};

/// One setting of [`ServerConfig`] whose value is a word, not a number (a backend, a name).
pub use execrelay_io::setting::TextSetting;

// Every setting, declared once by the settings macro both servers share (its docs say what
// it generates).
execrelay_io::settings! {
    /// Limits and timings of one exec server. Every field has a flag of `execrelay serve`
    /// (the same name in kebab-case) and a key (the same name) in the `--config` TOML file;
    /// flags win over the file. Each field's default is the named constant in its doc.
    #[derive(Debug, Clone, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct ServerConfig;
    /// The flags of `execrelay serve` that set [`ServerConfig`] fields: one per field, each
    /// `None` unless given (a given flag wins over the TOML file). Help lines come from
    /// [`SETTINGS`], with the real default.
    #[derive(Debug, Clone, Default, clap::Args)]
    #[allow(missing_docs)] // Each field is documented on `ServerConfig`.
    pub struct ConfigFlags;
    /// See [`MAX_MESSAGE_BYTES`].
    max_message_bytes: usize = MAX_MESSAGE_BYTES, Bytes,
        "one JSON-RPC message; a larger one is a framing error (`-32600`, then close), detected before more than the limit is buffered";
    /// See [`MAX_PROCESSES`].
    max_processes: usize = MAX_PROCESSES, Count,
        "processes per session (exited ones count until released) → `-32004`";
    /// See [`MAX_SESSIONS`].
    max_sessions: usize = MAX_SESSIONS, Count,
        "sessions per server, attached or detached → `-32004`";
    /// See [`RETAINED_OUTPUT_BYTES`].
    retained_output_bytes: usize = RETAINED_OUTPUT_BYTES, Bytes,
        "event log per process; beyond it written (or acked) events are released, oldest first";
    /// See [`OUTPUT_BUDGET_BYTES`].
    output_budget_bytes: usize = OUTPUT_BUDGET_BYTES, Bytes,
        "unwritten output of all processes together, shared fairly by those ahead of their clients; each may always hold one 64 KiB chunk beyond it (a pump then waits, its child blocks)";
    /// See [`DETACHED_SESSION_TTL_MS`].
    detached_session_ttl_ms: u64 = DETACHED_SESSION_TTL_MS, Millis,
        "how long a detached session survives";
    /// See [`MAX_SESSION_TTL_MS`].
    max_session_ttl_ms: u64 = MAX_SESSION_TTL_MS, Millis,
        "longest `sessionTtlMs` a client may ask for in `initialize` (also `--max-session-ttl DURATION`) → `-32602`";
    /// See [`MAX_OUTPUT_TAIL_BYTES`].
    max_output_tail_bytes: usize = MAX_OUTPUT_TAIL_BYTES, Bytes,
        "largest tail `outputCapKeep: \"headAndTail\"` keeps per stream (half the cap), held in memory until the stream ends → `-32602`";
    /// See [`MAX_READ_WAIT_MS`].
    max_read_wait_ms: u64 = MAX_READ_WAIT_MS, Millis,
        "longest `process/read` long poll";
    /// See [`EXITED_RETENTION_MS`].
    exited_retention_ms: u64 = EXITED_RETENTION_MS, Millis,
        "how long an exited process stays known after its exit notice was written (without acks)";
    /// See [`STALL_WATCHDOG_MS`].
    stall_watchdog_ms: u64 = STALL_WATCHDOG_MS, Millis,
        "output standing still this long while nothing outside the server holds it back is reported as a stall (a log line with the stream's flow-control state, `execrelay_stalled_streams`); 0 turns the watchdog off";
    /// See [`MAX_PENDING_REQUESTS`].
    max_pending_requests: usize = MAX_PENDING_REQUESTS, Count,
        "requests in flight per connection → `-32004`";
    /// See [`MAX_KILL_GRACE_MS`].
    max_kill_grace_ms: u64 = MAX_KILL_GRACE_MS, Millis,
        "largest `killGraceMs` a client may ask for (bounds expiry and shutdown)";
    /// See [`MAX_DRAIN_TIMEOUT_MS`].
    max_drain_timeout_ms: u64 = MAX_DRAIN_TIMEOUT_MS, Millis,
        "largest `drainTimeoutMs` a client may ask for (bounds expiry and shutdown)";
    /// See [`MAX_TIMEOUT_MS`].
    max_timeout_ms: u64 = MAX_TIMEOUT_MS, Millis,
        "largest `timeoutMs` a client may ask for";
    /// See [`MAX_CONNECTIONS`].
    max_connections: usize = MAX_CONNECTIONS, Count,
        "established JSON-RPC connections over `ws://`; one more is refused with `503` before the upgrade";
    /// See [`MAX_LINKS`].
    max_links: usize = MAX_LINKS, Count,
        "Noise links over `noise+ws://`; one more is refused with `503` before the upgrade";
    /// See [`REQUEST_HEAD_TIMEOUT_MS`].
    request_head_timeout_ms: u64 = REQUEST_HEAD_TIMEOUT_MS, Millis,
        "total time a new connection has to send its whole HTTP request head and finish its upgrade, however slowly it trickles";
    /// See [`MAX_PENDING_HANDSHAKES`].
    max_pending_handshakes: usize = MAX_PENDING_HANDSHAKES, Count,
        "connections per listener not yet upgraded or answered; more are closed at once";
    /// See [`MAX_PENDING_HANDSHAKES_PER_ADDRESS`].
    max_pending_handshakes_per_address: usize = MAX_PENDING_HANDSHAKES_PER_ADDRESS, Count,
        "the same, from one peer address (IPv4 address or IPv6 /64); more are closed at once";
    /// See [`MAX_PENDING_AUTHORIZATIONS`].
    max_pending_authorizations: usize = MAX_PENDING_AUTHORIZATIONS, Count,
        "Noise handshakes waiting for authorization per link; more are reset (`busy`)";
    /// See [`MAX_STREAMS_PER_LINK`].
    max_streams_per_link: usize = MAX_STREAMS_PER_LINK, Count,
        "Noise streams per link (pending ones count); more are reset (`too_many_streams`)";
    /// See [`MAX_STREAMS_PER_KEY`].
    max_streams_per_key: usize = MAX_STREAMS_PER_KEY, Count,
        "Noise streams one client key holds at once over all links (pending ones count); more are reset (`too_many_streams`)";
    /// See [`NOISE_WINDOW_RECORDS`].
    noise_window_records: u32 = NOISE_WINDOW_RECORDS, Count,
        "receive window of each Noise stream, 1 to 64 records of at most 64 KiB: what a client may send (stdin, uploads) past what the server consumed, held per stream; a client far away uploads at most one window per round trip";
    /// See [`HANDSHAKE_FAILURE_BURST`].
    handshake_failure_burst: u32 = HANDSHAKE_FAILURE_BURST, Count,
        "Noise handshake failures tolerated back to back per direct link; the one that takes the last token closes it";
    /// See [`HANDSHAKE_FAILURE_REFILL_MS`].
    handshake_failure_refill_ms: u64 = HANDSHAKE_FAILURE_REFILL_MS, Millis,
        "one Noise handshake failure of a direct link forgiven per this interval";
    /// See [`RELAY_LINK_HANDSHAKE_FAILURE_BURST`].
    relay_link_handshake_failure_burst: u32 = RELAY_LINK_HANDSHAKE_FAILURE_BURST, Count,
        "last-resort budget of handshake failures of the environment link (the relay charges each to the client that caused it); once empty, every new stream is refused (`busy`) for 10 s";
    /// See [`RELAY_LINK_HANDSHAKE_FAILURE_REFILL_MS`].
    relay_link_handshake_failure_refill_ms: u64 = RELAY_LINK_HANDSHAKE_FAILURE_REFILL_MS, Millis,
        "one failure of the environment link's last-resort budget forgiven per this interval";
    /// See [`HANDSHAKE_CLOCK_WINDOW_MS`].
    handshake_clock_window_ms: u64 = HANDSHAKE_CLOCK_WINDOW_MS, Millis,
        "how far a Noise message 1's `ts` may be from the server's clock, either way (`clock_skew` beyond); accepted stamps are remembered this long, and nothing stamped before the server started is accepted";
    /// See [`MAX_HANDSHAKES_PER_KEY_WINDOW`].
    max_handshakes_per_key_window: usize = MAX_HANDSHAKES_PER_KEY_WINDOW, Count,
        "Noise handshakes of one client key remembered within the clock window; more are reset (`busy`) until older ones age out";
    /// See [`KEEPALIVE_INTERVAL_MS`].
    keepalive_interval_ms: u64 = KEEPALIVE_INTERVAL_MS, Millis,
        "WebSocket ping interval on every link and WebSocket (`noise+ws://`, the relay link, `ws://`)";
    /// See [`PONG_TIMEOUT_MS`].
    pong_timeout_ms: u64 = PONG_TIMEOUT_MS, Millis,
        "a link whose ping is unanswered this long is closed (data does not count), and so is one whose write takes this long";
    /// See [`RELAY_BACKOFF_INITIAL_MS`].
    relay_backoff_initial_ms: u64 = RELAY_BACKOFF_INITIAL_MS, Millis,
        "first delay before dialling the relay again (`serve --relay`); doubles after each failure";
    /// See [`RELAY_BACKOFF_MAX_MS`].
    relay_backoff_max_ms: u64 = RELAY_BACKOFF_MAX_MS, Millis,
        "longest delay between two dials of the relay";
    /// See [`RELAY_BACKOFF_RESET_MS`].
    relay_backoff_reset_ms: u64 = RELAY_BACKOFF_RESET_MS, Millis,
        "a relay link that lived this long sets the delay back to the first";
    /// See [`RELAY_REFUSED_BACKOFF_MAX_MS`].
    relay_refused_backoff_max_ms: u64 = RELAY_REFUSED_BACKOFF_MAX_MS, Millis,
        "longest delay between two dials after the relay refused the link (unauthorized, wrong relay key, clocks apart)";
    /// See [`MAX_PENDING_REQUEST_BYTES`].
    max_pending_request_bytes: usize = MAX_PENDING_REQUEST_BYTES, Bytes,
        "bytes of requests read and not yet answered per connection → `-32004`";
    /// See [`MAX_INBOUND_BYTES`].
    max_inbound_bytes: usize = MAX_INBOUND_BYTES, Bytes,
        "bytes of requests not yet answered and of Noise messages not yet taken by their connection, server-wide → `-32004` (a Noise stream: reset `busy`)";
    /// See [`MAX_LINK_REASSEMBLY_BYTES`].
    max_link_reassembly_bytes: usize = MAX_LINK_REASSEMBLY_BYTES, Bytes,
        "bytes of Noise messages one link holds for its streams (unfinished, or not yet taken by their connection); a stream that would pass it is reset (`busy`)";
    /// See [`MAX_SESSIONS_PER_KEY`].
    max_sessions_per_key: usize = MAX_SESSIONS_PER_KEY, Count,
        "sessions per Noise client key → `-32004`";
    /// See [`MAX_SESSIONS_PER_ADDRESS`].
    max_sessions_per_address: usize = MAX_SESSIONS_PER_ADDRESS, Count,
        "sessions per peer address (IPv4 address or IPv6 /64) → `-32004`";
    /// See [`MAX_PROCESSES_PER_KEY`].
    max_processes_per_key: usize = MAX_PROCESSES_PER_KEY, Count,
        "processes of all the sessions of one Noise client key → `-32004`";
    /// See [`MAX_PROCESSES_PER_ADDRESS`].
    max_processes_per_address: usize = MAX_PROCESSES_PER_ADDRESS, Count,
        "processes of all the sessions of one peer address → `-32004`";
    /// See [`DESCRIPTOR_RESERVE`].
    descriptor_reserve: usize = DESCRIPTOR_RESERVE, Count,
        "file descriptors kept free for spawns; below it new connections and links are refused";
    /// See [`IDLE_CONNECTION_TIMEOUT_MS`].
    idle_connection_timeout_ms: u64 = IDLE_CONNECTION_TIMEOUT_MS, Millis,
        "a `ws://` connection or Noise stream with no inbound message, request, running process or unwritten output this long is closed";
    /// See [`IDLE_LINK_TIMEOUT_MS`].
    idle_link_timeout_ms: u64 = IDLE_LINK_TIMEOUT_MS, Millis,
        "a direct `noise+ws://` link without any stream this long is closed (never the environment link to a relay)";
    /// See [`APPROVAL_TIMEOUT_MS`].
    approval_timeout_ms: u64 = APPROVAL_TIMEOUT_MS, Millis,
        "an unanswered `process/approve` is withdrawn after this long and its start fails (`-32006`)";
    /// See [`DEFAULT_SESSION_PIDS_MAX`].
    session_pids_max: u64 = DEFAULT_SESSION_PIDS_MAX, Count,
        "processes and threads of one session at once (its cgroup's `pids.max`; a fork fails beyond it); 0: no limit. Needs the `pids` controller, or start fails";
@text:
    /// See [`BackendChoice`].
    containment_backend: BackendChoice = BackendChoice::Auto, shown "auto",
        values "auto|cgroup2|cgroup1|none",
        "how a session's processes are found and killed (SECURITY.md, \"Process containment\"): `auto` takes the first of `cgroup2`, `cgroup1`, `none` that works; a named cgroup backend that cannot work here fails the start";
    /// See [`DEFAULT_CGROUP_NAME`].
    cgroup_name: String = String::from(DEFAULT_CGROUP_NAME), shown DEFAULT_CGROUP_NAME,
        values "NAME",
        "base name of the server's instance cgroup (`NAME-<pid>-<start time>-<n>`, one child per session); servers sharing a parent cgroup and a name remove each other's leftovers after a crash";
    /// See [`NoiseSuites`].
    noise_suites: NoiseSuites = NoiseSuites::ALL, shown "chachapoly,aesgcm",
        values "chachapoly,aesgcm",
        "the Noise suites a `noise+ws://` stream may use (`chachapoly` = suite 0, `aesgcm` = suite 1, comma-separated); an `OPEN` with another is reset `unsupported_suite` and a client retries with suite 0";
}

/// A configuration that cannot work.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration: {0}")]
pub struct ConfigError(pub String);

impl ServerConfig {
    /// Check relationships between settings once, at start.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let min_message = 4096;
        if self.max_message_bytes < min_message {
            return Err(ConfigError(format!(
                "max_message_bytes must be at least {min_message}"
            )));
        }
        // One base64-encoded chunk in a notification must fit in a message.
        if self.max_message_bytes < MAX_CHUNK_BYTES * 4 / 3 + 1024 {
            return Err(ConfigError(
                "max_message_bytes must hold one base64 output chunk (about 88 KiB)".into(),
            ));
        }
        for (name, v) in [
            ("max_processes", self.max_processes),
            ("max_sessions", self.max_sessions),
            ("retained_output_bytes", self.retained_output_bytes),
            ("output_budget_bytes", self.output_budget_bytes),
            ("max_pending_requests", self.max_pending_requests),
            ("max_connections", self.max_connections),
            ("max_links", self.max_links),
            ("max_pending_handshakes", self.max_pending_handshakes),
            (
                "max_pending_handshakes_per_address",
                self.max_pending_handshakes_per_address,
            ),
            (
                "max_pending_authorizations",
                self.max_pending_authorizations,
            ),
            ("max_streams_per_link", self.max_streams_per_link),
            ("max_streams_per_key", self.max_streams_per_key),
            (
                "max_handshakes_per_key_window",
                self.max_handshakes_per_key_window,
            ),
            ("max_sessions_per_key", self.max_sessions_per_key),
            ("max_sessions_per_address", self.max_sessions_per_address),
            ("max_processes_per_key", self.max_processes_per_key),
            ("max_processes_per_address", self.max_processes_per_address),
        ] {
            if v == 0 {
                return Err(ConfigError(format!("{name} must be greater than 0")));
            }
        }
        // Zero would make a timer fire at once (or, for the refill, never forgive).
        for (name, v) in [
            ("request_head_timeout_ms", self.request_head_timeout_ms),
            (
                "handshake_failure_refill_ms",
                self.handshake_failure_refill_ms,
            ),
            (
                "relay_link_handshake_failure_refill_ms",
                self.relay_link_handshake_failure_refill_ms,
            ),
            ("handshake_clock_window_ms", self.handshake_clock_window_ms),
            ("keepalive_interval_ms", self.keepalive_interval_ms),
            ("pong_timeout_ms", self.pong_timeout_ms),
            ("relay_backoff_initial_ms", self.relay_backoff_initial_ms),
            ("relay_backoff_max_ms", self.relay_backoff_max_ms),
            (
                "relay_refused_backoff_max_ms",
                self.relay_refused_backoff_max_ms,
            ),
            (
                "idle_connection_timeout_ms",
                self.idle_connection_timeout_ms,
            ),
            ("idle_link_timeout_ms", self.idle_link_timeout_ms),
            ("approval_timeout_ms", self.approval_timeout_ms),
        ] {
            if v == 0 {
                return Err(ConfigError(format!("{name} must be greater than 0")));
            }
        }
        // A message of the largest size must fit in every budget that holds one whole.
        for (name, v) in [
            ("max_pending_request_bytes", self.max_pending_request_bytes),
            ("max_link_reassembly_bytes", self.max_link_reassembly_bytes),
            ("max_inbound_bytes", self.max_inbound_bytes),
        ] {
            if v < self.max_message_bytes {
                return Err(ConfigError(format!(
                    "{name} must be at least max_message_bytes ({})",
                    self.max_message_bytes
                )));
            }
        }
        if !(1..=MAX_NOISE_WINDOW_RECORDS).contains(&self.noise_window_records) {
            return Err(ConfigError(format!(
                "noise_window_records must be 1 to {MAX_NOISE_WINDOW_RECORDS} (records of at most 64 KiB, held per stream; a relay passes on at most its max_window_records, 64 by default)"
            )));
        }
        if self.detached_session_ttl_ms > self.max_session_ttl_ms {
            return Err(ConfigError(format!(
                "detached_session_ttl_ms ({}) must be at most max_session_ttl_ms ({})",
                self.detached_session_ttl_ms, self.max_session_ttl_ms
            )));
        }
        check_cgroup_name(&self.cgroup_name).map_err(ConfigError)?;
        if self.noise_suites.is_empty() {
            return Err(ConfigError(
                "noise_suites must list at least one suite (chachapoly, aesgcm)".into(),
            ));
        }
        Ok(())
    }

    /// [`Self::max_kill_grace_ms`] as a duration: the longest SIGTERM-to-SIGKILL grace on any
    /// path, and the most expiry, close and shutdown wait for a process that ignores SIGTERM.
    pub fn max_kill_grace(&self) -> Duration {
        Duration::from_millis(self.max_kill_grace_ms)
    }

    /// [`Self::max_drain_timeout_ms`] as a duration.
    pub fn max_drain_timeout(&self) -> Duration {
        Duration::from_millis(self.max_drain_timeout_ms)
    }

    /// [`Self::session_pids_max`] as a limit: `None` for 0 (no limit).
    pub fn session_pids_limit(&self) -> Option<u64> {
        (self.session_pids_max > 0).then_some(self.session_pids_max)
    }

    /// [`Self::request_head_timeout_ms`] as a duration.
    pub fn request_head_timeout(&self) -> Duration {
        Duration::from_millis(self.request_head_timeout_ms)
    }

    /// The HTTP front limits of a WebSocket listener (`ws://`, `noise+ws://`).
    pub fn websocket_front_limits(&self) -> FrontLimits {
        FrontLimits::websocket(
            self.request_head_timeout(),
            self.max_pending_handshakes,
            self.max_pending_handshakes_per_address,
        )
    }

    /// The HTTP front limits of the metrics listener.
    pub fn metrics_front_limits(&self) -> FrontLimits {
        FrontLimits::metrics(self.request_head_timeout())
    }

    /// [`Self::idle_connection_timeout_ms`] as a duration.
    pub fn idle_connection_timeout(&self) -> Duration {
        Duration::from_millis(self.idle_connection_timeout_ms)
    }

    /// [`Self::idle_link_timeout_ms`] as a duration.
    pub fn idle_link_timeout(&self) -> Duration {
        Duration::from_millis(self.idle_link_timeout_ms)
    }

    /// [`Self::approval_timeout_ms`] as a duration.
    pub fn approval_timeout(&self) -> Duration {
        Duration::from_millis(self.approval_timeout_ms)
    }

    /// `detachedSessionTtlMs` as a duration.
    pub fn detached_ttl(&self) -> Duration {
        Duration::from_millis(self.detached_session_ttl_ms)
    }

    /// Parse a TOML configuration file's contents.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let table: toml::Table = toml::from_str(text).map_err(|e| ConfigError(e.to_string()))?;
        Self::from_toml_table(table)
    }

    /// The settings of a TOML table already parsed (the caller took out its own keys). A
    /// number may be written with its unit, as a flag's (`output_budget_bytes = "256MiB"`).
    pub fn from_toml_table(mut table: toml::Table) -> Result<Self, ConfigError> {
        execrelay_io::setting::read_units(&mut table, SETTINGS).map_err(ConfigError)?;
        let cfg: ServerConfig = table.try_into().map_err(|e| ConfigError(e.to_string()))?;
        cfg.validate()?;
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_match_the_spec() {
        let c = ServerConfig::default();
        c.validate().unwrap();
        assert_eq!(c.max_message_bytes, 16_777_216);
        assert_eq!(c.retained_output_bytes, 8_388_608);
        assert_eq!(c.detached_session_ttl_ms, 60_000);
    }

    #[test]
    fn toml_overrides_and_rejects_unknown_keys() {
        let c = ServerConfig::from_toml("max_processes = 3\n").unwrap();
        assert_eq!(c.max_processes, 3);
        assert!(ServerConfig::from_toml("max_procs = 3\n").is_err());
        assert!(ServerConfig::from_toml("max_sessions = 0\n").is_err());
        assert!(ServerConfig::from_toml("max_message_bytes = 100\n").is_err());
        assert!(ServerConfig::from_toml("max_connections = 0\n").is_err());
        assert!(ServerConfig::from_toml("pong_timeout_ms = 0\n").is_err());
        let c = ServerConfig::from_toml("max_pending_handshakes_per_address = 1\n").unwrap();
        assert_eq!(c.max_pending_handshakes_per_address, 1);
    }

    #[test]
    fn values_read_for_people() {
        assert_eq!(Unit::Bytes.display(16 * 1024 * 1024), "16 MiB");
        assert_eq!(Unit::Bytes.display(16 * 1024), "16 KiB");
        assert_eq!(Unit::Bytes.display(1000), "1 000 bytes");
        assert_eq!(Unit::Millis.display(86_400_000), "86 400 000 ms");
        assert_eq!(Unit::Millis.display(500), "500 ms");
        assert_eq!(Unit::Count.display(1024), "1 024");
        assert_eq!(Unit::Count.display(64), "64");
    }

    #[test]
    fn every_setting_is_listed_once_and_readable_by_name() {
        let c = ServerConfig::default();
        let mut names: Vec<&str> = SETTINGS.iter().map(|s| s.name).collect();
        for s in SETTINGS {
            assert_eq!(c.value_of(s.name), Some(s.default), "{}", s.name);
        }
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), SETTINGS.len());
        assert_eq!(c.value_of("no_such_setting"), None);
    }
}
