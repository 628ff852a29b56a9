//! The relay server under attack, in-process on real sockets: a hostile client from one
//! loopback address (127.0.0.2), an honest bystander from another (127.0.0.1) whose stream
//! must carry on. Each test reproduces a finding of the red team that failed before its fix:
//! client links that hold nothing or trickle one message are reaped, links that flood `OPEN`s
//! and read nothing are closed at their share (their refusals counted), and an environment's
//! message 1 captured before a relay restart cannot be replayed after it.
//!
//! Waits are on frames, closes and metric values; wall-clock timeouts are hang guards only
//! (the attack's own pacing excepted: a trickler sends a byte every 100 ms on purpose).

mod harness;

use std::net::Ipv4Addr;
use std::time::Duration;

use execrelay_io::driver::send_frame;
use execrelay_protocol::config::EndpointConfig;
use execrelay_protocol::env_handshake::EnvironmentHandshake;
use execrelay_protocol::frame::FrameType;
use execrelay_protocol::keys::Keypair;
use execrelay_relay::server::settings::RelaySettings;
use harness::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const ENV: &str = "sandbox-1";
const HOSTILE: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

/// A relay with `ENV` listed and up (echoing), and an honest client's stream through it.
struct Scene {
    relay: Relay,
    client: execrelay_io::driver::EndpointLink,
    stream: execrelay_io::driver::StreamHandle,
}

impl Scene {
    async fn start(settings: RelaySettings) -> Scene {
        let env_keys = Keypair::generate().unwrap();
        let relay = Relay::start(settings, &[(ENV, &env_keys)]).await;
        let (_env, incoming) = environment(&relay, &env_keys, ENV, EndpointConfig::default()).await;
        echo_environment(incoming);
        let client = client(&relay, ENV).await;
        let mut stream = open(&client).await;
        round_trip(&mut stream, "before").await;
        Scene {
            relay,
            client,
            stream,
        }
    }

    async fn still_fine(&mut self, what: &str) {
        round_trip(&mut self.stream, what).await;
        assert_eq!(self.client.close_reason(), None, "{what}");
    }
}

/// Finding 4: 64 of 64 client links with no stream were alive after 75 s (their pongs kept
/// them up), so 64 addresses could hold every client-link slot and everyone else got `503`.
/// With `idle_link_timeout_ms` (300 ms here, 60 s by default) each is closed `idle`, while the
/// honest link, which holds a stream, is kept.
#[tokio::test]
async fn client_links_that_hold_no_stream_are_reaped_and_one_with_a_stream_is_kept() {
    let mut scene = Scene::start(RelaySettings {
        idle_link_timeout_ms: 300,
        ..settings()
    })
    .await;
    let mut idle = Vec::new();
    for _ in 0..10 {
        idle.push(ws_from(HOSTILE, &scene.relay, &format!("/v1/connect/{ENV}")).await);
    }
    for ws in &mut idle {
        wait_closed(ws).await;
    }
    scene
        .relay
        .wait_metric("execrelay_relay_link_closes_total{reason=\"idle\"}", 10)
        .await;
    scene.still_fine("after the idle links went").await;
    assert_eq!(
        scene
            .relay
            .metric("execrelay_relay_link_closes_total{reason=\"idle\"}")
            .await,
        10,
        "the honest link was not reaped"
    );
    scene.relay.stop().await;
}

/// Finding 4, trickling: 60 links trickling one byte every 3 s into an unfinished message
/// were alive after 30 s. A client link whose WebSocket message takes longer than
/// `message_timeout_ms` (300 ms here, 10 s by default) to arrive from its first byte is closed
/// (`message_timeout`), without waiting for the keepalive.
#[tokio::test]
async fn a_client_link_trickling_one_message_is_closed_at_the_message_timeout() {
    let mut scene = Scene::start(RelaySettings {
        message_timeout_ms: 300,
        ..settings()
    })
    .await;
    let mut ws = ws_from(HOSTILE, &scene.relay, &format!("/v1/connect/{ENV}")).await;
    // Below tungstenite: a masked binary frame header for 100 bytes, then a byte at a time.
    let tcp = ws.get_mut();
    tcp.write_all(&[0x82, 0x80 | 100, 0, 0, 0, 0])
        .await
        .unwrap();
    let started = tokio::time::Instant::now();
    let mut sent = 0;
    let closed = guard("the trickler is closed", async {
        let mut buf = [0u8; 256];
        loop {
            tokio::select! {
                r = tcp.read(&mut buf) => match r {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {} // the close frame
                },
                () = tokio::time::sleep(Duration::from_millis(100)) => {
                    if tcp.write_all(&[0]).await.is_err() {
                        return;
                    }
                    sent += 1;
                }
            }
        }
    });
    closed.await;
    assert!(
        started.elapsed() >= Duration::from_millis(300) && sent < 100,
        "closed after {:?}, {sent} bytes",
        started.elapsed()
    );
    scene
        .relay
        .wait_metric(
            "execrelay_relay_link_closes_total{reason=\"message_timeout\"}",
            1,
        )
        .await;
    scene.still_fine("after the trickler").await;
    scene.relay.stop().await;
}

