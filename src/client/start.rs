//! Starting a process ([`Client::start`]): its id's slot claimed until the start succeeds,
//! the start sent again after a lost connection (its pid looked up when the server says the
//! id is in use) and after a refusal for a limit that empties by itself, and the lookup that
//! keeps a start from running twice when an earlier attempt, on a connection since lost,
//! may have been carried out.
//!
//! It must never send a start again while anything says an earlier attempt started it, nor
//! leave its id's slot behind when it ends without a handle (README, "Decisions where the
//! spec is silent": "A refused start is tried again too").

use std::sync::Arc;

use tokio::sync::Notify;

use super::event_stream::ProcSlot;
use super::exclusive::ExclusiveInFlight;
use super::RECONNECT_INITIAL_DELAY;
use super::{write_retry, Client, ClientError, ProcessHandle, Shared, StartOptions};
use crate::connection::message::{Call, Reply};
use crate::connection::parse_cost;
use crate::rpc::messages::StartResult;
use crate::sync::lock;

/// A retried `process/start` answered `-32002` looks its pid up in `process/list`; while the
/// process is still being spawned it is not listed yet, and the start is tried again, at
/// most this many times, [`RECONNECT_INITIAL_DELAY`] apart (a spawn takes milliseconds).
pub const START_LOOKUPS: u32 = 20;

/// What an earlier attempt of a start did, as far as the client can tell
/// ([`Client::started_earlier`]).
enum Earlier {
    /// It started: this is its result (pid 0 when only its events say so).
    Started(StartResult),
    /// It did not, or not yet: the start goes again.
    SendAgain,
    /// Nothing says either way (the lookup failed): nothing is sent until something does.
    Unknown,
}

/// A start's claim on its id's slot ([`Client::start`]): freed on drop unless the start
/// succeeded ([`keep`](SlotClaim::keep)).
struct SlotClaim<'a> {
    shared: &'a Shared,
    id: &'a str,
    /// The slot this start made (its `notify`): only that one is freed, never a later
    /// start's under the same id (as `ProcessHandle`'s drop does).
    slot: &'a Arc<Notify>,
}

impl SlotClaim<'_> {
    /// The start succeeded: the slot is the handle's now.
    fn keep(self) {
        std::mem::forget(self);
    }
}

impl Drop for SlotClaim<'_> {
    fn drop(&mut self) {
        let mut procs = lock(&self.shared.procs);
        let ours = procs
            .get(self.id)
            .is_some_and(|s| Arc::ptr_eq(&s.notify, self.slot));
        let slot = if ours { procs.remove(self.id) } else { None };
        drop(procs);
        drop(slot);
    }
}

impl Client {
    /// Start a process and get a handle streaming its events.
    pub async fn start(&self, opts: StartOptions) -> Result<ProcessHandle, ClientError> {
        let id = opts.params.process_id.clone();
        // A live handle owns its id's slot: replacing it would leave that handle waiting on a
        // slot no event reaches any more.
        let (slot, flags) = {
            let mut procs = lock(&self.shared.procs);
            match procs.entry(id.clone()) {
                std::collections::hash_map::Entry::Occupied(_) => {
                    return Err(ClientError::ProcessIdInUse(id));
                }
                std::collections::hash_map::Entry::Vacant(v) => {
                    let s = v.insert(ProcSlot::new(0));
                    (s.notify.clone(), s.flags())
                }
            }
        };
        // Until the start succeeds the slot is the start's: any other end (an error, or this
        // future dropped, say during a retry's pause under the caller's timeout) frees the id,
        // else every later start with it failed `ProcessIdInUse` (review R5).
        let claim = SlotClaim {
            shared: &self.shared,
            id: &id,
            slot: &slot,
        };
        // The start is an exclusive request until it is answered, which may take a person's
        // time (an approval): the silence watch leaves the process alone meanwhile.
        let _starting = ExclusiveInFlight::new(&flags.exclusive_in_flight);
        let mut retried = false;
        let mut refusals = write_retry::WriteRetry::new(self.shared.opts.write_retry_for);
        // The least the server charges it, as it charges (text and parsed values): a start of
        // many short arguments costs far more than its text, and one that can never fit the
        // byte budget is given up at once (review R6). Counted at the first refusal only: an
        // in-process start is never encoded as JSON otherwise.
        let mut cost = None;
        let mut lookups = 0;
        let result = loop {
            let conn = self.connection().await?;
            let held = Some(_starting.another());
            match conn
                .call_typed_held(Call::Start(opts.params.clone()), held)
                .await
            {
                Ok(Reply::Start(r)) => break r,
                Ok(other) => {
                    return Err(ClientError::Protocol(format!(
                        "bad start result: {other:?}"
                    )));
                }
                Err(ClientError::ConnectionLost) if self.shared.target.can_reconnect() => {
                    retried = true;
                    continue;
                }
                // The first attempt started it before the link died: find its pid. While
                // it is still being spawned (or waits for approval) it has none yet: try the
                // start again (a start waiting for approval is joined).
                Err(ClientError::Rpc { code: -32002, .. }) if retried => {
                    match self.listed(&id).await?.flatten() {
                        Some(pid) => {
                            break StartResult {
                                process_id: id.clone(),
                                pid,
                            }
                        }
                        None if lookups < START_LOOKUPS => {
                            lookups += 1;
                            tokio::time::sleep(RECONNECT_INITIAL_DELAY).await;
                            continue;
                        }
                        None => {
                            break StartResult {
                                process_id: id.clone(),
                                pid: 0,
                            }
                        }
                    }
                }
                // Refused for a limit that empties as other requests are answered (many
                // uploads held by children that do not read): refused before it was carried
                // out, so this attempt started nothing. Tried again, with the pauses and bound
                // of a refused write; a start that can never fit the byte limit is given up at
                // once.
                Err(e) if write_retry::transient_limit(&e) => {
                    let cost = *cost.get_or_insert_with(|| {
                        serde_json::to_vec(&opts.params).map_or(0, |v| parse_cost(&v))
                    });
                    if let Some(r) = self
                        .after_transient_refusal(&id, e, retried, &mut refusals, cost)
                        .await?
                    {
                        break r;
                    }
                }
                // After a lost attempt, a limit may be that attempt's own doing (its process
                // counted against `maxProcesses`): looked up before it is reported.
                Err(e @ ClientError::Rpc { code: -32004, .. }) if retried => {
                    match self.started_earlier(&id).await {
                        Earlier::Started(r) => break r,
                        _ => return Err(e),
                    }
                }
                Err(e) => return Err(e),
            }
        };
        claim.keep();
        Ok(ProcessHandle::new(
            id,
            result.pid,
            self.clone(),
            flags,
            slot,
        ))
    }

