//! The byte budget of a network connection's requests, applied at the JSON
//! edge: each message is charged, **before it is parsed**, for its text and the most its
//! parsed tree can take ([`parse_cost`]), under the connection's budget
//! (`max_pending_request_bytes`, a child of the server's `max_inbound_bytes`). The charge is
//! held until the request is answered or skipped; a message that does not fit is refused
//! unparsed (`-32004`, `data.limit` naming the full budget), except a small one that finishes
//! at once ([`SMALL_MESSAGE_BYTES`]), so that a client whose budget is full of stuck writes can
//! still `terminate` the child, or answer a `process/approve`.
//!
//! The in-process transport is not charged here: its messages are typed values the
//! application built in its own memory (a write's data is the caller's `Bytes`, never copied),
//! and its request queue (`IN_PROCESS_REQUEST_QUEUE`) with the processor's request slots bound
//! how many the server holds. These budgets guard against a peer's bytes; in process there is
//! no peer.
//!
//! This module decides only whether a message's bytes may be held: it must never parse a
//! request's params or send anything (the processor answers a refusal).

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::Value;

use super::json_codec::request_id;
use super::message::RequestId;
use crate::bounds::{ByteBudget, Charge};
use crate::config::{MAX_PROCESS_ID_BYTES, MAX_WRITE_ID_BYTES};
use crate::rpc::{Method, MethodClass, RpcError};

/// A message charged at most this many bytes ([`parse_cost`]) whose method finishes at once
/// (a control request, `process/ack`, `initialize`, `initialized`), or that is a response to a
/// server request (an approval answer), is never refused for bytes: it is charged even past the
/// budgets, so that a client whose budget is full of writes stuck on a child can still
/// `terminate` it (such a request is under 1 KiB). Control requests in flight are capped by
/// [`CONTROL_REQUEST_SLOTS`](super::processor::CONTROL_REQUEST_SLOTS) and the others are
/// answered by the reader itself, so a connection forces at most 65 × 16 KiB past its budget.
pub const SMALL_MESSAGE_BYTES: usize = 16 * 1024;

/// The name clients see in `data.limit` when a connection's request budget is full.
pub const REQUEST_BUDGET_NAME: &str = "maxPendingRequestBytes";

/// What one JSON value can take once parsed, beyond its text, at most: 128 bytes (a 32-byte
/// `Value` in an array that may have doubled, or a map entry with its key and B-tree share,
/// plus the smallest heap block of a short string). A message is charged its length plus this
/// for every `,` `:` `[` `{` in it (each starts at most one value), *before* it is parsed:
/// `[0,0,0,…]` would otherwise turn 16 MiB of text into half a gigabyte of tree. A write of
/// base64 has a dozen such bytes.
pub const PARSED_VALUE_BYTES: usize = 128;

/// The bytes a message is charged: its text, plus [`PARSED_VALUE_BYTES`] per value it can
/// hold (an upper bound of its parsed tree; the text is dropped once parsed).
pub fn parse_cost(bytes: &[u8]) -> usize {
    let values = memchr::memchr3_iter(b',', b':', b'[', bytes).count()
        + memchr::memchr_iter(b'{', bytes).count();
    bytes
        .len()
        .saturating_add(values.saturating_mul(PARSED_VALUE_BYTES))
}

/// What becomes of one framed message.
#[derive(Debug)]
pub(super) enum Admission {
    /// Decode it; the charge goes with it until it is answered.
    Admit(Charge),
    /// A request over budget: answer `-32004` (`id` `None`: one that was not a string or
    /// integer, answered with `null`), without parsing it.
    Refuse {
        /// The request's id.
        id: Option<RequestId>,
        /// The `-32004` naming the budget that is full.
        error: RpcError,
        /// A `process/write`'s process id and `writeId`, as far as they could be read: its
        /// process's later writes wait for it (`write_order.rs`).
        write: Option<RefusedWrite>,
    },
    /// A notification or a response over budget: nothing answers it.
    Drop,
}

