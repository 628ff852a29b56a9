//! Every limit and setting of the link engine: a named constant with its reason, and a field of
//! a `Config` struct whose `Default` is those constants. The exec server, the client and the
//! relay binary map these fields to flags and TOML keys; this module owns only the values and
//! the rules that tie them together ([`EndpointConfig::validate`], [`RelayConfig::validate`]).
//!
//! It never reads a clock, a file or the environment.

use std::time::Duration;

use crate::frame::MAX_FRAME_BYTES;

/// Records of the peer a stream accepts past its acknowledgement (`secure-transport.md` §7,
/// `STREAM_WINDOW_RECORDS`). The protocol field is 32 bits; we advertise 16: a record carries
/// at most 64 KiB, so at most 1 MiB per direction per stream is in flight or queued anywhere
/// (sender queue, relay queue, receiver queue), which is what bounds memory per stream.
pub const STREAM_WINDOW_RECORDS: u32 = 16;

/// A receiver reports what it consumed at least every this many records, whatever its window
/// (`secure-transport.md` §7 asks for a bare `ACK` after half a window; with the default window
/// that is these 8). A larger window does not stretch it: a relay forwards windows clipped to
/// its `max_window_records` ([`MAX_RELAY_WINDOW_RECORDS`]), and a receiver waiting for half of
/// a window its sender never saw would never acknowledge; acknowledging every 8 records also
/// keeps a long pipe full. A relay's window is never below it ([`RelayConfig::validate`]).
pub const ACK_EVERY_RECORDS: u32 = STREAM_WINDOW_RECORDS / 2;

/// Streams one endpoint link holds at once (opening, pending, open or finishing). The protocol
/// has no maximum (16-byte ids); 1024 bounds one link's state and memory (at most one window
/// per stream per direction) and matches the exec server's `--max-streams-per-link`.
pub const MAX_STREAMS_PER_LINK: usize = 1024;

/// `OPEN`s a server endpoint has reported and not yet answered (`secure-transport.md` §8,
/// `MAX_PENDING_AUTHORIZATIONS`): more are reset `busy` without being reported, so a flood of
/// handshakes cannot queue unbounded authorization work.
pub const MAX_PENDING_OPENS: usize = 32;

/// Handshake failures tolerated back to back per link (§8: burst 8). Bad message 1, refused
/// authorization, a second `OPEN` or early `DATA` on a pending stream each take one token.
pub const HANDSHAKE_FAILURE_BURST: u32 = 8;

/// One handshake failure forgiven per this interval (§8: "refilling over time"): a client
/// that mistypes a key a few times an hour is never locked out.
pub const HANDSHAKE_FAILURE_REFILL: Duration = Duration::from_secs(2);

/// How long an endpoint refuses new `OPEN`s (`busy`) once its handshake-failure bucket is
/// empty, under [`HandshakeBudgetPolicy::RefuseOpens`] (the exec server's last-resort budget
/// of its environment link, which the relay's per-client budgets keep from ever emptying for
/// one client's sake: [`ADDRESS_HANDSHAKE_FAILURE_BURST`]).
pub const HANDSHAKE_COOLDOWN: Duration = Duration::from_secs(10);

/// Handshake failures one address (IPv4 address or IPv6 /64) may cause through a relay back
/// to back, over all its client links (§6.4, §8): each `RESET` with a handshake-failure
/// reason an environment answers to one of its `OPEN`s takes a token (as does the link's own
/// bucket, [`HANDSHAKE_FAILURE_BURST`]). The relay forwards an `OPEN` from an address only
/// while its `OPEN`s awaiting an answer are fewer than its tokens, so the failures an
/// environment can see from one address in any interval `t` are at most this burst plus
/// `t` / [`ADDRESS_HANDSHAKE_FAILURE_REFILL`], however many links it opens. Also the most
/// handshakes one address has in flight through the relay at once: 256 is more than a busy
/// host behind one NAT opens together (each client library keeps at most 16 in flight per
/// link; the exec server takes 32 pending per link).
pub const ADDRESS_HANDSHAKE_FAILURE_BURST: u32 = 256;