    /// A start of `id` was refused `error`, for a limit that empties by itself (this attempt
    /// started nothing): wait the retry's pause, then `None` to send it again, or the result
    /// of an earlier attempt on a connection since lost (`retried`) that started it, which
    /// may have exited and been forgotten during the pauses: sent again, it would run twice
    /// (review R7). That is asked after each pause, and once more before the refusal is
    /// reported when the retries end (S3); while the lookup itself is refused, nothing is sent
    /// (S2).
    async fn after_transient_refusal(
        &self,
        id: &str,
        error: ClientError,
        retried: bool,
        refusals: &mut write_retry::WriteRetry,
        cost: usize,
    ) -> Result<Option<StartResult>, ClientError> {
        loop {
            let pause = refusals.after_refusal(&error, cost, true, write_retry::retry_now());
            if let Some(pause) = pause {
                tokio::time::sleep(pause).await;
            }
            let earlier = if retried {
                self.started_earlier(id).await
            } else {
                Earlier::SendAgain
            };
            return match (earlier, pause) {
                (Earlier::Started(r), _) => Ok(Some(r)),
                (Earlier::SendAgain, Some(_)) => Ok(None),
                (Earlier::Unknown, Some(_)) => continue,
                (_, None) => Err(error),
            };
        }
    }

    /// The process `id` as the server lists it: `None` when it is not listed, else its pid
    /// (`None` while it is being spawned or waits for approval).
    async fn listed(&self, id: &str) -> Result<Option<Option<u32>>, ClientError> {
        Ok(match self.call_typed(Call::List).await? {
            Reply::List(list) => list.into_iter().find(|p| p.process_id == id).map(|p| p.pid),
            _ => None,
        })
    }

    /// What an earlier attempt of the start of `id`, on a connection since lost, did: it
    /// started if events of it arrived (it may have exited and been forgotten since: no list
    /// needed) or the server lists it with a pid. Not listed and nothing heard, or listed
    /// without a pid yet (spawning, or waiting for approval: the start again is answered
    /// `-32002`, which is looked up), it goes again. A list that fails, with nothing heard,
    /// says nothing.
    async fn started_earlier(&self, id: &str) -> Earlier {
        let started = |pid| {
            Earlier::Started(StartResult {
                process_id: id.to_string(),
                pid,
            })
        };
        let heard = lock(&self.shared.procs)
            .get(id)
            .is_some_and(|s| s.delivery().received_seq > 0);
        match self.listed(id).await {
            Ok(Some(Some(pid))) => started(pid),
            _ if heard => started(0),
            Ok(_) => Earlier::SendAgain,
            Err(_) => Earlier::Unknown,
        }
    }
}
