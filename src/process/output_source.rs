//! A child's output descriptor as its pump reads it: a pipe through its own readiness, read
//! once per chunk straight into the chunk's buffer, or the PTY master through `AsyncRead`.
//! It reads and sizes chunks; it never decides when to read (the pump does, once its log
//! admits a chunk) and never touches the event log.

use bytes::{Bytes, BytesMut};
use futures_util::FutureExt;
use tokio::io::AsyncReadExt;

use super::spawn::{OutputPipe, OutputReader};
use crate::config::PUMP_CHUNK_BYTES;

/// The first read of a PTY's chunk: the most its pump holds that is not in its log, while
/// the terminal is idle or while it waits for room. (A pipe's pump holds nothing: it waits
/// for readiness, then for room, and only then reads, into a buffer that becomes the chunk.)
/// Only when this read comes back full, and a whole chunk would be admitted, does the pump
/// read on.
pub const FIRST_READ_BYTES: usize = 4096;

/// A chunk in a buffer of `PUMP_CHUNK_BYTES`: kept as it is when it filled half of it or
/// more, else moved to an allocation of its size, so a log of small chunks does not hold
/// 64 KiB buffers.
pub(super) fn sized(chunk: BytesMut) -> Bytes {
    if chunk.len() < PUMP_CHUNK_BYTES / 2 {
        Bytes::copy_from_slice(&chunk)
    } else {
        chunk.freeze()
    }
}

/// A child's output as its pump reads it.
pub(super) enum Source {
    /// A pipe (on the reactor once a read found it empty): the pump waits until it is
    /// readable (holding no buffer), then for room, then reads once, straight into the
    /// chunk's own buffer: one read, so one wake-up of a child blocked on a full pipe, per
    /// chunk.
    Pipe(OutputPipe),
    /// Anything else (the PTY master): read through `AsyncRead`, [`FIRST_READ_BYTES`] first.
    Reader(OutputReader),
}

/// What [`Source::ready`] found.
pub(super) enum Ready {
    /// The pipe is readable (or at its end).
    Readable,
    /// The first read of a chunk returned this many bytes (0: end of file).
    Read(usize),
}

/// What [`Source::read_chunk`] read.
pub(super) enum Chunk {
    /// Bytes of output.
    Data(Bytes),
    /// End of file.
    Eof,
    /// Nothing after all (a spurious readiness): wait again.
    Nothing,
}

impl Source {
    /// Pipes are read through their own readiness (`OutputPipe`);
    /// anything else (a terminal) through `AsyncRead`.
    pub(super) fn new(reader: OutputReader) -> Source {
        match reader {
            OutputReader::Stdout(pipe) | OutputReader::Stderr(pipe) => Source::Pipe(pipe),
            other => Source::Reader(other),
        }
    }

    /// Wait until there is something to read (cancel-safe: nothing is consumed unless it
    /// resolves). The PTY's first read goes into `first`.
    pub(super) async fn ready(&mut self, first: &mut [u8]) -> std::io::Result<Ready> {
        match self {
            Source::Pipe(pipe) => pipe.readable().await.map(|()| Ready::Readable),
            Source::Reader(reader) => reader.read(first).await.map(Ready::Read),
        }
    }

    /// Read a chunk now, straight from the descriptor, without waiting and without asking
    /// the reactor: past the drain deadline, a pump that was never polled before has no
    /// readiness recorded yet, though the child's last output is in the pipe. Up to
    /// `PUMP_CHUNK_BYTES`; `Nothing` when nothing is there now.
    pub(super) fn read_now(&mut self) -> std::io::Result<Chunk> {
        use std::os::fd::AsRawFd;
        let fd = match self {
            Source::Pipe(pipe) => pipe.as_raw_fd(),
            Source::Reader(OutputReader::Pty(fd)) => fd.get_ref().as_raw_fd(),
            // Not built by `Source::new` (pipes are `Source::Pipe`).
            Source::Reader(_) => return Ok(Chunk::Nothing),
        };
        let mut chunk = BytesMut::zeroed(PUMP_CHUNK_BYTES);
        // Both descriptors are non-blocking (`OutputPipe::new`, `spawn_pty`).
        match nix::unistd::read(fd, &mut chunk) {
            Ok(0) => Ok(Chunk::Eof),
            Ok(n) => {
                chunk.truncate(n);
                Ok(Chunk::Data(sized(chunk)))
            }
            Err(nix::errno::Errno::EAGAIN) => Ok(Chunk::Nothing),
            // Every PTY slave closed.
            Err(nix::errno::Errno::EIO) => Ok(Chunk::Eof),
            Err(e) => Err(e.into()),
        }
    }

    /// Read a chunk now, without waiting: from the pipe, up to `PUMP_CHUNK_BYTES`; from the
    /// PTY, what follows `first` (a full first read) up to the same.
    pub(super) fn read_chunk(&mut self, first: &[u8]) -> std::io::Result<Chunk> {
        let mut chunk = BytesMut::with_capacity(PUMP_CHUNK_BYTES);
        match self {
            Source::Pipe(pipe) => match pipe.try_read_buf(&mut chunk) {
                Ok(0) => Ok(Chunk::Eof),
                Ok(_) => Ok(Chunk::Data(sized(chunk))),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(Chunk::Nothing),
                Err(e) => Err(e),
            },
            Source::Reader(reader) => {
                chunk.extend_from_slice(first);
                // Whatever is readable now; not readable, end of file or an error: the chunk
                // is what we have, and the next read in the pump's loop sees the rest.
                let _ = reader.read_buf(&mut chunk).now_or_never();
                Ok(Chunk::Data(sized(chunk)))
            }
        }
    }
}
