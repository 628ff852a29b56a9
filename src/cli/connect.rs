//! From what a person typed (`TARGET`: a URL or a host alias, and the key flags) to the
//! client library's [`Target`]: the URL form checked, the keys and token read, the flags
//! winning over the host's entry in the configuration file (`hosts.rs`), and every error
//! naming what is wrong and where (the flag, or `FILE:LINE: hosts.NAME.KEY`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Args;

use super::failure::Failure;
use super::hosts::{default_key_path, expand_home, Entry, HostsFile};
use crate::client::Target;
use crate::link::client::{check_window, LinkPool, NoiseClientConfig};
use crate::link::dial::{LinkTarget, TlsRoots};
use crate::noise::keys::{fingerprint, load_public, Keypair};
use execrelay_protocol::noise::suite::SuiteChoice;

/// How to reach and authenticate to the server: every command that talks to one takes these.
#[derive(Debug, Clone, Default, Args)]
pub struct ConnFlags {
    /// noise+ws and relay+ws: the exec server's public key (a `.pub` file or the key line
    /// itself; through a relay still the exec server's, never the relay's). Overrides the
    /// host's `server_key`.
    #[arg(long, value_name = "KEY_OR_FILE")]
    pub server_key: Option<String>,
    /// noise+ws and relay+ws: this client's private key file [default: the host's `key`, else
    /// ~/.config/execrelay/id].
    #[arg(long, value_name = "FILE")]
    pub key: Option<PathBuf>,
    /// noise+ws and relay+ws: a token to present in the handshake (read from the file).
    /// Overrides the host's `token_file`.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// relay+wss: trust only the CA certificates (PEM) in this file instead of the platform's
    /// roots. Overrides the host's `ca_file`.
    #[arg(long, value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
    /// noise+ws and relay+ws: the Noise suite of the streams: `auto` (aesgcm where the CPU has
    /// hardware AES, else chachapoly; back to chachapoly when the server does not accept
    /// aesgcm), or pinned: `chachapoly` (suite 0), `aesgcm` (suite 1). Overrides the host's
    /// `noise_suite` [default: auto].
    #[arg(long, value_name = "auto|chachapoly|aesgcm")]
    pub noise_suite: Option<SuiteChoice>,
    /// noise+ws and relay+ws: the receive window of each stream, in records of at most 64 KiB
    /// (1 to 256). A stream moves at most one window per round trip: raise it for a server far
    /// away (64 = 4 MiB, the most a relay passes on by default), at the cost of that much memory
    /// per stream. Overrides the host's `noise_window` [default: 16].
    #[arg(long, value_name = "RECORDS")]
    pub noise_window: Option<u32>,
}

/// A server to talk to, resolved.
#[derive(Debug, Clone)]
pub struct Remote {
    /// The URL (from the command line, or the host's `url`).
    pub url: String,
    /// How the library reaches it.
    pub target: Target,
    /// This client's key as the words of a refusal name it (`FILE (SHA256:…)`).
    pub key: Option<String>,
    /// Whether a token is presented.
    pub token: bool,
}

/// The URL forms a client speaks.
const FORMS: &str =
    "ws://HOST:PORT, noise+ws://HOST:PORT, relay+ws://RELAY:PORT/ENVIRONMENT_ID or relay+wss://RELAY:PORT/ENVIRONMENT_ID";

/// Where a value came from: a flag, or the host's entry in the file.
enum From<'a> {
    Flag(&'static str),
    File(&'a HostsFile, &'a str, &'static str, &'a Entry),
}

impl From<'_> {
    fn fail(&self, why: impl std::fmt::Display) -> Failure {
        match self {
            From::Flag(flag) => Failure::cause(format!("{flag}: {why}")),
            From::File(file, host, field, entry) => file.fail(host, field, entry, why),
        }
    }
}

