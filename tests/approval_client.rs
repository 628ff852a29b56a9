//! Approvals end to end (`protocol.md` §7): the client library's `ApprovalHandler` over
//! WebSocket and over Noise (the same test bodies for both: approve runs the process, deny
//! is `-32006` with nothing spawned, a client without a handler gets denials), and a
//! connection dropped while the handler decides (asked once, answered on the resumed
//! connection, the process runs once). The built binary's side is `approval_cli.rs`.

mod common;
use common::process::{exec_done, running_with_arg};
use common::*;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use execrelay::client::{
    ApprovalDecision, ApproveParams, Client, ClientError, ClientOptions, ProcessEvent,
    StartOptions, Target,
};
use execrelay::config::ServerConfig;
use execrelay::policy::PolicyFile;
use execrelay::server::{Listener, Server};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

/// Asks about `sleep` and `echo`; the rest is allowed.
const POLICY: &str = r#"
default = "allow"
[[rule]]
program = "sleep"
action = "ask"
reason = "sleeps"
[[rule]]
program = "echo"
action = "ask"
"#;

fn policy_file(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("policy.toml");
    std::fs::write(&path, POLICY).unwrap();
    path
}

fn loaded(dir: &Path) -> Option<Arc<PolicyFile>> {
    Some(Arc::new(PolicyFile::load(&policy_file(dir)).unwrap()))
}

/// A `sleep` argument no other process has.
fn marker(tag: u32) -> String {
    format!("{}.{:03}", 4000 + tag, std::process::id() % 1000)
}

/// A handler approving process ids that start with `yes`, telling `calls` of every request.
fn handler_by_id(calls: mpsc::UnboundedSender<ApproveParams>) -> ClientOptions {
    ClientOptions {
        approval_handler: Some(Arc::new(move |req: ApproveParams| {
            let _ = calls.send(req.clone());
            async move {
                if req.process_id.starts_with("yes") {
                    ApprovalDecision::Approve
                } else {
                    ApprovalDecision::Deny
                }
            }
        })),
        ..ClientOptions::default()
    }
}

/// The exit notice of `p` (terminating it first when `kill`).
async fn exit_of(p: &mut execrelay::client::ProcessHandle, kill: bool) -> ProcessEvent {
    if kill {
        p.terminate(Some(Duration::ZERO)).await.unwrap();
    }
    loop {
        let ev = tokio::time::timeout(GUARD, p.next_event())
            .await
            .expect("no exit notice (hang guard)")
            .expect("event stream ended");
        if matches!(ev, ProcessEvent::Exited(_)) {
            return ev;
        }
    }
}

/// The body shared by every transport: approve runs the process, deny spawns nothing, a
/// client without a handler is denied without being asked.
async fn approve_deny_and_no_handler(target: Target, tag: u32) {
    let (calls_tx, mut calls) = mpsc::unbounded_channel();
    let client = Client::connect(target.clone(), handler_by_id(calls_tx))
        .await
        .unwrap();
    let yes = marker(tag);
    let mut p = client
        .start(StartOptions::new("yes-1", ["sleep", yes.as_str()]))
        .await
        .expect("approved");
    let req = calls.recv().await.unwrap();
    assert_eq!(req.process_id, "yes-1");
    assert_eq!(req.argv, ["sleep", yes.as_str()]);
    assert_eq!(req.rule, "sleeps");
    exec_done(p.pid as i32).await;
    assert_eq!(running_with_arg(&yes), vec![p.pid as i32]);
    assert!(matches!(
        exit_of(&mut p, true).await,
        ProcessEvent::Exited(_)
    ));

    let no = marker(tag + 1);
    let e = client
        .start(StartOptions::new("no-1", ["sleep", no.as_str()]))
        .await
        .err()
        .expect("denied");
    match e {
        ClientError::Rpc { code, data, .. } => {
            assert_eq!(code, -32006);
            assert_eq!(data.unwrap()["reason"], "denied by the client");
        }
        other => panic!("{other:?}"),
    }
    assert!(running_with_arg(&no).is_empty(), "a denial spawns nothing");
    assert_eq!(calls.recv().await.unwrap().process_id, "no-1");
    client.shutdown().await;

    let plain = Client::connect(target, ClientOptions::default())
        .await
        .unwrap();
    let e = plain
        .start(StartOptions::new("yes-2", ["sleep", no.as_str()]))
        .await
        .err()
        .expect("denied without a handler");
    assert_eq!(e.code(), Some(-32006));
    assert!(calls.try_recv().is_err(), "nobody was asked");
    assert!(running_with_arg(&no).is_empty());
    // Allowed programs still run.
    let mut p = plain.start(StartOptions::new("t", ["true"])).await.unwrap();
    assert!(matches!(
        exit_of(&mut p, false).await,
        ProcessEvent::Exited(_)
    ));
    plain.shutdown().await;
}

