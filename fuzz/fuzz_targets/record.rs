//! Records after decryption. The fuzzer chooses plaintexts (kind byte, body, message lengths
//! and where records cut them), which a sealer with fixed keys encrypts, so that what gets
//! fuzzed is the opener's authenticated path: replay window, kind byte, close reason, and the
//! message deframer with its length checks. (Random ciphertext never authenticates, so it
//! would only ever reach the AEAD's refusal.) Replayed, tampered and raw records are mixed in
//! to keep the failure paths covered.
//!
//! Input: a suite byte (low bit: 0 ChaChaPoly, 1 AESGCM, `secure-transport.md` §3: both
//! suites' AEADs and nonce layouts are fuzzed), then a sequence of operations, each an opcode
//! byte and its operands:
//! - `0 LEN:u16 BYTES`: one record whose plaintext is BYTES (first byte = kind).
//! - `1 LEN:u16 BYTES`: BYTES as one message, sealed into `DATA` frames in place.
//! - `2`: the last record again (must be refused as a replay).
//! - `3 AT:u16`: the last record with one bit flipped, under the next number (refused).
//! - `4 NONCE:u64 LEN:u16 BYTES`: BYTES as raw ciphertext under NONCE (refused).
#![no_main]
use std::sync::Arc;

use execrelay_protocol::frame::Frame;
use execrelay_protocol::noise::cipher::TransportKeys;
use execrelay_protocol::noise::record::{
    MessageDeframer, Opened, RecordError, RecordOpener, RecordSealer, MAX_RECORD_BODY,
};
use execrelay_protocol::noise::suite::NoiseSuite;
use libfuzzer_sys::fuzz_target;

/// Small, so that the deframer's length refusals and messages spanning records are both
/// reachable with short inputs.
const MAX_MESSAGE: usize = 1024;

fn pair(suite: NoiseSuite) -> (RecordSealer, RecordOpener) {
    let keys = |initiator| {
        Arc::new(
            TransportKeys::from_split_suite(suite, initiator, [1; 32], [2; 32])
                .expect("fixed keys"),
        )
    };
    (
        RecordSealer::new(keys(true)),
        RecordOpener::new(keys(false), MAX_MESSAGE),
    )
}

fn take<'a>(input: &mut &'a [u8], n: usize) -> &'a [u8] {
    let n = n.min(input.len());
    let (head, tail) = input.split_at(n);
    *input = tail;
    head
}

fn take_u16(input: &mut &[u8]) -> usize {
    let b = take(input, 2);
    b.iter().fold(0usize, |acc, &x| acc << 8 | x as usize)
}

fn take_u64(input: &mut &[u8]) -> u64 {
    take(input, 8)
        .iter()
        .fold(0u64, |acc, &x| acc << 8 | x as u64)
}

fn check(opened: &Result<Opened, RecordError>) {
    if let Ok(Opened::Messages(msgs)) = opened {
        for m in msgs {
            assert!(!m.is_empty() && m.len() <= MAX_MESSAGE, "{} bytes", m.len());
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&suite, mut input)) = data.split_first() else {
        return;
    };
    let suite = if suite & 1 == 1 {
        NoiseSuite::AesGcm
    } else {
        NoiseSuite::ChaChaPoly
    };
    let (mut sealer, mut opener) = pair(suite);
    let sid = [7u8; 16];
    let mut last: Option<(u64, Vec<u8>)> = None;
    while let Some((&op, rest)) = input.split_first() {
        input = rest;
        match op % 5 {
            0 => {
                let len = take_u16(&mut input);
                let plain = take(&mut input, len);
                let Some((&kind, body)) = plain.split_first() else {
                    continue;
                };
                match sealer.seal(kind, body) {
                    Ok((n, ct)) => {
                        let opened = opener.open(n, &ct);
                        check(&opened);
                        last = Some((n, ct));
                    }
                    Err(_) => assert!(body.len() > MAX_RECORD_BODY),
                }
            }
            1 => {
                let len = take_u16(&mut input);
                let msg = take(&mut input, len);
                let Ok(frames) = sealer.seal_message_frames(&sid, msg) else {
                    continue;
                };
                for f in frames {
                    let f = Frame::decode_owned(f).expect("a sealed frame decodes");
                    let (n, copy) = (f.seq, f.payload.to_vec());
                    let opened = opener.open_owned(n, f.payload);
                    check(&opened);
                    last = Some((n, copy));
                }
            }
            2 => {
                if let Some((n, ct)) = &last {
                    assert_eq!(opener.open(*n, ct), Err(RecordError::Replay(*n)));
                }
            }
            3 => {
                let at = take_u16(&mut input);
                if let Some((n, ct)) = &last {
                    let mut bad = ct.clone();
                    if bad.is_empty() {
                        continue;
                    }
                    let i = at % bad.len();
                    bad[i] ^= 1u8 << (at % 8);
                    assert!(
                        opener.open(n + 1, &bad).is_err(),
                        "a tampered record opened"
                    );
                }
            }
            _ => {
                let nonce = take_u64(&mut input);
                let len = take_u16(&mut input);
                let ct = take(&mut input, len);
                let _ = opener.open(nonce, ct);
            }
        }
    }
    // The deframer on its own, on the raw input cut every 7 bytes.
    let mut d = MessageDeframer::new(MAX_MESSAGE);
    for chunk in data.chunks(7) {
        if d.push(chunk).is_err() {
            break;
        }
    }
});
