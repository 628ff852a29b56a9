//! The relay under attack, end to end (the relay and an exec server in this process, real
//! sockets): a hostile client from one loopback address (127.0.0.2), an authorized one from
//! another (127.0.0.1). Each test reproduces a finding of the red team that failed before
//! its fix:
//!
//! - garbage `OPEN`s without a key no longer make the environment refuse everyone (`busy`):
//!   the relay charges them to the attacker's link and address;
//! - honest parallel clients of one key are accepted in any order (the replay cache), and
//!   nobody is refused because of them;
//! - one key cannot take an environment's streams (`max_streams_per_key`).
//!
//! Every wait is on a frame, a close, a message or a counter, bounded by a hang guard.

mod common;
use common::noise::*;
use common::relay::*;
use common::*;

use std::net::Ipv4Addr;

use serde_json::json;

use execrelay::config::ServerConfig;
use execrelay::link::client::{LinkPool, NoiseClientConfig};
use execrelay::noise::keys::Keypair;
use execrelay_protocol::frame::FrameType;

/// The attacker's address (the authorized client is on 127.0.0.1).
const HOSTILE: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

/// A relay, and one environment `env` whose authorizer allows `clients`.
async fn relay_and_env(
    dir: &std::path::Path,
    clients: &[&Keypair],
    config: ServerConfig,
) -> (InRelay, InEnv, Keypair) {
    let server = Keypair::generate().unwrap();
    let envs = environments_file(dir, &[("env", &server)]);
    let relay = InRelay::start(&envs).await;
    let rules: Vec<(&Keypair, Verdict)> = clients.iter().map(|k| (*k, Verdict::Allow)).collect();
    let (auth, _) = TestAuth::new(&rules);
    let env = InEnv::start(
        &relay.url(),
        relay.keys.public,
        "env",
        server.clone(),
        auth,
        config,
    )
    .await;
    env.registered().await;
    (relay, env, server)
}

/// Open `n` streams of `key` on `link` at once and expect an `ACCEPT` for each (never
/// `busy`); their ids.
async fn accepted(
    link: &mut RawLink,
    key: &Keypair,
    server: &Keypair,
    n: usize,
) -> Vec<execrelay_protocol::frame::StreamId> {
    let mut sids = Vec::new();
    for _ in 0..n {
        sids.push(link.send_hello(key, &server.public).await.0);
    }
    for sid in &sids {
        let f = link.frame_for(sid).await;
        assert_eq!(f.ftype, FrameType::Accept, "refused: {}", f.reset_reason());
    }
    sids
}

/// Finding 1 (high): eight garbage `OPEN`s from a client without a key emptied the
/// environment link's handshake budget, and every authorized client's `OPEN` got `busy` for
/// the 10 s cool-down (40 of 40), renewed for as long as the attacker kept it up (about one
/// `OPEN` a second). Now each failure is charged by the relay to the link and address that
/// caused it: the attacker's link closes at its 8th failure, the environment never refuses
/// anyone, and the authorized client's 48 `OPEN`s between the attacker's rounds are all
/// accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_opens_close_the_attackers_links_and_never_make_the_environment_busy() {
    let dir = tempfile::tempdir().unwrap();
    let good = Keypair::generate().unwrap();
    let (relay, env, server) = relay_and_env(dir.path(), &[&good], ServerConfig::default()).await;
    let mut honest = RawLink::connect_path(relay.port, "/v1/connect/env", "env").await;
    let mut opened = 0;
    for round in 0..6 {
        // The attacker: a fresh link, ten OPENs of garbage, never a key.
        let mut bad = RawLink::connect_from(HOSTILE, relay.port, "/v1/connect/env", "env").await;
        for _ in 0..10 {
            bad.send_open(random_sid(), vec![7u8; 96]).await;
        }
        let seen = bad.until_closed().await;
        assert!(
            seen.len() <= 8
                && seen
                    .iter()
                    .all(|f| f.ftype == FrameType::Reset && f.reset_reason() == "handshake_failed"),
            "round {round}: {seen:?}"
        );
        // The authorized client, between the rounds: nothing refused.
        opened += accepted(&mut honest, &good, &server, 8).await.len();
    }
    assert_eq!(opened, 48);
    assert_eq!(
        env.noise_failures("busy"),
        0,
        "the environment refused no one"
    );
    assert_eq!(env.links(), 1, "the environment link was never closed");
    assert!(
        env.noise_failures("handshake_failed") >= 48,
        "the garbage reached it"
    );
    assert_eq!(
        relay
            .metrics
            .value("execrelay_relay_link_closes_total{reason=\"handshake_budget\"}"),
        6,
        "each attacker link closed at its budget"
    );
    assert!(
        relay
            .metrics
            .value("execrelay_relay_handshake_failures_total")
            >= 48
    );
    env.stop().await;
    relay.stop().await;
}

