//! The client library's behaviour, the same over a remote server (plain WebSocket) and over
//! the in-process one (`Client::in_process`): one test body each, run against both targets
//! by [`over_both!`], so the in-process transport is held to exactly what the WebSocket one
//! does (methods, events, errors, ordering).

mod common;
use common::*;

use std::sync::Arc;
use std::time::Duration;

use execrelay::client::{
    ApprovalDecision, ApproveParams, Client, ClientError, ClientOptions, InProcessConfig,
    ProcessEvent, ProcessHandle, StartOptions, Target,
};
use execrelay::config::ServerConfig;
use execrelay::policy::PolicyFile;
use execrelay::rpc::messages::{StreamName, TermSize};
use execrelay::server::{Listener, Server};
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// Where the server runs.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Ws,
    InProcess,
}

/// A connected client and what to stop afterwards.
struct Harness {
    client: Client,
    stop: Option<CancellationToken>,
}

impl Harness {
    async fn connect(kind: Kind, policy: Option<Arc<PolicyFile>>, opts: ClientOptions) -> Harness {
        match kind {
            Kind::Ws => {
                let server = Server::with_exec_policy(Arc::new(ServerConfig::default()), policy)
                    .expect("server starts");
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                let url = format!("ws://{}", listener.local_addr().unwrap());
                let stop = CancellationToken::new();
                tokio::spawn(server.run(vec![Listener::Ws(listener)], stop.clone()));
                let client = Client::connect(Target::Ws(url), opts).await.unwrap();
                Harness {
                    client,
                    stop: Some(stop),
                }
            }
            Kind::InProcess => {
                let config = InProcessConfig {
                    policy,
                    ..InProcessConfig::default()
                };
                let client = Client::in_process(config, opts).await.unwrap();
                Harness { client, stop: None }
            }
        }
    }

    async fn plain(kind: Kind) -> Harness {
        Self::connect(kind, None, ClientOptions::default()).await
    }

    async fn done(self) {
        self.client.shutdown().await;
        if let Some(stop) = self.stop {
            stop.cancel();
        }
    }
}

/// Everything a process produced, through its exit notice.
#[derive(Default, Debug)]
struct Seen {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    pty: Vec<u8>,
    exit: Option<execrelay::rpc::messages::ExitInfo>,
}

async fn collect(p: &mut ProcessHandle) -> Seen {
    let mut seen = Seen::default();
    loop {
        let ev = tokio::time::timeout(GUARD, p.next_event())
            .await
            .expect("no event (hang guard)")
            .expect("the event stream ended before the exit notice");
        match ev {
            ProcessEvent::Output { stream, data } => match stream {
                StreamName::Stdout => seen.stdout.extend_from_slice(&data),
                StreamName::Stderr => seen.stderr.extend_from_slice(&data),
                StreamName::Pty => seen.pty.extend_from_slice(&data),
            },
            ProcessEvent::Lost { from, to } => panic!("lost {from}..={to}"),
            ProcessEvent::Omitted { .. } => panic!("no cap was asked for"),
            ProcessEvent::Exited(info) => {
                seen.exit = Some(info);
                return seen;
            }
        }
    }
}

async fn run(c: &Client, opts: StartOptions) -> Seen {
    let mut p = c.start(opts).await.expect("start");
    collect(&mut p).await
}

// ---------------------------------------------------------------------------------------------
// The bodies.

async fn streams_and_exit_code(kind: Kind) {
    let h = Harness::plain(kind).await;
    let seen = run(
        &h.client,
        StartOptions::new("p", ["sh", "-c", "echo out; echo err >&2; exit 3"]),
    )
    .await;
    assert_eq!(text(&seen.stdout), "out\n");
    assert_eq!(text(&seen.stderr), "err\n");
    let exit = seen.exit.unwrap();
    assert_eq!(exit.exit_code, Some(3));
    assert_eq!(exit.signal, None);
    assert_eq!(exit.stdout_bytes, 4);
    h.done().await;
}

async fn death_by_signal_is_reported_by_name(kind: Kind) {
    let h = Harness::plain(kind).await;
    let seen = run(
        &h.client,
        StartOptions::new("p", ["sh", "-c", "kill -KILL $$"]),
    )
    .await;
    let exit = seen.exit.unwrap();
    assert_eq!(exit.exit_code, None);
    assert_eq!(exit.signal.as_deref(), Some("SIGKILL"));
    h.done().await;
}

