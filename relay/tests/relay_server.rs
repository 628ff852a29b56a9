//! The relay server alone (`execrelay_relay::server`), in-process on real sockets, with fake
//! environments and clients on the engine's `EndpointLink` (opaque payloads) and raw links for
//! hand-written frames: environment admission and revocation, routing, replacement, and every
//! misbehaviour handled as specified, counted in `/metrics`, and another client's established
//! stream unaffected. End-to-end tests through exec servers and clients are the main crate's.
//!
//! Waits are on frames, closes, log lines and metric values; wall-clock timeouts are hang
//! guards only.

mod harness;

use bytes::Bytes;
use execrelay_io::driver::{recv_frame, StreamError};
use execrelay_protocol::config::EndpointConfig;
use execrelay_protocol::env_handshake::LinkRefusal;
use execrelay_protocol::frame::{Frame, FrameType, LINK_STREAM, MAX_FRAME_BYTES};
use execrelay_protocol::keys::Keypair;
use execrelay_protocol::reason::CloseReason;
use harness::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const ENV: &str = "sandbox-1";

/// A relay with one listed environment up (echoing) and one client stream established
/// through it: the bystander every misbehaviour test checks is unaffected.
struct Bystander {
    relay: Relay,
    env_keys: Keypair,
    env: execrelay_io::driver::EndpointLink,
    client: execrelay_io::driver::EndpointLink,
    stream: execrelay_io::driver::StreamHandle,
}

impl Bystander {
    async fn start(settings: execrelay_relay::server::settings::RelaySettings) -> Bystander {
        let env_keys = Keypair::generate().unwrap();
        let relay = Relay::start(settings, &[(ENV, &env_keys)]).await;
        let (env, incoming) = environment(&relay, &env_keys, ENV, EndpointConfig::default()).await;
        echo_environment(incoming);
        let client = client(&relay, ENV).await;
        let mut stream = open(&client).await;
        round_trip(&mut stream, "before").await;
        Bystander {
            relay,
            env_keys,
            env,
            client,
            stream,
        }
    }

    async fn still_fine(&mut self, what: &str) {
        round_trip(&mut self.stream, what).await;
        assert_eq!(self.client.close_reason(), None, "{what}");
        assert_eq!(self.env.close_reason(), None, "{what}");
    }
}

#[tokio::test]
async fn readyz_answers_and_an_environment_is_admitted_and_routed() {
    let (logs, _g) = capture_logs();
    let env_keys = Keypair::generate().unwrap();
    let relay = Relay::start(settings(), &[(ENV, &env_keys)]).await;
    assert_eq!(http_get(relay.addr, "/readyz").await.0, 200);
    assert_eq!(http_get(relay.metrics, "/readyz").await.0, 200);
    assert_eq!(http_get(relay.addr, "/v1/nope").await.0, 404);

    let (_env, incoming) = environment(&relay, &env_keys, ENV, EndpointConfig::default()).await;
    echo_environment(incoming);
    logs.wait_for(&["environment link up", "env_link", ENV])
        .await;
    let c = client(&relay, ENV).await;
    let mut s = open(&c).await;
    for i in 0..40 {
        round_trip(&mut s, &format!("record {i}")).await;
    }
    let m = relay.metrics().await;
    assert_eq!(
        metric_of(&m, "execrelay_relay_links{kind=\"environment\"}"),
        1
    );
    assert_eq!(metric_of(&m, "execrelay_relay_links{kind=\"client\"}"), 1);
    assert_eq!(metric_of(&m, "execrelay_relay_streams"), 1);
    assert_eq!(metric_of(&m, "execrelay_relay_environments_listed"), 1);
    assert_eq!(
        metric_of(
            &m,
            "execrelay_relay_environment_handshakes_total{result=\"accepted\"}"
        ),
        1
    );
    assert_eq!(
        metric_of(
            &m,
            "execrelay_relay_frames_total{type=\"data\",direction=\"in\"}"
        ),
        80
    );
    assert!(metric_of(&m, "execrelay_relay_data_bytes_total{direction=\"out\"}") > 0);
    // Liveness and the status document, on both listeners.
    for addr in [relay.addr, relay.metrics] {
        assert_eq!(http_get(addr, "/livez").await, (200, "ok\n".to_string()));
        let (code, body) = http_get(addr, "/status").await;
        assert_eq!(code, 200);
        let status: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(status["environments"]["online"], 1, "{status}");
        assert_eq!(status["environments"]["listed"], 1, "{status}");
        assert_eq!(status["client_links"]["open"], 1, "{status}");
        assert_eq!(status["streams"], 1, "{status}");
        assert_eq!(status["environments"]["file_ok"], true, "{status}");
        assert!(status["tls"].is_null(), "{status}");
    }
    // Per-stream span (debug): the stream's id and its routing.
    logs.wait_for(&["stream{id=", "OPEN routed to the environment"])
        .await;
    relay.stop().await;
    logs.wait_for(&["shutting down"]).await;
}

