//! A child's output pipe, put on the reactor only once a read finds it empty.
//!
//! A short child often ends before its pump first looks at its pipes (under load the
//! cloning thread gets its CPU back late): registering a descriptor that is already readable
//! (at end of file) with `epoll_ctl` wakes the runtime's worker parked in `epoll_wait` for
//! nothing, a context switch per pipe. Read first, then, and register only a pipe that has
//! nothing to give now; a pipe that reaches its end before that is never registered at all.
//!
//! Off the reactor, a read costs the task nothing of tokio's cooperative budget, so a child
//! that keeps its pipe full could keep its pump from ever yielding: after
//! [`MAX_UNREGISTERED_READS`] reads that returned bytes the pipe goes on the reactor whatever
//! it holds, and from then on every readiness check counts against the budget as before.
//!
//! It owns the read end and its reactor registration; it must never block (the descriptor
//! is non-blocking from the start) and never lose a byte between the two states (reads before
//! and after the registration go to the same descriptor).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::task::{Context, Poll};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::net::unix::pipe;

/// Reads that returned bytes before a pipe goes on the reactor anyway: enough for a short
/// child's whole output, few enough that a pump never runs long without yielding.
pub const MAX_UNREGISTERED_READS: u8 = 4;

/// The read end of a child's stdout or stderr pipe.
pub struct OutputPipe {
    state: State,
    /// Reads that returned bytes while off the reactor.
    raw_reads: u8,
}

enum State {
    /// Not on the reactor yet (non-blocking).
    Raw(OwnedFd),
    /// On the reactor. `None` only if registering failed (the error was returned).
    Registered(Option<pipe::Receiver>),
}

impl OutputPipe {
    /// Take `fd` (a pipe's read end) and make it non-blocking; nothing is registered yet.
    pub(super) fn new(fd: OwnedFd) -> io::Result<OutputPipe> {
        super::set_nonblocking(fd.as_raw_fd())?;
        Ok(OutputPipe {
            state: State::Raw(fd),
            raw_reads: 0,
        })
    }

    /// Whether it was put on the reactor (tests).
    pub fn is_registered(&self) -> bool {
        matches!(self.state, State::Registered(_))
    }

    /// Put it on the reactor (once).
    fn register(&mut self) -> io::Result<&mut pipe::Receiver> {
        if let State::Raw(_) = self.state {
            let State::Raw(fd) = std::mem::replace(&mut self.state, State::Registered(None)) else {
                unreachable!("matched above")
            };
            self.state = State::Registered(Some(pipe::Receiver::from_owned_fd(fd)?));
        }
        match &mut self.state {
            State::Registered(Some(r)) => Ok(r),
            _ => Err(io::Error::other("the output pipe could not be registered")),
        }
    }

    /// Wait until the pipe is readable or at its end (cancel-safe: nothing is read). Before
    /// its registration, a look (`poll` with no wait) answers when it can.
    pub async fn readable(&mut self) -> io::Result<()> {
        if let State::Raw(fd) = &self.state {
            if self.raw_reads < MAX_UNREGISTERED_READS && ready_now(fd.as_fd())? {
                return Ok(());
            }
        }
        self.register()?.readable().await
    }

    /// Read into `buf`'s spare room now: the bytes read (0: end of file), or `WouldBlock`.
    pub fn try_read_buf(&mut self, buf: &mut bytes::BytesMut) -> io::Result<usize> {
        match &mut self.state {
            State::Raw(fd) => {
                // Read straight into the buffer's room (zeroed first: no unsafe here).
                let start = buf.len();
                let room = (buf.capacity() - start).max(1);
                buf.resize(start + room, 0);
                match nix::unistd::read(fd.as_raw_fd(), &mut buf[start..]) {
                    Ok(n) => {
                        buf.truncate(start + n);
                        if n > 0 {
                            self.raw_reads = self.raw_reads.saturating_add(1);
                        }
                        Ok(n)
                    }
                    Err(e) => {
                        buf.truncate(start);
                        Err(e.into())
                    }
                }
            }
            State::Registered(Some(r)) => r.try_read_buf(buf),
            State::Registered(None) => Err(io::Error::other("the output pipe is not usable")),
        }
    }
}

impl AsRawFd for OutputPipe {
    fn as_raw_fd(&self) -> RawFd {
        match &self.state {
            State::Raw(fd) => fd.as_raw_fd(),
            State::Registered(Some(r)) => r.as_raw_fd(),
            State::Registered(None) => -1,
        }
    }
}

