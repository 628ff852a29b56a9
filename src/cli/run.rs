//! `execrelay run`: behave like `ssh host cmd` (`processes.md` §7), and `execrelay demo`.
//!
//! Local stdout/stderr receive the remote streams, local stdin is forwarded and closed at end
//! of file, `-t` puts the local terminal in raw mode and forwards size changes, Ctrl-C is
//! forwarded as `SIGINT`, and the exit status is the remote one (`128+N` for a signal).

use std::io::IsTerminal;
use std::os::fd::AsFd;
use std::time::Duration;

use clap::Args;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::client::{
    ApprovalDecision, ApprovalHandler, ApproveParams, Client, ClientOptions, InProcessConfig,
    ProcessEvent, StartOptions, Target, STDIN_WRITE_BYTES,
};
use crate::rpc::messages::StreamName;
use crate::rpc::messages::TermSize;

/// Flags of `execrelay run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Server URL: `ws://HOST:PORT`, `noise+ws://HOST:PORT`, or through a relay
    /// `relay+ws://RELAY:PORT/ENVIRONMENT_ID` (`relay+wss://` over TLS). Omit it (or pass
    /// `--local`) to run an exec server in this process.
    pub target: Option<String>,
    /// Run the command through an exec server in this process (`Client::in_process`).
    #[arg(long)]
    pub local: bool,
    /// Allocate a PTY; the local terminal goes raw and its size is forwarded.
    #[arg(short = 't', long = "tty")]
    pub tty: bool,
    /// Set an environment variable for the command (repeatable).
    #[arg(short = 'e', long = "env", value_name = "K=V")]
    pub env: Vec<String>,
    /// Working directory on the server (absolute).
    #[arg(short = 'C', long = "cwd", value_name = "DIR")]
    pub cwd: Option<String>,
    /// Terminate the command after this many seconds.
    #[arg(long, value_name = "SECONDS")]
    pub timeout: Option<f64>,
    /// noise+ws and relay+ws: the exec server's public key (a `.pub` file or the key line
    /// itself; through a relay, still the exec server's, never the relay's).
    #[arg(long, value_name = "KEY_OR_FILE")]
    pub server_key: Option<String>,
    /// noise+ws and relay+ws: this client's private key file.
    #[arg(long, value_name = "FILE")]
    pub key: Option<std::path::PathBuf>,
    /// noise+ws and relay+ws: a token to present in the handshake (read from the file).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<std::path::PathBuf>,
    /// Approve every process the server's exec policy asks about, without asking. Without
    /// it, `run` asks on the controlling terminal, and denies when there is none.
    #[arg(long)]
    pub approve_all: bool,
    /// relay+wss: trust only the CA certificates (PEM) in this file instead of the platform's
    /// roots (a relay behind a proxy with a private CA).
    #[arg(long, value_name = "FILE")]
    pub ca_file: Option<std::path::PathBuf>,
    /// Receive output as JSON with base64 instead of binary messages (the default where the
    /// transport carries them; `protocol.md` §5.1).
    #[arg(long)]
    pub json_output: bool,
    /// The program and its arguments.
    #[arg(last = true, required = true)]
    pub argv: Vec<String>,
}

/// Flags of `execrelay demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Command to run instead of the built-in demo script.
    #[arg(last = true)]
    pub argv: Vec<String>,
}

/// Run `run`; returns the exit code.
pub fn main(args: RunArgs) -> i32 {
    crate::cli::init_logging("warn", false);
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("execrelay run: {e}");
            return 255;
        }
    };
    let code = rt.block_on(run(args));
    // Do not wait for the blocking stdin reader thread.
    rt.shutdown_timeout(Duration::from_millis(100));
    code
}

/// The server to use; `None`: one in this process.
fn parse_target(args: &RunArgs) -> Result<Option<Target>, String> {
    match (&args.target, args.local) {
        (None, _) | (_, true) => Ok(None),
        (Some(_), false) => parse_remote(args).map(Some),
    }
}

