//! Commands that outlive their client: `run --detach` starts one and prints its handle,
//! `attach` shows its output (from the first byte the server still holds, or from where the
//! last attach stopped) and ends with its status, `ps` lists them, `kill` signals one.
//!
//! Each detached command has a session of its own, asked to outlive the default TTL
//! (`sessionTtlMs`, `protocol.md` §3), with acks: what an attach shows is released only
//! lazily ([`AckPolicy::Lazy`]), so a later attach can show it again. What a client needs to
//! come back, the session id and its resume token, is kept in one file per command under
//! `$XDG_STATE_HOME/execrelay/detached/` (`~/.local/state/…`), mode 0600 in a 0700
//! directory, and removed once an attach showed the command's end.

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Args;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::connect::{failure_of, resolve, ConnFlags, Remote};
use super::duration::show_duration;
use super::failure::{say, Failure};
use super::outcome::{command_end, start_failure};
use super::show::show_events;
use super::terminal::announce_resumes;
use crate::client::{AckPolicy, ApprovalHandler, Client, ClientError, ClientOptions, StartOptions};

/// The process id of a detached command in its session.
pub const DETACHED_PROCESS_ID: &str = "p-1";
/// How long a detached session is asked to survive without a client, unless `--session-ttl`
/// says otherwise: a day (a server's `--max-session-ttl` may grant less).
pub const DEFAULT_DETACHED_TTL: Duration = Duration::from_secs(24 * 3600);

/// What a client keeps to come back to a detached command.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Detached {
    /// `SESSION/PROCESS`: what the user types.
    pub handle: String,
    /// The target as typed (a URL or a host alias).
    pub target: String,
    /// The URL it resolved to.
    pub url: String,
    /// The session.
    pub session_id: String,
    /// Its resume token (a secret: the file is 0600).
    pub resume_token: String,
    /// The process in it.
    pub process_id: String,
    /// The command, as shown by `ps`.
    pub command: String,
    /// When it was started (seconds since the epoch).
    pub started: u64,
    /// The seq of the last event an attach showed (for `--since-last`).
    pub last_seq: u64,
}

/// `$XDG_STATE_HOME/execrelay/detached`, else `~/.local/state/execrelay/detached`.
pub fn state_dir() -> Result<PathBuf, Failure> {
    let base = match std::env::var_os("XDG_STATE_HOME").filter(|v| !v.is_empty()) {
        Some(x) => PathBuf::from(x),
        None => std::env::var_os("HOME")
            .filter(|v| !v.is_empty())
            .map(|h| PathBuf::from(h).join(".local").join("state"))
            .ok_or_else(|| {
                Failure::cause(
                    "neither XDG_STATE_HOME nor HOME is set: nowhere to keep resume tokens",
                )
            })?,
    };
    Ok(base.join("execrelay").join("detached"))
}

impl Detached {
    fn file(&self) -> Result<PathBuf, Failure> {
        Ok(state_dir()?.join(format!("{}.json", self.session_id)))
    }

