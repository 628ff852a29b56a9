//! Through the relay with the real binaries: `execrelay keygen` for the
//! relay, the exec server and the client; `execrelay-relay`; `execrelay serve --relay`;
//! `execrelay run relay+ws://…`. Output and exit status are the remote ones; what the relay
//! reads and writes on every link holds no plaintext; a client of an environment that is
//! not linked waits for it a few seconds (it may be moving between relays) and then gets
//! `environment_offline` and a clear error, one whose environment comes in that time runs
//! its command, and one whose environment was revoked is told so and stops at once, even in
//! the middle of a command.
//!
//! Every wait is on a line, an exit or a log entry, bounded by a hang guard.

mod common;
use common::noise_bin::{relay_server_and_client, run_bin};
use common::relay::{capturing_proxy, BinEnv, BinRelay};
use common::text;

/// One run through relay and exec server, with every byte on both of the relay's links
/// captured by TCP proxies in front of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_through_the_relay_with_the_real_binaries_and_no_plaintext_on_the_wire() {
    let dir = tempfile::tempdir().unwrap();
    let (relay_keys, server, client, envs, auth) =
        relay_server_and_client(dir.path(), "env-1").await;

    let relay = BinRelay::start(
        &relay_keys.private,
        &envs,
        &[],
        &dir.path().join("relay.log"),
    )
    .await;
    let port: u16 = relay.url.rsplit(':').next().unwrap().parse().unwrap();
    // The exec server's link and the client's link each through a proxy of their own.
    let (env_port, env_cap) = capturing_proxy(port).await;
    let (client_port, client_cap) = capturing_proxy(port).await;
    let env = BinEnv::start(
        &format!("ws://127.0.0.1:{env_port}"),
        "env-1",
        &relay_keys.public,
        &server.private,
        &auth,
        &[],
        &dir.path().join("server.log"),
    )
    .await;

    let url = format!("relay+ws://127.0.0.1:{client_port}/env-1");
    // The output is not in the argv (OUT""PUT), so each is looked for on its own.
    let out = run_bin(
        &url,
        server.pubs(),
        client.p(),
        &[],
        &[
            "sh",
            "-c",
            "echo OUT\"\"PUT-MARK-61; echo err-line >&2; exit 3 # ARGV-MARK-93",
        ],
        None,
    )
    .await;
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "OUTPUT-MARK-61\n");
    assert!(
        text(&out.stderr).contains("err-line"),
        "{}",
        text(&out.stderr)
    );

    assert!(
        env_cap.len() > 0 && client_cap.len() > 0,
        "both links carried frames"
    );
    for cap in [&env_cap, &client_cap] {
        for needle in [
            &b"process/start"[..],
            b"initialize",
            b"ARGV-MARK-93",
            b"OUTPUT-MARK-61",
            b"err-line",
            b"execrelay-client",
        ] {
            assert!(
                !cap.contains(needle),
                "the relay saw {:?} in the clear",
                String::from_utf8_lossy(needle)
            );
        }
    }
    drop(env);
    drop(relay);
}