fn parse_remote(args: &RunArgs) -> Result<Target, String> {
    match &args.target {
        None => Err("no target".into()),
        Some(t) if t.starts_with("ws://") => Ok(Target::Ws(t.clone())),
        Some(t)
            if t.starts_with("noise+ws://")
                || t.starts_with("relay+ws://")
                || t.starts_with("relay+wss://") =>
        {
            use crate::link::client::{LinkPool, NoiseClientConfig};
            use crate::link::dial::{LinkTarget, TlsRoots};
            use crate::noise::keys::{load_public, Keypair};
            LinkTarget::parse(t).map_err(|e| e.to_string())?;
            let server = args.server_key.as_deref().ok_or(
                "noise+ws:// and relay+ws:// need --server-key (the exec server's public key; no trust on first use)",
            )?;
            let server_public = load_public(server).map_err(|e| e.to_string())?;
            let key = args
                .key
                .as_ref()
                .ok_or("noise+ws:// and relay+ws:// need --key (this client's private key)")?;
            let keys = Keypair::load(key).map_err(|e| e.to_string())?;
            let mut config = NoiseClientConfig::new(keys, server_public);
            config.token = match &args.token_file {
                Some(p) => Some(
                    std::fs::read_to_string(p)
                        .map_err(|e| format!("{}: {e}", p.display()))?
                        .trim()
                        .to_string(),
                ),
                None => None,
            };
            if let Some(ca) = &args.ca_file {
                let roots = TlsRoots::CaFile(ca.clone());
                // Checked now, so a bad file is reported before anything is dialled.
                roots.client_config().map_err(|e| e.to_string())?;
                config.tls = roots;
            }
            Ok(Target::Noise {
                url: t.clone(),
                config: std::sync::Arc::new(config),
                // One client per run: the pool holds its link across resumes.
                pool: LinkPool::new(),
            })
        }
        Some(t) => Err(format!(
            "unsupported target {t:?}: expected ws://HOST:PORT, noise+ws://HOST:PORT, relay+ws://RELAY:PORT/ENVIRONMENT_ID, relay+wss://RELAY:PORT/ENVIRONMENT_ID or --local"
        )),
    }
}

fn local_size() -> Option<TermSize> {
    let out = std::io::stdout();
    if !out.is_terminal() {
        return None;
    }
    let mut ws = nix::pty::Winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes a winsize struct we own.
    let r = unsafe {
        libc::ioctl(
            std::os::fd::AsRawFd::as_raw_fd(&out.as_fd()),
            libc::TIOCGWINSZ,
            &mut ws,
        )
    };
    (r == 0 && ws.ws_row > 0).then_some(TermSize {
        rows: ws.ws_row,
        cols: ws.ws_col,
    })
}

/// Restores the terminal mode when dropped.
struct RawMode {
    saved: nix::sys::termios::Termios,
}