async fn output_arrives_whole_and_in_order(kind: Kind) {
    let h = Harness::plain(kind).await;
    let seen = run(&h.client, StartOptions::new("p", ["seq", "1", "200000"])).await;
    let expected: String = (1..=200_000).map(|i| format!("{i}\n")).collect();
    assert_eq!(seen.stdout.len(), expected.len());
    assert!(seen.stdout == expected.as_bytes(), "bytes differ");
    h.done().await;
}

async fn stdin_is_written_and_closed(kind: Kind) {
    let h = Harness::plain(kind).await;
    let mut opts = StartOptions::new("cat", ["cat"]);
    opts.params.pipe_stdin = true;
    let mut p = h.client.start(opts).await.unwrap();
    assert_eq!(p.write(b"hello ").await.unwrap(), "accepted");
    assert_eq!(p.write(b"world").await.unwrap(), "accepted");
    p.close_stdin().await.unwrap();
    let seen = collect(&mut p).await;
    assert_eq!(text(&seen.stdout), "hello world");
    assert_eq!(seen.exit.unwrap().exit_code, Some(0));
    h.done().await;
}

async fn signal_and_terminate(kind: Kind) {
    let h = Harness::plain(kind).await;
    let mut p = h
        .client
        .start(StartOptions::new(
            "s",
            [
                "sh",
                "-c",
                "trap 'echo got-usr1' USR1; echo ready; while :; do sleep 0.05; done",
            ],
        ))
        .await
        .unwrap();
    // Wait for the trap to be set.
    loop {
        match tokio::time::timeout(GUARD, p.next_event())
            .await
            .unwrap()
            .unwrap()
        {
            ProcessEvent::Output { data, .. } if text(&data).contains("ready") => break,
            ProcessEvent::Output { .. } => {}
            other => panic!("{other:?}"),
        }
    }
    p.signal("SIGUSR1").await.unwrap();
    loop {
        match tokio::time::timeout(GUARD, p.next_event())
            .await
            .unwrap()
            .unwrap()
        {
            ProcessEvent::Output { data, .. } if text(&data).contains("got-usr1") => break,
            ProcessEvent::Output { .. } => {}
            other => panic!("{other:?}"),
        }
    }
    assert!(
        p.terminate(Some(Duration::from_millis(500))).await.unwrap(),
        "it was running"
    );
    let exit = collect(&mut p).await.exit.unwrap();
    assert_eq!(exit.signal.as_deref(), Some("SIGTERM"));
    h.done().await;
}

