//! The execrelay benchmark (`bash benches/run.sh`, or `cargo bench --bench bench` for our
//! half alone). Prints `KEY VALUE` lines and, when given the OpenSSH baseline file written by
//! `benches/ssh_baseline.sh` in the same run, ratios against it.
//!
//! Measured: throughput of `head -c N /dev/zero` to the client over stdio, plain WebSocket and
//! Noise (`noise`: the client's default suite, aesgcm where the CPU has AES-NI; `noise0`:
//! chachapoly pinned), each with JSON output and with binary output (`protocol.md` §5.1; stdio
//! carries only JSON), in MB/s, CPU seconds per GB (server and client together, and the server alone) and
//! server peak RSS; upload (`head -c N /dev/zero | execrelay run URL -- sh -c 'cat >…'`, the
//! real CLI, to `/dev/null`) over WebSocket and Noise, with binary writes (§5.2) and with
//! `--json-input`; fan-in (many Noise streams at once);
//! exec and connect latency; resume; a slow consumer. Every throughput figure is printed with
//! its ratio to OpenSSH and to the raw pipe measured in the same run.

use std::collections::HashMap;
use std::process::Stdio;
use std::time::{Duration, Instant};

use execrelay::client::{
    Client, ClientOptions, InProcessConfig, ProcessEvent, StartOptions, Target,
};
use execrelay::config::BackendChoice;
use execrelay::noise::suite::{NoiseSuite, SuiteChoice};
use tokio::io::AsyncBufReadExt;

mod common;
use common::{
    drain, env_u64, faults_per_mib, percentile, proc_cpu_secs, proc_minor_faults, proc_own_cpu_secs,
};

fn server_bin() -> std::path::PathBuf {
    common::bin("execrelay", "EXECRELAY_BIN")
}

fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn self_cpu_secs() -> f64 {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

/// Context switches of this process's threads so far (voluntary and not, every thread's,
/// those that ended included): each voluntary one is a thread that went to sleep and must be
/// woken, so the count per exec is the number of thread hand-offs an exec costs.
fn self_switches() -> u64 {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    (ru.ru_nvcsw + ru.ru_nivcsw) as u64
}

/// A server started as a separate process, as in production.
struct ServerProc {
    child: tokio::process::Child,
    url: String,
}

/// Start `execrelay serve ARGS…` and read the bound URL from its first line of stdout.
async fn start_server<I, S>(args: I) -> ServerProc
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut child = tokio::process::Command::new(server_bin())
        .arg("serve")
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start server");
    let out = child.stdout.take().expect("stdout");
    let mut lines = tokio::io::BufReader::new(out).lines();
    let url = lines.next_line().await.expect("url").expect("url line");
    ServerProc { child, url }
}

async fn start_ws_server() -> ServerProc {
    start_server(["--listen", "ws://127.0.0.1:0"]).await
}

/// Keys for a Noise server and its client, in a temporary directory.
struct NoiseKeys {
    dir: std::path::PathBuf,
    config: std::sync::Arc<execrelay::link::client::NoiseClientConfig>,
}

