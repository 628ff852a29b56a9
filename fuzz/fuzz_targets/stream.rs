//! A Noise stream after decryption, end to end on both sides. The fuzzer chooses the
//! messages a peer sends; a sealer holding the stream's keys seals them into `DATA` frames as
//! a real sender does, and the receiver opens and reassembles them (so the AEAD passes and the
//! code after it is what is fuzzed), then decodes each message as both ends would:
//!
//! - the exec server, as a request from a client: the request budget's cost, the JSON edge
//!   (`json_codec::decode_inbound`: envelope, ids, params typed per method, a write's base64);
//! - the client, as a message from the server: a binary output message, the fast output
//!   delta decoder, the envelope, a result read back for every method (`decode_reply`), an
//!   exit notice's and an output delta's params.
//!
//! Nothing may panic, and what decodes must hold together (a decoded binary delta's chunk
//! within its limit, a typed call of a known method, a delta the fast decoder takes read the
//! same by the general path).
//!
//! Input: a sequence of `LEN:u16 BYTES`, each one message (what the seed corpus holds, from
//! real sessions: `soak capture`).
#![no_main]
use std::sync::Arc;

use bytes::Bytes;
use execrelay::connection::json_codec::{decode_inbound, decode_reply};
use execrelay::connection::request_budget::parse_cost;
use execrelay::rpc::binary_output::{decode_output_message, is_binary_message};
use execrelay::rpc::jsonrpc::{parse_inbound, Inbound};
use execrelay::rpc::method::TABLE;
use execrelay::rpc::notification::{decode_exit_info, decode_output_delta, decode_output_params};
use execrelay_protocol::frame::Frame;
use execrelay_protocol::noise::cipher::TransportKeys;
use execrelay_protocol::noise::record::{Opened, RecordOpener, RecordSealer};
use libfuzzer_sys::fuzz_target;

/// Large enough for every message of a session (a write of 256 KiB in base64), small enough
/// to keep one input cheap.
const MAX_MESSAGE: usize = 1 << 20;

fn pair() -> (RecordSealer, RecordOpener) {
    let keys = |initiator| {
        Arc::new(TransportKeys::from_split(initiator, [3; 32], [4; 32]).expect("fixed keys"))
    };
    (
        RecordSealer::new(keys(true)),
        RecordOpener::new(keys(false), MAX_MESSAGE),
    )
}

/// What the exec server does with a message from a client.
fn as_request(m: &[u8]) {
    let _ = parse_cost(m);
    if is_binary_message(m) {
        // The server refuses binary messages from a client before decoding them.
        return;
    }
    let _ = decode_inbound(m);
}

/// What the client does with a message from the server.
fn as_server_message(m: &[u8]) {
    if is_binary_message(m) {
        if let Ok(d) = decode_output_message(Bytes::copy_from_slice(m)) {
            assert!(!d.data.is_empty() && d.data.len() <= execrelay::config::MAX_CHUNK_BYTES);
        }
        return;
    }
    if let Some(d) = decode_output_delta(m) {
        // The fast path is a shortcut, never a second meaning: the general path reads the
        // same message to the same delta.
        let Ok(Inbound::Notification { params, .. }) = parse_inbound(m) else {
            panic!("the fast path took a message the JSON parser refuses");
        };
        assert_eq!(params["processId"].as_str(), Some(d.process_id.as_str()));
        assert_eq!(params["seq"].as_u64(), Some(d.seq));
        assert_eq!(decode_output_params(&params), Some((d.stream, d.data)));
        return;
    }
    match parse_inbound(m) {
        Ok(Inbound::Response {
            outcome: Ok(result),
            ..
        }) => {
            for (method, _) in TABLE {
                let _ = decode_reply(method, result.clone());
            }
        }
        Ok(Inbound::Notification { params, .. }) => {
            let _ = decode_exit_info(&params);
            let _ = decode_output_params(&params);
        }
        _ => {}
    }
}

fuzz_target!(|data: &[u8]| {
    let (mut sealer, mut opener) = pair();
    let sid = [5u8; 16];
    let mut input = data;
    while input.len() >= 2 {
        let len = usize::from(u16::from_be_bytes([input[0], input[1]])).min(input.len() - 2);
        let msg = &input[2..2 + len];
        input = &input[2 + len..];
        let Ok(frames) = sealer.seal_message_frames(&sid, msg) else {
            continue;
        };
        for f in frames {
            let f = Frame::decode_owned(f).expect("a sealed frame decodes");
            match opener.open_owned(f.seq, f.payload) {
                Ok(Opened::Messages(msgs)) => {
                    for m in msgs {
                        assert!(!m.is_empty() && m.len() <= MAX_MESSAGE);
                        as_request(&m);
                        as_server_message(&m);
                    }
                }
                Ok(Opened::Close(_)) => return,
                // An empty message is refused by the deframer: the stream would be reset.
                Err(_) => return,
            }
        }
    }
});
