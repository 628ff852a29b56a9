//! The fault-injecting proxy: a TCP proxy on loopback that sits on one link of a deployment
//! (client ↔ relay, environment ↔ relay, client ↔ direct server) and, from a seed, at random
//! cuts its connections (a FIN, or a reset), cuts one side only (the peer upstream keeps a
//! dead link until its keepalive notices: a NAT that forgot the mapping, and on an environment
//! link the way the relay sees a replacement), stalls them (both directions or one, shorter or
//! longer than the pong timeout), delays them and trickles bytes.
//!
//! **Replayable.** Connection `n` of proxy `name` draws its faults from
//! `derive(seed, name, n)` and nothing else: the same seed gives every connection the same
//! list of faults (what, in which direction, how long, after how long a quiet spell) however
//! the run's timing differs. Every action goes to the [`FaultLog`] with its time since the
//! start of the run, so a failure is read against the faults that preceded it and replayed
//! with the same seed.
//!
//! **What it tells the stall detector.** Each proxy knows when it last disturbed its link
//! ([`Proxy::quiet_since`]): a fault under way, or the end of the last one. Output that stops
//! while its path is disturbed is not a stall; output that stops on a quiet path is.
//!
//! It never looks inside what it carries: WebSocket frames, Noise records and JSON all look
//! alike to it, and a trickle cuts them anywhere.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use execrelay_protocol::sync::lock;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::rng::{derive, Rng};

/// How long a connection to the upstream may take before the downstream one is closed (the
/// upstream is down: a relay restarting).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest an upstream socket is held open, silent, after its downstream was cut.
const HALF_CUT_HOLD: Duration = Duration::from_secs(120);
/// Chunks in flight per direction (at most 64 KiB each): the delay line's length.
const QUEUE_CHUNKS: usize = 64;

/// The kinds of fault a proxy injects, as they are counted and logged.
pub const KINDS: [&str; 7] = [
    "cut",
    "reset",
    "half-cut",
    "stall-short",
    "stall-long",
    "delay",
    "trickle",
];

/// What a proxy does, and how often.
#[derive(Debug, Clone)]
pub struct FaultPlan {
    /// Mean quiet spell between two faults on one connection (exponential).
    pub mean_gap: Duration,
    /// The keepalive's pong timeout of the link it sits on: short stalls stay below it, long
    /// ones pass it.
    pub pong_timeout: Duration,
    /// Relative weights of cut, reset, half-cut, short stall, long stall, delay, trickle.
    pub weights: [u32; 7],
    /// How long a delay or a trickle lasts (ms, uniform in this range).
    pub spell_ms: (u64, u64),
    /// The latency a delay adds (ms, uniform in this range).
    pub latency_ms: (u64, u64),
}

impl FaultPlan {
    /// Every kind of fault, every `mean_gap` on average.
    pub fn new(mean_gap: Duration, pong_timeout: Duration) -> FaultPlan {
        FaultPlan {
            mean_gap,
            pong_timeout,
            weights: [3, 1, 2, 4, 2, 3, 2],
            spell_ms: (500, 6000),
            latency_ms: (20, 400),
        }
    }
}

/// The run's record of faults: one line per action, with its time since the start, and a
/// count per kind.
pub struct FaultLog {
    start: Instant,
    out: Mutex<Option<std::io::BufWriter<std::fs::File>>>,
    counts: Mutex<BTreeMap<String, u64>>,
}

impl FaultLog {
    /// A log written to `path` (created), timed from `start`.
    pub fn create(path: &Path, start: Instant) -> std::io::Result<Arc<FaultLog>> {
        let f = std::fs::File::create(path)?;
        Ok(Arc::new(FaultLog {
            start,
            out: Mutex::new(Some(std::io::BufWriter::new(f))),
            counts: Mutex::new(BTreeMap::new()),
        }))
    }

    /// Seconds since the start of the run.
    pub fn elapsed(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// Log one line (`what` says who and what).
    pub fn line(&self, what: &str) {
        let line = format!("+{:.3}s {what}\n", self.elapsed());
        if let Some(out) = lock(&self.out).as_mut() {
            let _ = out.write_all(line.as_bytes());
        }
    }

    /// Count one fault of `kind` by `who`, and log it with its `details`.
    pub fn fault(&self, kind: &str, who: &str, details: &str) {
        *lock(&self.counts).entry(kind.to_string()).or_default() += 1;
        self.line(format!("{who} {kind} {details}").trim_end());
    }

    /// Count an event that is not a fault of its own (a consequence of one), and log it.
    pub fn event(&self, kind: &str, who: &str, details: &str) {
        *lock(&self.counts).entry(kind.to_string()).or_default() += 1;
        self.line(format!("{who} {kind} {details}").trim_end());
    }

    /// Faults so far, by kind.
    pub fn counts(&self) -> BTreeMap<String, u64> {
        lock(&self.counts).clone()
    }

    /// Write what is buffered.
    pub fn flush(&self) {
        if let Some(out) = lock(&self.out).as_mut() {
            let _ = out.flush();
        }
    }
}

/// What a direction does with the bytes it carries.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Pass,
    Stall,
    Delay(Duration),
    /// This many bytes per tick of 10 ms.
    Trickle(usize),
}

