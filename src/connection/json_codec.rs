//! The JSON edge of a connection: both directions of the typed messages of `message.rs`.
//!
//! Server side: [`decode_inbound`] (bytes → [`Inbound`]: the envelope classified by
//! `rpc/jsonrpc.rs`, params decoded by method, a write's base64 decoded), [`encode_outbound`]
//! ([`Outbound`] → JSON text) and [`encode_event`] (an event of a log → an output delta in the
//! connection's form, or an exit notice). Client side (the library's JSON connections):
//! [`encode_call`] and [`decode_reply`]. The JSON shapes are the protocol's (`protocol.md` §4):
//! the messages of the `-32602` errors and the member names are part of the contract.
//!
//! Only network connections use it: the in-process transport carries the typed messages as
//! they are. It must never be bypassed by the processor (which sees no JSON).

use base64::Engine;
use serde::de::DeserializeOwned;
use serde_json::{json, Map, Value};

use super::message::WriteCall;
use super::message::{Call, Inbound, Note, Outbound, ReadReply, Reply, RequestId, ServerInfo};
use crate::process::event_log::{Event, EventBody};
use crate::process::{ManagedProcess, WriteStatus};
use crate::rpc::binary_output::encode_output_head;
use crate::rpc::jsonrpc::{
    decode_params, encode_error, encode_request, encode_response, parse_inbound, valid_id,
    Inbound as Raw, ID_RULE,
};
use crate::rpc::messages::{ApprovalDecision, ApproveResult, StartResult, WriteParams};
use crate::rpc::notification::{
    decode_read_event, encode_exit_notice, encode_output_delta, encode_output_omitted,
    exit_event_json, omitted_event_json, output_event_json, ReadEvent,
};
use crate::rpc::write_request::decode_write_chunk;
use crate::rpc::{Method, RpcError};
use crate::session::{ApprovalAnswer, ListedProcess, ListedState};
use crate::transport::OutMessage;

/// A JSON id as a [`RequestId`] (`None` for anything else: `parse_inbound` lets only integers
/// and strings of at most `MAX_REQUEST_ID_BYTES` through as request ids).
pub fn request_id(v: &Value) -> Option<RequestId> {
    match v {
        Value::String(s) if valid_id(v) => Some(RequestId::Str(s.clone())),
        Value::String(_) => None,
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Some(RequestId::Int(i)),
            (None, Some(u)) => Some(RequestId::UInt(u)),
            _ => None,
        },
        _ => None,
    }
}

/// A [`RequestId`] as JSON.
pub fn id_value(id: Option<&RequestId>) -> Value {
    match id {
        Some(RequestId::Int(i)) => json!(i),
        Some(RequestId::UInt(u)) => json!(u),
        Some(RequestId::Str(s)) => json!(s),
        None => Value::Null,
    }
}

/// One framed message from a client.
pub fn decode_inbound(bytes: &[u8]) -> Inbound {
    match parse_inbound(bytes) {
        Err(r) => Inbound::Rejected {
            id: request_id(&r.id),
            error: r.error,
        },
        Ok(Raw::Request { id, method, params }) => match request_id(&id) {
            Some(id) => Inbound::Request {
                id,
                call: decode_call(&method, params),
            },
            None => Inbound::Rejected {
                id: None,
                error: RpcError::invalid_request(ID_RULE),
            },
        },
        Ok(Raw::Notification { method, params }) => {
            Inbound::Notification(match Method::parse(&method) {
                Some(Method::Initialized) => Note::Initialized,
                Some(Method::ProcessAck) => Note::Ack(decode_params(params).ok()),
                _ => Note::Other(method),
            })
        }
        Ok(Raw::Response { id, outcome }) => Inbound::Response {
            id: request_id(&id),
            answer: match outcome {
                Ok(result) => match serde_json::from_value::<ApproveResult>(result) {
                    Ok(ApproveResult {
                        decision: ApprovalDecision::Approve,
                    }) => ApprovalAnswer::Approve,
                    Ok(ApproveResult {
                        decision: ApprovalDecision::Deny,
                    }) => ApprovalAnswer::Deny,
                    Err(_) => ApprovalAnswer::Unreadable,
                },
                Err(_) => ApprovalAnswer::Unreadable,
            },
        },
    }
}