/// Finding 5: 16 clients of one key at a time (separate links, as separate processes
/// have), 5 rounds. Their stamps reach the server in any order; under the old high-water mark
/// each one that arrived after a later one was refused `replayed_handshake` and charged to
/// the environment's budget, which then refused everyone (`busy`), a *different* key too.
/// The replay cache accepts each once: no refusal at all, and another key's stream right
/// after opens at once. The key's stream quota is held exactly (16 at a time, 16 allowed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_clients_of_one_key_are_accepted_in_any_order() {
    const PARALLEL: usize = 16;
    let dir = tempfile::tempdir().unwrap();
    let (shared, other) = (Keypair::generate().unwrap(), Keypair::generate().unwrap());
    // Every stream initializes a session of its own (kept detached afterwards). The key's
    // stream quota is exactly the parallelism: a round's streams must be given back as their
    // clients go, or the next round is refused `too_many_streams` (a finished stream used to
    // keep its slot for the 2 s its connection takes to flush its last writes).
    let config = ServerConfig {
        max_sessions: 128,
        max_sessions_per_key: 128,
        max_streams_per_key: PARALLEL,
        ..ServerConfig::default()
    };
    let (relay, env, server) = relay_and_env(dir.path(), &[&shared, &other], config).await;
    let url = relay.client_url("env");
    for round in 0..5 {
        let mut tasks = Vec::new();
        for _ in 0..PARALLEL {
            let (url, cfg) = (
                url.clone(),
                NoiseClientConfig::new(shared.clone(), server.public),
            );
            tasks.push(tokio::spawn(async move {
                // A pool of its own: a link of its own, as a separate process has.
                let link = LinkPool::new().link(&url, &cfg).await.unwrap();
                let t = tokio::time::timeout(GUARD, link.open_stream())
                    .await
                    .expect("open (hang guard)")
                    .expect("a stream");
                let mut t = TransportRpc { t, next_id: 0 };
                let r = t
                    .call("initialize", json!({"clientName": "parallel"}))
                    .await;
                assert!(r["sessionId"].is_string(), "{r}");
            }));
        }
        for t in tasks {
            tokio::time::timeout(GUARD, t)
                .await
                .unwrap_or_else(|_| panic!("round {round}: hang guard"))
                .unwrap();
        }
    }
    assert_eq!(env.noise_failures("replayed_handshake"), 0);
    assert_eq!(env.noise_failures("busy"), 0);
    assert_eq!(
        relay
            .metrics
            .value("execrelay_relay_handshake_failures_total"),
        0
    );
    // Another key, right after: accepted at once.
    let mut link = RawLink::connect_path(relay.port, "/v1/connect/env", "env").await;
    accepted(&mut link, &other, &server, 1).await;
    env.stop().await;
    relay.stop().await;
}

