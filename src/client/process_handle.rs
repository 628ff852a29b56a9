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
//! - [`StdinWriter`]: stdin as a pipeline of `process/write` requests, several in flight
//!   (the server applies them in request order), each encoded by hand
//!   (`rpc/write_request.rs`); after a reconnect, every write not yet answered is sent again,
//!   in order, with its `writeId`, so none is lost or applied twice.
//! - Ending the event stream when the handle is dropped.
//!
//! # What it must never do
//!
//! - Buffer, reorder or acknowledge events: that is `event_stream.rs`.
//! - Retry a request that is not safe to repeat: every request here goes through
//!   [`Client::call`], and a write carries its idempotency key.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::Notify;

use super::rpc_connection::{PendingCall, RpcConnection};
use super::{Client, ClientError, ProcessEvent};
use crate::connection::message::{Call, Reply, WriteCall};
use crate::process::WriteStatus;
use crate::rpc::messages::{ProcessRef, ResizeParams, SignalParams, TermSize, TerminateParams};
use crate::sync::lock;

/// The most a [`StdinWriter`] puts in one `process/write`: large enough that the per-request
/// costs (a response, a task, a frame) vanish beside the bytes, small enough that a write
/// stays a fraction of `maxMessageBytes` once in base64.
pub const STDIN_WRITE_BYTES: usize = 256 * 1024;

/// Bytes of a write request besides its base64 chunk that a [`StdinWriter`] leaves room for
/// under the server's `maxMessageBytes` (the envelope, a process id of at most 256 bytes
/// escaped, the `writeId`).
const WRITE_REQUEST_SLACK: usize = 4096;

/// Writes a [`StdinWriter`] keeps in flight before it waits for the oldest answer: with
/// [`STDIN_WRITE_BYTES`] each, 2 MiB, enough to cover the round trip of a fast link (and what
/// a reconnect may have to send again).
pub const STDIN_WRITES_IN_FLIGHT: usize = 8;

/// The most a [`StdinWriter`] puts in one binary write (`protocol.md` §5.2, at most
/// `MAX_CHUNK_BYTES`): 512 bytes less, so that the write with its head (at most 524 bytes) and
/// its length prefix fits one Noise record, as the server's output chunks do.
pub const STDIN_BINARY_WRITE_BYTES: usize = crate::config::PUMP_CHUNK_BYTES;

/// Binary writes a [`StdinWriter`] keeps in flight: as many as the records of the largest
/// window a server grants (`MAX_NOISE_WINDOW_RECORDS`, 64; each write is one record), so that
/// the server's window, not this pipeline, sets the speed of an upload from far away. At most
/// 4 MiB held for sending again after a reconnect. With 32 (2 MiB), uploads at a 20 ms round
/// trip to a server granting 64 ran at half the window's speed.
pub const STDIN_BINARY_WRITES_IN_FLIGHT: usize = crate::config::MAX_NOISE_WINDOW_RECORDS as usize;

