//! The silence watch: a client never waits forever on a live connection.
//!
//! Output and exit notices arrive as notifications; if a server stopped delivering them (a
//! server bug, a wedged connection) while the link still answers pings, a client that only
//! waits would wait forever. So a process the application is waiting on (running, all it
//! received consumed) that delivered nothing for [`SILENCE_PROBE_AFTER`] is asked about:
//! `process/read` after the last event received. Events the server holds come back that way
//! (handed on in order, deduplicated like any replay, and logged as a delivery the server
//! owed); a silent process costs one small request per quiet period. A connection that does
//! not answer within [`PROBE_REPLY_TIMEOUT`] is taken for wedged: it is closed, and the client
//! resumes on a new one as after any lost connection (the resume replays what it missed).
//!
//! Not while the process has its start, a write (or `closeStdin`, `resize`) in flight: a read
//! waits behind it (`protocol.md` §6), a write for as long as the child leaves its stdin
//! unread, a start for as long as a person takes to approve it. Asked then, a healthy
//! connection would be closed for a process that was merely waiting: its upload refused on
//! the new one while the old write still held the server's budget, or its question asked
//! again. Checked when the process is picked and again just before its question (the
//! questions before it take time); a question left unanswered while one of those requests
//! began meanwhile does not condemn the connection.
//!
//! Only when everything received was consumed: with acks, a `process/read` acknowledges what
//! precedes it, and the client never acknowledges what the application has not taken.

use std::time::Duration;

use super::exclusive::ExclusiveCounts;
use super::Client;
use crate::sync::lock;

/// How long a running process may deliver nothing, on a live connection, before the client
/// asks the server about it.
pub const SILENCE_PROBE_AFTER: Duration = Duration::from_secs(30);

/// How long the answer to that question may take before the connection is taken for wedged
/// (closed, then resumed): the default of `ClientOptions::probe_reply_timeout`.
pub const PROBE_REPLY_TIMEOUT: Duration = Duration::from_secs(20);

impl Client {
    /// Watch for quiet processes until the client closes (see the module docs).
    pub(super) async fn watch_silence(self) {
        let Some(after) = self.shared.opts.silence_probe else {
            return;
        };
        let tick = (after / 4).max(Duration::from_millis(10));
        let reply_within = self.shared.opts.probe_reply_timeout;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(tick) => {}
                _ = self.shared.shutdown.cancelled() => return,
            }
            let Some(conn) = lock(&self.shared.conn).clone() else {
                continue;
            };
            if conn.is_closed() {
                continue;
            }
            let quiet_since = tokio::time::Instant::now() - after;
            for q in self.quiet_processes(quiet_since) {
                let pid = &q.pid;
                let fetch = self.fetch_after(&conn, pid, q.received);
                match ask(&q.exclusive, reply_within, fetch).await {
                    Probe::Skipped | Probe::Answered(0) => {}
                    Probe::Answered(n) => tracing::warn!(
                        process = %pid,
                        events = n,
                        "events fetched with process/read after {after:?} of silence: the \
                         server held them without delivering them"
                    ),
                    Probe::BehindItsOwnRequest => tracing::debug!(
                        process = %pid,
                        "no answer to the silence probe, but a request of the process began \
                         meanwhile: not taken for a wedged connection"
                    ),
                    Probe::Unanswered => {
                        tracing::warn!(
                            process = %pid,
                            "no answer within {reply_within:?} on a live connection: \
                             closing it to resume on a new one"
                        );
                        conn.close();
                        break;
                    }
                }
            }
        }
    }
}

/// What one question about a quiet process said.
#[derive(Debug, PartialEq, Eq)]
enum Probe {
    /// Not asked: an exclusive request of the process is in flight, and the read would wait
    /// behind it.
    Skipped,
    /// Answered, with this many events the server had not delivered.
    Answered(u64),
    /// Unanswered in time, but an exclusive request of the process began while the question
    /// was on its way (between the check and the send, or while the read was paged): the
    /// read may wait behind it, which says nothing about the connection. Asked again in the
    /// next quiet period.
    BehindItsOwnRequest,
    /// Unanswered in time with nothing of its own ahead of it: the connection is wedged.
    Unanswered,
}

