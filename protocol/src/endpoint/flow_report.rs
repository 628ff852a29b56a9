//! What one stream's flow control looks like from outside (secure-transport.md §7): plain
//! snapshots the endpoint hands to drivers, diagnostics and stall reports. They hold no
//! state of their own and change nothing; the rules live in the endpoint and `stream.rs`.

/// One stream's sending direction as the flow-control rules see it (secure-transport.md §7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamFlow {
    /// Records sent (the last `seq`).
    pub sent: u64,
    /// The peer's last report: the records it consumed…
    pub acked: u64,
    /// …and how many past them it accepts.
    pub window: u32,
    /// Records that may be sent now: `acked + window - sent`.
    pub credit: u64,
    /// Records of this stream queued for the link writer.
    pub queued_records: usize,
    /// `DATA` bytes queued for the link writer, all streams.
    pub link_queued_bytes: usize,
    /// Whether the link's send queue takes another record.
    pub link_has_room: bool,
    /// The application was told to wait and has not been told it may send again.
    pub waiting: bool,
}

impl StreamFlow {
    /// Whether the stream may send a record now (credit, and room in the link's queue).
    pub fn can_send(&self) -> bool {
        self.credit > 0 && self.link_has_room
    }
}

/// One stream's receiving direction (secure-transport.md §7): what arrived, what the
/// application took, and what the sender was last told. A sender that waits for credit while
/// `consumed` is past `reported` waits for a report this side still owes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvFlow {
    /// Records received (the last `seq`).
    pub received: u64,
    /// Records the application consumed.
    pub consumed: u64,
    /// The `ack` last sent to the peer…
    pub reported: u64,
    /// …with this window.
    pub window: u32,
    /// Records received and not yet taken by the application.
    pub queued_records: usize,
}

impl std::fmt::Display for RecvFlow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "received {} consumed {} reported {} window {} queued {} records",
            self.received, self.consumed, self.reported, self.window, self.queued_records,
        )
    }
}

impl std::fmt::Display for StreamFlow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "sent {} acked {} window {} credit {} queued {} records (link {} bytes{}){}",
            self.sent,
            self.acked,
            self.window,
            self.credit,
            self.queued_records,
            self.link_queued_bytes,
            if self.link_has_room { "" } else { ", full" },
            if self.waiting { ", sender waiting" } else { "" },
        )
    }
}
