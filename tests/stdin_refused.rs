//! A write the server refuses (`-32004`, a full request budget) while `execrelay run` or
//! `execrelay cp` forwards input. The command must not finish on part of its input as if it
//! were whole (it used to: `run` exited 0 with a short count, `cp` hung on a remote `tar`
//! waiting for the rest). It is stopped, and the client exits 255 naming the refusal.
//!
//! The server's budgets hold one binary write (88 KiB, the least `max_message_bytes` allows),
//! so any two writes charged at once refuse the second; 32 MiB of input is hundreds of
//! chances. A small input through the same server goes through whole, so the refusal is what
//! stops the large one. Every wait is on an exit, under the hang guard.

mod common;
use common::binary::{first_line, output_of, output_with_stdin, serve_cmd};
use common::*;

use std::process::{Output, Stdio};

use tokio::process::{Child, Command};

/// Each of the server's byte budgets: one write fits, two do not.
const TIGHT: &str = "90112";

/// A `ws://` server with [`TIGHT`] budgets: the child (killed on drop), its URL, and the rest
/// of its stdout (kept open).
async fn tight_server() -> (Child, String, impl Sized) {
    let mut c = serve_cmd("ws://127.0.0.1:0", Stdio::null());
    c.args(["--containment-backend", "none"])
        .args(["--max-message-bytes", TIGHT])
        .args(["--max-pending-request-bytes", TIGHT])
        .args(["--max-inbound-bytes", TIGHT])
        .env_remove("RUST_LOG");
    let mut child = c.spawn().expect("spawn serve");
    let (url, rest) = first_line(&mut child, GUARD).await;
    (child, url.expect("serve printed its URL"), rest)
}

/// `execrelay run URL -- ARGV…` with stdin from `input`.
async fn run_with_input(url: &str, input: &std::path::Path, argv: &[&str]) -> Output {
    output_with_stdin(
        Command::new(bin())
            .args(["run", url, "--"])
            .args(argv)
            .env_remove("RUST_LOG")
            .env("HOME", "/"),
        std::fs::File::open(input).expect("open the input"),
    )
    .await
}

fn input_of(dir: &tempfile::TempDir, name: &str, len: usize) -> std::path::PathBuf {
    let path = dir.path().join(name);
    let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    std::fs::write(&path, data).expect("write the input");
    path
}

const LARGE: usize = 32 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_stops_a_command_whose_input_was_refused_and_says_why() {
    let (_server, url, _rest) = tight_server().await;
    let dir = tempfile::tempdir().unwrap();

    // One write's worth goes through whole: the server serves, only tightly.
    let small = input_of(&dir, "small", 60_000);
    let o = run_with_input(&url, &small, &["wc", "-c"]).await;
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "60000");

    let large = input_of(&dir, "large", LARGE);
    let o = run_with_input(&url, &large, &["wc", "-c"]).await;
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(255), "not the command's doing: {o:?}");
    assert!(
        stderr.contains("stdin could not be delivered")
            && stderr.contains("-32004")
            && stderr.contains("maxPendingRequestBytes")
            && stderr.contains("the command was stopped")
            && stderr.contains("have its operator raise that limit"),
        "the refusal is named: {stderr}"
    );
    assert_ne!(
        String::from_utf8_lossy(&o.stdout).trim(),
        LARGE.to_string(),
        "the whole input cannot have arrived"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cp_stops_the_remote_tar_when_the_upload_is_refused_and_says_why() {
    let (_server, url, _rest) = tight_server().await;
    let dir = tempfile::tempdir().unwrap();
    let large = input_of(&dir, "large", LARGE);
    let dest = dir.path().join("copied");
    let target = format!("{url}:{}", dest.display());
    let o = output_of(
        Command::new(bin())
            .args(["cp", large.to_str().unwrap(), &target])
            .env_remove("RUST_LOG")
            .env("HOME", "/"),
    )
    .await;
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(255), "{o:?}");
    assert!(
        stderr.contains("the upload could not be delivered")
            && stderr.contains("-32004")
            && stderr.contains("the remote tar was stopped")
            && stderr.contains("have its operator raise that limit"),
        "the refusal is named: {stderr}"
    );
}