/// A request's params, decoded for its method (`params` `null` is `{}`). A method not served
/// to clients is [`Call::NotFound`]; params that do not decode are [`Call::Invalid`] with the
/// `-32602` naming the member.
pub fn decode_call(name: &str, params: Value) -> Call {
    let Some(method) = Method::parse(name) else {
        return Call::NotFound(name.to_string());
    };
    let process_id = params
        .get("processId")
        .and_then(Value::as_str)
        .map(str::to_string);
    let invalid = |error: RpcError| Call::Invalid {
        method,
        process_id: process_id.clone(),
        error,
    };
    fn typed<T: DeserializeOwned>(
        params: Value,
        f: impl FnOnce(T) -> Call,
    ) -> Result<Call, RpcError> {
        decode_params(params).map(f)
    }
    let call = match method {
        Method::Initialize => typed(params, Call::Initialize),
        Method::ServerInfo => Ok(Call::ServerInfo),
        Method::SessionClose => Ok(Call::SessionClose),
        Method::ProcessList => Ok(Call::List),
        Method::ProcessStart => typed(params, Call::Start),
        Method::ProcessRead => typed(params, Call::Read),
        Method::ProcessCloseStdin => typed(params, Call::CloseStdin),
        Method::ProcessResize => typed(params, Call::Resize),
        Method::ProcessSignal => typed(params, Call::Signal),
        Method::ProcessTerminate => typed(params, Call::Terminate),
        Method::ProcessAck => Ok(Call::Ack(decode_params(params).ok())),
        Method::ProcessWrite => decode_params::<WriteParams>(params).and_then(|p| {
            let data = decode_write_chunk(&p.chunk).map_err(RpcError::invalid_params)?;
            Ok(Call::Write(WriteCall {
                process_id: p.process_id,
                data: data.into(),
                write_id: p.write_id,
                close_stdin: false,
            }))
        }),
        // Not something a client may call.
        Method::Initialized
        | Method::ProcessOutputDelta
        | Method::ProcessExited
        | Method::ProcessOutputOmitted
        | Method::ProcessApprove => Ok(Call::NotFound(name.to_string())),
    };
    call.unwrap_or_else(invalid)
}

/// A control-lane message as JSON text.
pub fn encode_outbound(m: &Outbound) -> String {
    match m {
        Outbound::Result { id, reply } => encode_response(&id_value(Some(id)), &reply_value(reply)),
        Outbound::Error { id, error } => encode_error(&id_value(id.as_ref()), error),
        Outbound::Request { id, params } => {
            let params = serde_json::to_value(&**params).unwrap_or(Value::Null);
            encode_request(&json!(id), Method::ProcessApprove.as_str(), &params)
        }
    }
}

/// An event of `p`'s log in the connection's form: an output delta as a binary message
/// (`protocol.md` §5.1: head built here, payload the event's own chunk) or JSON text with
/// base64; the exit notice always JSON.
pub fn encode_event(p: &ManagedProcess, ev: &Event, binary: bool) -> OutMessage {
    match &ev.body {
        EventBody::Output { stream, chunk } if binary => OutMessage::Binary {
            head: encode_output_head(&p.id, ev.seq, *stream),
            payload: chunk.clone(),
        },
        EventBody::Output { stream, chunk } => {
            OutMessage::Text(encode_output_delta(&p.id_json, ev.seq, *stream, chunk))
        }
        // JSON in both forms (`protocol.md` §5): at most once per stream.
        EventBody::Omitted {
            stream,
            omitted_bytes,
        } => OutMessage::Text(encode_output_omitted(
            &p.id,
            ev.seq,
            *stream,
            *omitted_bytes,
        )),
        EventBody::Exited(info) => OutMessage::Text(encode_exit_notice(&p.id, ev.seq, info)),
    }
}

/// A result's `result` member.
pub fn reply_value(reply: &Reply) -> Value {
    match reply {
        Reply::Initialize(r) => serde_json::to_value(r).unwrap_or(Value::Null),
        Reply::Start(r) => serde_json::to_value(r).unwrap_or(Value::Null),
        Reply::Read(r) => {
            let events: Vec<Value> = r
                .events
                .iter()
                .map(|ev| match &ev.body {
                    EventBody::Output { stream, chunk } => {
                        output_event_json(ev.seq, *stream, chunk)
                    }
                    EventBody::Omitted {
                        stream,
                        omitted_bytes,
                    } => omitted_event_json(ev.seq, *stream, *omitted_bytes),
                    EventBody::Exited(info) => exit_event_json(ev.seq, info),
                })
                .collect();
            json!({"events": events, "nextSeq": r.next_seq, "running": r.running, "exited": r.exited})
        }
        Reply::Write(status) => json!({ "status": status.as_str() }),
        Reply::Terminate { running } => json!({ "running": running }),
        Reply::List(list) => {
            let procs: Vec<Value> = list.iter().map(list_entry).collect();
            json!({ "processes": procs })
        }
        Reply::ServerInfo(i) => json!({
            "serverVersion": i.server_version,
            "protocolVersion": i.protocol_version,
            "hostname": i.hostname,
            "os": i.os,
            "pid": i.pid,
            "uptimeMs": i.uptime_ms,
            "sessions": i.sessions,
            "processes": i.processes,
        }),
        Reply::Empty => json!({}),
    }
}

