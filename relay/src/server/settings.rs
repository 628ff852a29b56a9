//! Every setting of the relay server: the limits of `secure-transport.md` §6.4 (the engine's
//! [`RelayConfig`] constants, one source of truth) and the server's own (HTTP front, link
//! handshake, environments file), each declared once by [`settings!`](execrelay_io::settings): a field of
//! [`RelaySettings`] (and so a key of the `--config` TOML file), its default (the named
//! constant), its `execrelay-relay` flag in [`RelayFlags`], and its row in [`SETTINGS`].
//!
//! It never reads a file or the environment itself: the binary hands it the TOML text and the
//! parsed flags.

use std::time::Duration;

use serde::Deserialize;

use super::runtime_threads::RuntimeThreads;
use crate::cluster::trusted_front::TrustedFronts;
use execrelay_io::http::FrontLimits;
use execrelay_protocol::config::{
    BucketConfig, ConfigError as EngineConfigError, KeepaliveConfig, RelayConfig,
    ADDRESS_HANDSHAKE_FAILURE_BURST, ADDRESS_HANDSHAKE_FAILURE_REFILL, CLIENT_LINK_SHARE_BYTES,
    CLOSED_STREAMS_REMEMBERED, CONTROL_RESERVE_BYTES, ENVIRONMENT_PROBE_TIMEOUT,
    HANDSHAKE_FAILURE_BURST, HANDSHAKE_FAILURE_REFILL, IDLE_LINK_TIMEOUT, KEEPALIVE_INTERVAL,
    MALFORMED_FRAME_BURST, MALFORMED_FRAME_REFILL, MAX_CLIENT_LINKS_PER_ADDRESS, MAX_ENVIRONMENTS,
    MAX_QUEUED_BYTES, MAX_RELAY_WINDOW_RECORDS, MAX_STREAMS_PER_ADDRESS_PER_ENVIRONMENT,
    MAX_STREAMS_PER_CLIENT_LINK, MAX_STREAMS_PER_ENVIRONMENT, MESSAGE_TIMEOUT, OPENS_PER_SECOND,
    PONG_TIMEOUT, UNKNOWN_STREAM_BURST, UNKNOWN_STREAM_REFILL,
};
use execrelay_protocol::env_handshake::MAX_LINK_MSG1_BYTES;
use execrelay_protocol::frame::{HEADER_BYTES, MAX_FRAME_BYTES};
use execrelay_protocol::replay::{HANDSHAKE_CLOCK_WINDOW, MAX_HANDSHAKES_PER_KEY_WINDOW};

/// Client links a relay holds at once, over all addresses (beside
/// [`MAX_CLIENT_LINKS_PER_ADDRESS`] per address). One more is refused with `503` before the
/// upgrade. An idle client link costs a few KiB (its tasks and WebSocket buffers), a busy one
/// up to its write buffer (about 260 KiB) plus one window per stream; 4096 links bound the
/// first and leave the second to [`MAX_QUEUED_BYTES`].
pub const MAX_CLIENT_LINKS: usize = 4096;
/// Environment links upgraded and not yet through their handshake (§6.2). Each waits at most
/// [`LINK_HANDSHAKE_TIMEOUT_MS`] for its message 1; more are closed at once, so a flood of
/// upgrades to `/v1/env/ID` cannot hold sockets or make the relay do Diffie-Hellman
/// operations without bound.
pub const MAX_PENDING_LINK_HANDSHAKES: usize = 64;
/// Environment links in their handshake from one peer address (IPv4 address or IPv6 /64),
/// beside [`MAX_PENDING_LINK_HANDSHAKES`] in all. Without it one host opening upgrades to
/// `/v1/env/ID` that never send message 1 holds every slot, and every environment's
/// reconnection is refused `busy` for as long as it keeps doing so. A quarter of the slots:
/// a fleet behind one NAT that reconnects together after a relay restart is refused only in
/// part, and its environments retry after their backoff.
pub const MAX_PENDING_LINK_HANDSHAKES_PER_ADDRESS: usize = 16;
/// How long an upgraded environment link has to send its message 1 (an `OPEN` on stream id
/// 0). An exec server sends it at once; 10 s absorbs a slow network.
pub const LINK_HANDSHAKE_TIMEOUT_MS: u64 = 10_000;
/// How often the environments file is checked for a change (a `stat`; the file is read only
/// when its size, modification time or inode changed). Polling rather than inotify: it
/// follows editors that replace the file, symlink swaps (Kubernetes ConfigMaps) and network
/// file systems alike, with no extra dependency, and one `stat` a second costs nothing. The
/// file is also checked before every environment handshake, so a removed key never opens a
/// new link; this interval bounds how long a removed line's *live* link lasts.
pub const ENVIRONMENTS_POLL_MS: u64 = 1_000;
/// A new TCP connection must deliver its whole HTTP request head within this time (the
/// deadline is fixed at accept): the exec server's value.
pub const REQUEST_HEAD_TIMEOUT_MS: u64 = 10_000;
/// Connections accepted but not yet upgraded or answered. Each holds at most 16 KiB of head
/// for at most [`REQUEST_HEAD_TIMEOUT_MS`]: 1024 × 16 KiB = 16 MiB at most. Higher than the
/// exec server's 256: a relay serves a whole fleet, and reconnect storms after a relay restart
/// arrive together.
pub const MAX_PENDING_HANDSHAKES: usize = 1024;
/// The same, from one peer address (IPv4 address or IPv6 /64): one address cannot take more
/// than a sixteenth of the slots.
pub const MAX_PENDING_HANDSHAKES_PER_ADDRESS: usize = 64;

