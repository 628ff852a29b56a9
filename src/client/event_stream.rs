//! Per-process event streams: what the client received for each process and has not yet
//! handed to the application, and how it gets there.
//!
//! # What this module owns
//!
//! - [`ProcSlot`], one process's buffer, and the routing of a connection's notifications into
//!   it: in-order output on the connection's reader ([`Client::fast_deliver`]), everything else
//!   on the router task ([`Client::route`]).
//! - Deduplication by `seq` (a resume replays what was not acknowledged) and gap filling with
//!   `process/read` (`gap_fill.rs`); a range the server no longer retains becomes
//!   [`ProcessEvent::Lost`].
//! - Handing events to the application one at a time ([`Client::next_event_of`]) and
//!   acknowledging what it consumed (`process/ack`, every [`ACK_EVERY_BYTES`] and at exit).
//!
//! # What it must never do
//!
//! - Show a byte twice or skip one silently.
//! - Make the connection's reader wait for the application: the buffer is bounded by the
//!   server's retention (see [`ProcSlot`]), not by blocking here.
//! - Acknowledge an event the application has not consumed: the ack is what lets the server
//!   release it and keep reading the child.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;
use tokio::sync::{mpsc, Notify};

use super::exclusive::ExclusiveCounts;
use super::rpc_connection::{Notification, RpcConnection};
use super::{AckPolicy, Client, ClientError, Shared};
use crate::connection::message::Note;
use crate::process::event_log::EVENT_OVERHEAD_BYTES;
use crate::rpc::messages::AckParams;
use crate::rpc::messages::ExitInfo;
use crate::rpc::messages::StreamName;
use crate::rpc::notification::{decode_exit_info, decode_omitted_params, decode_output_params};
use crate::rpc::Method;
use crate::sync::lock;

mod gap_fill;

/// Output consumed by the application before an ack is sent, counted as the server counts
/// its retention: each event's bytes plus [`EVENT_OVERHEAD_BYTES`].
///
/// With acks the server holds what it wrote until it is acknowledged, so this is memory the
/// server holds per stream (about this much, plus what is in flight): 64 KiB keeps a thousand
/// streams at once under 100 MB of it (it was 256 KiB: 256 MB for the fan-in benchmark), for
/// one small notification per chunk or two consumed. A server whose `retainedOutputBytes` is
/// smaller gets an ack at half its retention (`ack_threshold`); and whatever the count, a
/// client that has consumed everything it received acknowledges it before it waits for more,
/// so the server is never left waiting for an ack while the client waits for output.
pub const ACK_EVERY_BYTES: u64 = 64 * 1024;

/// The ack threshold for a server that retains `retained` bytes per process (from its
/// `initialize` result): [`ACK_EVERY_BYTES`], or half the retention if that is less.
pub(super) fn ack_threshold(retained: u64) -> u64 {
    match retained / 2 {
        0 => ACK_EVERY_BYTES,
        half => half.min(ACK_EVERY_BYTES),
    }
}

/// An event of one process, handed out exactly once, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum ProcessEvent {
    /// Output bytes.
    Output {
        /// Which stream.
        stream: StreamName,
        /// The bytes.
        data: Bytes,
    },
    /// The server read `omitted_bytes` of `stream` and did not keep them
    /// (`outputCapKeep: "headAndTail"`): the kept tail follows.
    Omitted {
        /// Which stream.
        stream: StreamName,
        /// How many bytes.
        omitted_bytes: u64,
    },
    /// The server no longer had events `from..=to` (only possible without acks).
    Lost {
        /// First missing seq.
        from: u64,
        /// Last missing seq.
        to: u64,
    },
    /// The exit notice; the last event.
    Exited(ExitInfo),
}

