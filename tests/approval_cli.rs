//! Approvals through the built binary (`protocol.md` §7): `serve --exec-policy` refusing a bad
//! file at start, `execrelay run` asking on its controlling terminal (answered `y` and `n`),
//! denying without a terminal, `--approve-all`, and `exec_policy` in the `--config` file.
//!
//! Apart from `approval_client.rs` because these tests fork `execrelay run` into a session of
//! its own (`setsid`, for a controlling terminal or none) and wait for it: in a test binary
//! that also runs a server in process, that server's subreaper would reap such a child (it is
//! not one `spawn.rs` registered, and it left the test's session; see
//! `process/containment/subreaper.rs`, "Children forked outside `spawn.rs`") and the test's
//! `wait` would fail with `ECHILD`. No server runs in this binary's process.

mod common;
use common::binary::{first_line, output_of, serve_cmd};
use common::process::running_with_arg;
use common::pty::*;
use common::*;

use std::path::Path;
use std::process::Stdio;

/// Asks about `sleep` and `echo`; the rest is allowed.
const POLICY: &str = r#"
default = "allow"
[[rule]]
program = "sleep"
action = "ask"
reason = "sleeps"
[[rule]]
program = "echo"
action = "ask"
"#;

fn policy_file(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("policy.toml");
    std::fs::write(&path, POLICY).unwrap();
    path
}

/// A `sleep` argument no other process has.
fn marker(tag: u32) -> String {
    format!("{}.{:03}", 4000 + tag, std::process::id() % 1000)
}

/// `execrelay serve --listen ws://127.0.0.1:0 --exec-policy POLICY`; the child and its URL.
async fn serve_with_policy(dir: &Path) -> (tokio::process::Child, String, impl Sized) {
    let path = policy_file(dir);
    let mut cmd = serve_cmd("ws://127.0.0.1:0", Stdio::null());
    cmd.arg("--exec-policy").arg(&path);
    let mut child = cmd.spawn().expect("spawn serve");
    let (url, rest) = first_line(&mut child, GUARD).await;
    (child, url.expect("serve printed its URL"), rest)
}

#[tokio::test]
async fn serve_refuses_a_bad_policy_file_at_start_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "default = \"allow\"\n[[rule]]\nprogram = \"[\"\naction = \"ask\"\n",
    )
    .unwrap();
    let mut cmd = serve_cmd("ws://127.0.0.1:0", Stdio::piped());
    cmd.arg("--exec-policy").arg(&bad);
    let out = output_of(&mut cmd).await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(err.contains("bad.toml") && err.contains("rule 1"), "{err}");
    assert!(out.stdout.is_empty(), "nothing served");
}

/// `execrelay run ARGS…` in a new session without a controlling terminal (so `/dev/tty`
/// cannot open), stdin null.
fn run_without_terminal(args: &[&str]) -> tokio::process::Command {
    let mut c = tokio::process::Command::new(bin());
    c.arg("run").args(args).env_remove("RUST_LOG");
    // SAFETY: setsid is async-signal-safe.
    unsafe {
        c.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_without_a_terminal_denies_and_approve_all_approves() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, url, _rest) = serve_with_policy(dir.path()).await;
    let arg = marker(40);
    let out = output_of(&mut run_without_terminal(&[&url, "--", "sleep", &arg])).await;
    assert_eq!(out.status.code(), Some(255), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(err.contains("no terminal to ask on: denied"), "{err}");
    assert!(
        err.contains("execrelay: ws://") && err.contains("not approved"),
        "{err}"
    );
    assert!(running_with_arg(&arg).is_empty(), "nothing spawned");

    let out = output_of(&mut run_without_terminal(&[
        &url,
        "--approve-all",
        "--",
        "echo",
        "approved-all",
    ]))
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "approved-all\n");
    assert_eq!(text(&out.stderr), "", "approved without a word");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_asks_on_its_terminal_and_y_approves() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, url, _rest) = serve_with_policy(dir.path()).await;
    let pty = open_pty(24, 80);
    let mut screen = Screen::new(&pty.master);
    let master = pty.master;
    let mut child = spawn_on_pty_controlling(pty.slave, &[&url, "--", "echo", "it-ran"]);
    screen
        .wait_for("approve echo it-ran (rule: program = \"echo\")? [y/N] ")
        .await;
    type_keys(&master, b"y\n");
    let shown = screen.read_to_end().await;
    let status = wait_status(&mut child).await;
    assert_eq!(status.code(), Some(0), "{shown}");
    assert!(shown.contains("it-ran\r\n"), "{shown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_asks_on_its_terminal_and_n_denies() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, url, _rest) = serve_with_policy(dir.path()).await;
    let arg = marker(50);
    let pty = open_pty(24, 80);
    let mut screen = Screen::new(&pty.master);
    let master = pty.master;
    let mut child = spawn_on_pty_controlling(pty.slave, &[&url, "--", "sleep", &arg]);
    screen
        .wait_for(&format!("approve sleep {arg} (rule: sleeps)? [y/N] "))
        .await;
    type_keys(&master, b"n\n");
    let shown = screen.read_to_end().await;
    let status = wait_status(&mut child).await;
    assert_eq!(status.code(), Some(255), "{shown}");
    assert!(
        shown.contains("not approved: denied by the client"),
        "{shown}"
    );
    assert!(running_with_arg(&arg).is_empty(), "nothing spawned");
}

/// `exec_policy` in the `--config` file (relative to it) loads the policy; `--exec-policy`
/// wins; a policy that is not a string is an error naming the file.
#[test]
fn the_config_file_names_the_policy_and_the_flag_wins() {
    use clap::Parser;
    use execrelay::cli::{Cli, Command};
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.toml"), "default = \"deny\"\n").unwrap();
    std::fs::write(dir.path().join("q.toml"), "default = \"ask\"\n").unwrap();
    let cfg = dir.path().join("serve.toml");
    std::fs::write(&cfg, "exec_policy = \"p.toml\"\nmax_processes = 7\n").unwrap();
    let serve = |args: &[&str]| match Cli::try_parse_from(["execrelay", "serve"].iter().chain(args))
        .unwrap()
        .command
    {
        Command::Serve(s) => s,
        _ => unreachable!(),
    };
    let cfg_s = cfg.to_str().unwrap();
    let s = serve(&["--config", cfg_s]);
    assert_eq!(s.config().unwrap().max_processes, 7, "settings still read");
    let p = s.exec_policy().unwrap().expect("a policy");
    assert_eq!(
        p.current().decide("ls", None).action,
        execrelay::policy::Action::Deny
    );
    let q = dir.path().join("q.toml");
    let s = serve(&["--config", cfg_s, "--exec-policy", q.to_str().unwrap()]);
    let p = s.exec_policy().unwrap().unwrap();
    assert_eq!(
        p.current().decide("ls", None).action,
        execrelay::policy::Action::Ask
    );
    std::fs::write(&cfg, "exec_policy = 3\n").unwrap();
    let e = serve(&["--config", cfg_s]).exec_policy().unwrap_err();
    assert!(e.to_string().contains("serve.toml"), "{e}");
    assert!(serve(&[]).exec_policy().unwrap().is_none());
}
