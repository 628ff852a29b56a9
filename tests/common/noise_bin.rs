//! The built binary over Noise: key files made by `execrelay keygen`, a `serve --listen
//! noise+ws://…` server with its log, and `execrelay run` against it.

use std::path::{Path, PathBuf};
use std::process::Output;

use tokio::io::{BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

use super::binary::{first_line, output_of, serve_cmd};
use super::{bin, text, PROMPT};

/// A key pair written by `execrelay keygen`.
pub struct Keys {
    pub private: PathBuf,
    pub public: PathBuf,
}

impl Keys {
    /// The private key file's content (base64).
    pub fn private_b64(&self) -> String {
        std::fs::read_to_string(&self.private)
            .unwrap()
            .trim()
            .to_string()
    }
    /// The public key line (`execrelay-x25519 … comment`).
    pub fn public_line(&self) -> String {
        std::fs::read_to_string(&self.public)
            .unwrap()
            .trim()
            .to_string()
    }
    /// The private key's path.
    pub fn p(&self) -> &str {
        self.private.to_str().unwrap()
    }
    /// The public key's path.
    pub fn pubs(&self) -> &str {
        self.public.to_str().unwrap()
    }
}

/// `execrelay keygen -o DIR/NAME -c NAME`.
pub async fn keygen(dir: &Path, name: &str) -> Keys {
    let private = dir.join(name);
    let out = output_of(
        Command::new(bin())
            .args(["keygen", "-o"])
            .arg(&private)
            .args(["-c", name]),
    )
    .await;
    assert!(out.status.success(), "keygen: {}", text(&out.stderr));
    Keys {
        public: dir.join(format!("{name}.pub")),
        private,
    }
}

/// [`server_and_client`], plus keys for a relay (`DIR/relay`) and its environments file
/// (`DIR/environments`) listing the server's key for `env_id`: what a test of the real
/// binaries through a relay needs. Returns (relay, server, client, environments, auth).
pub async fn relay_server_and_client(
    dir: &Path,
    env_id: &str,
) -> (Keys, Keys, Keys, PathBuf, PathBuf) {
    let relay = keygen(dir, "relay").await;
    let (server, client, auth) = server_and_client(dir).await;
    let envs = dir.join("environments");
    std::fs::write(&envs, format!("{env_id} {}\n", server.public_line())).unwrap();
    (relay, server, client, envs, auth)
}

/// Keys for `server` and `client` in `dir`, and an authorized-keys file `DIR/auth` holding
/// the client's public key line.
pub async fn server_and_client(dir: &Path) -> (Keys, Keys, PathBuf) {
    let server = keygen(dir, "server").await;
    let client = keygen(dir, "client").await;
    let auth = dir.join("auth");
    std::fs::write(&auth, format!("{}\n", client.public_line())).unwrap();
    (server, client, auth)
}

/// `execrelay run URL --server-key … --key … [extra] -- argv…`, `RUST_LOG` unset unless given.
pub async fn run_bin(
    url: &str,
    server_pub: &str,
    key: &str,
    extra: &[&str],
    argv: &[&str],
    rust_log: Option<&str>,
) -> Output {
    let mut c = Command::new(bin());
    c.args(["run", url, "--server-key", server_pub, "--key", key])
        .args(extra)
        .arg("--")
        .args(argv)
        .env_remove("RUST_LOG");
    if let Some(l) = rust_log {
        c.env("RUST_LOG", l);
    }
    output_of(&mut c).await
}

/// A `serve --listen noise+ws://127.0.0.1:0` child and its bound URL.
pub struct BinServer {
    child: Child,
    pub url: String,
    log: PathBuf,
    _stdout: Lines<BufReader<ChildStdout>>,
}

impl BinServer {
    /// `execrelay serve --listen noise+ws://127.0.0.1:0 ARGS…`, stderr to `log`.
    pub async fn start(args: &[&str], log: &Path, rust_log: Option<&str>) -> BinServer {
        let mut c = serve_cmd(
            "noise+ws://127.0.0.1:0",
            std::fs::File::create(log).unwrap(),
        );
        c.args(args).env_remove("RUST_LOG");
        if let Some(l) = rust_log {
            c.env("RUST_LOG", l);
        }
        let mut child = c.spawn().expect("spawn execrelay serve");
        let (url, lines) = first_line(&mut child, PROMPT).await;
        let url = url.unwrap_or_else(|| {
            panic!(
                "serve exited without a URL: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            )
        });
        assert!(url.starts_with("noise+ws://127.0.0.1:"), "{url}");
        assert!(!url.ends_with(":0"), "the real port is printed: {url}");
        BinServer {
            child,
            url,
            log: log.to_path_buf(),
            _stdout: lines,
        }
    }

    /// [`BinServer::start`] with `--key` `server` and `--authorized-keys` `auth` (then
    /// `extra`), logging to `DIR/server.log`.
    pub async fn with_keys(
        dir: &Path,
        server: &Keys,
        auth: &Path,
        extra: &[&str],
        rust_log: Option<&str>,
    ) -> BinServer {
        let mut args = vec![
            "--key",
            server.p(),
            "--authorized-keys",
            auth.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        BinServer::start(&args, &dir.join("server.log"), rust_log).await
    }

    /// The server's pid.
    pub fn pid(&self) -> u32 {
        self.child.id().expect("server still running")
    }

    /// SIGTERM, wait for the exit, return the log.
    pub async fn stop(mut self) -> String {
        let pid = self.child.id().expect("server still running") as i32;
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        tokio::time::timeout(PROMPT, self.child.wait())
            .await
            .expect("serve did not exit on SIGTERM (hang guard)")
            .unwrap();
        std::fs::read_to_string(&self.log).unwrap()
    }
}

/// Write `contents` to `path` by replacing the file (a new inode, as editors do).
pub fn replace_file(path: &Path, contents: &str) {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, contents).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Assert that `out` (of `run`) failed with 255 before running anything, saying `why` on
/// stderr.
pub fn assert_refused(out: &Output, why: &str) {
    assert_eq!(out.status.code(), Some(255), "{}", text(&out.stderr));
    assert!(out.stdout.is_empty(), "nothing ran");
    assert!(text(&out.stderr).contains(why), "{}", text(&out.stderr));
}