/// Client-side state of one process: events received but not yet consumed.
///
/// The connection's reader never waits for the application (so responses keep flowing while
/// output piles up); the buffer is bounded by the server instead: with acks, the server stops
/// reading the child once `retainedOutputBytes` are unacknowledged, and this client
/// acknowledges only what the application consumed.
pub(super) struct ProcSlot {
    buf: VecDeque<(u64, ProcessEvent)>,
    /// Highest seq received (deduplication of replays).
    received: u64,
    /// Highest seq handed to the application.
    consumed: u64,
    /// Highest seq acknowledged to the server.
    acked: u64,
    /// What was consumed since the last ack, in the server's cost units.
    unacked_cost: u64,
    /// The exit notice was received.
    done: bool,
    /// When this process last delivered an event (or was started, or asked about): the
    /// silence watch (`silence.rs`) asks the server about a process quiet for long.
    pub(super) heard: tokio::time::Instant,
    /// Shared with the process's controllers: set when the exit notice is received, after
    /// which they send nothing more (the server forgets the process once its exit is
    /// acknowledged, and a request then would only be answered "unknown process").
    pub(super) finished: Arc<AtomicBool>,
    /// Shared with the process's controllers: its exclusive requests (its start, writes,
    /// `closeStdin`, `resize`) awaiting their answer. A `process/read` would queue behind them
    /// (`protocol.md` §6), so the silence watch does not ask about the process meanwhile.
    pub(super) exclusive_in_flight: Arc<ExclusiveCounts>,
    pub(super) notify: Arc<Notify>,
}

/// What a process's slot shares with the handle and controllers of that process.
#[derive(Clone)]
pub(super) struct SlotFlags {
    /// [`ProcSlot::finished`].
    pub(super) finished: Arc<AtomicBool>,
    /// [`ProcSlot::exclusive_in_flight`].
    pub(super) exclusive_in_flight: Arc<ExclusiveCounts>,
}

/// A process the silence watch asks about ([`Client::quiet_processes`]).
pub(super) struct QuietProcess {
    pub(super) pid: String,
    /// The last seq received when it was picked.
    pub(super) received: u64,
    /// Its exclusive requests: checked again just before the question, as one may have
    /// begun while the watch asked about the processes before it.
    pub(super) exclusive: Arc<ExclusiveCounts>,
}

impl ProcSlot {
    /// A slot expecting events after `after` (0: from the first).
    pub(super) fn new(after: u64) -> Self {
        ProcSlot {
            buf: VecDeque::new(),
            received: after,
            consumed: after,
            acked: after,
            unacked_cost: 0,
            done: false,
            heard: tokio::time::Instant::now(),
            finished: Arc::new(AtomicBool::new(false)),
            exclusive_in_flight: Arc::default(),
            notify: Arc::new(Notify::new()),
        }
    }

    /// What the process's handle and controllers share with this slot.
    pub(super) fn flags(&self) -> SlotFlags {
        SlotFlags {
            finished: self.finished.clone(),
            exclusive_in_flight: self.exclusive_in_flight.clone(),
        }
    }
}

impl ProcSlot {
    /// What this slot says about delivery, for [`Client::delivery_state`].
    pub(super) fn delivery(&self) -> super::DeliveryState {
        super::DeliveryState {
            received_seq: self.received,
            consumed_seq: self.consumed,
            acked_seq: self.acked,
            buffered_events: self.buf.len(),
            exit_received: self.done,
            since_last_event: self.heard.elapsed(),
            connection: 0,
            transport: None,
        }
    }
}

/// The event a typed notification carries (`None` for a JSON one).
fn typed_event(n: Notification) -> Option<ProcessEvent> {
    match n {
        Notification::Output { stream, data, .. } => Some(ProcessEvent::Output { stream, data }),
        Notification::Omitted {
            stream,
            omitted_bytes,
            ..
        } => Some(ProcessEvent::Omitted {
            stream,
            omitted_bytes,
        }),
        Notification::Exited { info, .. } => Some(ProcessEvent::Exited(info)),
        Notification::Other { .. } => None,
    }
}

