//! The Prometheus endpoint (`serve --metrics-listen`), through the real binary: figures follow
//! what clients do, bad requests get clear HTTP errors, and the scrape slots are bounded.

use std::collections::HashMap;
use std::process::Stdio;
use std::time::Duration;

use execrelay::client::{Client, ClientOptions, ProcessEvent, ProcessHandle, StartOptions, Target};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

/// Upper bound for anything the test waits on; a hang fails instead of blocking CI.
const GUARD: Duration = Duration::from_secs(60);

struct Server {
    child: Child,
    /// The listener's URL (first line of stdout).
    url: String,
    /// `HOST:PORT` of the metrics endpoint.
    metrics: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// Start `execrelay serve --listen LISTEN --metrics-listen 127.0.0.1:0 EXTRA…` and read both
/// addresses it prints.
async fn start(listen: &str, extra: &[&str]) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_execrelay"))
        .args([
            "serve",
            "--listen",
            listen,
            "--metrics-listen",
            "127.0.0.1:0",
        ])
        .args(extra)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn server");
    let stderr = child.stderr.take().expect("stderr");
    let stdout = child.stdout.take().expect("stdout");
    let read = async move {
        let mut err = BufReader::new(stderr).lines();
        let metrics = loop {
            let line = err
                .next_line()
                .await
                .expect("stderr")
                .expect("metrics line");
            if let Some(rest) = line.strip_prefix("execrelay metrics: http://") {
                break rest.trim_end_matches("/metrics").to_string();
            }
        };
        // Keep draining stderr so the server never blocks on it.
        tokio::spawn(async move { while let Ok(Some(_)) = err.next_line().await {} });
        let mut out = BufReader::new(stdout).lines();
        let url = out.next_line().await.expect("stdout").expect("url line");
        (metrics, url)
    };
    let (metrics, url) = tokio::time::timeout(GUARD, read)
        .await
        .expect("server start");
    Server {
        child,
        url,
        metrics,
    }
}

/// One raw HTTP exchange: send `request`, read until the server closes.
async fn raw(addr: &str, request: &[u8]) -> String {
    let exchange = async {
        let mut s = TcpStream::connect(addr).await.expect("connect metrics");
        s.write_all(request).await.expect("send");
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.expect("read");
        String::from_utf8_lossy(&out).into_owned()
    };
    tokio::time::timeout(GUARD, exchange)
        .await
        .expect("http exchange")
}

