//! A process's stdin: `process/write` (in request order, each `writeId` applied at most once,
//! giving up with `exited` when the child exits meanwhile) and `process/closeStdin`.
//!
//! Stdin sits behind the process's one async lock, held by at most one write at a time; it
//! is never held for long once the child exited, and nothing here waits on a dead child.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;

use super::ManagedProcess;

/// How long a failed stdin write waits to learn whether the child is exiting (a child's
/// descriptors close before it can be reaped), to answer `exited` rather than `stdinClosed`.
pub const WRITE_EXIT_GRACE: Duration = Duration::from_millis(500);

/// Outcome of `process/write`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteStatus {
    /// Written (or a repeated `writeId` already written).
    Accepted,
    /// No stdin, or it was closed.
    StdinClosed,
    /// The process exited.
    Exited,
}

impl WriteStatus {
    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            WriteStatus::Accepted => "accepted",
            WriteStatus::StdinClosed => "stdinClosed",
            WriteStatus::Exited => "exited",
        }
    }
}

impl ManagedProcess {
    /// The last `n` `writeId`s this process accepted, oldest first (kept by the session once
    /// the process is forgotten: see `session::ended_ids`).
    pub async fn last_write_ids(&self, n: usize) -> Vec<Arc<str>> {
        self.stdin.lock().await.ids.newest(n)
    }

    /// [`last_write_ids`](Self::last_write_ids) without waiting: `None` while a write holds
    /// stdin (after the child's exit never for long: a blocked write gives up then).
    pub fn try_last_write_ids(&self, n: usize) -> Option<Vec<Arc<str>>> {
        self.stdin.try_lock().ok().map(|st| st.ids.newest(n))
    }

    /// `process/write`: applied in request order by the caller's queue; waits for pipe space
    /// but gives up with `exited` when the child exits meanwhile. A `writeId` already written
    /// is answered `accepted` whatever happened since: a write repeated after a resume (its
    /// answer lost with the connection) may arrive after the child took its bytes and exited,
    /// and it did its work.
    pub async fn write(&self, data: &[u8], write_id: Option<String>) -> WriteStatus {
        // Never held for long once the child exited: a write blocked on its pipe gives up
        // then (below), and `close_stdin` does not wait on a dead child either.
        let mut st = self.stdin.lock().await;
        if let Some(id) = &write_id {
            if st.ids.contains(id) {
                return WriteStatus::Accepted;
            }
        }
        if !self.is_running() {
            return WriteStatus::Exited;
        }
        if st.closed {
            return WriteStatus::StdinClosed;
        }
        let Some(w) = st.writer.as_mut() else {
            return WriteStatus::StdinClosed;
        };
        let res = tokio::select! {
            r = async { w.write_all(data).await?; w.flush().await } => r,
            _ = self.exited.cancelled() => return WriteStatus::Exited,
        };
        match res {
            Ok(()) => {
                self.metrics.stdin_bytes.inc_by(data.len() as u64);
                if let Some(id) = write_id {
                    st.ids.remember(&id);
                }
                WriteStatus::Accepted
            }
            Err(_) => {
                st.writer = None;
                st.closed = true;
                // A dying child closes its stdin before it can be reaped: give the reaper a
                // moment so that such a write answers `exited`, not `stdinClosed`.
                tokio::select! {
                    _ = self.exited.cancelled() => WriteStatus::Exited,
                    _ = tokio::time::sleep(WRITE_EXIT_GRACE) => WriteStatus::StdinClosed,
                }
            }
        }
    }

    /// `process/closeStdin`: a pipe is closed; a PTY gets the end-of-file character (^D),
    /// which the terminal's line discipline turns into end of file for the reader.
    pub async fn close_stdin(&self) {
        let mut st = tokio::select! {
            st = self.stdin.lock() => st,
            _ = self.exited.cancelled() => return,
        };
        if st.closed {
            return;
        }
        st.closed = true;
        if let Some(mut w) = st.writer.take() {
            if w.is_pty() {
                let _ = tokio::select! {
                    r = w.write_all(b"\x04") => r,
                    _ = self.exited.cancelled() => Ok(()),
                };
                // Keep the master writer alive: dropping it does not close the terminal.
                st.writer = Some(w);
            } else {
                let _ = w.shutdown().await;
            }
        }
    }
}