fn noise_keys() -> NoiseKeys {
    use execrelay::noise::keys::{public_line, Keypair};
    let dir = std::env::temp_dir().join(format!("execrelay-bench-keys-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("key dir");
    let server = Keypair::generate().expect("keygen");
    let client = Keypair::generate().expect("keygen");
    server
        .write(&dir.join("server"), "bench")
        .expect("write key");
    // For `execrelay run` (the upload benchmark): the client's key and the server's public key.
    client
        .write(&dir.join("client"), "bench")
        .expect("write key");
    std::fs::write(
        dir.join("server.pub"),
        format!("{}\n", public_line(&server.public, "bench")),
    )
    .expect("server public key");
    std::fs::write(
        dir.join("authorized"),
        format!("{}\n", public_line(&client.public, "bench")),
    )
    .expect("authorized keys");
    NoiseKeys {
        config: std::sync::Arc::new(execrelay::link::client::NoiseClientConfig::new(
            client,
            server.public,
        )),
        dir,
    }
}

async fn start_noise_server(keys: &NoiseKeys) -> ServerProc {
    start_noise_server_with(keys, &[]).await
}

async fn start_noise_server_with(keys: &NoiseKeys, extra: &[&str]) -> ServerProc {
    let (key, auth) = (keys.dir.join("server"), keys.dir.join("authorized"));
    let mut args: Vec<std::ffi::OsString> = vec![
        "--listen".into(),
        "noise+ws://127.0.0.1:0".into(),
        "--key".into(),
        key.into_os_string(),
        "--authorized-keys".into(),
        auth.into_os_string(),
    ];
    args.extend(extra.iter().map(Into::into));
    start_server(args).await
}

/// Fan-in: `procs` clients, each a virtual stream with its own session on one shared Noise
/// link, each running one process that writes `per` bytes, all at once. Returns aggregate
/// MB/s, the server's peak RSS, its CPU seconds per GB, its RSS with the sessions idle and its
/// RSS before any session.
async fn fan_in(keys: &NoiseKeys, procs: usize, per: u64) -> (f64, u64, f64, u64, u64) {
    let limit = (procs + 16).to_string();
    // FANIN_SERVER_ARGS: more flags for the server (say `--output-budget-bytes 32MiB`), to see
    // what a setting costs or saves under fan-in.
    let more = std::env::var("FANIN_SERVER_ARGS").unwrap_or_default();
    // Every client is one key from one address: the per-client quotas must allow them all.
    let mut args: Vec<&str> = vec![
        "--max-sessions",
        &limit,
        "--max-sessions-per-key",
        &limit,
        "--max-sessions-per-address",
        &limit,
        "--max-processes-per-key",
        &limit,
        "--max-processes-per-address",
        &limit,
        "--max-streams-per-key",
        &limit,
    ];
    args.extend(more.split_whitespace());
    let s = start_noise_server_with(keys, &args).await;
    let server_pid = s.child.id().unwrap_or(0);
    // Before any session: the per-session figure is the growth from here.
    let rss_empty = peak_rss_kib(server_pid);
    let opts = ClientOptions {
        reconnect: false,
        ..ClientOptions::default()
    };
    let mut clients = Vec::with_capacity(procs);
    // One pool for all: every client is a stream on the same link.
    let pool = execrelay::link::client::LinkPool::new();
    for _ in 0..procs {
        let target = Target::Noise {
            url: s.url.clone(),
            config: keys.config.clone(),
            pool: pool.clone(),
        };
        clients.push(
            Client::connect(target, opts.clone())
                .await
                .expect("connect"),
        );
    }
    assert_eq!(pool.live_links(), 1, "every fan-in client on one link");
    let rss_idle = peak_rss_kib(server_pid);
    // FANIN_PERF=FILE: record the server's profile during the timed part only (`perf report
    // -i FILE`), to see where the per-stream cost goes.
    let perf = std::env::var_os("FANIN_PERF").map(|out| {
        std::process::Command::new("perf")
            .args([
                "record",
                "-g",
                "-F",
                "999",
                "-p",
                &server_pid.to_string(),
                "-o",
            ])
            .arg(out)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("perf record")
    });
    let cpu0 = proc_own_cpu_secs(server_pid);
    let faults0 = proc_minor_faults(server_pid);
    let t0 = Instant::now();
    let runs = clients.iter().enumerate().map(|(i, c)| {
        let argv = vec![
            "head".to_string(),
            "-c".to_string(),
            per.to_string(),
            "/dev/zero".to_string(),
        ];
        async move { drain(c, &format!("f{i}"), argv).await.0 }
    });
    let total: u64 = futures_util::future::join_all(runs).await.into_iter().sum();
    let took = t0.elapsed();
    // The server's own CPU: the 1,000 `head` processes' start-up (about 1 ms each) is theirs.
    let cpu = proc_own_cpu_secs(server_pid) - cpu0;
    let faults = proc_minor_faults(server_pid);
    eprintln!(
        "[bench] fan-in: server minor faults {:.1} per MiB",
        faults_per_mib(faults0, faults, per * procs as u64)
    );
    if let Some(mut perf) = perf {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(perf.id() as i32),
            nix::sys::signal::Signal::SIGINT,
        );
        let _ = perf.wait();
    }
    assert_eq!(
        total,
        per * procs as u64,
        "every byte of every process arrives"
    );
    let rss = peak_rss_kib(server_pid);
    eprintln!("[bench] fan-in: server RSS {rss_idle} KiB with {procs} idle sessions");
    for c in &clients {
        c.shutdown().await;
    }
    let bytes = per as f64 * procs as f64;
    (
        bytes / 1e6 / took.as_secs_f64(),
        rss,
        cpu / (bytes / 1e9),
        rss_idle,
        rss_empty,
    )
}

/// New connection each time: link, handshake, `initialize`, start `true`, exit notice.
async fn connect_latency(keys: &NoiseKeys, runs: u64) -> (f64, f64) {
    let s = start_noise_server(keys).await;
    common::connect_latency_to(&s.url, &keys.config, runs).await
}

struct Throughput {
    mbps: f64,
    /// Server (with the command it ran) and client together, as OpenSSH's figure counts sshd
    /// with the remote shell and `head`.
    cpu_per_gb: f64,
    /// The server process alone (not the command).
    server_cpu_per_gb: f64,
    server_rss_kib: u64,
}

/// Client options for output in `form` (`json` or `binary`).
fn form_options(form: &str) -> ClientOptions {
    ClientOptions {
        binary_output: form == "binary",
        ..ClientOptions::default()
    }
}

async fn throughput(kind: &str, form: &str, n: u64, keys: &NoiseKeys) -> Throughput {
    let argv = vec![
        "head".to_string(),
        "-c".to_string(),
        n.to_string(),
        "/dev/zero".to_string(),
    ];
    let (client, server_pid, mut server) = match kind {
        "stdio" => {
            let c = Client::connect(
                Target::Spawn {
                    program: server_bin(),
                    args: vec!["serve".into(), "--listen".into(), "stdio".into()],
                },
                form_options(form),
            )
            .await
            .expect("connect stdio");
            let info = c.server_info().await.expect("info");
            (c, info["pid"].as_u64().unwrap_or(0) as u32, None)
        }
        // `noise`: the client's default suite (aesgcm where the CPU has AES-NI); `noise0`:
        // suite 0 (chachapoly) pinned.
        "noise" | "noise0" => {
            let s = start_noise_server(keys).await;
            let mut config = (*keys.config).clone();
            if kind == "noise0" {
                config.suite = SuiteChoice::Pinned(NoiseSuite::ChaChaPoly);
            }
            eprintln!(
                "[bench] {kind}: Noise suite {}",
                config.suite.preferred().as_str()
            );
            let c = Client::connect(
                Target::Noise {
                    url: s.url.clone(),
                    config: std::sync::Arc::new(config),
                    pool: execrelay::link::client::LinkPool::new(),
                },
                form_options(form),
            )
            .await
            .expect("connect noise");
            let pid = s.child.id().unwrap_or(0);
            (c, pid, Some(s))
        }
        _ => {
            let s = start_ws_server().await;
            let c = Client::connect(Target::Ws(s.url.clone()), form_options(form))
                .await
                .expect("connect ws");
            let pid = s.child.id().unwrap_or(0);
            (c, pid, Some(s))
        }
    };
    let server0 = proc_own_cpu_secs(server_pid);
    let faults0 = proc_minor_faults(server_pid);
    let cpu0 = proc_cpu_secs(server_pid) + self_cpu_secs();
    let (bytes, took) = drain(&client, "tp", argv).await;
    let server_cpu = proc_own_cpu_secs(server_pid) - server0;
    let faults = proc_minor_faults(server_pid);
    eprintln!(
        "[bench] {kind}_{form}: server minor faults {:.1} per MiB",
        faults_per_mib(faults0, faults, n)
    );
    let cpu = proc_cpu_secs(server_pid) + self_cpu_secs() - cpu0;
    assert_eq!(bytes, n, "every byte must arrive (got {bytes} of {n})");
    let rss = peak_rss_kib(server_pid);
    client.close();
    if let Some(s) = server.as_mut() {
        let _ = s.child.start_kill();
        let _ = s.child.wait().await;
    }
    Throughput {
        mbps: n as f64 / 1e6 / took.as_secs_f64(),
        cpu_per_gb: cpu / (n as f64 / 1e9),
        server_cpu_per_gb: server_cpu / (n as f64 / 1e9),
        server_rss_kib: rss,
    }
}

/// `head -c n /dev/zero`, and its stdout to hand a command as stdin (the uploads' source).
fn zeros_source(n: u64) -> (std::process::Child, Stdio) {
    let mut head = std::process::Command::new("head")
        .args(["-c", &n.to_string(), "/dev/zero"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("head");
    let out = head.stdout.take().expect("head stdout");
    (head, Stdio::from(out))
}

/// Upload: `head -c N /dev/zero | execrelay run URL -- sh -c 'cat >/dev/null'`, the real CLI
/// against a server of `kind` (`ws` or `noise`). MB/s, and CPU seconds per GB of the server
/// and the client (`execrelay run`) together.
async fn upload(kind: &str, n: u64, keys: &NoiseKeys) -> (f64, f64) {
    // `ws`, `noise`: binary writes (protocol.md §5.2, the CLI's default); `ws_json`,
    // `noise_json`: `--json-input`, JSON with base64.
    let noise = kind.starts_with("noise");
    let mut s = if noise {
        start_noise_server(keys).await
    } else {
        start_ws_server().await
    };
    let server_pid = s.child.id().unwrap_or(0);
    let mut run = std::process::Command::new(server_bin());
    run.arg("run").arg(&s.url);
    if kind.ends_with("_json") {
        run.arg("--json-input");
    }
    if noise {
        run.arg("--server-key")
            .arg(keys.dir.join("server.pub"))
            .arg("--key")
            .arg(keys.dir.join("client"));
    }
    run.args(["--", "sh", "-c", "cat >/dev/null"]);
    let (mut head, head_out) = zeros_source(n);
    let server0 = proc_cpu_secs(server_pid);
    let t0 = Instant::now();
    let children_cpu = || {
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
        let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
        t(ru.ru_utime) + t(ru.ru_stime)
    };
    let children0 = children_cpu();
    let status = run
        .stdin(head_out)
        .stdout(Stdio::null())
        .status()
        .expect("execrelay run");
    let took = t0.elapsed();
    assert!(status.success(), "execrelay run failed: {status}");
    // The client's own CPU (`head` is waited for after this).
    let client_cpu = children_cpu() - children0;
    let _ = head.wait();
    let server_cpu = proc_cpu_secs(server_pid) - server0;
    let _ = s.child.start_kill();
    let _ = s.child.wait().await;
    (
        n as f64 / 1e6 / took.as_secs_f64(),
        (client_cpu + server_cpu) / (n as f64 / 1e9),
    )
}

async fn exec_latency(runs: u64) -> (f64, f64) {
    let s = start_ws_server().await;
    let client = Client::connect(Target::Ws(s.url.clone()), ClientOptions::default())
        .await
        .expect("connect");
    let latency = common::exec_latency_on(&client, runs, 20).await;
    client.close();
    latency
}

// ---------------------------------------------------------------------------------------------
// In-process: `Client::in_process` beside plain WebSocket, in the same run.

/// p50/p99 exec latency (ms) of `true` → exit notice on one in-process client, with the
/// containment backend `backend` (`auto` as a server runs by default; `none` shows what the
/// cgroup placement costs).
async fn in_process_exec_latency(runs: u64, backend: BackendChoice) -> (f64, f64) {
    let (p50, p99, _) = in_process_exec_cost(runs, backend).await;
    (p50, p99)
}

/// [`in_process_exec_latency`] and this process's CPU time per exec (ms): server and client
/// both run here, the child's own time is not counted (it is not reaped into RUSAGE_SELF), so
/// what a spawn costs the server — a fork's page-table copy and copy-on-write faults, or
/// none — shows here, and far more steadily than a latency on a loaded machine.
async fn in_process_exec_cost(runs: u64, backend: BackendChoice) -> (f64, f64, f64) {
    let (p50, p99, cpu_ms, _) = in_process_exec_cost_switches(runs, backend).await;
    (p50, p99, cpu_ms)
}

/// [`in_process_exec_cost`] and the context switches of this process per exec
/// ([`self_switches`]).
async fn in_process_exec_cost_switches(runs: u64, backend: BackendChoice) -> (f64, f64, f64, f64) {
    let mut config = InProcessConfig::default();
    config.server.containment_backend = backend;
    let client = Client::in_process(config, ClientOptions::default())
        .await
        .expect("in-process client");
    let mut samples = Vec::with_capacity(runs as usize);
    let mut cpu0 = 0.0;
    let mut switches0 = 0;
    for i in 0..(runs + 20) {
        if i == 20 {
            cpu0 = self_cpu_secs();
            switches0 = self_switches();
        }
        let (_, took) = drain(&client, &format!("lat-{i}"), vec!["true".into()]).await;
        if i >= 20 {
            samples.push(took.as_secs_f64() * 1000.0);
        }
    }
    let cpu_ms = (self_cpu_secs() - cpu0) * 1000.0 / runs.max(1) as f64;
    let switches = (self_switches() - switches0) as f64 / runs.max(1) as f64;
    samples.sort_by(|a, b| a.total_cmp(b));
    client.shutdown().await;
    (
        percentile(&samples, 50.0),
        percentile(&samples, 99.0),
        cpu_ms,
        switches,
    )
}

/// `head -c n /dev/zero` through an in-process client: MB/s and CPU-s/GB (this process does
/// everything: server, client and the copy of nothing, so its own CPU time is the cost).
async fn in_process_throughput(n: u64) -> (f64, f64) {
    let client = Client::in_process(InProcessConfig::default(), ClientOptions::default())
        .await
        .expect("in-process client");
    let argv = vec![
        "head".into(),
        "-c".into(),
        n.to_string(),
        "/dev/zero".into(),
    ];
    let cpu0 = self_cpu_secs();
    let (bytes, took) = drain(&client, "tp", argv).await;
    let cpu = self_cpu_secs() - cpu0;
    assert_eq!(bytes, n, "every byte must arrive (got {bytes} of {n})");
    client.shutdown().await;
    (n as f64 / 1e6 / took.as_secs_f64(), cpu / (n as f64 / 1e9))
}

/// The physical limit of exec latency on this machine now: fork, exec and reap `true` from
/// this process (tokio's `Command`), p50/p99 in ms, measured beside the others.
async fn raw_spawn_latency(runs: u64) -> (f64, f64, f64) {
    let mut samples = Vec::with_capacity(runs as usize);
    let mut switches0 = 0;
    for i in 0..(runs + 20) {
        if i == 20 {
            switches0 = self_switches();
        }
        let t = Instant::now();
        let status = tokio::process::Command::new("true")
            .status()
            .await
            .expect("spawn true");
        assert!(status.success());
        if i >= 20 {
            samples.push(t.elapsed().as_secs_f64() * 1000.0);
        }
    }
    let switches = (self_switches() - switches0) as f64 / runs.max(1) as f64;
    samples.sort_by(|a, b| a.total_cmp(b));
    (
        percentile(&samples, 50.0),
        percentile(&samples, 99.0),
        switches,
    )
}

/// Raw spawn and in-process exec p50 (ms), both on a runtime of one worker thread of their
/// own (run as a task on it, as `#[tokio::main]` code runs on the bench's two).
fn one_worker_pair(runs: u64) -> (f64, f64) {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a one-worker runtime");
        rt.block_on(async {
            tokio::spawn(async move {
                let (r50, _, _) = raw_spawn_latency(runs).await;
                let (i50, _, _, _) = in_process_exec_cost_switches(runs, BackendChoice::Auto).await;
                (r50, i50)
            })
            .await
            .expect("the one-worker measurement")
        })
    })
    .join()
    .expect("the one-worker thread")
}

/// The in-process section: exec latency and throughput of `Client::in_process` with plain
/// WebSocket measured beside it in the same run (`INPROC_RUNS`, `INPROC_BYTES`; 0 skips).
async fn in_process_section(keys: &NoiseKeys) {
    let runs = env_u64("INPROC_RUNS", 1000);
    if runs > 0 {
        let (r50, r99, rsw) = raw_spawn_latency(runs).await;
        let (i50, i99, icpu, isw) = in_process_exec_cost_switches(runs, BackendChoice::Auto).await;
        let (n50, _) = in_process_exec_latency(runs, BackendChoice::None).await;
        // The same with a large server: `INPROC_BALLAST_MB` of touched memory held meanwhile
        // (a fork copies its page tables and then faults copy-on-write; a clone does neither).
        let ballast_mb = env_u64("INPROC_BALLAST_MB", 512);
        if ballast_mb > 0 {
            let ballast = vec![1u8; (ballast_mb as usize) << 20];
            let (b50, _, bcpu) = in_process_exec_cost(runs, BackendChoice::Auto).await;
            std::hint::black_box(&ballast);
            drop(ballast);
            println!("inproc_exec_latency_ballast_{ballast_mb}MB_p50_ms {b50:.3}");
            println!("inproc_exec_cpu_ballast_{ballast_mb}MB_ms {bcpu:.3}");
        }
        println!("inproc_exec_cpu_ms {icpu:.3}");
        let (w50, w99) = exec_latency(runs).await;
        println!("inproc_raw_spawn_p50_ms {r50:.3}");
        println!("inproc_raw_spawn_p99_ms {r99:.3}");
        println!("inproc_exec_latency_p50_ms {i50:.3}");
        println!("inproc_exec_latency_no_cgroup_p50_ms {n50:.3}");
        println!("inproc_exec_latency_p99_ms {i99:.3}");
        println!("inproc_raw_spawn_switches_per_exec {rsw:.2}");
        println!("inproc_exec_switches_per_exec {isw:.2}");
        println!("inproc_ws_exec_latency_p50_ms {w50:.3}");
        println!("inproc_ws_exec_latency_p99_ms {w99:.3}");
        println!("inproc_vs_ws_exec_latency_p50_ratio {:.3}", i50 / w50);
        println!("inproc_overhead_over_raw_spawn_p50_ms {:.3}", i50 - r50);
        // The same pair on a runtime of one worker (a caller's choice, not the server's): no
        // second worker is woken to steal the in-process path's tasks, so the difference
        // between the two overheads is what that stealing costs on this machine.
        let (o50, oi50) = one_worker_pair(runs);
        println!("inproc_one_worker_raw_spawn_p50_ms {o50:.3}");
        println!("inproc_one_worker_exec_latency_p50_ms {oi50:.3}");
        println!(
            "inproc_one_worker_overhead_over_raw_spawn_p50_ms {:.3}",
            oi50 - o50
        );
    }
    let n = env_u64("INPROC_BYTES", 256 << 20);
    if n > 0 {
        let (mbps, cpu) = in_process_throughput(n).await;
        let ws = throughput("ws", "binary", n, keys).await;
        println!("inproc_MBps {mbps:.1}");
        println!("inproc_cpu_s_per_GB {cpu:.2}");
        println!("inproc_ws_binary_MBps {:.1}", ws.mbps);
        println!("inproc_ws_binary_cpu_s_per_GB {:.2}", ws.cpu_per_gb);
        println!("inproc_vs_ws_MBps_ratio {:.2}", mbps / ws.mbps);
    }
}

/// Kill the client's link `kills` times while a child streams a known file; measure the time
/// from each kill to the next output received over the new connection, and the bytes lost.
async fn resume_bench(kills: usize) -> (f64, f64, i64) {
    let total: usize = 256 * 1024 * 1024;
    let mut data = vec![0u8; total];
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for b in data.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = (x >> 32) as u8;
    }
    let path = std::env::temp_dir().join(format!("execrelay-bench-{}", std::process::id()));
    std::fs::write(&path, &data).expect("write temp file");
    let s = start_ws_server().await;
    let client = Client::connect(Target::Ws(s.url.clone()), ClientOptions::default())
        .await
        .expect("connect");
    let mut p = client
        .start(StartOptions::new(
            "resume",
            ["cat".to_string(), path.display().to_string()],
        ))
        .await
        .expect("start");
    let mut got: Vec<u8> = Vec::with_capacity(total);
    let mut next_kill = total / (kills + 1);
    let mut pending: Option<(Instant, u64)> = None;
    let mut samples = Vec::new();
    while let Some(ev) = p.next_event().await {
        match ev {
            ProcessEvent::Output { data, .. } => {
                got.extend_from_slice(&data);
                if let Some((t, conns)) = pending {
                    if client.connection_count() > conns {
                        samples.push(t.elapsed().as_secs_f64() * 1000.0);
                        pending = None;
                    }
                }
                if pending.is_none() && samples.len() < kills && got.len() >= next_kill {
                    pending = Some((Instant::now(), client.connection_count()));
                    client.break_connection();
                    next_kill += total / (kills + 1);
                }
            }
            ProcessEvent::Exited(_) => break,
            ProcessEvent::Lost { .. } | ProcessEvent::Omitted { .. } => break,
        }
    }
    let _ = std::fs::remove_file(&path);
    let lost = total as i64 - got.len() as i64;
    let intact = got == data;
    if !intact {
        eprintln!("[bench] resume: received bytes differ from what the child wrote");
    }
    client.close();
    samples.sort_by(|a, b| a.total_cmp(b));
    let (p50, max) = if samples.is_empty() {
        (f64::NAN, f64::NAN)
    } else {
        (percentile(&samples, 50.0), samples[samples.len() - 1])
    };
    (p50, max, if intact { lost } else { lost.max(1) })
}

