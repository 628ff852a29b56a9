//! The relay's environments file (`secure-transport.md` §6.2): which environment ids may hold
//! an environment link, and the static key each must authenticate with.
//!
//! Format: one line per environment, `ID execrelay-x25519 <base64> [comment]`; `#` starts a
//! comment line; blank lines are skipped. An id is what the environment dials
//! (`/v1/env/ID`), so it must be a valid path id: 1 to [`MAX_ENVIRONMENT_ID_BYTES`]
//! characters of `A–Z a–z 0–9 - . _ ~`. An id listed twice is an error (which key would
//! count?); one key listed for several ids is allowed (the id is bound into the handshake).
//! Every error names `FILE:LINE`.
//!
//! [`EnvironmentsFile`] re-reads the file when it changes ([`EnvironmentsFile::poll`]) and
//! says which ids lost their key (removed, or listed with another key), so the relay can close
//! their links at once. A file that becomes unreadable or malformed admits no new environment
//! link until it is fixed (fail closed) and says so in the log; links already up are kept (a
//! typo must not take every environment offline), and the next good version is compared with
//! the last good one.
//!
//! It never logs key material (only fingerprints) and never reads a clock.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::{
    fingerprint, parse_public, read_bounded, stamp, KeyError, Stamp, KEY_BYTES, PUBLIC_KEY_TAG,
};

/// Longest environment id, 128 bytes: an id must fit in the relay's route `/v1/env/ID`, and
/// the HTTP front captures route ids of at most this many bytes (its `MAX_ROUTE_ID_BYTES` is
/// this constant).
pub const MAX_ENVIRONMENT_ID_BYTES: usize = 128;

/// Whether `id` is a valid environment id (the route's id rule).
pub fn valid_environment_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_ENVIRONMENT_ID_BYTES
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~'))
}

/// The parsed environments file: environment id → its static public key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Environments {
    keys: HashMap<String, [u8; KEY_BYTES]>,
}

impl Environments {
    /// The key listed for `id`.
    pub fn key(&self, id: &str) -> Option<&[u8; KEY_BYTES]> {
        self.keys.get(id)
    }

    /// Whether `key` is the one listed for `id` (constant-time comparison of the keys).
    pub fn is_listed(&self, id: &str, key: &[u8]) -> bool {
        self.keys
            .get(id)
            .is_some_and(|k| bool::from(subtle::ConstantTimeEq::ct_eq(&k[..], key)))
    }

    /// Environments listed.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether none is listed.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The listed ids, in no particular order.
    pub fn ids(&self) -> impl Iterator<Item = &str> {
        self.keys.keys().map(String::as_str)
    }

    /// The ids of `self` that `newer` no longer lists with the same key (removed, or listed
    /// with another key), sorted: their links must close.
    pub fn revoked_in(&self, newer: &Environments) -> Vec<String> {
        let mut gone: Vec<String> = self
            .keys
            .iter()
            .filter(|(id, key)| newer.keys.get(*id) != Some(key))
            .map(|(id, _)| id.clone())
            .collect();
        gone.sort_unstable();
        gone
    }
}

