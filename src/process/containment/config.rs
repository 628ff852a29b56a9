//! Containment settings and errors: which backend, the instance cgroup's name, the
//! per-session `pids.max`, and what can go wrong. Plain data, validated once at start. The
//! settings themselves are declared in `crate::config` (with every other setting); this file
//! turns them into a [`ContainmentConfig`].

use serde::Deserialize;

use crate::config::{check_cgroup_name, ServerConfig};
pub use crate::config::{BackendChoice, DEFAULT_CGROUP_NAME, MAX_CGROUP_NAME_BYTES};

/// The backend in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// cgroup v2.
    Cgroup2,
    /// cgroup v1 `freezer` (+ `pids`).
    Cgroup1,
    /// Process-tree tracking only.
    None,
}

/// Containment settings: the `ServerConfig` keys `containment_backend`, `cgroup_name` and
/// `session_pids_max` ([`ContainmentConfig::from_server`]).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ContainmentConfig {
    /// See [`BackendChoice`].
    pub backend: BackendChoice,
    /// Base name of this server's instance cgroup (`<name>-<pid>-<start time>-<n>`); servers that
    /// share a parent cgroup and a name sweep each other's leftovers after a crash.
    pub cgroup_name: String,
    /// `pids.max` of each session's cgroup: most processes (threads count) one session may
    /// have at once. `None` (default): no limit beyond the host's. Needs the `pids`
    /// controller: the v1 `pids` hierarchy, or on v2 a server cgroup that may enable `pids`
    /// for its children (the root cgroup, or one the server is not itself a member of: the
    /// kernel refuses controllers below a non-root cgroup that holds processes). Otherwise
    /// start fails naming the cause; a unit's `TasksMax=` bounds the whole server instead.
    pub session_pids_max: Option<u64>,
}

impl Default for ContainmentConfig {
    fn default() -> Self {
        ContainmentConfig {
            backend: BackendChoice::Auto,
            cgroup_name: DEFAULT_CGROUP_NAME.to_string(),
            session_pids_max: None,
        }
    }
}

impl ContainmentConfig {
    /// The containment settings of a server's configuration.
    pub fn from_server(c: &ServerConfig) -> ContainmentConfig {
        ContainmentConfig {
            backend: c.containment_backend,
            cgroup_name: c.cgroup_name.clone(),
            session_pids_max: c.session_pids_limit(),
        }
    }

    /// Check the settings.
    pub fn validate(&self) -> Result<(), ContainmentError> {
        check_cgroup_name(&self.cgroup_name).map_err(ContainmentError::Config)?;
        if self.session_pids_max == Some(0) {
            return Err(ContainmentError::Config(
                "session_pids_max must be at least 1".into(),
            ));
        }
        Ok(())
    }
}

/// Containment failures.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ContainmentError {
    /// Bad settings.
    #[error("containment configuration: {0}")]
    Config(String),
    /// The requested backend cannot work here.
    #[error("containment backend {backend} unavailable: {reason}")]
    Unavailable {
        /// What was asked for.
        backend: BackendChoice,
        /// Why each candidate failed.
        reason: String,
    },
    /// The scope was killed or removed: nothing may be placed in it any more.
    #[error("session scope is closed")]
    ScopeClosed,
    /// Processes are left in the scope.
    #[error("session scope still has processes")]
    NotEmpty,
    /// An OS call failed.
    #[error("containment: {0}")]
    Io(#[from] std::io::Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_validation_edges() {
        ContainmentConfig::default().validate().unwrap();
        let with = |name: &str| ContainmentConfig {
            cgroup_name: name.into(),
            ..ContainmentConfig::default()
        };
        with(&"a".repeat(MAX_CGROUP_NAME_BYTES)).validate().unwrap();
        assert!(with(&"a".repeat(MAX_CGROUP_NAME_BYTES + 1))
            .validate()
            .is_err());
        for bad in ["", ".", "..", "-x", "a/b", "a b", "é"] {
            assert!(with(bad).validate().is_err(), "{bad:?}");
        }
        with("execrelay-test_1.x").validate().unwrap();
        let pids = |n| ContainmentConfig {
            session_pids_max: n,
            ..ContainmentConfig::default()
        };
        assert!(pids(Some(0)).validate().is_err());
        pids(Some(1)).validate().unwrap();
    }

    #[test]
    fn backend_names() {
        assert_eq!(
            "auto".parse::<BackendChoice>().unwrap(),
            BackendChoice::Auto
        );
        assert_eq!(
            "cgroup2".parse::<BackendChoice>().unwrap(),
            BackendChoice::Cgroup2
        );
        assert_eq!(
            "cgroup1".parse::<BackendChoice>().unwrap(),
            BackendChoice::Cgroup1
        );
        assert_eq!(
            "none".parse::<BackendChoice>().unwrap(),
            BackendChoice::None
        );
        assert!("v2".parse::<BackendChoice>().is_err());
        let c: ContainmentConfig =
            toml::from_str("backend = \"cgroup1\"\nsession_pids_max = 64\n").unwrap();
        assert_eq!(c.backend, BackendChoice::Cgroup1);
        assert_eq!(c.session_pids_max, Some(64));
        assert!(toml::from_str::<ContainmentConfig>("backend = \"v2\"\n").is_err());
    }
}
