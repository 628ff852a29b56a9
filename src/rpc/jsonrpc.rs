//! The JSON-RPC 2.0 envelope: classifying inbound messages and encoding outbound ones.
//!
//! This module knows nothing of methods or sessions. It never panics on input: every byte
//! sequence becomes either a [`Inbound`] or an [`RpcError`] with the id to answer to.

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::error::RpcError;

/// A classified inbound message.
#[derive(Debug)]
pub enum Inbound {
    /// A request: it gets exactly one response with `id`.
    Request {
        /// The id, echoed unchanged (an integer, or a string of at most
        /// [`MAX_REQUEST_ID_BYTES`]).
        id: Value,
        /// The method name.
        method: String,
        /// The params (`Null` when absent).
        params: Value,
    },
    /// A notification: no response.
    Notification {
        /// The method name.
        method: String,
        /// The params (`Null` when absent).
        params: Value,
    },
    /// A response from the peer. The server never sends requests, so for it this is a
    /// protocol violation; the client uses it.
    Response {
        /// The id it answers.
        id: Value,
        /// `Ok(result)` or `Err(error object)`.
        outcome: Result<Value, Value>,
    },
}

/// An inbound message that cannot be served, with the id to put on the error (`Null` when
/// unknown).
#[derive(Debug)]
pub struct Rejected {
    /// The id to answer to.
    pub id: Value,
    /// The error to send.
    pub error: RpcError,
}

/// The longest string id a peer may give a request, in bytes (`-32600` with id `null`
/// beyond): every response echoes its id, and responses wait in the connection's control
/// lane, bounded by count, after the request's bytes were given back.
pub const MAX_REQUEST_ID_BYTES: usize = 256;

/// The `-32600` message of an id that is not [`valid_id`].
pub const ID_RULE: &str = "id must be an integer or a string of at most 256 bytes";

/// An id a request may carry: an integer, or a string of at most [`MAX_REQUEST_ID_BYTES`].
pub fn valid_id(id: &Value) -> bool {
    match id {
        Value::String(s) => s.len() <= MAX_REQUEST_ID_BYTES,
        Value::Number(n) => n.is_i64() || n.is_u64(),
        _ => false,
    }
}

/// Classify one framed message.
pub fn parse_inbound(bytes: &[u8]) -> Result<Inbound, Rejected> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| Rejected {
        id: Value::Null,
        error: RpcError::parse_error(e),
    })?;
    let obj = match value {
        Value::Object(obj) => obj,
        Value::Array(_) => {
            return Err(Rejected {
                id: Value::Null,
                error: RpcError::invalid_request("batch requests are not supported"),
            })
        }
        _ => {
            return Err(Rejected {
                id: Value::Null,
                error: RpcError::invalid_request("a JSON-RPC message must be an object"),
            })
        }
    };
    classify(obj)
}

fn classify(mut obj: Map<String, Value>) -> Result<Inbound, Rejected> {
    let id = obj.remove("id");
    if let Some(id) = &id {
        if !valid_id(id) {
            return Err(Rejected {
                id: Value::Null,
                error: RpcError::invalid_request(ID_RULE),
            });
        }
    }
    if let Some(v) = obj.get("jsonrpc") {
        if v != "2.0" {
            return Err(Rejected {
                id: id.unwrap_or(Value::Null),
                error: RpcError::invalid_request("jsonrpc must be \"2.0\""),
            });
        }
    }
    match obj.remove("method") {
        Some(Value::String(method)) => {
            let params = obj.remove("params").unwrap_or(Value::Null);
            if !matches!(params, Value::Null | Value::Object(_)) {
                return Err(Rejected {
                    id: id.unwrap_or(Value::Null),
                    error: RpcError::invalid_params("params must be an object"),
                });
            }
            Ok(match id {
                Some(id) => Inbound::Request { id, method, params },
                None => Inbound::Notification { method, params },
            })
        }
        Some(_) => Err(Rejected {
            id: id.unwrap_or(Value::Null),
            error: RpcError::invalid_request("method must be a string"),
        }),
        None => {
            let id = id.unwrap_or(Value::Null);
            if let Some(result) = obj.remove("result") {
                Ok(Inbound::Response {
                    id,
                    outcome: Ok(result),
                })
            } else if let Some(error) = obj.remove("error") {
                Ok(Inbound::Response {
                    id,
                    outcome: Err(error),
                })
            } else {
                Err(Rejected {
                    id,
                    error: RpcError::invalid_request("missing method"),
                })
            }
        }
    }
}

