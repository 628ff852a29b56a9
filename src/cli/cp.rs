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
//! carries them; uploads go out as `process/write` requests through [`upload`], the one
//! place binary writes (`protocol.md` §5.2) will slot in. A progress bar is drawn on a
//! terminal for a transfer that takes longer than a second.

use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use clap::Args;
use tokio::sync::mpsc;

use super::connect::{resolve, ConnFlags, Remote};
use super::failure::Failure;
use super::outcome::start_failure;
use super::run::failure_of;
use crate::client::{Client, ClientOptions, ProcessEvent, StartOptions, StdinWriter};
use crate::rpc::messages::StreamName;

/// Exit status of a copy that failed on a path (as scp): connection failures are 255.
pub const COPY_FAILED: i32 = 1;
/// Chunks of the tar stream in flight between the thread that reads or writes the archive
/// and the connection: 16, at most 4 MiB of pieces (uploads) or of output chunks (downloads).
const PIPE_CHUNKS: usize = 16;
/// The size of an upload's pieces: one `process/write` each (`STDIN_WRITE_BYTES`), so the
/// per-request costs vanish beside the bytes.
const PIPE_CHUNK_BYTES: usize = crate::client::STDIN_WRITE_BYTES;
/// The remote `tar`'s stderr kept for the error message, at most.
const MAX_REMOTE_ERROR_BYTES: usize = 16 * 1024;
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

fn copy_failed(words: impl Into<String>) -> Failure {
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
        (Some(d), _, false) => upload(srcs, &d, &args).await,
        (None, true, _) => {
            let rs: Vec<RemotePath> = remote_srcs.into_iter().flatten().collect();
            if rs.iter().any(|r| r.target != rs[0].target) {
                return Err(Failure::usage("cp: every source must be on the same server"));
            }
            download(&rs, Path::new(dst), &args).await
        }
        (Some(_), _, true) => Err(Failure::usage(
            "cp copies between this machine and a server: only one side may be TARGET:PATH",
        )),
        (None, false, _) => Err(Failure::usage(
            "cp needs one side as TARGET:PATH (a host alias or a URL, then :PATH); a local path with a ':' is written ./NAME",
        )),
    }
}

/// A connected client for `target`.
async fn connect(target: &str, conn: &ConnFlags) -> Result<(Remote, Client), Failure> {
    let remote = resolve(target, conn)?;
    let client = Client::connect(remote.target.clone(), ClientOptions::default())
        .await
        .map_err(|e| failure_of(&remote, &e))?;
    Ok((remote, client))
}

/// What a remote command wrote and how it ended.
struct Ran {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    code: i32,
}

/// Run `argv` on `client` to its end, collecting stdout (up to `max` bytes) and stderr.
async fn run_small(
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
                ran.code = super::outcome::plain_status(&info);
                return Ok(ran);
            }
            _ => {}
        }
    }
    Err(lost(client, remote))
}

fn keep(buf: &mut Vec<u8>, data: &[u8], max: usize) {
    let room = max.saturating_sub(buf.len());
    buf.extend_from_slice(&data[..data.len().min(room)]);
}

fn lost(client: &Client, remote: &Remote) -> Failure {
    match client.loss() {
        Some(e) => failure_of(remote, &e),
        None => Failure::cause(format!("the connection to {} was lost", remote.url)),
    }
}

/// The remote tar's complaint, one line: `tar: x: Cannot open: Permission denied` →
/// `x: Cannot open: Permission denied`.
fn remote_words(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.contains("Exiting with failure status"))
        .unwrap_or("failed");
    line.strip_prefix("tar: ").unwrap_or(line).to_string()
}

// ---------------------------------------------------------------------------------------------
// Upload.

