//! Records and the message stream inside a Noise channel (`secure-transport.md` §4), sans-IO.
//!
//! A record is one Noise transport message encrypted with an explicit nonce: record `n` of a
//! direction uses nonce `n`, from 1. Its plaintext is a kind byte and a body: kind 0 carries
//! stream bytes, kind 1 is the authenticated close with a reason. The stream bytes carry
//! JSON-RPC messages, each behind a 4-byte big-endian length, cut into records at any point.
//! This module never logs plaintext.
//!
//! The bytes of an unfinished message are charged to a [`ReassemblyBudget`] before the
//! deframer grows it (on the exec server, the link's byte budget under the server's;
//! [`Unlimited`] on a client): a message that cannot get its bytes fails its stream
//! ([`RecordError::OverBudget`]) and nothing else. A completed message keeps its charge until the caller takes it
//! ([`RecordOpener::take_charge`], to hand it on with the message until its consumer has it)
//! or opens the next record (then it is given back).

use super::budget::{BudgetCharge, OverBudget, ReassemblyBudget, Unlimited};
use super::handshake::TransportKeys;

/// Noise tag length.
pub const TAG_BYTES: usize = 16;
/// Largest record plaintext: 65,535 − 16 (tag) − 1 (kind) bytes of body.
pub const MAX_RECORD_BODY: usize = 65_535 - TAG_BYTES - 1;
/// Longest authenticated-close reason, in bytes.
pub const MAX_CLOSE_REASON: usize = 256;
/// Records below the highest seen by more than this are refused as too old; within it, each
/// nonce is accepted once. Records arrive in order on one link; the window allows for the
/// retransmissions of the reliability layer.
pub const REPLAY_WINDOW: u64 = 128;
/// Kind byte of stream bytes.
pub const KIND_STREAM: u8 = 0;
/// Kind byte of the authenticated close.
pub const KIND_CLOSE: u8 = 1;

/// A record that cannot be accepted. Only the stream it arrived on is affected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    /// Failed authentication (tampered, or not ours).
    #[error("record failed to decrypt")]
    Decrypt,
    /// A nonce seen before, or older than the window.
    #[error("replayed or stale record {0}")]
    Replay(u64),
    /// Nonce 0 is never used.
    #[error("record number 0 is invalid")]
    ZeroNonce,
    /// Unknown kind byte, or an empty plaintext.
    #[error("bad record kind")]
    BadKind,
    /// A message length prefix of 0 or over the limit.
    #[error("message length {0} out of range")]
    BadLength(u64),
    /// The record would be too large, or the nonce space is exhausted.
    #[error("record cannot be sealed")]
    Seal,
    /// A message longer than its 4-byte length prefix can declare.
    #[error("message of {0} bytes is too long for a length prefix")]
    MessageTooLong(usize),
    /// An unfinished message could not get the bytes it needs from its budget (the link's or
    /// the server's): its stream is reset, the others go on.
    #[error("unfinished message over budget: {0}")]
    OverBudget(OverBudget),
}

/// The 4-byte big-endian length prefix of a message (`secure-transport.md` §4), refused for a
/// message whose length does not fit in it rather than truncated.
pub fn length_prefix(len: usize) -> Result<[u8; 4], RecordError> {
    u32::try_from(len)
        .map(u32::to_be_bytes)
        .map_err(|_| RecordError::MessageTooLong(len))
}

/// What a record carried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// Stream bytes.
    Stream(Vec<u8>),
    /// Authenticated close with its reason.
    Close(String),
}

/// The sending half: numbers and encrypts records.
pub struct RecordSealer {
    keys: TransportKeys,
    next: u64,
}

impl RecordSealer {
    /// A sealer whose first record is number 1.
    pub fn new(keys: TransportKeys) -> Self {
        RecordSealer { keys, next: 1 }
    }

    /// The next record number, checked against exhaustion.
    fn number(&self) -> Result<u64, RecordError> {
        match self.next {
            u64::MAX => Err(RecordError::Seal),
            n => Ok(n),
        }
    }

    /// Encrypt one record; returns its number and ciphertext.
    pub fn seal(&mut self, kind: u8, body: &[u8]) -> Result<(u64, Vec<u8>), RecordError> {
        if body.len() > MAX_RECORD_BODY {
            return Err(RecordError::Seal);
        }
        let n = self.number()?;
        let mut out = Vec::with_capacity(1 + body.len() + TAG_BYTES);
        out.push(kind);
        out.extend_from_slice(body);
        let tag = self
            .keys
            .seal_in_place(n, &mut out)
            .map_err(|_| RecordError::Seal)?;
        out.extend_from_slice(tag.as_ref());
        self.next += 1;
        Ok((n, out))
    }

