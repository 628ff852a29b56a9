//! Operators' metrics: the counters and gauges of one exec server, and their Prometheus text
//! (served at `GET /metrics` by the HTTP front on `--metrics-listen ADDR`).
//!
//! # What this module owns
//!
//! - [`Metrics`]: counters updated where things happen (bytes read from children, bytes written
//!   to their stdin, time a pump spent blocked on a slow client, handshake failures by reason,
//!   JSON-RPC errors by code, connections, Noise links and streams). One per server, built by
//!   the caller and passed in (`SessionRegistry::new(config, metrics, containment)`), so
//!   servers in one process (tests) never mix their figures.
//! - Gauges that are *read* rather than counted (sessions attached and detached, processes
//!   running and exited, output bytes retained for clients): set from a [`StateSnapshot`] the
//!   caller takes from the registry at scrape time, so they can never drift from the truth.
//! - [`Metrics::render`], the OpenMetrics text; the endpoint that serves it is the HTTP front
//!   (`execrelay_io::http`), wired by the composition root (`server.rs`), whose renderer renders
//!   `metrics.render(&registry.stats())`.
//!
//! A leaf (layer 1): it imports nothing of the crate, never builds or reads a registry itself.
//!
//! # What it must never do
//!
//! - Carry a label a peer chooses (process ids, session ids, paths, keys): label values are
//!   fixed strings from this code, so a client cannot grow the series set or smuggle text into
//!   an operator's dashboards.
//! - Block or slow the data path: counter updates there are relaxed atomic adds (labelled
//!   families take a read lock, only on error and handshake paths); the registry's locks are
//!   taken only at scrape time, by the caller that builds the snapshot.

use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, OnceLock};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// A label with one value from a fixed set (a state, a reason, a code).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    /// The state.
    pub state: &'static str,
}

/// Why a Noise handshake or stream failed.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// A fixed reason string, as in the `RESET` frame.
    pub reason: &'static str,
}

/// A JSON-RPC error code.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabel {
    /// The code (`-32600`, …).
    pub code: i64,
}

/// What became of an approval request (`protocol.md` §7).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    /// `requested`, `approved`, `denied`, `timed_out` or `withdrawn`.
    pub outcome: &'static str,
}

/// The fixed outcomes of [`Metrics::approval`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApprovalOutcome {
    /// A `process/approve` was registered for a process (sent, or to be sent on resume).
    Requested,
    /// The client approved.
    Approved,
    /// The client denied (an error answer and an unreadable one count as denials), or could
    /// not be asked (no `serverRequests` capability).
    Denied,
    /// `approval_timeout_ms` passed.
    TimedOut,
    /// The session was closed or expired with the request pending.
    Withdrawn,
}

impl ApprovalOutcome {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalOutcome::Requested => "requested",
            ApprovalOutcome::Approved => "approved",
            ApprovalOutcome::Denied => "denied",
            ApprovalOutcome::TimedOut => "timed_out",
            ApprovalOutcome::Withdrawn => "withdrawn",
        }
    }
}

/// A step of process containment that failed (metrics label `stage`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainmentStage {
    /// A session's scope (its cgroups) could not be created: the session was refused.
    OpenScope,
    /// Signalling or waiting for a session's processes failed.
    Signal,
    /// Killing a session's processes failed, or some survived SIGKILL.
    Kill,
    /// A session's emptied scope could not be removed.
    RemoveScope,
    /// Killing everything at shutdown failed, or left processes behind.
    Shutdown,
}

impl ContainmentStage {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            ContainmentStage::OpenScope => "open_scope",
            ContainmentStage::Signal => "signal",
            ContainmentStage::Kill => "kill",
            ContainmentStage::RemoveScope => "remove_scope",
            ContainmentStage::Shutdown => "shutdown",
        }
    }
}

/// A containment stage label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabel {
    /// One of [`ContainmentStage::as_str`].
    pub stage: &'static str,
}

/// The environment link's series (`serve --relay` only: a server without a relay link has
/// none, so an alert on them never fires for it).
pub struct EnvironmentLinkMetrics {
    up: Gauge,
    state: Family<StateLabel, Gauge>,
    ups: Counter,
    refusals: Family<ReasonLabel, Counter>,
}