    /// Write (0600, in a 0700 directory; replaced whole, never half written).
    pub fn save(&self) -> Result<(), Failure> {
        use std::io::Write;
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        let dir = state_dir()?;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| Failure::cause(format!("{}: {e}", dir.display())))?;
        let path = self.file()?;
        let tmp = path.with_extension("json.tmp");
        let text = serde_json::to_vec_pretty(self).map_err(|e| Failure::cause(e.to_string()))?;
        let io = |e: std::io::Error| Failure::cause(format!("{}: {e}", tmp.display()));
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io)?;
        f.write_all(&text).and_then(|()| f.sync_all()).map_err(io)?;
        std::fs::rename(&tmp, &path).map_err(|e| Failure::cause(format!("{}: {e}", path.display())))
    }

    /// Forget it (its command ended, or its session is gone).
    pub fn forget(&self) {
        if let Ok(p) = self.file() {
            let _ = std::fs::remove_file(p);
        }
    }

    /// Every detached command this client started at `url`, oldest first.
    pub fn all_at(url: &str) -> Result<Vec<Detached>, Failure> {
        let dir = state_dir()?;
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Failure::cause(format!("{}: {e}", dir.display()))),
        };
        let mut all = Vec::new();
        for e in entries.flatten() {
            let p = e.path();
            if p.extension().and_then(|x| x.to_str()) != Some("json") {
                continue;
            }
            let Ok(text) = std::fs::read(&p) else {
                continue;
            };
            match serde_json::from_slice::<Detached>(&text) {
                Ok(d) if d.url == url => all.push(d),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(file = %p.display(), error = %e, "unreadable detached-command file skipped")
                }
            }
        }
        all.sort_by(|a, b| (a.started, &a.handle).cmp(&(b.started, &b.handle)));
        Ok(all)
    }

    /// The one command at `url` whose handle is `handle`, or starts with it.
    pub fn find(url: &str, target: &str, handle: &str) -> Result<Detached, Failure> {
        let all = Detached::all_at(url)?;
        if let Some(d) = all.iter().find(|d| d.handle == handle) {
            return Ok(d.clone());
        }
        let mut matches = all.into_iter().filter(|d| d.handle.starts_with(handle));
        match (matches.next(), matches.next()) {
            (Some(d), None) if !handle.is_empty() => Ok(d),
            (Some(_), Some(_)) => Err(Failure::cause(format!(
                "{handle:?} names more than one detached command at {target}: give more of the handle (execrelay ps {target})"
            ))),
            _ => Err(Failure::cause(format!(
                "no detached command {handle:?} at {target} started from here (execrelay ps {target} lists them)"
            ))),
        }
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// `run --detach`: start `start` in a session of its own that survives detached for `ttl`
/// (the server's most if it grants less), print its handle, keep its resume token, exit 0.
pub async fn detach(
    label: &str,
    remote: &Remote,
    mut start: StartOptions,
    ttl: Option<Duration>,
    approval: Option<std::sync::Arc<dyn ApprovalHandler>>,
) -> Result<i32, Failure> {
    start.params.process_id = DETACHED_PROCESS_ID.into();
    let want = ttl.unwrap_or(DEFAULT_DETACHED_TTL);
    let mut opts = ClientOptions {
        acks: true,
        ack_policy: AckPolicy::Lazy,
        session_ttl: Some(want),
        approval_handler: approval,
        ..ClientOptions::default()
    };
    let client = match Client::connect(remote.target.clone(), opts.clone()).await {
        Ok(c) => c,
        // The server keeps sessions less long: take what it grants, unless it was asked.
        Err(ClientError::Rpc {
            code: -32602,
            data: Some(d),
            ..
        }) if ttl.is_none() && d["member"] == "sessionTtlMs" && d["max"].is_u64() => {
            let most = Duration::from_millis(d["max"].as_u64().unwrap_or(0));
            opts.session_ttl = Some(most);
            Client::connect(remote.target.clone(), opts)
                .await
                .map_err(|e| failure_of(remote, &e))?
        }
        Err(e) => return Err(failure_of(remote, &e)),
    };
    let command = display_command(&start.params.argv);
    let proc = match client.start(start).await {
        Ok(p) => p,
        Err(e) => {
            client.shutdown().await;
            return Err(start_failure(
                &remote.url,
                &e,
                remote.key.as_deref(),
                remote.token,
            ));
        }
    };
    let Some((session_id, resume_token)) = client.session_credentials() else {
        return Err(Failure::cause("no session after initialize"));
    };
    let d = Detached {
        handle: format!("{session_id}/{}", proc.id),
        target: label.to_string(),
        url: remote.url.clone(),
        session_id,
        resume_token,
        process_id: proc.id.clone(),
        command,
        started: now_secs(),
        last_seq: 0,
    };
    if let Err(f) = d.save() {
        // Without its token nobody could come back: do not leave it running unreachable.
        client.shutdown().await;
        return Err(f);
    }
    println!("{}", d.handle);
    let granted = client.granted_session_ttl();
    if granted < want {
        say(&format!(
            "the server keeps a detached session {} at most (asked for {})",
            show_duration(granted),
            show_duration(want)
        ));
    }
    drop(proc);
    // Leave the session detached (not closed): the command runs on.
    client.close();
    Ok(0)
}

/// `argv` as `ps` shows it: the shell's script for `/bin/sh -c`, else the words.
fn display_command(argv: &[String]) -> String {
    match argv {
        [sh, c, script] if sh == "/bin/sh" && c == "-c" => script.clone(),
        _ => argv.join(" "),
    }
}

/// Flags of `execrelay attach`.
#[derive(Debug, Args)]
#[command(
    after_help = "Ctrl-C detaches again (the command runs on); --kill-on-interrupt sends it SIGINT instead.
The exit status is the command's, as with run, once it ended."
)]
pub struct AttachArgs {
    /// Where the command runs: a URL or a host alias.
    pub target: String,
    /// The handle `run --detach` printed (or the start of it).
    pub handle: String,
    /// Show the output from where the last attach stopped, not from the first byte.
    #[arg(long)]
    pub since_last: bool,
    /// Ctrl-C sends SIGINT to the command instead of detaching.
    #[arg(long)]
    pub kill_on_interrupt: bool,
    /// How to reach the server (flags win over the host's entry).
    #[command(flatten)]
    pub conn: ConnFlags,
}

