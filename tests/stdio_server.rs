//! `serve --listen stdio` on both kinds of standard streams: pipes (driven by the reactor) and
//! regular files (tokio's blocking adapters). The end of input is a half-close: every request
//! read before it is answered (long polls end at once), then the server exits.

use std::process::{Command, Stdio};

use serde_json::Value;

const REQUESTS: &str = concat!(
    r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"clientName":"t"}}"#,
    "\n",
    r#"{"jsonrpc":"2.0","method":"initialized","params":{}}"#,
    "\n",
    r#"{"jsonrpc":"2.0","id":2,"method":"no/such"}"#,
    "\n",
    r#"{"jsonrpc":"2.0","id":3,"method":"process/list","params":{}}"#,
    "\n",
    r#"{"jsonrpc":"2.0","id":4,"method":"process/start","params":{"processId":"p","argv":["sleep","30"]}}"#,
    "\n",
    // A long poll on a process that prints nothing: it must end when input ends, not in 60 s.
    r#"{"jsonrpc":"2.0","id":5,"method":"process/read","params":{"processId":"p","waitMs":60000}}"#,
    "\n",
);

/// The responses by id, from the server's whole stdout.
fn responses(out: &[u8]) -> Vec<(i64, Value)> {
    String::from_utf8_lossy(out)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("one JSON message per line"))
        .filter_map(|v| Some((v.get("id")?.as_i64()?, v)))
        .collect()
}

fn check(out: &[u8]) {
    let r = responses(out);
    let ids: Vec<i64> = r.iter().map(|(id, _)| *id).collect();
    // Every request read before the end of input is answered, each exactly once.
    let mut sorted = ids.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        vec![1, 2, 3, 4, 5],
        "{}",
        String::from_utf8_lossy(out)
    );
    let by_id = |id: i64| &r.iter().find(|(i, _)| *i == id).expect("answered").1;
    assert!(by_id(1)["result"]["sessionId"].is_string());
    assert_eq!(by_id(2)["error"]["code"], -32601);
    assert!(by_id(3)["result"]["processes"].is_array());
    assert!(by_id(4)["result"].is_object(), "{}", by_id(4));
    // The long poll is answered at once, saying why it ended early.
    assert_eq!(by_id(5)["error"]["code"], -32600, "{}", by_id(5));
    assert_eq!(by_id(5)["error"]["message"], "connection closed");
}

/// `execrelay serve --listen stdio` on the given standard streams, logs quiet.
fn spawn_server(stdin: Stdio, stdout: Stdio) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_execrelay"))
        .args(["serve", "--listen", "stdio"])
        .env("RUST_LOG", "warn")
        .stdin(stdin)
        .stdout(stdout)
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn")
}

#[test]
fn stdio_on_pipes() {
    use std::io::Write;
    let mut child = spawn_server(Stdio::piped(), Stdio::piped());
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(REQUESTS.as_bytes()).expect("write");
    drop(stdin); // end of input: the server answers what it read, then exits
    let out = child.wait_with_output().expect("wait");
    assert!(out.status.success(), "{:?}", out.status);
    check(&out.stdout);
}

