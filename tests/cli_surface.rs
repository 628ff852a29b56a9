//! The command line as ssh users expect it, through the built binary (README "The command
//! line"): shell strings and exact argv, the missing target, every exit status with its
//! words, host aliases (each field, a flag over it, a broken file), `-n` in a shell loop,
//! `TERM` under `-t`, `--keep-tail`, and the notices of a connection being resumed.
//!
//! Every test waits on output or on an exit, bounded by a hang guard; none sleeps to
//! synchronise. Children run with `RUST_LOG` removed and their own `HOME`, `XDG_CONFIG_HOME`
//! and `XDG_STATE_HOME`, as a user's would be.

mod common;
use common::binary::{output_of, serve_cmd};
use common::cut_proxy::CutProxy;
use common::noise_bin::{keygen, server_and_client, BinServer};
use common::pty::{open_pty, Screen};
use common::*;

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// A home of its own for the client: `HOME`, `XDG_CONFIG_HOME` and `XDG_STATE_HOME` in a
/// temporary directory.
struct Home {
    dir: tempfile::TempDir,
}

impl Home {
    fn new() -> Home {
        Home {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The configuration file (`$XDG_CONFIG_HOME/execrelay/config.toml`).
    fn config(&self) -> PathBuf {
        let d = self.path().join("config").join("execrelay");
        std::fs::create_dir_all(&d).unwrap();
        d.join("config.toml")
    }

    /// `execrelay ARGS…` in this home.
    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(bin());
        c.args(args)
            .env_remove("RUST_LOG")
            .env_remove("EXECRELAY_CONFIG")
            .env("HOME", self.path())
            .env("XDG_CONFIG_HOME", self.path().join("config"))
            .env("XDG_STATE_HOME", self.path().join("state"))
            .stdin(Stdio::null())
            .kill_on_drop(true);
        c
    }

    async fn out(&self, args: &[&str]) -> Output {
        output_of(&mut self.cmd(args)).await
    }
}

/// `execrelay serve --listen ws://127.0.0.1:0 EXTRA…`: the child, its URL and port.
async fn ws_server(extra: &[&str]) -> (Child, String, u16) {
    let mut child = serve_cmd("ws://127.0.0.1:0", Stdio::null())
        .args(extra)
        .env_remove("RUST_LOG")
        .spawn()
        .expect("spawn serve");
    let out = child.stdout.take().unwrap();
    let mut lines = BufReader::new(out).lines();
    let url = tokio::time::timeout(GUARD, lines.next_line())
        .await
        .expect("serve printed its URL (hang guard)")
        .unwrap()
        .expect("a URL line");
    // Keep reading stdout so the server never writes to a closed pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let port = url.rsplit(':').next().unwrap().parse().unwrap();
    (child, url, port)
}

fn code(o: &Output) -> i32 {
    o.status
        .code()
        .unwrap_or_else(|| panic!("died by a signal: {o:?}"))
}

/// The one line on stderr (panics unless there is exactly one).
fn one_line(o: &Output) -> String {
    let err = text(&o.stderr);
    assert_eq!(err.lines().count(), 1, "one line on stderr: {err:?}");
    err.trim_end().to_string()
}

// ---------------------------------------------------------------------------------------------
// Commands: shell strings, exact argv, the missing target.

#[tokio::test]
async fn shell_strings_keep_their_pipes_and_quotes() {
    let (_server, url, _) = ws_server(&[]).await;
    let home = Home::new();
    let o = home
        .out(&[
            "run",
            &url,
            "printf '%s|' 'a  b' \"c'd\" | tr '|' '\\n' | wc -l; echo \"$((6*7))\"",
        ])
        .await;
    assert_eq!(code(&o), 0, "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "2\n42\n");
    // Several words are joined with single spaces, as ssh joins them.
    let o = home
        .out(&["run", &url, "echo", "a", "b", "|", "tr", "a-z", "A-Z"])
        .await;
    assert_eq!(text(&o.stdout), "A B\n", "{}", text(&o.stderr));
    // An option of the command after TARGET is the command's (`ls -d` here), not run's.
    let o = home.out(&["run", &url, "ls", "-d", "/"]).await;
    assert_eq!(text(&o.stdout), "/\n", "{}", text(&o.stderr));
}

#[tokio::test]
async fn argv_after_the_double_dash_is_untouched() {
    let (_server, url, _) = ws_server(&[]).await;
    let home = Home::new();
    let o = home
        .out(&[
            "run", &url, "--", "printf", "[%s]", "a  b", "$HOME", "*", "'q'", "-n",
        ])
        .await;
    assert_eq!(code(&o), 0, "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "[a  b][$HOME][*]['q'][-n]");
    // Options may also stand right after TARGET, before `--`.
    let o = home
        .out(&["run", &url, "-e", "X=1", "--", "sh", "-c", "echo $X"])
        .await;
    assert_eq!(text(&o.stdout), "1\n", "{}", text(&o.stderr));
}

#[tokio::test]
async fn a_missing_target_is_a_usage_error_never_a_local_run() {
    let home = Home::new();
    for args in [vec!["run"], vec!["run", "-t"], vec!["run", "-e", "A=1"]] {
        let o = home.out(&args).await;
        assert_eq!(code(&o), 2, "{args:?}");
        assert_eq!(
            one_line(&o),
            "execrelay: no target: give a URL or a host alias (or --local to run here)"
        );
        assert!(o.stdout.is_empty());
    }
    // `--` first: the next word is the target, never run here.
    let o = home
        .out(&["run", "--", "ws://127.0.0.1:1", "touch", "/tmp/i19-never"])
        .await;
    assert_eq!(code(&o), 255);
    assert!(one_line(&o).starts_with("execrelay: cannot connect to ws://127.0.0.1:1: "));
    assert!(!Path::new("/tmp/i19-never").exists(), "nothing ran here");
    // --local stays the way to run here.
    let o = home.out(&["run", "--local", "echo", "here"]).await;
    assert_eq!(text(&o.stdout), "here\n", "{}", text(&o.stderr));
}

// ---------------------------------------------------------------------------------------------
// Exit statuses and their words.

#[tokio::test]
async fn the_commands_status_and_the_shells_conventions() {
    let (_server, url, _) = ws_server(&[]).await;
    let home = Home::new();
    let o = home.out(&["run", &url, "exit 42"]).await;
    assert_eq!((code(&o), text(&o.stderr)), (42, String::new()));
    let o = home.out(&["run", &url, "kill -USR1 $$"]).await;
    assert_eq!((code(&o), text(&o.stderr)), (128 + 10, String::new()));
    // 127: a program that is not there.
    let o = home.out(&["run", &url, "--", "nosuchprog"]).await;
    assert_eq!(code(&o), 127);
    assert_eq!(one_line(&o), "execrelay: nosuchprog: command not found");
    // 126: one that cannot be executed.
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("not-executable");
    std::fs::write(&script, "echo hi\n").unwrap();
    let o = home
        .out(&["run", &url, "--", script.to_str().unwrap()])
        .await;
    assert_eq!(code(&o), 126);
    assert_eq!(
        one_line(&o),
        format!("execrelay: {}: permission denied", script.display())
    );
    // A missing working directory is not a missing program.
    let o = home
        .out(&["run", &url, "-C", "/nonexistent-i19", "--", "true"])
        .await;
    assert_eq!(code(&o), 255);
    assert_eq!(
        one_line(&o),
        "execrelay: cwd \"/nonexistent-i19\": no such directory"
    );
    // 124 after --timeout, in every accepted form.
    for t in ["1", "1s"] {
        let o = home.out(&["run", "--timeout", t, &url, "sleep 30"]).await;
        assert_eq!(code(&o), 124);
        assert_eq!(one_line(&o), "execrelay: timed out after 1s");
    }
    let o = home.out(&["run", "--timeout", "5x", &url, "true"]).await;
    assert_eq!(code(&o), 2, "a bad duration is a usage error");
    assert!(text(&o.stderr).contains("is not a duration"));
}

#[tokio::test]
async fn what_is_not_the_commands_doing_is_255_with_its_cause() {
    let home = Home::new();
    // Cannot connect, naming the URL.
    let free = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("ws://127.0.0.1:{free}");
    let o = home.out(&["run", &url, "true"]).await;
    assert_eq!(code(&o), 255);
    assert!(one_line(&o).starts_with(&format!("execrelay: cannot connect to {url}: ")));

    // A wrong scheme for what answered: ws:// at a relay, ws:// at a Noise server.
    let dir = tempfile::tempdir().unwrap();
    let (server, client, auth) = server_and_client(dir.path()).await;
    let envs = dir.path().join("environments");
    std::fs::write(&envs, format!("e1 {}\n", server.public_line())).unwrap();
    let relay = common::relay::InRelay::start(&envs).await;
    let relay_url = relay.url();
    let o = home.out(&["run", &relay_url, "true"]).await;
    assert_eq!(code(&o), 255);
    let port = relay_url.rsplit(':').next().unwrap();
    assert_eq!(
        one_line(&o),
        format!("execrelay: {relay_url}: this is a relay; use relay+ws://127.0.0.1:{port}/ENVIRONMENT_ID")
    );
    let noise = BinServer::with_keys(dir.path(), &server, &auth, &[], None).await;
    let ws_form = noise.url.replace("noise+ws://", "ws://");
    let o = home.out(&["run", &ws_form, "true"]).await;
    assert_eq!(code(&o), 255);
    assert!(
        one_line(&o).ends_with(&format!(
            "this is an exec server speaking Noise; use {}",
            noise.url
        )),
        "{}",
        text(&o.stderr)
    );

    // Refused, naming the key (and the token).
    let other = keygen(dir.path(), "other").await;
    let o = home
        .out(&[
            "run",
            &noise.url,
            "--server-key",
            server.pubs(),
            "--key",
            other.p(),
            "true",
        ])
        .await;
    assert_eq!(code(&o), 255);
    let words = one_line(&o);
    assert!(
        words.starts_with(&format!("execrelay: {} refused this client: ", noise.url)),
        "{words}"
    );
    assert!(
        words.contains(&format!("(key {} (SHA256:", other.p())),
        "{words}"
    );
    // And what to do about it.
    assert!(
        words.ends_with("to the server's authorized_keys"),
        "{words}"
    );
    // The good key works, for contrast.
    let o = home
        .out(&[
            "run",
            &noise.url,
            "--server-key",
            server.pubs(),
            "--key",
            client.p(),
            "echo ok",
        ])
        .await;
    assert_eq!(text(&o.stdout), "ok\n", "{}", text(&o.stderr));
}

#[tokio::test]
async fn a_lost_connection_is_resumed_and_said_so_on_a_terminal() {
    let (_server, _url, port) = ws_server(&[]).await;
    let proxy = CutProxy::start(port).await;
    let home = Home::new();
    let pty = open_pty(24, 80);
    let mut screen = Screen::new(&pty.master);
    let fd = || Stdio::from(pty.slave.try_clone().unwrap());
    let fifo = tempfile::tempdir().unwrap();
    let go = fifo.path().join("go");
    let mut child = home
        .cmd(&[
            "run",
            &proxy.url("ws"),
            &format!(
                "echo ready; while [ ! -e {} ]; do sleep 0.05; done; echo done",
                go.display()
            ),
        ])
        .stdout(Stdio::piped())
        .stderr(fd())
        .spawn()
        .unwrap();
    drop(pty.slave);
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(GUARD, out.next_line())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.as_deref(), Some("ready"));
    proxy.cut();
    screen
        .wait_for("execrelay: connection lost, resuming…")
        .await;
    proxy.restore();
    screen.wait_for("execrelay: resumed").await;
    std::fs::write(&go, "").unwrap();
    let next = tokio::time::timeout(GUARD, out.next_line())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        next.as_deref(),
        Some("done"),
        "nothing lost across the resume"
    );
    let status = tokio::time::timeout(GUARD, child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(0));
}

#[tokio::test]
async fn a_connection_that_cannot_be_resumed_or_a_session_gone_is_255_with_its_cause() {
    // Lost for longer than the session's TTL: given up, saying so.
    let (_server, _url, port) = ws_server(&["--detached-session-ttl-ms", "1500"]).await;
    let proxy = CutProxy::start(port).await;
    let home = Home::new();
    let mut child = home
        .cmd(&["run", &proxy.url("ws"), "echo ready; sleep 30"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(GUARD, out.next_line())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.as_deref(), Some("ready"));
    proxy.cut();
    let o = tokio::time::timeout(GUARD, child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(o.status.code(), Some(255));
    let words = one_line(&o);
    assert!(
        words.starts_with(&format!(
            "execrelay: the connection to {} was lost and could not be resumed: could not resume within 1500 ms",
            proxy.url("ws")
        )),
        "{words}"
    );

    // Back, but to a server that does not know the session: it expired there.
    let (_other, _, other_port) = ws_server(&[]).await;
    let proxy = CutProxy::start(port).await;
    let mut child = home
        .cmd(&["run", &proxy.url("ws"), "echo ready; sleep 30"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(GUARD, out.next_line())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.as_deref(), Some("ready"));
    proxy.redirect(other_port);
    proxy.cut();
    proxy.restore();
    let o = tokio::time::timeout(GUARD, child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(o.status.code(), Some(255));
    assert_eq!(
        one_line(&o),
        format!(
            "execrelay: the session expired on {} (it outlived its TTL detached, or was closed)",
            proxy.url("ws")
        )
    );
}

// ---------------------------------------------------------------------------------------------
// Host aliases.

#[tokio::test]
async fn a_host_alias_gives_every_field_and_a_flag_wins_over_it() {
    let dir = tempfile::tempdir().unwrap();
    let (server, client, auth) = server_and_client(dir.path()).await;
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret\n").unwrap();
    let noise = BinServer::with_keys(
        dir.path(),
        &server,
        &auth,
        &["--auth-token-file", token.to_str().unwrap()],
        None,
    )
    .await;
    let home = Home::new();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, "not a certificate\n").unwrap();
    // url, server_key (a file), key, token_file: enough to run; the key line works too.
    std::fs::write(
        home.config(),
        format!(
            "[hosts.box]\nurl = \"{}\"\nserver_key = \"{}\"\nkey = \"{}\"\ntoken_file = \"{}\"\n\n[hosts.line]\nurl = \"{}\"\nserver_key = \"{}\"\nkey = \"{}\"\n\n[hosts.badca]\nurl = \"relay+wss://127.0.0.1:1/x\"\nserver_key = \"{}\"\nkey = \"{}\"\nca_file = \"{}\"\n",
            noise.url, server.pubs(), client.p(), token.display(),
            noise.url, server.public_line(), client.p(),
            server.pubs(), client.p(), ca.display(),
        ),
    )
    .unwrap();
    let o = home.out(&["run", "box", "echo", "via", "alias"]).await;
    assert_eq!(text(&o.stdout), "via alias\n", "{}", text(&o.stderr));
    // Without the token (host `line` has none), the server refuses.
    let o = home.out(&["run", "line", "true"]).await;
    assert_eq!(code(&o), 255);
    assert!(
        one_line(&o).contains("refused this client"),
        "{}",
        text(&o.stderr)
    );
    // A flag wins over the file: the token given on the command line.
    let o = home
        .out(&[
            "run",
            "line",
            "--token-file",
            token.to_str().unwrap(),
            "echo",
            "flag",
        ])
        .await;
    assert_eq!(text(&o.stdout), "flag\n", "{}", text(&o.stderr));
    // --key over `key`: another key is refused, naming it.
    let other = keygen(dir.path(), "other").await;
    let o = home.out(&["run", "box", "--key", other.p(), "true"]).await;
    assert!(
        one_line(&o).contains(&format!("(key {} (SHA256:", other.p())),
        "{}",
        text(&o.stderr)
    );
    // ca_file is read: a bad one is named by file, line and key.
    let o = home.out(&["run", "badca", "true"]).await;
    assert_eq!(code(&o), 255);
    let words = one_line(&o);
    assert!(
        words.starts_with(&format!(
            "execrelay: {}:16: hosts.badca.ca_file: ",
            home.config().display()
        )),
        "{words}"
    );
    // The default key: no `key` and no --key uses ~/.config/execrelay/id.
    std::fs::copy(client.p(), home.config().with_file_name("id")).unwrap();
    std::fs::write(
        home.config(),
        format!(
            "[hosts.dflt]\nurl = \"{}\"\nserver_key = \"{}\"\ntoken_file = \"{}\"\n",
            noise.url,
            server.pubs(),
            token.display()
        ),
    )
    .unwrap();
    let o = home.out(&["run", "dflt", "echo", "default key"]).await;
    assert_eq!(text(&o.stdout), "default key\n", "{}", text(&o.stderr));
    // $EXECRELAY_CONFIG names another file.
    let elsewhere = dir.path().join("elsewhere.toml");
    std::fs::write(
        &elsewhere,
        format!("[hosts.there]\nurl = \"{}\"\n", "ws://127.0.0.1:1"),
    )
    .unwrap();
    let o = output_of(
        home.cmd(&["run", "there", "true"])
            .env("EXECRELAY_CONFIG", &elsewhere),
    )
    .await;
    assert!(
        one_line(&o).starts_with("execrelay: cannot connect to ws://127.0.0.1:1"),
        "{}",
        text(&o.stderr)
    );
}

/// `noise_window` in a host's entry and `--noise-window` over it: a window in range runs, one
/// out of range (or not a number) is named by flag, or by file, line and key, before anything
/// is dialled.
#[tokio::test]
async fn the_stream_window_comes_from_the_host_or_the_flag_and_is_checked() {
    let dir = tempfile::tempdir().unwrap();
    let (server, client, auth) = server_and_client(dir.path()).await;
    let noise = BinServer::with_keys(dir.path(), &server, &auth, &[], None).await;
    let home = Home::new();
    let host = |name: &str, window: &str| {
        format!(
            "[hosts.{name}]\nurl = \"{}\"\nserver_key = \"{}\"\nkey = \"{}\"\nnoise_window = {window}\n",
            noise.url,
            server.pubs(),
            client.p()
        )
    };
    std::fs::write(
        home.config(),
        [host("wide", "64"), host("huge", "300")].concat(),
    )
    .unwrap();
    let o = home
        .out(&["run", "wide", "head -c 3000000 /dev/zero | wc -c"])
        .await;
    assert_eq!(text(&o.stdout), "3000000\n", "{}", text(&o.stderr));
    // The flag wins over the file's bad value.
    let o = home
        .out(&["run", "huge", "--noise-window", "256", "echo", "flag"])
        .await;
    assert_eq!(text(&o.stdout), "flag\n", "{}", text(&o.stderr));
    let o = home.out(&["run", "huge", "true"]).await;
    assert_eq!(code(&o), 255);
    assert_eq!(
        one_line(&o),
        format!(
            "execrelay: {}:10: hosts.huge.noise_window: a stream window of 300 records is out of range: give 1 to 256 (records of at most 64 KiB; the default is 16)",
            home.config().display()
        )
    );
    let o = home
        .out(&["run", "wide", "--noise-window", "0", "true"])
        .await;
    assert_eq!(code(&o), 255);
    assert!(
        one_line(&o)
            .starts_with("execrelay: --noise-window: a stream window of 0 records is out of range"),
        "{}",
        text(&o.stderr)
    );
    std::fs::write(home.config(), host("word", "\"many\"")).unwrap();
    let o = home.out(&["run", "word", "true"]).await;
    assert_eq!(code(&o), 255);
    let words = one_line(&o);
    assert!(
        words.starts_with(&format!(
            "execrelay: {}:5: hosts.word.noise_window: invalid type",
            home.config().display()
        )),
        "{words}"
    );
}

#[tokio::test]
async fn a_broken_configuration_file_names_the_file_the_line_and_the_key() {
    let home = Home::new();
    let file = home.config();
    for (text_, line, key) in [
        (
            "[hosts.a]\nurl = \"ws://h:1\"\nurll = \"x\"\n",
            3,
            "hosts.a.urll",
        ),
        ("# c\n[hosts.a]\nurl = 7\n", 3, "hosts.a.url"),
        ("[hosts.a]\nurl = \"ftp://x\"\n", 2, "hosts.a.url"),
        (
            "[hosts.a]\nurl = \"noise+ws://h:1\"\nserver_key = \"/nonexistent.pub\"\n",
            3,
            "hosts.a.server_key",
        ),
    ] {
        std::fs::write(&file, text_).unwrap();
        let o = home.out(&["run", "a", "true"]).await;
        assert_eq!(code(&o), 255, "{text_}");
        let words = one_line(&o);
        assert!(
            words.starts_with(&format!("execrelay: {}:{line}: {key}: ", file.display())),
            "{text_}: {words}"
        );
    }
    // An unknown alias says where aliases go.
    std::fs::write(&file, "[hosts.a]\nurl = \"ws://h:1\"\n").unwrap();
    let o = home.out(&["run", "b", "true"]).await;
    let words = one_line(&o);
    assert!(
        words.contains("unknown host \"b\"") && words.contains(&file.display().to_string()),
        "{words}"
    );
}

// ---------------------------------------------------------------------------------------------
// stdin, -t, the environment, --keep-tail.

#[tokio::test]
async fn dash_n_leaves_a_shell_loops_stdin_alone() {
    let (_server, url, _) = ws_server(&[]).await;
    let home = Home::new();
    let script = "printf 'a\\nb\\nc\\n' | while read h; do \"$0\" run -n \"$1\" \"echo $h\"; done"
        .to_string();
    let o = output_of(
        Command::new("sh")
            .args(["-c", &script, bin(), &url])
            .env_remove("RUST_LOG")
            .env("HOME", home.path())
            .env("XDG_CONFIG_HOME", home.path().join("config")),
    )
    .await;
    assert_eq!(
        text(&o.stdout),
        "a\nb\nc\n",
        "every line reached the loop: {}",
        text(&o.stderr)
    );
    // Without -n, the first run eats the rest of the loop's input (as ssh does).
    let eaten = script.replace(" -n ", " ");
    let o = output_of(
        Command::new("sh")
            .args(["-c", &eaten, bin(), &url])
            .env_remove("RUST_LOG")
            .env("HOME", home.path())
            .env("XDG_CONFIG_HOME", home.path().join("config")),
    )
    .await;
    assert_eq!(text(&o.stdout), "a\n", "{}", text(&o.stderr));
}

#[tokio::test]
async fn dash_t_passes_term_and_the_env_flags_reach_the_command() {
    let (_server, url, _) = ws_server(&[]).await;
    let home = Home::new();
    let pty = open_pty(24, 80);
    let mut screen = Screen::new(&pty.master);
    let fd = || Stdio::from(pty.slave.try_clone().unwrap());
    let envs = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(envs.path(), "# file\nFROM_FILE=f\nBOTH=file\n").unwrap();
    let mut child = home
        .cmd(&[
            "run",
            "-t",
            "--env-file",
            envs.path().to_str().unwrap(),
            "-e",
            "BOTH=flag",
            "-e",
            "FROM_HERE",
            &url,
            "echo \"term=$TERM file=$FROM_FILE both=$BOTH here=$FROM_HERE tty=$(tty >/dev/null && echo yes)\"",
        ])
        .env("TERM", "xterm-i19")
        .env("FROM_HERE", "local")
        .stdin(fd())
        .stdout(fd())
        .stderr(fd())
        .spawn()
        .unwrap();
    drop(pty.slave);
    let shown = screen.read_to_end().await;
    let status = tokio::time::timeout(GUARD, child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(0), "{shown}");
    assert!(
        shown.contains("term=xterm-i19 file=f both=flag here=local tty=yes"),
        "{shown:?}"
    );
}

#[tokio::test]
async fn keep_tail_shows_the_first_and_last_half_and_says_what_was_omitted() {
    let (_server, url, _) = ws_server(&[]).await;
    let home = Home::new();
    let o = home
        .out(&[
            "run",
            "--output-cap",
            "10",
            "--keep-tail",
            &url,
            "printf 0123456789ABCDEFGHIJ",
        ])
        .await;
    assert_eq!(code(&o), 0, "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "01234FGHIJ");
    assert_eq!(
        one_line(&o),
        "execrelay: 10 bytes of stdout omitted here (--output-cap with --keep-tail); the last ones follow"
    );
    // Without --keep-tail: the head alone, and nothing said.
    let o = home
        .out(&[
            "run",
            "--output-cap",
            "10",
            &url,
            "printf 0123456789ABCDEFGHIJ",
        ])
        .await;
    assert_eq!(
        (text(&o.stdout), text(&o.stderr)),
        ("0123456789".into(), String::new())
    );
}

#[tokio::test]
async fn run_help_shows_examples_and_serve_help_groups_its_limits() {
    let home = Home::new();
    let o = home.out(&["run", "--help"]).await;
    let help = text(&o.stdout);
    assert!(
        help.contains("Examples:") && help.contains("execrelay run sandbox-1 'ls -l | wc -l'"),
        "{help}"
    );
    let o = home.out(&["serve", "--help"]).await;
    let help = text(&o.stdout);
    let limits = help.find("\nLimits:\n").expect("a Limits heading");
    assert!(
        help[limits..].contains("--max-session-ttl <DURATION>"),
        "{help}"
    );
    assert!(help[limits..].contains("--max-processes <N>"), "{help}");
    assert!(
        !help[..limits].contains("--max-processes"),
        "limits only under their heading"
    );
}

#[tokio::test]
async fn no_command_is_a_login_shell_on_a_terminal_when_stdin_is_one() {
    let (_server, url, _) = ws_server(&[]).await;
    let home = Home::new();
    let pty = open_pty(24, 80);
    let mut screen = Screen::new(&pty.master);
    let fd = || Stdio::from(pty.slave.try_clone().unwrap());
    let mut child = home
        .cmd(&["run", &url])
        .env("TERM", "xterm-i19")
        .stdin(fd())
        .stdout(fd())
        .stderr(fd())
        .spawn()
        .unwrap();
    drop(pty.slave);
    common::pty::type_keys(
        &pty.master,
        b"echo \"term=$TERM tty=$(tty >/dev/null && echo yes)\"; exit 3\n",
    );
    let shown = screen.read_to_end().await;
    let status = tokio::time::timeout(GUARD, child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(3), "{shown}");
    assert!(shown.contains("term=xterm-i19 tty=yes"), "{shown:?}");
    // Not a terminal here: the shell reads its commands from stdin, without one (as ssh).
    let mut child = home
        .cmd(&["run", &url])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    tokio::io::AsyncWriteExt::write_all(
        &mut stdin,
        b"echo \"tty=$(tty >/dev/null && echo yes || echo no)\"; exit 4\n",
    )
    .await
    .unwrap();
    drop(stdin);
    let o = tokio::time::timeout(GUARD, child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(o.status.code(), Some(4), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "tty=no\n");
}

/// `run`'s stdin over a network target: binary writes by default (`protocol.md` §5.2),
/// JSON with `--json-input`; the command gets the same bytes, its end of input included.
#[tokio::test]
async fn run_stdin_goes_byte_exact_as_binary_writes_and_as_json() {
    let (_server, url, _) = ws_server(&[]).await;
    let home = Home::new();
    let data = common::noise::pattern(3 << 20, 11);
    for extra in [&[][..], &["--json-input"][..]] {
        let mut args = vec!["run"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&[&url, "--", "sha256sum"]);
        let mut child = home
            .cmd(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let input = data.clone();
        let writer = tokio::spawn(async move {
            tokio::io::AsyncWriteExt::write_all(&mut stdin, &input)
                .await
                .unwrap();
        });
        let o = tokio::time::timeout(GUARD, child.wait_with_output())
            .await
            .expect("run ended (hang guard)")
            .unwrap();
        writer.await.unwrap();
        assert_eq!(o.status.code(), Some(0), "{extra:?}: {}", text(&o.stderr));
        assert_eq!(
            text(&o.stdout),
            format!("{}  -\n", sha256(&data)),
            "{extra:?}"
        );
    }
}