impl AsyncRead for OutputPipe {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let (State::Raw(fd), true) = (&this.state, this.raw_reads < MAX_UNREGISTERED_READS) {
            let unfilled = buf.initialize_unfilled();
            match nix::unistd::read(fd.as_raw_fd(), unfilled) {
                Ok(n) => {
                    buf.advance(n);
                    if n > 0 {
                        this.raw_reads += 1;
                    }
                    return Poll::Ready(Ok(()));
                }
                Err(nix::errno::Errno::EAGAIN) => {}
                Err(e) => return Poll::Ready(Err(e.into())),
            }
        }
        match this.register() {
            Ok(r) => Pin::new(r).poll_read(cx, buf),
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

/// Whether `fd` has something to read or is at its end, without waiting.
fn ready_now(fd: BorrowedFd<'_>) -> io::Result<bool> {
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    match poll(&mut fds, PollTimeout::ZERO) {
        Ok(0) | Err(nix::errno::Errno::EINTR) => Ok(false),
        Ok(_) => Ok(fds[0].revents().is_some_and(|r| {
            r.intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR)
        })),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use futures_util::FutureExt;
    use std::time::Duration;
    use tokio::io::AsyncReadExt;

    const GUARD: Duration = Duration::from_secs(10);

    fn pair() -> (OutputPipe, std::fs::File) {
        let (r, w) = nix::unistd::pipe().expect("pipe");
        (
            OutputPipe::new(r).expect("output pipe"),
            std::fs::File::from(w),
        )
    }

    #[tokio::test]
    async fn a_pipe_at_its_end_is_read_to_the_end_without_the_reactor() {
        use std::io::Write;
        let (mut p, mut w) = pair();
        w.write_all(b"last words").unwrap();
        drop(w);
        tokio::time::timeout(GUARD, p.readable())
            .await
            .expect("readable at once (hang guard)")
            .unwrap();
        let mut buf = BytesMut::with_capacity(64);
        assert_eq!(p.try_read_buf(&mut buf).unwrap(), 10);
        assert_eq!(&buf[..], b"last words");
        assert_eq!(p.try_read_buf(&mut buf).unwrap(), 0, "end of file");
        assert!(!p.is_registered());
    }

    #[tokio::test]
    async fn an_empty_pipe_is_registered_and_sees_what_comes_later() {
        use std::io::Write;
        let (mut p, mut w) = pair();
        let mut buf = BytesMut::with_capacity(64);
        let e = p.try_read_buf(&mut buf).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        assert!(buf.is_empty(), "nothing read, nothing added");
        // One look finds nothing: it goes on the reactor and waits there.
        assert!(p.readable().now_or_never().is_none());
        assert!(p.is_registered());
        w.write_all(b"x").unwrap();
        tokio::time::timeout(GUARD, p.readable())
            .await
            .expect("woken by the reactor (hang guard)")
            .unwrap();
        assert_eq!(p.try_read_buf(&mut buf).unwrap(), 1);
        assert_eq!(&buf[..], b"x");
        drop(w);
        tokio::time::timeout(GUARD, p.readable())
            .await
            .expect("end of file seen (hang guard)")
            .unwrap();
        assert_eq!(p.try_read_buf(&mut buf).unwrap(), 0);
    }

    #[tokio::test]
    async fn a_pipe_that_never_runs_dry_goes_on_the_reactor_after_a_few_reads() {
        use std::io::Write;
        let (mut p, mut w) = pair();
        let mut buf = BytesMut::with_capacity(64);
        for n in 0..MAX_UNREGISTERED_READS {
            w.write_all(b"x").unwrap();
            p.readable().now_or_never().expect("ready at once").unwrap();
            assert!(!p.is_registered(), "read {n} is made off the reactor");
            assert_eq!(p.try_read_buf(&mut buf).unwrap(), 1);
        }
        // Bytes wait in the pipe, yet the next look registers it: from now on the reactor
        // (and the task's budget) has a say.
        w.write_all(b"y").unwrap();
        tokio::time::timeout(GUARD, p.readable())
            .await
            .expect("readable (hang guard)")
            .unwrap();
        assert!(p.is_registered());
        assert_eq!(p.try_read_buf(&mut buf).unwrap(), 1);
        let mut want = vec![b'x'; usize::from(MAX_UNREGISTERED_READS)];
        want.push(b'y');
        assert_eq!(&buf[..], &want[..]);
    }

    #[tokio::test]
    async fn read_to_end_gets_every_byte_before_and_after_the_registration() {
        use std::io::Write;
        let (mut p, mut w) = pair();
        w.write_all(b"before ").unwrap();
        let writer = std::thread::spawn(move || {
            // Written while the reader waits on the reactor (or before: either way every
            // byte must arrive, once).
            w.write_all(b"after").unwrap();
        });
        let mut all = Vec::new();
        tokio::time::timeout(GUARD, p.read_to_end(&mut all))
            .await
            .expect("end of file (hang guard)")
            .unwrap();
        writer.join().unwrap();
        assert_eq!(all, b"before after");
    }
}