/// One handshake failure of an address forgiven per this interval: an address that keeps
/// sending bad handshakes costs an environment at most one a second.
pub const ADDRESS_HANDSHAKE_FAILURE_REFILL: Duration = Duration::from_secs(1);

/// Memory a queued frame costs the relay beside its wire bytes: the `Frame` itself in its
/// queue slot, its payload's allocation header, the bookkeeping of its lane. A frame is
/// charged `wire_len + QUEUED_FRAME_OVERHEAD_BYTES` against its link's share and the relay's
/// total, so that a flood of small frames (a `RESET busy` is 48 bytes on the wire and about
/// three times that in memory) is counted at what it holds.
pub const QUEUED_FRAME_OVERHEAD_BYTES: usize = 128;

/// Bytes (at their memory cost) the relay queues for one client link besides its streams'
/// `DATA`: refusals of its `OPEN`s, `ACCEPT`s, `RESET`s of any origin, coalesced `ACK`s
/// (§6.4 "every byte queued for a client link counts against that link's own share"). A
/// frame that would pass it closes the link (`control_queue_full`): the peer is not reading.
/// Its `DATA` is held to one window per stream by the flow accounting instead. 256 KiB holds
/// a reading client's worst burst (a `RESET` for each of its 1024 streams when its
/// environment goes, its 64 `OPEN`s of a second refused); one address holds at most
/// 64 × 256 KiB = 16 MiB of them, a sixteenth of [`MAX_QUEUED_BYTES`].
pub const CLIENT_LINK_SHARE_BYTES: usize = 256 << 10;

/// A client link with no stream for this long is closed (§6.4 `IDLE_LINK_TIMEOUT`), so that
/// links which hold nothing cannot keep the relay's link slots (their pongs keep them alive).
/// As the exec server's `idle_link_timeout_ms`.
pub const IDLE_LINK_TIMEOUT: Duration = Duration::from_secs(60);

/// A client link whose WebSocket message has taken this long to arrive since its first
/// byte is closed (§6.4): a peer trickling one message holds its slot without sending
/// anything the relay could act on (and cannot answer pings meanwhile). 10 s is a 64 KiB
/// frame at 6.5 KB/s.
pub const MESSAGE_TIMEOUT: Duration = Duration::from_secs(10);

/// Streams one address (IPv4 address or IPv6 /64) may hold to one environment through a
/// relay at once. The relay cannot see client keys (message 1 hides them); an address is its
/// nearest view of one client, and the exec server holds each key to its own quota
/// (`max_streams_per_key`). Half an exec server's streams per link (1024): one host cannot
/// take an environment's streams from others.
pub const MAX_STREAMS_PER_ADDRESS_PER_ENVIRONMENT: usize = 512;

/// When another exec server claims an environment id whose link is up, how long the holder
/// has to answer a ping (a probe) to keep it. A holder that answers keeps the id and the
/// newcomer is refused (`environment_in_use`: two servers share the key); one that does not
/// is dead (its host crashed or its path broke without the relay noticing) and the newcomer
/// takes the id at once, instead of waiting for the keepalive.
pub const ENVIRONMENT_PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Malformed frames tolerated back to back per link before it is closed (§6.4): frames that do
/// not decode, break a header rule (`ack bits` ≠ 0, `RESUME`, `seq` outside `DATA`, a zero
/// initial window, stream id 0) or arrive in the wrong direction. An honest peer sends none;
/// 16 absorbs a buggy burst without letting a hostile peer make us work forever.
pub const MALFORMED_FRAME_BURST: u32 = 16;

/// One malformed frame forgiven per this interval.
pub const MALFORMED_FRAME_REFILL: Duration = Duration::from_secs(1);

/// Frames for streams we never knew (and do not remember closing) tolerated back to back per
/// link before it is closed (§6.4). Frames that cross a reset land in the remembered set
/// ([`CLOSED_STREAMS_REMEMBERED`]) and cost nothing, so only a confused or hostile peer spends
/// this.
pub const UNKNOWN_STREAM_BURST: u32 = 64;

