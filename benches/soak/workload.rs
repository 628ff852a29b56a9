//! The soak's clients and their processes, through the public client library
//! (`execrelay::client`) as an application uses it: a client slot runs one client after
//! another (each its own key, its own link pool, its own fault proxy), each keeping its share
//! of the processes running, until the soak's end.
//!
//! Every decision (which kind of process, how much output and stdin, when to terminate, when
//! to stop reading, how a client ends) is drawn from the slot's generator, seeded from `SEED`,
//! so a run replays. Every process is tracked for the stall detector ([`Tracked`]) and checked
//! at its exit notice (`verify.rs`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use execrelay::client::{Client, ClientOptions, ProcessEvent, StartOptions, Target};
use execrelay::link::client::{LinkPool, NoiseClientConfig};
use execrelay::noise::keys::Keypair;
use execrelay::rpc::messages::TermSize;
use execrelay_protocol::config::KeepaliveConfig;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::child::ChildArgs;
use crate::proxy::{FaultLog, Proxy};
use crate::rng::{derive, stream_bytes, Rng};
use crate::verify::{check, Delivery, Expect, Kind};

/// Where a client's links go.
#[derive(Clone)]
pub struct Path {
    /// Its server (index).
    pub server: usize,
    /// Through the relay (else to the server's direct listener).
    pub via_relay: bool,
    /// The fault proxy its links go through.
    pub proxy: Proxy,
    /// The URL to dial (the proxy's address).
    pub url: String,
    /// The server's public key.
    pub server_public: [u8; 32],
}

/// Settings of the workload.
#[derive(Debug, Clone)]
pub struct WorkloadConfig {
    pub seed: u64,
    pub per_client: usize,
    pub max_output: u64,
    pub max_stdin: u64,
    pub keepalive: KeepaliveConfig,
    /// The soak's tag, set in every process's environment (`SOAK_RUN=…`).
    pub tag: (String, String),
    /// This very binary (the children are `soak child …`).
    pub exe: String,
    /// Mean lifetime of one client.
    pub client_life: Duration,
    /// Chance that a client ends by leaving its session (to expire) rather than closing it.
    pub abandon: f64,
    /// Mean time between two connection breaks by a client itself (0: never).
    pub break_gap: Duration,
}

/// One process as the stall detector sees it.
pub struct Tracked {
    pub id: String,
    pub kind: Kind,
    pub path: Path,
    pub client: Client,
    pub started: Instant,
    /// Last time its output (or stdin) moved, or it resumed reading.
    pub progress: Mutex<Instant>,
    pub out_bytes: AtomicU64,
    pub in_bytes: AtomicU64,
    /// Its client is not reading on purpose.
    pub paused: AtomicBool,
    /// Its exit notice arrived (or its stream ended).
    pub done: AtomicBool,
    /// Reported as stalled (once).
    pub stalled: AtomicBool,
}

