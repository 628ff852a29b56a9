//! Static X25519 keys: generation, the on-disk formats of `secure-transport.md` §2, the
//! authorized-keys file (re-read when it changes) and the relay's environments file (§6.2,
//! [`environments`]).
//!
//! Private key file: the 32-byte key in standard base64 on one line, mode 0600 (a file readable
//! by group or others is refused). Public key: one line `execrelay-x25519 <base64> <comment>`.
//! This module never logs key material; [`fingerprint`] is what logs show.
//!
//! It lives in the protocol crate because the exec server, the client and the relay all read key
//! files (the main crate re-exports it as `execrelay::noise::keys`). It must never import a
//! handshake (the handshakes build on it).

pub mod environments;

use std::collections::HashSet;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use base64::Engine;
use sha2::Digest;
use snow::params::DHChoice;
use snow::resolvers::{CryptoResolver, DefaultResolver};

/// Length of an X25519 key.
pub const KEY_BYTES: usize = 32;
/// The public key line prefix.
pub const PUBLIC_KEY_TAG: &str = "execrelay-x25519";
/// Largest key or authorized-keys file read (a key file is ~50 bytes; an authorized-keys
/// file of 10,000 keys is ~1 MiB).
pub const MAX_KEY_FILE_BYTES: u64 = 4 * 1024 * 1024;

/// A key that cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A private key readable by others.
    #[error("{0}: private key permissions are too open (mode {1:o}); run `chmod 600 {0}`")]
    Permissions(PathBuf, u32),
    /// The public key could not be derived (the X25519 implementation failed).
    #[error("cannot derive a key: {why}")]
    Derive {
        /// What failed.
        why: String,
    },
    /// Not the documented format.
    #[error("{path}: {why}")]
    Format {
        /// The file (or argument).
        path: String,
        /// What is wrong.
        why: String,
    },
}

/// A static key pair.
#[derive(Clone)]
pub struct Keypair {
    /// Private key (never logged).
    pub private: [u8; KEY_BYTES],
    /// Public key.
    pub public: [u8; KEY_BYTES],
}

impl std::fmt::Debug for Keypair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Keypair(public {})", fingerprint(&self.public))
    }
}

/// A short, non-secret name for a public key in logs and messages.
pub fn fingerprint(public: &[u8]) -> String {
    let d = sha2::Sha256::digest(public);
    let hex: String = d.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("SHA256:{hex}")
}

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

impl Keypair {
    /// Generate a key pair from the OS generator.
    pub fn generate() -> Result<Keypair, KeyError> {
        let mut rng = DefaultResolver
            .resolve_rng()
            .ok_or_else(|| KeyError::Derive {
                why: "no random number generator".into(),
            })?;
        let mut private = [0u8; KEY_BYTES];
        rng.try_fill_bytes(&mut private)
            .map_err(|e| KeyError::Derive { why: e.to_string() })?;
        Keypair::from_private(private)
    }

    /// Derive the public key of a private key. An error (never a key of zeros) when the
    /// X25519 implementation is unavailable.
    pub fn from_private(private: [u8; KEY_BYTES]) -> Result<Keypair, KeyError> {
        let public = x25519_public(&private)?;
        Ok(Keypair { private, public })
    }

