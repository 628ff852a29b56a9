//! The endpoint role of a link (exec server and client), sans-IO: the stream table, flow
//! control, budgets and keepalive of one physical link, driven quinn-proto style.
//!
//! - In: [`Endpoint::handle_frame`] (one binary WebSocket message), [`Endpoint::handle_pong`],
//!   [`Endpoint::handle_timeout`], and the application's calls (`open`, `accept`, `send`,
//!   `consumed`, `reset`, …).
//! - Out: [`Endpoint::poll_transmit`] (frames and pings for the writer, control first),
//!   [`Endpoint::poll_timeout`] (the next deadline), [`Endpoint::poll_event`] (what the
//!   application must know).
//!
//! It owns no socket, no clock and no task, and never looks inside a payload: handshake
//! messages and records are opaque bytes, so the same engine runs under the exec server,
//! the client and (through [`crate::router`]) beside the relay, which holds no keys.
//!
//! # Stream states
//!
//! ```text
//! client:  open() ──OPEN──▶ Opening ──ACCEPT──▶ Open ──finish()──▶ Finishing ──last DATA──▶ closed
//! server:  OPEN ──▶ Pending (Event::OpenRequested) ──accept()──▶ Open ──…
//! any state ──RESET in / reset() / a broken rule──▶ closed (id remembered in the closed set)
//! ```
//!
//! # Invariants
//!
//! - A record is never sent past the peer's `ack + window`, and a record past ours resets
//!   that stream alone (`window_exceeded`).
//! - Every outgoing frame of a live stream carries its current `ack` and `window`; a bare
//!   `ACK` goes out once half a window was consumed since the last report.
//! - Control frames (`OPEN`, `ACCEPT`, `RESET`, then `ACK`s) leave before any `DATA`; `DATA` is
//!   served round robin between streams.
//! - Established streams never pay for another stream's misbehaviour: budgets close the whole
//!   link or refuse new `OPEN`s, and never reset a stream that broke no rule.
//! - A stream refused for want of room in the link's send queue hears `Writable` once there is
//!   room, oldest waiter first, and only as many waiters at a time as the room takes (one
//!   frame each, counted until the stream asks to send again, sends, finishes or goes): one
//!   frame leaving wakes one writer, not every writer of the link. An empty queue tells
//!   every waiter, so a told stream that never asks cannot hold the others back.

mod event;
mod flow_report;
mod inbound;
mod outbound;
mod stream;

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use bytes::Bytes;

pub use event::{Event, ResetCause, SendError, UseError};
pub use flow_report::{RecvFlow, StreamFlow};
use stream::Stream;
pub use stream::StreamState;

use crate::bucket::TokenBucket;
use crate::closed_set::ClosedSet;
use crate::config::{ConfigError, EndpointConfig};
use crate::frame::{Frame, FrameType, StreamId, HEADER_BYTES, LINK_STREAM, MAX_PAYLOAD_BYTES};
use crate::keepalive::Keepalive;
use crate::reason::{CloseReason, Counters, Reason};

/// Which end of the link this is: the client opens streams, the server accepts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// Sends `OPEN`, receives `ACCEPT`.
    Client,
    /// Receives `OPEN`, sends `ACCEPT`.
    Server,
}

/// One endpoint of a physical link.
#[derive(Debug)]
pub struct Endpoint {
    side: Side,
    cfg: EndpointConfig,
    streams: HashMap<StreamId, Stream>,
    closed_streams: ClosedSet,
    /// `OPEN`, `ACCEPT`, `RESET`, oldest first.
    control: VecDeque<Frame>,
    /// Streams owing a bare `ACK`.
    acks: VecDeque<StreamId>,
    /// Streams with queued records, round robin.
    ready: VecDeque<StreamId>,
    /// Streams that were refused `send_ready` for want of send-queue room.
    link_waiters: VecDeque<StreamId>,
    /// Streams told `Writable` by the queue that have not asked to send since
    /// (`Stream::link_woken`).
    link_woken: usize,
    queued_data_bytes: usize,
    pending_opens: usize,
    events: VecDeque<Event>,
    handshake_failures: TokenBucket,
    opens_refused_until: Option<Instant>,
    malformed: TokenBucket,
    unknown: TokenBucket,
    keepalive: Keepalive,
    counters: Counters,
    closed: Option<CloseReason>,
}

