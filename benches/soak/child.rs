//! The processes the soak runs (`soak child …`, this very binary): each writes the output
//! stream of its seed ([`crate::rng::stream_bytes`]), so the client checks every byte without
//! a copy, hashes what it reads on stdin, and says so at the end in a trailer the client
//! checks too. `soak sleep SECS` is the grandchild some of them leave behind.
//!
//! - `--seed S --bytes N --exit E`: N bytes of the stream of S on stdout, then exit E.
//! - `--stdin-bytes M`: read stdin (M bytes, or to its end on a pipe) on a thread, hashing it;
//!   at the end write `stdin LEN SHA256HEX\n` (on stderr; on the terminal with `--pty`).
//! - `--pty`: stdout is a terminal: put it in raw mode (no echo, no newline translation) and
//!   write `R` first, so the client knows input will not be echoed from then on.
//! - `--pace BYTES_PER_S`: write at that rate (the children that must still be running when
//!   their `timeoutMs` passes).
//! - `--on-term count`: on SIGTERM, stop writing, write `term K\n` on stderr (K: bytes
//!   written) and exit 143; without it SIGTERM kills as usual.
//! - `--grandchild group|setsid`: first start `soak sleep 3600` in its process group, or in a
//!   session of its own, with no inherited descriptors: only containment can stop it.
//!
//! Plain blocking std code: it must start fast and never hold a byte back.

use std::io::Read;
use std::os::fd::FromRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::rng::stream_bytes;

static TERMINATED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigterm(_: libc::c_int) {
    TERMINATED.store(true, Ordering::SeqCst);
}

/// The trailer a child writes after its output: what it read on stdin.
pub fn stdin_trailer(len: u64, hash: &[u8]) -> String {
    let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    format!("stdin {len} {hex}\n")
}

