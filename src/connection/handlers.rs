//! Method handlers: decode and validate params, call the session or process, shape the
//! result. Typed errors of the layers below become JSON-RPC errors through `?` and the
//! conversions of [`error_map`](super::error_map).
//!
//! Handlers run in their own tasks, already ordered by the scheduler. They never touch the
//! transport; a handler that needs something to happen after its reply is written (opening a
//! new process's output) returns it as `after_write`.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::config::{
    ServerConfig, DEFAULT_DRAIN_TIMEOUT_MS, DEFAULT_KILL_GRACE_MS, DEFAULT_READ_MAX_BYTES,
    MAX_PROCESS_ID_BYTES, MAX_WRITE_ID_BYTES,
};
use crate::process::event_log::EventBody;
use crate::process::signals::parse_signal;
use crate::process::spawn::SpawnSpec;
use crate::process::{check_term_size, ProcessInfo, ProcessOptions};
use crate::rpc::jsonrpc::decode_params;
use crate::rpc::messages::{
    AckParams, ProcessRef, ReadParams, ResizeParams, SignalParams, StartParams, StartResult,
    TermSize, TerminateParams, WriteParams, PROTOCOL_VERSION,
};
use crate::rpc::notification::{exit_event_json, output_event_json};
use crate::rpc::{Method, RpcError};
use crate::session::{Session, SessionRegistry, StartSpec};

/// What a request handler needs.
pub struct Ctx {
    /// The connection's session.
    pub session: Arc<Session>,
    /// The server's registry.
    pub registry: Arc<SessionRegistry>,
    /// The connection.
    pub conn_id: u64,
    /// Fires when the connection closes.
    pub cancel: CancellationToken,
}

/// A successful reply.
pub struct Reply {
    /// The `result` member.
    pub result: Value,
    /// Run once the reply was handed to the transport.
    pub after_write: Option<Box<dyn FnOnce() + Send>>,
}

impl From<Value> for Reply {
    fn from(result: Value) -> Self {
        Reply {
            result,
            after_write: None,
        }
    }
}

/// Route one request (the connection processor already checked state and class).
pub async fn dispatch(ctx: &Ctx, method: Method, params: Value) -> Result<Reply, RpcError> {
    match method {
        Method::ProcessStart => start(ctx, decode_params(params)?),
        Method::ProcessRead => read(ctx, decode_params(params)?).await.map(Reply::from),
        Method::ProcessWrite => write(ctx, decode_params(params)?).await.map(Reply::from),
        Method::ProcessCloseStdin => {
            let p: ProcessRef = decode_params(params)?;
            ctx.session.get(&p.process_id)?.close_stdin().await;
            Ok(json!({}).into())
        }
        Method::ProcessResize => {
            let p: ResizeParams = decode_params(params)?;
            ctx.session.get(&p.process_id)?.resize(TermSize {
                rows: p.rows,
                cols: p.cols,
            })?;
            Ok(json!({}).into())
        }
        Method::ProcessSignal => {
            let p: SignalParams = decode_params(params)?;
            let sig = parse_signal(&p.signal).ok_or_else(|| {
                RpcError::invalid_params(format!("unknown signal {:?}", p.signal))
            })?;
            ctx.session.get(&p.process_id)?.signal(sig)?;
            Ok(json!({}).into())
        }
        Method::ProcessTerminate => {
            let p: TerminateParams = decode_params(params)?;
            let cfg = ctx.registry.config();
            if let Some(g) = p.grace_ms {
                within_cap("graceMs", g, "max_kill_grace_ms", cfg.max_kill_grace_ms)?;
            }
            let running = match ctx.session.get(&p.process_id) {
                Ok(proc) => proc.terminate(p.grace_ms.map(Duration::from_millis)).await,
                Err(_) => false,
            };
            Ok(json!({ "running": running }).into())
        }
        Method::ProcessList => {
            let mut procs: Vec<Value> = ctx
                .session
                .processes()
                .iter()
                .map(|p| list_entry(&p.info()))
                .collect();
            procs.sort_by(|a, b| a["processId"].as_str().cmp(&b["processId"].as_str()));
            Ok(json!({ "processes": procs }).into())
        }
        Method::ServerInfo => Ok(server_info(&ctx.registry).into()),
        // Extension (not in protocol.md): a client that is done ends its session at once
        // instead of leaving it detached for detachedSessionTtlMs (it would count against
        // maxSessions meanwhile). Answered once everything the session started is gone
        // (bounded by max_kill_grace_ms and the kill's own bound).
        Method::SessionClose => {
            ctx.session.close();
            ctx.session.terminated().await;
            Ok(json!({}).into())
        }
        // The processor routes only requests a client may call here.
        other => Err(RpcError::method_not_found(other.as_str())),
    }
}

