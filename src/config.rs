//! Server configuration: every limit of the specification as a named constant with its
//! default, gathered in one [`ServerConfig`] that `execrelay serve` fills from flags and an
//! optional TOML file.
//!
//! Relationships between settings are validated once, in [`ServerConfig::validate`].

use std::time::Duration;

use serde::Deserialize;

/// Largest JSON-RPC message accepted, in bytes (`protocol.md` §1). Large enough for a 1 MiB
/// `process/read` batch in base64 many times over; small enough that a hostile peer cannot
/// make one connection hold much memory.
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;
/// Output is cut into chunks of at most this many raw bytes (`protocol.md` §5). One pipe read
/// is at most this large, so a chunk is one read.
pub const MAX_CHUNK_BYTES: usize = 64 * 1024;
/// Processes per session. Bounds per-session memory together with `retainedOutputBytes`.
pub const MAX_PROCESSES: usize = 256;
/// Sessions per server, attached or detached.
pub const MAX_SESSIONS: usize = 64;
/// Retained output per process, in bytes (`processes.md` §4). When the log holds this much
/// that it may not release, the pump stops reading and the child blocks.
pub const RETAINED_OUTPUT_BYTES: usize = 8 * 1024 * 1024;
/// Unwritten bytes per process before the pump stops reading: the delivery queue between a
/// child and a slow client. Smaller than the retention so that a slow client holds the
/// child back early while recent output stays readable.
pub const DELIVERY_QUEUE_BYTES: usize = 1024 * 1024;
/// How long a detached session survives (`processes.md` §5).
pub const DETACHED_SESSION_TTL_MS: u64 = 60_000;
/// Longest `process/read` long poll (`protocol.md` §4).
pub const MAX_READ_WAIT_MS: u64 = 60_000;
/// How long an exited process stays known after its exit notice was written, without acks.
pub const EXITED_RETENTION_MS: u64 = 300_000;
/// Requests in flight per connection; one more is answered `-32004`. Bounds the tasks and the
/// control lane of one connection.
pub const MAX_PENDING_REQUESTS: usize = 1024;
/// `writeId`s remembered per process for deduplication (`protocol.md` §4).
pub const RETAINED_WRITE_IDS: usize = 4096;
/// Default `drainTimeoutMs`.
pub const DEFAULT_DRAIN_TIMEOUT_MS: u64 = 2000;
/// Default `killGraceMs`.
pub const DEFAULT_KILL_GRACE_MS: u64 = 2000;
/// Longest `processId`, in bytes.
pub const MAX_PROCESS_ID_BYTES: usize = 256;
/// Output bytes the connection writer takes from one process before it looks at the control
/// lane and the other processes again: keeps control replies and other processes from
/// waiting behind one chatty child.
pub const EVENT_BATCH_BYTES: usize = 256 * 1024;
/// Default `maxBytes` of `process/read`.
pub const DEFAULT_READ_MAX_BYTES: u64 = 1024 * 1024;
/// How long shutdown waits for exit notices to reach attached clients after terminating.
pub const SHUTDOWN_DELIVERY_GRACE_MS: u64 = 5_000;

/// Limits and timings of one exec server. Every field has a flag of `execrelay serve` and
/// a key (the same name in snake_case) in the `--config` TOML file.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// See [`MAX_MESSAGE_BYTES`].
    pub max_message_bytes: usize,
    /// See [`MAX_PROCESSES`].
    pub max_processes: usize,
    /// See [`MAX_SESSIONS`].
    pub max_sessions: usize,
    /// See [`RETAINED_OUTPUT_BYTES`].
    pub retained_output_bytes: usize,
    /// See [`DELIVERY_QUEUE_BYTES`].
    pub delivery_queue_bytes: usize,
    /// See [`DETACHED_SESSION_TTL_MS`].
    pub detached_session_ttl_ms: u64,
    /// See [`MAX_READ_WAIT_MS`].
    pub max_read_wait_ms: u64,
    /// See [`EXITED_RETENTION_MS`].
    pub exited_retention_ms: u64,
    /// See [`MAX_PENDING_REQUESTS`].
    pub max_pending_requests: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_message_bytes: MAX_MESSAGE_BYTES,
            max_processes: MAX_PROCESSES,
            max_sessions: MAX_SESSIONS,
            retained_output_bytes: RETAINED_OUTPUT_BYTES,
            delivery_queue_bytes: DELIVERY_QUEUE_BYTES,
            detached_session_ttl_ms: DETACHED_SESSION_TTL_MS,
            max_read_wait_ms: MAX_READ_WAIT_MS,
            exited_retention_ms: EXITED_RETENTION_MS,
            max_pending_requests: MAX_PENDING_REQUESTS,
        }
    }
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
            ("delivery_queue_bytes", self.delivery_queue_bytes),
            ("max_pending_requests", self.max_pending_requests),
        ] {
            if v == 0 {
                return Err(ConfigError(format!("{name} must be greater than 0")));
            }
        }
        Ok(())
    }

    /// `detachedSessionTtlMs` as a duration.
    pub fn detached_ttl(&self) -> Duration {
        Duration::from_millis(self.detached_session_ttl_ms)
    }

    /// Parse a TOML configuration file's contents.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let cfg: ServerConfig = toml::from_str(text).map_err(|e| ConfigError(e.to_string()))?;
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
    }
}