/// Ask about a process with `fetch` (not polled, so not sent, when the process is skipped),
/// unless one of its `exclusive` requests is in flight: the process was picked with none,
/// but the questions before it in the round took time, and one begun since would hold this
/// one too.
async fn ask(
    exclusive: &ExclusiveCounts,
    reply_within: Duration,
    fetch: impl std::future::Future<Output = u64>,
) -> Probe {
    // `begun` before `idle`: see `ExclusiveInFlight::new` for why this order (review R3).
    let begun = exclusive.begun();
    if !exclusive.idle() {
        return Probe::Skipped;
    }
    match tokio::time::timeout(reply_within, fetch).await {
        Ok(n) => Probe::Answered(n),
        Err(_) if exclusive.begun() != begun => Probe::BehindItsOwnRequest,
        Err(_) => Probe::Unanswered,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio::sync::oneshot;

    use super::*;
    use crate::client::exclusive::ExclusiveInFlight;

    const WITHIN: Duration = Duration::from_secs(20);

    /// A question that says when it is sent, and is never answered.
    async fn sent_never_answered(asked: oneshot::Sender<()>) -> u64 {
        let _ = asked.send(());
        std::future::pending::<u64>().await
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_is_taken_as_it_comes() {
        let counts = ExclusiveCounts::default();
        assert_eq!(ask(&counts, WITHIN, async { 3 }).await, Probe::Answered(3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_process_with_a_request_in_flight_is_not_asked() {
        let counts = Arc::new(ExclusiveCounts::default());
        let write = ExclusiveInFlight::new(&counts);
        let mut sent = false;
        let fetch = async {
            sent = true;
            0
        };
        assert_eq!(ask(&counts, WITHIN, fetch).await, Probe::Skipped);
        assert!(!sent, "the read was not sent");
        drop(write);
        assert_eq!(ask(&counts, WITHIN, async { 0 }).await, Probe::Answered(0));
    }

    #[tokio::test(start_paused = true)]
    async fn silence_with_nothing_ahead_condemns_the_connection() {
        let counts = ExclusiveCounts::default();
        let before = tokio::time::Instant::now();
        let probe = ask(&counts, WITHIN, std::future::pending()).await;
        assert_eq!(probe, Probe::Unanswered);
        assert_eq!(before.elapsed(), WITHIN, "after the whole reply timeout");
    }

    /// Red team F1: a write to the process began while its read was on the way (the watch
    /// picked it while idle); the read waits behind the write, and the connection is fine.
    #[tokio::test(start_paused = true)]
    async fn silence_behind_a_request_begun_meanwhile_does_not() {
        let counts = Arc::new(ExclusiveCounts::default());
        let (asked, asked_rx) = oneshot::channel::<()>();
        let writer = {
            let counts = counts.clone();
            tokio::spawn(async move {
                asked_rx.await.expect("the read was sent");
                // Held to the end, as a write to a child that leaves its stdin unread.
                let write = ExclusiveInFlight::new(&counts);
                std::future::pending::<()>().await;
                drop(write);
            })
        };
        assert_eq!(
            ask(&counts, WITHIN, sent_never_answered(asked)).await,
            Probe::BehindItsOwnRequest
        );
        // Begun and already answered counts too: the read still queued behind it for a while.
        writer.abort();
        let (asked, asked_rx) = oneshot::channel::<()>();
        let quick = {
            let counts = counts.clone();
            tokio::spawn(async move {
                asked_rx.await.expect("the read was sent");
                drop(ExclusiveInFlight::new(&counts));
            })
        };
        let _ = writer.await;
        assert!(counts.idle());
        assert_eq!(
            ask(&counts, WITHIN, sent_never_answered(asked)).await,
            Probe::BehindItsOwnRequest
        );
        quick.await.expect("the quick write");
        assert_eq!(
            ask(&counts, WITHIN, std::future::pending()).await,
            Probe::Unanswered,
            "nothing begun during this one"
        );
    }
}
