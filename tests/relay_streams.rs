//! Streams through a relay, with the relay and the exec server in this process: a
//! second server with the same key waits while the first holds the id; the relay killed and restarted five
//! times under `seq 1 3000000`, the client resuming with nothing lost or repeated; 1,000
//! streams from 10 client links, every output exact; hostile senders on a client link,
//! handled without touching another client's established stream; an empty handshake bucket
//! on the environment link refusing new streams only; the environment link kept while idle;
//! quotas through the relay counted per key, not per address.
//!
//! Every wait is on a message, an exit, a reset or a gauge, bounded by a hang guard.

mod common;
use common::noise::*;
use common::relay::*;
use common::*;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::json;
use sha2::{Digest, Sha256};

use execrelay::client::{Client, ClientOptions, ProcessEvent, StartOptions, Target};
use execrelay::config::ServerConfig;
use execrelay::link::client::{ClientLink, LinkPool, NoiseClientConfig};
use execrelay::noise::handshake::ClientHandshake;
use execrelay::noise::keys::Keypair;
use execrelay::noise::timestamp::next_hello_ts;
use execrelay_protocol::frame::{Frame, FrameType};
use execrelay_relay::server::settings::RelaySettings;

/// A relay, and one environment `env` registered with it whose authorizer allows `clients`.
async fn relay_and_env(
    dir: &std::path::Path,
    clients: &[&Keypair],
    config: ServerConfig,
) -> (InRelay, InEnv, Keypair, Arc<TestAuth>) {
    let rules: Vec<(&Keypair, Verdict)> = clients.iter().map(|k| (*k, Verdict::Allow)).collect();
    relay_and_env_with(dir, &rules, config).await
}

/// [`relay_and_env`] with an authorizer that answers by `rules`.
async fn relay_and_env_with(
    dir: &std::path::Path,
    rules: &[(&Keypair, Verdict)],
    config: ServerConfig,
) -> (InRelay, InEnv, Keypair, Arc<TestAuth>) {
    relay_and_env_at(dir, rules, config, RelaySettings::default()).await
}

/// [`relay_and_env_with`], the relay with `relay_settings`.
async fn relay_and_env_at(
    dir: &std::path::Path,
    rules: &[(&Keypair, Verdict)],
    config: ServerConfig,
    relay_settings: RelaySettings,
) -> (InRelay, InEnv, Keypair, Arc<TestAuth>) {
    let server = Keypair::generate().unwrap();
    let envs = environments_file(dir, &[("env", &server)]);
    let relay = InRelay::start_at(&envs, Keypair::generate().unwrap(), 0, relay_settings).await;
    let (auth, _) = TestAuth::new(rules);
    let env = InEnv::start(
        &relay.url(),
        relay.keys.public,
        "env",
        server.clone(),
        auth.clone(),
        config,
    )
    .await;
    env.registered().await;
    (relay, env, server, auth)
}

/// `server/info` answers: the stream is alive end to end.
async fn alive(t: &mut TransportRpc) {
    let info = t.call("server/info", json!({})).await;
    assert!(info["serverVersion"].is_string(), "{info}");
}

/// `initialize` + `initialized` on a library stream.
async fn init(t: &mut TransportRpc, caps: serde_json::Value) -> serde_json::Value {
    let r = t
        .call(
            "initialize",
            json!({"clientName": "relay-test", "capabilities": caps}),
        )
        .await;
    t.send(json!({"jsonrpc": "2.0", "method": "initialized", "params": {}}))
        .await;
    r
}

async fn stream(link: &Arc<ClientLink>) -> TransportRpc {
    let t = tokio::time::timeout(PROMPT, link.open_stream())
        .await
        .expect("open (hang guard)")
        .expect("a stream through the relay");
    TransportRpc { t, next_id: 0 }
}

