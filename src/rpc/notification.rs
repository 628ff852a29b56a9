//! Both directions of the event codecs: the `process/outputDelta` and `process/exited`
//! notifications and the events of a `process/read` result.
//!
//! # What this module owns
//!
//! - The server's hand-written output-delta encoder ([`encode_output_delta`]), the hot path of
//!   every byte a child writes: one `String` sized up front, SIMD base64 appended in place.
//! - The client's fast decoder ([`decode_output_delta`]), which takes an output delta apart
//!   without building a JSON tree. It recognises a delta by the exact bytes the encoder starts
//!   with ([`OUTPUT_DELTA_PREFIX`]): that key order is a contract between the two, kept here
//!   in one file and tested by round trips. A delta in any other key order still decodes, on
//!   the client's general path ([`decode_output_params`]).
//! - The exit notice ([`encode_exit_notice`]) and the JSON of events in `process/read`
//!   results ([`output_event_json`], [`exit_event_json`]), with their decoders
//!   ([`decode_read_event`]).
//!
//! # What it must never do
//!
//! - Copy output more than once or build a JSON tree on the output path (either side).
//! - Know where events come from: it takes wire values (seq, stream, bytes, [`ExitInfo`]),
//!   never a process or its log.

use std::fmt::Write as _;

use base64::Engine;
use bytes::Bytes;
use serde::Deserialize as _;
use serde_json::{json, Value};

use super::messages::{ExitInfo, StreamName};
use super::method::Method;

/// The exact first bytes of every output delta [`encode_output_delta`] writes, up to the
/// process id's value. [`decode_output_delta`] takes the fast path only for messages that
/// start with them, so the encoder's key order (`jsonrpc`, `method`, `params` with
/// `processId`, `seq`, `stream`, `chunk`) is what the fast decoder relies on.
pub const OUTPUT_DELTA_PREFIX: &str =
    "{\"jsonrpc\":\"2.0\",\"method\":\"process/outputDelta\",\"params\":{\"processId\":";

/// Bytes of an output delta besides the id and the base64 chunk: the prefix, the longest
/// `seq` (20 digits), the longest stream name and the punctuation. An exact upper bound, so
/// the encoder's `String` is allocated once and never grows (growing would copy the chunk).
const DELTA_FIXED_BYTES: usize = OUTPUT_DELTA_PREFIX.len()
    + ",\"seq\":".len()
    + 20
    + ",\"stream\":\"".len()
    + "stderr".len()
    + "\",\"chunk\":\"".len()
    + "\"}}".len();

/// A process id as a JSON string literal (quotes and escapes included). Computed once per
/// process and passed to [`encode_output_delta`] for every chunk.
pub fn json_string(s: &str) -> String {
    Value::String(s.to_owned()).to_string()
}

/// Encode a `process/outputDelta` notification by hand. `id_json` is the process id as a JSON
/// string literal ([`json_string`]).
pub fn encode_output_delta(id_json: &str, seq: u64, stream: StreamName, chunk: &[u8]) -> String {
    let b64_len = chunk.len().div_ceil(3) * 4;
    let mut s = String::with_capacity(b64_len + id_json.len() + DELTA_FIXED_BYTES);
    s.push_str(OUTPUT_DELTA_PREFIX);
    s.push_str(id_json);
    // Writing into a String cannot fail.
    let _ = write!(s, ",\"seq\":{seq}");
    s.push_str(",\"stream\":\"");
    s.push_str(stream.as_str());
    s.push_str("\",\"chunk\":\"");
    // SIMD base64: this is the largest CPU cost per output byte.
    base64_simd::STANDARD.encode_append(chunk, &mut s);
    s.push_str("\"}}");
    s
}

/// Encode the `process/exited` notification (once per process: not a hot path).
pub fn encode_exit_notice(process_id: &str, seq: u64, info: &ExitInfo) -> String {
    let mut params = serde_json::to_value(info).unwrap_or_else(|_| json!({}));
    params["seq"] = json!(seq);
    params["processId"] = Value::String(process_id.to_owned());
    json!({"jsonrpc": "2.0", "method": Method::ProcessExited.as_str(), "params": params})
        .to_string()
}

/// Encode the `process/outputOmitted` notification (`outputCapKeep: "headAndTail"`): JSON in
/// both output forms, at most twice per process (not a hot path).
pub fn encode_output_omitted(
    process_id: &str,
    seq: u64,
    stream: StreamName,
    omitted: u64,
) -> String {
    json!({
        "jsonrpc": "2.0",
        "method": Method::ProcessOutputOmitted.as_str(),
        "params": {
            "processId": process_id,
            "seq": seq,
            "stream": stream.as_str(),
            "omittedBytes": omitted,
        },
    })
    .to_string()
}