fn start(ctx: &Ctx, p: StartParams) -> Result<Reply, RpcError> {
    let proc = ctx
        .session
        .start(start_spec(p, ctx.registry.config())?, ctx.conn_id)?;
    let result = serde_json::to_value(StartResult {
        process_id: proc.id.clone(),
        pid: proc.pid,
    })
    .map_err(|e| RpcError::internal(e.to_string()))?;
    let session = ctx.session.clone();
    let conn_id = ctx.conn_id;
    Ok(Reply {
        result,
        after_write: Some(Box::new(move || session.enable_delivery(&proc, conn_id))),
    })
}

/// Validate `process/start` params and apply the defaults: the session takes only this
/// (the messages of the `-32602` errors are part of the protocol).
///
/// Durations a client chooses are refused above the server's caps (`max_kill_grace_ms`,
/// `max_drain_timeout_ms`, `max_timeout_ms`) with a message naming the cap, rather than
/// clamped: a client learns at once that its value will not be honoured.
pub fn start_spec(p: StartParams, config: &ServerConfig) -> Result<StartSpec, RpcError> {
    let n = p.process_id.len();
    if n == 0 || n > MAX_PROCESS_ID_BYTES {
        return Err(RpcError::invalid_params(format!(
            "processId must be 1 to {MAX_PROCESS_ID_BYTES} bytes"
        )));
    }
    if p.argv.is_empty() {
        return Err(RpcError::invalid_params("argv must not be empty"));
    }
    if let Some(cwd) = &p.cwd {
        if !cwd.starts_with('/') {
            return Err(RpcError::invalid_params("cwd must be an absolute path"));
        }
    }
    if p.argv.iter().any(|a| a.contains('\0')) {
        return Err(RpcError::invalid_params("argv must not contain NUL"));
    }
    for (name, value) in &p.env {
        check_env(name, value.as_deref())?;
    }
    // One rule for terminal sizes, the same as `process/resize`'s (and the same error).
    if let Some(size) = p.size {
        check_term_size(size)?;
    }
    if let Some(t) = p.timeout_ms {
        within_cap("timeoutMs", t, "max_timeout_ms", config.max_timeout_ms)?;
    }
    // A value the client left out is the default, lowered to the cap of a server configured
    // below it (the client chose nothing that could be refused).
    let drain = match p.drain_timeout_ms {
        Some(d) => {
            within_cap(
                "drainTimeoutMs",
                d,
                "max_drain_timeout_ms",
                config.max_drain_timeout_ms,
            )?;
            d
        }
        None => DEFAULT_DRAIN_TIMEOUT_MS.min(config.max_drain_timeout_ms),
    };
    let grace = match p.kill_grace_ms {
        Some(g) => {
            within_cap(
                "killGraceMs",
                g,
                "max_kill_grace_ms",
                config.max_kill_grace_ms,
            )?;
            g
        }
        None => DEFAULT_KILL_GRACE_MS.min(config.max_kill_grace_ms),
    };
    Ok(StartSpec {
        spawn: SpawnSpec {
            argv: p.argv,
            cwd: p.cwd,
            env: p.env.into_iter().collect(),
            inherit_env: p.inherit_env,
            tty: p.tty.then(|| p.size.unwrap_or_default()),
            pipe_stdin: p.pipe_stdin,
        },
        options: ProcessOptions {
            timeout: p.timeout_ms.map(Duration::from_millis),
            output_cap: p.output_bytes_cap,
            drain_timeout: Duration::from_millis(drain),
            kill_grace: Duration::from_millis(grace),
            kill_group_on_exit: p.kill_process_group_on_exit,
        },
        process_id: p.process_id,
    })
}

/// `-32602` when a client's `value` of `member` is above the server's `cap` (named by its
/// setting).
fn within_cap(member: &str, value: u64, setting: &str, cap: u64) -> Result<(), RpcError> {
    if value > cap {
        return Err(RpcError::invalid_params(format!(
            "{member} {value} is above this server's {setting} ({cap})"
        )));
    }
    Ok(())
}