/// Descriptors that client links and connections before their upgrade never take: kept for
/// environment links (a fleet reconnecting after a relay restart must get back in however
/// many clients hold links) and, beside the fixed ones, the metrics listener. The relay sizes
/// `max_client_links` and `max_pending_handshakes` down at start if the open files limit
/// cannot hold them beside it (`execrelay_io::descriptors::RelayDescriptorPlan`).
pub const DESCRIPTOR_RESERVE: usize = 1024;

/// The smallest frame limit that still carries the link handshake (message 1 and its header).
pub const MIN_FRAME_BYTES: usize = HEADER_BYTES + MAX_LINK_MSG1_BYTES;

pub use execrelay_io::setting::{Setting, Unit};

const fn millis(d: Duration) -> u64 {
    d.as_millis() as u64
}

execrelay_io::settings! {
    /// Limits and timings of one relay. Every field has a flag of `execrelay-relay` (the
    /// same name in kebab-case) and a key (the same name) in the `--config` TOML file;
    /// flags win over the file. Each field's default is the named constant in its doc.
    #[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct RelaySettings;
    /// The flags of `execrelay-relay` that set [`RelaySettings`] fields, each `None`
    /// unless given (a given flag wins over the TOML file).
    #[derive(Debug, Clone, Default, clap::Args)]
    #[allow(missing_docs)] // Each field is documented on `RelaySettings`.
    pub struct RelayFlags;
    /// See [`MAX_ENVIRONMENTS`].
    max_environments: usize = MAX_ENVIRONMENTS, Count,
        "environments with a link at once; one more environment link is refused (`RESET busy` on stream id 0)";
    /// See [`MAX_STREAMS_PER_ENVIRONMENT`].
    max_streams_per_environment: usize = MAX_STREAMS_PER_ENVIRONMENT, Count,
        "streams routed to one environment; more `OPEN`s are reset `busy`";
    /// See [`MAX_STREAMS_PER_CLIENT_LINK`].
    max_streams_per_client_link: usize = MAX_STREAMS_PER_CLIENT_LINK, Count,
        "streams one client link holds; more `OPEN`s are reset `busy`";
    /// See [`MAX_CLIENT_LINKS_PER_ADDRESS`].
    max_client_links_per_address: usize = MAX_CLIENT_LINKS_PER_ADDRESS, Count,
        "client links from one address (IPv4 address or IPv6 /64); one more is closed after its upgrade (close code 1013)";
    /// See [`MAX_CLIENT_LINKS`].
    max_client_links: usize = MAX_CLIENT_LINKS, Count,
        "client links at once; one more is refused with `503` before the upgrade";
    /// See [`MAX_FRAME_BYTES`] (the protocol's maximum, 44 + 65 535 bytes).
    max_frame_bytes: usize = MAX_FRAME_BYTES, Bytes,
        "largest frame (one WebSocket message) on any link, refused from its header before it is buffered, closing that link; at most the protocol's maximum, and lower only if every endpoint sends smaller records";
    /// See [`MALFORMED_FRAME_BURST`].
    malformed_frame_burst: u32 = MALFORMED_FRAME_BURST, Count,
        "malformed frames tolerated back to back per link; one more closes that link";
    /// See [`MALFORMED_FRAME_REFILL`].
    malformed_frame_refill_ms: u64 = millis(MALFORMED_FRAME_REFILL), Millis,
        "one malformed frame forgiven per this interval";
    /// See [`UNKNOWN_STREAM_BURST`].
    unknown_stream_burst: u32 = UNKNOWN_STREAM_BURST, Count,
        "frames for unknown streams tolerated back to back per link; one more closes that link";
    /// See [`UNKNOWN_STREAM_REFILL`].
    unknown_stream_refill_ms: u64 = millis(UNKNOWN_STREAM_REFILL), Millis,
        "one unknown-stream frame forgiven per this interval";
    /// See [`OPENS_PER_SECOND`].
    opens_per_second: u32 = OPENS_PER_SECOND, Count,
        "`OPEN`s (handshakes) per second per client link, as a bucket of this burst; more are reset `busy`";
    /// See [`HANDSHAKE_FAILURE_BURST`]: per client link.
    handshake_failure_burst: u32 = HANDSHAKE_FAILURE_BURST, Count,
        "handshake failures per client link (an environment's `RESET` `handshake_failed`, `unauthorized`, `replayed_handshake` or `clock_skew` answering its `OPEN`); the one that takes the last token closes the link";
    /// See [`HANDSHAKE_FAILURE_REFILL`].
    handshake_failure_refill_ms: u64 = millis(HANDSHAKE_FAILURE_REFILL), Millis,
        "one handshake failure of a client link forgiven per this interval";
    /// See [`ADDRESS_HANDSHAKE_FAILURE_BURST`].
    address_handshake_failure_burst: u32 = ADDRESS_HANDSHAKE_FAILURE_BURST, Count,
        "handshake failures per client address (IPv4 address or IPv6 /64) over all its links, and the most `OPEN`s it has awaiting an answer (more are reset `busy` unforwarded); the one that takes the last token closes that link";
    /// See [`ADDRESS_HANDSHAKE_FAILURE_REFILL`].
    address_handshake_failure_refill_ms: u64 = millis(ADDRESS_HANDSHAKE_FAILURE_REFILL), Millis,
        "one handshake failure of an address forgiven per this interval";
    /// See [`MAX_STREAMS_PER_ADDRESS_PER_ENVIRONMENT`].
    max_streams_per_address_per_environment: usize = MAX_STREAMS_PER_ADDRESS_PER_ENVIRONMENT, Count,
        "streams one address (IPv4 address or IPv6 /64) holds to one environment; more `OPEN`s are reset `busy`";
    /// See [`MAX_QUEUED_BYTES`].
    max_queued_bytes: usize = MAX_QUEUED_BYTES, Bytes,
        "bytes queued on all links together (each frame at its memory cost: its bytes + 128); above it new streams are reset `busy`";
    /// See [`CLIENT_LINK_SHARE_BYTES`].
    client_link_share_bytes: usize = CLIENT_LINK_SHARE_BYTES, Bytes,
        "bytes queued for one client link besides its streams' `DATA` (refusals, `ACCEPT`s, `RESET`s, `ACK`s, each at its memory cost); one more closes the link: it is not reading";
    /// See [`CONTROL_RESERVE_BYTES`].
    control_reserve_bytes: usize = CONTROL_RESERVE_BYTES, Bytes,
        "control-frame share of an environment link's queue; a client's `OPEN` that would pass it is reset `busy`";
    /// See [`MAX_RELAY_WINDOW_RECORDS`].
    max_window_records: u32 = MAX_RELAY_WINDOW_RECORDS, Count,
        "largest receive window (records) honoured per stream, at least 8; windows are forwarded clipped to it (a receiver advertising more is sent no more than this), and records past it are reset `window_exceeded`";
    /// See [`CLOSED_STREAMS_REMEMBERED`].
    closed_streams_remembered: usize = CLOSED_STREAMS_REMEMBERED, Count,
        "recently closed stream ids remembered per link (their late frames are dropped free)";
    /// See [`KEEPALIVE_INTERVAL`].
    keepalive_interval_ms: u64 = millis(KEEPALIVE_INTERVAL), Millis,
        "WebSocket ping interval on every link (minus up to a tenth of jitter)";
    /// See [`PONG_TIMEOUT`]; also every write's deadline.
    pong_timeout_ms: u64 = millis(PONG_TIMEOUT), Millis,
        "a link whose ping is unanswered this long, or whose write takes this long, is closed";
    /// See [`IDLE_LINK_TIMEOUT`].
    idle_link_timeout_ms: u64 = millis(IDLE_LINK_TIMEOUT), Millis,
        "a client link that holds no stream this long is closed";
    /// See [`MESSAGE_TIMEOUT`].
    message_timeout_ms: u64 = millis(MESSAGE_TIMEOUT), Millis,
        "a client link whose WebSocket message takes longer than this to arrive (from its first byte) is closed";
    /// See [`ENVIRONMENT_PROBE_TIMEOUT`].
    environment_probe_timeout_ms: u64 = millis(ENVIRONMENT_PROBE_TIMEOUT), Millis,
        "when a second exec server claims a live environment id, how long the holder has to answer a ping: it keeps the id if it does (the newcomer is refused `environment_in_use`), is closed if not";
    /// See [`HANDSHAKE_CLOCK_WINDOW`].
    handshake_clock_window_ms: u64 = millis(HANDSHAKE_CLOCK_WINDOW), Millis,
        "how far an environment link's message-1 `ts` may be from the relay's clock, either way (`clock_skew` beyond); accepted stamps are remembered this long";
    /// See [`MAX_HANDSHAKES_PER_KEY_WINDOW`].
    max_handshakes_per_key_window: usize = MAX_HANDSHAKES_PER_KEY_WINDOW, Count,
        "environment link handshakes of one id remembered within the clock window; more are refused `busy` until older ones age out";
    /// See [`DESCRIPTOR_RESERVE`].
    descriptor_reserve: usize = DESCRIPTOR_RESERVE, Count,
        "file descriptors client links and connections before their upgrade never take (kept for environment links); `max_client_links` and `max_pending_handshakes` are lowered at start if the open files limit cannot hold them beside it";
    /// See [`MAX_PENDING_LINK_HANDSHAKES`].
    max_pending_link_handshakes: usize = MAX_PENDING_LINK_HANDSHAKES, Count,
        "environment links upgraded and not yet through their handshake; more are refused (`RESET busy`) at once";
    /// See [`MAX_PENDING_LINK_HANDSHAKES_PER_ADDRESS`].
    max_pending_link_handshakes_per_address: usize = MAX_PENDING_LINK_HANDSHAKES_PER_ADDRESS, Count,
        "the same, from one peer address (IPv4 address or IPv6 /64)";
    /// See [`LINK_HANDSHAKE_TIMEOUT_MS`].
    link_handshake_timeout_ms: u64 = LINK_HANDSHAKE_TIMEOUT_MS, Millis,
        "how long an environment link has to send its message 1 after the upgrade";
    /// See [`ENVIRONMENTS_POLL_MS`].
    environments_poll_ms: u64 = ENVIRONMENTS_POLL_MS, Millis,
        "how often the environments file is checked for a change (a removed line closes its link)";
    /// See [`crate::cluster::CLUSTER_LOOKUP_TIMEOUT_MS`].
    cluster_lookup_timeout_ms: u64 = crate::cluster::CLUSTER_LOOKUP_TIMEOUT_MS, Millis,
        "cluster: how long a relay waits for the directory (NATS) to say which relay holds an environment it does not hold; then the client link's streams are refused";
    /// See [`crate::cluster::MAX_CLUSTER_LOOKUPS`].
    max_cluster_lookups: usize = crate::cluster::MAX_CLUSTER_LOOKUPS, Count,
        "cluster: directory lookups in flight at once; a misrouted client link past it is refused (`RESET busy`)";
    /// See [`crate::cluster::CLUSTER_LOOKUPS_PER_SECOND`].
    cluster_lookups_per_second: u32 = crate::cluster::CLUSTER_LOOKUPS_PER_SECOND, Count,
        "cluster: directory lookups started per second (burst the same); a misrouted client link past it is refused (`RESET busy`)";
    /// See [`crate::cluster::MAX_RELAY_LINKS`].
    max_relay_links: usize = crate::cluster::MAX_RELAY_LINKS, Count,
        "cluster: relay-to-relay links held at once, each way (forwarding and holding); one more is refused";
    /// See [`crate::cluster::MOVES_PER_SECOND`].
    moves_per_second: u32 = crate::cluster::MOVES_PER_SECOND, Count,
        "cluster: environment links asked to move to their new home relay per second, at most";
    /// See [`crate::cluster::MOVE_MIN_LINK_AGE_MS`].
    move_min_link_age_ms: u64 = crate::cluster::MOVE_MIN_LINK_AGE_MS, Millis,
        "cluster: an environment link younger than this is never asked to move";
    /// See [`REQUEST_HEAD_TIMEOUT_MS`].
    request_head_timeout_ms: u64 = REQUEST_HEAD_TIMEOUT_MS, Millis,
        "total time a new connection has to send its whole HTTP request head";
    /// See [`MAX_PENDING_HANDSHAKES`].
    max_pending_handshakes: usize = MAX_PENDING_HANDSHAKES, Count,
        "connections not yet upgraded or answered; more are closed at once";
    /// See [`MAX_PENDING_HANDSHAKES_PER_ADDRESS`].
    max_pending_handshakes_per_address: usize = MAX_PENDING_HANDSHAKES_PER_ADDRESS, Count,
        "the same, from one peer address (IPv4 address or IPv6 /64)";
@text:
    /// See [`TrustedFronts`]: empty (nobody) by default.
    trusted_front: TrustedFronts = TrustedFronts::none(), shown "none",
        values "ADDR[,ADDR…]",
        "cluster: the front's (HAProxy's) addresses, IPs or CIDR blocks, comma-separated (at most 64): only a client link whose TCP peer is one of them has its `X-Execrelay-Front` header honoured (moving an environment home); from any other peer the header is ignored and counted (`front_header_ignored_total`). `none` trusts no one";
    /// See [`RuntimeThreads`]: one per available core by default.
    runtime_threads: RuntimeThreads = RuntimeThreads::Cores, shown "cores",
        values "cores|N",
        "single-threaded runtimes (one thread each) the `execrelay-relay` binary runs links on, each new connection going to the one running the fewest tasks; `cores` is one per CPU the process may use; at most 256";
}