/// A `ws://` server with `policy`.
async fn ws_server(policy: Option<Arc<PolicyFile>>) -> (String, CancellationToken) {
    let server =
        Server::with_exec_policy(Arc::new(ServerConfig::default()), policy).expect("server starts");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    let stop = CancellationToken::new();
    tokio::spawn(server.run(vec![Listener::Ws(listener)], stop.clone()));
    (url, stop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_websocket_approve_runs_deny_spawns_nothing_and_no_handler_is_denied() {
    let dir = tempfile::tempdir().unwrap();
    let (url, stop) = ws_server(loaded(dir.path())).await;
    approve_deny_and_no_handler(Target::Ws(url), 10).await;
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_noise_approve_runs_deny_spawns_nothing_and_no_handler_is_denied() {
    use common::noise::{start_server_on, TestAuth, Verdict};
    let dir = tempfile::tempdir().unwrap();
    let key = execrelay::noise::keys::Keypair::generate().unwrap();
    let (auth, _) = TestAuth::new(&[(&key, Verdict::Allow)]);
    let server = Server::with_exec_policy(Arc::new(ServerConfig::default()), loaded(dir.path()))
        .expect("server starts");
    let srv = start_server_on(server, auth).await;
    approve_deny_and_no_handler(srv.target(&key), 20).await;
    srv.stop().await;
}

/// A handler that tells `calls` of every request and approves once `gate` opens.
fn approve_when_open(
    calls: mpsc::UnboundedSender<ApproveParams>,
    gate: watch::Receiver<bool>,
) -> Arc<dyn execrelay::client::ApprovalHandler> {
    Arc::new(move |req: ApproveParams| {
        let _ = calls.send(req);
        let mut gate = gate.clone();
        async move {
            let _ = gate.wait_for(|open| *open).await;
            ApprovalDecision::Approve
        }
    })
}

/// `sleep ARG` started as `asked` (its policy asks), on a task: the start waits for the answer.
fn start_asked(
    client: &Client,
    arg: &str,
) -> tokio::task::JoinHandle<Result<execrelay::client::ProcessHandle, ClientError>> {
    let client = client.clone();
    let arg = arg.to_string();
    tokio::spawn(async move {
        client
            .start(StartOptions::new("asked", ["sleep", arg.as_str()]))
            .await
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_lost_while_the_handler_decides_is_answered_once_after_the_resume() {
    let dir = tempfile::tempdir().unwrap();
    let (url, stop) = ws_server(loaded(dir.path())).await;
    let (calls_tx, mut calls) = mpsc::unbounded_channel::<ApproveParams>();
    let (gate_tx, gate) = watch::channel(false);
    let opts = ClientOptions {
        approval_handler: Some(approve_when_open(calls_tx, gate)),
        ..ClientOptions::default()
    };
    let client = Client::connect(Target::Ws(url), opts).await.unwrap();
    let arg = marker(30);
    let start = start_asked(&client, &arg);
    tokio::time::timeout(GUARD, calls.recv())
        .await
        .expect("the handler is asked (hang guard)")
        .unwrap();
    client.break_connection();
    eventually("the client resumed", || client.connection_count() == 2).await;
    let _ = gate_tx.send(true);
    let mut p = tokio::time::timeout(GUARD, start)
        .await
        .expect("the start finishes (hang guard)")
        .unwrap()
        .expect("approved after the resume");
    exec_done(p.pid as i32).await;
    assert!(
        calls.try_recv().is_err(),
        "asked once for the re-sent request"
    );
    assert_eq!(
        running_with_arg(&arg),
        vec![p.pid as i32],
        "runs exactly once"
    );
    assert!(matches!(
        exit_of(&mut p, true).await,
        ProcessEvent::Exited(_)
    ));
    client.shutdown().await;
    stop.cancel();
}

/// A person who takes long to answer does not cost the client its connection: the silence
/// watch does not ask about a process whose start is still waiting (a `process/read` would
/// wait behind the start, `protocol.md` §6, and the watch would take the connection for
/// wedged, so the question would be asked again on a new one). Another, quiet process is asked
/// about meanwhile, round after round; once its answers show many rounds went by, the client
/// is still on its first connection and was asked once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_answer_keeps_the_connection() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::with_exec_policy(Arc::new(ServerConfig::default()), loaded(dir.path()))
        .expect("server starts");
    let registry = server.registry().clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    let stop = CancellationToken::new();
    tokio::spawn(server.run(vec![Listener::Ws(listener)], stop.clone()));
    let (calls_tx, mut calls) = mpsc::unbounded_channel::<ApproveParams>();
    let (gate_tx, gate) = watch::channel(false);
    let opts = ClientOptions {
        approval_handler: Some(approve_when_open(calls_tx, gate)),
        silence_probe: Some(Duration::from_millis(50)),
        probe_reply_timeout: Duration::from_millis(200),
        ..ClientOptions::default()
    };
    let client = Client::connect(Target::Ws(url), opts).await.unwrap();
    let mut quiet = client
        .start(StartOptions::new("quiet", ["tail", "-f", "/dev/null"]))
        .await
        .expect("start the quiet process");
    let arg = marker(40);
    let start = start_asked(&client, &arg);
    tokio::time::timeout(GUARD, calls.recv())
        .await
        .expect("the handler is asked (hang guard)")
        .unwrap();
    answered_more(&registry, 20, "twenty rounds of the silence watch").await;
    assert_eq!(
        client.connection_count(),
        1,
        "the connection was taken for wedged while the person decided"
    );
    let _ = gate_tx.send(true);
    let mut p = tokio::time::timeout(GUARD, start)
        .await
        .expect("the start finishes (hang guard)")
        .unwrap()
        .expect("approved");
    assert!(
        calls.try_recv().is_err(),
        "asked once, on the first connection"
    );
    assert_eq!(client.connection_count(), 1);
    for proc in [&mut p, &mut quiet] {
        assert!(matches!(exit_of(proc, true).await, ProcessEvent::Exited(_)));
    }
    client.shutdown().await;
    stop.cancel();
}

// ---------------------------------------------------------------------------------------------
// The built binary.