/// Charge `bytes` to `budget`, or decide what to do with a message that does not fit.
pub(super) fn admit(budget: &ByteBudget, bytes: &[u8]) -> Admission {
    let cost = parse_cost(bytes);
    let over = match budget.try_charge(cost) {
        Ok(charge) => return Admission::Admit(charge),
        Err(over) => over,
    };
    // Only the envelope: serde skips the params without building them.
    let peek = serde_json::from_slice::<Peek>(bytes).ok();
    let method = peek.as_ref().and_then(|p| p.method.as_deref());
    let finishes_at_once = match method {
        Some(name) => Method::parse(name).is_some_and(|m| {
            matches!(
                m.class(),
                MethodClass::Control | MethodClass::Ack | MethodClass::Setup
            )
        }),
        // No method: a response to a server request (`process/approve`), which the reader
        // hands to the session at once; or not JSON-RPC, rejected at once.
        None => true,
    };
    if cost <= SMALL_MESSAGE_BYTES && finishes_at_once {
        return Admission::Admit(budget.force_charge(cost));
    }
    match peek {
        // A request: it has a method and an id.
        Some(Peek {
            id: Some(id),
            method: Some(method),
        }) => {
            tracing::debug!(limit = over.limit, bytes = bytes.len(), "request refused");
            let write = (method == Method::ProcessWrite.as_str())
                .then(|| serde_json::from_slice::<WritePeek>(bytes).ok())
                .flatten()
                .and_then(|w| {
                    // Ids past their limits are never kept: not copied either (a refused
                    // message's text may be up to `maxMessageBytes`).
                    let process_id = w
                        .params
                        .process_id
                        .filter(|p| p.len() <= MAX_PROCESS_ID_BYTES)?;
                    Some(RefusedWrite {
                        process_id: process_id.into_owned(),
                        write_id: w
                            .params
                            .write_id
                            .filter(|w| w.len() <= MAX_WRITE_ID_BYTES)
                            .map(Cow::into_owned),
                    })
                });
            Admission::Refuse {
                id: request_id(&id),
                error: RpcError::limit_reached(over.limit, over.max as u64),
                write,
            }
        }
        _ => {
            tracing::debug!(limit = over.limit, "message dropped over budget");
            Admission::Drop
        }
    }
}

/// What a binary write (`protocol.md` §5.2) holds beyond its bytes: its decoded ids and the
/// request's bookkeeping (no parsed tree: the chunk is a slice of the message).
pub const BINARY_WRITE_OVERHEAD_BYTES: usize = 1024;

/// Charge a binary write of `len` bytes its length and [`BINARY_WRITE_OVERHEAD_BYTES`], or
/// the `-32004` that refuses it like a JSON write that does not fit (a write never finishes at
/// once, so it is never charged past the budget).
pub(super) fn admit_binary_write(budget: &ByteBudget, len: usize) -> Result<Charge, RpcError> {
    let cost = len.saturating_add(BINARY_WRITE_OVERHEAD_BYTES);
    budget.try_charge(cost).map_err(|over| {
        tracing::debug!(limit = over.limit, bytes = len, "binary write refused");
        RpcError::limit_reached(over.limit, over.max as u64)
    })
}

/// A write refused for a limit, as far as its ids could be read (`write_order.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct RefusedWrite {
    /// Its process.
    pub(super) process_id: String,
    /// Its `writeId`, if it has one.
    pub(super) write_id: Option<String>,
}

/// The ids of a refused `process/write`: serde skips its chunk without allocating. (A string
/// id with escapes is unescaped into an owned one; both are bounded by `write_order.rs`
/// before they are kept.)
#[derive(Deserialize)]
struct WritePeek<'a> {
    #[serde(borrow)]
    params: WriteIds<'a>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WriteIds<'a> {
    #[serde(default, borrow)]
    process_id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    write_id: Option<Cow<'a, str>>,
}