impl Client {
    /// In-order events (and replays) handled on the connection's reader: output, and the
    /// typed omission and exit notices of an in-process connection (the exit notice of a
    /// short process is most of what it delivers, and the router task would be one more
    /// thread hand-off on its way to the application). Anything out of order (a gap to fill)
    /// goes to the router task, and so does every event of a process while one of its gaps is
    /// being filled: the gap leaves `received` behind, so nothing after it is in order here.
    pub(super) fn fast_deliver(shared: &Shared, n: Notification) -> Option<Notification> {
        let (process_id, seq) = match &n {
            Notification::Output {
                process_id, seq, ..
            }
            | Notification::Omitted {
                process_id, seq, ..
            }
            | Notification::Exited {
                process_id, seq, ..
            } => (process_id, *seq),
            Notification::Other { .. } => return Some(n),
        };
        let mut procs = lock(&shared.procs);
        let wake = match procs.get_mut(process_id) {
            Some(slot) if !slot.done && Some(seq) == slot.received.checked_add(1) => {
                typed_event(n).map(|ev| Self::push(slot, seq, ev))
            }
            Some(slot) if slot.done || seq <= slot.received => None,
            None => None,
            Some(_) => return Some(n),
        };
        drop(procs);
        if let Some(w) = wake {
            w.notify_waiters();
        }
        None
    }

    /// Route notifications of one connection to process streams, deduplicated by seq.
    pub(super) async fn route(
        &self,
        conn: RpcConnection,
        mut rx: mpsc::UnboundedReceiver<Notification>,
    ) {
        while let Some(n) = rx.recv().await {
            match n {
                Notification::Output {
                    process_id,
                    seq,
                    stream,
                    data,
                } => {
                    let ev = ProcessEvent::Output { stream, data };
                    self.deliver(&conn, &process_id, seq, ev).await;
                }
                Notification::Exited {
                    process_id,
                    seq,
                    info,
                } => {
                    self.deliver(&conn, &process_id, seq, ProcessEvent::Exited(info))
                        .await;
                }
                Notification::Omitted {
                    process_id,
                    seq,
                    stream,
                    omitted_bytes,
                } => {
                    let ev = ProcessEvent::Omitted {
                        stream,
                        omitted_bytes,
                    };
                    self.deliver(&conn, &process_id, seq, ev).await;
                }
                Notification::Other { method, params } => {
                    let Some(pid) = params.get("processId").and_then(Value::as_str) else {
                        continue;
                    };
                    let Some(seq) = params.get("seq").and_then(Value::as_u64) else {
                        continue;
                    };
                    let ev = match Method::parse(&method) {
                        Some(Method::ProcessOutputDelta) => match decode_output_params(&params) {
                            Some((stream, data)) => ProcessEvent::Output { stream, data },
                            None => continue,
                        },
                        Some(Method::ProcessExited) => match decode_exit_info(&params) {
                            Some(info) => ProcessEvent::Exited(info),
                            None => continue,
                        },
                        Some(Method::ProcessOutputOmitted) => {
                            match decode_omitted_params(&params) {
                                Some((stream, omitted_bytes)) => ProcessEvent::Omitted {
                                    stream,
                                    omitted_bytes,
                                },
                                None => continue,
                            }
                        }
                        _ => continue,
                    };
                    self.deliver(&conn, pid, seq, ev).await;
                }
            }
        }
    }

    async fn deliver(&self, conn: &RpcConnection, pid: &str, seq: u64, ev: ProcessEvent) {
        let gap_from = {
            let mut procs = lock(&self.shared.procs);
            let Some(slot) = procs.get_mut(pid) else {
                return;
            };
            if seq <= slot.received || slot.done {
                return; // a replay after resume
            }
            if Some(seq) == slot.received.checked_add(1) {
                let wake = Self::push(slot, seq, ev);
                drop(procs);
                wake.notify_waiters();
                return;
            }
            slot.received
        };
        // A gap: fetch what is missing before going on.
        self.fill_gap(conn, pid, gap_from, seq).await;
        let mut procs = lock(&self.shared.procs);
        if let Some(slot) = procs.get_mut(pid) {
            if Some(seq) == slot.received.checked_add(1) && !slot.done {
                let wake = Self::push(slot, seq, ev);
                drop(procs);
                wake.notify_waiters();
            }
        }
    }

