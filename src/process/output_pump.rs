//! The task that moves a child's output into its event log and turns its exit into the exit
//! notice: one pump per output stream, run inside the process's one task by its supervisor.
//!
//! The pump reads a chunk, then appends it once its log admits it (its retention, and the
//! server-wide output budget of `output_budget.rs`); while it waits it reads nothing more
//! (backpressure: the child blocks in `write()`), tells the drain state machine how long it was
//! blocked, and stops waiting at the drain deadline. What is readable then it still takes (up
//! to `DRAIN_DEADLINE_READ_BYTES`, without waiting), so that a pump the runtime runs late
//! loses nothing the child wrote. The supervisor reaps the child (through its `DirectChild`,
//! the only reap path), enforces `timeoutMs`, waits for the pumps, and appends the exit notice
//! last. Neither ever writes to a transport.

use std::os::unix::process::ExitStatusExt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt;
use tokio::time::Instant;

use super::containment::SessionScope;
use super::event_log::LogLimits;
use super::managed_process::{exit_reason, ManagedProcess, ProcessOptions};
use super::output_budget::{Blocked, OutputBudget};
use super::output_drain::StreamEnd;
use super::output_source::{Chunk, Ready, Source, FIRST_READ_BYTES};
use super::signals::signal_name;
use super::spawn::{spawn_into, ChildProcess, OutputReader, SpawnSpec};
use super::start_error::StartError;
use super::tail_ring::TailRing;
use crate::config::{DRAIN_DEADLINE_READ_BYTES, PUMP_CHUNK_BYTES};
use crate::metrics::Metrics;
use crate::rpc::messages::{ExitInfo, ExitReason, OutputCapKeep, StreamName};

/// A started process's supervisor (its pumps, its exit, its timeout), for the caller to run
/// in the process's one task, followed there by whatever must wait for the process's end:
/// one task per process, so a start makes one task runnable, not two (on a multi-threaded
/// runtime each further task made runnable at once wakes an idle worker thread).
pub type Supervisor = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Spawn a child into the session's `scope`; its pumps and supervisor are the returned
/// [`Supervisor`], which the caller must run (in a task) whatever else happens.
#[allow(clippy::too_many_arguments)]
pub fn start_process(
    id: String,
    spec: &SpawnSpec,
    opts: ProcessOptions,
    limits: LogLimits,
    acks: bool,
    metrics: Arc<Metrics>,
    budget: Arc<OutputBudget>,
    scope: &Arc<SessionScope>,
) -> Result<(Arc<ManagedProcess>, Supervisor), StartError> {
    let spawned = spawn_into(spec, Some(scope))?;
    let streams = spawned.outputs.len();
    let proc = Arc::new(ManagedProcess::new(
        id,
        spawned.pid,
        Arc::from(spec.argv.as_slice()),
        spec.tty.is_some(),
        opts,
        limits,
        acks,
        streams,
        spawned.stdin,
        spawned.pty,
        metrics,
        budget,
        spawned.direct,
        scope.clone(),
    ));
    let span = tracing::info_span!("process", id = %proc.id, pid = proc.pid);
    let pumps: Vec<_> = spawned
        .outputs
        .into_iter()
        .enumerate()
        .map(|(i, (name, reader))| {
            let p = proc.clone();
            async move { (i, pump(p, name, reader).await) }
        })
        .collect();
    let supervisor = Box::pin(tracing::Instrument::instrument(
        supervise(proc.clone(), spawned.child, pumps),
        span,
    ));
    Ok((proc, supervisor))
}

/// While a pump is blocked, its blocked time is added to the metrics at least this often, so a
/// client that never acknowledges shows up in `execrelay_delivery_blocked_seconds_total`
/// before it lets go.
pub const BLOCKED_METRIC_INTERVAL: Duration = Duration::from_secs(1);

/// What a pump waits for.
enum Want {
    /// To append this chunk.
    Append(StreamName, Bytes),
    /// Room for a chunk of this many bytes, before reading it.
    Room(usize),
}

