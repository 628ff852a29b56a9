//! Relays in a cluster (`execrelay_relay::cluster`), in-process on real sockets, with a real
//! `nats-server` (Debian's package, installed by the test when missing) as the directory:
//! affinity without a lookup, a misrouted client forwarded over a relay-to-relay link, a
//! client posing as a relay refused, two holders (the newest wins), a holder that goes away
//! (its forwarded clients are closed `moved`), and NATS down (affine traffic works, misroutes
//! fail fast with `directory_unavailable`, and everything recovers when it is back).
//! HAProxy in front is `tests/cluster/run.sh`'s, with real exec servers and clients.
//!
//! Waits are on frames, closes and metric values; wall-clock timeouts are hang guards only.

mod harness;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use bytes::Bytes;
use execrelay_io::driver::{EndpointLink, StreamError};
use execrelay_protocol::config::EndpointConfig;
use execrelay_protocol::frame::{FrameType, LINK_STREAM};
use execrelay_protocol::keys::environments::{parse_environments, EnvironmentsFile};
use execrelay_protocol::keys::{public_line, Keypair};
use execrelay_relay::cluster::relay_link;
use execrelay_relay::cluster::{ClusterKeys, ClusterSpec};
use execrelay_relay::server::{RelayServer, RelayServerConfig};
use harness::*;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

const ENV: &str = "sandbox-1";

/// The `nats-server` binary: Debian's package, installed (as root, with apt-get) when missing.
fn nats_server_binary() -> PathBuf {
    for p in ["/usr/sbin/nats-server", "/usr/bin/nats-server"] {
        if std::path::Path::new(p).exists() {
            return p.into();
        }
    }
    let status = Command::new("sh")
        .args([
            "-c",
            "(apt-get install -y nats-server || (apt-get update && apt-get install -y nats-server)) >/dev/null 2>&1",
        ])
        .status();
    for p in ["/usr/sbin/nats-server", "/usr/bin/nats-server"] {
        if std::path::Path::new(p).exists() {
            return p.into();
        }
    }
    panic!(
        "these tests need nats-server (Debian package `nats-server`); installing it with apt-get failed ({status:?}): run `apt-get install -y nats-server` as root"
    );
}

/// A `nats-server` on loopback, stopped when dropped.
struct Nats {
    port: u16,
    child: Option<Child>,
}