    /// Queue `ev` for the application; returns the notify to wake it with **once the
    /// caller released `procs`**. Woken under the lock, the application's thread (on another
    /// core) runs at once into that lock, sleeps on it and is woken a second time by its
    /// release: two thread wake-ups per event instead of one (README, "The exit delivered
    /// where it happens"). No wake is lost: a waiter enables its notification before it
    /// looks at `buf` under the lock.
    #[must_use]
    fn push(slot: &mut ProcSlot, seq: u64, ev: ProcessEvent) -> Arc<Notify> {
        if matches!(ev, ProcessEvent::Exited(_)) {
            slot.done = true;
            slot.finished.store(true, Ordering::Release);
        }
        slot.received = seq;
        slot.heard = tokio::time::Instant::now();
        slot.buf.push_back((seq, ev));
        slot.notify.clone()
    }

    /// Processes the application waits on (running, everything received consumed) that
    /// delivered nothing since `quiet_since`, with the last seq received; each is marked
    /// heard now, so it is asked about once per quiet period.
    pub(super) fn quiet_processes(&self, quiet_since: tokio::time::Instant) -> Vec<QuietProcess> {
        let now = tokio::time::Instant::now();
        let mut procs = lock(&self.shared.procs);
        procs
            .iter_mut()
            // A process with its start, a write (or `closeStdin`, `resize`) in flight is not
            // asked about: the read would wait behind it (`protocol.md` §6), for as long as the
            // child leaves its stdin unread or a person takes to approve the start, and the
            // watch would take a healthy connection for a wedged one. It is asked about once
            // that is answered, if still quiet.
            .filter(|(_, s)| {
                !s.done
                    && s.buf.is_empty()
                    && s.heard <= quiet_since
                    && s.exclusive_in_flight.idle()
            })
            .map(|(pid, s)| {
                s.heard = now;
                QuietProcess {
                    pid: pid.clone(),
                    received: s.received,
                    exclusive: s.exclusive_in_flight.clone(),
                }
            })
            .collect()
    }

    /// For each process, the highest seq the application consumed (if any).
    pub(super) fn consumed_positions(&self) -> Vec<(String, u64)> {
        lock(&self.shared.procs)
            .iter()
            .filter(|(_, slot)| slot.consumed > 0)
            .map(|(pid, slot)| (pid.clone(), slot.consumed))
            .collect()
    }

    /// The application took events up to `seq` of `pid`: acknowledge now and then, so the
    /// server releases them (and keeps the child going).
    fn consumed(&self, pid: &str, seq: u64, bytes: u64, exited: bool) {
        let ack = {
            let mut procs = lock(&self.shared.procs);
            let Some(slot) = procs.get_mut(pid) else {
                return;
            };
            slot.consumed = seq;
            slot.unacked_cost += bytes + EVENT_OVERHEAD_BYTES as u64;
            let retained = self
                .shared
                .server_retained
                .load(std::sync::atomic::Ordering::Relaxed);
            let (every, at_exit) = match self.shared.opts.ack_policy {
                AckPolicy::Eager => (ack_threshold(retained), true),
                AckPolicy::Lazy => ((retained / 2).max(1), false),
            };
            self.shared.opts.acks
                && ((exited && at_exit) || slot.unacked_cost >= every)
                && Self::take_ack(slot)
        };
        if ack {
            self.send_ack(pid, seq);
        }
    }

    /// Mark everything consumed as acknowledged; whether there was anything to acknowledge.
    fn take_ack(slot: &mut ProcSlot) -> bool {
        slot.unacked_cost = 0;
        if slot.consumed > slot.acked {
            slot.acked = slot.consumed;
            true
        } else {
            false
        }
    }

    fn send_ack(&self, pid: &str, seq: u64) {
        if let Some(conn) = lock(&self.shared.conn).clone() {
            let note = Note::Ack(Some(AckParams {
                process_id: pid.to_string(),
                seq,
            }));
            // Fire and forget: an ack lost with its connection is repeated after the
            // resume (`establish_over`). Queued here when there is room at once (in process:
            // no task, no hand-off); else a task waits for room, the application never does.
            if let Err(note) = conn.try_notify_typed(note) {
                tokio::spawn(async move {
                    let _ = conn.notify_typed(note).await;
                });
            }
        }
    }