/// A relay configuration that cannot work.
#[derive(Debug, thiserror::Error)]
#[error("invalid relay configuration: {0}")]
pub struct SettingsError(pub String);

impl From<EngineConfigError> for SettingsError {
    fn from(e: EngineConfigError) -> Self {
        SettingsError(e.to_string())
    }
}

impl RelaySettings {
    /// Parse a TOML configuration file's contents (unknown keys are errors), and validate.
    /// A number may be written with its unit, as a flag's (`max_queued_bytes = "256MiB"`).
    pub fn from_toml(text: &str) -> Result<Self, SettingsError> {
        let mut table: toml::Table =
            toml::from_str(text).map_err(|e| SettingsError(e.to_string()))?;
        execrelay_io::setting::read_units(&mut table, SETTINGS).map_err(SettingsError)?;
        let s: RelaySettings = toml::Value::Table(table)
            .try_into()
            .map_err(|e| SettingsError(e.to_string()))?;
        s.validate()?;
        Ok(s)
    }

    /// Check every value and the relationships between them, once, at start.
    pub fn validate(&self) -> Result<(), SettingsError> {
        for s in SETTINGS {
            if self.value_of(s.name) == Some(0) {
                return Err(SettingsError(format!("{} must be greater than 0", s.name)));
            }
        }
        let one_address = self
            .max_client_links_per_address
            .saturating_mul(self.client_link_share_bytes);
        if one_address > self.max_queued_bytes / 4 {
            return Err(SettingsError(format!(
                "max_client_links_per_address × client_link_share_bytes ({one_address}) must be at most a quarter of max_queued_bytes ({}): otherwise one address that does not read could fill the queue to where other environments refuse new streams",
                self.max_queued_bytes
            )));
        }
        if !(MIN_FRAME_BYTES..=MAX_FRAME_BYTES).contains(&self.max_frame_bytes) {
            return Err(SettingsError(format!(
                "max_frame_bytes must be between {MIN_FRAME_BYTES} (a link handshake) and {MAX_FRAME_BYTES} (the protocol's maximum)"
            )));
        }
        self.engine().validate()?;
        Ok(())
    }

