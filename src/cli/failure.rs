//! How the command line ends when something is not the command's own doing: an exit status
//! and one line on stderr, `execrelay: ` and the cause (`--help` and README "Exit status").
//!
//! - `2`: the command line itself is wrong (as clap's own errors).
//! - `255`: everything else that is not the command's doing, each with its cause: cannot
//!   connect (naming the URL), refused (which key or token), the wrong URL form for what
//!   answered, the server shut down, the session expired, the connection was lost and could
//!   not be resumed, the environment was revoked, a bad configuration file or key.
//!
//! The words of a failure are built from the library's typed errors here, in one place.

use crate::client::ClientError;
use crate::link::dial::LinkTarget;

/// Exit status of a usage error.
pub const USAGE: i32 = 2;
/// Exit status of everything that is not the command's own doing (as ssh).
pub const NOT_THE_COMMAND: i32 = 255;

/// An end of the command line that is not the command's: its status and its words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The exit status.
    pub status: i32,
    /// One line, without the `execrelay: ` prefix.
    pub words: String,
}

impl Failure {
    /// Status 255 with `words`.
    pub fn cause(words: impl Into<String>) -> Failure {
        Failure {
            status: NOT_THE_COMMAND,
            words: words.into(),
        }
    }

    /// Status 2 (a wrong command line) with `words`.
    pub fn usage(words: impl Into<String>) -> Failure {
        Failure {
            status: USAGE,
            words: words.into(),
        }
    }

    /// Print the words (one line, `execrelay: ` first) and give the status.
    pub fn report(&self) -> i32 {
        say(&self.words);
        self.status
    }
}

/// One line on stderr, `execrelay: ` first; control characters a server sent are escaped.
pub fn say(words: &str) {
    let line: String = words
        .chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect();
    // On a terminal (raw during `run -t`) a bare `\n` does not return the carriage.
    if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        eprint!("\rexecrelay: {line}\r\n");
    } else {
        eprintln!("execrelay: {line}");
    }
}

/// The body a relay sends (`RELAY_HINT`) to an upgrade on a path it does not serve.
const RELAY_SAYS: &str = "this is an execrelay relay";
/// The body a `noise+ws://` exec server sends (`NOISE_SERVER_HINT`) likewise.
const NOISE_SERVER_SAYS: &str = "this is an execrelay exec server speaking Noise";

/// `HOST:PORT` of a URL of any of the forms (for the words of a wrong scheme).
fn host_port(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    rest.split('/').next().unwrap_or(rest)
}

/// What to say when connecting to `url` (or opening a session there) failed with `e`.
/// `key` names this client's key (`FILE (SHA256:…)`) for a refusal; `token` whether a token
/// was presented.
pub fn connect_failure(url: &str, e: &ClientError, key: Option<&str>, token: bool) -> Failure {
    match e {
        ClientError::Connect(why) => {
            if why.contains(RELAY_SAYS) {
                return Failure::cause(format!(
                    "{url}: this is a relay; use relay+ws://{}/ENVIRONMENT_ID",
                    host_port(url)
                ));
            }
            if why.contains(NOISE_SERVER_SAYS) {
                return Failure::cause(format!(
                    "{url}: this is an exec server speaking Noise; use noise+ws://{}",
                    host_port(url)
                ));
            }
            if why.contains("is offline") {
                return Failure::cause(format!("{url}: {}", strip_connect(why, url)));
            }
            let why = strip_connect(why, url);
            // Nothing listens there: the commonest first mistake (a server not started, a
            // wrong port), so the line says what to check, as the refusal below does.
            let hint = if why.contains("Connection refused") {
                ": is the exec server (or relay) running and listening on that address and port?"
            } else {
                ""
            };
            Failure::cause(format!("cannot connect to {url}: {why}{hint}"))
        }
        ClientError::Refused(why) => {
            let why = why
                .strip_prefix("the server refused this client: ")
                .or_else(|| why.strip_prefix("the server refused the handshake: "))
                .unwrap_or(why);
            let mut words = format!("{url} refused this client: {why}");
            if let Some(key) = key {
                words.push_str(&format!(" (key {key}"));
                words.push_str(if token { ", with a token)" } else { ")" });
            }
            if why.starts_with("its key is not authorized") {
                // What to do about it: the server's operator adds the public line.
                words.push_str(
                    ": add this key's public line (its .pub file, or `execrelay keygen -y -f KEY`) \
                     to the server's authorized_keys",
                );
                if token {
                    words.push_str(", or check the token (--token-file) against the server's");
                }
            }
            Failure::cause(words)
        }
        ClientError::Revoked(why) => Failure::cause(format!("{url}: {why}")),
        ClientError::EnvironmentOffline { why, .. } => Failure::cause(format!("{url}: {why}")),
        ClientError::SessionExpired => Failure::cause(format!(
            "the session expired on {url} (it outlived its TTL detached, or was closed)"
        )),
        ClientError::Rpc { code: -32003, .. } => Failure::cause(format!(
            "the session expired on {url} (it outlived its TTL detached, or was closed)"
        )),
        ClientError::Rpc { message, .. } => Failure::cause(format!("{url}: {message}")),
        ClientError::ProcessIdInUse(id) => {
            Failure::cause(format!("{url}: process id {id:?} is already in use here"))
        }
        ClientError::SessionLost(why) => Failure::cause(format!(
            "the connection to {url} was lost and could not be resumed: {why}"
        )),
        ClientError::ConnectionLost => Failure::cause(format!("the connection to {url} was lost")),
        ClientError::Protocol(why) => Failure::cause(format!("{url}: {why}")),
        e @ ClientError::RequestTooLarge { .. } => Failure::cause(format!("{url}: {e}")),
    }
}

