//! The stall that was seen from outside: an independent client (`tests/interop/pause_client.py`,
//! its own frame codec and flow control, a bare `ACK` after every half window it consumed)
//! streams `head -c` output, stops reading its WebSocket while a second client on another
//! link runs `seq` to its end, then reads again. Several at once on this machine, direct
//! (`noise+ws://`) and through the relay (`relay+ws://`): every run must deliver every byte
//! and the exit notice. A run that receives nothing for `STALL_S` on a live link fails, naming
//! the record it consumed and the one it acknowledged.
//!
//! The stall needed a log that lands on its retention limit to the byte: the limit here
//! ([`retained`]) makes that likely. Before the fix, four of five tries of this file failed
//! (both tests, one or two runs of 20 stopped for good each); it is a reproduction from
//! outside, so chance is in it: `tests/stall.rs` has the deterministic case, and
//! `process::event_log` the property that rules it out.
//!
//! Needs the Python environment of `tests/noise_interop.rs` (built on first use).

mod common;
use common::interop::{python, PAUSE_SCRIPT};
use common::noise_bin::{keygen, BinServer, Keys};
use common::relay::{BinEnv, BinRelay};
use common::*;

use std::path::Path;

use execrelay::process::event_log::output_cost;
use std::process::Stdio;

use tokio::process::Command;

/// Runs in all, per transport.
const RUNS: usize = 20;
/// Runs at once.
const AT_ONCE: usize = 4;
/// Output of each run.
const BYTES: usize = 8_000_000;
/// Where each run pauses, and pauses again.
const PAUSE_AT: usize = 2_000_000;
/// Pauses per run: each fills the server's log for the run's process.
const PAUSES: &str = "1";
/// 256 KiB plus the bookkeeping of six events: a log of six chunks of whole 4 KiB pages (what
/// a pipe mostly hands over) can fill it to the byte, which is what the stall needed.
fn retained() -> String {
    (256 * 1024 + 6 * output_cost(0)).to_string()
}
/// Silence on a live link after which a run is declared stalled (a healthy run never waits
/// more than a scheduling hiccup).
const STALL_S: &str = "30";

/// Keys for the server and one client key per concurrent run (so that no two runs share a
/// key's handshake timestamps), and the authorized keys file.
async fn keys(dir: &Path) -> (Keys, Vec<Keys>, std::path::PathBuf) {
    let server = keygen(dir, "server").await;
    let mut clients = Vec::new();
    let mut auth = String::new();
    for i in 0..=AT_ONCE {
        let k = keygen(dir, &format!("client{i}")).await;
        auth.push_str(&k.public_line());
        auth.push('\n');
        clients.push(k);
    }
    let path = dir.join("auth");
    std::fs::write(&path, auth).unwrap();
    (server, clients, path)
}

/// `RUNS` runs of the pause client against `url`, `AT_ONCE` at a time; each pauses while
/// `execrelay run URL … -- seq 1 100000` runs on another link with the last client key.
async fn pause_runs(url: &str, server: &Keys, clients: &[Keys]) {
    let py = python().await;
    let second = format!(
        "{} run {url} --server-key {} --key {} -- seq 1 100000 >/dev/null",
        bin(),
        server.pubs(),
        clients[AT_ONCE].p()
    );
    let mut failures = Vec::new();
    for round in 0..RUNS / AT_ONCE {
        let mut runs = Vec::new();
        for client in clients.iter().take(AT_ONCE) {
            let child = Command::new(&py)
                .arg(PAUSE_SCRIPT)
                .args([url, server.pubs(), client.p()])
                .args(["--bytes", &BYTES.to_string()])
                .args(["--pause-at", &PAUSE_AT.to_string()])
                .args(["--pause-s", "1.5", "--pauses", PAUSES, "--stall-s", STALL_S])
                .args(["--second", &second])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .expect("spawn the pause client");
            runs.push(child.wait_with_output());
        }
        for (i, out) in futures_util::future::join_all(runs)
            .await
            .into_iter()
            .enumerate()
        {
            let out = out.expect("pause client ran");
            let line = text(&out.stdout);
            if !(out.status.success() && line.starts_with("OK ")) {
                failures.push(format!(
                    "round {round} run {i}: {:?} {}{}",
                    out.status.code(),
                    line.trim(),
                    text(&out.stderr)
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {RUNS} runs failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_readers_get_every_byte_direct() {
    let dir = tempfile::tempdir().unwrap();
    let (server, clients, auth) = keys(dir.path()).await;
    let srv = BinServer::with_keys(
        dir.path(),
        &server,
        &auth,
        &["--retained-output-bytes", &retained()],
        None,
    )
    .await;
    pause_runs(&srv.url, &server, &clients).await;
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_readers_get_every_byte_through_the_relay() {
    let dir = tempfile::tempdir().unwrap();
    let (server, clients, auth) = keys(dir.path()).await;
    let relay_keys = keygen(dir.path(), "relay").await;
    let envs = dir.path().join("environments");
    std::fs::write(&envs, format!("pause {}\n", server.public_line())).unwrap();
    let relay = BinRelay::start(
        &relay_keys.private,
        &envs,
        &[],
        &dir.path().join("relay.log"),
    )
    .await;
    let env = BinEnv::start(
        &relay.url,
        "pause",
        &relay_keys.public,
        &server.private,
        &auth,
        &["--retained-output-bytes", &retained()],
        &dir.path().join("server.log"),
    )
    .await;
    pause_runs(&env.client_url, &server, &clients).await;
}