struct State {
    name: String,
    seed: u64,
    upstream: SocketAddr,
    plan: FaultPlan,
    log: Arc<FaultLog>,
    connections: AtomicU64,
    /// Faults under way now.
    active: AtomicU64,
    /// When the last fault ended (or the last cut happened).
    last_disturbed: Mutex<Option<Instant>>,
    faults_on: AtomicBool,
    bytes: AtomicU64,
    stop: CancellationToken,
}

impl State {
    fn disturbed(&self) {
        *lock(&self.last_disturbed) = Some(Instant::now());
    }
}

/// A running proxy.
#[derive(Clone)]
pub struct Proxy {
    /// Its name in the log.
    pub name: String,
    /// Where it listens (127.0.0.1).
    pub addr: SocketAddr,
    state: Arc<State>,
}

impl Proxy {
    /// Listen on `listen` (127.0.0.1:0 picks a port) and carry every connection to `upstream`,
    /// injecting the faults of `plan` drawn from `seed`.
    pub async fn start(
        name: &str,
        listen: SocketAddr,
        upstream: SocketAddr,
        seed: u64,
        plan: FaultPlan,
        log: Arc<FaultLog>,
    ) -> std::io::Result<Proxy> {
        if !listen.ip().is_loopback() || !upstream.ip().is_loopback() {
            return Err(std::io::Error::other(
                "the fault proxy serves loopback only (--listen and --upstream on 127.0.0.1)",
            ));
        }
        let listener = TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State {
            name: name.to_string(),
            seed,
            upstream,
            plan,
            log,
            connections: AtomicU64::new(0),
            active: AtomicU64::new(0),
            last_disturbed: Mutex::new(None),
            faults_on: AtomicBool::new(true),
            bytes: AtomicU64::new(0),
            stop: CancellationToken::new(),
        });
        let st = state.clone();
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    _ = st.stop.cancelled() => return,
                    a = listener.accept() => a,
                };
                let Ok((down, _)) = accepted else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let n = st.connections.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(serve(st.clone(), down, n));
            }
        });
        Ok(Proxy {
            name: name.to_string(),
            addr,
            state,
        })
    }

    /// `None` while a fault is under way on one of its connections; otherwise when its link
    /// was last disturbed (`None` inside: never).
    pub fn quiet_since(&self) -> Result<Option<Instant>, ()> {
        if self.state.active.load(Ordering::SeqCst) > 0 {
            return Err(());
        }
        Ok(*lock(&self.state.last_disturbed))
    }

    /// Note a disturbance made from outside (a client breaking its own connection).
    pub fn mark_disturbed(&self) {
        self.state.disturbed();
    }

    /// Inject no more faults (the end of a soak: everything must finish on quiet links).
    pub fn stop_faults(&self) {
        self.state.faults_on.store(false, Ordering::SeqCst);
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.state.connections.load(Ordering::Relaxed)
    }

    /// Bytes carried (both directions).
    pub fn bytes(&self) -> u64 {
        self.state.bytes.load(Ordering::Relaxed)
    }

    /// Stop accepting; connections under way end with their peers.
    pub fn shutdown(&self) {
        self.state.stop.cancel();
    }
}

/// The two sides of one connection, each cancelled on its own for a half cut.
struct Sides {
    /// The side the connection came from (client, or exec server dialling the relay).
    down: CancellationToken,
    /// The side it goes to.
    up: CancellationToken,
    /// Close with a reset rather than a FIN.
    reset: Arc<AtomicBool>,
}