impl RawMode {
    fn enable() -> Option<RawMode> {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return None;
        }
        let saved = nix::sys::termios::tcgetattr(stdin.as_fd()).ok()?;
        let mut raw = saved.clone();
        nix::sys::termios::cfmakeraw(&mut raw);
        nix::sys::termios::tcsetattr(stdin.as_fd(), nix::sys::termios::SetArg::TCSANOW, &raw)
            .ok()?;
        Some(RawMode { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let stdin = std::io::stdin();
        let _ = nix::sys::termios::tcsetattr(
            stdin.as_fd(),
            nix::sys::termios::SetArg::TCSANOW,
            &self.saved,
        );
    }
}

async fn run(args: RunArgs) -> i32 {
    let target = match parse_target(&args) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("execrelay run: {e}");
            return 255;
        }
    };
    let mut start = StartOptions::new(RUN_PROCESS_ID, args.argv.clone());
    for kv in &args.env {
        match kv.split_once('=') {
            Some((k, v)) => {
                start.params.env.insert(k.to_string(), Some(v.to_string()));
            }
            None => {
                eprintln!("execrelay run: -e expects K=V, got {kv:?}");
                return 255;
            }
        }
    }
    start.params.cwd = args.cwd.clone();
    start.params.timeout_ms = args.timeout.map(|s| (s * 1000.0) as u64);
    start.params.pipe_stdin = true;
    if args.tty {
        start.params.tty = true;
        start.params.size = Some(local_size().unwrap_or_default());
    }
    // Install the signal handlers before anything can print: a Ctrl-C that arrived before
    // they existed would kill `run` instead of reaching the command.
    use tokio::signal::unix::{signal, SignalKind};
    let (mut sigint, mut sigwinch) = match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::window_change()),
    ) {
        (Ok(i), Ok(w)) => (i, w),
        _ => {
            eprintln!("execrelay run: cannot install signal handlers");
            return 255;
        }
    };
    let opts = ClientOptions {
        approval_handler: Some(approval_handler(
            args.approve_all,
            RUN_PROCESS_ID,
            args.argv.clone(),
        )),
        binary_output: !args.json_output,
        ..ClientOptions::default()
    };
    let connected = match target {
        Some(target) => Client::connect(target, opts).await,
        None => Client::in_process(InProcessConfig::default(), opts).await,
    };
    let client = match connected {
        Ok(c) => c,
        Err(e) => {
            eprintln!("execrelay run: {e}");
            return 255;
        }
    };
    let mut proc = match client.start(start).await {
        Ok(p) => p,
        Err(e) => {
            eprintln!("execrelay run: {e}");
            // An in-process server is shut down like after a command (its cgroups removed).
            client.shutdown().await;
            return 255;
        }
    };
    let _raw = if args.tty { RawMode::enable() } else { None };

    // stdin → process/write, then closeStdin at end of file: pipelined writes of whatever
    // stdin has (up to STDIN_WRITE_BYTES each), never waiting for more than the first byte.
    let mut writer = proc.stdin_writer();
    tokio::spawn(async move {
        use futures_util::FutureExt;
        let mut stdin = crate::transport::stdio::stdin_reader();
        let mut buf = bytes::BytesMut::new();
        let mut eof = false;
        while !eof {
            buf.reserve(STDIN_WRITE_BYTES);
            match stdin.read_buf(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            // Whatever else is readable now, without waiting.
            while buf.len() < STDIN_WRITE_BYTES {
                match stdin.read_buf(&mut buf).now_or_never() {
                    Some(Ok(0)) | Some(Err(_)) => {
                        eof = true;
                        break;
                    }
                    Some(Ok(_)) => {}
                    None => break,
                }
            }
            if writer.write(buf.split().freeze()).await.is_err() {
                return;
            }
        }
        let _ = writer.finish().await;
    });

    // Ctrl-C (when the terminal is not raw) → SIGINT; window changes → resize.
    let ctl = proc.controller();
    let tty = args.tty;
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = sigint.recv() => { let _ = ctl.signal("SIGINT").await; }
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

    let mut stdout = tokio::io::stdout();
    let mut stderr = tokio::io::stderr();
    let mut code = 255;
    while let Some(ev) = proc.next_event().await {
        match ev {
            ProcessEvent::Output { stream, data } => {
                let r = match stream {
                    StreamName::Stderr => stderr.write_all(&data).await,
                    _ => {
                        let r = stdout.write_all(&data).await;
                        if tty {
                            let _ = stdout.flush().await;
                        }
                        r
                    }
                };
                if r.is_err() {
                    // Local stdout is gone (e.g. `| head`): stop the remote command.
                    let _ = proc.terminate(None).await;
                }
            }
            ProcessEvent::Lost { from, to } => {
                eprintln!("execrelay run: output events {from}..={to} were lost");
            }
            ProcessEvent::Omitted {
                stream,
                omitted_bytes,
            } => {
                eprintln!(
                    "execrelay: {omitted_bytes} bytes of {} omitted",
                    stream.as_str()
                );
            }
            ProcessEvent::Exited(info) => {
                code = match (info.exit_code, info.signal.as_deref()) {
                    (Some(c), _) => c,
                    (None, Some(sig)) => 128 + signal_number(sig),
                    (None, None) => 255,
                };
                if info.output_drain_timed_out {
                    tracing::warn!("output was cut at the drain deadline");
                }
                break;
            }
        }
    }
    let _ = stdout.flush().await;
    let _ = stderr.flush().await;
    if let Some(why) = client.lost_reason() {
        eprintln!("execrelay run: {why}");
    }
    // The command is over: end the session rather than leave it detached on the server.
    client.shutdown().await;
    code
}

