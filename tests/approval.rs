//! The exec policy and approval requests (`protocol.md` §7), over a raw connection (every
//! byte the client sends is the test's): allow, deny and ask rules; the policy file edited
//! while the server runs (a bad edit keeps the old policy); `process/approve` answered,
//! refused, unreadable, late, duplicated, never sent, timed out; the session closed or
//! expired with a request pending; a connection dropped with a request pending (the resumed
//! connection gets the same id first, before any replayed event, and the process runs once);
//! an answer sent on the old connection just before it died. "Nothing spawned" is checked in
//! `/proc`: every test runs `sleep` with an argument no other process has.
//!
//! The client library and the CLI are in `approval_client.rs`.

mod common;
use common::process::{exec_done, running_with_arg};
use common::*;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use execrelay::config::ServerConfig;
use execrelay::connection::ConnectionEnd;
use execrelay::metrics::Metrics;
use execrelay::policy::PolicyFile;
use execrelay::session::SessionRegistry;
use serde_json::{json, Value};

/// A policy asking about `sleep`, denying `/usr/sbin/*` and `false`, allowing the rest.
const POLICY: &str = r#"
default = "allow"
[[rule]]
program = "sleep"
action = "ask"
reason = "sleeps"
[[rule]]
program = "false"
action = "deny"
[[rule]]
program = "/usr/sbin/*"
action = "deny"
reason = "system tools"
"#;

/// A registry whose starts go through `policy` (written to a file in `dir`).
fn registry_with(policy: &str, dir: &Path, cfg: ServerConfig) -> (Arc<SessionRegistry>, PathBuf) {
    let path = dir.join("policy.toml");
    std::fs::write(&path, policy).unwrap();
    let file = PolicyFile::load(&path).expect("valid policy");
    let containment = execrelay::server::start_containment(&cfg).expect("containment starts");
    let reg = SessionRegistry::with_exec_policy(
        Arc::new(cfg),
        Arc::new(Metrics::new()),
        containment,
        Some(Arc::new(file)),
    );
    (reg, path)
}

/// `initialize` (declaring `serverRequests` when `approve`, and acks) + `initialized`.
async fn init(c: &mut RawClient, approve: bool) -> Value {
    let mut caps = json!({"acks": true});
    if approve {
        caps["serverRequests"] = json!(["process/approve"]);
    }
    let r = c
        .call(
            "initialize",
            json!({"clientName": "t", "capabilities": caps}),
        )
        .await;
    c.notify("initialized", json!({})).await;
    r
}

/// `initialize` resuming `sid`, declaring `serverRequests`; the whole response.
async fn resume_approving(c: &mut RawClient, sid: &str, token: &str) -> Value {
    let id = c
        .request(
            "initialize",
            json!({"resume": {"sessionId": sid, "resumeToken": token},
                   "capabilities": {"acks": true, "serverRequests": ["process/approve"]}}),
        )
        .await;
    let r = c.response(id).await;
    c.notify("initialized", json!({})).await;
    r
}

/// Whether `m` is a request from the server.
fn is_server_request(m: &Value) -> bool {
    m.get("id").is_some() && m.get("method").is_some()
}

/// The next request from the server, leaving everything else in the backlog.
async fn server_request(c: &mut RawClient) -> Value {
    if let Some(pos) = c.backlog.iter().position(is_server_request) {
        return c.backlog.remove(pos).unwrap();
    }
    loop {
        let m = c
            .read_message()
            .await
            .expect("connection closed before a server request");
        if is_server_request(&m) {
            return m;
        }
        c.backlog.push_back(m);
    }
}

/// Answer server request `id` with `decision`.
async fn answer(c: &mut RawClient, id: &Value, decision: &str) {
    c.send(&json!({"jsonrpc": "2.0", "id": id, "result": {"decision": decision}}))
        .await;
}

