//! The send queue of one relay link: a control lane served first, one coalesced `ACK` per
//! stream, then `DATA` round robin between streams.
//!
//! Bounds (the [`Router`](super::Router) enforces the admissions): `DATA` of a stream is
//! admitted only inside the receiver's window, so a stream never holds more than one window
//! here; `ACCEPT`, `RESET` and the coalesced `ACK` are at most one each per stream; `OPEN`
//! is admitted only while the control lane is under its reserve.
//!
//! Every frame is counted at its memory cost ([`cost`]: wire bytes plus
//! [`QUEUED_FRAME_OVERHEAD_BYTES`]), so that small frames are counted at what they hold.
//!
//! Order: a stream's `DATA` frames leave in arrival order. A `RESET` forwarded from a sender
//! waits behind that sender's queued `DATA` ([`OutQueue::push_reset_after_data`]), so that the
//! last records (an authenticated close) are not overtaken. `ACK`s may overtake `DATA`; both
//! carry monotonic reports, and receivers keep the highest.

use std::collections::{HashMap, VecDeque};

use crate::config::QUEUED_FRAME_OVERHEAD_BYTES;
use crate::frame::{Frame, StreamId, HEADER_BYTES};

/// What `f` costs while queued: its wire bytes and [`QUEUED_FRAME_OVERHEAD_BYTES`].
pub(crate) fn cost(f: &Frame) -> usize {
    f.wire_len() + QUEUED_FRAME_OVERHEAD_BYTES
}

/// What a queued `ACK` costs (its payload is dropped).
const ACK_COST: usize = HEADER_BYTES + QUEUED_FRAME_OVERHEAD_BYTES;

#[derive(Debug, Default)]
struct StreamOut {
    frames: VecDeque<Frame>,
    bytes: usize,
    /// A `RESET` to send once `frames` is empty.
    then: Option<Frame>,
    in_ready: bool,
}

/// One link's send queue.
#[derive(Debug, Default)]
pub(crate) struct OutQueue {
    control: VecDeque<Frame>,
    control_bytes: usize,
    acks: VecDeque<StreamId>,
    ack_frames: HashMap<StreamId, Frame>,
    data: HashMap<StreamId, StreamOut>,
    ready: VecDeque<StreamId>,
    bytes: usize,
    /// The part of `bytes` that is `DATA`.
    data_bytes: usize,
}

impl OutQueue {
    /// Bytes queued (all lanes).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Bytes in the control lane.
    pub fn control_bytes(&self) -> usize {
        self.control_bytes
    }

    /// Bytes of everything but `DATA`: control frames, `ACK`s, `RESET`s waiting behind their
    /// stream's `DATA` (what a client link's share holds).
    pub fn non_data_bytes(&self) -> usize {
        self.bytes - self.data_bytes
    }

    /// `DATA` bytes queued for `stream`.
    pub fn stream_bytes(&self, stream: &StreamId) -> usize {
        self.data.get(stream).map_or(0, |d| d.bytes)
    }

    /// `DATA` frames queued for `stream` (records the relay forwarded that have not left).
    pub fn stream_frames(&self, stream: &StreamId) -> usize {
        self.data.get(stream).map_or(0, |d| d.frames.len())
    }

    /// Whether anything waits.
    pub fn is_empty(&self) -> bool {
        self.control.is_empty() && self.acks.is_empty() && self.ready.is_empty()
    }

    /// `OPEN`, `ACCEPT` or `RESET`, after the control frames already queued. Returns the
    /// bytes added.
    pub fn push_control(&mut self, f: Frame) -> usize {
        let n = cost(&f);
        self.control_bytes += n;
        self.bytes += n;
        self.control.push_back(f);
        n
    }

    /// An `ACK` (payload dropped: an `ACK` carries none). Replaces a queued `ACK` of the same
    /// stream, whose report is older. Returns the bytes added.
    pub fn push_ack(&mut self, mut f: Frame) -> usize {
        f.drop_payload();
        if let Some(q) = self.ack_frames.get_mut(&f.stream) {
            *q = f;
            return 0;
        }
        self.acks.push_back(f.stream);
        self.ack_frames.insert(f.stream, f);
        self.bytes += ACK_COST;
        ACK_COST
    }

    /// What [`push_ack`](Self::push_ack) of a frame for `stream` would add.
    pub fn ack_cost(&self, stream: &StreamId) -> usize {
        if self.ack_frames.contains_key(stream) {
            0
        } else {
            ACK_COST
        }
    }

    /// A `DATA` frame (admitted by the window check). Returns the bytes added.
    pub fn push_data(&mut self, f: Frame) -> usize {
        let n = cost(&f);
        let id = f.stream;
        let d = self.data.entry(id).or_default();
        d.frames.push_back(f);
        d.bytes += n;
        if !d.in_ready {
            d.in_ready = true;
            self.ready.push_back(id);
        }
        self.bytes += n;
        self.data_bytes += n;
        n
    }

