//! Coalescing of pipe reads (`output_pump.rs`, `wait_for_writer`): while the connection's
//! writer still has a process's earlier events to write, its pump leaves a pipe that is less
//! than half full to fill, and reads it in one chunk once the writer caught up; a detach, the
//! child's exit, or a half-full pipe make it read at once.
//!
//! Driven through the library without a connection: the test is the writer (it holds the
//! process's delivery and marks events written by hand), and the child waits on FIFOs the
//! test opens, so every step is ordered by the kernel, not by time.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use execrelay::metrics::Metrics;
use execrelay::process::containment::{BackendChoice, Containment, ContainmentConfig};
use execrelay::process::event_log::{EventBody, LogLimits};
use execrelay::process::output_pump::start_process;
use execrelay::process::spawn::SpawnSpec;
use execrelay::process::{ManagedProcess, OutputBudget, ProcessOptions, ReadySet, WriteStatus};
use execrelay::rpc::messages::OutputCapKeep;
use tokio_util::sync::CancellationToken;

/// Hang guard for a long poll that must end (never a synchronisation).
const HANG_GUARD: Duration = Duration::from_secs(60);

/// The child: writes `a`, waits for the test (a line on its stdin), runs `then`, says so
/// (the FIFO `done`), waits for the test again, and exits 0. (Its go-ahead is its stdin, not
/// a FIFO the test opens: a FIFO's write end open in the test process is copied into any
/// child another test spawns meanwhile, until that child's `exec`, and a reader opening the
/// FIFO then would find a writer that was never ours, and its end of file.)
fn script(then: &str) -> String {
    format!("printf a; read _; {then}; echo done > \"$D/done\"; read _; exit 0")
}

struct Run {
    dir: PathBuf,
    p: Arc<ManagedProcess>,
    ready: Arc<ReadySet>,
    _containment: Containment,
}

async fn start(tag: &str, then: &str) -> Run {
    let dir = std::env::temp_dir().join(format!("execrelay-coalesce-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    nix::unistd::mkfifo(&dir.join("done"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    let containment = Containment::new(&ContainmentConfig {
        backend: BackendChoice::None,
        cgroup_name: format!("execrelay-test-coalesce-{tag}"),
        session_pids_max: None,
    })
    .expect("containment without cgroups always starts");
    let scope = containment.open_scope().expect("scope");
    let spec = SpawnSpec {
        env: vec![("D".into(), Some(dir.display().to_string()))],
        pipe_stdin: true,
        ..SpawnSpec::command(&["sh", "-c", &script(then)])
    };
    let opts = ProcessOptions {
        timeout: None,
        output_cap: None,
        output_cap_keep: OutputCapKeep::Head,
        drain_timeout: Duration::from_secs(2),
        kill_grace: Duration::from_secs(2),
        kill_group_on_exit: false,
    };
    let limits = LogLimits {
        retained_bytes: 4 << 20,
        fault_release_past_limit: false,
    };
    let (p, supervisor) = start_process(
        "c".into(),
        &spec,
        opts,
        limits,
        false,
        Arc::new(Metrics::new()),
        OutputBudget::unlimited(),
        &scope,
    )
    .expect("start");
    tokio::spawn(supervisor);
    let ready = Arc::new(ReadySet::default());
    p.set_delivery(Some(ready.clone()));
    // The first event, `a`, which nobody writes: from here the writer is behind.
    let first = events_after(&p, 0).await;
    assert_eq!(stdout_of(&first), [Bytes::from_static(b"a")]);
    Run {
        dir,
        p,
        ready,
        _containment: containment,
    }
}

/// Run a blocking FIFO open on a thread of its own: a test that fails while one is blocked
/// (the child gone) then reports its failure, where the runtime's blocking pool would wait
/// for the open for ever when the runtime is dropped.
fn off_runtime<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> tokio::sync::oneshot::Receiver<T> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx
}

/// Let the child go on past its next `read _` (a line on its stdin).
async fn go(run: &Run) {
    assert_eq!(run.p.write(b"\n", None).await, WriteStatus::Accepted);
}

/// Wait until the child said `done`: everything it wrote before is in its pipe (or read).
async fn done(dir: &Path) {
    let done = dir.join("done");
    let said = off_runtime(move || std::fs::read(done));
    let said = tokio::time::timeout(HANG_GUARD, said)
        .await
        .expect("the child says `done` (hang guard)")
        .unwrap()
        .unwrap();
    assert_eq!(said, b"done\n");
}