    /// Seal one JSON-RPC message straight into `DATA` frames for `stream` (header, then
    /// ciphertext): each plaintext byte is copied once, into the frame that carries it, and
    /// encrypted there. The hot path of every encrypted byte.
    pub fn seal_message_frames(
        &mut self,
        stream: &crate::frame::StreamId,
        msg: &[u8],
    ) -> Result<Vec<Vec<u8>>, RecordError> {
        self.seal_message_parts(stream, &[msg])
    }

    /// Seal one message made of `parts` (their bytes in order, as one message behind one
    /// length prefix) straight into `DATA` frames, like
    /// [`seal_message_frames`](Self::seal_message_frames): a binary output message's small
    /// head and its chunk are copied once each, into the frames, never joined first.
    pub fn seal_message_parts(
        &mut self,
        stream: &crate::frame::StreamId,
        parts: &[&[u8]],
    ) -> Result<Vec<Vec<u8>>, RecordError> {
        use crate::frame::{Frame, FrameType, HEADER_BYTES};
        let len = parts
            .iter()
            .try_fold(0usize, |sum, p| sum.checked_add(p.len()))
            .ok_or(RecordError::MessageTooLong(usize::MAX))?;
        let prefix = length_prefix(len)?;
        let total = 4 + len;
        let mut frames = Vec::with_capacity(total / MAX_RECORD_BODY + 1);
        // The virtual stream `prefix ++ parts[0] ++ parts[1] ++ …`, consumed front to back.
        let mut pieces = std::iter::once(&prefix[..]).chain(parts.iter().copied());
        let mut current: &[u8] = &[];
        let mut off = 0usize;
        while off < total {
            let n = self.number()?;
            let take = (total - off).min(MAX_RECORD_BODY);
            let mut frame = Vec::with_capacity(HEADER_BYTES + 1 + take + TAG_BYTES);
            let mut head = [0u8; HEADER_BYTES];
            Frame::write_header(&mut head, FrameType::Data, stream, n, 0, 0, 0);
            frame.extend_from_slice(&head);
            frame.push(KIND_STREAM);
            let mut need = take;
            while need > 0 {
                if current.is_empty() {
                    // `total` counts exactly the pieces' bytes, so they cannot run out first.
                    let Some(next) = pieces.next() else { break };
                    current = next;
                    continue;
                }
                let k = need.min(current.len());
                frame.extend_from_slice(&current[..k]);
                current = &current[k..];
                need -= k;
            }
            let tag = self
                .keys
                .seal_in_place(n, &mut frame[HEADER_BYTES..])
                .map_err(|_| RecordError::Seal)?;
            frame.extend_from_slice(tag.as_ref());
            self.next += 1;
            frames.push(frame);
            off += take;
        }
        Ok(frames)
    }

    /// Seal one JSON-RPC message: length-prefixed, cut into as many records as needed.
    pub fn seal_message(&mut self, msg: &[u8]) -> Result<Vec<(u64, Vec<u8>)>, RecordError> {
        let prefix = length_prefix(msg.len())?;
        let mut stream = Vec::with_capacity(4 + msg.len());
        stream.extend_from_slice(&prefix);
        stream.extend_from_slice(msg);
        stream
            .chunks(MAX_RECORD_BODY)
            .map(|c| self.seal(KIND_STREAM, c))
            .collect()
    }

    /// Seal the authenticated close.
    pub fn seal_close(&mut self, reason: &str) -> Result<(u64, Vec<u8>), RecordError> {
        let mut end = reason.len().min(MAX_CLOSE_REASON);
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        self.seal(KIND_CLOSE, &reason.as_bytes()[..end])
    }
}

/// Accepts each nonce once, within a window below the highest seen.
#[derive(Debug, Default, Clone)]
pub struct ReplayWindow {
    highest: u64,
    /// Bit i: nonce `highest - i` was seen.
    seen: u128,
}

impl ReplayWindow {
    /// Whether `n` may be accepted (does not record it).
    pub fn check(&self, n: u64) -> Result<(), RecordError> {
        if n == 0 {
            return Err(RecordError::ZeroNonce);
        }
        if n > self.highest {
            return Ok(());
        }
        let age = self.highest - n;
        if age >= REPLAY_WINDOW || self.seen & (1u128 << age) != 0 {
            return Err(RecordError::Replay(n));
        }
        Ok(())
    }

