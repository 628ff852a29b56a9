//! A client's first connection through a relay while its environment is away or moving
//! (`ClientOptions::offline_wait`, `FIRST_CONNECT_OFFLINE_WAIT`): the relay's
//! `environment_offline` refusal, or a link the relay closes `moved` (a cluster moving the
//! environment between relays), is tried again with backoff within the bound, and the
//! connection succeeds once the environment is there; past the bound it fails with an error
//! that names the environment and says it is offline. A failure of another kind is not
//! retried.
//!
//! Every wait is on a metric, a connection or a returned call, bounded by a hang guard; the
//! environment is started only after its first refusal was observed.

mod common;
use common::noise::*;
use common::relay::*;
use common::*;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use execrelay::client::{
    Client, ClientError, ClientOptions, ProcessEvent, StartOptions, Target,
    FIRST_CONNECT_OFFLINE_WAIT,
};
use execrelay::config::ServerConfig;
use execrelay::link::client::{ClientLink, LinkPool, NoiseClientConfig, NoiseError};
use execrelay::noise::keys::Keypair;
use futures_util::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;

const ENV: &str = "env";

fn offline_refusals(relay: &InRelay) -> u64 {
    relay
        .metrics
        .value("execrelay_relay_resets_total{reason=\"environment_offline\"}")
}

fn target(url: String, client: &Keypair, server: &Keypair) -> Target {
    Target::Noise {
        url,
        config: Arc::new(NoiseClientConfig::new(client.clone(), server.public)),
        pool: LinkPool::new(),
    }
}

/// `echo` through the client: its output, exact.
async fn echo(client: &Client, word: &str) {
    let mut p = client
        .start(StartOptions::new("p", ["echo", word]))
        .await
        .unwrap();
    let mut out = Vec::new();
    let exit = tokio::time::timeout(GUARD, async {
        while let Some(ev) = p.next_event().await {
            match ev {
                ProcessEvent::Output { data, .. } => out.extend_from_slice(&data),
                ProcessEvent::Exited(info) => return Some(info),
                other => panic!("unexpected {other:?}"),
            }
        }
        None
    })
    .await
    .expect("hang guard: echo");
    assert_eq!(exit.and_then(|e| e.exit_code), Some(0));
    assert_eq!(out, format!("{word}\n").as_bytes());
}

/// A relay listing `env` (its exec server not started), and the keys of the server and of a
/// client it will authorize.
async fn relay_without_its_environment(dir: &std::path::Path) -> (InRelay, Keypair, Keypair) {
    let server = Keypair::generate().unwrap();
    let client = Keypair::generate().unwrap();
    let envs = environments_file(dir, &[(ENV, &server)]);
    let relay = InRelay::start(&envs).await;
    (relay, server, client)
}