/// Parse the text of an environments file; `name` (the path) prefixes every error, with the
/// line number: `envs:3: …`.
pub fn parse_environments(text: &str, name: &str) -> Result<Environments, KeyError> {
    let mut keys = HashMap::new();
    let mut first_line: HashMap<String, usize> = HashMap::new();
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        let err = |why: String| KeyError::Format {
            path: format!("{name}:{n}"),
            why,
        };
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut parts = line.split_whitespace();
        let id = parts.next().unwrap_or_default();
        if !valid_environment_id(id) {
            let shown: String = id.chars().take(MAX_ENVIRONMENT_ID_BYTES + 1).collect();
            return Err(err(format!(
                "environment id {shown:?} is not valid: an id is 1 to {MAX_ENVIRONMENT_ID_BYTES} \
                 characters of A-Z a-z 0-9 - . _ ~ (expected `ID {PUBLIC_KEY_TAG} <base64> [comment]`)"
            )));
        }
        match parts.next() {
            Some(tag) if tag == PUBLIC_KEY_TAG => {}
            Some(_) | None => {
                return Err(err(format!(
                    "expected `{PUBLIC_KEY_TAG} <base64>` after the environment id {id:?} \
                     (a line is `ID {PUBLIC_KEY_TAG} <base64> [comment]`)"
                )))
            }
        }
        let b64 = parts.next().ok_or_else(|| {
            err(format!(
                "missing the key after `{PUBLIC_KEY_TAG}` for environment {id:?}"
            ))
        })?;
        let key = parse_public(b64).map_err(|why| err(format!("environment {id:?}: {why}")))?;
        if let Some(first) = first_line.get(id) {
            return Err(err(format!(
                "environment {id:?} is listed twice (first on line {first}); list each id once"
            )));
        }
        first_line.insert(id.to_string(), n);
        keys.insert(id.to_string(), key);
    }
    Ok(Environments { keys })
}

/// What a look at the file found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reload {
    /// The file changed and was read: `revoked` lists the ids whose links must close (sorted).
    Changed {
        /// Environments now listed.
        listed: usize,
        /// Ids removed or listed with another key.
        revoked: Vec<String>,
    },
    /// The file changed and cannot be used: no new environment link is admitted until it is
    /// fixed; links up are kept.
    Failed {
        /// Why (names the file and line).
        error: String,
    },
}

/// The environments file, re-read when it changes.
#[derive(Debug)]
pub struct EnvironmentsFile {
    path: PathBuf,
    stamp: Option<Stamp>,
    /// The last version that parsed.
    good: Environments,
    /// Why the current version is unusable, if it is.
    broken: Option<String>,
}

