//! The application's grip on one started process: [`ProcessHandle`] owns its event stream,
//! [`ProcessController`] only controls it (signals, resizes, stdin, termination).
//!
//! # What this module owns
//!
//! - The control requests (`process/write`, `process/closeStdin`, `process/signal`,
//!   `process/resize`, `process/terminate`), built in one place: [`ProcessHandle`] delegates
//!   them to the [`ProcessController`] it carries.
//! - The `writeId` of [`ProcessHandle::write`], which makes a write safe to retry across
//!   reconnects.
//! - Ending the event stream when the handle is dropped.
//!
//! # What it must never do
//!
//! - Buffer, reorder or acknowledge events: that is `event_stream.rs`.
//! - Retry a request that is not safe to repeat: every request here goes through
//!   [`Client::call`], and a write carries its idempotency key.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::Notify;

use super::event_stream::SlotFlags;
use super::exclusive::{ExclusiveCounts, ExclusiveInFlight};
use super::write_retry::{retry_now, write_cost, WriteRetry};
use super::{Client, ClientError, ProcessEvent};
use crate::connection::message::{Call, Reply, WriteCall};
use crate::process::WriteStatus;
use crate::rpc::messages::{ProcessRef, ResizeParams, SignalParams, TermSize, TerminateParams};
use crate::sync::lock;

/// A started process.
pub struct ProcessHandle {
    /// Its id.
    pub id: String,
    /// Its pid on the server.
    pub pid: u32,
    /// Every control request goes through here, so the handle and its controllers send the
    /// same requests.
    control: ProcessController,
    /// The seq of the last event handed out.
    last_seq: u64,
    /// Its event slot's identity (the slot's `Notify`): a handle removes only its own slot.
    slot: Arc<Notify>,
}

impl ProcessHandle {
    /// A handle for the process `id` just started by `client`.
    pub(super) fn new(
        id: String,
        pid: u32,
        client: Client,
        flags: SlotFlags,
        slot: Arc<Notify>,
    ) -> Self {
        ProcessHandle {
            control: ProcessController {
                id: id.clone(),
                client,
                finished: flags.finished,
                exclusive_in_flight: flags.exclusive_in_flight,
                write_seq: Arc::default(),
            },
            id,
            pid,
            last_seq: 0,
            slot,
        }
    }

    /// A handle whose events after `seq` are the ones still to come (a resumed attach).
    pub(super) fn after(mut self, seq: u64) -> Self {
        self.last_seq = seq;
        self
    }

    /// The next event; `None` after the exit notice, or if the session was lost (see
    /// [`Client::lost_reason`]).
    pub async fn next_event(&mut self) -> Option<ProcessEvent> {
        let (seq, ev) = self.control.client.next_event_of(&self.id).await?;
        self.last_seq = seq;
        Some(ev)
    }

    /// The seq of the last event handed out by [`next_event`](Self::next_event) (0: none
    /// yet), e.g. to resume from there later (`execrelay attach --since-last`).
    pub fn consumed_seq(&self) -> u64 {
        self.last_seq
    }

    /// Write to stdin. Idempotent across reconnects (each write carries a `writeId`). A
    /// write the server refuses for a full limit is sent again with the same `writeId` where
    /// the server keeps a process's writes in order after a refusal, as a [`StdinWriter`]'s
    /// are (`ClientOptions::write_retry_for`); otherwise, or past that, the refusal is
    /// returned.
    ///
    /// [`StdinWriter`]: super::StdinWriter
    pub async fn write(&mut self, data: &[u8]) -> Result<String, ClientError> {
        let write_id = self.control.next_write_id("w");
        let mut retry = WriteRetry::new(self.control.client.shared.opts.write_retry_for);
        loop {
            match self.control.write(data, &write_id).await {
                Err(e) => {
                    // A write through `ProcessController::write` travels as JSON.
                    let cost = write_cost(data.len(), false);
                    let promised = self.control.client.retry_refused_writes();
                    match retry.after_refusal(&e, cost, promised, retry_now()) {
                        Some(pause) => tokio::time::sleep(pause).await,
                        None => return Err(e),
                    }
                }
                answered => return answered,
            }
        }
    }

