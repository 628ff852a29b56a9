//! Commands that outlive their client, through the built binary: `run --detach` prints a
//! handle and exits; the command runs on; `attach` shows every byte from the first (or from
//! where the last attach stopped, `--since-last`), detaches again on Ctrl-C and ends with the
//! command's status; `ps` lists, `kill` signals; the session outlives the server's default
//! TTL by asking `sessionTtlMs`, and a TTL above the server's most is refused. Resume tokens
//! live in `$XDG_STATE_HOME/execrelay/detached/`, mode 0600.
//!
//! Every wait is on output, an exit, a file or the server's metrics, bounded by a hang guard.
//! The TTLs themselves are tested on a simulated clock (`session/table/tests.rs`,
//! `sessions.rs`); here, that the client asks for them and the server holds to them.

mod common;
use common::binary::{output_of, serve_cmd};
use common::*;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// A client's home: `HOME`, `XDG_CONFIG_HOME`, `XDG_STATE_HOME` of its own.
struct Home {
    dir: tempfile::TempDir,
}

impl Home {
    fn new() -> Home {
        Home {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(bin());
        c.args(args)
            .env_remove("RUST_LOG")
            .env_remove("EXECRELAY_CONFIG")
            .env("HOME", self.dir.path())
            .env("XDG_CONFIG_HOME", self.dir.path().join("config"))
            .env("XDG_STATE_HOME", self.state())
            .stdin(Stdio::null())
            .kill_on_drop(true);
        c
    }

    async fn out(&self, args: &[&str]) -> Output {
        output_of(&mut self.cmd(args)).await
    }

    /// `run --detach URL ARGS…`: the handle it printed.
    async fn detach(&self, url: &str, args: &[&str]) -> String {
        let mut all = vec!["run", "--detach", url];
        all.extend_from_slice(args);
        let o = self.out(&all).await;
        assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
        let handle = text(&o.stdout).trim().to_string();
        assert!(
            handle.starts_with("s-") && handle.ends_with("/p-1"),
            "{handle:?}"
        );
        handle
    }
}

/// `execrelay serve --listen ws://127.0.0.1:0 EXTRA…`: the child and its URL.
async fn ws_server(extra: &[&str]) -> (Child, String) {
    let mut child = serve_cmd("ws://127.0.0.1:0", Stdio::null())
        .args(extra)
        .env_remove("RUST_LOG")
        .spawn()
        .expect("spawn serve");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let url = tokio::time::timeout(GUARD, lines.next_line())
        .await
        .expect("serve printed its URL (hang guard)")
        .unwrap()
        .expect("a URL line");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, url)
}

/// [`ws_server`] with `--metrics-listen 127.0.0.1:0`: also the metrics address.
async fn ws_server_with_metrics(extra: &[&str]) -> (Child, String, String) {
    let mut child = serve_cmd("ws://127.0.0.1:0", Stdio::piped())
        .args(["--metrics-listen", "127.0.0.1:0"])
        .args(extra)
        .env("RUST_LOG", "warn")
        .spawn()
        .expect("spawn serve");
    let mut err = BufReader::new(child.stderr.take().unwrap()).lines();
    let metrics = tokio::time::timeout(GUARD, async {
        loop {
            let line = err.next_line().await.unwrap().expect("the metrics line");
            if let Some(rest) = line.strip_prefix("execrelay metrics: http://") {
                break rest.trim_end_matches("/metrics").to_string();
            }
        }
    })
    .await
    .expect("serve printed its metrics address (hang guard)");
    tokio::spawn(async move { while let Ok(Some(_)) = err.next_line().await {} });
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let url = tokio::time::timeout(GUARD, lines.next_line())
        .await
        .expect("serve printed its URL (hang guard)")
        .unwrap()
        .expect("a URL line");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, url, metrics)
}

