//! Helpers shared by the benchmarks that drive the client library (`benches/bench.rs`,
//! `benches/cluster.rs`): settings from the environment, the built binaries, a process's CPU
//! time from `/proc`, percentiles, draining a process's output, and the two latency loops
//! (exec on one connection, a fresh connection each time).
//!
//! Each bench is its own crate and uses only some of these.
#![allow(dead_code)]

pub mod delay;

use std::time::{Duration, Instant};

use execrelay::client::{Client, ClientOptions, ProcessEvent, StartOptions};
use execrelay::link::client::{ClientLink, NoiseClientConfig};

/// A whole number from the environment variable `name`, or `default`.
pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The built binary `name` (benches run from `target/release/deps`; the binaries are one level
/// up), or the path in the environment variable `var`.
pub fn bin(name: &str, var: &str) -> std::path::PathBuf {
    if let Ok(p) = std::env::var(var) {
        return p.into();
    }
    let mut p = std::env::current_exe().expect("current exe");
    p.pop();
    if p.ends_with("deps") {
        p.pop();
    }
    p.join(name)
}

/// (own, reaped children) CPU seconds (user + system) of a live process, from /proc.
pub fn proc_cpu_split(pid: u32) -> (f64, f64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    // SAFETY: sysconf reads a constant of the system.
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    // Fields 14 to 17 of stat (utime, stime, cutime, cstime) are 11 to 14 after the command.
    let field = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (
        (field(11) + field(12)) / tick,
        (field(13) + field(14)) / tick,
    )
}

/// A live process's own minor page faults so far (`minflt` of its `stat`, without its reaped
/// children's): how much fresh memory a run touched, a page at a time. (`/proc/PID/io`'s call
/// counts would not do: a reaped child's calls are added to its parent's.)
pub fn proc_minor_faults(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Field 10 of stat (minflt) is the 8th after the command.
    stat.rsplit(')')
        .next()
        .and_then(|rest| rest.split_whitespace().nth(7))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Minor faults per MiB moved between two readings of [`proc_minor_faults`].
pub fn faults_per_mib(before: u64, after: u64, bytes: u64) -> f64 {
    after.saturating_sub(before) as f64 / (bytes as f64 / (1u64 << 20) as f64)
}

/// CPU seconds of a live process and its reaped children (the commands it ran).
pub fn proc_cpu_secs(pid: u32) -> f64 {
    let (own, children) = proc_cpu_split(pid);
    own + children
}

/// CPU seconds of a live process itself, without the children it reaped.
pub fn proc_own_cpu_secs(pid: u32) -> f64 {
    proc_cpu_split(pid).0
}

/// The `p`th percentile of `sorted` by nearest rank, like the OpenSSH baseline script.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// (p50, p99) in milliseconds of `samples` (seconds).
pub fn p50_p99_ms(mut samples: Vec<f64>) -> (f64, f64) {
    let mut ms: Vec<f64> = samples.drain(..).map(|s| s * 1000.0).collect();
    ms.sort_by(|a, b| a.total_cmp(b));
    (percentile(&ms, 50.0), percentile(&ms, 99.0))
}

/// Start `argv` as process `id` and read its output to the exit notice: (bytes, time taken).
pub async fn drain(client: &Client, id: &str, argv: Vec<String>) -> (u64, Duration) {
    let t0 = Instant::now();
    let mut p = client
        .start(StartOptions::new(id, argv))
        .await
        .expect("start");
    let mut bytes = 0u64;
    let mut events = 0u64;
    while let Some(ev) = p.next_event().await {
        match ev {
            ProcessEvent::Output { data, .. } => {
                bytes += data.len() as u64;
                events += 1;
            }
            ProcessEvent::Exited(_) => break,
            ProcessEvent::Lost { .. } => panic!("lost output"),
            ProcessEvent::Omitted { .. } => panic!("no cap was asked for"),
        }
    }
    if bytes > 1 << 20 {
        eprintln!(
            "[bench] {events} output events, {} bytes per event on average",
            bytes / events.max(1)
        );
    }
    (bytes, t0.elapsed())
}

/// (p50, p99) ms of `true` from start to exit notice on one connection: `runs` samples after
/// `warmup` unrecorded ones.
pub async fn exec_latency_on(client: &Client, runs: u64, warmup: u64) -> (f64, f64) {
    let mut samples = Vec::with_capacity(runs as usize);
    for i in 0..(runs + warmup) {
        let (_, took) = drain(client, &format!("lat-{i}"), vec!["true".into()]).await;
        if i >= warmup {
            samples.push(took.as_secs_f64());
        }
    }
    p50_p99_ms(samples)
}

/// (p50, p99) ms of a fresh connection each time, in no pool: link, Noise handshake,
/// `initialize`, `true` to its exit notice; `runs` samples after five unrecorded ones.
pub async fn connect_latency_to(url: &str, config: &NoiseClientConfig, runs: u64) -> (f64, f64) {
    let mut samples = Vec::with_capacity(runs as usize);
    for i in 0..(runs + 5) {
        let t0 = Instant::now();
        let link = ClientLink::connect(url, config.clone())
            .await
            .expect("link");
        let transport = link.open_stream().await.expect("stream");
        let client = Client::connect_transport(transport, ClientOptions::default())
            .await
            .expect("initialize");
        let _ = drain(&client, "c", vec!["true".into()]).await;
        let took = t0.elapsed();
        client.shutdown().await;
        link.kill();
        if i >= 5 {
            samples.push(took.as_secs_f64());
        }
    }
    p50_p99_ms(samples)
}
