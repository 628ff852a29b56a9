//! Handshake payloads after decryption. A fixed-key initiator writes message 1 around a
//! payload the fuzzer chooses, so what gets fuzzed is the server's payload parsing (size,
//! JSON shape, version, `ts`, token), not the AEAD that random bytes never pass; likewise a
//! fixed-key responder answers a genuine message 1 with message 2 around the fuzzer's payload
//! for the client's parser. Raw fuzzer bytes as message 1 and message 2 keep the refusals
//! before decryption covered.
//!
//! Every case runs in the Noise suite the selector names (`secure-transport.md` §3: 0
//! ChaChaPoly, 1 AESGCM), on both sides, so both suites' handshakes are fuzzed.
//!
//! Input: a selector byte (mod 3: message 1, message 2, raw; bit 7: suite 1), then the
//! payload or message.
//!
//! Cheap per input: the keys are made once, and both this harness's snow states and the
//! protocol crate's own (built with `cfg(fuzzing)`) use
//! `execrelay_protocol::noise::fuzz_resolver`, whose X25519 results are remembered and whose
//! ephemeral keys come from a fixed sequence. The handshakes, their AEAD and hashing and
//! every line of the record layer's code still run per input.
#![no_main]
use std::sync::OnceLock;

use execrelay_protocol::keys::Keypair;
use execrelay_protocol::noise::fuzz_resolver::FuzzResolver;
use execrelay_protocol::noise::handshake::{prologue, read_hello_suite, ClientHandshake};
use execrelay_protocol::noise::suite::{protocol_name, NoiseSuite};
use libfuzzer_sys::fuzz_target;

const SID: [u8; 16] = [0; 16];

/// The client's and the server's keys, and the prologue: made once.
struct Fixed {
    client: Keypair,
    server: Keypair,
    prologue: Vec<u8>,
}

fn fixed() -> &'static Fixed {
    static FIXED: OnceLock<Fixed> = OnceLock::new();
    FIXED.get_or_init(|| Fixed {
        client: Keypair::from_private([1; 32]).expect("client key"),
        server: Keypair::from_private([2; 32]).expect("server key"),
        prologue: prologue("", &SID),
    })
}

fn builder<'a>(suite: NoiseSuite, keys: &'a Keypair, prologue: &'a [u8]) -> snow::Builder<'a> {
    snow::Builder::with_resolver(
        protocol_name(suite).parse().expect("params"),
        Box::new(FuzzResolver),
    )
    .local_private_key(&keys.private)
    .and_then(|b| b.prologue(prologue))
    .expect("builder")
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, payload)) = data.split_first() else {
        return;
    };
    let suite = if sel & 0x80 != 0 {
        NoiseSuite::AesGcm
    } else {
        NoiseSuite::ChaChaPoly
    };
    let Fixed {
        client,
        server,
        prologue: pro,
    } = fixed();
    let mut buf = vec![0u8; 65_535];
    match sel % 3 {
        0 => {
            // Message 1 around the fuzzer's payload: decryption passes, parsing is fuzzed.
            let mut init = builder(suite, client, pro)
                .remote_public_key(&server.public)
                .and_then(|b| b.build_initiator())
                .expect("initiator");
            let Ok(n) = init.write_message(payload, &mut buf) else {
                return; // larger than a Noise message
            };
            if let Ok(pending) = read_hello_suite(suite, server, "", &SID, &buf[..n]) {
                assert_eq!(pending.client_key, client.public);
                pending.accept("fuzz").expect("an accepted hello answers");
            }
        }
        1 => {
            // Message 2 around the fuzzer's payload, answering a genuine message 1.
            let Ok((hs, m1)) =
                ClientHandshake::start_suite(suite, client, &server.public, "", &SID, None, 1)
            else {
                return;
            };
            let mut resp = builder(suite, server, pro)
                .build_responder()
                .expect("responder");
            resp.read_message(&m1, &mut buf)
                .expect("a genuine message 1 reads");
            let Ok(n) = resp.write_message(payload, &mut buf) else {
                return;
            };
            let _ = hs.finish(&buf[..n]);
        }
        _ => {
            let _ = read_hello_suite(suite, server, "", &SID, payload);
            if let Ok((hs, _)) =
                ClientHandshake::start_suite(suite, client, &server.public, "", &SID, None, 1)
            {
                let _ = hs.finish(payload);
            }
        }
    }
});
