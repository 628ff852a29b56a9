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

use std::time::Duration;

use bytes::Bytes;

use super::{Client, ClientError, ProcessEvent};
use crate::connection::message::{Call, Reply, WriteCall};
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
    write_seq: u64,
}

impl ProcessHandle {
    /// A handle for the process `id` just started by `client`.
    pub(super) fn new(id: String, pid: u32, client: Client) -> Self {
        ProcessHandle {
            control: ProcessController {
                id: id.clone(),
                client,
            },
            id,
            pid,
            write_seq: 0,
        }
    }

    /// The next event; `None` after the exit notice, or if the session was lost (see
    /// [`Client::lost_reason`]).
    pub async fn next_event(&mut self) -> Option<ProcessEvent> {
        self.control.client.next_event_of(&self.id).await
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
}

impl Drop for ProcessHandle {
    /// Stop buffering this process's events. Its output is no longer acknowledged, so with
    /// acks the server eventually holds the child back: terminate it if it should not run on.
    fn drop(&mut self) {
        lock(&self.control.client.shared.procs).remove(&self.id);
    }
}

/// Controls a process without owning its event stream.
#[derive(Clone)]
pub struct ProcessController {
    id: String,
    client: Client,
}

impl ProcessController {
    /// Send a signal by name.
    pub async fn signal(&self, name: &str) -> Result<(), ClientError> {
        self.client
            .call_typed(Call::Signal(SignalParams {
                process_id: self.id.clone(),
                signal: name.to_string(),
            }))
            .await
            .map(|_| ())
    }

    /// Resize the PTY.
    pub async fn resize(&self, size: TermSize) -> Result<(), ClientError> {
        self.client
            .call_typed(Call::Resize(ResizeParams {
                process_id: self.id.clone(),
                rows: size.rows,
                cols: size.cols,
            }))
            .await
            .map(|_| ())
    }

    /// Write with an explicit idempotency key.
    pub async fn write(&self, data: &[u8], write_id: &str) -> Result<String, ClientError> {
        let r = self
            .client
            .call_typed(Call::Write(WriteCall {
                process_id: self.id.clone(),
                data: Bytes::copy_from_slice(data),
                write_id: Some(write_id.to_string()),
            }))
            .await?;
        match r {
            Reply::Write(status) => Ok(status.as_str().to_string()),
            other => Err(ClientError::Protocol(format!(
                "bad write result: {other:?}"
            ))),
        }
    }

    /// Close stdin.
    pub async fn close_stdin(&self) -> Result<(), ClientError> {
        self.client
            .call_typed(Call::CloseStdin(ProcessRef {
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
        let r = self
            .client
            .call_typed(Call::Terminate(TerminateParams {
                process_id: self.id.clone(),
                grace_ms: grace.map(|g| g.as_millis() as u64),
            }))
            .await?;
        match r {
            Reply::Terminate { running } => Ok(running),
            other => Err(ClientError::Protocol(format!(
                "bad terminate result: {other:?}"
            ))),
        }
    }
}
