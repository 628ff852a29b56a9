//! Black-box tests of the built binary's `execrelay run` (`processes.md` §7): it behaves like
//! `ssh host cmd`. Remote stdout/stderr reach the local ones byte for byte, local stdin is
//! forwarded and closed at end of file, `-e`/`-C`/`--timeout` reach the command, `-t` gives the
//! command a terminal of the local size (raw local terminal, size changes forwarded, terminal
//! restored afterwards), Ctrl-C is forwarded as `SIGINT`, and the exit status is the remote one
//! (`128+N` for a signal), for `--local` and for a `ws://` server. Also bad usage and how `run`
//! ends when its server goes away.
//!
//! Every test waits on output or on process exit, never on a sleep; every wait is bounded.
//! Children run with `RUST_LOG` removed, as a user would run them.

mod common;
use common::binary::{output_of, serve_cmd};
use common::pty::*;
use common::*;

use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

/// `execrelay run ARGS…` with null stdin, piped stdout/stderr, `RUST_LOG` unset, killed if
/// the test gives up on it.
fn run_cmd(args: &[&str]) -> Command {
    let mut c = Command::new(bin());
    c.arg("run")
        .args(args)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    c
}

/// The exit code; panics (with the signal) if the process died by a signal.
fn code(status: &ExitStatus) -> i32 {
    status
        .code()
        .unwrap_or_else(|| panic!("execrelay run died by signal {:?}", status.signal()))
}

/// Lines of a child's stdout, each read within [`GUARD`].
struct LineReader(Lines<BufReader<ChildStdout>>);

impl LineReader {
    fn new(child: &mut Child) -> Self {
        let out = child.stdout.take().expect("stdout is piped");
        LineReader(BufReader::new(out).lines())
    }

    async fn next(&mut self) -> Option<String> {
        tokio::time::timeout(GUARD, self.0.next_line())
            .await
            .expect("timed out waiting for a line (hang guard)")
            .expect("read stdout")
    }

    /// Wait for `ready PID`, printed by the test scripts; returns the remote shell's pid
    /// (also its process group: the server starts every command in its own session).
    async fn ready(&mut self) -> i32 {
        let line = self.next().await.expect("stdout closed before `ready`");
        let pid = line
            .strip_prefix("ready ")
            .unwrap_or_else(|| panic!("expected `ready PID`, got {line:?}"));
        pid.parse().expect("pid")
    }

    /// Everything left, within [`GUARD`].
    async fn rest(self) -> String {
        let mut inner = self.0.into_inner();
        let mut s = String::new();
        tokio::time::timeout(GUARD, inner.read_to_string(&mut s))
            .await
            .expect("stdout not closed (hang guard)")
            .expect("read stdout");
        s
    }
}

/// Kill a remote command's process group left behind by a failing test (best effort).
fn reap_group(pgid: i32) {
    let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
}

/// A script that reports `ready $$`, prints `got-int` and exits 9 on SIGINT, and otherwise
/// runs until killed.
const INT_SCRIPT: &str =
    "trap 'echo got-int; exit 9' INT; echo ready $$; while :; do sleep 0.1; done";

