//! `execrelay run`: behave like `ssh host cmd` (`processes.md` §7, README "The command line").
//!
//! `run TARGET COMMAND…` runs the words by `/bin/sh -c` on the server; `run TARGET -- PROGRAM
//! ARGS…` runs that exact argv; no command runs a login shell (on a terminal when local stdin
//! is one). Local stdout/stderr receive the remote streams, local stdin is forwarded and
//! closed at end of file (`-n`: not read at all), `-t` puts the local terminal in raw mode,
//! passes `TERM` and forwards size changes, Ctrl-C is forwarded as `SIGINT`, and the exit
//! status is the remote one (`outcome.rs`); everything that is not the command's own doing
//! is 255 with its cause (`failure.rs`). `--detach` hands over to `detached.rs`.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use tokio::io::AsyncReadExt;

use super::connect::{resolve, ConnFlags};
use super::duration::parse_duration;
use super::failure::{say, Failure};
use super::outcome::{command_end, start_failure};
use super::show::show_events;
use super::terminal::{announce_resumes, approval_handler, local_size, RawMode};
use super::words::{split, ValueOptions};
use crate::client::{
    Client, ClientError, ClientOptions, InProcessConfig, ProcessController, StartOptions,
    StdinRefused, StdinWriter,
};
use crate::rpc::messages::OutputCapKeep;

/// `run --help`'s examples.
const EXAMPLES: &str = "Examples:
  execrelay run sandbox-1 'ls -l | wc -l'        a shell command, as ssh runs it
  execrelay run sandbox-1 -- ls -l 'a file'     an exact argv, no shell
  execrelay run sandbox-1                       a login shell on a terminal
  execrelay run -t sandbox-1 top                a terminal for a full-screen program
  execrelay run -n sandbox-1 uptime             stdin not read (inside a `while read` loop)
  execrelay run --timeout 5m -e CI=1 -C /work sandbox-1 make test
  execrelay run --detach sandbox-1 ./long-job   start it, print a handle, come back with attach
  execrelay run --output-cap 1048576 --keep-tail sandbox-1 make   the first and last 512 KiB
  execrelay run noise+ws://10.0.0.5:7000 --server-key server.pub --key ~/.config/execrelay/id -- id
  execrelay run --local -- uname -a             an exec server in this process

TARGET is a URL (ws://HOST:PORT, noise+ws://HOST:PORT, relay+ws://RELAY:PORT/ENVIRONMENT_ID,
relay+wss://…) or a host alias of ~/.config/execrelay/config.toml. Exit status: the command's;
128+N when a signal ended it; 127 not found; 126 not executable; 124 after --timeout; 255
when anything else went wrong (the cause is printed, one line, on stderr).";

/// Flags of `execrelay run`.
#[derive(Debug, Args)]
#[command(
    override_usage = "execrelay run [OPTIONS] TARGET [COMMAND]...\n       execrelay run [OPTIONS] TARGET -- PROGRAM [ARGS]...\n       execrelay run [OPTIONS] --local [COMMAND]...",
    after_help = EXAMPLES
)]
pub struct RunArgs {
    /// Where to run: a URL, or a host alias of the configuration file.
    #[arg(value_name = "TARGET")]
    pub target: Option<String>,
    /// The command: words joined by spaces and run by `/bin/sh -c` on the server, or after
    /// `--` the program and its arguments, exactly. None: a login shell.
    #[arg(
        value_name = "COMMAND",
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    pub command: Vec<String>,
    /// Run the command through an exec server in this process (no TARGET).
    #[arg(long)]
    pub local: bool,
    /// Allocate a terminal: the local one goes raw, its size and `TERM` are passed on.
    #[arg(short = 't', long = "tty")]
    pub tty: bool,
    /// Do not read stdin (the command gets /dev/null), as `ssh -n`.
    #[arg(short = 'n')]
    pub no_stdin: bool,
    /// Set an environment variable for the command; `-e K` alone passes the local value of
    /// K (and unsets K there when it is unset here). Repeatable; wins over --env-file.
    #[arg(short = 'e', long = "env", value_name = "K[=V]")]
    pub env: Vec<String>,
    /// Read variables from FILE: `K=V` or `K` lines, `#` comments (as `docker --env-file`).
    #[arg(long, value_name = "FILE")]
    pub env_file: Vec<PathBuf>,
    /// Working directory on the server (absolute).
    #[arg(short = 'C', long = "cwd", value_name = "DIR")]
    pub cwd: Option<String>,
    /// End the command after this long (`90`, `90s`, `5m`, `1h`): exit status 124.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub timeout: Option<Duration>,
    /// Show at most this many bytes of each output stream (the rest is read and dropped).
    #[arg(long, value_name = "BYTES")]
    pub output_cap: Option<u64>,
    /// With --output-cap: show the first half of the cap and the last half, with a line
    /// saying how much was omitted between them.
    #[arg(long, requires = "output_cap")]
    pub keep_tail: bool,
    /// Start the command, print its handle and exit 0; it runs on, its output kept (see
    /// `execrelay attach`, `ps`, `kill`).
    #[arg(long)]
    pub detach: bool,
    /// With --detach: how long the server keeps the session while nobody is attached
    /// [default: 24h, or the server's --max-session-ttl if lower].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, requires = "detach")]
    pub session_ttl: Option<Duration>,
    /// How to reach the server (flags win over the host's entry).
    #[command(flatten)]
    pub conn: ConnFlags,
    /// Approve every process the server's exec policy asks about, without asking. Without
    /// it, `run` asks on the controlling terminal, and denies when there is none.
    #[arg(long)]
    pub approve_all: bool,
    /// Receive output as JSON with base64 instead of binary messages (the default where the
    /// transport carries them; `protocol.md` §5.1).
    #[arg(long)]
    pub json_output: bool,
    /// Send stdin as JSON `process/write` requests with base64 instead of binary writes (the
    /// default where the server offers them; `protocol.md` §5.2).
    #[arg(long)]
    pub json_input: bool,
    /// How long stdin the server refuses for a full limit (`-32004`) is sent again before the
    /// command is stopped (`0`: at the first refusal). Only servers that keep a process's
    /// writes in order after a refusal are sent input again. A start refused for a full
    /// request budget is tried again as long [default: 60s].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub input_retry: Option<Duration>,
}