/// Write all of `buf` to `fd`, unless SIGTERM arrives (with `--on-term count`); the bytes
/// written.
fn write_some(fd: i32, buf: &[u8], stop_on_term: bool) -> Result<usize, std::io::Error> {
    let mut done = 0;
    while done < buf.len() {
        if stop_on_term && TERMINATED.load(Ordering::SeqCst) {
            break;
        }
        // SAFETY: `buf[done..]` is valid for reads of its length; `fd` is one of ours.
        let n = unsafe { libc::write(fd, buf[done..].as_ptr().cast(), buf.len() - done) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        done += n as usize;
    }
    Ok(done)
}

fn raw_terminal() {
    use nix::sys::termios::{cfmakeraw, tcgetattr, tcsetattr, SetArg};
    let fd = std::io::stdout();
    if let Ok(mut t) = tcgetattr(&fd) {
        cfmakeraw(&mut t);
        let _ = tcsetattr(&fd, SetArg::TCSANOW, &t);
    }
}

fn grandchild(how: &str) {
    use std::os::unix::process::CommandExt;
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    let mut cmd = std::process::Command::new(exe);
    cmd.args(["sleep", "3600"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    if how == "setsid" {
        // SAFETY: setsid is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
    }
    // Not waited for: it is meant to outlive this process.
    let _ = cmd.spawn();
}

/// `soak child`'s flags (see the module docs).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ChildArgs {
    /// The output stream's seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Bytes of output.
    #[arg(long, default_value_t = 0)]
    pub bytes: u64,
    /// Exit status at the end.
    #[arg(long, default_value_t = 0)]
    pub exit: i32,
    /// Stdout is a terminal.
    #[arg(long)]
    pub pty: bool,
    /// Bytes per second (0: as fast as the pipe takes them).
    #[arg(long, default_value_t = 0)]
    pub pace: u64,
    /// `count`: count SIGTERM instead of dying of it.
    #[arg(long)]
    pub on_term: Option<String>,
    /// Read and hash stdin (this many bytes on a terminal; to its end on a pipe).
    #[arg(long)]
    pub stdin_bytes: Option<u64>,
    /// `group` or `setsid`: leave a grandchild behind.
    #[arg(long)]
    pub grandchild: Option<String>,
}

impl ChildArgs {
    /// The argv that runs this child (after the program).
    pub fn argv(&self) -> Vec<String> {
        let mut v = vec![
            "child".to_string(),
            format!("--seed={}", self.seed),
            format!("--bytes={}", self.bytes),
            format!("--exit={}", self.exit),
        ];
        if self.pty {
            v.push("--pty".into());
        }
        if self.pace > 0 {
            v.push(format!("--pace={}", self.pace));
        }
        if let Some(t) = &self.on_term {
            v.push(format!("--on-term={t}"));
        }
        if let Some(m) = self.stdin_bytes {
            v.push(format!("--stdin-bytes={m}"));
        }
        if let Some(g) = &self.grandchild {
            v.push(format!("--grandchild={g}"));
        }
        v
    }
}

/// `soak child …`: see the module docs. Never returns.
pub fn main(args: &ChildArgs) -> ! {
    let (seed, bytes, exit, pty, pace) = (args.seed, args.bytes, args.exit, args.pty, args.pace);
    let count_term = args.on_term.as_deref() == Some("count");
    let stdin_bytes = args.stdin_bytes;
    if let Some(how) = &args.grandchild {
        grandchild(how);
    }
    if count_term {
        // SAFETY: the handler only stores to an atomic; no SA_RESTART, so a write blocked
        // in the pipe returns and the loop sees the flag.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_sigterm as *const () as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(libc::SIGTERM, &sa, std::ptr::null_mut());
        }
    }
    if pty {
        raw_terminal();
        let _ = write_some(1, b"R", false);
    }
    let reader = stdin_bytes.map(|want| {
        std::thread::spawn(move || {
            // SAFETY: fd 0 is ours; ManuallyDrop keeps it open for the rest of the process.
            let mut stdin = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(0) });
            let mut h = Sha256::new();
            let mut len = 0u64;
            let mut buf = vec![0u8; 64 * 1024];
            // A pipe ends; a terminal in raw mode has no end of input: read exactly `want`.
            while !(pty && len >= want) {
                let room = if pty {
                    buf.len().min((want - len) as usize)
                } else {
                    buf.len()
                };
                match stdin.read(&mut buf[..room]) {
                    Ok(0) => break,
                    Ok(n) => {
                        h.update(&buf[..n]);
                        len += n as u64;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
            (len, h.finalize().to_vec())
        })
    });
    let chunk = if pace > 0 { 16 * 1024 } else { 64 * 1024 };
    let mut buf = vec![0u8; chunk];
    let mut written = 0u64;
    while written < bytes {
        if count_term && TERMINATED.load(Ordering::SeqCst) {
            break;
        }
        let n = chunk.min((bytes - written) as usize);
        stream_bytes(seed, written, &mut buf[..n]);
        match write_some(1, &buf[..n], count_term) {
            Ok(k) => written += k as u64,
            Err(_) => std::process::exit(120),
        }
        if pace > 0 {
            let mut left = Duration::from_secs_f64(n as f64 / pace as f64);
            // Only a child that must notice SIGTERM between writes wakes up in 10 ms steps;
            // the others sleep the whole pause in one go (the load benchmark keeps 1,000 of
            // them: 100 wake-ups a second each would load the host more than the server).
            let most = if count_term {
                Duration::from_millis(10)
            } else {
                Duration::MAX
            };
            while !(left.is_zero() || count_term && TERMINATED.load(Ordering::SeqCst)) {
                let step = left.min(most);
                std::thread::sleep(step);
                left -= step;
            }
        }
    }
    let terminated = || {
        if count_term && TERMINATED.load(Ordering::SeqCst) {
            let _ = write_some(2, format!("term {written}\n").as_bytes(), false);
            std::process::exit(143);
        }
    };
    terminated();
    if let Some(r) = reader {
        // Waiting for the end of stdin must not hide a SIGTERM.
        while !r.is_finished() {
            terminated();
            std::thread::sleep(Duration::from_millis(5));
        }
        let (len, hash) = r.join().unwrap_or((u64::MAX, Vec::new()));
        let fd = if pty { 1 } else { 2 };
        let _ = write_some(fd, stdin_trailer(len, &hash).as_bytes(), false);
    }
    std::process::exit(exit)
}

/// `soak sleep SECS`: the grandchild. Never returns.
pub fn sleep(secs: u64) -> ! {
    std::thread::sleep(Duration::from_secs(secs));
    std::process::exit(0)
}
