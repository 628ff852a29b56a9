//! The load benchmark (`soak load`, driven by `benches/load.sh`): one relay, one exec server
//! registered with it, 50 clients through the relay keeping 1,000 processes running for ten
//! minutes (each writes a paced trickle for a while, exits, and is replaced), and a probe
//! client measuring, beside that load and before it on the idle server:
//!
//! - `process/terminate`: the request's round trip, for a running process;
//! - a small run on the probe's connection: `process/start` of a child that writes 100 bytes
//!   and exits, to its exit notice;
//! - a small run as a user types it: `execrelay run relay+ws://… -- true`, a new process, a new
//!   link, a new handshake and session, to its exit status.
//!
//! p50 and p99 of each, idle and loaded, side by side. No faults: this measures latency under
//! load, not resilience.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use execrelay::client::{Client, ClientOptions, ProcessEvent, StartOptions, Target};
use execrelay::link::client::{LinkPool, NoiseClientConfig};
use execrelay::noise::keys::Keypair;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::child::ChildArgs;
use crate::deploy::{self, Bins, LinkTimes, RelayProc, ServerProc};
use crate::rng::{derive, Rng};

/// `soak load`'s flags; `benches/load.sh` sets them from its environment.
#[derive(Debug, Clone, clap::Args)]
pub struct LoadArgs {
    /// How long the load runs (s).
    #[arg(long, default_value_t = 600)]
    pub duration_s: u64,
    /// Clients (each a key, a link and a session of its own).
    #[arg(long, default_value_t = 50)]
    pub clients: usize,
    /// Processes each client keeps running.
    #[arg(long, default_value_t = 20)]
    pub per_client: usize,
    /// Output of each loaded process (bytes per second).
    #[arg(long, default_value_t = 8192)]
    pub pace: u64,
    /// Samples of each figure on the idle server.
    #[arg(long, default_value_t = 300)]
    pub idle_samples: usize,
    /// Time between two probes (ms).
    #[arg(long, default_value_t = 200)]
    pub probe_every_ms: u64,
    /// The seed of the load's process lifetimes.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Where `execrelay` and `execrelay-relay` are.
    #[arg(long)]
    pub bin_dir: PathBuf,
    /// Where logs go.
    #[arg(long)]
    pub out_dir: Option<PathBuf>,
}

/// Latencies of one kind, in ms.
#[derive(Default)]
struct Samples(Vec<f64>);

impl Samples {
    fn push(&mut self, d: Duration) {
        self.0.push(d.as_secs_f64() * 1000.0);
    }

    fn pct(&self, p: f64) -> f64 {
        if self.0.is_empty() {
            return f64::NAN;
        }
        let mut v = self.0.clone();
        v.sort_by(f64::total_cmp);
        let i = ((v.len() as f64 - 1.0) * p).round() as usize;
        v[i]
    }

    fn line(&self) -> String {
        format!(
            "p50 {:.2} ms, p99 {:.2} ms (n = {})",
            self.pct(0.5),
            self.pct(0.99),
            self.0.len()
        )
    }
}

#[derive(Default)]
struct Probes {
    terminate: Samples,
    run: Samples,
    cli: Samples,
}

struct Env {
    url: String,
    bins: Bins,
    server_pub: PathBuf,
    exe: String,
}

fn client_config(keys: &Keypair, server_public: [u8; 32]) -> Arc<NoiseClientConfig> {
    Arc::new(NoiseClientConfig::new(keys.clone(), server_public))
}