impl Nats {
    async fn start() -> Nats {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let mut n = Nats { port, child: None };
        n.restart().await;
        n
    }

    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    async fn restart(&mut self) {
        let child = Command::new(nats_server_binary())
            .args(["-a", "127.0.0.1", "-p", &self.port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nats-server");
        self.child = Some(child);
        // Ready once it greets a client with INFO.
        let addr: SocketAddr = ([127, 0, 0, 1], self.port).into();
        guard("nats-server up", async {
            loop {
                if let Ok(mut s) = tokio::net::TcpStream::connect(addr).await {
                    let mut buf = [0u8; 4];
                    use tokio::io::AsyncReadExt;
                    if s.read_exact(&mut buf).await.is_ok() && &buf == b"INFO" {
                        return;
                    }
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        })
        .await;
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Relays of one cluster: their keys, by node id, in one keys file.
struct Members {
    _dir: tempfile::TempDir,
    keys_file: PathBuf,
    nodes: Vec<(String, Keypair)>,
}

impl Members {
    fn new(n: usize) -> Members {
        let dir = tempfile::tempdir().unwrap();
        let nodes: Vec<(String, Keypair)> = (0..n)
            .map(|i| (format!("relay-{i}"), Keypair::generate().unwrap()))
            .collect();
        let text: String = nodes
            .iter()
            .map(|(id, k)| format!("{id} {}\n", public_line(&k.public, id)))
            .collect();
        let keys_file = dir.path().join("cluster-keys");
        std::fs::write(&keys_file, text).unwrap();
        Members {
            _dir: dir,
            keys_file,
            nodes,
        }
    }

    fn keys(&self) -> ClusterKeys {
        let text = std::fs::read_to_string(&self.keys_file).unwrap();
        ClusterKeys::from_nodes(
            self.keys_file.clone(),
            parse_environments(&text, "cluster").unwrap(),
        )
    }
}

/// Relay `i` of `members` in the cluster on `nats`, listing `entries`.
async fn member(members: &Members, i: usize, nats: &Nats, entries: &[(&str, &Keypair)]) -> Relay {
    member_with(members, i, nats, entries, settings()).await
}

async fn member_with(
    members: &Members,
    i: usize,
    nats: &Nats,
    entries: &[(&str, &Keypair)],
    settings: execrelay_relay::server::settings::RelaySettings,
) -> Relay {
    let (node, keys) = &members.nodes[i];
    let dir = tempfile::tempdir().unwrap();
    let environments = dir.path().join("environments");
    std::fs::write(&environments, environments_text(entries)).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let metrics_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (addr, metrics) = (
        listener.local_addr().unwrap(),
        metrics_listener.local_addr().unwrap(),
    );
    let server = RelayServer::new(RelayServerConfig {
        keys: keys.clone(),
        environments: EnvironmentsFile::load(&environments).unwrap(),
        settings,
    })
    .unwrap()
    .with_cluster(ClusterSpec {
        nats_url: nats.url(),
        node_id: node.clone(),
        advertise: format!("ws://{addr}"),
        keys: members.keys(),
        node_keys: keys.clone(),
    });
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(server.run(listener, Some(metrics_listener), shutdown.clone()));
    let relay = Relay {
        addr,
        metrics,
        keys: keys.clone(),
        dir,
        environments,
        shutdown,
        task,
    };
    relay
        .wait_metric("execrelay_relay_cluster_directory_up", 1)
        .await;
    relay
}

/// An echoing environment on `relay`, announced in the directory.
async fn echo_env(relay: &Relay, keys: &Keypair, id: &str) -> EndpointLink {
    let (link, incoming) = environment(relay, keys, id, EndpointConfig::default()).await;
    echo_environment(incoming);
    relay
        .wait_metric("execrelay_relay_cluster_environments_held", 1)
        .await;
    link
}

/// Wait until `relay`'s directory subscription for its environments is in place: a lookup
/// from `other` finds it.
async fn until_found(other: &Relay, id: &str) -> EndpointLink {
    let deadline = tokio::time::Instant::now() + GUARD;
    loop {
        let c = client(other, id).await;
        let opened = c.open(stream_id(), Bytes::from_static(b"msg1")).unwrap();
        match guard("open", opened).await {
            Ok(accepted) => {
                assert_eq!(&accepted.payload[..], b"msg2");
                return c;
            }
            Err(e) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "hang guard: never found ({e})"
                );
                tokio::task::yield_now().await;
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        }
    }
}

#[tokio::test]
async fn affine_links_need_no_lookup_and_a_misroute_is_forwarded() {
    let nats = Nats::start().await;
    let members = Members::new(2);
    let env_keys = Keypair::generate().unwrap();
    let a = member(&members, 0, &nats, &[(ENV, &env_keys)]).await;
    let b = member(&members, 1, &nats, &[(ENV, &env_keys)]).await;
    let _env = echo_env(&a, &env_keys, ENV).await;

    // Affinity: the client on the holder; nothing asked, nothing forwarded.
    let c = client(&a, ENV).await;
    let mut s = open(&c).await;
    for i in 0..20 {
        round_trip(&mut s, &format!("affine {i}")).await;
    }
    let m = a.metrics().await;
    assert_eq!(metric_of(&m, "execrelay_relay_cluster_lookups_total"), 0);
    assert_eq!(
        metric_of(&m, "execrelay_relay_cluster_forwarded_streams_total"),
        0
    );
    assert_eq!(
        metric_of(&m, "execrelay_relay_cluster_environments_held"),
        1
    );

    // A misroute: the client on B; B looks A up and forwards over a relay-to-relay link.
    let fwd = until_found(&b, ENV).await;
    let mut streams = Vec::new();
    for _ in 0..8 {
        streams.push(open(&fwd).await);
    }
    for (i, s) in streams.iter_mut().enumerate() {
        for j in 0..10 {
            round_trip(s, &format!("forwarded {i}/{j}")).await;
        }
    }
    let mb = b.metrics().await;
    assert!(metric_of(&mb, "execrelay_relay_cluster_lookups_total") >= 1);
    assert!(metric_of(&mb, "execrelay_relay_cluster_forwarded_streams_total") >= 9);
    assert!(metric_of(&mb, "execrelay_relay_cluster_forwarded_bytes_total") > 0);
    assert_eq!(
        metric_of(&mb, "execrelay_relay_cluster_forwarding_links"),
        1
    );
    assert_eq!(
        metric_of(&mb, "execrelay_relay_cluster_environments_held"),
        0
    );
    let ma = a.metrics().await;
    assert_eq!(
        metric_of(&ma, "execrelay_relay_cluster_relay_links_admitted_total"),
        1
    );
    assert!(metric_of(&ma, "execrelay_relay_cluster_lookups_answered_total") >= 1);
    // A second misrouted client link of the environment shares the relay-to-relay link.
    let fwd2 = client(&b, ENV).await;
    let mut s2 = open(&fwd2).await;
    round_trip(&mut s2, "second client").await;
    assert_eq!(
        b.metric("execrelay_relay_cluster_forward_links_total")
            .await,
        metric_of(&mb, "execrelay_relay_cluster_forward_links_total")
    );
    // The affine stream never noticed.
    round_trip(&mut s, "affine after").await;

    // The holder goes: B's forwarded client links are closed `moved`, so their clients dial
    // again and find the environment wherever it is next.
    a.stop().await;
    guard("forwarded link closed", async {
        while fwd.close_reason().is_none() || fwd2.close_reason().is_none() {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await;
    b.wait_metric("execrelay_relay_link_closes_total{reason=\"moved\"}", 2)
        .await;
    b.stop().await;
}

#[tokio::test]
async fn a_client_without_a_cluster_key_cannot_pose_as_a_relay() {
    let nats = Nats::start().await;
    let members = Members::new(2);
    let env_keys = Keypair::generate().unwrap();
    let a = member(&members, 0, &nats, &[(ENV, &env_keys)]).await;
    let _env = echo_env(&a, &env_keys, ENV).await;

    // A stranger's key, pinning A's real key: the handshake decrypts but the key is listed
    // for no relay.
    let stranger = Keypair::generate().unwrap();
    // An environment's own key is no relay key either.
    for (who, keys) in [("stranger", &stranger), ("environment", &env_keys)] {
        let mut ws = a.ws(&format!("/v1/relay/{ENV}")).await;
        let (_, open) = relay_link::start(keys, &a.keys.public, ENV, next_ts()).unwrap();
        send_raw(&mut ws, &open).await;
        let answer = recv_until(&mut ws, |_| true).await.expect("an answer");
        assert_eq!(
            (answer.ftype, answer.stream, answer.reset_reason().as_str()),
            (FrameType::Reset, LINK_STREAM, "unauthorized"),
            "{who}"
        );
        wait_closed(&mut ws).await;
    }
    // An environment link's message 1 on the relay path does not decrypt.
    let mut ws = a.ws(&format!("/v1/relay/{ENV}")).await;
    let err = env_handshake(&mut ws, &env_keys, &a.keys.public, ENV, next_ts()).await;
    assert!(err.is_err());
    a.wait_metric("execrelay_relay_cluster_relay_links_refused_total", 3)
        .await;
    assert_eq!(
        a.metric("execrelay_relay_cluster_relay_links_admitted_total")
            .await,
        0
    );
    // A member's key is admitted (the same check the forwarder passes).
    let (_, b_keys) = &members.nodes[1];
    let mut ws = a.ws(&format!("/v1/relay/{ENV}")).await;
    let (hs, open) = relay_link::start(b_keys, &a.keys.public, ENV, next_ts()).unwrap();
    send_raw(&mut ws, &open).await;
    let answer = recv_until(&mut ws, |_| true).await.expect("an answer");
    assert!(hs.finish(&answer).is_ok());
    // A standalone relay has no such route.
    let alone = Relay::start(settings(), &[(ENV, &env_keys)]).await;
    assert_eq!(http_get(alone.addr, "/v1/relay/x").await.0, 404);
    alone.stop().await;
    a.stop().await;
}

#[tokio::test]
async fn two_holders_the_newest_link_wins() {
    let nats = Nats::start().await;
    let members = Members::new(2);
    let env_keys = Keypair::generate().unwrap();
    let a = member(&members, 0, &nats, &[(ENV, &env_keys)]).await;
    let b = member(&members, 1, &nats, &[(ENV, &env_keys)]).await;
    let old = echo_env(&a, &env_keys, ENV).await;
    a.wait_metric("execrelay_relay_cluster_environments_held", 1)
        .await;
    // The environment re-dials and lands on B while its old link on A is still up.
    let _new = echo_env(&b, &env_keys, ENV).await;
    guard("old link replaced", async {
        while old.close_reason().is_none() {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await;
    a.wait_metric("execrelay_relay_cluster_takeovers_total", 1)
        .await;
    a.wait_metric("execrelay_relay_link_closes_total{reason=\"replaced\"}", 1)
        .await;
    assert_eq!(b.metric("execrelay_relay_cluster_takeovers_total").await, 0);
    assert_eq!(
        b.metric("execrelay_relay_cluster_environments_held").await,
        1
    );
    // Clients on A now reach the environment on B.
    let c = until_found(&a, ENV).await;
    let mut s = open(&c).await;
    round_trip(&mut s, "to the newest").await;
    a.stop().await;
    b.stop().await;
}

/// Only the older holder acts on a claim, and NATS keeps nothing for a late subscriber: an
/// older holder whose subscription came up after the newer one's claim went by would keep its
/// link for good. Its own claim reaching the newer holder makes the newer one claim again, so
/// the older one hears it; a publisher replaying old claims gets at most
/// `MAX_CLAIM_REASSERTS` answers per holding.
#[tokio::test]
async fn a_late_older_holder_hears_the_newer_claim_again_and_replays_are_bounded() {
    use execrelay_relay::cluster::directory::{subject, DirectoryMessage};
    use execrelay_relay::cluster::MAX_CLAIM_REASSERTS;
    use futures_util::{FutureExt, StreamExt};
    let nats = Nats::start().await;
    let members = Members::new(2);
    let env_keys = Keypair::generate().unwrap();
    let b = member(&members, 1, &nats, &[(ENV, &env_keys)]).await;
    let _env = echo_env(&b, &env_keys, ENV).await;
    until_found(&b, ENV).await;
    // The older holder subscribes only now: B's first claim is long gone.
    let late = async_nats::connect(nats.url()).await.unwrap();
    let mut sub = late.subscribe(subject(ENV)).await.unwrap();
    let older = DirectoryMessage::Claim {
        node: "relay-0".into(),
        since_us: 1,
    };
    // More old claims than the cap; the first also proves our subscription is live (it
    // comes back to us before anything B sends in answer to it).
    for _ in 0..MAX_CLAIM_REASSERTS + 4 {
        late.publish(subject(ENV), older.encode().into())
            .await
            .unwrap();
    }
    // B handles its subject's messages one by one: once it has answered this lookup, it has
    // handled every claim above, and NATS delivers one publisher's messages in order.
    let answer = guard(
        "lookup",
        late.request(subject(ENV), DirectoryMessage::Lookup.encode().into()),
    )
    .await
    .unwrap();
    assert!(!answer.payload.is_empty());
    let mut ours = 0;
    let mut reasserted = 0;
    while let Some(Some(m)) = sub.next().now_or_never() {
        match DirectoryMessage::decode(&m.payload) {
            Ok(DirectoryMessage::Claim { node, .. }) if node == "relay-1" => reasserted += 1,
            Ok(DirectoryMessage::Claim { node, .. }) if node == "relay-0" => ours += 1,
            _ => {}
        }
    }
    assert_eq!(ours, MAX_CLAIM_REASSERTS + 4);
    assert_eq!(reasserted, MAX_CLAIM_REASSERTS);
    // B kept its link and took nothing over.
    assert_eq!(b.metric("execrelay_relay_cluster_takeovers_total").await, 0);
    assert_eq!(
        b.metric("execrelay_relay_cluster_environments_held").await,
        1
    );
    b.stop().await;
}

#[tokio::test]
async fn without_nats_affine_traffic_works_misroutes_fail_fast_and_all_recovers() {
    let mut nats = Nats::start().await;
    let members = Members::new(2);
    let env_keys = Keypair::generate().unwrap();
    let a = member(&members, 0, &nats, &[(ENV, &env_keys)]).await;
    let b = member(&members, 1, &nats, &[(ENV, &env_keys)]).await;
    let _env = echo_env(&a, &env_keys, ENV).await;
    let c = client(&a, ENV).await;
    let mut s = open(&c).await;
    round_trip(&mut s, "before").await;

    nats.stop();
    for r in [&a, &b] {
        guard("directory down", async {
            while r.metric("execrelay_relay_cluster_directory_up").await != 0 {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        })
        .await;
    }
    // Affine: the established stream and a new client on the holder work.
    round_trip(&mut s, "during").await;
    let c2 = client(&a, ENV).await;
    let mut s2 = open(&c2).await;
    round_trip(&mut s2, "new during").await;
    // A misroute fails fast, with the reason.
    let started = std::time::Instant::now();
    let m = client(&b, ENV).await;
    let opened = m.open(stream_id(), Bytes::from_static(b"msg1")).unwrap();
    match guard("refused", opened).await {
        Err(StreamError::PeerReset(reason)) => assert_eq!(reason, "directory_unavailable"),
        Err(e) => panic!("expected RESET directory_unavailable, got {e}"),
        Ok(_) => panic!("a misroute without the directory was forwarded"),
    }
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "the refusal took {:?}",
        started.elapsed()
    );
    assert!(
        b.metric("execrelay_relay_cluster_lookup_failures_total")
            .await
            >= 1
    );

    // NATS is back: the holder's subscription is renewed, and misroutes are forwarded again.
    nats.restart().await;
    for r in [&a, &b] {
        r.wait_metric("execrelay_relay_cluster_directory_up", 1)
            .await;
    }
    let f = until_found(&b, ENV).await;
    let mut fs = open(&f).await;
    round_trip(&mut fs, "after").await;
    round_trip(&mut s, "affine after").await;
    a.stop().await;
    b.stop().await;
}

/// A client link on `relay` as the cluster's front (HAProxy) makes it: with its header, from
/// 127.0.0.1.
async fn client_via_front(relay: &Relay, id: &str) -> EndpointLink {
    client_with_front_header(relay, id, [127, 0, 0, 1]).await
}

/// A client link on `relay` carrying the front's header, from the loopback address `from`
/// (any of 127.0.0.0/8 is this machine).
async fn client_with_front_header(relay: &Relay, id: &str, from: [u8; 4]) -> EndpointLink {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut req = format!("ws://{}/v1/connect/{id}", relay.addr)
        .into_client_request()
        .unwrap();
    req.headers_mut()
        .insert("X-Execrelay-Front", "1".parse().unwrap());
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind((from, 0).into()).unwrap();
    let tcp = socket.connect(relay.addr).await.unwrap();
    let (ws, _) = guard(
        "upgrade",
        tokio_tungstenite::client_async_with_config(
            req,
            execrelay_io::driver::ReadAhead::websocket_client(tcp),
            Some(execrelay_io::driver::link_websocket_config()),
        ),
    )
    .await
    .unwrap();
    EndpointLink::spawn_client(ws, EndpointConfig::default()).unwrap()
}

async fn until_closed(link: &EndpointLink, what: &str) -> std::time::Instant {
    guard(what, async {
        while link.close_reason().is_none() {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    })
    .await;
    std::time::Instant::now()
}

#[tokio::test]
async fn clients_sent_by_the_front_move_the_environment_home_at_the_bounded_rate() {
    let (logs, _g) = capture_logs();
    let nats = Nats::start().await;
    let members = Members::new(2);
    let (k1, k2, k3) = (
        Keypair::generate().unwrap(),
        Keypair::generate().unwrap(),
        Keypair::generate().unwrap(),
    );
    let entries = [("env-1", &k1), ("env-2", &k2), ("env-3", &k3)];
    // Both relays trust the front, here this machine.
    let trusting = execrelay_relay::server::settings::RelaySettings {
        trusted_front: "127.0.0.1".parse().unwrap(),
        ..settings()
    };
    let moving = execrelay_relay::server::settings::RelaySettings {
        moves_per_second: 2,
        move_min_link_age_ms: 1,
        ..trusting.clone()
    };
    let a = member_with(&members, 0, &nats, &entries, moving.clone()).await;
    let b = member_with(&members, 1, &nats, &entries, trusting).await;
    let e1 = echo_env(&a, &k1, "env-1").await;
    let e2 = echo_env(&a, &k2, "env-2").await;

    // A client straight to B (no front header): forwarded, and nothing moves.
    let direct = until_found(&b, "env-1").await;
    let mut ds = open(&direct).await;
    round_trip(&mut ds, "direct").await;
    assert_eq!(a.metric("execrelay_relay_cluster_moves_total").await, 0);

    // The front sends clients of both environments to B now: A moves them, one per 500 ms.
    // (Their forwarded streams work as any misroute's; here the move is what is watched.)
    let _f1 = client_via_front(&b, "env-1").await;
    let f2 = client_via_front(&b, "env-2").await;
    let t1 = until_closed(&e1, "env-1 moved").await;
    let t2 = until_closed(&e2, "env-2 moved").await;
    let gap = if t2 > t1 { t2 - t1 } else { t1 - t2 };
    assert!(
        gap >= std::time::Duration::from_millis(400),
        "two moves {gap:?} apart at 2 per second"
    );
    a.wait_metric("execrelay_relay_cluster_moves_total", 2)
        .await;
    a.wait_metric("execrelay_relay_link_closes_total{reason=\"moved\"}", 2)
        .await;
    // Their forwarded clients on B are closed too (moved), to dial again: the client is told
    // why in the close frame.
    until_closed(&f2, "forwarded client closed").await;
    assert_eq!(
        f2.peer_close_reason(),
        Some(execrelay_protocol::reason::CloseReason::Moved)
    );
    // The environment re-dials and lands on B (as the front would send it): no forwarding.
    let _home = echo_env(&b, &k2, "env-2").await;
    let c = client_via_front(&b, "env-2").await;
    let mut s = open(&c).await;
    round_trip(&mut s, "at home").await;
    assert_eq!(
        b.metric("execrelay_relay_cluster_forwarding_links").await,
        0
    );

    // A young link is not moved: B, with the default minimum age, keeps env-3.
    let _e3 = echo_env(&b, &k3, "env-3").await;
    // B's directory subscription for env-3 is in place only once a lookup finds it.
    until_found(&a, "env-3").await;
    let f3 = client_via_front(&a, "env-3").await;
    let mut s3 = open(&f3).await;
    round_trip(&mut s3, "young").await;
    logs.wait_for(&["link too young to move"]).await;
    assert_eq!(b.metric("execrelay_relay_cluster_moves_total").await, 0);
    for r in [&a, &b] {
        assert_eq!(
            r.metric("execrelay_relay_cluster_front_header_ignored_total")
                .await,
            0,
            "the front's header from a trusted front is never ignored"
        );
    }
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn the_front_header_is_honoured_only_from_a_trusted_front() {
    let (logs, _g) = capture_logs();
    let nats = Nats::start().await;
    let members = Members::new(2);
    let (k1, k2) = (Keypair::generate().unwrap(), Keypair::generate().unwrap());
    let entries = [("env-1", &k1), ("env-2", &k2)];
    // A moves anything it is asked to, at once: only the header's trust stands in the way.
    let holder = execrelay_relay::server::settings::RelaySettings {
        moves_per_second: 50,
        move_min_link_age_ms: 1,
        ..settings()
    };
    let a = member_with(&members, 0, &nats, &entries, holder).await;
    // B's front is at 127.0.0.2: a client at 127.0.0.1 is not the front, whatever it sends.
    let b = member_with(
        &members,
        1,
        &nats,
        &entries,
        execrelay_relay::server::settings::RelaySettings {
            trusted_front: "127.0.0.2".parse().unwrap(),
            ..settings()
        },
    )
    .await;
    let e1 = echo_env(&a, &k1, "env-1").await;
    let e2 = echo_env(&a, &k2, "env-2").await;
    until_found(&b, "env-1").await;

    // A direct client that sends the header: forwarded as any misroute, counted, and nothing
    // moves.
    let direct = client_with_front_header(&b, "env-1", [127, 0, 0, 1]).await;
    let mut s = open(&direct).await;
    round_trip(&mut s, "direct with the header").await;
    b.wait_metric("execrelay_relay_cluster_front_header_ignored_total", 1)
        .await;
    logs.wait_for(&["X-Execrelay-Front ignored: the peer is not in trusted_front"])
        .await;

    // The front (127.0.0.2) sends a client of env-2 to B: A moves env-2. This is the barrier:
    // a notice for env-1 (the bug this test is for) would have left B on the same NATS
    // connection before this one, and NATS keeps one publisher's order to a subscriber.
    let front = client_with_front_header(&b, "env-2", [127, 0, 0, 2]).await;
    until_closed(&e2, "env-2 moved by the trusted front").await;
    a.wait_metric("execrelay_relay_cluster_moves_total", 1)
        .await;
    until_closed(&front, "env-2's forwarded client closed").await;

    assert!(
        e1.close_reason().is_none(),
        "env-1 was moved by an untrusted header"
    );
    assert_eq!(a.metric("execrelay_relay_cluster_moves_total").await, 1);
    assert_eq!(
        b.metric("execrelay_relay_cluster_front_header_ignored_total")
            .await,
        1
    );
    // The untrusted client's stream still works: it was never told to move.
    round_trip(&mut s, "after").await;
    a.stop().await;
    b.stop().await;
}

/// A directory participant that is not a relay: answers lookups on `subject` with `answer`
/// (or never, with `None`).
async fn fake_holder(
    nats: &Nats,
    env: &str,
    answer: Option<Vec<u8>>,
) -> tokio::task::JoinHandle<()> {
    use futures_util::StreamExt;
    let client = async_nats::connect(nats.url()).await.unwrap();
    let mut sub = client
        .subscribe(format!("execrelay.env.{env}"))
        .await
        .unwrap();
    // `flush` only writes the SUB to the socket; the server may still register it after a
    // relay's lookup arrives on another connection, and that lookup then meets "no
    // responders" at once. The server handles one connection's operations in order, so our
    // own probe coming back through the subscription proves it is in place.
    client
        .publish(format!("execrelay.env.{env}"), "probe".into())
        .await
        .unwrap();
    let probe = tokio::time::timeout(GUARD, sub.next()).await;
    assert!(
        matches!(&probe, Ok(Some(m)) if m.payload.as_ref() == b"probe"),
        "the fake holder's subscription never became live"
    );
    tokio::spawn(async move {
        while let Some(msg) = sub.next().await {
            if let (Some(reply), Some(a)) = (msg.reply, answer.clone()) {
                let _ = client.publish(reply, a.into()).await;
            }
        }
    })
}

async fn refused_with(relay: &Relay, env: &str) -> String {
    let c = client(relay, env).await;
    let opened = c.open(stream_id(), Bytes::from_static(b"msg1")).unwrap();
    match guard("refused", opened).await {
        Err(StreamError::PeerReset(reason)) => reason,
        Err(e) => panic!("expected a RESET, got {e}"),
        Ok(_) => panic!("{env}: opened"),
    }
}

#[tokio::test]
async fn lookups_are_bounded_in_time_and_in_flight() {
    let nats = Nats::start().await;
    let members = Members::new(1);
    // The slot stays taken for the whole timeout: long enough that the refusal below is seen
    // while it is, on a loaded machine too (1.5 s was not, under the whole suite).
    let bounded = execrelay_relay::server::settings::RelaySettings {
        cluster_lookup_timeout_ms: 6_000,
        max_cluster_lookups: 1,
        ..settings()
    };
    let k = Keypair::generate().unwrap();
    let a = member_with(&members, 0, &nats, &[("ghost", &k), ("other", &k)], bounded).await;
    // Something subscribed that never answers: the lookup waits for its timeout.
    let _silent = fake_holder(&nats, "ghost", None).await;
    let started = std::time::Instant::now();
    let slow = tokio::spawn({
        let c = client(&a, "ghost").await;
        async move {
            let opened = c.open(stream_id(), Bytes::from_static(b"msg1")).unwrap();
            let r = guard("timed out lookup", opened).await;
            (r.err().map(|e| e.to_string()), c)
        }
    });
    a.wait_metric("execrelay_relay_cluster_lookups_total", 1)
        .await;
    // The one lookup slot is taken: the next misrouted client link is refused at once.
    assert_eq!(refused_with(&a, "other").await, "busy");
    assert_eq!(
        a.metric("execrelay_relay_cluster_lookup_failures_total")
            .await,
        1
    );
    let (err, _c) = slow.await.unwrap();
    let elapsed = started.elapsed();
    assert!(
        err.as_deref()
            .is_some_and(|e| e.contains("environment_offline")),
        "{err:?}"
    );
    assert!(
        elapsed >= std::time::Duration::from_millis(6_000),
        "{elapsed:?}"
    );
    assert_eq!(
        a.metric("execrelay_relay_cluster_lookup_misses_total")
            .await,
        1
    );
    a.stop().await;
}

#[tokio::test]
async fn a_directory_answer_cannot_send_a_misroute_to_an_impostor() {
    let nats = Nats::start().await;
    let members = Members::new(3);
    let k = Keypair::generate().unwrap();
    let entries = [("fake-1", &k), ("fake-2", &k), ("fake-3", &k)];
    let a = member(&members, 0, &nats, &entries).await;
    // Relay 2 is a member, but not relay 1.
    let impostor = member(&members, 2, &nats, &entries).await;
    let answer = |node: &str, addr: String| {
        Some(
            serde_json::to_vec(&serde_json::json!({
                "node": node, "addr": addr, "age_ms": 1, "since_us": 1
            }))
            .unwrap(),
        )
    };
    // A node the cluster file does not list.
    let _f1 = fake_holder(
        &nats,
        "fake-1",
        answer("relay-9", format!("ws://{}", impostor.addr)),
    )
    .await;
    // A listed node, at the address of another relay (which does not hold relay-1's key).
    let _f2 = fake_holder(
        &nats,
        "fake-2",
        answer("relay-1", format!("ws://{}", impostor.addr)),
    )
    .await;
    // Garbage.
    let _f3 = fake_holder(&nats, "fake-3", Some(b"{\"node\":1}".to_vec())).await;
    assert_eq!(refused_with(&a, "fake-1").await, "holder_unreachable");
    assert_eq!(refused_with(&a, "fake-2").await, "holder_unreachable");
    assert_eq!(refused_with(&a, "fake-3").await, "environment_offline");
    assert_eq!(
        a.metric("execrelay_relay_cluster_forward_failures_total")
            .await,
        2
    );
    assert_eq!(
        impostor
            .metric("execrelay_relay_cluster_relay_links_admitted_total")
            .await,
        0
    );
    a.stop().await;
    impostor.stop().await;
}

#[tokio::test]
async fn relay_links_are_bounded() {
    let nats = Nats::start().await;
    let members = Members::new(2);
    let k = Keypair::generate().unwrap();
    let one = execrelay_relay::server::settings::RelaySettings {
        max_relay_links: 1,
        ..settings()
    };
    let a = member_with(&members, 0, &nats, &[(ENV, &k)], one).await;
    let (_, b_keys) = &members.nodes[1];
    let relay_link = || async {
        let mut ws = a.ws(&format!("/v1/relay/{ENV}")).await;
        let (_, open) = relay_link::start(b_keys, &a.keys.public, ENV, next_ts()).unwrap();
        send_raw(&mut ws, &open).await;
        let answer = recv_until(&mut ws, |_| true).await.expect("an answer");
        (ws, answer)
    };
    let (_held, first) = relay_link().await;
    assert_eq!(first.ftype, FrameType::Accept);
    let (_ws, second) = relay_link().await;
    assert_eq!(
        (second.ftype, second.reset_reason().as_str()),
        (FrameType::Reset, "busy")
    );
    a.stop().await;
}