impl Endpoint {
    /// A new link at `now`. `seed` drives the keepalive jitter (any value; a random one in
    /// production, a fixed one in tests).
    pub fn new(
        side: Side,
        cfg: EndpointConfig,
        now: Instant,
        seed: u64,
    ) -> Result<Self, ConfigError> {
        cfg.validate()?;
        Ok(Endpoint {
            side,
            streams: HashMap::new(),
            closed_streams: ClosedSet::new(cfg.closed_streams_remembered),
            control: VecDeque::new(),
            acks: VecDeque::new(),
            ready: VecDeque::new(),
            link_waiters: VecDeque::new(),
            link_woken: 0,
            queued_data_bytes: 0,
            pending_opens: 0,
            events: VecDeque::new(),
            handshake_failures: TokenBucket::new(cfg.handshake_failures, now),
            opens_refused_until: None,
            malformed: TokenBucket::new(cfg.malformed_frames, now),
            unknown: TokenBucket::new(cfg.unknown_stream_frames, now),
            keepalive: Keepalive::new(cfg.keepalive, now, seed),
            counters: Counters::default(),
            closed: None,
            cfg,
        })
    }

    /// This end's side.
    pub fn side(&self) -> Side {
        self.side
    }

    /// Settings.
    pub fn config(&self) -> &EndpointConfig {
        &self.cfg
    }

    /// Why the link closed, once it has.
    pub fn is_closed(&self) -> Option<CloseReason> {
        self.closed
    }

    /// Counters of resets, drops and frames.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Streams held (any state).
    pub fn stream_count(&self) -> usize {
        self.streams.len()
    }

    /// A stream's state, if held.
    pub fn stream_state(&self, stream: &StreamId) -> Option<StreamState> {
        self.streams.get(stream).map(|s| s.state)
    }

    /// Records `stream` may send now (window credit only).
    pub fn credit(&self, stream: &StreamId) -> u64 {
        self.streams.get(stream).map_or(0, |s| s.send.credit())
    }

    /// The flow-control state of `stream`'s sending direction, for a watchdog's account of a
    /// stream that sends nothing (never used to decide anything).
    pub fn stream_flow(&self, stream: &StreamId) -> Option<StreamFlow> {
        let s = self.streams.get(stream)?;
        let (acked, window) = s.send.reported();
        Some(StreamFlow {
            sent: s.send.sent(),
            acked,
            window,
            credit: s.send.credit(),
            queued_records: s.out.len(),
            link_queued_bytes: self.queued_data_bytes,
            link_has_room: self.queued_data_bytes < self.cfg.send_queue_bytes,
            waiting: s.wants_writable,
        })
    }

    /// One stream's receiving direction, or `None` if it is not in the table.
    pub fn stream_recv_flow(&self, stream: &StreamId) -> Option<RecvFlow> {
        let s = self.streams.get(stream)?;
        Some(RecvFlow {
            received: s.recv.received(),
            consumed: s.recv.consumed(),
            reported: s.recv.reported(),
            window: s.recv.window(),
            queued_records: s.recv.received().saturating_sub(s.recv.consumed()) as usize,
        })
    }

    /// `DATA` bytes queued for the writer.
    pub fn queued_data_bytes(&self) -> usize {
        self.queued_data_bytes
    }

    /// The next event for the application.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    // ---- the application's calls ------------------------------------------------------

