//! Signal names of the protocol. Signalling is by identity only: `ManagedProcess` goes
//! through the child's pidfd and its session scope (`containment/`), never `killpg` by a
//! number that may have been reused.

use nix::sys::signal::Signal;

/// The signals a client may send by name (`protocol.md` §4, `process/signal`).
pub fn parse_signal(name: &str) -> Option<Signal> {
    Some(match name {
        "SIGINT" => Signal::SIGINT,
        "SIGTERM" => Signal::SIGTERM,
        "SIGKILL" => Signal::SIGKILL,
        "SIGHUP" => Signal::SIGHUP,
        "SIGQUIT" => Signal::SIGQUIT,
        "SIGUSR1" => Signal::SIGUSR1,
        "SIGUSR2" => Signal::SIGUSR2,
        "SIGWINCH" => Signal::SIGWINCH,
        "SIGCONT" => Signal::SIGCONT,
        "SIGSTOP" => Signal::SIGSTOP,
        _ => return None,
    })
}

/// The name of a signal number as reported in the exit notice (`SIGKILL`), or `SIG<n>` for
/// a number this platform does not name.
pub fn signal_name(signo: i32) -> String {
    match Signal::try_from(signo) {
        Ok(s) => s.as_str().to_string(),
        Err(_) => format!("SIG{signo}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for n in [
            "SIGINT", "SIGTERM", "SIGKILL", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGWINCH",
            "SIGCONT", "SIGSTOP",
        ] {
            let s = parse_signal(n).unwrap();
            assert_eq!(signal_name(s as i32), n);
        }
        assert!(parse_signal("SIGSEGV").is_none());
        assert!(parse_signal("9").is_none());
    }
}
