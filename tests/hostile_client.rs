//! A hostile client against the paths added with the exec policy, approvals, binary output
//! and the typed connection core (red team of the `redteam` branch): each test is an attack
//! that once worked, and checks the bound that now stops it.

mod common;
use common::*;

use std::path::Path;
use std::sync::Arc;

use execrelay::config::ServerConfig;
use execrelay::metrics::Metrics;
use execrelay::policy::resolve::MAX_PATH_LOOKUP_ENTRIES;
use execrelay::policy::PolicyFile;
use execrelay::session::SessionRegistry;
use serde_json::json;

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