/// One unknown-stream frame forgiven per this interval.
pub const UNKNOWN_STREAM_REFILL: Duration = Duration::from_secs(1);

/// Stream ids remembered per link after they closed, so that frames already in flight when a
/// stream was reset (at most one window of `DATA`, plus `ACK`s and a crossing `RESET`) are
/// dropped quietly instead of charged to the unknown-stream budget. Oldest forgotten first;
/// 1024 × 16 bytes per link.
pub const CLOSED_STREAMS_REMEMBERED: usize = 1024;

/// `DATA` bytes an endpoint queues for its link writer before a stream must wait for room
/// (beside waiting for window credit). At least one window of full records (1 MiB), so a
/// single stream can keep its window full; 2 MiB leaves room for a second. A stream admitted
/// below the limit may overshoot it by one record.
pub const LINK_SEND_QUEUE_BYTES: usize = 2 << 20;

/// Control frames (`OPEN`, `ACCEPT`, `RESET`) an endpoint queues for its writer. Our own are
/// bounded by the stream count (one `OPEN` or `ACCEPT` and one `RESET` per stream); the rest
/// answer the peer (refusals, unknown streams). A peer that makes us queue more than twice
/// the stream limit without reading them is not reading its link: the link is closed.
pub const CONTROL_QUEUE_FRAMES: usize = 2 * MAX_STREAMS_PER_LINK;

/// Interval of WebSocket pings on every link (§6.4 `KEEPALIVE_INTERVAL`), minus jitter.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(15);

/// Largest jitter taken off each keepalive interval, so that links created together do not
/// ping in lockstep: a tenth of the interval.
pub const KEEPALIVE_JITTER: Duration = Duration::from_millis(1500);

/// A link whose oldest unanswered ping is this old is dead (§6.4 `PONG_TIMEOUT`). Inbound
/// data does not count as an answer: a peer that sends but never answers is dead.
pub const PONG_TIMEOUT: Duration = Duration::from_secs(30);

/// A write (of a frame or ping, or a flush) that has not completed after this long kills the
/// link (§6.4: "every write has the same deadline" as the pong).
pub const WRITE_TIMEOUT: Duration = PONG_TIMEOUT;

/// Environment ids a relay serves at once (§6.4 "environments"). Each costs a map entry and at
/// most one link; 10,000 is far above one relay's expected fleet and bounds the table.
pub const MAX_ENVIRONMENTS: usize = 10_000;

/// Streams routed to one environment at once (§6.4). Above the exec server's own stream limit
/// per link (1024) times a few client links; a relay routes at most this many for one
/// environment, and the environment link's queue holds at most one window for each.
pub const MAX_STREAMS_PER_ENVIRONMENT: usize = 8192;

/// Streams one client link may hold through a relay (§6.4), as for a direct link.
pub const MAX_STREAMS_PER_CLIENT_LINK: usize = MAX_STREAMS_PER_LINK;

/// Client links a relay accepts from one address (§6.4): enough for every process on a busy
/// host behind one NAT, few enough that one address cannot hold the relay's link table. An
/// address is an IPv4 address or an IPv6 /64 (one host owns a whole /64), as for the HTTP
/// front's handshake slots.
pub const MAX_CLIENT_LINKS_PER_ADDRESS: usize = 64;

/// `OPEN`s per second a client link may send through a relay (§6.4 "handshakes per second per
/// client link"), as a bucket of this burst refilled at this rate; more are reset `busy`.
/// Each `OPEN` costs the environment a Noise handshake (two X25519 operations).
pub const OPENS_PER_SECOND: u32 = 64;

/// Bytes a relay holds in all its send queues together (§6.4 "total queued bytes"); above it
/// new streams are refused with `busy`. Established streams keep their windows (at most
/// 1 MiB each per direction), so the relay's memory is this plus one window per stream
/// admitted while below it.
pub const MAX_QUEUED_BYTES: usize = 256 << 20;

