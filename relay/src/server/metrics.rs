//! The relay's Prometheus metrics (`--metrics-listen`, `GET /metrics`), rendered at scrape
//! time from figures that are read, never kept twice: the hub's [`RelaySnapshot`] (links,
//! environments, streams, queue depths, the router's counters of frames, bytes, resets, drops
//! and closes) and the server's own [`ServerStats`] (environment-link handshakes, client links
//! refused).
//!
//! Every label value is a fixed string of this crate (frame types, directions, reasons): a
//! peer can never grow the series set or put its words in an operator's dashboards. Nothing
//! here is on the data path: a scrape takes the hub's lock once, for the snapshot.

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::settings::RelaySettings;
use execrelay_io::driver::relay::RelaySnapshot;
use execrelay_io::runtimes::RuntimeFigures;
use execrelay_io::tls::validity::utc;
use execrelay_io::tls::TlsFigures;
use execrelay_protocol::env_handshake::{
    REASON_CLOCK_SKEW, REASON_HELD, REASON_MALFORMED, REASON_REPLAYED,
};

/// A label with one value from a fixed set.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FrameLabel {
    r#type: &'static str,
    direction: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DirectionLabel {
    direction: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

/// A link runtime's index (`--runtime-threads`): 0 to the count less one.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RuntimeLabel {
    runtime: u64,
}

/// Outcomes of environment-link handshakes, in counter order (metrics label `result`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkOutcome {
    /// Admitted.
    Accepted,
    /// The key or id did not check out (not listed, wrong key, message 1 did not decrypt,
    /// the environments file is unusable).
    Unauthorized,
    /// A replayed message 1.
    Replayed,
    /// The environment's clock is too far off.
    ClockSkew,
    /// The first frame was not a link handshake.
    Malformed,
    /// No message 1 within the handshake timeout, or the socket ended first.
    Timeout,
    /// Refused for load: too many environments, or too many handshakes at once.
    Busy,
    /// Another live link holds the id (it answered the relay's probe): two exec servers
    /// share the environment's key.
    InUse,
    /// Silent in its handshake while every slot was held: its slot went to a newer link.
    Evicted,
}

impl LinkOutcome {
    const ALL: [LinkOutcome; 9] = [
        LinkOutcome::Accepted,
        LinkOutcome::Unauthorized,
        LinkOutcome::Replayed,
        LinkOutcome::ClockSkew,
        LinkOutcome::Malformed,
        LinkOutcome::Timeout,
        LinkOutcome::Busy,
        LinkOutcome::InUse,
        LinkOutcome::Evicted,
    ];

    /// The metrics label.
    pub fn as_str(self) -> &'static str {
        match self {
            LinkOutcome::Accepted => "accepted",
            LinkOutcome::Unauthorized => "unauthorized",
            LinkOutcome::Replayed => REASON_REPLAYED,
            LinkOutcome::ClockSkew => REASON_CLOCK_SKEW,
            LinkOutcome::Malformed => REASON_MALFORMED,
            LinkOutcome::Timeout => "timeout",
            LinkOutcome::Busy => "busy",
            LinkOutcome::InUse => REASON_HELD,
            LinkOutcome::Evicted => "evicted",
        }
    }

    /// The outcome of a refusal's `RESET` reason.
    pub fn of_reason(reason: &str) -> LinkOutcome {
        match reason {
            REASON_REPLAYED => LinkOutcome::Replayed,
            REASON_CLOCK_SKEW => LinkOutcome::ClockSkew,
            REASON_MALFORMED => LinkOutcome::Malformed,
            REASON_HELD => LinkOutcome::InUse,
            "busy" => LinkOutcome::Busy,
            _ => LinkOutcome::Unauthorized,
        }
    }
}

/// Why a client link was refused after its upgrade.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientRefusal {
    /// Its address holds its maximum of client links.
    PerAddress,
}