// ---------------------------------------------------------------------------------------------
// Streams and exit status
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn local_stdout_stderr_and_exit_code_are_the_remote_ones() {
    let o = output_of(&mut run_cmd(&[
        "--local",
        "--",
        "sh",
        "-c",
        "echo out; echo err >&2; exit 3",
    ]))
    .await;
    assert_eq!(code(&o.status), 3, "stderr: {}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "out\n");
    // Regression (fixed in 3577aea): the spawned `serve --listen stdio` inherits run's stderr
    // and used to log at `info` with RUST_LOG unset, putting `INFO … initialized session=…`
    // lines around the command's own stderr.
    assert_eq!(
        text(&o.stderr),
        "err\n",
        "stderr must be exactly the command's stderr"
    );
}

#[tokio::test]
async fn death_by_signal_maps_to_128_plus_n() {
    let o = output_of(&mut run_cmd(&[
        "--local",
        "--",
        "sh",
        "-c",
        "kill -TERM $$",
    ]))
    .await;
    assert_eq!(code(&o.status), 128 + 15, "stderr: {}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "");
}

#[tokio::test]
async fn large_output_is_byte_exact() {
    let o = output_of(&mut run_cmd(&[
        "--local",
        "--",
        "sh",
        "-c",
        "seq 1 2000000",
    ]))
    .await;
    assert_eq!(code(&o.status), 0, "stderr: {}", text(&o.stderr));
    let expected = std::process::Command::new("seq")
        .args(["1", "2000000"])
        .output()
        .expect("run seq locally");
    assert!(expected.status.success());
    if o.stdout != expected.stdout {
        let first_diff = o
            .stdout
            .iter()
            .zip(&expected.stdout)
            .position(|(a, b)| a != b);
        panic!(
            "output differs: got {} bytes, expected {}; first differing byte at {first_diff:?}",
            o.stdout.len(),
            expected.stdout.len()
        );
    }
}

// ---------------------------------------------------------------------------------------------
// stdin
// ---------------------------------------------------------------------------------------------

/// Run with `data` piped into stdin (closed after it), reading stdout concurrently.
async fn with_stdin(args: &[&str], data: Vec<u8>) -> Output {
    let mut cmd = run_cmd(args);
    cmd.stdin(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn execrelay");
    let mut stdin = child.stdin.take().expect("stdin is piped");
    let writer = tokio::spawn(async move {
        stdin.write_all(&data).await.expect("write stdin");
        // Dropping `stdin` closes it: end of file.
    });
    let out = tokio::time::timeout(GUARD, child.wait_with_output())
        .await
        .expect("execrelay run did not exit (hang guard)")
        .expect("wait for execrelay run");
    writer.await.expect("stdin writer");
    out
}

/// 3 MiB + 17 bytes that are not all alike.
fn stdin_data() -> Vec<u8> {
    (0..3 * 1024 * 1024 + 17u32)
        .map(|i| (i % 251) as u8)
        .collect()
}

#[tokio::test]
async fn stdin_is_forwarded_and_closed_at_eof() {
    let data = stdin_data();
    assert_eq!(data.len(), 3_145_745);
    let o = with_stdin(&["--local", "--", "wc", "-c"], data).await;
    assert_eq!(code(&o.status), 0, "stderr: {}", text(&o.stderr));
    assert_eq!(text(&o.stdout).trim(), "3145745");
}

#[tokio::test]
async fn stdin_round_trips_byte_exact() {
    let data = stdin_data();
    let o = with_stdin(&["--local", "--", "cat"], data.clone()).await;
    assert_eq!(code(&o.status), 0, "stderr: {}", text(&o.stderr));
    assert_eq!(o.stdout.len(), data.len());
    assert!(o.stdout == data, "cat echoed different bytes");
}

#[tokio::test]
async fn empty_stdin_is_end_of_file() {
    let o = output_of(&mut run_cmd(&["--local", "--", "wc", "-c"])).await;
    assert_eq!(code(&o.status), 0, "stderr: {}", text(&o.stderr));
    assert_eq!(text(&o.stdout).trim(), "0");
}

// ---------------------------------------------------------------------------------------------
// -e, -C, --timeout
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn env_flag_sets_a_variable() {
    let o = output_of(&mut run_cmd(&[
        "--local",
        "-e",
        "FOO=bar",
        "-e",
        "EMPTY=",
        "--",
        "sh",
        "-c",
        "echo \"$FOO\"; echo \"${EMPTY-unset}.\"",
    ]))
    .await;
    assert_eq!(code(&o.status), 0, "stderr: {}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "bar\n.\n");
}

#[tokio::test]
async fn cwd_flag_sets_the_directory() {
    let o = output_of(&mut run_cmd(&["--local", "-C", "/tmp", "--", "pwd"])).await;
    assert_eq!(code(&o.status), 0, "stderr: {}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "/tmp\n");
}

#[tokio::test]
async fn timeout_flag_terminates_the_command() {
    let t0 = Instant::now();
    let o = output_of(&mut run_cmd(&[
        "--local",
        "--timeout",
        "1s",
        "--",
        "sleep",
        "30",
    ]))
    .await;
    let took = t0.elapsed();
    assert_eq!(
        code(&o.status),
        124,
        "124 at the timeout, as timeout(1); stderr: {}",
        text(&o.stderr)
    );
    assert_eq!(text(&o.stderr), "execrelay: timed out after 1s\n");
    // A hang guard only, not a speed test: the command itself would take 30 s.
    assert!(took < Duration::from_secs(20), "took {took:?}");
}

// ---------------------------------------------------------------------------------------------
// Bad usage
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn unsupported_target_is_rejected() {
    let o = output_of(&mut run_cmd(&["ftp://x", "--", "true"])).await;
    assert_eq!(code(&o.status), 255);
    assert_eq!(text(&o.stdout), "");
    let err = text(&o.stderr);
    assert!(
        err.contains("unsupported target") && err.contains("ftp://x"),
        "stderr: {err}"
    );
}

#[tokio::test]
async fn env_without_equals_passes_the_local_value() {
    let o = output_of(
        run_cmd(&[
            "--local",
            "-e",
            "I19_LOCAL",
            "-e",
            "I19_UNSET_HERE",
            "--",
            "sh",
            "-c",
            "echo \"$I19_LOCAL ${I19_UNSET_HERE-unset}\"",
        ])
        .env("I19_LOCAL", "from here")
        .env_remove("I19_UNSET_HERE"),
    )
    .await;
    assert_eq!(code(&o.status), 0, "stderr: {}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "from here unset\n");
}

#[tokio::test]
async fn unreachable_server_is_reported() {
    // A port nobody listens on: bind one, then free it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind")
        .port();
    let url = format!("ws://127.0.0.1:{port}");
    let o = output_of(&mut run_cmd(&[&url, "--", "true"])).await;
    assert_eq!(code(&o.status), 255);
    assert_eq!(text(&o.stdout), "");
    let err = text(&o.stderr);
    assert!(
        err.starts_with(&format!("execrelay: cannot connect to {url}: "))
            && err.lines().count() == 1,
        "stderr: {err}"
    );
    // Nothing listens on that port: the line says what to check.
    assert!(
        err.trim_end().ends_with(
            ": is the exec server (or relay) running and listening on that address and port?"
        ),
        "stderr: {err}"
    );
}

// ---------------------------------------------------------------------------------------------
// ws:// target
// ---------------------------------------------------------------------------------------------

/// `execrelay serve --listen ws://127.0.0.1:0` and the URL it printed.
async fn ws_server() -> (Child, String, LineReader) {
    let mut server = serve_cmd("ws://127.0.0.1:0", Stdio::null())
        .env_remove("RUST_LOG")
        .spawn()
        .expect("spawn execrelay serve");
    let mut lines = LineReader::new(&mut server);
    let url = lines.next().await.expect("server printed no URL");
    assert!(url.starts_with("ws://127.0.0.1:"), "URL line: {url:?}");
    (server, url, lines)
}

/// SIGTERM the server and check it exits 0.
async fn stop_server(mut server: Child) {
    let pid = server.id().expect("server pid") as i32;
    kill(Pid::from_raw(pid), Signal::SIGTERM).expect("SIGTERM server");
    let status = tokio::time::timeout(GUARD, server.wait())
        .await
        .expect("server did not exit after SIGTERM (hang guard)")
        .expect("wait server");
    assert_eq!(status.code(), Some(0), "server exit: {status:?}");
}

#[tokio::test]
async fn ws_target_runs_remotely() {
    let (server, url, _lines) = ws_server().await;
    let o = output_of(&mut run_cmd(&[
        &url,
        "--",
        "sh",
        "-c",
        "echo remote; echo remote-err >&2; exit 5",
    ]))
    .await;
    assert_eq!(code(&o.status), 5, "stderr: {}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "remote\n");
    assert_eq!(text(&o.stderr), "remote-err\n");
    stop_server(server).await;
}

#[tokio::test]
async fn ws_server_shutdown_ends_run_with_the_commands_signal() {
    // Server shutdown terminates the command (SIGTERM) and delivers its exit notice
    // (`processes.md` §5, reason `serverShutdown`), so `run` exits at once rather than trying
    // to reconnect: 255 (not the command's own doing), saying why.
    let (server, url, _lines) = ws_server().await;
    let mut child = run_cmd(&[&url, "--", "sh", "-c", "echo ready $$; exec sleep 30"])
        .spawn()
        .expect("spawn execrelay run");
    let mut out = LineReader::new(&mut child);
    let pgid = out.ready().await;
    stop_server(server).await;
    let status = tokio::time::timeout(PROMPT, child.wait()).await;
    reap_group(pgid);
    let status = status
        .expect("run did not exit after its server shut down")
        .expect("wait run");
    assert_eq!(code(&status), 255);
    let mut err = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut err)
        .await
        .expect("read stderr");
    assert_eq!(
        err,
        "execrelay: the server shut down; the command was ended (killed by SIGTERM)\n"
    );
}

// ---------------------------------------------------------------------------------------------
// Ctrl-C without -t, and the local server going away
// ---------------------------------------------------------------------------------------------

/// Start `run --local` on [`INT_SCRIPT`], SIGINT it as soon as the command's first line
/// shows, and return its exit status and the rest of its stdout.
async fn interrupt_after_ready() -> (ExitStatus, String) {
    let mut child = run_cmd(&["--local", "--", "sh", "-c", INT_SCRIPT])
        .spawn()
        .expect("spawn execrelay run");
    let mut out = LineReader::new(&mut child);
    let pgid = out.ready().await;
    let pid = child.id().expect("run pid") as i32;
    kill(Pid::from_raw(pid), Signal::SIGINT).expect("SIGINT run");
    let status = tokio::time::timeout(GUARD, child.wait()).await;
    reap_group(pgid);
    let status = status
        .expect("run did not exit (hang guard)")
        .expect("wait");
    (status, out.rest().await)
}

#[tokio::test]
async fn sigint_is_forwarded() {
    // Regression (fixed; was intermittent under load): see `sigint_right_after_the_first_output_is_forwarded`;
    // `run` may still be at SIGINT's default disposition when `ready` shows, and die of it.
    let (status, rest) = interrupt_after_ready().await;
    assert_eq!(code(&status), 9);
    assert_eq!(rest, "got-int\n");
}

#[tokio::test]
async fn sigint_right_after_the_first_output_is_forwarded() {
    // Rounds of many at once, so that some `run` is slow to get CPU time: a Ctrl-C must be
    // forwarded from the moment the command's output shows, not only once `run` settled.
    //
    // Regression (fixed): `run` (cli/run.rs) registers its SIGINT/SIGWINCH handlers inside a
    // `tokio::spawn`ed task, which may not have been polled yet when the main task already
    // forwards the command's first output. A Ctrl-C in that window finds SIGINT at its
    // default disposition and kills `run` itself (status: signal 2) instead of being
    // forwarded; with a ws:// target the command is left running on the server, detached,
    // until the session TTL expires.
    // Creating the `signal(…)` streams before `client.start` (or at least before the output
    // loop) and moving them into the task fixes it. Probabilistic: a round of 32 usually
    // loses one or more runs; four rounds make a pass with the bug unlikely. (Also makes
    // `sigint_is_forwarded` and `terminal_ctrl_c_…` fail now and then under load.)
    const ROUNDS: usize = 4;
    const N: usize = 32;
    for round in 0..ROUNDS {
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..N {
            set.spawn(interrupt_after_ready());
        }
        let mut killed = 0;
        while let Some(r) = set.join_next().await {
            let (status, rest) = r.expect("join");
            match status.code() {
                Some(c) => {
                    assert_eq!(c, 9);
                    assert_eq!(rest, "got-int\n");
                }
                None => killed += 1,
            }
        }
        assert_eq!(
            killed, 0,
            "round {round}: of {N} runs, {killed} died of the SIGINT they should have forwarded"
        );
    }
}

#[tokio::test]
async fn terminal_ctrl_c_to_the_foreground_group_is_forwarded() {
    // A terminal's Ctrl-C sends SIGINT to the whole foreground process group, which here
    // holds `execrelay run` (and its in-process server; the command has a session of its
    // own). Simulate it with killpg on a group of our own.
    let mut cmd = run_cmd(&["--local", "--", "sh", "-c", INT_SCRIPT]);
    cmd.process_group(0);
    let mut child = cmd.spawn().expect("spawn execrelay run");
    let mut out = LineReader::new(&mut child);
    let remote = out.ready().await;
    let group = child.id().expect("run pid") as i32;
    killpg(Pid::from_raw(group), Signal::SIGINT).expect("SIGINT the group");
    let status = tokio::time::timeout(PROMPT, child.wait()).await;
    reap_group(remote);
    reap_group(group);
    // Regression (fixed in 3577aea): the local server used to share run's process group, so
    // it took the Ctrl-C as a shutdown request, SIGTERMed the command and closed the stdio
    // connection without the exit notice, and `run` hung. Expected: the command gets SIGINT,
    // prints got-int, and `run` exits 9, as with a SIGINT to `run` alone.
    let status = status
        .expect("run did not exit within 20 s after Ctrl-C (it hangs)")
        .expect("wait");
    assert_eq!(code(&status), 9);
    assert_eq!(out.rest().await, "got-int\n");
}

/// Pids whose parent is `ppid`, from /proc.
fn children_of(ppid: u32) -> Vec<i32> {
    let mut kids = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("read /proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid …`; comm may contain spaces and parentheses.
        let Some(after) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        let mut fields = after.split_whitespace();
        let _state = fields.next();
        if fields.next().and_then(|p| p.parse::<u32>().ok()) == Some(ppid) {
            kids.push(pid);
        }
    }
    kids
}

/// `run --local` runs its server in its own process now; the regression this guarded (a
/// `Target::Spawn` connection that ended left the event streams open, and `run` hung) is
/// checked on the library: a spawned stdio server killed under a running command ends the
/// command's events and says why.
#[tokio::test]
async fn a_spawned_server_that_dies_ends_the_event_streams() {
    use execrelay::client::{Client, ClientOptions, StartOptions, Target};
    let target = Target::Spawn {
        program: bin().into(),
        args: vec!["serve".into(), "--listen".into(), "stdio".into()],
    };
    let client = Client::connect(target, ClientOptions::default())
        .await
        .expect("connect");
    let mut p = client
        .start(StartOptions::new("p", ["sh", "-c", INT_SCRIPT]))
        .await
        .expect("start");
    // Its output says it runs.
    let first = tokio::time::timeout(PROMPT, p.next_event())
        .await
        .expect("output");
    assert!(first.is_some());
    let me = std::process::id();
    let servers = children_of(me)
        .into_iter()
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.contains("serve") && c.contains("stdio"))
        })
        .collect::<Vec<_>>();
    assert_eq!(servers.len(), 1, "the spawned server: {servers:?}");
    kill(Pid::from_raw(servers[0]), Signal::SIGKILL).expect("SIGKILL the server");
    reap_group(p.pid as i32);
    let end = tokio::time::timeout(PROMPT, async { while p.next_event().await.is_some() {} }).await;
    assert!(end.is_ok(), "the event stream did not end (it hangs)");
    assert!(client.lost_reason().is_some());
}

// ---------------------------------------------------------------------------------------------
// -t: a terminal of the local size, raw mode, resize, restore
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn tty_flag_gives_a_terminal_of_the_local_size() {
    let (status, shown) = run_on_pty(
        33,
        101,
        &[
            "--local",
            "-t",
            "--",
            "sh",
            "-c",
            "test -t 0 && echo IS_TTY; stty size",
        ],
    )
    .await;
    assert_eq!(code(&status), 0, "screen: {shown:?}");
    assert!(shown.contains("IS_TTY"), "screen: {shown:?}");
    assert!(shown.contains("33 101"), "screen: {shown:?}");
}

#[tokio::test]
async fn without_tty_flag_the_command_has_no_terminal() {
    let (status, shown) = run_on_pty(
        33,
        101,
        &["--local", "--", "sh", "-c", "test -t 0 || echo NOT_TTY"],
    )
    .await;
    assert_eq!(code(&status), 0, "screen: {shown:?}");
    assert!(shown.contains("NOT_TTY"), "screen: {shown:?}");
}

#[tokio::test]
async fn tty_mode_is_raw_while_running_and_restored_after() {
    // Raw mode: the local terminal does not turn Ctrl-C into a signal (nobody would get it:
    // `run` is not the terminal's session); the byte goes to the remote terminal, whose line
    // discipline sends SIGINT to the command.
    let pty = open_pty(33, 101);
    let before = nix::sys::termios::tcgetattr(pty.slave.as_fd()).expect("tcgetattr");
    let mut screen = Screen::new(&pty.master);
    let mut keyboard = std::fs::File::from(pty.master.try_clone().expect("dup master"));
    let mut child = spawn_on_pty(pty.slave, &["--local", "-t", "--", "sh", "-c", INT_SCRIPT]);
    screen.wait_for("ready").await;
    keyboard.write_all(&[0x03]).expect("type Ctrl-C");
    let shown = screen.read_to_end().await;
    let status = wait_status(&mut child).await;
    assert_eq!(code(&status), 9, "screen: {shown:?}");
    assert!(shown.contains("got-int"), "screen: {shown:?}");

    let slave = open_slave(&pty.slave_path);
    let after = nix::sys::termios::tcgetattr(slave.as_fd()).expect("tcgetattr");
    assert_eq!(after.local_flags, before.local_flags, "lflag restored");
    assert_eq!(after.input_flags, before.input_flags, "iflag restored");
    assert_eq!(after.output_flags, before.output_flags, "oflag restored");
}

#[tokio::test]
async fn tty_size_changes_are_forwarded() {
    let pty = open_pty(33, 101);
    let mut screen = Screen::new(&pty.master);
    let mut child = spawn_on_pty(
        pty.slave,
        &[
            "--local",
            "-t",
            "--",
            "sh",
            "-c",
            "trap 'stty size; exit 0' WINCH; echo ready; while :; do sleep 0.1; done",
        ],
    );
    screen.wait_for("ready").await;
    set_size(&pty.master, 40, 120);
    // `run` is not the terminal's session, so the kernel signals nobody: send the SIGWINCH a
    // terminal would. It is resent if the size does not show promptly, because `run`
    // installs its handler in a task that may not have run yet when `ready` shows.
    let pid = Pid::from_raw(child.id().expect("run pid") as i32);
    let give_up = Instant::now() + GUARD;
    loop {
        kill(pid, Signal::SIGWINCH).expect("SIGWINCH run");
        if screen
            .wait_for_within("40 120", Duration::from_millis(500))
            .await
        {
            break;
        }
        assert!(
            Instant::now() < give_up,
            "new size never reached the command; screen: {:?}",
            text(&screen.seen)
        );
    }
    let shown = screen.read_to_end().await;
    let status = wait_status(&mut child).await;
    assert_eq!(code(&status), 0, "screen: {shown:?}");
}

/// `run --local` serves in its own process, with the containment `serve` has (its command
/// runs in a session cgroup under an instance cgroup named after `run`'s pid), and its
/// shutdown removes that instance cgroup: nothing named after its pid is left.
#[tokio::test]
async fn run_local_contains_its_command_and_leaves_no_instance_cgroup() {
    use common::contain::cgroups_here;
    use execrelay::config::BackendChoice;
    use execrelay::process::containment::{Containment, ContainmentConfig};
    if !cgroups_here("run_local_contains_its_command_and_leaves_no_instance_cgroup") {
        return;
    }
    // Where `run`'s instance cgroups go: beside a probe's (the same cgroups as this test's).
    let probe = Containment::new(&ContainmentConfig {
        backend: BackendChoice::Auto,
        cgroup_name: "execrelay-probe".into(),
        session_pids_max: None,
    })
    .expect("containment starts");
    let parents: Vec<std::path::PathBuf> = probe
        .instance_dirs()
        .iter()
        .filter_map(|d| d.parent().map(|p| p.to_path_buf()))
        .collect();
    drop(probe);
    assert!(!parents.is_empty());
    let mut cmd = Command::new(bin());
    cmd.args(["run", "--local", "--", "cat", "/proc/self/cgroup"])
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let child = cmd.spawn().expect("spawn execrelay run");
    let pid = child.id().expect("run's pid");
    let out = tokio::time::timeout(GUARD, child.wait_with_output())
        .await
        .expect("execrelay run did not exit (hang guard)")
        .expect("wait");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let prefix = format!("execrelay-{pid}-");
    assert!(
        stdout.contains(&format!("/{prefix}")),
        "premise: the command ran in run's instance cgroup: {stdout}"
    );
    for parent in &parents {
        let left: Vec<String> = std::fs::read_dir(parent)
            .expect("list the cgroup")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(&prefix))
            .collect();
        assert!(
            left.is_empty(),
            "run --local left {left:?} in {}",
            parent.display()
        );
    }
}
