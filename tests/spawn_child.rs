//! The child's start-up contract through both clones (`process/spawn/`): what `std`'s
//! `Command` gave a child before (execvp's `PATH` search and its errors, a script without
//! `#!` run by `/bin/sh`, the environment and working directory, an empty signal mask and
//! default dispositions, stdin on `/dev/null`, no stray descriptors), a failed start that
//! leaves no zombie, and a dropped handle whose child the subreaper reaps.

use std::os::unix::fs::PermissionsExt;
use std::sync::Once;
use std::time::{Duration, Instant};

use std::sync::Arc;

use execrelay::process::containment::{
    procfs, subreaper, BackendChoice, Containment, ContainmentConfig, Pidfd, SessionScope,
};
use execrelay::process::spawn::{
    clone3_usable, spawn_with, CloneMethod, ClonePreference, OutputReader, SpawnSpec, Spawned,
};
use execrelay::process::start_error::StartWhat;
use tokio::io::AsyncReadExt;

/// Hang guard for anything that waits on the wall clock (never a synchronisation).
const HANG_GUARD: Duration = Duration::from_secs(60);

/// One way to start a child: in no scope (`clone`), or in a v2 session scope by `clone3`
/// (where usable) or by `clone` with the child writing itself in.
struct Way {
    scope: Option<Arc<SessionScope>>,
    pref: ClonePreference,
    _c: Option<Containment>,
}

impl std::fmt::Debug for Way {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?} in a scope: {}", self.pref, self.scope.is_some())
    }
}

impl Way {
    fn spawn(
        &self,
        spec: &SpawnSpec,
    ) -> Result<Spawned, execrelay::process::start_error::StartError> {
        let sp = spawn_with(spec, self.scope.as_deref(), self.pref)?;
        let v2 = self.scope.is_some() && self.pref == ClonePreference::Auto;
        let want = if v2 && clone3_usable() {
            CloneMethod::Clone3IntoCgroup
        } else {
            CloneMethod::CloneVfork
        };
        assert_eq!(sp.method, want, "{self:?}");
        Ok(sp)
    }
}

/// Every way this machine offers (the v2 ones only where a cgroup2 containment can be made).
fn ways() -> Vec<Way> {
    setup();
    let mut out = vec![Way {
        scope: None,
        pref: ClonePreference::Auto,
        _c: None,
    }];
    for pref in [ClonePreference::Auto, ClonePreference::CloneOnly] {
        let cfg = ContainmentConfig {
            backend: BackendChoice::Cgroup2,
            cgroup_name: "execrelay-test-spawn-child".into(),
            session_pids_max: None,
        };
        match Containment::new(&cfg) {
            Ok(c) => out.push(Way {
                scope: Some(c.open_scope().unwrap()),
                pref,
                _c: Some(c),
            }),
            Err(e) => eprintln!("SKIPPED: the v2 ways ({e})"),
        }
    }
    out
}

fn setup() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| subreaper::start_reaper().expect("become a subreaper"));
}

fn spec(argv: &[&str]) -> SpawnSpec {
    SpawnSpec::command(argv)
}

/// Run to the end: (exit code, stdout, stderr).
async fn run(spec: &SpawnSpec, way: &Way) -> (Option<i32>, String, String) {
    let mut sp = way.spawn(spec).expect("spawn");
    collect(&mut sp).await
}

async fn collect(sp: &mut Spawned) -> (Option<i32>, String, String) {
    let mut texts = Vec::new();
    for (_, mut r) in std::mem::take(&mut sp.outputs) {
        let mut buf = Vec::new();
        tokio::time::timeout(HANG_GUARD, r.read_to_end(&mut buf))
            .await
            .expect("hang guard: output did not end")
            .unwrap();
        texts.push(String::from_utf8_lossy(&buf).into_owned());
    }
    let st = tokio::time::timeout(HANG_GUARD, sp.child.wait())
        .await
        .expect("hang guard: child did not exit")
        .unwrap();
    let err = texts.pop().unwrap_or_default();
    let out = texts.pop().unwrap_or_default();
    (st.code(), out, err)
}

