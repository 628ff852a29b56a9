//! The links' WebSocket framing beside two WebSocket crates, the same bytes over loopback TCP
//! (`cargo bench -p execrelay-io --bench ws_codec`; README, "The WebSocket codec measured").
//!
//! Contenders, each started as an already-upgraded WebSocket over a raw TCP connection (no
//! HTTP upgrade: the links do theirs with tungstenite whichever codec frames the data after):
//!
//! - `ours`: the very reader and writer a link's driver runs ([`LinkSocket::from_raw`] split
//!   into `FrameReader` and `FrameWriter`, `io/src/driver/socket.rs`): reads of up to
//!   `LINK_READ_BYTES` into a buffer never zero-filled, payloads handed on as `Bytes` slices,
//!   each batch of up to `WRITE_BATCH_BYTES` written as one `writev`. Like the driver, it
//!   runs on the two halves of `tokio::io::split` (a lock taken per poll); the others run
//!   unsplit.
//! - `tungstenite`: tokio-tungstenite 0.30 with its default configuration (128 KiB read and
//!   write buffers); the writer feeds messages and flushes once per `WRITE_BATCH_BYTES`.
//! - `fastwebsockets`: fastwebsockets 0.10 over the bare socket; it has no batching of its
//!   own (each `write_frame` is at least one system call).
//! - `fastwebsockets_buffered`: the same over a tokio `BufWriter` of `WRITE_BATCH_BYTES`,
//!   flushed once per batch: the batching a link would have to add to it.
//!
//! Every reader turns each message into a `Bytes` (what a link hands its router) and checks
//! its length and first byte (the message's sequence number); every writer sends clones of
//! 256 prepared `Bytes` payloads (a link's frames are shared `Bytes`).
//!
//! Cases (all four contenders, in turn, in each): `large`, `WS_BENCH_BYTES` (default 1 GiB) as
//! full-size link frames (`MAX_FRAME_BYTES`, 65,579 bytes); `small`, `WS_BENCH_SMALL_BYTES`
//! (default 256 MiB) as 1 KiB messages; each server→client (unmasked) and client→server
//! (masked). The reader and the writer run in two threads, each with its own single-threaded
//! tokio runtime, so each thread's CPU clock (`CLOCK_THREAD_CPUTIME_ID`; the user share from
//! `getrusage(RUSAGE_THREAD)`) is that side's CPU alone.
//!
//! `WS_BENCH_ROUNDS` rounds (default 3), the contenders taking turns in each; the figures are
//! medians over the rounds (peak and idle memory: the largest). Prints `KEY VALUE` lines,
//! `ws_<contender>_<case>_<direction>_…`:
//!
//! - `MBps`: payload bytes over the time from the writer's start to the reader's last message.
//! - `reader_cpu_s_per_GB`, `writer_cpu_s_per_GB` (user + system of that thread, per 10⁹
//!   payload bytes), `both_cpu_s_per_GB` (the two together: how fast a reader is paced by its
//!   writer moves CPU between them, the sum less so), and their `_vs_ours` ratios (taken round
//!   by round, then the median); `reader_user_cpu_s_per_GB`, `writer_user_cpu_s_per_GB`, the
//!   user share.
//! - `reader_KiB_per_read`, `writer_KiB_per_write`: bytes per read or write of the socket
//!   that moved any (the socket is wrapped to count them): most of the system time follows.
//! - `reader_peak_KiB`, `writer_peak_KiB`: the most heap that side held at once during the
//!   burst (a counting allocator, per thread), above what it held before the WebSocket was
//!   built.
//! - `reader_idle_KiB`, `writer_idle_KiB`: what that side still holds once the burst is over,
//!   the reader waiting in a read that has nothing to return: the cost of an idle connection.
//!
//! Then the same figures as a Markdown table on stderr (CPU with its range over the rounds),
//! and the load average before and after.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::future::Future;
use std::io::{self, IoSlice};
use std::net::{TcpListener, TcpStream as StdTcpStream};
use std::pin::Pin;
use std::sync::mpsc;
use std::sync::{Arc, Barrier};
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use execrelay_io::driver::socket::{Outgoing, ReadEvent};
use execrelay_io::driver::{LinkSocket, WRITE_BATCH_BYTES};
use execrelay_protocol::frame::{WireParts, MAX_FRAME_BYTES};
use execrelay_protocol::websocket::{Message, Role};
use futures_util::{SinkExt, StreamExt};
use nix::sys::resource::{getrusage, UsageWho};
use nix::time::{clock_gettime, ClockId};
use tokio::io::{AsyncRead, AsyncWrite, BufWriter, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio_tungstenite::tungstenite;

// ---------------------------------------------------------------------------------------------
// Heap held per thread: a counting allocator over the system's.

thread_local! {
    static HELD: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

/// The system allocator, counting the bytes each thread has allocated and not freed (a block
/// freed by another thread counts there; in this benchmark each side's blocks stay in its
/// thread) and the most it held at once.
struct Counting;

fn note(delta: isize) {
    // `try_with`: the allocator runs while thread-locals are torn down too.
    let _ = HELD.try_with(|h| {
        let now = h.get() + delta;
        h.set(now);
        let _ = PEAK.try_with(|p| {
            if now > p.get() {
                p.set(now)
            }
        });
    });
}

// SAFETY: every call is passed to `System` unchanged; the counting touches only
// thread-locals of plain integers (no allocation, no re-entry).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            note(layout.size() as isize);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            note(layout.size() as isize);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) };
        note(-(layout.size() as isize));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            note(new_size as isize - layout.size() as isize);
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn held() -> isize {
    HELD.with(Cell::get)
}

/// This thread's CPU time so far (total, user), in seconds: the total from
/// `CLOCK_THREAD_CPUTIME_ID` (exact), the user share from `getrusage(RUSAGE_THREAD)` (the
/// kernel splits a thread's time into user and system by sampling at its tick, so that share
/// is only as good as the run is long).
fn thread_cpu() -> (f64, f64) {
    let t = clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID).expect("CLOCK_THREAD_CPUTIME_ID");
    let u = getrusage(UsageWho::RUSAGE_THREAD).expect("getrusage(RUSAGE_THREAD)");
    let user = u.user_time().tv_sec() as f64 + u.user_time().tv_usec() as f64 / 1e6;
    (t.tv_sec() as f64 + t.tv_nsec() as f64 / 1e9, user)
}

// ---------------------------------------------------------------------------------------------
// System calls per side: the socket, counting the reads and writes that moved bytes.

thread_local! {
    static IO_CALLS: Cell<u64> = const { Cell::new(0) };
    static IO_BYTES: Cell<u64> = const { Cell::new(0) };
}

fn count_io(r: &Poll<io::Result<usize>>) {
    if let Poll::Ready(Ok(n)) = r {
        if *n > 0 {
            IO_CALLS.with(|c| c.set(c.get() + 1));
            IO_BYTES.with(|c| c.set(c.get() + *n as u64));
        }
    }
}

/// A TCP stream that counts, in its thread, each read or write that moved bytes (one
/// `recv`, `send` or `writev` each): how much a codec moves per system call explains most of
/// its system time.
struct Io(TcpStream);

impl AsyncRead for Io {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.0).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) {
            count_io(&Poll::Ready(Ok(buf.filled().len() - before)));
        }
        r
    }
}

