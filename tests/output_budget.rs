//! The server-wide output budget (`output_budget_bytes`, `process/output_budget.rs`) with real
//! processes: a thousand processes writing at once, for a client that reads nothing, stay
//! within the documented bound (budget + one guaranteed chunk per process) and every one of
//! them progresses; chatty processes whose client is stuck do not starve another session.
//! The admission rule itself is tested at its edges beside it (`output_budget.rs`,
//! `event_log.rs`).

mod common;
use common::*;

use execrelay::config::ServerConfig;
use execrelay::config::PUMP_CHUNK_BYTES;
use execrelay::process::event_log::output_cost;
use execrelay::process::output_budget::{admission, GUARANTEED_OUTPUT_BYTES};
use serde_json::json;

/// Raise this process's descriptor limit to what `n` children need (three pipe ends each,
/// and the test's own), or fail saying so.
fn raise_fd_limit(n: usize) {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let need = (4 * n + 256) as u64;
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    if soft < need {
        assert!(
            hard >= need,
            "this test runs {n} children and needs {need} descriptors; the hard limit is {hard}"
        );
        setrlimit(Resource::RLIMIT_NOFILE, need, hard).expect("setrlimit");
    }
}

/// What a process costs the server besides its output, at most: two pumps' first-read buffers
/// (`FIRST_READ_BYTES`) and their tasks, the supervisor, the process's structures and pipes.
/// Measured at about 25 KiB; this is the documented constant (README, "Bounds").
const PER_PROCESS_BYTES: usize = 64 * 1024;

/// Resident memory of this process, in bytes.
fn rss_bytes() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|kib| kib.parse::<usize>().ok())
        .expect("VmRSS")
        * 1024
}

/// A thousand processes, each writing 1 MiB at once, for a client that reads nothing: each
/// holds at least its guaranteed chunk (none is starved), and unwritten output never exceeded
/// `output_budget_bytes + processes × GUARANTEED_OUTPUT_BYTES`. Without the budget the logs
/// would have taken the whole 1,000 MiB (a fixed 1 MiB queue each, as before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_processes_writing_at_once_stay_within_the_budget() {
    const N: usize = 1000;
    const BUDGET: usize = 16 << 20;
    raise_fd_limit(N);
    let rss_before = rss_bytes();
    // A small transport buffer: the client never reads, so the writer is stuck at once.
    let mut t = in_process(
        ServerConfig {
            output_budget_bytes: BUDGET,
            max_processes: N,
            ..cfg()
        },
        64 * 1024,
    );
    let init = t.client.handshake().await;
    let (sid, _) = credentials(&init);
    for i in 0..N {
        t.client
            .request(
                "process/start",
                json!({"processId": format!("p{i}"), "argv": ["head", "-c", "1048576", "/dev/zero"]}),
            )
            .await;
    }
    let budget = t.registry.output_budget().clone();
    let reg = t.registry.clone();
    // Every process has appended at least one chunk: the guarantee holds for all.
    eventually("every process holds output", || {
        let Some(s) = reg.session(&sid) else {
            return false;
        };
        let procs = s.processes();
        procs.len() == N && procs.iter().all(|p| p.stats().next_seq >= 2)
    })
    .await;
    let bound = BUDGET + N * GUARANTEED_OUTPUT_BYTES;
    let peak = budget.peak();
    assert!(
        peak <= bound,
        "unwritten output peaked at {peak} bytes, over the bound {bound}"
    );
    // The logs hold what the budget counts, and what the stuck transport took before it
    // filled (its 64 KiB pipe and the writer's buffer), nothing beside.
    let held: usize = reg.stats().retained_output_bytes;
    assert!(budget.unwritten() <= bound);
    assert!(held >= budget.unwritten());
    assert!(held <= bound + (512 << 10), "{held} held");
    // And memory follows: the server grew by the output it holds, plus its per-process
    // constant (one read buffer of MAX_CHUNK_BYTES per stream, the tasks and structures).
    let grown = rss_bytes().saturating_sub(rss_before);
    let per_process = PER_PROCESS_BYTES;
    assert!(
        grown <= bound + N * per_process,
        "the server grew by {grown} bytes with {held} held for {N} processes"
    );
    eprintln!(
        "{N} processes: peak unwritten {peak} (bound {bound}), held {held}, RSS grew by {grown}"
    );
    reg.close_all().await;
}

/// Three chatty processes whose client reads nothing hold the budget; another session's
/// process still gets its guaranteed share and finishes its output for a client that reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chatty_processes_of_a_stuck_client_do_not_starve_another_session() {
    const BUDGET: usize = 1 << 20;
    let cfg = ServerConfig {
        output_budget_bytes: BUDGET,
        ..cfg()
    };
    let registry = common::new_registry(cfg);
    let mut stuck = in_process_with(
        registry.clone(),
        64 * 1024,
        execrelay::connection::ConnectionOptions::default(),
    );
    let init = stuck.client.handshake().await;
    let (sid, _) = credentials(&init);
    for i in 0..3 {
        stuck
            .client
            .request(
                "process/start",
                json!({"processId": format!("chatty{i}"), "argv": ["cat", "/dev/zero"]}),
            )
            .await;
    }
    let budget = registry.output_budget().clone();
    // None of them may take another chunk (by its fair share, or because the budget is
    // spent: whichever came first may hold more than a third, as it was alone for a moment).
    let full = output_cost(PUMP_CHUNK_BYTES);
    let reg = registry.clone();
    eventually("the chatty processes hold their fair shares", || {
        let Some(s) = reg.session(&sid) else {
            return false;
        };
        let procs = s.processes();
        procs.len() == 3
            && procs.iter().all(|p| {
                let own = p.stats().unwritten_bytes;
                admission(own, full, budget.unwritten(), budget.ahead(), BUDGET).is_err()
            })
    })
    .await;

    let (mut reader, _, _) = open_session(&registry).await;
    let done = reader
        .client
        .run(json!({"processId": "quiet", "argv": ["head", "-c", "4194304", "/dev/zero"]}))
        .await;
    done.assert_seqs_contiguous();
    assert_eq!(done.stdout.len(), 4 << 20);
    assert_eq!(done.exit["exitCode"], 0);
    assert!(budget.peak() <= BUDGET + 4 * GUARANTEED_OUTPUT_BYTES);
    registry.close_all().await;
}
