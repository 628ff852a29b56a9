//! Delivery to one connection: the connection writer that serves the control lane before the
//! event lane, pulling events of the processes in the connection's [`ReadySet`].
//!
//! The event lane is *pulled*, not pushed: events stay in each process's log (bounded by its
//! limits) and the writer takes them when the transport can accept more. So events are never
//! dropped, a slow client blocks the child (its pump finds no room), and the only per-
//! connection queue is the control lane, bounded by the connection's request limit.
//! The writer must never block on anything but the transport.
//!
//! What it writes goes to an [`Outlet`]: a network transport (each output delta encoded in the
//! form the connection asked for in `initialize`, `OutputForm`: a JSON text with base64, or a
//! binary message whose payload is the event's own `Bytes`; replays after a resume take the
//! same path) or the in-process transport's two bounded channels (typed values). A reply to an
//! in-process client that installed a receiver skips the writer (`hand_over`).

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::message::Outbound;
use super::outlet::{Outlet, OutletClosed, ReceiverSlot};
use crate::config::EVENT_BATCH_BYTES;
use crate::process::ready_set::WriterPhase;
use crate::process::ReadySet;

/// A message for the control lane: a response, an error or a server request, with an
/// optional action to run once it was handed to the transport (used to open a new process's
/// event delivery only after its `process/start` result, so the result precedes its output).
pub struct ControlMessage {
    /// The message.
    pub msg: Outbound,
    /// Run after the message was accepted by the transport.
    pub after_write: Option<Box<dyn FnOnce() + Send>>,
}

impl ControlMessage {
    /// A plain message.
    pub fn new(msg: Outbound) -> Self {
        ControlMessage {
            msg,
            after_write: None,
        }
    }
}

/// Hand a reply over: to the in-process client's receiver when it installed one (then run the
/// reply's after-write action, as the writer does once the transport took a message), else
/// through the control lane. `false` if the connection is gone.
pub(crate) async fn hand_over(
    control: &mpsc::Sender<ControlMessage>,
    receiver: Option<&ReceiverSlot>,
    m: ControlMessage,
) -> bool {
    if let Some(r) = receiver.and_then(|slot| slot.get()) {
        if !r.control(m.msg) {
            return false;
        }
        if let Some(after) = m.after_write {
            after();
        }
        return true;
    }
    control.send(m).await.is_ok()
}

/// Why the writer stopped.
#[derive(Debug, PartialEq, Eq)]
pub enum WriterEnd {
    /// The control lane closed (the connection is done) and everything was flushed.
    Finished,
    /// Cancelled by the connection (evicted, or shutdown).
    Cancelled,
    /// The transport failed.
    TransportFailed,
}

/// What the control lane holds right now.
enum Lane {
    /// Nothing queued.
    Empty,
    /// Closed: the connection is done.
    Closed,
}