impl AsyncWrite for Io {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.0).poll_write(cx, buf);
        count_io(&r);
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.0).poll_write_vectored(cx, bufs);
        count_io(&r);
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

// ---------------------------------------------------------------------------------------------
// One side's measurements.

/// What one side (reader or writer thread) measured.
#[derive(Debug, Default, Clone, Copy)]
struct Side {
    /// CPU seconds, user and system.
    cpu: f64,
    /// Of which user (sampled).
    user: f64,
    peak: isize,
    idle: isize,
    /// Reads (reader) or writes (writer) of the socket that moved bytes, and those bytes.
    calls: u64,
    bytes: u64,
    /// When it began (just before the WebSocket was built) and when its burst was over.
    began: Option<Instant>,
    ended: Option<Instant>,
}

/// Started just before the WebSocket is built.
struct Probe {
    base: isize,
    cpu0: (f64, f64),
    side: Side,
}

impl Probe {
    fn begin() -> Probe {
        let base = held();
        PEAK.with(|p| p.set(base));
        IO_CALLS.with(|c| c.set(0));
        IO_BYTES.with(|c| c.set(0));
        Probe {
            base,
            cpu0: thread_cpu(),
            side: Side {
                began: Some(Instant::now()),
                ..Side::default()
            },
        }
    }

