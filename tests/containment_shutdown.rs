//! Shutdown's `Containment::kill_everything`: every process any session started, on every
//! backend here, including what a session scope cannot attribute (a `setsid` double fork
//! under the `none` backend) and children spawned without a scope — and nothing the server
//! did not start through `spawn.rs`.
//!
//! Its own binary with one test: `kill_everything` kills every process this test binary
//! started through `spawn.rs`, which would break tests running beside it.
//!
//! cgroup backends that are unavailable are reported `SKIPPED` unless
//! `EXECRELAY_REQUIRE_CGROUPS=1` (see `containment.rs`).

use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use execrelay::process::containment::cgroup::wait_until;
use execrelay::process::containment::pidfd::wait_all_exited;
use execrelay::process::containment::{
    procfs, subreaper, BackendChoice, Containment, ContainmentConfig, Pidfd, SessionScope,
};
use execrelay::process::spawn::{spawn_into, OutputReader, SpawnSpec, Spawned};
use tokio::io::{AsyncBufReadExt, BufReader};

const HANG_GUARD: Duration = Duration::from_secs(60);

fn spec(script: &str) -> SpawnSpec {
    SpawnSpec {
        argv: vec!["sh".into(), "-c".into(), script.into()],
        cwd: None,
        env: Vec::new(),
        inherit_env: true,
        tty: None,
        pipe_stdin: false,
    }
}

struct Child {
    sp: Spawned,
    out: BufReader<OutputReader>,
    _err: Option<OutputReader>,
}

async fn start(script: &str, scope: Option<&SessionScope>) -> (Child, Vec<Pidfd>) {
    let mut sp = spawn_into(&spec(script), scope).unwrap();
    let mut outs = std::mem::take(&mut sp.outputs).into_iter();
    let out = outs.next().unwrap().1;
    let mut c = Child {
        sp,
        out: BufReader::new(out),
        _err: outs.next().map(|o| o.1),
    };
    let mut line = String::new();
    tokio::time::timeout(HANG_GUARD, c.out.read_line(&mut line))
        .await
        .expect("hang guard")
        .unwrap();
    let fds = line
        .split_whitespace()
        .map(|p| Pidfd::open(p.parse().unwrap()).unwrap())
        .collect();
    (c, fds)
}

#[tokio::test]
async fn kill_everything_leaves_nothing_a_session_started() {
    subreaper::start_reaper().unwrap();
    let required = std::env::var("EXECRELAY_REQUIRE_CGROUPS").is_ok_and(|v| v == "1");
    for kind in [
        BackendChoice::Cgroup2,
        BackendChoice::Cgroup1,
        BackendChoice::None,
    ] {
        let cfg = ContainmentConfig {
            backend: kind,
            cgroup_name: format!("execrelay-test-shutdown-{kind:?}").to_lowercase(),
            session_pids_max: None,
        };
        let c = match Containment::new(&cfg) {
            Ok(c) => c,
            Err(e) if kind != BackendChoice::None && !required => {
                eprintln!("SKIPPED: {kind:?} unavailable here ({e})");
                continue;
            }
            Err(e) => panic!("{kind:?}: {e}"),
        };
        assert!(c.sweep_stale().failures.is_empty());
        let a = c.open_scope().unwrap();
        let b = c.open_scope().unwrap();
        let mut held = Vec::new();
        let mut children = Vec::new();
        for (script, scope) in [
            ("sleep 1000 & echo $!; exit 0", Some(&a)),
            (
                "bash -c 'set -m; sleep 1000 & echo $!; wait' & wait",
                Some(&a),
            ),
            ("setsid sh -c 'sleep 1000 & echo $!'; exit 0", Some(&b)),
            ("(sleep 1000 & echo $!); exec sleep 1000", Some(&b)),
            // Spawned in no scope at all.
            ("sleep 1000 & echo $!; wait", None),
        ] {
            let (child, fds) = start(script, scope.map(|s| &**s)).await;
            // The direct child too, by pidfd.
            held.push(Pidfd::open(child.sp.pid).unwrap());
            held.extend(fds);
            children.push(child);
        }
        // Something the server did not start through spawn.rs: not ours to kill.
        let mut foreign = std::process::Command::new("sleep")
            .arg("1000")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let foreign_fd = Pidfd::open(foreign.id()).unwrap();
        let dirs = c.instance_dirs();

        let report = tokio::time::timeout(HANG_GUARD, c.kill_everything())
            .await
            .expect("hang guard")
            .unwrap();
        assert!(report.emptied, "{kind:?}: {report:?}");
        for fd in &held {
            assert!(
                fd.has_exited().unwrap(),
                "{kind:?}: {} survived kill_everything",
                fd.pid()
            );
        }
        for mut child in children {
            let st = tokio::time::timeout(HANG_GUARD, child.sp.child.wait())
                .await
                .expect("hang guard")
                .unwrap();
            assert!(
                st.signal() == Some(libc::SIGKILL) || st.code() == Some(0),
                "{st:?}"
            );
        }
        for d in dirs {
            assert!(!d.exists(), "{} left behind", d.display());
        }
        assert!(
            !foreign_fd.has_exited().unwrap(),
            "a foreign child was killed"
        );
        // The orphans among them were ours: the reaper reaps them.
        let deadline = Instant::now() + HANG_GUARD;
        assert!(wait_until(deadline, || Ok(held.iter().all(|fd| !fd.is_unreaped()))).unwrap());
        foreign.kill().unwrap();
        foreign.wait().unwrap();
        assert_eq!(wait_all_exited(&[&foreign_fd], Duration::ZERO).unwrap(), 0);
        // Nothing of ours is left in the tree.
        let me = std::process::id();
        for pid in procfs::children(me).unwrap() {
            let st = procfs::read_stat(pid).unwrap();
            assert!(st.is_dead(), "left: {st:?}");
        }
    }
}
