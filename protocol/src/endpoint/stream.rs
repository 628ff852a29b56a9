//! One stream of an endpoint link: its state, both flow-control directions, and the records
//! it has queued for the link writer.

use std::collections::VecDeque;

use bytes::Bytes;

use crate::flow::{RecvWindow, SendWindow};
use crate::frame::HEADER_BYTES;
use crate::reason::Reason;

/// Where a stream is in its life. Closed streams are not in the table (their ids are
/// remembered in the link's closed set).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamState {
    /// Client: `OPEN` sent, waiting for `ACCEPT` or `RESET`.
    Opening,
    /// Server: `OPEN` reported to the application, which has not answered yet.
    Pending,
    /// Established: `DATA` both ways.
    Open,
    /// The application finished it: the queued records go out, then a `RESET` with this
    /// reason; inbound records are dropped.
    Finishing(Reason),
}

/// One stream's bookkeeping.
#[derive(Debug)]
pub(crate) struct Stream {
    pub state: StreamState,
    pub send: SendWindow,
    pub recv: RecvWindow,
    /// Records numbered and waiting for the writer, oldest first.
    pub out: VecDeque<(u64, Bytes)>,
    /// In the link's round-robin of streams with queued records.
    pub in_ready: bool,
    /// In the link's queue of streams owing a bare `ACK`.
    pub in_acks: bool,
    /// In the link's list of streams waiting for send-queue room.
    pub in_link_waiters: bool,
    /// Told `Writable` by the link's queue and has not asked to send since: one frame of
    /// the queue's room is counted as this stream's until it does (see
    /// `Endpoint::wake_link_waiters`).
    pub link_woken: bool,
    /// The application was told it cannot send: report `Writable` when it can.
    pub wants_writable: bool,
}

impl Stream {
    pub fn new(state: StreamState, window: u32) -> Self {
        Stream {
            state,
            send: SendWindow::new(),
            recv: RecvWindow::new(window),
            out: VecDeque::new(),
            in_ready: false,
            in_acks: false,
            in_link_waiters: false,
            link_woken: false,
            wants_writable: false,
        }
    }

    /// Wire bytes of the queued records.
    pub fn queued_bytes(&self) -> usize {
        self.out.iter().map(|(_, p)| HEADER_BYTES + p.len()).sum()
    }
}