/// Flags of `execrelay ps`.
#[derive(Debug, Args)]
pub struct PsArgs {
    /// Where the commands run: a URL or a host alias.
    pub target: String,
    /// How to reach the server (flags win over the host's entry).
    #[command(flatten)]
    pub conn: ConnFlags,
}

/// Flags of `execrelay kill`.
#[derive(Debug, Args)]
pub struct KillArgs {
    /// The signal: a name (`TERM`, `SIGKILL`) or a number [default: TERM].
    #[arg(
        short = 's',
        long = "signal",
        value_name = "SIGNAL",
        default_value = "TERM"
    )]
    pub signal: String,
    /// Where the command runs: a URL or a host alias.
    pub target: String,
    /// The handle `run --detach` printed (or the start of it).
    pub handle: String,
    /// How to reach the server (flags win over the host's entry).
    #[command(flatten)]
    pub conn: ConnFlags,
}

/// Options of a client that comes back to a detached session.
fn coming_back() -> ClientOptions {
    ClientOptions {
        acks: true,
        ack_policy: AckPolicy::Lazy,
        ..ClientOptions::default()
    }
}

/// Resume `d`'s session, handing out its process's events after `after`.
async fn resume(
    remote: &Remote,
    d: &Detached,
    target: &str,
    after: Option<u64>,
) -> Result<(Client, Option<crate::client::ProcessHandle>), Failure> {
    let watch: Vec<(String, u64)> = after
        .map(|a| vec![(d.process_id.clone(), a)])
        .unwrap_or_default();
    match Client::resume(
        remote.target.clone(),
        coming_back(),
        &d.session_id,
        &d.resume_token,
        &watch,
    )
    .await
    {
        Ok((c, mut handles)) => Ok((c, handles.pop())),
        Err(ClientError::Rpc { code: -32003, .. }) => {
            d.forget();
            Err(Failure::cause(format!(
                "{}: the session expired on {} (it outlived its TTL detached, or was closed); forgotten here",
                d.handle, target
            )))
        }
        Err(e) => Err(failure_of(remote, &e)),
    }
}

/// Run a runtime for one of these commands.
fn block_on(f: impl std::future::Future<Output = Result<i32, Failure>>) -> i32 {
    crate::cli::init_logging("warn", false);
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => return Failure::cause(format!("cannot start: {e}")).report(),
    };
    let code = rt.block_on(async {
        match f.await {
            Ok(c) => c,
            Err(f) => f.report(),
        }
    });
    rt.shutdown_timeout(Duration::from_millis(100));
    code
}

/// `execrelay attach`.
pub fn attach_main(args: AttachArgs) -> i32 {
    block_on(attach(args))
}

async fn attach(args: AttachArgs) -> Result<i32, Failure> {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut sigint) = signal(SignalKind::interrupt()) else {
        return Err(Failure::cause("cannot install signal handlers"));
    };
    let remote = resolve(&args.target, &args.conn)?;
    let mut d = Detached::find(&remote.url, &args.target, &args.handle)?;
    let after = if args.since_last { d.last_seq } else { 0 };
    let (client, proc) = resume(&remote, &d, &args.target, Some(after)).await?;
    let Some(mut proc) = proc else {
        return Err(Failure::cause("no process handle after the resume"));
    };
    // A process the session no longer knows would never send anything: say so instead.
    let listed = client
        .call("process/list", json!({}))
        .await
        .map_err(|e| failure_of(&remote, &e))?;
    if state_of(&listed, &d.process_id).0 == "gone" {
        client.shutdown().await;
        d.forget();
        return Err(Failure::cause(format!(
            "{}: the command is no longer known on {}; forgotten here",
            d.handle, args.target
        )));
    }
    announce_resumes(&client);
    let ctl = proc.controller();
    let ended = tokio::select! {
        ended = show_events(&mut proc, false) => Some(ended),
        _ = sigint.recv() => {
            if args.kill_on_interrupt {
                let _ = ctl.signal("SIGINT").await;
                // The end follows, with its status.
                Some(show_events(&mut proc, false).await)
            } else {
                None
            }
        }
    };
    d.last_seq = proc.consumed_seq().max(d.last_seq);
    match ended {
        // Ctrl-C: detached again.
        None => {
            d.save()?;
            client.close();
            say(&format!(
                "detached; the command runs on (execrelay attach {} {} comes back; --since-last goes on from here)",
                args.target, d.handle
            ));
            Ok(0)
        }
        Some(Some(info)) => {
            let (code, words) = command_end(&info, None, args.kill_on_interrupt);
            if let Some(w) = words {
                say(&w);
            }
            // Its end was shown: the session and what is kept of it go.
            client.shutdown().await;
            d.forget();
            Ok(code)
        }
        Some(None) => {
            d.save()?;
            let f = match client.loss() {
                Some(e) => failure_of(&remote, &e),
                None => Failure::cause(format!("the connection to {} was lost", remote.url)),
            };
            client.close();
            Err(f)
        }
    }
}