/// The id of the one process `run` starts.
pub const RUN_PROCESS_ID: &str = "run-1";

/// Run `run` over `words` (what followed `run` on the command line); returns the exit status.
pub fn main(args: RunArgs, words: &[OsString]) -> i32 {
    crate::cli::init_logging("warn", false);
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => return Failure::cause(format!("cannot start: {e}")).report(),
    };
    let code = rt.block_on(async {
        match run(args, words).await {
            Ok(code) => code,
            Err(f) => f.report(),
        }
    });
    // Do not wait for the blocking stdin reader thread.
    rt.shutdown_timeout(Duration::from_millis(100));
    code
}

/// The command to start: the exact argv, the words for `/bin/sh -c`, or a login shell (the
/// server's `$SHELL -l`, `/bin/sh` when it has none).
pub fn argv_of(command: &[String], exact: bool) -> Vec<String> {
    if exact {
        return command.to_vec();
    }
    let script = if command.is_empty() {
        "exec \"${SHELL:-/bin/sh}\" -l".to_string()
    } else {
        command.join(" ")
    };
    vec!["/bin/sh".into(), "-c".into(), script]
}

/// The environment the command gets on top of the server's: `--env-file` lines, then `-e`
/// (which win). `K` alone takes the local value, or unsets K when it is unset here.
pub fn env_of(
    flags: &[String],
    files: &[PathBuf],
) -> Result<BTreeMap<String, Option<String>>, Failure> {
    let mut env = BTreeMap::new();
    let mut put = |entry: &str, origin: &dyn Fn() -> String| -> Result<(), Failure> {
        let (k, v) = match entry.split_once('=') {
            Some((k, v)) => (k, Some(v.to_string())),
            None => (entry, std::env::var(entry).ok()),
        };
        if k.is_empty() || k.contains('\0') || v.as_deref().is_some_and(|v| v.contains('\0')) {
            return Err(Failure::usage(format!(
                "{}: {entry:?} is not K=V or K",
                origin()
            )));
        }
        env.insert(k.to_string(), v);
        Ok(())
    };
    for file in files {
        let text = std::fs::read_to_string(file)
            .map_err(|e| Failure::cause(format!("--env-file {}: {e}", file.display())))?;
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            put(line, &|| format!("{}:{}", file.display(), i + 1))?;
        }
    }
    for kv in flags {
        put(kv, &|| "-e".to_string())?;
    }
    Ok(env)
}

/// What `run` was asked to start, checked.
struct Plan {
    /// The target as typed (`None`: `--local`).
    target: Option<String>,
    /// What to start.
    start: StartOptions,
    /// Forward local stdin.
    stdin: bool,
}