/// A client of an environment with no link gets `environment_offline`; one whose environment
/// was removed from the relay's environments file while its link was up (the relay closes
/// that link at once and refuses it when it redials) is told it was revoked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_of_an_offline_or_removed_environment_is_told_which() {
    let dir = tempfile::tempdir().unwrap();
    let (relay_keys, server, client, envs, auth) =
        relay_server_and_client(dir.path(), "env-1").await;
    let relay = BinRelay::start(
        &relay_keys.private,
        &envs,
        &["--environments-poll-ms", "100"],
        &dir.path().join("relay.log"),
    )
    .await;
    let server_log = dir.path().join("server.log");
    let env = BinEnv::start(
        &relay.url,
        "env-1",
        &relay_keys.public,
        &server.private,
        &auth,
        &[
            "--relay-backoff-initial-ms",
            "50",
            "--relay-backoff-max-ms",
            "200",
        ],
        &server_log,
    )
    .await;
    let ok = run_bin(
        &env.client_url,
        server.pubs(),
        client.p(),
        &[],
        &["echo", "up"],
        None,
    )
    .await;
    assert_eq!(text(&ok.stdout), "up\n", "{}", text(&ok.stderr));

    // An id the relay has no link for: tried for `FIRST_CONNECT_OFFLINE_WAIT` (a client
    // connecting while its environment moves between relays must not fail), then 255 with
    // the environment named, said to be offline, and what to check.
    let nope = env.client_url.replace("/env-1", "/env-2");
    let started = std::time::Instant::now();
    let out = run_bin(&nope, server.pubs(), client.p(), &[], &["true"], None).await;
    let took = started.elapsed();
    assert_eq!(out.status.code(), Some(255));
    let err = text(&out.stderr);
    assert!(
        err.contains("environment \"env-2\" is offline")
            && err.contains("environment_offline")
            && err.contains("still offline after")
            && err.contains("over 5.0 s")
            && err.contains("--environment-id env-2"),
        "{err}"
    );
    let bound = execrelay::client::FIRST_CONNECT_OFFLINE_WAIT;
    assert!(took >= bound, "gave up after {took:?}, before the bound");
    // The bound, plus a generous allowance for starting the binary on a loaded machine.
    assert!(took < bound * 4, "took {took:?} for a bound of {bound:?}");

    // The line removed while the link is up: the relay closes it, the server's redials are
    // refused (its log says so and what to check), clients are told it was revoked (and stop
    // at once: nothing will bring it back).
    std::fs::write(&envs, "# nobody\n").unwrap();
    common::eventually("the server's log shows its link refused", || {
        std::fs::read_to_string(&server_log)
            .unwrap_or_default()
            .contains("refused environment env-1 (unauthorized): check that")
    })
    .await;
    let out = run_bin(
        &env.client_url,
        server.pubs(),
        client.p(),
        &[],
        &["true"],
        None,
    )
    .await;
    assert_eq!(out.status.code(), Some(255));
    assert!(
        text(&out.stderr).contains("environment \"env-1\" was revoked at the relay"),
        "{}",
        text(&out.stderr)
    );
    let log = std::fs::read_to_string(&server_log).unwrap();
    assert!(log.contains("unauthorized"), "{log}");
    drop(env);
    drop(relay);
}

/// `execrelay demo` shows the whole path: a relay, an exec server registered with it, and
/// the demo command run through the relay over Noise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_runs_its_command_through_a_relay() {
    let out =
        common::binary::output_of(tokio::process::Command::new(common::bin()).arg("demo")).await;
    let stdout = text(&out.stdout);
    // The README's first command: it succeeds.
    assert_eq!(
        out.status.code(),
        Some(0),
        "the demo command's own status; {stdout}{}",
        text(&out.stderr)
    );
    for line in [
        "demo: relay listening on ws://127.0.0.1:",
        "clients reach it at relay+ws://127.0.0.1:",
        "[stdout] tick 5 from pid",
        "[stderr] a line on stderr",
        "demo: the command exited with status 0",
    ] {
        assert!(stdout.contains(line), "{line:?} missing from:\n{stdout}");
    }
    // A command of one's own: its status is the demo's, said in words.
    let out = common::binary::output_of(
        tokio::process::Command::new(common::bin()).args(["demo", "--", "sh", "-c", "exit 7"]),
    )
    .await;
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(7), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("demo: the command exited with status 7"),
        "{stdout}"
    );
}

