//! [`StdinWriter`]: a process's stdin as a pipeline of `process/write` requests, several in
//! flight (the server applies them in request order), each encoded by hand
//! (`rpc/write_request.rs`) or sent as a binary write (§5.2).
//!
//! # What this module owns
//!
//! - Handing writers out (`ProcessHandle::stdin_writer`, `ProcessController::stdin_writer`):
//!   here, so that this module depends on `process_handle.rs` and not the other way round.
//! - The pieces a caller's bytes are cut into ([`StdinWriter::piece_bytes`]) and the writes in
//!   flight, each held with its `writeId` until it is answered.
//! - Sending again: after a reconnect, every write not yet answered, in order, so none is lost
//!   or applied twice; after a refusal for a limit, on a server that keeps the order
//!   (`retryRefusedWrites`), the refused write alone when `write_retry.rs` says to, then,
//!   once it is accepted, everything after it.
//!
//! # What it must never do
//!
//! - Reorder writes, or send one again on a server that did not promise to hold the writes
//!   behind a refused one (they could then be applied first).
//! - Hold more than its pipeline's writes ([`STDIN_WRITES_IN_FLIGHT`],
//!   [`STDIN_BINARY_WRITES_IN_FLIGHT`]).

use std::collections::VecDeque;
use std::time::Duration;

use bytes::Bytes;

use super::exclusive::ExclusiveInFlight;
use super::process_handle::{ProcessController, ProcessHandle, UNKNOWN_PROCESS};
use super::rpc_connection::{PendingCall, RpcConnection};
use super::write_retry::{retry_now, write_cost, WriteRetry};
use super::ClientError;
use crate::process::WriteStatus;

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
    /// Counts it among the process's exclusive requests in flight while it is unanswered.
    _in_flight: ExclusiveInFlight,
}

/// Stdin as a pipeline: up to [`STDIN_WRITES_IN_FLIGHT`] `process/write` requests in flight,
/// in order (the server applies the writes of a process in request order), so a stream of
/// input is not held to one round trip per write. Each write carries its own `writeId`
/// (`s-1`, `s-2`, …): after a reconnect, the writes not yet answered are sent again in order,
/// and the server acknowledges those it had already applied without writing them twice.
pub struct StdinWriter {
    control: ProcessController,
    in_flight: VecDeque<InFlight>,
    /// The connection the in-flight writes were sent on.
    conn: Option<RpcConnection>,
    /// Refusals in a row, and the pause before the next try (`write_retry.rs`).
    retry: WriteRetry,
    /// Why it stopped, once it did: every later call answers the same, and nothing it held
    /// is kept (the writes still on the wire stay counted by the connection until answered).
    stopped: Option<StdinRefused>,
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

impl ProcessHandle {
    /// A pipelined writer of this process's stdin (see [`StdinWriter`]).
    pub fn stdin_writer(&self) -> StdinWriter {
        self.controller().stdin_writer()
    }
}

impl ProcessController {
    /// A pipelined writer of this process's stdin (see [`StdinWriter`]).
    pub fn stdin_writer(&self) -> StdinWriter {
        StdinWriter::new(self.clone(), self.client.shared.opts.write_retry_for)
    }
}

impl StdinWriter {
    /// A writer of `control`'s stdin that sends a refused write again for `retry_for`.
    pub(super) fn new(control: ProcessController, retry_for: Duration) -> StdinWriter {
        StdinWriter {
            control,
            in_flight: VecDeque::new(),
            conn: None,
            retry: WriteRetry::new(retry_for),
            stopped: None,
        }
    }

