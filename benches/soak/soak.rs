//! The soak (`soak run`, driven by `benches/soak.sh`): a relay, two exec servers registered
//! with it (each also on a direct listener), every link through a fault proxy, clients that
//! keep `clients × per_client` processes running for `duration`, the relay restarted now and
//! then, and the stall detector watching. Then the end checks, one summary line each, and a
//! non-zero exit on any loss, stall or leak.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path as FsPath, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use execrelay::noise::keys::Keypair;
use execrelay_protocol::config::KeepaliveConfig;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::deploy::{self, Bins, LinkTimes, RelayProc, ServerProc};
use crate::proxy::{FaultLog, FaultPlan, Proxy, KINDS};
use crate::rng::{derive, Rng};
use crate::stall::{Detector, RelayState, ServerView};
use crate::verify::Kind;
use crate::workload::{client_slot, Path, Shared, Stats, WorkloadConfig};

/// `soak run`'s flags; `benches/soak.sh` sets them from its environment.
#[derive(Debug, Clone, clap::Args)]
pub struct SoakArgs {
    /// How long clients keep starting processes (then everything drains and is checked).
    #[arg(long, default_value_t = 60)]
    pub duration_s: u64,
    /// The seed of every decision of the run.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Client slots (each one client at a time, with a key and a fault proxy of its own).
    #[arg(long, default_value_t = 20)]
    pub clients: usize,
    /// Processes each client keeps running.
    #[arg(long, default_value_t = 10)]
    pub per_client: usize,
    /// Largest output of one process (bytes; sizes are log-uniform from 1 KiB).
    #[arg(long, default_value_t = 50_000_000)]
    pub max_output: u64,
    /// Largest stdin of one process (bytes).
    #[arg(long, default_value_t = 4 << 20)]
    pub max_stdin: u64,
    /// Output and stdin standing still this long on a quiet path, while the client reads, is
    /// a stall.
    #[arg(long, default_value_t = 20)]
    pub stall_bound_s: u64,
    /// The servers' `detached_session_ttl_ms`.
    #[arg(long, default_value_t = 20_000)]
    pub ttl_ms: u64,
    /// Keepalive interval of every link (ms).
    #[arg(long, default_value_t = 2_000)]
    pub keepalive_ms: u64,
    /// Pong timeout of every link (ms): short stalls stay below it, long ones pass it.
    #[arg(long, default_value_t = 5_000)]
    pub pong_ms: u64,
    /// Mean quiet spell between faults on one client link (s).
    #[arg(long, default_value_t = 30.0)]
    pub fault_gap_s: f64,
    /// Mean quiet spell between faults on an environment link (s).
    #[arg(long, default_value_t = 60.0)]
    pub env_fault_gap_s: f64,
    /// Mean time between relay restarts (s; 0: never).
    #[arg(long, default_value_t = 60.0)]
    pub relay_restart_s: f64,
    /// Mean time between connection breaks a client makes itself (s; 0: never).
    #[arg(long, default_value_t = 90.0)]
    pub break_gap_s: f64,
    /// Mean lifetime of one client (s).
    #[arg(long, default_value_t = 90.0)]
    pub client_life_s: f64,
    /// Chance that a client leaves its session to expire rather than closing it.
    #[arg(long, default_value_t = 0.3)]
    pub abandon: f64,
    /// The servers' stall watchdog (ms).
    #[arg(long, default_value_t = 5_000)]
    pub watchdog_ms: u64,
    /// Where `execrelay` and `execrelay-relay` are.
    #[arg(long)]
    pub bin_dir: PathBuf,
    /// Where logs go (a fresh directory under target/soak by default).
    #[arg(long)]
    pub out_dir: Option<PathBuf>,
    /// `NAME=VALUE` for the exec servers' environment (`EXECRELAY_DEBUG_FAULTS=…`).
    #[arg(long)]
    pub server_env: Vec<String>,
    /// Extra flag for the second exec server (repeatable), e.g. a retention that lands on
    /// page boundaries.
    #[arg(long, allow_hyphen_values = true)]
    pub server_b_flag: Vec<String>,
    /// How long the end may take for every process to finish once faults stop (s).
    #[arg(long, default_value_t = 300)]
    pub drain_s: u64,
    /// An exec server's RSS after the run may exceed its RSS before by this much (MiB): what
    /// its allocator cannot hand back (README, "Soak").
    #[arg(long, default_value_t = 48)]
    pub server_rss_bound_mib: u64,
    /// The relay's RSS after the run may exceed its RSS before by this much (MiB): what its
    /// allocator keeps (the relay does not hand memory back).
    #[arg(long, default_value_t = 24)]
    pub relay_rss_bound_mib: u64,
    /// Write the figures as JSON here too.
    #[arg(long)]
    pub summary_json: Option<PathBuf>,
    /// Keep the deployment up this long after the checks (s), to look at it.
    #[arg(long, default_value_t = 0)]
    pub hold_s: u64,
}

