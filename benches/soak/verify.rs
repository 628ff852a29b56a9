//! What one process of the soak must have delivered, checked as it arrives and at its exit
//! notice: every byte of its output stream, in order, once (against the seed's stream, so a
//! loss, a repeat or a corruption is found at the byte), stderr exactly, its stdin read back
//! whole (the trailer), the exit notice last and once, the status its kind calls for, and the
//! notice's `reason` where the server sends one.

use execrelay::client::ProcessEvent;
use execrelay::rpc::messages::{ExitInfo, StreamName};
use sha2::{Digest, Sha256};

use crate::child::stdin_trailer;
use crate::rng::{stream_bytes, StreamCheck};

/// The kinds of process the soak runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// Pipes, output and stdin, an exit status of its own.
    Plain,
    /// Plain, leaving a grandchild behind (in its group, or in a session of its own).
    Grandchild,
    /// On a terminal.
    Pty,
    /// Terminated by the client after a while.
    Terminated,
    /// Still writing when its `timeoutMs` passes.
    Timeout,
    /// Its client stops reading for a while, and comes back.
    Paused,
}

impl Kind {
    /// Every kind, in report order.
    pub const ALL: [Kind; 6] = [
        Kind::Plain,
        Kind::Grandchild,
        Kind::Pty,
        Kind::Terminated,
        Kind::Timeout,
        Kind::Paused,
    ];

    /// Its name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Plain => "plain",
            Kind::Grandchild => "grandchild",
            Kind::Pty => "pty",
            Kind::Terminated => "terminated",
            Kind::Timeout => "timeout",
            Kind::Paused => "paused",
        }
    }
}

/// What the child was asked to do.
#[derive(Debug, Clone)]
pub struct Expect {
    pub kind: Kind,
    /// Output stream seed and length.
    pub seed: u64,
    pub bytes: u64,
    /// Stdin stream seed and length (`None`: no stdin).
    pub stdin: Option<(u64, u64)>,
    pub exit: i32,
    pub pty: bool,
    /// Counts SIGTERM (`term K` on stderr, exit 143) instead of dying of it.
    pub counts_term: bool,
}

/// The SHA-256 of the first `len` bytes of the stream of `seed`.
pub fn stream_hash(seed: u64, len: u64) -> Vec<u8> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut off = 0;
    while off < len {
        let n = (len - off).min(buf.len() as u64) as usize;
        stream_bytes(seed, off, &mut buf[..n]);
        h.update(&buf[..n]);
        off += n as u64;
    }
    h.finalize().to_vec()
}

/// The checks of one process as its events arrive.
pub struct Delivery {
    pub expect: Expect,
    /// Its output stream (stdout, or the terminal after its `R`).
    pub out: StreamCheck,
    /// The `R` of a terminal child was seen.
    pub banner: bool,
    /// Bytes after the output stream (the terminal's trailer).
    pub tail: Vec<u8>,
    /// stderr as received.
    pub stderr: Vec<u8>,
    /// Raw bytes per stream, as the server counts them.
    pub stdout_raw: u64,
    pub stderr_raw: u64,
    /// Exit notices seen.
    pub exits: u32,
    pub exit: Option<ExitInfo>,
    /// Events after the exit notice, `Lost` ranges.
    pub after_exit: u32,
    pub lost_events: u32,
    /// A hash of every output byte received (stdout or terminal), for the report.
    pub hash: Sha256,
}

/// Most bytes of stderr (or a terminal's tail) kept: the trailers are a line.
const TAIL_LIMIT: usize = 4096;

impl Delivery {
    pub fn new(expect: Expect) -> Delivery {
        Delivery {
            out: StreamCheck::new(expect.seed),
            expect,
            banner: false,
            tail: Vec::new(),
            stderr: Vec::new(),
            stdout_raw: 0,
            stderr_raw: 0,
            exits: 0,
            exit: None,
            after_exit: 0,
            lost_events: 0,
            hash: Sha256::new(),
        }
    }