/// The events after `seq`, waiting (long poll) for at least one.
async fn events_after(p: &ManagedProcess, seq: u64) -> Vec<EventBody> {
    let r = p
        .read(seq, 1 << 20, HANG_GUARD, false, &CancellationToken::new())
        .await
        .expect("read");
    assert!(
        !r.events.is_empty(),
        "no event after seq {seq} within {HANG_GUARD:?}"
    );
    r.events.into_iter().map(|e| e.body).collect()
}

/// The events after `seq` now, without waiting.
async fn events_now(p: &ManagedProcess, seq: u64) -> Vec<EventBody> {
    let r = p
        .read(
            seq,
            1 << 20,
            Duration::ZERO,
            false,
            &CancellationToken::new(),
        )
        .await
        .expect("read");
    r.events.into_iter().map(|e| e.body).collect()
}

fn stdout_of(events: &[EventBody]) -> Vec<Bytes> {
    events
        .iter()
        .filter_map(|e| match e {
            EventBody::Output { chunk, .. } => Some(chunk.clone()),
            _ => None,
        })
        .collect()
}

/// Ten writes of 100 bytes each.
const TEN_SMALL_WRITES: &str = "i=0; while [ $i -lt 10 ]; do printf '%0100d' 0; i=$((i+1)); done";

async fn finish(run: Run) {
    go(&run).await;
    tokio::time::timeout(HANG_GUARD, run.p.wait_finished())
        .await
        .expect("the exit notice (hang guard)");
    let _ = std::fs::remove_dir_all(&run.dir);
}

/// Ten small writes while the writer owes the first event stay in the pipe, and come out as
/// one chunk of 1,000 bytes once that event is written: not ten chunks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_writes_wait_for_the_writer_and_come_out_as_one_chunk() {
    let run = start("one-chunk", TEN_SMALL_WRITES).await;
    go(&run).await;
    done(&run.dir).await;
    assert!(
        events_now(&run.p, 1).await.is_empty(),
        "nothing read while the writer owes event 1 and the pipe holds 1,000 bytes"
    );
    assert!(
        !run.p.mark_written_by(&run.ready, 1),
        "event 1 was the only one"
    );
    let next = events_after(&run.p, 1).await;
    assert_eq!(stdout_of(&next), [Bytes::from(vec![b'0'; 1000])]);
    finish(run).await;
}

/// A detached process reads ahead into its retention at once: the pump waiting for a writer
/// that is gone must not hold its bytes in the pipe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detach_makes_the_pump_read_at_once() {
    let run = start("detach", TEN_SMALL_WRITES).await;
    go(&run).await;
    done(&run.dir).await;
    run.p.set_delivery(None);
    let next = events_after(&run.p, 1).await;
    assert_eq!(stdout_of(&next), [Bytes::from(vec![b'0'; 1000])]);
    assert_eq!(run.p.stats().written_through, 0, "nothing was written");
    finish(run).await;
}

/// A pipe found half full is read though the writer still owes event 1: a child writing fast
/// is read ahead as before (here one write of 40,000 bytes into a 64 KiB pipe).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_full_pipe_is_read_though_the_writer_is_behind() {
    let run = start("half-full", "dd if=/dev/zero bs=40000 count=1 status=none").await;
    go(&run).await;
    done(&run.dir).await;
    let next = events_after(&run.p, 1).await;
    assert_eq!(stdout_of(&next), [Bytes::from(vec![0u8; 40000])]);
    assert_eq!(
        run.p.stats().written_through,
        0,
        "event 1 is still unwritten"
    );
    finish(run).await;
}

/// The child's exit ends the wait: what it left in the pipe is read before the exit notice
/// though nobody writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exit_makes_the_pump_read_at_once() {
    let run = start("exit", TEN_SMALL_WRITES).await;
    go(&run).await;
    done(&run.dir).await;
    assert!(events_now(&run.p, 1).await.is_empty());
    go(&run).await;
    tokio::time::timeout(HANG_GUARD, run.p.wait_finished())
        .await
        .expect("the exit notice (hang guard)");
    let rest = events_now(&run.p, 1).await;
    assert_eq!(stdout_of(&rest), [Bytes::from(vec![b'0'; 1000])]);
    match rest.last() {
        Some(EventBody::Exited(info)) => {
            assert_eq!(info.exit_code, Some(0), "{info:?}");
            assert!(!info.output_drain_timed_out, "{info:?}");
            assert_eq!(info.stdout_bytes, 1001, "{info:?}");
        }
        other => panic!("the exit notice comes last: {other:?}"),
    }
    let _ = std::fs::remove_dir_all(&run.dir);
}