/// One measured process (an exec server or the relay): before and after.
#[derive(Debug, Clone, Default, serde::Serialize)]
struct Usage {
    rss_kib: u64,
    fds: usize,
}

fn usage(pid: Option<u32>) -> Usage {
    let Some(pid) = pid else {
        return Usage::default();
    };
    Usage {
        rss_kib: deploy::rss_kib(pid).unwrap_or(0),
        fds: deploy::fd_count(pid).unwrap_or(0),
    }
}

/// The summary: one line per check.
struct Report {
    lines: Vec<String>,
    failed: bool,
}

impl Report {
    fn check(&mut self, name: &str, ok: bool, detail: String) {
        let line = format!(
            "soak: check {name:<28} {} {detail}",
            if ok { "PASS" } else { "FAIL" }
        );
        println!("{line}");
        self.lines.push(line);
        self.failed |= !ok;
    }
}

/// Run a soak; the process exit code.
pub async fn run(args: SoakArgs) -> Result<i32> {
    let start = Instant::now();
    let out = match &args.out_dir {
        Some(d) => d.clone(),
        None => PathBuf::from(format!(
            "target/soak/seed{}-{}",
            args.seed,
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_secs()
        )),
    };
    std::fs::create_dir_all(&out)?;
    let out = out.canonicalize()?;
    println!(
        "soak: seed {} for {} s, {} clients × {} processes; logs in {}",
        args.seed,
        args.duration_s,
        args.clients,
        args.per_client,
        out.display()
    );
    init_client_log(&out.join("clients.log"))?;
    let log = FaultLog::create(&out.join("faults.log"), start)?;
    log.line(&format!("soak seed={} args={args:?}", args.seed));
    let bins = Bins::in_dir(&args.bin_dir)?;
    let keydir = out.join("keys");
    std::fs::create_dir_all(&keydir)?;
    let times = LinkTimes {
        keepalive_ms: args.keepalive_ms,
        pong_timeout_ms: args.pong_ms,
    };
    let pong = Duration::from_millis(args.pong_ms);

    // Keys: the relay, two exec servers, one per client slot.
    let relay_keys = Keypair::generate()?;
    let relay_key = deploy::write_key(&keydir, "relay", &relay_keys)?;
    let server_keys = [Keypair::generate()?, Keypair::generate()?];
    let env_ids = ["soak-a".to_string(), "soak-b".to_string()];
    let mut server_key_paths = Vec::new();
    for (i, k) in server_keys.iter().enumerate() {
        server_key_paths.push(deploy::write_key(&keydir, &env_ids[i], k)?);
    }
    let clients: Vec<Keypair> = (0..args.clients)
        .map(|_| Keypair::generate())
        .collect::<Result<_, _>>()?;
    let authorized = deploy::authorized_keys(&keydir, &clients)?;
    let envs_file = deploy::environments(
        &keydir,
        &[
            (env_ids[0].clone(), server_keys[0].public),
            (env_ids[1].clone(), server_keys[1].public),
        ],
    )?;

    // The relay, the environment links' proxies, the exec servers.
    let relay = RelayProc::start(&bins, &out, &relay_key, &envs_file, &times).await?;
    let relay_addr = relay.addr();
    let relay_metrics = Arc::new(Mutex::new(relay.metrics_addr()));
    let relay = Arc::new(tokio::sync::Mutex::new(relay));
    let env_plan = FaultPlan::new(Duration::from_secs_f64(args.env_fault_gap_s), pong);
    let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
    let mut env_proxies = Vec::new();
    for id in &env_ids {
        env_proxies.push(
            Proxy::start(
                &format!("env-{id}"),
                loopback,
                relay_addr,
                args.seed,
                env_plan.clone(),
                log.clone(),
            )
            .await?,
        );
    }
    let server_env: Vec<(String, String)> = args
        .server_env
        .iter()
        .filter_map(|kv| kv.split_once('=').map(|(k, v)| (k.into(), v.into())))
        .collect();
    let mut servers = Vec::new();
    for i in 0..2 {
        let mut extra = vec![
            format!("--detached-session-ttl-ms={}", args.ttl_ms),
            format!("--stall-watchdog-ms={}", args.watchdog_ms),
            "--relay-backoff-initial-ms=100".to_string(),
            "--relay-backoff-max-ms=1000".to_string(),
            "--max-sessions=512".to_string(),
            "--max-sessions-per-key=64".to_string(),
            // Every client connects from 127.0.0.1 (abandoned sessions wait out their TTL).
            "--max-sessions-per-address=512".to_string(),
        ];
        if i == 1 {
            extra.extend(args.server_b_flag.iter().cloned());
        }
        let relay_pub = execrelay::noise::keys::pub_path(&relay_key);
        servers.push(
            ServerProc::start(
                &bins,
                &out,
                &env_ids[i],
                &server_keys[i],
                &server_key_paths[i],
                &relay_pub,
                &authorized,
                env_proxies[i].addr,
                &times,
                &extra,
                &server_env,
            )
            .await
            .with_context(|| format!("exec server {}", env_ids[i]))?,
        );
    }
    // Settle, then the baseline: environment links up, nothing else.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let server_before: Vec<Usage> = servers.iter().map(|s| usage(s.pid())).collect();
    let relay_before = usage(relay.lock().await.pid());
    println!(
        "soak: deployment up in {:.1?}: relay pid {:?}, servers {:?}",
        start.elapsed(),
        relay.lock().await.pid(),
        servers.iter().map(|s| s.pid()).collect::<Vec<_>>()
    );

    // Client slots: 60 % through the relay, the rest direct; alternating servers.
    let tag = (
        "SOAK_RUN".to_string(),
        format!("{}-{}", args.seed, std::process::id()),
    );
    let cfg = WorkloadConfig {
        seed: args.seed,
        per_client: args.per_client,
        max_output: args.max_output,
        max_stdin: args.max_stdin,
        keepalive: KeepaliveConfig {
            interval: Duration::from_millis(args.keepalive_ms),
            jitter: Duration::from_millis(args.keepalive_ms / 10),
            pong_timeout: pong,
            write_timeout: pong,
        },
        tag: tag.clone(),
        exe: std::env::current_exe()?.display().to_string(),
        client_life: Duration::from_secs_f64(args.client_life_s),
        abandon: args.abandon,
        break_gap: Duration::from_secs_f64(args.break_gap_s),
    };
    let sh = Arc::new(Shared {
        cfg,
        stats: Stats::default(),
        live: Mutex::new(BTreeMap::new()),
        failures: Mutex::new(Vec::new()),
        log: log.clone(),
        stop: CancellationToken::new(),
        calm: CancellationToken::new(),
        clients: Mutex::new(Vec::new()),
    });
    let client_plan = FaultPlan::new(Duration::from_secs_f64(args.fault_gap_s), pong);
    let mut paths = Vec::new();
    for slot in 0..args.clients {
        let server = slot % 2;
        let via_relay = slot % 5 < 3;
        let (name, upstream, url) = if via_relay {
            ("relay", relay_addr, None)
        } else {
            ("direct", servers[server].noise_addr(), Some(()))
        };
        let proxy = Proxy::start(
            &format!("client-{slot:02}-{name}-{}", env_ids[server]),
            loopback,
            upstream,
            args.seed,
            client_plan.clone(),
            log.clone(),
        )
        .await?;
        let url = match url {
            None => format!("relay+ws://{}/{}", proxy.addr, env_ids[server]),
            Some(()) => format!("noise+ws://{}", proxy.addr),
        };
        paths.push(Path {
            server,
            via_relay,
            proxy,
            url,
            server_public: servers[server].public,
        });
    }

    let relay_state = Arc::new(RelayState::default());
    let detector = Arc::new(Detector {
        sh: sh.clone(),
        bound: Duration::from_secs(args.stall_bound_s),
        env_proxies: env_proxies.clone(),
        relay: relay_state.clone(),
        relay_metrics: relay_metrics.clone(),
        servers: servers
            .iter()
            .map(|s| ServerView {
                pid: s.pid().unwrap_or(0),
                log: s.log.clone(),
            })
            .collect(),
        client_stalls: Default::default(),
        server_stalls: Default::default(),
    });
    let detector_stop = CancellationToken::new();
    let detector_task = tokio::spawn(detector.clone().run(detector_stop.clone()));

    // The relay's restarts, and its counters across incarnations.
    let replaced = Arc::new(Mutex::new((0.0f64, 0.0f64))); // (earlier incarnations, current)
    let restarter = tokio::spawn(restart_relay(
        relay.clone(),
        relay_state.clone(),
        replaced.clone(),
        sh.clone(),
        args.seed,
        args.relay_restart_s,
    ));

    let mut slots = JoinSet::new();
    for (slot, path) in paths.iter().enumerate() {
        slots.spawn(client_slot(
            sh.clone(),
            slot,
            clients[slot].clone(),
            path.clone(),
        ));
    }
    let progress = tokio::spawn(print_progress(sh.clone(), start));

    // The run, then calm: no new process, no fault; everything finishes and is checked.
    tokio::time::sleep(Duration::from_secs(args.duration_s)).await;
    log.line("duration reached: no new processes, no more faults");
    println!("soak: {} s reached: draining", args.duration_s);
    sh.stop.cancel();
    sh.calm.cancel();
    for p in paths.iter().map(|p| &p.proxy).chain(&env_proxies) {
        p.stop_faults();
    }
    let _ = restarter.await;
    let drain_deadline = tokio::time::Instant::now() + Duration::from_secs(args.drain_s);
    loop {
        tokio::select! {
            r = slots.join_next() => if r.is_none() { break },
            _ = tokio::time::sleep_until(drain_deadline) => {
                let live: Vec<String> = sh.live.lock().unwrap_or_else(|e| e.into_inner()).values()
                    .map(|t| format!("{} ({}, {} B, via {}): {}", t.id, t.kind.name(),
                        t.out_bytes.load(Ordering::Relaxed), t.path.proxy.name,
                        t.client.delivery_state(&t.id).map(|s| s.to_string()).unwrap_or_default()))
                    .collect();
                sh.fail(format!("{} processes still running {} s after the end:\n    {}",
                    live.len(), args.drain_s, live.join("\n    ")));
                slots.abort_all();
                // Their sessions detach, and expire.
                for c in sh.clients.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
                    c.close();
                }
            }
        }
    }
    detector_stop.cancel();
    let _ = detector_task.await;
    progress.abort();
    let run_time = start.elapsed();
    println!("soak: every client ended after {run_time:.1?}; checking the hosts");

    // Sessions gone after their TTL (abandoned ones expire, closed ones are gone at once).
    let ttl = Duration::from_millis(args.ttl_ms);
    let sessions_deadline = Instant::now() + ttl + Duration::from_secs(30);
    let sessions_left = loop {
        let mut left = 0u64;
        for s in &servers {
            if let Ok(st) = deploy::status(s.metrics_addr()).await {
                left += st["sessions"]["attached"].as_u64().unwrap_or(0)
                    + st["sessions"]["detached"].as_u64().unwrap_or(0);
            }
        }
        if left == 0 || Instant::now() > sessions_deadline {
            break left;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    // No child or grandchild left: by the run's tag (wherever they were re-parented), and
    // under the exec servers.
    let children_deadline = Instant::now() + Duration::from_secs(30);
    let (tagged, under) = loop {
        let tagged = deploy::tagged_processes(&format!("{}={}", tag.0, tag.1));
        let under: Vec<u32> = servers
            .iter()
            .filter_map(|s| s.pid())
            .flat_map(deploy::descendants)
            .collect();
        if (tagged.is_empty() && under.is_empty()) || Instant::now() > children_deadline {
            break (tagged, under);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    // Descriptors back to where they were, RSS within its bound (an idle server hands its
    // memory back two looks after its last session: `bounds::give_back`).
    let fd_deadline = Instant::now() + Duration::from_secs(30);
    let (server_bound, relay_bound) = (
        args.server_rss_bound_mib * 1024,
        args.relay_rss_bound_mib * 1024,
    );
    let (server_after, relay_after) = loop {
        let s: Vec<Usage> = servers.iter().map(|s| usage(s.pid())).collect();
        let r = usage(relay.lock().await.pid());
        let settled = s
            .iter()
            .zip(&server_before)
            .all(|(a, b)| a.fds <= b.fds && a.rss_kib <= b.rss_kib + server_bound)
            && r.fds <= relay_before.fds
            && r.rss_kib <= relay_before.rss_kib + relay_bound;
        if settled || Instant::now() > fd_deadline {
            break (s, r);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let mut crashed = Vec::new();
    for s in servers.iter_mut() {
        if let Some(st) = s.exited() {
            crashed.push(format!("{} exited: {st}", s.env_id));
        }
    }
    let server_metrics = {
        let mut v = Vec::new();
        for s in &servers {
            v.push(deploy::metrics(s.metrics_addr()).await.unwrap_or_default());
        }
        v
    };
    let relay_starts = relay.lock().await.starts;
    if let Ok(m) = deploy::metrics(relay.lock().await.metrics_addr()).await {
        let mut r = replaced.lock().unwrap_or_else(|e| e.into_inner());
        r.1 = m
            .get("execrelay_relay_link_closes_total{reason=\"replaced\"}")
            .copied()
            .unwrap_or(0.0);
    }
    let replacements = {
        let r = replaced.lock().unwrap_or_else(|e| e.into_inner());
        (r.0 + r.1) as u64
    };
    // Each loss is followed by a new registration (the relay keeps a live holder's id, so a
    // new link waits out the old one's keepalive rather than replacing it).
    let env_links_lost: u64 = servers
        .iter()
        .map(|s| {
            std::fs::read_to_string(&s.log)
                .map(|t| t.matches("environment link lost").count() as u64)
                .unwrap_or(0)
        })
        .sum();

    // The report.
    let st = &sh.stats;
    let faults = log.counts();
    let mut rep = Report {
        lines: Vec::new(),
        failed: false,
    };
    println!(
        "soak: seed {} ran {:.0} s (+{:.0} s to drain and check): {} processes ({} checked, {} \
         abandoned with their clients), {:.2} GB of output and {:.2} GB of stdin moved, {} \
         clients ({} left their sessions to expire), relay started {} times, {} environment \
         links lost and registered again ({} replaced at the relay)",
        args.seed,
        args.duration_s,
        (run_time.as_secs_f64() - args.duration_s as f64).max(0.0),
        st.started.load(Ordering::Relaxed),
        st.checked.load(Ordering::Relaxed),
        st.abandoned.load(Ordering::Relaxed),
        st.out_bytes.load(Ordering::Relaxed) as f64 / 1e9,
        st.in_bytes.load(Ordering::Relaxed) as f64 / 1e9,
        st.clients.load(Ordering::Relaxed),
        st.clients_abandoned.load(Ordering::Relaxed),
        relay_starts,
        env_links_lost,
        replacements,
    );
    let by_kind = st.by_kind.lock().unwrap_or_else(|e| e.into_inner()).clone();
    println!(
        "soak: processes by kind: {}",
        Kind::ALL
            .iter()
            .map(|k| format!("{} {}", k.name(), by_kind.get(k.name()).unwrap_or(&0)))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let fault_line: Vec<String> = KINDS
        .iter()
        .chain(["relay-restart", "break-connection"].iter())
        .map(|k| format!("{k} {}", faults.get(*k).unwrap_or(&0)))
        .collect();
    println!(
        "soak: faults injected: {} (connections refused while the relay was down: {})",
        fault_line.join(", "),
        faults.get("upstream-refused").unwrap_or(&0)
    );
    println!(
        "soak: the proxies carried {:.2} GB over {} connections",
        paths
            .iter()
            .map(|p| &p.proxy)
            .chain(&env_proxies)
            .map(|p| p.bytes())
            .sum::<u64>() as f64
            / 1e9,
        paths
            .iter()
            .map(|p| &p.proxy)
            .chain(&env_proxies)
            .map(|p| p.connections())
            .sum::<u64>()
    );
    rep.check(
        "exec servers alive",
        crashed.is_empty(),
        if crashed.is_empty() {
            "both ran to the end".into()
        } else {
            crashed.join("; ")
        },
    );
    let (lost, dup, corrupt) = (
        st.lost.load(Ordering::Relaxed),
        st.duplicated.load(Ordering::Relaxed),
        st.corrupt.load(Ordering::Relaxed),
    );
    rep.check(
        "output complete, in order",
        lost == 0 && dup == 0 && corrupt == 0,
        format!(
            "{} processes checked byte for byte: {lost} bytes lost, {dup} duplicated, {corrupt} \
             streams out of order",
            st.checked.load(Ordering::Relaxed)
        ),
    );
    let notice_errors = st.exit_notice_errors.load(Ordering::Relaxed);
    rep.check(
        "exit notice once and last",
        notice_errors == 0 && st.sessions_lost.load(Ordering::Relaxed) == 0,
        format!(
            "{notice_errors} processes with a missing, repeated or early notice; {} event \
             streams ended without one",
            st.sessions_lost.load(Ordering::Relaxed)
        ),
    );
    let reasons = st.reasons_checked.load(Ordering::Relaxed);
    rep.check(
        "status and reason",
        st.bad_status.load(Ordering::Relaxed) == 0,
        format!(
            "{} wrong; `reason` {}",
            st.bad_status.load(Ordering::Relaxed),
            if reasons > 0 {
                format!("present and checked in {reasons} notices")
            } else {
                "not sent by this server (not checked)".into()
            }
        ),
    );
    let server_watchdog: f64 = server_metrics
        .iter()
        .map(|m| m.get("execrelay_stalls_total").copied().unwrap_or(0.0))
        .sum();
    let (cs, ss) = (
        detector.client_stalls.load(Ordering::Relaxed),
        detector.server_stalls.load(Ordering::Relaxed),
    );
    let rescued = count_lines(&out.join("clients.log"), "events fetched with process/read");
    rep.check(
        "stalls",
        cs == 0 && ss == 0 && server_watchdog == 0.0 && rescued == 0,
        format!(
            "{cs} seen by the clients (bound {} s on a quiet path), {ss} reported by the \
             servers' watchdogs (execrelay_stalls_total {server_watchdog}), {rescued} rescued \
             by the client's silence probe",
            args.stall_bound_s
        ),
    );
    rep.check(
        "no child or grandchild left",
        tagged.is_empty() && under.is_empty(),
        format!(
            "{} processes with the run's tag, {} under the exec servers{}",
            tagged.len(),
            under.len(),
            if tagged.is_empty() {
                String::new()
            } else {
                format!(
                    ": {}",
                    tagged
                        .iter()
                        .take(5)
                        .map(|(p, c)| format!("{p} {c}"))
                        .collect::<Vec<_>>()
                        .join("; ")
                )
            }
        ),
    );
    rep.check(
        "no session after its TTL",
        sessions_left == 0,
        format!(
            "{sessions_left} sessions left {} s after the last client (TTL {} s)",
            (ttl + Duration::from_secs(30)).as_secs(),
            ttl.as_secs()
        ),
    );
    let mib = |k: u64| k as f64 / 1024.0;
    let mut rss_ok = true;
    let mut rss_detail = Vec::new();
    for (i, (b, a)) in server_before.iter().zip(&server_after).enumerate() {
        let ok = a.rss_kib <= b.rss_kib + server_bound;
        rss_ok &= ok;
        rss_detail.push(format!(
            "server {} {:.1} → {:.1} MiB",
            env_ids[i],
            mib(b.rss_kib),
            mib(a.rss_kib)
        ));
    }
    let relay_ok = relay_after.rss_kib <= relay_before.rss_kib + relay_bound;
    rss_ok &= relay_ok;
    rss_detail.push(format!(
        "relay {:.1} → {:.1} MiB",
        mib(relay_before.rss_kib),
        mib(relay_after.rss_kib)
    ));
    rep.check(
        "RSS back within its bound",
        rss_ok,
        format!(
            "{} (bounds: +{} MiB per server, +{} MiB relay)",
            rss_detail.join(", "),
            args.server_rss_bound_mib,
            args.relay_rss_bound_mib
        ),
    );
    let mut fd_ok = true;
    let mut fd_detail = Vec::new();
    for (i, (b, a)) in server_before.iter().zip(&server_after).enumerate() {
        fd_ok &= a.fds <= b.fds;
        fd_detail.push(format!("server {} {} → {}", env_ids[i], b.fds, a.fds));
        if a.fds > b.fds {
            if let Some(pid) = servers[i].pid() {
                fd_detail.push(format!("({:?})", deploy::fd_kinds(pid)));
            }
        }
    }
    fd_ok &= relay_after.fds <= relay_before.fds;
    fd_detail.push(format!("relay {} → {}", relay_before.fds, relay_after.fds));
    rep.check(
        "no descriptor leaked",
        fd_ok,
        format!("open descriptors {}", fd_detail.join(", ")),
    );
    let failures = sh
        .failures
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    rep.check(
        "no other failure",
        failures.is_empty(),
        format!(
            "{} failures recorded (start errors {}); see {}",
            failures.len(),
            st.start_errors.load(Ordering::Relaxed),
            out.join("faults.log").display()
        ),
    );
    if !failures.is_empty() {
        println!("soak: failures:");
        for f in failures.iter().take(40) {
            println!("  {f}");
        }
        if failures.len() > 40 {
            println!("  … {} more in faults.log", failures.len() - 40);
        }
    }
    if let Some(path) = &args.summary_json {
        let j = serde_json::json!({
            "seed": args.seed,
            "duration_s": args.duration_s,
            "run_s": run_time.as_secs_f64(),
            "processes": st.started.load(Ordering::Relaxed),
            "checked": st.checked.load(Ordering::Relaxed),
            "abandoned": st.abandoned.load(Ordering::Relaxed),
            "by_kind": by_kind,
            "output_bytes": st.out_bytes.load(Ordering::Relaxed),
            "stdin_bytes": st.in_bytes.load(Ordering::Relaxed),
            "faults": faults,
            "relay_starts": relay_starts,
            "env_links_replaced": replacements,
            "env_links_lost": env_links_lost,
            "lost": lost, "duplicated": dup, "corrupt": corrupt,
            "stalls_client": cs, "stalls_server": ss, "silence_rescues": rescued,
            "children_left": tagged.len() + under.len(),
            "sessions_left": sessions_left,
            "reasons_checked": reasons,
            "server_before": server_before, "server_after": server_after,
            "relay_before": relay_before, "relay_after": relay_after,
            "failures": failures.len(),
            "passed": !rep.failed,
        });
        std::fs::write(path, serde_json::to_string_pretty(&j)?)?;
    }
    log.line(&format!(
        "result: {}",
        if rep.failed { "FAIL" } else { "PASS" }
    ));
    log.flush();
    if args.hold_s > 0 {
        println!(
            "soak: holding the deployment for {} s: servers {:?}, relay {:?}",
            args.hold_s,
            servers.iter().map(|s| s.pid()).collect::<Vec<_>>(),
            relay.lock().await.pid()
        );
        tokio::time::sleep(Duration::from_secs(args.hold_s)).await;
    }

    for s in servers.iter_mut() {
        s.stop().await;
    }
    relay.lock().await.stop(false).await;
    for p in paths.iter().map(|p| &p.proxy).chain(&env_proxies) {
        p.shutdown();
    }
    println!(
        "soak: {} (seed {}; replay: SEED={} DURATION={} bash benches/soak.sh)",
        if rep.failed { "FAILED" } else { "passed" },
        args.seed,
        args.seed,
        args.duration_s
    );
    Ok(if rep.failed { 1 } else { 0 })
}

/// Restart the relay every `mean_s` on average until calm: SIGKILL or SIGTERM, down for up
/// to 3 s, back on the same ports.
async fn restart_relay(
    relay: Arc<tokio::sync::Mutex<RelayProc>>,
    state: Arc<RelayState>,
    replaced: Arc<Mutex<(f64, f64)>>,
    sh: Arc<Shared>,
    seed: u64,
    mean_s: f64,
) {
    let mut rng = Rng::new(derive(seed, "relay", 0));
    let mut poll = tokio::time::interval(Duration::from_secs(2));
    if mean_s <= 0.0 {
        return;
    }
    loop {
        let gap = Duration::from_secs_f64(rng.exp(mean_s));
        let kill = rng.chance(0.4);
        let down = Duration::from_millis(rng.range(0, 3000));
        let due = tokio::time::Instant::now() + gap;
        loop {
            tokio::select! {
                _ = sh.calm.cancelled() => return,
                _ = tokio::time::sleep_until(due) => break,
                _ = poll.tick() => {
                    let addr = relay.lock().await.metrics_addr();
                    if let Ok(m) = deploy::metrics(addr).await {
                        replaced.lock().unwrap_or_else(|e| e.into_inner()).1 = m
                            .get("execrelay_relay_link_closes_total{reason=\"replaced\"}")
                            .copied()
                            .unwrap_or(0.0);
                    }
                }
            }
        }
        let mut r = relay.lock().await;
        sh.log.fault(
            "relay-restart",
            "relay",
            &format!(
                "{} down_ms={}",
                if kill { "SIGKILL" } else { "SIGTERM" },
                down.as_millis()
            ),
        );
        state.down.store(true, Ordering::SeqCst);
        {
            let mut rep = replaced.lock().unwrap_or_else(|e| e.into_inner());
            rep.0 += rep.1;
            rep.1 = 0.0;
        }
        r.stop(kill).await;
        tokio::time::sleep(down).await;
        if let Err(e) = r.restart().await {
            sh.fail(format!("the relay did not restart: {e}"));
        }
        *state.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        state.down.store(false, Ordering::SeqCst);
        sh.log.line("relay back");
    }
}

/// A line every 10 s while it runs.
async fn print_progress(sh: Arc<Shared>, start: Instant) {
    loop {
        tokio::time::sleep(Duration::from_secs(10)).await;
        let st = &sh.stats;
        println!(
            "soak: +{:>4.0}s {} running, {} done, {:.2} GB out, {:.2} GB in, {} failures",
            start.elapsed().as_secs_f64(),
            sh.live.lock().unwrap_or_else(|e| e.into_inner()).len(),
            st.checked.load(Ordering::Relaxed),
            st.out_bytes.load(Ordering::Relaxed) as f64 / 1e9,
            st.in_bytes.load(Ordering::Relaxed) as f64 / 1e9,
            sh.failures.lock().unwrap_or_else(|e| e.into_inner()).len(),
        );
    }
}

/// The client library's warnings go to a file of their own (the silence probe's rescues are
/// counted from it).
fn init_client_log(path: &FsPath) -> Result<()> {
    let file = std::fs::File::create(path)?;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .with_writer(Mutex::new(file))
        .try_init();
    Ok(())
}

fn count_lines(path: &FsPath, needle: &str) -> usize {
    std::fs::read_to_string(path)
        .map(|t| t.lines().filter(|l| l.contains(needle)).count())
        .unwrap_or(0)
}
