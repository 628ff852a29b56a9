//! JSON-RPC error codes and the [`RpcError`] sent to a peer.
//!
//! Every error the server can send a peer is an [`RpcError`] built with the constructors here.
//! The layers below the connection return their own typed errors; `connection/error_map.rs`
//! is the one place they become an `RpcError`, so the code a client sees for a given failure
//! is decided in exactly one file. This module imports nothing above `rpc`.

use serde_json::{json, Value};

/// The error codes of `protocol.md` §2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorCode {
    /// The bytes are not JSON.
    ParseError,
    /// Not a JSON-RPC request object, or a request in the wrong connection state.
    InvalidRequest,
    /// No such method.
    MethodNotFound,
    /// Params did not decode.
    InvalidParams,
    /// A local failure (spawn, signal…); the message carries the OS error.
    Internal,
    /// No process with that id in the session.
    UnknownProcess,
    /// A process with that id is already known.
    ProcessExists,
    /// Unknown or expired session, or a wrong resume token.
    UnknownSession,
    /// A configured limit was reached; `data.limit` names it.
    LimitReached,
    /// The requested events were released; `data` gives the missing range.
    OutputNotRetained,
    /// The exec policy denied the process, or its approval was refused, timed out or lost
    /// with its session; `data.reason` says which.
    NotApproved,
    /// The process could not be started; `data` says what (`program`, `cwd`, `pty`,
    /// `other`), which path and which `errno`.
    StartFailed,
}

impl ErrorCode {
    /// The numeric JSON-RPC code.
    pub fn code(self) -> i64 {
        match self {
            ErrorCode::ParseError => -32700,
            ErrorCode::InvalidRequest => -32600,
            ErrorCode::MethodNotFound => -32601,
            ErrorCode::InvalidParams => -32602,
            ErrorCode::Internal => -32603,
            ErrorCode::UnknownProcess => -32001,
            ErrorCode::ProcessExists => -32002,
            ErrorCode::UnknownSession => -32003,
            ErrorCode::LimitReached => -32004,
            ErrorCode::OutputNotRetained => -32005,
            ErrorCode::NotApproved => -32006,
            ErrorCode::StartFailed => -32007,
        }
    }
}

/// The longest error message sent, in bytes: longer ones are cut (on a character boundary)
/// and end with `…`. Messages quote what the peer sent (a method name, a process id, the
/// value a decode refused), and an error waits in the connection's control lane, bounded by
/// count, after the request's bytes were given back: without a cut, a client that did not
/// read its responses made the server hold a copy of each of its (16 MiB) requests.
pub const MAX_ERROR_MESSAGE_BYTES: usize = 1024;

/// An error to send to the peer as a JSON-RPC error object.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message} ({code:?})")]
pub struct RpcError {
    /// Which error.
    pub code: ErrorCode,
    /// Human-readable message.
    pub message: String,
    /// Optional structured data.
    pub data: Option<Value>,
}

