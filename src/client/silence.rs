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
//! again.
//!
//! Only when everything received was consumed: with acks, a `process/read` acknowledges what
//! precedes it, and the client never acknowledges what the application has not taken.

use std::time::Duration;

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
            for (pid, received) in self.quiet_processes(quiet_since) {
                match tokio::time::timeout(reply_within, self.fetch_after(&conn, &pid, received))
                    .await
                {
                    Ok(0) => {}
                    Ok(n) => tracing::warn!(
                        process = %pid,
                        events = n,
                        "events fetched with process/read after {after:?} of silence: the \
                         server held them without delivering them"
                    ),
                    Err(_) => {
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