    /// The link engine's configuration (§6.4 limits, budgets, keepalive).
    pub fn engine(&self) -> RelayConfig {
        let interval = Duration::from_millis(self.keepalive_interval_ms);
        let pong = Duration::from_millis(self.pong_timeout_ms);
        RelayConfig {
            handshake_failures: BucketConfig {
                burst: self.handshake_failure_burst,
                refill: Duration::from_millis(self.handshake_failure_refill_ms),
            },
            address_handshake_failures: BucketConfig {
                burst: self.address_handshake_failure_burst,
                refill: Duration::from_millis(self.address_handshake_failure_refill_ms),
            },
            client_link_share_bytes: self.client_link_share_bytes,
            idle_link_timeout: Duration::from_millis(self.idle_link_timeout_ms),
            message_timeout: Duration::from_millis(self.message_timeout_ms),
            max_streams_per_address_per_environment: self.max_streams_per_address_per_environment,
            environment_probe_timeout: Duration::from_millis(self.environment_probe_timeout_ms),
            max_environments: self.max_environments,
            max_streams_per_environment: self.max_streams_per_environment,
            max_streams_per_client_link: self.max_streams_per_client_link,
            max_client_links_per_address: self.max_client_links_per_address,
            opens_per_second: self.opens_per_second,
            max_queued_bytes: self.max_queued_bytes,
            control_reserve_bytes: self.control_reserve_bytes,
            max_window_records: self.max_window_records,
            malformed_frames: BucketConfig {
                burst: self.malformed_frame_burst,
                refill: Duration::from_millis(self.malformed_frame_refill_ms),
            },
            unknown_stream_frames: BucketConfig {
                burst: self.unknown_stream_burst,
                refill: Duration::from_millis(self.unknown_stream_refill_ms),
            },
            closed_streams_remembered: self.closed_streams_remembered,
            keepalive: KeepaliveConfig {
                interval,
                // As the engine's default: a tenth of the interval.
                jitter: interval / 10,
                pong_timeout: pong,
                // §6.4: every write has the same deadline as the pong.
                write_timeout: pong,
            },
        }
    }

