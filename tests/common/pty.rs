//! A pseudo-terminal opened by the test, what it shows, and `execrelay run` on it (`-t`
//! tests of the built binary).

use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::process::{Child, Command};

use super::{bin, text, GUARD};

/// A pseudo-terminal opened by the test: every descriptor close-on-exec, so only the child
/// it is handed to holds the slave (the test binary runs tests on several threads).
pub struct Pty {
    pub master: OwnedFd,
    pub slave: OwnedFd,
    pub slave_path: String,
}

/// Set the terminal size of `fd` (`TIOCSWINSZ`).
pub fn set_size(fd: &OwnedFd, rows: u16, cols: u16) {
    let ws = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads a winsize struct that lives across the call.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSWINSZ, &ws) };
    assert_eq!(r, 0, "TIOCSWINSZ: {}", std::io::Error::last_os_error());
}

/// Open the slave at `path` (close-on-exec, not as the controlling terminal).
pub fn open_slave(path: &str) -> OwnedFd {
    // std opens with O_CLOEXEC.
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY)
        .open(path)
        .expect("open pty slave")
        .into()
}

/// A new pseudo-terminal of `rows` x `cols`.
pub fn open_pty(rows: u16, cols: u16) -> Pty {
    use nix::fcntl::OFlag;
    let m = nix::pty::posix_openpt(OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC)
        .expect("posix_openpt");
    nix::pty::grantpt(&m).expect("grantpt");
    nix::pty::unlockpt(&m).expect("unlockpt");
    let slave_path = nix::pty::ptsname_r(&m).expect("ptsname_r");
    let master = m.as_fd().try_clone_to_owned().expect("dup master");
    let slave = open_slave(&slave_path);
    set_size(&master, rows, cols);
    Pty {
        master,
        slave,
        slave_path,
    }
}

/// What the terminal shows: the master read on a blocking thread until EOF/EIO (every slave
/// descriptor closed).
pub struct Screen {
    rx: tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>,
    /// Everything shown so far.
    pub seen: Vec<u8>,
}

impl Screen {
    /// Start reading `master`.
    pub fn new(master: &OwnedFd) -> Screen {
        let mut f = std::fs::File::from(master.try_clone().expect("dup master"));
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            loop {
                match f.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        if tx.send(buf[..n].to_vec()).is_err() {
                            break;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(_) => break, // EIO: the last slave descriptor was closed
                }
            }
        });
        Screen {
            rx,
            seen: Vec::new(),
        }
    }

    /// Whether `needle` has shown.
    pub fn shows(&self, needle: &str) -> bool {
        text(&self.seen).contains(needle)
    }

    /// Wait up to `limit` for `needle`; false if it did not show.
    pub async fn wait_for_within(&mut self, needle: &str, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        while !self.shows(needle) {
            match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(Some(chunk)) => self.seen.extend_from_slice(&chunk),
                Ok(None) => panic!(
                    "terminal closed before {needle:?} showed; screen: {:?}",
                    text(&self.seen)
                ),
                Err(_) => return false,
            }
        }
        true
    }

    /// Wait (within [`GUARD`]) for `needle`.
    pub async fn wait_for(&mut self, needle: &str) {
        assert!(
            self.wait_for_within(needle, GUARD).await,
            "{needle:?} never showed (hang guard); screen: {:?}",
            text(&self.seen)
        );
    }

    /// Everything until every slave descriptor is closed.
    pub async fn read_to_end(&mut self) -> String {
        loop {
            match tokio::time::timeout(GUARD, self.rx.recv()).await {
                Ok(Some(chunk)) => self.seen.extend_from_slice(&chunk),
                Ok(None) => return text(&self.seen),
                Err(_) => panic!(
                    "terminal never closed (hang guard); screen: {:?}",
                    text(&self.seen)
                ),
            }
        }
    }
}

/// `execrelay run ARGS…` with the slave as stdin, stdout and stderr. Consumes the slave: the
/// test keeps no descriptor of it, so the master sees EIO once `run` (and its local server)
/// exit.
pub fn spawn_on_pty(slave: OwnedFd, args: &[&str]) -> Child {
    let fd = || Stdio::from(slave.try_clone().expect("dup slave"));
    let mut cmd = Command::new(bin());
    cmd.arg("run")
        .args(args)
        .env_remove("RUST_LOG")
        .stdin(fd())
        .stdout(fd())
        .stderr(fd())
        .kill_on_drop(true);
    cmd.spawn().expect("spawn execrelay run")
    // `cmd` and `slave` drop here, closing the test's copies.
}

/// [`spawn_on_pty`], with the terminal as `run`'s **controlling** terminal (a new session,
/// `TIOCSCTTY` on the slave), so `/dev/tty` opens to it: the terminal `run` asks approval
/// questions on.
pub fn spawn_on_pty_controlling(slave: OwnedFd, args: &[&str]) -> Child {
    let fd = || Stdio::from(slave.try_clone().expect("dup slave"));
    let mut cmd = Command::new(bin());
    cmd.arg("run")
        .args(args)
        .env_remove("RUST_LOG")
        .stdin(fd())
        .stdout(fd())
        .stderr(fd())
        .kill_on_drop(true);
    // SAFETY: setsid and ioctl are async-signal-safe; nothing is allocated.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn().expect("spawn execrelay run")
}

/// Write `bytes` to the terminal's master: what a person types.
pub fn type_keys(master: &OwnedFd, bytes: &[u8]) {
    use std::io::Write;
    let mut f = std::fs::File::from(master.try_clone().expect("dup master"));
    f.write_all(bytes).expect("type on the terminal");
}

/// The exit status of `child`, within [`GUARD`].
pub async fn wait_status(child: &mut Child) -> ExitStatus {
    tokio::time::timeout(GUARD, child.wait())
        .await
        .expect("execrelay run did not exit (hang guard)")
        .expect("wait")
}

/// `execrelay run ARGS…` on a new terminal of `rows` x `cols`: everything it showed until
/// every slave descriptor closed, and its exit status.
pub async fn run_on_pty(rows: u16, cols: u16, args: &[&str]) -> (ExitStatus, String) {
    let pty = open_pty(rows, cols);
    let mut screen = Screen::new(&pty.master);
    let mut child = spawn_on_pty(pty.slave, args);
    let shown = screen.read_to_end().await;
    let status = wait_status(&mut child).await;
    (status, shown)
}