/// Bytes of control frames a relay link's queue reserves beside its data (§6.3 "a reserved
/// share for control frames"). `ACCEPT`, `ACK` (one coalesced per stream) and `RESET` are
/// bounded by the link's streams and always admitted; an `OPEN` that would push the control
/// share past this is refused `busy`. The refusals themselves (`RESET busy` of a client's
/// `OPEN`s, the one control frame a client can make the relay queue without holding a stream)
/// are held to it too: a client link whose unread refusals would pass it is closed
/// (`control_queue_full`). Sixteen full-size frames.
pub const CONTROL_RESERVE_BYTES: usize = 16 * MAX_FRAME_BYTES;

/// The largest receive window (records) a relay honours. A receiver advertising more is held
/// to this many records past its `ack`, so that a hostile receiver that never reads cannot
/// make the relay queue more than 64 records (4 MiB) of one stream. Four times the default
/// window: room for endpoints tuned to larger windows (a client far away: a stream moves at
/// most one window per round trip). The relay forwards every `window` field clipped to this,
/// so a sender never learns of a larger window and an endpoint that advertises more is slowed
/// to it, not reset.
pub const MAX_RELAY_WINDOW_RECORDS: u32 = 64;

/// A token bucket's shape: `burst` tokens, one more every `refill` (never above `burst`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketConfig {
    /// Tokens when full.
    pub burst: u32,
    /// One token returns per this interval; zero refills at once.
    pub refill: Duration,
}

/// What an endpoint does when its handshake-failure bucket runs empty (§8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandshakeBudgetPolicy {
    /// Refuse new `OPEN`s (`busy`) for `cooldown`; established streams are untouched. For an
    /// environment link, which carries many clients' streams.
    RefuseOpens {
        /// How long new `OPEN`s are refused.
        cooldown: Duration,
    },
    /// Close the link. For a direct listener, where the link is one client's.
    CloseLink,
}

/// Keepalive and write deadline of one link (§6.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeepaliveConfig {
    /// See [`KEEPALIVE_INTERVAL`].
    pub interval: Duration,
    /// See [`KEEPALIVE_JITTER`]; must be below `interval`.
    pub jitter: Duration,
    /// See [`PONG_TIMEOUT`].
    pub pong_timeout: Duration,
    /// See [`WRITE_TIMEOUT`].
    pub write_timeout: Duration,
}

impl Default for KeepaliveConfig {
    fn default() -> Self {
        KeepaliveConfig {
            interval: KEEPALIVE_INTERVAL,
            jitter: KEEPALIVE_JITTER,
            pong_timeout: PONG_TIMEOUT,
            write_timeout: WRITE_TIMEOUT,
        }
    }
}

/// Settings of one endpoint link (exec server or client).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointConfig {
    /// Our receive window per stream, advertised in `OPEN`/`ACCEPT` ([`STREAM_WINDOW_RECORDS`]).
    pub window: u32,
    /// See [`MAX_STREAMS_PER_LINK`].
    pub max_streams: usize,
    /// See [`MAX_PENDING_OPENS`].
    pub max_pending_opens: usize,
    /// See [`HANDSHAKE_FAILURE_BURST`], [`HANDSHAKE_FAILURE_REFILL`].
    pub handshake_failures: BucketConfig,
    /// What an empty handshake-failure bucket does.
    pub on_handshake_budget_empty: HandshakeBudgetPolicy,
    /// See [`MALFORMED_FRAME_BURST`], [`MALFORMED_FRAME_REFILL`].
    pub malformed_frames: BucketConfig,
    /// See [`UNKNOWN_STREAM_BURST`], [`UNKNOWN_STREAM_REFILL`].
    pub unknown_stream_frames: BucketConfig,
    /// Whether an empty unknown-stream budget closes the link (the default). Not on an
    /// environment link: its frames come from every client of the environment through the
    /// relay, and any client can make the environment close more streams than
    /// [`CLOSED_STREAMS_REMEMBERED`] (refusals cost it nothing), so that other clients' frames
    /// crossing their streams' ends would be charged and the link (every client's) closed.
    /// There, unknown-stream frames are counted and dropped (`DATA` still answered `RESET`).
    pub unknown_streams_close_link: bool,
    /// See [`CLOSED_STREAMS_REMEMBERED`].
    pub closed_streams_remembered: usize,
    /// See [`LINK_SEND_QUEUE_BYTES`].
    pub send_queue_bytes: usize,
    /// See [`CONTROL_QUEUE_FRAMES`].
    pub control_queue_frames: usize,
    /// Keepalive and write deadline.
    pub keepalive: KeepaliveConfig,
}

