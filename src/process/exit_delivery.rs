//! Who learns that a process's exit notice was delivered: written to a transport (a session
//! without acks) or acknowledged by the client (with acks).
//!
//! Two kinds of listener. Waits (`ManagedProcess::wait_exit_delivered`: shutdown) are woken
//! through notifies of their own, not the process's `changed`, so an event written does not
//! wake them for nothing. And one **finisher** (`ManagedProcess::when_exit_delivered`: the
//! session's "forget this process" step) that is *run*, not woken: by whoever delivers the
//! notice — the connection's reader handling the ack, or the writer that wrote the notice —
//! right where it happens. A task parked until the ack would be one more task made runnable by
//! the ack, and the next `process/start` (which arrives with the ack, from the same client)
//! spawns its process task beside it; on tokio's multi-threaded runtime the second runnable
//! task wakes an idle worker to steal one of them (README, "Fewer thread hand-offs per exec", "The exit delivered where it happens").
//!
//! A finisher must be short, non-blocking work (it runs on a connection's reader or writer);
//! it runs at most once and never under this process's locks. It must never wait.

use std::sync::Mutex;

use tokio::sync::Notify;

use crate::sync::lock;

/// Run once the exit notice was delivered, with the process (`T`: `ManagedProcess`; generic
/// so that this file does not import the one that holds it).
pub type Finisher<T> = Box<dyn FnOnce(&T) + Send>;

/// The listeners of one process's exit delivery.
pub(crate) struct ExitDelivery<T> {
    /// Woken once the exit notice was written (waits without acks, shutdown).
    written: Notify,
    /// Woken once the exit notice was acknowledged (waits with acks).
    acked: Notify,
    /// The finisher and whether it waits for the ack (`true`) or the write (`false`).
    finisher: Mutex<Option<(bool, Finisher<T>)>>,
}

impl<T> Default for ExitDelivery<T> {
    fn default() -> Self {
        ExitDelivery {
            written: Notify::new(),
            acked: Notify::new(),
            finisher: Mutex::new(None),
        }
    }
}

impl<T> ExitDelivery<T> {
    /// The log's flags after a write or an ack (taken under the process's lock, called after
    /// it was released): wake the waits, run the finisher with `p` if its moment has come.
    pub(crate) fn changed(&self, p: &T, exit_written: bool, exit_acked: bool) {
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

    /// What a wait for the delivery (with or without acks) is woken by.
    pub(crate) fn notify(&self, acks: bool) -> &Notify {
        if acks {
            &self.acked
        } else {
            &self.written
        }
    }

    /// Run `f` with `p` here and now if `delivered_now()`, else store it for
    /// [`changed`](Self::changed). One finisher per process: a second replaces the first.
    pub(crate) fn when_delivered(
        &self,
        p: &T,
        acks: bool,
        delivered_now: impl FnOnce() -> bool,
        f: Finisher<T>,
    ) {
        let mut slot = lock(&self.finisher);
        // Decided under the slot's lock: a write or an ack that lands after this look finds
        // the finisher stored (it takes the slot's lock after changing the log), one that
        // landed before it is seen here.
        if delivered_now() {
            drop(slot);
            f(p);
        } else {
            *slot = Some((acks, f));
        }
    }
}

/// Whether the notice counts as delivered with or without acks.
pub(crate) fn delivered(acks: bool, exit_written: bool, exit_acked: bool) -> bool {
    if acks {
        exit_acked
    } else {
        exit_written
    }
}