impl Want {
    /// Try once, under the process's lock: appended (or room found), or what blocks it.
    fn attempt(self, p: &ManagedProcess) -> Result<(), (Want, Blocked)> {
        let mut inner = p.inner();
        let r = match self {
            Want::Append(stream, chunk) => inner
                .log
                .try_append_output(stream, chunk)
                .map(|_| ())
                .map_err(|(chunk, why)| (Want::Append(stream, chunk), why)),
            Want::Room(len) => inner
                .log
                .would_admit_output(len)
                .map_err(|why| (Want::Room(len), why)),
        };
        // What it waits for, for the stall watchdog (meaningful while a pump is blocked).
        inner.waiting_for = r.as_ref().err().map(|(_, why)| *why);
        r
    }
}

/// Wait until `want` is admitted (the chunk appended, or room for it found), recording the
/// time blocked with the drain clock (and in the metrics). Returns false when the process was
/// abandoned (a chunk in hand is dropped with the session).
///
/// It waits on its own process (retention or fair share: its events must be written first)
/// or, when the budget itself is spent, also in the budget's queue of waiters, registered
/// before it checks again so that no release is missed. A wake-up from that queue that it
/// does not use is passed on; one it used is passed on too, for the room that may be left.
async fn wait_admitted(p: &ManagedProcess, mut want: Want) -> bool {
    // While blocked: up to when the blocked time is already counted in the metrics.
    let mut blocked: Option<Instant> = None;
    let count = |counted: &mut Instant| {
        let now = Instant::now();
        p.metrics
            .delivery_blocked_seconds
            .inc_by((now - *counted).as_secs_f64());
        *counted = now;
        now
    };
    let mut woken_for_room = false;
    loop {
        let own = p.changed.notified();
        tokio::pin!(own);
        own.as_mut().enable();
        let room = p.budget.room_released();
        tokio::pin!(room);
        let mut waiting_for_room = None;
        let mut outcome = want.attempt(p);
        if let Err((back, Blocked::Budget)) = outcome {
            // Register, then look again: a release in between is not lost.
            room.as_mut().enable();
            waiting_for_room = Some(p.budget.begin_wait());
            outcome = back.attempt(p);
        }
        match outcome {
            Ok(()) => {
                if woken_for_room || waiting_for_room.is_some() {
                    drop(waiting_for_room);
                    p.budget.wake_one();
                }
                if let Some(mut counted) = blocked {
                    let now = count(&mut counted);
                    p.inner().drain.block_end(now.into_std());
                    // The deadline moved: wake the other pump so it re-reads it.
                    p.changed.notify_waiters();
                }
                return true;
            }
            Err((back, why)) => {
                want = back;
                if woken_for_room && why != Blocked::Budget {
                    // Not waiting for the budget any more: let the next waiter have the room.
                    p.budget.wake_one();
                }
            }
        }
        woken_for_room = false;
        if blocked.is_none() {
            let now = Instant::now();
            p.inner().drain.block_begin(now.into_std());
            blocked = Some(now);
        }
        tokio::select! {
            _ = &mut own => {}
            _ = &mut room, if waiting_for_room.is_some() => woken_for_room = true,
            _ = tokio::time::sleep(BLOCKED_METRIC_INTERVAL) => {
                if let Some(counted) = blocked.as_mut() {
                    count(counted);
                }
            }
            _ = p.abandoned.cancelled() => {
                if let Some(counted) = blocked.as_mut() {
                    count(counted);
                }
                return false;
            }
        }
    }
}

/// What a cap does with a stream: how many bytes go out live, and the ring of the kept tail.
struct CapPlan {
    /// Bytes delivered live at most (`None`: no cap).
    head: Option<u64>,
    /// With `headAndTail`: the last bytes past the head, sent when the stream ends.
    tail: Option<TailRing>,
}