    /// Take one event; the bytes of output it carried.
    pub fn event(&mut self, ev: &ProcessEvent) -> u64 {
        if self.exits > 0 {
            self.after_exit += 1;
        }
        match ev {
            ProcessEvent::Output { stream, data } => {
                let n = data.len() as u64;
                match stream {
                    StreamName::Stderr => {
                        self.stderr_raw += n;
                        if self.stderr.len() < TAIL_LIMIT {
                            self.stderr.extend_from_slice(data);
                        }
                    }
                    StreamName::Stdout | StreamName::Pty => {
                        self.stdout_raw += n;
                        self.hash.update(data);
                        let mut d: &[u8] = data;
                        if self.expect.pty && !self.banner && !d.is_empty() {
                            if d[0] != b'R' {
                                // Not the banner: the stream is wrong from its first byte.
                                self.out.push(d);
                                return n;
                            }
                            self.banner = true;
                            d = &d[1..];
                        }
                        // The output stream is `bytes` long; a terminal's trailer follows it.
                        let room = self.expect.bytes.saturating_sub(self.out.received());
                        let (body, rest) = if self.expect.pty {
                            d.split_at((room as usize).min(d.len()))
                        } else {
                            (d, &[][..])
                        };
                        self.out.push(body);
                        if !rest.is_empty() && self.tail.len() < TAIL_LIMIT {
                            self.tail.extend_from_slice(rest);
                        }
                    }
                }
                n
            }
            // The soak never asks for `headAndTail`: output said omitted is output lost.
            ProcessEvent::Lost { .. } | ProcessEvent::Omitted { .. } => {
                self.lost_events += 1;
                0
            }
            ProcessEvent::Exited(info) => {
                self.exits += 1;
                self.exit = Some(info.clone());
                0
            }
        }
    }

    /// The expected stdin trailer.
    fn trailer(&self) -> String {
        match self.expect.stdin {
            Some((seed, len)) => stdin_trailer(len, &stream_hash(seed, len)),
            None => String::new(),
        }
    }
}

/// What checking one finished process found.
#[derive(Debug, Default, Clone)]
pub struct Verdict {
    /// Output bytes expected (what the server says the child wrote) and received.
    pub expected: u64,
    pub received: u64,
    /// Bytes missing, repeated (received beyond what was written), and whether the order
    /// broke (a byte differs from the stream's).
    pub lost: u64,
    pub duplicated: u64,
    pub corrupt: bool,
    /// `reason` was in the exit notice (a server that sends it), and what it said.
    pub reason: Option<String>,
    /// Everything wrong, in words.
    pub problems: Vec<String>,
    /// Stopped by a terminate whose answer said it was not running (the answer of a repeat).
    pub terminate_repeated: bool,
}