/// How many sessions the server at metrics address `addr` holds, attached or not (read
/// without resuming any, which would restart its TTL).
async fn sessions_held(addr: &str) -> f64 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    };
    let body = tokio::time::timeout(GUARD, exchange)
        .await
        .expect("metrics answer (hang guard)");
    let gauges: Vec<f64> = body
        .lines()
        .filter(|l| l.starts_with("execrelay_sessions{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(gauges.len(), 2, "attached and detached: {body}");
    gauges.iter().sum()
}

/// `attach` until its stdout shows `until` (a whole line), then Ctrl-C: what it showed, its
/// status and its stderr.
async fn attach_until(home: &Home, args: &[&str], until: &str) -> (Vec<String>, i32, String) {
    let mut all = vec!["attach"];
    all.extend_from_slice(args);
    let mut child = home
        .cmd(&all)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut shown = Vec::new();
    loop {
        let line = tokio::time::timeout(GUARD, out.next_line())
            .await
            .expect("attach showed the line (hang guard)")
            .unwrap()
            .unwrap_or_else(|| panic!("attach ended before {until:?}: {shown:?}"));
        let done = line == until;
        shown.push(line);
        if done {
            break;
        }
    }
    kill(Pid::from_raw(child.id().unwrap() as i32), Signal::SIGINT).unwrap();
    let o = tokio::time::timeout(GUARD, child.wait_with_output())
        .await
        .expect("attach ends on Ctrl-C (hang guard)")
        .unwrap();
    (shown, o.status.code().unwrap(), text(&o.stderr))
}

/// A script that prints `line 1` … `line N`, then waits for `go1` and prints `second`, waits
/// for `go2` and prints `third`, and exits 3.
fn staged(n: u32, dir: &Path) -> String {
    format!(
        "i=0; while [ $i -lt {n} ]; do i=$((i+1)); echo line $i; done; \
         while [ ! -e {g1} ]; do sleep 0.05; done; echo second; \
         while [ ! -e {g2} ]; do sleep 0.05; done; echo third; exit 3",
        g1 = dir.join("go1").display(),
        g2 = dir.join("go2").display()
    )
}

#[tokio::test]
async fn attach_shows_every_byte_from_the_first_and_ends_with_the_status() {
    let (_server, url) = ws_server(&[]).await;
    let home = Home::new();
    let marks = tempfile::tempdir().unwrap();
    let handle = home.detach(&url, &[&staged(100, marks.path())]).await;

    // The resume token is kept, readable by its owner alone.
    let dir = home.state().join("execrelay").join("detached");
    assert_eq!(
        std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
        0o700
    );
    let file = dir.join(format!("{}.json", handle.split('/').next().unwrap()));
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );

    // The client that started it is gone. The first attach shows from the first line; Ctrl-C
    // detaches again, the command runs on.
    let (shown, code, err) = attach_until(&home, &[&url, &handle], "line 100").await;
    let expected: Vec<String> = (1..=100).map(|i| format!("line {i}")).collect();
    assert_eq!(shown, expected);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.starts_with("execrelay: detached; the command runs on"),
        "{err}"
    );

    // A second attach with --since-last goes on from there.
    std::fs::write(marks.path().join("go1"), "").unwrap();
    let (shown, code, _) = attach_until(&home, &["--since-last", &url, &handle], "second").await;
    assert_eq!(shown, vec!["second".to_string()], "only what came after");
    assert_eq!(code, 0);

    // The third, from the first byte again, to the end: every line, then the status.
    std::fs::write(marks.path().join("go2"), "").unwrap();
    let o = home.out(&["attach", &url, &handle]).await;
    let mut expected: Vec<String> = (1..=100).map(|i| format!("line {i}")).collect();
    expected.extend(["second".into(), "third".into()]);
    assert_eq!(text(&o.stdout).lines().collect::<Vec<_>>(), expected);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o.stderr));
    assert_eq!(text(&o.stderr), "");
    // Its end was shown: it is forgotten here and on the server.
    assert!(!file.exists());
    let o = home.out(&["attach", &url, &handle]).await;
    assert_eq!(o.status.code(), Some(255));
    assert!(
        text(&o.stderr).contains("no detached command"),
        "{}",
        text(&o.stderr)
    );
}