    /// The burst is over: CPU and peak so far.
    fn finish(&mut self) {
        self.side.ended = Some(Instant::now());
        let (cpu, user) = thread_cpu();
        self.side.cpu = cpu - self.cpu0.0;
        self.side.user = user - self.cpu0.1;
        self.side.peak = PEAK.with(Cell::get) - self.base;
        self.side.calls = IO_CALLS.with(Cell::get);
        self.side.bytes = IO_BYTES.with(Cell::get);
    }

    /// The connection is idle: what this side still holds.
    fn idle(&mut self) {
        self.side.idle = held() - self.base;
    }
}

/// How a side waits once its burst is over: it says it is idle, then waits to be stopped
/// (the writer must not close the connection before the reader is idle too).
struct Park {
    idle: mpsc::Sender<()>,
    stop: oneshot::Receiver<()>,
}

/// Wait idle with `read` pending (a read with nothing to return: where a codec releases or
/// keeps its buffer), measuring what is held meanwhile.
async fn park_reading<F>(read: F, probe: &mut Probe, park: Park)
where
    F: Future,
    F::Output: std::fmt::Debug,
{
    let Park { idle, stop } = park;
    tokio::select! {
        biased;
        ev = read => panic!("the reader got something after the burst: {ev:?}"),
        _ = async {
            probe.idle();
            let _ = idle.send(());
            let _ = stop.await;
        } => {}
    }
}

async fn park_writing(probe: &mut Probe, park: Park) {
    probe.idle();
    let _ = park.idle.send(());
    let _ = park.stop.await;
}

// ---------------------------------------------------------------------------------------------
// The plan of a run and the payloads.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Contender {
    Ours,
    Tungstenite,
    Fast,
    FastBuffered,
}

impl Contender {
    const ALL: [Contender; 4] = [
        Contender::Ours,
        Contender::Tungstenite,
        Contender::Fast,
        Contender::FastBuffered,
    ];

    fn name(self) -> &'static str {
        match self {
            Contender::Ours => "ours",
            Contender::Tungstenite => "tungstenite",
            Contender::Fast => "fastwebsockets",
            Contender::FastBuffered => "fastwebsockets_buffered",
        }
    }
}

/// One run: `messages` messages of `size` bytes from a writer of role `writer_role`.
#[derive(Clone)]
struct Plan {
    size: usize,
    messages: u64,
    writer_role: Role,
    /// 256 payloads; message `i` is `payloads[i % 256]`, whose first byte is `i % 256`.
    payloads: Arc<Vec<Bytes>>,
}

impl Plan {
    fn reader_role(&self) -> Role {
        match self.writer_role {
            Role::Server => Role::Client,
            Role::Client => Role::Server,
        }
    }

    fn payload(&self, i: u64) -> Bytes {
        self.payloads[(i % 256) as usize].clone()
    }

    /// Messages per batch a link's writer would take at once.
    fn per_batch(&self) -> u64 {
        (WRITE_BATCH_BYTES / self.size).max(1) as u64
    }

    fn check(&self, i: u64, got: &[u8]) {
        assert_eq!(got.len(), self.size, "message {i}: wrong length");
        assert_eq!(got[0], (i % 256) as u8, "message {i}: out of order");
    }
}

fn payloads(size: usize) -> Arc<Vec<Bytes>> {
    Arc::new(
        (0..256u32)
            .map(|i| {
                let mut v: Vec<u8> = (0..size).map(|j| (j * 7 + 3) as u8).collect();
                v[0] = i as u8;
                let b = Bytes::from(v);
                // A `Bytes` from a `Vec` allocates its shared count at its first clone: do it
                // here, not in a measured thread.
                drop(b.clone());
                b
            })
            .collect(),
    )
}

fn tung_role(r: Role) -> tungstenite::protocol::Role {
    match r {
        Role::Server => tungstenite::protocol::Role::Server,
        Role::Client => tungstenite::protocol::Role::Client,
    }
}

fn fast_role(r: Role) -> fastwebsockets::Role {
    match r {
        Role::Server => fastwebsockets::Role::Server,
        Role::Client => fastwebsockets::Role::Client,
    }
}

// ---------------------------------------------------------------------------------------------
// Readers.

async fn read_ours(tcp: Io, plan: &Plan, probe: &mut Probe, park: Park) {
    let (mut r, _w) = LinkSocket::from_raw(tcp, plan.reader_role(), MAX_FRAME_BYTES).split();
    for i in 0..plan.messages {
        match r.next().await {
            ReadEvent::Message(Message::Binary(b)) => plan.check(i, &b),
            other => panic!("ours: message {i}: {other:?}"),
        }
    }
    probe.finish();
    park_reading(r.next(), probe, park).await;
}

