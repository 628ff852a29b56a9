//! The environment link's health, as an operator asks for it (`/readyz`, `/status`, the
//! `execrelay_environment_link_*` series): is the link to the relay up and authenticated, and
//! if not, why (`connecting`, `refused`, `unauthorized`), since when, after how many attempts.
//!
//! [`LinkHealth`] is the sans-IO state, fed `now` and the environment link's events
//! (`environment.rs`); [`EnvironmentHealth`] shares it between that task and the HTTP fronts
//! behind a lock held for a few field updates, and mirrors each change into the metrics.
//!
//! It must never decide anything about the link (when to dial is `environment.rs`'s), nor
//! read a clock itself.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::metrics::Metrics;
use crate::sync::lock;

/// Where the environment link stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkPhase {
    /// Not up: being dialled, or lost and about to be dialled again.
    Connecting,
    /// Up and authenticated by the relay.
    Up,
    /// The relay refused it for another reason than its key (busy, clocks apart, a replayed
    /// handshake), or the relay did not prove the pinned key.
    Refused,
    /// The relay does not list this server's key for its environment id.
    Unauthorized,
}

impl LinkPhase {
    /// The label of metrics and `/status`.
    pub fn as_str(self) -> &'static str {
        match self {
            LinkPhase::Connecting => "connecting",
            LinkPhase::Up => "up",
            LinkPhase::Refused => "refused",
            LinkPhase::Unauthorized => "unauthorized",
        }
    }
}

/// The state of one environment link (sans-IO).
#[derive(Debug, Clone)]
pub struct LinkHealth {
    phase: LinkPhase,
    /// Why it is not up (the last failure, in words), or empty while up.
    detail: String,
    /// When the current phase began.
    since: Instant,
    /// Dials since the link was last up (or since start).
    attempts: u64,
    /// Times the link came up.
    ups: u64,
}

impl LinkHealth {
    /// Before the first dial.
    pub fn new(now: Instant) -> LinkHealth {
        LinkHealth {
            phase: LinkPhase::Connecting,
            detail: "first dial in progress".into(),
            since: now,
            attempts: 0,
            ups: 0,
        }
    }

    fn enter(&mut self, phase: LinkPhase, detail: String, now: Instant) {
        if self.phase != phase {
            self.since = now;
        }
        self.phase = phase;
        self.detail = detail;
    }

    /// A dial begins.
    pub fn dialling(&mut self) {
        self.attempts += 1;
    }

    /// The relay could not be reached, or did not answer the link handshake.
    pub fn unreachable(&mut self, now: Instant, why: String) {
        self.enter(LinkPhase::Connecting, why, now);
    }

    /// The relay refused the link (`unauthorized`: its key is not listed for the id).
    pub fn refused(&mut self, now: Instant, unauthorized: bool, why: String) {
        let phase = if unauthorized {
            LinkPhase::Unauthorized
        } else {
            LinkPhase::Refused
        };
        self.enter(phase, why, now);
    }

    /// The link is up and authenticated.
    pub fn up(&mut self, now: Instant) {
        self.enter(LinkPhase::Up, String::new(), now);
        self.attempts = 0;
        self.ups += 1;
    }

    /// The link that was up ended.
    pub fn lost(&mut self, now: Instant, why: String) {
        self.enter(LinkPhase::Connecting, why, now);
    }

    /// The phase now.
    pub fn phase(&self) -> LinkPhase {
        self.phase
    }

    /// `Ok` while up; otherwise the phase and why, in one line.
    pub fn readiness(&self) -> Result<(), String> {
        match self.phase {
            LinkPhase::Up => Ok(()),
            phase => Err(format!(
                "environment link {}: {}",
                phase.as_str(),
                self.detail
            )),
        }
    }

    /// How long the current phase has lasted.
    pub fn for_how_long(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.since)
    }
}