impl Default for EndpointConfig {
    fn default() -> Self {
        EndpointConfig {
            window: STREAM_WINDOW_RECORDS,
            max_streams: MAX_STREAMS_PER_LINK,
            max_pending_opens: MAX_PENDING_OPENS,
            handshake_failures: BucketConfig {
                burst: HANDSHAKE_FAILURE_BURST,
                refill: HANDSHAKE_FAILURE_REFILL,
            },
            on_handshake_budget_empty: HandshakeBudgetPolicy::RefuseOpens {
                cooldown: HANDSHAKE_COOLDOWN,
            },
            malformed_frames: BucketConfig {
                burst: MALFORMED_FRAME_BURST,
                refill: MALFORMED_FRAME_REFILL,
            },
            unknown_stream_frames: BucketConfig {
                burst: UNKNOWN_STREAM_BURST,
                refill: UNKNOWN_STREAM_REFILL,
            },
            unknown_streams_close_link: true,
            closed_streams_remembered: CLOSED_STREAMS_REMEMBERED,
            send_queue_bytes: LINK_SEND_QUEUE_BYTES,
            control_queue_frames: CONTROL_QUEUE_FRAMES,
            keepalive: KeepaliveConfig::default(),
        }
    }
}

/// Settings of a relay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayConfig {
    /// Handshake failures per client link ([`HANDSHAKE_FAILURE_BURST`],
    /// [`HANDSHAKE_FAILURE_REFILL`]); the failure that takes the last token closes the link.
    pub handshake_failures: BucketConfig,
    /// Handshake failures per client address ([`ADDRESS_HANDSHAKE_FAILURE_BURST`],
    /// [`ADDRESS_HANDSHAKE_FAILURE_REFILL`]).
    pub address_handshake_failures: BucketConfig,
    /// See [`CLIENT_LINK_SHARE_BYTES`].
    pub client_link_share_bytes: usize,
    /// See [`IDLE_LINK_TIMEOUT`].
    pub idle_link_timeout: Duration,
    /// See [`MESSAGE_TIMEOUT`].
    pub message_timeout: Duration,
    /// See [`MAX_STREAMS_PER_ADDRESS_PER_ENVIRONMENT`].
    pub max_streams_per_address_per_environment: usize,
    /// See [`ENVIRONMENT_PROBE_TIMEOUT`].
    pub environment_probe_timeout: Duration,
    /// See [`MAX_ENVIRONMENTS`].
    pub max_environments: usize,
    /// See [`MAX_STREAMS_PER_ENVIRONMENT`].
    pub max_streams_per_environment: usize,
    /// See [`MAX_STREAMS_PER_CLIENT_LINK`].
    pub max_streams_per_client_link: usize,
    /// See [`MAX_CLIENT_LINKS_PER_ADDRESS`].
    pub max_client_links_per_address: usize,
    /// See [`OPENS_PER_SECOND`]: burst `n`, one token per `1/n` s.
    pub opens_per_second: u32,
    /// See [`MAX_QUEUED_BYTES`].
    pub max_queued_bytes: usize,
    /// See [`CONTROL_RESERVE_BYTES`].
    pub control_reserve_bytes: usize,
    /// See [`MAX_RELAY_WINDOW_RECORDS`].
    pub max_window_records: u32,
    /// See [`MALFORMED_FRAME_BURST`].
    pub malformed_frames: BucketConfig,
    /// See [`UNKNOWN_STREAM_BURST`].
    pub unknown_stream_frames: BucketConfig,
    /// See [`CLOSED_STREAMS_REMEMBERED`].
    pub closed_streams_remembered: usize,
    /// Keepalive and write deadline of every relay link.
    pub keepalive: KeepaliveConfig,
}

