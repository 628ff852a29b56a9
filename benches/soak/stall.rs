//! The stall detector: a process whose client is reading, whose path has been quiet (no fault
//! under way on its proxy, its environment link's proxy, or the relay, for longer than the
//! bound) and whose output and stdin have not moved for longer than the bound is stalled.
//! That is the failure a user meets as "the command just hangs", and the soak's worst.
//!
//! A stall is reported with both ends' flow-control state: the client's side from the
//! library ([`execrelay::client::Client::delivery_state`]: received, consumed and acknowledged
//! `seq`, buffered events, and its Noise stream's windows both ways), the server's from its
//! own words (`SIGUSR1` makes `execrelay serve` log a `stream state:` line per process: log
//! counters, pump, writer, and its stream's windows both ways), and through the relay, the
//! relay's `/status` (streams, queued bytes). The server's own stall watchdog
//! (`stalled stream:` in its log, `execrelay_stalls_total`) is read too: a stall it sees is a
//! failure whether or not a client noticed.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::deploy::status;
use crate::proxy::Proxy;
use crate::workload::{Path, Shared, Tracked};

/// The relay's restarts, as the detector sees them.
#[derive(Default)]
pub struct RelayState {
    /// Down (or starting) now.
    pub down: AtomicBool,
    /// When it last came back.
    pub last: Mutex<Option<Instant>>,
}

/// One exec server, as the detector reads it.
#[derive(Clone)]
pub struct ServerView {
    pub pid: u32,
    pub log: PathBuf,
}

/// The detector's view of the deployment.
pub struct Detector {
    pub sh: Arc<Shared>,
    pub bound: Duration,
    pub env_proxies: Vec<Proxy>,
    pub relay: Arc<RelayState>,
    pub relay_metrics: Arc<Mutex<SocketAddr>>,
    pub servers: Vec<ServerView>,
    /// Stalls seen by the client side, and by the servers' watchdogs.
    pub client_stalls: AtomicU64,
    pub server_stalls: AtomicU64,
}

fn later(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

impl Detector {
    /// `Err` while something on `path` is disturbed now; else when it last was.
    fn path_quiet(&self, path: &Path) -> Result<Option<Instant>, ()> {
        let mut last = path.proxy.quiet_since()?;
        if path.via_relay {
            last = later(last, self.env_proxies[path.server].quiet_since()?);
            if self.relay.down.load(Ordering::SeqCst) {
                return Err(());
            }
            last = later(
                last,
                *self.relay.last.lock().unwrap_or_else(|e| e.into_inner()),
            );
        }
        Ok(last)
    }

    /// Look every second until `stop`.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        let mut offsets = vec![0u64; self.servers.len()];
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
            self.scan_server_logs(&mut offsets);
            let now = Instant::now();
            let live: Vec<Arc<Tracked>> = self
                .sh
                .live
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .values()
                .cloned()
                .collect();
            for t in live {
                if t.done.load(Ordering::SeqCst)
                    || t.paused.load(Ordering::SeqCst)
                    || t.stalled.load(Ordering::SeqCst)
                {
                    continue;
                }
                let Ok(quiet) = self.path_quiet(&t.path) else {
                    continue;
                };
                let since = later(Some(t.last_progress()), quiet).unwrap_or(t.started);
                let idle = now.saturating_duration_since(since);
                if idle > self.bound {
                    t.stalled.store(true, Ordering::SeqCst);
                    self.client_stalls.fetch_add(1, Ordering::Relaxed);
                    let me = self.clone();
                    tokio::spawn(async move { me.report(t, idle).await });
                }
            }
        }
    }

    /// New `stalled stream:` lines in the servers' logs.
    fn scan_server_logs(&self, offsets: &mut [u64]) {
        for (i, s) in self.servers.iter().enumerate() {
            let Ok(text) = std::fs::read(&s.log) else {
                continue;
            };
            let from = (offsets[i] as usize).min(text.len());
            // Only whole lines.
            let Some(end) = text[from..].iter().rposition(|&b| b == b'\n') else {
                continue;
            };
            let chunk = String::from_utf8_lossy(&text[from..from + end + 1]).to_string();
            offsets[i] = (from + end + 1) as u64;
            for line in chunk.lines() {
                if line.contains("stalled stream:") {
                    self.server_stalls.fetch_add(1, Ordering::Relaxed);
                    self.sh
                        .fail(format!("STALL seen by server {i}'s watchdog: {line}"));
                }
            }
        }
    }

    async fn report(&self, t: Arc<Tracked>, idle: Duration) {
        let client = t
            .client
            .delivery_state(&t.id)
            .map(|s| s.to_string())
            .unwrap_or_else(|| "no live handle".into());
        let server = &self.servers[t.path.server];
        let server_line = self.server_state(server, &t.id).await;
        let relay = if t.path.via_relay {
            let addr = *self.relay_metrics.lock().unwrap_or_else(|e| e.into_inner());
            match status(addr).await {
                Ok(s) => format!(
                    "environments online {}, client links {}, streams {}, queued bytes {} \
                     (deepest link {})",
                    s["environments"]["online"],
                    s["client_links"]["open"],
                    s["streams"],
                    s["queued_bytes"]["now"],
                    s["queued_bytes"]["deepest_link"],
                ),
                Err(e) => format!("no /status: {e}"),
            }
        } else {
            "not on this path (direct)".into()
        };
        self.sh.fail(format!(
            "STALL {} ({}, via {}): no progress for {idle:.1?} on a quiet path while its \
             client reads; output {} B, stdin {} B so far\n    client: {client}\n    \
             server: {server_line}\n    relay: {relay}",
            t.id,
            t.kind.name(),
            t.path.proxy.name,
            t.out_bytes.load(Ordering::Relaxed),
            t.in_bytes.load(Ordering::Relaxed),
        ));
    }

    /// The server's `stream state:` line for `id`, asked for with `SIGUSR1`.
    async fn server_state(&self, server: &ServerView, id: &str) -> String {
        let before = std::fs::metadata(&server.log).map(|m| m.len()).unwrap_or(0);
        // SAFETY: signalling the exec server the soak started (a pid it has not reaped).
        unsafe { libc::kill(server.pid as i32, libc::SIGUSR1) };
        let needle = format!("process {id:?} ");
        for _ in 0..50 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let Ok(text) = std::fs::read(&server.log) else {
                continue;
            };
            let from = (before as usize).min(text.len());
            let text = String::from_utf8_lossy(&text[from..]);
            if let Some(line) = text
                .lines()
                .find(|l| l.contains("stream state: ") && l.contains(&needle))
            {
                return line
                    .split_once("stream state: ")
                    .map(|(_, r)| r.to_string())
                    .unwrap_or_else(|| line.to_string());
            }
            if text.contains("stream state: ") && text.contains(" processes") {
                return "the server does not know this process (or not any more)".into();
            }
        }
        "no stream state from the server within 5 s".into()
    }
}
