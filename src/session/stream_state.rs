//! What one process's output is waiting for, in one line: its log's counters, its pump, the
//! connection writer's phase and the transport's flow-control state in both directions. The
//! stall watchdog puts it in its report; [`lines`] gives it for every process of the server at
//! once, for an operator (`execrelay serve` logs them on `SIGUSR1`) or a harness that saw
//! output stop from outside and wants the server's side of the story.
//!
//! It only reads: it never wakes, signals or changes a process, and takes each lock briefly
//! (never across an `.await`).

use crate::process::stall_watch::Observation;
use crate::process::{ManagedProcess, ReadySet};

/// The state of `p` (of session `session_id`), delivering to `ready`, as `o` observed it.
pub fn describe(
    session_id: &str,
    p: &std::sync::Arc<ManagedProcess>,
    o: &Observation,
    ready: &std::sync::Arc<ReadySet>,
) -> String {
    let flow = ready
        .flow()
        .map(|f| f.describe())
        .unwrap_or_else(|| "no flow control of its own".into());
    let st = p.stats();
    format!(
        "session {session_id} process {:?} pid {}: log next_seq {} written {} released {} \
         acked {} unwritten {} B retained {} B; pump waiting for {:?}; writer {:?}, process \
         queued for it: {}; transport: {flow}",
        p.id,
        p.pid,
        st.next_seq,
        st.written_through,
        st.released_through,
        st.acked_through,
        st.unwritten_bytes,
        st.retained_bytes,
        o.pump_waiting,
        o.writer,
        ready.contains(p),
    )
}

/// One line per process of `processes` (the registry's `all_processes`): [`describe`] for
/// those delivering to a connection, the log's counters for the others (detached, or exited
/// and released). Takes the processes, not the registry, so that the watchdog the registry
/// starts can use [`describe`] without an import circle.
pub fn lines(
    processes: impl IntoIterator<Item = (String, std::sync::Arc<ManagedProcess>)>,
) -> Vec<String> {
    processes
        .into_iter()
        .map(|(session_id, p)| match p.stall_observation() {
            Some((o, ready)) => describe(&session_id, &p, &o, &ready),
            None => {
                let st = p.stats();
                format!(
                    "session {session_id} process {:?} pid {}: log next_seq {} written {} \
                     released {} acked {} unwritten {} B retained {} B; not delivering to a \
                     connection (detached)",
                    p.id,
                    p.pid,
                    st.next_seq,
                    st.written_through,
                    st.released_through,
                    st.acked_through,
                    st.unwritten_bytes,
                    st.retained_bytes,
                )
            }
        })
        .collect()
}

/// Log [`lines`] at `info`, each starting `stream state: `, then how many there were.
pub fn log_all(processes: impl IntoIterator<Item = (String, std::sync::Arc<ManagedProcess>)>) {
    let lines = lines(processes);
    for line in &lines {
        tracing::info!("stream state: {line}");
    }
    tracing::info!("stream state: {} processes", lines.len());
}
