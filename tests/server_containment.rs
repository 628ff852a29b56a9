//! Process containment where the server process itself must go: the built binary,
//! stopped by SIGTERM or killed by SIGKILL and started again, and what it leaves in `/proc`
//! (processes recorded by pid and start time). Also the start-up error of a containment
//! backend named explicitly that cannot work here.
//!
//! The crash test needs a cgroup backend (a crash leaves orphans under init; only the
//! sweep of the dead server's cgroup at the next start finds them): without one it prints
//! `SKIPPED`, unless `EXECRELAY_REQUIRE_CGROUPS=1`.

mod common;

use std::process::Stdio;
use std::time::Duration;

use serde_json::json;
use tokio::process::{Child, ChildStdout};

use common::binary::{first_line, output_of, serve_cmd, ws_client};
use common::contain::{
    all_gone, assert_gone, cgroups_here, number_after, start_pty_job, start_stubborn_child, Tracked,
};
use common::process::read_until;
use common::*;
use execrelay::config::BackendChoice;
use execrelay::process::containment::{Containment, ContainmentConfig};
use execrelay::transport::websocket::connect_websocket;

/// A running `execrelay serve` on a local port and a client of it.
struct Served {
    child: Child,
    client: RawClient,
    /// The rest of its stdout, kept open.
    _out: tokio::io::Lines<tokio::io::BufReader<ChildStdout>>,
}

async fn serve(args: &[&str]) -> Served {
    let mut cmd = serve_cmd("ws://127.0.0.1:0", Stdio::null());
    cmd.args(args).env("RUST_LOG", "warn");
    let mut child = cmd.spawn().expect("start the server");
    let (url, out) = first_line(&mut child, GUARD).await;
    let url = url.expect("the server prints its URL");
    let t = connect_websocket(&url, 16 << 20)
        .await
        .expect("connect to the server");
    let mut client = ws_client(t);
    client.handshake().await;
    Served {
        child,
        client,
        _out: out,
    }
}

/// Send `sig` to the server.
fn signal(child: &Child, sig: libc::c_int) {
    let pid = child.id().expect("the server runs") as libc::pid_t;
    // SAFETY: kill on the pid of a child we have not reaped (it cannot have been reused).
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0, "kill the server");
}

/// Wait (hang guard) for the server to exit; its exit status.
async fn exited(child: &mut Child) -> std::process::ExitStatus {
    tokio::time::timeout(GUARD, child.wait())
        .await
        .expect("the server exits (hang guard)")
        .expect("wait for the server")
}

/// Item 2: a PTY shell's job-control job (a process group of its own) is gone when the server
/// has exited after SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_to_the_server_ends_a_pty_shells_background_job() {
    let mut s = serve(&[]).await;
    let (shell, job) = start_pty_job(&mut s.client, "sh", 200).await;
    signal(&s.child, libc::SIGTERM);
    let status = exited(&mut s.child).await;
    assert!(status.success(), "{status:?}");
    // The server kills everything its sessions started before it exits.
    assert_gone("after the server's SIGTERM", &[job, shell]);
}

/// Item 3: `sh -c 'sleep 1000 & wait'` under a server killed with SIGKILL. The parent-death
/// signal takes the shell; the `sleep` runs on under init until a server of the same
/// `cgroup_name` starts again, which kills it (crash sweep) before it prints its URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_servers_processes_are_gone_once_a_server_starts_again() {
    if !cgroups_here("a_crashed_servers_processes_are_gone_once_a_server_starts_again") {
        return;
    }
    let name = format!("execrelay-crash-test-{}", std::process::id());
    let args = ["--cgroup-name", name.as_str()];
    let mut first = serve(&args).await;
    let c = &mut first.client;
    let r = c
        .start(json!({"processId": "w", "argv": ["sh", "-c", "sleep 1000 & echo JOB:$!; wait"]}))
        .await;
    let shell = Tracked::of(r["pid"].as_u64().expect("pid") as u32);
    let mut acc = Collected::default();
    read_until(c, "w", &mut acc, "the job's pid", |a| {
        number_after(&text(&a.stdout), "JOB:").is_some()
    })
    .await;
    let job = Tracked::of(number_after(&text(&acc.stdout), "JOB:").expect("the job's pid"));

    signal(&first.child, libc::SIGKILL);
    exited(&mut first.child).await;
    all_gone("the direct child, by the parent-death signal", &[shell]).await;
    assert!(job.alive(), "the crash left the grandchild running");

    let mut second = serve(&args).await;
    // Started means swept: nothing of the first server's sessions is left.
    assert_gone("once a server started again", &[job]);
    signal(&second.child, libc::SIGTERM);
    assert!(exited(&mut second.child).await.success());
}

