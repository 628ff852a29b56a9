//! The client's silence watch (`client/silence.rs`) asks about a quiet process with
//! `process/read`, and takes an unanswered question for a wedged connection. A read waits
//! behind the process's exclusive requests on the server (`protocol.md` §6), so a process with
//! one of them still on the wire is not asked about, however that request's caller went
//! away: a child that leaves its stdin unread, a write future dropped, a writer dropped or
//! stopped on an error never get a healthy connection closed.
//!
//! Every wait is on a message or on the server's counters (the quiet process's answers count
//! the watch's rounds), under a hang guard.

mod common;
use common::fifo::{make_fifo, release};
use common::noise::pattern;
use common::ws_server::{held_sha256sum, sha256sum_of_all, WsServer};
use common::*;

use std::time::Duration;

use execrelay::client::{
    Client, ClientOptions, ProcessEvent, ProcessHandle, StartOptions, StdinRefused, StdinWriter,
};

/// A watch that asks after 50 ms of silence and gives up after 200 ms.
fn impatient() -> ClientOptions {
    ClientOptions {
        silence_probe: Some(Duration::from_millis(50)),
        probe_reply_timeout: Duration::from_millis(200),
        ..ClientOptions::default()
    }
}

/// An impatient client of a fresh server with two processes: `quiet` (asked about round
/// after round: its answers count the watch's rounds) and `held`, whose child reads nothing
/// until `fifo` is released and then hashes its stdin.
struct Held {
    server: WsServer,
    client: Client,
    quiet: ProcessHandle,
    held: ProcessHandle,
    fifo: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Held {
    async fn start() -> Held {
        let server = WsServer::start(cfg()).await;
        let dir = tempfile::tempdir().unwrap();
        let fifo = make_fifo(dir.path());
        let client = server.client(impatient()).await;
        let quiet = client
            .start(StartOptions::new("quiet", ["sleep", "60"]))
            .await
            .expect("start the quiet process");
        let mut start = StartOptions::new("held", held_sha256sum(&fifo));
        start.params.pipe_stdin = true;
        let held = client.start(start).await.expect("start");
        Held {
            server,
            client,
            quiet,
            held,
            fifo,
            _dir: dir,
        }
    }

    /// Two pieces of input for `held` (from `seed`) through a writer: the first fills the
    /// pipe, the second waits at the server until the child reads (a signal's answer, read by
    /// the server after both, says it has them). Returns the writer and the input.
    async fn two_writes_held(&self, seed: u64) -> (StdinWriter, Vec<u8>) {
        let mut w = self.held.stdin_writer();
        let piece = w.piece_bytes().await.expect("piece size");
        let input = pattern(2 * piece, seed);
        w.write(bytes::Bytes::from(input.clone()))
            .await
            .expect("queued");
        self.held
            .signal("SIGCONT")
            .await
            .expect("a round trip behind the writes");
        (w, input)
    }

    /// Many rounds of the watch go by, and the client is still on its first connection.
    async fn many_rounds_on_one_connection(&self, why: &str) {
        answered_more(
            &self.server.registry,
            20,
            "twenty rounds of the silence watch",
        )
        .await;
        assert_eq!(self.client.connection_count(), 1, "{why}");
    }

    /// Release the child, check it hashed `input`, and stop everything.
    async fn finish(mut self, input: &[u8], what: &str) {
        sha256sum_of_all(&mut self.held, input, what).await;
        assert_eq!(self.client.connection_count(), 1);
        self.quiet.terminate(None).await.expect("terminate");
        let _ = stdout_and_code(&mut self.quiet).await;
        self.client.shutdown().await;
        self.server.stop().await;
    }
}

/// A child that leaves its stdin unread does not get its client's connection closed: the
/// silence watch does not ask about a process whose write is in flight (a `process/read`
/// would wait behind the write, `protocol.md` §6, and the watch would take the connection
/// for wedged). Another, quiet process is asked about meanwhile, round after round; once its
/// answers show many rounds went by, the client is still on its first connection, and the
/// held upload then arrives whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_that_leaves_its_stdin_unread_keeps_its_connection() {
    let t = Held::start().await;
    let (w, input) = t.two_writes_held(5).await;
    t.many_rounds_on_one_connection(
        "the connection was taken for wedged while the child left its stdin unread",
    )
    .await;
    release(&t.fifo).await;
    w.finish()
        .await
        .expect("every write delivered, stdin closed");
    t.finish(&input, "every byte once, in order").await;
}