/// Two exec servers with one environment key: the live one keeps the id and its streams,
/// the second is refused (`environment_in_use`) and keeps redialling quietly at its backoff;
/// when the first stops, the second takes over and new streams reach it. (Before, each
/// replaced the other without end, resetting every stream each time.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_server_with_the_same_key_waits_until_the_first_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let client = Keypair::generate().unwrap();
    let (relay, first, server, auth) = relay_and_env(
        dir.path(),
        &[&client],
        quick_redial(ServerConfig::default()),
    )
    .await;
    let cfg = NoiseClientConfig::new(client.clone(), server.public);
    let link = ClientLink::connect(&relay.client_url("env"), cfg)
        .await
        .unwrap();
    let mut old = stream(&link).await;
    init(&mut old, json!({})).await;
    assert_eq!(first.streams(), 1);

    let second = InEnv::start(
        &relay.url(),
        relay.keys.public,
        "env",
        server.clone(),
        auth,
        quick_redial(ServerConfig::default()),
    )
    .await;
    // Refused while the first is alive: its redials (every 50 to 200 ms) are refused too.
    let refused = || relay.refusals_in_use();
    eventually("the second server was refused three times", || {
        refused() >= 3
    })
    .await;
    assert_eq!(second.links(), 0);
    alive(&mut old).await;
    assert_eq!((first.links(), first.streams()), (1, 1));

    // The first stops: the second takes the id, and new streams reach it.
    drop(old);
    first.stop().await;
    second.registered().await;
    let mut new = stream(&link).await;
    init(&mut new, json!({})).await;
    alive(&mut new).await;
    assert_eq!(second.streams(), 1);
    second.stop().await;
    relay.stop().await;
}

/// The relay killed and restarted five times while a client runs `seq 1 3000000` through
/// it: the exec server re-registers, the client library resumes its session on new streams,
/// and the output is complete and in order (hash), nothing repeated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_restarts_lose_and_repeat_nothing() {
    const LINES: u64 = 3_000_000;
    const RESTARTS: usize = 5;
    let dir = tempfile::tempdir().unwrap();
    let client_keys = Keypair::generate().unwrap();
    let (mut relay, env, server, _auth) = relay_and_env(
        dir.path(),
        &[&client_keys],
        quick_redial(ServerConfig::default()),
    )
    .await;
    let (port, relay_keys) = (relay.port, relay.keys.clone());
    let envs = dir.path().join("environments");

    let mut expected = Sha256::new();
    let mut expected_len = 0u64;
    for i in 1..=LINES {
        let line = format!("{i}\n");
        expected_len += line.len() as u64;
        expected.update(line.as_bytes());
    }
    let expected = expected.finalize();

    let target = Target::Noise {
        url: relay.client_url("env"),
        config: Arc::new(NoiseClientConfig::new(client_keys, server.public)),
        pool: LinkPool::new(),
    };
    let opts = ClientOptions {
        reconnect_deadline: Some(Duration::from_secs(50)),
        ..ClientOptions::default()
    };
    let client = Client::connect(target, opts).await.unwrap();
    let mut p = client
        .start(StartOptions::new("seq", ["seq", "1", &LINES.to_string()]))
        .await
        .unwrap();
    let (progress_tx, mut progress) = tokio::sync::watch::channel(0u64);
    let reader = tokio::spawn(async move {
        let (mut hash, mut len, mut exit) = (Sha256::new(), 0u64, None);
        while let Some(ev) = p.next_event().await {
            match ev {
                ProcessEvent::Output { data, .. } => {
                    len += data.len() as u64;
                    hash.update(&data);
                    let _ = progress_tx.send(len);
                }
                ProcessEvent::Lost { from, to } => panic!("events {from}..={to} lost"),
                ProcessEvent::Omitted { .. } => panic!("no cap was asked for"),
                ProcessEvent::Exited(info) => {
                    exit = Some(info);
                    break;
                }
            }
        }
        (hash.finalize(), len, exit)
    });

    for i in 0..RESTARTS {
        let at = expected_len * (i as u64 + 1) / (RESTARTS as u64 + 2);
        tokio::time::timeout(GUARD, progress.wait_for(|n| *n >= at))
            .await
            .expect("no progress through the relay (hang guard)")
            .expect("the reader ended early");
        relay.stop().await;
        relay = InRelay::start_at(&envs, relay_keys.clone(), port, Default::default()).await;
        env.registered().await;
        // The client resumed through the new relay before the next restart: progress alone
        // can come from output received before this one (a fast link buffers plenty), and
        // two restarts within one outage would be one resume.
        let want = i as u64 + 2;
        eventually("the client resumed through the restarted relay", || {
            client.connection_count() >= want
        })
        .await;
    }
    let (hash, len, exit) = tokio::time::timeout(GUARD * 2, reader)
        .await
        .expect("the output did not complete (hang guard)")
        .unwrap();
    let exit = exit.expect("an exit notice");
    assert_eq!(exit.exit_code, Some(0));
    assert_eq!(len, expected_len, "every byte once");
    assert_eq!(hash, expected, "in order, nothing repeated");
    assert!(
        client.connection_count() > RESTARTS as u64,
        "resumed after each restart: {} connections",
        client.connection_count()
    );
    client.shutdown().await;
    env.stop().await;
    relay.stop().await;
}