#[tokio::test]
async fn an_unlisted_key_a_wrong_id_and_a_wrong_relay_key_are_refused_with_a_clear_log() {
    let (logs, _g) = capture_logs();
    let env_keys = Keypair::generate().unwrap();
    let relay = Relay::start(settings(), &[(ENV, &env_keys)]).await;

    // A key that is not the one listed for the id.
    let stranger = Keypair::generate().unwrap();
    let mut ws = relay.ws(&format!("/v1/env/{ENV}")).await;
    let r = env_handshake(&mut ws, &stranger, &relay.keys.public, ENV, next_ts()).await;
    assert_eq!(r, Err(LinkRefusal::Refused("unauthorized".into())));
    wait_closed(&mut ws).await;
    logs.wait_for(&[
        "environment link refused (unauthorized)",
        "environments file lists",
    ])
    .await;

    // The listed key, but an id that is not listed.
    let mut ws = relay.ws("/v1/env/sandbox-9").await;
    let r = env_handshake(
        &mut ws,
        &env_keys,
        &relay.keys.public,
        "sandbox-9",
        next_ts(),
    )
    .await;
    assert_eq!(r, Err(LinkRefusal::Refused("unauthorized".into())));
    logs.wait_for(&["environment link refused", "sandbox-9", "not listed"])
        .await;

    // The environment pins another relay key.
    let other_relay = Keypair::generate().unwrap();
    let mut ws = relay.ws(&format!("/v1/env/{ENV}")).await;
    let r = env_handshake(&mut ws, &env_keys, &other_relay.public, ENV, next_ts()).await;
    assert_eq!(r, Err(LinkRefusal::Refused("unauthorized".into())));
    logs.wait_for(&["environment link refused", "--relay-key"])
        .await;

    // A message 1 made for one id, sent on another id's path (listed with the same key).
    relay.write_environments(&[(ENV, &env_keys), ("sandbox-2", &env_keys)]);
    logs.wait_for(&["environments file reloaded", "listed=2"])
        .await;
    let mut ws = relay.ws("/v1/env/sandbox-2").await;
    let r = env_handshake(&mut ws, &env_keys, &relay.keys.public, ENV, next_ts()).await;
    assert_eq!(r, Err(LinkRefusal::Refused("unauthorized".into())));

    // A replayed message 1 (same ts as an accepted one) cannot take the link over.
    let ts = next_ts();
    let mut ws = relay.ws(&format!("/v1/env/{ENV}")).await;
    env_handshake(&mut ws, &env_keys, &relay.keys.public, ENV, ts)
        .await
        .unwrap();
    let mut replay = relay.ws(&format!("/v1/env/{ENV}")).await;
    let r = env_handshake(&mut replay, &env_keys, &relay.keys.public, ENV, ts).await;
    assert_eq!(r, Err(LinkRefusal::Refused("replayed_handshake".into())));
    logs.wait_for(&["environment link refused (replayed_handshake)"])
        .await;

    let m = relay.metrics().await;
    assert_eq!(
        metric_of(
            &m,
            "execrelay_relay_environment_handshakes_total{result=\"unauthorized\"}"
        ),
        4
    );
    assert_eq!(
        metric_of(
            &m,
            "execrelay_relay_environment_handshakes_total{result=\"replayed_handshake\"}"
        ),
        1
    );
    assert_eq!(
        metric_of(
            &m,
            "execrelay_relay_environment_handshakes_total{result=\"accepted\"}"
        ),
        1
    );
    assert_eq!(
        metric_of(&m, "execrelay_relay_links{kind=\"environment\"}"),
        1
    );
    // No key material in the log: fingerprints only.
    let text = logs.text();
    let b64 = |k: &Keypair| {
        execrelay_protocol::keys::public_line(&k.public, "")
            .split_whitespace()
            .nth(1)
            .unwrap()
            .to_string()
    };
    for k in [&env_keys, &stranger, &relay.keys] {
        assert!(!text.contains(&b64(k)), "a key in the log");
    }
    relay.stop().await;
}

