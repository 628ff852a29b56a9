//! A hostile client against the paths added with the exec policy, approvals, binary output
//! and the typed connection core (red team of the `redteam` branch): each test is an attack
//! that once worked, and checks the bound that now stops it.

mod common;
use common::*;

use std::path::Path;
use std::sync::{Arc, Mutex};

use execrelay::config::{ServerConfig, MAX_ARGV_BYTES};
use execrelay::connection::handlers::start_spec;
use execrelay::metrics::Metrics;
use execrelay::policy::resolve::MAX_PATH_LOOKUP_ENTRIES;
use execrelay::policy::PolicyFile;
use execrelay::process::ReadySet;
use execrelay::rpc::error::MAX_ERROR_MESSAGE_BYTES;
use execrelay::rpc::jsonrpc::MAX_REQUEST_ID_BYTES;
use execrelay::rpc::messages::StartParams;
use execrelay::session::{
    Caller, ConnHandle, RequestSink, ServerRequest, SessionError, SessionRegistry,
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

fn registry_with_policy(policy: &str, dir: &Path, cfg: ServerConfig) -> Arc<SessionRegistry> {
    let path = dir.join("policy.toml");
    std::fs::write(&path, policy).unwrap();
    let file = PolicyFile::load(&path).expect("valid policy");
    let containment = execrelay::server::start_containment(&cfg).expect("containment starts");
    SessionRegistry::with_exec_policy(
        Arc::new(cfg),
        Arc::new(Metrics::new()),
        containment,
        Some(Arc::new(file)),
    )
}

const DENY_SBIN: &str = r#"
default = "allow"
[[rule]]
program = "/usr/sbin/*"
action = "deny"
"#;

/// `PATH` of `junk` entries that do not exist, then the directories of `true` and `nologin`.
fn long_path(junk: usize) -> String {
    let mut entries = vec!["/nonexistent/execrelay-junk"; junk];
    entries.extend(["/usr/bin", "/bin", "/usr/sbin", "/sbin"]);
    entries.join(":")
}

/// Under an exec policy the server looks the program up in the child's `PATH`, which the
/// client chooses: 400,000 entries (a 58 MiB start, under the request budget) held a runtime
/// worker for 1.8 s of `stat`s per `process/start`, and a few such starts at once stalled
/// every connection of the server. The lookup now stops at `MAX_PATH_LOOKUP_ENTRIES`, and a
/// start whose program it could not find within them is denied (fail closed: execvp would go
/// on looking, and could find a program a rule denies).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_too_long_to_look_up_is_denied_not_searched() {
    let _one = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let reg = registry_with_policy(DENY_SBIN, dir.path(), cfg());
    let mut t = connect_to(&reg);
    t.client.handshake().await;

    // At the bound (the program in the last entry examined): allowed, and it runs.
    let at = long_path(MAX_PATH_LOOKUP_ENTRIES - 1);
    let c = t
        .client
        .run(json!({"processId": "at", "argv": ["true"], "env": {"PATH": at}}))
        .await;
    assert_eq!(c.exit["exitCode"], 0, "{:?}", c.exit);

    // One entry past it: denied, although `true` is allowed, because the lookup gave up.
    let past = long_path(MAX_PATH_LOOKUP_ENTRIES);
    let e = t
        .client
        .call_err(
            "process/start",
            json!({"processId": "past", "argv": ["true"], "env": {"PATH": past}}),
        )
        .await;
    assert_eq!(e["code"], -32006, "{e}");
    assert_eq!(e["data"]["reason"], "denied by the exec policy", "{e}");
    assert_eq!(
        e["data"]["rule"],
        format!("PATH has more than {MAX_PATH_LOOKUP_ENTRIES} entries"),
        "{e}"
    );
    // Junk entries cannot hide a denied program from its rule either.
    let e = t
        .client
        .call_err(
            "process/start",
            json!({"processId": "hide", "argv": ["nologin"], "env": {"PATH": long_path(100_000)}}),
        )
        .await;
    assert_eq!(e["code"], -32006, "{e}");

    // Without a policy nothing is looked up: the same start runs.
    let plain = new_registry(cfg());
    let mut u = connect_to(&plain);
    u.client.handshake().await;
    let c = u
        .client
        .run(json!({"processId": "past", "argv": ["true"], "env": {"PATH": long_path(MAX_PATH_LOOKUP_ENTRIES)}}))
        .await;
    assert_eq!(c.exit["exitCode"], 0, "{:?}", c.exit);
}

