//! `execrelay cp SRC… DST`: files and trees between this machine and a server, the way
//! `kubectl cp` does it: a tar stream over an exec of the server's `tar` (`tar -x -p -f - -C
//! DIR` to upload, `tar -c -f - NAME` to download), this side reading and writing tar itself
//! (the `tar` crate), so modes, symbolic links and times are kept both ways.
//!
//! One side is `TARGET:PATH` (a host alias, or a URL followed by `:PATH`:
//! `ws://HOST:PORT:/tmp/x`, `relay+ws://RELAY:PORT/ID:/tmp/x`). As with scp: an existing
//! directory as `DST` receives the sources under their own names, anything else is the new
//! name of the one source; a directory needs `-r`. Missing paths and permission errors are
//! named, on either side. Downloads arrive as binary output messages where the transport
//! carries them; uploads go out as `process/write` requests through `upload`, the one
//! place binary writes (`protocol.md` §5.2) will slot in. A progress bar is drawn on a
//! terminal for a transfer that takes longer than a second.

use std::path::Path;
use std::time::Duration;

use clap::Args;

use super::connect::failure_of;
use super::connect::{resolve, ConnFlags, Remote};
use super::failure::Failure;
use super::outcome::start_failure;
use crate::client::{Client, ClientOptions, ProcessEvent, StartOptions};
use crate::rpc::messages::StreamName;

mod download;
mod progress;
mod upload;

pub use upload::upload_stream;

/// Exit status of a copy that failed on a path (as scp): connection failures are 255.
pub const COPY_FAILED: i32 = 1;
/// Chunks of the tar stream in flight between the thread that reads or writes the archive
/// and the connection: 16, at most 4 MiB of pieces (uploads) or of output chunks (downloads).
pub(super) const PIPE_CHUNKS: usize = 16;
/// The size of an upload's pieces: four binary writes' worth (`STDIN_BINARY_WRITE_BYTES`,
/// 254 KiB), so that the writer splits each into four full writes and no short one (one
/// record each; a stream's window counts records), and one JSON write where binary writes
/// are not negotiated (at most `STDIN_WRITE_BYTES`), so the per-request costs vanish beside
/// the bytes.
pub(super) const PIPE_CHUNK_BYTES: usize = 4 * crate::client::STDIN_BINARY_WRITE_BYTES;
const _: () = assert!(PIPE_CHUNK_BYTES <= crate::client::STDIN_WRITE_BYTES);
/// The remote `tar`'s stderr kept for the error message, at most.
pub(super) const MAX_REMOTE_ERROR_BYTES: usize = 16 * 1024;
/// A transfer shorter than this draws no progress bar.
pub const PROGRESS_AFTER: Duration = Duration::from_secs(1);

/// Flags of `execrelay cp`.
#[derive(Debug, Args)]
#[command(after_help = "Examples:
  execrelay cp build.tar.gz sandbox-1:/tmp/          into a directory, under its own name
  execrelay cp -r src sandbox-1:/work/src            a tree, as /work/src
  execrelay cp sandbox-1:/var/log/app.log .          from the server
  execrelay cp a b sandbox-1:/tmp                    several files into a directory
  execrelay cp ./report ws://127.0.0.1:7000:/tmp/report   a URL, then :PATH

The server needs tar (GNU, BusyBox or BSD). Exit status: 0 copied; 1 a path was missing or
could not be read or written (named on stderr); 255 the connection failed.")]
pub struct CpArgs {
    /// Copy directories and their contents.
    #[arg(short = 'r', long = "recursive")]
    pub recursive: bool,
    /// Sources, then the destination; exactly one side is TARGET:PATH.
    #[arg(value_name = "SRC... DST", num_args = 2.., required = true)]
    pub paths: Vec<String>,
    /// How to reach the server (flags win over the host's entry).
    #[command(flatten)]
    pub conn: ConnFlags,
    /// How long an upload the server refuses for a full limit (`-32004`) is sent again before
    /// the copy is stopped (`0`: at the first refusal). Only servers that keep a process's
    /// writes in order after a refusal are sent input again. A start refused for a full
    /// request budget is tried again as long [default: 60s].
    #[arg(long, value_name = "DURATION", value_parser = crate::cli::duration::parse_duration)]
    pub input_retry: Option<std::time::Duration>,
}