/// Resolve `target` (a URL, or a host alias of the configuration file) with `flags` on top.
pub fn resolve(target: &str, flags: &ConnFlags) -> Result<Remote, Failure> {
    if target.contains("://") {
        return build(target, flags, None);
    }
    let file = HostsFile::load_default()?;
    let Some(file) = file else {
        let place = super::hosts::config_dir()
            .map(|d| d.join("config.toml").display().to_string())
            .unwrap_or_else(|| "$XDG_CONFIG_HOME/execrelay/config.toml".into());
        return Err(Failure::cause(format!(
            "unknown host {target:?}: give a URL ({FORMS}), or add [hosts.{target}] to {place}"
        )));
    };
    if !file.hosts.contains_key(target) {
        return Err(Failure::cause(format!(
            "unknown host {target:?}: give a URL ({FORMS}), or add [hosts.{target}] to {}",
            file.path.display()
        )));
    }
    let host = &file.hosts[target];
    let Some(url) = &host.url else {
        return Err(Failure::cause(format!(
            "{}: hosts.{target} has no url",
            file.path.display()
        )));
    };
    build(&url.value, flags, Some((&file, target))).map_err(|f| {
        match f.words.strip_prefix("bad URL: ") {
            Some(why) => file.fail(target, "url", url, why),
            None => f,
        }
    })
}

fn build(
    url: &str,
    flags: &ConnFlags,
    host: Option<(&HostsFile, &str)>,
) -> Result<Remote, Failure> {
    let entry = |pick: fn(&super::hosts::Host) -> &Option<Entry>, field: &'static str| {
        host.and_then(|(file, name)| {
            pick(&file.hosts[name])
                .as_ref()
                .map(|e| (From::File(file, name, field, e), e.value.clone()))
        })
    };
    if url.starts_with("ws://") {
        return Ok(Remote {
            url: url.to_string(),
            target: Target::Ws(url.to_string()),
            key: None,
            token: false,
        });
    }
    let noise = ["noise+ws://", "relay+ws://", "relay+wss://"]
        .iter()
        .any(|p| url.starts_with(p));
    if !noise {
        return Err(Failure::cause(format!(
            "bad URL: unsupported target {url:?}: expected {FORMS}"
        )));
    }
    LinkTarget::parse(url).map_err(|e| Failure::cause(format!("bad URL: {e}")))?;

    let server_public = match (&flags.server_key, entry(|h| &h.server_key, "server_key")) {
        (Some(k), _) => load_public(k).map_err(|e| From::Flag("--server-key").fail(e))?,
        (None, Some((from, v))) => {
            // A path (`~/…` allowed) or the key line itself.
            let expanded = expand_home(&v);
            let arg = if expanded.exists() {
                expanded.display().to_string()
            } else {
                v.clone()
            };
            load_public(&arg).map_err(|e| from.fail(e))?
        }
        (None, None) => {
            return Err(Failure::cause(format!(
                "{url} needs the exec server's public key (no trust on first use): --server-key KEY_OR_FILE, or server_key in the host's entry of the configuration file"
            )))
        }
    };
    let (keys, key_path) = match (&flags.key, entry(|h| &h.key, "key")) {
        (Some(p), _) => (
            Keypair::load(p).map_err(|e| From::Flag("--key").fail(e))?,
            p.clone(),
        ),
        (None, Some((from, v))) => {
            let p = expand_home(&v);
            (Keypair::load(&p).map_err(|e| from.fail(e))?, p)
        }
        (None, None) => match default_key_path() {
            Some(p) if p.exists() => (
                Keypair::load(&p).map_err(|e| Failure::cause(e.to_string()))?,
                p,
            ),
            p => {
                let place = p
                    .map(|p| p.display().to_string())
                    .unwrap_or_else(|| "~/.config/execrelay/id".into());
                return Err(Failure::cause(format!(
                    "{url} needs this client's private key: --key FILE, or `execrelay keygen` to create {place}"
                )));
            }
        },
    };
    let mut config = NoiseClientConfig::new(keys.clone(), server_public);
    let token = match (&flags.token_file, entry(|h| &h.token_file, "token_file")) {
        (Some(p), _) => Some(read_token(p).map_err(|e| From::Flag("--token-file").fail(e))?),
        (None, Some((from, v))) => Some(read_token(&expand_home(&v)).map_err(|e| from.fail(e))?),
        (None, None) => None,
    };
    let has_token = token.is_some();
    config.token = token;
    let ca = match (&flags.ca_file, entry(|h| &h.ca_file, "ca_file")) {
        (Some(p), _) => Some((p.clone(), From::Flag("--ca-file"))),
        (None, Some((from, v))) => Some((expand_home(&v), from)),
        (None, None) => None,
    };
    config.suite = match (flags.noise_suite, entry(|h| &h.noise_suite, "noise_suite")) {
        (Some(s), _) => s,
        (None, Some((from, v))) => v.parse().map_err(|e| from.fail(e))?,
        (None, None) => SuiteChoice::Auto,
    };
    config.window = match (
        flags.noise_window,
        entry(|h| &h.noise_window, "noise_window"),
    ) {
        (Some(w), _) => check_window(w).map_err(|e| From::Flag("--noise-window").fail(e))?,
        (None, Some((from, v))) => v
            .parse::<u32>()
            .map_err(|e| e.to_string())
            .and_then(check_window)
            .map_err(|e| from.fail(e))?,
        (None, None) => config.window,
    };
    if let Some((path, from)) = ca {
        let roots = TlsRoots::CaFile(path);
        // Checked now, so a bad file is reported before anything is dialled.
        roots.client_config().map_err(|e| from.fail(e))?;
        config.tls = roots;
    }
    Ok(Remote {
        url: url.to_string(),
        target: Target::Noise {
            url: url.to_string(),
            config: Arc::new(config),
            // One client per command: the pool holds its link across resumes.
            pool: LinkPool::new(),
        },
        key: Some(format!(
            "{} ({})",
            key_path.display(),
            fingerprint(&keys.public)
        )),
        token: has_token,
    })
}