    /// Client: open `stream` (16 random bytes, not 0) with handshake message 1 as payload,
    /// flags 0 (Noise suite 0).
    pub fn open(&mut self, stream: StreamId, payload: Bytes) -> Result<(), UseError> {
        self.open_with_flags(stream, 0, payload)
    }

    /// Client: open `stream` with `flags` on the `OPEN` (the Noise suite in bits 0–1,
    /// [`OPEN_SUITE_MASK`](crate::frame::OPEN_SUITE_MASK); other bits are refused as
    /// [`UseError::BadFlags`]).
    pub fn open_with_flags(
        &mut self,
        stream: StreamId,
        flags: u16,
        payload: Bytes,
    ) -> Result<(), UseError> {
        if flags & !crate::frame::OPEN_SUITE_MASK != 0 {
            return Err(UseError::BadFlags);
        }
        self.usable()?;
        if self.side != Side::Client {
            return Err(UseError::WrongSide);
        }
        if stream == LINK_STREAM {
            return Err(UseError::LinkStream);
        }
        if payload.len() > MAX_PAYLOAD_BYTES {
            return Err(UseError::TooLarge);
        }
        if self.streams.contains_key(&stream) {
            return Err(UseError::Exists);
        }
        if self.streams.len() >= self.cfg.max_streams {
            return Err(UseError::TooManyStreams);
        }
        self.closed_streams.remove(&stream);
        self.streams
            .insert(stream, Stream::new(StreamState::Opening, self.cfg.window));
        let mut open = Frame::new(FrameType::Open, stream, 0, payload);
        open.window = self.cfg.window;
        open.flags = flags;
        self.push_control(open);
        Ok(())
    }

    /// Server: accept a pending stream with handshake message 2 as payload.
    pub fn accept(&mut self, stream: StreamId, payload: Bytes) -> Result<(), UseError> {
        self.usable()?;
        if self.side != Side::Server {
            return Err(UseError::WrongSide);
        }
        if payload.len() > MAX_PAYLOAD_BYTES {
            return Err(UseError::TooLarge);
        }
        let s = self
            .streams
            .get_mut(&stream)
            .ok_or(UseError::UnknownStream)?;
        if s.state != StreamState::Pending {
            return Err(UseError::WrongState);
        }
        s.state = StreamState::Open;
        self.pending_opens = self.pending_opens.saturating_sub(1);
        let mut accept = Frame::new(FrameType::Accept, stream, 0, payload);
        accept.window = self.cfg.window;
        self.push_control(accept);
        Ok(())
    }

    /// Server: refuse a pending stream (busy, limits): `RESET` with `reason`, not charged.
    pub fn refuse(&mut self, stream: StreamId, reason: Reason) -> Result<(), UseError> {
        self.pending_only(&stream)?;
        self.remove_and_reset(stream, reason);
        Ok(())
    }

    /// Server: the handshake of a pending stream failed (bad message 1, refused
    /// authorization): `RESET` with `reason`, charged to the handshake-failure bucket (§8).
    pub fn handshake_failed(
        &mut self,
        now: Instant,
        stream: StreamId,
        reason: Reason,
    ) -> Result<(), UseError> {
        self.pending_only(&stream)?;
        self.remove_and_reset(stream, reason);
        self.charge_handshake(now);
        Ok(())
    }

    /// Whether `stream` may send now; if not, [`Event::Writable`] follows once it may.
    /// Returns the `seq` the next record gets, so a caller can seal it with that nonce before
    /// [`send`](Self::send). This is the admission check for the link's send queue.
    pub fn send_ready(&mut self, stream: &StreamId) -> Result<u64, SendError> {
        if self.closed.is_some() {
            return Err(SendError::LinkClosed);
        }
        let ready = self.check_send_ready(stream);
        if ready.is_err() {
            // Woken by the queue and still cannot send: not its room after all. (Admitted,
            // it keeps the room until `send` fills it.)
            self.link_wake_spent(stream);
        }
        ready
    }

