//! Delivery to one connection: the connection writer that serves the control lane before the
//! event lane, pulling events of the processes in the connection's [`ReadySet`].
//!
//! The event lane is *pulled*, not pushed: events stay in each process's log (bounded by its
//! limits) and the writer takes them when the transport can accept more. So events are never
//! dropped, a slow client blocks the child (its pump finds no room), and the only per-
//! connection queue is the control lane, bounded by the connection's request limit.
//! The writer must never block on anything but the transport.
//!
//! Each output delta is encoded here in the form the connection asked for in `initialize`
//! ([`OutputForm`]): a JSON text with base64 (`rpc/notification.rs`), or a binary message
//! (`protocol.md` §5.1, `rpc/binary_output.rs`) whose payload is the event's own `Bytes`,
//! shared with the log and never copied here. Replays after a resume take the same path, so
//! they come in the form of the connection that resumed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures_util::SinkExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::config::EVENT_BATCH_BYTES;
use crate::process::event_log::Event;
use crate::process::event_log::EventBody;
use crate::process::ManagedProcess;
use crate::process::ReadySet;
use crate::rpc::binary_output::encode_output_head;
use crate::rpc::notification::{encode_exit_notice, encode_output_delta};
use crate::transport::{MessageSink, OutMessage};

/// The form of one connection's output deltas: JSON (the default) until `initialize` asks for
/// binary on a transport that carries it. Set by the connection's reader before the session
/// is attached (so before any of its events can reach the writer), read by the writer.
#[derive(Debug, Default)]
pub struct OutputForm {
    binary: AtomicBool,
}

impl OutputForm {
    /// Output deltas as binary messages from now on (or as JSON again, for an `initialize`
    /// retried after a failed one).
    pub fn set_binary(&self, binary: bool) {
        // Release/acquire: the writer that pops a process pushed after this store (through
        // the ready set's lock) sees it.
        self.binary.store(binary, Ordering::Release);
    }

    /// Whether output deltas go out as binary messages.
    pub fn is_binary(&self) -> bool {
        self.binary.load(Ordering::Acquire)
    }
}

/// The wire form of one event: the exit notice is always JSON; an output delta is a binary
/// message (head built here, payload the event's chunk) or a JSON text.
fn encode_event(p: &ManagedProcess, ev: &Event, binary: bool) -> OutMessage {
    match &ev.body {
        EventBody::Output { stream, chunk } if binary => OutMessage::Binary {
            head: encode_output_head(&p.id, ev.seq, *stream),
            payload: chunk.clone(),
        },
        EventBody::Output { stream, chunk } => {
            OutMessage::Text(encode_output_delta(&p.id_json, ev.seq, *stream, chunk))
        }
        EventBody::Exited(info) => OutMessage::Text(encode_exit_notice(&p.id, ev.seq, info)),
    }
}

/// A message for the control lane: a response or error, with an optional action to run once
/// it was handed to the transport (used to open a new process's event delivery only after its
/// `process/start` result, so the result precedes its output).
pub struct ControlMessage {
    /// The encoded JSON text.
    pub text: String,
    /// Run after the text was accepted by the transport.
    pub after_write: Option<Box<dyn FnOnce() + Send>>,
}

impl ControlMessage {
    /// A plain message.
    pub fn new(text: String) -> Self {
        ControlMessage {
            text,
            after_write: None,
        }
    }
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

/// Serve one connection's transport until the control lane closes, `cancel` fires, or the
/// transport fails. Control messages go first; between output batches the writer looks at the
/// control lane again, so a response waits at most for one event already being written.
pub async fn run_writer(
    mut sink: MessageSink,
    mut control: mpsc::Receiver<ControlMessage>,
    ready: Arc<ReadySet>,
    form: Arc<OutputForm>,
    cancel: CancellationToken,
) -> WriterEnd {
    let end = loop {
        // Control lane first, without waiting.
        match drain_control(&mut sink, &mut control).await {
            Ok(true) => {}
            Ok(false) => break finish(&mut sink).await,
            Err(()) => break WriterEnd::TransportFailed,
        }
        if cancel.is_cancelled() {
            break WriterEnd::Cancelled;
        }
        if let Some(p) = ready.pop() {
            if !p.delivers_to(&ready) {
                continue;
            }
            let events = p.peek_unwritten(EVENT_BATCH_BYTES);
            let binary = form.is_binary();
            let mut last = None;
            let mut failed = false;
            for ev in &events {
                if sink.feed(encode_event(&p, ev, binary)).await.is_err() {
                    failed = true;
                    break;
                }
                last = Some(ev.seq);
                // Let a response overtake the rest of this batch.
                if !control.is_empty() {
                    break;
                }
            }
            if failed {
                break WriterEnd::TransportFailed;
            }
            if let Some(seq) = last {
                if p.mark_written_by(&ready, seq) {
                    ready.push(p);
                }
            }
            continue;
        }
        // Nothing to do: push out what is buffered, then sleep until there is.
        if sink.flush().await.is_err() {
            break WriterEnd::TransportFailed;
        }
        let notified = ready.notified();
        tokio::select! {
            biased;
            _ = cancel.cancelled() => break WriterEnd::Cancelled,
            msg = control.recv() => match msg {
                Some(m) => {
                    if write_control(&mut sink, m).await.is_err() {
                        break WriterEnd::TransportFailed;
                    }
                }
                None => break finish(&mut sink).await,
            },
            _ = notified => {}
        }
    };
    end
}

async fn finish(sink: &mut MessageSink) -> WriterEnd {
    let _ = sink.flush().await;
    let _ = sink.close().await;
    WriterEnd::Finished
}

/// Write every queued control message. `Ok(false)`: the lane is closed.
async fn drain_control(
    sink: &mut MessageSink,
    control: &mut mpsc::Receiver<ControlMessage>,
) -> Result<bool, ()> {
    loop {
        match control.try_recv() {
            Ok(m) => write_control(sink, m).await?,
            Err(mpsc::error::TryRecvError::Empty) => return Ok(true),
            Err(mpsc::error::TryRecvError::Disconnected) => return Ok(false),
        }
    }
}

async fn write_control(sink: &mut MessageSink, m: ControlMessage) -> Result<(), ()> {
    sink.feed(OutMessage::Text(m.text)).await.map_err(|_| ())?;
    if let Some(after) = m.after_write {
        // The action may make events deliverable that must follow this message: flush so the
        // ordering holds on the wire even if a later write fails.
        sink.flush().await.map_err(|_| ())?;
        after();
    }
    Ok(())
}