impl Default for RelayConfig {
    fn default() -> Self {
        let e = EndpointConfig::default();
        RelayConfig {
            handshake_failures: e.handshake_failures,
            address_handshake_failures: BucketConfig {
                burst: ADDRESS_HANDSHAKE_FAILURE_BURST,
                refill: ADDRESS_HANDSHAKE_FAILURE_REFILL,
            },
            client_link_share_bytes: CLIENT_LINK_SHARE_BYTES,
            idle_link_timeout: IDLE_LINK_TIMEOUT,
            message_timeout: MESSAGE_TIMEOUT,
            max_streams_per_address_per_environment: MAX_STREAMS_PER_ADDRESS_PER_ENVIRONMENT,
            environment_probe_timeout: ENVIRONMENT_PROBE_TIMEOUT,
            max_environments: MAX_ENVIRONMENTS,
            max_streams_per_environment: MAX_STREAMS_PER_ENVIRONMENT,
            max_streams_per_client_link: MAX_STREAMS_PER_CLIENT_LINK,
            max_client_links_per_address: MAX_CLIENT_LINKS_PER_ADDRESS,
            opens_per_second: OPENS_PER_SECOND,
            max_queued_bytes: MAX_QUEUED_BYTES,
            control_reserve_bytes: CONTROL_RESERVE_BYTES,
            max_window_records: MAX_RELAY_WINDOW_RECORDS,
            malformed_frames: e.malformed_frames,
            unknown_stream_frames: e.unknown_stream_frames,
            closed_streams_remembered: CLOSED_STREAMS_REMEMBERED,
            keepalive: KeepaliveConfig::default(),
        }
    }
}

/// A setting that contradicts another, or cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A value that must be at least 1 is 0.
    #[error("{0} must be at least 1")]
    Zero(&'static str),
    /// The jitter is not below the keepalive interval.
    #[error("the keepalive jitter must be below the keepalive interval")]
    Jitter,
    /// The send queue cannot hold one frame.
    #[error("the send queue must hold at least one frame ({MAX_FRAME_BYTES} bytes)")]
    SendQueue,
    /// A client link's share cannot hold one refusal.
    #[error(
        "the client link share must hold at least one RESET ({} bytes at its memory cost)",
        MIN_CLIENT_LINK_SHARE_BYTES
    )]
    ClientShare,
    /// The relay's window is below what receivers acknowledge at a time.
    #[error(
        "the relay's window (max_window_records) must be at least {} records: receivers acknowledge every {} records, and a smaller window would stall their streams",
        ACK_EVERY_RECORDS, ACK_EVERY_RECORDS
    )]
    RelayWindow,
}

// One address's client links can never hold more than a sixteenth of the total.
const _: () =
    assert!(MAX_CLIENT_LINKS_PER_ADDRESS * CLIENT_LINK_SHARE_BYTES <= MAX_QUEUED_BYTES / 16);
// The overhead charged per queued frame covers the frame itself and its payload's handle (a
// frame of at least `KEEP_WIRE_FROM_BYTES` also boxes its message's handle, 48 bytes, under 5 %
// of its bytes: `frame.rs`).
const _: () =
    assert!(std::mem::size_of::<crate::frame::Frame>() + 32 <= QUEUED_FRAME_OVERHEAD_BYTES);

/// The smallest client link share: one `RESET` with the longest reason, at its memory cost.
pub const MIN_CLIENT_LINK_SHARE_BYTES: usize =
    crate::frame::HEADER_BYTES + crate::frame::MAX_RESET_REASON_BYTES + QUEUED_FRAME_OVERHEAD_BYTES;

fn nonzero(v: u64, name: &'static str) -> Result<(), ConfigError> {
    if v == 0 {
        Err(ConfigError::Zero(name))
    } else {
        Ok(())
    }
}