fn scratch(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("execrelay-spawn-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn write_file(path: &std::path::Path, text: &str, mode: u32) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[tokio::test]
async fn a_script_without_interpreter_line_runs_under_sh_with_its_arguments() {
    let d = scratch("script");
    let script = d.join("plain");
    write_file(&script, "echo \"$0|$1|$2\"\nexit 7\n", 0o755);
    for way in ways() {
        let (code, out, _) = run(&spec(&[script.to_str().unwrap(), "a b", "c"]), &way).await;
        assert_eq!(code, Some(7), "{way:?}");
        assert_eq!(out, format!("{}|a b|c\n", script.display()), "{way:?}");
    }
    std::fs::remove_dir_all(d).unwrap();
}

#[tokio::test]
async fn path_search_uses_the_childs_path_and_execvps_error_rules() {
    let d = scratch("path");
    let (a, b) = (d.join("a"), d.join("b"));
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    // Not executable in `a`, executable in `b`: the search goes on past EACCES.
    write_file(&a.join("prog"), "#!/bin/sh\necho from-a\n", 0o644);
    write_file(&b.join("prog"), "#!/bin/sh\necho from-b\n", 0o755);
    // Only a non-executable one: EACCES, not ENOENT.
    write_file(&a.join("noexec"), "#!/bin/sh\necho no\n", 0o644);
    let path = format!("/nonexistent:{}:{}", a.display(), b.display());
    for way in ways() {
        let mut s = spec(&["prog"]);
        s.env.push(("PATH".into(), Some(path.clone())));
        let (code, out, _) = run(&s, &way).await;
        assert_eq!((code, out.as_str()), (Some(0), "from-b\n"), "{way:?}");

        let mut s = spec(&["noexec"]);
        s.env.push(("PATH".into(), Some(path.clone())));
        let e = way.spawn(&s).err().expect("not executable");
        assert_eq!((e.what, e.errno), (StartWhat::Program, Some(libc::EACCES)));

        let mut s = spec(&["no-such-program-anywhere"]);
        s.env.push(("PATH".into(), Some(path.clone())));
        let e = way.spawn(&s).err().expect("missing");
        assert_eq!((e.what, e.errno), (StartWhat::Program, Some(libc::ENOENT)));
        assert!(e.message().contains("not found in PATH"), "{}", e.message());

        // The whole PATH is searched, however long, as execvp does.
        let mut s = spec(&["prog"]);
        let long = format!("{}:{}", vec!["/nonexistent"; 3000].join(":"), b.display());
        s.env.push(("PATH".into(), Some(long)));
        let (code, out, _) = run(&s, &way).await;
        assert_eq!((code, out.as_str()), (Some(0), "from-b\n"), "{way:?}");

        // Too long a name is not looked up at all, as execvp does.
        let long = "x".repeat(300);
        let e = way.spawn(&spec(&[&long])).err().expect("too long");
        assert_eq!(e.errno, Some(libc::ENAMETOOLONG));
    }
    std::fs::remove_dir_all(d).unwrap();
}

#[tokio::test]
async fn environment_directory_and_stdin_are_the_specs() {
    let d = scratch("env");
    for way in ways() {
        let mut s = spec(&[
            "/bin/sh",
            "-c",
            "echo \"$FOO|${HOME-unset}|$(pwd)\"; cat; echo end",
        ]);
        s.inherit_env = false;
        s.env = vec![
            ("FOO".into(), Some("bar".into())),
            ("HOME".into(), Some("/x".into())),
            ("HOME".into(), None),
        ];
        s.cwd = Some(d.to_str().unwrap().into());
        let (code, out, _) = run(&s, &way).await;
        // stdin is /dev/null: `cat` ends at once.
        assert_eq!(code, Some(0));
        assert_eq!(out, format!("bar|unset|{}\nend\n", d.display()), "{way:?}");
    }
    std::fs::remove_dir_all(d).unwrap();
}

/// A field of `/proc/self/status` as the child saw it.
fn status_field<'a>(text: &'a str, key: &str) -> &'a str {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .unwrap_or_else(|| panic!("no {key} in {text}"))
        .trim()
}