/// The states of [`EnvironmentLinkMetrics::set_state`].
pub const ENVIRONMENT_LINK_STATES: [&str; 4] = ["connecting", "up", "refused", "unauthorized"];

impl EnvironmentLinkMetrics {
    /// The link is now in `state` (one of [`ENVIRONMENT_LINK_STATES`]).
    pub fn set_state(&self, state: &'static str) {
        for s in ENVIRONMENT_LINK_STATES {
            self.state
                .get_or_create(&StateLabel { state: s })
                .set(i64::from(s == state));
        }
        self.up.set(i64::from(state == "up"));
    }

    /// The link came up (authenticated by the relay).
    pub fn came_up(&self) {
        self.ups.inc();
    }

    /// The relay refused the link; `reason` is a fixed string.
    pub fn refused(&self, reason: &'static str) {
        self.refusals.get_or_create(&ReasonLabel { reason }).inc();
    }
}

/// What the registry holds at one moment: the read gauges, given to [`Metrics::render`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StateSnapshot {
    /// Sessions held by a connection.
    pub sessions_attached: usize,
    /// Sessions waiting for a resume.
    pub sessions_detached: usize,
    /// Processes whose exit notice is not yet in their log.
    pub processes_running: usize,
    /// Processes that exited and are retained for their client.
    pub processes_exited: usize,
    /// Output held for clients, with per-event overhead, summed over processes.
    pub retained_output_bytes: usize,
    /// Processes of the session that holds the most (against `processes_limit`).
    pub largest_session_processes: usize,
    /// `max_sessions`.
    pub sessions_limit: usize,
    /// `max_processes`: processes per session.
    pub processes_limit: usize,
    /// `max_connections`.
    pub connections_limit: usize,
    /// `max_links`.
    pub links_limit: usize,
}

/// Every metric of one server.
pub struct Metrics {
    /// Behind a lock only so that the environment link's series can be added once a server
    /// has one ([`Metrics::environment_link`]); taken at scrape time and that once.
    registry: Mutex<Registry>,
    environment_link: OnceLock<EnvironmentLinkMetrics>,
    /// Live JSON-RPC connections (one per WebSocket or virtual stream, or stdio).
    pub connections: Gauge,
    /// Bytes read from children's stdout, stderr and PTYs.
    pub output_bytes: Counter,
    /// Bytes written to children's stdin.
    pub stdin_bytes: Counter,
    /// Seconds output pumps spent waiting for a client to take output (all processes).
    pub delivery_blocked_seconds: Counter<f64, AtomicU64>,
    /// JSON-RPC error responses sent, by code.
    pub rpc_errors: Family<CodeLabel, Counter>,
    /// Requests refused for a limit (`-32004`), by the limit's name (`data.limit`).
    pub limit_refusals: Family<RefusedLimitLabel, Counter>,
    /// JSON-RPC responses (results and errors) queued on connections' control lanes, counted
    /// once each is queued: from then on it goes out before any output not yet written.
    pub rpc_responses: Counter,
    /// Noise handshake and stream failures, by reason.
    pub noise_failures: Family<ReasonLabel, Counter>,
    /// Live Noise physical links.
    pub noise_links: Gauge,
    /// Live Noise virtual streams (authorized and open).
    pub noise_streams: Gauge,
    /// Approval requests, by outcome.
    pub approvals: Family<OutcomeLabel, Counter>,
    /// Processes refused by a `deny` rule of the exec policy (no client asked).
    pub policy_denials: Counter,
    /// Processes whose output stands still for no reason outside the server, now (the stall
    /// watchdog, `process/stall_watch.rs`). Anything but 0 is a bug.
    pub stalled_streams: Gauge,
    /// Stalls the watchdog reported since the server started.
    pub stalls: Counter,
    /// Exit notices marked `outputDrainTimedOut`: output cut at the drain deadline.
    pub output_drain_timeouts: Counter,
    /// Containment steps that failed, by stage.
    pub containment_failures: Family<StageLabel, Counter>,
    sessions: Family<StateLabel, Gauge>,
    processes: Family<StateLabel, Gauge>,
    retained_output_bytes: Gauge,
    largest_session_processes: Gauge,
    limits: Family<LimitLabel, Gauge>,
}

