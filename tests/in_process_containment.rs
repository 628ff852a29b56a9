//! The in-process server's containment (`connection/local.rs`, `LocalServer::shutdown`): its
//! shutdown kills, through containment as a network server's does, what its session started
//! even when it left its process group and session, and removes its instance cgroup.
//!
//! One test in a binary of its own: a process that calls `setsid` and whose parent exits is
//! attributed to no session by the tree walk, so another server's shutdown in the same
//! process (a parallel test) would kill it first ("whichever shuts down first",
//! `process/containment/mod.rs`), and this test could not tell whose shutdown did.

mod common;
use common::local::{handshake, start};
use common::*;

use std::sync::Arc;
use std::time::Duration;

use execrelay::config::ServerConfig;
use execrelay::connection::local::{LocalLimits, LocalServer};

/// Shutdown goes through containment, as a network server's does: a process the session
/// started that left its process group and session (`setsid` in the background, its parent
/// gone, so no group signal could reach it) is killed too, and the server's instance cgroup
/// is removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_kills_what_left_the_group_and_leaves_no_cgroup() {
    use common::contain::{assert_gone, cgroups_required, number_after, Tracked};
    use execrelay::process::event_log::EventBody;
    let cfg = ServerConfig::default();
    let limits = LocalLimits::for_config(&cfg);
    let (server, mut end) = LocalServer::start(Arc::new(cfg), None, limits).expect("server starts");
    let cgroups = server.registry().containment().instance_dirs();
    assert!(
        !cgroups.is_empty() || !cgroups_required(),
        "EXECRELAY_REQUIRE_CGROUPS=1 but the in-process server has no cgroup"
    );
    assert!(cgroups.iter().all(|d| d.is_dir()), "{cgroups:?}");
    handshake(&mut end).await;
    // The pid is printed from inside the new session, and the pipe is closed before the sleep,
    // so the start's output (and its exit notice) ends at once.
    let sh = start(
        &mut end,
        2,
        "escape",
        &[
            "sh",
            "-c",
            "setsid sh -c 'echo escaped=$$ >&3; exec sleep 1000 3>&-' 3>&1 >/dev/null 2>&1 &",
        ],
    )
    .await;
    let mut out = String::new();
    let escaped = loop {
        let ev = tokio::time::timeout(GUARD, end.events.recv())
            .await
            .expect("no event (hang guard)")
            .expect("server gone");
        match ev.body {
            EventBody::Output { chunk, .. } => out.push_str(&String::from_utf8_lossy(&chunk)),
            EventBody::Omitted { .. } => panic!("no cap was asked for"),
            EventBody::Exited(_) => {
                break number_after(&out, "escaped=").unwrap_or_else(|| panic!("{out:?}"))
            }
        }
    };
    let escaped = Tracked::of(escaped);
    let st = escaped.stat().expect("the escaped process runs");
    assert_eq!(
        st.sid, escaped.pid,
        "premise: it leads a session of its own"
    );
    assert_ne!(st.pgid, sh, "premise: it left the start's process group");
    tokio::time::timeout(GUARD, server.shutdown(Duration::from_secs(5)))
        .await
        .expect("shutdown returned (hang guard)");
    assert_gone("the process that left its group", &[escaped]);
    for d in &cgroups {
        assert!(!d.exists(), "instance cgroup {} left behind", d.display());
    }
    drop(end);
}