/// An environment entry the child can receive as given: a name that is not empty and holds
/// no `=` (the first `=` of `NAME=value` ends the name, so `{"A=B": "C"}` would set `A` to
/// `B=C`) and no NUL, and a value without NUL (C strings end there). The error names the
/// variable.
fn check_env(name: &str, value: Option<&str>) -> Result<(), RpcError> {
    if name.is_empty() || name.contains('=') || name.contains('\0') {
        return Err(RpcError::invalid_params(format!(
            "env name {} is invalid: it must be non-empty, without '=' or NUL",
            json!(name)
        )));
    }
    if value.is_some_and(|v| v.contains('\0')) {
        return Err(RpcError::invalid_params(format!(
            "env value of {} contains NUL",
            json!(name)
        )));
    }
    Ok(())
}

async fn read(ctx: &Ctx, p: ReadParams) -> Result<Value, RpcError> {
    let proc = ctx.session.get(&p.process_id)?;
    let max_wait = ctx.registry.config().max_read_wait_ms;
    let wait = Duration::from_millis(p.wait_ms.min(max_wait));
    let max_bytes = p.max_bytes.unwrap_or(DEFAULT_READ_MAX_BYTES);
    let max_bytes = usize::try_from(max_bytes).unwrap_or(usize::MAX);
    let r = proc
        .read(p.after_seq, max_bytes, wait, ctx.session.acks, &ctx.cancel)
        .await?;
    let events: Vec<Value> = r
        .events
        .iter()
        .map(|ev| match &ev.body {
            EventBody::Output { stream, chunk } => output_event_json(ev.seq, *stream, chunk),
            EventBody::Exited(info) => exit_event_json(ev.seq, info),
        })
        .collect();
    Ok(json!({
        "events": events,
        "nextSeq": r.next_seq,
        "running": r.running,
        "exited": r.exited,
    }))
}

async fn write(ctx: &Ctx, p: WriteParams) -> Result<Value, RpcError> {
    let WriteParams {
        process_id,
        chunk,
        write_id,
    } = p;
    if write_id
        .as_ref()
        .is_some_and(|id| id.len() > MAX_WRITE_ID_BYTES)
    {
        return Err(RpcError::invalid_params(format!(
            "writeId must be at most {MAX_WRITE_ID_BYTES} bytes"
        )));
    }
    let proc = ctx.session.get(&process_id)?;
    let data = base64::engine::general_purpose::STANDARD
        .decode(chunk.as_bytes())
        .map_err(|e| RpcError::invalid_params(format!("chunk is not valid base64: {e}")))?;
    // The base64 text is not needed while the write waits for pipe space: hold only the
    // bytes (three quarters of it).
    drop(chunk);
    let status = proc.write(&data, write_id).await;
    Ok(json!({ "status": status.as_str() }))
}

/// A `process/list` entry.
fn list_entry(p: &ProcessInfo) -> Value {
    let (code, signal) = match &p.exit {
        Some(e) => (json!(e.exit_code), json!(e.signal)),
        None => (Value::Null, Value::Null),
    };
    json!({
        "processId": p.process_id,
        "pid": p.pid,
        "argv": p.argv,
        "tty": p.tty,
        "state": if p.exit.is_some() { "exited" } else { "running" },
        "nextSeq": p.next_seq,
        "exitCode": code,
        "signal": signal,
    })
}

/// `process/ack` (a notification): ignored without the acks capability or for an unknown
/// process, as a notification cannot be answered.
pub fn ack(session: &Session, params: Value) {
    if !session.acks {
        return;
    }
    if let Ok(p) = decode_params::<AckParams>(params) {
        if let Ok(proc) = session.get(&p.process_id) {
            proc.ack(p.seq);
        }
    }
}

fn server_info(registry: &SessionRegistry) -> Value {
    let hostname = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_default();
    json!({
        "serverVersion": env!("CARGO_PKG_VERSION"),
        "protocolVersion": PROTOCOL_VERSION,
        "hostname": hostname,
        "os": std::env::consts::OS,
        "pid": std::process::id(),
        "uptimeMs": registry.uptime().as_millis() as u64,
        "sessions": registry.session_count(),
        "processes": registry.process_count(),
    })
}