/// 1,000 concurrent streams from 10 client links through one relay, each running a command
/// with its own output: every output exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_streams_from_ten_client_links() {
    const LINKS: usize = 10;
    const PER_LINK: usize = 100;
    let dir = tempfile::tempdir().unwrap();
    // Ten clients, one link each, all on one host (one address).
    let clients: Vec<Keypair> = (0..LINKS).map(|_| Keypair::generate().unwrap()).collect();
    let config = ServerConfig {
        max_sessions: LINKS * PER_LINK + 16,
        // Each client holds 100 sessions (one per stream): above the per-key quotas.
        max_sessions_per_key: PER_LINK,
        max_processes_per_key: PER_LINK,
        max_streams_per_key: PER_LINK,
        max_pending_authorizations: 256,
        ..ServerConfig::default()
    };
    // One address holds all 1,000 streams of the environment: above the relay's default
    // share of one address (512).
    let relay_settings = RelaySettings {
        max_streams_per_address_per_environment: LINKS * PER_LINK,
        ..RelaySettings::default()
    };
    let rules: Vec<(&Keypair, Verdict)> = clients.iter().map(|k| (k, Verdict::Allow)).collect();
    let (relay, env, server, _auth) =
        relay_and_env_at(dir.path(), &rules, config, relay_settings).await;
    let mut tasks = Vec::new();
    for (l, client) in clients.iter().enumerate() {
        let cfg = NoiseClientConfig::new(client.clone(), server.public);
        let link = ClientLink::connect(&relay.client_url("env"), cfg)
            .await
            .unwrap();
        for s in 0..PER_LINK {
            let link = link.clone();
            tasks.push(tokio::spawn(async move {
                let word = format!("out-{l}-{s}");
                // Each link opens at most MAX_OPENING_STREAMS at once: the last of 100 waits
                // for the others' handshakes.
                let t = tokio::time::timeout(GUARD, link.open_stream())
                    .await
                    .expect("open (hang guard)")
                    .expect("a stream through the relay");
                let mut t = TransportRpc { t, next_id: 0 };
                init(&mut t, json!({})).await;
                let start = json!({"processId": "p", "argv": ["echo", word.clone()]});
                t.call("process/start", start).await;
                let mut got = Vec::new();
                loop {
                    let m = t.recv().await;
                    match m["method"].as_str() {
                        Some("process/outputDelta") => got.extend(unb64(
                            m["params"]["chunk"]
                                .as_str()
                                .unwrap_or_else(|| panic!("{m}")),
                        )),
                        Some("process/exited") => break,
                        _ => {}
                    }
                }
                assert_eq!(text(&got), format!("{word}\n"));
            }));
        }
    }
    for t in tasks {
        tokio::time::timeout(GUARD * 2, t)
            .await
            .expect("a stream did not finish (hang guard)")
            .unwrap();
    }
    env.stop().await;
    relay.stop().await;
}

