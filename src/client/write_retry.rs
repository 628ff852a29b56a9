//! When a [`StdinWriter`](super::StdinWriter) sends a refused write again, and when
//! `Client::start` sends a refused start again: the policy, without I/O or a clock (the
//! caller sleeps the pauses it returns).
//!
//! A server that says `capabilities.retryRefusedWrites` keeps a process's writes in order after
//! refusing one for a limit (`connection/write_order.rs`): everything behind the refused write
//! is refused too, until it comes again. So a refused write is not lost input, only input that
//! came too early: the writer waits, then sends it again alone, and once it is accepted the
//! writes after it, in order (sent with it, they would only be refused again, each charged to
//! the server's full budget first).
//!
//! # What this module owns
//!
//! [`WriteRetry`]: whether a refusal is worth another try, and how long to wait first — from
//! [`WRITE_RETRY_FIRST_MS`], doubling to [`WRITE_RETRY_MAX_MS`], for at most
//! `ClientOptions::write_retry_for` ([`WRITE_RETRY_FOR_MS`] by default) since the first of the
//! refusals in a row (pauses and round trips alike: the caller passes the time); an accepted
//! write starts it over. [`transient_limit`]: the refusals a start is tried again on (a start
//! is tried again with the same pauses and bound; it needs no promise of order).
//!
//! # What it must never do
//!
//! - Retry a refusal that cannot end: a byte limit smaller than the write itself, or anything
//!   but `-32004`.
//! - Retry on a server that did not promise the order (a refused write sent again there could
//!   land after writes that followed it).

use std::time::{Duration, Instant};

use serde_json::Value;

use super::ClientError;
use crate::rpc::ErrorCode;

/// The first pause before a refused write is sent again.
pub const WRITE_RETRY_FIRST_MS: u64 = 5;

/// The longest pause between two tries (the pause doubles from [`WRITE_RETRY_FIRST_MS`]).
pub const WRITE_RETRY_MAX_MS: u64 = 500;

/// How long a writer keeps sending a refused write again before it gives up, by default
/// (`ClientOptions::write_retry_for`; the command's input is then reported lost, as it is by a
/// server that does not keep the order): a server whose limits stay full for a minute is not
/// coming back soon.
pub const WRITE_RETRY_FOR_MS: u64 = 60_000;

/// The limits whose `-32004` a start is tried again on (`Client::start`): the connection's
/// and the server's requests in flight and their bytes, and the in-process queue. They empty
/// as other requests are answered, and a request refused for them was refused before it was
/// carried out (the byte budgets before it is parsed, the request slots before it is routed),
/// so that attempt made no start. Not `maxProcesses` and its kin: they wait on processes
/// ending, which is the application's to decide.
const TRANSIENT_LIMITS: [&str; 5] = [
    "maxPendingRequests",
    "maxPendingControlRequests",
    "maxPendingRequestBytes",
    "maxInboundBytes",
    super::rpc_connection::IN_PROCESS_QUEUE_LIMIT,
];

/// Whether `error` is a refusal for a limit that empties by itself ([`TRANSIENT_LIMITS`]).
pub(super) fn transient_limit(error: &ClientError) -> bool {
    let ClientError::Rpc { code, data, .. } = error else {
        return false;
    };
    *code == ErrorCode::LimitReached.code()
        && data
            .as_ref()
            .and_then(|d| d.get("limit"))
            .and_then(Value::as_str)
            .is_some_and(|l| TRANSIENT_LIMITS.contains(&l))
}

/// The byte limits a write is charged to (`data.limit` of their `-32004`); `data.value` is
/// their size in bytes, so a write larger than that can never fit.
const BYTE_LIMITS: [&str; 2] = ["maxPendingRequestBytes", "maxInboundBytes"];

/// The refusals in a row of one writer, and the next pause.
#[derive(Debug, Clone)]
pub(super) struct WriteRetry {
    /// How long refusals in a row are tried again.
    limit: Duration,
    next: Duration,
    /// When the first of the refusals in a row came.
    since: Option<Instant>,
    /// Refused writes sent again, in all.
    tries: u64,
}

impl WriteRetry {
    /// A writer that tries again for at most `limit` of refusals in a row.
    pub(super) fn new(limit: Duration) -> WriteRetry {
        WriteRetry {
            limit,
            next: Duration::from_millis(WRITE_RETRY_FIRST_MS),
            since: None,
            tries: 0,
        }
    }