impl EnvironmentsFile {
    /// Load at start: errors are fatal here, so a typo is caught before serving.
    pub fn load(path: &Path) -> Result<EnvironmentsFile, KeyError> {
        let stamp = stamp(path);
        let text = read_bounded(path)?;
        let good = parse_environments(&text, &path.display().to_string())?;
        Ok(EnvironmentsFile {
            path: path.to_path_buf(),
            stamp,
            good,
            broken: None,
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Re-read the file if it changed since the last look (size, modification time or inode;
    /// a missing file counts as changed every time, so it is picked up once it is back).
    /// `None` when nothing changed.
    pub fn poll(&mut self) -> Option<Reload> {
        let now = stamp(&self.path);
        if now == self.stamp && now.is_some() {
            return None;
        }
        let was_broken = self.broken.clone();
        self.stamp = now;
        let read = read_bounded(&self.path)
            .and_then(|text| parse_environments(&text, &self.path.display().to_string()));
        match read {
            Ok(newer) => {
                let revoked = self.good.revoked_in(&newer);
                let changed = newer != self.good || was_broken.is_some();
                self.good = newer;
                self.broken = None;
                changed.then(|| Reload::Changed {
                    listed: self.good.len(),
                    revoked,
                })
            }
            Err(e) => {
                let error = e.to_string();
                // Said once per distinct error, not at every look at a missing file.
                let new_error = was_broken.as_deref() != Some(error.as_str());
                self.broken = Some(error.clone());
                new_error.then_some(Reload::Failed { error })
            }
        }
    }

    /// Whether an environment link for `id` authenticated with `key` may be admitted now:
    /// the key is the one listed for `id`, and the file is usable. Does not look at the file
    /// (call [`poll`](Self::poll) first).
    pub fn admits(&self, id: &str, key: &[u8]) -> Result<(), NotAdmitted> {
        if let Some(error) = &self.broken {
            return Err(NotAdmitted::FileUnusable(error.clone()));
        }
        match self.good.key(id) {
            None => Err(NotAdmitted::UnknownId),
            Some(_) if !self.good.is_listed(id, key) => Err(NotAdmitted::WrongKey {
                listed: fingerprint(self.good.key(id).map_or(&[][..], |k| &k[..])),
                presented: fingerprint(key),
            }),
            Some(_) => Ok(()),
        }
    }

    /// Whether `id` is listed in the last usable version (a cheap check before any
    /// cryptography: an unlisted id is refused without a Diffie-Hellman).
    pub fn lists(&self, id: &str) -> bool {
        self.broken.is_none() && self.good.key(id).is_some()
    }

    /// The last usable version.
    pub fn current(&self) -> &Environments {
        &self.good
    }

    /// Why the file is unusable now, if it is.
    pub fn broken(&self) -> Option<&str> {
        self.broken.as_deref()
    }
}

/// Why an environment link is not admitted (for the relay's log; the peer only learns
/// `unauthorized`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NotAdmitted {
    /// The id is not in the environments file.
    #[error("the environment id is not listed in the environments file")]
    UnknownId,
    /// The id is listed with another key.
    #[error(
        "the environment authenticated with key {presented}, but the environments file lists \
         {listed} for this id"
    )]
    WrongKey {
        /// Fingerprint of the listed key.
        listed: String,
        /// Fingerprint of the key the environment proved.
        presented: String,
    },
    /// The file cannot be used; no environment is admitted until it is fixed.
    #[error("the environments file is unusable, so no environment is admitted: {0}")]
    FileUnusable(String),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{public_line, Keypair};
    use std::fs;

    fn line(id: &str, kp: &Keypair, comment: &str) -> String {
        format!("{id} {}", public_line(&kp.public, comment))
    }

    #[test]
    fn parses_ids_keys_comments_and_blank_lines() {
        let (a, b) = (Keypair::generate().unwrap(), Keypair::generate().unwrap());
        let text = format!(
            "# fleet\n\n{}\n  {}  \n{}\n",
            line("sandbox-1", &a, "first box"),
            line("sb_2.x~", &b, ""),
            line("same-key", &a, "a key may serve two ids"),
        );
        let envs = parse_environments(&text, "envs").unwrap();
        assert_eq!(envs.len(), 3);
        assert_eq!(envs.key("sandbox-1"), Some(&a.public));
        assert_eq!(envs.key("sb_2.x~"), Some(&b.public));
        assert!(envs.is_listed("same-key", &a.public));
        assert!(!envs.is_listed("sandbox-1", &b.public));
        assert!(!envs.is_listed("nope", &a.public));
        assert!(parse_environments("# only comments\n\n", "e")
            .unwrap()
            .is_empty());
    }

    #[test]
    fn every_error_names_the_file_and_line() {
        let a = Keypair::generate().unwrap();
        let good = line("ok", &a, "");
        let cases = [
            (
                format!("{good}\nbad/id {}\n", public_line(&a.public, "")),
                "envs:2",
                "not valid",
            ),
            (
                format!("{good}\nlonely\n"),
                "envs:2",
                "expected `execrelay-x25519",
            ),
            (
                format!("{}\n", public_line(&a.public, "")),
                "envs:1",
                "expected",
            ),
            (
                "# c\nid2 ssh-ed25519 AAAA\n".to_string(),
                "envs:2",
                "expected `execrelay-x25519",
            ),
            (
                "id3 execrelay-x25519\n".to_string(),
                "envs:1",
                "missing the key",
            ),
            ("id4 execrelay-x25519 !!!\n".to_string(), "envs:1", "base64"),
            (
                format!("{good}\n\n{good}\n"),
                "envs:3",
                "listed twice (first on line 1)",
            ),
            (
                format!(
                    "{} execrelay-x25519 AAAA\n",
                    "x".repeat(MAX_ENVIRONMENT_ID_BYTES + 1)
                ),
                "envs:1",
                "1 to 128",
            ),
        ];
        for (text, at, why) in cases {
            let err = parse_environments(&text, "envs").unwrap_err().to_string();
            assert!(err.starts_with(&format!("{at}: ")), "{err}");
            assert!(err.contains(why), "{err} (wanted {why:?})");
        }
        // The longest id is fine.
        let longest = "x".repeat(MAX_ENVIRONMENT_ID_BYTES);
        assert!(parse_environments(&line(&longest, &a, ""), "envs").is_ok());
    }

    #[test]
    fn revoked_lists_removed_and_rekeyed_ids() {
        let (a, b, c) = (
            Keypair::generate().unwrap(),
            Keypair::generate().unwrap(),
            Keypair::generate().unwrap(),
        );
        let old = parse_environments(
            &format!(
                "{}\n{}\n{}\n",
                line("x", &a, ""),
                line("y", &b, ""),
                line("z", &c, "")
            ),
            "e",
        )
        .unwrap();
        let new = parse_environments(
            &format!(
                "{}\n{}\n{}\n",
                line("x", &a, "new comment"),
                line("y", &c, ""),
                line("w", &a, "")
            ),
            "e",
        )
        .unwrap();
        assert_eq!(old.revoked_in(&new), vec!["y".to_string(), "z".to_string()]);
        assert!(new.revoked_in(&new).is_empty());
    }

    #[test]
    fn the_file_is_followed_and_a_broken_version_fails_closed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("envs");
        let (a, b) = (Keypair::generate().unwrap(), Keypair::generate().unwrap());
        fs::write(
            &path,
            format!("{}\n{}\n", line("x", &a, ""), line("y", &b, "")),
        )
        .unwrap();
        let mut file = EnvironmentsFile::load(&path).unwrap();
        assert_eq!(file.poll(), None, "unchanged");
        assert_eq!(file.admits("x", &a.public), Ok(()));
        assert_eq!(file.admits("nope", &a.public), Err(NotAdmitted::UnknownId));
        assert!(matches!(
            file.admits("x", &b.public),
            Err(NotAdmitted::WrongKey { .. })
        ));
        assert!(file.lists("y") && !file.lists("nope"));

        // Remove y: rewritten as editors do (a new inode).
        let tmp = dir.path().join("envs.new");
        fs::write(&tmp, format!("{}\n", line("x", &a, ""))).unwrap();
        fs::rename(&tmp, &path).unwrap();
        assert_eq!(
            file.poll(),
            Some(Reload::Changed {
                listed: 1,
                revoked: vec!["y".into()]
            })
        );
        assert_eq!(file.admits("y", &b.public), Err(NotAdmitted::UnknownId));
        assert_eq!(file.poll(), None);

        // A typo: nothing new is admitted, said once.
        fs::write(&path, "x execrelay-x25519 garbage\n").unwrap();
        match file.poll() {
            Some(Reload::Failed { error }) => assert!(error.contains(":1:"), "{error}"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            file.admits("x", &a.public),
            Err(NotAdmitted::FileUnusable(_))
        ));
        assert!(!file.lists("x"));
        assert_eq!(file.current().len(), 1, "the last good version is kept");

        // Missing: still failed, not repeated while the error is the same.
        fs::remove_file(&path).unwrap();
        assert!(matches!(file.poll(), Some(Reload::Failed { .. })));
        assert_eq!(file.poll(), None);

        // Fixed: compared with the last good version.
        fs::write(&path, format!("{}\n", line("y", &b, ""))).unwrap();
        assert_eq!(
            file.poll(),
            Some(Reload::Changed {
                listed: 1,
                revoked: vec!["x".into()]
            })
        );
        assert_eq!(file.admits("y", &b.public), Ok(()));
    }

    #[test]
    fn the_id_rule_admits_unreserved_characters_only() {
        assert_eq!(MAX_ENVIRONMENT_ID_BYTES, 128);
        for good in ["a", "A-z_0.9~"] {
            assert!(valid_environment_id(good), "{good}");
        }
        for bad in ["", "a/b", "a b", "é", "a%20"] {
            assert!(!valid_environment_id(bad), "{bad}");
        }
    }
}
