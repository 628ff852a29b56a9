//! The tasks that move a child's output into its event log and turn its exit into the exit
//! notice: one pump per output stream and one supervisor per process.
//!
//! The pump stops reading while the log has no room (backpressure: the child blocks in
//! `write()`), tells the drain state machine how long it was blocked, and stops at the drain
//! deadline. The supervisor reaps the child (through its `DirectChild`, the only reap path),
//! enforces `timeoutMs`, waits for the pumps, and appends the exit notice last. Neither ever
//! writes to a transport.

use std::os::unix::process::ExitStatusExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::AsyncReadExt;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::containment::SessionScope;
use super::event_log::LogLimits;
use super::managed_process::{ManagedProcess, ProcessOptions};
use super::output_drain::StreamEnd;
use super::signals::signal_name;
use super::spawn::{spawn_into, OutputReader, SpawnSpec};
use crate::config::MAX_CHUNK_BYTES;
use crate::metrics::Metrics;
use crate::rpc::messages::{ExitInfo, StreamName};

/// Spawn a child into the session's `scope` and start its pumps and supervisor.
#[allow(clippy::too_many_arguments)]
pub fn start_process(
    id: String,
    spec: &SpawnSpec,
    opts: ProcessOptions,
    limits: LogLimits,
    acks: bool,
    metrics: Arc<Metrics>,
    scope: &Arc<SessionScope>,
) -> std::io::Result<Arc<ManagedProcess>> {
    let spawned = spawn_into(spec, Some(scope))?;
    let streams = spawned.outputs.len();
    let proc = Arc::new(ManagedProcess::new(
        id,
        spawned.pid,
        spec.argv.clone(),
        spec.tty.is_some(),
        opts,
        limits,
        acks,
        streams,
        spawned.stdin,
        spawned.pty,
        metrics,
        spawned.direct,
        scope.clone(),
    ));
    let span = tracing::info_span!("process", id = %proc.id, pid = proc.pid);
    let pumps: Vec<JoinHandle<(usize, StreamEnd)>> = spawned
        .outputs
        .into_iter()
        .enumerate()
        .map(|(i, (name, reader))| {
            let p = proc.clone();
            tokio::spawn(tracing::Instrument::instrument(
                async move { (i, pump(p, name, reader).await) },
                span.clone(),
            ))
        })
        .collect();
    tokio::spawn(tracing::Instrument::instrument(
        supervise(proc.clone(), spawned.child, pumps),
        span,
    ));
    Ok(proc)
}

/// While a pump is blocked, its blocked time is added to the metrics at least this often, so a
/// client that never acknowledges shows up in `execrelay_delivery_blocked_seconds_total`
/// before it lets go.
pub const BLOCKED_METRIC_INTERVAL: Duration = Duration::from_secs(1);

/// Wait until the log has room, recording blocked time with the drain clock (and in the
/// metrics). Returns false when the process was abandoned.
async fn wait_for_room(p: &ManagedProcess) -> bool {
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
    loop {
        let notified = p.changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        {
            let mut inner = p.inner();
            if inner.log.has_room() {
                if let Some(mut counted) = blocked {
                    let now = count(&mut counted);
                    inner.drain.block_end(now.into_std());
                    drop(inner);
                    // The deadline moved: wake the other pump so it re-reads it.
                    p.changed.notify_waiters();
                }
                return true;
            }
            if blocked.is_none() {
                let now = Instant::now();
                inner.drain.block_begin(now.into_std());
                blocked = Some(now);
            }
        }
        tokio::select! {
            _ = &mut notified => {}
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

async fn pump(p: Arc<ManagedProcess>, stream: StreamName, mut reader: OutputReader) -> StreamEnd {
    let cap = p.opts.output_cap;
    let mut delivered: u64 = 0;
    let mut capped = cap == Some(0);
    let mut buf = vec![0u8; MAX_CHUNK_BYTES];
    loop {
        // Once capped, bytes are discarded: never wait for the client then.
        if !capped && !wait_for_room(&p).await {
            return StreamEnd::Cut { capped };
        }
        let notified = p.changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let (deadline, exited) = {
            let inner = p.inner();
            (inner.drain.deadline(), inner.drain.has_exited())
        };
        if let Some(d) = deadline {
            if Instant::now().into_std() >= d {
                return StreamEnd::Cut { capped };
            }
        }
        let sleep_until = deadline
            .map(Instant::from_std)
            .unwrap_or_else(|| Instant::now() + std::time::Duration::from_secs(86_400));
        tokio::select! {
            biased;
            r = reader.read(&mut buf) => match r {
                Ok(0) => return StreamEnd::Eof,
                Ok(n) => {
                    p.metrics.output_bytes.inc_by(n as u64);
                    let chunk = Bytes::copy_from_slice(&buf[..n]);
                    {
                        let mut inner = p.inner();
                        match stream {
                            StreamName::Stderr => inner.stderr_bytes += n as u64,
                            _ => inner.stdout_bytes += n as u64,
                        }
                        let keep = match cap {
                            Some(cap) => (cap - delivered).min(n as u64) as usize,
                            None => n,
                        };
                        if keep < n {
                            inner.dropped_bytes += (n - keep) as u64;
                        }
                        if keep > 0 {
                            inner.log.append_output(stream, chunk.slice(..keep));
                            delivered += keep as u64;
                        }
                        if cap.is_some_and(|c| delivered >= c) {
                            capped = true;
                        }
                    }
                    p.notify_delivery();
                }
                Err(e) => {
                    tracing::debug!(error = %e, stream = stream.as_str(), "output read failed");
                    return StreamEnd::Eof;
                }
            },
            _ = &mut notified => {}
            _ = p.exited.cancelled(), if !exited => {}
            _ = tokio::time::sleep_until(sleep_until), if deadline.is_some() => {}
            _ = p.abandoned.cancelled() => return StreamEnd::Cut { capped },
        }
    }
}

async fn supervise(
    p: Arc<ManagedProcess>,
    mut child: tokio::process::Child,
    pumps: Vec<JoinHandle<(usize, StreamEnd)>>,
) {
    let timeout = p.opts.timeout;
    let status = {
        // The reap goes through the direct child's gate: no group signal can follow it.
        let wait = p.direct.wait(&mut child);
        tokio::pin!(wait);
        match timeout {
            Some(t) => {
                tokio::select! {
                    s = &mut wait => s,
                    _ = tokio::time::sleep(t) => {
                        p.mark_timed_out();
                        tracing::info!("timeout reached; terminating");
                        p.terminate(None).await;
                        wait.await
                    }
                }
            }
            None => wait.await,
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

    for h in pumps {
        if let Ok((i, end)) = h.await {
            p.inner().drain.stream_ended(i, end);
        }
    }
    {
        let mut inner = p.inner();
        let info = ExitInfo {
            exit_code,
            signal,
            timed_out: p.timed_out.load(Ordering::SeqCst),
            output_drain_timed_out: inner.drain.timed_out(),
            stdout_bytes: inner.stdout_bytes,
            stderr_bytes: inner.stderr_bytes,
            dropped_bytes: inner.dropped_bytes,
            duration_ms: p.started.elapsed().as_millis() as u64,
        };
        inner.log.append_exit(info.clone());
        inner.exit = Some(info);
    }
    p.finished.cancel();
    p.notify_delivery();
    tracing::info!("exit notice ready");
    if p.opts.kill_group_on_exit {
        // The leader is reaped: what is left of its group is reached through the scope.
        p.terminate(None).await;
    }
}
