//! The client library's pipelined stdin (`StdinWriter`): several `process/write` requests in
//! flight, applied in order; every byte exactly once across a killed connection (the
//! unanswered writes are sent again with their `writeId`); a process that stops taking input
//! stops the writer with the server's answer.

mod common;
use common::noise::pattern;
use common::*;

use std::sync::Arc;

use bytes::Bytes;
use execrelay::client::{
    Client, ClientOptions, StartOptions, StdinRefused, Target, STDIN_WRITE_BYTES,
};
use execrelay::config::ServerConfig;
use execrelay::server::{Listener, Server};
use tokio_util::sync::CancellationToken;

async fn ws_server() -> (String, CancellationToken) {
    let server = Server::new(Arc::new(cfg())).expect("server starts");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    let stop = CancellationToken::new();
    tokio::spawn(server.run(vec![Listener::Ws(listener)], stop.clone()));
    (url, stop)
}

/// Everything the process wrote to stdout, until its exit notice (status 0).
async fn stdout_of(p: &mut execrelay::client::ProcessHandle) -> Vec<u8> {
    let (out, code) = stdout_and_code(p).await;
    assert_eq!(code, Some(0));
    out
}

fn start_opts(id: &str, argv: &[&str]) -> StartOptions {
    let mut o = StartOptions::new(id, argv.iter().copied());
    o.params.pipe_stdin = true;
    o
}

/// 12 MiB in pieces of every size, among them pieces larger than one write: the child gets
/// exactly the bytes, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_writes_arrive_in_order() {
    let (url, stop) = ws_server().await;
    let client = Client::connect(Target::Ws(url), ClientOptions::default())
        .await
        .unwrap();
    let data = pattern(12 << 20, 3);
    let mut p = client
        .start(start_opts("sum", &["sha256sum"]))
        .await
        .unwrap();
    let mut w = p.stdin_writer();
    let mut at = 0;
    for size in [
        1,
        7,
        4096,
        STDIN_WRITE_BYTES - 1,
        3 * STDIN_WRITE_BYTES + 5,
        100_000,
    ]
    .iter()
    .cycle()
    {
        if at == data.len() {
            break;
        }
        let end = (at + size).min(data.len());
        w.write(Bytes::copy_from_slice(&data[at..end]))
            .await
            .unwrap();
        at = end;
    }
    w.finish().await.unwrap();
    let out = stdout_of(&mut p).await;
    assert_eq!(text(&out), format!("{}  -\n", sha256(&data)));
    client.shutdown().await;
    stop.cancel();
}

/// The connection dies while writes are in flight, several times: after each resume the
/// unanswered writes go again with their `writeId`, and the child receives every byte once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_in_flight_survive_a_killed_connection_exactly_once() {
    let (url, stop) = ws_server().await;
    // JSON writes (binary ones: tests/binary_input.rs).
    let opts = ClientOptions {
        binary_input: false,
        ..ClientOptions::default()
    };
    let client = Client::connect(Target::Ws(url), opts).await.unwrap();
    let data = pattern(24 << 20, 5);
    let mut p = client
        .start(start_opts("sum", &["sha256sum"]))
        .await
        .unwrap();
    let mut w = p.stdin_writer();
    for (i, piece) in data.chunks(STDIN_WRITE_BYTES).enumerate() {
        w.write(Bytes::copy_from_slice(piece)).await.unwrap();
        // With up to eight writes in flight, a kill every 20 writes cuts some of them off.
        if i % 20 == 10 {
            client.break_connection();
        }
    }
    w.finish().await.unwrap();
    let out = stdout_of(&mut p).await;
    assert_eq!(text(&out), format!("{}  -\n", sha256(&data)));
    assert!(
        client.connection_count() >= 5,
        "the connection was killed and resumed"
    );
    client.shutdown().await;
    stop.cancel();
}

/// A child that closes its stdin: the writer stops with the server's answer (`stdinClosed`),
/// not an error of its own, and never hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_that_takes_no_more_input_stops_the_writer() {
    let (url, stop) = ws_server().await;
    let client = Client::connect(
        Target::Ws(url),
        ClientOptions {
            ..ClientOptions::default()
        },
    )
    .await
    .unwrap();
    let p = client
        .start(start_opts(
            "closed",
            &["sh", "-c", "exec 0<&-; echo closed; exec sleep 60"],
        ))
        .await
        .unwrap();
    let mut w = p.stdin_writer();
    let refused = tokio::time::timeout(GUARD, async {
        loop {
            if let Err(e) = w.write(Bytes::from_static(b"ignored\n")).await {
                return e;
            }
            if let Err(e) = w.flush().await {
                return e;
            }
        }
    })
    .await
    .expect("the writer did not stop (hang guard)");
    match refused {
        StdinRefused::Status(s) => assert_eq!(s, "stdinClosed"),
        other => panic!("expected the server's answer, got {other}"),
    }
    p.terminate(None).await.unwrap();
    client.shutdown().await;
    stop.cancel();
}

/// A server with a small message limit: the writer cuts its writes to fit it once in base64
/// (a write of 256 KiB would be 341 KiB of JSON, a framing error that ends the connection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_fit_the_servers_message_limit() {
    let server = Server::new(Arc::new(ServerConfig {
        max_message_bytes: 128 * 1024,
        ..cfg()
    }))
    .expect("server starts");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    let stop = CancellationToken::new();
    tokio::spawn(server.run(vec![Listener::Ws(listener)], stop.clone()));
    let client = Client::connect(
        Target::Ws(url),
        ClientOptions {
            reconnect: false,
            // The JSON form is the one the message limit cuts (a binary write is one chunk).
            binary_input: false,
            ..ClientOptions::default()
        },
    )
    .await
    .unwrap();
    let data = pattern(3 << 20, 9);
    let mut p = client
        .start(start_opts("sum", &["sha256sum"]))
        .await
        .unwrap();
    let mut w = p.stdin_writer();
    w.write(Bytes::from(data.clone())).await.unwrap();
    w.finish().await.unwrap();
    let out = stdout_of(&mut p).await;
    assert_eq!(text(&out), format!("{}  -\n", sha256(&data)));
    assert_eq!(client.connection_count(), 1, "never a framing error");
    client.shutdown().await;
    stop.cancel();
}