async fn errors_have_their_codes(kind: Kind) {
    let h = Harness::plain(kind).await;
    let _p = h
        .client
        .start(StartOptions::new("dup", ["sleep", "30"]))
        .await
        .unwrap();
    let e = h
        .client
        .start(StartOptions::new("dup", ["true"]))
        .await
        .err()
        .unwrap();
    assert_eq!(e.code(), Some(-32002), "{e}");
    let e = h
        .client
        .start(StartOptions::new("empty", Vec::<String>::new()))
        .await
        .err()
        .unwrap();
    assert_eq!(e.code(), Some(-32602), "{e}");
    let e = h
        .client
        .call(
            "process/signal",
            json!({"processId": "nope", "signal": "SIGTERM"}),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(-32001), "{e}");
    let r = h
        .client
        .call("process/terminate", json!({"processId": "nope"}))
        .await
        .unwrap();
    assert_eq!(r, json!({"running": false}));
    let e = h.client.call("no/such", json!({})).await.unwrap_err();
    assert_eq!(e.code(), Some(-32601), "{e}");
    let e = h
        .client
        .call("process/read", json!({"afterSeq": 0}))
        .await
        .unwrap_err();
    match e {
        ClientError::Rpc { code, message, .. } => {
            assert_eq!(code, -32602);
            assert!(message.contains("missing field processId"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    h.done().await;
}

async fn list_read_and_info(kind: Kind) {
    let h = Harness::plain(kind).await;
    let mut p = h
        .client
        .start(StartOptions::new(
            "e",
            ["sh", "-c", "echo listed; exec sleep 30"],
        ))
        .await
        .unwrap();
    match tokio::time::timeout(GUARD, p.next_event())
        .await
        .unwrap()
        .unwrap()
    {
        ProcessEvent::Output { data, .. } => assert_eq!(text(&data), "listed\n"),
        other => panic!("{other:?}"),
    }
    let list = h.client.call("process/list", json!({})).await.unwrap();
    let entry = &list["processes"][0];
    assert_eq!(entry["processId"], "e");
    assert_eq!(entry["state"], "running");
    assert_eq!(entry["pid"], p.pid);
    assert_eq!(entry["exitCode"], serde_json::Value::Null);
    // Not acknowledged yet: still readable.
    let read = h
        .client
        .call("process/read", json!({"processId": "e", "afterSeq": 0}))
        .await
        .unwrap();
    assert_eq!(read["running"], true);
    assert_eq!(read["events"][0]["chunk"], b64(b"listed\n"));
    assert_eq!(read["nextSeq"], 2);
    let info = h.client.server_info().await.unwrap();
    assert_eq!(info["protocolVersion"], 1);
    assert_eq!(info["sessions"], 1);
    assert_eq!(info["processes"], 1);
    assert!(p.terminate(Some(Duration::ZERO)).await.unwrap());
    assert!(collect(&mut p).await.exit.is_some());
    h.done().await;
}

async fn a_pty_has_its_size_and_one_stream(kind: Kind) {
    let h = Harness::plain(kind).await;
    let mut opts = StartOptions::new("t", ["sh", "-c", "stty size; test -t 0 && echo tty"]);
    opts.params.tty = true;
    opts.params.size = Some(TermSize {
        rows: 33,
        cols: 101,
    });
    let seen = run(&h.client, opts).await;
    // The exit notice in every message: a lost line and a shell that never wrote it (killed,
    // or its terminal gone) look the same in the bytes alone.
    let exit = seen.exit.as_ref().expect("an exit notice");
    assert!(seen.stdout.is_empty() && seen.stderr.is_empty(), "{seen:?}");
    assert_eq!(text(&seen.pty), "33 101\r\ntty\r\n", "{exit:?}");
    assert_eq!(
        (exit.exit_code, exit.signal.as_deref()),
        (Some(0), None),
        "{exit:?}"
    );
    assert!(!exit.output_drain_timed_out, "{exit:?}");
    h.done().await;
}

async fn approvals_are_asked_and_honoured(kind: Kind) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.toml");
    std::fs::write(
        &path,
        "default = \"allow\"\n[[rule]]\nprogram = \"echo\"\naction = \"ask\"\n",
    )
    .unwrap();
    let policy = Some(Arc::new(PolicyFile::load(&path).unwrap()));
    let opts = ClientOptions {
        approval_handler: Some(Arc::new(|req: ApproveParams| async move {
            if req.argv.get(1).is_some_and(|a| a == "yes") {
                ApprovalDecision::Approve
            } else {
                ApprovalDecision::Deny
            }
        })),
        ..ClientOptions::default()
    };
    let h = Harness::connect(kind, policy, opts).await;
    let seen = run(&h.client, StartOptions::new("a", ["echo", "yes"])).await;
    assert_eq!(text(&seen.stdout), "yes\n");
    let e = h
        .client
        .start(StartOptions::new("b", ["echo", "no"]))
        .await
        .err()
        .unwrap();
    assert_eq!(e.code(), Some(-32006), "{e}");
    h.done().await;
}

/// Each body once per target, as `ws::NAME` and `in_process::NAME`.
macro_rules! over_both {
    ($($name:ident),* $(,)?) => {
        mod ws {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Kind::Ws).await
                }
            )*
        }
        mod in_process {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Kind::InProcess).await
                }
            )*
        }
    };
}

over_both!(
    streams_and_exit_code,
    death_by_signal_is_reported_by_name,
    output_arrives_whole_and_in_order,
    stdin_is_written_and_closed,
    signal_and_terminate,
    errors_have_their_codes,
    list_read_and_info,
    a_pty_has_its_size_and_one_stream,
    approvals_are_asked_and_honoured,
);
