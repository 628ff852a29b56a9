//! The `noise+ws://` handshake and its authorization (`secure-transport.md` §2–§5, §8;
//! `protocol.md` §3), against an in-process server with a scripted authorizer and a raw link
//! client: the prologue binds message 1 to its stream, a pending authorization blocks nothing
//! else (not even shutdown), an oversized or malformed message 1 is reset before
//! authorization, violations on pending streams are charged to the link's failure budget, the
//! pending authorizations of a link are capped, sessions are bound to the client's static
//! key, a message 1 is refused when replayed (its `ts` already seen for the key), stamped
//! before the server started, or stamped by a clock more than 2 minutes off, and the failure
//! budget refills on tokio's clock.
//!
//! Every wait is on a frame or a message, never on a sleep; every wait is bounded by a hang
//! guard.

mod common;
use common::noise::*;
use common::*;

use serde_json::json;

use std::time::Duration;

use execrelay::config::ServerConfig;
use execrelay::noise::handshake::{ClientHandshake, MAX_MSG1_BYTES};
use execrelay::noise::keys::Keypair;
use execrelay::noise::timestamp::{next_hello_ts, unix_micros};
use execrelay_protocol::frame::{Frame, FrameType};

// =============================================================================================
// 4. The prologue binds message 1 to its stream.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_1_replayed_on_another_stream_is_reset() {
    let (a, auth, srv) = serve_one(ServerConfig::default()).await;
    let mut link = RawLink::connect(srv.port).await;

    let sid1 = random_sid();
    let (hs, m1) =
        ClientHandshake::start(&a, &srv.keys.public, "", &sid1, None, next_hello_ts()).unwrap();
    link.send_open(sid1, m1.clone()).await;
    let accept = link.frame_for(&sid1).await;
    assert_eq!(accept.ftype, FrameType::Accept, "{}", accept.reset_reason());
    hs.finish(&accept.payload).unwrap();

    // The captured message 1, spliced onto another stream id of the same link.
    let sid2 = random_sid();
    link.send_open(sid2, m1.clone()).await;
    link.expect_reset(&sid2, "handshake_failed").await;
    // And onto another link, other stream id.
    let mut link2 = RawLink::connect(srv.port).await;
    let sid3 = random_sid();
    link2.send_open(sid3, m1).await;
    link2.expect_reset(&sid3, "handshake_failed").await;
    assert_eq!(
        auth.calls_for(&a),
        1,
        "only the genuine handshake was authorized"
    );
    assert!(
        link.backlog
            .iter()
            .chain(link2.backlog.iter())
            .all(|f| f.ftype != FrameType::Accept),
        "never ACCEPT"
    );
    srv.stop().await;
}

// Once a bug: a message 1 replayed *with its own stream id* on another link
// passed the prologue and was ACCEPTed (the attacker could not use the stream, but learned
// that the key was still authorized, and took a slot). Now `ts` must grow per client key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_1_replayed_with_its_stream_id_is_refused() {
    let (a, auth, srv) = serve_one(ServerConfig::default()).await;
    let mut link = RawLink::connect(srv.port).await;
    let sid = random_sid();
    let (hs, m1) =
        ClientHandshake::start(&a, &srv.keys.public, "", &sid, None, next_hello_ts()).unwrap();
    link.send_open(sid, m1.clone()).await;
    let accept = link.frame_for(&sid).await;
    assert_eq!(accept.ftype, FrameType::Accept, "{}", accept.reset_reason());
    hs.finish(&accept.payload).unwrap();

    // On another link, same stream id: the prologue matches, the `ts` does not grow.
    let mut other = RawLink::connect(srv.port).await;
    other.send_open(sid, m1.clone()).await;
    other.expect_reset(&sid, "replayed_handshake").await;
    // On the same link once the original stream is gone. A peer's RESET removes a stream at
    // once (the link engine answers nothing to it), and frames on a link are handled in
    // order, so the OPEN that follows finds the id free.
    link.send_frame(&Frame::reset(sid, "done")).await;
    link.send_open(sid, m1).await;
    link.expect_reset(&sid, "replayed_handshake").await;
    assert_eq!(auth.calls_for(&a), 1, "a replay is never authorized");

    // The key's next genuine handshake, on either link, is accepted.
    link.open_ready(&a, &srv.keys.public).await;
    other.open_ready(&a, &srv.keys.public).await;
    srv.stop().await;
}