    fn check_send_ready(&mut self, stream: &StreamId) -> Result<u64, SendError> {
        let over = self.queued_data_bytes >= self.cfg.send_queue_bytes;
        let s = self.streams.get_mut(stream).ok_or(SendError::NotOpen)?;
        if s.state != StreamState::Open {
            return Err(SendError::NotOpen);
        }
        if s.send.credit() == 0 || over {
            s.wants_writable = true;
            if over && !s.in_link_waiters {
                s.in_link_waiters = true;
                self.link_waiters.push_back(*stream);
            }
            return Err(SendError::Blocked);
        }
        Ok(s.send.next_seq())
    }

    /// Queue one record on `stream`; returns its `seq`. Checks the window only, so a record
    /// prepared after [`send_ready`](Self::send_ready) said yes is always taken (the send
    /// queue may overshoot its limit by one record per stream).
    pub fn send(&mut self, stream: &StreamId, payload: Bytes) -> Result<u64, SendError> {
        if self.closed.is_some() {
            return Err(SendError::LinkClosed);
        }
        if payload.len() > MAX_PAYLOAD_BYTES {
            return Err(SendError::TooLarge);
        }
        let queued = self.queue_record(stream, payload);
        // Its room is filled now (or it was refused): no longer counted as about to be.
        self.link_wake_spent(stream);
        queued
    }

    fn queue_record(&mut self, stream: &StreamId, payload: Bytes) -> Result<u64, SendError> {
        let s = self.streams.get_mut(stream).ok_or(SendError::NotOpen)?;
        if s.state != StreamState::Open {
            return Err(SendError::NotOpen);
        }
        let Some(seq) = s.send.take() else {
            s.wants_writable = true;
            return Err(SendError::Blocked);
        };
        self.queued_data_bytes += HEADER_BYTES + payload.len();
        s.out.push_back((seq, payload));
        if !s.in_ready {
            s.in_ready = true;
            self.ready.push_back(*stream);
        }
        Ok(seq)
    }

    /// The application has every record of `stream` up to `seq` (cumulative). A bare `ACK`
    /// is queued once half a window was consumed since the last report.
    pub fn consumed(&mut self, stream: &StreamId, seq: u64) -> Result<(), UseError> {
        self.usable()?;
        let s = self
            .streams
            .get_mut(stream)
            .ok_or(UseError::UnknownStream)?;
        let due = s.recv.consume(seq).ok_or(UseError::NotReceived)?;
        if due && !s.in_acks {
            s.in_acks = true;
            self.acks.push_back(*stream);
        }
        Ok(())
    }

    /// Reset `stream` now: its queued records are dropped and `RESET` with `reason` goes out.
    pub fn reset(&mut self, stream: StreamId, reason: Reason) -> Result<(), UseError> {
        self.usable()?;
        if !self.streams.contains_key(&stream) {
            return Err(UseError::UnknownStream);
        }
        self.remove_and_reset(stream, reason);
        Ok(())
    }

    /// Finish `stream`: its queued records go out, then `RESET` with `reason` (how the exec
    /// server follows an authenticated close record). Inbound records are dropped from now on.
    pub fn finish(&mut self, stream: StreamId, reason: Reason) -> Result<(), UseError> {
        self.usable()?;
        let s = self
            .streams
            .get_mut(&stream)
            .ok_or(UseError::UnknownStream)?;
        if s.out.is_empty() {
            self.remove_and_reset(stream, reason);
        } else {
            s.state = StreamState::Finishing(reason);
            // It sends nothing more: the room counted as its own is the others'.
            self.link_wake_spent(&stream);
        }
        Ok(())
    }

    /// End the link (the application's wish, or its driver saw the socket end).
    pub fn close(&mut self, reason: CloseReason) {
        self.close_link(reason);
    }

    // ---- timers and keepalive ----------------------------------------------------------