/// The id of the one process `run` starts.
const RUN_PROCESS_ID: &str = "run-1";

/// `run`'s answer to the server's approval requests: `--approve-all`, or a question on the
/// controlling terminal (like ssh's host-key question), denied when there is no terminal. A
/// request for anything but the one start `run` made (`process_id` running `argv`) is denied
/// without a question: a hostile or confused server cannot fill the terminal with prompts,
/// nor get "yes" for a command the user never typed, even under `--approve-all`.
fn approval_handler(
    approve_all: bool,
    process_id: &'static str,
    argv: Vec<String>,
) -> std::sync::Arc<dyn ApprovalHandler> {
    let argv = std::sync::Arc::new(argv);
    std::sync::Arc::new(move |request: ApproveParams| {
        let argv = argv.clone();
        async move {
            if !is_our_start(&request, process_id, &argv) {
                static WARNED: std::sync::atomic::AtomicBool =
                    std::sync::atomic::AtomicBool::new(false);
                if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    eprintln!(
                        "execrelay run: the server asked to approve a start this command did not make; denied (and every such request after it)"
                    );
                }
                return ApprovalDecision::Deny;
            }
            if approve_all {
                return ApprovalDecision::Approve;
            }
            tokio::task::spawn_blocking(move || ask_on_terminal(&request))
                .await
                .unwrap_or(ApprovalDecision::Deny)
        }
    })
}

/// Whether `request` asks about the start `run` made: its process id, running its argv.
fn is_our_start(request: &ApproveParams, process_id: &str, argv: &[String]) -> bool {
    request.process_id == process_id && request.argv == argv
}

/// One question at a time on the terminal.
static TERMINAL_QUESTION: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// `approve <argv> (rule: …)? [y/N]` on `/dev/tty`: `y` or `yes` approves, anything else
/// (an empty line, end of file) denies. Not stdin/stdout: those carry the command's data.
fn ask_on_terminal(request: &ApproveParams) -> ApprovalDecision {
    use std::io::{BufRead, Write};
    let _one = TERMINAL_QUESTION.lock().unwrap_or_else(|p| p.into_inner());
    let argv = display_argv(&request.argv);
    let tty = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty");
    let Ok(mut tty) = tty else {
        eprintln!(
            "execrelay run: the server asks to approve {argv} (rule: {}), and there is no terminal to ask on: denied (--approve-all approves without asking)",
            sanitize(&request.rule)
        );
        return ApprovalDecision::Deny;
    };
    let question = format!("approve {argv} (rule: {})? [y/N] ", sanitize(&request.rule));
    if tty
        .write_all(question.as_bytes())
        .and_then(|()| tty.flush())
        .is_err()
    {
        return ApprovalDecision::Deny;
    }
    let mut line = String::new();
    let mut reader = std::io::BufReader::new(tty);
    if reader.read_line(&mut line).is_err() {
        return ApprovalDecision::Deny;
    }
    match line.trim().to_ascii_lowercase().as_str() {
        "y" | "yes" => ApprovalDecision::Approve,
        _ => ApprovalDecision::Deny,
    }
}

