//! The Noise suites (`secure-transport.md` §3): suite 0 (`Noise_IK_25519_ChaChaPoly_BLAKE2s`)
//! and suite 1 (`Noise_IK_25519_AESGCM_BLAKE2s`), chosen by the client in bits 0–1 of its
//! `OPEN` frame's flags. Streams of both suites share one link; a suite number changed on the
//! path fails that stream's handshake alone; a server whose `noise_suites` does not list a
//! suite resets its `OPEN`s `unsupported_suite` before any cryptography, and the client
//! library falls back to suite 0 unless the suite was pinned; the reserved numbers 2 and 3 are
//! refused the same way.
//!
//! Every wait is on a frame or a message, bounded by a hang guard.

mod common;
use common::noise::*;
use common::*;

use serde_json::json;

use execrelay::config::ServerConfig;
use execrelay::link::client::{ClientLink, NoiseError};
use execrelay::noise::handshake::ClientHandshake;
use execrelay::noise::suite::{NoiseSuite, NoiseSuites, SuiteChoice};
use execrelay::noise::timestamp::next_hello_ts;

fn suite_0_only() -> ServerConfig {
    ServerConfig {
        noise_suites: NoiseSuites::of(&[NoiseSuite::ChaChaPoly]),
        ..Default::default()
    }
}

/// Runs `echo WORD` on the stream and returns what it printed (JSON output deltas).
async fn echo(t: &mut TransportRpc, word: &str) -> String {
    let start = json!({"processId": "p", "argv": ["echo", word]});
    t.call("process/start", start).await;
    let mut out = Vec::new();
    loop {
        let m = t.recv().await;
        match m["method"].as_str() {
            Some("process/outputDelta") => {
                use base64::Engine;
                let chunk = m["params"]["chunk"].as_str().unwrap_or_default();
                out.extend(
                    base64::engine::general_purpose::STANDARD
                        .decode(chunk)
                        .expect("base64"),
                );
            }
            Some("process/exited") => break,
            _ => {}
        }
    }
    String::from_utf8(out).expect("UTF-8 output")
}

async fn ready(t: execrelay::transport::Transport) -> TransportRpc {
    let mut t = TransportRpc { t, next_id: 0 };
    t.call("initialize", json!({"clientName": "suites"})).await;
    t.send(json!({"jsonrpc": "2.0", "method": "initialized", "params": {}}))
        .await;
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suite_1_and_suite_0_streams_share_one_link() {
    let (key, _auth, srv) = serve_one(ServerConfig::default()).await;
    // The raw client: both suites' handshakes and records on one link, interleaved.
    let mut link = RawLink::connect(srv.port).await;
    let mut aes = link
        .open_suite(NoiseSuite::AesGcm, &key, &srv.keys.public)
        .await;
    let mut chacha = link
        .open_suite(NoiseSuite::ChaChaPoly, &key, &srv.keys.public)
        .await;
    link.init(&mut aes).await;
    link.init(&mut chacha).await;
    link.assert_alive(&mut aes).await;
    link.assert_alive(&mut chacha).await;

    // The library: one link, a stream pinned to each suite, a command on each.
    let cfg = srv.client_config(&key);
    let client = tokio::time::timeout(GUARD, ClientLink::connect(&srv.url, cfg))
        .await
        .expect("connect (hang guard)")
        .expect("a link");
    let mut s1 = ready(
        client
            .open_stream_with(SuiteChoice::Pinned(NoiseSuite::AesGcm))
            .await
            .expect("a suite 1 stream"),
    )
    .await;
    let mut s0 = ready(
        client
            .open_stream_with(SuiteChoice::Pinned(NoiseSuite::ChaChaPoly))
            .await
            .expect("a suite 0 stream"),
    )
    .await;
    assert_eq!(echo(&mut s1, "aes").await, "aes\n");
    assert_eq!(echo(&mut s0, "chacha").await, "chacha\n");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suite_flag_flipped_on_the_path_fails_only_that_streams_handshake() {
    let (key, auth, srv) = serve_one(ServerConfig::default()).await;
    let mut link = RawLink::connect(srv.port).await;
    let mut good = link
        .open_suite(NoiseSuite::AesGcm, &key, &srv.keys.public)
        .await;
    link.init(&mut good).await;
    for (wrote, flags) in [(NoiseSuite::AesGcm, 0), (NoiseSuite::ChaChaPoly, 1)] {
        let sid = random_sid();
        let (_hs, m1) = ClientHandshake::start_suite(
            wrote,
            &key,
            &srv.keys.public,
            "",
            &sid,
            None,
            next_hello_ts(),
        )
        .unwrap();
        // What a path that changed the suite bits delivers: the protocol name differs, so
        // message 1 does not decrypt.
        link.send_open_flags(sid, flags, m1).await;
        link.expect_reset(&sid, "handshake_failed").await;
    }
    // Neither reached the authorizer; the established stream carries on.
    assert_eq!(auth.calls_for(&key), 1);
    link.assert_alive(&mut good).await;
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restricted_to_suite_0_resets_suite_1_and_the_client_falls_back() {
    let (key, auth, srv) = serve_one(suite_0_only()).await;

    // On the wire: suite 1, and the reserved numbers 2 and 3, are refused before any
    // cryptography with the reason that says so; suite 0 is accepted on the same link.
    let mut link = RawLink::connect(srv.port).await;
    for flags in [1u16, 2, 3] {
        let sid = random_sid();
        let (_hs, m1) = ClientHandshake::start_suite(
            NoiseSuite::AesGcm,
            &key,
            &srv.keys.public,
            "",
            &sid,
            None,
            next_hello_ts(),
        )
        .unwrap();
        link.send_open_flags(sid, flags, m1).await;
        link.expect_reset(&sid, "unsupported_suite").await;
    }
    assert_eq!(auth.calls_for(&key), 0, "refused before authorization");
    let mut st = link
        .open_suite(NoiseSuite::ChaChaPoly, &key, &srv.keys.public)
        .await;
    link.init(&mut st).await;

    // The library, preferring suite 1: refused once, then suite 0 on this link for good.
    let cfg = srv.client_config(&key);
    let client = tokio::time::timeout(GUARD, ClientLink::connect(&srv.url, cfg))
        .await
        .expect("connect (hang guard)")
        .expect("a link");
    let prefer = SuiteChoice::Prefer(NoiseSuite::AesGcm);
    assert_eq!(client.suite_for(prefer), NoiseSuite::AesGcm);
    let mut t = ready(client.open_stream_with(prefer).await.expect("fell back")).await;
    assert_eq!(echo(&mut t, "fallback").await, "fallback\n");
    assert_eq!(client.suite_for(prefer), NoiseSuite::ChaChaPoly);
    let resets_before = client.counters().peer_resets;
    let _t2 = ready(client.open_stream_with(prefer).await.expect("suite 0")).await;
    assert_eq!(
        client.counters().peer_resets,
        resets_before,
        "the second stream went straight to suite 0"
    );

    // Pinned, there is no fallback: the error says what to do.
    let err = client
        .open_stream_with(SuiteChoice::Pinned(NoiseSuite::AesGcm))
        .await
        .err()
        .expect("a pinned suite 1 is refused");
    assert!(
        matches!(err, NoiseError::UnsupportedSuite(NoiseSuite::AesGcm)),
        "{err:?}"
    );
    let words = err.to_string();
    assert!(
        words.contains("--noise-suite") && words.contains("noise_suites"),
        "{words}"
    );
    drop(client);
    srv.stop().await;
}
