//! The health of an exec server in relay mode, as an operator's probe sees it: `/readyz` is
//! `200` only while the environment link is up and authenticated, and `503` with the reason
//! otherwise (`connecting`, `unauthorized`, `refused`); `/livez` is `200` throughout;
//! `/status` tells the link's state and what the server holds. Across the relay down → up →
//! the environment removed from the environments file → put back, on `--health-listen` and
//! on `--metrics-listen` alike. With the real binaries: the log says `connected to relay URL
//! as environment ID` once per link up, and a refusal says what to check.

mod common;
use common::noise::{TestAuth, Verdict};
use common::noise_bin::relay_server_and_client;
use common::relay::{
    environments_file, quick_redial, write_environments, BinEnv, BinRelay, InRelay,
};
use common::{eventually, GUARD, PROMPT};

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use execrelay::config::ServerConfig;
use execrelay::link::environment::RelayDial;
use execrelay::link::server::NoiseServerConfig;
use execrelay::noise::keys::Keypair;
use execrelay::server::{Listener, Server};
use execrelay_relay::server::settings::RelaySettings;

/// `GET path` on `addr`: (status, body).
async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let exchange = async {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: probe\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await.unwrap();
        String::from_utf8(raw).unwrap()
    };
    let text = tokio::time::timeout(PROMPT, exchange)
        .await
        .expect("the probe answered (hang guard)");
    let status = text[9..12].parse().unwrap();
    let body = text.split_once("\r\n\r\n").unwrap().1.to_string();
    (status, body)
}