#[tokio::test]
async fn ps_lists_and_kill_signals_detached_commands() {
    let (_server, url) = ws_server(&[]).await;
    let home = Home::new();
    // Nothing detached yet: the header alone on stdout, and a line on stderr saying so.
    let o = home.out(&["ps", &url]).await;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout).lines().count(), 1, "{}", text(&o.stdout));
    assert_eq!(
        text(&o.stderr).trim_end(),
        format!(
            "execrelay: no detached commands started from this client on {url} \
             (`execrelay run --detach {url} CMD` starts one)"
        )
    );
    let a = home.detach(&url, &["sleep 100"]).await;
    let b = home.detach(&url, &["--", "sleep", "101"]).await;
    let o = home.out(&["ps", &url]).await;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let listing = text(&o.stdout);
    let lines: Vec<&str> = listing.lines().collect();
    assert!(
        lines[0].starts_with("HANDLE") && lines[0].ends_with("COMMAND"),
        "{listing}"
    );
    let row = |h: &str| {
        lines
            .iter()
            .find(|l| l.starts_with(h))
            .unwrap_or_else(|| panic!("{h} not listed: {listing}"))
            .split_whitespace()
            .collect::<Vec<_>>()
    };
    assert_eq!(row(&a)[1..3], ["running", "-"]);
    assert_eq!(row(&a)[4..], ["sleep", "100"]);
    assert_eq!(row(&b)[4..], ["sleep", "101"]);

    let o = home.out(&["kill", "-s", "KILL", &url, &a]).await;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    // A unique start of the handle is enough.
    let o = home.out(&["kill", &url, &b[..12]]).await;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    // Both end: polled through ps (bounded).
    let deadline = tokio::time::Instant::now() + GUARD;
    loop {
        let listing = text(&home.out(&["ps", &url]).await.stdout);
        let state = |h: &str| {
            listing.lines().find(|l| l.starts_with(h)).map(|l| {
                l.split_whitespace()
                    .skip(1)
                    .take(2)
                    .collect::<Vec<_>>()
                    .join(" ")
            })
        };
        if state(&a).as_deref() == Some("exited SIGKILL")
            && state(&b).as_deref() == Some("exited SIGTERM")
        {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{listing}");
        // Pacing of the poll (each `ps` resumes both sessions), not a synchronisation.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let o = home.out(&["attach", &url, &b]).await;
    assert_eq!(o.status.code(), Some(128 + 15));
    assert_eq!(
        text(&o.stderr),
        "execrelay: the command was terminated by a client (killed by SIGTERM)\n"
    );
    let o = home.out(&["kill", "-s", "BOGUS", &url, &a]).await;
    assert_eq!(o.status.code(), Some(2));
}

#[tokio::test]
async fn a_detached_session_outlives_the_default_ttl_and_not_its_own() {
    // The server's default TTL is 300 ms and it grants at most 10 s.
    let (_server, url, metrics) = ws_server_with_metrics(&[
        "--detached-session-ttl-ms",
        "300",
        "--max-session-ttl",
        "10s",
    ])
    .await;
    let home = Home::new();
    // Asking for more than the server grants, explicitly: refused, with the server's words.
    let o = home
        .out(&["run", "--detach", "--session-ttl", "20s", &url, "true"])
        .await;
    assert_eq!(o.status.code(), Some(255));
    assert_eq!(
        text(&o.stderr),
        format!("execrelay: {url}: sessionTtlMs 20000 is above this server's max_session_ttl_ms (10000)\n")
    );
    // By default it asks for a day and takes the server's most, saying so.
    let o = home
        .out(&["run", "--detach", &url, "echo kept; sleep 100"])
        .await;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let kept = text(&o.stdout).trim().to_string();
    assert_eq!(
        text(&o.stderr),
        "execrelay: the server keeps a detached session 10s at most (asked for 1d)\n"
    );
    // A short TTL of its own.
    let short = home
        .detach(&url, &["--session-ttl", "500ms", "echo short"])
        .await;
    // Until the short one (500 ms) is gone, and with it the default TTL (300 ms) has passed
    // for both.
    let deadline = tokio::time::Instant::now() + GUARD;
    while sessions_held(&metrics).await != 1.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the short session expires (hang guard)"
        );
        // Pacing of the poll (a scrape resumes nothing), not a synchronisation.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (shown, code, _) = attach_until(&home, &[&url, &kept], "kept").await;
    assert_eq!(
        (shown, code),
        (vec!["kept".to_string()], 0),
        "kept past the default"
    );
    let o = home.out(&["attach", &url, &short]).await;
    assert_eq!(o.status.code(), Some(255));
    assert_eq!(
        text(&o.stderr),
        format!("execrelay: {short}: the session expired on {url} (it outlived its TTL detached, or was closed); forgotten here\n")
    );
    let o = home.out(&["kill", "-s", "KILL", &url, &kept]).await;
    assert_eq!(o.status.code(), Some(0));
}