/// A `sleep` argument no other process on the machine has (so `/proc` can tell whether this
/// test's process exists).
fn marker(tag: u32) -> String {
    format!("{}.{:03}", 3000 + tag, std::process::id() % 1000)
}

fn sleep_params(id: &str, arg: &str) -> Value {
    json!({"processId": id, "argv": ["sleep", arg], "env": {"B": "2", "A": "1"}, "cwd": "/"})
}

/// `-32006` with `reason` (and the rule, when given).
fn assert_not_approved(e: &Value, reason: &str, rule: Option<&str>) {
    assert_eq!(e["code"], -32006, "{e}");
    assert_eq!(e["data"]["reason"], reason, "{e}");
    if let Some(rule) = rule {
        assert_eq!(e["data"]["rule"], rule, "{e}");
    }
}

/// Terminate `id` and wait for its exit notice (hygiene, and proof it ran).
async fn stop(c: &mut RawClient, id: &str) -> Value {
    c.terminate(id, Some(0)).await;
    c.collect(id).await.exit
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_and_deny_rules_decide_without_asking() {
    let dir = tempfile::tempdir().unwrap();
    let (reg, _) = registry_with(POLICY, dir.path(), cfg());
    let mut t = connect_to(&reg);
    init(&mut t.client, true).await;

    let c = t
        .client
        .run(json!({"processId": "ok", "argv": ["sh", "-c", "echo allowed"]}))
        .await;
    assert_eq!(text(&c.stdout), "allowed\n");

    let e = t
        .client
        .call_err(
            "process/start",
            json!({"processId": "f", "argv": ["false"]}),
        )
        .await;
    assert_not_approved(&e, "denied by the exec policy", Some("program = \"false\""));
    assert_eq!(e["message"], "not approved: denied by the exec policy");
    // Matched through the resolved path, whatever argv[0] says.
    let e = t
        .client
        .call_err(
            "process/start",
            json!({"processId": "s", "argv": ["/usr/sbin/nologin"]}),
        )
        .await;
    assert_not_approved(&e, "denied by the exec policy", Some("system tools"));
    // A denied id is free again, and nothing waits in the list.
    let list = t.client.call("process/list", json!({})).await;
    assert!(
        list["processes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["processId"] != "f"),
        "{list}"
    );
    assert!(
        !t.client.backlog.iter().any(is_server_request),
        "deny and allow never ask"
    );
    let text = reg.metrics().render(&reg.stats());
    assert!(text.contains("execrelay_policy_denials_total 2"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ask_waits_for_the_answer_while_everything_else_proceeds() {
    let dir = tempfile::tempdir().unwrap();
    let (reg, _) = registry_with(POLICY, dir.path(), cfg());
    let mut t = connect_to(&reg);
    init(&mut t.client, true).await;
    let arg = marker(1);

    let start = t
        .client
        .request("process/start", sleep_params("asked", &arg))
        .await;
    let req = server_request(&mut t.client).await;
    assert_eq!(req["jsonrpc"], "2.0");
    assert_eq!(req["id"], "s-1");
    assert_eq!(req["method"], "process/approve");
    assert_eq!(
        req["params"],
        json!({"processId": "asked", "argv": ["sleep", arg], "cwd": "/",
               "envNames": ["A", "B"], "tty": false, "rule": "sleeps"})
    );

    // Pending: listed, not spawned, and the connection serves other requests meanwhile
    // (another process, a control request).
    let entry = common::process::list_entry(&mut t.client, "asked")
        .await
        .expect("listed");
    assert_eq!(entry["state"], "pendingApproval");
    assert_eq!(entry["pid"], Value::Null);
    assert_eq!(entry["argv"], json!(["sleep", arg]));
    let other = t
        .client
        .run(json!({"processId": "other", "argv": ["true"]}))
        .await;
    assert_eq!(other.exit["exitCode"], 0);
    assert!(t.client.call("server/info", json!({})).await["processes"].as_u64() >= Some(1));
    assert!(running_with_arg(&arg).is_empty(), "spawned before approval");
    assert!(
        !t.client
            .backlog
            .iter()
            .any(|m| m.get("id") == Some(&json!(start))),
        "process/start answered before the approval"
    );

    answer(&mut t.client, &req["id"], "approve").await;
    let r = t.client.response(start).await;
    let pid = r["result"]["pid"].as_i64().expect("started") as i32;
    exec_done(pid).await;
    assert_eq!(
        running_with_arg(&arg),
        vec![pid],
        "exactly this process runs it"
    );
    // Approved, it was spawned into its session's scope like any start: with a cgroup
    // backend, a cgroup under this server's instance.
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    for inst in reg.containment().instance_dirs() {
        let name = inst.file_name().unwrap().to_string_lossy().into_owned();
        assert!(cgroup.contains(&format!("/{name}/")), "{name}: {cgroup}");
    }
    let entry = common::process::list_entry(&mut t.client, "asked")
        .await
        .unwrap();
    assert_eq!(entry["state"], "running");
    assert!(stop(&mut t.client, "asked").await["signal"].is_string());
    let text = reg.metrics().render(&reg.stats());
    assert!(
        text.contains("execrelay_approvals_total{outcome=\"requested\"} 1")
            && text.contains("execrelay_approvals_total{outcome=\"approved\"} 1"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_an_error_answer_or_an_unreadable_one_spawns_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (reg, _) = registry_with(POLICY, dir.path(), cfg());
    let mut t = connect_to(&reg);
    init(&mut t.client, true).await;
    let arg = marker(2);
    let answers = [
        (
            json!({"result": {"decision": "deny"}}),
            "denied by the client",
        ),
        (
            json!({"error": {"code": -1, "message": "no"}}),
            "the client could not answer",
        ),
        (
            json!({"result": {"decision": "perhaps"}}),
            "the client could not answer",
        ),
    ];
    for (i, (reply, reason)) in answers.into_iter().enumerate() {
        let start = t
            .client
            .request("process/start", sleep_params("p", &arg))
            .await;
        let req = server_request(&mut t.client).await;
        assert_eq!(req["id"], format!("s-{}", i + 1), "ids count up");
        let mut reply = reply;
        reply["id"] = req["id"].clone();
        t.client.send(&reply).await;
        let r = t.client.response(start).await;
        assert_not_approved(error_of(&r), reason, Some("sleeps"));
        assert!(running_with_arg(&arg).is_empty(), "{reason}: spawned");
    }
    let text = reg.metrics().render(&reg.stats());
    assert!(
        text.contains("execrelay_approvals_total{outcome=\"denied\"} 3"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_the_capability_gets_a_denial_and_no_request() {
    let dir = tempfile::tempdir().unwrap();
    let (reg, _) = registry_with(POLICY, dir.path(), cfg());
    let mut t = connect_to(&reg);
    init(&mut t.client, false).await;
    let arg = marker(3);
    let e = t
        .client
        .call_err("process/start", sleep_params("p", &arg))
        .await;
    assert_not_approved(
        &e,
        "approval required, and the client cannot answer approval requests",
        Some("sleeps"),
    );
    // Nothing was sent: the next message is the answer to this.
    let info = t.client.request("server/info", json!({})).await;
    let next = t.client.next_message().await.unwrap();
    assert_eq!(next["id"], info, "no request before it: {next}");
    assert!(running_with_arg(&arg).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_and_duplicate_answers_are_ignored_and_unknown_ids_close_only_that_connection() {
    let dir = tempfile::tempdir().unwrap();
    let (reg, _) = registry_with(POLICY, dir.path(), cfg());
    let mut t = connect_to(&reg);
    init(&mut t.client, true).await;
    let mut bystander = connect_to(&reg);
    init(&mut bystander.client, true).await;
    let arg = marker(4);

    let start = t
        .client
        .request("process/start", sleep_params("p", &arg))
        .await;
    let req = server_request(&mut t.client).await;
    answer(&mut t.client, &req["id"], "approve").await;
    let r = t.client.response(start).await;
    let pid = r["result"]["pid"].as_i64().expect("started") as i32;
    // The same answer again, and a contrary one: ignored, the connection goes on.
    answer(&mut t.client, &req["id"], "approve").await;
    answer(&mut t.client, &req["id"], "deny").await;
    t.client.call("server/info", json!({})).await;
    exec_done(pid).await;
    assert_eq!(running_with_arg(&arg), vec![pid], "started once");
    stop(&mut t.client, "p").await;

    // An id this session never sent (a later one, a number) is a protocol error.
    answer(&mut t.client, &json!("s-2"), "approve").await;
    assert_eq!(
        connection_end(t.end).await,
        ConnectionEnd::UnexpectedResponse
    );
    answer(&mut bystander.client, &json!(7), "approve").await;
    assert_eq!(
        connection_end(bystander.end).await,
        ConnectionEnd::UnexpectedResponse
    );
    // Each connection closed alone; a third one is served.
    let mut other = connect_to(&reg);
    init(&mut other.client, true).await;
    other.client.call("server/info", json!({})).await;
}

/// Paused time: the timeout is `approval_timeout_ms` exactly, on the tokio clock.
#[tokio::test(start_paused = true)]
async fn an_unanswered_request_is_withdrawn_after_the_approval_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let (reg, _) = registry_with(
        POLICY,
        dir.path(),
        ServerConfig {
            approval_timeout_ms: 30_000,
            ..cfg()
        },
    );
    let mut t = connect_to(&reg);
    init(&mut t.client, true).await;
    let arg = marker(5);
    let begin = tokio::time::Instant::now();
    let start = t
        .client
        .request("process/start", sleep_params("p", &arg))
        .await;
    let req = server_request(&mut t.client).await;
    let r = t.client.response(start).await;
    assert!(
        begin.elapsed() >= Duration::from_millis(30_000),
        "too early"
    );
    assert_not_approved(error_of(&r), "approval timed out", Some("sleeps"));
    assert!(running_with_arg(&arg).is_empty());
    // The answer now is late: ignored, the connection goes on.
    answer(&mut t.client, &req["id"], "approve").await;
    assert!(
        common::process::list_entry(&mut t.client, "p")
            .await
            .is_none(),
        "the id is free again"
    );
    assert!(
        running_with_arg(&arg).is_empty(),
        "a late answer starts nothing"
    );
    let text = reg.metrics().render(&reg.stats());
    assert!(
        text.contains("execrelay_approvals_total{outcome=\"timed_out\"} 1"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_the_session_withdraws_its_requests() {
    let dir = tempfile::tempdir().unwrap();
    let (reg, _) = registry_with(POLICY, dir.path(), cfg());
    let mut t = connect_to(&reg);
    init(&mut t.client, true).await;
    let arg = marker(6);
    let start = t
        .client
        .request("process/start", sleep_params("p", &arg))
        .await;
    let req = server_request(&mut t.client).await;
    t.client.call("session/close", json!({})).await;
    let r = t.client.response(start).await;
    assert_not_approved(error_of(&r), "session closed", Some("sleeps"));
    answer(&mut t.client, &req["id"], "approve").await;
    assert!(running_with_arg(&arg).is_empty());
    assert_no_scope_left(&reg);
    let text = reg.metrics().render(&reg.stats());
    assert!(
        text.contains("execrelay_approvals_total{outcome=\"withdrawn\"} 1"),
        "{text}"
    );
}

/// No session scope is left under this server's instance cgroups (`session/close` answers,
/// and `Session::terminated` resolves, once the scope is removed).
fn assert_no_scope_left(reg: &SessionRegistry) {
    for inst in reg.containment().instance_dirs() {
        let scopes: Vec<_> = std::fs::read_dir(&inst)
            .unwrap()
            .flatten()
            .filter(|e| e.path().is_dir())
            .map(|e| e.file_name())
            .collect();
        assert!(scopes.is_empty(), "{}: {scopes:?}", inst.display());
    }
}

/// Paused time: the detached session expires after its TTL with the request pending.
#[tokio::test(start_paused = true)]
async fn an_expired_session_withdraws_its_requests() {
    let dir = tempfile::tempdir().unwrap();
    let (reg, _) = registry_with(
        POLICY,
        dir.path(),
        ServerConfig {
            detached_session_ttl_ms: 5_000,
            ..cfg()
        },
    );
    let mut t = connect_to(&reg);
    let (sid, _) = credentials(&init(&mut t.client, true).await);
    let arg = marker(7);
    t.client
        .request("process/start", sleep_params("p", &arg))
        .await;
    server_request(&mut t.client).await;
    assert_eq!(t.hang_up().await, ConnectionEnd::PeerClosed);
    let session = reg.session(&sid).expect("detached, not gone");
    session.closed().await;
    // The start (still running on the dead connection) ends with the withdrawal.
    eventually("the withdrawal is counted", || {
        reg.metrics()
            .render(&reg.stats())
            .contains("execrelay_approvals_total{outcome=\"withdrawn\"} 1")
    })
    .await;
    assert!(running_with_arg(&arg).is_empty());
    session.terminated().await;
    assert_no_scope_left(&reg);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_connection_gets_the_same_request_first_and_the_process_runs_once() {
    let dir = tempfile::tempdir().unwrap();
    let (reg, _) = registry_with(POLICY, dir.path(), cfg());
    let mut a = connect_to(&reg);
    let (sid, token) = credentials(&init(&mut a.client, true).await);
    // Output that a resume replays: not acknowledged.
    let chatty = a
        .client
        .run(json!({"processId": "out", "argv": ["sh", "-c", "echo one; echo two"]}))
        .await;
    assert_eq!(text(&chatty.stdout), "one\ntwo\n");
    let arg = marker(8);
    let params = sleep_params("asked", &arg);
    a.client.request("process/start", params.clone()).await;
    let first = server_request(&mut a.client).await;
    assert_eq!(a.hang_up().await, ConnectionEnd::PeerClosed);

    let mut b = connect_to(&reg);
    let r = resume_approving(&mut b.client, &sid, &token).await;
    assert_eq!(r["result"]["resumed"], true);
    // Before any replayed event: the same request, same id.
    let mut seen = Vec::new();
    loop {
        let m = b.client.next_message().await.expect("message");
        if is_server_request(&m) {
            assert_eq!(m["id"], first["id"]);
            assert_eq!(m["params"], first["params"]);
            break;
        }
        assert!(
            m.get("method").is_none(),
            "an event was replayed before the pending request: {m}"
        );
        seen.push(m);
    }
    // The client retries its start and answers. The retry runs in its own task: it joins
    // the pending start if it gets there before the answer (and gets its result), else it
    // finds the process started (`-32002`, as for any retried start; the client library
    // then looks the pid up). Joining itself is tested on the session below.
    let retry = b.client.request("process/start", params).await;
    answer(&mut b.client, &first["id"], "approve").await;
    let r = b.client.response(retry).await;
    let pid = match r["result"]["pid"].as_i64() {
        Some(pid) => pid as i32,
        None => {
            assert_eq!(error_of(&r)["code"], -32002, "{r}");
            // Listed once spawned (not while its spawn is in progress).
            let deadline = tokio::time::Instant::now() + GUARD;
            loop {
                let e = common::process::list_entry(&mut b.client, "asked").await;
                if let Some(pid) = e.as_ref().and_then(|e| e["pid"].as_i64()) {
                    break pid as i32;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "never listed: {e:?}"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    exec_done(pid).await;
    assert_eq!(running_with_arg(&arg), vec![pid], "exactly one process");
    // The replay still comes, in order, after the request.
    let replay = b.client.collect("out").await;
    assert_eq!(text(&replay.stdout), "one\ntwo\n");
    let list = b.client.call("process/list", json!({})).await;
    let asked: Vec<&Value> = list["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["processId"] == "asked")
        .collect();
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0]["pid"], pid);
    stop(&mut b.client, "asked").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_sent_just_before_the_connection_died_starts_the_process_once() {
    let dir = tempfile::tempdir().unwrap();
    let (reg, _) = registry_with(POLICY, dir.path(), cfg());
    let mut a = connect_to(&reg);
    let (sid, token) = credentials(&init(&mut a.client, true).await);
    let arg = marker(9);
    let params = sleep_params("asked", &arg);
    a.client.request("process/start", params.clone()).await;
    let req = server_request(&mut a.client).await;
    // The answer, then the connection dies before the start result could arrive.
    answer(&mut a.client, &req["id"], "approve").await;
    assert_eq!(a.hang_up().await, ConnectionEnd::PeerClosed);

    let mut b = connect_to(&reg);
    resume_approving(&mut b.client, &sid, &token).await;
    // The client does not know its answer arrived: it answers again (a duplicate, ignored)
    // and retries the start, which finds the process started.
    answer(&mut b.client, &req["id"], "approve").await;
    let e = b.client.call_err("process/start", params).await;
    assert_eq!(e["code"], -32002, "{e}");
    let entry = common::process::list_entry(&mut b.client, "asked")
        .await
        .unwrap();
    assert_eq!(entry["state"], "running");
    let pid = entry["pid"].as_i64().unwrap() as i32;
    exec_done(pid).await;
    assert_eq!(running_with_arg(&arg), vec![pid], "started exactly once");
    assert!(
        !b.client.backlog.iter().any(is_server_request),
        "an answered request is not sent again"
    );
    stop(&mut b.client, "asked").await;
}

/// On the session itself, polled by hand: a start retried while the first waits for approval
/// joins it, and both get the one process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_retried_while_pending_joins_it_and_both_get_the_one_process() {
    use execrelay::process::ReadySet;
    use execrelay::session::{ApprovalAnswer, Caller, ConnHandle, ServerRequest};
    use futures_util::FutureExt;
    let dir = tempfile::tempdir().unwrap();
    let (reg, _) = registry_with(POLICY, dir.path(), cfg());
    let (tx, mut requests) = tokio::sync::mpsc::unbounded_channel::<ServerRequest>();
    let conn = ConnHandle {
        conn_id: reg.next_conn_id(),
        ready: Arc::new(ReadySet::default()),
        evict: tokio_util::sync::CancellationToken::new(),
        peer_key: None,
        peer_addr: None,
        requests: Some(Arc::new(move |r| {
            let _ = tx.send(r);
        })),
    };
    let (session, _) = reg.create(true, &conn).unwrap();
    let arg = marker(11);
    let spec = execrelay::connection::handlers::start_spec(
        serde_json::from_value(sleep_params("p", &arg)).unwrap(),
        reg.config(),
    )
    .unwrap();
    let caller = Caller {
        conn_id: conn.conn_id,
        can_approve: true,
    };
    let first = tokio::spawn({
        let (s, spec) = (session.clone(), spec.clone());
        async move { s.start_checked(spec, caller).await }
    });
    let req = tokio::time::timeout(GUARD, requests.recv())
        .await
        .unwrap()
        .unwrap();
    let mut retry = Box::pin(session.start_checked(spec, caller));
    assert!(
        (&mut retry).now_or_never().is_none(),
        "the retry waits for the pending start"
    );
    assert!(requests.try_recv().is_err(), "joining does not ask again");
    assert_eq!(
        session.answer(&req.id, ApprovalAnswer::Approve),
        execrelay::session::AnswerOutcome::Answered
    );
    let a = tokio::time::timeout(GUARD, first)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let b = tokio::time::timeout(GUARD, retry).await.unwrap().unwrap();
    assert!(Arc::ptr_eq(&a, &b), "one process for both");
    exec_done(a.pid as i32).await;
    assert_eq!(running_with_arg(&arg), vec![a.pid as i32]);
    a.terminate(Some(Duration::ZERO)).await;
    session.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_different_start_for_a_pending_id_is_a_duplicate() {
    let dir = tempfile::tempdir().unwrap();
    let (reg, _) = registry_with(POLICY, dir.path(), cfg());
    let mut t = connect_to(&reg);
    init(&mut t.client, true).await;
    let mut u = connect_to(&reg);
    let (sid, token) = credentials(&init(&mut u.client, true).await);
    let arg = marker(10);
    // On another connection of the same session (a resume evicts `u`): the pending start's
    // process id is taken for any other spec.
    u.client
        .request("process/start", sleep_params("p", &arg))
        .await;
    let req = server_request(&mut u.client).await;
    let mut v = connect_to(&reg);
    resume_approving(&mut v.client, &sid, &token).await;
    let e = v
        .client
        .call_err(
            "process/start",
            json!({"processId": "p", "argv": ["sleep", "1"]}),
        )
        .await;
    assert_eq!(e["code"], -32002, "{e}");
    answer(&mut v.client, &req["id"], "deny").await;
    assert!(running_with_arg(&arg).is_empty());
    drop(t);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_policy_file_edited_while_the_server_runs_applies_and_a_bad_edit_keeps_it() {
    let dir = tempfile::tempdir().unwrap();
    let (reg, path) = registry_with("default = \"allow\"\n", dir.path(), cfg());
    let mut t = connect_to(&reg);
    init(&mut t.client, false).await;
    let run_echo = |id: &str| json!({"processId": id, "argv": ["echo", "x"]});
    t.client.run(run_echo("e1")).await;

    let replace = |text: &str| {
        let tmp = path.with_extension("new");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
    };
    replace("default = \"allow\"\n[[rule]]\nprogram = \"echo\"\naction = \"deny\"\n");
    let e = t.client.call_err("process/start", run_echo("e2")).await;
    assert_not_approved(&e, "denied by the exec policy", Some("program = \"echo\""));

    replace("default = \"allow\"\n[[rule]]\nprogram = \"echo\"\naction = \"maybe\"\n");
    let e = t.client.call_err("process/start", run_echo("e3")).await;
    assert_not_approved(&e, "denied by the exec policy", None);

    replace("default = \"allow\"\n");
    t.client.run(run_echo("e4")).await;
}

/// A connection that declared it answers server requests, closed its session
/// (`session/close`, as `execrelay run` does at its end) and then went away, ends at once. It
/// used to last its writer's flush deadline (2 s): the closed session kept the connection's
/// request sink, which held its control lane open. Through a relay, every such stream stayed
/// counted against its key's `max_streams_per_key` meanwhile: 16 `execrelay run`s of one key
/// at a time, back to back, were refused `too_many_streams` within a few rounds. Paused time:
/// the end comes with no time passing.
#[tokio::test(start_paused = true)]
async fn a_connection_whose_session_was_closed_ends_at_once_when_its_peer_goes() {
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir().unwrap();
    let (reg, _) = registry_with(POLICY, dir.path(), cfg());
    let mut t = connect_to(&reg);
    init(&mut t.client, true).await;
    t.client.call("session/close", json!({})).await;
    t.client.writer.shutdown().await.unwrap();
    let gone = tokio::time::Instant::now();
    assert_eq!(connection_end(t.end).await, ConnectionEnd::PeerClosed);
    assert_eq!(gone.elapsed(), Duration::ZERO, "the connection lingered");
}