/// Local sources → `dst` on the server.
async fn upload(srcs: &[String], dst: &RemotePath, args: &CpArgs) -> Result<(), Failure> {
    let mut total = 0u64;
    let mut items = Vec::new();
    for s in srcs {
        let path = PathBuf::from(s);
        let meta =
            std::fs::symlink_metadata(&path).map_err(|e| copy_failed(format!("{s}: {e}")))?;
        if meta.is_dir() && !args.recursive {
            return Err(copy_failed(format!(
                "{s}: is a directory (cp -r copies it)"
            )));
        }
        total += tree_size(&path);
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .filter(|n| n != "..")
            .unwrap_or_else(|| ".".into());
        items.push((path, name));
    }
    let (remote, client) = connect(&dst.target, &args.conn).await?;
    let shown = format!("{}:{}", dst.target, dst.path);
    // Where it goes: into DST when it is a directory there, else as DST.
    let probe = run_small(
        &client,
        &remote,
        "cp-probe",
        &["/bin/sh", "-c", "if [ -d \"$1\" ]; then echo dir; elif [ -e \"$1\" ]; then echo file; else echo none; fi", "sh", &dst.path],
        64,
    )
    .await?;
    let kind = String::from_utf8_lossy(&probe.stdout).trim().to_string();
    let into_dir = kind == "dir";
    if !into_dir && (items.len() > 1 || dst.path.ends_with('/')) {
        client.shutdown().await;
        return Err(copy_failed(format!("{shown}: not a directory")));
    }
    let dir = if into_dir {
        dst.path.clone()
    } else {
        let p = Path::new(&dst.path);
        let parent = p
            .parent()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        if name.is_empty() {
            client.shutdown().await;
            return Err(copy_failed(format!("{shown}: not a file name")));
        }
        items[0].1 = name;
        if parent.is_empty() {
            ".".into()
        } else {
            parent
        }
    };
    let mut p = client
        .start({
            let mut s = StartOptions::new(
                "cp-upload",
                ["tar", "-x", "-p", "-f", "-", "-C", dir.as_str()],
            );
            s.params.pipe_stdin = true;
            s
        })
        .await
        .map_err(|e| start_failure(&remote.url, &e, remote.key.as_deref(), remote.token))?;
    let progress = Progress::start(Some(total), "upload");
    // The archive is written on a thread of its own (the `tar` crate is blocking) into a
    // bounded channel the connection drains.
    let (tx, rx) = mpsc::channel::<Bytes>(PIPE_CHUNKS);
    let writer = tokio::task::spawn_blocking(move || -> Result<(), String> {
        let mut b = tar::Builder::new(ChannelWriter::new(tx));
        b.mode(tar::HeaderMode::Complete);
        b.follow_symlinks(false);
        for (path, name) in &items {
            append(&mut b, path, Path::new(name))?;
        }
        b.into_inner()
            .and_then(|mut w| w.flush())
            .map_err(|e| format!("writing the archive: {e}"))
    });
    let sent = upload_stream(p.stdin_writer(), rx, progress.counter());
    let mut stderr = Vec::new();
    let mut code = -1;
    let (sent, _) = tokio::join!(sent, async {
        while let Some(ev) = p.next_event().await {
            match ev {
                ProcessEvent::Output { data, .. } => {
                    keep(&mut stderr, &data, MAX_REMOTE_ERROR_BYTES)
                }
                ProcessEvent::Exited(info) => {
                    code = super::outcome::plain_status(&info);
                    break;
                }
                _ => {}
            }
        }
    });
    progress.finish();
    let local = writer.await.map_err(|e| copy_failed(e.to_string()))?;
    if code == -1 {
        return Err(lost(&client, &remote));
    }
    client.shutdown().await;
    if let Err(why) = local {
        return Err(copy_failed(why));
    }
    if code != 0 {
        return Err(copy_failed(format!("{shown}: {}", remote_words(&stderr))));
    }
    sent.map_err(|e| copy_failed(format!("{shown}: {e}")))?;
    Ok(())
}

/// Send what arrives on `rx` to the process's stdin, then close it: the upload path. Today
/// each chunk is a JSON `process/write` (base64); binary writes (`protocol.md` §5.2) take
/// this one place when negotiated.
pub async fn upload_stream(
    mut writer: StdinWriter,
    mut rx: mpsc::Receiver<Bytes>,
    counter: Arc<AtomicU64>,
) -> Result<(), String> {
    while let Some(chunk) = rx.recv().await {
        let n = chunk.len() as u64;
        writer.write(chunk).await.map_err(|e| e.to_string())?;
        counter.fetch_add(n, Ordering::Relaxed);
    }
    writer.finish().await.map_err(|e| e.to_string())
}

/// Bytes of the regular files under `path` (for the progress bar).
fn tree_size(path: &Path) -> u64 {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::read_dir(path)
            .map(|rd| rd.flatten().map(|e| tree_size(&e.path())).sum())
            .unwrap_or(0),
        Ok(m) if m.is_file() => m.len(),
        _ => 0,
    }
}

