//! [`PolicyFile`]: the policy of `execrelay serve --exec-policy FILE`, re-read when the file
//! changes.
//!
//! The file's identity and times (device, inode, size, mtime, ctime) are compared on every
//! look ([`PolicyFile::current`], once per `process/start`), the way the authorized keys are:
//! deterministic (no watcher thread, no timer), and an edit applies to the next start. A file
//! that cannot be read or parsed at start is a fatal error naming what is wrong; once the
//! server runs, a bad edit (or a deleted file) **keeps the previous policy** and logs why,
//! once per change, until the file is fixed. A policy that failed open would be worse than
//! one a minute old.

use std::fs;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::{ExecPolicy, PolicyError};
use crate::config::MAX_POLICY_FILE_BYTES;
use crate::sync::lock;

/// What identifies one version of the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

fn stamp(path: &Path) -> Option<Stamp> {
    let m = fs::metadata(path).ok()?;
    Some(Stamp {
        dev: m.dev(),
        ino: m.ino(),
        len: m.len(),
        mtime: (m.mtime(), m.mtime_nsec()),
        ctime: (m.ctime(), m.ctime_nsec()),
    })
}

struct State {
    /// The version last looked at (read, or failed to read).
    seen: Option<Stamp>,
    /// The policy in force: the last version that parsed.
    policy: Arc<ExecPolicy>,
}

/// The exec policy of one server, following its file.
pub struct PolicyFile {
    path: PathBuf,
    state: Mutex<State>,
}

impl std::fmt::Debug for PolicyFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyFile")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl PolicyFile {
    /// Load at start: any problem is an error (the server must not start with a policy it
    /// cannot read).
    pub fn load(path: &Path) -> Result<PolicyFile, PolicyError> {
        let seen = stamp(path);
        let policy = read_policy(path)?;
        Ok(PolicyFile {
            path: path.to_path_buf(),
            state: Mutex::new(State {
                seen,
                policy: Arc::new(policy),
            }),
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The policy in force now: re-read first if the file changed since the last look. A
    /// version that does not parse leaves the previous policy in force (logged once).
    pub fn current(&self) -> Arc<ExecPolicy> {
        let now = stamp(&self.path);
        let mut st = lock(&self.state);
        if now != st.seen {
            st.seen = now;
            match read_policy(&self.path) {
                Ok(p) => {
                    tracing::info!(path = %self.path.display(), rules = p.rule_count(), "exec policy reloaded");
                    st.policy = Arc::new(p);
                }
                Err(e) => {
                    tracing::error!(error = %e, "exec policy file unusable: keeping the previous policy until it is fixed");
                }
            }
        }
        st.policy.clone()
    }
}

/// Read and parse, at most [`MAX_POLICY_FILE_BYTES`].
fn read_policy(path: &Path) -> Result<ExecPolicy, PolicyError> {
    let origin = path.display().to_string();
    let file = fs::File::open(path).map_err(|e| PolicyError(format!("{origin}: {e}")))?;
    let mut text = String::new();
    file.take(MAX_POLICY_FILE_BYTES as u64 + 1)
        .read_to_string(&mut text)
        .map_err(|e| PolicyError(format!("{origin}: {e}")))?;
    if text.len() > MAX_POLICY_FILE_BYTES {
        return Err(PolicyError(format!(
            "{origin}: larger than {MAX_POLICY_FILE_BYTES} bytes"
        )));
    }
    ExecPolicy::parse(&text, &origin)
}

#[cfg(test)]
mod tests {
    use super::super::Action;
    use super::*;

    /// Replace the file's contents the way editors do (a new file renamed over the old), so
    /// the change is seen whatever the clock's granularity.
    fn replace(path: &Path, text: &str) {
        let tmp = path.with_extension("new");
        fs::write(&tmp, text).unwrap();
        fs::rename(&tmp, path).unwrap();
    }

    fn action(f: &PolicyFile, program: &str) -> Action {
        f.current().decide(program, None).action
    }

    #[test]
    fn edits_apply_and_bad_edits_keep_the_previous_policy() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("policy.toml");
        replace(&path, "default = \"allow\"\n");
        let f = PolicyFile::load(&path).unwrap();
        assert_eq!(action(&f, "rm"), Action::Allow);

        replace(
            &path,
            "default = \"allow\"\n[[rule]]\nprogram = \"rm\"\naction = \"deny\"\n",
        );
        assert_eq!(action(&f, "rm"), Action::Deny, "an edit applies at once");

        replace(&path, "default = \"allow\"\n[[rule]]\nprogram = \"[\"\n");
        assert_eq!(
            action(&f, "rm"),
            Action::Deny,
            "a bad edit keeps the old policy"
        );
        assert_eq!(action(&f, "rm"), Action::Deny);

        fs::remove_file(&path).unwrap();
        assert_eq!(action(&f, "rm"), Action::Deny, "so does a deleted file");

        replace(&path, "default = \"deny\"\n");
        assert_eq!(action(&f, "ls"), Action::Deny, "the fixed file applies");
    }

    #[test]
    fn a_bad_or_missing_file_at_start_is_an_error_naming_it() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("p.toml");
        let e = PolicyFile::load(&path).unwrap_err();
        assert!(e.0.contains("p.toml"), "{e}");
        fs::write(&path, "default = 3\n").unwrap();
        let e = PolicyFile::load(&path).unwrap_err();
        assert!(e.0.contains("p.toml"), "{e}");
    }

    #[test]
    fn the_file_size_is_bounded_at_its_edge() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("p.toml");
        let head = "default = \"allow\"\n";
        let pad = MAX_POLICY_FILE_BYTES - head.len();
        fs::write(&path, format!("{head}{}", " ".repeat(pad))).unwrap();
        assert!(PolicyFile::load(&path).is_ok(), "exactly the limit");
        fs::write(&path, format!("{head}{}", " ".repeat(pad + 1))).unwrap();
        let e = PolicyFile::load(&path).unwrap_err();
        assert!(e.0.contains("larger than"), "{e}");
    }
}