/// Red team F3: the writes of a writer dropped while the server still holds them (the child
/// leaves its stdin unread) stay counted, by the connection, until they are answered: the
/// watch does not ask about the process meanwhile. Before, the count fell with the writer,
/// the read queued behind the held write and the connection was closed after 200 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_of_a_dropped_writer_still_held_by_the_server_keep_the_connection() {
    let t = Held::start().await;
    let (w, input) = t.two_writes_held(7).await;
    drop(w);
    t.many_rounds_on_one_connection(
        "the connection was taken for wedged behind a dropped writer's write",
    )
    .await;
    release(&t.fifo).await;
    t.held
        .close_stdin()
        .await
        .expect("stdin closed after the writes");
    t.finish(&input, "every write sent before the drop, once, in order")
        .await;
}

/// Red team F3, for one write: a `ProcessController::write` whose caller stopped waiting
/// (its future dropped) while the server holds the write is still counted until answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_write_call_still_held_by_the_server_keeps_the_connection() {
    let t = Held::start().await;
    // More than a pipe holds: the write waits at the server until the child reads.
    let input = pattern(256 * 1024, 9);
    let control = t.held.controller();
    let data = input.clone();
    let write = tokio::spawn(async move { control.write(&data, "w-1").await });
    // The server holds it, charged to its budget, while the pipe is full.
    let budget = t.server.registry.inbound_budget().clone();
    eventually("the write held by the server", || budget.used() > 0).await;
    write.abort();
    assert!(
        write.await.is_err_and(|e| e.is_cancelled()),
        "dropped unanswered"
    );
    t.many_rounds_on_one_connection(
        "the connection was taken for wedged behind a dropped write call",
    )
    .await;
    release(&t.fifo).await;
    t.held.close_stdin().await.expect("stdin closed");
    t.finish(&input, "the dropped call's write, applied once")
        .await;
}

/// Red team F4: a writer that stopped on an error (the child closed its stdin) keeps nothing:
/// it answers every later call with the same error, and the watch asks about the process
/// again (before, the writes behind the refused one stayed counted until the writer was
/// dropped, and a process whose output then stopped was never asked about).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_stopped_on_an_error_holds_nothing_back() {
    let server = WsServer::start(cfg()).await;
    let client = server.client(impatient()).await;
    let mut start = StartOptions::new(
        "closed",
        ["sh", "-c", "exec 0<&-; echo ready; exec sleep 60"],
    );
    start.params.pipe_stdin = true;
    let mut p = client.start(start).await.expect("start");
    let mut w = p.stdin_writer();
    match tokio::time::timeout(GUARD, p.next_event()).await {
        Ok(Some(ProcessEvent::Output { data, .. })) => assert_eq!(&data[..], b"ready\n"),
        other => panic!("expected \"ready\": {other:?}"),
    }
    // Several writes in flight, each refused: the first answer stops the writer.
    for i in 0..4u8 {
        w.write(bytes::Bytes::from(vec![i; 10]))
            .await
            .expect("queued behind the others");
    }
    let e = w.flush().await.expect_err("stdin is closed");
    assert!(
        matches!(&e, StdinRefused::Status(s) if s == "stdinClosed"),
        "{e}"
    );
    let again = w
        .write(bytes::Bytes::from_static(b"more"))
        .await
        .expect_err("stopped");
    assert_eq!(
        again.to_string(),
        e.to_string(),
        "the same error, nothing sent"
    );
    // With nothing of its own in flight, the quiet process is asked about again. The server
    // answers nothing else now but the three writes left (their answers may still be on the
    // way): ten more answers are the watch's questions.
    answered_more(&server.registry, 10, "the watch asks about the process").await;
    assert_eq!(client.connection_count(), 1);
    p.terminate(None).await.expect("terminate");
    let _ = stdout_and_code(&mut p).await;
    drop(w);
    client.shutdown().await;
    server.stop().await;
}