/// Append `path` (a file, a directory and everything under it, a symbolic link) to the
/// archive as `name`; an error names the local path.
fn append<W: Write>(b: &mut tar::Builder<W>, path: &Path, name: &Path) -> Result<(), String> {
    let named = |e: std::io::Error| format!("{}: {e}", path.display());
    let meta = std::fs::symlink_metadata(path).map_err(named)?;
    if meta.is_dir() {
        b.append_dir(name, path).map_err(named)?;
        let mut entries: Vec<_> = std::fs::read_dir(path)
            .map_err(named)?
            .collect::<Result<_, _>>()
            .map_err(named)?;
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            append(b, &e.path(), &name.join(e.file_name()))?;
        }
        Ok(())
    } else if meta.is_file() {
        let mut f = std::fs::File::open(path).map_err(named)?;
        b.append_file(name, &mut f).map_err(named)
    } else {
        // A symbolic link (kept as one), a fifo…: the header says what it is.
        b.append_path_with_name(path, name).map_err(named)
    }
}

/// A blocking writer into a bounded channel of chunks (the archive's thread → the
/// connection).
struct ChannelWriter {
    tx: mpsc::Sender<Bytes>,
    buf: Vec<u8>,
}

impl ChannelWriter {
    fn new(tx: mpsc::Sender<Bytes>) -> Self {
        ChannelWriter {
            tx,
            buf: Vec::with_capacity(PIPE_CHUNK_BYTES),
        }
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let n = data.len().min(PIPE_CHUNK_BYTES - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == PIPE_CHUNK_BYTES {
            self.flush()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(
            &mut self.buf,
            Vec::with_capacity(PIPE_CHUNK_BYTES),
        ));
        self.tx
            .blocking_send(chunk)
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the upload stopped"))
    }
}

// ---------------------------------------------------------------------------------------------
// Download.

/// `srcs` on the server → `dst` here.
async fn download(srcs: &[RemotePath], dst: &Path, args: &CpArgs) -> Result<(), Failure> {
    let into_dir = dst.is_dir();
    if srcs.len() > 1 && !into_dir {
        return Err(copy_failed(format!("{}: not a directory", dst.display())));
    }
    let (remote, client) = connect(&srcs[0].target, &args.conn).await?;
    for (i, src) in srcs.iter().enumerate() {
        let r = download_one(&client, &remote, src, dst, into_dir, args.recursive, i).await;
        if let Err(f) = r {
            client.shutdown().await;
            return Err(f);
        }
    }
    client.shutdown().await;
    Ok(())
}

/// The remote side of a download: check the path, then `tar -c` it from its directory.
const DOWNLOAD_SCRIPT: &str = r#"p=$1
[ -e "$p" ] || [ -L "$p" ] || { echo "No such file or directory" >&2; exit 2; }
if [ -d "$p" ] && [ "$2" != r ]; then echo "is a directory (cp -r copies it)" >&2; exit 3; fi
cd "$(dirname -- "$p")" || exit 2
exec tar -c -f - -- "$(basename -- "$p")""#;

async fn download_one(
    client: &Client,
    remote: &Remote,
    src: &RemotePath,
    dst: &Path,
    into_dir: bool,
    recursive: bool,
    n: usize,
) -> Result<(), Failure> {
    let shown = format!("{}:{}", src.target, src.path);
    let name = Path::new(&src.path)
        .file_name()
        .map(|n| n.to_os_string())
        .ok_or_else(|| copy_failed(format!("{shown}: not a file name")))?;
    let root = if into_dir {
        dst.join(&name)
    } else {
        dst.to_path_buf()
    };
    let r = if recursive { "r" } else { "-" };
    let mut p = client
        .start(StartOptions::new(
            &format!("cp-download-{n}"),
            ["/bin/sh", "-c", DOWNLOAD_SCRIPT, "sh", src.path.as_str(), r],
        ))
        .await
        .map_err(|e| start_failure(&remote.url, &e, remote.key.as_deref(), remote.token))?;
    let progress = Progress::start(None, "download");
    let counter = progress.counter();
    let (tx, rx) = mpsc::channel::<Bytes>(PIPE_CHUNKS);
    let top = name.clone();
    let reader = tokio::task::spawn_blocking(move || unpack(ChannelReader::new(rx), &top, &root));
    let mut stderr = Vec::new();
    let mut code = -1;
    let mut tx = Some(tx);
    while let Some(ev) = p.next_event().await {
        match ev {
            ProcessEvent::Output {
                stream: StreamName::Stderr,
                data,
            } => keep(&mut stderr, &data, MAX_REMOTE_ERROR_BYTES),
            ProcessEvent::Output { data, .. } => {
                counter.fetch_add(data.len() as u64, Ordering::Relaxed);
                let Some(t) = tx.as_ref() else { continue };
                // The unpacking thread stopped (an error it reports): stop sending.
                if t.send(data).await.is_err() {
                    tx = None;
                    let _ = p.terminate(None).await;
                }
            }
            ProcessEvent::Exited(info) => {
                code = super::outcome::plain_status(&info);
                break;
            }
            _ => {}
        }
    }
    drop(tx);
    progress.finish();
    let unpacked = reader.await.map_err(|e| copy_failed(e.to_string()))?;
    if code == -1 {
        return Err(lost(client, remote));
    }
    if code != 0 {
        return Err(copy_failed(format!("{shown}: {}", remote_words(&stderr))));
    }
    unpacked.map_err(copy_failed)
}

/// Unpack the archive from `r`: its top entry `top` becomes `root`, everything under it goes
/// under `root`; modes and times kept; an entry that would land outside `root` is refused.
fn unpack(r: impl Read, top: &std::ffi::OsStr, root: &Path) -> Result<(), String> {
    let mut a = tar::Archive::new(r);
    a.set_preserve_permissions(true);
    a.set_preserve_mtime(true);
    a.set_overwrite(true);
    let entries = a
        .entries()
        .map_err(|e| format!("reading the archive: {e}"))?;
    // Directory modes are set last: a read-only directory must still receive its files.
    let mut dirs: Vec<(PathBuf, u32)> = Vec::new();
    for entry in entries {
        let mut entry = entry.map_err(|e| format!("reading the archive: {e}"))?;
        let path = entry
            .path()
            .map_err(|e| format!("reading the archive: {e}"))?
            .into_owned();
        let mut parts = path.components();
        if parts.next() != Some(Component::Normal(top)) {
            return Err(format!(
                "unexpected entry {} in the archive",
                path.display()
            ));
        }
        let mut out = root.to_path_buf();
        for c in parts {
            match c {
                Component::Normal(n) => out.push(n),
                Component::CurDir => {}
                _ => return Err(format!("unsafe entry {} in the archive", path.display())),
            }
        }
        let named = |e: std::io::Error| format!("{}: {e}", out.display());
        if entry.header().entry_type().is_dir() {
            std::fs::create_dir_all(&out).map_err(named)?;
            if let Ok(mode) = entry.header().mode() {
                dirs.push((out.clone(), mode));
            }
            continue;
        }
        entry.unpack(&out).map_err(named)?;
    }
    use std::os::unix::fs::PermissionsExt;
    for (dir, mode) in dirs.into_iter().rev() {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode & 0o7777))
            .map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    Ok(())
}

