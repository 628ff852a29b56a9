//! Faults a debug build can be told to inject (layer 0), so that tests can break a wake-up on
//! purpose and check that the stall watchdog sees it. `EXECRELAY_DEBUG_FAULTS` names them,
//! comma-separated, read once. In a release build nothing is read and no fault exists.
//!
//! It owns the switch only; each fault lives where it bites (named by [`Fault`]). It must
//! never import another module of the crate.

use std::sync::OnceLock;

/// The environment variable that names the active faults (debug builds only).
pub const FAULTS_ENV: &str = "EXECRELAY_DEBUG_FAULTS";

/// A fault a debug build can inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// `lose-ready-push`: a connection's ready queue drops every push of a process (a lost
    /// wake-up between the output pump and the connection writer).
    LoseReadyPush,
    /// `release-past-limit`: the event log releases written events only past its retention
    /// limit, not at it (the dead end that stopped streams for good).
    ReleasePastLimit,
    /// `late-pump`: a process's output pumps first look at their streams only once the
    /// child has exited and its drain deadline has passed (what an overloaded runtime does
    /// to a pump it polls for the first time seconds after the child ended).
    LatePump,
}

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::LoseReadyPush => "lose-ready-push",
            Fault::ReleasePastLimit => "release-past-limit",
            Fault::LatePump => "late-pump",
        }
    }
}

/// Whether `fault` is active: always false in a release build.
pub fn active(fault: Fault) -> bool {
    if !cfg!(debug_assertions) {
        return false;
    }
    static NAMES: OnceLock<Vec<String>> = OnceLock::new();
    NAMES
        .get_or_init(|| {
            std::env::var(FAULTS_ENV)
                .unwrap_or_default()
                .split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect()
        })
        .iter()
        .any(|n| n == fault.name())
}