#[tokio::test]
async fn a_removed_line_closes_the_link_at_once_and_resets_its_streams() {
    let (logs, _g) = capture_logs();
    let env_keys = Keypair::generate().unwrap();
    let other = Keypair::generate().unwrap();
    let relay = Relay::start(settings(), &[(ENV, &env_keys), ("keep", &other)]).await;
    let (env, incoming) = environment(&relay, &env_keys, ENV, EndpointConfig::default()).await;
    echo_environment(incoming);
    let (kept, kept_incoming) =
        environment(&relay, &other, "keep", EndpointConfig::default()).await;
    echo_environment(kept_incoming);
    let c = client(&relay, ENV).await;
    let mut s = open(&c).await;
    round_trip(&mut s, "before").await;
    let c2 = client(&relay, "keep").await;
    let mut s2 = open(&c2).await;

    relay.write_environments(&[("keep", &other)]);
    let reason = guard("the environment link closes", env.closed()).await;
    assert_eq!(reason, CloseReason::Transport, "closed by the relay");
    assert_eq!(
        guard("reset", s.receiver.recv()).await,
        Err(StreamError::PeerReset("environment_revoked".into()))
    );
    logs.wait_for(&["environment no longer listed", ENV]).await;
    logs.wait_for(&["environment link closed", "revoked"]).await;
    // The other environment and its stream carry on.
    round_trip(&mut s2, "after").await;
    assert_eq!(kept.close_reason(), None);
    // The environment cannot come back, and its clients are told it was revoked.
    let mut ws = relay.ws(&format!("/v1/env/{ENV}")).await;
    let r = env_handshake(&mut ws, &env_keys, &relay.keys.public, ENV, next_ts()).await;
    assert_eq!(r, Err(LinkRefusal::Refused("unauthorized".into())));
    let refused = guard(
        "open",
        c.open(stream_id(), Bytes::from_static(b"m")).unwrap(),
    )
    .await;
    assert_eq!(
        refused.err(),
        Some(StreamError::PeerReset("environment_revoked".into()))
    );
    let m = relay.metrics().await;
    assert_eq!(
        metric_of(&m, "execrelay_relay_link_closes_total{reason=\"revoked\"}"),
        1
    );
    assert_eq!(
        metric_of(
            &m,
            "execrelay_relay_resets_total{reason=\"environment_revoked\"}"
        ),
        2
    );
    assert_eq!(
        metric_of(&m, "execrelay_relay_environments_revoked_total"),
        1
    );
    relay.stop().await;
}

#[tokio::test]
async fn a_client_of_an_offline_environment_gets_environment_offline() {
    let env_keys = Keypair::generate().unwrap();
    let relay = Relay::start(settings(), &[(ENV, &env_keys)]).await;
    for id in [ENV, "never-listed"] {
        let c = client(&relay, id).await;
        let r = guard(
            "open",
            c.open(stream_id(), Bytes::from_static(b"m")).unwrap(),
        )
        .await;
        assert_eq!(
            r.err(),
            Some(StreamError::PeerReset("environment_offline".into()))
        );
    }
    assert_eq!(
        relay
            .metric("execrelay_relay_resets_total{reason=\"environment_offline\"}")
            .await,
        2
    );
    relay.stop().await;
}

