//! The local terminal: its size, raw mode (restored on drop), the one-line notices of a
//! connection being resumed, and the questions `run` asks on it (the server's approval
//! requests). Nothing here talks to a server.

use std::io::IsTerminal;
use std::os::fd::AsFd;

use std::time::Duration;

use crate::client::{ApprovalDecision, ApprovalHandler, ApproveParams, Client, ConnectionState};
use crate::rpc::messages::TermSize;

/// How long a lost connection may be being resumed before `run` says so (on a terminal):
/// a blip that resumes within it goes unmentioned.
pub const RESUME_NOTICE_AFTER: Duration = Duration::from_secs(1);

/// While `client`'s connection is being resumed for more than [`RESUME_NOTICE_AFTER`], and
/// stderr is a terminal, say so (`connection lost, resuming…`), and say when it is back
/// (`resumed`). Nothing is said to a file or a pipe: a script reads the exit status.
pub fn announce_resumes(client: &Client) {
    if !std::io::stderr().is_terminal() {
        return;
    }
    let mut state = client.connection_state();
    tokio::spawn(async move {
        loop {
            if state.changed().await.is_err() {
                return;
            }
            if *state.borrow_and_update() != ConnectionState::Resuming {
                continue;
            }
            let resuming = |s: &ConnectionState| *s != ConnectionState::Resuming;
            if tokio::time::timeout(RESUME_NOTICE_AFTER, state.wait_for(resuming))
                .await
                .is_ok()
            {
                continue;
            }
            super::failure::say("connection lost, resuming…");
            match state.wait_for(resuming).await.map(|s| s.clone()) {
                Ok(ConnectionState::Connected) => super::failure::say("resumed"),
                _ => return,
            }
        }
    });
}

/// The local terminal's size (of stdout), when it is a terminal.
pub fn local_size() -> Option<TermSize> {
    let out = std::io::stdout();
    if !out.is_terminal() {
        return None;
    }
    let mut ws = nix::pty::Winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes a winsize struct we own.
    let r = unsafe {
        libc::ioctl(
            std::os::fd::AsRawFd::as_raw_fd(&out.as_fd()),
            libc::TIOCGWINSZ,
            &mut ws,
        )
    };
    (r == 0 && ws.ws_row > 0).then_some(TermSize {
        rows: ws.ws_row,
        cols: ws.ws_col,
    })
}

/// Restores the terminal mode when dropped.
pub struct RawMode {
    saved: nix::sys::termios::Termios,
}

impl RawMode {
    /// Put the local terminal (stdin) in raw mode; `None` when stdin is no terminal.
    pub fn enable() -> Option<RawMode> {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return None;
        }
        let saved = nix::sys::termios::tcgetattr(stdin.as_fd()).ok()?;
        let mut raw = saved.clone();
        nix::sys::termios::cfmakeraw(&mut raw);
        nix::sys::termios::tcsetattr(stdin.as_fd(), nix::sys::termios::SetArg::TCSANOW, &raw)
            .ok()?;
        Some(RawMode { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let stdin = std::io::stdin();
        let _ = nix::sys::termios::tcsetattr(
            stdin.as_fd(),
            nix::sys::termios::SetArg::TCSANOW,
            &self.saved,
        );
    }
}

/// `run`'s answer to the server's approval requests: `--approve-all`, or a question on the
/// controlling terminal (like ssh's host-key question), denied when there is no terminal. A
/// request for anything but the one start `run` made (`process_id` running `argv`) is denied
/// without a question: a hostile or confused server cannot fill the terminal with prompts,
/// nor get "yes" for a command the user never typed, even under `--approve-all`.
pub fn approval_handler(
    approve_all: bool,
    process_id: &'static str,
    argv: Vec<String>,
) -> std::sync::Arc<dyn ApprovalHandler> {
    let argv = std::sync::Arc::new(argv);
    std::sync::Arc::new(move |request: ApproveParams| {
        let argv = argv.clone();
        async move {
            if !is_our_start(&request, process_id, &argv) {
                static WARNED: std::sync::atomic::AtomicBool =
                    std::sync::atomic::AtomicBool::new(false);
                if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    eprintln!(
                        "execrelay run: the server asked to approve a start this command did not make; denied (and every such request after it)"
                    );
                }
                return ApprovalDecision::Deny;
            }
            if approve_all {
                return ApprovalDecision::Approve;
            }
            tokio::task::spawn_blocking(move || ask_on_terminal(&request))
                .await
                .unwrap_or(ApprovalDecision::Deny)
        }
    })
}

