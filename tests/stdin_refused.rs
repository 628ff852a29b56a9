//! A write the server refuses (`-32004`, a full request budget) while `execrelay run` or
//! `execrelay cp` forwards input. The server keeps the process's writes in order after the
//! refusal (`capabilities.retryRefusedWrites`), so the client sends the refused write again,
//! with everything after it, and the command gets all of its input, in order. With
//! `--input-retry 0` (or once the retries run out) the command must not finish on part of its
//! input as if it were whole (it used to: `run` exited 0 with a short count, `cp` hung on a
//! remote `tar` waiting for the rest): it is stopped, and the client exits 255 naming the
//! refusal.
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

/// `execrelay run [FLAGS] URL -- ARGV…` with stdin from `input`.
async fn run_with_input(
    flags: &[&str],
    url: &str,
    input: &std::path::Path,
    argv: &[&str],
) -> Output {
    output_with_stdin(
        Command::new(bin())
            .arg("run")
            .args(flags)
            .args([url, "--"])
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

/// `sha256sum`'s line for a local file.
fn local_sha256(path: &std::path::Path) -> String {
    let o = std::process::Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("sha256sum");
    String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .next()
        .expect("a hash")
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_sends_refused_input_again_and_the_command_gets_all_of_it_in_order() {
    let (_server, url, _rest) = tight_server().await;
    let dir = tempfile::tempdir().unwrap();
    let large = input_of(&dir, "large", LARGE);
    let o = run_with_input(&[], &url, &large, &["sha256sum"]).await;
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let got = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        got.split_whitespace().next(),
        Some(local_sha256(&large).as_str()),
        "every byte once, in order: {got}"
    );
    assert!(
        o.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_without_input_retry_stops_a_command_whose_input_was_refused_and_says_why() {
    let (_server, url, _rest) = tight_server().await;
    let dir = tempfile::tempdir().unwrap();

    // One write's worth goes through whole: the server serves, only tightly.
    let small = input_of(&dir, "small", 60_000);
    let o = run_with_input(&["--input-retry", "0"], &url, &small, &["wc", "-c"]).await;
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "60000");

    let large = input_of(&dir, "large", LARGE);
    let o = run_with_input(&["--input-retry", "0"], &url, &large, &["wc", "-c"]).await;
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(255), "not the command's doing: {o:?}");
    assert!(
        stderr.contains("stdin could not be delivered")
            && stderr.contains("-32004")
            && stderr.contains("maxPendingRequestBytes")
            && stderr.contains("the command was stopped")
            && stderr.contains("with a longer --input-retry")
            && stderr.contains("have its operator raise that limit"),
        "the refusal is named: {stderr}"
    );
    assert_ne!(
        String::from_utf8_lossy(&o.stdout).trim(),
        LARGE.to_string(),
        "the whole input cannot have arrived"
    );
}

/// `execrelay cp [FLAGS] LOCAL URL:DEST`.
async fn cp_up(
    flags: &[&str],
    local: &std::path::Path,
    url: &str,
    dest: &std::path::Path,
) -> Output {
    let target = format!("{url}:{}", dest.display());
    output_of(
        Command::new(bin())
            .arg("cp")
            .args(flags)
            .args([local.to_str().unwrap(), &target])
            .env_remove("RUST_LOG")
            .env("HOME", "/"),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cp_sends_a_refused_upload_again_and_the_copy_is_whole() {
    let (_server, url, _rest) = tight_server().await;
    let dir = tempfile::tempdir().unwrap();
    let large = input_of(&dir, "large", LARGE);
    let dest = dir.path().join("copied");
    let o = cp_up(&[], &large, &url, &dest).await;
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert!(
        std::fs::read(&dest).expect("the copy") == std::fs::read(&large).unwrap(),
        "the copy is the file, byte for byte"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cp_without_input_retry_stops_the_remote_tar_when_the_upload_is_refused_and_says_why() {
    let (_server, url, _rest) = tight_server().await;
    let dir = tempfile::tempdir().unwrap();
    let large = input_of(&dir, "large", LARGE);
    let dest = dir.path().join("copied");
    let o = cp_up(&["--input-retry", "0"], &large, &url, &dest).await;
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