/// `execrelay ps`.
pub fn ps_main(args: PsArgs) -> i32 {
    block_on(ps(args))
}

async fn ps(args: PsArgs) -> Result<i32, Failure> {
    let remote = resolve(&args.target, &args.conn)?;
    let all = Detached::all_at(&remote.url)?;
    if all.is_empty() {
        // `ps` asks no server: it lists what this client detached there. An empty list for
        // a mistyped target would otherwise look the same as a quiet server.
        say(&format!(
            "no detached commands started from this client on {} (`execrelay run --detach {} CMD` starts one)",
            args.target, args.target
        ));
    }
    println!(
        "{:<40} {:<8} {:<14} {:>6}  COMMAND",
        "HANDLE", "STATE", "STATUS", "AGE"
    );
    let mut worst = 0;
    for d in all {
        let age = show_age(now_secs().saturating_sub(d.started));
        let (state, status) = match resume(&remote, &d, &args.target, None).await {
            Ok((client, _)) => {
                let listed = client.call("process/list", json!({})).await;
                client.close();
                match listed {
                    Ok(v) => state_of(&v, &d.process_id),
                    Err(e) => ("unknown".to_string(), failure_of(&remote, &e).words),
                }
            }
            Err(f) if f.words.contains("the session expired") => {
                ("gone".into(), "session expired".into())
            }
            Err(f) => {
                worst = f.status;
                ("unknown".into(), f.words)
            }
        };
        println!(
            "{:<40} {:<8} {:<14} {:>6}  {}",
            d.handle, state, status, age, d.command
        );
    }
    Ok(worst)
}

/// `running` / `exited` and the status, from a `process/list` result.
fn state_of(list: &Value, id: &str) -> (String, String) {
    let Some(p) = list["processes"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["processId"] == id))
    else {
        return ("gone".into(), "-".into());
    };
    let state = p["state"].as_str().unwrap_or("?").to_string();
    let status = match (p["exitCode"].as_i64(), p["signal"].as_str()) {
        (Some(c), _) => c.to_string(),
        (None, Some(sig)) => sig.to_string(),
        _ => "-".into(),
    };
    (state, status)
}

fn show_age(secs: u64) -> String {
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

/// `execrelay kill`.
pub fn kill_main(args: KillArgs) -> i32 {
    block_on(kill(args))
}

/// A signal as `kill -s` takes it (`TERM`, `SIGTERM`, `15`), by its protocol name.
pub fn signal_name(s: &str) -> Result<String, Failure> {
    use nix::sys::signal::Signal;
    let sig = match s.parse::<i32>() {
        Ok(n) => Signal::try_from(n).ok(),
        Err(_) => {
            let upper = s.to_ascii_uppercase();
            let name = if upper.starts_with("SIG") {
                upper
            } else {
                format!("SIG{upper}")
            };
            name.parse::<Signal>().ok()
        }
    };
    let name = sig.map(|s| s.as_str().to_string());
    match name {
        Some(n) if crate::process::signals::parse_signal(&n).is_some() => Ok(n),
        _ => Err(Failure::usage(format!(
            "unknown signal {s:?}: one of INT, TERM, KILL, HUP, QUIT, USR1, USR2, WINCH, CONT, STOP (or its number)"
        ))),
    }
}

async fn kill(args: KillArgs) -> Result<i32, Failure> {
    let signal = signal_name(&args.signal)?;
    let remote = resolve(&args.target, &args.conn)?;
    let d = Detached::find(&remote.url, &args.target, &args.handle)?;
    let (client, _) = resume(&remote, &d, &args.target, None).await?;
    let r = client
        .call(
            "process/signal",
            json!({"processId": d.process_id, "signal": signal}),
        )
        .await;
    client.close();
    r.map_err(|e| failure_of(&remote, &e))?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_by_name_or_number() {
        assert_eq!(signal_name("TERM").unwrap(), "SIGTERM");
        assert_eq!(signal_name("sigkill").unwrap(), "SIGKILL");
        assert_eq!(signal_name("9").unwrap(), "SIGKILL");
        assert_eq!(signal_name("2").unwrap(), "SIGINT");
        assert_eq!(signal_name("NOPE").unwrap_err().status, 2);
    }

    #[test]
    fn commands_show_as_typed() {
        let w = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            display_command(&w(&["/bin/sh", "-c", "make -j4"])),
            "make -j4"
        );
        assert_eq!(display_command(&w(&["ls", "-l"])), "ls -l");
        assert_eq!(show_age(59), "59s");
        assert_eq!(show_age(3600), "60m");
        assert_eq!(show_age(10_000), "2h");
    }
}