/// A `run` in the middle of its command when its environment is revoked stops at once, with
/// 255 and the cause (it used to retry for the whole session TTL), not after a minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_environment_is_revoked_stops_at_once_saying_so() {
    use tokio::io::AsyncBufReadExt;
    let dir = tempfile::tempdir().unwrap();
    let (relay_keys, server, client, envs, auth) =
        relay_server_and_client(dir.path(), "env-1").await;
    let relay = BinRelay::start(
        &relay_keys.private,
        &envs,
        &["--environments-poll-ms", "100"],
        &dir.path().join("relay.log"),
    )
    .await;
    let env = BinEnv::start(
        &relay.url,
        "env-1",
        &relay_keys.public,
        &server.private,
        &auth,
        &[],
        &dir.path().join("server.log"),
    )
    .await;
    let url = env.client_url.clone();
    let mut child = tokio::process::Command::new(common::bin())
        .args([
            "run",
            &url,
            "--server-key",
            server.pubs(),
            "--key",
            client.p(),
        ])
        .args(["--", "sh", "-c", "echo ready; sleep 60"])
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut out = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(common::GUARD, out.next_line())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.as_deref(), Some("ready"));
    let t0 = std::time::Instant::now();
    std::fs::write(&envs, "# nobody\n").unwrap();
    let o = tokio::time::timeout(common::PROMPT, child.wait_with_output())
        .await
        .expect("run stops at once, not after the session TTL (60 s)")
        .unwrap();
    assert_eq!(o.status.code(), Some(255));
    assert_eq!(
        text(&o.stderr),
        format!(
            "execrelay: {url}: environment \"env-1\" was revoked at the relay: its key is no longer listed there\n"
        )
    );
    eprintln!("stopped {:?} after the revocation", t0.elapsed());
    drop(env);
    drop(relay);
}

/// `execrelay run` whose environment is away at its first attempt (as when it connects in the
/// instant a relay cluster moves the environment) and comes online right after: the run
/// waits, then works. The exec server dials the relay through a proxy that is cut until the
/// client's first refusal has been seen (in its debug log).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_environment_comes_online_after_its_first_attempt_works() {
    use common::cut_proxy::CutProxy;
    use tokio::io::AsyncBufReadExt;
    let dir = tempfile::tempdir().unwrap();
    let (relay_keys, server, client, envs, auth) =
        relay_server_and_client(dir.path(), "env-1").await;
    let relay = BinRelay::start(
        &relay_keys.private,
        &envs,
        &[],
        &dir.path().join("relay.log"),
    )
    .await;
    let port: u16 = relay.url.rsplit(':').next().unwrap().parse().unwrap();
    let proxy = CutProxy::start(port).await;
    proxy.cut();
    // The exec server runs already, its dials (every 50 to 100 ms) cut until it is let through.
    let env = tokio::spawn({
        let (url, relay_pub, key, auth) = (
            proxy.url("ws"),
            relay_keys.public.clone(),
            server.private.clone(),
            auth.clone(),
        );
        let log = dir.path().join("server.log");
        async move {
            BinEnv::start(
                &url,
                "env-1",
                &relay_pub,
                &key,
                &auth,
                &[
                    "--relay-backoff-initial-ms",
                    "50",
                    "--relay-backoff-max-ms",
                    "100",
                ],
                &log,
            )
            .await
        }
    });

    let mut run = tokio::process::Command::new(common::bin())
        .args([
            "run",
            &format!("{}/env-1", relay.url.replace("ws://", "relay+ws://")),
            "--server-key",
            server.pubs(),
            "--key",
            client.p(),
            "--",
            "echo",
            "came online",
        ])
        .env("RUST_LOG", "execrelay::client=debug")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stderr = tokio::io::BufReader::new(run.stderr.take().unwrap()).lines();
    let mut log = String::new();
    tokio::time::timeout(common::GUARD, async {
        while let Some(line) = stderr.next_line().await.unwrap() {
            log.push_str(&line);
            log.push('\n');
            if line.contains("the environment is offline (or moving); trying again") {
                return;
            }
        }
        panic!("run ended without a retry:\n{log}");
    })
    .await
    .expect("hang guard: the first refusal");

    // Now the environment comes: its server's next dial gets through.
    assert!(
        !env.is_finished(),
        "the environment was online before the refusal"
    );
    proxy.restore();
    let env = tokio::time::timeout(common::GUARD, env)
        .await
        .expect("hang guard: the environment link")
        .unwrap();
    let rest = tokio::spawn(async move {
        let mut more = String::new();
        while let Ok(Some(line)) = stderr.next_line().await {
            more.push_str(&line);
            more.push('\n');
        }
        more
    });
    let out = tokio::time::timeout(common::GUARD, run.wait_with_output())
        .await
        .expect("hang guard: run")
        .unwrap();
    let more = rest.await.unwrap();
    assert_eq!(out.status.code(), Some(0), "{log}{more}");
    assert_eq!(text(&out.stdout), "came online\n");
    drop(env);
    drop(relay);
}