/// Hostile frames on one client link through the relay: a sender past its window, an
/// oversized authorization payload, early `DATA` and a second `OPEN` while an authorization is
/// pending, a flood of `OPEN`s. Each is handled as specified, and another client's
/// established stream carries on throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_senders_through_the_relay_leave_other_streams_alone() {
    let dir = tempfile::tempdir().unwrap();
    let good = Keypair::generate().unwrap();
    let bad = Keypair::generate().unwrap();
    // Its authorizations never answer: its OPENs stay pending.
    let flooder = Keypair::generate().unwrap();
    let rules = [
        (&good, Verdict::Allow),
        (&bad, Verdict::Allow),
        (&flooder, Verdict::Block),
    ];
    let (relay, env, server, auth) =
        relay_and_env_with(dir.path(), &rules, ServerConfig::default()).await;
    // The bystander: an established stream on a client link of its own.
    let cfg = NoiseClientConfig::new(good.clone(), server.public);
    let blink = ClientLink::connect(&relay.client_url("env"), cfg)
        .await
        .unwrap();
    let mut bystander = stream(&blink).await;
    init(&mut bystander, json!({})).await;

    // 1. A sender past its window: the relay resets that stream alone (window_exceeded).
    let mut raw = RawLink::connect_path(relay.port, "/v1/connect/env", "env").await;
    let mut st = raw.open(&bad, &server.public).await;
    let req = json!({"jsonrpc": "2.0", "method": "initialized", "params": {}});
    for _ in 0..=RAW_WINDOW + 1 {
        let (n, ct) = st
            .sealer
            .seal_message(req.to_string().as_bytes())
            .unwrap()
            .remove(0);
        raw.send_frame(&Frame::new(FrameType::Data, st.sid, n, Bytes::from(ct)))
            .await;
    }
    raw.expect_reset(&st.sid, "window_exceeded").await;
    alive(&mut bystander).await;

    // 2. An oversized authorization payload: refused by the exec server before authorization.
    let sid = random_sid();
    let big = json!({"version": 1, "ts": next_hello_ts(), "token": "x".repeat(5000)});
    let m1 = raw_msg1_env(
        &bad,
        &server.public,
        "env",
        &sid,
        big.to_string().as_bytes(),
    );
    raw.send_open(sid, m1).await;
    raw.expect_reset(&sid, "handshake_failed").await;
    alive(&mut bystander).await;

    // 3. While an authorization is pending (the flooder's never answer): early DATA resets
    // that stream alone; the relay catches it first, as a record past a window the exec
    // server has not granted yet (no ACCEPT, no window: `window_exceeded`, §7), and resets
    // the route on both of its links. A second OPEN of a pending id resets that stream alone
    // too (`duplicate_open`, by the relay, which holds the route). Neither reaches the exec
    // server's handshake budget as a failure: the environment link still takes new streams.
    let (sid, _) = raw.send_hello(&flooder, &server.public).await;
    eventually("the authorization is pending", || {
        auth.calls_for(&flooder) == 1
    })
    .await;
    raw.send_data(sid, 1, vec![0u8; 40]).await;
    raw.expect_reset(&sid, "window_exceeded").await;
    let (sid, m1) = raw.send_hello(&flooder, &server.public).await;
    eventually("the authorization is pending", || {
        auth.calls_for(&flooder) == 2
    })
    .await;
    raw.send_open(sid, m1).await;
    raw.expect_reset(&sid, "duplicate_open").await;
    alive(&mut bystander).await;
    let mut fresh = stream(&blink).await;
    init(&mut fresh, json!({})).await;
    let authorized = auth.calls_for(&flooder);

    // 4. A flood of OPENs whose authorizations never answer: the exec server holds at most
    // `max_pending_authorizations` of them and turns the rest away (busy), unprocessed; the
    // relay's per-link OPEN rate turns some away first. The link and the bystander carry on.
    let mut flood = Vec::new();
    for _ in 0..200 {
        let sid = random_sid();
        let (_hs, m1) =
            ClientHandshake::start(&flooder, &server.public, "env", &sid, None, next_hello_ts())
                .unwrap();
        raw.send_open(sid, m1).await;
        flood.push(sid);
    }
    // Whichever turned them away (the relay's rate or the server's cap), exactly the pending
    // cap's worth stays pending, the rest are refused `busy`, and none is accepted.
    let pending = ServerConfig::default().max_pending_authorizations;
    let mut busy = 0;
    while busy < 200 - pending {
        let f = raw.read_frame().await.expect("the link stays up");
        if !flood.contains(&f.stream) {
            continue;
        }
        match (f.ftype, f.reset_reason().as_str()) {
            (FrameType::Reset, "busy") => busy += 1,
            (t, r) => panic!("unexpected {t:?} {r:?} for a flooding OPEN"),
        }
    }
    eventually("the pending ones reach the authorizer", || {
        auth.calls_for(&flooder) == authorized + pending
    })
    .await;
    alive(&mut bystander).await;
    assert!(env.links() == 1, "the environment link is untouched");
    env.stop().await;
    relay.stop().await;
}

/// The environment link is never closed for idleness (a direct link without a stream is, after
/// `idle_link_timeout_ms`; `tests/idle.rs`): it is how clients reach the server at all. With a
/// link timeout of 100 ms and a redial delay of an hour, an environment link that had been
/// closed for idleness would leave the environment offline; after ten timeouts without a
/// stream, a client still opens one and is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_environment_link_is_never_closed_for_idleness() {
    let dir = tempfile::tempdir().unwrap();
    let client = Keypair::generate().unwrap();
    let hour = 3_600_000;
    let config = ServerConfig {
        idle_link_timeout_ms: 100,
        relay_backoff_initial_ms: hour,
        relay_backoff_max_ms: hour,
        ..ServerConfig::default()
    };
    let (relay, env, server, _auth) = relay_and_env(dir.path(), &[&client], config).await;
    // The time without a stream is what is under test (no event to wait for): ten timeouts.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(env.links(), 1, "the environment link is still up");
    let cfg = NoiseClientConfig::new(client.clone(), server.public);
    let link = ClientLink::connect(&relay.client_url("env"), cfg)
        .await
        .unwrap();
    let mut t = stream(&link).await;
    init(&mut t, json!({})).await;
    alive(&mut t).await;
    env.stop().await;
    relay.stop().await;
}

