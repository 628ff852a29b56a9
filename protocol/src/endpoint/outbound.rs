//! Frames out: the order the writer takes them in (a due ping, control, bare `ACK`s, then
//! `DATA` round robin) and the room in the link's send queue, told to waiting streams as
//! frames leave. Nothing here reads a frame from the peer (`inbound.rs` does) or owns a
//! socket: the driver calls [`Endpoint::poll_transmit`] and writes what it gets.

use std::time::Instant;

use bytes::Bytes;

use super::{Endpoint, Event, StreamState};
use crate::frame::{Frame, FrameType, StreamId, MAX_FRAME_BYTES};
use crate::transmit::Transmit;

impl Endpoint {
    /// Whether [`poll_transmit`](Self::poll_transmit) has something (a cheap check for
    /// drivers deciding whether to wake their writer).
    pub fn has_transmit(&self) -> bool {
        self.closed.is_none()
            && (self.keepalive.wants_ping()
                || !self.control.is_empty()
                || !self.acks.is_empty()
                || !self.ready.is_empty())
    }

    /// The next thing to write: a due ping, control frames, bare `ACK`s, then `DATA` round
    /// robin between streams. Every frame of a live stream carries its current report.
    pub fn poll_transmit(&mut self, now: Instant) -> Option<Transmit> {
        if self.closed.is_some() {
            return None;
        }
        if let Some(p) = self.keepalive.poll_ping(now) {
            return Some(Transmit::Ping(p));
        }
        if let Some(f) = self.control.pop_front() {
            return Some(self.sent(f));
        }
        while let Some(id) = self.acks.pop_front() {
            let Some(s) = self.streams.get_mut(&id) else {
                continue;
            };
            s.in_acks = false;
            if !s.recv.unreported() {
                continue; // a DATA frame carried it already
            }
            let (ack, window) = s.recv.report();
            let mut f = Frame::new(FrameType::Ack, id, 0, Bytes::new());
            (f.ack, f.window) = (ack, window);
            return Some(self.sent(f));
        }
        while let Some(id) = self.ready.pop_front() {
            let Some(s) = self.streams.get_mut(&id) else {
                continue;
            };
            s.in_ready = false;
            let Some((seq, payload)) = s.out.pop_front() else {
                continue;
            };
            let mut f = Frame::new(FrameType::Data, id, seq, payload);
            (f.ack, f.window) = s.recv.report();
            if !s.out.is_empty() {
                s.in_ready = true;
                self.ready.push_back(id);
            } else if let StreamState::Finishing(reason) = s.state {
                self.remove_and_reset(id, reason);
            }
            self.queued_data_bytes -= f.wire_len();
            self.counters.data_bytes_out += f.payload.len() as u64;
            self.wake_link_waiters();
            return Some(self.sent(f));
        }
        None
    }

    fn sent(&mut self, f: Frame) -> Transmit {
        self.counters.frames_out[f.ftype as usize] += 1;
        Transmit::Frame(f)
    }

    // ---- the send queue's room --------------------------------------------------------

    /// Report `Writable` for `stream` if it wants it and now may send. If only the link's
    /// queue stops it (credit is back, room is not), it waits for room again: the queue's
    /// earlier wake-up may have been spent while it still lacked credit.
    /// `by_queue`: the queue's room is what it waited for (it then counts as woken, see
    /// [`wake_link_waiters`](Self::wake_link_waiters)).
    pub(super) fn maybe_writable(&mut self, stream: &StreamId, by_queue: bool) {
        let room = self.queued_data_bytes < self.cfg.send_queue_bytes;
        if let Some(s) = self.streams.get_mut(stream) {
            if !s.wants_writable || s.state != StreamState::Open || s.send.credit() == 0 {
                return;
            }
            if room {
                s.wants_writable = false;
                if by_queue && !s.link_woken {
                    s.link_woken = true;
                    self.link_woken += 1;
                }
                self.events.push_back(Event::Writable { stream: *stream });
            } else if !s.in_link_waiters {
                s.in_link_waiters = true;
                self.link_waiters.push_back(*stream);
            }
        }
    }

    /// Tell the streams waiting for room in the send queue, oldest first, as many as the
    /// room takes: each one told is counted as about to queue a whole frame until it asks to
    /// send ([`link_wake_spent`](Self::link_wake_spent)). Telling all of them whenever any
    /// room appeared made each frame the writer took wake every waiting stream's task (a
    /// thousand, under a fan-in) for one of them to fill the room and the rest to find the
    /// queue full again and wait anew.
    ///
    /// An empty queue tells every waiter, whatever is counted as told: a told stream whose
    /// sender stopped polling without ending the stream (a send future dropped by a
    /// `select!`) never asks again, and no frame leaves an empty queue to wake anyone else.
    /// Counting stays an optimisation of the busy queue; it can never hold a stream back
    /// for good.
    pub(super) fn wake_link_waiters(&mut self) {
        while self.queued_data_bytes == 0
            || self.queued_data_bytes + self.link_woken * MAX_FRAME_BYTES
                < self.cfg.send_queue_bytes
        {
            let Some(id) = self.link_waiters.pop_front() else {
                break;
            };
            if let Some(s) = self.streams.get_mut(&id) {
                s.in_link_waiters = false;
            }
            self.maybe_writable(&id, true);
        }
    }

    /// `stream` asked to send (or will send nothing more): the room counted as its own since
    /// the queue woke it is free again, for the next waiter if the stream leaves it unused.
    pub(super) fn link_wake_spent(&mut self, stream: &StreamId) {
        let Some(s) = self.streams.get_mut(stream) else {
            return;
        };
        if s.link_woken {
            s.link_woken = false;
            self.link_woken -= 1;
            self.wake_link_waiters();
        }
    }
}
