//! Where a connection's writer puts what it sends: an [`Outlet`], one per kind of edge.
//!
//! - [`Outlet::Json`]: a network transport (stdio, WebSocket, Noise stream). Control messages
//!   and events are encoded (`json_codec.rs`: JSON text, or a binary output message in the
//!   form the connection asked for, [`OutputForm`]) into the one sink, in the order written.
//! - [`Outlet::Local`]: the in-process transport (`local.rs`): control messages and events go
//!   to **two bounded channels**, as typed values. The writer waits for room in the event
//!   channel while still serving the control lane, so a control reply never waits behind a
//!   full event queue; an event is never dropped (the writer waits, the logs fill, the pumps
//!   stop reading, the children block). When the in-process client installed a receiver
//!   (`local.rs`, "Handed over directly"), both go to it instead, with no channel between.
//!
//! It must never drop an event or reorder the events of one process.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use futures_util::SinkExt;
use tokio::sync::mpsc;

use super::json_codec::{encode_event, encode_outbound};
use super::message::Outbound;
use crate::process::event_log::{Event, EventBody};
use crate::process::ManagedProcess;
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

/// An event as the in-process transport carries it: the chunk is the log's own `Bytes`.
#[derive(Debug, Clone, PartialEq)]
pub struct EventMessage {
    /// The process.
    pub process_id: String,
    /// Its seq.
    pub seq: u64,
    /// Output or the exit notice.
    pub body: EventBody,
}

/// A client that takes replies and events straight from the server's side (see the module
/// docs). Its methods run on the server's reader, a request's task or the writer: they must
/// not block or wait.
pub trait LocalReceiver: Send + Sync {
    /// A control-lane message (a result, an error, a server request). `false` when the client
    /// is gone: the connection's transport has failed.
    fn control(&self, m: Outbound) -> bool;
    /// An event, in `seq` order per process. `false` when the client is gone.
    fn event(&self, e: EventMessage) -> bool;
}

/// Where the client's [`LocalReceiver`] is installed, shared by both ends: set at most once,
/// by the client, before it sends anything.
pub(crate) type ReceiverSlot = Arc<OnceLock<Arc<dyn LocalReceiver>>>;

/// The writer's side of the in-process transport.
pub struct LocalOutlet {
    pub(super) control: mpsc::Sender<Outbound>,
    pub(super) events: mpsc::Sender<EventMessage>,
    /// Room for one event, reserved by [`Outlet::event_ready`].
    pub(super) permit: Option<mpsc::OwnedPermit<EventMessage>>,
    /// The client's receiver, when it takes messages directly.
    pub(super) receiver: ReceiverSlot,
}

/// The outlet's transport failed (or its client end is gone): the writer stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the connection's transport is gone")]
pub struct OutletClosed;

/// Where one connection's writer sends.
pub enum Outlet {
    /// A network transport, through the JSON codec.
    Json {
        /// The transport's sink.
        sink: MessageSink,
        /// The form of output deltas.
        form: Arc<OutputForm>,
    },
    /// The in-process transport.
    Local(LocalOutlet),
}

impl Outlet {
    /// Hand one control-lane message over (waiting for room).
    pub async fn control(&mut self, m: Outbound) -> Result<(), OutletClosed> {
        match self {
            Outlet::Json { sink, .. } => sink
                .feed(OutMessage::Text(encode_outbound(&m)))
                .await
                .map_err(|_| OutletClosed),
            Outlet::Local(l) => match l.receiver.get() {
                Some(r) => r.control(m).then_some(()).ok_or(OutletClosed),
                None => l.control.send(m).await.map_err(|_| OutletClosed),
            },
        }
    }

    /// Wait until one event can be handed over. Cancel-safe: the writer selects on it with the
    /// control lane.
    pub async fn event_ready(&mut self) -> Result<(), OutletClosed> {
        match self {
            Outlet::Json { sink, .. } => std::future::poll_fn(|cx| sink.as_mut().poll_ready(cx))
                .await
                .map_err(|_| OutletClosed),
            // A receiver takes every event at once: the client's own queues are bounded by
            // the server's retention (with acks), as behind the event channel.
            Outlet::Local(l) if l.receiver.get().is_some() => Ok(()),
            Outlet::Local(l) => {
                if l.permit.is_none() {
                    let permit = l
                        .events
                        .clone()
                        .reserve_owned()
                        .await
                        .map_err(|_| OutletClosed)?;
                    l.permit = Some(permit);
                }
                Ok(())
            }
        }
    }

    /// Hand one event of `p` over, after [`event_ready`](Self::event_ready).
    pub fn send_event(&mut self, p: &ManagedProcess, ev: &Event) -> Result<(), OutletClosed> {
        match self {
            Outlet::Json { sink, form } => sink
                .as_mut()
                .start_send(encode_event(p, ev, form.is_binary()))
                .map_err(|_| OutletClosed),
            Outlet::Local(l) => {
                let msg = EventMessage {
                    process_id: p.id.clone(),
                    seq: ev.seq,
                    body: ev.body.clone(),
                };
                if let Some(r) = l.receiver.get() {
                    return r.event(msg).then_some(()).ok_or(OutletClosed);
                }
                let permit = l.permit.take().ok_or(OutletClosed)?;
                permit.send(msg);
                Ok(())
            }
        }
    }

    /// Push out what is buffered.
    pub async fn flush(&mut self) -> Result<(), OutletClosed> {
        match self {
            Outlet::Json { sink, .. } => sink.flush().await.map_err(|_| OutletClosed),
            Outlet::Local(_) => Ok(()),
        }
    }

    /// Flush and close (the connection is done).
    pub async fn close(&mut self) {
        match self {
            Outlet::Json { sink, .. } => {
                let _ = sink.flush().await;
                let _ = sink.close().await;
            }
            Outlet::Local(l) => l.permit = None,
        }
    }
}
