//! Why streams are reset, frames dropped and links closed, and the counters of each.
//!
//! Every reason is ours (a fixed list), so a counter label never carries a peer's words: a
//! peer's `RESET` reason is handed to the application as text and counted as one
//! `peer_resets` figure.

/// A `RESET` reason this engine (or its application) sends. `as_str` is the wire text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Reason {
    /// A record past the receiver's `ack + window` (§7).
    WindowExceeded,
    /// A frame that breaks a rule of §5 on an established stream (out-of-order `seq`, `ack`
    /// of a record never sent, a frame in the wrong direction or state).
    MalformedFrame,
    /// Refused for load: pending handshakes, a cool-down, the relay's queue or rate limits.
    Busy,
    /// `DATA` for a stream the endpoint does not hold.
    UnknownStream,
    /// A second `OPEN` for a stream the endpoint holds.
    DuplicateOpen,
    /// `DATA` on a stream whose `OPEN` is not yet answered.
    DataBeforeAccept,
    /// The link's stream limit.
    TooManyStreams,
    /// Handshake message 1 did not verify (the application's verdict).
    HandshakeFailed,
    /// The authorizer refused (the application's verdict; the relay's for a bad environment key).
    Unauthorized,
    /// A record that did not decrypt (the application's verdict).
    BadRecord,
    /// The stream ended on purpose, or its handles were dropped.
    Closed,
    /// Relay: the environment has no link.
    EnvironmentOffline,
    /// Relay: the environment's link died or was replaced.
    EnvironmentGone,
    /// Relay: the environment is no longer listed (its key was removed from the
    /// environments file): its streams are reset, and `OPEN`s for it refused, with this
    /// reason, so that its clients stop at once instead of waiting for it to come back.
    EnvironmentRevoked,
    /// Relay: the client link that opened the stream died.
    ClientGone,
    /// Handshake message 1 whose `ts` is not above one already accepted for its key (the
    /// exec server's verdict, `secure-transport.md` §3).
    ReplayedHandshake,
    /// Handshake message 1 whose `ts` is more than 10 minutes from the server's clock.
    ClockSkew,
    /// An `OPEN` whose Noise suite (its flags' bits 0–1) the server does not accept: not one
    /// it implements, or not one its configuration lists (`secure-transport.md` §3). A
    /// client may retry with suite 0.
    UnsupportedSuite,
}

impl Reason {
    /// Every reason, in counter order.
    pub const ALL: [Reason; 18] = [
        Reason::WindowExceeded,
        Reason::MalformedFrame,
        Reason::Busy,
        Reason::UnknownStream,
        Reason::DuplicateOpen,
        Reason::DataBeforeAccept,
        Reason::TooManyStreams,
        Reason::HandshakeFailed,
        Reason::Unauthorized,
        Reason::BadRecord,
        Reason::Closed,
        Reason::EnvironmentOffline,
        Reason::EnvironmentGone,
        Reason::EnvironmentRevoked,
        Reason::ClientGone,
        Reason::ReplayedHandshake,
        Reason::ClockSkew,
        Reason::UnsupportedSuite,
    ];