/// A replay sent while the original still waits for its authorization is refused too (the
/// pending `ts` counts), and the refusal is charged to the failure budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_1_replayed_during_its_authorization_is_refused_and_charged() {
    let (a, b, auth, mut entered) = block_a_allow_b();
    let srv = start_server(auth.clone(), quick_budget(2)).await;
    let mut link = RawLink::connect(srv.port).await;
    let (sid, m1) = link.send_hello(&a, &srv.keys.public).await;
    wait_entered(&mut entered, &a).await;

    let mut other = RawLink::connect(srv.port).await;
    other.send_open(sid, m1.clone()).await;
    other.expect_reset(&sid, "replayed_handshake").await;
    other.open_ready(&b, &srv.keys.public).await;
    // Burst 2: the second charged failure closes the link.
    other.send_open(sid, m1).await;
    other
        .expect_closed_after_resets("only resets before the close")
        .await;
    assert_eq!(auth.calls_for(&a), 1, "only the original is authorized");
    srv.shutdown.cancel();
}

/// `secure-transport.md` §3: a `ts` more than 2 minutes (`handshake_clock_window_ms`) from
/// the server's clock is refused `clock_skew` (before authorization, charged), either way;
/// one minute ahead is accepted. (One minute behind would be before the server started:
/// `replayed_handshake`, in `a_message_1_stamped_before_the_server_started_is_refused`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_clock_more_than_two_minutes_off_is_refused() {
    let (a, auth, srv) = serve_one(quick_budget(3)).await;
    let mut link = RawLink::connect(srv.port).await;
    let now = unix_micros(std::time::SystemTime::now());
    let minutes = |m: u64| m * 60_000_000;
    for ts in [now - minutes(3), now + minutes(3)] {
        let sid = random_sid();
        let (_, m1) = ClientHandshake::start(&a, &srv.keys.public, "", &sid, None, ts).unwrap();
        link.send_open(sid, m1).await;
        link.expect_reset(&sid, "clock_skew").await;
    }
    assert_eq!(auth.total_calls(), 0, "refused before authorization");
    let sid = random_sid();
    let (hs, m1) =
        ClientHandshake::start(&a, &srv.keys.public, "", &sid, None, now + minutes(1)).unwrap();
    link.send_open(sid, m1).await;
    let f = link.frame_for(&sid).await;
    assert_eq!(f.ftype, FrameType::Accept, "{}", f.reset_reason());
    hs.finish(&f.payload).unwrap();
    // Burst 3, two charged: a third skewed message 1 closes the link.
    let sid = random_sid();
    let (_, m1) =
        ClientHandshake::start(&a, &srv.keys.public, "", &sid, None, now - minutes(20)).unwrap();
    link.send_open(sid, m1).await;
    link.expect_closed_after_resets("only resets before the close")
        .await;
    srv.stop().await;
}

/// `secure-transport.md` §3: nothing stamped before the server started is accepted, so a
/// restart opens no replay window: a message 1 stamped a second before the server came up
/// (within the clock window, never seen by this server) is refused `replayed_handshake`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_1_stamped_before_the_server_started_is_refused() {
    let before = unix_micros(std::time::SystemTime::now()) - 1_000_000;
    let (a, auth, srv) = serve_one(quick_budget(3)).await;
    let mut link = RawLink::connect(srv.port).await;
    let sid = random_sid();
    let (_, m1) = ClientHandshake::start(&a, &srv.keys.public, "", &sid, None, before).unwrap();
    link.send_open(sid, m1).await;
    link.expect_reset(&sid, "replayed_handshake").await;
    assert_eq!(auth.total_calls(), 0, "refused before authorization");
    // A fresh stamp of the same key passes.
    let mut st = link.open_ready(&a, &srv.keys.public).await;
    link.assert_alive(&mut st).await;
    srv.stop().await;
}

