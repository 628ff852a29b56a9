//! The stall watchdog's driver: one task per registry that looks at every process delivering
//! to a connection every quarter of `stall_watchdog_ms`, feeds the sans-IO rule
//! ([`crate::process::stall_watch`]) and reports what it declares: one log line with the
//! process's log counters, the writer's phase and the stream's flow-control state (sent,
//! acked, window, queued), the `execrelay_stalled_streams` gauge and `execrelay_stalls_total`.
//!
//! A stall is a bug of the server (the rule excludes every wait the client causes), so a
//! debug build also stops the process there (`std::process::abort`, after the report on
//! stderr): a test that runs into one fails loudly instead of hanging. `EXECRELAY_STALL_ABORT=0`
//! keeps a debug build running (the watchdog's own tests read the report and the metrics).
//!
//! It only observes: it never wakes, signals or changes a process (a watchdog that "fixed"
//! stalls would hide them).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::metrics::Metrics;
use crate::process::stall_watch::{StallWatch, Verdict};
use crate::process::ManagedProcess;

/// Every process of a server with its session's id, or `None` once the server is gone (the
/// registry hands the watchdog this rather than itself, so the watchdog knows no registry).
pub(crate) type Processes = Box<dyn Fn() -> Option<Vec<(String, Arc<ManagedProcess>)>> + Send>;

/// The shortest look interval (a tiny `stall_watchdog_ms` in tests).
const MIN_INTERVAL: Duration = Duration::from_millis(20);

/// Whether a debug build aborts on a stall (see the module docs).
fn abort_on_stall() -> bool {
    cfg!(debug_assertions) && std::env::var("EXECRELAY_STALL_ABORT").as_deref() != Ok("0")
}

/// Start the watchdog of a server's `processes` on the current runtime, if there is one and
/// `bound` (`stall_watchdog_ms`) is not 0. It ends once `processes` answers `None`.
pub(crate) fn spawn(bound: Duration, metrics: Arc<Metrics>, processes: Processes) {
    if bound.is_zero() {
        return;
    }
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    rt.spawn(run(processes, metrics, bound));
}

struct Watched {
    process: Weak<ManagedProcess>,
    watch: StallWatch,
}

async fn run(processes: Processes, metrics: Arc<Metrics>, bound: Duration) {
    let interval = (bound / 4).max(MIN_INTERVAL);
    let mut watched: HashMap<usize, Watched> = HashMap::new();
    loop {
        tokio::time::sleep(interval).await;
        let Some(all) = processes() else {
            return;
        };
        let now = tokio::time::Instant::now().into_std();
        let mut seen = HashSet::new();
        for (session_id, p) in all {
            let key = Arc::as_ptr(&p) as usize;
            seen.insert(key);
            let w = watched.entry(key).or_insert_with(|| Watched {
                process: Arc::downgrade(&p),
                watch: StallWatch::with_interval(bound, interval),
            });
            let Some((o, ready)) = p.stall_observation() else {
                // Detached: output is held on purpose until a client resumes.
                if w.watch.is_stalled() {
                    metrics.stalled_streams.dec();
                }
                w.watch = StallWatch::with_interval(bound, interval);
                continue;
            };
            match w.watch.observe(now, &o) {
                Verdict::Stalled(kind) => {
                    metrics.stalls.inc();
                    metrics.stalled_streams.inc();
                    let report = format!(
                        "stalled stream: {} (no progress for {bound:?}); {}",
                        kind.as_str(),
                        super::stream_state::describe(&session_id, &p, &o, &ready),
                    );
                    tracing::error!(session = %session_id, process = %p.id, "{report}");
                    if abort_on_stall() {
                        execrelay_io::service::note(format_args!(
                            "execrelay (debug build): {report}"
                        ));
                        std::process::abort();
                    }
                }
                Verdict::Recovered => {
                    metrics.stalled_streams.dec();
                    tracing::warn!(
                        session = %session_id,
                        process = %p.id,
                        "stalled stream moves again"
                    );
                }
                Verdict::Fine | Verdict::StillStalled => {}
            }
        }
        // Forget processes that are gone (a stalled one leaves the gauge with it).
        watched.retain(|key, w| {
            let keep = seen.contains(key) && w.process.strong_count() > 0;
            if !keep && w.watch.is_stalled() {
                metrics.stalled_streams.dec();
            }
            keep
        });
    }
}