    /// When [`handle_timeout`](Self::handle_timeout) must next be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.closed.is_some() {
            return None;
        }
        self.keepalive.poll_timeout()
    }

    /// Advance timers to `now`: a ping may become due, or the link dead.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.closed.is_some() {
            return;
        }
        self.keepalive.handle_timeout(now);
        if self.keepalive.is_dead() {
            self.close_link(CloseReason::KeepaliveTimeout);
        }
    }

    /// A WebSocket pong arrived with `payload`.
    pub fn handle_pong(&mut self, _now: Instant, payload: &[u8]) {
        self.keepalive.on_pong(payload);
    }

    /// How long a write may take before the driver kills the link.
    pub fn write_timeout(&self) -> std::time::Duration {
        self.cfg.keepalive.write_timeout
    }

    // ---- internals ---------------------------------------------------------------------

    fn usable(&self) -> Result<(), UseError> {
        match self.closed {
            Some(_) => Err(UseError::LinkClosed),
            None => Ok(()),
        }
    }

    fn pending_only(&self, stream: &StreamId) -> Result<(), UseError> {
        self.usable()?;
        if self.side != Side::Server {
            return Err(UseError::WrongSide);
        }
        match self.streams.get(stream) {
            None => Err(UseError::UnknownStream),
            Some(s) if s.state != StreamState::Pending => Err(UseError::WrongState),
            Some(_) => Ok(()),
        }
    }

    fn push_control(&mut self, f: Frame) {
        if self.control.len() >= self.cfg.control_queue_frames {
            self.close_link(CloseReason::ControlQueueFull);
            return;
        }
        self.control.push_back(f);
    }

    /// Send `RESET` for a stream we hold nothing for (or no longer), counted.
    fn send_reset(&mut self, stream: StreamId, reason: Reason) {
        self.counters.reset(reason);
        self.closed_streams.insert(stream);
        self.push_control(Frame::reset(stream, reason.as_str()));
    }

    /// Drop a stream and everything it queued; `RESET` goes out. No event.
    fn remove_and_reset(&mut self, stream: StreamId, reason: Reason) {
        if let Some(s) = self.streams.remove(&stream) {
            if s.state == StreamState::Pending {
                self.pending_opens = self.pending_opens.saturating_sub(1);
            }
            if s.link_woken {
                self.link_woken -= 1;
            }
            self.queued_data_bytes -= s.queued_bytes();
            self.wake_link_waiters();
        }
        self.send_reset(stream, reason);
    }

    /// The peer broke a rule on `stream`: reset it alone and tell the application.
    fn local_reset(&mut self, stream: StreamId, reason: Reason) {
        self.remove_and_reset(stream, reason);
        self.events.push_back(Event::Reset {
            stream,
            cause: ResetCause::Local(reason),
        });
    }

    /// Charge the handshake-failure bucket (§8); an empty bucket refuses new `OPEN`s for a
    /// cool-down or closes the link, as configured.
    fn charge_handshake(&mut self, now: Instant) {
        self.handshake_failures.take(now);
        if self.handshake_failures.remaining(now) > 0 {
            return;
        }
        match self.cfg.on_handshake_budget_empty {
            crate::config::HandshakeBudgetPolicy::RefuseOpens { cooldown } => {
                self.opens_refused_until = Some(now + cooldown);
            }
            crate::config::HandshakeBudgetPolicy::CloseLink => {
                self.close_link(CloseReason::HandshakeBudget);
            }
        }
    }

    fn close_link(&mut self, reason: CloseReason) {
        if self.closed.is_some() {
            return;
        }
        self.closed = Some(reason);
        self.counters.closed(reason);
        self.streams.clear();
        self.control.clear();
        self.acks.clear();
        self.ready.clear();
        self.link_waiters.clear();
        self.link_woken = 0;
        self.queued_data_bytes = 0;
        self.events.push_back(Event::Closed { reason });
    }
}