    /// Write `path` (mode 0600) and `path.pub`. Refuses to overwrite.
    pub fn write(&self, path: &Path, comment: &str) -> Result<(), KeyError> {
        let io = |source| KeyError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(io)?;
        writeln!(f, "{}", b64().encode(self.private)).map_err(io)?;
        let pub_path = pub_path(path);
        let mut p = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&pub_path)
            .map_err(|source| KeyError::Io {
                path: pub_path.clone(),
                source,
            })?;
        writeln!(p, "{}", public_line(&self.public, comment)).map_err(|source| KeyError::Io {
            path: pub_path,
            source,
        })?;
        Ok(())
    }

    /// Load a private key file, refusing one readable by group or others. A public key line
    /// given instead is named as such (before its mode is looked at: a `.pub` is readable by
    /// all, and `chmod 600` would not help).
    pub fn load(path: &Path) -> Result<Keypair, KeyError> {
        let meta = fs::metadata(path).map_err(|source| KeyError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        if meta.is_file() && meta.len() <= MAX_KEY_FILE_BYTES {
            if let Ok(text) = fs::read_to_string(path) {
                if text.trim_start().starts_with(PUBLIC_KEY_TAG) {
                    return Err(KeyError::Format {
                        path: path.display().to_string(),
                        why: "this is a public key (execrelay-x25519 …), and a private key is needed here: give the file without .pub".into(),
                    });
                }
            }
        }
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(KeyError::Permissions(path.to_path_buf(), mode));
        }
        let text = read_bounded(path)?;
        let raw = b64().decode(text.trim()).map_err(|_| KeyError::Format {
            path: path.display().to_string(),
            why:
                "not a private key (expected one line of base64, as written by `execrelay keygen`)"
                    .into(),
        })?;
        let private: [u8; KEY_BYTES] = raw.try_into().map_err(|_| KeyError::Format {
            path: path.display().to_string(),
            why: "a private key must be 32 bytes".into(),
        })?;
        Keypair::from_private(private)
    }

    /// A key file's key as [`KeyFile`]: the private key (and its public key) or a public key
    /// line, whichever the file holds (`execrelay keygen -l -f FILE`).
    pub fn read_any(path: &Path) -> Result<KeyFile, KeyError> {
        let text = read_bounded(path)?;
        let line = text
            .lines()
            .find(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
            .unwrap_or("")
            .trim();
        if line.starts_with(PUBLIC_KEY_TAG) {
            let public = parse_public(line).map_err(|why| KeyError::Format {
                path: path.display().to_string(),
                why,
            })?;
            let comment = line
                .split_whitespace()
                .skip(2)
                .collect::<Vec<_>>()
                .join(" ");
            return Ok(KeyFile::Public { public, comment });
        }
        Keypair::load(path).map(KeyFile::Private)
    }
}

/// What a key file holds.
#[derive(Debug)]
pub enum KeyFile {
    /// A private key (mode 0600), with its public key derived.
    Private(Keypair),
    /// A public key line, with its comment.
    Public {
        /// The key.
        public: [u8; KEY_BYTES],
        /// The comment after it (may be empty).
        comment: String,
    },
}

impl KeyFile {
    /// The public key, whichever the file holds.
    pub fn public(&self) -> [u8; KEY_BYTES] {
        match self {
            KeyFile::Private(k) => k.public,
            KeyFile::Public { public, .. } => *public,
        }
    }
}

/// X25519 of the base point, with the implementation `snow` itself uses for the handshake.
fn x25519_public(private: &[u8; KEY_BYTES]) -> Result<[u8; KEY_BYTES], KeyError> {
    let mut dh = DefaultResolver
        .resolve_dh(&DHChoice::Curve25519)
        .ok_or_else(|| KeyError::Derive {
            why: "X25519 is not available".into(),
        })?;
    dh.set(private);
    <[u8; KEY_BYTES]>::try_from(dh.pubkey()).map_err(|_| KeyError::Derive {
        why: format!("X25519 gave a public key of {} bytes", dh.pubkey().len()),
    })
}

/// `NAME.pub`.
pub fn pub_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".pub");
    PathBuf::from(s)
}

/// The public key line.
pub fn public_line(public: &[u8; KEY_BYTES], comment: &str) -> String {
    let comment: String = comment.chars().filter(|c| !c.is_control()).collect();
    format!("{PUBLIC_KEY_TAG} {} {comment}", b64().encode(public))
        .trim_end()
        .to_string()
}

/// Parse `execrelay-x25519 <base64> [comment]` (or a bare base64 key).
pub fn parse_public(line: &str) -> Result<[u8; KEY_BYTES], String> {
    let mut parts = line.split_whitespace();
    let first = parts.next().ok_or("empty public key")?;
    let b = if first == PUBLIC_KEY_TAG {
        parts.next().ok_or("missing key after execrelay-x25519")?
    } else {
        first
    };
    let raw = b64()
        .decode(b)
        .map_err(|_| "public key is not valid base64".to_string())?;
    raw.try_into()
        .map_err(|_| "a public key must be 32 bytes".to_string())
}