async fn connect(url: &str, cfg: Arc<NoiseClientConfig>) -> Result<Client> {
    let target = Target::Noise {
        url: url.to_string(),
        config: cfg,
        pool: LinkPool::new(),
    };
    let mut last = None;
    for _ in 0..50 {
        match Client::connect(target.clone(), ClientOptions::default()).await {
            Ok(c) => return Ok(c),
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bail!("cannot connect to {url}: {last:?}")
}

fn child(exe: &str, args: ChildArgs) -> Vec<String> {
    let mut v = vec![exe.to_string()];
    v.extend(args.argv());
    v
}

/// Wait for a process's exit notice (draining its output).
async fn wait_exit(h: &mut execrelay::client::ProcessHandle) -> Result<()> {
    while let Some(ev) = h.next_event().await {
        if matches!(ev, ProcessEvent::Exited(_)) {
            return Ok(());
        }
    }
    bail!("no exit notice")
}

/// One round of the three probes.
async fn probe_once(
    env: &Env,
    probe: &Client,
    keys_path: &std::path::Path,
    n: u64,
    p: &mut Probes,
    cli: bool,
) -> Result<()> {
    // terminate: a running process (it has written), then the request's round trip.
    let id = format!("probe-t{n}");
    let mut h = probe
        .start(StartOptions::new(
            &id,
            child(
                &env.exe,
                ChildArgs {
                    bytes: 1 << 30,
                    pace: 1024,
                    ..Default::default()
                },
            ),
        ))
        .await?;
    if !matches!(h.next_event().await, Some(ProcessEvent::Output { .. })) {
        bail!("{id} ended before it wrote");
    }
    let t0 = Instant::now();
    h.terminate(None).await?;
    p.terminate.push(t0.elapsed());
    wait_exit(&mut h).await?;
    drop(h);
    // A small run on this connection: start → exit notice.
    let id = format!("probe-r{n}");
    let t0 = Instant::now();
    let mut h = probe
        .start(StartOptions::new(
            &id,
            child(
                &env.exe,
                ChildArgs {
                    bytes: 100,
                    ..Default::default()
                },
            ),
        ))
        .await?;
    wait_exit(&mut h).await?;
    p.run.push(t0.elapsed());
    drop(h);
    if cli {
        // A small run as a user types it: a new process, link, handshake and session.
        let t0 = Instant::now();
        let out = tokio::process::Command::new(&env.bins.execrelay)
            .arg("run")
            .arg(&env.url)
            .arg(format!("--server-key={}", env.server_pub.display()))
            .arg(format!("--key={}", keys_path.display()))
            .args(["--", "true"])
            .stdin(std::process::Stdio::null())
            .output()
            .await?;
        if !out.status.success() {
            bail!(
                "execrelay run failed: {:?} {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        p.cli.push(t0.elapsed());
    }
    Ok(())
}

/// Run the load benchmark; the process exit code.
pub async fn run(args: LoadArgs) -> Result<i32> {
    let out = match &args.out_dir {
        Some(d) => d.clone(),
        None => PathBuf::from("target/load"),
    };
    std::fs::create_dir_all(&out)?;
    let out = out.canonicalize()?;
    let bins = Bins::in_dir(&args.bin_dir)?;
    let keydir = out.join("keys");
    let _ = std::fs::remove_dir_all(&keydir);
    std::fs::create_dir_all(&keydir)?;
    let times = LinkTimes {
        keepalive_ms: 15_000,
        pong_timeout_ms: 30_000,
    };
    let relay_keys = Keypair::generate()?;
    let relay_key = deploy::write_key(&keydir, "relay", &relay_keys)?;
    let server_keys = Keypair::generate()?;
    let server_key = deploy::write_key(&keydir, "server", &server_keys)?;
    // One key per loading client, one for the probe client, one for `execrelay run` (so
    // that no two of them share a key's handshake timestamps).
    let clients: Vec<Keypair> = (0..args.clients + 2)
        .map(|_| Keypair::generate())
        .collect::<Result<_, _>>()?;
    let cli_key = deploy::write_key(&keydir, "cli", &clients[args.clients + 1])?;
    let authorized = deploy::authorized_keys(&keydir, &clients)?;
    let envs = deploy::environments(&keydir, &[("load".to_string(), server_keys.public)])?;
    let mut relay = RelayProc::start(&bins, &out, &relay_key, &envs, &times).await?;
    let relay_pub = execrelay::noise::keys::pub_path(&relay_key);
    let load_processes = args.clients * args.per_client;
    let mut server = ServerProc::start(
        &bins,
        &out,
        "load",
        &server_keys,
        &server_key,
        &relay_pub,
        &authorized,
        relay.addr(),
        &times,
        // Every client connects from 127.0.0.1: the server's per-address quotas (32 sessions,
        // 512 processes by default) and its process limit (256) are raised to the load.
        &[
            "--max-sessions=128".to_string(),
            "--max-sessions-per-address=128".to_string(),
            format!("--max-processes={}", load_processes + 64),
            format!("--max-processes-per-address={}", load_processes + 64),
        ],
        &[],
    )
    .await
    .context("the exec server")?;
    let url = format!("relay+ws://{}/load", relay.addr());
    let env = Env {
        url: url.clone(),
        bins: bins.clone(),
        server_pub: execrelay::noise::keys::pub_path(&server_key),
        exe: std::env::current_exe()?.display().to_string(),
    };
    println!(
        "load: relay pid {:?}, exec server pid {:?}; {} clients × {} processes through {url}",
        relay.pid(),
        server.pid(),
        args.clients,
        args.per_client
    );
    let probe = connect(
        &url,
        client_config(&clients[args.clients], server_keys.public),
    )
    .await?;

    // Idle.
    let mut idle = Probes::default();
    for n in 0..args.idle_samples as u64 {
        probe_once(&env, &probe, &cli_key, n, &mut idle, n % 4 == 0).await?;
        tokio::time::sleep(Duration::from_millis(args.probe_every_ms)).await;
    }
    println!("load: idle: terminate {}", idle.terminate.line());
    println!("load: idle: small run {}", idle.run.line());
    println!("load: idle: execrelay run -- true {}", idle.cli.line());

    // The load: every client keeps its processes running; each lives 30 to 120 s.
    let stop = CancellationToken::new();
    let running = Arc::new(AtomicU64::new(0));
    let started = Arc::new(AtomicU64::new(0));
    let bytes = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(AtomicU64::new(0));
    let mut loaders = JoinSet::new();
    for (i, keys) in clients.iter().enumerate().take(args.clients) {
        let client = connect(&url, client_config(keys, server_keys.public)).await?;
        let (stop, running, started, bytes, failures) = (
            stop.clone(),
            running.clone(),
            started.clone(),
            bytes.clone(),
            failures.clone(),
        );
        let (exe, per, pace) = (env.exe.clone(), args.per_client, args.pace);
        let mut rng = Rng::new(derive(args.seed, "load", i as u64));
        loaders.spawn(async move {
            let mut procs = JoinSet::new();
            let mut n = 0u64;
            while !stop.is_cancelled() {
                while procs.len() < per && !stop.is_cancelled() {
                    let life = rng.range(30, 120);
                    let argv = child(
                        &exe,
                        ChildArgs {
                            seed: rng.next_u64(),
                            bytes: life * pace,
                            pace,
                            ..Default::default()
                        },
                    );
                    let id = format!("c{i}-p{n}");
                    n += 1;
                    let (client, running, started, bytes, failures) = (
                        client.clone(),
                        running.clone(),
                        started.clone(),
                        bytes.clone(),
                        failures.clone(),
                    );
                    procs.spawn(async move {
                        let Ok(mut h) = client.start(StartOptions::new(&id, argv)).await else {
                            failures.fetch_add(1, Ordering::Relaxed);
                            return;
                        };
                        started.fetch_add(1, Ordering::Relaxed);
                        running.fetch_add(1, Ordering::Relaxed);
                        let mut exited = false;
                        while let Some(ev) = h.next_event().await {
                            match ev {
                                ProcessEvent::Output { data, .. } => {
                                    bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
                                }
                                ProcessEvent::Exited(_) => {
                                    exited = true;
                                    break;
                                }
                                // Nothing is asked to be omitted, nor may be lost.
                                ProcessEvent::Lost { .. } | ProcessEvent::Omitted { .. } => {
                                    failures.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                        }
                        if !exited {
                            failures.fetch_add(1, Ordering::Relaxed);
                        }
                        running.fetch_sub(1, Ordering::Relaxed);
                    });
                }
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = procs.join_next() => {}
                }
            }
            client.shutdown().await;
            procs.abort_all();
        });
    }
    // Ramp up: 95% of the processes running. Each lives 30 to 120 s and is then replaced,
    // so some are always between an exit notice and their replacement's start (on a loaded
    // 2-core host, 15% of 1,000 at a time): the figures report how many ran at every probe.
    let target = (args.clients * args.per_client) as u64;
    let ramp = Instant::now();
    while running.load(Ordering::Relaxed) < target - target / 20 {
        if ramp.elapsed() > Duration::from_secs(300) {
            bail!(
                "only {} of {target} processes running after 300 s",
                running.load(Ordering::Relaxed)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "load: {target} processes running after {:.1?}; measuring for {} s",
        ramp.elapsed(),
        args.duration_s
    );
    let cpu0 = (cpu_seconds(server.pid()), cpu_seconds(relay.pid()));
    let bytes0 = bytes.load(Ordering::Relaxed);
    let t0 = Instant::now();
    let mut loaded = Probes::default();
    let mut min_running = u64::MAX;
    let mut sum_running = 0u64;
    let mut peak_rss = (0u64, 0u64);
    let mut n = 1_000_000u64;
    while t0.elapsed() < Duration::from_secs(args.duration_s) {
        probe_once(&env, &probe, &cli_key, n, &mut loaded, n % 4 == 0).await?;
        n += 1;
        let now_running = running.load(Ordering::Relaxed);
        min_running = min_running.min(now_running);
        sum_running += now_running;
        peak_rss.0 = peak_rss
            .0
            .max(server.pid().and_then(deploy::rss_kib).unwrap_or(0));
        peak_rss.1 = peak_rss
            .1
            .max(relay.pid().and_then(deploy::rss_kib).unwrap_or(0));
        if n % 300 == 0 {
            println!(
                "load: +{:.0}s {} running, {} started, terminate {}, run {}",
                t0.elapsed().as_secs_f64(),
                running.load(Ordering::Relaxed),
                started.load(Ordering::Relaxed),
                loaded.terminate.line(),
                loaded.run.line()
            );
        }
        tokio::time::sleep(Duration::from_millis(args.probe_every_ms)).await;
    }
    let secs = t0.elapsed().as_secs_f64();
    let cpu1 = (cpu_seconds(server.pid()), cpu_seconds(relay.pid()));
    let moved = bytes.load(Ordering::Relaxed) - bytes0;
    stop.cancel();
    while loaders.join_next().await.is_some() {}
    probe.shutdown().await;
    println!(
        "load: {:.0} s under load: {} processes started in all, at least {min_running} running \
         at every probe ({:.0} on average over {} probes); {:.1} MB/s of output through the relay; exec server {:.2} CPU cores, \
         peak RSS {:.0} MiB; relay {:.2} CPU cores, peak RSS {:.0} MiB; {} failures",
        secs,
        started.load(Ordering::Relaxed),
        sum_running as f64 / (n - 1_000_000).max(1) as f64,
        n - 1_000_000,
        moved as f64 / secs / 1e6,
        (cpu1.0 - cpu0.0) / secs,
        peak_rss.0 as f64 / 1024.0,
        (cpu1.1 - cpu0.1) / secs,
        peak_rss.1 as f64 / 1024.0,
        failures.load(Ordering::Relaxed),
    );
    println!("load: | figure | idle | under load |");
    println!("load: |---|---|---|");
    for (name, a, b) in [
        (
            "`process/terminate` round trip",
            &idle.terminate,
            &loaded.terminate,
        ),
        ("small run (start → exit notice)", &idle.run, &loaded.run),
        ("`execrelay run … -- true`", &idle.cli, &loaded.cli),
    ] {
        println!(
            "load: | {name} | p50 {:.2} ms, p99 {:.2} ms | p50 {:.2} ms, p99 {:.2} ms (n = {}) |",
            a.pct(0.5),
            a.pct(0.99),
            b.pct(0.5),
            b.pct(0.99),
            b.0.len()
        );
    }
    server.stop().await;
    relay.stop(false).await;
    Ok(if failures.load(Ordering::Relaxed) == 0 {
        0
    } else {
        1
    })
}

/// User + system CPU seconds of `pid` so far.
fn cpu_seconds(pid: Option<u32>) -> f64 {
    let Some(pid) = pid else { return 0.0 };
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 of stat (utime, stime) are the 12th and 13th after the command.
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (ticks(11) + ticks(12)) / hz
}