    /// Queue `data` (split into writes of at most [`STDIN_WRITE_BYTES`], or
    /// [`STDIN_BINARY_WRITE_BYTES`] where the connection takes binary writes); waits only
    /// while the pipeline is full. An error means the process takes no more input (or the
    /// session is lost): nothing further will be written.
    pub async fn write(&mut self, data: Bytes) -> Result<(), StdinRefused> {
        if let Some(e) = &self.stopped {
            return Err(e.clone());
        }
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
            let w = InFlight {
                write_id: self.control.next_write_id("s"),
                data: piece,
                close_stdin: false,
                call: None,
                repeated: false,
                _in_flight: self.control.exclusive(),
            };
            self.push_in_order(w).await?;
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
            None => self.connection().await?.binary_input(),
        })
    }

    /// Writes the server refused for a limit and this writer sent again (alone, the writes
    /// after them following once they were accepted), so far: how often the server's limits were full under this input.
    pub fn refused_writes_sent_again(&self) -> u64 {
        self.retry.tries()
    }

    /// Wait until every queued write was answered `accepted`.
    pub async fn flush(&mut self) -> Result<(), StdinRefused> {
        if let Some(e) = &self.stopped {
            return Err(e.clone());
        }
        while !self.in_flight.is_empty() {
            self.settle_oldest().await?;
        }
        Ok(())
    }

    /// Write everything queued, then close stdin: with binary writes (`protocol.md` §5.2) an
    /// empty write whose close-stdin flag is set, in the pipeline like any write (resent, with
    /// its `writeId`, after a reconnect); else `process/closeStdin`.
    pub async fn finish(mut self) -> Result<(), StdinRefused> {
        if let Some(e) = self.stopped.take() {
            return Err(e);
        }
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
        let w = InFlight {
            write_id: self.control.next_write_id("s"),
            data: Bytes::new(),
            close_stdin: true,
            call: None,
            repeated: false,
            _in_flight: self.control.exclusive(),
        };
        self.push_in_order(w).await?;
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

    /// Queue `w` behind the writes in flight and send it, never ahead of one of them: when
    /// some are unsent (a call cancelled while a refused write went again alone, or a lost
    /// connection), everything unanswered goes again, in order, with it (the `writeId`s make
    /// the repeats harmless).
    async fn push_in_order(&mut self, w: InFlight) -> Result<(), StdinRefused> {
        let r = self.push_in_order_once(w).await;
        self.stop_on(r)
    }

    async fn push_in_order_once(&mut self, mut w: InFlight) -> Result<(), StdinRefused> {
        let behind_unsent = self.in_flight.iter().any(|w| w.call.is_none());
        if let (Some(conn), false) = (&self.conn, behind_unsent) {
            w.call = self.send(conn, &w).await?;
        }
        let unsent = w.call.is_none();
        self.in_flight.push_back(w);
        if self.conn.is_none() || unsent {
            self.resend().await?;
        }
        Ok(())
    }

    /// Send one write: `None` when the connection is gone (sent again on the next), an error
    /// when it can never be sent (larger than the server reads: sending it again on each new
    /// connection looped at full speed, review R2).
    async fn send(
        &self,
        conn: &RpcConnection,
        w: &InFlight,
    ) -> Result<Option<PendingCall>, StdinRefused> {
        // (A write already in flight when the exit arrived is still answered by the server:
        // `exited`, the process being known until its exit is acknowledged.)
        let id = &self.control.id;
        // Counted by the connection too while on the wire: the writer may be dropped (or
        // stop on an error) while the server still holds the write.
        let held = Some(w._in_flight.another());
        match conn
            .start_write_held(id, &w.write_id, &w.data, w.close_stdin, held)
            .await
        {
            Ok(call) => Ok(Some(call)),
            Err(e @ ClientError::RequestTooLarge { .. }) => Err(StdinRefused::Error(e)),
            Err(_) => Ok(None),
        }
    }

    /// The client's current connection (waiting for a reconnect if one is under way).
    async fn connection(&self) -> Result<RpcConnection, StdinRefused> {
        self.control
            .client
            .connection()
            .await
            .map_err(StdinRefused::Error)
    }

    /// Send every unanswered write again, in order, on the current connection (waiting for a
    /// reconnect if one is under way).
    async fn resend(&mut self) -> Result<(), StdinRefused> {
        loop {
            let conn = self.connection().await?;
            let mut all_sent = true;
            for i in 0..self.in_flight.len() {
                let call = self.send(&conn, &self.in_flight[i]).await?;
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

    /// Send the oldest write alone again (after a refusal), on the current connection; the
    /// others' answers (refusals naming it) are no longer awaited, and they are sent again
    /// once it is accepted (their `writeId`s make that safe on a new connection too).
    async fn resend_oldest(&mut self) -> Result<(), StdinRefused> {
        let conn = self.connection().await?;
        for w in self.in_flight.iter_mut() {
            w.call = None;
        }
        if let Some(oldest) = self.in_flight.front() {
            let call = self.send(&conn, oldest).await?;
            if let Some(front) = self.in_flight.front_mut() {
                front.call = call;
                front.repeated = true;
            }
        }
        self.conn = Some(conn);
        Ok(())
    }

    /// Wait for the oldest write's answer; on a lost connection, send everything unanswered
    /// again and wait on.
    async fn settle_oldest(&mut self) -> Result<(), StdinRefused> {
        let r = self.settle_oldest_once().await;
        self.stop_on(r)
    }

    /// After an error nothing more is written (red team F4: a writer that stopped kept its
    /// writes, each counted as an exclusive request of the process, until it was dropped,
    /// and the silence watch left the process alone meanwhile).
    fn stop_on(&mut self, r: Result<(), StdinRefused>) -> Result<(), StdinRefused> {
        if let Err(e) = &r {
            self.in_flight.clear();
            self.stopped = Some(e.clone());
        }
        r
    }

    async fn settle_oldest_once(&mut self) -> Result<(), StdinRefused> {
        loop {
            let Some(oldest) = self.in_flight.front_mut() else {
                return Ok(());
            };
            let repeated = oldest.repeated;
            let len = oldest.data.len();
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
                        Some("accepted") => {
                            self.retry.accepted();
                            // After a refusal only the refused write went again: the writes
                            // behind it go now, in order, before anything newer.
                            if self.in_flight.iter().any(|w| w.call.is_none()) {
                                self.resend().await?;
                            }
                            Ok(())
                        }
                        other => Err(StdinRefused::Status(other.unwrap_or("").to_string())),
                    };
                }
                Err(ClientError::ConnectionLost)
                    if self.control.client.shared.opts.reconnect
                        && self.control.client.shared.target.can_reconnect() =>
                {
                    self.resend().await?;
                }
                // Refused for a limit, by a server that then refuses everything behind it
                // until it comes again: wait, and send it alone again; the rest follow once it
                // is accepted (above). Sending them with it would only have them refused
                // again, each charged to the server's full budget first.
                Err(e @ ClientError::Rpc { .. }) => {
                    let (promised, binary) = self.conn.as_ref().map_or((false, false), |c| {
                        (c.retry_refused_writes(), c.binary_input())
                    });
                    let cost = write_cost(len, binary);
                    match self.retry.after_refusal(&e, cost, promised, retry_now()) {
                        Some(pause) => {
                            tokio::time::sleep(pause).await;
                            self.resend_oldest().await?;
                        }
                        None => return Err(StdinRefused::Error(e)),
                    }
                }
                Err(e) => return Err(StdinRefused::Error(e)),
            }
        }
    }
}
