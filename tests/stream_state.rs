//! Both ends of a delivery, on demand: `execrelay serve` logs every process's stream state on
//! `SIGUSR1` (`session::stream_state`: log counters, pump, writer, the Noise stream's windows
//! both ways), and the client library tells its side (`Client::delivery_state`: received,
//! consumed and acknowledged `seq`, buffered events, the stream's windows both ways). The soak's
//! stall detector puts the two side by side.

mod common;
use common::noise_bin::{server_and_client, BinServer};
use common::*;

use std::sync::Arc;

use execrelay::client::{Client, ClientOptions, ProcessEvent, StartOptions, Target};
use execrelay::link::client::{LinkPool, NoiseClientConfig};
use execrelay::noise::keys::{load_public, Keypair};

async fn noise_client(
    url: &str,
    client: &common::noise_bin::Keys,
    server: &common::noise_bin::Keys,
) -> Client {
    let cfg = NoiseClientConfig::new(
        Keypair::load(&client.private).unwrap(),
        load_public(server.pubs()).unwrap(),
    );
    Client::connect(
        Target::Noise {
            url: url.to_string(),
            config: Arc::new(cfg),
            pool: LinkPool::new(),
        },
        ClientOptions::default(),
    )
    .await
    .unwrap()
}

/// Wait for the first output of `h`.
async fn first_output(h: &mut execrelay::client::ProcessHandle) -> Vec<u8> {
    match tokio::time::timeout(GUARD, h.next_event()).await {
        Ok(Some(ProcessEvent::Output { data, .. })) => data.to_vec(),
        other => panic!("expected output, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigusr1_logs_the_stream_state_of_every_process() {
    let dir = tempfile::tempdir().unwrap();
    let (server, client, auth) = server_and_client(dir.path()).await;
    let srv = BinServer::with_keys(dir.path(), &server, &auth, &[], Some("info")).await;
    let c = noise_client(&srv.url, &client, &server).await;
    let mut a = c
        .start(StartOptions::new(
            "quiet-a",
            ["sh", "-c", "echo a; sleep 600"],
        ))
        .await
        .unwrap();
    let mut b = c
        .start(StartOptions::new(
            "quiet-b",
            ["sh", "-c", "echo b; sleep 600"],
        ))
        .await
        .unwrap();
    assert_eq!(first_output(&mut a).await, b"a\n");
    assert_eq!(first_output(&mut b).await, b"b\n");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(srv.pid() as i32),
        nix::sys::signal::Signal::SIGUSR1,
    )
    .unwrap();
    let log = dir.path().join("server.log");
    let mut text = String::new();
    eventually("the stream state dump", || {
        text = std::fs::read_to_string(&log).unwrap_or_default();
        text.contains("stream state: 2 processes")
    })
    .await;
    for id in ["quiet-a", "quiet-b"] {
        let line = text
            .lines()
            .find(|l| {
                l.contains("stream state: session ") && l.contains(&format!("process {id:?} "))
            })
            .unwrap_or_else(|| panic!("no line for {id}: {text}"));
        assert!(line.contains(" log next_seq "), "{line}");
        assert!(line.contains("; writer "), "{line}");
        assert!(line.contains("transport: send: sent "), "{line}");
        assert!(line.contains(" window 16 "), "{line}");
        assert!(line.contains("; receive: received "), "{line}");
        assert!(line.contains(" reported "), "{line}");
    }
    a.terminate(None).await.unwrap();
    b.terminate(None).await.unwrap();
    c.shutdown().await;
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_tells_its_side_of_a_delivery() {
    let dir = tempfile::tempdir().unwrap();
    let (server, client, auth) = server_and_client(dir.path()).await;
    let srv = BinServer::with_keys(dir.path(), &server, &auth, &[], None).await;
    let c = noise_client(&srv.url, &client, &server).await;
    let mut h = c
        .start(StartOptions::new(
            "three",
            [
                "sh",
                "-c",
                "echo one; sleep 0.2; echo two; sleep 0.2; echo three; sleep 600",
            ],
        ))
        .await
        .unwrap();
    // Events arrive while the application takes none: they are the client's, buffered.
    let mut state = None;
    eventually("an event buffered", || {
        state = c.delivery_state("three");
        state.as_ref().is_some_and(|s| s.received_seq >= 1)
    })
    .await;
    let s = state.unwrap();
    assert_eq!((s.consumed_seq, s.acked_seq), (0, 0), "{s}");
    assert_eq!(s.buffered_events as u64, s.received_seq, "{s}");
    assert!(!s.exit_received);
    assert_eq!(s.connection, 1);
    let flow = s
        .transport
        .clone()
        .expect("a Noise stream has flow control");
    assert!(flow.starts_with("send: sent "), "{flow}");
    assert!(flow.contains("; receive: received "), "{flow}");
    assert!(
        s.to_string().contains(&format!(
            "received seq {} consumed 0 acked 0",
            s.received_seq
        )),
        "{s}"
    );
    // Taken: the client's position follows the application's.
    let mut got = Vec::new();
    while got.len() < 14 {
        got.extend(first_output(&mut h).await);
    }
    assert_eq!(got, b"one\ntwo\nthree\n");
    let s = c.delivery_state("three").unwrap();
    assert_eq!(s.consumed_seq, s.received_seq, "{s}");
    assert_eq!(s.buffered_events, 0, "{s}");
    h.terminate(None).await.unwrap();
    loop {
        match tokio::time::timeout(GUARD, h.next_event()).await.unwrap() {
            Some(ProcessEvent::Exited(_)) => break,
            Some(_) => {}
            None => panic!("no exit notice"),
        }
    }
    assert!(
        c.delivery_state("three").is_none(),
        "nothing is known of a process whose exit notice was taken"
    );
    assert!(c.delivery_state("never-started").is_none());
    c.shutdown().await;
    srv.stop().await;
}