impl CapPlan {
    /// `headAndTail` delivers the first half of the cap live and keeps the last half.
    fn of(opts: &ProcessOptions) -> CapPlan {
        match (opts.output_cap, opts.output_cap_keep) {
            (None, _) => CapPlan {
                head: None,
                tail: None,
            },
            (Some(cap), OutputCapKeep::Head) => CapPlan {
                head: Some(cap),
                tail: None,
            },
            (Some(cap), OutputCapKeep::HeadAndTail) => {
                let head = cap / 2;
                // The handler refused a tail above `max_output_tail_bytes`, so it fits.
                let tail = usize::try_from(cap - head).unwrap_or(usize::MAX);
                CapPlan {
                    head: Some(head),
                    tail: Some(TailRing::new(tail)),
                }
            }
        }
    }
}

/// One stream's pump: the live part, then (`headAndTail`) the kept tail when the stream
/// ended, unless the session is gone.
/// Count a chunk read from `stream` and append what the cap keeps of it (the rest dropped, or
/// into the kept tail), waiting for its admission. `Some(capped)` once it is in, `None` when
/// the process was abandoned meanwhile.
async fn take_chunk(
    p: &Arc<ManagedProcess>,
    stream: StreamName,
    chunk: Bytes,
    plan: &mut CapPlan,
    delivered: &mut u64,
    cap: Option<u64>,
) -> Option<bool> {
    let n = chunk.len();
    p.metrics.output_bytes.inc_by(n as u64);
    let keep = {
        let mut inner = p.inner();
        match stream {
            StreamName::Stderr => inner.stderr_bytes += n as u64,
            _ => inner.stdout_bytes += n as u64,
        }
        let keep = match cap {
            Some(cap) => (cap - *delivered).min(n as u64) as usize,
            None => n,
        };
        // Past the head: dropped, or into the kept tail (whose omitted bytes are counted when
        // the stream ends).
        if keep < n && plan.tail.is_none() {
            inner.dropped_bytes += (n - keep) as u64;
        }
        keep
    };
    if keep < n {
        if let Some(ring) = plan.tail.as_mut() {
            ring.push(chunk.slice(keep..));
        }
    }
    // Once capped, bytes are discarded: never wait for the client then.
    if keep > 0 {
        let chunk = chunk.slice(..keep);
        if !wait_admitted(p, Want::Append(stream, chunk)).await {
            return None;
        }
        *delivered += keep as u64;
        p.notify_delivery();
    }
    Some(cap.is_some_and(|c| *delivered >= c))
}

/// The `late-pump` fault (debug builds): wait until the child exited and its drain deadline
/// passed before the first look at the stream.
async fn late_start(p: &ManagedProcess) {
    p.exited.cancelled().await;
    let deadline = p.inner().drain.deadline();
    if let Some(d) = deadline {
        tokio::time::sleep_until(Instant::from_std(d)).await;
    }
}

async fn pump(p: Arc<ManagedProcess>, stream: StreamName, reader: OutputReader) -> StreamEnd {
    let mut plan = CapPlan::of(&p.opts);
    let mut end = pump_live(&p, stream, reader, &mut plan).await;
    if let Some(ring) = plan.tail.take() {
        // Bytes left unread at the deadline would have been kept (the tail), not discarded:
        // a cut here is a drain timeout even past the head.
        if let StreamEnd::Cut { .. } = end {
            end = StreamEnd::Cut { capped: false };
        }
        let (omitted, kept) = ring.finish();
        if p.abandoned.is_cancelled() {
            return end;
        }
        if omitted > 0 {
            {
                let mut inner = p.inner();
                inner.dropped_bytes += omitted;
                inner.log.append_omitted(stream, omitted);
            }
            p.notify_delivery();
        }
        for chunk in kept {
            if !wait_admitted(&p, Want::Append(stream, chunk)).await {
                return end;
            }
            p.notify_delivery();
        }
    }
    end
}