/// Whether `request` asks about the start `run` made: its process id, running its argv.
fn is_our_start(request: &ApproveParams, process_id: &str, argv: &[String]) -> bool {
    request.process_id == process_id && request.argv == argv
}

/// One question at a time on the terminal.
static TERMINAL_QUESTION: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// `approve <argv> (rule: …)? [y/N]` on `/dev/tty`: `y` or `yes` approves, anything else
/// (an empty line, end of file) denies. Not stdin/stdout: those carry the command's data.
fn ask_on_terminal(request: &ApproveParams) -> ApprovalDecision {
    use std::io::{BufRead, Write};
    let _one = TERMINAL_QUESTION.lock().unwrap_or_else(|p| p.into_inner());
    let argv = display_argv(&request.argv);
    let tty = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty");
    let Ok(mut tty) = tty else {
        eprintln!(
            "execrelay run: the server asks to approve {argv} (rule: {}), and there is no terminal to ask on: denied (--approve-all approves without asking)",
            sanitize(&request.rule)
        );
        return ApprovalDecision::Deny;
    };
    let question = format!("approve {argv} (rule: {})? [y/N] ", sanitize(&request.rule));
    if tty
        .write_all(question.as_bytes())
        .and_then(|()| tty.flush())
        .is_err()
    {
        return ApprovalDecision::Deny;
    }
    let mut line = String::new();
    let mut reader = std::io::BufReader::new(tty);
    if reader.read_line(&mut line).is_err() {
        return ApprovalDecision::Deny;
    }
    match line.trim().to_ascii_lowercase().as_str() {
        "y" | "yes" => ApprovalDecision::Approve,
        _ => ApprovalDecision::Deny,
    }
}

/// `argv` as a shell would read it back: plain words as they are, others single-quoted;
/// control characters escaped, so a server cannot drive the terminal through a prompt.
fn display_argv(argv: &[String]) -> String {
    let plain = |a: &str| {
        !a.is_empty()
            && a.chars()
                .all(|c| c.is_ascii_alphanumeric() || "_@%+=:,./-".contains(c))
    };
    argv.iter()
        .map(|a| {
            if plain(a) {
                a.clone()
            } else {
                format!("'{}'", sanitize(a).replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// `text` with every control character escaped (`\n`, `\u{1b}`).
fn sanitize(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(id: &str, argv: &[&str]) -> ApproveParams {
        ApproveParams {
            process_id: id.into(),
            argv: argv.iter().map(|a| a.to_string()).collect(),
            cwd: "/".into(),
            env_names: Vec::new(),
            tty: false,
            rule: "default".into(),
        }
    }

    #[tokio::test]
    async fn approvals_for_starts_run_did_not_make_are_denied_without_asking() {
        let argv = vec!["make".to_string(), "test".to_string()];
        // --approve-all: only what `run` started is approved; no terminal is touched.
        let h = approval_handler(true, "run-1", argv.clone());
        assert_eq!(
            h.decide(request("run-1", &["make", "test"])).await,
            ApprovalDecision::Approve
        );
        assert_eq!(
            h.decide(request("other", &["make", "test"])).await,
            ApprovalDecision::Deny
        );
        assert_eq!(
            h.decide(request("run-1", &["rm", "-rf", "/"])).await,
            ApprovalDecision::Deny
        );
        assert!(is_our_start(
            &request("run-1", &["make", "test"]),
            "run-1",
            &argv
        ));
        assert!(!is_our_start(&request("run-1", &["make"]), "run-1", &argv));
    }

    #[test]
    fn prompts_show_argv_as_a_shell_reads_it_and_never_control_characters() {
        let argv = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            display_argv(&argv(&["rm", "-rf", "/tmp/x"])),
            "rm -rf /tmp/x"
        );
        assert_eq!(
            display_argv(&argv(&["sh", "-c", "echo it's"])),
            "sh -c 'echo it'\\''s'"
        );
        assert_eq!(display_argv(&argv(&["a\x1b[2Jb", ""])), "'a\\u{1b}[2Jb' ''");
        assert_eq!(sanitize("line\nbreak"), "line\\nbreak");
    }
}