async fn read_tungstenite(tcp: Io, plan: &Plan, probe: &mut Probe, park: Park) {
    let mut ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
        tcp,
        tung_role(plan.reader_role()),
        None,
    )
    .await;
    for i in 0..plan.messages {
        match ws.next().await {
            Some(Ok(tungstenite::Message::Binary(b))) => plan.check(i, &b),
            other => panic!("tungstenite: message {i}: {other:?}"),
        }
    }
    probe.finish();
    park_reading(ws.next(), probe, park).await;
}

async fn read_fast(tcp: Io, plan: &Plan, probe: &mut Probe, park: Park) {
    let mut ws = fastwebsockets::WebSocket::after_handshake(tcp, fast_role(plan.reader_role()));
    for i in 0..plan.messages {
        let frame = ws
            .read_frame()
            .await
            .unwrap_or_else(|e| panic!("fastwebsockets: message {i}: {e}"));
        assert_eq!(frame.opcode, fastwebsockets::OpCode::Binary);
        // A payload a link can hand on: its read buffer's slice, frozen (no copy), or a copy.
        let b = match frame.payload {
            fastwebsockets::Payload::Bytes(b) => b.freeze(),
            other => Bytes::copy_from_slice(&other),
        };
        plan.check(i, &b);
    }
    probe.finish();
    let read = async { ws.read_frame().await.map(|f| f.opcode) };
    park_reading(read, probe, park).await;
}

// ---------------------------------------------------------------------------------------------
// Writers.

async fn write_ours(tcp: Io, plan: &Plan, probe: &mut Probe, park: Park) {
    let (_r, mut w) = LinkSocket::from_raw(tcp, plan.writer_role, MAX_FRAME_BYTES).split();
    let per_batch = plan.per_batch();
    let mut batch = Vec::with_capacity(per_batch as usize);
    for i in 0..plan.messages {
        batch.push(Outgoing::Frame(WireParts::Whole(plan.payload(i))));
        if batch.len() as u64 == per_batch || i + 1 == plan.messages {
            w.write_batch(&batch).await.expect("ours: write");
            batch.clear();
        }
    }
    drop(batch);
    // As the driver does when it has nothing to send.
    w.release_scratch();
    probe.finish();
    park_writing(probe, park).await;
}

async fn write_tungstenite(tcp: Io, plan: &Plan, probe: &mut Probe, park: Park) {
    let mut ws =
        tokio_tungstenite::WebSocketStream::from_raw_socket(tcp, tung_role(plan.writer_role), None)
            .await;
    let per_batch = plan.per_batch();
    for i in 0..plan.messages {
        ws.feed(tungstenite::Message::Binary(plan.payload(i)))
            .await
            .expect("tungstenite: write");
        if (i + 1) % per_batch == 0 || i + 1 == plan.messages {
            ws.flush().await.expect("tungstenite: flush");
        }
    }
    probe.finish();
    park_writing(probe, park).await;
}

async fn write_fast<S>(io: S, plan: &Plan, probe: &mut Probe, park: Park)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut ws = fastwebsockets::WebSocket::after_handshake(io, fast_role(plan.writer_role));
    let per_batch = plan.per_batch();
    for i in 0..plan.messages {
        let p = plan.payload(i);
        // Borrowed: a server sends it as it is; a client masks a copy (RFC 6455 forces one).
        let frame = fastwebsockets::Frame::binary(fastwebsockets::Payload::Borrowed(&p));
        ws.write_frame(frame).await.expect("fastwebsockets: write");
        if (i + 1) % per_batch == 0 || i + 1 == plan.messages {
            ws.flush().await.expect("fastwebsockets: flush");
        }
    }
    probe.finish();
    park_writing(probe, park).await;
}

// ---------------------------------------------------------------------------------------------
// One run.