// =============================================================================================
// 8b. The failure budget runs on tokio's clock.

/// An `OPEN` whose message 1 is garbage (a charged handshake failure); its stream id.
async fn garbage_open(link: &mut RawLink) -> execrelay_protocol::frame::StreamId {
    let sid = random_sid();
    link.send_open(sid, b"garbage".to_vec()).await;
    sid
}

/// Once a bug: the budget read `std::time::Instant` while the keepalive used tokio's
/// clock, so paused time could not drive its refill. On paused time, advancing tokio's clock
/// by one refill interval now gives one failure back: the third failure leaves the link open
/// (before the fix it closed it), and the fourth, with no time passing, closes it.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_failure_budget_refills_on_tokios_clock() {
    let refill = Duration::from_secs(60);
    let limits = ServerConfig {
        handshake_failure_burst: 3,
        handshake_failure_refill_ms: refill.as_millis() as u64,
        // No other timer may fire while the test waits on the sockets (nor close the link
        // for having no stream while the clock is advanced).
        keepalive_interval_ms: 7 * 24 * 3600 * 1000,
        pong_timeout_ms: 14 * 24 * 3600 * 1000,
        idle_link_timeout_ms: 14 * 24 * 3600 * 1000,
        ..Default::default()
    };
    let (a, _auth, srv) = serve_one(limits).await;
    let mut link = RawLink::connect(srv.port).await;
    for _ in 0..2 {
        let sid = garbage_open(&mut link).await;
        link.expect_reset(&sid, "handshake_failed").await;
    }
    tokio::time::advance(refill).await;
    let sid = garbage_open(&mut link).await;
    link.expect_reset(&sid, "handshake_failed").await;
    link.open(&a, &srv.keys.public).await;
    garbage_open(&mut link).await;
    link.expect_closed_after_resets("only resets before the close")
        .await;
    srv.stop().await;
}

// =============================================================================================
// 6. A pending authorization blocks nothing else.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_authorization_blocks_nothing_else() {
    let (a, b, auth, mut entered) = block_a_allow_b();
    let srv = start_server(auth.clone(), ServerConfig::default()).await;
    let mut link = RawLink::connect(srv.port).await;
    let mut established = link.open_ready(&b, &srv.keys.public).await;

    // A's handshake: message 1 is valid, authorization never answers.
    let (sid_a, _) = link.send_hello(&a, &srv.keys.public).await;
    wait_entered(&mut entered, &a).await;

    // Meanwhile: B's handshake on the same link, and on another link, completes.
    let mut same = link.open_ready(&b, &srv.keys.public).await;
    let mut link2 = RawLink::connect(srv.port).await;
    let mut other = link2.open_ready(&b, &srv.keys.public).await;
    // The established stream carries a request and its response.
    link.assert_alive(&mut established).await;
    link.assert_alive(&mut same).await;
    link2.assert_alive(&mut other).await;
    // A got no answer at all.
    assert!(
        link.backlog.iter().all(|f| f.stream != sid_a),
        "A's stream is still pending: {:?}",
        link.backlog
    );
    assert_eq!(auth.calls_for(&a), 1);
    srv.shutdown.cancel();
}