/// The tests of this file one at a time: one measures this process's peak memory
/// (`VmHWM`), which the others' servers and clients would add to if they ran beside it (seen:
/// 33 MiB over a 32 MiB bound in the full suite, never alone).
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `VmRSS` and `VmHWM` of this process, in bytes.
fn memory() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let field = |name: &str| -> u64 {
        let line = status.lines().find(|l| l.starts_with(name)).unwrap();
        line.split_whitespace()
            .nth(1)
            .unwrap()
            .parse::<u64>()
            .unwrap()
            * 1024
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// An argv of exactly `bytes` as `MAX_ARGV_BYTES` counts them (each argument with its NUL):
/// a shell that execs `sleep`, and padding arguments it ignores.
fn argv_of(bytes: usize) -> Vec<String> {
    let mut argv: Vec<String> = ["sh", "-c", "exec sleep 1000"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mut used: usize = argv.iter().map(|a| a.len() + 1).sum();
    while used < bytes {
        // Under the kernel's 128 KiB per argument.
        let n = (bytes - used - 1).min(100 * 1024);
        argv.push("a".repeat(n));
        used += n + 1;
    }
    argv
}

/// A process keeps its argv for `process/list`, and every list answer carried a copy of every
/// process's argv: 64 processes with 1.8 MiB of argv each (122 MiB held) and 16
/// `process/list`s the client did not read took the server to 2.2 GiB; the control lane holds
/// 1,152 answers. Now argv is at most `MAX_ARGV_BYTES` and shared between the process and the
/// answers: queued answers cost no argv, and the writer encodes one at a time. (With a copy
/// per answer, this test's 32 answers took 79 MiB above the start; shared, 17 MiB.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_list_answers_share_argv_and_argv_is_bounded() {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut t = ready_with(cfg()).await;
    // The bound's edge: at it, the start runs; one byte over, -32602 naming it.
    let e = t
        .client
        .call_err(
            "process/start",
            json!({"processId": "over", "argv": argv_of(MAX_ARGV_BYTES + 1), "inheritEnv": false}),
        )
        .await;
    assert_eq!(e["code"], -32602, "{e}");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains(&format!("argv must be at most {MAX_ARGV_BYTES} bytes")),
        "{e}"
    );
    const PROCS: usize = 8;
    // Under CONTROL_REQUEST_SLOTS (64), so that none is refused.
    const LISTS: usize = 32;
    let argv = argv_of(MAX_ARGV_BYTES);
    for i in 0..PROCS {
        t.client
            .start(json!({"processId": format!("p{i:02}"), "argv": argv, "inheritEnv": false}))
            .await;
    }
    // From here, the peak: every list answer queued at once (the client reads nothing until
    // it sent them all), then read back.
    std::fs::write("/proc/self/clear_refs", "5").expect("reset VmHWM");
    let (before, _) = memory();
    let mut ids = Vec::new();
    for _ in 0..LISTS {
        ids.push(t.client.request("process/list", json!({})).await);
    }
    // Read back unparsed (parsing them all is the slow part of this test, not the server's).
    let mut line = Vec::new();
    for _ in 0..ids.len() {
        let n = t.client.skip_line(&mut line).await.expect("a list answer");
        assert!(
            n > PROCS * MAX_ARGV_BYTES * 9 / 10,
            "{n}: {}",
            String::from_utf8_lossy(&line)
        );
    }
    let (_, peak) = memory();
    drop(line);
    let r = t.client.call("process/list", json!({})).await;
    let procs = r["processes"].as_array().unwrap();
    assert_eq!(procs.len(), PROCS);
    assert_eq!(procs[0]["argv"].as_array().unwrap().len(), argv.len());
    let argv_all = (PROCS * MAX_ARGV_BYTES) as u64;
    // One answer at a time in the writer (its JSON tree and text), and the client's copy of
    // it as it parses: a few times one answer, far from one copy per answer (LISTS ×).
    let bound = 16 * argv_all;
    assert!(
        peak.saturating_sub(before) < bound,
        "{LISTS} list answers took {} MiB above {} MiB (bound {} MiB)",
        peak.saturating_sub(before) >> 20,
        before >> 20,
        bound >> 20
    );
    for i in 0..PROCS {
        t.client.terminate(&format!("p{i:02}"), Some(0)).await;
    }
}

const ASK_SLEEP: &str = r#"
default = "allow"
[[rule]]
program = "sleep"
action = "ask"
"#;

/// A connection handle as a connection brings it; `sink` receives the server requests sent to
/// it, `None` for a client that did not declare `serverRequests`.
fn conn(conn_id: u64, sink: Option<RequestSink>) -> ConnHandle {
    ConnHandle {
        conn_id,
        ready: Arc::new(ReadySet::default()),
        evict: CancellationToken::new(),
        peer_key: None,
        peer_addr: None,
        requests: sink,
    }
}