async fn serve(st: Arc<State>, down: TcpStream, n: u64) {
    let who = format!("proxy={} conn={n}", st.name);
    let up = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(st.upstream)).await {
        Ok(Ok(up)) => up,
        Ok(Err(e)) => {
            st.log
                .event("upstream-refused", &who, &format!("{}: {e}", st.upstream));
            st.disturbed();
            return;
        }
        Err(_) => {
            st.log.event(
                "upstream-refused",
                &who,
                &format!("{}: timed out", st.upstream),
            );
            st.disturbed();
            return;
        }
    };
    let _ = down.set_nodelay(true);
    let _ = up.set_nodelay(true);
    let (dr, dw) = down.into_split();
    let (ur, uw) = up.into_split();
    let sides = Sides {
        down: CancellationToken::new(),
        up: CancellationToken::new(),
        reset: Arc::new(AtomicBool::new(false)),
    };
    let (to_up, up_mode) = watch::channel(Mode::Pass);
    let (to_down, down_mode) = watch::channel(Mode::Pass);
    // up: what the downstream peer sends; down: what the upstream peer sends.
    let a = direction(
        st.clone(),
        dr,
        uw,
        up_mode,
        sides.down.clone(),
        sides.up.clone(),
        sides.reset.clone(),
    );
    let b = direction(
        st.clone(),
        ur,
        dw,
        down_mode,
        sides.up.clone(),
        sides.down.clone(),
        sides.reset.clone(),
    );
    let done = CancellationToken::new();
    {
        let done = done.clone();
        tokio::spawn(async move {
            let _ = tokio::join!(a, b);
            done.cancel();
        });
    }
    let mut rng = Rng::new(derive(st.seed, &st.name, n));
    let plan = st.plan.clone();
    loop {
        let gap = Duration::from_secs_f64(rng.exp(plan.mean_gap.as_secs_f64()));
        tokio::select! {
            _ = done.cancelled() => break,
            _ = tokio::time::sleep(gap) => {}
        }
        // Every draw is made whether or not faults are on, so the sequence stays the seed's.
        let kind = rng.weighted(&plan.weights);
        let dir = rng.below(3); // 0 both, 1 up only, 2 down only
        let pong = plan.pong_timeout.as_secs_f64();
        let short = Duration::from_secs_f64(pong * (0.2 + 0.6 * rng.unit()));
        let long = Duration::from_secs_f64(pong * (1.2 + 1.3 * rng.unit()));
        let delay = Duration::from_millis(rng.range(plan.latency_ms.0, plan.latency_ms.1));
        let spell = Duration::from_millis(rng.range(plan.spell_ms.0, plan.spell_ms.1));
        let trickle = rng.range(1, 64) as usize;
        if !st.faults_on.load(Ordering::SeqCst) {
            continue;
        }
        let dirs = ["both", "up", "down"][dir as usize];
        let set = |mode: Mode| {
            if dir != 2 {
                let _ = to_up.send(mode);
            }
            if dir != 1 {
                let _ = to_down.send(mode);
            }
        };
        match kind {
            0 | 1 => {
                let k = if kind == 0 { "cut" } else { "reset" };
                st.log.fault(k, &who, "");
                sides.reset.store(kind == 1, Ordering::SeqCst);
                sides.down.cancel();
                sides.up.cancel();
                st.disturbed();
                break;
            }
            2 => {
                st.log.fault("half-cut", &who, "");
                sides.down.cancel();
                st.disturbed();
                // The upstream side stays open, silent, until its peer gives up on it.
                tokio::select! {
                    _ = done.cancelled() => {}
                    _ = tokio::time::sleep(HALF_CUT_HOLD) => sides.up.cancel(),
                }
                st.line_end(&who, "half-cut upstream closed");
                break;
            }
            _ => {
                let (k, mode, dur, what) = match kind {
                    3 => ("stall-short", Mode::Stall, short, format!("dir={dirs}")),
                    4 => ("stall-long", Mode::Stall, long, format!("dir={dirs}")),
                    5 => (
                        "delay",
                        Mode::Delay(delay),
                        spell,
                        format!("dir={dirs} latency_ms={}", delay.as_millis()),
                    ),
                    _ => (
                        "trickle",
                        Mode::Trickle(trickle),
                        spell,
                        format!("dir={dirs} bytes_per_10ms={trickle}"),
                    ),
                };
                st.active.fetch_add(1, Ordering::SeqCst);
                st.log
                    .fault(k, &who, &format!("{what} ms={}", dur.as_millis()));
                set(mode);
                tokio::select! {
                    _ = done.cancelled() => {}
                    _ = tokio::time::sleep(dur) => {}
                }
                set(Mode::Pass);
                st.disturbed();
                st.active.fetch_sub(1, Ordering::SeqCst);
                if done.is_cancelled() {
                    break;
                }
            }
        }
    }
    done.cancelled().await;
    st.log.line(&format!("{who} closed"));
}

impl State {
    fn line_end(&self, who: &str, what: &str) {
        self.log.line(&format!("{who} {what}"));
    }
}