#[test]
fn stdio_on_regular_files() {
    let dir = std::env::temp_dir().join(format!("execrelay-stdio-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let input = dir.join("in");
    let output = dir.join("out");
    std::fs::write(&input, REQUESTS).expect("write input");
    let status = spawn_server(
        std::fs::File::open(&input).expect("open input").into(),
        std::fs::File::create(&output)
            .expect("create output")
            .into(),
    )
    .wait()
    .expect("run");
    assert!(status.success(), "{status:?}");
    check(&std::fs::read(&output).expect("read output"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A request that cannot finish after the end of input (a write to a child that never reads
/// its stdin) holds the connection for `HALF_CLOSE_DRAIN_TIMEOUT`, no longer.
#[tokio::test(start_paused = true)]
async fn a_request_stuck_after_end_of_input_is_abandoned_at_the_drain_timeout() {
    use std::sync::Arc;

    use base64::Engine;
    use execrelay::config::ServerConfig;
    use execrelay::connection::{
        ConnectionEnd, ConnectionOptions, ConnectionProcessor, HALF_CLOSE_DRAIN_TIMEOUT,
    };
    use execrelay::metrics::Metrics;
    use execrelay::session::SessionRegistry;
    use execrelay::transport::stdio::line_transport;
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    use tokio_util::sync::CancellationToken;

    let config = ServerConfig::default();
    let containment = execrelay::server::start_containment(&config).expect("containment starts");
    let registry = SessionRegistry::new(Arc::new(config), Arc::new(Metrics::new()), containment);
    let (client, server) = tokio::io::duplex(8 << 20);
    let (sr, sw) = tokio::io::split(server);
    let transport = line_transport(sr, sw, ServerConfig::default().max_message_bytes, "test");
    let opts = ConnectionOptions {
        close_session_on_end: true,
        answer_after_eof: true,
        ..ConnectionOptions::default()
    };
    let conn = tokio::spawn(ConnectionProcessor::run(
        transport,
        registry,
        opts,
        CancellationToken::new(),
    ));
    let (cr, mut cw) = tokio::io::split(client);
    // 4 MiB to a child that never reads: far more than a pipe holds.
    let chunk = base64::engine::general_purpose::STANDARD.encode(vec![b'x'; 4 << 20]);
    let requests = [
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"clientName":"t"}}"#.to_string(),
        r#"{"jsonrpc":"2.0","method":"initialized","params":{}}"#.to_string(),
        r#"{"jsonrpc":"2.0","id":2,"method":"process/start","params":{"processId":"p","argv":["sleep","30"],"pipeStdin":true}}"#.to_string(),
        format!(r#"{{"jsonrpc":"2.0","id":3,"method":"process/write","params":{{"processId":"p","chunk":"{chunk}"}}}}"#),
    ];
    let mut lines = BufReader::new(cr).lines();
    for r in &requests[..3] {
        cw.write_all(format!("{r}\n").as_bytes()).await.unwrap();
    }
    // Wait for the start's answer, so the write surely reaches a running child.
    loop {
        let l = lines.next_line().await.unwrap().expect("answer to start");
        if l.contains(r#""id":2"#) {
            assert!(l.contains(r#""result""#), "{l}");
            break;
        }
    }
    cw.write_all(format!("{}\n", requests[3]).as_bytes())
        .await
        .unwrap();
    let t0 = tokio::time::Instant::now();
    cw.shutdown().await.unwrap(); // end of input
    let end = conn.await.unwrap();
    assert_eq!(end, ConnectionEnd::PeerClosed);
    let waited = t0.elapsed();
    assert!(
        waited >= HALF_CLOSE_DRAIN_TIMEOUT,
        "gave up after {waited:?}, before the drain timeout"
    );
}

/// SIGTERM to a stdio server: its processes are terminated and their exit notices still reach
/// the client before the server exits.
#[test]
fn sigterm_delivers_exit_notices_before_exiting() {
    use std::io::{BufRead, BufReader, Write};
    let mut child = spawn_server(Stdio::piped(), Stdio::piped());
    let mut stdin = child.stdin.take().expect("stdin");
    let requests = concat!(
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"clientName":"t"}}"#,
        "\n",
        r#"{"jsonrpc":"2.0","method":"initialized","params":{}}"#,
        "\n",
        r#"{"jsonrpc":"2.0","id":2,"method":"process/start","params":{"processId":"p","argv":["sleep","30"]}}"#,
        "\n",
    );
    stdin.write_all(requests.as_bytes()).expect("write");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            out.read_line(&mut line).expect("read") > 0,
            "server ended early"
        );
        if line.contains(r#""id":2"#) {
            assert!(line.contains(r#""result""#), "{line}");
            break;
        }
    }
    // Input stays open: the signal alone ends the server.
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("kill");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).expect("read rest");
    let exited: Vec<Value> = rest
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["method"] == "process/exited")
        .collect();
    assert_eq!(exited.len(), 1, "one exit notice, got:\n{rest}");
    assert_eq!(exited[0]["params"]["processId"], "p");
    assert_eq!(exited[0]["params"]["signal"], "SIGTERM", "{}", exited[0]);
    let status = child.wait().expect("wait");
    assert!(status.success(), "{status:?}");
    drop(stdin);
}

/// Registering a pipe with the reactor sets O_NONBLOCK on the pipe's shared description; the
/// server puts the flags back, so a process that shares the pipe after it is not surprised.
#[test]
fn pipe_flags_are_restored_on_exit() {
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;

    use nix::fcntl::{fcntl, FcntlArg, OFlag};

    let nonblocking = |fd: &std::os::fd::OwnedFd| {
        let bits = fcntl(fd.as_raw_fd(), FcntlArg::F_GETFL).expect("F_GETFL");
        OFlag::from_bits_truncate(bits).contains(OFlag::O_NONBLOCK)
    };
    // Close-on-exec, so that the server inherits only the ends it is given.
    let (in_r, in_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).expect("pipe");
    let (out_r, out_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).expect("pipe");
    // Our own references to the very descriptions the server gets as stdin and stdout.
    let shared_in = in_r.try_clone().expect("dup");
    let shared_out = out_w.try_clone().expect("dup");
    let mut child = spawn_server(Stdio::from(in_r), Stdio::from(out_w));
    let mut input = std::fs::File::from(in_w);
    input.write_all(REQUESTS.as_bytes()).expect("write");
    drop(input);
    // Answers are a few KiB: they fit in the pipe, so reading can wait for the exit.
    let status = child.wait().expect("wait");
    assert!(status.success(), "{status:?}");
    assert!(!nonblocking(&shared_in), "stdin's pipe left non-blocking");
    assert!(!nonblocking(&shared_out), "stdout's pipe left non-blocking");
    // The server did answer through them.
    drop(shared_out);
    let mut out = Vec::new();
    std::fs::File::from(out_r)
        .read_to_end(&mut out)
        .expect("read");
    check(&out);
}