/// `argv` as a shell would read it back: plain words as they are, others single-quoted;
/// control characters escaped, so a server cannot drive the terminal through a prompt.
fn display_argv(argv: &[String]) -> String {
    let plain = |a: &str| {
        !a.is_empty()
            && a.chars()
                .all(|c| c.is_ascii_alphanumeric() || "_@%+=:,./-".contains(c))
    };
    argv.iter()
        .map(|a| {
            if plain(a) {
                a.clone()
            } else {
                format!("'{}'", sanitize(a).replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// `text` with every control character escaped (`\n`, `\u{1b}`).
fn sanitize(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

fn signal_number(name: &str) -> i32 {
    name.parse::<nix::sys::signal::Signal>()
        .map(|s| s as i32)
        .unwrap_or(0)
}

/// `execrelay demo`: the whole path on one machine. Throwaway keys; a relay in this process;
/// an exec server (`execrelay serve --relay …`, a child process) registered with it; and the
/// demo client running a command through the relay over Noise.
pub fn demo_main(args: DemoArgs) -> i32 {
    // The relay's own link notices (a link closing at shutdown) are not the demo's story.
    crate::cli::init_logging("warn,execrelay_relay=error", false);
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("execrelay demo: {e}");
            return 1;
        }
    };
    match rt.block_on(demo(args)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("execrelay demo: {e}");
            1
        }
    }
}

/// How long the demo waits for the exec server to register with the relay.
const DEMO_REGISTER_TIMEOUT: Duration = Duration::from_secs(15);

async fn demo(args: DemoArgs) -> anyhow::Result<i32> {
    use crate::link::client::{LinkPool, NoiseClientConfig};
    use crate::noise::keys::{fingerprint, public_line, Keypair};
    use execrelay_relay::keys::environments::EnvironmentsFile;
    use execrelay_relay::server::settings::RelaySettings;
    use execrelay_relay::server::RelayServerConfig;
    use tokio::io::AsyncBufReadExt;

    // 1. Throwaway keys, as `execrelay keygen` writes them.
    let dir = std::env::temp_dir().join(format!("execrelay-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    struct Cleanup(std::path::PathBuf);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _cleanup = Cleanup(dir.clone());
    let (relay_keys, server_keys, client_keys) = (
        Keypair::generate()?,
        Keypair::generate()?,
        Keypair::generate()?,
    );
    relay_keys.write(&dir.join("relay"), "demo-relay")?;
    server_keys.write(&dir.join("server"), "demo-server")?;
    let env_id = "demo";
    std::fs::write(
        dir.join("environments"),
        format!(
            "{env_id} {}\n",
            public_line(&server_keys.public, "demo-server")
        ),
    )?;
    std::fs::write(
        dir.join("authorized_keys"),
        format!("{}\n", public_line(&client_keys.public, "demo-client")),
    )?;
    println!(
        "demo: keys in {} (relay, exec server, client; deleted at the end)",
        dir.display()
    );

    // 2. The relay, in this process.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let relay_url = format!("ws://{}", listener.local_addr()?);
    let relay_config = RelayServerConfig {
        keys: relay_keys.clone(),
        environments: EnvironmentsFile::load(&dir.join("environments"))?,
        settings: RelaySettings::default(),
    };
    let relay_stop = tokio_util::sync::CancellationToken::new();
    let relay = tokio::spawn(execrelay_relay::server::run(
        listener,
        relay_config,
        relay_stop.clone(),
    ));
    println!(
        "demo: relay listening on {relay_url} (key {}); it routes frames and reads none",
        fingerprint(&relay_keys.public)
    );

    // 3. The exec server, a child process that dials out to the relay.
    let exe = std::env::current_exe()?;
    let mut cmd = tokio::process::Command::new(exe);
    if std::env::var_os("RUST_LOG").is_none() {
        // Keep the demo's own output readable; RUST_LOG=info shows the server's logs.
        cmd.env("RUST_LOG", "warn");
    }
    let mut server = cmd
        .arg("serve")
        .args(["--relay", &relay_url, "--environment-id", env_id])
        .arg("--relay-key")
        .arg(dir.join("relay.pub"))
        .arg("--key")
        .arg(dir.join("server"))
        .arg("--authorized-keys")
        .arg(dir.join("authorized_keys"))
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| anyhow::anyhow!("cannot start the exec server: {e}"))?;
    let out = server
        .stdout
        .take()
        .ok_or_else(|| anyhow::anyhow!("no stdout"))?;
    let mut lines = tokio::io::BufReader::new(out).lines();
    let url = lines
        .next_line()
        .await?
        .ok_or_else(|| anyhow::anyhow!("the exec server did not print its URL"))?;
    println!(
        "demo: exec server (pid {}) dialled out as environment {env_id:?}; clients reach it at {url}",
        server.id().unwrap_or(0)
    );

    // 4. The client, through the relay, end to end encrypted to the exec server's key.
    let config = NoiseClientConfig::new(client_keys, server_keys.public);
    let target = Target::Noise {
        url: url.clone(),
        config: std::sync::Arc::new(config),
        pool: LinkPool::new(),
    };
    let deadline = tokio::time::Instant::now() + DEMO_REGISTER_TIMEOUT;
    let client = loop {
        match Client::connect(target.clone(), ClientOptions::default()).await {
            Ok(c) => break c,
            // The exec server may not have registered yet.
            Err(e)
                if tokio::time::Instant::now() < deadline && e.to_string().contains("offline") =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e.into()),
        }
    };
    println!(
        "demo: client -> relay -> exec server: Noise_IK stream open, session {}",
        client.session_id().unwrap_or_default()
    );
    let argv = if args.argv.is_empty() {
        vec![
            "sh".to_string(),
            "-c".to_string(),
            "for i in 1 2 3 4 5; do echo \"tick $i from pid $$\"; sleep 0.2; done; echo 'a line on stderr' >&2; exit 7".to_string(),
        ]
    } else {
        args.argv
    };
    println!("demo: running {argv:?}");
    let mut p = client.start(StartOptions::new("demo-1", argv)).await?;
    let mut status = 1;
    while let Some(ev) = p.next_event().await {
        match ev {
            ProcessEvent::Output { stream, data } => {
                for line in String::from_utf8_lossy(&data).lines() {
                    println!("[{}] {line}", stream.as_str());
                }
            }
            ProcessEvent::Lost { from, to } => println!("[lost] events {from}..={to}"),
            ProcessEvent::Omitted {
                stream,
                omitted_bytes,
            } => {
                println!("[{}] ({omitted_bytes} bytes omitted)", stream.as_str())
            }
            ProcessEvent::Exited(info) => {
                println!(
                    "demo: exited: code={:?} signal={:?} stdout={}B stderr={}B in {} ms",
                    info.exit_code,
                    info.signal,
                    info.stdout_bytes,
                    info.stderr_bytes,
                    info.duration_ms
                );
                status = 0;
                break;
            }
        }
    }
    client.shutdown().await;
    if let Some(pid) = server.id() {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    let _ = tokio::time::timeout(Duration::from_secs(10), server.wait()).await;
    relay_stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(10), relay).await;
    println!("demo: done (every byte between client and exec server crossed the relay encrypted)");
    Ok(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(id: &str, argv: &[&str]) -> ApproveParams {
        ApproveParams {
            process_id: id.into(),
            argv: argv.iter().map(|a| a.to_string()).collect(),
            cwd: "/".into(),
            env_names: Vec::new(),
            tty: false,
            rule: "default".into(),
        }
    }

    #[tokio::test]
    async fn approvals_for_starts_run_did_not_make_are_denied_without_asking() {
        let argv = vec!["make".to_string(), "test".to_string()];
        // --approve-all: only what `run` started is approved; no terminal is touched.
        let h = approval_handler(true, RUN_PROCESS_ID, argv.clone());
        assert_eq!(
            h.decide(request(RUN_PROCESS_ID, &["make", "test"])).await,
            ApprovalDecision::Approve
        );
        assert_eq!(
            h.decide(request("other", &["make", "test"])).await,
            ApprovalDecision::Deny
        );
        assert_eq!(
            h.decide(request(RUN_PROCESS_ID, &["rm", "-rf", "/"])).await,
            ApprovalDecision::Deny
        );
        assert!(is_our_start(
            &request(RUN_PROCESS_ID, &["make", "test"]),
            RUN_PROCESS_ID,
            &argv
        ));
        assert!(!is_our_start(
            &request(RUN_PROCESS_ID, &["make"]),
            RUN_PROCESS_ID,
            &argv
        ));
    }

    #[test]
    fn prompts_show_argv_as_a_shell_reads_it_and_never_control_characters() {
        let argv = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            display_argv(&argv(&["rm", "-rf", "/tmp/x"])),
            "rm -rf /tmp/x"
        );
        assert_eq!(
            display_argv(&argv(&["sh", "-c", "echo it's"])),
            "sh -c 'echo it'\\''s'"
        );
        assert_eq!(display_argv(&argv(&["a\x1b[2Jb", ""])), "'a\\u{1b}[2Jb' ''");
        assert_eq!(sanitize("line\nbreak"), "line\\nbreak");
    }
}