async fn start_env(relay: &InRelay, server: &Keypair, client: &Keypair) -> InEnv {
    let (auth, _) = TestAuth::new(&[(client, Verdict::Allow)]);
    InEnv::start(
        &relay.url(),
        relay.keys.public,
        ENV,
        server.clone(),
        auth,
        quick_redial(ServerConfig::default()),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_connect_waits_for_an_environment_that_comes_online() {
    let dir = tempfile::tempdir().unwrap();
    let (relay, server, client) = relay_without_its_environment(dir.path()).await;
    // A wide bound: the environment comes when the test says, on a loaded machine too.
    let opts = ClientOptions {
        offline_wait: GUARD,
        ..ClientOptions::default()
    };
    let connecting = tokio::spawn(Client::connect(
        target(relay.client_url(ENV), &client, &server),
        opts,
    ));
    eventually("the relay refused the first attempt", || {
        offline_refusals(&relay) >= 1
    })
    .await;
    assert!(!connecting.is_finished(), "it gave up at the first refusal");
    let env = start_env(&relay, &server, &client).await;
    let c = tokio::time::timeout(GUARD, connecting)
        .await
        .expect("hang guard: connect")
        .unwrap()
        .expect("connected once the environment came");
    assert_eq!(c.connection_count(), 1);
    echo(&c, "online").await;
    c.shutdown().await;
    env.stop().await;
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_connect_gives_up_on_an_environment_that_never_comes_within_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    let (relay, server, client) = relay_without_its_environment(dir.path()).await;
    assert_eq!(FIRST_CONNECT_OFFLINE_WAIT, Duration::from_secs(5));
    assert_eq!(
        ClientOptions::default().offline_wait,
        FIRST_CONNECT_OFFLINE_WAIT
    );
    let wait = Duration::from_secs(3);
    let started = tokio::time::Instant::now();
    let err = Client::connect(
        target(relay.client_url(ENV), &client, &server),
        ClientOptions {
            offline_wait: wait,
            ..ClientOptions::default()
        },
    )
    .await
    .err()
    .expect("the environment never came");
    let took = started.elapsed();
    let ClientError::EnvironmentOffline { environment, why } = &err else {
        panic!("expected EnvironmentOffline, got {err:?}");
    };
    assert_eq!(environment, ENV);
    assert!(
        why.contains("environment \"env\" is offline")
            && why.contains("environment_offline")
            && why.contains("still offline after")
            && why.contains("--environment-id env"),
        "{why}"
    );
    // It waited the whole bound, trying more than once (0.1 s, 0.2 s, 0.4 s … apart).
    assert!(took >= wait, "gave up after {took:?}");
    let tries = offline_refusals(&relay);
    assert!(tries >= 2, "{tries} tries within {wait:?}");
    assert!(
        why.contains(&format!("still offline after {tries} tries")),
        "{why}"
    );

    // `offline_wait: 0`: one refusal, and the relay's words alone.
    let before = offline_refusals(&relay);
    let err = Client::connect(
        target(relay.client_url(ENV), &client, &server),
        ClientOptions {
            offline_wait: Duration::ZERO,
            ..ClientOptions::default()
        },
    )
    .await
    .err()
    .expect("offline");
    assert!(
        matches!(&err, ClientError::EnvironmentOffline { why, .. } if !why.contains("still offline")),
        "{err:?}"
    );
    assert_eq!(offline_refusals(&relay), before + 1);
    relay.stop().await;
}

/// A front before `relay_port` whose first `moving` connections are closed `moved` by "the
/// relay" as soon as their first frame (an `OPEN`) arrives, as a relay of a cluster closes
/// the client links of an environment that is moving; every later connection is passed
/// through to the relay. Counts the connections.
async fn moving_front(relay_port: u16, moving: usize) -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(AtomicUsize::new(0));
    let count = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let n = count.fetch_add(1, Ordering::SeqCst) + 1;
            tokio::spawn(async move {
                if n <= moving {
                    let Ok(mut ws) = tokio_tungstenite::accept_async(tcp).await else {
                        return;
                    };
                    // The OPEN, then the close a relay sends when the environment moves.
                    let _ = ws.next().await;
                    let _ = ws
                        .send(Message::Close(Some(CloseFrame {
                            code: CloseCode::Policy,
                            reason: "moved".into(),
                        })))
                        .await;
                    while let Some(Ok(_)) = ws.next().await {}
                } else {
                    let Ok(relay) = TcpStream::connect(("127.0.0.1", relay_port)).await else {
                        return;
                    };
                    let (mut cr, mut cw) = tcp.into_split();
                    let (mut rr, mut rw) = relay.into_split();
                    tokio::select! {
                        _ = tokio::io::copy(&mut cr, &mut rw) => {}
                        _ = tokio::io::copy(&mut rr, &mut cw) => {}
                    }
                }
            });
        }
    });
    (port, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_connect_whose_link_is_closed_moved_is_tried_again() {
    let dir = tempfile::tempdir().unwrap();
    let (relay, server, client) = relay_without_its_environment(dir.path()).await;
    let env = start_env(&relay, &server, &client).await;
    env.registered().await;
    let (port, seen) = moving_front(relay.port, 2).await;
    let url = format!("relay+ws://127.0.0.1:{port}/{ENV}");

    // What a stream sees on a link the relay closes `moved`.
    let link = ClientLink::connect(&url, NoiseClientConfig::new(client.clone(), server.public))
        .await
        .unwrap();
    match tokio::time::timeout(GUARD, link.open_stream())
        .await
        .expect("hang guard: open")
    {
        Err(NoiseError::Moved(id)) => assert_eq!(id, ENV),
        Err(e) => panic!("expected Moved, got {e:?}"),
        Ok(_) => panic!("opened on a link closed moved"),
    }
    let said = NoiseError::Moved(ENV.into()).to_string();
    assert!(
        said.contains("environment \"env\" is offline") && said.contains("moved"),
        "{said}"
    );

    // A client connecting in that instant: its first link is closed `moved`, its second goes
    // through.
    let c = tokio::time::timeout(
        GUARD,
        Client::connect(target(url, &client, &server), ClientOptions::default()),
    )
    .await
    .expect("hang guard: connect")
    .expect("connected after the move");
    assert_eq!(
        seen.load(Ordering::SeqCst),
        3,
        "one moved link each, then through"
    );
    echo(&c, "moved").await;
    c.shutdown().await;
    env.stop().await;
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_that_waiting_cannot_mend_is_not_retried() {
    let dir = tempfile::tempdir().unwrap();
    let (relay, server, client) = relay_without_its_environment(dir.path()).await;
    let env = start_env(&relay, &server, &client).await;
    env.registered().await;
    // A key the exec server does not authorize: refused at once, whatever the offline wait.
    let stranger = Keypair::generate().unwrap();
    let err = Client::connect(
        target(relay.client_url(ENV), &stranger, &server),
        ClientOptions {
            offline_wait: GUARD,
            ..ClientOptions::default()
        },
    )
    .await
    .err()
    .expect("refused");
    assert!(matches!(err, ClientError::Refused(_)), "{err:?}");
    env.stop().await;
    relay.stop().await;
}