/// The stream and count of `process/outputOmitted` params (or of an `outputOmitted` event of a
/// `process/read` result, which has the same members).
pub fn decode_omitted_params(params: &Value) -> Option<(StreamName, u64)> {
    let stream = StreamName::from_wire(params.get("stream")?.as_str()?)?;
    Some((stream, params.get("omittedBytes")?.as_u64()?))
}

/// An output delta as the client's fast path decodes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputDelta {
    /// The process.
    pub process_id: String,
    /// Its seq.
    pub seq: u64,
    /// Which stream.
    pub stream: StreamName,
    /// The raw bytes (decoded from base64 once, into their own buffer).
    pub data: Bytes,
}

/// The client's fast decoder: an output delta as [`encode_output_delta`] writes it, taken
/// apart by position, without a JSON parser over the chunk (which is nearly all of the
/// message): the chunk is everything between `"chunk":"` and the closing `"}}`, and the
/// base64 decoder, which refuses any byte outside its alphabet (a quote, a backslash), is
/// the only pass over it. (serde_json scanned every byte of it for escapes and checked it as
/// UTF-8 first: a pass as long as the decode, README "The JSON delta taken apart by
/// position".) `None` for anything else, including a delta in another key order, with
/// whitespace, or with an escape in the chunk: the caller then takes the general path, which
/// reads any valid JSON (and refuses what is not).
pub fn decode_output_delta(bytes: &[u8]) -> Option<OutputDelta> {
    let rest = bytes.strip_prefix(OUTPUT_DELTA_PREFIX.as_bytes())?;
    // The id: a JSON string, escapes and all, read by serde_json from its opening quote to
    // its closing one (short from our server; from any server, bounded by the message).
    let id_len = json_string_len(rest)?;
    let process_id: String = serde_json::from_slice(&rest[..id_len]).ok()?;
    let rest = rest[id_len..].strip_prefix(b",\"seq\":")?;
    // A JSON number that is a u64: digits only, no leading zero, no fraction or exponent
    // (the next bytes must be the stream's key).
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 || (digits > 1 && rest[0] == b'0') {
        return None;
    }
    let seq: u64 = std::str::from_utf8(&rest[..digits]).ok()?.parse().ok()?;
    let rest = rest[digits..].strip_prefix(b",\"stream\":\"")?;
    let name_len = rest.iter().position(|&b| b == b'"')?;
    let stream = StreamName::from_wire(std::str::from_utf8(&rest[..name_len]).ok()?)?;
    let chunk = rest[name_len..]
        .strip_prefix(b"\",\"chunk\":\"")?
        .strip_suffix(b"\"}}")?;
    let data = base64_simd::STANDARD.decode_to_vec(chunk).ok()?;
    Some(OutputDelta {
        process_id,
        seq,
        stream,
        data: Bytes::from(data),
    })
}

/// The length of the JSON string literal at the start of `bytes`, both quotes included
/// (`None` if `bytes` does not start with one that ends). Only finds its end: whether it is
/// valid (escapes, control characters, UTF-8) is for the parser it is handed to.
fn json_string_len(bytes: &[u8]) -> Option<usize> {
    if bytes.first() != Some(&b'"') {
        return None;
    }
    let mut i = 1;
    loop {
        match *bytes.get(i)? {
            b'\\' => i += 2,
            b'"' => return Some(i + 1),
            _ => i += 1,
        }
    }
}

/// The general path: the stream and bytes of output-delta `params` (or of an output event of
/// a `process/read` result, which has the same members).
pub fn decode_output_params(params: &Value) -> Option<(StreamName, Bytes)> {
    let stream = StreamName::from_wire(params.get("stream")?.as_str()?)?;
    let data = base64::engine::general_purpose::STANDARD
        .decode(params.get("chunk")?.as_str()?)
        .ok()?;
    Some((stream, Bytes::from(data)))
}

/// The JSON of an output event in a `process/read` result.
pub fn output_event_json(seq: u64, stream: StreamName, chunk: &[u8]) -> Value {
    json!({
        "seq": seq,
        "type": "output",
        "stream": stream.as_str(),
        "chunk": base64::engine::general_purpose::STANDARD.encode(chunk),
    })
}

/// The JSON of an `outputOmitted` event in a `process/read` result.
pub fn omitted_event_json(seq: u64, stream: StreamName, omitted: u64) -> Value {
    json!({
        "seq": seq,
        "type": "outputOmitted",
        "stream": stream.as_str(),
        "omittedBytes": omitted,
    })
}