/// The environment link's health, shared by the link's task and the HTTP fronts.
pub struct EnvironmentHealth {
    relay: String,
    env_id: String,
    state: Mutex<LinkHealth>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for EnvironmentHealth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnvironmentHealth")
            .field("relay", &self.relay)
            .field("env_id", &self.env_id)
            .field("state", &*lock(&self.state))
            .finish_non_exhaustive()
    }
}

impl EnvironmentHealth {
    /// The health of the link of environment `env_id` to `relay` (its base URL), mirrored
    /// into `metrics` (whose environment-link series this registers).
    pub fn new(relay: &str, env_id: &str, metrics: Arc<Metrics>) -> Arc<EnvironmentHealth> {
        metrics
            .environment_link()
            .set_state(LinkPhase::Connecting.as_str());
        Arc::new(EnvironmentHealth {
            relay: relay.to_string(),
            env_id: env_id.to_string(),
            state: Mutex::new(LinkHealth::new(Instant::now())),
            metrics,
        })
    }

    /// Apply `event` to the state now, and mirror the phase into the metrics.
    pub fn update(&self, event: impl FnOnce(&mut LinkHealth, Instant)) {
        let phase = {
            let mut st = lock(&self.state);
            event(&mut st, Instant::now());
            st.phase()
        };
        self.metrics.environment_link().set_state(phase.as_str());
    }

    /// What [`LinkHealth::readiness`] says now.
    pub fn readiness(&self) -> Result<(), String> {
        lock(&self.state).readiness()
    }

    /// The link's part of `/status`.
    pub fn status(&self) -> serde_json::Value {
        let st = lock(&self.state).clone();
        json!({
            "relay": self.relay,
            "environment": self.env_id,
            "state": st.phase.as_str(),
            "seconds_in_state": st.for_how_long(Instant::now()).as_secs(),
            "reason": (st.phase != LinkPhase::Up).then_some(st.detail),
            "attempts_since_up": st.attempts,
            "times_up": st.ups,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_follows_the_link() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut h = LinkHealth::new(t0);
        assert_eq!(
            h.readiness().unwrap_err(),
            "environment link connecting: first dial in progress"
        );
        h.dialling();
        h.unreachable(t0 + s, "cannot connect to ws://r:1: refused".into());
        assert_eq!(h.phase(), LinkPhase::Connecting);
        assert_eq!(
            h.for_how_long(t0 + 2 * s),
            2 * s,
            "still connecting since the start"
        );
        h.dialling();
        h.refused(t0 + 3 * s, true, "not listed".into());
        assert_eq!(
            h.readiness().unwrap_err(),
            "environment link unauthorized: not listed"
        );
        assert_eq!(h.for_how_long(t0 + 4 * s), s);
        h.dialling();
        h.refused(t0 + 5 * s, false, "busy".into());
        assert_eq!(h.phase(), LinkPhase::Refused);
        h.dialling();
        h.up(t0 + 6 * s);
        assert_eq!(h.readiness(), Ok(()));
        assert_eq!((h.attempts, h.ups), (0, 1));
        h.lost(t0 + 7 * s, "link lost: keepalive_timeout".into());
        assert_eq!(
            h.readiness().unwrap_err(),
            "environment link connecting: link lost: keepalive_timeout"
        );
    }

    #[test]
    fn the_shared_health_mirrors_its_phase_into_the_metrics() {
        let metrics = Arc::new(Metrics::new());
        let h = EnvironmentHealth::new("ws://r:1", "env", metrics.clone());
        let text = || metrics.render(&Default::default());
        assert!(text().contains("execrelay_environment_link_up 0"));
        h.update(|st, now| st.up(now));
        assert!(text().contains("execrelay_environment_link_up 1"));
        assert_eq!(h.status()["state"], "up");
        assert!(h.status()["reason"].is_null());
        h.update(|st, now| st.refused(now, true, "not listed".into()));
        assert!(text().contains("execrelay_environment_link_state{state=\"unauthorized\"} 1"));
        assert_eq!(h.status()["reason"], "not listed");
        assert_eq!(h.status()["environment"], "env");
    }
}
