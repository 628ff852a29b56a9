//! Conformance adapter for the Rust client library (`execrelay::client`): the kit's runner
//! (`conformance/runner.py`) sends one JSON command per line on stdin and reads one JSON
//! reply per line on stdout; the connection details come from the environment
//! (`conformance/README.md`, "Adapter protocol"). Built as an example of the main crate
//! (`cargo build --example conformance-adapter`), so it stays out of the library's API.
//!
//! What the Rust client cannot do yet is answered `{"ok": false, "error": {"type":
//! "unsupported"}}`, and what it does not report is `null` (whether `reason` came from the
//! server): the scenarios that
//! need them fail, naming the missing feature, instead of passing on a guess.

use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use bytes::Bytes;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::Notify;

use execrelay::client::{
    ApprovalDecision, ApproveParams, Client, ClientError, ClientOptions, ProcessController,
    ProcessEvent, StartOptions, Target,
};
use execrelay::config::NoiseSuite;
use execrelay::link::client::{LinkPool, NoiseClientConfig};
use execrelay::noise::keys::{load_public, Keypair};
use execrelay::noise::suite::SuiteChoice;
use execrelay::rpc::messages::{OutputCapKeep, TermSize};

/// Output kept inline in a `wait` reply (beyond it only the length and SHA-256).
const MAX_INLINE: usize = 1 << 20;

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn emit(v: &Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

#[derive(Default)]
struct Collected {
    out: Sha256,
    err: Sha256,
    out_len: usize,
    err_len: usize,
    out_head: Vec<u8>,
    err_head: Vec<u8>,
    streams: Vec<String>,
    exit: Option<Value>,
    lost: bool,
    ended: bool,
    /// `[stream, omittedBytes]` of each `process/outputOmitted`, in order.
    omitted: Vec<Value>,
}

struct Proc {
    control: ProcessController,
    seen: Arc<Mutex<Collected>>,
    changed: Arc<Notify>,
}

struct Adapter {
    client: Option<Client>,
    procs: HashMap<String, Proc>,
    approvals: Arc<Mutex<Vec<Value>>>,
    writes: u64,
}

fn error_of(e: &ClientError) -> Value {
    match e {
        ClientError::Refused(msg) => {
            let what = if msg.contains("--server-key") || msg.contains("did not verify") {
                "server_key"
            } else if msg.contains("not authorized") {
                if env("EXECRELAY_TOKEN").is_some() {
                    "token"
                } else {
                    "key"
                }
            } else {
                "other"
            };
            json!({"type": "refused", "what": what, "message": msg})
        }
        ClientError::Rpc {
            code,
            message,
            data,
        } => match *code {
            -32006 => json!({"type": "not_approved", "message": message, "data": data}),
            -32007 => {
                let d = data.clone().unwrap_or(Value::Null);
                json!({"type": "start", "code": code, "what": d.get("what"), "path": d.get("path"),
                       "errno": d.get("errno"), "message": message})
            }
            -32603 if message.starts_with("spawn failed") => {
                json!({"type": "start", "code": code, "what": null, "path": null,
                       "errno": errno_of(message), "message": message})
            }
            _ => json!({"type": "rpc", "code": code, "message": message}),
        },
        ClientError::Connect(m) => json!({"type": "connect", "message": m}),
        ClientError::SessionLost(m) => json!({"type": "session_lost", "message": m}),
        e @ ClientError::RequestTooLarge { bytes, limit, .. } => {
            json!({"type": "request_too_large", "size": bytes, "limit": limit,
                   "message": e.to_string()})
        }
        other => json!({"type": "other", "message": other.to_string()}),
    }
}

/// `(os error N)` in a message, as the errno's name.
fn errno_of(message: &str) -> Value {
    let n = message
        .rsplit("(os error ")
        .next()
        .and_then(|s| s.trim_end_matches(')').parse::<i32>().ok());
    match n {
        Some(2) => json!("ENOENT"),
        Some(13) => json!("EACCES"),
        Some(8) => json!("ENOEXEC"),
        Some(n) => json!(format!("errno {n}")),
        None => Value::Null,
    }
}

fn fail(kind: &str, message: impl Into<String>) -> Value {
    json!({"type": kind, "message": message.into()})
}

impl Adapter {
    fn client(&self) -> Result<&Client, Value> {
        self.client
            .as_ref()
            .ok_or_else(|| fail("other", "not connected"))
    }

    fn proc(&self, m: &Value) -> Result<&Proc, Value> {
        let id = m["id"].as_str().unwrap_or_default();
        self.procs
            .get(id)
            .ok_or_else(|| fail("other", format!("no process {id}")))
    }

    async fn connect(&mut self) -> Result<Value, Value> {
        let session_ttl = match env("EXECRELAY_SESSION_TTL_MS") {
            Some(ms) => Some(Duration::from_millis(ms.parse().map_err(|_| {
                fail(
                    "config",
                    format!("EXECRELAY_SESSION_TTL_MS {ms:?} is not a number"),
                )
            })?)),
            None => None,
        };
        // A suite the kit names is pinned (no fallback), as `--noise-suite` pins it.
        let suite = match env("EXECRELAY_NOISE_SUITE") {
            Some(n) => Some(
                n.parse::<u16>()
                    .ok()
                    .and_then(NoiseSuite::from_number)
                    .ok_or_else(|| fail("config", format!("no Noise suite {n:?}")))?,
            ),
            None => None,
        };
        let url = env("EXECRELAY_TARGET").ok_or_else(|| fail("other", "no EXECRELAY_TARGET"))?;
        let target = if url.starts_with("ws://") {
            Target::Ws(url.clone())
        } else {
            let server = env("EXECRELAY_SERVER_KEY").unwrap_or_default();
            let key = env("EXECRELAY_KEY").unwrap_or_default();
            let server_public = load_public(&server).map_err(|e| fail("config", e.to_string()))?;
            let keys = Keypair::load(std::path::Path::new(&key))
                .map_err(|e| fail("config", e.to_string()))?;
            let mut config = NoiseClientConfig::new(keys, server_public);
            config.token = env("EXECRELAY_TOKEN");
            if let Some(suite) = suite {
                config.suite = SuiteChoice::Pinned(suite);
            }
            if let (Some(ka), Some(pong)) = (
                env("EXECRELAY_KEEPALIVE_MS"),
                env("EXECRELAY_PONG_TIMEOUT_MS"),
            ) {
                let ka: u64 = ka.parse().unwrap_or(15_000);
                let pong: u64 = pong.parse().unwrap_or(30_000);
                config.keepalive.interval = Duration::from_millis(ka);
                config.keepalive.jitter = Duration::from_millis(ka / 10);
                config.keepalive.pong_timeout = Duration::from_millis(pong);
                config.keepalive.write_timeout = Duration::from_millis(pong);
            }
            Target::Noise {
                url: url.clone(),
                config: Arc::new(config),
                pool: LinkPool::new(),
            }
        };
        let mut opts = ClientOptions {
            client_name: "execrelay-conformance-rust".into(),
            ..ClientOptions::default()
        };
        opts.binary_output = env("EXECRELAY_BINARY").as_deref() != Some("0");
        opts.session_ttl = session_ttl;
        if let Some(answer) = env("EXECRELAY_APPROVE") {
            let approve = answer == "yes";
            let delay = env("EXECRELAY_APPROVE_DELAY_MS")
                .and_then(|d| d.parse::<u64>().ok())
                .unwrap_or(0);
            let seen = self.approvals.clone();
            opts.approval_handler = Some(Arc::new(move |req: ApproveParams| {
                let seen = seen.clone();
                async move {
                    // The id is the server's; the Rust handler is not told it, so the runner
                    // counts calls (one per question, however often it is re-sent).
                    let entry = json!({"id": null, "argv": req.argv, "rule": req.rule});
                    if let Ok(mut s) = seen.lock() {
                        s.push(entry.clone());
                    }
                    emit(&json!({"event": "approval", "argv": req.argv}));
                    tokio::time::sleep(Duration::from_millis(delay)).await;
                    if approve {
                        ApprovalDecision::Approve
                    } else {
                        ApprovalDecision::Deny
                    }
                }
            }));
        }
        let client = Client::connect(target, opts)
            .await
            .map_err(|e| error_of(&e))?;
        let session = client.session_id();
        self.client = Some(client);
        Ok(json!({"session": session}))
    }

    async fn start(&mut self, m: &Value) -> Result<Value, Value> {
        let id = m["id"].as_str().unwrap_or_default().to_string();
        let argv: Vec<String> = match m["shell"].as_str() {
            Some(s) => vec!["/bin/sh".into(), "-c".into(), s.into()],
            None => m["argv"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|x| x.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default(),
        };
        let mut opts = StartOptions::new(&id, argv);
        let p = &mut opts.params;
        p.cwd = m["cwd"].as_str().map(String::from);
        if let Some(envs) = m["env"].as_object() {
            for (k, v) in envs {
                p.env.insert(k.clone(), v.as_str().map(String::from));
            }
        }
        p.inherit_env = m["inherit_env"].as_bool().unwrap_or(true);
        p.tty = m["tty"].as_bool().unwrap_or(false);
        p.pipe_stdin = m["stdin"].as_bool().unwrap_or(false);
        if let Some(size) = m["size"].as_array() {
            p.size = Some(TermSize {
                rows: size.first().and_then(Value::as_u64).unwrap_or(24) as u16,
                cols: size.get(1).and_then(Value::as_u64).unwrap_or(80) as u16,
            });
        }
        p.timeout_ms = m["timeout_ms"].as_u64();
        p.output_bytes_cap = m["output_cap"].as_u64();
        if m["keep_tail"].as_bool() == Some(true) {
            p.output_cap_keep = OutputCapKeep::HeadAndTail;
        }
        let mut handle = self.client()?.start(opts).await.map_err(|e| error_of(&e))?;
        let pid = handle.pid;
        let seen = Arc::new(Mutex::new(Collected::default()));
        let changed = Arc::new(Notify::new());
        let control = handle.controller();
        // `count_only` (benchmarks): lengths only, no hashing or copying of the output.
        let count_only = m["count_only"].as_bool() == Some(true);
        let (s2, c2) = (seen.clone(), changed.clone());
        tokio::spawn(async move {
            while let Some(ev) = handle.next_event().await {
                let mut guard = match s2.lock() {
                    Ok(s) => s,
                    Err(p) => p.into_inner(),
                };
                let s = &mut *guard;
                match ev {
                    ProcessEvent::Output { stream, data } if count_only => {
                        if stream.as_str() == "stderr" {
                            s.err_len += data.len();
                        } else {
                            s.out_len += data.len();
                        }
                    }
                    ProcessEvent::Output { stream, data } => {
                        let name = stream.as_str().to_string();
                        let (h, len, head) = if name == "stderr" {
                            (&mut s.err, &mut s.err_len, &mut s.err_head)
                        } else {
                            (&mut s.out, &mut s.out_len, &mut s.out_head)
                        };
                        h.update(&data);
                        *len += data.len();
                        if head.len() < MAX_INLINE {
                            head.extend_from_slice(&data);
                        }
                        if !s.streams.contains(&name) {
                            s.streams.push(name);
                        }
                    }
                    ProcessEvent::Lost { .. } => s.lost = true,
                    ProcessEvent::Omitted {
                        stream,
                        omitted_bytes,
                    } => s.omitted.push(json!([stream.as_str(), omitted_bytes])),
                    ProcessEvent::Exited(info) => {
                        s.exit = Some(json!({
                            "exit_code": info.exit_code, "signal": info.signal,
                            "reason": info.reason.as_str(),
                            "timed_out": info.timed_out, "dropped_bytes": info.dropped_bytes,
                        }));
                    }
                }
                drop(guard);
                c2.notify_waiters();
            }
            if let Ok(mut s) = s2.lock() {
                s.ended = true;
            }
            c2.notify_waiters();
        });
        self.procs.insert(
            id,
            Proc {
                control,
                seen,
                changed,
            },
        );
        Ok(json!({"pid": pid}))
    }

    async fn write(&mut self, m: &Value) -> Result<Value, Value> {
        let data = B64
            .decode(m["data_b64"].as_str().unwrap_or_default())
            .map_err(|e| fail("other", e.to_string()))?;
        self.writes += 1;
        let wid = format!("cw-{}", self.writes);
        let status = self
            .proc(m)?
            .control
            .write(&data, &wid)
            .await
            .map_err(|e| match e.code() {
                Some(-32001) => fail("stdin_closed", "the process exited"),
                _ => error_of(&e),
            })?;
        if status != "accepted" {
            return Err(fail("stdin_closed", status));
        }
        Ok(json!({}))
    }

    async fn write_pattern(&mut self, m: &Value) -> Result<Value, Value> {
        let n = m["bytes"].as_u64().unwrap_or(0) as usize;
        let block: Vec<u8> = (0..251u8).collect::<Vec<u8>>().repeat(1024);
        let mut w = self.proc(m)?.control.stdin_writer();
        let mut at = 0;
        while at < n {
            let k = (n - at).min(block.len());
            w.write(Bytes::copy_from_slice(&block[..k]))
                .await
                .map_err(|e| fail("stdin_closed", e.to_string()))?;
            at += k;
        }
        w.flush()
            .await
            .map_err(|e| fail("stdin_closed", e.to_string()))?;
        Ok(json!({}))
    }

    async fn wait_output(&self, m: &Value) -> Result<Value, Value> {
        let p = self.proc(m)?;
        let want = B64
            .decode(m["contains_b64"].as_str().unwrap_or_default())
            .map_err(|e| fail("other", e.to_string()))?;
        let limit = Duration::from_millis(m["timeout_ms"].as_u64().unwrap_or(30_000));
        tokio::time::timeout(limit, async {
            loop {
                let notified = p.changed.notified();
                {
                    let s = p.seen.lock().map_err(|_| fail("other", "poisoned"))?;
                    if s.out_head
                        .windows(want.len().max(1))
                        .any(|w| w == want.as_slice())
                    {
                        return Ok(json!({}));
                    }
                    if s.ended {
                        return Err(fail("other", "the process ended first"));
                    }
                }
                notified.await;
            }
        })
        .await
        .map_err(|_| fail("timeout", "the output never contained it"))?
    }

    async fn wait(&self, m: &Value) -> Result<Value, Value> {
        let p = self.proc(m)?;
        let limit = Duration::from_millis(m["timeout_ms"].as_u64().unwrap_or(60_000));
        tokio::time::timeout(limit, async {
            loop {
                let notified = p.changed.notified();
                if p.seen.lock().map(|s| s.ended).unwrap_or(true) {
                    return;
                }
                notified.await;
            }
        })
        .await
        .map_err(|_| fail("timeout", "the process did not end in time"))?;
        let s = p.seen.lock().map_err(|_| fail("other", "poisoned"))?;
        let Some(exit) = s.exit.clone() else {
            let why = self
                .client
                .as_ref()
                .and_then(Client::lost_reason)
                .unwrap_or_else(|| "no exit notice".into());
            return Err(fail("session_lost", why));
        };
        let mut r = exit;
        let hex = |h: &Sha256| {
            h.clone()
                .finalize()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        };
        // The library reads a notice without `reason` as `exited` (a server that predates
        // it); the servers the kit starts always send one, so it is not reported apart.
        r["reason_from_server"] = Value::Null;
        r["stdout_len"] = json!(s.out_len);
        r["stdout_sha256"] = json!(hex(&s.out));
        r["stderr_len"] = json!(s.err_len);
        r["stderr_sha256"] = json!(hex(&s.err));
        r["omitted"] = json!(s.omitted);
        r["streams"] = json!(s.streams);
        r["seqs_ok"] = json!(!s.lost);
        if s.out_len <= MAX_INLINE {
            r["stdout_b64"] = json!(B64.encode(&s.out_head));
        }
        if s.err_len <= MAX_INLINE {
            r["stderr_b64"] = json!(B64.encode(&s.err_head));
        }
        Ok(r)
    }

    async fn op(&mut self, op: &str, m: &Value) -> Result<Value, Value> {
        match op {
            "connect" => self.connect().await,
            // Not exposed by the Rust client: the runner reads the server's log instead.
            // The library keeps of `initialize` only what it uses: the granted TTL.
            "capabilities" => {
                let ttl = self.client()?.granted_session_ttl();
                let c = self.client()?;
                Ok(json!({"capabilities": {"binaryInput": c.binary_input(),
                                           "binaryOutput": c.binary_output(),
                                           "retryRefusedWrites": c.retry_refused_writes()},
                          "limits": {"detachedSessionTtlMs": ttl.as_millis() as u64}}))
            }
            "start" => self.start(m).await,
            "write" => self.write(m).await,
            "write_pattern" => self.write_pattern(m).await,
            "close_stdin" => self
                .proc(m)?
                .control
                .close_stdin()
                .await
                .map(|()| json!({}))
                .map_err(|e| error_of(&e)),
            "resize" => self
                .proc(m)?
                .control
                .resize(TermSize {
                    rows: m["rows"].as_u64().unwrap_or(24) as u16,
                    cols: m["cols"].as_u64().unwrap_or(80) as u16,
                })
                .await
                .map(|()| json!({}))
                .map_err(|e| error_of(&e)),
            "signal" => self
                .proc(m)?
                .control
                .signal(m["signal"].as_str().unwrap_or("SIGTERM"))
                .await
                .map(|()| json!({}))
                .map_err(|e| error_of(&e)),
            "terminate" => {
                let params = json!({"processId": m["id"], "graceMs": m["grace_ms"].as_u64().unwrap_or(2000)});
                let r = self
                    .client()?
                    .call("process/terminate", params)
                    .await
                    .map_err(|e| error_of(&e))?;
                Ok(json!({"running": r["running"]}))
            }
            "wait_output" => self.wait_output(m).await,
            "wait" => self.wait(m).await,
            "approvals" => Ok(
                json!({"approvals": self.approvals.lock().map(|a| a.clone()).unwrap_or_default()}),
            ),
            "list" => self
                .client()?
                .call("process/list", json!({}))
                .await
                .map_err(|e| error_of(&e)),
            "close" => {
                if let Some(c) = self.client.take() {
                    c.close();
                }
                Ok(json!({}))
            }
            other => Err(fail("unsupported", format!("unknown op {other}"))),
        }
    }
}

#[tokio::main]
async fn main() {
    let mut a = Adapter {
        client: None,
        procs: HashMap::new(),
        approvals: Arc::new(Mutex::new(Vec::new())),
        writes: 0,
    };
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if line.trim().is_empty() {
            continue;
        }
        let m: Value = match serde_json::from_str(&line) {
            Ok(m) => m,
            Err(e) => {
                emit(&json!({"ok": false, "error": fail("other", e.to_string())}));
                continue;
            }
        };
        let op = m["op"].as_str().unwrap_or_default().to_string();
        match a.op(&op, &m).await {
            Ok(mut v) => {
                v["ok"] = json!(true);
                emit(&v);
            }
            Err(e) => emit(&json!({"ok": false, "error": e})),
        }
        if op == "close" {
            break;
        }
    }
    if let Some(c) = a.client.take() {
        c.close();
    }
}
