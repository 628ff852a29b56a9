//! Keepalive on the exec server's links and WebSockets (`secure-transport.md` §6.4): a peer
//! that keeps sending but never answers pings is dead at the pong timeout; a client process
//! stopped with SIGSTOP is declared dead within the pong timeout (shortened by settings, as
//! the flags do); a process silent for several keepalive intervals keeps its stream.
//!
//! Keepalive is about wall-clock time, so these tests use short real intervals; every wait is
//! on a gauge, an event or an exit, with the elapsed time checked against the settings and a
//! hang guard on each.

mod common;
use common::*;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::SinkExt;
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

use execrelay::client::{Client, ClientOptions, ProcessEvent, StartOptions, Target};
use execrelay::config::ServerConfig;
use execrelay::link::client::{LinkPool, NoiseClientConfig};
use execrelay::link::server::NoiseServerConfig;
use execrelay::noise::keys::{public_line, Keypair};
use execrelay::server::{Listener, Server};
use execrelay::session::SessionRegistry;
use execrelay_protocol::config::KeepaliveConfig;

const INTERVAL_MS: u64 = 100;
const PONG_MS: u64 = 600;
/// Scheduling slack on a loaded machine, on top of interval + pong timeout.
const SLACK: Duration = Duration::from_millis(2500);

fn short_keepalive() -> ServerConfig {
    ServerConfig {
        keepalive_interval_ms: INTERVAL_MS,
        pong_timeout_ms: PONG_MS,
        ..ServerConfig::default()
    }
}

struct Srv {
    /// The authorized-keys file lives here (re-read when it changes: it must stay).
    _dir: Option<tempfile::TempDir>,
    registry: Arc<SessionRegistry>,
    url: String,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Srv {
    async fn ws(config: ServerConfig) -> Srv {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("ws://{}", l.local_addr().unwrap());
        Srv::run(config, Listener::Ws(l), url, None)
    }

    async fn noise(config: ServerConfig, keys: &Keypair, client: &Keypair) -> Srv {
        use execrelay::noise::authorizer::KeysAuthorizer;
        use execrelay::noise::keys::AuthorizedKeys;
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("noise+ws://{}", l.local_addr().unwrap());
        let dir = tempfile::tempdir().unwrap();
        let auth = dir.path().join("auth");
        std::fs::write(&auth, public_line(&client.public, "c")).unwrap();
        let noise = Arc::new(NoiseServerConfig {
            keys: keys.clone(),
            authorizer: Arc::new(KeysAuthorizer::new(
                AuthorizedKeys::load(&auth).unwrap(),
                None,
            )),
            env_id: String::new(),
        });
        Srv::run(config, Listener::Noise(l, noise), url, Some(dir))
    }

    fn run(
        config: ServerConfig,
        listener: Listener,
        url: String,
        dir: Option<tempfile::TempDir>,
    ) -> Srv {
        let server = Server::new(Arc::new(config)).expect("server starts");
        let registry = server.registry().clone();
        let stop = CancellationToken::new();
        let task = tokio::spawn(server.run(vec![listener], stop.clone()));
        Srv {
            _dir: dir,
            registry,
            url,
            stop,
            task,
        }
    }

    async fn stop(self) {
        self.stop.cancel();
        tokio::time::timeout(PROMPT, self.task)
            .await
            .expect("server stop (hang guard)")
            .unwrap();
    }
}

/// A plain WebSocket peer that keeps sending but never reads (so never answers a ping) is
/// dead at the pong timeout, not kept alive by its data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ws_peer_that_sends_but_never_answers_pings_is_dead_at_the_pong_timeout() {
    let srv = Srv::ws(short_keepalive()).await;
    let (mut ws, _) = tokio_tungstenite::connect_async(&srv.url).await.unwrap();
    let connections = srv.registry.metrics().connections.clone();
    eventually("the connection is up", || connections.get() == 1).await;
    let t0 = Instant::now();
    let note = r#"{"jsonrpc":"2.0","method":"initialized","params":{}}"#;
    let deadline = tokio::time::Instant::now() + GUARD;
    while connections.get() != 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never declared dead"
        );
        // Data, every 20 ms, never a pong (this peer never reads).
        let _ = ws.send(Message::Text(note.into())).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(PONG_MS),
        "dead only once a ping went unanswered for the pong timeout: {took:?}"
    );
    assert!(
        took <= Duration::from_millis(INTERVAL_MS + PONG_MS) + SLACK,
        "dead within the interval and the pong timeout: {took:?}"
    );
    srv.stop().await;
}

