//! A process's control operations that reach its process group: `process/signal`,
//! `process/terminate` and `process/resize` (`protocol.md` §4).
//!
//! Signals reach the group by identity only: `killpg` through the direct child while the
//! leader is unreaped, afterwards each member still in the session's scope by pidfd. It never
//! signals by a bare pid or group id.

use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;

use super::super::containment::{ContainmentError, Delivery};
use super::super::error::ProcessError;
use super::ManagedProcess;
use crate::rpc::messages::TermSize;

impl ManagedProcess {
    /// `process/signal`: to the process group; nothing once the child exited (`protocol.md`
    /// §4: "a process that already exited: nothing is sent").
    pub fn signal(&self, sig: Signal) -> Result<(), ProcessError> {
        if !self.is_running() {
            return Ok(());
        }
        // `Gone`: reaped since the check; nothing is sent, as for an exited process.
        self.direct
            .signal_group(sig)
            .map(|_| ())
            .map_err(ProcessError::Signal)
    }

    /// Send `sig` to the process group by identity: `killpg` while the direct child is
    /// unreaped, otherwise each member of the group still in the session's scope, by pidfd
    /// (the group's number may belong to someone else by then). Returns whether any process
    /// was reached.
    pub async fn signal_group(&self, sig: Signal) -> Result<bool, ProcessError> {
        match self
            .direct
            .signal_group(sig)
            .map_err(ProcessError::Signal)?
        {
            Delivery::Delivered => Ok(true),
            Delivery::Gone => {
                let (scope, pgid) = (self.scope.clone(), self.pid);
                // A walk of `/proc` or the cgroup's member list: off the runtime's threads.
                let n = tokio::task::spawn_blocking(move || {
                    scope.signal_group_members(pgid, Some(sig))
                })
                .await
                .map_err(|e| ProcessError::Signal(std::io::Error::other(e.to_string())))?
                .map_err(|e| ProcessError::Signal(containment_io(e)))?;
                Ok(n > 0)
            }
        }
    }

    /// `process/terminate`: SIGTERM to the group now, SIGKILL to what is left of it after
    /// `grace` (default: the process's `killGraceMs`). Both by identity
    /// ([`signal_group`](Self::signal_group)): for a process that already exited, only
    /// members of its group still in the session are reached, never a group that reused its
    /// number. Returns whether the child was still running.
    pub async fn terminate(self: &Arc<Self>, grace: Option<Duration>) -> bool {
        let running = self.is_running();
        let grace = grace.unwrap_or(self.opts.kill_grace);
        match self.signal_group(Signal::SIGTERM).await {
            Ok(true) => {}
            // Nothing of the group is left: no SIGKILL to schedule.
            Ok(false) => return running,
            Err(e) => {
                tracing::warn!(pgid = self.pid, error = %e, "SIGTERM to the process group failed")
            }
        }
        let me = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            if let Err(e) = me.signal_group(Signal::SIGKILL).await {
                tracing::warn!(pgid = me.pid, error = %e, "SIGKILL to the process group failed");
            }
        });
        running
    }

    /// `process/resize`.
    pub fn resize(&self, size: TermSize) -> Result<(), ProcessError> {
        let Some(pty) = &self.pty else {
            return Err(ProcessError::NotTty(self.id.clone()));
        };
        check_term_size(size)?;
        pty.resize(size).map_err(ProcessError::Resize)?;
        if self.is_running() {
            let _ = self.direct.signal_group(Signal::SIGWINCH);
        }
        Ok(())
    }
}

/// The one rule for terminal sizes, at `process/start` and `process/resize` alike: rows and
/// columns are positive (a 0×0 terminal is refused, with the same error, on both paths).
pub fn check_term_size(size: TermSize) -> Result<(), ProcessError> {
    if size.rows == 0 || size.cols == 0 {
        return Err(ProcessError::ZeroSize);
    }
    Ok(())
}

/// A containment failure as the I/O error it carries (or wraps).
fn containment_io(e: ContainmentError) -> std::io::Error {
    match e {
        ContainmentError::Io(e) => e,
        other => std::io::Error::other(other.to_string()),
    }
}