    /// Record `n` as seen. Call only after it authenticated, so forgeries cannot poison it.
    pub fn mark(&mut self, n: u64) {
        if n > self.highest {
            let shift = n - self.highest;
            self.seen = if shift >= REPLAY_WINDOW {
                0
            } else {
                self.seen << shift
            };
            self.highest = n;
            self.seen |= 1;
        } else {
            let age = self.highest - n;
            if age < REPLAY_WINDOW {
                self.seen |= 1u128 << age;
            }
        }
    }

    /// Highest nonce accepted.
    pub fn highest(&self) -> u64 {
        self.highest
    }
}

/// The receiving half: decrypts records, refuses replays, reassembles messages, charging
/// unfinished ones to a budget of type `B`.
pub struct RecordOpener<B: ReassemblyBudget = Unlimited> {
    keys: TransportKeys,
    window: ReplayWindow,
    deframer: MessageDeframer<B>,
    /// Reused for records that arrive in a shared buffer and must be copied to be decrypted.
    scratch: Vec<u8>,
}

impl RecordOpener {
    /// An opener refusing messages over `max_message_bytes`, holding unfinished ones without
    /// a budget (a client, whose server's messages are bounded by its own requests).
    pub fn new(keys: TransportKeys, max_message_bytes: usize) -> Self {
        Self::with_budget(keys, max_message_bytes, Unlimited)
    }
}

impl<B: ReassemblyBudget> RecordOpener<B> {
    /// An opener whose unfinished messages are charged to `budget` (on the exec server: the
    /// link's reassembly budget, a child of the server's inbound budget). A record whose
    /// message cannot grow within it fails with [`RecordError::OverBudget`].
    pub fn with_budget(keys: TransportKeys, max_message_bytes: usize, budget: B) -> Self {
        RecordOpener {
            keys,
            window: ReplayWindow::default(),
            deframer: MessageDeframer::with_budget(max_message_bytes, budget),
            scratch: Vec::new(),
        }
    }

    /// Decrypt record `n` and return what it completes: whole messages, or a close.
    pub fn open(&mut self, n: u64, ciphertext: &[u8]) -> Result<Opened, RecordError> {
        let mut buf = std::mem::take(&mut self.scratch);
        buf.clear();
        buf.extend_from_slice(ciphertext);
        let r = self.open_in_place(n, &mut buf);
        self.scratch = buf;
        r
    }

    /// Like [`open`](Self::open), decrypting in the frame's own buffer when nothing else
    /// holds it (the usual case: the link reader owns each frame it decoded).
    pub fn open_owned(&mut self, n: u64, payload: bytes::Bytes) -> Result<Opened, RecordError> {
        match payload.try_into_mut() {
            Ok(mut owned) => self.open_in_place(n, &mut owned),
            Err(shared) => self.open(n, &shared),
        }
    }

    /// Decrypt record `n` in `buf` (ciphertext ‖ tag); the plaintext is consumed at once.
    pub fn open_in_place(&mut self, n: u64, buf: &mut [u8]) -> Result<Opened, RecordError> {
        self.window.check(n)?;
        if buf.len() < TAG_BYTES + 1 {
            return Err(RecordError::Decrypt);
        }
        let plain = self
            .keys
            .open_in_place(n, buf)
            .map_err(|_| RecordError::Decrypt)?;
        self.window.mark(n);
        match plain.first() {
            Some(&KIND_STREAM) => Ok(Opened::Messages(self.deframer.push(&plain[1..])?)),
            Some(&KIND_CLOSE) => Ok(Opened::Close(
                String::from_utf8_lossy(&plain[1..plain.len().min(1 + MAX_CLOSE_REASON)])
                    .into_owned(),
            )),
            _ => Err(RecordError::BadKind),
        }
    }

    /// Highest record number accepted (the cumulative ack of the reliability layer).
    pub fn highest(&self) -> u64 {
        self.window.highest()
    }

    /// The charge of the oldest message the last opened record completed (and not yet
    /// taken), in the order of [`Opened::Messages`]; nothing once they are all taken. Keep it
    /// with the message until its consumer holds it: charges not taken are given back when
    /// the next record is opened.
    pub fn take_charge(&mut self) -> B::Charge {
        self.deframer.take_charge()
    }
}