/// The envelope of a message that did not fit its budget: enough to answer it, without
/// building its params (serde skips them without allocating).
#[derive(Deserialize)]
struct Peek<'a> {
    #[serde(default)]
    id: Option<Value>,
    #[serde(default, borrow)]
    method: Option<Cow<'a, str>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_costs_its_text_plus_its_values() {
        let write = format!(
            r#"{{"jsonrpc":"2.0","id":7,"method":"process/write","params":{{"processId":"p","chunk":"{}"}}}}"#,
            "QUJD".repeat(1000)
        );
        // `{` ×2, `:` ×6, `,` ×4.
        assert_eq!(
            parse_cost(write.as_bytes()),
            write.len() + 12 * PARSED_VALUE_BYTES
        );
        // A tree of tiny values costs far more than its text.
        let zeros = format!("[{}0]", "0,".repeat(1000));
        assert_eq!(
            parse_cost(zeros.as_bytes()),
            zeros.len() + 1001 * PARSED_VALUE_BYTES
        );
        let terminate = r#"{"jsonrpc":"2.0","id":1,"method":"process/terminate","params":{"processId":"some-process","graceMs":2000}}"#;
        assert!(parse_cost(terminate.as_bytes()) < SMALL_MESSAGE_BYTES);
    }

    #[test]
    fn a_refused_write_names_its_process_and_write_id_even_escaped() {
        let budget = full();
        let msg = br#"{"jsonrpc":"2.0","id":3,"method":"process/write","params":{"processId":"p\u0031","writeId":"s-7","chunk":"QUJD"}}"#;
        match admit(&budget, msg) {
            Admission::Refuse { write, .. } => assert_eq!(
                write,
                Some(RefusedWrite {
                    process_id: "p1".into(),
                    write_id: Some("s-7".into())
                })
            ),
            other => panic!("{other:?}"),
        }
        // Ids past their limits are not copied: a process id names nothing, a writeId none.
        let long = format!(
            r#"{{"jsonrpc":"2.0","id":3,"method":"process/write","params":{{"processId":"p","writeId":"{}","chunk":""}}}}"#,
            "w".repeat(MAX_WRITE_ID_BYTES + 1)
        );
        match admit(&budget, long.as_bytes()) {
            Admission::Refuse { write, .. } => assert_eq!(
                write,
                Some(RefusedWrite {
                    process_id: "p".into(),
                    write_id: None
                })
            ),
            other => panic!("{other:?}"),
        }
        let long = format!(
            r#"{{"jsonrpc":"2.0","id":3,"method":"process/write","params":{{"processId":"{}","chunk":""}}}}"#,
            "p".repeat(MAX_PROCESS_ID_BYTES + 1)
        );
        assert!(matches!(
            admit(&budget, long.as_bytes()),
            Admission::Refuse { write: None, .. }
        ));
        // Not a write, or a write whose params cannot be read: nothing named.
        for msg in [
            &br#"{"jsonrpc":"2.0","id":3,"method":"process/read","params":{"processId":"p"}}"#[..],
            br#"{"jsonrpc":"2.0","id":3,"method":"process/write","params":[1,2]}"#,
            br#"{"jsonrpc":"2.0","id":3,"method":"process/write","params":{"writeId":"s-1"}}"#,
            br#"{"jsonrpc":"2.0","id":3,"method":"process/write","params":{"processId":7}}"#,
        ] {
            match admit(&budget, msg) {
                Admission::Refuse { write, .. } => assert_eq!(write, None),
                other => panic!("{other:?}"),
            }
        }
    }

    /// A budget with no room at all.
    fn full() -> ByteBudget {
        ByteBudget::new("maxPendingRequestBytes", 0)
    }

    #[test]
    fn a_message_that_fits_is_charged_until_its_charge_drops() {
        let budget = ByteBudget::new("b", 1 << 20);
        let msg = br#"{"jsonrpc":"2.0","id":1,"method":"process/write","params":{}}"#;
        let charge = match admit(&budget, msg) {
            Admission::Admit(c) => c,
            other => panic!("{other:?}"),
        };
        assert_eq!(budget.used(), parse_cost(msg));
        drop(charge);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn over_budget_a_request_is_refused_naming_the_budget_with_its_id() {
        let budget = full();
        let msg = br#"{"jsonrpc":"2.0","id":"w-9","method":"process/write","params":{"processId":"p","chunk":""}}"#;
        match admit(&budget, msg) {
            Admission::Refuse { id, error, write } => {
                assert_eq!(id, Some(RequestId::Str("w-9".into())));
                assert_eq!(error.code.code(), -32004);
                assert_eq!(
                    error.data,
                    Some(serde_json::json!({"limit": "maxPendingRequestBytes", "value": 0}))
                );
                // A write without a writeId: its process is named, nothing to send again.
                assert_eq!(
                    write,
                    Some(RefusedWrite {
                        process_id: "p".into(),
                        write_id: None
                    })
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(budget.used(), 0);
        // An id that is neither a string nor an integer is answered with `null`.
        let msg = br#"{"jsonrpc":"2.0","id":[1],"method":"process/read","params":{}}"#;
        assert!(matches!(
            admit(&budget, msg),
            Admission::Refuse { id: None, .. }
        ));
        // So is a string id over MAX_REQUEST_ID_BYTES: the refusal never echoes it.
        let long = format!(
            r#"{{"jsonrpc":"2.0","id":"{}","method":"process/read","params":{{}}}}"#,
            "i".repeat(crate::rpc::jsonrpc::MAX_REQUEST_ID_BYTES + 1)
        );
        assert!(matches!(
            admit(&budget, long.as_bytes()),
            Admission::Refuse { id: None, .. }
        ));
    }

    #[test]
    fn over_budget_small_control_requests_and_approval_answers_are_charged_anyway() {
        let budget = full();
        for msg in [
            &br#"{"jsonrpc":"2.0","id":1,"method":"process/terminate","params":{"processId":"p"}}"#[..],
            br#"{"jsonrpc":"2.0","id":2,"method":"process/signal","params":{"processId":"p","signal":"INT"}}"#,
            br#"{"jsonrpc":"2.0","method":"process/ack","params":{"processId":"p","seq":3}}"#,
            br#"{"jsonrpc":"2.0","id":3,"method":"initialize","params":{}}"#,
            br#"{"jsonrpc":"2.0","id":"s-1","result":{"decision":"approve"}}"#,
        ] {
            match admit(&budget, msg) {
                Admission::Admit(c) => assert_eq!(c.bytes(), parse_cost(msg)),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn over_budget_large_or_queued_messages_are_not_forced() {
        let budget = full();
        // A write is never forced, however small.
        let write = br#"{"jsonrpc":"2.0","id":4,"method":"process/write","params":{"processId":"p","chunk":""}}"#;
        assert!(matches!(admit(&budget, write), Admission::Refuse { .. }));
        // A control request past SMALL_MESSAGE_BYTES is refused.
        let big = format!(
            r#"{{"jsonrpc":"2.0","id":5,"method":"server/info","params":{{"pad":"{}"}}}}"#,
            "a".repeat(SMALL_MESSAGE_BYTES)
        );
        assert!(matches!(
            admit(&budget, big.as_bytes()),
            Admission::Refuse { .. }
        ));
        // A large notification or response is dropped: nothing may answer it.
        let note = format!(
            r#"{{"jsonrpc":"2.0","method":"process/ack","params":{{"pad":"{}"}}}}"#,
            "a".repeat(SMALL_MESSAGE_BYTES)
        );
        assert!(matches!(admit(&budget, note.as_bytes()), Admission::Drop));
        let response = format!(
            r#"{{"jsonrpc":"2.0","id":"s-1","result":{{"pad":"{}"}}}}"#,
            "a".repeat(SMALL_MESSAGE_BYTES)
        );
        assert!(matches!(
            admit(&budget, response.as_bytes()),
            Admission::Drop
        ));
        assert_eq!(budget.used(), 0);
    }
}