/// Serve one connection's outlet until the control lane closes, `cancel` fires, or the
/// transport fails. Control messages go first; between output batches the writer looks at the
/// control lane again, so a response waits at most for one event already being written; and
/// while it waits for room for an event (an in-process event queue full and unread) it keeps
/// serving the control lane.
pub async fn run_writer(
    mut outlet: Outlet,
    mut control: mpsc::Receiver<ControlMessage>,
    ready: Arc<ReadySet>,
    cancel: CancellationToken,
) -> WriterEnd {
    // The phase is for the stall watchdog: `Outlet` around every wait for the transport,
    // `Idle` while asleep, `Busy` otherwise.
    let end = 'outer: loop {
        ready.set_phase(WriterPhase::Busy);
        // Control lane first, without waiting.
        match drain_control(&mut outlet, &mut control, &ready).await {
            Ok(Lane::Empty) => {}
            Ok(Lane::Closed) => break finish(&mut outlet).await,
            Err(OutletClosed) => break WriterEnd::TransportFailed,
        }
        if cancel.is_cancelled() {
            break WriterEnd::Cancelled;
        }
        if let Some(p) = ready.pop() {
            if !p.delivers_to(&ready) {
                continue;
            }
            // Whatever reached the control lane before this process became ready goes first:
            // on a resume, the session's pending server requests are queued before its
            // processes are marked ready, so they precede every replayed event.
            match drain_control(&mut outlet, &mut control, &ready).await {
                Ok(Lane::Empty) => {}
                Ok(Lane::Closed) => break finish(&mut outlet).await,
                Err(OutletClosed) => break WriterEnd::TransportFailed,
            }
            let events = p.peek_unwritten(EVENT_BATCH_BYTES);
            let mut last = None;
            for ev in &events {
                // Room for this event; control messages meanwhile go out at once.
                ready.set_phase(WriterPhase::Outlet);
                loop {
                    tokio::select! {
                        biased;
                        _ = cancel.cancelled() => break 'outer WriterEnd::Cancelled,
                        m = control.recv() => match m {
                            Some(m) => {
                                if write_control(&mut outlet, m, &ready).await.is_err() {
                                    break 'outer WriterEnd::TransportFailed;
                                }
                                ready.set_phase(WriterPhase::Outlet);
                            }
                            // The connection is done: no more events.
                            None => break 'outer finish(&mut outlet).await,
                        },
                        r = outlet.event_ready() => {
                            if r.is_err() {
                                break 'outer WriterEnd::TransportFailed;
                            }
                            break;
                        }
                    }
                }
                ready.set_phase(WriterPhase::Busy);
                if outlet.send_event(&p, ev).is_err() {
                    break 'outer WriterEnd::TransportFailed;
                }
                last = Some(ev.seq);
                // Let a response overtake the rest of this batch.
                if !control.is_empty() {
                    break;
                }
            }
            if let Some(seq) = last {
                if p.mark_written_by(&ready, seq) {
                    ready.push(p);
                }
            }
            continue;
        }
        // Nothing to do: push out what is buffered, then sleep until there is.
        ready.set_phase(WriterPhase::Outlet);
        if outlet.flush().await.is_err() {
            break WriterEnd::TransportFailed;
        }
        let notified = ready.notified();
        ready.set_phase(WriterPhase::Idle);
        tokio::select! {
            biased;
            _ = cancel.cancelled() => break WriterEnd::Cancelled,
            msg = control.recv() => match msg {
                Some(m) => {
                    if write_control(&mut outlet, m, &ready).await.is_err() {
                        break WriterEnd::TransportFailed;
                    }
                }
                None => break finish(&mut outlet).await,
            },
            _ = notified => {}
        }
    };
    ready.set_phase(WriterPhase::Closed);
    end
}

async fn finish(outlet: &mut Outlet) -> WriterEnd {
    outlet.close().await;
    WriterEnd::Finished
}

/// Write every queued control message.
async fn drain_control(
    outlet: &mut Outlet,
    control: &mut mpsc::Receiver<ControlMessage>,
    ready: &ReadySet,
) -> Result<Lane, OutletClosed> {
    loop {
        match control.try_recv() {
            Ok(m) => write_control(outlet, m, ready).await?,
            Err(mpsc::error::TryRecvError::Empty) => return Ok(Lane::Empty),
            Err(mpsc::error::TryRecvError::Disconnected) => return Ok(Lane::Closed),
        }
    }
}

async fn write_control(
    outlet: &mut Outlet,
    m: ControlMessage,
    ready: &ReadySet,
) -> Result<(), OutletClosed> {
    ready.set_phase(WriterPhase::Outlet);
    outlet.control(m.msg).await?;
    if let Some(after) = m.after_write {
        // The action may make events deliverable that must follow this message: flush so the
        // ordering holds on the wire even if a later write fails.
        outlet.flush().await?;
        after();
    }
    ready.set_phase(WriterPhase::Busy);
    Ok(())
}
