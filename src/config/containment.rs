//! The containment settings that are words, not numbers: the backend to use and the name of
//! the server's cgroup, each with its parsing and its check. `process/containment/` acts on
//! them; this module only reads and checks them.

use serde::Deserialize;

use super::MAX_CGROUP_NAME_BYTES;

/// Which process-containment backend to use (`containment_backend`; see SECURITY.md,
/// "Process containment"). Declared here, with the other settings; `process/containment/`
/// implements it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendChoice {
    /// The first of `cgroup2`, `cgroup1`, `none` that works here.
    #[default]
    Auto,
    /// cgroup v2 or fail at start.
    Cgroup2,
    /// cgroup v1 `freezer` (and `pids`) or fail at start.
    Cgroup1,
    /// No cgroups: process-tree tracking only.
    None,
}

impl BackendChoice {
    /// The setting's spelling.
    pub const fn as_str(self) -> &'static str {
        match self {
            BackendChoice::Auto => "auto",
            BackendChoice::Cgroup2 => "cgroup2",
            BackendChoice::Cgroup1 => "cgroup1",
            BackendChoice::None => "none",
        }
    }
}

impl std::fmt::Display for BackendChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for BackendChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "auto" => BackendChoice::Auto,
            "cgroup2" => BackendChoice::Cgroup2,
            "cgroup1" => BackendChoice::Cgroup1,
            "none" => BackendChoice::None,
            _ => {
                return Err(format!(
                    "unknown containment backend {s:?} (auto, cgroup2, cgroup1, none)"
                ))
            }
        })
    }
}

/// Check a `cgroup_name`: 1 to [`MAX_CGROUP_NAME_BYTES`] bytes of `[A-Za-z0-9_.-]`, not
/// starting with `.` or `-` (it becomes a directory name next to other cgroups).
pub fn check_cgroup_name(n: &str) -> Result<(), String> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if n.is_empty()
        || n.len() > MAX_CGROUP_NAME_BYTES
        || !n.chars().all(ok_char)
        || n.starts_with('.')
        || n.starts_with('-')
    {
        return Err(format!(
            "cgroup_name must be 1 to {MAX_CGROUP_NAME_BYTES} bytes of [A-Za-z0-9_.-], \
             not starting with '.' or '-'"
        ));
    }
    Ok(())
}