/// Two exec servers holding one environment key settle instead of flapping: the live holder
/// keeps the id, a second claimant is refused `environment_in_use` (the relay says once that
/// two servers share the key, however often the second redials), and the holder's streams
/// are untouched. Before, each new link replaced the other (7 times in 30 s, every stream
/// reset each time). A holder that stops answering (its host gone without a FIN) loses the
/// id to the next claimant within the probe timeout, not the keepalive's 45 s.
#[tokio::test]
async fn two_holders_of_one_key_settle_and_a_silent_holder_loses_the_id_to_a_probe() {
    let (logs, _g) = capture_logs();
    let env_keys = Keypair::generate().unwrap();
    let mut s = settings();
    s.environment_probe_timeout_ms = 300;
    let relay = Relay::start(s, &[(ENV, &env_keys)]).await;
    let (first, incoming) = environment(&relay, &env_keys, ENV, EndpointConfig::default()).await;
    echo_environment(incoming);
    let c = client(&relay, ENV).await;
    let mut old = open(&c).await;
    round_trip(&mut old, "on the first link").await;

    for attempt in 0..3 {
        let mut ws = relay.ws(&format!("/v1/env/{ENV}")).await;
        let refused = env_handshake(&mut ws, &env_keys, &relay.keys.public, ENV, next_ts()).await;
        assert_eq!(
            refused,
            Err(LinkRefusal::Refused("environment_in_use".into())),
            "attempt {attempt}"
        );
        round_trip(&mut old, "the holder's stream carries on").await;
    }
    assert_eq!(first.close_reason(), None);
    assert_eq!(
        relay
            .metric("execrelay_relay_environment_handshakes_total{result=\"environment_in_use\"}")
            .await,
        3
    );
    let said = logs
        .text()
        .lines()
        .filter(|l| l.contains("two exec servers share the key"))
        .count();
    assert_eq!(said, 1, "said once:\n{}", logs.text());

    // A holder that completed its handshake and then reads nothing (so it answers no ping):
    // the next claimant waits for the probe, then takes the id.
    // The first server stops: the relay sees its link end, so the next claimant takes the
    // id at once (no probe).
    first.close();
    guard("the first link closes", first.closed()).await;
    assert_eq!(
        guard("reset", old.receiver.recv()).await,
        Err(StreamError::PeerReset("environment_gone".into()))
    );
    drop(c);
    let mut silent = relay.ws(&format!("/v1/env/{ENV}")).await;
    guard("the next claimant is admitted", async {
        loop {
            let r = env_handshake(&mut silent, &env_keys, &relay.keys.public, ENV, next_ts()).await;
            if r.is_ok() {
                break;
            }
            // The relay may not have processed the first link's end yet: try again.
            silent = relay.ws(&format!("/v1/env/{ENV}")).await;
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    let started = tokio::time::Instant::now();
    let (second, mut incoming2) =
        environment(&relay, &env_keys, ENV, EndpointConfig::default()).await;
    let waited = started.elapsed();
    assert!(
        waited >= std::time::Duration::from_millis(300),
        "admitted after the probe timeout, not before: {waited:?}"
    );
    logs.wait_for(&["did not answer a probe"]).await;
    assert_eq!(
        relay
            .metric("execrelay_relay_link_closes_total{reason=\"keepalive_timeout\"}")
            .await,
        1
    );
    // New streams reach the new link.
    let c = client(&relay, ENV).await;
    let opening = c.open(stream_id(), Bytes::from_static(b"msg1")).unwrap();
    let req = guard("OPEN on the new link", incoming2.next())
        .await
        .unwrap();
    let mut s = req.accept(Bytes::from_static(b"msg2")).unwrap();
    let mut cs = guard("accepted", opening).await.unwrap().stream;
    cs.sender.send(Bytes::from_static(b"hello")).await.unwrap();
    assert_eq!(
        guard("record", s.receiver.recv()).await.unwrap().1,
        Bytes::from_static(b"hello")
    );
    assert_eq!(second.close_reason(), None);
    drop(silent);
    relay.stop().await;
}

#[tokio::test]
async fn malformed_frames_close_only_the_sender_after_its_budget() {
    let mut b = Bystander::start(settings()).await;
    let mut raw = b.relay.ws(&format!("/v1/connect/{ENV}")).await;
    // 16 tolerated back to back; the 17th closes the link.
    for _ in 0..17 {
        send_bytes(&mut raw, vec![9u8; 10]).await;
    }
    wait_closed(&mut raw).await;
    b.relay
        .wait_metric(
            "execrelay_relay_link_closes_total{reason=\"malformed_budget\"}",
            1,
        )
        .await;
    let m = b.relay.metrics().await;
    assert_eq!(
        metric_of(
            &m,
            "execrelay_relay_dropped_frames_total{reason=\"malformed\"}"
        ),
        17
    );
    assert_eq!(
        metric_of(
            &m,
            "execrelay_relay_frames_total{type=\"undecodable\",direction=\"in\"}"
        ),
        17
    );
    b.still_fine("after malformed frames").await;
    b.relay.stop().await;
}

#[tokio::test]
async fn frames_for_unknown_streams_close_only_the_sender_after_its_budget() {
    let mut b = Bystander::start(settings()).await;
    let mut raw = b.relay.ws(&format!("/v1/connect/{ENV}")).await;
    for i in 0..65u64 {
        let mut id = [7u8; 16];
        id[..8].copy_from_slice(&i.to_be_bytes());
        send_raw(&mut raw, &data_frame(id, 1, b"x")).await;
    }
    wait_closed(&mut raw).await;
    b.relay
        .wait_metric(
            "execrelay_relay_link_closes_total{reason=\"unknown_stream_budget\"}",
            1,
        )
        .await;
    assert_eq!(
        b.relay
            .metric("execrelay_relay_dropped_frames_total{reason=\"unknown_stream\"}")
            .await,
        65
    );
    // The bystander's own stream id, named by a stranger, is unknown on the stranger's link.
    let mut raw = b.relay.ws(&format!("/v1/connect/{ENV}")).await;
    send_raw(&mut raw, &data_frame(b.stream.id(), 1, b"forged")).await;
    send_raw(&mut raw, &Frame::reset(b.stream.id(), "forged")).await;
    b.relay
        .wait_metric(
            "execrelay_relay_dropped_frames_total{reason=\"unknown_stream\"}",
            67,
        )
        .await;
    b.still_fine("after unknown-stream frames").await;
    b.relay.stop().await;
}

/// A WebSocket message whose header announces more than the frame limit is refused from the
/// header: the relay closes the link while the sender is still far from the end, so the
/// message was never buffered whole.
#[tokio::test]
async fn an_oversized_frame_is_refused_before_it_is_buffered() {
    let mut b = Bystander::start(settings()).await;
    // A hand-made upgrade, then a binary frame announcing 64 MiB.
    let mut tcp = tokio::net::TcpStream::connect(b.relay.addr).await.unwrap();
    let req = format!(
        "GET /v1/connect/{ENV} HTTP/1.1\r\nHost: relay\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    );
    tcp.write_all(req.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        guard("101", tcp.read_exact(&mut byte)).await.unwrap();
        head.push(byte[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    let announced: u64 = 64 << 20;
    let mut frame = vec![0x82u8, 0x80 | 127];
    frame.extend_from_slice(&announced.to_be_bytes());
    frame.extend_from_slice(&[0, 0, 0, 0]); // mask key
    tcp.write_all(&frame).await.unwrap();
    // Keep sending payload until the relay closes; it must do so long before 64 MiB.
    let chunk = vec![0u8; 64 << 10];
    let mut sent = 0usize;
    let closed = guard("closed", async {
        loop {
            match tcp.write_all(&chunk).await {
                Ok(()) => sent += chunk.len(),
                Err(_) => return,
            }
            if sent >= announced as usize {
                panic!("the whole oversized frame was accepted");
            }
        }
    });
    closed.await;
    assert!(
        sent < 16 << 20,
        "{sent} bytes were written before the relay closed the link"
    );
    b.relay
        .wait_metric(
            "execrelay_relay_link_closes_total{reason=\"oversized_frame\"}",
            1,
        )
        .await;
    // One byte over the limit, as a whole message, is refused the same way.
    let mut raw = b.relay.ws(&format!("/v1/connect/{ENV}")).await;
    send_bytes(&mut raw, vec![0u8; MAX_FRAME_BYTES + 1]).await;
    wait_closed(&mut raw).await;
    b.relay
        .wait_metric(
            "execrelay_relay_link_closes_total{reason=\"oversized_frame\"}",
            2,
        )
        .await;
    b.still_fine("after oversized frames").await;
    b.relay.stop().await;
}

#[tokio::test]
async fn a_flood_of_opens_is_held_to_the_rate_and_refused_busy() {
    let per_second = 4;
    let mut b = Bystander::start(execrelay_relay::server::settings::RelaySettings {
        opens_per_second: per_second,
        ..settings()
    })
    .await;
    let mut raw = b.relay.ws(&format!("/v1/connect/{ENV}")).await;
    let started = tokio::time::Instant::now();
    let n = 40;
    let mut ids = Vec::new();
    for _ in 0..n {
        let id = stream_id();
        ids.push(id);
        send_raw(&mut raw, &open_frame(id, 16)).await;
    }
    let (mut accepted, mut busy) = (0u64, 0u64);
    while accepted + busy < n {
        let f = recv_frame(&mut raw, GUARD).await.unwrap();
        match f.ftype {
            FrameType::Accept => accepted += 1,
            FrameType::Reset => {
                assert_eq!(f.reset_reason(), "busy");
                busy += 1;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    let elapsed = started.elapsed().as_secs() + 1;
    assert!(accepted >= u64::from(per_second), "{accepted}");
    assert!(
        accepted <= u64::from(per_second) * (1 + elapsed),
        "{accepted} accepted in about {elapsed} s"
    );
    assert_eq!(
        b.relay
            .metric("execrelay_relay_resets_total{reason=\"busy\"}")
            .await,
        busy
    );
    assert_eq!(
        b.relay
            .metric("execrelay_relay_dropped_frames_total{reason=\"refused_open\"}")
            .await,
        busy
    );
    b.still_fine("after a flood of OPENs").await;
    b.relay.stop().await;
}

#[tokio::test]
async fn a_sender_past_its_window_is_reset_alone() {
    let mut b = Bystander::start(settings()).await;
    // A second environment whose receiver never reads and advertises a window of 4.
    let slow_keys = Keypair::generate().unwrap();
    b.relay
        .write_environments(&[(ENV, &b.env_keys), ("slow", &slow_keys)]);
    b.relay
        .wait_metric("execrelay_relay_environments_listed", 2)
        .await;
    let mut ws = b.relay.ws("/v1/env/slow").await;
    env_handshake(&mut ws, &slow_keys, &b.relay.keys.public, "slow", next_ts())
        .await
        .expect("admitted");
    let small_window = EndpointConfig {
        window: 4,
        ..EndpointConfig::default()
    };
    let (_slow, mut incoming) =
        execrelay_io::driver::EndpointLink::spawn_server(ws, small_window).unwrap();
    let mut raw = b.relay.ws("/v1/connect/slow").await;
    let id = stream_id();
    send_raw(&mut raw, &open_frame(id, 16)).await;
    let req = guard("OPEN", incoming.next()).await.unwrap();
    let mut held = req.accept(Bytes::from_static(b"msg2")).unwrap();
    let accept = recv_until(&mut raw, |f| f.ftype == FrameType::Accept)
        .await
        .unwrap();
    assert_eq!(accept.window, 4);
    // Records 1..=4 fit the window; record 5 is past it.
    for seq in 1..=5 {
        send_raw(&mut raw, &data_frame(id, seq, b"record")).await;
    }
    let reset = recv_until(&mut raw, |f| f.ftype == FrameType::Reset && f.stream == id)
        .await
        .unwrap();
    assert_eq!(reset.reset_reason(), "window_exceeded");
    // The environment gets the records of its window still in flight (the relay drops what
    // it had queued for a stream it resets), in order, then the reset.
    let mut next = 1;
    loop {
        match guard("record or reset", held.receiver.recv()).await {
            Ok((seq, _)) => {
                assert_eq!(seq, next);
                assert!(seq <= 4, "record {seq} is past the window");
                next += 1;
            }
            Err(e) => {
                assert_eq!(e, StreamError::PeerReset("window_exceeded".into()));
                break;
            }
        }
    }
    assert_eq!(
        b.relay
            .metric("execrelay_relay_resets_total{reason=\"window_exceeded\"}")
            .await,
        1
    );
    // The sender's link stays up (a stream-level fault), and so does everyone else.
    let again = stream_id();
    send_raw(&mut raw, &open_frame(again, 16)).await;
    assert!(guard("second OPEN", incoming.next()).await.is_some());
    b.still_fine("after a window violation").await;
    b.relay.stop().await;
}

#[tokio::test]
async fn an_environment_that_never_sends_its_handshake_is_cut_at_the_timeout() {
    let (logs, _g) = capture_logs();
    let env_keys = Keypair::generate().unwrap();
    let relay = Relay::start(
        execrelay_relay::server::settings::RelaySettings {
            link_handshake_timeout_ms: 200,
            ..settings()
        },
        &[(ENV, &env_keys)],
    )
    .await;
    let mut ws = relay.ws(&format!("/v1/env/{ENV}")).await;
    wait_closed(&mut ws).await;
    logs.wait_for(&["environment link refused: no link handshake"])
        .await;
    // A first frame that is not a link handshake is refused malformed_frame.
    let mut ws = relay.ws(&format!("/v1/env/{ENV}")).await;
    send_raw(&mut ws, &open_frame(stream_id(), 16)).await;
    let reset = recv_until(&mut ws, |f| f.ftype == FrameType::Reset)
        .await
        .unwrap();
    assert_eq!(
        (reset.stream, reset.reset_reason().as_str()),
        (LINK_STREAM, "malformed_frame")
    );
    let m = relay.metrics().await;
    assert_eq!(
        metric_of(
            &m,
            "execrelay_relay_environment_handshakes_total{result=\"timeout\"}"
        ),
        1
    );
    assert_eq!(
        metric_of(
            &m,
            "execrelay_relay_environment_handshakes_total{result=\"malformed_frame\"}"
        ),
        1
    );
    relay.stop().await;
}

#[tokio::test]
async fn shutdown_closes_every_link() {
    let env_keys = Keypair::generate().unwrap();
    let relay = Relay::start(settings(), &[(ENV, &env_keys)]).await;
    let (env, incoming) = environment(&relay, &env_keys, ENV, EndpointConfig::default()).await;
    echo_environment(incoming);
    let c = client(&relay, ENV).await;
    let mut s = open(&c).await;
    round_trip(&mut s, "before").await;
    relay.stop().await;
    guard("env link closes", env.closed()).await;
    guard("client link closes", c.closed()).await;
    assert!(matches!(
        guard("stream ends", s.receiver.recv()).await,
        Err(StreamError::LinkClosed(_) | StreamError::PeerReset(_))
    ));
}

/// A relay listing `ENV` with `env_keys`, with three environment handshake slots, two per
/// address.
async fn relay_with_three_env_slots(env_keys: &Keypair) -> Relay {
    Relay::start(
        execrelay_relay::server::settings::RelaySettings {
            max_pending_link_handshakes: 3,
            max_pending_link_handshakes_per_address: 2,
            ..settings()
        },
        &[(ENV, env_keys)],
    )
    .await
}

/// `ENV` connects with `env_keys` and echoes; a client's stream through the relay makes a
/// round trip (`what` names the moment). The environment's link is returned to keep it up.
async fn an_environment_serves(
    relay: &Relay,
    env_keys: &Keypair,
    what: &str,
) -> execrelay_io::driver::EndpointLink {
    let (env, incoming) = environment(relay, env_keys, ENV, EndpointConfig::default()).await;
    echo_environment(incoming);
    let c = client(relay, ENV).await;
    let mut s = open(&c).await;
    round_trip(&mut s, what).await;
    env
}

// Reproduce (before the eviction of silent links): squatters from a few addresses (four, at
// the default shares) each hold their address's share of `/v1/env/ID` upgrades that never
// send message 1, renewing each as it times out; together they hold every slot, and every
// environment's reconnection meanwhile is refused `RESET busy` (a red team kept a real
// environment off a relay for 45 s this way). Now a newcomer takes the slot of the oldest
// silent link of the address holding the most.
#[tokio::test]
async fn a_reconnecting_environment_takes_the_slot_of_a_silent_squatter() {
    use futures_util::StreamExt;
    let env_keys = Keypair::generate().unwrap();
    let relay = relay_with_three_env_slots(&env_keys).await;
    let path = format!("/v1/env/{ENV}");
    let (a, b) = (
        std::net::Ipv4Addr::new(127, 0, 0, 2),
        std::net::Ipv4Addr::new(127, 0, 0, 3),
    );
    let mut oldest = ws_from(a, &relay, &path).await;
    let _second = ws_from(a, &relay, &path).await;
    let _third = ws_from(b, &relay, &path).await;
    // One more from the first address is over its share: refused at once. Its task starts
    // after the first two took their slots (accepted in order).
    let _over = ws_from(a, &relay, &path).await;
    let busy = "execrelay_relay_environment_handshakes_total{result=\"busy\"}";
    relay.wait_metric(busy, 1).await;
    // Every slot is held by silent links; the environment (another address) gets one.
    let env = an_environment_serves(&relay, &env_keys, "after an eviction").await;
    let evicted = "execrelay_relay_environment_handshakes_total{result=\"evicted\"}";
    assert_eq!(relay.wait_metric(evicted, 1).await, 1);
    assert_eq!(relay.metric(busy).await, 1, "nobody else was refused");
    // The evicted one was the oldest of the address holding two: it is told and closed.
    let told = guard("the evicted link is told", oldest.next()).await;
    let Some(Ok(tokio_tungstenite::tungstenite::Message::Binary(b))) = told else {
        panic!("a RESET on stream id 0, got {told:?}");
    };
    let f = execrelay_protocol::frame::Frame::decode(&b).expect("a frame");
    assert_eq!(f.ftype, execrelay_protocol::frame::FrameType::Reset);
    assert_eq!(&f.payload[..], b"busy");
    drop((env, oldest));
    relay.stop().await;
}

// Reproduce (before `max_pending_link_handshakes_per_address`): one host opens
// `max_pending_link_handshakes` upgrades to `/v1/env/ID` (any id, no key needed) and never
// sends message 1; every slot is held for `link_handshake_timeout_ms`, and every
// environment's reconnection meanwhile is refused `RESET busy`. Repeated, that keeps every
// environment off the relay. Now one address holds at most its share of the slots.
#[tokio::test]
async fn one_address_cannot_hold_every_environment_handshake_slot() {
    let env_keys = Keypair::generate().unwrap();
    let relay = relay_with_three_env_slots(&env_keys).await;
    let squatter = std::net::Ipv4Addr::new(127, 0, 0, 2);
    let mut silent = Vec::new();
    for _ in 0..3 {
        silent.push(ws_from(squatter, &relay, &format!("/v1/env/{ENV}")).await);
    }
    // One over the address's share is refused at once.
    let busy = "execrelay_relay_environment_handshakes_total{result=\"busy\"}";
    relay.wait_metric(busy, 1).await;
    // The environment (another address) still gets a slot and is admitted: its share and the
    // squatter's two fill the relay's three exactly.
    let env = an_environment_serves(&relay, &env_keys, "with a squatter").await;
    assert_eq!(relay.metric(busy).await, 1);
    drop((silent, env));
    relay.stop().await;
}