impl RpcError {
    /// A new error without data; a message over [`MAX_ERROR_MESSAGE_BYTES`] is cut.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        let mut message = message.into();
        if message.len() > MAX_ERROR_MESSAGE_BYTES {
            let mut end = MAX_ERROR_MESSAGE_BYTES - '…'.len_utf8();
            while !message.is_char_boundary(end) {
                end -= 1;
            }
            message.truncate(end);
            message.push('…');
        }
        RpcError {
            code,
            message,
            data: None,
        }
    }

    /// `-32700`.
    pub fn parse_error(detail: impl std::fmt::Display) -> Self {
        Self::new(ErrorCode::ParseError, format!("parse error: {detail}"))
    }

    /// `-32600`.
    pub fn invalid_request(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidRequest, message)
    }

    /// `-32601`.
    pub fn method_not_found(method: &str) -> Self {
        Self::new(
            ErrorCode::MethodNotFound,
            format!("method not found: {method}"),
        )
    }

    /// `-32602`.
    pub fn invalid_params(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidParams, message)
    }

    /// `-32603`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Internal, message)
    }

    /// `-32001`.
    pub fn unknown_process(id: &str) -> Self {
        Self::new(
            ErrorCode::UnknownProcess,
            format!("unknown process id {}", json!(id)),
        )
    }

    /// `-32002`.
    pub fn process_exists(id: &str) -> Self {
        Self::new(
            ErrorCode::ProcessExists,
            format!("process id {} already exists", json!(id)),
        )
    }

    /// `-32003`: one message for every cause, so a probe learns nothing.
    pub fn unknown_session() -> Self {
        Self::new(
            ErrorCode::UnknownSession,
            "unknown or expired session, or wrong resume token",
        )
    }

    /// `-32004` naming the limit.
    pub fn limit_reached(limit: &str, value: u64) -> Self {
        RpcError {
            code: ErrorCode::LimitReached,
            message: format!("limit reached: {limit} ({value})"),
            data: Some(json!({ "limit": limit, "value": value })),
        }
    }

    /// `-32004` for a write behind a refused one of the same process
    /// (`connection/write_order.rs`): `data.limit` `writeOrder`, `data.writeId` the refused
    /// write's id, to be sent again first.
    pub fn write_order(held_write_id: &str) -> Self {
        RpcError {
            code: ErrorCode::LimitReached,
            message: format!(
                "limit reached: writeOrder (this process's write {held_write_id:?} was refused \
                 for a limit; send it again, then the writes after it)"
            ),
            data: Some(json!({ "limit": "writeOrder", "writeId": held_write_id })),
        }
    }

    /// `-32005` with the exact missing range.
    pub fn output_not_retained(from_seq: u64, to_seq: u64) -> Self {
        RpcError {
            code: ErrorCode::OutputNotRetained,
            message: format!("output no longer retained: seq {from_seq}..={to_seq}"),
            data: Some(json!({ "fromSeq": from_seq, "toSeq": to_seq })),
        }
    }

    /// `-32006`: `data.reason` says why (a fixed phrase per cause), `data.rule` which policy
    /// rule asked or denied, when one did.
    pub fn not_approved(reason: &str, rule: Option<&str>) -> Self {
        let mut data = json!({ "reason": reason });
        if let Some(rule) = rule {
            data["rule"] = json!(rule);
        }
        RpcError {
            code: ErrorCode::NotApproved,
            message: format!("not approved: {reason}"),
            data: Some(data),
        }
    }

    /// `-32007`: the process could not be started. `what` is `program`, `cwd`, `pty` or
    /// `other`; `path` the program or directory concerned; `errno` the OS error's name
    /// (`ENOENT`), so a client maps `program` + `ENOENT` to 127 and `program` +
    /// `EACCES`/`ENOEXEC` to 126 without reading the message.
    pub fn start_failed(message: impl Into<String>, what: &str, path: &str, errno: &str) -> Self {
        let mut e = Self::new(ErrorCode::StartFailed, message);
        e.data = Some(json!({ "what": what, "path": path, "errno": errno }));
        e
    }

    /// `-32602` for a client's `value` of `member` above the server's `cap` (named by its
    /// `setting`): the message names all four, `data` carries `member` and `max` so a client
    /// can ask again within it.
    pub fn above_cap(member: &str, value: u64, setting: &str, cap: u64) -> Self {
        let mut e = Self::invalid_params(format!(
            "{member} {value} is above this server's {setting} ({cap})"
        ));
        e.data = Some(json!({ "member": member, "max": cap }));
        e
    }

    /// The `error` member of a JSON-RPC response.
    pub fn to_json(&self) -> Value {
        let mut v = json!({ "code": self.code.code(), "message": self.message });
        if let Some(data) = &self.data {
            v["data"] = data.clone();
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_messages_are_cut_on_a_character_boundary() {
        let at = "a".repeat(MAX_ERROR_MESSAGE_BYTES);
        assert_eq!(RpcError::invalid_params(at.clone()).message, at);
        // Two-byte characters: the cut may not split one.
        let e = RpcError::method_not_found(&"é".repeat(MAX_ERROR_MESSAGE_BYTES));
        assert!(
            e.message.len() <= MAX_ERROR_MESSAGE_BYTES,
            "{}",
            e.message.len()
        );
        assert!(e.message.starts_with("method not found: éé"));
        assert!(e.message.ends_with("é…"), "{}", e.message);
    }

    #[test]
    fn codes_match_the_protocol_table() {
        assert_eq!(ErrorCode::ParseError.code(), -32700);
        assert_eq!(ErrorCode::InvalidRequest.code(), -32600);
        assert_eq!(ErrorCode::MethodNotFound.code(), -32601);
        assert_eq!(ErrorCode::InvalidParams.code(), -32602);
        assert_eq!(ErrorCode::Internal.code(), -32603);
        assert_eq!(ErrorCode::UnknownProcess.code(), -32001);
        assert_eq!(ErrorCode::ProcessExists.code(), -32002);
        assert_eq!(ErrorCode::UnknownSession.code(), -32003);
        assert_eq!(ErrorCode::LimitReached.code(), -32004);
        assert_eq!(ErrorCode::OutputNotRetained.code(), -32005);
        assert_eq!(ErrorCode::NotApproved.code(), -32006);
        assert_eq!(ErrorCode::StartFailed.code(), -32007);
    }

    #[test]
    fn start_failures_carry_what_path_and_errno() {
        let e = RpcError::start_failed("program \"x\" not found in PATH", "program", "x", "ENOENT")
            .to_json();
        assert_eq!(e["code"], -32007);
        assert_eq!(
            e["data"],
            json!({"what": "program", "path": "x", "errno": "ENOENT"})
        );
        let e = RpcError::above_cap("sessionTtlMs", 5, "max_session_ttl_ms", 4).to_json();
        assert_eq!(e["code"], -32602);
        assert_eq!(
            e["message"],
            "sessionTtlMs 5 is above this server's max_session_ttl_ms (4)"
        );
        assert_eq!(e["data"], json!({"member": "sessionTtlMs", "max": 4}));
    }

    #[test]
    fn not_retained_carries_the_range() {
        let e = RpcError::output_not_retained(3, 9).to_json();
        assert_eq!(e["code"], -32005);
        assert_eq!(e["data"]["fromSeq"], 3);
        assert_eq!(e["data"]["toSeq"], 9);
    }

    #[test]
    fn messages_quote_ids() {
        assert_eq!(
            RpcError::unknown_process("x").message,
            "unknown process id \"x\""
        );
        assert_eq!(
            RpcError::process_exists("x").message,
            "process id \"x\" already exists"
        );
    }
}
