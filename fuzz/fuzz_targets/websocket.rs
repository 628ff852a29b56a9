//! The links' WebSocket framing (`execrelay_protocol::websocket`): any bytes, read in any
//! chunks, as either role, decode into messages within the limits or fail with a rule the
//! peer broke; never a panic, never a message past the limit. The frame boundaries a
//! reader stops at always move forward and never pass the bytes given.
#![no_main]
use execrelay_protocol::websocket::{Boundaries, Decoder, Message, Role, MAX_CONTROL_PAYLOAD};
use libfuzzer_sys::fuzz_target;

/// Small enough that the fuzzer meets the limit often.
const MAX_MESSAGE: usize = 4096;

fuzz_target!(|data: &[u8]| {
    let Some((&ctl, rest)) = data.split_first() else {
        return;
    };
    let role = if ctl & 1 == 0 { Role::Server } else { Role::Client };
    // Chunk sizes 1..=64 from the control byte: splits land inside headers and payloads.
    let chunk = usize::from(ctl >> 2).max(1);
    let share_from = if ctl & 2 == 0 { 0 } else { 32 };
    let mut d = Decoder::new(role, MAX_MESSAGE).share_from(share_from);
    'feed: for piece in rest.chunks(chunk) {
        d.read_buffer().extend_from_slice(piece);
        loop {
            match d.decode() {
                Ok(None) => break,
                Ok(Some(Message::Binary(b) | Message::Text(b))) => {
                    assert!(b.len() <= MAX_MESSAGE, "a message past the limit");
                }
                Ok(Some(Message::Ping(b) | Message::Pong(b))) => {
                    assert!(b.len() <= MAX_CONTROL_PAYLOAD, "a control frame past 125");
                }
                Ok(Some(Message::Close(_))) => {}
                Err(e) => {
                    // Every refusal names a close code a peer may receive.
                    assert!((1000..=1011).contains(&e.close_code()));
                    break 'feed;
                }
            }
        }
        let _ = d.frame_remaining();
    }
    d.release_if_empty();

    let mut b = if ctl & 2 == 0 {
        Boundaries::frames()
    } else {
        Boundaries::http_then_frames()
    };
    let mut at = 0;
    while at < rest.len() {
        let n = b.take(&rest[at..]);
        assert!(n >= 1 && n <= rest.len() - at, "take moved {n} of {}", rest.len() - at);
        at += n;
    }
});