async fn pump_live(
    p: &Arc<ManagedProcess>,
    stream: StreamName,
    reader: OutputReader,
    plan: &mut CapPlan,
) -> StreamEnd {
    let cap = plan.head;
    let mut delivered: u64 = 0;
    let mut capped = cap == Some(0);
    let mut first = [0u8; FIRST_READ_BYTES];
    if crate::faults::active(crate::faults::Fault::LatePump) {
        late_start(p).await;
    }
    let mut source = Source::new(reader);
    // What may still be read past the drain deadline.
    let mut after_deadline = DRAIN_DEADLINE_READ_BYTES;
    loop {
        let notified = p.changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let (deadline, exited) = {
            let inner = p.inner();
            (inner.drain.deadline(), inner.drain.has_exited())
        };
        if deadline.is_some_and(|d| Instant::now().into_std() >= d) {
            // The deadline ends the wait for more output, not the reading of what is there:
            // the child's last output may be in the pipe, unread only because this task was
            // not run in time (a loaded server). Take what is readable now, up to a bound,
            // and stop at the first wait.
            if after_deadline == 0 {
                return StreamEnd::Cut { capped };
            }
            let chunk = match source.read_now() {
                Ok(Chunk::Data(chunk)) => chunk,
                Ok(Chunk::Eof) => return StreamEnd::Eof,
                Ok(Chunk::Nothing) => return StreamEnd::Cut { capped },
                Err(e) => {
                    tracing::debug!(error = %e, stream = stream.as_str(), "output read failed");
                    return StreamEnd::Eof;
                }
            };
            after_deadline = after_deadline.saturating_sub(chunk.len());
            match take_chunk(p, stream, chunk, plan, &mut delivered, cap).await {
                Some(now_capped) => capped |= now_capped,
                None => return StreamEnd::Cut { capped },
            }
            continue;
        }
        let sleep_until = deadline
            .map(Instant::from_std)
            .unwrap_or_else(|| Instant::now() + std::time::Duration::from_secs(86_400));
        tokio::select! {
            biased;
            r = source.ready(&mut first) => {
                let chunk = match r {
                    Ok(Ready::Read(0)) => return StreamEnd::Eof,
                    Ok(Ready::Read(n)) if n < FIRST_READ_BYTES || capped => {
                        Bytes::copy_from_slice(&first[..n])
                    }
                    Ok(ready) => {
                        // Room for a whole chunk before reading one (once capped, bytes are
                        // discarded: never wait for the client then).
                        if !capped && !wait_admitted(p, Want::Room(PUMP_CHUNK_BYTES)).await {
                            return StreamEnd::Cut { capped };
                        }
                        // Let the other tasks (the connection's writer) run once while the
                        // child fills its pipe, so that a stream in bulk makes whole chunks
                        // rather than what arrived in the last microsecond (small chunks cost
                        // a message each, all the way to the client).
                        tokio::task::yield_now().await;
                        let first_read = match ready {
                            Ready::Read(n) => &first[..n],
                            Ready::Readable => &[][..],
                        };
                        match source.read_chunk(first_read) {
                            Ok(Chunk::Data(chunk)) => chunk,
                            Ok(Chunk::Eof) => return StreamEnd::Eof,
                            Ok(Chunk::Nothing) => continue,
                            Err(e) => {
                                tracing::debug!(
                                    error = %e,
                                    stream = stream.as_str(),
                                    "output read failed"
                                );
                                return StreamEnd::Eof;
                            }
                        }
                    }
                    Err(e) => {
                        tracing::debug!(
                            error = %e,
                            stream = stream.as_str(),
                            "output read failed"
                        );
                        return StreamEnd::Eof;
                    }
                };
                match take_chunk(p, stream, chunk, plan, &mut delivered, cap).await {
                    Some(now_capped) => capped |= now_capped,
                    None => return StreamEnd::Cut { capped },
                }
            }
            _ = &mut notified => {}
            _ = p.exited.cancelled(), if !exited => {}
            _ = tokio::time::sleep_until(sleep_until), if deadline.is_some() => {}
            _ = p.abandoned.cancelled() => return StreamEnd::Cut { capped },
        }
    }
}

/// A pump's outcome as the supervisor collects it: `Err` if the pump panicked (its stream is
/// then left open in the drain state, and the exit notice still follows).
type PumpOutcome = std::thread::Result<(usize, StreamEnd)>;