/// The limits a `-32004` can name (`data.limit`), each a label of
/// `execrelay_limit_refusals_total`; any other is counted as `other`.
pub const LIMIT_REFUSAL_NAMES: [&str; 11] = [
    "maxSessions",
    "maxProcesses",
    "maxSessionsPerKey",
    "maxSessionsPerAddress",
    "maxProcessesPerKey",
    "maxProcessesPerAddress",
    "maxPendingRequests",
    "maxPendingControlRequests",
    "maxPendingRequestBytes",
    "maxInboundBytes",
    "writeOrder",
];

/// The limit a refused request met (one of [`LIMIT_REFUSAL_NAMES`], or `other`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusedLimitLabel {
    /// The limit's name, as `data.limit` of the `-32004` gave it.
    pub limit: &'static str,
}

/// The name of a limit (a `ServerConfig` setting).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitLabel {
    /// The setting's name.
    pub name: &'static str,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Fresh metrics, all zero.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("execrelay");
        let m = Metrics {
            registry: Mutex::new(Registry::default()),
            environment_link: OnceLock::new(),
            output_drain_timeouts: Counter::default(),
            containment_failures: Family::default(),
            largest_session_processes: Gauge::default(),
            limits: Family::default(),
            connections: Gauge::default(),
            output_bytes: Counter::default(),
            stdin_bytes: Counter::default(),
            delivery_blocked_seconds: Counter::default(),
            rpc_errors: Family::default(),
            limit_refusals: Family::default(),
            rpc_responses: Counter::default(),
            noise_failures: Family::default(),
            noise_links: Gauge::default(),
            noise_streams: Gauge::default(),
            approvals: Family::default(),
            policy_denials: Counter::default(),
            stalled_streams: Gauge::default(),
            stalls: Counter::default(),
            sessions: Family::default(),
            processes: Family::default(),
            retained_output_bytes: Gauge::default(),
        };
        registry.register(
            "connections",
            "Live JSON-RPC connections",
            m.connections.clone(),
        );
        registry.register(
            "stalled_streams",
            "Processes whose output stands still although nothing outside the server holds it back (the stall watchdog; anything but 0 is a bug)",
            m.stalled_streams.clone(),
        );
        registry.register(
            "stalls",
            "Stalls reported by the stall watchdog",
            m.stalls.clone(),
        );
        registry.register(
            "sessions",
            "Sessions by state (attached to a connection, or detached awaiting resume)",
            m.sessions.clone(),
        );
        registry.register(
            "processes",
            "Processes by state (running, or exited and retained for their client)",
            m.processes.clone(),
        );
        registry.register(
            "retained_output_bytes",
            "Output bytes held for clients (the per-process delivery queues, summed)",
            m.retained_output_bytes.clone(),
        );
        registry.register(
            "output_bytes",
            "Bytes read from children's stdout, stderr and PTYs",
            m.output_bytes.clone(),
        );
        registry.register(
            "stdin_bytes",
            "Bytes written to children's stdin",
            m.stdin_bytes.clone(),
        );
        registry.register(
            "delivery_blocked_seconds",
            "Seconds output pumps waited for slow clients",
            m.delivery_blocked_seconds.clone(),
        );
        registry.register(
            "rpc_errors",
            "JSON-RPC error responses sent, by code",
            m.rpc_errors.clone(),
        );
        registry.register(
            "limit_refusals",
            "Requests refused for a limit (-32004), by the limit's name",
            m.limit_refusals.clone(),
        );
        registry.register(
            "rpc_responses",
            "JSON-RPC responses (results and errors) queued for clients",
            m.rpc_responses.clone(),
        );
        registry.register(
            "noise_failures",
            "Noise handshake and stream failures, by reason",
            m.noise_failures.clone(),
        );
        registry.register(
            "noise_links",
            "Live Noise physical links",
            m.noise_links.clone(),
        );
        registry.register(
            "noise_streams",
            "Live Noise virtual streams",
            m.noise_streams.clone(),
        );
        registry.register(
            "approvals",
            "Approval requests (process/approve), by outcome",
            m.approvals.clone(),
        );
        registry.register(
            "policy_denials",
            "Processes refused by a deny rule of the exec policy",
            m.policy_denials.clone(),
        );
        registry.register(
            "output_drain_timeouts",
            "Processes whose output was cut at the drain deadline (exit notice outputDrainTimedOut)",
            m.output_drain_timeouts.clone(),
        );
        registry.register(
            "containment_failures",
            "Containment steps that failed (processes may have escaped or been left behind), by stage",
            m.containment_failures.clone(),
        );
        registry.register(
            "largest_session_processes",
            "Processes of the session holding the most (max_processes is per session)",
            m.largest_session_processes.clone(),
        );
        registry.register(
            "limit",
            "Limits in force, by setting name (max_sessions, max_processes, max_connections, max_links)",
            m.limits.clone(),
        );
        Metrics {
            registry: Mutex::new(registry),
            ..m
        }
    }

    /// The environment link's series, registered on first use (by the environment link).
    pub fn environment_link(&self) -> &EnvironmentLinkMetrics {
        self.environment_link.get_or_init(|| {
            let link = EnvironmentLinkMetrics {
                up: Gauge::default(),
                state: Family::default(),
                ups: Counter::default(),
                refusals: Family::default(),
            };
            let mut registry = crate::sync::lock(&self.registry);
            registry.register(
                "environment_link_up",
                "1 while the environment link is up and authenticated by the relay, else 0",
                link.up.clone(),
            );
            registry.register(
                "environment_link_state",
                "The environment link's state (connecting, up, refused, unauthorized): 1 for the current one",
                link.state.clone(),
            );
            registry.register(
                "environment_link_ups",
                "Times the environment link came up",
                link.ups.clone(),
            );
            registry.register(
                "environment_link_refusals",
                "Environment links the relay refused (or whose relay failed to prove the pinned key), by reason",
                link.refusals.clone(),
            );
            link.set_state("connecting");
            link
        })
    }

    /// Count a containment step that failed.
    pub fn containment_failure(&self, stage: ContainmentStage) {
        self.containment_failures
            .get_or_create(&StageLabel {
                stage: stage.as_str(),
            })
            .inc();
    }

    /// Count an approval request's step.
    pub fn approval(&self, outcome: ApprovalOutcome) {
        self.approvals
            .get_or_create(&OutcomeLabel {
                outcome: outcome.as_str(),
            })
            .inc();
    }

    /// Count a JSON-RPC error response.
    pub fn rpc_error(&self, code: i64) {
        self.rpc_errors.get_or_create(&CodeLabel { code }).inc();
    }

    /// Count a request refused for a limit (`-32004`) whose `data.limit` is `limit`: one of
    /// [`LIMIT_REFUSAL_NAMES`], else `other`, so that a label is never a string a peer chose.
    pub fn limit_refusal(&self, limit: Option<&str>) {
        let name = LIMIT_REFUSAL_NAMES
            .iter()
            .find(|n| Some(**n) == limit)
            .copied()
            .unwrap_or("other");
        self.limit_refusals
            .get_or_create(&RefusedLimitLabel { limit: name })
            .inc();
    }

    /// Count a Noise failure; `reason` is one of the fixed `RESET` reasons.
    pub fn noise_failure(&self, reason: &'static str) {
        self.noise_failures
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    /// The OpenMetrics text of everything, with the read gauges set from `s` (taken by the
    /// caller just before).
    pub fn render(&self, s: &StateSnapshot) -> String {
        let set = |f: &Family<StateLabel, Gauge>, state, v: usize| {
            f.get_or_create(&StateLabel { state }).set(v as i64);
        };
        set(&self.sessions, "attached", s.sessions_attached);
        set(&self.sessions, "detached", s.sessions_detached);
        set(&self.processes, "running", s.processes_running);
        set(&self.processes, "exited", s.processes_exited);
        let int = |v: usize| i64::try_from(v).unwrap_or(i64::MAX);
        self.retained_output_bytes.set(int(s.retained_output_bytes));
        self.largest_session_processes
            .set(int(s.largest_session_processes));
        for (name, v) in [
            ("max_sessions", s.sessions_limit),
            ("max_processes", s.processes_limit),
            ("max_connections", s.connections_limit),
            ("max_links", s.links_limit),
        ] {
            self.limits.get_or_create(&LimitLabel { name }).set(int(v));
        }
        let mut out = String::new();
        let registry = crate::sync::lock(&self.registry);
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
        out
    }
}