/// The server's own counters (the router counts everything about frames and streams).
#[derive(Debug, Default)]
pub struct ServerStats {
    link_handshakes: [AtomicU64; LinkOutcome::ALL.len()],
    client_links_refused_per_address: AtomicU64,
    environments_file_reloads: AtomicU64,
    environments_file_errors: AtomicU64,
    environments_revoked: AtomicU64,
}

impl ServerStats {
    /// Count an environment-link handshake's outcome.
    pub fn link_handshake(&self, outcome: LinkOutcome) {
        let i = LinkOutcome::ALL
            .iter()
            .position(|o| *o == outcome)
            .unwrap_or(0);
        self.link_handshakes[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Environment-link handshakes that ended with `outcome` so far.
    pub fn link_handshakes(&self, outcome: LinkOutcome) -> u64 {
        let i = LinkOutcome::ALL
            .iter()
            .position(|o| *o == outcome)
            .unwrap_or(0);
        self.link_handshakes[i].load(Ordering::Relaxed)
    }

    /// Count a client link refused after its upgrade.
    pub fn client_refused(&self, why: ClientRefusal) {
        match why {
            ClientRefusal::PerAddress => &self.client_links_refused_per_address,
        }
        .fetch_add(1, Ordering::Relaxed);
    }

    /// Count a reload of the environments file: `revoked` ids lost their key; `ok` false when
    /// the new version is unusable.
    pub fn environments_reloaded(&self, ok: bool, revoked: usize) {
        if ok {
            self.environments_file_reloads
                .fetch_add(1, Ordering::Relaxed);
        } else {
            self.environments_file_errors
                .fetch_add(1, Ordering::Relaxed);
        }
        self.environments_revoked
            .fetch_add(revoked as u64, Ordering::Relaxed);
    }
}

/// The frame type labels, by type index (0: undecodable).
const FRAME_TYPES: [&str; 7] = [
    "undecodable",
    "open",
    "accept",
    "data",
    "ack",
    "reset",
    "resume",
];

fn gauge(v: usize) -> Gauge {
    let g = Gauge::default();
    g.set(i64::try_from(v).unwrap_or(i64::MAX));
    g
}

fn counter(v: u64) -> Counter {
    let c = Counter::default();
    c.inc_by(v);
    c
}

/// Everything the metrics endpoint shows at one instant.
#[derive(Debug, Clone)]
pub struct Figures {
    /// The hub's figures.
    pub hub: RelaySnapshot,
    /// Environments listed in the environments file (its last usable version).
    pub environments_listed: usize,
    /// Whether the environments file is usable now.
    pub environments_file_ok: bool,
    /// The TLS listener's counts and certificate, when the relay speaks TLS.
    pub tls: Option<TlsFigures>,
    /// Client links the relay holds at most (`max_client_links`, as the descriptor limit
    /// allowed).
    pub max_client_links: usize,
    /// The cluster node's figures, when the relay is in a cluster.
    pub cluster: Option<ClusterFigures>,
    /// Each link runtime's figures (`--runtime-threads`); empty when the links run on the
    /// caller's runtime (an embedded relay).
    pub runtimes: Vec<RuntimeFigures>,
}

/// A cluster node's figures at one instant (`execrelay_relay_cluster_*`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterFigures {
    /// 1 while NATS is connected.
    pub directory_up: bool,
    /// Environments held (subscribed in the directory).
    pub held: usize,
    /// Forwarding relay-to-relay links up.
    pub forwarding_links: usize,
    /// Traffic across relay-to-relay links.
    pub forwarded: execrelay_protocol::router::Forwarded,
    /// Lookups asked, missed (no holder), failed (directory unreachable or a bound), answered.
    pub lookups: u64,
    /// See `lookups`.
    pub lookup_misses: u64,
    /// See `lookups`.
    pub lookup_failures: u64,
    /// See `lookups`.
    pub lookups_answered: u64,
    /// Relay-to-relay links dialled, and those that failed.
    pub forward_links: u64,
    /// See `forward_links`.
    pub forward_failures: u64,
    /// Relay-to-relay links admitted and refused here (holding side).
    pub relay_links_admitted: u64,
    /// See `relay_links_admitted`.
    pub relay_links_refused: u64,
    /// Environment links closed because a newer one elsewhere took the id.
    pub takeovers: u64,
    /// Environment links asked to re-dial to their new home.
    pub moves: u64,
    /// Client links whose front header was ignored: their peer is not a trusted front.
    pub front_header_ignored: u64,
}

/// The OpenMetrics text of `figures` and `stats` (every name prefixed `execrelay_relay_`),
/// with the limits the alerts compare against from `settings`.
pub fn render(figures: &Figures, stats: &ServerStats, settings: &RelaySettings) -> String {
    let mut r = Registry::with_prefix("execrelay_relay");
    let h = &figures.hub;
    let c = &h.counters;

    let links = Family::<KindLabel, Gauge>::default();
    links
        .get_or_create(&KindLabel {
            kind: "environment",
        })
        .set(h.environments as i64);
    links
        .get_or_create(&KindLabel { kind: "client" })
        .set(h.links.saturating_sub(h.environments) as i64);
    r.register("links", "Live links, by kind", links);
    r.register(
        "environments_online",
        "Environments with a live link",
        gauge(h.environments),
    );
    r.register(
        "environments_listed",
        "Environments listed in the environments file (its last usable version)",
        gauge(figures.environments_listed),
    );
    r.register(
        "environments_file_ok",
        "1 when the environments file is usable, 0 while it is unreadable or malformed (no new environment is admitted)",
        gauge(usize::from(figures.environments_file_ok)),
    );
    r.register("streams", "Routed streams", gauge(h.streams));
    r.register(
        "queued_bytes",
        "Bytes queued for writing on all links together",
        gauge(h.queued_bytes),
    );
    r.register(
        "deepest_link_queue_bytes",
        "Bytes queued on the link with the deepest queue",
        gauge(h.deepest_link_queue_bytes),
    );
    r.register(
        "queued_bytes_limit",
        "max_queued_bytes: above it new streams are reset busy",
        gauge(settings.max_queued_bytes),
    );
    r.register(
        "environments_limit",
        "max_environments: environments with a link at once",
        gauge(settings.max_environments),
    );
    r.register(
        "client_links_limit",
        "max_client_links: client links at once",
        gauge(settings.max_client_links),
    );

    let frames = Family::<FrameLabel, Counter>::default();
    for (i, t) in FRAME_TYPES.iter().enumerate() {
        for (direction, n) in [("in", c.frames_in[i]), ("out", c.frames_out[i])] {
            frames
                .get_or_create(&FrameLabel {
                    r#type: t,
                    direction,
                })
                .inc_by(n);
        }
    }
    r.register(
        "frames",
        "Frames read and written, by type and direction",
        frames,
    );
    let bytes = Family::<DirectionLabel, Counter>::default();
    bytes
        .get_or_create(&DirectionLabel { direction: "in" })
        .inc_by(c.data_bytes_in);
    bytes
        .get_or_create(&DirectionLabel { direction: "out" })
        .inc_by(c.data_bytes_out);
    r.register(
        "data_bytes",
        "Payload bytes of DATA frames read and written",
        bytes,
    );

    let resets = Family::<ReasonLabel, Counter>::default();
    for (reason, n) in c.reset_counts() {
        resets
            .get_or_create(&ReasonLabel {
                reason: reason.as_str(),
            })
            .inc_by(n);
    }
    r.register(
        "resets",
        "Streams reset or OPENs refused by the relay, by reason (once per stream)",
        resets,
    );
    r.register(
        "forwarded_resets",
        "RESETs sent by one end of a stream and forwarded to the other",
        counter(c.peer_resets),
    );
    let drops = Family::<ReasonLabel, Counter>::default();
    for (reason, n) in c.drop_counts() {
        drops
            .get_or_create(&ReasonLabel {
                reason: reason.as_str(),
            })
            .inc_by(n);
    }
    r.register("dropped_frames", "Inbound frames dropped, by reason", drops);
    let closes = Family::<ReasonLabel, Counter>::default();
    for (reason, n) in c.close_counts() {
        closes
            .get_or_create(&ReasonLabel {
                reason: reason.as_str(),
            })
            .inc_by(n);
    }
    r.register("link_closes", "Links closed, by reason", closes);

    let handshakes = Family::<ResultLabel, Counter>::default();
    for outcome in LinkOutcome::ALL {
        handshakes
            .get_or_create(&ResultLabel {
                result: outcome.as_str(),
            })
            .inc_by(stats.link_handshakes(outcome));
    }
    r.register(
        "environment_handshakes",
        "Environment-link handshakes, by result",
        handshakes,
    );
    r.register(
        "client_links_max",
        "Client links the relay holds at most: max_client_links, lowered at start if the open files limit could not hold it",
        gauge(figures.max_client_links),
    );
    r.register(
        "handshake_failures",
        "Environments' handshake-failure RESETs answering a client's OPEN, charged to that client's link and address",
        counter(c.handshake_failures),
    );
    r.register(
        "abandoned_opens",
        "OPENs whose route ended before their answer by the client's doing (its RESET, a broken rule, its link's death), charged to its address",
        counter(c.abandoned_opens),
    );
    r.register(
        "client_links_refused",
        "Client links closed after their upgrade because their address holds its maximum",
        counter(
            stats
                .client_links_refused_per_address
                .load(Ordering::Relaxed),
        ),
    );
    r.register(
        "environments_file_reloads",
        "Changes of the environments file read successfully",
        counter(stats.environments_file_reloads.load(Ordering::Relaxed)),
    );
    r.register(
        "environments_file_errors",
        "Changes of the environments file that left it unusable",
        counter(stats.environments_file_errors.load(Ordering::Relaxed)),
    );
    r.register(
        "environments_revoked",
        "Environment ids removed from the file (or given another key)",
        counter(stats.environments_revoked.load(Ordering::Relaxed)),
    );

    if !figures.runtimes.is_empty() {
        let tasks = Family::<RuntimeLabel, Gauge>::default();
        let placed = Family::<RuntimeLabel, Counter>::default();
        for (i, f) in figures.runtimes.iter().enumerate() {
            let label = RuntimeLabel { runtime: i as u64 };
            tasks
                .get_or_create(&label)
                .set(i64::try_from(f.alive_tasks).unwrap_or(i64::MAX));
            placed.get_or_create(&label).inc_by(f.connections_placed);
        }
        r.register(
            "runtime_tasks",
            "Tasks alive on each link runtime (a link is two: its reader and its writer)",
            tasks,
        );
        r.register(
            "runtime_connections",
            "Connections placed on each link runtime (the one running the fewest tasks)",
            placed,
        );
    }

    if let Some(tls) = &figures.tls {
        r.register(
            "tls_certificate_expiry_seconds",
            "notAfter of the TLS certificate in force, in seconds since the Unix epoch",
            gauge(usize::try_from(tls.not_after).unwrap_or(0)),
        );
        let reloads = Family::<ResultLabel, Counter>::default();
        for (result, n) in [("ok", tls.reloads), ("error", tls.reload_errors)] {
            reloads.get_or_create(&ResultLabel { result }).inc_by(n);
        }
        r.register(
            "tls_certificate_reloads",
            "Changes of the certificate files: put in force (ok) or kept out (error)",
            reloads,
        );
        let handshakes = Family::<ResultLabel, Counter>::default();
        for (result, n) in [("ok", tls.handshakes), ("error", tls.handshake_failures)] {
            handshakes.get_or_create(&ResultLabel { result }).inc_by(n);
        }
        r.register(
            "tls_handshakes",
            "TLS handshakes on the links' listener, by result (error: failed or timed out)",
            handshakes,
        );
    }

    if let Some(cl) = &figures.cluster {
        let entries: [(&str, &str, u64, bool); 16] = [
            (
                "cluster_directory_up",
                "1 while the cluster's directory (NATS) is connected",
                u64::from(cl.directory_up),
                false,
            ),
            (
                "cluster_environments_held",
                "Environments this relay holds and answers for in the directory",
                cl.held as u64,
                false,
            ),
            (
                "cluster_forwarding_links",
                "Relay-to-relay links up from this relay (forwarding misrouted clients)",
                cl.forwarding_links as u64,
                false,
            ),
            (
                "cluster_forwarded_streams",
                "Streams this relay opened across relay-to-relay links",
                cl.forwarded.streams,
                true,
            ),
            (
                "cluster_forwarded_bytes",
                "DATA payload bytes across relay-to-relay links (sent and received)",
                cl.forwarded.bytes,
                true,
            ),
            (
                "cluster_lookups",
                "Directory lookups asked",
                cl.lookups,
                true,
            ),
            (
                "cluster_lookup_misses",
                "Directory lookups that found no holder",
                cl.lookup_misses,
                true,
            ),
            (
                "cluster_lookup_failures",
                "Directory lookups not asked: directory unreachable or a lookup bound",
                cl.lookup_failures,
                true,
            ),
            (
                "cluster_lookups_answered",
                "Directory lookups this relay answered as the holder",
                cl.lookups_answered,
                true,
            ),
            (
                "cluster_forward_links",
                "Relay-to-relay links dialled",
                cl.forward_links,
                true,
            ),
            (
                "cluster_forward_failures",
                "Relay-to-relay links that could not be dialled or were refused",
                cl.forward_failures,
                true,
            ),
            (
                "cluster_relay_links_admitted",
                "Relay-to-relay links admitted (holding)",
                cl.relay_links_admitted,
                true,
            ),
            (
                "cluster_relay_links_refused",
                "Relay-to-relay links refused (handshake, unknown key, bound)",
                cl.relay_links_refused,
                true,
            ),
            (
                "cluster_takeovers",
                "Environment links closed because a newer link of the id came up on another relay",
                cl.takeovers,
                true,
            ),
            (
                "cluster_moves",
                "Environment links asked to re-dial to their new home relay",
                cl.moves,
                true,
            ),
            (
                "cluster_front_header_ignored",
                "Client links that carried X-Execrelay-Front from a peer not in trusted_front (the header was ignored)",
                cl.front_header_ignored,
                true,
            ),
        ];
        for (name, help, v, is_counter) in entries {
            if is_counter {
                r.register(name, help, counter(v));
            } else {
                r.register(name, help, gauge(v as usize));
            }
        }
    }

    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, &r);
    out
}

