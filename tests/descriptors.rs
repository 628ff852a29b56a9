//! File descriptors, on the built binary started under a lowered
//! `RLIMIT_NOFILE`: the soft limit is raised to the hard one at start; one client's processes
//! (capped by its address's quota) and connections (refused below the descriptor reserve)
//! leave another client's spawn alone; a spawn that runs out of descriptors is a clear
//! `-32007` (`what: "other"`, `errno: "EMFILE"`) and leaves no entry behind.

mod common;
use common::binary::*;
use common::*;

use std::path::Path;

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::net::{TcpSocket, TcpStream};
use tokio::process::Child;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use execrelay::transport::websocket::framed;

/// `execrelay serve --listen ws://127.0.0.1:0 ARGS` with `RLIMIT_NOFILE` = (`soft`, `hard`),
/// its stderr in `log`; the child, its `host:port` and its stdout (kept open).
async fn serve_limited(
    soft: u64,
    hard: u64,
    args: &[&str],
    log: &Path,
) -> (Child, String, impl Sized) {
    let mut cmd = serve_cmd("ws://127.0.0.1:0", std::fs::File::create(log).unwrap());
    cmd.args(args).env("RUST_LOG", "info");
    // SAFETY: `setrlimit` is async-signal-safe and touches nothing of the parent's state.
    unsafe {
        cmd.pre_exec(move || {
            let limit = libc::rlimit {
                rlim_cur: soft,
                rlim_max: hard,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().expect("spawn execrelay serve");
    let (url, lines) = first_line(&mut child, PROMPT).await;
    let url = url.unwrap_or_else(|| {
        panic!(
            "serve exited without a URL: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        )
    });
    let addr = url.trim_start_matches("ws://").to_string();
    (child, addr, lines)
}

/// This process's hard limit of open files (the most a child can be given).
fn our_hard_limit() -> u64 {
    execrelay::bounds::descriptors::nofile_limit().unwrap().hard
}

/// A WebSocket to `addr` from the local address `source`.
async fn websocket_from(source: &str, addr: &str) -> WebSocketStream<TcpStream> {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
    let tcp = tokio::time::timeout(PROMPT, socket.connect(addr.parse().unwrap()))
        .await
        .expect("connect (hang guard)")
        .expect("connect");
    let (ws, _) = tokio::time::timeout(
        PROMPT,
        tokio_tungstenite::client_async(format!("ws://{addr}/"), tcp),
    )
    .await
    .expect("upgrade (hang guard)")
    .expect("upgrade");
    ws
}

/// A JSON-RPC client from `source` that went through `initialize`.
async fn client_from(source: &str, addr: &str) -> RawClient {
    let ws = websocket_from(source, addr).await;
    let mut c = ws_client(framed(
        ws,
        execrelay_protocol::websocket::Role::Client,
        1 << 24,
        addr.to_string(),
    ));
    c.handshake().await;
    c
}

/// Whether a new connection from `source` is served: it gets an answer, or is closed at once
/// with `1013` (the descriptor reserve); the connection is kept open in `kept` when served.
async fn try_connection(
    source: &str,
    addr: &str,
    kept: &mut Vec<WebSocketStream<TcpStream>>,
) -> bool {
    let mut ws = websocket_from(source, addr).await;
    let probe = json!({"jsonrpc": "2.0", "id": 1, "method": "server/info"});
    ws.send(Message::Text(probe.to_string().into()))
        .await
        .unwrap();
    let m = tokio::time::timeout(PROMPT, ws.next())
        .await
        .expect("an answer or a close (hang guard)");
    match m {
        Some(Ok(Message::Text(_))) => {
            kept.push(ws);
            true
        }
        Some(Ok(Message::Close(Some(frame)))) => {
            assert_eq!(frame.code, CloseCode::Again, "{frame:?}");
            assert!(frame.reason.contains("file descriptors"), "{frame:?}");
            false
        }
        other => panic!("neither an answer nor a 1013 close: {other:?}"),
    }
}

fn open_files_limit(pid: u32) -> (u64, u64) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("a Max open files line");
    let nums: Vec<u64> = line
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    (nums[0], nums[1])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_soft_limit_is_raised_to_the_hard_limit_at_start() {
    let hard = our_hard_limit().min(4096);
    let soft = hard / 2;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("serve.log");
    let (child, _addr, _out) =
        serve_limited(soft, hard, &["--descriptor-reserve", "16"], &log).await;
    let pid = child.id().unwrap();
    assert_eq!(open_files_limit(pid), (hard, hard));
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(
        log.contains(&format!("soft limit raised from {soft} to {hard}")),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_not_above_the_reserve_is_refused_at_start() {
    let mut cmd = serve_cmd("ws://127.0.0.1:0", std::process::Stdio::piped());
    cmd.args(["--descriptor-reserve", "100"]);
    // SAFETY: as above.
    unsafe {
        cmd.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 100,
                rlim_max: 100,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = output_of(&mut cmd).await;
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("is not above --descriptor-reserve (100)"),
        "{err}"
    );
}

fn sleeper(id: &str) -> Value {
    json!({"processId": id, "argv": ["sleep", "1000"], "pipeStdin": true})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_clients_processes_and_connections_leave_another_clients_spawn_alone() {
    const LIMIT: u64 = 200;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("serve.log");
    let (_child, addr, _out) = serve_limited(
        LIMIT,
        LIMIT,
        &[
            "--descriptor-reserve",
            "48",
            "--max-processes-per-address",
            "10",
        ],
        &log,
    )
    .await;
    // B is connected before A starts.
    let mut b = client_from("127.0.0.2", &addr).await;
    let mut a = client_from("127.0.0.1", &addr).await;
    for i in 0..10 {
        a.start(sleeper(&format!("a{i}"))).await;
    }
    let e = a.call_err("process/start", sleeper("a10")).await;
    assert_eq!(e["code"], -32004, "{e}");
    assert_eq!(e["data"]["limit"], "maxProcessesPerAddress", "{e}");
    // A opens connections until the reserve refuses one.
    let mut kept = Vec::new();
    let mut refused = false;
    for _ in 0..LIMIT {
        if !try_connection("127.0.0.1", &addr, &mut kept).await {
            refused = true;
            break;
        }
    }
    assert!(refused, "{} connections and no refusal", kept.len());
    assert!(
        !kept.is_empty(),
        "connections were admitted until the reserve"
    );
    // B's spawn still works.
    let done = b
        .run(json!({"processId": "b", "argv": ["sh", "-c", "echo hi"]}))
        .await;
    assert_eq!(text(&done.stdout), "hi\n");
    assert_eq!(done.exit["exitCode"], 0);
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(log.contains("connection refused"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spawn_out_of_descriptors_is_a_clear_error_and_leaves_no_entry() {
    const LIMIT: u64 = 64;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("serve.log");
    let (_child, addr, _out) =
        serve_limited(LIMIT, LIMIT, &["--descriptor-reserve", "8"], &log).await;
    let mut c = client_from("127.0.0.1", &addr).await;
    let quiet = |id: &str| json!({"processId": id, "argv": ["sleep", "1000"]});
    let mut started = Vec::new();
    let failed = loop {
        let id = format!("p{}", started.len());
        let id_ = c.request("process/start", quiet(&id)).await;
        let r = c.response(id_).await;
        match r.get("error") {
            None => started.push(id),
            Some(e) => {
                assert_eq!(e["code"], -32007, "{e}");
                assert_eq!(e["data"]["what"], "other", "{e}");
                assert_eq!(e["data"]["errno"], "EMFILE", "{e}");
                let msg = e["message"].as_str().unwrap();
                assert!(
                    msg.starts_with(
                        "cannot start \"sleep\": the server is out of file descriptors"
                    ),
                    "{msg}"
                );
                break id;
            }
        }
        assert!((started.len() as u64) < LIMIT, "no spawn failed");
    };
    let list = c.call("process/list", json!({})).await;
    let ids: Vec<&str> = list["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["processId"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), started.len(), "{list}");
    assert!(
        !ids.contains(&failed.as_str()),
        "no entry for the failed spawn"
    );
    // Freeing some descriptors lets the same id start: nothing of it was left behind.
    let freed: Vec<&str> = started.iter().take(4).map(String::as_str).collect();
    for id in &freed {
        c.terminate(id, Some(0)).await;
    }
    c.collect_all(&freed).await;
    c.start(quiet(&failed)).await;
}
