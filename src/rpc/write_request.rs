//! Both directions of the `process/write` request, the hot path of every stdin byte (it stays
//! JSON with base64, `protocol.md` §4): the client's hand-written encoder and the server's
//! decoder of its chunk.
//!
//! # What this module owns
//!
//! - [`encode_write_request`]: the whole request text, built in one `String` sized up front,
//!   the chunk base64-encoded in place with SIMD: no JSON tree, no escape pass over the chunk.
//! - [`decode_write_chunk`]: the server's SIMD base64 decode of a `chunk`, with the error a
//!   client sees for one that is not base64.
//!
//! # What it must never do
//!
//! - Build a JSON tree around the chunk or copy it more than once on either side.

use std::fmt::Write as _;

use super::method::Method;
use super::notification::json_string;

/// The bytes of a write request besides the ids and the base64 chunk: an exact upper bound
/// (the longest request id has 20 digits), so the encoder's `String` never grows.
const WRITE_FIXED_BYTES: usize = "{\"jsonrpc\":\"2.0\",\"id\":".len()
    + 20
    + ",\"method\":\"".len()
    + "process/write".len()
    + "\",\"params\":{\"processId\":".len()
    + ",\"writeId\":".len()
    + ",\"chunk\":\"".len()
    + "\"}}".len();

/// Encode `process/write` of `chunk` to `process_id` with `write_id`, as request `id`.
pub fn encode_write_request(id: u64, process_id: &str, write_id: &str, chunk: &[u8]) -> String {
    let process_id = json_string(process_id);
    let write_id = json_string(write_id);
    let b64_len = chunk.len().div_ceil(3) * 4;
    let mut s =
        String::with_capacity(WRITE_FIXED_BYTES + process_id.len() + write_id.len() + b64_len);
    s.push_str("{\"jsonrpc\":\"2.0\",\"id\":");
    // Writing into a String cannot fail.
    let _ = write!(s, "{id}");
    s.push_str(",\"method\":\"");
    s.push_str(Method::ProcessWrite.as_str());
    s.push_str("\",\"params\":{\"processId\":");
    s.push_str(&process_id);
    s.push_str(",\"writeId\":");
    s.push_str(&write_id);
    s.push_str(",\"chunk\":\"");
    base64_simd::STANDARD.encode_append(chunk, &mut s);
    s.push_str("\"}}");
    s
}

/// Decode a `process/write` chunk (standard base64 with padding), or the `-32602` message.
pub fn decode_write_chunk(chunk: &str) -> Result<Vec<u8>, String> {
    base64_simd::STANDARD
        .decode_to_vec(chunk.as_bytes())
        .map_err(|e| format!("chunk is not valid base64: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rpc::jsonrpc::{decode_params, parse_inbound, Inbound};
    use crate::rpc::messages::WriteParams;

    /// What the client encodes is a JSON-RPC request the server decodes to the same chunk,
    /// for ids that need escaping, every base64 padding case and a large chunk.
    #[test]
    fn an_encoded_write_decodes_to_its_chunk() {
        for process_id in ["p", "with \"quotes\" \\ and ü"] {
            for len in [0, 1, 2, 3, 4, 1000, 256 * 1024] {
                let chunk: Vec<u8> = (0..len).map(|i| (i * 7 % 256) as u8).collect();
                let text = encode_write_request(u64::MAX, process_id, "w-\"1\"", &chunk);
                let Ok(Inbound::Request { id, method, params }) = parse_inbound(text.as_bytes())
                else {
                    panic!("not a request: {text:.200}");
                };
                assert_eq!(id, u64::MAX);
                assert_eq!(Method::parse(&method), Some(Method::ProcessWrite));
                let p: WriteParams = decode_params(params).unwrap();
                assert_eq!(p.process_id, process_id);
                assert_eq!(p.write_id.as_deref(), Some("w-\"1\""));
                assert_eq!(decode_write_chunk(&p.chunk).unwrap(), chunk);
            }
        }
    }

    #[test]
    fn the_request_bytes_are_exactly_these() {
        assert_eq!(
            encode_write_request(7, "p1", "w-1", b"hi\n"),
            "{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"process/write\",\"params\":\
             {\"processId\":\"p1\",\"writeId\":\"w-1\",\"chunk\":\"aGkK\"}}"
        );
    }

    /// The encoder's capacity estimate holds exactly for the longest id, so the chunk is
    /// never copied by a regrowth.
    #[test]
    fn the_encoder_sizes_its_buffer_once() {
        for len in [0, 1, 2, 65_536] {
            let s = encode_write_request(u64::MAX, "p", "w", &vec![0; len]);
            assert_eq!(s.capacity(), s.len(), "{len}");
        }
    }

    #[test]
    fn a_chunk_that_is_not_base64_is_refused_with_its_reason() {
        for bad in ["e!==", "eA=", "eA==x"] {
            let e = decode_write_chunk(bad).unwrap_err();
            assert!(e.starts_with("chunk is not valid base64"), "{bad}: {e}");
        }
        assert_eq!(decode_write_chunk("").unwrap(), b"");
    }
}