/// Through the relay the exec server does not know its clients' addresses: the per-address
/// quotas do not count them (every client would share the relay's), the per-key ones do.
/// With one session per address and two per key: two clients hold a session each, and a
/// third session of one key is refused naming the per-key quota.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_the_relay_quotas_count_keys_not_addresses() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (Keypair::generate().unwrap(), Keypair::generate().unwrap());
    let config = ServerConfig {
        max_sessions_per_address: 1,
        max_processes_per_address: 1,
        max_sessions_per_key: 2,
        ..ServerConfig::default()
    };
    let (relay, env, server, _auth) = relay_and_env(dir.path(), &[&a, &b], config).await;
    let mut held = Vec::new();
    for key in [&a, &b, &a] {
        let cfg = NoiseClientConfig::new(key.clone(), server.public);
        let link = ClientLink::connect(&relay.client_url("env"), cfg)
            .await
            .unwrap();
        let mut t = stream(&link).await;
        let r = init(&mut t, json!({})).await;
        assert!(r["sessionId"].is_string(), "{r}");
        held.push((link, t));
    }
    // A third session of `a`: over its key's quota of two.
    let cfg = NoiseClientConfig::new(a.clone(), server.public);
    let link = ClientLink::connect(&relay.client_url("env"), cfg)
        .await
        .unwrap();
    let mut t = stream(&link).await;
    t.send(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"clientName": "relay-test", "capabilities": {}}}))
        .await;
    let r = t.recv().await;
    assert_eq!(r["id"], 1, "{r}");
    assert_eq!(r["error"]["code"], -32004, "{r}");
    assert_eq!(r["error"]["data"]["limit"], "maxSessionsPerKey", "{r}");
    env.stop().await;
    relay.stop().await;
}

/// §8 on the environment link: its last-resort budget (`relay_link_handshake_failure_burst`,
/// here 2 instead of 1024, so that one client can reach it), once empty, refuses new `OPEN`s
/// (`busy`) for a cool-down without closing the link (it carries every client's streams) or
/// touching an established stream. (The cool-down's end is tested on the engine, on paused
/// time: `protocol/tests/endpoint_pair.rs`; that one client never reaches the default budget,
/// in `tests/relay_attack.rs`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_handshake_bucket_refuses_new_streams_and_keeps_the_environment_link() {
    let dir = tempfile::tempdir().unwrap();
    let good = Keypair::generate().unwrap();
    let config = ServerConfig {
        relay_link_handshake_failure_burst: 2,
        // No refill within the test.
        relay_link_handshake_failure_refill_ms: 3_600_000,
        ..ServerConfig::default()
    };
    let (relay, env, server, _auth) = relay_and_env(dir.path(), &[&good], config).await;
    let cfg = NoiseClientConfig::new(good.clone(), server.public);
    let blink = ClientLink::connect(&relay.client_url("env"), cfg)
        .await
        .unwrap();
    let mut bystander = stream(&blink).await;
    init(&mut bystander, json!({})).await;

    // Two OPENs whose message 1 is garbage: two failures, the bucket is empty.
    let mut raw = RawLink::connect_path(relay.port, "/v1/connect/env", "env").await;
    for _ in 0..2 {
        let sid = random_sid();
        raw.send_open(sid, vec![7u8; 96]).await;
        raw.expect_reset(&sid, "handshake_failed").await;
    }
    // A valid OPEN, from an authorized key, is now refused `busy`, unprocessed.
    let (sid, _) = raw.send_hello(&good, &server.public).await;
    raw.expect_reset(&sid, "busy").await;
    // The established stream carries on, and the environment link is the same one.
    alive(&mut bystander).await;
    assert_eq!(env.links(), 1, "the environment link is kept");
    env.stop().await;
    relay.stop().await;
}

