//! Frames in: decoding, the field rules, and what each frame type does to the stream table.
//! Every path ends in exactly one of: an effect on one stream, a quiet drop (counted), a
//! charge to a budget, or the link closing.

use std::time::Instant;

use bytes::Bytes;

use super::{Endpoint, Event, ResetCause, Side, Stream, StreamState};
use crate::frame::{Frame, FrameType, StreamId};
use crate::reason::{CloseReason, DropReason, Reason};

impl Endpoint {
    /// One binary WebSocket message from the peer, at `now`.
    pub fn handle_frame(&mut self, now: Instant, msg: impl Into<Bytes>) {
        if self.closed.is_some() {
            return;
        }
        let frame = match Frame::decode_owned(msg) {
            Ok(f) => f,
            Err(_) => {
                self.counters.frames_in[0] += 1;
                self.malformed(now, None);
                return;
            }
        };
        self.counters.frames_in[frame.ftype as usize] += 1;
        if frame.check_rules().is_err() {
            self.malformed(now, Some(frame.stream));
            return;
        }
        match (frame.ftype, self.side) {
            (FrameType::Open, Side::Server) => self.on_open(now, frame),
            (FrameType::Accept, Side::Client) => self.on_accept(now, frame),
            (FrameType::Data, _) => self.on_data(now, frame),
            (FrameType::Ack, _) => self.on_ack(now, frame),
            (FrameType::Reset, _) => self.on_reset(now, frame),
            // OPEN to a client, ACCEPT to a server (RESUME was refused by the rules).
            _ => self.malformed(now, Some(frame.stream)),
        }
    }

    /// A frame that does not decode or breaks a rule: charged to the malformed budget (the
    /// link closes past it); the stream it names, if we hold it, is reset.
    fn malformed(&mut self, now: Instant, stream: Option<StreamId>) {
        self.counters.dropped(DropReason::Malformed);
        if let Some(id) = stream {
            if self.streams.contains_key(&id) {
                self.local_reset(id, Reason::MalformedFrame);
            }
        }
        if !self.malformed.take(now) {
            self.close_link(CloseReason::MalformedBudget);
        }
    }

    /// A frame for a stream we do not hold. Free if the stream closed recently (it was in
    /// flight), or if it is a `RESET` (it asks for nothing, and `RESET`s cross ours: a peer
    /// that makes us refuse more streams than the closed set remembers would otherwise have
    /// its crossing `RESET`s charged, and through a relay that peer can be any client of the
    /// environment); otherwise charged to the unknown-stream budget, and `DATA` is answered
    /// with `RESET` so the peer stops.
    fn unknown(&mut self, now: Instant, f: &Frame) {
        if self.closed_streams.contains(&f.stream) {
            self.counters.dropped(DropReason::ClosedStream);
            return;
        }
        self.counters.dropped(DropReason::UnknownStream);
        if f.ftype == FrameType::Reset {
            return;
        }
        if self.cfg.unknown_streams_close_link && !self.unknown.take(now) {
            self.close_link(CloseReason::UnknownStreamBudget);
            return;
        }
        if f.ftype == FrameType::Data {
            self.send_reset(f.stream, Reason::UnknownStream);
        }
    }

    fn on_open(&mut self, now: Instant, f: Frame) {
        let id = f.stream;
        if self.streams.contains_key(&id) {
            // A second OPEN for a stream this peer holds: a handshake failure (§8).
            self.local_reset(id, Reason::DuplicateOpen);
            self.charge_handshake(now);
            return;
        }
        self.closed_streams.remove(&id);
        let cooling_down = self.opens_refused_until.is_some_and(|t| now < t);
        let refusal = if cooling_down || self.pending_opens >= self.cfg.max_pending_opens {
            Some(Reason::Busy)
        } else if self.streams.len() >= self.cfg.max_streams {
            Some(Reason::TooManyStreams)
        } else {
            None
        };
        if let Some(reason) = refusal {
            self.counters.dropped(DropReason::RefusedOpen);
            self.send_reset(id, reason);
            return;
        }
        let mut s = Stream::new(StreamState::Pending, self.cfg.window);
        // Rules checked ack == 0 and window > 0: this cannot fail.
        let _ = s.send.on_report(0, f.window);
        self.streams.insert(id, s);
        self.pending_opens += 1;
        self.events.push_back(Event::OpenRequested {
            stream: id,
            flags: f.flags,
            payload: f.payload,
        });
    }

