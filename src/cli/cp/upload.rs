//! The upload half of `cp`: local sources → a `tar -x` on the server.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::mpsc;

use super::progress::Progress;
use super::{
    connect, copy_failed, keep, lost, remote_words, run_small, CpArgs, RemotePath,
    MAX_REMOTE_ERROR_BYTES, PIPE_CHUNKS, PIPE_CHUNK_BYTES,
};
use crate::cli::failure::Failure;
use crate::cli::outcome::start_failure;
use crate::cli::run::{input_lost, refusal_hint};
use crate::client::{ProcessEvent, StartOptions, StdinRefused, StdinWriter};

/// Local sources → `dst` on the server.
pub(super) async fn upload(
    srcs: &[String],
    dst: &RemotePath,
    args: &CpArgs,
) -> Result<(), Failure> {
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
    let (remote, client) = connect(&dst.target, args).await?;
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
    // A write the server refuses leaves the archive incomplete (and writes behind it may have
    // been applied): stop the remote tar, which would otherwise wait on its stdin for good.
    let (stdin, ctl) = (p.stdin_writer(), p.controller());
    let counter = progress.counter();
    let sent = async move {
        let r = upload_stream(stdin, rx, counter).await;
        if let Err(StdinRefused::Error(e)) = &r {
            if input_lost(e) {
                let _ = ctl.terminate().await;
            }
        }
        r
    };
    let mut stderr = Vec::new();
    let mut code = -1;
    let (sent, _) = tokio::join!(sent, async {
        while let Some(ev) = p.next_event().await {
            match ev {
                ProcessEvent::Output { data, .. } => {
                    keep(&mut stderr, &data, MAX_REMOTE_ERROR_BYTES)
                }
                ProcessEvent::Exited(info) => {
                    code = crate::cli::outcome::plain_status(&info);
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
    // First: the archive's thread then fails too (its channel closed), which says less.
    if let Err(StdinRefused::Error(e)) = &sent {
        if input_lost(e) {
            return Err(Failure::cause(format!(
                "{shown}: the upload could not be delivered ({e}); the remote tar was stopped, \
                 and what it wrote may be incomplete{}",
                refusal_hint(e)
            )));
        }
    }
    if let Err(why) = local {
        return Err(copy_failed(why));
    }
    if code != 0 {
        return Err(copy_failed(format!("{shown}: {}", remote_words(&stderr))));
    }
    sent.map_err(|e| copy_failed(format!("{shown}: {e}")))?;
    Ok(())
}

/// Send what arrives on `rx` to the process's stdin, then close it: the upload path (binary
/// writes where negotiated, `protocol.md` §5.2, else JSON `process/write` with base64).
pub async fn upload_stream(
    mut writer: StdinWriter,
    mut rx: mpsc::Receiver<Bytes>,
    counter: Arc<AtomicU64>,
) -> Result<(), StdinRefused> {
    while let Some(chunk) = rx.recv().await {
        let n = chunk.len() as u64;
        writer.write(chunk).await?;
        counter.fetch_add(n, Ordering::Relaxed);
    }
    writer.finish().await
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