/// A connected pair of loopback sockets (the accepted one first).
fn tcp_pair() -> (StdTcpStream, StdTcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let dialled = StdTcpStream::connect(l.local_addr().expect("addr")).expect("connect");
    let (accepted, _) = l.accept().expect("accept");
    for s in [&accepted, &dialled] {
        s.set_nodelay(true).expect("nodelay");
        s.set_nonblocking(true).expect("nonblocking");
    }
    (accepted, dialled)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

#[derive(Debug, Clone, Copy)]
struct Outcome {
    mbps: f64,
    reader: Side,
    writer: Side,
}

fn run(c: Contender, plan: &Plan) -> Outcome {
    let (accepted, dialled) = tcp_pair();
    // The server end is the accepted socket.
    let (writer_tcp, reader_tcp) = match plan.writer_role {
        Role::Server => (accepted, dialled),
        Role::Client => (dialled, accepted),
    };
    let start = Arc::new(Barrier::new(2));
    let (idle_tx, idle_rx) = mpsc::channel();
    let (stop_r_tx, stop_r) = oneshot::channel();
    let (stop_w_tx, stop_w) = oneshot::channel();

    let reader = {
        let plan = plan.clone();
        let start = start.clone();
        let park = Park {
            idle: idle_tx.clone(),
            stop: stop_r,
        };
        std::thread::spawn(move || {
            let rt = runtime();
            rt.block_on(async move {
                let tcp = Io(TcpStream::from_std(reader_tcp).expect("register"));
                start.wait();
                let mut probe = Probe::begin();
                match c {
                    Contender::Ours => read_ours(tcp, &plan, &mut probe, park).await,
                    Contender::Tungstenite => read_tungstenite(tcp, &plan, &mut probe, park).await,
                    Contender::Fast | Contender::FastBuffered => {
                        read_fast(tcp, &plan, &mut probe, park).await
                    }
                }
                probe.side
            })
        })
    };
    let writer = {
        let plan = plan.clone();
        let park = Park {
            idle: idle_tx,
            stop: stop_w,
        };
        std::thread::spawn(move || {
            let rt = runtime();
            rt.block_on(async move {
                let tcp = Io(TcpStream::from_std(writer_tcp).expect("register"));
                start.wait();
                let mut probe = Probe::begin();
                match c {
                    Contender::Ours => write_ours(tcp, &plan, &mut probe, park).await,
                    Contender::Tungstenite => write_tungstenite(tcp, &plan, &mut probe, park).await,
                    Contender::Fast => write_fast(tcp, &plan, &mut probe, park).await,
                    Contender::FastBuffered => {
                        let io = BufWriter::with_capacity(WRITE_BATCH_BYTES, tcp);
                        write_fast(io, &plan, &mut probe, park).await
                    }
                }
                probe.side
            })
        })
    };
    // Both sides idle (a side that panicked drops its sender: the join below reports it).
    for _ in 0..2 {
        if idle_rx.recv().is_err() {
            break;
        }
    }
    // The reader first: the writer's end stays open until the reader is done with its read.
    let _ = stop_r_tx.send(());
    let reader = reader.join().expect("the reader thread panicked");
    let _ = stop_w_tx.send(());
    let writer = writer.join().expect("the writer thread panicked");
    let took = reader
        .ended
        .zip(writer.began)
        .map(|(end, begin)| end.duration_since(begin).as_secs_f64())
        .unwrap_or(f64::NAN);
    Outcome {
        mbps: plan.size as f64 * plan.messages as f64 / 1e6 / took,
        reader,
        writer,
    }
}

// ---------------------------------------------------------------------------------------------

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

fn kib(b: isize) -> f64 {
    b as f64 / 1024.0
}

/// The median of `v` (the lower middle of an even count) and its range.
fn spread(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[(v.len() - 1) / 2], v[0], v[v.len() - 1])
}

