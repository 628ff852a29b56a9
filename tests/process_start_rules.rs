//! What `process/start` refuses before anything is spawned, through
//! a real `ConnectionProcessor`: client-chosen durations above the server's caps (refused,
//! naming the cap, not clamped), terminal sizes with a zero side (one rule with
//! `process/resize`, the same error), and environment entries a child cannot receive as given.

mod common;

use serde_json::{json, Value};

use common::*;
use execrelay::config::ServerConfig;

async fn ready() -> InProcess {
    ready_with(ServerConfig {
        max_kill_grace_ms: 1_000,
        max_drain_timeout_ms: 2_000,
        max_timeout_ms: 5_000,
        ..cfg()
    })
    .await
}

/// `process/start` of `true` with `extra` params merged in: the error, if refused.
async fn start_err(c: &mut RawClient, id: &str, extra: Value) -> Option<Value> {
    let mut params = json!({"processId": id, "argv": ["true"]});
    for (k, v) in extra.as_object().expect("an object") {
        params[k] = v.clone();
    }
    let rid = c.request("process/start", params).await;
    let r = c.response(rid).await;
    match r.get("error") {
        Some(e) => Some(e.clone()),
        None => {
            let done = c.collect(id).await;
            assert_eq!(done.exit["exitCode"], 0, "{}", done.exit);
            None
        }
    }
}

fn assert_invalid(e: Option<Value>, needles: &[&str]) {
    let e = e.expect("refused");
    assert_eq!(e["code"], -32602, "{e}");
    let msg = e["message"].as_str().expect("message");
    for n in needles {
        assert!(msg.contains(n), "{msg:?} lacks {n:?}");
    }
}

/// Each cap at its edge: the cap itself is accepted, one more is refused with a message that
/// names the member, the value and the setting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durations_above_the_caps_are_refused_naming_the_cap() {
    let mut ip = ready().await;
    let c = &mut ip.client;
    for (member, setting, cap) in [
        ("killGraceMs", "max_kill_grace_ms", 1_000u64),
        ("drainTimeoutMs", "max_drain_timeout_ms", 2_000),
        ("timeoutMs", "max_timeout_ms", 5_000),
    ] {
        let over = cap + 1;
        assert_invalid(
            start_err(c, &format!("{member}-over"), json!({ member: over })).await,
            &[member, &over.to_string(), setting, &cap.to_string()],
        );
        assert_eq!(
            start_err(c, &format!("{member}-at"), json!({ member: cap })).await,
            None,
            "{member} at the cap"
        );
    }
    // A value left out is the default (2000 ms), lowered to a cap below it: nothing the
    // client chose is refused.
    assert_eq!(start_err(c, "defaults", json!({})).await, None);
    assert_invalid(
        start_err(c, "huge", json!({"killGraceMs": 1_000_000_000_000u64})).await,
        &["max_kill_grace_ms"],
    );
}

/// One rule for terminal sizes: a zero side is refused by `process/start` and by
/// `process/resize`, with the same error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_sized_terminal_is_refused_by_start_and_resize_alike() {
    let mut ip = ready_with(cfg()).await;
    let c = &mut ip.client;
    let mut refusals = Vec::new();
    for (rows, cols) in [(0, 0), (0, 80), (24, 0)] {
        let e = c
            .call_err(
                "process/start",
                json!({"processId": "z", "argv": ["true"], "tty": true,
                       "size": {"rows": rows, "cols": cols}}),
            )
            .await;
        refusals.push(e);
    }
    let r = c
        .start(
            json!({"processId": "t", "argv": ["sh", "-c", "read x"], "tty": true,
                      "size": {"rows": 24, "cols": 80}}),
        )
        .await;
    for (rows, cols) in [(0, 0), (0, 80), (24, 0)] {
        let e = c
            .call_err(
                "process/resize",
                json!({"processId": "t", "rows": rows, "cols": cols}),
            )
            .await;
        refusals.push(e);
    }
    let first = refusals[0].clone();
    assert_eq!(first["code"], -32602, "{first}");
    for e in &refusals {
        assert_eq!(e, &first, "one rule, one error");
    }
    // A positive size is fine on both paths.
    assert_eq!(
        c.call(
            "process/resize",
            json!({"processId": "t", "rows": 1, "cols": 1})
        )
        .await,
        json!({})
    );
    c.write("t", b"\n").await;
    let done = c.collect("t").await;
    assert_eq!(done.exit["exitCode"], 0, "{}", done.exit);
    kill_group(&r["pid"]);
}

/// Environment names that are empty or hold `=` or NUL, and values with NUL, are refused
/// naming the variable; `{"A=B": "C"}` used to reach the child as `A=B=C`, that is `A` set to
/// `B=C`. A value may hold `=`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn environment_entries_the_child_cannot_receive_are_refused() {
    let mut ip = ready_with(cfg()).await;
    let c = &mut ip.client;
    for (env, named) in [
        (json!({"A=B": "C"}), r#""A=B""#),
        (json!({"": "x"}), r#""""#),
        (json!({"=": "x"}), r#""=""#),
        (json!({"A\u{0}B": "x"}), r#""A\u0000B""#),
        (json!({"GOOD": "1", "V": "a\u{0}b"}), r#""V""#),
    ] {
        let e = start_err(c, "e", json!({ "env": env })).await;
        assert_invalid(e, &["env", named]);
    }
    let got = c
        .run(
            json!({"processId": "ok", "argv": ["sh", "-c", "printf '%s|%s' \"$A\" \"${C-unset}\""],
                    "env": {"A": "B=C", "C": null}}),
        )
        .await;
    assert_eq!(text(&got.stdout), "B=C|unset");
}