    /// The HTTP front's limits of the relay's listener.
    pub fn front_limits(&self) -> FrontLimits {
        FrontLimits::websocket(
            Duration::from_millis(self.request_head_timeout_ms),
            self.max_pending_handshakes,
            self.max_pending_handshakes_per_address,
        )
    }

    /// The HTTP front's limits of the metrics listener.
    pub fn metrics_front_limits(&self) -> FrontLimits {
        FrontLimits::metrics(Duration::from_millis(self.request_head_timeout_ms))
    }

    /// How long an environment link has to send its message 1.
    pub fn link_handshake_timeout(&self) -> Duration {
        Duration::from_millis(self.link_handshake_timeout_ms)
    }

    /// How often the environments file is checked.
    pub fn environments_poll(&self) -> Duration {
        Duration::from_millis(self.environments_poll_ms)
    }

    /// The replay limits of environment links' message-1 stamps.
    pub fn replay_limits(&self) -> execrelay_protocol::replay::ReplayLimits {
        execrelay_protocol::replay::ReplayLimits {
            window: Duration::from_millis(self.handshake_clock_window_ms),
            per_key: self.max_handshakes_per_key_window,
            ..execrelay_protocol::replay::ReplayLimits::with_keys(
                execrelay_protocol::env_handshake::TRACKED_ENVIRONMENTS,
            )
        }
    }