fn plan(args: &RunArgs, words: &[OsString]) -> Result<Plan, Failure> {
    let values = ValueOptions::of(&<RunArgs as clap::Args>::augment_args(clap::Command::new(
        "run",
    )));
    let cw = split(words, &values, args.local).map_err(Failure::usage)?;
    if cw.target.is_none() && !args.local {
        return Err(Failure::usage(
            "no target: give a URL or a host alias (or --local to run here)",
        ));
    }
    let argv = argv_of(&cw.command, cw.exact);
    let interactive = cw.command.is_empty() && !cw.exact;
    let stdin_is_tty = std::io::stdin().is_terminal();
    let tty = args.tty || (interactive && stdin_is_tty && !args.no_stdin);
    let mut start = StartOptions::new(RUN_PROCESS_ID, argv);
    start.params.env = env_of(&args.env, &args.env_file)?;
    if tty {
        start.params.tty = true;
        start.params.size = Some(local_size().unwrap_or_default());
        if let Ok(term) = std::env::var("TERM") {
            start.params.env.entry("TERM".into()).or_insert(Some(term));
        }
    }
    start.params.cwd = args.cwd.clone();
    start.params.timeout_ms = args.timeout.map(|t| t.as_millis() as u64);
    start.params.output_bytes_cap = args.output_cap;
    if args.keep_tail {
        start.params.output_cap_keep = OutputCapKeep::HeadAndTail;
    }
    start.params.pipe_stdin = !args.no_stdin && !args.detach;
    Ok(Plan {
        target: cw.target,
        start,
        stdin: !args.no_stdin && !args.detach,
    })
}

async fn run(args: RunArgs, words: &[OsString]) -> Result<i32, Failure> {
    let plan = plan(&args, words)?;
    let remote = match &plan.target {
        Some(t) => Some(resolve(t, &args.conn)?),
        None => None,
    };
    if args.detach {
        let Some(remote) = remote else {
            return Err(Failure::usage("--detach needs a TARGET (not --local)"));
        };
        let label = plan.target.clone().unwrap_or_default();
        let approval = approval_handler(
            args.approve_all,
            super::detached::DETACHED_PROCESS_ID,
            plan.start.params.argv.clone(),
        );
        return super::detached::detach(
            &label,
            &remote,
            plan.start,
            args.session_ttl,
            Some(approval),
        )
        .await;
    }
    // Install the signal handlers before anything can print: a Ctrl-C that arrived before
    // they existed would kill `run` instead of reaching the command.
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut sigint), Ok(mut sigwinch)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::window_change()),
    ) else {
        return Err(Failure::cause("cannot install signal handlers"));
    };
    let opts = ClientOptions {
        approval_handler: Some(approval_handler(
            args.approve_all,
            RUN_PROCESS_ID,
            plan.start.params.argv.clone(),
        )),
        binary_output: !args.json_output,
        binary_input: !args.json_input,
        write_retry_for: args
            .input_retry
            .unwrap_or(ClientOptions::default().write_retry_for),
        ..ClientOptions::default()
    };
    let (client, url) = match &remote {
        Some(r) => (
            Client::connect(r.target.clone(), opts).await.map_err(|e| {
                super::failure::connect_failure(&r.url, &e, r.key.as_deref(), r.token)
            })?,
            r.url.clone(),
        ),
        None => (
            Client::in_process(InProcessConfig::default(), opts)
                .await
                .map_err(|e| Failure::cause(format!("the in-process server: {e}")))?,
            "the in-process server".to_string(),
        ),
    };
    let tty = plan.start.params.tty;
    let mut proc = match client.start(plan.start).await {
        Ok(p) => p,
        Err(e) => {
            // An in-process server is shut down like after a command (its cgroups removed).
            client.shutdown().await;
            let (key, token) = remote
                .as_ref()
                .map_or((None, false), |r| (r.key.as_deref(), r.token));
            return Err(start_failure(&url, &e, key, token));
        }
    };
    announce_resumes(&client);
    let _raw = if tty { RawMode::enable() } else { None };
    // Set when stdin could not be delivered: the command was stopped, and `run` says why.
    let stdin_failed = std::sync::Arc::new(std::sync::OnceLock::new());
    if plan.stdin {
        forward_stdin(proc.stdin_writer(), proc.controller(), stdin_failed.clone());
    }
    // Ctrl-C (when the terminal is not raw) → SIGINT; window changes → resize.
    let ctl = proc.controller();
    let interrupted = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = interrupted.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = sigint.recv() => {
                    flag.store(true, std::sync::atomic::Ordering::Relaxed);
                    let _ = ctl.signal("SIGINT").await;
                }
                _ = sigwinch.recv() => {
                    if tty {
                        if let Some(size) = local_size() {
                            let _ = ctl.resize(size).await;
                        }
                    }
                }
            }
        }
    });
    let ended = show_events(&mut proc, tty).await;
    let code = match ended {
        // The command ended because its input could not be delivered: not its own doing.
        Some(_) if stdin_failed.get().is_some() => {
            Failure::cause(stdin_failed.get().cloned().unwrap_or_default()).report()
        }
        Some(info) => {
            let (code, words) = command_end(
                &info,
                args.timeout,
                interrupted.load(std::sync::atomic::Ordering::Relaxed),
            );
            if let Some(w) = words {
                say(&w);
            }
            code
        }
        None => {
            let f = match client.loss() {
                Some(e) => super::failure::connect_failure(
                    &url,
                    &e,
                    remote.as_ref().and_then(|r| r.key.as_deref()),
                    remote.as_ref().is_some_and(|r| r.token),
                ),
                None => Failure::cause(format!("the connection to {url} was lost")),
            };
            f.report()
        }
    };
    drop(_raw);
    // The command is over: end the session rather than leave it detached on the server.
    client.shutdown().await;
    Ok(code)
}