#[tokio::test]
async fn the_program_starts_with_no_signal_blocked_ignored_or_caught() {
    // This process ignores SIGPIPE (the Rust runtime) and, here, the C library's reserved
    // signal 32, and the clone blocks every signal: none of it reaches the program.
    let own = std::fs::read_to_string("/proc/self/status").unwrap();
    let own_ign = u64::from_str_radix(status_field(&own, "SigIgn:"), 16).unwrap();
    assert_ne!(own_ign & (1 << (libc::SIGPIPE - 1)), 0, "precondition");
    for way in ways() {
        let (code, out, _) = run(&spec(&["cat", "/proc/self/status"]), &way).await;
        assert_eq!(code, Some(0));
        assert_eq!(status_field(&out, "SigBlk:"), "0000000000000000", "{way:?}");
        assert_eq!(status_field(&out, "SigIgn:"), "0000000000000000", "{way:?}");
        assert_eq!(status_field(&out, "SigCgt:"), "0000000000000000", "{way:?}");
    }
}

#[tokio::test]
async fn the_child_holds_only_its_three_descriptors() {
    for way in ways() {
        // `ls` of its own fd table: 0, 1, 2 and the directory `ls` itself opened.
        let (code, out, _) = run(&spec(&["ls", "/proc/self/fd"]), &way).await;
        assert_eq!(code, Some(0));
        let fds: Vec<u32> = out.split_whitespace().map(|f| f.parse().unwrap()).collect();
        assert_eq!(fds.len(), 4, "{way:?}: {fds:?}");
        assert_eq!(&fds[..3], &[0, 1, 2], "{way:?}");
    }
}

/// Failed starts (a missing directory: before `setsid`; a missing program: at exec) are
/// reaped by the spawn itself: no zombie of the spawning thread is left.
#[test]
fn failed_starts_leave_no_zombie() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let handle = rt.handle().clone();
    // The children are named after the thread that cloned them (they never exec).
    let name = "spawnfail";
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let _g = handle.enter();
            for way in ways() {
                for _ in 0..10 {
                    let mut s = spec(&["true"]);
                    s.cwd = Some("/no/such/dir".into());
                    let e = way.spawn(&s).err().expect("missing cwd");
                    assert_eq!((e.what, e.errno), (StartWhat::Cwd, Some(libc::ENOENT)));
                    let e = way
                        .spawn(&spec(&["/no/such/prog"]))
                        .err()
                        .expect("missing program");
                    assert_eq!((e.what, e.errno), (StartWhat::Program, Some(libc::ENOENT)));
                }
            }
        })
        .unwrap()
        .join()
        .unwrap();
    let me = std::process::id();
    let left: Vec<u32> = procfs::children(me)
        .unwrap()
        .into_iter()
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == name)
        })
        .collect();
    assert!(left.is_empty(), "unreaped failed children: {left:?}");
}

/// A handle dropped before its child exits (or after, unreaped) leaves the child to the
/// subreaper, which reaps it: no zombie.
#[tokio::test]
async fn a_dropped_child_is_reaped_by_the_subreaper() {
    setup();
    for way in ways() {
        for exited_first in [false, true] {
            let mut s = spec(&["sh", "-c", "read x; exit 3"]);
            s.pipe_stdin = true;
            let mut sp = way.spawn(&s).expect("spawn");
            let fd = Pidfd::open(sp.pid).unwrap();
            let outputs: Vec<(_, OutputReader)> = std::mem::take(&mut sp.outputs);
            if exited_first {
                drop(sp.stdin.take());
                let deadline = Instant::now() + HANG_GUARD;
                while !fd.has_exited().unwrap() {
                    assert!(Instant::now() < deadline, "hang guard: child did not exit");
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
            // Dropping the handle (and stdin: end of file) lets the child end.
            drop(sp);
            drop(outputs);
            let deadline = Instant::now() + HANG_GUARD;
            while fd.is_unreaped() {
                assert!(
                    Instant::now() < deadline,
                    "hang guard: {way:?} exited_first={exited_first}: never reaped"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
}

/// Children without a stdin pipe share the server's one `/dev/null`: each, one after the
/// other, reads end of file from it at once, and none holds the server's copy.
#[tokio::test]
async fn every_child_without_a_stdin_pipe_reads_dev_null() {
    for way in ways() {
        for _ in 0..3 {
            let (code, out, _) = run(
                &spec(&[
                    "sh",
                    "-c",
                    "readlink /proc/self/fd/0; cat; ls /proc/self/fd | wc -l",
                ]),
                &way,
            )
            .await;
            assert_eq!(code, Some(0), "{way:?}");
            // `ls` of its own table: 0, 1, 2 and the directory it opened.
            assert_eq!(out, "/dev/null\n4\n", "{way:?}");
        }
    }
}