/// A client process stopped with SIGSTOP (`execrelay run` over `noise+ws://`) answers no
/// ping: the server declares its link dead within the pong timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_stopped_with_sigstop_is_declared_dead_within_the_pong_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let (server_keys, client_keys) = (Keypair::generate().unwrap(), Keypair::generate().unwrap());
    let srv = Srv::noise(short_keepalive(), &server_keys, &client_keys).await;
    server_keys.write(&dir.path().join("server"), "s").unwrap();
    client_keys.write(&dir.path().join("client"), "c").unwrap();
    let mut child = tokio::process::Command::new(bin())
        .args(["run", &srv.url, "--server-key"])
        .arg(dir.path().join("server.pub"))
        .arg("--key")
        .arg(dir.path().join("client"))
        .args(["--", "sleep", "60"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let m = srv.registry.metrics().clone();
    eventually("the client's stream is up", || m.noise_streams.get() == 1).await;
    let pid = nix::unistd::Pid::from_raw(child.id().unwrap() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let t0 = Instant::now();
    eventually("the stopped client's link is declared dead", || {
        m.noise_links.get() == 0
    })
    .await;
    let took = t0.elapsed();
    assert!(
        took <= Duration::from_millis(INTERVAL_MS + PONG_MS) + SLACK,
        "dead within the interval and the pong timeout: {took:?}"
    );
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
    let _ = child.wait().await;
    srv.stop().await;
}

async fn silent_then_output(client: &Client) {
    // Silent for ten keepalive intervals, then one line.
    let mut p = client
        .start(StartOptions::new(
            "quiet",
            ["sh", "-c", "sleep 1; echo still-here"],
        ))
        .await
        .unwrap();
    let mut out = Vec::new();
    loop {
        let ev = tokio::time::timeout(GUARD, p.next_event())
            .await
            .expect("an event (hang guard)")
            .expect("the event stream ended");
        match ev {
            ProcessEvent::Output { data, .. } => out.extend_from_slice(&data),
            ProcessEvent::Exited(info) => {
                assert_eq!(info.exit_code, Some(0));
                break;
            }
            ProcessEvent::Lost { .. } => panic!("lost"),
            ProcessEvent::Omitted { .. } => panic!("no cap was asked for"),
        }
    }
    assert_eq!(text(&out), "still-here\n");
    assert_eq!(client.connection_count(), 1, "the stream was never lost");
}

/// A process silent for many keepalive intervals keeps its stream, over `noise+ws://` (both
/// ends pinging) and over plain `ws://`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_process_keeps_its_stream() {
    let (server_keys, client_keys) = (Keypair::generate().unwrap(), Keypair::generate().unwrap());
    let srv = Srv::noise(short_keepalive(), &server_keys, &client_keys).await;
    let mut cfg = NoiseClientConfig::new(client_keys, server_keys.public);
    cfg.keepalive = KeepaliveConfig {
        interval: Duration::from_millis(INTERVAL_MS),
        jitter: Duration::from_millis(INTERVAL_MS / 10),
        pong_timeout: Duration::from_millis(PONG_MS),
        write_timeout: Duration::from_millis(PONG_MS),
    };
    let target = Target::Noise {
        url: srv.url.clone(),
        config: Arc::new(cfg),
        pool: LinkPool::new(),
    };
    let client = Client::connect(target, ClientOptions::default())
        .await
        .unwrap();
    silent_then_output(&client).await;
    client.shutdown().await;
    srv.stop().await;

    let srv = Srv::ws(short_keepalive()).await;
    let client = Client::connect(Target::Ws(srv.url.clone()), ClientOptions::default())
        .await
        .unwrap();
    silent_then_output(&client).await;
    client.shutdown().await;
    srv.stop().await;
}