/// Local stdin → `process/write`, then `closeStdin` at end of file: pipelined writes of
/// whatever stdin has, never waiting for more than the first byte, read in the writer's pieces
/// ([`StdinWriter::piece_bytes`]). Stops when the process takes no more input (its stdin
/// closed, or it exited).
///
/// A write the server refuses for a full limit (`-32004`) is sent again, with the writes after
/// it, for `--input-retry` (60 s by default), on a server that keeps a process's writes in
/// order after a refusal ([`StdinWriter`]). One still refused then (or any other error answer,
/// or any refusal from a server that does not keep that order) means the command's input would
/// arrive incomplete: the command is terminated rather than left to finish on part of its
/// input as if it were whole, and `failed` gets the words `run` reports (exit 255).
pub fn forward_stdin(
    writer: StdinWriter,
    ctl: ProcessController,
    failed: std::sync::Arc<std::sync::OnceLock<String>>,
) {
    tokio::spawn(async move {
        if let Err(StdinRefused::Error(e)) = pump_stdin(writer).await {
            if input_lost(&e) {
                let _ = failed.set(format!(
                    "stdin could not be delivered ({e}); the command was stopped, since its \
                     input would have been incomplete{}",
                    refusal_hint(&e)
                ));
                let _ = ctl.terminate().await;
            }
        }
    });
}

/// Whether a failed write means input was lost while the command goes on: an error answer
/// (a limit, `-32004`). Not a lost connection or session (the command's end reports that),
/// nor a process the server no longer knows (`-32001`: it exited, and its end was reported).
pub(crate) fn input_lost(e: &ClientError) -> bool {
    let gone = crate::rpc::ErrorCode::UnknownProcess.code();
    matches!(e, ClientError::Rpc { code, .. } if *code != gone)
}

/// What to do about a refused write, after its words: a `-32004` is one of the server's
/// limits, full for now (the error names it), which a later attempt or its operator can change.
pub(crate) fn refusal_hint(e: &ClientError) -> &'static str {
    match e {
        ClientError::Rpc { code, .. } if *code == crate::rpc::ErrorCode::LimitReached.code() => {
            ": run it again when the server is less busy (or with a longer --input-retry), or \
             have its operator raise that limit"
        }
        _ => "",
    }
}

/// The loop of [`forward_stdin`]: stdin to the writer until its end or a refusal.
async fn pump_stdin(mut writer: StdinWriter) -> Result<(), StdinRefused> {
    use crate::transport::stdio::{grow_pipe, stdin_reader, STDIN_PIPE_BYTES};
    use std::os::fd::AsFd;
    grow_pipe(std::io::stdin().as_fd(), STDIN_PIPE_BYTES);
    let mut stdin = stdin_reader();
    let mut buf = bytes::BytesMut::new();
    loop {
        let piece = writer.piece_bytes().await?;
        let more = read_piece(&mut stdin, &mut buf, piece).await;
        if !buf.is_empty() {
            writer.write(buf.split().freeze()).await?;
        }
        if !more {
            break;
        }
    }
    writer.finish().await
}

