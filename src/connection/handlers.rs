//! Method handlers: validate typed params ([`Call`]), call the session or process, shape the
//! typed result ([`Reply`]). Typed errors of the layers below become JSON-RPC errors through `?` and the
//! conversions of [`error_map`](super::error_map).
//!
//! Handlers run in their own tasks, already ordered by the scheduler. They never touch the
//! transport; a handler that needs something to happen after its reply is written (opening a
//! new process's output) returns it as `after_write`.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::message::{Call, ReadReply, Reply, ServerInfo, WriteCall};
use crate::config::{
    ServerConfig, DEFAULT_DRAIN_TIMEOUT_MS, DEFAULT_KILL_GRACE_MS, DEFAULT_READ_MAX_BYTES,
    MAX_ARGV_BYTES, MAX_PROCESS_ID_BYTES, MAX_WRITE_ID_BYTES,
};
use crate::process::signals::parse_signal;
use crate::process::spawn::SpawnSpec;
use crate::process::WriteStatus;
use crate::process::{check_term_size, ProcessOptions};
use crate::rpc::messages::{
    AckParams, ExitReason, OutputCapKeep, ReadParams, StartParams, StartResult, TermSize,
    PROTOCOL_VERSION,
};
use crate::rpc::RpcError;
use crate::session::{Caller, Session, SessionRegistry, StartSpec};

/// What a request handler needs.
pub struct Ctx {
    /// The connection's session.
    pub session: Arc<Session>,
    /// The server's registry.
    pub registry: Arc<SessionRegistry>,
    /// The connection.
    pub conn_id: u64,
    /// The client declared it answers `process/approve`.
    pub can_approve: bool,
    /// Fires when the connection closes.
    pub cancel: CancellationToken,
}

/// A successful reply.
pub struct Handled {
    /// The result.
    pub reply: Reply,
    /// Run once the reply was handed to the transport.
    pub after_write: Option<Box<dyn FnOnce() + Send>>,
}

impl From<Reply> for Handled {
    fn from(reply: Reply) -> Self {
        Handled {
            reply,
            after_write: None,
        }
    }
}

/// Run one request (the connection processor already checked state and class).
pub async fn dispatch(ctx: &Ctx, call: Call) -> Result<Handled, RpcError> {
    match call {
        Call::Start(p) => start(ctx, p).await,
        Call::Read(p) => read(ctx, p).await.map(Handled::from),
        Call::Write(p) => write(ctx, p).await.map(Handled::from),
        // A process that ended and was forgotten (its exit acknowledged while this request
        // was on its way) is answered as an exited one: nothing to close, resize or signal.
        Call::CloseStdin(p) => {
            if let Some(proc) = ctx.session.get_or_ended(&p.process_id)? {
                proc.close_stdin().await;
            }
            Ok(Reply::Empty.into())
        }
        Call::Resize(p) => {
            if let Some(proc) = ctx.session.get_or_ended(&p.process_id)? {
                proc.resize(TermSize {
                    rows: p.rows,
                    cols: p.cols,
                })?;
            }
            Ok(Reply::Empty.into())
        }
        Call::Signal(p) => {
            let sig = parse_signal(&p.signal).ok_or_else(|| {
                RpcError::invalid_params(format!("unknown signal {:?}", p.signal))
            })?;
            let Some(proc) = ctx.session.get_or_ended(&p.process_id)? else {
                return Ok(Reply::Empty.into());
            };
            if ends_by_default(sig) {
                // Should it die of it, a client ended it (`reason: "terminated"`).
                proc.mark_ending(ExitReason::Terminated);
            }
            proc.signal(sig)?;
            Ok(Reply::Empty.into())
        }
        Call::Terminate(p) => {
            if let Some(g) = p.grace_ms {
                let cap = ctx.registry.config().max_kill_grace_ms;
                within_cap("graceMs", g, "max_kill_grace_ms", cap)?;
            }
            let running = match ctx.session.get(&p.process_id) {
                Ok(proc) => {
                    proc.mark_ending(ExitReason::Terminated);
                    proc.terminate(p.grace_ms.map(Duration::from_millis)).await
                }
                Err(_) => false,
            };
            Ok(Reply::Terminate { running }.into())
        }
        Call::List => Ok(Reply::List(ctx.session.list()).into()),
        Call::ServerInfo => Ok(Reply::ServerInfo(server_info(&ctx.registry)).into()),
        // Extension (not in protocol.md): a client that is done ends its session at once
        // instead of leaving it detached for detachedSessionTtlMs (it would count against
        // maxSessions meanwhile). Answered once everything the session started is gone
        // (bounded by max_kill_grace_ms and the kill's own bound).
        Call::SessionClose => {
            ctx.session.close();
            ctx.session.terminated().await;
            Ok(Reply::Empty.into())
        }
        Call::Invalid { error, .. } => Err(error),
        // The processor routes only requests a client may call here.
        Call::Initialize(_) | Call::Ack(_) => Err(RpcError::invalid_request("not here")),
        Call::NotFound(name) => Err(RpcError::method_not_found(&name)),
    }
}

/// Whether `sig`'s default action ends a process: a client that sends one of these meant to
/// end it (its exit notice says `terminated` should it die). `SIGWINCH`, `SIGCONT` and
/// `SIGSTOP` do not end anything.
fn ends_by_default(sig: nix::sys::signal::Signal) -> bool {
    use nix::sys::signal::Signal as S;
    !matches!(
        sig,
        S::SIGWINCH | S::SIGCONT | S::SIGSTOP | S::SIGTSTP | S::SIGCHLD | S::SIGURG
    )
}

