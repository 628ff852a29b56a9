//! The relay's links on several single-threaded runtimes (`LinkRuntimes`, the binary's
//! `--runtime-threads`): a client link and its environment's link on different runtimes carry
//! a stream both ways with every byte in order, the placement shows in `/metrics`, a client
//! link moves to its environment's runtime when that one is up (over `ws://` and over the
//! relay's own TLS, `wss://`), and shutdown ends every link on every runtime before the
//! runtimes stop.
//!
//! Waits are on records, closes and metric values; wall-clock timeouts are hang guards only.

mod harness;

use bytes::Bytes;
use execrelay_io::driver::{EndpointLink, StreamError, StreamHandle};
use execrelay_io::runtimes::{LinkRuntimes, RuntimeFigures};
use execrelay_protocol::config::EndpointConfig;
use execrelay_protocol::keys::Keypair;
use harness::*;

/// Records each way on the stream of the routing test.
const RECORDS: usize = 300;

fn placed(figures: &[RuntimeFigures]) -> Vec<u64> {
    figures.iter().map(|f| f.connections_placed).collect()
}

/// The runtime whose placed count grew from `before` to `after` (exactly one did).
fn placed_on(before: &[u64], after: &[u64]) -> usize {
    let grew: Vec<usize> = (0..after.len()).filter(|&i| after[i] > before[i]).collect();
    assert_eq!(
        grew.len(),
        1,
        "one connection, one runtime: {before:?} → {after:?}"
    );
    grew[0]
}

/// Record `i` of a direction: its index and a length that varies (1 byte to 40 KiB), so
/// records of many sizes cross and a reordering or a cut would show.
fn record(direction: u8, i: usize) -> Bytes {
    let len = 8 + (i * 7919) % (40 << 10);
    let mut v = vec![direction; len];
    v[..8].copy_from_slice(&(i as u64).to_be_bytes());
    Bytes::from(v)
}

/// Send `RECORDS` records of `direction` on `stream` while receiving the other side's, and
/// check each arrived whole and in order.
async fn exchange(stream: StreamHandle, sends: u8, receives: u8) {
    let (mut rx, mut tx) = stream.split();
    let sender = tokio::spawn(async move {
        for i in 0..RECORDS {
            tx.send(record(sends, i)).await.expect("send");
        }
        tx
    });
    for i in 0..RECORDS {
        let (_, got) = guard("record", rx.recv()).await.expect("record");
        assert_eq!(got, record(receives, i), "record {i} from {receives:#x}");
    }
    guard("sender", sender).await.unwrap();
}