impl Tracked {
    fn moved(&self) {
        *self.progress.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    /// Last progress.
    pub fn last_progress(&self) -> Instant {
        *self.progress.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Counters of the whole run.
#[derive(Default)]
pub struct Stats {
    pub started: AtomicU64,
    pub checked: AtomicU64,
    pub abandoned: AtomicU64,
    pub out_bytes: AtomicU64,
    pub in_bytes: AtomicU64,
    pub lost: AtomicU64,
    pub duplicated: AtomicU64,
    pub corrupt: AtomicU64,
    pub bad_status: AtomicU64,
    pub exit_notice_errors: AtomicU64,
    pub reasons_checked: AtomicU64,
    pub sessions_lost: AtomicU64,
    pub start_errors: AtomicU64,
    pub clients: AtomicU64,
    pub clients_abandoned: AtomicU64,
    pub breaks: AtomicU64,
    pub by_kind: Mutex<BTreeMap<&'static str, u64>>,
}

/// What the workload shares with the stall detector and the end checks.
pub struct Shared {
    pub cfg: WorkloadConfig,
    pub stats: Stats,
    pub live: Mutex<BTreeMap<String, Arc<Tracked>>>,
    pub failures: Mutex<Vec<String>>,
    pub log: Arc<FaultLog>,
    /// No new process or client from now on.
    pub stop: CancellationToken,
    /// Faults (connection breaks) stop.
    pub calm: CancellationToken,
    /// Every client connected so far (closed at the end if the drain runs out).
    pub clients: Mutex<Vec<Client>>,
}

impl Shared {
    /// Record a failure (printed at the end, and at once on stderr).
    pub fn fail(&self, what: String) {
        eprintln!("soak: FAIL {what}");
        self.log.line(&format!("FAIL {what}"));
        self.failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(what);
    }

    fn track(&self, t: Arc<Tracked>) {
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(t.id.clone(), t);
    }

    fn untrack(&self, id: &str) {
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
    }
}

/// One planned process.
struct Plan {
    expect: Expect,
    child: ChildArgs,
    timeout_ms: Option<u64>,
    terminate_after: Option<Duration>,
    /// (after, for): stop reading `after` the start, for `for`.
    pause: Option<(Duration, Duration)>,
}

fn plan(rng: &mut Rng, cfg: &WorkloadConfig) -> Plan {
    let kind = Kind::ALL[rng.weighted(&[40, 8, 12, 15, 10, 15])];
    let seed = rng.next_u64();
    let mut bytes = rng.log_uniform(1024, cfg.max_output);
    let stdin_len = rng.log_uniform(1, cfg.max_stdin.max(1));
    let with_stdin = rng.chance(0.6);
    let exit = [0, 0, 0, 0, 1, 2, 3, 42][rng.below(8) as usize];
    let counts_term = rng.chance(0.5);
    let grandchild = ["group", "setsid"][rng.below(2) as usize];
    let timeout_ms = rng.range(1000, 8000);
    let terminate_ms = rng.range(200, 5000);
    let pause = (
        Duration::from_millis(rng.range(200, 8000)),
        Duration::from_millis(rng.range(2000, 20000)),
    );
    let pty = kind == Kind::Pty;
    let mut child = ChildArgs {
        seed,
        bytes,
        exit,
        pty,
        ..Default::default()
    };
    let mut stdin = None;
    if with_stdin && !matches!(kind, Kind::Timeout) {
        // A terminal's input queue is small: keep a terminal's stdin short.
        let len = if pty {
            stdin_len.min(256 * 1024)
        } else {
            stdin_len
        };
        stdin = Some((seed ^ 0x5354_4449_4e00, len));
        child.stdin_bytes = Some(len);
    }
    let (mut timeout, mut terminate) = (None, None);
    match kind {
        Kind::Grandchild => child.grandchild = Some(grandchild.into()),
        Kind::Terminated => {
            terminate = Some(Duration::from_millis(terminate_ms));
            if counts_term {
                child.on_term = Some("count".into());
            }
        }
        Kind::Timeout => {
            // Paced so that it is still writing when the timeout passes.
            child.pace = 1 << 20;
            bytes = (timeout_ms / 1000 + 60) << 20;
            child.bytes = bytes;
            timeout = Some(timeout_ms);
            if counts_term {
                child.on_term = Some("count".into());
            }
        }
        _ => {}
    }
    Plan {
        expect: Expect {
            kind,
            seed,
            bytes,
            stdin,
            exit,
            pty,
            counts_term: child.on_term.is_some(),
        },
        child,
        timeout_ms: timeout,
        terminate_after: terminate,
        pause: (kind == Kind::Paused).then_some(pause),
    }
}

/// Connect a client on `path`, retrying while its path is disturbed (up to `within`).
async fn connect(sh: &Shared, keys: &Keypair, path: &Path, within: Duration) -> Option<Client> {
    let mut cfg = NoiseClientConfig::new(keys.clone(), path.server_public);
    cfg.keepalive = sh.cfg.keepalive;
    let target = Target::Noise {
        url: path.url.clone(),
        config: Arc::new(cfg),
        pool: LinkPool::new(),
    };
    let opts = ClientOptions {
        client_name: "soak".into(),
        ..ClientOptions::default()
    };
    let deadline = Instant::now() + within;
    let mut last = String::new();
    while Instant::now() < deadline {
        match Client::connect(target.clone(), opts.clone()).await {
            Ok(c) => return Some(c),
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    sh.fail(format!(
        "client on {} could not connect within {within:?}: {last}",
        path.proxy.name
    ));
    None
}

/// One client slot: clients one after another on `path` until the soak stops.
pub async fn client_slot(sh: Arc<Shared>, slot: usize, keys: Keypair, path: Path) {
    let mut rng = Rng::new(derive(sh.cfg.seed, "slot", slot as u64));
    let mut generation = 0u64;
    while !sh.stop.is_cancelled() {
        let life = Duration::from_secs_f64(rng.exp(sh.cfg.client_life.as_secs_f64()).max(10.0));
        let abandon = rng.chance(sh.cfg.abandon);
        let Some(client) = connect(&sh, &keys, &path, Duration::from_secs(120)).await else {
            return;
        };
        sh.stats.clients.fetch_add(1, Ordering::Relaxed);
        sh.clients
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(client.clone());
        let until = Instant::now() + life;
        let mut procs = JoinSet::new();
        let mut n = 0u64;
        let mut next_break = next_break(&mut rng, &sh.cfg);
        loop {
            while procs.len() < sh.cfg.per_client
                && Instant::now() < until
                && !sh.stop.is_cancelled()
            {
                let p = plan(&mut rng, &sh.cfg);
                let id = format!("s{slot}-g{generation}-p{n}");
                n += 1;
                procs.spawn(run_process(sh.clone(), client.clone(), path.clone(), id, p));
            }
            if procs.is_empty() {
                break;
            }
            if Instant::now() >= until && abandon {
                break;
            }
            tokio::select! {
                _ = procs.join_next() => {}
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
            if let Some(at) = next_break {
                if Instant::now() >= at && !sh.calm.is_cancelled() {
                    sh.log.fault(
                        "break-connection",
                        &format!("client slot={slot} gen={generation}"),
                        "",
                    );
                    sh.stats.breaks.fetch_add(1, Ordering::Relaxed);
                    client.break_connection();
                    path.proxy.mark_disturbed();
                    next_break = self::next_break(&mut rng, &sh.cfg);
                }
            }
        }
        if procs.is_empty() || !abandon {
            while procs.join_next().await.is_some() {}
            client.shutdown().await;
        } else {
            // Leave the session detached with processes running: it must expire after its TTL
            // and take them with it.
            sh.stats.clients_abandoned.fetch_add(1, Ordering::Relaxed);
            sh.log.line(&format!(
                "client slot={slot} gen={generation} leaves its session with {} processes running",
                procs.len()
            ));
            procs.abort_all();
            while procs.join_next().await.is_some() {}
            client.close();
        }
        sh.clients
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|c| c.session_id() != client.session_id());
        generation += 1;
    }
}

fn next_break(rng: &mut Rng, cfg: &WorkloadConfig) -> Option<Instant> {
    let gap = rng.exp(cfg.break_gap.as_secs_f64());
    (!cfg.break_gap.is_zero()).then(|| Instant::now() + Duration::from_secs_f64(gap))
}

/// Marks a process abandoned if its task is dropped before it finished (an abandoned client).
struct Abandon<'a> {
    sh: &'a Shared,
    id: String,
    kind: Kind,
    finished: bool,
}

impl Drop for Abandon<'_> {
    fn drop(&mut self) {
        self.sh.untrack(&self.id);
        if !self.finished {
            self.sh.stats.abandoned.fetch_add(1, Ordering::Relaxed);
            *self
                .sh
                .stats
                .by_kind
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry("abandoned")
                .or_default() += 1;
            let _ = self.kind;
        }
    }
}

async fn run_process(sh: Arc<Shared>, client: Client, path: Path, id: String, p: Plan) {
    let mut argv = vec![sh.cfg.exe.clone()];
    argv.extend(p.child.argv());
    let mut opts = StartOptions::new(&id, argv);
    opts.params
        .env
        .insert(sh.cfg.tag.0.clone(), Some(sh.cfg.tag.1.clone()));
    opts.params.tty = p.expect.pty;
    if p.expect.pty {
        opts.params.size = Some(TermSize {
            rows: 40,
            cols: 120,
        });
    }
    opts.params.pipe_stdin = p.expect.stdin.is_some();
    opts.params.timeout_ms = p.timeout_ms;
    opts.params.kill_grace_ms = Some(3000);
    let tracked = Arc::new(Tracked {
        id: id.clone(),
        kind: p.expect.kind,
        path: path.clone(),
        client: client.clone(),
        started: Instant::now(),
        progress: Mutex::new(Instant::now()),
        out_bytes: AtomicU64::new(0),
        in_bytes: AtomicU64::new(0),
        paused: AtomicBool::new(false),
        done: AtomicBool::new(false),
        stalled: AtomicBool::new(false),
    });
    sh.track(tracked.clone());
    let mut guard = Abandon {
        sh: &sh,
        id: id.clone(),
        kind: p.expect.kind,
        finished: false,
    };
    sh.stats.started.fetch_add(1, Ordering::Relaxed);
    let mut handle = match client.start(opts).await {
        Ok(h) => h,
        Err(e) => {
            sh.stats.start_errors.fetch_add(1, Ordering::Relaxed);
            guard.finished = true;
            sh.fail(format!("{id} ({}): start failed: {e}", path.proxy.name));
            return;
        }
    };
    tracked.moved();
    let banner = Arc::new(Notify::new());
    let mut tasks = JoinSet::new();
    if let Some((seed, len)) = p.expect.stdin {
        let w = handle.stdin_writer();
        let (t, b, pty, sh2) = (tracked.clone(), banner.clone(), p.expect.pty, sh.clone());
        let tolerant = matches!(p.expect.kind, Kind::Terminated);
        tasks.spawn(async move {
            feed_stdin(sh2, w, t, b, pty, seed, len, tolerant).await;
        });
    }
    // 0: no terminate; 1: it found the process running; 2: it had already exited.
    let terminated = Arc::new(AtomicU8::new(0));
    if let Some(after) = p.terminate_after {
        let c = handle.controller();
        let (flag, sh2, id2) = (terminated.clone(), sh.clone(), id.clone());
        tasks.spawn(async move {
            tokio::time::sleep(after).await;
            match c.terminate().await {
                Ok(running) => flag.store(if running { 1 } else { 2 }, Ordering::SeqCst),
                Err(e) => sh2.fail(format!("{id2}: process/terminate failed: {e}")),
            }
        });
    }
    let mut d = Delivery::new(p.expect.clone());
    let pause_at = p.pause.map(|(after, len)| (Instant::now() + after, len));
    let mut paused_once = false;
    loop {
        let ev = match pause_at {
            Some((at, len)) if !paused_once => {
                tokio::select! {
                    ev = handle.next_event() => ev,
                    _ = tokio::time::sleep_until(tokio::time::Instant::from_std(at)) => {
                        paused_once = true;
                        tracked.paused.store(true, Ordering::SeqCst);
                        tokio::time::sleep(len).await;
                        tracked.paused.store(false, Ordering::SeqCst);
                        tracked.moved();
                        continue;
                    }
                }
            }
            _ => handle.next_event().await,
        };
        let Some(ev) = ev else {
            let why = client
                .lost_reason()
                .unwrap_or_else(|| "the event stream ended".into());
            sh.stats.sessions_lost.fetch_add(1, Ordering::Relaxed);
            sh.fail(format!("{id} ({}): no exit notice: {why}", path.proxy.name));
            break;
        };
        let n = d.event(&ev);
        if n > 0 {
            tracked.out_bytes.fetch_add(n, Ordering::Relaxed);
            sh.stats.out_bytes.fetch_add(n, Ordering::Relaxed);
            tracked.moved();
            if d.banner {
                banner.notify_one();
            }
        }
        if matches!(ev, ProcessEvent::Exited(_)) {
            break;
        }
    }
    tracked.done.store(true, Ordering::SeqCst);
    // The exit notice is the last event: nothing comes after it.
    if d.exits > 0 {
        if let Ok(Some(ev)) =
            tokio::time::timeout(Duration::from_secs(2), handle.next_event()).await
        {
            d.event(&ev);
        }
    }
    while tasks.join_next().await.is_some() {}
    guard.finished = true;
    if d.exit.is_none() {
        return;
    }
    let v = check(&d, terminated.load(Ordering::SeqCst) == 1);
    sh.stats.checked.fetch_add(1, Ordering::Relaxed);
    *sh.stats
        .by_kind
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(p.expect.kind.name())
        .or_default() += 1;
    sh.stats.lost.fetch_add(v.lost, Ordering::Relaxed);
    sh.stats
        .duplicated
        .fetch_add(v.duplicated, Ordering::Relaxed);
    if v.corrupt {
        sh.stats.corrupt.fetch_add(1, Ordering::Relaxed);
    }
    if v.reason.is_some() {
        sh.stats.reasons_checked.fetch_add(1, Ordering::Relaxed);
    }
    if d.exits != 1 || d.after_exit > 0 {
        sh.stats.exit_notice_errors.fetch_add(1, Ordering::Relaxed);
    }
    if !v.problems.is_empty() {
        if v.lost == 0 && v.duplicated == 0 && !v.corrupt {
            sh.stats.bad_status.fetch_add(1, Ordering::Relaxed);
        }
        let hash: String = {
            use sha2::Digest;
            d.hash.clone().finalize()[..8]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect()
        };
        sh.fail(format!(
            "{id} ({}, {}, {} bytes, sha256 {hash}…): {}",
            p.expect.kind.name(),
            path.proxy.name,
            d.stdout_raw,
            v.problems.join("; ")
        ));
    }
    drop(handle);
}

/// Write `len` bytes of the stdin stream of `seed`, in writes of random sizes, then close
/// stdin (a pipe) or just flush (a terminal: no end of input in raw mode).
#[allow(clippy::too_many_arguments)]
async fn feed_stdin(
    sh: Arc<Shared>,
    mut w: execrelay::client::StdinWriter,
    t: Arc<Tracked>,
    banner: Arc<Notify>,
    pty: bool,
    seed: u64,
    len: u64,
    tolerant: bool,
) {
    if pty {
        // Input before the child made its terminal raw would be echoed into its output.
        banner.notified().await;
    }
    let mut rng = Rng::new(seed);
    let mut off = 0u64;
    let mut buf = Vec::new();
    while off < len {
        let n = rng.log_uniform(1, 512 * 1024).min(len - off) as usize;
        buf.resize(n, 0);
        stream_bytes(seed, off, &mut buf);
        if let Err(e) = w.write(Bytes::copy_from_slice(&buf)).await {
            if !tolerant {
                sh.fail(format!("{}: stdin write failed at {off}: {e}", t.id));
            }
            return;
        }
        off += n as u64;
        t.in_bytes.fetch_add(n as u64, Ordering::Relaxed);
        sh.stats.in_bytes.fetch_add(n as u64, Ordering::Relaxed);
        t.moved();
    }
    let before = (t.client.connection_count(), t.done.load(Ordering::SeqCst));
    let r = if pty {
        w.flush().await
    } else {
        w.finish().await
    };
    if let Err(e) = r {
        if !tolerant {
            sh.fail(format!(
                "{} ({}): stdin close failed after all {len} bytes were queued: {e} (connections \
                 {} → {}, exit notice seen before {} / after {})",
                t.id,
                t.kind.name(),
                before.0,
                t.client.connection_count(),
                before.1,
                t.done.load(Ordering::SeqCst),
            ));
        }
    }
}