/// The process's one task: the reap, `timeoutMs`, the pumps, then the exit notice.
///
/// The pumps run inside this task (polled beside the wait), not as tasks of their own: when
/// a child exits, its pidfd and both pipes become ready at once, and three tasks woken
/// together meant three schedulings, a join-handle wake and, on a multi-threaded runtime,
/// idle workers unparked to steal them, all between the exit and its notice. One task
/// woken once does the same work. (A process's stdout and stderr then share a core; they
/// share the one connection writer anyway.) A pump that panics is caught here, as a pump
/// task's panic was by its join handle: the exit notice is never lost.
async fn supervise<F>(p: Arc<ManagedProcess>, mut child: ChildProcess, pumps: Vec<F>)
where
    F: std::future::Future<Output = (usize, StreamEnd)>,
{
    let pumps = futures_util::future::join_all(
        pumps
            .into_iter()
            .map(|f| std::panic::AssertUnwindSafe(f).catch_unwind()),
    );
    tokio::pin!(pumps);
    // The pumps' outcomes, if every stream ended before the child's exit was seen.
    let mut ended: Option<Vec<PumpOutcome>> = None;
    let timeout = p.opts.timeout;
    let status = {
        // The reap goes through the direct child's gate: no group signal can follow it.
        let wait = async {
            let wait = child.wait();
            tokio::pin!(wait);
            match timeout {
                Some(t) => {
                    tokio::select! {
                        s = &mut wait => s,
                        _ = tokio::time::sleep(t) => {
                            p.mark_ending(ExitReason::Timeout);
                            tracing::info!("timeout reached; terminating");
                            p.terminate(None).await;
                            wait.await
                        }
                    }
                }
                None => wait.await,
            }
        };
        tokio::pin!(wait);
        loop {
            tokio::select! {
                s = &mut wait => break s,
                e = &mut pumps, if ended.is_none() => ended = Some(e),
            }
        }
    };
    let (exit_code, signal) = match &status {
        Ok(s) => match (s.code(), s.signal()) {
            (Some(c), _) => (Some(c), None),
            (None, Some(sig)) => (None, Some(signal_name(sig))),
            (None, None) => (None, Some("SIGKILL".to_string())),
        },
        Err(e) => {
            tracing::warn!(error = %e, "waiting for the child failed");
            (None, Some("SIGKILL".to_string()))
        }
    };
    p.inner().drain.child_exited(Instant::now().into_std());
    p.exited.cancel();
    p.changed.notify_waiters();
    tracing::debug!(?exit_code, ?signal, "child exited; draining output");

    let ends = match ended {
        Some(ends) => ends,
        None => pumps.await,
    };
    for end in ends {
        match end {
            Ok((i, end)) => p.inner().drain.stream_ended(i, end),
            Err(_) => tracing::error!("an output pump panicked; its stream is cut"),
        }
    }
    // Read off the runtime's clock but not off its threads: one small cgroup file, once.
    let oom = match (p.end_cause(), signal.as_deref()) {
        (None, Some("SIGKILL")) => p.oom_killed_since_start(),
        _ => None,
    };
    let reason = exit_reason(p.end_cause(), signal.as_deref(), oom);
    {
        let mut inner = p.inner();
        let info = ExitInfo {
            exit_code,
            signal,
            reason,
            timed_out: reason == ExitReason::Timeout,
            output_drain_timed_out: inner.drain.timed_out(),
            stdout_bytes: inner.stdout_bytes,
            stderr_bytes: inner.stderr_bytes,
            dropped_bytes: inner.dropped_bytes,
            duration_ms: p.started.elapsed().as_millis() as u64,
        };
        if info.output_drain_timed_out {
            p.metrics.output_drain_timeouts.inc();
        }
        inner.log.append_exit(info.clone());
        inner.exit = Some(info);
    }
    p.finished.cancel();
    p.notify_delivery();
    tracing::info!(%reason, "exit notice ready");
    if p.opts.kill_group_on_exit {
        // The leader is reaped: what is left of its group is reached through the scope.
        p.terminate(None).await;
    }
}