/// A path on the server: the target (alias or URL) and the path there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemotePath {
    /// As typed.
    pub target: String,
    /// On the server.
    pub path: String,
}

/// `TARGET:PATH`, or `None` for a local path (one with a `/` before any `:`, or none).
pub fn remote_path(arg: &str) -> Option<RemotePath> {
    if let Some(i) = arg.find("://") {
        let scheme = &arg[..i];
        let rest = &arg[i + 3..];
        let mut j = if rest.starts_with('[') {
            rest.find(']')? + 1
        } else {
            rest.find([':', '/']).unwrap_or(rest.len())
        };
        if rest[j..].starts_with(':') {
            let digits = rest[j + 1..]
                .chars()
                .take_while(char::is_ascii_digit)
                .count();
            if digits > 0 {
                j += 1 + digits;
            }
        }
        if scheme.starts_with("relay+") && rest[j..].starts_with('/') {
            j += 1 + rest[j + 1..].find(':').unwrap_or(rest.len() - j - 1);
        }
        let path = rest[j..].strip_prefix(':')?;
        return Some(RemotePath {
            target: arg[..i + 3 + j].to_string(),
            path: path.to_string(),
        });
    }
    let (name, path) = arg.split_once(':')?;
    if name.is_empty() || name.contains('/') {
        return None;
    }
    Some(RemotePath {
        target: name.to_string(),
        path: path.to_string(),
    })
}

/// Run `cp`; the exit status.
pub fn main(args: CpArgs) -> i32 {
    crate::cli::init_logging("warn", false);
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => return Failure::cause(format!("cannot start: {e}")).report(),
    };
    let code = rt.block_on(async {
        match cp(args).await {
            Ok(()) => 0,
            Err(f) => f.report(),
        }
    });
    rt.shutdown_timeout(Duration::from_millis(100));
    code
}

pub(super) fn copy_failed(words: impl Into<String>) -> Failure {
    let words: String = words.into();
    // `No such file or directory (os error 2)`: the number says nothing more to a person.
    let words = match words.rfind(" (os error ") {
        Some(i) if words.ends_with(')') => words[..i].to_string(),
        _ => words,
    };
    Failure {
        status: COPY_FAILED,
        words,
    }
}

async fn cp(args: CpArgs) -> Result<(), Failure> {
    let (dst, srcs) = args
        .paths
        .split_last()
        .ok_or_else(|| Failure::usage("cp needs SRC... DST"))?;
    let remote_dst = remote_path(dst);
    let remote_srcs: Vec<Option<RemotePath>> = srcs.iter().map(|s| remote_path(s)).collect();
    match (remote_dst, remote_srcs.iter().all(Option::is_some), remote_srcs.iter().any(Option::is_some)) {
        (Some(d), _, false) => upload::upload(srcs, &d, &args).await,
        (None, true, _) => {
            let rs: Vec<RemotePath> = remote_srcs.into_iter().flatten().collect();
            if rs.iter().any(|r| r.target != rs[0].target) {
                return Err(Failure::usage("cp: every source must be on the same server"));
            }
            download::download(&rs, Path::new(dst), &args).await
        }
        (Some(_), _, true) => Err(Failure::usage(
            "cp copies between this machine and a server: only one side may be TARGET:PATH",
        )),
        (None, false, _) => Err(Failure::usage(
            "cp needs one side as TARGET:PATH (a host alias or a URL, then :PATH); a local path with a ':' is written ./NAME",
        )),
    }
}

