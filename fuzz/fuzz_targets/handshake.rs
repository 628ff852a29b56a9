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
#![no_main]
use execrelay::noise::handshake::{prologue, read_hello_suite, ClientHandshake};
use execrelay::noise::keys::Keypair;
use execrelay::noise::suite::{protocol_name, NoiseSuite};
use libfuzzer_sys::fuzz_target;

const SID: [u8; 16] = [0; 16];

fn keys() -> (Keypair, Keypair) {
    (
        Keypair::from_private([1; 32]).expect("client key"),
        Keypair::from_private([2; 32]).expect("server key"),
    )
}

fn builder<'a>(suite: NoiseSuite, keys: &'a Keypair, prologue: &'a [u8]) -> snow::Builder<'a> {
    snow::Builder::new(protocol_name(suite).parse().expect("params"))
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
    let (client, server) = keys();
    let pro = prologue("", &SID);
    let mut buf = vec![0u8; 65_535];
    match sel % 3 {
        0 => {
            // Message 1 around the fuzzer's payload: decryption passes, parsing is fuzzed.
            let mut init = builder(suite, &client, &pro)
                .remote_public_key(&server.public)
                .and_then(|b| b.build_initiator())
                .expect("initiator");
            let Ok(n) = init.write_message(payload, &mut buf) else {
                return; // larger than a Noise message
            };
            if let Ok(pending) = read_hello_suite(suite, &server, "", &SID, &buf[..n]) {
                assert_eq!(pending.client_key, client.public);
                pending.accept("fuzz").expect("an accepted hello answers");
            }
        }
        1 => {
            // Message 2 around the fuzzer's payload, answering a genuine message 1.
            let Ok((hs, m1)) =
                ClientHandshake::start_suite(suite, &client, &server.public, "", &SID, None, 1)
            else {
                return;
            };
            let mut resp = builder(suite, &server, &pro)
                .build_responder()
                .expect("responder");
            resp.read_message(&m1, &mut buf).expect("a genuine message 1 reads");
            let Ok(n) = resp.write_message(payload, &mut buf) else {
                return;
            };
            let _ = hs.finish(&buf[..n]);
        }
        _ => {
            let _ = read_hello_suite(suite, &server, "", &SID, payload);
            if let Ok((hs, _)) =
                ClientHandshake::start_suite(suite, &client, &server.public, "", &SID, None, 1)
            {
                let _ = hs.finish(payload);
            }
        }
    }
});