/// One direction: a reader into a bounded queue (stamped with the time each chunk arrived),
/// and a writer that applies the mode. The end of its source is passed on as a FIN; a write
/// that fails ends the whole connection; a side cut ends what reads or writes on that side,
/// and the other side of a half cut keeps reading (and dropping) until its peer closes.
async fn direction(
    st: Arc<State>,
    mut src: OwnedReadHalf,
    mut dst: OwnedWriteHalf,
    mut mode: watch::Receiver<Mode>,
    src_side: CancellationToken,
    dst_side: CancellationToken,
    reset: Arc<AtomicBool>,
) {
    let (tx, mut rx) = mpsc::channel::<Option<(Instant, Bytes)>>(QUEUE_CHUNKS);
    let (st2, reset2, side2) = (st, reset.clone(), src_side.clone());
    let reader = tokio::spawn(async move {
        let mut buf = BytesMut::with_capacity(64 * 1024);
        loop {
            buf.reserve(64 * 1024);
            let r = tokio::select! {
                _ = side2.cancelled() => break,
                r = src.read_buf(&mut buf) => r,
            };
            match r {
                Ok(0) | Err(_) => {
                    // Pass the end on (a FIN). Nobody to pass it to: the other side of this
                    // connection was cut (a half cut), and its last peer just left.
                    if tx.send(None).await.is_err() {
                        side2.cancel();
                    }
                    break;
                }
                Ok(n) => {
                    st2.bytes.fetch_add(n as u64, Ordering::Relaxed);
                    let chunk = buf.split().freeze();
                    // Nobody to take it (a half cut): dropped, as a forgotten NAT mapping
                    // drops it.
                    let _ = tx.send(Some((Instant::now(), chunk))).await;
                }
            }
        }
        if reset2.load(Ordering::SeqCst) {
            let _ = src.as_ref().set_zero_linger();
        }
    });
    loop {
        let item = tokio::select! {
            _ = dst_side.cancelled() => break,
            item = rx.recv() => item,
        };
        match item {
            Some(Some((at, chunk))) => {
                if !write_chunk(&mut dst, &mut mode, at, &chunk, &dst_side).await {
                    if !dst_side.is_cancelled() {
                        // The destination is gone: so is the connection.
                        src_side.cancel();
                        dst_side.cancel();
                    }
                    break;
                }
            }
            // The source ended: pass on the FIN.
            Some(None) => {
                let _ = dst.shutdown().await;
                break;
            }
            // The reader left without an end (its side was cut): hold this side open, silent,
            // until it is cut too.
            None => {
                dst_side.cancelled().await;
                break;
            }
        }
    }
    drop(rx);
    if reset.load(Ordering::SeqCst) {
        let _ = dst.as_ref().set_zero_linger();
        // No FIN before the reset.
        dst.forget();
    } else {
        drop(dst);
    }
    let _ = reader.await;
}

/// Write one chunk as the current mode says; false if the side was cut or the write failed.
async fn write_chunk(
    dst: &mut OwnedWriteHalf,
    mode: &mut watch::Receiver<Mode>,
    at: Instant,
    chunk: &[u8],
    side: &CancellationToken,
) -> bool {
    let mut rest = chunk;
    while !rest.is_empty() {
        let m = *mode.borrow_and_update();
        match m {
            Mode::Stall => {
                tokio::select! {
                    _ = side.cancelled() => return false,
                    r = mode.changed() => if r.is_err() { return false; },
                }
            }
            Mode::Delay(d) => {
                let due = tokio::time::Instant::from_std(at + d);
                tokio::select! {
                    _ = side.cancelled() => return false,
                    _ = mode.changed() => {}
                    _ = tokio::time::sleep_until(due) => {
                        if !write_all(dst, rest, side).await { return false; }
                        rest = &[];
                    }
                }
            }
            Mode::Trickle(k) => {
                let n = k.min(rest.len());
                if !write_all(dst, &rest[..n], side).await {
                    return false;
                }
                rest = &rest[n..];
                tokio::select! {
                    _ = side.cancelled() => return false,
                    _ = tokio::time::sleep(Duration::from_millis(10)) => {}
                }
            }
            Mode::Pass => {
                if !write_all(dst, rest, side).await {
                    return false;
                }
                rest = &[];
            }
        }
    }
    true
}

async fn write_all(dst: &mut OwnedWriteHalf, bytes: &[u8], side: &CancellationToken) -> bool {
    tokio::select! {
        _ = side.cancelled() => false,
        r = dst.write_all(bytes) => r.is_ok(),
    }
}