/// A `process/list` entry (`pid` is `null` while pending approval).
fn list_entry(p: &ListedProcess) -> Value {
    json!({
        "processId": p.process_id,
        "pid": p.pid,
        "argv": &p.argv[..],
        "tty": p.tty,
        "state": p.state.as_str(),
        "nextSeq": p.next_seq,
        "exitCode": p.exit_code,
        "signal": p.signal,
    })
}

// ---------------------------------------------------------------------------------------------
// Client side.

/// A request as JSON text (the client library's JSON connections).
pub fn encode_call(id: u64, call: &Call) -> Result<String, RpcError> {
    let (method, params) = call_value(call)?;
    Ok(encode_request(&json!(id), method.as_str(), &params))
}

/// A call's method and params as JSON (`Call::NotFound` and `Call::Invalid` are not sent).
pub fn call_value(call: &Call) -> Result<(Method, Value), RpcError> {
    let to = |v: Result<Value, serde_json::Error>| v.map_err(|e| RpcError::internal(e.to_string()));
    let params = match call {
        Call::Initialize(p) => to(serde_json::to_value(p))?,
        Call::ServerInfo | Call::SessionClose | Call::List => Value::Object(Map::new()),
        Call::Start(p) => to(serde_json::to_value(p))?,
        Call::Read(p) => to(serde_json::to_value(p))?,
        Call::Write(w) => {
            let mut v = json!({
                "processId": w.process_id,
                "chunk": base64::engine::general_purpose::STANDARD.encode(&w.data),
            });
            if let Some(id) = &w.write_id {
                v["writeId"] = json!(id);
            }
            v
        }
        Call::CloseStdin(p) => to(serde_json::to_value(p))?,
        Call::Resize(p) => to(serde_json::to_value(p))?,
        Call::Signal(p) => to(serde_json::to_value(p))?,
        Call::Terminate(p) => {
            let mut v = json!({"processId": p.process_id});
            if let Some(g) = p.grace_ms {
                v["graceMs"] = json!(g);
            }
            v
        }
        Call::Ack(p) => to(serde_json::to_value(p))?,
        Call::Invalid { error, .. } => return Err(error.clone()),
        Call::NotFound(name) => return Err(RpcError::method_not_found(name)),
    };
    let method = call
        .method()
        .ok_or_else(|| RpcError::internal("no method"))?;
    Ok((method, params))
}