/// Both Noise suites (`secure-transport.md` §3) through a real relay, on one client link:
/// the relay forwards the suite bits of each `OPEN` unchanged, so a suite 1 and a suite 0
/// stream both reach the exec server; an exec server restricted to suite 0 behind the relay
/// answers suite 1 `unsupported_suite`, which the client turns into suite 0 on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_suites_cross_the_relay_and_the_fallback_works_through_it() {
    use execrelay::noise::suite::{NoiseSuite, NoiseSuites, SuiteChoice};
    for restricted in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let client = Keypair::generate().unwrap();
        let config = if restricted {
            ServerConfig {
                noise_suites: NoiseSuites::of(&[NoiseSuite::ChaChaPoly]),
                ..ServerConfig::default()
            }
        } else {
            ServerConfig::default()
        };
        let (relay, _env, server, _auth) = relay_and_env(dir.path(), &[&client], config).await;
        let cfg = NoiseClientConfig::new(client.clone(), server.public);
        let link = ClientLink::connect(&relay.client_url("env"), cfg)
            .await
            .unwrap();
        let open = |choice| {
            let link = link.clone();
            async move {
                tokio::time::timeout(PROMPT, link.open_stream_with(choice))
                    .await
                    .expect("open (hang guard)")
            }
        };
        if restricted {
            let err = open(SuiteChoice::Pinned(NoiseSuite::AesGcm))
                .await
                .err()
                .expect("suite 1 refused behind the relay");
            assert!(err.to_string().contains("unsupported_suite"), "{err}");
            let t = open(SuiteChoice::Prefer(NoiseSuite::AesGcm))
                .await
                .expect("fell back to suite 0");
            let mut t = TransportRpc { t, next_id: 0 };
            init(&mut t, json!({})).await;
            alive(&mut t).await;
            assert_eq!(
                link.suite_for(SuiteChoice::Prefer(NoiseSuite::AesGcm)),
                NoiseSuite::ChaChaPoly
            );
        } else {
            for suite in [NoiseSuite::AesGcm, NoiseSuite::ChaChaPoly] {
                let t = open(SuiteChoice::Pinned(suite)).await.expect("a stream");
                let mut t = TransportRpc { t, next_id: 0 };
                init(&mut t, json!({})).await;
                alive(&mut t).await;
            }
        }
    }
}

/// A client tuned to a window larger than the relay passes on (`--noise-window 256` against
/// a relay at its default 64, and against one at the smallest it accepts, 8): its output is
/// held to the relay's window, arrives whole, and nothing is reset (before, the relay
/// forwarded the larger window and reset the server for using it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_window_above_the_relays_is_clipped_not_reset() {
    use execrelay::link::client::MAX_CLIENT_WINDOW_RECORDS;
    const BYTES: u64 = 6 << 20;
    for relay_window in [64, execrelay_protocol::config::ACK_EVERY_RECORDS] {
        let dir = tempfile::tempdir().unwrap();
        let client = Keypair::generate().unwrap();
        let settings = RelaySettings {
            max_window_records: relay_window,
            ..RelaySettings::default()
        };
        let rules = [(&client, Verdict::Allow)];
        let (relay, _env, server, _auth) =
            relay_and_env_at(dir.path(), &rules, ServerConfig::default(), settings).await;
        let mut cfg = NoiseClientConfig::new(client.clone(), server.public);
        cfg.window = MAX_CLIENT_WINDOW_RECORDS;
        let target = Target::Noise {
            url: relay.client_url("env"),
            config: Arc::new(cfg),
            pool: LinkPool::new(),
        };
        let c = Client::connect(target, ClientOptions::default())
            .await
            .unwrap();
        let mut p = c
            .start(StartOptions::new(
                "zeros",
                ["head", "-c", &BYTES.to_string(), "/dev/zero"],
            ))
            .await
            .unwrap();
        let (mut len, mut exit) = (0u64, None);
        let read = async {
            while let Some(ev) = p.next_event().await {
                match ev {
                    ProcessEvent::Output { data, .. } => {
                        assert!(data.iter().all(|b| *b == 0), "exact bytes");
                        len += data.len() as u64;
                    }
                    ProcessEvent::Exited(info) => {
                        exit = Some(info);
                        break;
                    }
                    other => panic!("unexpected {other:?}"),
                }
            }
        };
        tokio::time::timeout(PROMPT, read)
            .await
            .expect("the output arrives (hang guard)");
        assert_eq!(len, BYTES, "relay window {relay_window}: every byte");
        assert_eq!(exit.expect("an exit notice").exit_code, Some(0));
        assert_eq!(
            relay
                .metrics
                .value("execrelay_relay_resets_total{reason=\"window_exceeded\"}"),
            0,
            "relay window {relay_window}: nothing reset"
        );
    }
}