/// A blocking reader of a channel of chunks (the connection → the unpacking thread).
struct ChannelReader {
    rx: mpsc::Receiver<Bytes>,
    cur: Bytes,
}

impl ChannelReader {
    fn new(rx: mpsc::Receiver<Bytes>) -> Self {
        ChannelReader {
            rx,
            cur: Bytes::new(),
        }
    }
}

impl Read for ChannelReader {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.cur.is_empty() {
            match self.rx.blocking_recv() {
                Some(c) => self.cur = c,
                None => return Ok(0),
            }
        }
        let n = out.len().min(self.cur.len());
        out[..n].copy_from_slice(&self.cur.split_to(n));
        Ok(n)
    }
}

// ---------------------------------------------------------------------------------------------
// Progress.

/// A progress bar on a terminal's stderr, drawn only once the transfer has taken
/// [`PROGRESS_AFTER`]; nothing elsewhere.
struct Progress {
    counter: Arc<AtomicU64>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Progress {
    fn start(total: Option<u64>, what: &'static str) -> Progress {
        let counter = Arc::new(AtomicU64::new(0));
        if !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
            return Progress {
                counter,
                stop: None,
                task: None,
            };
        }
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let c = counter.clone();
        let task = tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(PROGRESS_AFTER) => {}
                _ = &mut stopped => return,
            }
            let bar = match total {
                Some(t) => indicatif::ProgressBar::new(t).with_style(
                    indicatif::ProgressStyle::with_template(
                        "{msg} {bar:30} {bytes}/{total_bytes} {binary_bytes_per_sec} {eta}",
                    )
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
                ),
                None => indicatif::ProgressBar::new_spinner().with_style(
                    indicatif::ProgressStyle::with_template(
                        "{msg} {spinner} {bytes} {binary_bytes_per_sec}",
                    )
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
                ),
            };
            bar.set_message(what);
            loop {
                bar.set_position(c.load(Ordering::Relaxed));
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                    _ = &mut stopped => break,
                }
            }
            bar.set_position(c.load(Ordering::Relaxed));
            bar.finish_and_clear();
        });
        Progress {
            counter,
            stop: Some(stop),
            task: Some(task),
        }
    }

    fn counter(&self) -> Arc<AtomicU64> {
        self.counter.clone()
    }

    fn finish(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        drop(self.task.take());
    }
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
