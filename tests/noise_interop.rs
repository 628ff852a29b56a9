//! Interoperability of the `noise+ws://` listener with an independent Noise client
//! (`tests/interop/noise_client.py`, written from `secure-transport.md` on top of the Python
//! `noiseprotocol` package, not from our code): keys made by `execrelay keygen`, the IK
//! handshake bound to its stream by the prologue, explicit-nonce records, the frame header,
//! and JSON-RPC over the stream (`initialize`, `process/start` of `echo`, its output and exit).
//! Also that a handshake message 1 replayed on another stream of the same link, or with its own
//! stream id on another link, is reset, and that a client whose clock is 11 minutes off is
//! refused with a log line that says so (`secure-transport.md` §3, `ts`). And that the same
//! client, asking for binary output (`protocol.md` §5.1), decodes the server's binary deltas
//! from the layout in the spec alone; that it speaks both Noise suites (§3: ChaChaPoly and
//! AESGCM, chosen in the `OPEN`'s flags), and that a server restricted to suite 0 resets a
//! suite 1 `OPEN` with `unsupported_suite`.
//!
//! Needs `python3` with the `venv` module (Debian: the `python3-venv` package). On first use
//! the tests build their own virtual environment, `target/interop-venv`, and install
//! `tests/interop/requirements.txt` into it with pip (PyPI must be reachable then); later runs
//! reuse it while the requirements file is unchanged. A lock file serializes the tests (and
//! test processes) that would build it at once. Without Python these tests FAIL, with a
//! message saying what to install: they never skip. `EXECRELAY_INTEROP_PYTHON` names an
//! interpreter to use instead, which must already have the packages.

mod common;
use common::binary::{first_line, output_of, serve_cmd};
use common::interop::{python, CLIENT_SCRIPT};
use common::*;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};

use serde_json::Value;
use tokio::io::{BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

/// `execrelay keygen -o DIR/NAME`: returns the private key path (`NAME.pub` beside it).
async fn keygen(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    let out = Command::new(bin())
        .arg("keygen")
        .arg("-o")
        .arg(&path)
        .stdin(Stdio::null())
        .output()
        .await
        .expect("spawn execrelay keygen");
    assert!(
        out.status.success(),
        "execrelay keygen -o {}: {:?}\n{}",
        path.display(),
        out.status,
        text(&out.stderr)
    );
    let mode = std::fs::metadata(&path)
        .expect("keygen wrote no private key")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "private key mode {mode:o}");
    let public = std::fs::read_to_string(pub_path(&path)).expect("keygen wrote no NAME.pub");
    assert!(
        public.starts_with("execrelay-x25519 "),
        "NAME.pub line: {public:?}"
    );
    path
}

fn pub_path(private: &Path) -> PathBuf {
    let mut p = private.as_os_str().to_owned();
    p.push(".pub");
    PathBuf::from(p)
}

/// A `serve --listen noise+ws://127.0.0.1:0` server with fresh keys, authorizing one client.
struct Fixture {
    dir: tempfile::TempDir,
    server: Child,
    /// Kept open so that the server never writes to a closed pipe.
    _stdout: Lines<BufReader<ChildStdout>>,
    url: String,
    server_key: PathBuf,
    client_key: PathBuf,
}

impl Fixture {
    async fn start() -> Fixture {
        Fixture::start_with(&[]).await
    }

