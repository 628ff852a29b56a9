//! `execrelay serve` stops on `SIGTERM` whatever became of the stream its logs go to: a log
//! collector that died, or `| head`, leaves stderr a pipe without a reader.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// How long a signalled server may take before the test calls it stuck (a bound for a failing
/// test; a server that works exits in milliseconds).
const EXIT_BOUND: Duration = Duration::from_secs(30);

/// Before: the signal handler's own log line failed, the subscriber reported that with
/// `eprintln!`, which panicked on the broken pipe and killed the handler's task before it
/// cancelled anything; the server served on, deaf to `SIGTERM`.
#[test]
fn sigterm_stops_a_server_whose_log_reader_is_gone() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_execrelay"))
        .args(["serve", "--listen", "ws://127.0.0.1:0"])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the server");
    // The URL is printed once the signal handlers are installed and the listener is bound.
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut url = String::new();
    out.read_line(&mut url).expect("read the URL");
    assert!(url.starts_with("ws://127.0.0.1:"), "{url:?}");
    // The log reader goes away.
    drop(child.stderr.take());
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    match rx.recv_timeout(EXIT_BOUND) {
        Ok(status) => {
            let status = status.expect("wait");
            assert_eq!(status.code(), Some(0), "{status:?}");
        }
        Err(_) => {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            panic!("the server did not stop within {EXIT_BOUND:?} of SIGTERM");
        }
    }
}
