//! The `execrelay-relay` binary: it prints its bound URL first, answers `/readyz` and
//! `/metrics`, admits a listed environment, logs refusals clearly on stderr, refuses bad
//! flags and files before serving, and exits 0 on SIGTERM after closing its links.

mod harness;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;

use execrelay_io::driver::EndpointLink;
use execrelay_protocol::config::EndpointConfig;
use execrelay_protocol::env_handshake::LinkRefusal;
use execrelay_protocol::keys::{public_line, Keypair};
use harness::{env_handshake, guard, http_get, metric_of, next_ts, GUARD};

const BIN: &str = env!("CARGO_BIN_EXE_execrelay-relay");

struct Running {
    child: Child,
    url: String,
    addr: SocketAddr,
    metrics: SocketAddr,
    stderr: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Running {
    /// Wait for a stderr line containing every needle.
    fn wait_stderr(&mut self, needles: &[&str]) -> String {
        loop {
            if let Some(l) = self
                .seen
                .iter()
                .find(|l| needles.iter().all(|n| l.contains(n)))
            {
                return l.clone();
            }
            match self.stderr.recv_timeout(GUARD) {
                Ok(l) => self.seen.push(l),
                Err(_) => panic!(
                    "no stderr line with {needles:?} in:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }
}

fn start(dir: &std::path::Path, env_keys: &Keypair) -> (Running, Keypair) {
    start_limited(dir, env_keys, None)
}

/// [`start`] under `sh -c 'ulimit LIMIT; exec relay …'` (`-Sn 200`: the soft open files
/// limit only; `-n 300`: soft and hard).
fn start_limited(
    dir: &std::path::Path,
    env_keys: &Keypair,
    ulimit: Option<&str>,
) -> (Running, Keypair) {
    let relay_keys = Keypair::generate().unwrap();
    let key = dir.join("relay.key");
    relay_keys.write(&key, "relay").unwrap();
    let envs = dir.join("environments");
    std::fs::write(
        &envs,
        format!(
            "# test fleet\nsandbox-1 {}\n",
            public_line(&env_keys.public, "box")
        ),
    )
    .unwrap();
    let mut cmd = match ulimit {
        Some(limit) => {
            let mut c = Command::new("sh");
            c.arg("-c")
                .arg(format!("ulimit {limit} && exec \"$0\" \"$@\""))
                .arg(BIN);
            c
        }
        None => Command::new(BIN),
    };
    let mut child = cmd
        .args([
            "--listen",
            "ws://127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
        ])
        .arg("--key")
        .arg(&key)
        .arg("--environments")
        .arg(&envs)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    let url = first.trim_end().to_string();
    let addr: SocketAddr = url
        .strip_prefix("ws://")
        .unwrap_or_else(|| panic!("first stdout line {url:?}"))
        .parse()
        .unwrap();
    let (tx, stderr) = mpsc::channel();
    let err = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let mut running = Running {
        child,
        url,
        addr,
        metrics: "127.0.0.1:1".parse().unwrap(),
        stderr,
        seen: Vec::new(),
    };
    let line = running.wait_stderr(&["execrelay-relay metrics: http://"]);
    running.metrics = line
        .rsplit("http://")
        .next()
        .unwrap()
        .trim_end_matches("/metrics")
        .parse()
        .unwrap();
    (running, relay_keys)
}

fn sigterm(child: &Child) {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_prints_its_url_serves_readyz_and_metrics_and_exits_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let env_keys = Keypair::generate().unwrap();
    let (mut r, relay_keys) = start(dir.path(), &env_keys);
    assert!(r.url.starts_with("ws://127.0.0.1:"), "{}", r.url);
    assert_ne!(r.addr.port(), 0, "the real port is printed");

    assert_eq!(http_get(r.addr, "/readyz").await.0, 200);
    let (status, body) = http_get(r.metrics, "/metrics").await;
    assert_eq!(status, 200);
    assert_eq!(metric_of(&body, "execrelay_relay_environments_listed"), 1);
    // The links run on the link runtimes (one per core by default), shown per runtime.
    assert!(
        body.contains("execrelay_relay_runtime_tasks{runtime=\"0\"}"),
        "{body}"
    );

    // A listed environment is admitted; a stranger is refused, and the log says why.
    let mut ws = harness::connect(r.addr, "/v1/env/sandbox-1").await;
    env_handshake(
        &mut ws,
        &env_keys,
        &relay_keys.public,
        "sandbox-1",
        next_ts(),
    )
    .await
    .unwrap();
    let (env, _incoming) = EndpointLink::spawn_server(ws, EndpointConfig::default()).unwrap();
    r.wait_stderr(&["environment link up", "sandbox-1"]);
    let stranger = Keypair::generate().unwrap();
    let mut ws = harness::connect(r.addr, "/v1/env/sandbox-1").await;
    let refused = env_handshake(
        &mut ws,
        &stranger,
        &relay_keys.public,
        "sandbox-1",
        next_ts(),
    )
    .await;
    assert_eq!(refused, Err(LinkRefusal::Refused("unauthorized".into())));
    r.wait_stderr(&["environment link refused (unauthorized)", "SHA256:"]);

    sigterm(&r.child);
    r.wait_stderr(&["shutting down"]);
    let mut child = r.child;
    let status = guard("exit", tokio::task::spawn_blocking(move || child.wait()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(0), "{status:?}");
    guard("the environment link closes", env.closed()).await;
}

/// Finding 3: the relay kept a 1024 soft `RLIMIT_NOFILE`, so 16 addresses × 64 client
/// links used every descriptor: new clients timed out, `/metrics` was unreachable, and a
/// restarting environment could not reconnect, while its caps (4,096 client links, 10,000
/// environments) could never be reached. Now (1) the soft limit is raised to the hard limit
/// at start; (2) the caps are derived from the limit (`RelayDescriptorPlan`), keeping a
/// reserve for environment links and the metrics listener: under a hard limit of 300, client
/// links are capped at what fits (one more gets `503` before its upgrade), and with every
/// client slot taken from two addresses, `/metrics` answers and an environment is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn descriptors_the_soft_limit_is_raised_and_the_caps_keep_a_reserve() {
    use execrelay_io::descriptors::{nofile_limit, RelayDescriptorPlan};
    use execrelay_relay::server::settings::RelaySettings;
    let hard = nofile_limit().unwrap().hard;
    let dir = tempfile::tempdir().unwrap();
    let env_keys = Keypair::generate().unwrap();
    // (1) Only the soft limit lowered: raised back to the hard one.
    let (mut r, _) = start_limited(dir.path(), &env_keys, Some("-Sn 200"));
    if hard > 200 {
        r.wait_stderr(&["open files: soft limit raised from 200 to"]);
    } else {
        r.wait_stderr(&["open files: soft limit 200"]);
    }
    sigterm(&r.child);
    let _ = r.child.wait();

    // (2) A hard limit of 300: the caps shrink to fit it.
    const LIMIT: u64 = 300;
    let plan =
        RelayDescriptorPlan::derive(LIMIT, RelaySettings::default().descriptor_needs()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (mut r, relay_keys) = start_limited(dir.path(), &env_keys, Some(&format!("-n {LIMIT}")));
    r.wait_stderr(&["open files limit too low for the configured caps"]);
    let (_, body) = http_get(r.metrics, "/metrics").await;
    assert_eq!(
        metric_of(&body, "execrelay_relay_client_links_max"),
        plan.client_links
    );
    // Every client slot taken, from two addresses (64 each at most).
    let mut held = Vec::new();
    for source in [[127, 0, 0, 2], [127, 0, 0, 3]] {
        for _ in 0..64 {
            if held.len() as u64 == plan.client_links {
                break;
            }
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind(SocketAddr::from((source, 0))).unwrap();
            let tcp = guard("connect", socket.connect(r.addr)).await.unwrap();
            let (ws, _) = guard(
                "upgrade",
                tokio_tungstenite::client_async(
                    format!("ws://{}/v1/connect/sandbox-1", r.addr),
                    tcp,
                ),
            )
            .await
            .expect("a client link within the cap");
            held.push(ws);
        }
    }
    assert_eq!(held.len() as u64, plan.client_links);
    // One more: 503 before the upgrade.
    let tcp = guard("connect", tokio::net::TcpStream::connect(r.addr))
        .await
        .unwrap();
    let over = guard(
        "upgrade",
        tokio_tungstenite::client_async(format!("ws://{}/v1/connect/sandbox-1", r.addr), tcp),
    )
    .await;
    match over {
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            assert_eq!(resp.status(), 503)
        }
        other => panic!("expected 503, got {:?}", other.map(|_| ())),
    }
    // The metrics listener and an environment still get their descriptors.
    let (status, body) = http_get(r.metrics, "/metrics").await;
    assert_eq!(status, 200);
    assert_eq!(
        metric_of(&body, "execrelay_relay_links{kind=\"client\"}"),
        plan.client_links
    );
    let mut ws = harness::connect(r.addr, "/v1/env/sandbox-1").await;
    env_handshake(
        &mut ws,
        &env_keys,
        &relay_keys.public,
        "sandbox-1",
        next_ts(),
    )
    .await
    .expect("the environment is admitted with every client slot taken");
    drop(held);
    sigterm(&r.child);
    let _ = r.child.wait();
}

#[test]
fn bad_flags_and_files_are_refused_before_serving() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("relay.key");
    Keypair::generate().unwrap().write(&key, "relay").unwrap();
    let envs = dir.path().join("environments");
    std::fs::write(&envs, "sandbox-1 execrelay-x25519 not-base64\n").unwrap();
    let run = |args: &[&str]| {
        let out = Command::new(BIN)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
            out.stdout,
        )
    };
    let (key_s, envs_s) = (key.to_str().unwrap(), envs.to_str().unwrap());
    // A relay on ws:// with the key and environments above, and `more` flags.
    let served = |more: &[&str]| {
        let base = [
            "--listen",
            "ws://127.0.0.1:0",
            "--key",
            key_s,
            "--environments",
            envs_s,
        ];
        run(&[&base[..], more].concat())
    };
    // The environments file's error names its line.
    let (code, err, out) = served(&[]);
    assert_eq!(code, Some(2));
    assert!(err.contains(&format!("{envs_s}:1:")), "{err}");
    assert!(out.is_empty(), "nothing printed on stdout before serving");
    // wss:// needs its certificate and key.
    std::fs::write(&envs, "# none yet\n").unwrap();
    let (code, err, _) = run(&[
        "--listen",
        "wss://127.0.0.1:0",
        "--key",
        key_s,
        "--environments",
        envs_s,
    ]);
    assert_eq!(code, Some(2));
    assert!(err.contains("--tls-cert FILE and --tls-key FILE"), "{err}");
    // A bad setting.
    let (code, err, _) = served(&["--max-frame-bytes", "100"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("max_frame_bytes"), "{err}");
    // A size in an ambiguous unit: the flag, and what to write instead.
    let (code, err, _) = served(&["--max-queued-bytes", "512MB"]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("--max-queued-bytes") && err.contains("write MiB"),
        "{err}"
    );
    // The same in the file: the file and the key are named.
    let conf = dir.path().join("relay.toml");
    std::fs::write(&conf, "max_queued_bytes = \"half a gig\"\n").unwrap();
    let (code, err, _) = served(&["--config", conf.to_str().unwrap()]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("relay.toml") && err.contains("max_queued_bytes: `half a gig`"),
        "{err}"
    );
    // No link runtime, or far too many: the flag is named with its range.
    for bad in ["0", "100000"] {
        let (code, err, _) = served(&["--runtime-threads", bad]);
        assert_eq!(code, Some(2), "{bad}");
        assert!(
            err.contains("--runtime-threads") && err.contains("from 1 to 256"),
            "{bad}: {err}"
        );
    }
    // A private key others can read.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (code, err, _) = served(&[]);
    assert_eq!(code, Some(2));
    assert!(err.contains("permissions"), "{err}");
    // --help lists the limits with their defaults.
    let (code, _, out) = run(&["--help"]);
    assert_eq!(code, Some(0));
    let help = String::from_utf8_lossy(&out);
    assert!(help.contains("--max-streams-per-environment"), "{help}");
    assert!(help.contains("[default: 8 192]"), "{help}");
}

/// `SIGTERM` stops the relay whatever became of the stream its logs go to: a log collector
/// that died, or `| head`, leaves stderr a pipe without a reader. Before, the signal handler's
/// log line failed, the subscriber reported it with `eprintln!`, which panicked on the broken
/// pipe before the handler cancelled anything, and the relay served on, deaf to `SIGTERM`.
#[test]
fn sigterm_stops_a_relay_whose_log_reader_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("relay.key");
    Keypair::generate().unwrap().write(&key, "relay").unwrap();
    let envs = dir.path().join("environments");
    std::fs::write(&envs, "# none yet\n").unwrap();
    let mut child = Command::new(BIN)
        .args(["--listen", "ws://127.0.0.1:0", "--key"])
        .arg(&key)
        .arg("--environments")
        .arg(&envs)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The URL is printed once the signal handlers are installed and the listener is bound.
    let mut url = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut url)
        .unwrap();
    assert!(url.starts_with("ws://127.0.0.1:"), "{url:?}");
    drop(child.stderr.take());
    sigterm(&child);
    let (tx, rx) = mpsc::channel();
    let pid = child.id();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    match rx.recv_timeout(GUARD) {
        Ok(status) => assert_eq!(status.unwrap().code(), Some(0)),
        Err(_) => {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            panic!("the relay did not stop within {GUARD:?} of SIGTERM");
        }
    }
}
