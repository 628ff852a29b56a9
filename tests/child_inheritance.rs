//! What a command inherits from how the server was started, and what it must not.
//!
//! **Signals.** A server started with signals ignored does not pass them on: `nohup` ignores SIGHUP, and a
//! non-interactive shell starts `execrelay serve &` with SIGINT and SIGQUIT ignored (POSIX
//! has it do so for asynchronous lists). A child inherits ignored dispositions through
//! `execve`, and a shell cannot trap a signal ignored on entry, so without the reset every
//! command would shrug off the client's `process/signal SIGINT` or Ctrl-C.
//!
//! **The descriptor limit.** `execrelay serve` raises its own soft `RLIMIT_NOFILE` to the hard
//! limit for its connections; a command gets back the soft limit the server was started
//! with (a million descriptors would slow every program that closes up to its limit).
//!
//! This binary ignores those signals in its own process before any test starts a server,
//! and starts with a soft descriptor limit of its own that it then raises, as such a launch
//! would; no test here needs the signals delivered to itself.

mod common;
use common::process::*;

use std::sync::Once;

use serde_json::json;

/// The soft descriptor limit this binary starts its server with (below any hard limit a
/// test machine has: 1024 is the distributions' default soft limit).
const STARTED_SOFT: u64 = 1000;

/// The signals a background or `nohup` launch leaves ignored, ignored in this process; and
/// the soft descriptor limit set to [`STARTED_SOFT`], then raised as `execrelay serve` does.
/// Returns the hard limit.
fn start_like_a_background_job() -> u64 {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        use execrelay::bounds::descriptors::{nofile_limit, raise_nofile_limit};
        let hard = nofile_limit().expect("limit").hard;
        assert!(hard > STARTED_SOFT, "precondition: hard limit {hard}");
        let lim = libc::rlimit {
            rlim_cur: STARTED_SOFT,
            rlim_max: hard,
        };
        // SAFETY: lowers this process's soft limit; it holds far fewer descriptors.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0);
        let (_, after) = raise_nofile_limit().expect("raise");
        assert!(
            after.soft > STARTED_SOFT,
            "precondition: raised to {}",
            after.soft
        );
        for sig in [libc::SIGINT, libc::SIGQUIT, libc::SIGHUP] {
            // SAFETY: installs SIG_IGN, no handler code; nothing in this test binary relies on
            // these signals' default action for itself.
            let old = unsafe { libc::signal(sig, libc::SIG_IGN) };
            assert_ne!(old, libc::SIG_ERR, "signal({sig})");
        }
    });
    execrelay::bounds::descriptors::nofile_limit()
        .expect("limit")
        .hard
}

/// The `SigIgn:` mask from a `/proc/PID/status` text.
fn sig_ign(status: &[u8]) -> u64 {
    let text = String::from_utf8_lossy(status);
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("SigIgn:"))
        .unwrap_or_else(|| panic!("no SigIgn in {text}"));
    u64::from_str_radix(line.trim(), 16).expect("hex mask")
}

/// This process's own `SigIgn:` (the precondition: the launch really ignores them).
fn own_sig_ign() -> u64 {
    sig_ign(&std::fs::read("/proc/self/status").expect("own status"))
}

const fn bit(sig: i32) -> u64 {
    1 << (sig - 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_starts_with_no_signal_ignored_on_pipes_and_on_a_terminal() {
    start_like_a_background_job();
    let ours = own_sig_ign();
    for sig in [libc::SIGINT, libc::SIGQUIT, libc::SIGHUP] {
        assert_ne!(
            ours & bit(sig),
            0,
            "precondition: {sig} ignored here ({ours:x})"
        );
    }
    let mut ip = connect().await;
    let c = &mut ip.client;
    let (_, got) = run_checked(
        c,
        json!({"processId": "p", "argv": ["cat", "/proc/self/status"]}),
    )
    .await;
    assert_eq!(got.exit["exitCode"], 0, "{}", got.exit);
    assert_eq!(sig_ign(&got.stdout), 0, "on pipes");

    let (_, got) = run_checked(
        c,
        json!({"processId": "t", "argv": ["cat", "/proc/self/status"], "tty": true}),
    )
    .await;
    assert_eq!(got.exit["exitCode"], 0, "{}", got.exit);
    assert_eq!(sig_ign(&got.pty), 0, "on a terminal");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shell_traps_the_clients_sigint_and_a_plain_command_dies_of_it() {
    start_like_a_background_job();
    let mut ip = connect().await;
    let c = &mut ip.client;

    // The case that hung: a shell's INT trap, which cannot be set on an ignored signal.
    let trap = "trap 'exit 9' INT; echo ready; while :; do sleep 0.05; done";
    let got = signalled_when_ready(c, "i", trap, "SIGINT").await;
    assert_eq!(got.exit["exitCode"], 9, "{}", got.exit);
    assert_eq!(got.exit["reason"], "terminated", "{}", got.exit);

    // No trap: the default action ends it, by the signal sent.
    let got = signalled_when_ready(c, "q", "echo ready; exec sleep 100", "SIGQUIT").await;
    assert_eq!(got.exit["signal"], "SIGQUIT", "{}", got.exit);
    assert_eq!(got.exit["reason"], "terminated", "{}", got.exit);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_gets_the_descriptor_limit_the_server_was_started_with() {
    let hard = start_like_a_background_job();
    let mut ip = connect().await;
    let c = &mut ip.client;
    for (id, tty) in [("p", false), ("t", true)] {
        let (_, got) = run_checked(
            c,
            json!({"processId": id, "argv": ["sh", "-c", "ulimit -Sn; ulimit -Hn"], "tty": tty}),
        )
        .await;
        assert_eq!(got.exit["exitCode"], 0, "{}", got.exit);
        let out = if tty { &got.pty } else { &got.stdout };
        let text = String::from_utf8_lossy(out).replace('\r', "");
        let hard_text = if hard == libc::RLIM_INFINITY {
            "unlimited".to_string()
        } else {
            hard.to_string()
        };
        assert_eq!(text, format!("{STARTED_SOFT}\n{hard_text}\n"), "tty {tty}");
    }
}