    fn on_accept(&mut self, now: Instant, f: Frame) {
        let id = f.stream;
        let Some(s) = self.streams.get_mut(&id) else {
            self.unknown(now, &f);
            return;
        };
        if s.state != StreamState::Opening {
            self.local_reset(id, Reason::MalformedFrame);
            return;
        }
        let _ = s.send.on_report(0, f.window);
        s.state = StreamState::Open;
        self.events.push_back(Event::Accepted {
            stream: id,
            payload: f.payload,
        });
    }

    fn on_data(&mut self, now: Instant, f: Frame) {
        let id = f.stream;
        let Some(s) = self.streams.get_mut(&id) else {
            self.unknown(now, &f);
            return;
        };
        match s.state {
            StreamState::Pending => {
                // Early DATA while the handshake is pending: a handshake failure (§8).
                self.local_reset(id, Reason::DataBeforeAccept);
                self.charge_handshake(now);
                return;
            }
            StreamState::Opening => {
                // The server sends nothing before ACCEPT, and the link is ordered.
                self.local_reset(id, Reason::MalformedFrame);
                return;
            }
            StreamState::Open | StreamState::Finishing(_) => {}
        }
        if !self.apply_report(&id, f.ack, f.window) {
            return;
        }
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        if matches!(s.state, StreamState::Finishing(_)) {
            self.counters.dropped(DropReason::ClosedStream);
            return;
        }
        match s.recv.on_data(f.seq) {
            Ok(()) => {
                self.counters.data_bytes_in += f.payload.len() as u64;
                self.events.push_back(Event::Data {
                    stream: id,
                    seq: f.seq,
                    payload: f.payload,
                });
            }
            Err(crate::flow::FlowError::WindowExceeded { .. }) => {
                self.local_reset(id, Reason::WindowExceeded);
            }
            Err(_) => self.local_reset(id, Reason::MalformedFrame),
        }
    }

    fn on_ack(&mut self, now: Instant, f: Frame) {
        if !self.streams.contains_key(&f.stream) {
            self.unknown(now, &f);
            return;
        }
        self.apply_report(&f.stream, f.ack, f.window);
    }

    fn on_reset(&mut self, now: Instant, f: Frame) {
        let id = f.stream;
        let Some(s) = self.streams.remove(&id) else {
            self.unknown(now, &f);
            return;
        };
        if s.state == StreamState::Pending {
            self.pending_opens = self.pending_opens.saturating_sub(1);
        }
        if s.link_woken {
            self.link_woken -= 1;
        }
        self.queued_data_bytes -= s.queued_bytes();
        self.wake_link_waiters();
        self.closed_streams.insert(id);
        self.counters.peer_resets += 1;
        self.events.push_back(Event::Reset {
            stream: id,
            cause: ResetCause::Peer(reason_text(&f.payload)),
        });
    }

    /// The peer's (`ack`, `window`) for our sending direction. False if it broke a rule (the
    /// stream is reset).
    fn apply_report(&mut self, id: &StreamId, ack: u64, window: u32) -> bool {
        let Some(s) = self.streams.get_mut(id) else {
            return false;
        };
        if matches!(s.state, StreamState::Opening | StreamState::Pending) {
            // Before ACCEPT the only report is the initial window; a peer acking nothing is
            // harmless, one acking records we never sent is not.
            if ack != 0 {
                self.local_reset(*id, Reason::MalformedFrame);
                return false;
            }
            return true;
        }
        match s.send.on_report(ack, window) {
            Ok(_) => {
                self.maybe_writable(id, false);
                true
            }
            Err(_) => {
                self.local_reset(*id, Reason::MalformedFrame);
                false
            }
        }
    }
}

fn reason_text(payload: &Bytes) -> String {
    String::from_utf8_lossy(payload).into_owned()
}