// Regression (fixed): the Noise listener spawned each authorization on the link's `TaskTracker` and, at shutdown,
// waits for every tracked task (`links.wait()`); an authorization that never answers keeps
// it waiting forever, so the server cannot shut down (its doc says it returns after
// terminating the processes; `execrelay serve` would ignore SIGTERM with such an
// authorizer). The authorization task should be cancelled when its link ends.
// Reproduce: an `Authorizer` whose future is `pending()`, one OPEN with that key, then
// cancel the shutdown token: the server never returned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_is_not_held_up_by_a_pending_authorization() {
    let a = Keypair::generate().unwrap();
    let (auth, mut entered) = TestAuth::new(&[(&a, Verdict::Block)]);
    let srv = start_server(auth, ServerConfig::default()).await;
    let mut link = RawLink::connect(srv.port).await;
    link.send_hello(&a, &srv.keys.public).await;
    wait_entered(&mut entered, &a).await;
    srv.stop().await;
    // The link ends with the server.
    link.until_closed().await;
}

/// An authorizer that never answers and reports when its call is dropped (the server gave
/// up on the authorization).
struct Hangs(tokio::sync::mpsc::UnboundedSender<&'static str>);

struct Reports(tokio::sync::mpsc::UnboundedSender<&'static str>);

impl Drop for Reports {
    fn drop(&mut self) {
        let _ = self.0.send("dropped");
    }
}

impl execrelay::noise::authorizer::Authorizer for Hangs {
    fn authorize(
        self: std::sync::Arc<Self>,
        _req: execrelay::noise::authorizer::AuthRequest,
    ) -> std::pin::Pin<
        Box<
            dyn std::future::Future<Output = Result<(), execrelay::noise::authorizer::AuthDenied>>
                + Send,
        >,
    > {
        let _ = self.0.send("entered");
        let reports = Reports(self.0.clone());
        Box::pin(async move {
            let _reports = reports;
            std::future::pending().await
        })
    }
}

async fn next_report(rx: &mut tokio::sync::mpsc::UnboundedReceiver<&'static str>) -> &'static str {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("hang guard: the authorizer's call was never dropped")
        .expect("authorizer gone")
}

// Reproduce (fixed): a client whose authorization is pending resets its stream; the engine
// frees the pending slot at once, but the server kept awaiting the authorizer until the link
// closed. A client repeating OPEN + RESET made the server run unboundedly many
// authorizations (tasks and authorizer calls, each maybe an outside request) on one link,
// past `max_pending_authorizations`. Now the authorization is dropped with its stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_reset_while_its_authorization_is_pending_ends_the_authorization() {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let srv = start_server(std::sync::Arc::new(Hangs(tx)), ServerConfig::default()).await;
    let a = Keypair::generate().unwrap();
    let mut link = RawLink::connect(srv.port).await;
    for _ in 0..3 {
        let (sid, _) = link.send_hello(&a, &srv.keys.public).await;
        assert_eq!(next_report(&mut rx).await, "entered");
        link.send_frame(&Frame::reset(sid, "gave up")).await;
        assert_eq!(next_report(&mut rx).await, "dropped");
    }
    // The link is fine: a new handshake still reaches the authorizer.
    link.send_hello(&a, &srv.keys.public).await;
    assert_eq!(next_report(&mut rx).await, "entered");
    srv.stop().await;
}

// =============================================================================================
// 7. Oversized or malformed message 1: reset before authorization.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_or_malformed_hello_is_reset_without_authorization() {
    let (a, auth, srv) = serve_one(ServerConfig::default()).await;
    let mut link = RawLink::connect(srv.port).await;
    let server = srv.keys.public;

    // A genuine message 1 (A is authorized) whose payload is 5000 bytes of valid JSON.
    let sid = random_sid();
    let big = json!({"version": 1, "token": "t".repeat(5000)}).to_string();
    let m1 = raw_msg1(&a, &server, &sid, big.as_bytes());
    assert!(m1.len() > MAX_MSG1_BYTES);
    link.send_open(sid, m1).await;
    link.expect_reset(&sid, "handshake_failed").await;

    // 5000 bytes of junk as message 1.
    let sid = random_sid();
    link.send_open(sid, vec![0x5a; 5000]).await;
    link.expect_reset(&sid, "handshake_failed").await;

    // Small, decrypting, but not the expected payload: not JSON, version 2, no `ts`.
    let ts = next_hello_ts();
    let v2 = json!({"version": 2, "ts": ts}).to_string();
    for payload in [&b"hello"[..], v2.as_bytes(), br#"{"version": 1}"#, b"[]"] {
        let sid = random_sid();
        link.send_open(sid, raw_msg1(&a, &server, &sid, payload))
            .await;
        link.expect_reset(&sid, "handshake_failed").await;
    }
    assert_eq!(auth.total_calls(), 0, "the authorizer is never called");

    // Exactly at the limit of the payload (4096 bytes) it is accepted and authorized.
    let sid = random_sid();
    let ts = next_hello_ts();
    let pad = 4096
        - json!({"version": 1, "ts": ts, "token": ""})
            .to_string()
            .len();
    let payload = json!({"version": 1, "ts": ts, "token": "p".repeat(pad)}).to_string();
    assert_eq!(payload.len(), 4096);
    let m1 = raw_msg1(&a, &server, &sid, payload.as_bytes());
    assert_eq!(m1.len(), MAX_MSG1_BYTES);
    link.send_open(sid, m1).await;
    let f = link.frame_for(&sid).await;
    assert_eq!(f.ftype, FrameType::Accept, "{}", f.reset_reason());
    assert_eq!(auth.total_calls(), 1);
    srv.stop().await;
}

// =============================================================================================
// 8. Violations on a pending stream are reset and charged; an empty budget closes the link.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn violations_on_pending_streams_are_charged_and_close_the_link() {
    let (a, b, auth, mut entered) = block_a_allow_b();
    // Burst 2: the first charged failure leaves the link open, the second closes it.
    let srv = start_server(auth, quick_budget(2)).await;
    let server = srv.keys.public;

    // Another link's established stream, running a process across all of this.
    let mut bystander = RawLink::connect(srv.port).await;
    let mut est = bystander.open_ready(&b, &server).await;
    bystander
        .call(
            &mut est,
            "process/start",
            json!({"processId": "cat", "argv": ["cat"], "pipeStdin": true}),
        )
        .await;

    // Early DATA on a pending stream: RESET, charged.
    let mut x = RawLink::connect(srv.port).await;
    let (sid, _) = x.send_hello(&a, &server).await;
    wait_entered(&mut entered, &a).await;
    x.send_data(sid, 1, vec![0u8; 40]).await;
    x.expect_reset(&sid, "data_before_accept").await;
    // One failure: the link still works.
    x.open_ready(&b, &server).await;
    // A second early DATA empties the bucket: the link is closed.
    let (sid, _) = x.send_hello(&a, &server).await;
    wait_entered(&mut entered, &a).await;
    x.send_data(sid, 1, vec![0u8; 40]).await;
    x.expect_closed_after_resets("only resets before the close")
        .await;

    // A second OPEN on a pending stream: RESET, charged.
    let mut y = RawLink::connect(srv.port).await;
    let (sid, m1) = y.send_hello(&a, &server).await;
    wait_entered(&mut entered, &a).await;
    y.send_open(sid, m1).await;
    y.expect_reset(&sid, "duplicate_open").await;
    y.open_ready(&b, &server).await;
    let (sid, m1) = y.send_hello(&a, &server).await;
    wait_entered(&mut entered, &a).await;
    y.send_open(sid, m1).await;
    y.expect_closed_after_resets("only resets before the close")
        .await;

    // Failed handshakes are charged too: one refused key, then a garbage OPEN closes.
    let stranger = Keypair::generate().unwrap();
    let mut z = RawLink::connect(srv.port).await;
    let (sid, _) = z.send_hello(&stranger, &server).await;
    z.expect_reset(&sid, "unauthorized").await;
    let sid = random_sid();
    z.send_open(sid, b"garbage".to_vec()).await;
    z.until_closed().await;

    // The bystander's stream and its process carry on.
    let w = bystander
        .call(
            &mut est,
            "process/write",
            json!({"processId": "cat", "chunk": b64(b"still here\n")}),
        )
        .await;
    assert_eq!(w["status"], "accepted");
    // The echo may overtake the write's response (events and responses travel on separate
    // lanes): `request` parks such messages in `other`.
    let mut got = Vec::new();
    for m in est.other.drain(..) {
        if m["method"] == "process/outputDelta" {
            got.extend(unb64(m["params"]["chunk"].as_str().unwrap()));
        }
    }
    while got.len() < 11 {
        match bystander.next_ev(&mut est).await {
            Ev::Msg(m) if m["method"] == "process/outputDelta" => {
                got.extend(unb64(m["params"]["chunk"].as_str().unwrap()))
            }
            Ev::Msg(_) => {}
            ev => panic!("the bystander's stream ended: {ev:?}"),
        }
    }
    assert_eq!(text(&got), "still here\n");
    srv.shutdown.cancel();
}