    /// The next event of `pid` and its seq (a [`ProcessEvent::Lost`] carries the last seq of
    /// its range).
    pub(super) async fn next_event_of(&self, pid: &str) -> Option<(u64, ProcessEvent)> {
        loop {
            let notify = {
                let mut procs = lock(&self.shared.procs);
                let slot = procs.get_mut(pid)?;
                if let Some((seq, ev)) = slot.buf.pop_front() {
                    let bytes = match &ev {
                        ProcessEvent::Output { data, .. } => data.len() as u64,
                        _ => 0,
                    };
                    let exited = matches!(ev, ProcessEvent::Exited(_));
                    drop(procs);
                    self.consumed(pid, seq, bytes, exited);
                    if exited {
                        lock(&self.shared.procs).remove(pid);
                    }
                    return Some((seq, ev));
                }
                if lock(&self.shared.lost).is_some() {
                    return None;
                }
                // About to wait for more: acknowledge everything taken first. The server may
                // be holding the child back until it is (its retention counts unacknowledged
                // events); a client that waits while owing an ack would wait for ever. (The
                // lazy policy acks at half the server's retention, counted in the same units:
                // a server held back by retention has been owed that much.)
                if self.shared.opts.acks
                    && self.shared.opts.ack_policy == AckPolicy::Eager
                    && Self::take_ack(slot)
                {
                    let seq = slot.acked;
                    drop(procs);
                    self.send_ack(pid, seq);
                    continue;
                }
                slot.notify.clone()
            };
            let notified = notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            // Re-check after registering, so a push in between is not missed.
            let ready = {
                let procs = lock(&self.shared.procs);
                procs.get(pid).is_none_or(|s| !s.buf.is_empty())
            };
            if !ready && lock(&self.shared.lost).is_none() {
                notified.await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::{ClientOptions, Target};
    use crate::rpc::messages::ExitReason;

    fn exit_info() -> ExitInfo {
        ExitInfo {
            exit_code: Some(0),
            signal: None,
            reason: ExitReason::Exited,
            timed_out: false,
            output_drain_timed_out: false,
            stdout_bytes: 0,
            stderr_bytes: 0,
            dropped_bytes: 0,
            duration_ms: 1,
        }
    }

    fn exited(seq: u64) -> Notification {
        Notification::Exited {
            process_id: "p".into(),
            seq,
            info: exit_info(),
        }
    }

    fn buffered(client: &Client) -> Vec<(u64, ProcessEvent)> {
        lock(&client.shared.procs)
            .get("p")
            .map(|s| s.buf.iter().cloned().collect())
            .unwrap_or_default()
    }

    #[test]
    fn an_in_order_exit_notice_is_delivered_on_the_reader() {
        let client = Client::unconnected(Target::Ws("test".into()), ClientOptions::default());
        lock(&client.shared.procs).insert("p".into(), ProcSlot::new(0));
        let out = Notification::Omitted {
            process_id: "p".into(),
            seq: 1,
            stream: StreamName::Stdout,
            omitted_bytes: 5,
        };
        assert!(Client::fast_deliver(&client.shared, out).is_none());
        assert!(Client::fast_deliver(&client.shared, exited(2)).is_none());
        assert_eq!(
            buffered(&client),
            vec![
                (
                    1,
                    ProcessEvent::Omitted {
                        stream: StreamName::Stdout,
                        omitted_bytes: 5
                    }
                ),
                (2, ProcessEvent::Exited(exit_info())),
            ]
        );
        // A replay of it is dropped, not shown twice.
        assert!(Client::fast_deliver(&client.shared, exited(2)).is_none());
        assert_eq!(buffered(&client).len(), 2);
    }

    #[test]
    fn an_exit_notice_after_a_gap_goes_to_the_router() {
        let client = Client::unconnected(Target::Ws("test".into()), ClientOptions::default());
        lock(&client.shared.procs).insert("p".into(), ProcSlot::new(0));
        // Seq 1 never arrived: the router must fill the gap before the exit is shown.
        let back = Client::fast_deliver(&client.shared, exited(2));
        assert!(matches!(back, Some(Notification::Exited { seq: 2, .. })));
        assert!(buffered(&client).is_empty());
    }
}