/// Wait until `cond` holds of the runtimes' figures (hang guard: [`GUARD`]).
async fn wait_figures(
    runtimes: &LinkRuntimes,
    what: &str,
    cond: impl Fn(&[RuntimeFigures]) -> bool,
) {
    let deadline = tokio::time::Instant::now() + GUARD;
    loop {
        let figures = runtimes.figures();
        if cond(&figures) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: {figures:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// The one client link connected since `before` was accepted on a less busy runtime (the
/// least busy is never the environment's, which runs its link) and then placed on the
/// environment's, `env_on`: two placements, the second there; and every link task runs there,
/// none elsewhere.
async fn assert_moved_home(runtimes: &LinkRuntimes, before: &[u64], env_on: usize) {
    let after = placed(&runtimes.figures());
    assert_eq!(after[env_on], before[env_on] + 1, "{before:?} → {after:?}");
    assert_eq!(after.iter().sum::<u64>(), before.iter().sum::<u64>() + 2);
    wait_figures(
        runtimes,
        "every link task on the environment's runtime",
        |f| {
            f.iter().enumerate().all(|(i, r)| {
                (i == env_on) == (r.alive_tasks >= 4) && (i == env_on || r.alive_tasks == 0)
            })
        },
    )
    .await;
}

/// A client link that connected while its environment was offline stays where it was placed;
/// the environment's link, placed on the least busy runtime, lands on another: a stream between
/// them crosses runtimes both ways.
#[tokio::test]
async fn links_on_different_runtimes_route_a_stream_both_ways_in_order() {
    let runtimes = LinkRuntimes::start(3, "test-link").unwrap();
    let env_keys = Keypair::generate().unwrap();
    let relay = Relay::start_on(settings(), &[("rt-env", &env_keys)], runtimes.clone()).await;

    let before = placed(&runtimes.figures());
    let client = client(&relay, "rt-env").await;
    let client_on = placed_on(&before, &placed(&runtimes.figures()));
    wait_figures(&runtimes, "the client link's tasks", |f| {
        f[client_on].alive_tasks > 0
    })
    .await;

    let before = placed(&runtimes.figures());
    let (env, mut incoming) =
        environment(&relay, &env_keys, "rt-env", EndpointConfig::default()).await;
    let env_on = placed_on(&before, &placed(&runtimes.figures()));
    assert_ne!(env_on, client_on, "the two links landed on one runtime");

    // The placement is in /metrics.
    let text = relay.metrics().await;
    for on in [env_on, client_on] {
        let series = format!("execrelay_relay_runtime_connections_total{{runtime=\"{on}\"}}");
        assert!(metric_of(&text, &series) >= 1, "{series} in\n{text}");
        let series = format!("execrelay_relay_runtime_tasks{{runtime=\"{on}\"}}");
        assert!(metric_of(&text, &series) >= 1, "{series} in\n{text}");
    }

    // One stream, both directions at once, every record whole and in order.
    let accepting = tokio::spawn(async move {
        let req = guard("OPEN at the environment", incoming.next())
            .await
            .expect("an OPEN");
        assert_eq!(&req.payload()[..], b"msg1");
        (req.accept(Bytes::from_static(b"msg2")).unwrap(), incoming)
    });
    let opened = guard(
        "open",
        client
            .open(stream_id(), Bytes::from_static(b"msg1"))
            .unwrap(),
    )
    .await
    .expect("accepted");
    let (env_stream, _incoming) = guard("accepted", accepting).await.unwrap();
    assert_eq!(&opened.payload[..], b"msg2");
    let at_env = tokio::spawn(exchange(env_stream, 0xe0, 0xc0));
    exchange(opened.stream, 0xc0, 0xe0).await;
    guard("environment side", at_env).await.unwrap();

    assert_eq!(client.close_reason(), None);
    assert_eq!(env.close_reason(), None);
    relay.stop().await;
    runtimes.shutdown();
}

/// A client link whose environment is up moves to the environment link's runtime after its
/// upgrade (wherever it was accepted), so the route's wake-ups stay on one thread.
#[tokio::test]
async fn a_client_link_moves_to_its_environments_runtime() {
    let runtimes = LinkRuntimes::start(3, "test-home").unwrap();
    let env_keys = Keypair::generate().unwrap();
    let relay = Relay::start_on(settings(), &[("home-env", &env_keys)], runtimes.clone()).await;
    let before = placed(&runtimes.figures());
    let (env, incoming) =
        environment(&relay, &env_keys, "home-env", EndpointConfig::default()).await;
    echo_environment(incoming);
    let env_on = placed_on(&before, &placed(&runtimes.figures()));

    let before = placed(&runtimes.figures());
    let c = client(&relay, "home-env").await;
    let mut s = open(&c).await;
    round_trip(&mut s, "at home").await;
    assert_moved_home(&runtimes, &before, env_on).await;
    round_trip(&mut s, "still").await;
    assert_eq!(env.close_reason(), None);
    relay.stop().await;
    runtimes.shutdown();
}

/// A `wss://` connection to the TLS relay at `addr`, trusting `cert` (DER) for `localhost`.
async fn tls_ws(
    addr: std::net::SocketAddr,
    cert: &rustls::pki_types::CertificateDer<'static>,
    path: &str,
) -> tokio_tungstenite::WebSocketStream<
    execrelay_io::driver::ReadAhead<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>,
> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.clone()).unwrap();
    // The provider named: the workspace's feature set may hold two.
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let tcp = guard("connect", tokio::net::TcpStream::connect(addr))
        .await
        .unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let tls = guard("TLS handshake", connector.connect(name, tcp))
        .await
        .unwrap();
    let (ws, _) = guard(
        "upgrade",
        tokio_tungstenite::client_async_with_config(
            format!("wss://localhost:{}{path}", addr.port()),
            execrelay_io::driver::ReadAhead::websocket_client(tls),
            Some(execrelay_io::driver::link_websocket_config()),
        ),
    )
    .await
    .unwrap();
    ws
}

/// A relay on its own TLS (`wss://`, a certificate for `localhost` made here) with its links
/// on `runtimes`, environment `id` allowed with `keys`: the relay, and the certificate a client
/// trusts.
async fn tls_relay(
    runtimes: &LinkRuntimes,
    id: &str,
    keys: &Keypair,
) -> (Relay, rustls::pki_types::CertificateDer<'static>) {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let relay_dir = tempfile::tempdir().unwrap();
    let files = execrelay_io::tls::CertificateFiles {
        cert: relay_dir.path().join("cert.pem"),
        key: relay_dir.path().join("key.pem"),
    };
    std::fs::write(&files.cert, cert.pem()).unwrap();
    std::fs::write(&files.key, key.serialize_pem()).unwrap();
    std::fs::set_permissions(
        &files.key,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    // Loaded now: the files may go with their directory.
    let tls = execrelay_io::tls::TlsListener::new(files).unwrap();
    let relay = Relay::start_tls_on(settings(), &[(id, keys)], runtimes.clone(), tls).await;
    (relay, cert.der().clone())
}

/// Environment `id` up on the TLS relay, echoing: its link and the runtime it landed on.
async fn tls_environment(
    relay: &Relay,
    runtimes: &LinkRuntimes,
    cert: &rustls::pki_types::CertificateDer<'static>,
    id: &str,
    keys: &Keypair,
) -> (EndpointLink, usize) {
    let before = placed(&runtimes.figures());
    let mut ws = tls_ws(relay.addr, cert, &format!("/v1/env/{id}")).await;
    env_handshake(&mut ws, keys, &relay.keys.public, id, next_ts())
        .await
        .expect("environment admitted");
    let (env, incoming) = EndpointLink::spawn_server(ws, EndpointConfig::default()).unwrap();
    echo_environment(incoming);
    (env, placed_on(&before, &placed(&runtimes.figures())))
}

/// Over the relay's own TLS too: the client link's TLS session moves with its socket to the
/// environment link's runtime (accepted, handshaken and upgraded elsewhere), and carries
/// records both ways after the move.
#[tokio::test]
async fn a_tls_client_link_moves_to_its_environments_runtime() {
    let runtimes = LinkRuntimes::start(3, "test-tls-home").unwrap();
    let env_keys = Keypair::generate().unwrap();
    let (relay, cert) = tls_relay(&runtimes, "tls-env", &env_keys).await;
    let (env, env_on) = tls_environment(&relay, &runtimes, &cert, "tls-env", &env_keys).await;

    let before = placed(&runtimes.figures());
    let ws = tls_ws(relay.addr, &cert, "/v1/connect/tls-env").await;
    let c = EndpointLink::spawn_client(ws, EndpointConfig::default()).unwrap();
    let mut s = open(&c).await;
    round_trip(&mut s, "over TLS").await;
    assert_moved_home(&runtimes, &before, env_on).await;
    // Many records of many sizes after the move, echoed whole and in order: the session's
    // state went with its socket.
    exchange(s, 0xc0, 0xc0).await;
    assert_eq!(env.close_reason(), None);
    assert_eq!(c.close_reason(), None);
    relay.stop().await;
    runtimes.shutdown();
}

/// A hostile client's version of the above: TLS clients that upgrade and vanish at once, while
/// they are being moved, or right after a malformed frame. Each one's link ends and nothing of it
/// stays on any runtime; the environment's link and a well-behaved client are untouched.
#[tokio::test]
async fn tls_clients_that_vanish_while_moving_leave_nothing_behind() {
    use futures_util::SinkExt;
    let runtimes = LinkRuntimes::start(3, "test-tls-vanish").unwrap();
    let env_keys = Keypair::generate().unwrap();
    let (relay, cert) = tls_relay(&runtimes, "vanish-env", &env_keys).await;
    let (env, env_on) = tls_environment(&relay, &runtimes, &cert, "vanish-env", &env_keys).await;
    // The environment's link alone: its tasks up (a link runs two) and nothing elsewhere. The
    // task that accepted it may still be ending: the count after the attack may be lower.
    wait_figures(&runtimes, "the environment's link alone", |f| {
        f.iter().enumerate().all(|(i, r)| {
            if i == env_on {
                r.alive_tasks >= 2
            } else {
                r.alive_tasks == 0
            }
        })
    })
    .await;
    let env_tasks = runtimes.figures()[env_on].alive_tasks;
    let before: u64 = placed(&runtimes.figures()).iter().sum();

    for i in 0..20 {
        let mut ws = tls_ws(relay.addr, &cert, "/v1/connect/vanish-env").await;
        if i % 2 == 1 {
            // Half a frame's worth of garbage, then gone.
            let _ = ws
                .send(tokio_tungstenite::tungstenite::Message::binary(vec![
                    0x5a;
                    7
                ]))
                .await;
        }
        drop(ws);
    }
    // Each went through the move: placed where accepted, then on the environment's runtime.
    wait_figures(&runtimes, "every vanished client accepted and moved", |f| {
        f.iter().map(|r| r.connections_placed).sum::<u64>() == before + 40
    })
    .await;
    wait_figures(&runtimes, "every vanished client's link ended", |f| {
        f.iter().enumerate().all(|(i, r)| {
            if i == env_on {
                r.alive_tasks <= env_tasks
            } else {
                r.alive_tasks == 0
            }
        })
    })
    .await;

    let ws = tls_ws(relay.addr, &cert, "/v1/connect/vanish-env").await;
    let c = EndpointLink::spawn_client(ws, EndpointConfig::default()).unwrap();
    let mut s = open(&c).await;
    round_trip(&mut s, "after the vanished ones").await;
    assert_eq!(env.close_reason(), None);
    relay.stop().await;
    runtimes.shutdown();
}

/// Two environments (each with two client links at home) and a client of an offline
/// environment, over three runtimes: links on every runtime. Shutdown closes every one of
/// them, and their tasks end before the runtimes stop.
#[tokio::test]
async fn shutdown_with_several_runtimes_ends_every_link_on_every_runtime() {
    let runtimes = LinkRuntimes::start(3, "test-stop").unwrap();
    let keys = [
        Keypair::generate().unwrap(),
        Keypair::generate().unwrap(),
        Keypair::generate().unwrap(),
    ];
    let relay = Relay::start_on(
        settings(),
        &[
            ("stop-a", &keys[0]),
            ("stop-b", &keys[1]),
            ("stop-c", &keys[2]),
        ],
        runtimes.clone(),
    )
    .await;
    let mut envs = Vec::new();
    for (id, k) in [("stop-a", &keys[0]), ("stop-b", &keys[1])] {
        let (env, incoming) = environment(&relay, k, id, EndpointConfig::default()).await;
        echo_environment(incoming);
        envs.push(env);
    }
    // Offline environment: its client stays on the runtime left idle.
    let offline = client(&relay, "stop-c").await;
    let mut clients = Vec::new();
    let mut streams = Vec::new();
    for id in ["stop-a", "stop-b", "stop-a", "stop-b"] {
        let c = client(&relay, id).await;
        let mut s = open(&c).await;
        round_trip(&mut s, id).await;
        clients.push(c);
        streams.push(s);
    }
    clients.push(offline);
    wait_figures(&runtimes, "links on every runtime", |f| {
        f.iter().all(|r| r.alive_tasks >= 2)
    })
    .await;

    relay.stop().await;
    for (i, link) in envs.iter().chain(clients.iter()).enumerate() {
        guard(&format!("link {i} closes"), link.closed()).await;
    }
    for s in &mut streams {
        assert!(matches!(
            guard("stream ends", s.receiver.recv()).await,
            Err(StreamError::LinkClosed(_) | StreamError::PeerReset(_))
        ));
    }
    // Every link's tasks have ended on their runtimes before those stop.
    wait_figures(
        &runtimes,
        "tasks left on the runtimes after shutdown",
        |f| f.iter().all(|r| r.alive_tasks == 0),
    )
    .await;
    runtimes.shutdown();
}