    /// Refused writes sent again so far.
    pub(super) fn tries(&self) -> u64 {
        self.tries
    }

    /// The oldest write in flight, charged about `cost` bytes by the server, was answered
    /// `error`, at `now`, on a connection where `promised` says the server keeps the order: the
    /// pause before sending it again, or `None` to give up.
    pub(super) fn after_refusal(
        &mut self,
        error: &ClientError,
        cost: usize,
        promised: bool,
        now: Instant,
    ) -> Option<Duration> {
        let ClientError::Rpc { code, data, .. } = error else {
            return None;
        };
        if !promised || *code != ErrorCode::LimitReached.code() || never_fits(data, cost) {
            return None;
        }
        let since = *self.since.get_or_insert(now);
        if now.saturating_duration_since(since) >= self.limit {
            return None;
        }
        let pause = self.next;
        self.tries += 1;
        self.next = (self.next * 2).min(Duration::from_millis(WRITE_RETRY_MAX_MS));
        Some(pause)
    }

    /// A write was accepted: the next refusal starts over.
    pub(super) fn accepted(&mut self) {
        self.next = Duration::from_millis(WRITE_RETRY_FIRST_MS);
        self.since = None;
    }
}

/// The time [`WriteRetry::after_refusal`] is given: tokio's clock, so that a test with paused
/// time drives it as it drives the pauses.
pub(super) fn retry_now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// A byte limit smaller than the write: no wait makes room for it.
fn never_fits(data: &Option<Value>, cost: usize) -> bool {
    let Some(data) = data else { return false };
    let limit = data.get("limit").and_then(Value::as_str);
    let value = data.get("value").and_then(Value::as_u64);
    match (limit, value) {
        (Some(limit), Some(value)) if BYTE_LIMITS.contains(&limit) => {
            (value as u128) < cost as u128
        }
        _ => false,
    }
}