    /// A server with `extra` arguments to `execrelay serve`.
    async fn start_with(extra: &[&str]) -> Fixture {
        // Fail first on a missing Python, with what to install.
        python().await;
        let dir = tempfile::tempdir().expect("temp dir");
        let server_key = keygen(dir.path(), "server").await;
        let client_key = keygen(dir.path(), "client").await;
        let client_pub = std::fs::read_to_string(pub_path(&client_key)).expect("read client key");
        let authorized = dir.path().join("authorized_keys");
        std::fs::write(
            &authorized,
            format!("# the interop test's client\n{}\n", client_pub.trim_end()),
        )
        .expect("write authorized keys");

        let log = std::fs::File::create(dir.path().join("server.log")).expect("server log");
        let mut server = serve_cmd("noise+ws://127.0.0.1:0", log)
            .arg("--key")
            .arg(&server_key)
            .arg("--authorized-keys")
            .arg(&authorized)
            .args(extra)
            .spawn()
            .expect("spawn execrelay serve");
        let (first, stdout) = first_line(&mut server, GUARD).await;
        let mut fixture = Fixture {
            dir,
            server,
            _stdout: stdout,
            url: String::new(),
            server_key,
            client_key,
        };
        match first {
            Some(url) if url.starts_with("noise+ws://127.0.0.1:") => fixture.url = url,
            other => panic!(
                "expected the bound URL noise+ws://127.0.0.1:PORT, got {other:?}\n{}",
                fixture.server_log()
            ),
        }
        fixture
    }

    fn server_log(&self) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default();
        format!("--- server stderr ---\n{log}")
    }

    /// Run the Python client with `extra` arguments, within [`GUARD`] (it gives up by itself
    /// after 20 s).
    async fn client(&self, extra: &[&str]) -> Output {
        output_of(
            Command::new(python().await)
                .arg(CLIENT_SCRIPT)
                .arg(&self.url)
                .arg(pub_path(&self.server_key))
                .arg(&self.client_key)
                .args(extra)
                .env("PYTHONDONTWRITEBYTECODE", "1")
                .env("PYTHONUNBUFFERED", "1"),
        )
        .await
    }

    /// Everything worth showing when an assertion fails.
    fn report(&self, out: &Output) -> String {
        format!(
            "client exit: {:?}\n--- client stdout ---\n{}--- client stderr ---\n{}{}",
            out.status,
            text(&out.stdout),
            text(&out.stderr),
            self.server_log()
        )
    }

    async fn stop(mut self) {
        self.server.start_kill().expect("kill the server");
        tokio::time::timeout(GUARD, self.server.wait())
            .await
            .expect("server did not exit after SIGKILL (hang guard)")
            .expect("wait for the server");
    }
}

/// The lines of `out`'s stdout.
fn lines(out: &Output) -> Vec<String> {
    text(&out.stdout).lines().map(str::to_string).collect()
}

/// The JSON after `INITIALIZE_RESULT `, checked for protocol version 1 and a session id.
fn check_initialize(lines: &[String], report: &str) {
    let line = lines
        .iter()
        .find_map(|l| l.strip_prefix("INITIALIZE_RESULT "))
        .unwrap_or_else(|| panic!("no INITIALIZE_RESULT line\n{report}"));
    let result: Value = serde_json::from_str(line)
        .unwrap_or_else(|e| panic!("INITIALIZE_RESULT is not JSON ({e})\n{report}"));
    assert_eq!(result["protocolVersion"], 1, "{report}");
    let session = result["sessionId"].as_str().unwrap_or_default();
    assert!(!session.is_empty(), "no sessionId\n{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_noise_client_initializes_and_runs_a_command() {
    runs_a_command_in_suite("0").await;
}

/// Suite 1 (`Noise_IK_25519_AESGCM_BLAKE2s`, `secure-transport.md` §3): the independent
/// client writes 1 in the `OPEN`'s flags, handshakes in AESGCM and seals its records with
/// AESGCM's big-endian nonces; the server answers in kind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_noise_client_speaks_suite_1() {
    runs_a_command_in_suite("1").await;
}

