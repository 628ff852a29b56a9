//! Gap filling: the events of a process missing before one that arrived (or after the last
//! one received, when the silence watch asks), fetched with `process/read` and handed on in
//! order; a range the server no longer retains, or will not give, becomes
//! [`ProcessEvent::Lost`].
//!
//! It must never ask the same question twice in a row (a server answering with nothing new,
//! or a `-32005` whose range does not move, is asked once: before, such a read went again for
//! ever and held every other process's delivery on the connection), nor trust a seq the
//! server sends with unchecked arithmetic.

use serde_json::Value;

use super::{Client, ClientError, ProcessEvent, RpcConnection};
use crate::connection::message::{Call, Reply};
use crate::process::event_log::EventBody;
use crate::rpc::messages::ReadParams;
use crate::sync::lock;

impl Client {
    /// Ask the server for the events of `pid` after `after` (the last one received) and hand
    /// them on as if delivered; how many arrived this way.
    pub(in crate::client) async fn fetch_after(
        &self,
        conn: &RpcConnection,
        pid: &str,
        after: u64,
    ) -> u64 {
        self.fill_gap(conn, pid, after, u64::MAX).await
    }

    /// Fetch the events of `pid` after `after` and before `upto` with `process/read`; how
    /// many it handed on.
    pub(super) async fn fill_gap(
        &self,
        conn: &RpcConnection,
        pid: &str,
        after: u64,
        upto: u64,
    ) -> u64 {
        let mut after = after;
        let mut pushed = 0;
        // (Checked arithmetic throughout: every seq here is the server's, `u64::MAX` too.)
        while after.saturating_add(1) < upto {
            let r = conn
                .call_typed(Call::Read(ReadParams {
                    process_id: pid.to_string(),
                    after_seq: after,
                    max_bytes: Some(1 << 20),
                    wait_ms: 0,
                }))
                .await;
            let events = match r {
                Ok(Reply::Read(r)) => r.events,
                Ok(_) => return pushed,
                Err(ClientError::Rpc {
                    code: -32005, data, ..
                }) => {
                    let to = data
                        .as_ref()
                        .and_then(|d| d.get("toSeq"))
                        .and_then(Value::as_u64);
                    // A `toSeq` that does not move past what was asked (or none) is the
                    // server's error: taken as it is, the same read went again for ever. In a
                    // gap before an event that arrived, the whole gap is then lost (and that
                    // event follows); asked after the last one received, nothing is known
                    // (review S6). One past the gap is kept to the gap.
                    let to = match to {
                        Some(to) if to > after => to.min(upto - 1),
                        _ if upto < u64::MAX => upto - 1,
                        _ => return pushed,
                    };
                    self.mark_lost(pid, after, to);
                    after = to;
                    continue;
                }
                Err(_) => return pushed,
            };
            let asked = after;
            for e in events {
                let seq = e.seq;
                if seq >= upto {
                    return pushed;
                }
                if seq <= after {
                    continue; // not what was asked for (review S4)
                }
                let ev = match e.body {
                    EventBody::Output { stream, chunk } => ProcessEvent::Output {
                        stream,
                        data: chunk,
                    },
                    EventBody::Omitted {
                        stream,
                        omitted_bytes,
                    } => ProcessEvent::Omitted {
                        stream,
                        omitted_bytes,
                    },
                    EventBody::Exited(info) => ProcessEvent::Exited(info),
                };
                let mut procs = lock(&self.shared.procs);
                if let Some(slot) = procs.get_mut(pid) {
                    if Some(seq) == slot.received.checked_add(1) {
                        let wake = Self::push(slot, seq, ev);
                        drop(procs);
                        wake.notify_waiters();
                        pushed += 1;
                    }
                }
                after = seq;
            }
            // Nothing past what was asked (none, or only events at or before it): asked
            // again, the server would answer the same, for ever (review S4). In a gap before
            // an event that arrived, what it does not give is lost, and that event follows.
            if after == asked {
                if upto < u64::MAX {
                    self.mark_lost(pid, after, upto - 1);
                }
                return pushed;
            }
        }
        pushed
    }

    /// Events `after + 1 ..= to` of `pid` will not arrive: the application is told so in
    /// their place ([`ProcessEvent::Lost`]), if nothing came since `after`. `to > after`.
    fn mark_lost(&self, pid: &str, after: u64, to: u64) {
        let mut procs = lock(&self.shared.procs);
        if let Some(slot) = procs.get_mut(pid) {
            if slot.received == after && to > after {
                // Not a real event: it does not take a seq of its own.
                slot.buf.push_back((
                    to,
                    ProcessEvent::Lost {
                        from: after + 1,
                        to,
                    },
                ));
                slot.received = to;
                slot.notify.notify_waiters();
            }
        }
    }
}