/// A start that began on a connection that can answer approvals, and asks after a client that
/// cannot resumed the session (it evicted that connection, whose started requests run to
/// their end): it was registered and sent nowhere, holding its process slot until
/// `approvalTimeoutMs` (5 minutes by default), and only the client that cannot answer could
/// still answer it. It is refused at once, as `attach` refuses the requests pending when
/// such a client resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ask_after_a_resume_by_a_client_that_cannot_answer_is_refused_at_once() {
    let _one = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let mut c = cfg();
    c.approval_timeout_ms = 60_000;
    let reg = registry_with_policy(ASK_SLEEP, dir.path(), c);
    let sent = Arc::new(Mutex::new(Vec::<ServerRequest>::new()));
    let sink: RequestSink = {
        let sent = sent.clone();
        Arc::new(move |r| sent.lock().unwrap().push(r))
    };
    let (session, token) = reg.create(true, &conn(1, Some(sink))).expect("session");
    // Resumed by a client without `serverRequests`.
    reg.resume(&session.id, &token, &conn(2, None))
        .expect("resume");
    // The start connection 1 had begun.
    let params: StartParams =
        serde_json::from_value(json!({"processId": "late", "argv": ["sleep", "3001.5"]})).unwrap();
    let spec = start_spec(params, reg.config()).unwrap();
    let caller = Caller {
        conn_id: 1,
        can_approve: true,
    };
    let r = tokio::time::timeout(PROMPT, session.start_checked(spec, caller))
        .await
        .expect("refused at once, not after approvalTimeoutMs");
    match r {
        Err(SessionError::NotApproved { reason, .. }) => assert_eq!(
            reason,
            "the session was resumed by a client that cannot answer approval requests"
        ),
        other => panic!("{:?}", other.map(|p| p.pid)),
    }
    assert!(sent.lock().unwrap().is_empty(), "sent to nobody");
    assert!(session.list().is_empty(), "its process id is free again");
    session.close();
}

/// Every response echoes its request's id, and error messages quote what the client sent (a
/// method name, a process id, a value a decode refused). Responses wait in the control lane,
/// bounded by count (1,152 by default), after the request's bytes were given back: 200
/// unread requests with a 4 MiB id and a 4 MiB unknown method took 1.7 GiB, and the lane
/// holds 1,152 such errors. Ids are now at most `MAX_REQUEST_ID_BYTES` and messages at most
/// `MAX_ERROR_MESSAGE_BYTES`: no response is larger than about 1.5 KiB however large the
/// request was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_never_echo_more_than_a_bounded_id_and_message() {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut t = ready_with(cfg()).await;
    // An id at the bound is echoed; one byte more is refused with id null.
    let at = "i".repeat(MAX_REQUEST_ID_BYTES);
    t.client
        .send(&json!({"jsonrpc": "2.0", "id": at, "method": "server/info"}))
        .await;
    let r = t.client.next_message().await.unwrap();
    assert_eq!(r["id"], at, "{r}");
    assert!(r.get("result").is_some(), "{r}");
    let over = "i".repeat(MAX_REQUEST_ID_BYTES + 1);
    t.client
        .send(&json!({"jsonrpc": "2.0", "id": over, "method": "server/info"}))
        .await;
    let r = t.client.next_message().await.unwrap();
    assert_eq!(r["id"], serde_json::Value::Null, "{r}");
    assert_eq!(r["error"]["code"], -32600, "{r}");
    assert_eq!(
        r["error"]["message"],
        "id must be an integer or a string of at most 256 bytes"
    );

    // Messages that quote the request are cut at MAX_ERROR_MESSAGE_BYTES.
    let big = "x".repeat(1 << 20);
    let requests = [
        json!({"jsonrpc": "2.0", "id": 1, "method": big}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "process/read", "params": {"processId": big}}),
        json!({"jsonrpc": "2.0", "id": 3, "method": "process/start", "params": {"processId": "p", "argv": big}}),
        json!({"jsonrpc": "2.0", "id": 4, "method": "process/signal", "params": {"processId": "p", "signal": big}}),
    ];
    let mut line = Vec::new();
    for req in &requests {
        t.client.send(req).await;
        let n = t.client.skip_line(&mut line).await.expect("an answer");
        let r: serde_json::Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(r["id"], req["id"], "{r}");
        let msg = r["error"]["message"].as_str().unwrap();
        assert!(msg.len() <= MAX_ERROR_MESSAGE_BYTES, "{}", msg.len());
        assert!(msg.ends_with('…'), "{msg}");
        assert!(n < MAX_ERROR_MESSAGE_BYTES + 512, "{n} bytes");
    }
}
