//! The client's configuration file: host aliases, so a command names `sandbox-1` instead of a
//! URL and four key flags (README "Host aliases").
//!
//! ```toml
//! [hosts.sandbox-1]
//! url = "relay+wss://relay.example.com:443/sandbox-1"
//! server_key = "execrelay-x25519 AAAA…"   # the key line, or a path to a .pub file
//! key = "~/.config/execrelay/id"          # default for every host when absent
//! ca_file = "/etc/ssl/private-ca.pem"     # optional
//! token_file = "~/.config/execrelay/token" # optional
//! noise_suite = "auto"                    # optional: auto, chachapoly or aesgcm
//! noise_window = 64                       # optional: receive window per stream, in records
//! ```
//!
//! Where: `$EXECRELAY_CONFIG`, else `$XDG_CONFIG_HOME/execrelay/config.toml`, else
//! `~/.config/execrelay/config.toml`; a missing default file is no error, a missing
//! `$EXECRELAY_CONFIG` is. Every error names the file, the line and the key
//! (`config.toml:3: hosts.sandbox-1.urll: unknown field …`). It only reads: the flags win over
//! it where the caller applies them (`connect.rs`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

use super::failure::Failure;

/// The configuration file's name under the configuration directory.
const FILE_NAME: &str = "config.toml";
/// The largest configuration file read (a hand-written file of hosts is a few KiB).
pub const MAX_CONFIG_BYTES: u64 = 1024 * 1024;

/// `$XDG_CONFIG_HOME/execrelay`, else `~/.config/execrelay` (`None` without either variable).
pub fn config_dir() -> Option<PathBuf> {
    match std::env::var_os("XDG_CONFIG_HOME").filter(|v| !v.is_empty()) {
        Some(x) => Some(PathBuf::from(x).join("execrelay")),
        None => home().map(|h| h.join(".config").join("execrelay")),
    }
}

/// The key `execrelay keygen` writes without `-o`, and every host uses without `key`:
/// `id` in [`config_dir`].
pub fn default_key_path() -> Option<PathBuf> {
    config_dir().map(|d| d.join("id"))
}

fn home() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// `~/x` → `$HOME/x`; anything else as it is.
pub fn expand_home(path: &str) -> PathBuf {
    match (path.strip_prefix("~/"), home()) {
        (Some(rest), Some(h)) => h.join(rest),
        _ => PathBuf::from(path),
    }
}

/// One value of the file and the line it is on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// As written.
    pub value: String,
    /// 1-based.
    pub line: usize,
}

/// One `[hosts.NAME]` table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Host {
    /// `url`.
    pub url: Option<Entry>,
    /// `server_key`: the key line or a path to a `.pub` file.
    pub server_key: Option<Entry>,
    /// `key`: this client's private key file.
    pub key: Option<Entry>,
    /// `ca_file`.
    pub ca_file: Option<Entry>,
    /// `token_file`.
    pub token_file: Option<Entry>,
    /// `noise_suite`: `auto`, `chachapoly` or `aesgcm`.
    pub noise_suite: Option<Entry>,
    /// `noise_window`: the receive window per stream, in records (an integer).
    pub noise_window: Option<Entry>,
}