/// A consumer that takes 1 KiB/s while the child writes as fast as it can: server peak RSS
/// and the latency of a `process/terminate` sent meanwhile.
async fn slow_consumer(seconds: u64) -> (u64, f64) {
    let mut s = start_ws_server().await;
    let server_pid = s.child.id().unwrap_or(0);
    let client = Client::connect(Target::Ws(s.url.clone()), ClientOptions::default())
        .await
        .expect("connect");
    let mut p = client
        .start(StartOptions::new(
            "flood",
            ["cat".to_string(), "/dev/zero".to_string()],
        ))
        .await
        .expect("start");
    let ctl = p.controller();
    let t0 = Instant::now();
    let mut consumed = 0u64;
    while t0.elapsed() < Duration::from_secs(seconds) {
        // Take output no faster than 1 KiB per second of wall time.
        let allowed = (t0.elapsed().as_secs_f64() * 1024.0) as u64;
        if consumed <= allowed {
            if let Some(ProcessEvent::Output { data, .. }) = p.next_event().await {
                consumed += data.len() as u64;
            }
        } else {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let rss = peak_rss_kib(server_pid);
    let t = Instant::now();
    ctl.terminate().await.expect("terminate");
    let latency = t.elapsed().as_secs_f64() * 1000.0;
    drop(p);
    client.close();
    let _ = s.child.start_kill();
    let _ = s.child.wait().await;
    (rss, latency)
}

fn read_baseline() -> HashMap<String, f64> {
    let mut m = HashMap::new();
    if let Ok(path) = std::env::var("SSH_BASELINE_FILE") {
        if let Ok(text) = std::fs::read_to_string(path) {
            for line in text.lines() {
                let mut it = line.split_whitespace();
                if let (Some(k), Some(v)) = (it.next(), it.next()) {
                    if let Ok(v) = v.parse() {
                        m.insert(k.to_string(), v);
                    }
                }
            }
        }
    }
    m
}

/// CPU seconds per GB of child output spent in the Noise record layer alone: sealing the
/// output deltas of `n` bytes (64 KiB chunks; base64 in JSON, or binary messages) into `DATA`
/// frames and opening them again, on one thread, with no I/O. Both ends of a real link pay it
/// on top of everything the plain WebSocket path pays.
fn record_layer_cpu_per_gb(n: u64, binary: bool, suite: NoiseSuite) -> f64 {
    use base64::Engine;
    use execrelay::noise::handshake::{read_hello_suite, ClientHandshake};
    use execrelay::noise::keys::Keypair;
    use execrelay::noise::record::{Opened, RecordOpener, RecordSealer};
    use execrelay_protocol::frame::Frame;
    let (c, s) = (
        Keypair::generate().expect("key"),
        Keypair::generate().expect("key"),
    );
    let sid = [5u8; 16];
    let (hs, m1) =
        ClientHandshake::start_suite(suite, &c, &s.public, "", &sid, None, 1).expect("m1");
    let (m2, server_keys) = read_hello_suite(suite, &s, "", &sid, &m1)
        .expect("hello")
        .accept("bench")
        .expect("m2");
    let (client_keys, _) = hs.finish(&m2).expect("finish");
    let mut sealer = RecordSealer::new(server_keys);
    let mut opener = RecordOpener::new(client_keys, execrelay::config::MAX_MESSAGE_BYTES);
    let raw = vec![0u8; execrelay::config::PUMP_CHUNK_BYTES];
    let chunk = base64::engine::general_purpose::STANDARD.encode(&raw);
    let msg = format!(
        r#"{{"jsonrpc":"2.0","method":"process/outputDelta","params":{{"processId":"tp","seq":1,"stream":"stdout","chunk":"{chunk}"}}}}"#
    );
    let head = execrelay::rpc::binary_output::encode_output_head(
        "tp",
        1,
        execrelay::rpc::messages::StreamName::Stdout,
    );
    let chunks = n.div_ceil(raw.len() as u64);
    let cpu0 = self_cpu_secs();
    let mut got = 0u64;
    for _ in 0..chunks {
        let frames = if binary {
            sealer.seal_message_parts(&sid, &[&head, &raw])
        } else {
            sealer.seal_message_frames(&sid, msg.as_bytes())
        };
        for f in frames.expect("seal") {
            let f = Frame::decode_owned(f).expect("frame");
            if let Ok(Opened::Messages(m)) = opener.open_owned(f.seq, f.payload) {
                got += m.len() as u64;
            }
        }
    }
    assert_eq!(got, chunks, "every message opened");
    (self_cpu_secs() - cpu0) / (n as f64 / 1e9)
}

#[tokio::main]
async fn main() {
    execrelay::cli::tune_allocator();
    // `cargo bench` passes `--bench`; nothing else to parse.
    let n = env_u64("BENCH_BYTES", 1 << 30);
    let repeats = env_u64("BENCH_REPEATS", 3).max(1);
    let runs = env_u64("EXEC_LATENCY_RUNS", 1000);
    let base = read_baseline();
    eprintln!("[bench] server binary: {}", server_bin().display());

    let keys = noise_keys();
    in_process_section(&keys).await;
    let kinds = std::env::var("BENCH_KINDS").unwrap_or_else(|_| "stdio,ws,noise,noise0".into());
    let forms = std::env::var("BENCH_FORMS").unwrap_or_else(|_| "json,binary".into());
    let ratios = |key: &str, mbps: f64| {
        if let Some(ssh) = base.get("ssh_chacha_MBps") {
            println!("{key}_vs_ssh_chacha_ratio {:.2}", mbps / ssh);
        }
        if let Some(ssh) = base.get("ssh_aes128gcm_MBps") {
            println!("{key}_vs_ssh_aes128gcm_ratio {:.2}", mbps / ssh);
        }
        if let Some(raw) = base.get("raw_pipe_MBps") {
            println!("{key}_vs_raw_pipe_ratio {:.2}", mbps / raw);
        }
    };
    let mut cpu_per_gb = HashMap::new();
    let mut server_cpu_per_gb = HashMap::new();
    let mut mbps_of: HashMap<String, f64> = HashMap::new();
    for kind in kinds.split(',').filter(|k| !k.is_empty()) {
        for form in forms.split(',').filter(|f| !f.is_empty()) {
            // stdio cannot carry binary messages: the server answers binaryOutput false.
            if kind == "stdio" && form == "binary" {
                continue;
            }
            let key = format!("{kind}_{form}");
            let mut results = Vec::new();
            for r in 0..repeats {
                let t = throughput(kind, form, n, &keys).await;
                eprintln!(
                    "[bench] {key} run {r}: {:.1} MB/s, {:.2} CPU-s/GB ({:.2} server), server peak RSS {} KiB",
                    t.mbps, t.cpu_per_gb, t.server_cpu_per_gb, t.server_rss_kib
                );
                results.push(t);
            }
            results.sort_by(|a, b| a.mbps.total_cmp(&b.mbps));
            let med = &results[results.len() / 2];
            println!("{key}_MBps {:.1}", med.mbps);
            println!("{key}_cpu_s_per_GB {:.2}", med.cpu_per_gb);
            println!("{key}_server_own_cpu_s_per_GB {:.2}", med.server_cpu_per_gb);
            println!("{key}_server_peak_rss_KiB {}", med.server_rss_kib);
            ratios(&key, med.mbps);
            cpu_per_gb.insert(key.clone(), med.cpu_per_gb);
            mbps_of.insert(key.clone(), med.mbps);
            server_cpu_per_gb.insert(key, med.server_cpu_per_gb);
        }
    }

    // The record layer's own cost, and what it implies: the Noise path does all the work of
    // the plain WebSocket path plus this, so with every core busy and perfect overlap it cannot
    // exceed cores / (ws CPU-s/GB + record CPU-s/GB).
    if kinds.split(',').any(|k| k.starts_with("noise")) {
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get()) as f64;
        for (suite, tag) in [
            (NoiseSuite::AesGcm, "aesgcm"),
            (NoiseSuite::ChaChaPoly, "chachapoly"),
        ] {
            for form in ["json", "binary"] {
                let rec = record_layer_cpu_per_gb(n.min(1 << 30), form == "binary", suite);
                println!("noise_{tag}_{form}_record_layer_cpu_s_per_GB {rec:.2}");
                if let Some(ws) = cpu_per_gb.get(&format!("ws_{form}")) {
                    let ceiling = cores / (ws + rec) * 1e3;
                    println!("noise_{tag}_{form}_ceiling_MBps {ceiling:.0}");
                    if let Some(ssh) = base.get("ssh_chacha_MBps") {
                        println!(
                            "noise_{tag}_{form}_ceiling_vs_ssh_chacha_ratio {:.2}",
                            ceiling / ssh
                        );
                    }
                }
            }
        }
    }

    // Upload through the real CLI, beside `ssh host 'cat >/dev/null'` (ssh_baseline.sh).
    let up_kinds =
        std::env::var("UPLOAD_KINDS").unwrap_or_else(|_| "ws,noise,ws_json,noise_json".into());
    for kind in up_kinds.split(',').filter(|k| !k.is_empty()) {
        let mut results = Vec::new();
        for r in 0..repeats {
            let (mbps, cpu) = upload(kind, n, &keys).await;
            eprintln!("[bench] upload {kind} run {r}: {mbps:.1} MB/s, {cpu:.2} CPU-s/GB");
            results.push((mbps, cpu));
        }
        results.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (mbps, cpu) = results[results.len() / 2];
        println!("upload_{kind}_MBps {mbps:.1}");
        println!("upload_{kind}_cpu_s_per_GB {cpu:.2}");
        if let Some(ssh) = base.get("ssh_upload_MBps") {
            println!("upload_{kind}_vs_ssh_upload_ratio {:.2}", mbps / ssh);
        }
        if let Some(raw) = base.get("raw_pipe_MBps") {
            println!("upload_{kind}_vs_raw_pipe_ratio {:.2}", mbps / raw);
        }
    }

    // Each part below can be skipped by setting its count to 0 (for profiling one path).
    let kills = env_u64("RESUME_KILLS", 10) as usize;
    if kills > 0 {
        let (r50, rmax, lost) = resume_bench(kills).await;
        println!("resume_p50_ms {r50:.2}");
        println!("resume_max_ms {rmax:.2}");
        println!("resume_bytes_lost {lost}");
    }

    let slow_secs = env_u64("SLOW_CONSUMER_SECONDS", 10);
    if slow_secs > 0 {
        let (rss, term_ms) = slow_consumer(slow_secs).await;
        println!("slow_consumer_server_peak_rss_KiB {rss}");
        println!("slow_consumer_terminate_latency_ms {term_ms:.2}");
    }

    let fan = env_u64("FANIN_PROCS", 1000) as usize;
    if fan > 0 && kinds.split(',').any(|k| k == "noise") {
        let per = env_u64("FANIN_BYTES", 1 << 20);
        let (mbps, rss, cpu, idle, empty) = fan_in(&keys, fan, per).await;
        println!("fanin_procs {fan}");
        println!("fanin_MBps {mbps:.1}");
        println!("fanin_server_own_cpu_s_per_GB {cpu:.2}");
        // Against one Noise stream with binary output (what the fan-in's clients ask for).
        if let Some(single) = server_cpu_per_gb.get("noise_binary") {
            println!(
                "fanin_server_cpu_vs_single_noise_stream_ratio {:.2}",
                cpu / single
            );
        }
        println!("fanin_server_peak_rss_KiB {rss}");
        // The documented bound (README, "The output budget"): the server's RSS with its
        // sessions idle, plus the output budget, plus the link's send queue, plus per stream:
        // its guaranteed chunk, the process itself (64 KiB), what its client has not yet
        // acknowledged (ACK_EVERY_BYTES) and the one sealed message its stream sink may hold.
        let budget_kib = (execrelay::config::OUTPUT_BUDGET_BYTES / 1024) as u64;
        let link_queue_kib = (execrelay_protocol::config::LINK_SEND_QUEUE_BYTES / 1024) as u64;
        let per_stream_kib = ((execrelay::process::output_budget::GUARANTEED_OUTPUT_BYTES
            + 64 * 1024
            + execrelay::client::ACK_EVERY_BYTES as usize
            + execrelay_protocol::frame::MAX_FRAME_BYTES)
            / 1024) as u64;
        let bound = idle + budget_kib + link_queue_kib + fan as u64 * per_stream_kib;
        println!("fanin_server_idle_rss_KiB {idle}");
        // Each idle session is a client on its own Noise stream, initialized, no process yet.
        println!(
            "server_rss_per_idle_session_KiB {:.2}",
            idle.saturating_sub(empty) as f64 / fan.max(1) as f64
        );
        println!("fanin_server_rss_bound_KiB {bound}");
    }

    // Through one relay: its own section, apart from the relay-alone
    // figures. Skipped with BENCH_RELAY=0.
    if env_u64("BENCH_RELAY", 1) > 0 {
        relay_section(&keys, n, runs.min(200), &mbps_of, &base).await;
    }

    // A far client: the stream window against a round trip. Skipped with BENCH_RTT_MS=0.
    let rtt = env_u64("BENCH_RTT_MS", 20);
    if rtt > 0 {
        far_section(&keys, rtt, env_u64("BENCH_RTT_BYTES", 64 << 20)).await;
    }

    let connects = env_u64("CONNECT_LATENCY_RUNS", 200);
    if connects > 0 {
        let (c50, c99) = connect_latency(&keys, connects).await;
        println!("noise_connect_latency_p50_ms {c50:.3}");
        println!("noise_connect_latency_p99_ms {c99:.3}");
        if let Some(ssh) = base.get("ssh_fresh_p50_ms") {
            println!("noise_connect_ssh_fresh_speedup {:.1}", ssh / c50);
        }
    }
    let _ = std::fs::remove_dir_all(&keys.dir);

    if runs > 0 {
        let (p50, p99) = exec_latency(runs).await;
        println!("exec_latency_p50_ms {p50:.3}");
        println!("exec_latency_p99_ms {p99:.3}");
        if let Some(ssh) = base.get("ssh_controlmaster_p50_ms") {
            println!(
                "exec_latency_p50_vs_ssh_controlmaster_ratio {:.3}",
                p50 / ssh
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Through one relay: throughput, exec latency and new-connection latency, with the relay's
// CPU-s/GB and peak RSS (`execrelay-relay` next to `execrelay`; `benches/run.sh` builds both).

/// A relay binary, and an exec server registered with it as environment `bench`.
struct RelayRig {
    relay: tokio::process::Child,
    _server: ServerProc,
    /// `relay+ws://127.0.0.1:PORT/bench`.
    url: String,
}

async fn start_relay_rig(keys: &NoiseKeys) -> RelayRig {
    use execrelay::noise::keys::{public_line, Keypair};
    let relay_keys = Keypair::generate().expect("keygen");
    relay_keys
        .write(&keys.dir.join("relay"), "bench-relay")
        .expect("write key");
    std::fs::write(
        keys.dir.join("environments"),
        format!(
            "bench {}\n",
            public_line(&keys.config.server_public, "bench-server")
        ),
    )
    .expect("environments");
    let relay_bin = server_bin().with_file_name("execrelay-relay");
    let mut relay = tokio::process::Command::new(&relay_bin)
        .args(["--listen", "ws://127.0.0.1:0", "--key"])
        .arg(keys.dir.join("relay"))
        .arg("--environments")
        .arg(keys.dir.join("environments"))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", relay_bin.display()));
    let out = relay.stdout.take().expect("stdout");
    let relay_url = tokio::io::BufReader::new(out)
        .lines()
        .next_line()
        .await
        .expect("relay url")
        .expect("relay url line");
    let (key, auth) = (keys.dir.join("server"), keys.dir.join("authorized"));
    let server = start_server([
        std::ffi::OsString::from("--relay"),
        relay_url.into(),
        "--environment-id".into(),
        "bench".into(),
        "--relay-key".into(),
        keys.dir.join("relay.pub").into_os_string(),
        "--key".into(),
        key.into_os_string(),
        "--authorized-keys".into(),
        auth.into_os_string(),
    ])
    .await;
    let url = server.url.clone();
    RelayRig {
        relay,
        _server: server,
        url,
    }
}

fn relay_target(rig: &RelayRig, keys: &NoiseKeys) -> Target {
    Target::Noise {
        url: rig.url.clone(),
        config: keys.config.clone(),
        pool: execrelay::link::client::LinkPool::new(),
    }
}

/// A Noise target at `url` whose streams advertise `window` records.
fn windowed_target(url: &str, keys: &NoiseKeys, window: u32) -> Target {
    let mut config = (*keys.config).clone();
    config.window = window;
    Target::Noise {
        url: url.to_string(),
        config: std::sync::Arc::new(config),
        pool: execrelay::link::client::LinkPool::new(),
    }
}

/// `head -c n /dev/zero` drained on a new client of `target`: MB/s.
async fn zeros_mbps(target: Target, n: u64) -> f64 {
    let client = Client::connect(target, ClientOptions::default())
        .await
        .expect("connect");
    let argv = vec![
        "head".into(),
        "-c".into(),
        n.to_string(),
        "/dev/zero".into(),
    ];
    let (bytes, took) = drain(&client, "far", argv).await;
    assert_eq!(bytes, n, "every byte must arrive");
    client.close();
    n as f64 / 1e6 / took.as_secs_f64()
}

/// A Noise server started with `extra` flags, behind a proxy that delays each direction by
/// `rtt_ms / 2`: the server and the proxy's `noise+ws://` URL.
async fn far_server(keys: &NoiseKeys, extra: &[&str], rtt_ms: u64) -> (ServerProc, String) {
    let s = start_noise_server_with(keys, extra).await;
    let port: u16 = s
        .url
        .rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .expect("the server's port");
    let proxy = common::delay::start(port, Duration::from_millis(rtt_ms) / 2).await;
    (s, format!("noise+ws://127.0.0.1:{proxy}"))
}

/// Noise direct through a proxy that delays each direction by `rtt_ms / 2`: a stream moves at
/// most one window per round trip, so this is the window's figure, not the CPU's. Output at the
/// client's window 16 (the default, 1 MiB), 64 (the most a relay passes on by default) and
/// 256 (the client's largest), each with its ceiling (window ÷ round trip); uploads at the
/// server's `noise_window_records` 16 (default) and 64 (its largest).
async fn far_section(keys: &NoiseKeys, rtt_ms: u64, n: u64) {
    use execrelay::link::client::MAX_CLIENT_WINDOW_RECORDS;
    use execrelay_protocol::config::{MAX_RELAY_WINDOW_RECORDS, STREAM_WINDOW_RECORDS};
    let (mut s, url) = far_server(keys, &[], rtt_ms).await;
    println!("far_rtt_ms {rtt_ms}");
    let mut base = None;
    for w in [
        STREAM_WINDOW_RECORDS,
        MAX_RELAY_WINDOW_RECORDS,
        MAX_CLIENT_WINDOW_RECORDS,
    ] {
        let mbps = zeros_mbps(windowed_target(&url, keys, w), n).await;
        let ceiling = f64::from(w) * 65536.0 / 1e6 / (rtt_ms as f64 / 1e3);
        println!("far_window{w}_MBps {mbps:.1}");
        println!("far_window{w}_ceiling_MBps {ceiling:.1}");
        match base {
            None => base = Some(mbps),
            Some(b) => println!(
                "far_window{w}_vs_window{STREAM_WINDOW_RECORDS}_ratio {:.2}",
                mbps / b
            ),
        }
    }
    let _ = s.child.start_kill();
    let _ = s.child.wait().await;

    // Uploads (`execrelay run` with stdin, binary writes) are held by the server's window:
    // `noise_window_records` at its default and at its maximum.
    for w in [STREAM_WINDOW_RECORDS, MAX_RELAY_WINDOW_RECORDS] {
        let w_arg = w.to_string();
        let (mut s, url) = far_server(keys, &["--noise-window-records", &w_arg], rtt_ms).await;
        let (mut head, head_out) = zeros_source(n);
        let t0 = Instant::now();
        let status = tokio::process::Command::new(server_bin())
            .arg("run")
            .arg(&url)
            .arg("--server-key")
            .arg(keys.dir.join("server.pub"))
            .arg("--key")
            .arg(keys.dir.join("client"))
            .args(["--", "sh", "-c", "cat >/dev/null"])
            .stdin(head_out)
            .stdout(Stdio::null())
            .status()
            .await
            .expect("execrelay run");
        let took = t0.elapsed();
        assert!(status.success(), "execrelay run failed: {status}");
        let _ = head.wait();
        let mbps = n as f64 / 1e6 / took.as_secs_f64();
        println!("far_upload_server_window{w}_MBps {mbps:.1}");
        let _ = s.child.start_kill();
        let _ = s.child.wait().await;
    }
}

/// Connect through the relay, waiting (bounded) for the exec server to register.
async fn relay_client(rig: &RelayRig, keys: &NoiseKeys) -> Client {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match Client::connect(relay_target(rig, keys), ClientOptions::default()).await {
            Ok(c) => return c,
            Err(e) if Instant::now() < deadline && e.to_string().contains("offline") => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("connect through the relay: {e}"),
        }
    }
}

async fn relay_section(
    keys: &NoiseKeys,
    n: u64,
    runs: u64,
    mbps_of: &HashMap<String, f64>,
    base: &HashMap<String, f64>,
) {
    let mut rig = start_relay_rig(keys).await;
    let relay_pid = rig.relay.id().unwrap_or(0);
    let client = relay_client(&rig, keys).await;
    let argv = vec![
        "head".to_string(),
        "-c".to_string(),
        n.to_string(),
        "/dev/zero".to_string(),
    ];
    let cpu0 = proc_cpu_secs(relay_pid);
    let (bytes, took) = drain(&client, "tp", argv).await;
    let relay_cpu = proc_cpu_secs(relay_pid) - cpu0;
    assert_eq!(bytes, n, "every byte must arrive through the relay");
    let mbps = n as f64 / 1e6 / took.as_secs_f64();
    println!("relay_MBps {mbps:.1}");
    println!("relay_cpu_s_per_GB {:.3}", relay_cpu / (n as f64 / 1e9));
    if let Some(noise) = mbps_of.get("noise_binary") {
        println!("relay_vs_noise_direct_ratio {:.2}", mbps / noise);
    }
    if let Some(ssh) = base.get("ssh_chacha_MBps") {
        println!("relay_vs_ssh_chacha_ratio {:.2}", mbps / ssh);
    }
    // The same through the relay with the client's window at the most the relay passes on
    // (64 records): on loopback the round trip across three processes on two cores is what
    // the default window waits for.
    {
        let w = execrelay_protocol::config::MAX_RELAY_WINDOW_RECORDS;
        let mbps = zeros_mbps(windowed_target(&rig.url, keys, w), n).await;
        println!("relay_window{w}_MBps {mbps:.1}");
        if let Some(noise) = mbps_of.get("noise_binary") {
            println!("relay_window{w}_vs_noise_direct_ratio {:.2}", mbps / noise);
        }
    }

    if runs == 0 {
        let _ = rig.relay.start_kill();
        let _ = rig.relay.wait().await;
        return;
    }
    // Exec latency through the relay: `true` from start to exit notice on one stream.
    let (p50, p99) = common::exec_latency_on(&client, runs, 5).await;
    println!("relay_exec_latency_p50_ms {p50:.3}");
    println!("relay_exec_latency_p99_ms {p99:.3}");
    client.close();

    // New-connection latency through the relay: link, handshake, `initialize`, `true`.
    let (p50, p99) = common::connect_latency_to(&rig.url, &keys.config, runs.min(100)).await;
    println!("relay_connect_latency_p50_ms {p50:.3}");
    println!("relay_connect_latency_p99_ms {p99:.3}");
    println!("relay_peak_rss_KiB {}", peak_rss_kib(relay_pid));
    let _ = rig.relay.start_kill();
    let _ = rig.relay.wait().await;
}