/// A started process.
pub struct ProcessHandle {
    /// Its id.
    pub id: String,
    /// Its pid on the server.
    pub pid: u32,
    /// Every control request goes through here, so the handle and its controllers send the
    /// same requests.
    control: ProcessController,
    write_seq: u64,
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
        finished: Arc<AtomicBool>,
        slot: Arc<Notify>,
    ) -> Self {
        ProcessHandle {
            control: ProcessController {
                id: id.clone(),
                client,
                finished,
            },
            id,
            pid,
            write_seq: 0,
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

    /// Write to stdin. Idempotent across reconnects (each write carries a `writeId`).
    pub async fn write(&mut self, data: &[u8]) -> Result<String, ClientError> {
        self.write_seq += 1;
        let write_id = format!("w-{}", self.write_seq);
        self.control.write(data, &write_id).await
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

    /// A pipelined writer of this process's stdin (see [`StdinWriter`]).
    pub fn stdin_writer(&self) -> StdinWriter {
        self.control.stdin_writer()
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
    id: String,
    client: Client,
    finished: Arc<AtomicBool>,
}

/// `-32001`, the server's "unknown process id".
const UNKNOWN_PROCESS: i64 = -32001;

impl ProcessController {
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
    async fn control(&self, call: Call) -> Result<Option<Reply>, ClientError> {
        let shared = &self.client.shared;
        let mut repeated = false;
        loop {
            let conn = self.client.connection().await?;
            match conn.call_typed(call.clone()).await {
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
        self.control(Call::Signal(SignalParams {
            process_id: self.id.clone(),
            signal: name.to_string(),
        }))
        .await
        .map(|_| ())
    }

    /// Resize the PTY.
    pub async fn resize(&self, size: TermSize) -> Result<(), ClientError> {
        if self.is_finished() {
            return Ok(());
        }
        self.control(Call::Resize(ResizeParams {
            process_id: self.id.clone(),
            rows: size.rows,
            cols: size.cols,
        }))
        .await
        .map(|_| ())
    }

    /// A pipelined writer of this process's stdin (see [`StdinWriter`]).
    pub fn stdin_writer(&self) -> StdinWriter {
        StdinWriter {
            control: self.clone(),
            next: 0,
            in_flight: VecDeque::new(),
            conn: None,
        }
    }

    /// Write with an explicit idempotency key. A repeat after a reconnect that finds the
    /// process gone answers `exited`, as the server does for a write to an exited process.
    pub async fn write(&self, data: &[u8], write_id: &str) -> Result<String, ClientError> {
        if self.is_finished() {
            return Ok("exited".into());
        }
        let r = self
            .control(Call::Write(WriteCall {
                process_id: self.id.clone(),
                data: Bytes::copy_from_slice(data),
                write_id: Some(write_id.to_string()),
                close_stdin: false,
            }))
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
        self.control(Call::CloseStdin(ProcessRef {
            process_id: self.id.clone(),
        }))
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
            .control(Call::Terminate(TerminateParams {
                process_id: self.id.clone(),
                grace_ms: grace.map(|g| g.as_millis() as u64),
            }))
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

/// One write of a [`StdinWriter`] not yet answered.
struct InFlight {
    write_id: String,
    data: Bytes,
    /// The last write of [`StdinWriter::finish`]: it closes stdin too.
    close_stdin: bool,
    /// Its request on the current connection; `None` once that connection is gone.
    call: Option<PendingCall>,
    /// Sent again after a reconnect (so an earlier attempt may have been applied).
    repeated: bool,
}

/// Stdin as a pipeline: up to [`STDIN_WRITES_IN_FLIGHT`] `process/write` requests in flight,
/// in order (the server applies the writes of a process in request order), so a stream of
/// input is not held to one round trip per write. Each write carries its own `writeId`
/// (`s-1`, `s-2`, …): after a reconnect, the writes not yet answered are sent again in order,
/// and the server acknowledges those it had already applied without writing them twice.
pub struct StdinWriter {
    control: ProcessController,
    next: u64,
    in_flight: VecDeque<InFlight>,
    /// The connection the in-flight writes were sent on.
    conn: Option<RpcConnection>,
}

/// Why a [`StdinWriter`] stopped: the process no longer takes input.
#[derive(Debug, Clone)]
pub enum StdinRefused {
    /// `stdinClosed` or `exited`, as the server answered.
    Status(String),
    /// The request failed.
    Error(ClientError),
}

impl std::fmt::Display for StdinRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StdinRefused::Status(s) => write!(f, "stdin refused: {s}"),
            StdinRefused::Error(e) => write!(f, "{e}"),
        }
    }
}

impl StdinWriter {
    /// Queue `data` (split into writes of at most [`STDIN_WRITE_BYTES`], or
    /// [`STDIN_BINARY_WRITE_BYTES`] where the connection takes binary writes); waits only
    /// while the pipeline is full. An error means the process takes no more input (or the
    /// session is lost): nothing further will be written.
    pub async fn write(&mut self, data: Bytes) -> Result<(), StdinRefused> {
        if self.control.is_finished() {
            return Err(StdinRefused::Status("exited".into()));
        }
        let binary = self.binary().await?;
        let most = self.piece_for(binary);
        let in_flight = if binary {
            STDIN_BINARY_WRITES_IN_FLIGHT
        } else {
            STDIN_WRITES_IN_FLIGHT
        };
        let mut rest = data;
        while !rest.is_empty() {
            let piece = rest.split_to(rest.len().min(most));
            while self.in_flight.len() >= in_flight {
                self.settle_oldest().await?;
            }
            self.next += 1;
            let mut w = InFlight {
                write_id: format!("s-{}", self.next),
                data: piece,
                close_stdin: false,
                call: None,
                repeated: false,
            };
            if let Some(conn) = &self.conn {
                w.call = self.send(conn, &w).await;
            }
            self.in_flight.push_back(w);
            if self.conn.is_none() || self.in_flight.back().is_some_and(|w| w.call.is_none()) {
                self.resend().await?;
            }
        }
        Ok(())
    }

    /// The most one write carries on the current connection: [`StdinWriter::write`] splits
    /// its data into pieces of this size, so a caller that reads its input in whole pieces
    /// (as `execrelay run` does) sends no short piece after each full one. With binary writes
    /// every piece is one Noise record, and a stream's window counts records, not bytes.
    pub async fn piece_bytes(&self) -> Result<usize, StdinRefused> {
        let binary = self.binary().await?;
        Ok(self.piece_for(binary))
    }

    /// The piece size with or without binary writes: a JSON write must fit the server's
    /// message limit once in base64, with room for the rest of the request; a binary one, one
    /// chunk.
    fn piece_for(&self, binary: bool) -> usize {
        if binary {
            return STDIN_BINARY_WRITE_BYTES;
        }
        let limit = self
            .control
            .client
            .shared
            .server_max_message
            .load(std::sync::atomic::Ordering::Relaxed);
        (limit.saturating_sub(WRITE_REQUEST_SLACK) / 4 * 3).clamp(1, STDIN_WRITE_BYTES)
    }

    /// Whether this writer's writes go as binary messages now (`protocol.md` §5.2: the
    /// connection negotiated `binaryInput`); else as JSON with base64.
    pub async fn binary_writes(&self) -> bool {
        self.binary().await.unwrap_or(false)
    }

    /// Whether the current connection takes binary writes.
    async fn binary(&self) -> Result<bool, StdinRefused> {
        Ok(match &self.conn {
            Some(conn) => conn.binary_input(),
            None => self
                .control
                .client
                .connection()
                .await
                .map_err(StdinRefused::Error)?
                .binary_input(),
        })
    }

    /// Wait until every queued write was answered `accepted`.
    pub async fn flush(&mut self) -> Result<(), StdinRefused> {
        while !self.in_flight.is_empty() {
            self.settle_oldest().await?;
        }
        Ok(())
    }

    /// Write everything queued, then close stdin: with binary writes (`protocol.md` §5.2) an
    /// empty write whose close-stdin flag is set, in the pipeline like any write (resent, with
    /// its `writeId`, after a reconnect); else `process/closeStdin`.
    pub async fn finish(mut self) -> Result<(), StdinRefused> {
        let binary = self.binary().await?;
        if !binary || self.control.is_finished() {
            self.flush().await?;
            return self
                .control
                .close_stdin()
                .await
                .map_err(StdinRefused::Error);
        }
        while self.in_flight.len() >= STDIN_BINARY_WRITES_IN_FLIGHT {
            self.settle_oldest().await?;
        }
        self.next += 1;
        let mut w = InFlight {
            write_id: format!("s-{}", self.next),
            data: Bytes::new(),
            close_stdin: true,
            call: None,
            repeated: false,
        };
        if let Some(conn) = &self.conn {
            w.call = self.send(conn, &w).await;
        }
        let unsent = w.call.is_none();
        self.in_flight.push_back(w);
        if unsent {
            self.resend().await?;
        }
        while let Some(oldest) = self.in_flight.front() {
            let closing = oldest.close_stdin;
            match self.settle_oldest().await {
                Ok(()) => {}
                // Stdin already closed, or the process gone: closing it is done, as
                // `process/closeStdin` would have answered.
                Err(StdinRefused::Status(s))
                    if closing && (s == "stdinClosed" || s == "exited") =>
                {
                    return Ok(())
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    async fn send(&self, conn: &RpcConnection, w: &InFlight) -> Option<PendingCall> {
        // (A write already in flight when the exit arrived is still answered by the server:
        // `exited`, the process being known until its exit is acknowledged.)
        let id = &self.control.id;
        conn.start_write(id, &w.write_id, &w.data, w.close_stdin)
            .await
            .ok()
    }

    /// Send every unanswered write again, in order, on the current connection (waiting for a
    /// reconnect if one is under way).
    async fn resend(&mut self) -> Result<(), StdinRefused> {
        loop {
            let conn = self
                .control
                .client
                .connection()
                .await
                .map_err(StdinRefused::Error)?;
            let mut all_sent = true;
            for i in 0..self.in_flight.len() {
                let call = self.send(&conn, &self.in_flight[i]).await;
                all_sent &= call.is_some();
                self.in_flight[i].call = call;
                self.in_flight[i].repeated = true;
                if !all_sent {
                    break;
                }
            }
            self.conn = Some(conn);
            if all_sent {
                return Ok(());
            }
        }
    }

    /// Wait for the oldest write's answer; on a lost connection, send everything unanswered
    /// again and wait on.
    async fn settle_oldest(&mut self) -> Result<(), StdinRefused> {
        loop {
            let Some(oldest) = self.in_flight.front_mut() else {
                return Ok(());
            };
            let repeated = oldest.repeated;
            let outcome = match oldest.call.take() {
                Some(call) => call.outcome().await,
                None => Err(ClientError::ConnectionLost),
            };
            match outcome {
                // Repeated, and the process is gone: it exited (and its exit notice was
                // taken) meanwhile, what the server says of a write to an exited process.
                Err(ClientError::Rpc {
                    code: UNKNOWN_PROCESS,
                    ..
                }) if repeated => {
                    self.in_flight.pop_front();
                    return Err(StdinRefused::Status(WriteStatus::Exited.as_str().into()));
                }
                Ok(v) => {
                    self.in_flight.pop_front();
                    return match v["status"].as_str() {
                        Some("accepted") => Ok(()),
                        other => Err(StdinRefused::Status(other.unwrap_or("").to_string())),
                    };
                }
                Err(ClientError::ConnectionLost)
                    if self.control.client.shared.opts.reconnect
                        && self.control.client.shared.target.can_reconnect() =>
                {
                    self.resend().await?;
                }
                Err(e) => return Err(StdinRefused::Error(e)),
            }
        }
    }
}