impl KeepaliveConfig {
    /// Check the relationships between the fields.
    pub fn validate(&self) -> Result<(), ConfigError> {
        nonzero(self.interval.as_nanos() as u64, "keepalive interval")?;
        nonzero(self.pong_timeout.as_nanos() as u64, "pong timeout")?;
        nonzero(self.write_timeout.as_nanos() as u64, "write timeout")?;
        if self.jitter >= self.interval {
            return Err(ConfigError::Jitter);
        }
        Ok(())
    }
}

impl EndpointConfig {
    /// Check the relationships between the fields, once, before a link starts.
    pub fn validate(&self) -> Result<(), ConfigError> {
        nonzero(self.window.into(), "window")?;
        nonzero(self.max_streams as u64, "max streams")?;
        nonzero(self.max_pending_opens as u64, "max pending opens")?;
        nonzero(
            self.handshake_failures.burst.into(),
            "handshake failure burst",
        )?;
        nonzero(self.malformed_frames.burst.into(), "malformed frame burst")?;
        nonzero(
            self.unknown_stream_frames.burst.into(),
            "unknown stream burst",
        )?;
        nonzero(self.control_queue_frames as u64, "control queue")?;
        if self.send_queue_bytes < MAX_FRAME_BYTES {
            return Err(ConfigError::SendQueue);
        }
        self.keepalive.validate()
    }
}

impl RelayConfig {
    /// Check the relationships between the fields, once, before the relay starts.
    pub fn validate(&self) -> Result<(), ConfigError> {
        nonzero(self.max_environments as u64, "max environments")?;
        nonzero(
            self.max_streams_per_environment as u64,
            "streams per environment",
        )?;
        nonzero(
            self.max_streams_per_client_link as u64,
            "streams per client link",
        )?;
        nonzero(
            self.max_client_links_per_address as u64,
            "client links per address",
        )?;
        nonzero(self.opens_per_second.into(), "opens per second")?;
        if self.max_window_records < ACK_EVERY_RECORDS {
            return Err(ConfigError::RelayWindow);
        }
        nonzero(self.malformed_frames.burst.into(), "malformed frame burst")?;
        nonzero(
            self.unknown_stream_frames.burst.into(),
            "unknown stream burst",
        )?;
        if self.control_reserve_bytes < MAX_FRAME_BYTES {
            return Err(ConfigError::SendQueue);
        }
        nonzero(
            self.handshake_failures.burst.into(),
            "handshake failure burst",
        )?;
        nonzero(
            self.address_handshake_failures.burst.into(),
            "address handshake failure burst",
        )?;
        nonzero(
            self.max_streams_per_address_per_environment as u64,
            "streams per address per environment",
        )?;
        nonzero(
            self.idle_link_timeout.as_millis() as u64,
            "idle link timeout",
        )?;
        nonzero(self.message_timeout.as_millis() as u64, "message timeout")?;
        nonzero(
            self.environment_probe_timeout.as_millis() as u64,
            "environment probe timeout",
        )?;
        if self.client_link_share_bytes < MIN_CLIENT_LINK_SHARE_BYTES {
            return Err(ConfigError::ClientShare);
        }
        self.keepalive.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_match_the_spec() {
        assert_eq!(EndpointConfig::default().validate(), Ok(()));
        assert_eq!(RelayConfig::default().validate(), Ok(()));
        assert_eq!(STREAM_WINDOW_RECORDS, 16);
        assert_eq!(KEEPALIVE_INTERVAL, Duration::from_secs(15));
        assert_eq!(PONG_TIMEOUT, Duration::from_secs(30));
        assert_eq!(IDLE_LINK_TIMEOUT, Duration::from_secs(60));
    }

    #[test]
    fn contradictions_are_refused() {
        let mut c = EndpointConfig {
            window: 0,
            ..EndpointConfig::default()
        };
        assert_eq!(c.validate(), Err(ConfigError::Zero("window")));
        c.window = 1;
        c.keepalive.jitter = c.keepalive.interval;
        assert_eq!(c.validate(), Err(ConfigError::Jitter));
        c.keepalive.jitter = Duration::ZERO;
        c.send_queue_bytes = MAX_FRAME_BYTES - 1;
        assert_eq!(c.validate(), Err(ConfigError::SendQueue));
    }
}