    /// A `RESET` that must not overtake the stream's queued `DATA`. Returns the bytes added.
    pub fn push_reset_after_data(&mut self, f: Frame) -> usize {
        if let Some(d) = self.data.get_mut(&f.stream) {
            if !d.frames.is_empty() {
                let n = cost(&f);
                if let Some(old) = d.then.replace(f) {
                    self.bytes -= cost(&old);
                }
                self.bytes += n;
                return n;
            }
        }
        self.push_control(f)
    }

    /// Forget everything queued for `stream` (it was reset). Returns the bytes freed.
    pub fn drop_stream(&mut self, stream: &StreamId) -> usize {
        let mut freed = 0;
        if let Some(d) = self.data.remove(stream) {
            self.data_bytes -= d.bytes;
            freed += d.bytes + d.then.map_or(0, |f| cost(&f));
        }
        if self.ack_frames.remove(stream).is_some() {
            freed += ACK_COST;
        }
        self.bytes -= freed;
        freed
    }

    /// The next frame: control, then `ACK`s, then one `DATA` of the next stream in turn.
    pub fn pop(&mut self) -> Option<Frame> {
        if let Some(f) = self.control.pop_front() {
            let n = cost(&f);
            self.control_bytes -= n;
            self.bytes -= n;
            return Some(f);
        }
        while let Some(id) = self.acks.pop_front() {
            if let Some(f) = self.ack_frames.remove(&id) {
                self.bytes -= ACK_COST;
                return Some(f);
            }
        }
        while let Some(id) = self.ready.pop_front() {
            let Some(d) = self.data.get_mut(&id) else {
                continue;
            };
            d.in_ready = false;
            let Some(f) = d.frames.pop_front() else {
                continue;
            };
            let n = cost(&f);
            d.bytes -= n;
            self.bytes -= n;
            self.data_bytes -= n;
            if !d.frames.is_empty() {
                d.in_ready = true;
                self.ready.push_back(id);
            } else {
                let then = d.then.take();
                self.data.remove(&id);
                if let Some(r) = then {
                    // Already counted in `bytes`: move it to the control lane's share.
                    self.control_bytes += cost(&r);
                    self.control.push_back(r);
                }
            }
            return Some(f);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::FrameType;
    use bytes::Bytes;

    fn data(s: u8, seq: u64) -> Frame {
        Frame::new(FrameType::Data, [s; 16], seq, Bytes::from(vec![s; 10]))
    }

    fn ack(s: u8, ack: u64) -> Frame {
        let mut f = Frame::new(FrameType::Ack, [s; 16], 0, Bytes::new());
        f.ack = ack;
        f.window = 16;
        f
    }

    #[test]
    fn control_then_acks_then_data_round_robin() {
        let mut q = OutQueue::default();
        q.push_data(data(1, 1));
        q.push_data(data(1, 2));
        q.push_data(data(2, 1));
        q.push_ack(ack(3, 1));
        q.push_ack(ack(3, 5)); // coalesced: the newer report wins
        q.push_control(Frame::reset([4; 16], "busy"));
        let order: Vec<_> = std::iter::from_fn(|| q.pop())
            .map(|f| (f.ftype, f.stream[0], f.seq, f.ack))
            .collect();
        assert_eq!(
            order,
            vec![
                (FrameType::Reset, 4, 0, 0),
                (FrameType::Ack, 3, 0, 5),
                (FrameType::Data, 1, 1, 0),
                (FrameType::Data, 2, 1, 0),
                (FrameType::Data, 1, 2, 0),
            ]
        );
        assert_eq!(q.bytes(), 0);
        assert_eq!(q.control_bytes(), 0);
    }

    #[test]
    fn a_forwarded_reset_waits_behind_its_streams_data_and_drop_frees_everything() {
        let mut q = OutQueue::default();
        q.push_data(data(1, 1));
        q.push_reset_after_data(Frame::reset([1; 16], "closed"));
        q.push_control(Frame::reset([2; 16], "busy"));
        let order: Vec<_> = std::iter::from_fn(|| q.pop())
            .map(|f| (f.ftype, f.stream[0]))
            .collect();
        assert_eq!(
            order,
            vec![
                (FrameType::Reset, 2),
                (FrameType::Data, 1),
                (FrameType::Reset, 1)
            ]
        );
        assert_eq!(q.bytes(), 0);

        q.push_data(data(5, 1));
        q.push_ack(ack(5, 1));
        q.push_reset_after_data(Frame::reset([5; 16], "closed"));
        assert!(q.bytes() > 0);
        assert_eq!(
            q.stream_bytes(&[5; 16]),
            HEADER_BYTES + 10 + QUEUED_FRAME_OVERHEAD_BYTES
        );
        assert_eq!(q.non_data_bytes(), q.bytes() - q.stream_bytes(&[5; 16]));
        q.drop_stream(&[5; 16]);
        assert_eq!(q.bytes(), 0);
        assert_eq!(q.non_data_bytes(), 0);
        assert!(q.pop().is_none());
        assert!(q.is_empty());
    }
}
