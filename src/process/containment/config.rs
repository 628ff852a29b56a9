//! Containment settings and errors: which backend, the instance cgroup's name, the
//! per-session `pids.max`, and what can go wrong. Plain data, validated once at start.

use serde::Deserialize;

/// Longest `cgroup_name`, in bytes (a directory name, with `-<pid>-<start>` appended).
pub const MAX_CGROUP_NAME_BYTES: usize = 64;
/// Default `cgroup_name`.
pub const DEFAULT_CGROUP_NAME: &str = "execrelay";

/// Which containment backend to use (`containment_backend` in the configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendChoice {
    /// The first of `cgroup2`, `cgroup1`, `none` that works here.
    #[default]
    Auto,
    /// cgroup v2 or fail.
    Cgroup2,
    /// cgroup v1 `freezer` (and `pids`) or fail.
    Cgroup1,
    /// No cgroups: process-tree tracking only.
    None,
}

impl std::str::FromStr for BackendChoice {
    type Err = ContainmentError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "auto" => BackendChoice::Auto,
            "cgroup2" => BackendChoice::Cgroup2,
            "cgroup1" => BackendChoice::Cgroup1,
            "none" => BackendChoice::None,
            _ => {
                return Err(ContainmentError::Config(format!(
                    "unknown containment backend {s:?} (auto, cgroup2, cgroup1, none)"
                )))
            }
        })
    }
}

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

/// Containment settings (to become `ServerConfig` keys: `containment_backend`,
/// `cgroup_name`, `session_pids_max`).
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
    /// Check the settings.
    pub fn validate(&self) -> Result<(), ContainmentError> {
        let n = &self.cgroup_name;
        let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
        if n.is_empty()
            || n.len() > MAX_CGROUP_NAME_BYTES
            || !n.chars().all(ok_char)
            || n.starts_with('.')
            || n.starts_with('-')
        {
            return Err(ContainmentError::Config(format!(
                "cgroup_name must be 1 to {MAX_CGROUP_NAME_BYTES} bytes of [A-Za-z0-9_.-], \
                 not starting with '.' or '-'"
            )));
        }
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
    #[error("containment backend {backend:?} unavailable: {reason}")]
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