/// The least the server charges a write of `len` bytes (`connection/request_budget.rs`): a
/// binary one exactly its length and its bookkeeping; a JSON one at least its base64 text (its
/// envelope and parsed values come on top). Never more than the charge, so that a write that
/// fits is never given up on; one that does not, by a little, is given up on after
/// `write_retry_for`.
pub(super) fn write_cost(len: usize, binary: bool) -> usize {
    use crate::connection::request_budget::BINARY_WRITE_OVERHEAD_BYTES;
    if binary {
        len + BINARY_WRITE_OVERHEAD_BYTES
    } else {
        len.div_ceil(3) * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_start_is_tried_again_only_for_limits_that_empty_by_themselves() {
        for name in TRANSIENT_LIMITS {
            assert!(transient_limit(&limit(name, 1)), "{name}");
        }
        for name in [
            "maxProcesses",
            "maxSessions",
            "maxProcessesPerKey",
            "writeOrder",
        ] {
            assert!(!transient_limit(&limit(name, 1)), "{name}");
        }
        let no_data = ClientError::Rpc {
            code: -32004,
            message: "limit reached".into(),
            data: None,
        };
        assert!(!transient_limit(&no_data));
        let other_code = ClientError::Rpc {
            code: -32602,
            message: "x".into(),
            data: Some(json!({"limit": "maxInboundBytes", "value": 1})),
        };
        assert!(!transient_limit(&other_code));
        assert!(!transient_limit(&ClientError::ConnectionLost));
    }

    fn limit(name: &str, value: u64) -> ClientError {
        ClientError::Rpc {
            code: -32004,
            message: format!("limit reached: {name} ({value})"),
            data: Some(json!({"limit": name, "value": value})),
        }
    }

    /// Refusals in a row, each a round trip of `rtt` after the pause before it: the pauses
    /// given, and the time from the first refusal to the one given up on.
    fn refused_until_given_up(r: &mut WriteRetry, rtt: Duration) -> (Vec<u64>, Duration) {
        let e = limit("maxInboundBytes", 1 << 20);
        let start = Instant::now();
        let mut now = start;
        let mut pauses = Vec::new();
        while let Some(p) = r.after_refusal(&e, 65_000, true, now) {
            pauses.push(p.as_millis() as u64);
            now += p + rtt;
        }
        (pauses, now - start)
    }

    #[test]
    fn pauses_double_to_the_most_then_it_gives_up_after_the_minute() {
        let limit_for = Duration::from_millis(WRITE_RETRY_FOR_MS);
        let mut r = WriteRetry::new(limit_for);
        let (pauses, took) = refused_until_given_up(&mut r, Duration::ZERO);
        assert_eq!(&pauses[..8], &[5, 10, 20, 40, 80, 160, 320, 500]);
        assert!(pauses[8..].iter().all(|&p| p == WRITE_RETRY_MAX_MS));
        let max = Duration::from_millis(WRITE_RETRY_MAX_MS);
        assert!(took >= limit_for && took < limit_for + max, "{took:?}");
        assert_eq!(r.tries(), pauses.len() as u64);
        // An accepted write starts it over.
        r.accepted();
        let e = limit("maxInboundBytes", 1 << 20);
        assert_eq!(
            r.after_refusal(&e, 65_000, true, Instant::now()),
            Some(Duration::from_millis(5))
        );
        // A limit of zero: the first refusal is reported.
        let mut never = WriteRetry::new(Duration::ZERO);
        assert_eq!(never.after_refusal(&e, 65_000, true, Instant::now()), None);
    }

    /// The minute counts the round trips too: a far server is not tried for longer.
    #[test]
    fn round_trips_count_against_the_limit() {
        let limit_for = Duration::from_millis(WRITE_RETRY_FOR_MS);
        let rtt = Duration::from_millis(200);
        let mut r = WriteRetry::new(limit_for);
        let (pauses, took) = refused_until_given_up(&mut r, rtt);
        let max = Duration::from_millis(WRITE_RETRY_MAX_MS);
        assert!(
            took >= limit_for && took < limit_for + max + rtt,
            "{took:?}"
        );
        // Fewer tries than with no round trip: each one took 200 ms more.
        let mut near = WriteRetry::new(limit_for);
        let (near_pauses, _) = refused_until_given_up(&mut near, Duration::ZERO);
        assert!(pauses.len() < near_pauses.len(), "{} tries", pauses.len());
    }

    #[test]
    fn only_a_limit_that_can_free_on_a_server_that_keeps_the_order_is_retried() {
        let mut r = WriteRetry::new(Duration::from_secs(60));
        let now = Instant::now();
        // The server did not promise the order.
        assert_eq!(
            r.after_refusal(&limit("maxInboundBytes", 1 << 20), 10, false, now),
            None
        );
        // A byte limit smaller than the write.
        assert_eq!(
            r.after_refusal(&limit("maxPendingRequestBytes", 1000), 1001, true, now),
            None
        );
        assert!(r
            .after_refusal(&limit("maxPendingRequestBytes", 1001), 1001, true, now)
            .is_some());
        // Slots and the write order itself free as answers go out.
        assert!(r
            .after_refusal(&limit("maxPendingRequests", 1), 1 << 30, true, now)
            .is_some());
        let order = ClientError::Rpc {
            code: -32004,
            message: "limit reached: writeOrder".into(),
            data: Some(json!({"limit": "writeOrder", "writeId": "s-1"})),
        };
        assert!(r.after_refusal(&order, 1 << 30, true, now).is_some());
        // Anything else is not a limit.
        let other = ClientError::Rpc {
            code: -32602,
            message: "invalid params".into(),
            data: None,
        };
        assert_eq!(r.after_refusal(&other, 10, true, now), None);
        assert_eq!(
            r.after_refusal(&ClientError::ConnectionLost, 10, true, now),
            None
        );
    }

    #[test]
    fn a_write_costs_no_more_than_the_server_charges() {
        use crate::connection::request_budget::parse_cost;
        // The JSON estimate is under the real request's charge (ids at their longest), and
        // not far under.
        let data = vec![7u8; 196_000];
        let req = crate::rpc::write_request::encode_write_request(
            u64::MAX,
            &"p".repeat(256),
            &"w".repeat(256),
            &data,
        );
        let charged = parse_cost(req.as_bytes());
        let estimate = write_cost(data.len(), false);
        assert!(estimate <= charged, "{estimate} > {charged}");
        assert!(estimate + 4096 > charged, "{estimate} vs {charged}");
        assert_eq!(write_cost(1000, true), 1000 + 1024);
    }
}
