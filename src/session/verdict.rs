//! What the exec policy says about a start: the program a start names, resolved the way
//! `execvp` would with the child's `PATH` and working directory, checked against the policy
//! file in force (re-read if it changed).
//!
//! It reads the policy file and the directories of `PATH`; it never spawns anything.

use crate::policy::resolve::resolve_program;
use crate::policy::{Action, ExecPolicy, PolicyFile, Verdict};
use crate::process::spawn::SpawnSpec;

/// What `policy` says about `spec` (everything is allowed without a policy). A `PATH` too
/// long to look the program up in ([`MAX_PATH_LOOKUP_ENTRIES`]) is denied: the policy cannot
/// be checked against what the child would run (fail closed).
///
/// [`MAX_PATH_LOOKUP_ENTRIES`]: crate::policy::resolve::MAX_PATH_LOOKUP_ENTRIES
pub(super) fn exec_verdict(policy: Option<&PolicyFile>, spec: &SpawnSpec) -> Verdict {
    let Some(file) = policy else {
        return ExecPolicy::allow_all().decide("", None);
    };
    let policy = file.current();
    let program = spec.argv.first().map(String::as_str).unwrap_or("");
    let path_var = match spec.env.iter().rev().find(|(k, _)| k == "PATH") {
        Some((_, v)) => v.as_ref().map(std::ffi::OsString::from),
        None if spec.inherit_env => std::env::var_os("PATH"),
        None => None,
    };
    let cwd = match &spec.cwd {
        Some(c) => std::path::PathBuf::from(c),
        None => std::env::current_dir().unwrap_or_else(|_| "/".into()),
    };
    match resolve_program(program, &cwd, path_var.as_deref()) {
        Ok(resolved) => policy.decide(program, resolved.as_deref()),
        Err(e) => Verdict {
            action: Action::Deny,
            rule: e.to_string(),
        },
    }
}