/// The `/status` document: what the relay holds now, against its limits.
pub fn status(figures: &Figures, settings: &RelaySettings) -> String {
    let h = &figures.hub;
    let tls = figures.tls.as_ref().map(|t| {
        serde_json::json!({
            "certificate": t.fingerprint,
            "not_after": utc(t.not_after),
            "reloads": t.reloads,
            "reload_errors": t.reload_errors,
        })
    });
    serde_json::json!({
        "version": super::RELAY_VERSION,
        "environments": {
            "online": h.environments,
            "listed": figures.environments_listed,
            "limit": settings.max_environments,
            "file_ok": figures.environments_file_ok,
        },
        "client_links": {
            "open": h.links.saturating_sub(h.environments),
            "limit": settings.max_client_links,
        },
        "streams": h.streams,
        "queued_bytes": {
            "now": h.queued_bytes,
            "deepest_link": h.deepest_link_queue_bytes,
            "limit": settings.max_queued_bytes,
        },
        "tls": tls,
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use execrelay_protocol::reason::Counters;

    #[test]
    fn every_family_renders_with_fixed_labels() {
        let figures = Figures {
            hub: RelaySnapshot {
                links: 5,
                environments: 2,
                streams: 7,
                queued_bytes: 1000,
                deepest_link_queue_bytes: 600,
                counters: Counters::default(),
            },
            environments_listed: 3,
            environments_file_ok: true,
            cluster: None,
            tls: Some(TlsFigures {
                reloads: 2,
                reload_errors: 1,
                handshakes: 9,
                handshake_failures: 4,
                not_after: 4_102_444_799,
                fingerprint: "SHA256:AB".into(),
            }),
            max_client_links: 4096,
            runtimes: vec![
                RuntimeFigures {
                    alive_tasks: 4,
                    connections_placed: 2,
                },
                RuntimeFigures {
                    alive_tasks: 0,
                    connections_placed: 1,
                },
            ],
        };
        let stats = ServerStats::default();
        stats.link_handshake(LinkOutcome::Accepted);
        stats.link_handshake(LinkOutcome::of_reason("replayed_handshake"));
        stats.client_refused(ClientRefusal::PerAddress);
        let settings = RelaySettings::default();
        let out = render(&figures, &stats, &settings);
        for line in [
            "execrelay_relay_links{kind=\"environment\"} 2",
            "execrelay_relay_links{kind=\"client\"} 3",
            "execrelay_relay_streams 7",
            "execrelay_relay_environments_listed 3",
            "execrelay_relay_queued_bytes 1000",
            "execrelay_relay_deepest_link_queue_bytes 600",
            "execrelay_relay_frames_total{type=\"data\",direction=\"in\"} 0",
            "execrelay_relay_resets_total{reason=\"window_exceeded\"} 0",
            "execrelay_relay_dropped_frames_total{reason=\"unknown_stream\"} 0",
            "execrelay_relay_link_closes_total{reason=\"oversized_frame\"} 0",
            "execrelay_relay_environment_handshakes_total{result=\"accepted\"} 1",
            "execrelay_relay_environment_handshakes_total{result=\"replayed_handshake\"} 1",
            "execrelay_relay_client_links_refused_total 1",
            &format!(
                "execrelay_relay_queued_bytes_limit {}",
                settings.max_queued_bytes
            ),
            &format!(
                "execrelay_relay_environments_limit {}",
                settings.max_environments
            ),
            "execrelay_relay_tls_certificate_expiry_seconds 4102444799",
            "execrelay_relay_tls_certificate_reloads_total{result=\"ok\"} 2",
            "execrelay_relay_tls_certificate_reloads_total{result=\"error\"} 1",
            "execrelay_relay_tls_handshakes_total{result=\"error\"} 4",
            "execrelay_relay_client_links_max 4096",
            "execrelay_relay_handshake_failures_total 0",
            "execrelay_relay_link_closes_total{reason=\"idle\"} 0",
            "execrelay_relay_link_closes_total{reason=\"message_timeout\"} 0",
            "execrelay_relay_runtime_tasks{runtime=\"0\"} 4",
            "execrelay_relay_runtime_tasks{runtime=\"1\"} 0",
            "execrelay_relay_runtime_connections_total{runtime=\"0\"} 2",
            "execrelay_relay_runtime_connections_total{runtime=\"1\"} 1",
            "# EOF",
        ] {
            assert!(out.lines().any(|l| l == line), "missing {line:?} in\n{out}");
        }
        let status: serde_json::Value = serde_json::from_str(&status(&figures, &settings)).unwrap();
        assert_eq!(status["environments"]["online"], 2);
        assert_eq!(status["client_links"]["open"], 3);
        assert_eq!(status["queued_bytes"]["limit"], settings.max_queued_bytes);
        assert_eq!(status["tls"]["not_after"], "2099-12-31 23:59:59 UTC");
        // Without TLS, no TLS series.
        let plain = Figures {
            tls: None,
            runtimes: Vec::new(),
            ..figures
        };
        let plain = render(&plain, &stats, &settings);
        assert!(!plain.contains("tls_"));
        // Links on the caller's runtime (an embedded relay): no runtime series.
        assert!(!plain.contains("runtime_"));
    }
}