/// Keeps [`Metrics::connections`] (or any gauge) raised while it lives.
pub struct GaugeGuard(Gauge);

impl GaugeGuard {
    /// Raise `gauge` until the guard drops.
    pub fn new(gauge: &Gauge) -> Self {
        gauge.inc();
        GaugeGuard(gauge.clone())
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_counters_render_in_openmetrics_text() {
        let m = Metrics::new();
        m.output_bytes.inc_by(42);
        m.rpc_error(-32601);
        m.rpc_error(-32601);
        m.rpc_responses.inc_by(3);
        m.noise_failure("unauthorized");
        m.delivery_blocked_seconds.inc_by(1.5);
        m.approval(ApprovalOutcome::Requested);
        m.approval(ApprovalOutcome::TimedOut);
        m.policy_denials.inc();
        m.limit_refusal(Some("writeOrder"));
        m.limit_refusal(Some("writeOrder"));
        m.limit_refusal(Some("maxInboundBytes"));
        // Never a label a peer chose: anything unknown, or no name, is `other`.
        m.limit_refusal(Some("a name a peer made up"));
        m.limit_refusal(None);
        let _g = GaugeGuard::new(&m.connections);
        let out = m.render(&StateSnapshot::default());
        for line in [
            "# TYPE execrelay_output_bytes counter",
            "execrelay_output_bytes_total 42",
            "execrelay_rpc_errors_total{code=\"-32601\"} 2",
            "execrelay_rpc_responses_total 3",
            "execrelay_noise_failures_total{reason=\"unauthorized\"} 1",
            "execrelay_delivery_blocked_seconds_total 1.5",
            "execrelay_connections 1",
            "execrelay_approvals_total{outcome=\"requested\"} 1",
            "execrelay_approvals_total{outcome=\"timed_out\"} 1",
            "execrelay_policy_denials_total 1",
            "execrelay_limit_refusals_total{limit=\"writeOrder\"} 2",
            "execrelay_limit_refusals_total{limit=\"maxInboundBytes\"} 1",
            "execrelay_limit_refusals_total{limit=\"other\"} 2",
            "# EOF",
        ] {
            assert!(out.lines().any(|l| l == line), "missing {line:?} in\n{out}");
        }
        drop(_g);
        let out = m.render(&StateSnapshot::default());
        assert!(out.lines().any(|l| l == "execrelay_connections 0"));
        assert!(
            !out.contains("environment_link"),
            "no relay link, no environment link series"
        );
    }

    #[test]
    fn the_environment_link_series_appear_with_the_link_and_limits_render() {
        let m = Metrics::new();
        m.output_drain_timeouts.inc();
        m.containment_failure(ContainmentStage::Kill);
        let link = m.environment_link();
        let out = m.render(&StateSnapshot::default());
        for line in [
            "execrelay_environment_link_up 0",
            "execrelay_environment_link_state{state=\"connecting\"} 1",
            "execrelay_environment_link_state{state=\"up\"} 0",
        ] {
            assert!(out.lines().any(|l| l == line), "missing {line:?} in\n{out}");
        }
        link.set_state("up");
        link.came_up();
        link.refused("unauthorized");
        let s = StateSnapshot {
            largest_session_processes: 7,
            sessions_limit: 64,
            processes_limit: 256,
            connections_limit: 9,
            links_limit: 10,
            ..StateSnapshot::default()
        };
        let out = m.render(&s);
        for line in [
            "execrelay_environment_link_up 1",
            "execrelay_environment_link_state{state=\"up\"} 1",
            "execrelay_environment_link_state{state=\"connecting\"} 0",
            "execrelay_environment_link_ups_total 1",
            "execrelay_environment_link_refusals_total{reason=\"unauthorized\"} 1",
            "execrelay_output_drain_timeouts_total 1",
            "execrelay_containment_failures_total{stage=\"kill\"} 1",
            "execrelay_largest_session_processes 7",
            "execrelay_limit{name=\"max_sessions\"} 64",
            "execrelay_limit{name=\"max_processes\"} 256",
            "execrelay_limit{name=\"max_links\"} 10",
        ] {
            assert!(out.lines().any(|l| l == line), "missing {line:?} in\n{out}");
        }
    }
}
