//! A start waiting for the client's approval: what it would spawn, and its outcome for every
//! start that joined it (`gated_start.rs` decides it; `process/list` shows it).
//!
//! Plain data and a watch channel: it never spawns, signals or writes to a transport.

use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use super::error::SessionError;
use super::spec::StartSpec;
use crate::process::ManagedProcess;
use crate::sync::lock;

/// The outcome of a pending start, once decided.
pub(super) type Outcome = Option<Result<Arc<ManagedProcess>, Arc<SessionError>>>;

/// A start waiting for the client's approval.
pub(crate) struct PendingStart {
    pub(super) spec: StartSpec,
    /// Its argv, shared with every `process/list` answer that shows it.
    pub(super) argv: Arc<[String]>,
    /// Its outcome, for starts that joined it; `None` until decided.
    pub(super) done: watch::Sender<Outcome>,
    /// Connections of the starts that joined: each opens delivery after writing its result.
    pub(super) joined: Mutex<Vec<u64>>,
}

impl PendingStart {
    pub(super) fn new(spec: &StartSpec) -> Arc<Self> {
        Arc::new(PendingStart {
            spec: spec.clone(),
            argv: Arc::from(spec.spawn.argv.as_slice()),
            done: watch::channel(None).0,
            joined: Mutex::new(Vec::new()),
        })
    }

    /// A start on connection `conn_id` joins this one.
    pub(super) fn join(&self, conn_id: u64) {
        lock(&self.joined).push(conn_id);
    }

    /// The connections whose starts joined, taken once the outcome is known.
    pub(super) fn take_joined(&self) -> Vec<u64> {
        std::mem::take(&mut *lock(&self.joined))
    }

    /// The outcome, once decided.
    pub(super) async fn outcome(&self) -> Result<Arc<ManagedProcess>, SessionError> {
        let mut rx = self.done.subscribe();
        let outcome = match rx.wait_for(Option::is_some).await {
            Ok(v) => v.clone(),
            // The sender lives in the pending start, which we hold: never taken.
            Err(_) => None,
        };
        match outcome {
            Some(Ok(p)) => Ok(p),
            Some(Err(e)) => Err(e.duplicate()),
            None => Err(SessionError::UnknownSession),
        }
    }
}