/// Poll `GET /readyz` on every address until each answers `status` with a body containing
/// `needle`; the last body.
async fn readyz_until(addrs: &[SocketAddr], status: u16, needle: &str) -> String {
    let deadline = tokio::time::Instant::now() + GUARD;
    loop {
        let mut all = true;
        let mut last = String::new();
        for a in addrs {
            let (s, body) = get(*a, "/readyz").await;
            all &= s == status && body.contains(needle);
            last = body;
        }
        if all {
            return last;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "/readyz never answered {status} with {needle:?}; last: {last:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// A port with nothing listening on it (for now).
async fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    l.local_addr().unwrap().port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_follows_the_environment_link_down_up_removed_and_back() {
    let dir = tempfile::tempdir().unwrap();
    let (server, client, relay_keys) = (
        Keypair::generate().unwrap(),
        Keypair::generate().unwrap(),
        Keypair::generate().unwrap(),
    );
    let envs = environments_file(dir.path(), &[("env", &server)]);
    let port = free_port().await;

    // The exec server first, its relay not running: a health listener and a metrics one.
    let (auth, _) = TestAuth::new(&[(&client, Verdict::Allow)]);
    let config = ServerConfig {
        relay_refused_backoff_max_ms: 300,
        ..quick_redial(ServerConfig::default())
    };
    let server_task = {
        let dial = RelayDial {
            relay_url: format!("ws://127.0.0.1:{port}"),
            env_id: "env".into(),
            relay_public: relay_keys.public,
            tls: Default::default(),
        };
        let noise = Arc::new(NoiseServerConfig {
            keys: server.clone(),
            authorizer: auth,
            env_id: "env".into(),
        });
        let health = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let metrics = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addrs = [health.local_addr().unwrap(), metrics.local_addr().unwrap()];
        let srv = Server::new(Arc::new(config)).unwrap();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(srv.run(
            vec![
                Listener::Relay(dial, noise),
                Listener::Health(health),
                Listener::Metrics(metrics),
            ],
            shutdown.clone(),
        ));
        (addrs, shutdown, task)
    };
    let (addrs, shutdown, task) = server_task;

    // 1. The relay is down: not ready, connecting, saying why; alive all the same.
    let why = readyz_until(&addrs, 503, "environment link connecting: cannot connect").await;
    assert!(
        why.contains(&format!("ws://127.0.0.1:{port}/v1/env/env")),
        "{why}"
    );
    for a in addrs {
        assert_eq!(get(a, "/livez").await, (200, "ok\n".to_string()));
    }
    let (status, body) = get(addrs[0], "/status").await;
    assert_eq!(status, 200);
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(doc["ready"], false);
    assert_eq!(doc["environment_link"]["state"], "connecting");
    assert_eq!(doc["environment_link"]["environment"], "env");
    assert!(
        doc["environment_link"]["attempts_since_up"]
            .as_u64()
            .unwrap()
            >= 1
    );
    assert_eq!(
        doc["sessions"]["limit"],
        ServerConfig::default().max_sessions
    );
    // The health listener serves no metrics; the metrics listener does, with the link down.
    assert_eq!(get(addrs[0], "/metrics").await.0, 404);
    let (_, metrics) = get(addrs[1], "/metrics").await;
    assert!(
        metrics
            .lines()
            .any(|l| l == "execrelay_environment_link_up 0"),
        "{metrics}"
    );

    // 2. The relay comes up: ready.
    let relay = InRelay::start_at(&envs, relay_keys.clone(), port, RelaySettings::default()).await;
    readyz_until(&addrs, 200, "ok").await;
    let doc: serde_json::Value = serde_json::from_str(&get(addrs[0], "/status").await.1).unwrap();
    assert_eq!(doc["ready"], true);
    assert_eq!(doc["environment_link"]["state"], "up");
    assert_eq!(doc["links"]["open"], 1);
    let (_, metrics) = get(addrs[1], "/metrics").await;
    assert!(metrics
        .lines()
        .any(|l| l == "execrelay_environment_link_up 1"));

    // 3. The environment is removed from the relay's environments file: its link is closed
    //    and the next one refused. Not ready, unauthorized, saying what to check.
    write_environments(&envs, &[]);
    let why = readyz_until(&addrs, 503, "environment link unauthorized").await;
    assert!(
        why.contains("check that the relay's environments file lists this server's public key"),
        "{why}"
    );
    let doc: serde_json::Value = serde_json::from_str(&get(addrs[0], "/status").await.1).unwrap();
    assert_eq!(doc["environment_link"]["state"], "unauthorized");
    let (_, metrics) = get(addrs[1], "/metrics").await;
    assert!(
        metrics
            .lines()
            .any(|l| l == "execrelay_environment_link_state{state=\"unauthorized\"} 1"),
        "{metrics}"
    );

    // 4. Put back: ready again, without a restart.
    write_environments(&envs, &[("env", &server)]);
    readyz_until(&addrs, 200, "ok").await;
    let (_, metrics) = get(addrs[1], "/metrics").await;
    assert!(
        metrics
            .lines()
            .any(|l| l == "execrelay_environment_link_ups_total 2"),
        "{metrics}"
    );

    shutdown.cancel();
    tokio::time::timeout(PROMPT, task)
        .await
        .expect("the exec server stopped (hang guard)")
        .unwrap();
    relay.stop().await;
}

/// The real binaries: `serve --relay … --health-listen`, its log line per link up, and a
/// refusal in the log with what to check; `/readyz` follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_logs_each_link_up_and_what_to_check_on_a_refusal() {
    let dir = tempfile::tempdir().unwrap();
    let (relay_keys, server, _client, envs, auth) =
        relay_server_and_client(dir.path(), "env-1").await;
    let relay = BinRelay::start(
        &relay_keys.private,
        &envs,
        &["--environments-poll-ms", "50"],
        &dir.path().join("relay.log"),
    )
    .await;
    let log = dir.path().join("server.log");
    let env = BinEnv::start(
        &relay.url,
        "env-1",
        &relay_keys.public,
        &server.private,
        &auth,
        &[
            "--health-listen",
            "127.0.0.1:0",
            "--relay-backoff-initial-ms",
            "50",
            "--relay-backoff-max-ms",
            "100",
            "--relay-refused-backoff-max-ms",
            "200",
        ],
        &log,
    )
    .await;
    let health_url = {
        let log = log.clone();
        let find = move || {
            std::fs::read_to_string(&log)
                .unwrap_or_default()
                .lines()
                .find_map(|l| l.strip_prefix("execrelay health: http://"))
                .map(|rest| rest.trim_end_matches("/readyz").to_string())
        };
        let probe = find.clone();
        eventually("the health URL is in the log", move || probe().is_some()).await;
        find().unwrap()
    };
    let addr: SocketAddr = health_url.parse().unwrap();
    readyz_until(&[addr], 200, "ok").await;
    let connected = format!("connected to relay {} as environment env-1", relay.url);
    let count = |needle: &str| {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .matches(needle)
            .count()
    };
    assert_eq!(count(&connected), 1);

    // Removed from the environments file: refused, and the log says what to check.
    std::fs::write(&envs, "# nobody\n").unwrap();
    readyz_until(&[addr], 503, "environment link unauthorized").await;
    eventually("the refusal is logged", || {
        count("check that the relay's environments file lists this server's public key") >= 1
    })
    .await;
    // Back: connected again, logged once more.
    std::fs::write(&envs, format!("env-1 {}\n", server.public_line())).unwrap();
    readyz_until(&[addr], 200, "ok").await;
    eventually("the second link up is logged", || count(&connected) == 2).await;
    drop(env);
    drop(relay);
}