/// A link from `HOSTILE` with a small receive buffer (so that the kernel holds few of the
/// relay's refusals for it): what a client that reads nothing looks like to the relay.
async fn non_reading_link(relay: &Relay, path: &str) -> Ws {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    socket
        .bind(std::net::SocketAddr::from((HOSTILE, 0)))
        .unwrap();
    let tcp = guard("connect", socket.connect(relay.addr)).await.unwrap();
    let (ws, _) = guard(
        "upgrade",
        tokio_tungstenite::client_async_with_config(
            format!("ws://{}{path}", relay.addr),
            execrelay_io::driver::ReadAhead::websocket_client(tcp),
            Some(execrelay_io::driver::link_websocket_config()),
        ),
    )
    .await
    .unwrap();
    ws
}

/// Finding 2: a client link with no key sends `OPEN`s to an id that is not online and never
/// reads: about 78,000 refusals parked in the relay per link (2.9 to 3.8 MiB of its memory
/// each; 320 links took it to 601 MB). Every frame queued for a client link now counts
/// against its share (`client_link_share_bytes`, at its memory cost) and the total: each
/// hostile link is closed (`control_queue_full`) once its unread refusals reach its share
/// (a few thousand `OPEN`s, where they used to pile up without end), its queue freed, and the
/// honest stream carries on. (The bound at every step is checked on the routing core:
/// `relay_budgets.rs`.)
#[tokio::test]
async fn links_that_flood_opens_and_read_nothing_are_closed_at_their_share() {
    let share = 64 << 10;
    let mut scene = Scene::start(RelaySettings {
        client_link_share_bytes: share,
        ..settings()
    })
    .await;
    const LINKS: usize = 4;
    let mut links = Vec::new();
    for _ in 0..LINKS {
        links.push(non_reading_link(&scene.relay, "/v1/connect/offline-env").await);
    }
    let mut n = 0u64;
    guard("every hostile link is closed", async {
        loop {
            let closed = scene
                .relay
                .metric("execrelay_relay_link_closes_total{reason=\"control_queue_full\"}")
                .await;
            if closed >= LINKS as u64 {
                break;
            }
            for ws in &mut links {
                for _ in 0..500 {
                    n += 1;
                    let mut id = [0x77u8; 16];
                    id[..8].copy_from_slice(&n.to_be_bytes());
                    // A closed link stops taking frames: its sends fail, that is all.
                    if send_frame(ws, &open_frame(id, 16), GUARD).await.is_err() {
                        break;
                    }
                }
            }
        }
    })
    .await;
    let m = scene.relay.metrics().await;
    let refused = metric_of(
        &m,
        "execrelay_relay_resets_total{reason=\"environment_offline\"}",
    ) + metric_of(&m, "execrelay_relay_resets_total{reason=\"busy\"}");
    assert!(refused > 0 && n < 1_000_000, "{n} OPENs, {refused} refused");
    // Nothing of theirs is left queued: only the honest link's (nothing, it reads).
    scene.still_fine("after the flood").await;
    assert_eq!(
        scene
            .relay
            .metric("execrelay_relay_links{kind=\"client\"}")
            .await,
        1
    );
    scene.relay.stop().await;
}

/// Finding 7: the relay remembered environment stamps in memory only, so a message 1
/// captured before a relay restart was accepted again after it, and routed that id's clients
/// to the replayer until the real server came back. A restarted relay now refuses anything
/// stamped before it started (`replayed_handshake`); the real server's fresh handshake is
/// admitted.
#[tokio::test]
async fn an_environment_message_1_captured_before_a_relay_restart_is_refused_after_it() {
    let env_keys = Keypair::generate().unwrap();
    let relay_keys = Keypair::generate().unwrap();
    let relay = Relay::start_with(settings(), &[(ENV, &env_keys)], relay_keys.clone()).await;
    // The environment's message 1 on the wire, captured by an attacker.
    let (_, captured) =
        EnvironmentHandshake::start(&env_keys, &relay_keys.public, ENV, next_ts()).unwrap();
    let mut ws = relay.ws(&format!("/v1/env/{ENV}")).await;
    send_raw(&mut ws, &captured).await;
    let answer = recv_until(&mut ws, |_| true).await.unwrap();
    assert_eq!(answer.ftype, FrameType::Accept);
    drop(ws);
    relay.stop().await;

    let restarted = Relay::start_with(settings(), &[(ENV, &env_keys)], relay_keys.clone()).await;
    let mut replayer = restarted.ws(&format!("/v1/env/{ENV}")).await;
    send_raw(&mut replayer, &captured).await;
    let answer = recv_until(&mut replayer, |_| true).await.unwrap();
    assert_eq!(
        (answer.ftype, answer.reset_reason().as_str()),
        (FrameType::Reset, "replayed_handshake")
    );
    let mut real = restarted.ws(&format!("/v1/env/{ENV}")).await;
    let admitted = env_handshake(&mut real, &env_keys, &relay_keys.public, ENV, next_ts()).await;
    assert_eq!(admitted, Ok(()));
    assert_eq!(
        restarted
            .metric("execrelay_relay_environment_handshakes_total{result=\"replayed_handshake\"}")
            .await,
        1
    );
    restarted.stop().await;
}