fn main() {
    // `cargo bench` passes `--bench`; nothing here takes arguments.
    let large = env_u64("WS_BENCH_BYTES", 1 << 30);
    let small = env_u64("WS_BENCH_SMALL_BYTES", 256 << 20);
    let rounds = env_u64("WS_BENCH_ROUNDS", 3).max(1) as usize;
    let load_before = loadavg();
    println!("ws_codec_rounds {rounds}");
    println!("ws_codec_loadavg_before {}", load_before.replace(' ', "/"));
    let mut table = Vec::new();
    for (case, size, bytes) in [("large", MAX_FRAME_BYTES, large), ("small", 1024, small)] {
        let payloads = payloads(size);
        for (dir, writer_role) in [("s2c", Role::Server), ("c2s", Role::Client)] {
            let plan = Plan {
                size,
                messages: (bytes / size as u64).max(1),
                writer_role,
                payloads: payloads.clone(),
            };
            let gb = plan.size as f64 * plan.messages as f64 / 1e9;
            // outcomes[contender][round]: the contenders take turns within each round, so a
            // change of the machine's load falls on all of them alike.
            let mut outcomes: Vec<Vec<Outcome>> = vec![Vec::new(); Contender::ALL.len()];
            for _ in 0..rounds {
                for (k, c) in Contender::ALL.into_iter().enumerate() {
                    outcomes[k].push(run(c, &plan));
                }
            }
            let ours = &outcomes[0];
            for (k, c) in Contender::ALL.into_iter().enumerate() {
                let os = &outcomes[k];
                let per = |f: &dyn Fn(&Outcome) -> f64| spread(os.iter().map(f).collect());
                let mbps = per(&|o| o.mbps);
                let rcpu = per(&|o| o.reader.cpu / gb);
                let wcpu = per(&|o| o.writer.cpu / gb);
                let both = per(&|o| (o.reader.cpu + o.writer.cpu) / gb);
                let ruser = per(&|o| o.reader.user / gb);
                let wuser = per(&|o| o.writer.user / gb);
                // Ratios round by round (the same minutes), then their median.
                let vs = |f: &dyn Fn(&Outcome) -> f64| {
                    spread(os.iter().zip(ours).map(|(o, b)| f(o) / f(b)).collect()).0
                };
                let r_vs = vs(&|o| o.reader.cpu);
                let w_vs = vs(&|o| o.writer.cpu);
                let both_vs = vs(&|o| o.reader.cpu + o.writer.cpu);
                let mem =
                    |f: &dyn Fn(&Outcome) -> isize| os.iter().map(f).max().map(kib).unwrap_or(0.0);
                let (rpeak, wpeak) = (mem(&|o| o.reader.peak), mem(&|o| o.writer.peak));
                let (ridle, widle) = (mem(&|o| o.reader.idle), mem(&|o| o.writer.idle));
                let per_call = |f: &dyn Fn(&Outcome) -> &Side| {
                    spread(
                        os.iter()
                            .map(|o| f(o).bytes as f64 / f(o).calls.max(1) as f64 / 1024.0)
                            .collect(),
                    )
                    .0
                };
                let (rcall, wcall) = (per_call(&|o| &o.reader), per_call(&|o| &o.writer));
                let key = format!("ws_{}_{case}_{dir}", c.name());
                println!("{key}_MBps {:.1}", mbps.0);
                println!("{key}_reader_cpu_s_per_GB {:.3}", rcpu.0);
                println!("{key}_reader_user_cpu_s_per_GB {:.3}", ruser.0);
                println!("{key}_writer_cpu_s_per_GB {:.3}", wcpu.0);
                println!("{key}_writer_user_cpu_s_per_GB {:.3}", wuser.0);
                println!("{key}_both_cpu_s_per_GB {:.3}", both.0);
                println!("{key}_reader_KiB_per_read {rcall:.1}");
                println!("{key}_writer_KiB_per_write {wcall:.1}");
                println!("{key}_reader_peak_KiB {rpeak:.1}");
                println!("{key}_writer_peak_KiB {wpeak:.1}");
                println!("{key}_reader_idle_KiB {ridle:.1}");
                println!("{key}_writer_idle_KiB {widle:.1}");
                if c != Contender::Ours {
                    println!("{key}_reader_cpu_vs_ours {r_vs:.2}");
                    println!("{key}_writer_cpu_vs_ours {w_vs:.2}");
                    println!("{key}_both_cpu_vs_ours {both_vs:.2}");
                }
                let range = |t: (f64, f64, f64)| format!("{:.3} ({:.2}–{:.2})", t.0, t.1, t.2);
                table.push(format!(
                    "| {} | {case} {dir} | {:.0} | {} | {:.3} | {} | {:.3} | {} | {r_vs:.2} / {w_vs:.2} / {both_vs:.2} | {rcall:.1} / {wcall:.1} | {rpeak:.0} / {wpeak:.0} | {ridle:.1} / {widle:.1} |",
                    c.name(),
                    mbps.0,
                    range(rcpu),
                    ruser.0,
                    range(wcpu),
                    wuser.0,
                    range(both),
                ));
            }
        }
    }
    let load_after = loadavg();
    println!("ws_codec_loadavg_after {}", load_after.replace(' ', "/"));
    eprintln!(
        "{rounds} round(s), medians (range); load average before {load_before}, after {load_after}"
    );
    eprintln!(
        "| codec | case | MB/s | reader CPU-s/GB | reader user | writer CPU-s/GB | writer user | both | CPU vs ours: reader / writer / both | KiB per read / write | peak KiB: reader / writer | idle KiB: reader / writer |"
    );
    eprintln!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for row in table {
        eprintln!("{row}");
    }
}