/// `MAX_PENDING_AUTHORIZATIONS`: more handshakes waiting on one link are reset ("busy")
/// without reaching the authorizer; other links are not affected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_authorizations_per_link_are_capped() {
    let (a, b, auth, mut entered) = block_a_allow_b();
    let limits = ServerConfig {
        max_pending_authorizations: 4,
        ..Default::default()
    };
    let srv = start_server(auth.clone(), limits).await;
    let server = srv.keys.public;
    let mut link = RawLink::connect(srv.port).await;
    for _ in 0..4 {
        link.send_hello(&a, &server).await;
        wait_entered(&mut entered, &a).await;
    }
    let (sid, _) = link.send_hello(&b, &server).await;
    link.expect_reset(&sid, "busy").await;
    assert_eq!(auth.calls_for(&b), 0, "reset without being processed");
    let mut other = RawLink::connect(srv.port).await;
    other.open_ready(&b, &server).await;
    assert_eq!(auth.calls_for(&a), 4);
    srv.shutdown.cancel();
}

// =============================================================================================
// 13. Sessions are bound to the client's static key.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_cannot_be_resumed_from_another_key() {
    let a = Keypair::generate().unwrap();
    let b = Keypair::generate().unwrap();
    let (_auth, srv) = serve_allowing(&[&a, &b], ServerConfig::default()).await;
    let server = srv.keys.public;

    let mut la = RawLink::connect(srv.port).await;
    let mut sa = la.open(&a, &server).await;
    let init = la.init(&mut sa).await;
    let session = init["sessionId"].as_str().unwrap().to_string();
    let token = init["resumeToken"].as_str().unwrap().to_string();
    assert_eq!(init["resumed"], false);
    la.call(
        &mut sa,
        "process/start",
        json!({"processId": "p", "argv": ["true"]}),
    )
    .await;

    // B, with the right session id and token.
    let mut lb = RawLink::connect(srv.port).await;
    let mut sb = lb.open(&b, &server).await;
    let r = lb
        .request(
            &mut sb,
            "initialize",
            json!({"clientName": "b", "resume": {"sessionId": session, "resumeToken": token}}),
        )
        .await;
    assert_eq!(r["error"]["code"], -32003, "{r}");
    // B's attempt did not evict A.
    la.assert_alive(&mut sa).await;

    // A itself, on a new stream, resumes it.
    let mut sa2 = la.open(&a, &server).await;
    let r = la
        .call(
            &mut sa2,
            "initialize",
            json!({"clientName": "a2", "resume": {"sessionId": session, "resumeToken": token}}),
        )
        .await;
    assert_eq!(r["resumed"], true);
    assert_eq!(r["sessionId"], session.as_str());
    // The evicted stream learns that it is gone: close record, then RESET.
    loop {
        match la.next_ev(&mut sa).await {
            Ev::Msg(_) => continue,
            Ev::Close(..) => break,
            Ev::Reset(r) => panic!("RESET {r:?} before the close record"),
        }
    }
    assert!(matches!(la.next_ev(&mut sa).await, Ev::Reset(_)));
    srv.stop().await;
}