/// The configuration file, read.
#[derive(Debug, Clone, Default)]
pub struct HostsFile {
    /// Where it was read from.
    pub path: PathBuf,
    /// Its hosts by name.
    pub hosts: BTreeMap<String, Host>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Doc {
    #[serde(default)]
    hosts: BTreeMap<String, RawHost>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHost {
    url: Option<Spanned<String>>,
    server_key: Option<Spanned<String>>,
    key: Option<Spanned<String>>,
    ca_file: Option<Spanned<String>>,
    token_file: Option<Spanned<String>>,
    noise_suite: Option<Spanned<String>>,
    noise_window: Option<Spanned<u32>>,
}

impl HostsFile {
    /// The file in force (`$EXECRELAY_CONFIG`, else the default places), read and checked;
    /// `None` when there is none.
    pub fn load_default() -> Result<Option<HostsFile>, Failure> {
        if let Some(p) = std::env::var_os("EXECRELAY_CONFIG").filter(|v| !v.is_empty()) {
            let p = PathBuf::from(p);
            if !p.exists() {
                return Err(Failure::cause(format!(
                    "{}: no such file (named by $EXECRELAY_CONFIG)",
                    p.display()
                )));
            }
            return HostsFile::load(&p).map(Some);
        }
        match config_dir().map(|d| d.join(FILE_NAME)) {
            Some(p) if p.exists() => HostsFile::load(&p).map(Some),
            _ => Ok(None),
        }
    }

    /// Read and check the file at `path`.
    pub fn load(path: &Path) -> Result<HostsFile, Failure> {
        let name = path.display().to_string();
        let meta = std::fs::metadata(path).map_err(|e| Failure::cause(format!("{name}: {e}")))?;
        if meta.len() > MAX_CONFIG_BYTES {
            return Err(Failure::cause(format!(
                "{name}: larger than {MAX_CONFIG_BYTES} bytes"
            )));
        }
        let text =
            std::fs::read_to_string(path).map_err(|e| Failure::cause(format!("{name}: {e}")))?;
        HostsFile::parse(&text, path)
    }

    /// Parse `text` as the file at `path` (errors name `path:LINE: KEY`).
    pub fn parse(text: &str, path: &Path) -> Result<HostsFile, Failure> {
        let name = path.display().to_string();
        let doc: Doc = toml::from_str(text).map_err(|e| {
            let at = e.span().map(|s| s.start).unwrap_or(0);
            let line = line_of(text, at);
            let words = match key_path_at(text, at) {
                Some(key) => format!("{name}:{line}: {key}: {}", e.message()),
                None => format!("{name}:{line}: {}", e.message()),
            };
            Failure::cause(words)
        })?;
        let entry = |v: Option<Spanned<String>>| {
            v.map(|s| Entry {
                line: line_of(text, s.span().start),
                value: s.into_inner(),
            })
        };
        let hosts = doc
            .hosts
            .into_iter()
            .map(|(k, h)| {
                let host = Host {
                    url: entry(h.url),
                    server_key: entry(h.server_key),
                    key: entry(h.key),
                    ca_file: entry(h.ca_file),
                    token_file: entry(h.token_file),
                    noise_suite: entry(h.noise_suite),
                    noise_window: h.noise_window.map(|s| Entry {
                        line: line_of(text, s.span().start),
                        value: s.into_inner().to_string(),
                    }),
                };
                (k, host)
            })
            .collect();
        Ok(HostsFile {
            path: path.to_path_buf(),
            hosts,
        })
    }

    /// The failure of `field` of host `name` (`FILE:LINE: hosts.NAME.FIELD: why`).
    pub fn fail(
        &self,
        name: &str,
        field: &str,
        entry: &Entry,
        why: impl std::fmt::Display,
    ) -> Failure {
        Failure::cause(format!(
            "{}:{}: hosts.{name}.{field}: {why}",
            self.path.display(),
            entry.line
        ))
    }
}

/// The 1-based line of byte `at` of `text`.
fn line_of(text: &str, at: usize) -> usize {
    text[..at.min(text.len())].matches('\n').count() + 1
}

/// The dotted key at byte `at` (`hosts.NAME.KEY`): the table header above it and the key on
/// its line, as written (quotes removed).
fn key_path_at(text: &str, at: usize) -> Option<String> {
    let at = at.min(text.len());
    let start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let line = text[start..].lines().next().unwrap_or("");
    let header = text[..start]
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with('[') && l.ends_with(']'))
        .map(|l| {
            l.trim_matches(|c| c == '[' || c == ']')
                .trim()
                .replace('"', "")
        });
    let trimmed = line.trim();
    if trimmed.starts_with('[') {
        return Some(
            trimmed
                .trim_matches(|c| c == '[' || c == ']')
                .replace('"', ""),
        );
    }
    let key = trimmed
        .split_once('=')
        .map(|(k, _)| k.trim().trim_matches('"'))?;
    Some(match header {
        Some(h) if !h.is_empty() => format!("{h}.{key}"),
        _ => key.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<HostsFile, Failure> {
        HostsFile::parse(text, Path::new("/c/config.toml"))
    }

    #[test]
    fn every_field_is_read_with_its_line() {
        let f = parse(
            "# hosts\n[hosts.sandbox-1]\nurl = \"relay+wss://r:443/sandbox-1\"\nserver_key = \"k.pub\"\nkey = \"~/id\"\nca_file = \"/ca.pem\"\ntoken_file = \"/t\"\n[hosts.\"b c\"]\nurl = \"ws://h:1\"\n",
        )
        .unwrap();
        let h = &f.hosts["sandbox-1"];
        assert_eq!(
            h.url,
            Some(Entry {
                value: "relay+wss://r:443/sandbox-1".into(),
                line: 3
            })
        );
        assert_eq!(h.server_key.as_ref().unwrap().line, 4);
        assert_eq!(h.key.as_ref().unwrap().value, "~/id");
        assert_eq!(h.ca_file.as_ref().unwrap().line, 6);
        assert_eq!(h.token_file.as_ref().unwrap().line, 7);
        assert_eq!(f.hosts["b c"].url.as_ref().unwrap().line, 9);
    }

    #[test]
    fn errors_name_the_file_the_line_and_the_key() {
        let e = parse("[hosts.a]\nurl = \"ws://h:1\"\nurll = \"x\"\n").unwrap_err();
        assert_eq!(e.status, 255);
        assert!(
            e.words
                .starts_with("/c/config.toml:3: hosts.a.urll: unknown field `urll`"),
            "{}",
            e.words
        );
        let e = parse("[hosts.a]\nurl = 3\n").unwrap_err();
        assert!(
            e.words.starts_with("/c/config.toml:2: hosts.a.url: "),
            "{}",
            e.words
        );
        let e = parse("[hosts.a]\nurl = \"x\n").unwrap_err();
        assert!(e.words.starts_with("/c/config.toml:2: "), "{}", e.words);
        let e = parse("[servers.a]\nurl = \"x\"\n").unwrap_err();
        assert!(
            e.words.starts_with("/c/config.toml:1: servers.a: "),
            "{}",
            e.words
        );
    }
}