/// A token file's contents, trimmed; an empty one is an error.
fn read_token(path: &Path) -> Result<String, String> {
    let t = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let t = t.trim().to_string();
    if t.is_empty() {
        return Err(format!("{}: empty token", path.display()));
    }
    Ok(t)
}

/// A resolved remote's words for a failure (its key and token), for the other commands.
pub fn failure_of(r: &Remote, e: &crate::client::ClientError) -> Failure {
    super::failure::connect_failure(&r.url, e, r.key.as_deref(), r.token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::noise::keys::public_line;

    /// A noise+ws target resolved with `window` given on the command line.
    fn resolved(window: Option<u32>) -> Result<Remote, Failure> {
        let dir = tempfile::tempdir().unwrap();
        let client = Keypair::generate().unwrap();
        let key = dir.path().join("id");
        client.write(&key, "test").unwrap();
        let server = Keypair::generate().unwrap();
        let flags = ConnFlags {
            server_key: Some(public_line(&server.public, "server")),
            key: Some(key),
            noise_window: window,
            ..ConnFlags::default()
        };
        resolve("noise+ws://127.0.0.1:1", &flags)
    }

    fn window_of(r: &Remote) -> u32 {
        match &r.target {
            Target::Noise { config, .. } => config.window,
            other => panic!("not a Noise target: {other:?}"),
        }
    }

    #[test]
    fn the_stream_window_is_the_flags_or_the_default_and_checked() {
        use execrelay_protocol::config::STREAM_WINDOW_RECORDS;
        assert_eq!(window_of(&resolved(None).unwrap()), STREAM_WINDOW_RECORDS);
        assert_eq!(window_of(&resolved(Some(64)).unwrap()), 64);
        assert_eq!(window_of(&resolved(Some(256)).unwrap()), 256);
        for bad in [0, 257, u32::MAX] {
            let words = resolved(Some(bad)).expect_err("refused").words;
            assert!(
                words.starts_with(&format!(
                    "--noise-window: a stream window of {bad} records is out of range: give 1 to 256"
                )),
                "{words}"
            );
        }
    }
}
