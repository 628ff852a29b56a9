//! What a command's end means for the command line: its exit status as shells give it (the
//! remote code, `128+N` for a signal, 124 after a timeout, 127 and 126 for a program that
//! could not be found or executed) and, when it did not simply exit, one line saying why
//! (the exit notice's `reason`, `protocol.md` §5). Shared by `run`, `attach` and `demo`.

use std::time::Duration;

use serde_json::Value;

use super::duration::show_duration;
use super::failure::{Failure, NOT_THE_COMMAND};
use crate::client::ClientError;
use crate::rpc::messages::{ExitInfo, ExitReason};

/// Exit status after `--timeout` (as `timeout(1)`).
pub const TIMED_OUT: i32 = 124;
/// Exit status of a program that could not be executed (as shells).
pub const CANNOT_EXECUTE: i32 = 126;
/// Exit status of a program that was not found (as shells).
pub const NOT_FOUND: i32 = 127;

/// `128+N` for death by signal `name` (as shells); 255 for a name this system does not know.
pub fn signal_status(name: &str) -> i32 {
    name.parse::<nix::sys::signal::Signal>()
        .map(|s| 128 + s as i32)
        .unwrap_or(NOT_THE_COMMAND)
}

/// The status of the process itself: its code, or `128+N`.
pub fn plain_status(info: &ExitInfo) -> i32 {
    match (info.exit_code, info.signal.as_deref()) {
        (Some(c), _) => c,
        (None, Some(sig)) => signal_status(sig),
        (None, None) => NOT_THE_COMMAND,
    }
}

/// How a command ended, for the command line: the exit status and, unless it simply exited,
/// the words that say why. `timeout` is what `--timeout` asked for; `interrupted`: this
/// command line forwarded the user's Ctrl-C (its `terminated` is the user's own doing and
/// needs no words).
pub fn command_end(
    info: &ExitInfo,
    timeout: Option<Duration>,
    interrupted: bool,
) -> (i32, Option<String>) {
    let status = plain_status(info);
    match info.reason {
        ExitReason::Exited => (status, None),
        ExitReason::Timeout => {
            let after = timeout.map_or_else(|| "its timeout".to_string(), show_duration);
            (TIMED_OUT, Some(format!("timed out after {after}")))
        }
        ExitReason::Terminated if interrupted => (status, None),
        ExitReason::Terminated => (
            status,
            Some(format!(
                "the command was terminated by a client ({})",
                how(info)
            )),
        ),
        ExitReason::OomKilled => (
            status,
            Some("the command was killed by the kernel's OOM killer (out of memory)".into()),
        ),
        ExitReason::ServerShutdown => (
            NOT_THE_COMMAND,
            Some(format!(
                "the server shut down; the command was ended ({})",
                how(info)
            )),
        ),
        ExitReason::SessionExpired => (
            NOT_THE_COMMAND,
            Some(format!(
                "the session expired; the command was ended ({})",
                how(info)
            )),
        ),
        ExitReason::SessionClosed => (
            NOT_THE_COMMAND,
            Some(format!(
                "the session was closed; the command was ended ({})",
                how(info)
            )),
        ),
    }
}

/// `exited with status 7` / `killed by SIGKILL`.
pub fn how(info: &ExitInfo) -> String {
    match (info.exit_code, info.signal.as_deref()) {
        (Some(c), _) => format!("exited with status {c}"),
        (None, Some(sig)) => format!("killed by {sig}"),
        (None, None) => "ended".into(),
    }
}

/// What to say and return when `process/start` failed with `e`: `-32007` for a program
/// not found is 127 (`nosuchprog: command not found`), one that cannot be executed 126,
/// anything else 255 with the server's words.
pub fn start_failure(url: &str, e: &ClientError, key: Option<&str>, token: bool) -> Failure {
    if let ClientError::Rpc {
        code: -32007,
        message,
        data,
    } = e
    {
        let field = |k: &str| {
            data.as_ref()
                .and_then(|d| d.get(k))
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        let (what, path, errno) = (field("what"), field("path"), field("errno"));
        return match (what.as_str(), errno.as_str()) {
            ("program", "ENOENT") if !path.contains('/') => Failure {
                status: NOT_FOUND,
                words: format!("{path}: command not found"),
            },
            ("program", "ENOENT") => Failure {
                status: NOT_FOUND,
                words: format!("{path}: no such file"),
            },
            ("program", "EACCES") => Failure {
                status: CANNOT_EXECUTE,
                words: format!("{path}: permission denied"),
            },
            ("program", "ENOEXEC") => Failure {
                status: CANNOT_EXECUTE,
                words: format!("{path}: cannot execute (not an executable format)"),
            },
            ("program", _) => Failure {
                status: CANNOT_EXECUTE,
                words: message.clone(),
            },
            _ => Failure::cause(message.clone()),
        };
    }
    if let ClientError::Rpc {
        code: -32006,
        message,
        ..
    } = e
    {
        return Failure::cause(format!("{url}: {message}"));
    }
    super::failure::connect_failure(url, e, key, token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn info(code: Option<i32>, signal: Option<&str>, reason: ExitReason) -> ExitInfo {
        ExitInfo {
            exit_code: code,
            signal: signal.map(String::from),
            reason,
            timed_out: reason == ExitReason::Timeout,
            output_drain_timed_out: false,
            stdout_bytes: 0,
            stderr_bytes: 0,
            dropped_bytes: 0,
            duration_ms: 0,
        }
    }

    #[test]
    fn statuses_are_the_shells_and_causes_have_words() {
        use ExitReason as R;
        assert_eq!(
            command_end(&info(Some(3), None, R::Exited), None, false),
            (3, None)
        );
        assert_eq!(
            command_end(&info(None, Some("SIGKILL"), R::Exited), None, false),
            (137, None)
        );
        assert_eq!(
            command_end(
                &info(None, Some("SIGTERM"), R::Timeout),
                Some(Duration::from_secs(5)),
                false
            ),
            (124, Some("timed out after 5s".into()))
        );
        let (s, w) = command_end(&info(None, Some("SIGTERM"), R::ServerShutdown), None, false);
        assert_eq!(s, 255);
        assert!(w.unwrap().starts_with("the server shut down"));
        assert_eq!(
            command_end(&info(Some(130), None, R::Terminated), None, true),
            (130, None)
        );
        let (s, w) = command_end(&info(None, Some("SIGKILL"), R::OomKilled), None, false);
        assert_eq!(s, 137);
        assert!(w.unwrap().contains("OOM"));
        assert_eq!(how(&info(Some(7), None, R::Exited)), "exited with status 7");
        assert_eq!(
            how(&info(None, Some("SIGKILL"), R::Exited)),
            "killed by SIGKILL"
        );
    }

    #[test]
    fn start_errors_map_to_127_and_126() {
        let e = |what: &str, path: &str, errno: &str| ClientError::Rpc {
            code: -32007,
            message: "m".into(),
            data: Some(json!({"what": what, "path": path, "errno": errno})),
        };
        let f = start_failure("u", &e("program", "nosuchprog", "ENOENT"), None, false);
        assert_eq!(
            (f.status, f.words.as_str()),
            (127, "nosuchprog: command not found")
        );
        let f = start_failure("u", &e("program", "/x", "EACCES"), None, false);
        assert_eq!((f.status, f.words.as_str()), (126, "/x: permission denied"));
        let f = start_failure("u", &e("cwd", "/x", "ENOENT"), None, false);
        assert_eq!((f.status, f.words.as_str()), (255, "m"));
    }
}