    /// The wire text (and metrics label).
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::WindowExceeded => "window_exceeded",
            Reason::MalformedFrame => "malformed_frame",
            Reason::Busy => "busy",
            Reason::UnknownStream => "unknown_stream",
            Reason::DuplicateOpen => "duplicate_open",
            Reason::DataBeforeAccept => "data_before_accept",
            Reason::TooManyStreams => "too_many_streams",
            Reason::HandshakeFailed => "handshake_failed",
            Reason::Unauthorized => "unauthorized",
            Reason::BadRecord => "bad_record",
            Reason::Closed => "closed",
            Reason::EnvironmentOffline => "environment_offline",
            Reason::EnvironmentGone => "environment_gone",
            Reason::EnvironmentRevoked => "environment_revoked",
            Reason::ClientGone => "client_gone",
            Reason::ReplayedHandshake => "replayed_handshake",
            Reason::ClockSkew => "clock_skew",
            Reason::UnsupportedSuite => "unsupported_suite",
        }
    }

    fn index(self) -> usize {
        Reason::ALL.iter().position(|r| *r == self).unwrap_or(0)
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why an inbound frame was dropped without effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DropReason {
    /// It did not decode or broke a header rule (charged to the malformed budget).
    Malformed,
    /// Its stream was never known here (charged to the unknown-stream budget).
    UnknownStream,
    /// Its stream closed recently: it was in flight when the stream was reset (free).
    ClosedStream,
    /// An `OPEN` refused (busy, limits, offline): counted here as well as by its reset.
    RefusedOpen,
}

impl DropReason {
    /// Every drop reason, in counter order.
    pub const ALL: [DropReason; 4] = [
        DropReason::Malformed,
        DropReason::UnknownStream,
        DropReason::ClosedStream,
        DropReason::RefusedOpen,
    ];

    /// Metrics label.
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::Malformed => "malformed",
            DropReason::UnknownStream => "unknown_stream",
            DropReason::ClosedStream => "closed_stream",
            DropReason::RefusedOpen => "refused_open",
        }
    }

    fn index(self) -> usize {
        DropReason::ALL.iter().position(|r| *r == self).unwrap_or(0)
    }
}

/// Why a link ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CloseReason {
    /// More malformed frames than its budget.
    MalformedBudget,
    /// More unknown-stream frames than its budget.
    UnknownStreamBudget,
    /// Its handshake-failure bucket ran empty under [`HandshakeBudgetPolicy::CloseLink`](crate::config::HandshakeBudgetPolicy).
    HandshakeBudget,
    /// No pong within the pong timeout.
    KeepaliveTimeout,
    /// A write did not complete within the write timeout.
    WriteTimeout,
    /// The peer let our control frames pile up past the limit.
    ControlQueueFull,
    /// A protocol error of the WebSocket layer (a text message, a broken WebSocket frame).
    Protocol,
    /// A WebSocket message (one frame) over the frame size limit: refused before it was
    /// buffered whole (§5).
    OversizedFrame,
    /// The socket ended (close frame, end of stream or I/O error).
    Transport,
    /// The application (or relay operator) closed it.
    Local,
    /// Relay: a newer link for the same environment replaced it.
    Replaced,
    /// Relay: its environment is no longer listed.
    Revoked,
    /// Relay: a client link that held no stream for the idle timeout.
    Idle,
    /// A WebSocket message that took longer than the message timeout to arrive (a client
    /// link trickling one message).
    MessageTimeout,
    /// Relay cluster: the environment's home is now another relay (its link is asked to
    /// re-dial), or the relay-to-relay link a client link was forwarded over ended (the
    /// client dials again to find the environment's holder).
    Moved,
}

impl CloseReason {
    /// Every close reason, in counter order.
    pub const ALL: [CloseReason; 15] = [
        CloseReason::MalformedBudget,
        CloseReason::UnknownStreamBudget,
        CloseReason::HandshakeBudget,
        CloseReason::KeepaliveTimeout,
        CloseReason::WriteTimeout,
        CloseReason::ControlQueueFull,
        CloseReason::Protocol,
        CloseReason::OversizedFrame,
        CloseReason::Transport,
        CloseReason::Local,
        CloseReason::Replaced,
        CloseReason::Revoked,
        CloseReason::Idle,
        CloseReason::MessageTimeout,
        CloseReason::Moved,
    ];