/// Item 5: a huge `killGraceMs` is refused naming the cap; a child that ignores SIGTERM,
/// started with the largest grace allowed, cannot hold a SIGTERMed server past the caps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_to_the_server_ends_within_the_caps() {
    let mut s = serve(&[
        "--max-kill-grace-ms",
        "1000",
        "--max-drain-timeout-ms",
        "1000",
    ])
    .await;
    let child = start_stubborn_child(&mut s.client, 1000, json!({"drainTimeoutMs": 1000})).await;

    let t0 = tokio::time::Instant::now();
    signal(&s.child, libc::SIGTERM);
    let status = exited(&mut s.child).await;
    let took = t0.elapsed();
    assert!(status.success(), "{status:?}");
    assert_gone("the SIGTERM-ignoring child", &[child]);
    // Its grace was honoured (it ignored SIGTERM, only SIGKILL ended it) …
    assert!(took >= Duration::from_millis(1000), "{took:?}");
    // … and bounded by the caps: grace + drain + the 5 s delivery grace, with slack.
    assert!(
        took < Duration::from_millis(1000 + 1000 + 5000 + 5000),
        "{took:?}"
    );
}

/// A cgroup backend named explicitly that cannot work here stops the start with its reason
/// (exit status 2, nothing bound); one that works starts. Which is which depends on the
/// machine, so each is probed here first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_explicit_backend_that_cannot_work_here_fails_the_start() {
    let cases: [(&str, BackendChoice, Option<&str>); 4] = [
        ("cgroup2", BackendChoice::Cgroup2, None),
        ("cgroup1", BackendChoice::Cgroup1, None),
        ("cgroup2", BackendChoice::Cgroup2, Some("64")),
        ("cgroup1", BackendChoice::Cgroup1, Some("64")),
    ];
    let mut refused = 0;
    for (word, backend, pids) in cases {
        let works = Containment::new(&ContainmentConfig {
            backend,
            cgroup_name: "execrelay-probe".into(),
            session_pids_max: pids.map(|p| p.parse().expect("number")),
        })
        .is_ok();
        let mut cmd = tokio::process::Command::new(bin());
        cmd.args(["serve", "--listen", "stdio", "--containment-backend", word]);
        if let Some(p) = pids {
            cmd.args(["--session-pids-max", p]);
        }
        let o = output_of(&mut cmd).await;
        let stderr = text(&o.stderr);
        if works {
            // stdin is /dev/null: the stdio server starts and ends at once.
            assert_eq!(o.status.code(), Some(0), "{word} {pids:?}: {stderr}");
        } else {
            refused += 1;
            assert_eq!(o.status.code(), Some(2), "{word} {pids:?}: {stderr}");
            assert!(
                stderr.contains(&format!("containment backend {word} unavailable")),
                "{word} {pids:?}: {stderr}"
            );
        }
    }
    eprintln!("{refused} of 4 explicit backends are unavailable here");
    // `none` always works.
    let mut cmd = tokio::process::Command::new(bin());
    cmd.args([
        "serve",
        "--listen",
        "stdio",
        "--containment-backend",
        "none",
    ]);
    assert_eq!(output_of(&mut cmd).await.status.code(), Some(0));
}