/// `--server-key KEY_OR_FILE`: a file holding the public key line, or the line itself. A
/// private key file given instead is named as such (a bare base64 line in a file that only
/// its owner may read, or next to its `.pub`); a path that does not exist is said to be
/// missing, not read as a malformed key.
pub fn load_public(arg: &str) -> Result<[u8; KEY_BYTES], KeyError> {
    let path = Path::new(arg);
    if path.exists() {
        let text = read_bounded(path)?;
        let name = path.display().to_string();
        let line = text
            .lines()
            .find(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
            .unwrap_or("")
            .trim();
        if !line.starts_with(PUBLIC_KEY_TAG) && looks_private(path) {
            return Err(KeyError::Format {
                path: name,
                why: format!(
                    "this is a private key, and a public key is needed here: give {}",
                    pub_path(path).display()
                ),
            });
        }
        return parse_public(line).map_err(|why| KeyError::Format { path: name, why });
    }
    let line = arg.trim();
    if line.starts_with(PUBLIC_KEY_TAG) {
        return parse_public(line).map_err(|why| KeyError::Format {
            path: "the key line".into(),
            why,
        });
    }
    match parse_public(line) {
        Ok(key) => Ok(key),
        Err(_) => Err(KeyError::Io {
            path: path.to_path_buf(),
            source: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no such file (give the exec server's .pub file, or its key line `execrelay-x25519 …`)",
            ),
        }),
    }
}

/// Whether the key file at `path` is a private key: only its owner may read it, or its
/// `.pub` is next to it (a public key file is readable by all, `execrelay keygen` writes
/// it 0644).
fn looks_private(path: &Path) -> bool {
    let owner_only = fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o077 == 0);
    owner_only || pub_path(path).exists()
}

/// Read the key file at `path` whole, refusing one past the key files' size bound (a text file of
/// key lines; a path to something else must not make a server read gigabytes).
pub fn read_bounded(path: &Path) -> Result<String, KeyError> {
    let io = |source| KeyError::Io {
        path: path.to_path_buf(),
        source,
    };
    let meta = fs::metadata(path).map_err(io)?;
    if meta.len() > MAX_KEY_FILE_BYTES {
        return Err(KeyError::Format {
            path: path.display().to_string(),
            why: format!("file larger than {MAX_KEY_FILE_BYTES} bytes"),
        });
    }
    fs::read_to_string(path).map_err(io)
}

/// Parse an authorized-keys file: one public key line per line, `#` comments, blank lines. A
/// line that is not a public key is skipped, as sshd does, and reported in `skipped` (its
/// place `name:LINE` and what is wrong), so one typo does not lock every client out; the
/// caller logs them.
pub fn parse_authorized(text: &str, name: &str) -> ParsedKeys {
    let mut parsed = ParsedKeys::default();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match parse_public(line) {
            Ok(key) => {
                parsed.keys.insert(key);
            }
            Err(why) => parsed.skipped.push(format!("{name}:{}: {why}", i + 1)),
        }
    }
    parsed
}

/// The keys of an authorized-keys file, and the lines that were skipped.
#[derive(Debug, Default)]
pub struct ParsedKeys {
    /// Every public key listed.
    pub keys: HashSet<[u8; KEY_BYTES]>,
    /// `FILE:LINE: why` of each line that is not a public key.
    pub skipped: Vec<String>,
}

impl ParsedKeys {
    /// Log each skipped line (a warning naming the file and line).
    fn warn(&self) {
        for why in &self.skipped {
            tracing::warn!("authorized keys: skipped a line that is not a public key: {why}");
        }
    }
}

/// The keys of the last read, or why it failed.
type KeySet = Result<HashSet<[u8; KEY_BYTES]>, String>;

/// What identifies one version of a file without reading it: a change to any field means the
/// file must be read again (editors replace files, so the inode counts too).
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub struct Stamp {
    mtime: i64,
    mtime_ns: i64,
    len: u64,
    ino: u64,
}