    /// Metrics label and log text.
    pub fn as_str(self) -> &'static str {
        match self {
            CloseReason::MalformedBudget => "malformed_budget",
            CloseReason::UnknownStreamBudget => "unknown_stream_budget",
            CloseReason::HandshakeBudget => "handshake_budget",
            CloseReason::KeepaliveTimeout => "keepalive_timeout",
            CloseReason::WriteTimeout => "write_timeout",
            CloseReason::ControlQueueFull => "control_queue_full",
            CloseReason::Protocol => "protocol",
            CloseReason::OversizedFrame => "oversized_frame",
            CloseReason::Transport => "transport",
            CloseReason::Local => "local",
            CloseReason::Replaced => "replaced",
            CloseReason::Revoked => "revoked",
            CloseReason::Idle => "idle",
            CloseReason::MessageTimeout => "message_timeout",
            CloseReason::Moved => "moved",
        }
    }

    fn index(self) -> usize {
        CloseReason::ALL
            .iter()
            .position(|r| *r == self)
            .unwrap_or(0)
    }
}

impl std::fmt::Display for CloseReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Counters of one endpoint link or of a whole relay.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    resets: [u64; Reason::ALL.len()],
    drops: [u64; DropReason::ALL.len()],
    closes: [u64; CloseReason::ALL.len()],
    /// `RESET`s received from a peer (an endpoint) or forwarded (a relay).
    pub peer_resets: u64,
    /// Frames received, by type index (`FrameType as u8`, 1..=6; 0 for undecodable).
    pub frames_in: [u64; 7],
    /// Frames sent, by type index.
    pub frames_out: [u64; 7],
    /// Payload bytes received in `DATA` frames.
    pub data_bytes_in: u64,
    /// Payload bytes sent in `DATA` frames.
    pub data_bytes_out: u64,
    /// Relay: environments' `RESET`s answering a client's `OPEN` with a handshake-failure
    /// reason, charged to that client's link and address.
    pub handshake_failures: u64,
    /// Relay: `OPEN`s whose route ended before their answer by the client's doing (its
    /// `RESET`, a broken rule, its link's death), charged to its address.
    pub abandoned_opens: u64,
}

impl Counters {
    /// `RESET`s we sent for `r`.
    pub fn resets(&self, r: Reason) -> u64 {
        self.resets[r.index()]
    }

    /// Frames dropped for `d`.
    pub fn drops(&self, d: DropReason) -> u64 {
        self.drops[d.index()]
    }

    /// Links closed for `c`.
    pub fn closes(&self, c: CloseReason) -> u64 {
        self.closes[c.index()]
    }

    /// Every reset counter, for metrics.
    pub fn reset_counts(&self) -> impl Iterator<Item = (Reason, u64)> + '_ {
        Reason::ALL.iter().map(|r| (*r, self.resets(*r)))
    }

    /// Every drop counter, for metrics.
    pub fn drop_counts(&self) -> impl Iterator<Item = (DropReason, u64)> + '_ {
        DropReason::ALL.iter().map(|d| (*d, self.drops(*d)))
    }

    /// Every close counter, for metrics.
    pub fn close_counts(&self) -> impl Iterator<Item = (CloseReason, u64)> + '_ {
        CloseReason::ALL.iter().map(|c| (*c, self.closes(*c)))
    }

    pub(crate) fn reset(&mut self, r: Reason) {
        self.resets[r.index()] += 1;
    }

    pub(crate) fn dropped(&mut self, d: DropReason) {
        self.drops[d.index()] += 1;
    }

    pub(crate) fn closed(&mut self, c: CloseReason) {
        self.closes[c.index()] += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_has_its_own_counter_and_label() {
        let mut c = Counters::default();
        for (i, r) in Reason::ALL.iter().enumerate() {
            for _ in 0..=i {
                c.reset(*r);
            }
        }
        for (i, (r, n)) in c.reset_counts().enumerate() {
            assert_eq!(n, i as u64 + 1, "{r}");
        }
        let labels: std::collections::HashSet<_> = Reason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(labels.len(), Reason::ALL.len());
        c.dropped(DropReason::ClosedStream);
        c.closed(CloseReason::Replaced);
        assert_eq!(c.drops(DropReason::ClosedStream), 1);
        assert_eq!(c.closes(CloseReason::Replaced), 1);
    }
}
