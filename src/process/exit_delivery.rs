//! Who learns that a process's exit notice was delivered: written to a transport (a session
//! without acks) or acknowledged by the client (with acks).
//!
//! Two kinds of listener. Waits ([`ManagedProcess::wait_exit_delivered`]: shutdown) are woken
//! through notifies of their own, not the process's `changed`, so an event written does not
//! wake them for nothing. And one **finisher** ([`ManagedProcess::when_exit_delivered`]: the
//! session's "forget this process" step) that is *run*, not woken: by whoever delivers the
//! notice — the connection's reader handling the ack, or the writer that wrote the notice —
//! right where it happens. A task parked until the ack would be one more task made runnable by
//! the ack, and the next `process/start` (which arrives with the ack, from the same client)
//! spawns its process task beside it; on tokio's multi-threaded runtime the second runnable
//! task wakes an idle worker to steal one of them (README, "Fewer thread hand-offs per exec").
//!
//! A finisher must be short, non-blocking work (it runs on a connection's reader or writer);
//! it runs at most once and never under this process's locks. It must never wait.

use std::sync::Mutex;

use tokio::sync::Notify;

use super::managed_process::ManagedProcess;
use crate::sync::lock;

/// Run once the exit notice was delivered, with the process.
pub type Finisher = Box<dyn FnOnce(&ManagedProcess) + Send>;

/// The listeners of one process's exit delivery.
#[derive(Default)]
pub(crate) struct ExitDelivery {
    /// Woken once the exit notice was written (waits without acks, shutdown).
    written: Notify,
    /// Woken once the exit notice was acknowledged (waits with acks).
    acked: Notify,
    /// The finisher and whether it waits for the ack (`true`) or the write (`false`).
    finisher: Mutex<Option<(bool, Finisher)>>,
}

impl ExitDelivery {
    /// The log's flags after a write or an ack (taken under the process's lock, called after
    /// it was released): wake the waits, run the finisher if its moment has come.
    pub(super) fn changed(&self, p: &ManagedProcess, exit_written: bool, exit_acked: bool) {
        if exit_written {
            self.written.notify_waiters();
        }
        if exit_acked {
            self.acked.notify_waiters();
        }
        if !(exit_written || exit_acked) {
            return;
        }
        let due = {
            let mut slot = lock(&self.finisher);
            match slot.as_ref() {
                Some((acks, _)) if delivered(*acks, exit_written, exit_acked) => slot.take(),
                _ => None,
            }
        };
        if let Some((_, f)) = due {
            f(p);
        }
    }
}

/// Whether the notice counts as delivered with or without acks.
fn delivered(acks: bool, exit_written: bool, exit_acked: bool) -> bool {
    if acks {
        exit_acked
    } else {
        exit_written
    }
}

impl ManagedProcess {
    /// Whether the exit notice was written (without acks) or acknowledged (with acks).
    pub fn exit_delivered(&self, acks: bool) -> bool {
        let inner = self.inner();
        delivered(acks, inner.log.exit_written(), inner.log.exit_acked())
    }

    /// Wait until [`exit_delivered`](Self::exit_delivered).
    pub async fn wait_exit_delivered(&self, acks: bool) {
        let notify = if acks {
            &self.exit_delivery.acked
        } else {
            &self.exit_delivery.written
        };
        loop {
            let notified = notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.exit_delivered(acks) {
                return;
            }
            notified.await;
        }
    }

    /// Run `f` once the exit notice is [delivered](Self::exit_delivered): here and now if it
    /// is, else by whoever delivers it (the module docs). One finisher per process: a second
    /// replaces the first.
    pub fn when_exit_delivered(&self, acks: bool, f: Finisher) {
        let mut slot = lock(&self.exit_delivery.finisher);
        // Decided under the slot's lock: a write or an ack that lands after this look finds
        // the finisher stored (it takes the slot's lock after changing the log), one that
        // landed before it is seen here.
        if self.exit_delivered(acks) {
            drop(slot);
            f(self);
        } else {
            *slot = Some((acks, f));
        }
    }
}