/// Decode params into `T`; a failure names the member (`missing field processId`).
pub fn decode_params<T: DeserializeOwned>(params: Value) -> Result<T, RpcError> {
    let params = if params.is_null() {
        Value::Object(Map::new())
    } else {
        params
    };
    serde_json::from_value(params)
        .map_err(|e| RpcError::invalid_params(format!("invalid params: {}", e).replace('`', "")))
}

/// Encode a success response.
pub fn encode_response(id: &Value, result: &Value) -> String {
    let mut out = String::with_capacity(64);
    out.push_str("{\"jsonrpc\":\"2.0\",\"id\":");
    out.push_str(&id.to_string());
    out.push_str(",\"result\":");
    out.push_str(&result.to_string());
    out.push('}');
    out
}

/// Encode an error response.
pub fn encode_error(id: &Value, error: &RpcError) -> String {
    serde_json::json!({"jsonrpc": "2.0", "id": id, "error": error.to_json()}).to_string()
}

/// Encode a notification (server → client) or a request/notification (client → server).
pub fn encode_notification(method: &str, params: &Value) -> String {
    serde_json::json!({"jsonrpc": "2.0", "method": method, "params": params}).to_string()
}

/// Encode a request (client → server).
pub fn encode_request(id: &Value, method: &str, params: &Value) -> String {
    serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rpc::error::ErrorCode;

    fn rejected(bytes: &[u8]) -> Rejected {
        match parse_inbound(bytes) {
            Err(r) => r,
            Ok(i) => panic!("expected rejection, got {i:?}"),
        }
    }

    #[test]
    fn not_json_is_a_parse_error_with_null_id() {
        let r = rejected(b"{nope");
        assert_eq!(r.error.code, ErrorCode::ParseError);
        assert_eq!(r.id, Value::Null);
    }

    #[test]
    fn batch_is_invalid_request() {
        let r = rejected(br#"[{"jsonrpc":"2.0","id":1,"method":"server/info"}]"#);
        assert_eq!(r.error.code, ErrorCode::InvalidRequest);
        assert_eq!(r.id, Value::Null);
    }

    #[test]
    fn scalar_and_bad_ids_are_invalid() {
        assert_eq!(rejected(b"42").error.code, ErrorCode::InvalidRequest);
        assert_eq!(
            rejected(br#"{"id":1.5,"method":"x"}"#).error.code,
            ErrorCode::InvalidRequest
        );
        assert_eq!(
            rejected(br#"{"id":1,"method":7}"#).error.code,
            ErrorCode::InvalidRequest
        );
        let r = rejected(br#"{"id":"a","method":"x","params":[1]}"#);
        assert_eq!(r.error.code, ErrorCode::InvalidParams);
        assert_eq!(r.id, Value::String("a".into()));
    }

    #[test]
    fn jsonrpc_member_is_optional() {
        match parse_inbound(br#"{"id":"q","method":"server/info"}"#) {
            Ok(Inbound::Request { id, method, .. }) => {
                assert_eq!(id, Value::String("q".into()));
                assert_eq!(method, "server/info");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse_inbound(br#"{"method":"initialized"}"#),
            Ok(Inbound::Notification { .. })
        ));
    }

    #[test]
    fn decode_failure_names_the_member() {
        #[derive(serde::Deserialize, Debug)]
        #[serde(rename_all = "camelCase")]
        #[allow(dead_code)]
        struct P {
            process_id: String,
        }
        let e = decode_params::<P>(Value::Null).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidParams);
        assert!(
            e.message.contains("missing field processId"),
            "{}",
            e.message
        );
    }

    #[test]
    fn ids_are_echoed_unchanged() {
        let id: Value = serde_json::from_str("18446744073709551615").unwrap();
        let s = encode_response(&id, &serde_json::json!({}));
        assert!(s.contains("\"id\":18446744073709551615"), "{s}");
    }
}