/// The JSON of the exit event in a `process/read` result.
pub fn exit_event_json(seq: u64, info: &ExitInfo) -> Value {
    let mut v = serde_json::to_value(info).unwrap_or_else(|_| json!({}));
    v["seq"] = json!(seq);
    v["type"] = json!("exited");
    v
}

/// An event of a `process/read` result, decoded (the client's side of
/// [`output_event_json`] and [`exit_event_json`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadEvent {
    /// Output bytes.
    Output {
        /// Which stream.
        stream: StreamName,
        /// The bytes.
        data: Bytes,
    },
    /// Output the server read and did not keep (`outputCapKeep: "headAndTail"`).
    Omitted {
        /// Which stream.
        stream: StreamName,
        /// How many bytes.
        omitted_bytes: u64,
    },
    /// The exit notice.
    Exited(ExitInfo),
}

/// Decode one event of a `process/read` result: its seq and content. `None` when it is
/// malformed.
pub fn decode_read_event(v: &Value) -> Option<(u64, ReadEvent)> {
    let seq = v.get("seq")?.as_u64()?;
    let ev = if v["type"] == "exited" {
        ReadEvent::Exited(decode_exit_info(v)?)
    } else if v["type"] == "outputOmitted" {
        let (stream, omitted_bytes) = decode_omitted_params(v)?;
        ReadEvent::Omitted {
            stream,
            omitted_bytes,
        }
    } else {
        let (stream, data) = decode_output_params(v)?;
        ReadEvent::Output { stream, data }
    };
    Some((seq, ev))
}

