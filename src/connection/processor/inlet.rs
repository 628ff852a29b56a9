//! The inlet of a connection: where its messages come from, and the byte charge each holds.
//! A network transport's framed messages are charged to the connection's request budget
//! (`request_budget.rs`) and decoded by the JSON codec here, at the edge, or, for a binary
//! write (`protocol.md` §5.2) on a connection that negotiated `binaryInput`, by its checked
//! decoder (`rpc/binary_write.rs`: the chunk a slice of the message, charged its length); the
//! in-process transport's are typed already and not charged. It never parses a message before
//! charging it (a binary write's head is checked first: that allocates only its two ids, at
//! most 511 bytes, and names the id a refusal answers), and never holds one past decoding.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::mpsc;

use super::super::json_codec::decode_inbound;
use super::super::message::{Call, Inbound, RequestId, WriteCall};
use super::super::request_budget::{admit, admit_binary_write, Admission};
use crate::bounds::{ByteBudget, Charge};
use crate::rpc::binary_output::is_binary_message;
use crate::rpc::binary_write::decode_binary_write;
use crate::rpc::RpcError;
use crate::transport::{FramingError, MessageStream};

/// Where a connection's messages come from: a network transport's framed messages, charged
/// to the connection's byte budget and decoded by the JSON codec at this edge, or the
/// in-process transport's typed ones (not charged: see `request_budget.rs`).
pub(super) enum Inlet {
    Json {
        incoming: MessageStream,
        /// `max_pending_request_bytes`, a child of the server's inbound budget.
        budget: ByteBudget,
        /// Set by `initialize` when the connection negotiated `binaryInput` (§5.2); read
        /// before each message (the reader runs `initialize` before it reads the next one).
        binary_input: Arc<AtomicBool>,
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
            Inlet::Json {
                incoming,
                budget,
                binary_input,
            } => {
                let bytes = match incoming.next().await? {
                    Ok(bytes) => bytes,
                    Err(e) => return Some(Err(e)),
                };
                if is_binary_message(&bytes) {
                    let negotiated = binary_input.load(Ordering::Relaxed);
                    return Some(Ok(binary_write(budget, negotiated, bytes)));
                }
                // Charged before it is parsed, for its text and the most its parsed tree can
                // take; the text is dropped as soon as it is decoded.
                Some(Ok(match admit(budget, &bytes) {
                    Admission::Admit(charge) => Some((decode_inbound(&bytes), charge)),
                    Admission::Refuse {
                        id,
                        error,
                        write: Some(w),
                    } => Some((
                        Inbound::RefusedWrite {
                            id,
                            error,
                            process_id: w.process_id,
                            write_id: w.write_id,
                        },
                        Charge::none(),
                    )),
                    Admission::Refuse { id, error, .. } => {
                        Some((Inbound::Rejected { id, error }, Charge::none()))
                    }
                    Admission::Drop => None,
                }))
            }
            Inlet::Local(rx) => rx.recv().await.map(|m| Ok(Some((m, Charge::none())))),
        }
    }
}

/// A binary message (§5.2): charged, then decoded into the `process/write` it stands for. A
/// malformed one, or one on a connection that did not negotiate `binaryInput`, is answered
/// `-32700` with id `null`, and the connection carries on.
fn binary_write(budget: &ByteBudget, negotiated: bool, bytes: Bytes) -> Arrival {
    if !negotiated {
        let error = RpcError::parse_error(
            "a binary message, but this connection did not negotiate \
             capabilities.binaryInput (send \"binaryInput\": true in initialize and check the \
             result's)",
        );
        return Some((Inbound::Rejected { id: None, error }, Charge::none()));
    }
    let len = bytes.len();
    let w = match decode_binary_write(bytes) {
        Ok(w) => w,
        Err(e) => {
            let error = RpcError::parse_error(e);
            return Some((Inbound::Rejected { id: None, error }, Charge::none()));
        }
    };
    let id = RequestId::from(w.id);
    let charge = match admit_binary_write(budget, len) {
        Ok(charge) => charge,
        Err(error) => {
            return Some((
                Inbound::RefusedWrite {
                    id: Some(id),
                    error,
                    process_id: w.process_id,
                    write_id: w.write_id,
                },
                Charge::none(),
            ));
        }
    };
    Some((
        Inbound::Request {
            id,
            call: Call::Write(WriteCall {
                process_id: w.process_id,
                data: w.data,
                write_id: w.write_id,
                close_stdin: w.close_stdin,
            }),
        },
        charge,
    ))
}