/// A server restricted to suite 0 resets the independent client's suite 1 `OPEN` with
/// `unsupported_suite`, and takes its suite 0 `OPEN`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restricted_to_suite_0_resets_suite_1_with_unsupported_suite() {
    let fx = Fixture::start_with(&["--noise-suites", "chachapoly"]).await;
    let out = fx.client(&["--suite", "1"]).await;
    let report = fx.report(&out);
    assert!(
        lines(&out)
            .iter()
            .any(|l| l.starts_with("ERROR") && l.contains("'unsupported_suite'")),
        "{report}"
    );
    assert_eq!(out.status.code(), Some(2), "{report}");
    let out = fx.client(&["--suite", "0"]).await;
    let report = fx.report(&out);
    assert!(lines(&out).iter().any(|l| l == "EXITED 0"), "{report}");
    assert_eq!(out.status.code(), Some(0), "{report}");
    fx.stop().await;
}

/// Binary writes (`protocol.md` §5.2) from the independent client, written from the spec's
/// layout alone: negotiated, answered by id, the `writeId` shared with a JSON write, a
/// malformed one answered `-32700`, and the close flag ending the child's input.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_noise_client_uploads_with_binary_writes() {
    let fx = Fixture::start().await;
    let out = fx.client(&["--binary-input", "--suite", "1"]).await;
    let report = fx.report(&out);
    let lines = lines(&out);
    let want = [
        "WRITE 3 accepted",
        "WRITE 4 accepted",
        "MALFORMED -32700",
        "WRITE 6 accepted",
        "OUTPUT interop-in|",
        "EXITED 0",
    ];
    let got: Vec<&str> = lines
        .iter()
        .map(String::as_str)
        .filter(|l| !l.starts_with("INITIALIZE_RESULT"))
        .collect();
    assert_eq!(got, want, "{report}");
    assert_eq!(out.status.code(), Some(0), "{report}");
    fx.stop().await;
}

async fn runs_a_command_in_suite(suite: &str) {
    let fx = Fixture::start().await;
    let out = fx.client(&["--suite", suite]).await;
    let report = fx.report(&out);
    let lines = lines(&out);
    assert!(
        !lines.iter().any(|l| l.starts_with("ERROR")),
        "client failed\n{report}"
    );
    check_initialize(&lines, &report);
    assert!(
        lines.iter().any(|l| l == "OUTPUT interop-ok"),
        "no `OUTPUT interop-ok`\n{report}"
    );
    let exited: Vec<_> = lines.iter().filter(|l| l.starts_with("EXITED")).collect();
    assert_eq!(exited, ["EXITED 0"], "{report}");
    // The output comes before the exit notice (protocol.md §5).
    let output_at = lines.iter().position(|l| l == "OUTPUT interop-ok");
    let exited_at = lines.iter().position(|l| l == "EXITED 0");
    assert!(output_at < exited_at, "{report}");
    assert_eq!(out.status.code(), Some(0), "{report}");
    fx.stop().await;
}