/// The [`ExitInfo`] of `process/exited` params or of an exit event.
pub fn decode_exit_info(v: &Value) -> Option<ExitInfo> {
    ExitInfo::deserialize(v).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rpc::jsonrpc::{parse_inbound, Inbound};

    fn info() -> ExitInfo {
        ExitInfo {
            exit_code: Some(3),
            signal: None,
            reason: crate::rpc::messages::ExitReason::Timeout,
            timed_out: true,
            output_drain_timed_out: true,
            stdout_bytes: 10,
            stderr_bytes: 2,
            dropped_bytes: 1,
            duration_ms: 42,
        }
    }

    /// Ids that need escaping, or are at the protocol's length limit.
    fn ids() -> Vec<String> {
        vec![
            "p".into(),
            "with \"quotes\" and \\ backslash".into(),
            "ünïcödé ✓".into(),
            "ctl\u{1}\n\t".into(),
            "x".repeat(crate::config::MAX_PROCESS_ID_BYTES),
        ]
    }

    fn chunk(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 131 % 251) as u8).collect()
    }

    /// The contract between the two files it replaced: whatever the server's encoder writes,
    /// the client's fast decoder takes apart exactly, for every stream, chunk length (each
    /// base64 padding case and the largest chunk) and seq.
    #[test]
    fn what_the_server_encodes_the_client_fast_path_decodes() {
        for id in ids() {
            let id_json = json_string(&id);
            for stream in [StreamName::Stdout, StreamName::Stderr, StreamName::Pty] {
                for len in [0, 1, 2, 3, 4, 1000, crate::config::MAX_CHUNK_BYTES] {
                    for seq in [1, 7, u64::MAX] {
                        let data = chunk(len);
                        let text = encode_output_delta(&id_json, seq, stream, &data);
                        let d = decode_output_delta(text.as_bytes())
                            .unwrap_or_else(|| panic!("fast path refused {text:.120}"));
                        assert_eq!(d.process_id, id);
                        assert_eq!(d.seq, seq);
                        assert_eq!(d.stream, stream);
                        assert_eq!(&d.data[..], &data[..]);
                    }
                }
            }
        }
    }

    /// The encoder's output is also a plain JSON-RPC notification that the general path
    /// decodes to the same values, so a client without the fast path agrees.
    #[test]
    fn an_encoded_delta_is_a_valid_notification_for_the_general_path() {
        for id in ids() {
            let data = chunk(5);
            let text = encode_output_delta(&json_string(&id), 9, StreamName::Stderr, &data);
            let Ok(Inbound::Notification { method, params }) = parse_inbound(text.as_bytes())
            else {
                panic!("not a notification: {text}");
            };
            assert_eq!(Method::parse(&method), Some(Method::ProcessOutputDelta));
            assert_eq!(params["processId"], id.as_str());
            assert_eq!(params["seq"], 9);
            let (stream, bytes) = decode_output_params(&params).unwrap();
            assert_eq!(stream, StreamName::Stderr);
            assert_eq!(&bytes[..], &data[..]);
        }
    }

    #[test]
    fn the_prefix_names_the_method_of_the_table() {
        assert_eq!(
            OUTPUT_DELTA_PREFIX,
            format!(
                "{{\"jsonrpc\":\"2.0\",\"method\":\"{}\",\"params\":{{\"processId\":",
                Method::ProcessOutputDelta
            )
        );
    }

    #[test]
    fn the_delta_bytes_are_exactly_these() {
        assert_eq!(
            encode_output_delta("\"p1\"", 7, StreamName::Stdout, b"hi\n"),
            "{\"jsonrpc\":\"2.0\",\"method\":\"process/outputDelta\",\"params\":\
             {\"processId\":\"p1\",\"seq\":7,\"stream\":\"stdout\",\"chunk\":\"aGkK\"}}"
        );
    }

    /// The encoder's capacity estimate holds for the longest seq and stream name, so the
    /// hot path never reallocates.
    #[test]
    fn the_encoder_sizes_its_buffer_once() {
        let id_json = json_string("p");
        for len in [0, 1, 2, 3, 65_536] {
            let s = encode_output_delta(&id_json, u64::MAX, StreamName::Stderr, &chunk(len));
            let b64 = len.div_ceil(3) * 4;
            assert_eq!(s.len(), b64 + id_json.len() + DELTA_FIXED_BYTES, "{len}");
            assert_eq!(s.capacity(), s.len(), "allocated once, exactly");
        }
    }

    /// The fast path is taken only for the encoder's own key order; anything else (another
    /// server's order, another method, a bad stream or chunk) falls back to the general path.
    #[test]
    fn the_fast_path_refuses_what_the_encoder_does_not_write() {
        let reordered = br#"{"method":"process/outputDelta","jsonrpc":"2.0","params":{"processId":"p","seq":1,"stream":"stdout","chunk":"aGkK"}}"#;
        assert_eq!(decode_output_delta(reordered), None);
        let Ok(Inbound::Notification { params, .. }) = parse_inbound(reordered) else {
            panic!("valid JSON-RPC");
        };
        assert_eq!(
            decode_output_params(&params),
            Some((StreamName::Stdout, Bytes::from_static(b"hi\n")))
        );
        let text = encode_output_delta("\"p\"", 1, StreamName::Stdout, b"x");
        for bad in [
            text.replace("\"stdout\"", "\"stdin\""),
            text.replace("\"eA==\"", "\"e!==\""),
            text.replace("\"seq\":1", "\"seq\":-1"),
            text[..text.len() - 1].to_string(),
            // Not JSON at all: the general path refuses it too.
            text.replace("\"seq\":1", "\"seq\":01"),
            text.replace("\"seq\":1", "\"seq\":18446744073709551616"),
            text.replace("\"p\"", "\"p\u{1}\""),
            text.replace("\"p\"", "\"p"),
        ] {
            assert_eq!(decode_output_delta(bad.as_bytes()), None, "{bad}");
        }
        // Valid JSON the encoder does not write: refused by the fast path, read (to the same
        // bytes) by the general one.
        for other in [
            text.replace("\"seq\":1", "\"seq\": 1"),
            text.replace("\"eA==\"", "\"eA\\u003d=\""),
            text.replace("\"eA==\"", "\"e\\u0041==\""),
            format!("{text}\n"),
        ] {
            assert_eq!(decode_output_delta(other.as_bytes()), None, "{other}");
            let Ok(Inbound::Notification { params, .. }) = parse_inbound(other.as_bytes()) else {
                panic!("valid JSON-RPC: {other}");
            };
            assert_eq!(params["seq"].as_u64(), Some(1), "{other}");
            assert_eq!(
                decode_output_params(&params),
                Some((StreamName::Stdout, Bytes::from_static(b"x"))),
                "{other}"
            );
        }
    }

    /// The fast path is a shortcut, never a second meaning: whatever it decodes, the general
    /// path (the JSON parser and [`decode_output_params`]) decodes to the same process, seq,
    /// stream and bytes. Mutations of an encoded delta at every position stand in for a hostile server (the
    /// fuzz target `stream` checks the same on arbitrary messages).
    #[test]
    fn the_fast_path_agrees_with_the_general_one_on_every_mutation() {
        let text = encode_output_delta(&json_string("a\"b"), 42, StreamName::Stderr, b"hi!!");
        let mut checked = 0;
        for i in 0..text.len() {
            for b in [b'"', b'\\', b'0', b'A', b' ', b'}', b'=', 0x01, 0xff] {
                let mut m = text.clone().into_bytes();
                m[i] = b;
                let Some(d) = decode_output_delta(&m) else {
                    continue;
                };
                let Ok(Inbound::Notification { method, params }) = parse_inbound(&m) else {
                    panic!(
                        "fast path took what JSON refuses: {}",
                        String::from_utf8_lossy(&m)
                    );
                };
                assert_eq!(method, Method::ProcessOutputDelta.as_str());
                assert_eq!(params["processId"].as_str(), Some(d.process_id.as_str()));
                assert_eq!(params["seq"].as_u64(), Some(d.seq));
                assert_eq!(decode_output_params(&params), Some((d.stream, d.data)));
                checked += 1;
            }
        }
        // The unmutated delta and the mutations that keep it valid (a digit of the seq, a
        // letter of the id or of the chunk) were checked, not skipped.
        assert!(checked > 10, "{checked}");
    }

    #[test]
    fn the_exit_notice_round_trips() {
        for id in ids() {
            let text = encode_exit_notice(&id, u64::MAX, &info());
            let Ok(Inbound::Notification { method, params }) = parse_inbound(text.as_bytes())
            else {
                panic!("not a notification: {text}");
            };
            assert_eq!(Method::parse(&method), Some(Method::ProcessExited));
            assert_eq!(params["processId"], id.as_str());
            assert_eq!(params["seq"].as_u64(), Some(u64::MAX));
            assert_eq!(decode_exit_info(&params), Some(info()));
        }
    }

    /// Key order of the exit notice (serde_json's sorted maps), as clients have always seen it.
    #[test]
    fn the_exit_notice_bytes_are_exactly_these() {
        assert_eq!(
            encode_exit_notice("p", 4, &info()),
            "{\"jsonrpc\":\"2.0\",\"method\":\"process/exited\",\"params\":{\"droppedBytes\":1,\
             \"durationMs\":42,\"exitCode\":3,\"outputDrainTimedOut\":true,\"processId\":\"p\",\
             \"reason\":\"timeout\",\"seq\":4,\"signal\":null,\"stderrBytes\":2,\"stdoutBytes\":10,\"timedOut\":true}}"
        );
    }

    /// The omitted notice is plain JSON-RPC with the members of `protocol.md` §5, and an exit
    /// notice without `reason` (a server that predates it) reads as `exited`.
    #[test]
    fn the_omitted_notice_round_trips_and_old_exit_notices_read_as_exited() {
        let text = encode_output_omitted("p\"1", 9, StreamName::Stdout, 123);
        let Ok(Inbound::Notification { method, params }) = parse_inbound(text.as_bytes()) else {
            panic!("not a notification: {text}");
        };
        assert_eq!(Method::parse(&method), Some(Method::ProcessOutputOmitted));
        assert_eq!(params["processId"], "p\"1");
        assert_eq!(params["seq"], 9);
        assert_eq!(
            decode_omitted_params(&params),
            Some((StreamName::Stdout, 123))
        );
        assert_eq!(
            decode_output_delta(text.as_bytes()),
            None,
            "never an output delta"
        );
        let mut old = serde_json::to_value(info()).unwrap();
        old.as_object_mut().unwrap().remove("reason");
        assert_eq!(
            decode_exit_info(&old).map(|i| i.reason),
            Some(crate::rpc::messages::ExitReason::Exited)
        );
    }

    #[test]
    fn read_events_round_trip() {
        let data = chunk(100);
        let v = output_event_json(5, StreamName::Pty, &data);
        assert_eq!(v["type"], "output");
        assert_eq!(
            decode_read_event(&v),
            Some((
                5,
                ReadEvent::Output {
                    stream: StreamName::Pty,
                    data: Bytes::from(data)
                }
            ))
        );
        let v = exit_event_json(6, &info());
        assert_eq!(v["type"], "exited");
        assert_eq!(decode_read_event(&v), Some((6, ReadEvent::Exited(info()))));
        let v = omitted_event_json(7, StreamName::Stderr, 1 << 40);
        assert_eq!(v["type"], "outputOmitted");
        assert_eq!(
            decode_read_event(&v),
            Some((
                7,
                ReadEvent::Omitted {
                    stream: StreamName::Stderr,
                    omitted_bytes: 1 << 40
                }
            ))
        );
        assert_eq!(decode_read_event(&json!({"type": "output"})), None);
        assert_eq!(
            decode_read_event(&json!({"seq": 1, "type": "exited"})),
            None
        );
    }
}