    /// Close stdin.
    pub async fn close_stdin(&self) -> Result<(), ClientError> {
        self.control.close_stdin().await
    }

    /// Send a signal by name.
    pub async fn signal(&self, name: &str) -> Result<(), ClientError> {
        self.control.signal(name).await
    }

    /// Resize the PTY.
    pub async fn resize(&self, size: TermSize) -> Result<(), ClientError> {
        self.control.resize(size).await
    }

    /// Terminate (SIGTERM, then SIGKILL after `grace`).
    pub async fn terminate(&self, grace: Option<Duration>) -> Result<bool, ClientError> {
        self.control.terminate_after(grace).await
    }

    /// A cloneable controller for this process (signals, writes) usable while another task
    /// consumes events.
    pub fn controller(&self) -> ProcessController {
        self.control.clone()
    }
}

impl Drop for ProcessHandle {
    /// Stop buffering this process's events. Its output is no longer acknowledged, so with
    /// acks the server eventually holds the child back: terminate it if it should not run on.
    fn drop(&mut self) {
        // Only its own slot: after its exit the id may have been started again, and that
        // slot is another handle's.
        let mut procs = lock(&self.control.client.shared.procs);
        if procs
            .get(&self.id)
            .is_some_and(|s| Arc::ptr_eq(&s.notify, &self.slot))
        {
            procs.remove(&self.id);
        }
    }
}

/// Controls a process without owning its event stream. Once the process's exit notice has
/// been received, its requests are answered here without being sent (as the server answers
/// them for an exited process: nothing to signal, resize or close, `exited` to a write): the
/// server forgets a process once its exit is acknowledged, and would answer "unknown process".
#[derive(Clone)]
pub struct ProcessController {
    pub(super) id: String,
    pub(super) client: Client,
    finished: Arc<AtomicBool>,
    /// Its exclusive requests awaiting their answer (the silence watch leaves the process
    /// alone meanwhile: `event_stream.rs`).
    exclusive_in_flight: Arc<ExclusiveCounts>,
    /// The last `writeId` number taken, shared by every writer of this process, so that no
    /// two of its writes carry the same id (the server would take the second for a repeat of
    /// the first, and drop it).
    write_seq: Arc<AtomicU64>,
}

/// `-32001`, the server's "unknown process id".
pub(super) const UNKNOWN_PROCESS: i64 = -32001;

impl ProcessController {
    /// Count an exclusive request of this process in flight until the guard drops.
    pub(super) fn exclusive(&self) -> ExclusiveInFlight {
        ExclusiveInFlight::new(&self.exclusive_in_flight)
    }

    /// A `writeId` no other write of this process carries: `PREFIX-N`.
    pub(super) fn next_write_id(&self, prefix: &str) -> String {
        format!(
            "{prefix}-{}",
            self.write_seq.fetch_add(1, Ordering::Relaxed) + 1
        )
    }

    /// A control request about this process, sent again after a reconnect as every request
    /// safe to repeat is. `None` when a repeat finds the process unknown: the first attempt
    /// may well have been applied, the process exited and this client took its exit notice
    /// (so the server released it) before the answer could come back. The process existed
    /// (this controller comes from its start), so it has exited: the caller answers as the
    /// server does for an exited process, rather than fail a request that did its work.
    ///
    /// A server answers such a repeat as for an exited process itself while it remembers the
    /// id (`session::ended_ids`, the last 1,024 ended per session); this rule covers a repeat
    /// that arrives after that memory moved on (many processes of the session ending during
    /// one reconnect) and a server that does not remember ended ids at all.
    ///
    /// An `exclusive` request (a write, `closeStdin`, `resize`) is counted among the
    /// process's exclusive requests while each attempt is on the wire, by the connection,
    /// even if the caller drops this future first (`exclusive.rs`).
    async fn control(&self, call: Call, exclusive: bool) -> Result<Option<Reply>, ClientError> {
        let shared = &self.client.shared;
        let mut repeated = false;
        loop {
            let conn = self.client.connection().await?;
            let held = exclusive.then(|| self.exclusive());
            match conn.call_typed_held(call.clone(), held).await {
                Err(ClientError::ConnectionLost)
                    if shared.opts.reconnect && shared.target.can_reconnect() =>
                {
                    repeated = true;
                }
                Err(ClientError::Rpc {
                    code: UNKNOWN_PROCESS,
                    ..
                }) if repeated => return Ok(None),
                other => return other.map(Some),
            }
        }
    }