/// `process/start`, through the exec policy: it may wait for the client's approval (the
/// request holds its process's exclusive slot meanwhile; other requests go on).
async fn start(ctx: &Ctx, p: StartParams) -> Result<Handled, RpcError> {
    let caller = Caller {
        conn_id: ctx.conn_id,
        can_approve: ctx.can_approve,
    };
    let proc = ctx
        .session
        .start_checked(start_spec(p, ctx.registry.config())?, caller)
        .await?;
    let reply = Reply::Start(StartResult {
        process_id: proc.id.clone(),
        pid: proc.pid,
    });
    let session = ctx.session.clone();
    let conn_id = ctx.conn_id;
    Ok(Handled {
        reply,
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
    if argv_bytes(&p.argv) > MAX_ARGV_BYTES {
        return Err(RpcError::invalid_params(format!(
            "argv must be at most {MAX_ARGV_BYTES} bytes (each argument counted with its NUL)"
        )));
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
    if p.output_cap_keep == OutputCapKeep::HeadAndTail {
        let Some(cap) = p.output_bytes_cap else {
            return Err(RpcError::invalid_params(
                "outputCapKeep \"headAndTail\" needs outputBytesCap",
            ));
        };
        let tail = cap - cap / 2;
        let max = config.max_output_tail_bytes as u64;
        if tail > max {
            return Err(RpcError::invalid_params(format!(
                "outputBytesCap {cap} with outputCapKeep \"headAndTail\" keeps a tail of {tail} bytes, above this server's max_output_tail_bytes ({max})"
            )));
        }
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
            output_cap_keep: p.output_cap_keep,
            drain_timeout: Duration::from_millis(drain),
            kill_grace: Duration::from_millis(grace),
            kill_group_on_exit: p.kill_process_group_on_exit,
        },
        process_id: p.process_id,
    })
}

/// The bytes `argv` takes as the kernel counts them: each argument and its NUL.
pub fn argv_bytes(argv: &[String]) -> usize {
    argv.iter()
        .fold(0usize, |n, a| n.saturating_add(a.len()).saturating_add(1))
}

/// `-32602` when a client's `value` of `member` is above the server's `cap` (named by its
/// setting).
pub fn within_cap(member: &str, value: u64, setting: &str, cap: u64) -> Result<(), RpcError> {
    if value > cap {
        return Err(RpcError::above_cap(member, value, setting, cap));
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

async fn read(ctx: &Ctx, p: ReadParams) -> Result<Reply, RpcError> {
    let proc = ctx.session.get(&p.process_id)?;
    let max_wait = ctx.registry.config().max_read_wait_ms;
    let wait = Duration::from_millis(p.wait_ms.min(max_wait));
    let max_bytes = p.max_bytes.unwrap_or(DEFAULT_READ_MAX_BYTES);
    let max_bytes = usize::try_from(max_bytes).unwrap_or(usize::MAX);
    let r = proc
        .read(p.after_seq, max_bytes, wait, ctx.session.acks, &ctx.cancel)
        .await?;
    Ok(Reply::Read(ReadReply {
        events: r.events,
        next_seq: r.next_seq,
        running: r.running,
        exited: r.exited,
    }))
}

async fn write(ctx: &Ctx, p: WriteCall) -> Result<Reply, RpcError> {
    // Checked here, on the typed call, so the limit holds for every transport (the JSON
    // codec and the in-process one alike).
    if p.write_id
        .as_ref()
        .is_some_and(|id| id.len() > MAX_WRITE_ID_BYTES)
    {
        return Err(RpcError::invalid_params(format!(
            "writeId must be at most {MAX_WRITE_ID_BYTES} bytes"
        )));
    }
    match ctx.session.get_or_ended(&p.process_id)? {
        Some(proc) => {
            let status = proc.write(&p.data, p.write_id).await;
            // As a `process/closeStdin` right after it (`protocol.md` §5.2): whatever the
            // write's status (closing is idempotent, so a repeated write closes again
            // harmlessly).
            if p.close_stdin {
                proc.close_stdin().await;
            }
            Ok(Reply::Write(status))
        }
        // Forgotten: a write it accepted, repeated after a resume, did its work.
        None if p
            .write_id
            .as_deref()
            .is_some_and(|w| ctx.session.ended_wrote(&p.process_id, w)) =>
        {
            Ok(Reply::Write(WriteStatus::Accepted))
        }
        None => Ok(Reply::Write(WriteStatus::Exited)),
    }
}

/// `process/ack` (a notification): ignored without the acks capability or for an unknown
/// process, as a notification cannot be answered.
pub fn ack(session: &Session, params: Option<AckParams>) {
    if !session.acks {
        return;
    }
    if let Some(p) = params {
        if let Ok(proc) = session.get(&p.process_id) {
            proc.ack(p.seq);
        }
    }
}

fn server_info(registry: &SessionRegistry) -> ServerInfo {
    let hostname = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_default();
    ServerInfo {
        server_version: env!("CARGO_PKG_VERSION").to_string(),
        protocol_version: PROTOCOL_VERSION,
        hostname,
        os: std::env::consts::OS.to_string(),
        pid: std::process::id(),
        uptime_ms: registry.uptime().as_millis() as u64,
        sessions: registry.session_count(),
        processes: registry.process_count(),
    }
}