/// What an opened record completed.
#[derive(Debug, PartialEq, Eq)]
pub enum Opened {
    /// Zero or more whole JSON-RPC messages.
    Messages(Vec<Vec<u8>>),
    /// The peer closed the stream on purpose.
    Close(String),
}

/// Most bytes reserved for a message when its length prefix arrives; a larger message grows
/// as its bytes arrive, so a declared length alone never commits memory.
pub const MAX_MESSAGE_RESERVE: usize = 1 << 20;

/// Reassembles length-prefixed messages from stream bytes. A length of 0 or over the limit is
/// refused as soon as its prefix is read, before any of the message is buffered. Each byte is
/// copied once, into the message it belongs to. The unfinished message's capacity is charged
/// to the deframer's budget before it is allocated, and given back when it is complete.
#[derive(Debug)]
pub struct MessageDeframer<B: ReassemblyBudget = Unlimited> {
    max: usize,
    prefix: [u8; 4],
    prefix_len: usize,
    /// The message being assembled and its declared length.
    partial: Option<(Vec<u8>, usize)>,
    budget: B,
    /// The partial message's capacity, held against `budget`.
    charge: B::Charge,
    /// The charges of the messages the last `push` completed, oldest first, until taken.
    completed: std::collections::VecDeque<B::Charge>,
}

impl MessageDeframer {
    /// A deframer refusing messages over `max` bytes, without a budget.
    pub fn new(max: usize) -> Self {
        Self::with_budget(max, Unlimited)
    }
}

impl<B: ReassemblyBudget> MessageDeframer<B> {
    /// A deframer refusing messages over `max` bytes and charging unfinished ones to
    /// `budget`.
    pub fn with_budget(max: usize, budget: B) -> Self {
        MessageDeframer {
            max,
            prefix: [0; 4],
            prefix_len: 0,
            partial: None,
            budget,
            charge: B::Charge::default(),
            completed: std::collections::VecDeque::new(),
        }
    }

    /// The charge of the oldest message the last `push` completed that was not yet taken.
    pub fn take_charge(&mut self) -> B::Charge {
        self.completed.pop_front().unwrap_or_default()
    }

    /// Bytes of unfinished message held (and charged) now.
    pub fn held_bytes(&self) -> usize {
        self.charge.bytes()
    }

    /// Add stream bytes; returns the messages they complete.
    pub fn push(&mut self, mut bytes: &[u8]) -> Result<Vec<Vec<u8>>, RecordError> {
        // Charges of earlier messages nobody took: their messages are the caller's now.
        self.completed.clear();
        let mut out = Vec::new();
        while !bytes.is_empty() {
            match self.partial.take() {
                Some((mut msg, want)) => {
                    let take = (want - msg.len()).min(bytes.len());
                    if msg.capacity() - msg.len() < take {
                        // Grow by doubling, but never past the declared length; charged
                        // before it is allocated.
                        let target = (msg.len() * 2).max(msg.len() + take).min(want);
                        let grow = target.saturating_sub(msg.capacity());
                        if let Err(e) = self.charge.try_grow(grow) {
                            self.partial = Some((msg, want));
                            return Err(RecordError::OverBudget(e));
                        }
                        msg.reserve_exact(target - msg.len());
                    }
                    msg.extend_from_slice(&bytes[..take]);
                    bytes = &bytes[take..];
                    if msg.len() == want {
                        out.push(msg);
                        // Complete: its charge goes with it, until the caller takes it.
                        self.completed.push_back(std::mem::take(&mut self.charge));
                    } else {
                        self.partial = Some((msg, want));
                    }
                }
                None => {
                    let take = (4 - self.prefix_len).min(bytes.len());
                    self.prefix[self.prefix_len..self.prefix_len + take]
                        .copy_from_slice(&bytes[..take]);
                    self.prefix_len += take;
                    bytes = &bytes[take..];
                    if self.prefix_len == 4 {
                        self.prefix_len = 0;
                        let declared = u32::from_be_bytes(self.prefix);
                        let len = match usize::try_from(declared) {
                            Ok(len) if len != 0 && len <= self.max => len,
                            _ => return Err(RecordError::BadLength(u64::from(declared))),
                        };
                        let reserve = len.min(MAX_MESSAGE_RESERVE);
                        self.charge = self
                            .budget
                            .try_charge(reserve)
                            .map_err(RecordError::OverBudget)?;
                        self.partial = Some((Vec::with_capacity(reserve), len));
                    }
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests;