/// `why` without the `cannot connect to URL: ` the layers below put before it.
fn strip_connect<'a>(why: &'a str, url: &str) -> &'a str {
    let mut w = why;
    loop {
        let before = w;
        for prefix in ["cannot connect: ", "cannot connect to "] {
            if let Some(rest) = w.strip_prefix(prefix) {
                w = rest;
            }
        }
        if let Some(rest) = w.strip_prefix(url).and_then(|r| r.strip_prefix(": ")) {
            w = rest;
        }
        if let Ok(t) = LinkTarget::parse(url) {
            if let Some(rest) = w.strip_prefix(&t.ws_url).and_then(|r| r.strip_prefix(": ")) {
                w = rest;
            }
        }
        if w == before {
            return w;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrong_scheme_says_what_answered_and_what_to_type() {
        let e = ClientError::Connect(format!(
            "cannot connect to ws://127.0.0.1:7000: HTTP 404 Not Found: {RELAY_SAYS}; clients use …"
        ));
        assert_eq!(
            connect_failure("ws://127.0.0.1:7000", &e, None, false),
            Failure::cause(
                "ws://127.0.0.1:7000: this is a relay; use relay+ws://127.0.0.1:7000/ENVIRONMENT_ID"
            )
        );
        let e = ClientError::Connect(format!("HTTP 404 Not Found: {NOISE_SERVER_SAYS}; use …"));
        assert_eq!(
            connect_failure("ws://h:1", &e, None, false).words,
            "ws://h:1: this is an exec server speaking Noise; use noise+ws://h:1"
        );
    }

    #[test]
    fn every_cause_names_the_url_and_what_happened() {
        let url = "noise+ws://h:1";
        let e = ClientError::Connect(
            "cannot connect to noise+ws://h:1: cannot connect to ws://h:1/v1/link: Connection refused (os error 111)".into(),
        );
        assert_eq!(
            connect_failure(url, &e, None, false).words,
            "cannot connect to noise+ws://h:1: Connection refused (os error 111): is the exec \
             server (or relay) running and listening on that address and port?"
        );
        let e = ClientError::Connect("cannot connect to noise+ws://h:1: timed out".into());
        assert_eq!(
            connect_failure(url, &e, None, false).words,
            "cannot connect to noise+ws://h:1: timed out"
        );
        let e = ClientError::Refused("its key is not authorized".into());
        let f = connect_failure(url, &e, Some("/k (SHA256:ab)"), true);
        assert_eq!(f.status, 255);
        assert_eq!(
            f.words,
            "noise+ws://h:1 refused this client: its key is not authorized (key /k (SHA256:ab), \
             with a token): add this key's public line (its .pub file, or `execrelay keygen -y -f \
             KEY`) to the server's authorized_keys, or check the token (--token-file) against the \
             server's"
        );
        let e = ClientError::Refused("check --server-key and --key".into());
        assert_eq!(
            connect_failure(url, &e, None, false).words,
            "noise+ws://h:1 refused this client: check --server-key and --key"
        );
        assert!(
            connect_failure(url, &ClientError::SessionExpired, None, false)
                .words
                .starts_with("the session expired on noise+ws://h:1")
        );
    }
}