/// Scrape and parse `name{labels} value` lines into a map keyed by `name{labels}`.
async fn scrape(addr: &str) -> HashMap<String, f64> {
    let resp = raw(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(resp.starts_with("HTTP/1.1 200 OK\r\n"), "{resp}");
    assert!(
        resp.contains("Content-Type: application/openmetrics-text; version=1.0.0"),
        "{resp}"
    );
    let body = resp.split_once("\r\n\r\n").expect("body").1;
    assert!(
        body.ends_with("# EOF\n"),
        "OpenMetrics text ends with # EOF"
    );
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

/// Scrape until `ready` holds (within [`GUARD`]). For figures that follow events the test cannot
/// observe directly, like the server noticing a disconnect.
async fn scrape_until(
    addr: &str,
    ready: impl Fn(&HashMap<String, f64>) -> bool,
) -> HashMap<String, f64> {
    let poll = async {
        loop {
            let m = scrape(addr).await;
            if ready(&m) {
                return m;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(GUARD, poll)
        .await
        .expect("figure reached")
}

fn get(m: &HashMap<String, f64>, key: &str) -> f64 {
    *m.get(key).unwrap_or_else(|| panic!("no {key} in {m:#?}"))
}

/// Run a process to its end; returns the output bytes received.
async fn run(client: &Client, opts: StartOptions, stdin: Option<&[u8]>) -> usize {
    let mut p = client.start(opts).await.expect("start");
    if let Some(data) = stdin {
        p.write(data).await.expect("write");
        p.close_stdin().await.expect("close stdin");
    }
    drain_to_exit(&mut p).await
}

/// Consume a process's events up to its exit notice; returns the output bytes received.
async fn drain_to_exit(p: &mut ProcessHandle) -> usize {
    let mut n = 0;
    while let Some(ev) = tokio::time::timeout(GUARD, p.next_event())
        .await
        .expect("event")
    {
        match ev {
            ProcessEvent::Output { data, .. } => n += data.len(),
            ProcessEvent::Exited(_) => return n,
            ProcessEvent::Lost { .. } => panic!("lost output"),
            ProcessEvent::Omitted { .. } => panic!("no cap was asked for"),
        }
    }
    panic!("no exit notice");
}

#[tokio::test]
async fn figures_follow_sessions_processes_bytes_and_errors() {
    let server = start("ws://127.0.0.1:0", &[]).await;
    let m = scrape(&server.metrics).await;
    assert_eq!(get(&m, "execrelay_connections"), 0.0);
    assert_eq!(get(&m, "execrelay_output_bytes_total"), 0.0);

    // Without acks, exited processes stay known (exitedRetentionMs), so the gauges are exact.
    let opts = ClientOptions {
        acks: false,
        reconnect: false,
        ..ClientOptions::default()
    };
    let client = Client::connect(Target::Ws(server.url.clone()), opts)
        .await
        .expect("connect");
    let got = run(
        &client,
        StartOptions::new("big", ["head", "-c", "300000", "/dev/zero"]),
        None,
    )
    .await;
    assert_eq!(got, 300_000);
    let mut cat = StartOptions::new("cat", ["cat"]);
    cat.params.pipe_stdin = true;
    assert_eq!(run(&client, cat, Some(b"hello")).await, 5);
    let err = client
        .call("no/such/method", serde_json::json!({}))
        .await
        .expect_err("unknown method");
    assert_eq!(err.code(), Some(-32601));

    let m = scrape(&server.metrics).await;
    assert_eq!(get(&m, "execrelay_output_bytes_total"), 300_005.0);
    assert_eq!(get(&m, "execrelay_stdin_bytes_total"), 5.0);
    assert_eq!(get(&m, "execrelay_connections"), 1.0);
    assert_eq!(get(&m, "execrelay_sessions{state=\"attached\"}"), 1.0);
    assert_eq!(get(&m, "execrelay_sessions{state=\"detached\"}"), 0.0);
    assert_eq!(get(&m, "execrelay_processes{state=\"running\"}"), 0.0);
    assert_eq!(get(&m, "execrelay_processes{state=\"exited\"}"), 2.0);
    assert_eq!(get(&m, "execrelay_rpc_errors_total{code=\"-32601\"}"), 1.0);
    assert!(get(&m, "execrelay_retained_output_bytes") > 0.0);

    // The client goes away without closing its session: the session is detached, not gone.
    // The server learns of the disconnect on its own schedule, so poll the figures (bounded).
    // Both: a scrape takes the sessions' snapshot before it reads the connection gauge, so
    // one scrape may show the connection gone and the session still attached.
    client.close();
    let m = scrape_until(&server.metrics, |m| {
        get(m, "execrelay_connections") == 0.0
            && get(m, "execrelay_sessions{state=\"attached\"}") == 0.0
    })
    .await;
    assert_eq!(get(&m, "execrelay_sessions{state=\"attached\"}"), 0.0);
    assert_eq!(get(&m, "execrelay_sessions{state=\"detached\"}"), 1.0);
}

/// Regression: every successful `execrelay run` counted one `-32001` (its `process/closeStdin`
/// reached the server after the process it named was forgotten). A normal run, whether its
/// stdin ends before, while or after the command exits, counts no error of any code.
#[tokio::test]
async fn normal_runs_count_no_error() {
    let server = start("ws://127.0.0.1:0", &[]).await;
    let bin = env!("CARGO_BIN_EXE_execrelay");
    // Its stdin at end of file at once, after the command exited, and with data in it: the
    // command reads none of it.
    for stdin in ["</dev/null", "sleep 0.3 |", "printf data |"] {
        for _ in 0..3 {
            let script = match stdin.strip_suffix('|') {
                Some(feed) => format!("{feed} | \"$0\" run \"$1\" -- echo ok"),
                None => format!("\"$0\" run \"$1\" -- echo ok {stdin}"),
            };
            let out = Command::new("sh")
                .args(["-c", &script, bin, &server.url])
                .env_remove("RUST_LOG")
                .stdin(Stdio::null())
                .output();
            let out = tokio::time::timeout(GUARD, out)
                .await
                .expect("run ends")
                .expect("run");
            assert!(out.status.success(), "{out:?}");
            assert_eq!(String::from_utf8_lossy(&out.stdout), "ok\n");
        }
    }
    let m = scrape_until(&server.metrics, |m| get(m, "execrelay_connections") == 0.0).await;
    let errors: Vec<_> = m
        .iter()
        .filter(|(k, _)| k.starts_with("execrelay_rpc_errors"))
        .collect();
    assert!(
        errors.is_empty(),
        "errors counted for normal runs: {errors:?}"
    );
}

#[tokio::test]
async fn bad_requests_get_http_errors() {
    let server = start("ws://127.0.0.1:0", &[]).await;
    let addr = server.metrics.as_str();
    let r = raw(addr, b"POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(r.starts_with("HTTP/1.1 405 "), "{r}");
    assert!(r.contains("Allow: GET\r\n"), "{r}");
    // The health routes are served beside the metrics: a server without a relay link is
    // ready while it accepts.
    let r = raw(addr, b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(
        r.starts_with("HTTP/1.1 200 ") && r.ends_with("\r\n\r\nok\n"),
        "{r}"
    );
    let r = raw(addr, b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(r.starts_with("HTTP/1.1 200 "), "{r}");
    let r = raw(addr, b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(
        r.starts_with("HTTP/1.1 200 ") && r.contains("application/json"),
        "{r}"
    );
    let status: serde_json::Value =
        serde_json::from_str(r.split_once("\r\n\r\n").unwrap().1).unwrap();
    assert_eq!(status["ready"], true);
    assert!(status["environment_link"].is_null(), "{status}");
    let r = raw(addr, b"GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(r.starts_with("HTTP/1.1 404 "), "{r}");
    let r = raw(addr, b"\x16\x03\x01 not http\r\n\r\n").await;
    assert!(r.starts_with("HTTP/1.1 400 "), "{r}");
    let mut big = b"GET /metrics HTTP/1.1\r\nX: ".to_vec();
    big.extend(std::iter::repeat_n(b'a', 20 * 1024));
    big.extend_from_slice(b"\r\n\r\n");
    let r = raw(addr, &big).await;
    assert!(r.starts_with("HTTP/1.1 431 "), "{r}");
    // The endpoint still serves after all that.
    scrape(addr).await;
}

/// A connection to the metrics listener from `source` (a loopback address of its own).
async fn connect_from(addr: &str, source: [u8; 4]) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(std::net::SocketAddr::from((source, 0)))
        .expect("bind a loopback source address");
    socket
        .connect(addr.parse().expect("metrics address"))
        .await
        .expect("connect")
}

/// A connection over a cap is closed without an answer (a FIN, or a reset since its request
/// is unread).
async fn assert_closed_unanswered(mut s: TcpStream, what: &str) {
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("send");
    let mut out = Vec::new();
    match tokio::time::timeout(GUARD, s.read_to_end(&mut out))
        .await
        .expect("closed")
    {
        Ok(_) => assert!(
            out.is_empty(),
            "{what}: a connection over the cap gets no response"
        ),
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{what}"),
    }
}

async fn assert_served(mut s: TcpStream) {
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("send");
    let mut out = Vec::new();
    tokio::time::timeout(GUARD, s.read_to_end(&mut out))
        .await
        .expect("response")
        .expect("read");
    assert!(out.starts_with(b"HTTP/1.1 200 OK\r\n"));
}

/// Scrapes are capped at `MAX_METRICS_SCRAPES` at once and `MAX_METRICS_SCRAPES_PER_ADDRESS`
/// from one address: one host holding connections that send nothing cannot blind the endpoint
/// for another (the red team's 8 stalled connections from one address did, for 10 s at a time,
/// renewable).
#[tokio::test]
async fn concurrent_scrapes_are_capped_in_all_and_per_address() {
    use execrelay_io::http::{MAX_METRICS_SCRAPES, MAX_METRICS_SCRAPES_PER_ADDRESS};
    let server = start("ws://127.0.0.1:0", &[]).await;
    let addr = server.metrics.as_str();
    // The server accepts in order and takes a slot before accepting the next connection.
    let mut held = Vec::new();
    for _ in 0..MAX_METRICS_SCRAPES_PER_ADDRESS {
        held.push(connect_from(addr, [127, 0, 0, 2]).await);
    }
    let extra = connect_from(addr, [127, 0, 0, 2]).await;
    assert_closed_unanswered(extra, "one address past its share").await;
    // Other addresses still get the rest (each is served below); past the total, a new
    // address is refused too.
    let mut host = 3;
    while held.len() < MAX_METRICS_SCRAPES {
        held.push(connect_from(addr, [127, 0, 0, host]).await);
        if held.len() % MAX_METRICS_SCRAPES_PER_ADDRESS == 0 {
            host += 1;
        }
    }
    let extra = connect_from(addr, [127, 0, 0, 200]).await;
    assert_closed_unanswered(extra, "past the total").await;
    // The held ones are live slots: each is served when its request arrives.
    for s in held {
        assert_served(s).await;
    }
}

#[tokio::test]
async fn noise_links_streams_and_refusals_are_counted() {
    use execrelay::link::client::{LinkPool, NoiseClientConfig};
    use execrelay::noise::keys::{public_line, Keypair};
    let dir = tempdir();
    let server_key = Keypair::generate().expect("key");
    let good = Keypair::generate().expect("key");
    let stranger = Keypair::generate().expect("key");
    server_key
        .write(&dir.join("server"), "t")
        .expect("write key");
    std::fs::write(
        dir.join("authorized"),
        format!("{}\n", public_line(&good.public, "good")),
    )
    .expect("authorized");
    let key = dir.join("server");
    let auth = dir.join("authorized");
    let server = start(
        "noise+ws://127.0.0.1:0",
        &[
            "--key",
            key.to_str().expect("utf-8 path"),
            "--authorized-keys",
            auth.to_str().expect("utf-8 path"),
        ],
    )
    .await;
    let config =
        |keys: Keypair| std::sync::Arc::new(NoiseClientConfig::new(keys, server_key.public));
    let opts = ClientOptions {
        reconnect: false,
        ..ClientOptions::default()
    };
    let refused = Client::connect(
        Target::Noise {
            url: server.url.clone(),
            config: config(stranger),
            pool: LinkPool::new(),
        },
        opts.clone(),
    )
    .await;
    assert!(refused.is_err(), "an unknown key is refused");
    let client = Client::connect(
        Target::Noise {
            url: server.url.clone(),
            config: config(good),
            pool: LinkPool::new(),
        },
        opts,
    )
    .await
    .expect("authorized key connects");
    assert_eq!(
        run(&client, StartOptions::new("t", ["printf", "ok"]), None).await,
        2
    );
    let m = scrape(&server.metrics).await;
    assert_eq!(
        get(
            &m,
            "execrelay_noise_failures_total{reason=\"unauthorized\"}"
        ),
        1.0
    );
    assert_eq!(get(&m, "execrelay_noise_streams"), 1.0);
    assert!(get(&m, "execrelay_noise_links") >= 1.0);
    assert_eq!(get(&m, "execrelay_output_bytes_total"), 2.0);
    client.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

fn tempdir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!(
        "execrelay-metrics-{}-{:x}",
        std::process::id(),
        rand_u64()
    ));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

fn rand_u64() -> u64 {
    let mut b = [0u8; 8];
    getrandom::getrandom(&mut b).expect("random");
    u64::from_le_bytes(b)
}

#[tokio::test]
async fn time_blocked_on_a_slow_client_is_counted() {
    // A small retention so that a client that does not consume (and so does not ack) stops
    // the pump quickly.
    let server = start("ws://127.0.0.1:0", &["--retained-output-bytes", "1048576"]).await;
    let client = Client::connect(Target::Ws(server.url.clone()), ClientOptions::default())
        .await
        .expect("connect");
    let mut p = client
        .start(StartOptions::new(
            "slow",
            ["head", "-c", "4194304", "/dev/zero"],
        ))
        .await
        .expect("start");
    // Wait (bounded) until the server holds a full retention for us: the pump is now blocked.
    scrape_until(&server.metrics, |m| {
        get(m, "execrelay_retained_output_bytes") >= 1_048_576.0
    })
    .await;
    // The blocked time shows while the pump is still stuck (counted every
    // BLOCKED_METRIC_INTERVAL), not only once the client lets go.
    let m = scrape_until(&server.metrics, |m| {
        get(m, "execrelay_delivery_blocked_seconds_total") > 0.0
    })
    .await;
    assert_eq!(get(&m, "execrelay_processes{state=\"running\"}"), 1.0);
    // Consume everything: acks release the retention and the pump goes on to the end.
    let n = drain_to_exit(&mut p).await;
    assert_eq!(n, 4_194_304);
    let m = scrape(&server.metrics).await;
    assert!(get(&m, "execrelay_delivery_blocked_seconds_total") > 0.0);
    assert_eq!(get(&m, "execrelay_output_bytes_total"), 4_194_304.0);
    client.shutdown().await;
}