/// Check a finished process. `terminated`: the answer to the client's `process/terminate` said
/// it was running.
pub fn check(d: &Delivery, terminated: bool) -> Verdict {
    let mut v = Verdict::default();
    let e = &d.expect;
    let Some(info) = &d.exit else {
        v.problems.push("no exit notice".into());
        return v;
    };
    if d.exits != 1 {
        v.problems.push(format!("{} exit notices", d.exits));
    }
    if d.after_exit > 0 {
        v.problems
            .push(format!("{} events after the exit notice", d.after_exit));
    }
    if d.lost_events > 0 {
        v.problems
            .push(format!("{} Lost ranges (with acks)", d.lost_events));
    }
    // The notice's `reason`, where this server sends one.
    v.reason = serde_json::to_value(info)
        .ok()
        .and_then(|j| j.get("reason").and_then(|r| r.as_str()).map(String::from));

    // Everything the child wrote arrived, once, in order.
    v.expected = info.stdout_bytes;
    v.received = d.stdout_raw;
    v.lost = v.expected.saturating_sub(v.received);
    v.duplicated = v.received.saturating_sub(v.expected);
    if let Some((at, _)) = d.out.diverged {
        v.corrupt = v.lost == 0 && v.duplicated == 0;
        v.problems.push(format!(
            "output differs from its stream at byte {at} (received {}, the child wrote {})",
            v.received, v.expected
        ));
    } else if v.lost > 0 || v.duplicated > 0 {
        v.problems.push(format!(
            "received {} bytes of output, the child wrote {}",
            v.received, v.expected
        ));
    }
    if d.stderr_raw != info.stderr_bytes {
        v.problems.push(format!(
            "received {} bytes of stderr, the child wrote {}",
            d.stderr_raw, info.stderr_bytes
        ));
        v.lost += info.stderr_bytes.saturating_sub(d.stderr_raw);
        v.duplicated += d.stderr_raw.saturating_sub(info.stderr_bytes);
    }

    let complete = d.out.diverged.is_none() && d.out.matched == e.bytes;
    let stderr = String::from_utf8_lossy(&d.stderr).to_string();
    let tail = String::from_utf8_lossy(&d.tail).to_string();
    let trailer = d.trailer();
    let normal_exit = |v: &mut Verdict| {
        if info.exit_code != Some(e.exit) || info.signal.is_some() {
            v.problems.push(format!(
                "exit {:?} signal {:?}, expected exit {}",
                info.exit_code, info.signal, e.exit
            ));
        }
        if !complete {
            v.problems.push(format!(
                "output incomplete: {} of {} bytes",
                d.out.matched, e.bytes
            ));
        }
        let (got, place) = if e.pty {
            (&tail, "terminal tail")
        } else {
            (&stderr, "stderr")
        };
        if *got != trailer {
            v.problems
                .push(format!("{place} {got:?}, expected {trailer:?}"));
        }
        if e.pty && !d.banner {
            v.problems.push("no R banner on the terminal".into());
        }
    };
    // A stop by signal: the child's own count of what it wrote, or a death by SIGTERM (or
    // SIGKILL if it outlived its grace).
    let stopped = |v: &mut Verdict| {
        if e.counts_term {
            let said = stderr
                .lines()
                .find_map(|l| l.strip_prefix("term "))
                .and_then(|k| k.trim().parse::<u64>().ok());
            match said {
                Some(k) if info.exit_code == Some(143) => {
                    if k != d.out.matched {
                        v.problems.push(format!(
                            "the child wrote {k} bytes (its own count), {} arrived in order",
                            d.out.matched
                        ));
                        v.lost += k.saturating_sub(d.out.matched);
                    }
                }
                _ if info.signal.as_deref() == Some("SIGKILL") => {}
                _ => v.problems.push(format!(
                    "exit {:?} signal {:?} stderr {stderr:?}: expected exit 143 and `term K`",
                    info.exit_code, info.signal
                )),
            }
        } else if !matches!(info.signal.as_deref(), Some("SIGTERM" | "SIGKILL")) {
            v.problems.push(format!(
                "exit {:?} signal {:?}: expected death by SIGTERM",
                info.exit_code, info.signal
            ));
        }
    };
    let reason_is = |v: &mut Verdict, allowed: &[&str]| {
        if let Some(r) = &v.reason {
            if !allowed.contains(&r.as_str()) {
                v.problems
                    .push(format!("reason {r:?}, expected one of {allowed:?}"));
            }
        }
    };
    match e.kind {
        Kind::Timeout => {
            if !info.timed_out {
                v.problems.push(format!(
                    "timedOut false (exit {:?} signal {:?})",
                    info.exit_code, info.signal
                ));
            }
            stopped(&mut v);
            reason_is(&mut v, &["timeout"]);
        }
        // Terminated: stopped by the SIGTERM, or finished on its own as it arrived. Whether
        // the answer said `running` does not decide it: a terminate repeated after a
        // reconnect answers for the moment the repeat arrived, after the first attempt had
        // already stopped it.
        Kind::Terminated => {
            if info.exit_code == Some(e.exit) && info.signal.is_none() && complete {
                normal_exit(&mut v);
                reason_is(&mut v, &["exited", "terminated"]);
            } else {
                if !terminated {
                    v.terminate_repeated = true;
                }
                stopped(&mut v);
                reason_is(&mut v, &["terminated"]);
            }
        }
        _ => {
            if info.timed_out {
                v.problems.push("timedOut true without a timeout".into());
            }
            normal_exit(&mut v);
            reason_is(&mut v, &["exited"]);
        }
    }
    v
}
