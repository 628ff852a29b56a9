//! The download half of `cp`: a `tar -c` on the server → files here.

use std::io::Read;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::Ordering;

use bytes::Bytes;
use tokio::sync::mpsc;

use super::progress::Progress;
use super::{
    connect, copy_failed, keep, lost, remote_words, CpArgs, RemotePath, MAX_REMOTE_ERROR_BYTES,
    PIPE_CHUNKS,
};
use crate::cli::connect::Remote;
use crate::cli::failure::Failure;
use crate::cli::outcome::start_failure;
use crate::client::{Client, ProcessEvent, StartOptions};
use crate::rpc::messages::StreamName;

/// `srcs` on the server → `dst` here.
pub(super) async fn download(
    srcs: &[RemotePath],
    dst: &Path,
    args: &CpArgs,
) -> Result<(), Failure> {
    let into_dir = dst.is_dir();
    if srcs.len() > 1 && !into_dir {
        return Err(copy_failed(format!("{}: not a directory", dst.display())));
    }
    let (remote, client) = connect(&srcs[0].target, args).await?;
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
                code = crate::cli::outcome::plain_status(&info);
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