    /// What these settings ask of the descriptor limit.
    pub fn descriptor_needs(&self) -> execrelay_io::descriptors::RelayDescriptorNeeds {
        execrelay_io::descriptors::RelayDescriptorNeeds {
            client_links: self.max_client_links as u64,
            pending_handshakes: self.max_pending_handshakes as u64,
            metrics: execrelay_io::http::MAX_METRICS_SCRAPES as u64 + 1,
            reserve: self.descriptor_reserve as u64,
        }
    }

    /// These settings with the caps of `plan` (never above what was configured).
    pub fn within(&self, plan: &execrelay_io::descriptors::RelayDescriptorPlan) -> RelaySettings {
        let cap = |v: usize, c: u64| v.min(usize::try_from(c).unwrap_or(usize::MAX));
        RelaySettings {
            max_client_links: cap(self.max_client_links, plan.client_links),
            max_pending_handshakes: cap(self.max_pending_handshakes, plan.pending_handshakes),
            descriptor_reserve: cap(self.descriptor_reserve, plan.reserve),
            ..self.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_engines_constants_and_valid() {
        let s = RelaySettings::default();
        s.validate().unwrap();
        let mut engine = s.engine();
        // The jitter is derived; the rest is the engine's defaults exactly.
        assert_eq!(
            engine.keepalive.jitter,
            execrelay_protocol::config::KEEPALIVE_JITTER
        );
        engine.keepalive = KeepaliveConfig::default();
        assert_eq!(engine, RelayConfig::default());
        for setting in SETTINGS {
            assert_eq!(
                s.value_of(setting.name),
                Some(setting.default),
                "{}",
                setting.name
            );
        }
        let mut names: Vec<&str> = SETTINGS.iter().map(|s| s.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), SETTINGS.len());
    }

    #[test]
    fn toml_keys_override_and_bad_values_are_refused() {
        let s = RelaySettings::from_toml("max_environments = 3\npong_timeout_ms = 500\n").unwrap();
        assert_eq!(s.max_environments, 3);
        assert_eq!(
            s.engine().keepalive.write_timeout,
            Duration::from_millis(500)
        );
        for bad in [
            "max_environs = 3",
            "max_queued_bytes = 0",
            "keepalive_interval_ms = 0",
            "max_frame_bytes = 100",
            "max_frame_bytes = 70000",
            "control_reserve_bytes = 1000",
            "client_link_share_bytes = 100",
            "idle_link_timeout_ms = 0",
            // 64 links × 1 MiB of share from one address: over a quarter of 256 MiB.
            "client_link_share_bytes = 1048577",
        ] {
            let err = RelaySettings::from_toml(bad).unwrap_err();
            assert!(
                err.to_string().starts_with("invalid relay configuration"),
                "{bad}: {err}"
            );
        }
        // A number may carry its unit, as a flag's; a bad one names the key and the form.
        let s =
            RelaySettings::from_toml("max_queued_bytes = \"512MiB\"\npong_timeout_ms = \"2s\"\n")
                .unwrap();
        assert_eq!(s.max_queued_bytes, 512 << 20);
        assert_eq!(s.pong_timeout_ms, 2_000);
        let err = RelaySettings::from_toml("max_queued_bytes = \"1.5GiB\"").unwrap_err();
        assert!(
            err.to_string().contains("max_queued_bytes: `1.5GiB`"),
            "{err}"
        );
        let edge = format!("max_frame_bytes = {MIN_FRAME_BYTES}");
        assert_eq!(
            RelaySettings::from_toml(&edge).unwrap().max_frame_bytes,
            MIN_FRAME_BYTES
        );
    }

    #[test]
    fn values_read_for_people() {
        assert_eq!(Unit::Bytes.display(MAX_QUEUED_BYTES as u64), "256 MiB");
        assert_eq!(Unit::Bytes.display(MAX_FRAME_BYTES as u64), "65 579 bytes");
        assert_eq!(Unit::Millis.display(15_000), "15 000 ms");
        assert_eq!(Unit::Count.display(8192), "8 192");
    }
}