    /// Whether the process's exit notice was received.
    pub fn is_finished(&self) -> bool {
        self.finished.load(Ordering::Acquire)
    }

    /// Send a signal by name.
    pub async fn signal(&self, name: &str) -> Result<(), ClientError> {
        if self.is_finished() {
            return Ok(());
        }
        self.control(
            Call::Signal(SignalParams {
                process_id: self.id.clone(),
                signal: name.to_string(),
            }),
            false,
        )
        .await
        .map(|_| ())
    }

    /// Resize the PTY.
    pub async fn resize(&self, size: TermSize) -> Result<(), ClientError> {
        if self.is_finished() {
            return Ok(());
        }
        let _in_flight = self.exclusive();
        self.control(
            Call::Resize(ResizeParams {
                process_id: self.id.clone(),
                rows: size.rows,
                cols: size.cols,
            }),
            true,
        )
        .await
        .map(|_| ())
    }

    /// Write with an explicit idempotency key. A repeat after a reconnect that finds the
    /// process gone answers `exited`, as the server does for a write to an exited process.
    /// Not sent again on a refusal: a write refused for a limit (`-32004`) holds this
    /// process's later writes back (refused, `writeOrder`) until it is written again with the
    /// same `write_id` ([`ProcessHandle::write`] and [`StdinWriter`](super::StdinWriter) do
    /// that).
    pub async fn write(&self, data: &[u8], write_id: &str) -> Result<String, ClientError> {
        if self.is_finished() {
            return Ok("exited".into());
        }
        let _in_flight = self.exclusive();
        let r = self
            .control(
                Call::Write(WriteCall {
                    process_id: self.id.clone(),
                    data: Bytes::copy_from_slice(data),
                    write_id: Some(write_id.to_string()),
                    close_stdin: false,
                }),
                true,
            )
            .await?;
        match r {
            Some(Reply::Write(status)) => Ok(status.as_str().to_string()),
            None => Ok(WriteStatus::Exited.as_str().to_string()),
            Some(other) => Err(ClientError::Protocol(format!(
                "bad write result: {other:?}"
            ))),
        }
    }

    /// Close stdin.
    pub async fn close_stdin(&self) -> Result<(), ClientError> {
        if self.is_finished() {
            return Ok(());
        }
        let _in_flight = self.exclusive();
        self.control(
            Call::CloseStdin(ProcessRef {
                process_id: self.id.clone(),
            }),
            true,
        )
        .await
        .map(|_| ())
    }

    /// Terminate.
    pub async fn terminate(&self) -> Result<bool, ClientError> {
        self.terminate_after(None).await
    }

    /// Terminate: SIGTERM, then SIGKILL after `grace` (the server's default when `None`, for
    /// which `graceMs` is left out of the request).
    async fn terminate_after(&self, grace: Option<Duration>) -> Result<bool, ClientError> {
        if self.is_finished() {
            return Ok(false);
        }
        let r = self
            .control(
                Call::Terminate(TerminateParams {
                    process_id: self.id.clone(),
                    grace_ms: grace.map(|g| g.as_millis() as u64),
                }),
                false,
            )
            .await?;
        match r {
            Some(Reply::Terminate { running }) => Ok(running),
            None => Ok(false),
            Some(other) => Err(ClientError::Protocol(format!(
                "bad terminate result: {other:?}"
            ))),
        }
    }
}