/// Finding 6: one authorized key held 996 of the environment link's 1024 streams, and
/// another key's `OPEN`s then got `too_many_streams`. A key now holds at most
/// `max_streams_per_key` streams over all its links (8 here; 64 by default): at the edge, its
/// 8 are accepted, its 9th refused `too_many_streams` (not charged: the relay keeps its link),
/// another key's 8 accepted; a stream's end gives its key a slot back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_key_cannot_take_the_environments_streams() {
    let dir = tempfile::tempdir().unwrap();
    let (greedy, other) = (Keypair::generate().unwrap(), Keypair::generate().unwrap());
    let config = ServerConfig {
        max_streams_per_key: 8,
        ..ServerConfig::default()
    };
    let (relay, env, server) = relay_and_env(dir.path(), &[&greedy, &other], config).await;
    let mut a = RawLink::connect_path(relay.port, "/v1/connect/env", "env").await;
    let mut held = accepted(&mut a, &greedy, &server, 8).await;
    // Over two links: the quota is the key's, not the link's.
    let mut a2 = RawLink::connect_path(relay.port, "/v1/connect/env", "env").await;
    let (sid, _) = a2.send_hello(&greedy, &server.public).await;
    a2.expect_reset(&sid, "too_many_streams").await;
    let mut b = RawLink::connect_path(relay.port, "/v1/connect/env", "env").await;
    accepted(&mut b, &other, &server, 8).await;
    // One of the greedy key's streams ends: one more fits, and no more.
    let gone = held.pop().unwrap();
    a.send_frame(&execrelay_protocol::frame::Frame::reset(gone, "done"))
        .await;
    eventually("the ended stream is gone", || env.streams() == 15).await;
    accepted(&mut a2, &greedy, &server, 1).await;
    let (sid, _) = a2.send_hello(&greedy, &server.public).await;
    a2.expect_reset(&sid, "too_many_streams").await;
    assert_eq!(
        relay
            .metrics
            .value("execrelay_relay_handshake_failures_total"),
        0
    );
    assert!(env.noise_failures("too_many_streams") >= 2);
    env.stop().await;
    relay.stop().await;
}

/// The exec server's environment link keeps only a last-resort budget, which no rate one
/// relay-throttled client reaches: an address sends 400 garbage `OPEN`s over as many links as
/// it likes (8 each); the relay forwards them only while the address's failure tokens cover
/// them (256, then one a second), refuses the rest `busy` itself, and closes each link at its
/// 8th failure. The environment sees at most `256 + seconds` failures, far below its budget of
/// 4096, and keeps accepting the authorized client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_cannot_empty_the_environments_last_resort_budget() {
    let dir = tempfile::tempdir().unwrap();
    let good = Keypair::generate().unwrap();
    let (relay, env, server) = relay_and_env(dir.path(), &[&good], ServerConfig::default()).await;
    let started = std::time::Instant::now();
    let (mut failed, mut busy) = (0, 0);
    for _ in 0..50 {
        let mut bad = RawLink::connect_from(HOSTILE, relay.port, "/v1/connect/env", "env").await;
        for _ in 0..8 {
            bad.send_open(random_sid(), vec![7u8; 96]).await;
        }
        // Eight answers, or the link's end (its 8th failure closes it, queued answers and all).
        let mut answers = 0;
        while answers < 8 {
            match bad.read_frame().await {
                Some(f) if f.reset_reason() == "busy" => busy += 1,
                Some(f) => {
                    assert_eq!(f.reset_reason(), "handshake_failed", "{f:?}");
                    failed += 1;
                }
                None => break,
            }
            answers += 1;
        }
    }
    let seconds = started.elapsed().as_secs() + 1;
    let reached = env.noise_failures("handshake_failed");
    assert!(
        (200..=256 + seconds).contains(&reached),
        "{reached} failures reached the environment in {seconds} s ({failed} answered, {busy} refused by the relay)"
    );
    assert!(busy > 0, "the relay throttled the address itself");
    let mut honest = RawLink::connect_path(relay.port, "/v1/connect/env", "env").await;
    accepted(&mut honest, &good, &server, 4).await;
    assert_eq!(env.noise_failures("busy"), 0);
    env.stop().await;
    relay.stop().await;
}