/// A connected client for `target`, as `args` ask.
pub(super) async fn connect(target: &str, args: &CpArgs) -> Result<(Remote, Client), Failure> {
    let remote = resolve(target, &args.conn)?;
    let defaults = ClientOptions::default();
    let opts = ClientOptions {
        write_retry_for: args.input_retry.unwrap_or(defaults.write_retry_for),
        ..defaults
    };
    let client = Client::connect(remote.target.clone(), opts)
        .await
        .map_err(|e| failure_of(&remote, &e))?;
    Ok((remote, client))
}

/// What a remote command wrote and how it ended.
pub(super) struct Ran {
    pub(super) stdout: Vec<u8>,
    pub(super) stderr: Vec<u8>,
    pub(super) code: i32,
}

/// Run `argv` on `client` to its end, collecting stdout (up to `max` bytes) and stderr.
pub(super) async fn run_small(
    client: &Client,
    remote: &Remote,
    id: &str,
    argv: &[&str],
    max: usize,
) -> Result<Ran, Failure> {
    let mut p = client
        .start(StartOptions::new(id, argv.iter().copied()))
        .await
        .map_err(|e| start_failure(&remote.url, &e, remote.key.as_deref(), remote.token))?;
    let mut ran = Ran {
        stdout: Vec::new(),
        stderr: Vec::new(),
        code: -1,
    };
    while let Some(ev) = p.next_event().await {
        match ev {
            ProcessEvent::Output {
                stream: StreamName::Stderr,
                data,
            } => keep(&mut ran.stderr, &data, MAX_REMOTE_ERROR_BYTES),
            ProcessEvent::Output { data, .. } => keep(&mut ran.stdout, &data, max),
            ProcessEvent::Exited(info) => {
                ran.code = crate::cli::outcome::plain_status(&info);
                return Ok(ran);
            }
            _ => {}
        }
    }
    Err(lost(client, remote))
}

pub(super) fn keep(buf: &mut Vec<u8>, data: &[u8], max: usize) {
    let room = max.saturating_sub(buf.len());
    buf.extend_from_slice(&data[..data.len().min(room)]);
}

pub(super) fn lost(client: &Client, remote: &Remote) -> Failure {
    match client.loss() {
        Some(e) => failure_of(remote, &e),
        None => Failure::cause(format!("the connection to {} was lost", remote.url)),
    }
}

/// The remote tar's complaint, one line: `tar: x: Cannot open: Permission denied` →
/// `x: Cannot open: Permission denied`.
pub(super) fn remote_words(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.contains("Exiting with failure status"))
        .unwrap_or("failed");
    line.strip_prefix("tar: ").unwrap_or(line).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_paths_of_aliases_and_urls() {
        let r = |t: &str, p: &str| {
            Some(RemotePath {
                target: t.into(),
                path: p.into(),
            })
        };
        assert_eq!(remote_path("sandbox-1:/tmp/x"), r("sandbox-1", "/tmp/x"));
        assert_eq!(remote_path("h:rel/x"), r("h", "rel/x"));
        assert_eq!(
            remote_path("ws://127.0.0.1:7000:/tmp/x"),
            r("ws://127.0.0.1:7000", "/tmp/x")
        );
        assert_eq!(
            remote_path("relay+ws://r:1/env-1:/a b"),
            r("relay+ws://r:1/env-1", "/a b")
        );
        assert_eq!(
            remote_path("noise+ws://[::1]:7:/x"),
            r("noise+ws://[::1]:7", "/x")
        );
        assert_eq!(remote_path("./a:b"), None);
        assert_eq!(remote_path("/abs/a:b"), None);
        assert_eq!(remote_path("plain"), None);
        assert_eq!(remote_path("ws://h:1"), None, "a URL without :PATH");
    }

    #[test]
    fn the_remote_complaint_is_one_line_without_tar() {
        assert_eq!(
            remote_words(b"tar: x: Cannot open: Permission denied\ntar: Exiting with failure status due to previous errors\n"),
            "x: Cannot open: Permission denied"
        );
        assert_eq!(remote_words(b""), "failed");
    }
}