/// The Python client asks for binary output and decodes every delta from `protocol.md` §5.1
/// (kind, stream, seq, process id length, a non-ASCII id, the chunk): stdout and stderr arrive
/// as binary deltas with the right bytes, the exit notice as JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_noise_client_decodes_binary_output_deltas() {
    let fx = Fixture::start().await;
    let out = fx.client(&["--binary-output"]).await;
    let report = fx.report(&out);
    let lines = lines(&out);
    assert!(
        !lines.iter().any(|l| l.starts_with("ERROR")),
        "client failed\n{report}"
    );
    check_initialize(&lines, &report);
    let init: Value = serde_json::from_str(
        lines
            .iter()
            .find_map(|l| l.strip_prefix("INITIALIZE_RESULT "))
            .unwrap_or_default(),
    )
    .unwrap_or_default();
    assert_eq!(init["capabilities"]["binaryOutput"], true, "{report}");
    let forms: Vec<&String> = lines.iter().filter(|l| l.starts_with("FORM ")).collect();
    assert!(!forms.is_empty(), "no output delta\n{report}");
    assert!(
        forms.iter().all(|l| l.starts_with("FORM binary ")),
        "every delta is binary\n{report}"
    );
    assert!(forms.iter().any(|l| l.ends_with(" stdout")), "{report}");
    assert!(forms.iter().any(|l| l.ends_with(" stderr")), "{report}");
    assert!(lines.iter().any(|l| l == "OUTPUT interop-ok"), "{report}");
    assert!(lines.iter().any(|l| l == "STDERR interop-err"), "{report}");
    let exited: Vec<_> = lines.iter().filter(|l| l.starts_with("EXITED")).collect();
    assert_eq!(exited, ["EXITED 0"], "{report}");
    assert_eq!(out.status.code(), Some(0), "{report}");
    fx.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshake_replayed_on_another_stream_is_reset() {
    let fx = Fixture::start().await;
    let out = fx.client(&["--mode", "replay-on-other-stream"]).await;
    let report = fx.report(&out);
    let lines = lines(&out);
    let result = lines
        .iter()
        .find_map(|l| l.strip_prefix("REPLAY_RESULT "))
        .unwrap_or_else(|| panic!("no REPLAY_RESULT line\n{report}"));
    assert_eq!(
        result, "5",
        "the replayed OPEN must be answered with RESET (5), never ACCEPT (2)\n{report}"
    );
    // The genuine stream on the same link carries on (secure-transport.md §8).
    check_initialize(&lines, &report);
    assert_eq!(out.status.code(), Some(0), "{report}");
    fx.stop().await;
}

/// Issue 9 item 14: message 1 replayed *with its own stream id* on another link passes the
/// prologue; its `ts`, not above the one accepted for the key, gets it reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshake_replayed_on_another_link_is_reset() {
    let fx = Fixture::start().await;
    let out = fx.client(&["--mode", "replay-on-other-link"]).await;
    let report = fx.report(&out);
    let lines = lines(&out);
    let result = lines
        .iter()
        .find_map(|l| l.strip_prefix("REPLAY_RESULT "))
        .unwrap_or_else(|| panic!("no REPLAY_RESULT line\n{report}"));
    assert_eq!(
        result, "5 replayed_handshake",
        "the replayed OPEN must be answered with RESET (5) `replayed_handshake`\n{report}"
    );
    check_initialize(&lines, &report);
    assert_eq!(out.status.code(), Some(0), "{report}");
    assert!(
        fx.server_log()
            .contains("handshake refused: replayed message 1"),
        "{report}"
    );
    fx.stop().await;
}

/// `secure-transport.md` §3: a client whose clock is 3 minutes behind (beyond the ±2-minute
/// window) is refused before authorization, and the server's log says what is wrong and what
/// to fix; one minute ahead is within the window. (One minute behind would be earlier than
/// the server's start: refused `replayed_handshake`, tested in `noise_handshake.rs`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_clock_three_minutes_off_is_refused_with_a_clear_log_line() {
    let fx = Fixture::start().await;
    let out = fx.client(&["--ts-offset-seconds", "-180"]).await;
    let report = fx.report(&out);
    assert_eq!(
        lines(&out),
        ["ERROR stream reset during the handshake: 'clock_skew'"],
        "{report}"
    );
    assert_eq!(out.status.code(), Some(2), "{report}");
    let log = fx.server_log();
    let line = log
        .lines()
        .find(|l| l.contains("handshake refused"))
        .unwrap_or_else(|| panic!("no log line about the refusal\n{report}"));
    for what in [
        "WARN",
        "the peer's clock is 180.",
        "s behind ours, more than the 120 s allowed",
        "fix the clock of one of them",
        "client=SHA256:",
    ] {
        assert!(line.contains(what), "{what:?} missing from {line:?}");
    }
    // One minute ahead is within the window.
    let out = fx.client(&["--ts-offset-seconds", "60"]).await;
    let report = fx.report(&out);
    assert!(lines(&out).contains(&"EXITED 0".to_string()), "{report}");
    fx.stop().await;
}
