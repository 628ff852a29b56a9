//! The inlet of a connection: where its messages come from, and the byte charge each holds.
//! A network transport's framed messages are charged to the connection's request budget
//! (`request_budget.rs`) and decoded by the JSON codec here, at the edge; the in-process
//! transport's are typed already and not charged. It never parses a message before charging
//! it, and never holds one past decoding.

use futures_util::StreamExt;
use tokio::sync::mpsc;

use super::super::json_codec::decode_inbound;
use super::super::message::Inbound;
use super::super::request_budget::{admit, Admission};
use crate::bounds::{ByteBudget, Charge};
use crate::transport::{FramingError, MessageStream};

/// Where a connection's messages come from: a network transport's framed messages, charged
/// to the connection's byte budget and decoded by the JSON codec at this edge, or the
/// in-process transport's typed ones (not charged: see `request_budget.rs`).
pub(super) enum Inlet {
    Json {
        incoming: MessageStream,
        /// `max_pending_request_bytes`, a child of the server's inbound budget.
        budget: ByteBudget,
    },
    Local(mpsc::Receiver<Inbound>),
}

/// One message read, as the inlet lets it in: the message with the bytes it holds charged
/// (nothing in process), to be held until it is answered; or `None`, a message over budget with
/// nothing to answer (a notification or a response), gone. (An `Option` rather than an enum
/// with an empty variant: the message is large and this is moved once per read.)
pub(super) type Arrival = Option<(Inbound, Charge)>;

impl Inlet {
    pub(super) async fn next(&mut self) -> Option<Result<Arrival, FramingError>> {
        match self {
            Inlet::Json { incoming, budget } => {
                let bytes = match incoming.next().await? {
                    Ok(bytes) => bytes,
                    Err(e) => return Some(Err(e)),
                };
                // Charged before it is parsed, for its text and the most its parsed tree can
                // take; the text is dropped as soon as it is decoded.
                Some(Ok(match admit(budget, &bytes) {
                    Admission::Admit(charge) => Some((decode_inbound(&bytes), charge)),
                    Admission::Refuse { id, error } => {
                        Some((Inbound::Rejected { id, error }, Charge::none()))
                    }
                    Admission::Drop => None,
                }))
            }
            Inlet::Local(rx) => rx.recv().await.map(|m| Ok(Some((m, Charge::none())))),
        }
    }
}