/// The authorized-keys file, re-read whenever it changes (checked on every handshake), so a
/// key removed from it can no longer open streams. A file that becomes unreadable or
/// malformed authorizes nobody until it is fixed (fail closed), and says so in the log.
pub struct AuthorizedKeys {
    path: PathBuf,
    state: Mutex<(Option<Stamp>, KeySet)>,
}

impl AuthorizedKeys {
    /// Load at start: errors are fatal here, so a typo is caught before serving.
    pub fn load(path: &Path) -> Result<AuthorizedKeys, KeyError> {
        let text = read_bounded(path)?;
        let parsed = parse_authorized(&text, &path.display().to_string());
        parsed.warn();
        Ok(AuthorizedKeys {
            path: path.to_path_buf(),
            state: Mutex::new((stamp(path), Ok(parsed.keys))),
        })
    }

    /// Whether `key` is authorized now.
    pub fn contains(&self, key: &[u8]) -> bool {
        let mut st = crate::sync::lock(&self.state);
        let now = stamp(&self.path);
        if now != st.0 || now.is_none() {
            let reloaded = read_bounded(&self.path)
                .map_err(|e| e.to_string())
                .map(|t| {
                    let parsed = parse_authorized(&t, &self.path.display().to_string());
                    parsed.warn();
                    parsed.keys
                });
            match &reloaded {
                Ok(k) => tracing::info!(keys = k.len(), "authorized keys reloaded"),
                Err(e) => {
                    tracing::error!(error = %e, "authorized keys unusable: refusing all clients until fixed")
                }
            }
            *st = (now, reloaded);
        }
        match &st.1 {
            Ok(keys) => keys
                .iter()
                .any(|k| bool::from(subtle::ConstantTimeEq::ct_eq(&k[..], key))),
            Err(_) => false,
        }
    }
}