/// Read what `input` has into `buf`, up to one `piece`: the first read waits; later ones,
/// without waiting, only complete the piece. `false` once `input` ended (or failed); what was
/// read before is in `buf` either way.
///
/// Why whole pieces: a pipe holds 64 KiB, and a binary write at most 64 KiB less its head
/// (`STDIN_BINARY_WRITE_BYTES`), so reading the pipe whole split every read into a full write
/// and one of 512 bytes. Each write is one Noise record and a stream's window counts records,
/// so half the window went to those tails: uploads to a far server ran at half speed.
pub(crate) async fn read_piece<R>(input: &mut R, buf: &mut bytes::BytesMut, piece: usize) -> bool
where
    R: tokio::io::AsyncRead + Unpin + ?Sized,
{
    use futures_util::FutureExt;
    let piece = piece.max(1);
    buf.reserve(piece);
    match (&mut *input).take(piece as u64).read_buf(buf).await {
        Ok(0) | Err(_) => return false,
        Ok(_) => {}
    }
    while buf.len() % piece != 0 {
        let want = (piece - buf.len() % piece) as u64;
        match (&mut *input).take(want).read_buf(buf).now_or_never() {
            Some(Ok(0)) | Some(Err(_)) => return false,
            Some(Ok(_)) => {}
            None => break,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pipe with `bytes` written into it, its reader on the reactor and its writer.
    fn pipe_with(bytes: usize) -> (tokio::net::unix::pipe::Receiver, std::fs::File) {
        use std::io::Write;
        let (r, w) = nix::unistd::pipe().unwrap();
        // Room for the test's bytes whatever the machine's default pipe size (`None`: it
        // had that much already).
        let _ = crate::transport::stdio::grow_pipe(std::os::fd::AsFd::as_fd(&w), 256 * 1024);
        let mut w = std::fs::File::from(w);
        w.write_all(&vec![7u8; bytes]).unwrap();
        (
            tokio::net::unix::pipe::Receiver::from_owned_fd(r).unwrap(),
            w,
        )
    }

    #[tokio::test]
    async fn a_full_pipe_is_read_as_a_whole_piece_and_no_short_one() {
        // 64 KiB in the pipe, as a producer leaves it: one binary write's worth (64 KiB less
        // its head), and the 512 bytes left wait for the next read instead of going out as a
        // write (a record) of their own.
        let piece = crate::client::STDIN_BINARY_WRITE_BYTES;
        let (mut r, _w) = pipe_with(64 * 1024);
        let mut buf = bytes::BytesMut::new();
        assert!(read_piece(&mut r, &mut buf, piece).await);
        assert_eq!(buf.split().len(), piece);
        assert!(read_piece(&mut r, &mut buf, piece).await);
        assert_eq!(buf.split().len(), 64 * 1024 - piece);
    }

    #[tokio::test]
    async fn pieces_then_what_is_there_then_the_end_with_its_last_bytes() {
        use std::io::Write;
        let (mut r, mut w) = pipe_with(2500);
        let mut buf = bytes::BytesMut::new();
        let mut read = Vec::new();
        for _ in 0..3 {
            assert!(read_piece(&mut r, &mut buf, 1000).await);
            read.push(buf.split().len());
        }
        // Two whole pieces, then the 500 bytes there are: never a wait for more.
        assert_eq!(read, [1000, 1000, 500]);
        w.write_all(&[1u8; 700]).unwrap();
        drop(w);
        assert!(!read_piece(&mut r, &mut buf, 1000).await, "the end is seen");
        assert_eq!(
            &buf.split()[..],
            &[1u8; 700][..],
            "with the bytes before it"
        );
        assert!(!read_piece(&mut r, &mut buf, 1000).await);
        assert!(buf.is_empty());
    }

    #[test]
    fn words_run_by_the_shell_and_argv_exactly() {
        let w = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            argv_of(&w(&["ls", "-l", "|", "wc", "-l"]), false),
            w(&["/bin/sh", "-c", "ls -l | wc -l"])
        );
        assert_eq!(argv_of(&w(&["ls", "a b"]), true), w(&["ls", "a b"]));
        assert_eq!(
            argv_of(&[], false),
            w(&["/bin/sh", "-c", "exec \"${SHELL:-/bin/sh}\" -l"])
        );
    }

    #[test]
    fn env_flags_files_and_local_values() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("env");
        std::fs::write(&f, "# c\nA=1\nB=file\n\nPATH\nNOT_SET_HERE_I19\n").unwrap();
        let env = env_of(&["B=flag".into(), "C".into()], std::slice::from_ref(&f)).unwrap();
        assert_eq!(env["A"], Some("1".into()));
        assert_eq!(env["B"], Some("flag".into()), "-e wins over the file");
        assert_eq!(env["PATH"], std::env::var("PATH").ok());
        assert_eq!(env["NOT_SET_HERE_I19"], None, "unset here: unset there");
        std::fs::write(&f, "A=1\n=x\n").unwrap();
        let e = env_of(&[], std::slice::from_ref(&f)).unwrap_err();
        assert_eq!(e.status, 2);
        assert!(
            e.words.starts_with(&format!("{}:2: ", f.display())),
            "{}",
            e.words
        );
    }
}