/// A result of `method` read back into a [`Reply`]; the error says what did not decode.
pub fn decode_reply(method: Method, v: Value) -> Result<Reply, String> {
    fn from<T: DeserializeOwned>(v: Value) -> Result<T, String> {
        serde_json::from_value(v).map_err(|e| e.to_string())
    }
    let u64_of = |v: &Value, k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
    let bool_of = |v: &Value, k: &str| v.get(k).and_then(Value::as_bool).unwrap_or(false);
    Ok(match method {
        Method::Initialize => Reply::Initialize(from(v)?),
        Method::ProcessStart => Reply::Start(from::<StartResult>(v)?),
        Method::ProcessRead => {
            let mut events = Vec::new();
            for e in v
                .get("events")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let (seq, ev) = decode_read_event(e).ok_or("bad read event")?;
                events.push(Event {
                    seq,
                    body: match ev {
                        ReadEvent::Output { stream, data } => EventBody::Output {
                            stream,
                            chunk: data,
                        },
                        ReadEvent::Omitted {
                            stream,
                            omitted_bytes,
                        } => EventBody::Omitted {
                            stream,
                            omitted_bytes,
                        },
                        ReadEvent::Exited(info) => EventBody::Exited(info),
                    },
                });
            }
            Reply::Read(ReadReply {
                events,
                next_seq: u64_of(&v, "nextSeq"),
                running: bool_of(&v, "running"),
                exited: bool_of(&v, "exited"),
            })
        }
        Method::ProcessWrite => Reply::Write(match v.get("status").and_then(Value::as_str) {
            Some("accepted") => WriteStatus::Accepted,
            Some("stdinClosed") => WriteStatus::StdinClosed,
            Some("exited") => WriteStatus::Exited,
            other => return Err(format!("bad write status {other:?}")),
        }),
        Method::ProcessTerminate => Reply::Terminate {
            running: bool_of(&v, "running"),
        },
        Method::ProcessList => {
            let mut out = Vec::new();
            for p in v
                .get("processes")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let state = match p.get("state").and_then(Value::as_str) {
                    Some("running") => ListedState::Running,
                    Some("exited") => ListedState::Exited,
                    Some("pendingApproval") => ListedState::PendingApproval,
                    other => return Err(format!("bad process state {other:?}")),
                };
                out.push(ListedProcess {
                    process_id: p["processId"].as_str().unwrap_or("").to_string(),
                    pid: p
                        .get("pid")
                        .and_then(Value::as_u64)
                        .and_then(|n| u32::try_from(n).ok()),
                    argv: from::<Vec<String>>(p.get("argv").cloned().unwrap_or(json!([])))?.into(),
                    tty: bool_of(p, "tty"),
                    state,
                    next_seq: u64_of(p, "nextSeq"),
                    exit_code: p
                        .get("exitCode")
                        .and_then(Value::as_i64)
                        .and_then(|c| i32::try_from(c).ok()),
                    signal: p.get("signal").and_then(Value::as_str).map(str::to_string),
                });
            }
            Reply::List(out)
        }
        Method::ServerInfo => Reply::ServerInfo(ServerInfo {
            server_version: v["serverVersion"].as_str().unwrap_or("").to_string(),
            protocol_version: u32::try_from(u64_of(&v, "protocolVersion")).unwrap_or(0),
            hostname: v["hostname"].as_str().unwrap_or("").to_string(),
            os: v["os"].as_str().unwrap_or("").to_string(),
            pid: u32::try_from(u64_of(&v, "pid")).unwrap_or(0),
            uptime_ms: u64_of(&v, "uptimeMs"),
            sessions: usize::try_from(u64_of(&v, "sessions")).unwrap_or(0),
            processes: usize::try_from(u64_of(&v, "processes")).unwrap_or(0),
        }),
        _ => Reply::Empty,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_survive_the_round_trip_through_json() {
        let write = Call::Write(WriteCall {
            process_id: "p".into(),
            data: bytes::Bytes::from_static(b"\x00\xffhi"),
            write_id: Some("w-1".into()),
            close_stdin: false,
        });
        let text = encode_call(7, &write).unwrap();
        match decode_inbound(text.as_bytes()) {
            Inbound::Request {
                id: RequestId::Int(7),
                call: Call::Write(w),
            } => {
                assert_eq!(&w.data[..], b"\x00\xffhi");
                assert_eq!(w.write_id.as_deref(), Some("w-1"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn undecodable_params_keep_the_process_id_and_name_the_member() {
        match decode_call("process/write", json!({"processId": "p", "chunk": "!!"})) {
            Call::Invalid {
                method: Method::ProcessWrite,
                process_id: Some(p),
                error,
            } => {
                assert_eq!(p, "p");
                assert!(
                    error.message.starts_with("chunk is not valid base64"),
                    "{}",
                    error.message
                );
            }
            other => panic!("{other:?}"),
        }
        match decode_call("process/start", json!({})) {
            Call::Invalid {
                error,
                process_id: None,
                ..
            } => {
                assert!(
                    error.message.contains("missing field processId"),
                    "{}",
                    error.message
                )
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            decode_call("process/exited", Value::Null),
            Call::NotFound(_)
        ));
        assert!(matches!(
            decode_call("nope", Value::Null),
            Call::NotFound(_)
        ));
    }

    #[test]
    fn replies_read_back_as_written() {
        let list = Reply::List(vec![ListedProcess {
            process_id: "a".into(),
            pid: None,
            argv: vec!["x".to_string()].into(),
            tty: false,
            state: ListedState::PendingApproval,
            next_seq: 1,
            exit_code: None,
            signal: None,
        }]);
        match decode_reply(Method::ProcessList, reply_value(&list)).unwrap() {
            Reply::List(l) => assert_eq!(l[0].state, ListedState::PendingApproval),
            other => panic!("{other:?}"),
        }
        match decode_reply(
            Method::ProcessWrite,
            reply_value(&Reply::Write(WriteStatus::StdinClosed)),
        )
        .unwrap()
        {
            Reply::Write(WriteStatus::StdinClosed) => {}
            other => panic!("{other:?}"),
        }
    }
}