/// The [`Stamp`] of the file at `path` now, or `None` when it cannot be read (gone, no
/// permission). Shared by every file watcher (key files here, certificates in `execrelay-io`).
pub fn stamp(path: &Path) -> Option<Stamp> {
    let m = fs::metadata(path).ok()?;
    Some(Stamp {
        mtime: m.mtime(),
        mtime_ns: m.mtime_nsec(),
        len: m.len(),
        ino: m.ino(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keygen_writes_both_files_and_they_load() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        let kp = Keypair::generate().unwrap();
        kp.write(&path, "me@host").unwrap();
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let loaded = Keypair::load(&path).unwrap();
        assert_eq!(loaded.private, kp.private);
        assert_eq!(
            loaded.public, kp.public,
            "public key derived from the private one"
        );
        let line = fs::read_to_string(pub_path(&path)).unwrap();
        assert!(line.starts_with("execrelay-x25519 "));
        assert!(line.trim_end().ends_with(" me@host"));
        assert_eq!(
            load_public(pub_path(&path).to_str().unwrap()).unwrap(),
            kp.public
        );
        assert!(kp.write(&path, "again").is_err(), "never overwrites a key");
    }

    /// The handshakes build on the keys, so the keys must not import a handshake back (they
    /// once did, for the protocol name, which made the two modules a cycle).
    #[test]
    fn keys_do_not_import_the_handshake() {
        for (name, src) in [
            ("keys/mod.rs", include_str!("mod.rs")),
            ("keys/environments.rs", include_str!("environments.rs")),
        ] {
            let code = src.split("#[cfg(test)]").next().unwrap();
            assert!(
                !code.contains("handshake::"),
                "{name} imports from a handshake module"
            );
        }
    }

    /// RFC 7748 §6.1: Alice's private key and its public key. A derivation that fails must
    /// be an error, never a key of zeros; a derivation that succeeds must be X25519.
    #[test]
    fn public_key_derivation_matches_rfc_7748() {
        let hex = |s: &str| -> [u8; KEY_BYTES] {
            let v: Vec<u8> = (0..s.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
                .collect();
            v.try_into().unwrap()
        };
        let private = hex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a");
        let public = hex("8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a");
        assert_eq!(Keypair::from_private(private).unwrap().public, public);
        let kp = Keypair::generate().unwrap();
        assert_ne!(kp.public, [0u8; KEY_BYTES]);
        assert_eq!(Keypair::from_private(kp.private).unwrap().public, kp.public);
    }

    /// A public key where a private one is needed, and the reverse, are named as such; a
    /// missing key file is said to be missing.
    #[test]
    fn public_and_private_keys_are_told_apart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        let kp = Keypair::generate().unwrap();
        kp.write(&path, "me").unwrap();
        let e = Keypair::load(&pub_path(&path)).unwrap_err().to_string();
        assert!(e.contains("this is a public key"), "{e}");
        let e = load_public(path.to_str().unwrap()).unwrap_err().to_string();
        assert!(e.contains("this is a private key"), "{e}");
        assert!(e.contains("k.pub"), "{e}");
        let gone = dir.path().join("nope.pub");
        let e = load_public(gone.to_str().unwrap()).unwrap_err().to_string();
        assert!(e.contains("no such file"), "{e}");
        assert!(!e.contains("base64"), "{e}");
        assert!(matches!(Keypair::read_any(&path), Ok(KeyFile::Private(_))));
        match Keypair::read_any(&pub_path(&path)) {
            Ok(KeyFile::Public { public, comment }) => {
                assert_eq!((public, comment.as_str()), (kp.public, "me"))
            }
            other => panic!("{other:?}"),
        }
        // The key line itself still works, as does a bare key on the command line.
        let line = public_line(&kp.public, "x");
        assert_eq!(load_public(&line).unwrap(), kp.public);
        assert_eq!(load_public(&b64().encode(kp.public)).unwrap(), kp.public);
    }

    #[test]
    fn open_permissions_and_garbage_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        Keypair::generate().unwrap().write(&path, "").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(
            Keypair::load(&path),
            Err(KeyError::Permissions(..))
        ));
        let bad = dir.path().join("bad");
        fs::write(&bad, "not base64 !!\n").unwrap();
        fs::set_permissions(&bad, fs::Permissions::from_mode(0o600)).unwrap();
        assert!(matches!(Keypair::load(&bad), Err(KeyError::Format { .. })));
        fs::write(&bad, format!("{}\n", b64().encode([1u8; 31]))).unwrap();
        assert!(matches!(Keypair::load(&bad), Err(KeyError::Format { .. })));
    }

    #[test]
    fn authorized_keys_parse_with_comments_and_skip_the_bad_line() {
        let a = Keypair::generate().unwrap();
        let text = format!("# ops\n\n{}\n", public_line(&a.public, "a"));
        let parsed = parse_authorized(&text, "f");
        assert!(parsed.keys.contains(&a.public));
        assert!(parsed.skipped.is_empty());
        // A bad line is skipped and named; the good lines around it still count.
        let text = format!(
            "# x\nexecrelay-x25519 nope\n{}\n",
            public_line(&a.public, "a")
        );
        let parsed = parse_authorized(&text, "f");
        assert!(parsed.keys.contains(&a.public), "the good line counts");
        assert_eq!(parsed.skipped.len(), 1);
        assert!(
            parsed.skipped[0].starts_with("f:2: "),
            "{:?}",
            parsed.skipped
        );
    }

    #[test]
    fn authorized_keys_follow_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("auth");
        let a = Keypair::generate().unwrap();
        let b = Keypair::generate().unwrap();
        fs::write(
            &path,
            format!(
                "{}\n{}\n",
                public_line(&a.public, "a"),
                public_line(&b.public, "b")
            ),
        )
        .unwrap();
        let ak = AuthorizedKeys::load(&path).unwrap();
        assert!(ak.contains(&a.public) && ak.contains(&b.public));
        // Revoke b: rewrite the file (a new inode, as editors do).
        let tmp = dir.path().join("auth.new");
        fs::write(&tmp, format!("{}\n", public_line(&a.public, "a"))).unwrap();
        fs::rename(&tmp, &path).unwrap();
        assert!(ak.contains(&a.public));
        assert!(!ak.contains(&b.public), "a revoked key is refused");
        // A broken file fails closed.
        fs::write(&path, "garbage\n").unwrap();
        assert!(!ak.contains(&a.public));
    }
}
