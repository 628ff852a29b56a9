//! Frames on a physical link: a 44-byte big-endian header and a payload, one frame per binary
//! WebSocket message.
//!
//! Sans-IO: [`Frame::decode`] and [`Frame::encode`] only. It owns the header layout and the
//! size limit; it never looks inside a payload (a handshake message, a ciphertext, or a reset
//! reason), which is what lets a relay route frames it cannot read.

use bytes::Bytes;

/// Frame format version.
pub const FRAME_VERSION: u8 = 1;
/// Header length.
pub const HEADER_BYTES: usize = 44;
/// Largest payload: one Noise message (65,535 bytes, tag included).
pub const MAX_PAYLOAD_BYTES: usize = 65_535;
/// Largest frame: header plus one Noise message. A larger WebSocket message is a protocol
/// error, rejected before it is buffered whole.
pub const MAX_FRAME_BYTES: usize = HEADER_BYTES + MAX_PAYLOAD_BYTES;
/// Longest `RESET` reason, in bytes.
pub const MAX_RESET_REASON_BYTES: usize = 256;
/// Length of a stream id.
pub const STREAM_ID_BYTES: usize = 16;

/// The bits of an `OPEN` frame's flags that carry the Noise suite (§3, §5): the relay passes
/// them unchanged, and an endpoint reads them with [`Frame::suite_bits`].
pub const OPEN_SUITE_MASK: u16 = 0b11;

/// A decoded frame keeps the message it came from for [`Frame::into_wire`] only from this
/// payload size: below it, copying the payload costs less than the kept handle.
pub const KEEP_WIRE_FROM_BYTES: usize = 1024;

/// A stream id: 16 random bytes chosen by the client.
pub type StreamId = [u8; STREAM_ID_BYTES];

/// Stream id 0 (all zero bytes): the link's own, used only by the environment link's
/// handshake (§6.2) before the link carries streams; never a virtual stream, never routed.
pub const LINK_STREAM: StreamId = [0; STREAM_ID_BYTES];

/// Frame types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FrameType {
    /// Handshake message 1 (client → server).
    Open = 1,
    /// Handshake message 2 (server → client).
    Accept = 2,
    /// One encrypted record; `seq` is its record number.
    Data = 3,
    /// Acknowledgement only (reliability layer).
    Ack = 4,
    /// The stream is gone (unauthenticated); payload is a reason.
    Reset = 5,
    /// Resume a stream after a link change (reliability layer).
    Resume = 6,
}

impl FrameType {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => FrameType::Open,
            2 => FrameType::Accept,
            3 => FrameType::Data,
            4 => FrameType::Ack,
            5 => FrameType::Reset,
            6 => FrameType::Resume,
            _ => return None,
        })
    }
}

/// A frame that cannot be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// Shorter than the header.
    #[error("truncated frame: {0} bytes, the header alone is 44")]
    Truncated(usize),
    /// Over [`MAX_FRAME_BYTES`].
    #[error("frame of {0} bytes exceeds the limit of {MAX_FRAME_BYTES}")]
    TooLarge(usize),
    /// Version other than 1.
    #[error("unsupported frame version {0}")]
    BadVersion(u8),
    /// Type byte not in the table.
    #[error("unknown frame type {0}")]
    UnknownType(u8),
    /// Flags must be 0 in version 1, except the suite bits of an `OPEN`
    /// ([`OPEN_SUITE_MASK`]).
    #[error("flags {0:#06x} not allowed on this frame (only an OPEN carries flags: bits 0-1, the Noise suite)")]
    BadFlags(u16),
    /// A `RESET` reason over 256 bytes.
    #[error("reset reason too long")]
    ReasonTooLong,
}

/// A message that does not decode as a frame ([`Frame::decode_bytes_named`]): why, and, when
/// it has a whole version-1 header, its type byte (possibly unknown) and stream id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Undecodable {
    /// Why it does not decode.
    pub error: FrameError,
    /// `(type byte, stream id)` as the header reads, if it is a whole version-1 header.
    pub named: Option<(u8, StreamId)>,
}

/// A frame that decodes but breaks a rule of §5–§7 about its fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RuleError {
    /// `ack bits` must be 0 (§5).
    #[error("nonzero ack bits")]
    AckBits,
    /// `RESUME` (type 6) is reserved (§5).
    #[error("RESUME is reserved")]
    Resume,
    /// `seq` is the record number of `DATA` and 0 on every other frame.
    #[error("seq on a frame other than DATA")]
    SeqOutsideData,
    /// `DATA` records are numbered from 1.
    #[error("DATA with seq 0")]
    ZeroSeq,
    /// `OPEN` and `ACCEPT` carry the initial window, which is never 0 (§7).
    #[error("zero initial window")]
    ZeroInitialWindow,
    /// `OPEN` and `ACCEPT` come before any record, so they acknowledge none.
    #[error("nonzero ack on OPEN or ACCEPT")]
    InitialAck,
    /// Stream id 0 is the link's own.
    #[error("stream id 0 outside the link handshake")]
    LinkStream,
}

/// One frame.
///
/// A frame decoded from an owned message ([`decode_owned`](Self::decode_owned),
/// [`decode_bytes`](Self::decode_bytes)) remembers the message it came from, and
/// [`into_wire`](Self::into_wire) hands that message back instead of copying the payload
/// into a new one, as long as its fields and payload are still what was read (checked each
/// time, so changing a field simply costs the copy). This is how a relay forwards a frame's
/// bytes without touching them. Equality ignores it.
#[derive(Clone)]
pub struct Frame {
    /// Type.
    pub ftype: FrameType,
    /// Flags: on `OPEN`, bits 0–1 are the Noise suite ([`OPEN_SUITE_MASK`]); 0 on every
    /// other frame (checked by [`decode`](Self::decode)). A relay forwards them unchanged.
    pub flags: u16,
    /// Stream id.
    pub stream: StreamId,
    /// `DATA`: the record number; otherwise 0.
    pub seq: u64,
    /// Highest record number received in order from the peer on this stream.
    pub ack: u64,
    /// Bit i acknowledges record `ack + 2 + i`.
    pub ack_bits: u32,
    /// How many records past `ack` the sender of this frame will accept.
    pub window: u32,
    /// Handshake message, ciphertext, or reset reason.
    pub payload: Bytes,
    /// The whole message this frame was decoded from, if its payload is at least
    /// [`KEEP_WIRE_FROM_BYTES`]: `payload` is a slice of it while nothing changed. Boxed, so
    /// that the frame itself stays within `QUEUED_FRAME_OVERHEAD_BYTES` (`config.rs` checks
    /// it); the box (48 bytes with its allocation) is under 5 % of such a frame's bytes.
    wire: Option<Box<Bytes>>,
}

impl PartialEq for Frame {
    fn eq(&self, o: &Frame) -> bool {
        self.ftype == o.ftype
            && self.flags == o.flags
            && self.stream == o.stream
            && self.seq == o.seq
            && self.ack == o.ack
            && self.ack_bits == o.ack_bits
            && self.window == o.window
            && self.payload == o.payload
    }
}

impl Eq for Frame {}

impl std::fmt::Debug for Frame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Frame")
            .field("ftype", &self.ftype)
            .field("flags", &self.flags)
            .field("stream", &self.stream)
            .field("seq", &self.seq)
            .field("ack", &self.ack)
            .field("ack_bits", &self.ack_bits)
            .field("window", &self.window)
            .field("payload", &self.payload)
            .finish()
    }
}

/// One frame's bytes on the wire, in at most two pieces ([`Frame::into_wire_parts`]).
#[derive(Debug, Clone)]
pub enum WireParts {
    /// The whole message, as it arrived.
    Whole(Bytes),
    /// The header, then the payload.
    Split([u8; HEADER_BYTES], Bytes),
}

impl WireParts {
    /// Bytes in all.
    pub fn len(&self) -> usize {
        match self {
            WireParts::Whole(b) => b.len(),
            WireParts::Split(h, p) => h.len() + p.len(),
        }
    }

    /// Never: a frame has a header.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Frame {
    /// A frame with zeroed reliability fields.
    pub fn new(ftype: FrameType, stream: StreamId, seq: u64, payload: Bytes) -> Self {
        Frame {
            ftype,
            flags: 0,
            stream,
            seq,
            ack: 0,
            ack_bits: 0,
            window: 0,
            payload,
            wire: None,
        }
    }

    /// A `RESET` with a reason (truncated to 256 bytes on a character boundary).
    pub fn reset(stream: StreamId, reason: &str) -> Self {
        let mut end = reason.len().min(MAX_RESET_REASON_BYTES);
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        Frame::new(
            FrameType::Reset,
            stream,
            0,
            Bytes::copy_from_slice(&reason.as_bytes()[..end]),
        )
    }

    /// Decode one frame from an owned message (a `Vec` or the WebSocket's own `Bytes`)
    /// without copying its payload; the message is kept for [`into_wire`](Self::into_wire).
    pub fn decode_owned(msg: impl Into<Bytes>) -> Result<Frame, FrameError> {
        Frame::decode_bytes(msg.into())
    }

    /// [`decode_owned`](Self::decode_owned) from shared bytes.
    pub fn decode_bytes(msg: Bytes) -> Result<Frame, FrameError> {
        Frame::decode_bytes_named(msg).map_err(|bad| bad.error)
    }

    /// [`decode_bytes`](Self::decode_bytes), and on failure what the message names, where its
    /// header can be read (see [`Undecodable`]): so a relay can answer a frame it cannot
    /// decode on the stream it was meant for. Costs nothing more on success.
    pub fn decode_bytes_named(msg: Bytes) -> Result<Frame, Undecodable> {
        match Frame::decode_header(&msg) {
            Ok(mut f) => {
                f.payload = msg.slice(HEADER_BYTES..);
                if f.payload.len() >= KEEP_WIRE_FROM_BYTES {
                    f.wire = Some(Box::new(msg));
                }
                Ok(f)
            }
            Err(error) => {
                // Only a whole version-1 header has its fields where this version puts them.
                let readable = (HEADER_BYTES..=MAX_FRAME_BYTES).contains(&msg.len())
                    && msg[0] == FRAME_VERSION;
                let named = readable.then(|| {
                    let mut stream = LINK_STREAM;
                    stream.copy_from_slice(&msg[4..4 + STREAM_ID_BYTES]);
                    (msg[1], stream)
                });
                Err(Undecodable { error, named })
            }
        }
    }

    /// Drop the payload (and the message it came from): what a queued `ACK` keeps.
    pub fn drop_payload(&mut self) {
        self.payload = Bytes::new();
        self.wire = None;
    }

    /// Decode one frame (one whole WebSocket message).
    pub fn decode(msg: &[u8]) -> Result<Frame, FrameError> {
        let mut f = Frame::decode_header(msg)?;
        f.payload = Bytes::copy_from_slice(&msg[HEADER_BYTES..]);
        Ok(f)
    }

    /// Write the 44-byte header of a frame with `payload_len` bytes of payload into `out`.
    pub fn write_header(
        out: &mut [u8; HEADER_BYTES],
        ftype: FrameType,
        stream: &StreamId,
        seq: u64,
        ack: u64,
        ack_bits: u32,
        window: u32,
    ) {
        out[0] = FRAME_VERSION;
        out[1] = ftype as u8;
        out[2] = 0;
        out[3] = 0;
        out[4..20].copy_from_slice(stream);
        out[20..28].copy_from_slice(&seq.to_be_bytes());
        out[28..36].copy_from_slice(&ack.to_be_bytes());
        out[36..40].copy_from_slice(&ack_bits.to_be_bytes());
        out[40..44].copy_from_slice(&window.to_be_bytes());
    }

    /// Everything but the payload (left empty), validated.
    fn decode_header(msg: &[u8]) -> Result<Frame, FrameError> {
        if msg.len() > MAX_FRAME_BYTES {
            return Err(FrameError::TooLarge(msg.len()));
        }
        if msg.len() < HEADER_BYTES {
            return Err(FrameError::Truncated(msg.len()));
        }
        if msg[0] != FRAME_VERSION {
            return Err(FrameError::BadVersion(msg[0]));
        }
        let ftype = FrameType::from_u8(msg[1]).ok_or(FrameError::UnknownType(msg[1]))?;
        let flags = u16::from_be_bytes([msg[2], msg[3]]);
        let allowed = if ftype == FrameType::Open {
            OPEN_SUITE_MASK
        } else {
            0
        };
        if flags & !allowed != 0 {
            return Err(FrameError::BadFlags(flags));
        }
        let mut stream = [0u8; STREAM_ID_BYTES];
        stream.copy_from_slice(&msg[4..20]);
        let be64 = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&msg[at..at + 8]);
            u64::from_be_bytes(b)
        };
        let be32 = |at: usize| {
            let mut b = [0u8; 4];
            b.copy_from_slice(&msg[at..at + 4]);
            u32::from_be_bytes(b)
        };
        let payload = &msg[HEADER_BYTES..];
        if ftype == FrameType::Reset && payload.len() > MAX_RESET_REASON_BYTES {
            return Err(FrameError::ReasonTooLong);
        }
        Ok(Frame {
            ftype,
            flags,
            stream,
            seq: be64(20),
            ack: be64(28),
            ack_bits: be32(36),
            window: be32(40),
            payload: Bytes::new(),
            wire: None,
        })
    }

    /// This frame's 44-byte header.
    fn header(&self) -> [u8; HEADER_BYTES] {
        let mut header = [0u8; HEADER_BYTES];
        Frame::write_header(
            &mut header,
            self.ftype,
            &self.stream,
            self.seq,
            self.ack,
            self.ack_bits,
            self.window,
        );
        header[2..4].copy_from_slice(&self.flags.to_be_bytes());
        header
    }

    /// Encode into one WebSocket message.
    pub fn encode(&self) -> Result<Vec<u8>, FrameError> {
        let len = HEADER_BYTES + self.payload.len();
        if len > MAX_FRAME_BYTES {
            return Err(FrameError::TooLarge(len));
        }
        // One copy of the payload, straight into the message.
        let mut b = Vec::with_capacity(len);
        b.extend_from_slice(&self.header());
        b.extend_from_slice(&self.payload);
        Ok(b)
    }

    /// Whether the message this frame was decoded from still says exactly what the frame
    /// says: same header bytes, and the payload is the message's own tail.
    fn wire_is_current(&self) -> bool {
        self.wire.as_ref().is_some_and(|w| {
            w.len() == HEADER_BYTES + self.payload.len()
                && w[HEADER_BYTES..].as_ptr() == self.payload.as_ptr()
                && w[..HEADER_BYTES] == self.header()
        })
    }

    /// Encode into one WebSocket message, consuming the frame: the message it was decoded
    /// from when that is still current (no copy: every forwarded byte's path through the
    /// relay), else a new one ([`encode`](Self::encode)). When nothing else shares the
    /// message, `Vec::from` on the result takes its buffer back without a copy.
    pub fn into_wire(mut self) -> Result<Bytes, FrameError> {
        if self.wire_is_current() {
            if let Some(wire) = self.wire.take() {
                // Give up the payload's share first, so the message is held once.
                drop(std::mem::take(&mut self.payload));
                return Ok(*wire);
            }
        }
        self.encode().map(Bytes::from)
    }

    /// The frame as the pieces of one WebSocket message, for a vectored write: the message
    /// it was decoded from when that is still current (what a relay forwards), else its
    /// header and its payload, neither copied into the other.
    pub fn into_wire_parts(mut self) -> Result<WireParts, FrameError> {
        let len = self.wire_len();
        if len > MAX_FRAME_BYTES {
            return Err(FrameError::TooLarge(len));
        }
        if self.wire_is_current() {
            if let Some(wire) = self.wire.take() {
                drop(std::mem::take(&mut self.payload));
                return Ok(WireParts::Whole(*wire));
            }
        }
        Ok(WireParts::Split(
            self.header(),
            std::mem::take(&mut self.payload),
        ))
    }

    /// Check the field rules of a virtual stream's frame (§5, §7): what a relay or an
    /// endpoint enforces beyond the layout [`decode`](Self::decode) checks.
    pub fn check_rules(&self) -> Result<(), RuleError> {
        if self.stream == LINK_STREAM {
            return Err(RuleError::LinkStream);
        }
        if self.ack_bits != 0 {
            return Err(RuleError::AckBits);
        }
        match self.ftype {
            FrameType::Resume => return Err(RuleError::Resume),
            FrameType::Data if self.seq == 0 => return Err(RuleError::ZeroSeq),
            FrameType::Data => {}
            _ if self.seq != 0 => return Err(RuleError::SeqOutsideData),
            _ => {}
        }
        if matches!(self.ftype, FrameType::Open | FrameType::Accept) {
            if self.window == 0 {
                return Err(RuleError::ZeroInitialWindow);
            }
            if self.ack != 0 {
                return Err(RuleError::InitialAck);
            }
        }
        Ok(())
    }

    /// The Noise suite number an `OPEN` carries (bits 0–1 of its flags; 0 on other frames).
    /// What the number means is the endpoints' business: a relay never reads it.
    pub fn suite_bits(&self) -> u16 {
        self.flags & OPEN_SUITE_MASK
    }

    /// The size of this frame on the link.
    pub fn wire_len(&self) -> usize {
        HEADER_BYTES + self.payload.len()
    }

    /// The reason of a `RESET`, lossily decoded.
    pub fn reset_reason(&self) -> String {
        String::from_utf8_lossy(&self.payload).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Frame {
        Frame {
            ftype: FrameType::Data,
            flags: 0,
            stream: *b"0123456789abcdef",
            seq: 7,
            ack: 5,
            ack_bits: 0b101,
            window: 64,
            payload: Bytes::from_static(b"ciphertext"),
            wire: None,
        }
    }

    #[test]
    fn round_trip() {
        let f = sample();
        let bytes = f.encode().unwrap();
        assert_eq!(bytes.len(), HEADER_BYTES + 10);
        assert_eq!(Frame::decode(&bytes).unwrap(), f);
        assert_eq!(Frame::decode_owned(bytes.clone()).unwrap(), f);
        let mut h = [0u8; HEADER_BYTES];
        Frame::write_header(
            &mut h, f.ftype, &f.stream, f.seq, f.ack, f.ack_bits, f.window,
        );
        assert_eq!(&bytes[..HEADER_BYTES], &h[..]);
    }

    #[test]
    fn golden_bytes_match_the_fixture() {
        // fixtures/frames/data.hex: the sample frame, byte for byte.
        let hex = include_str!("../../fixtures/frames/data.hex");
        let hex: String = hex.split_whitespace().collect();
        let golden: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        assert_eq!(sample().encode().unwrap(), golden);
        assert_eq!(Frame::decode(&golden).unwrap(), sample());
    }

    #[test]
    fn rejects_bad_frames() {
        let good = sample().encode().unwrap();
        assert_eq!(Frame::decode(&good[..43]), Err(FrameError::Truncated(43)));
        let mut v = good.clone();
        v[0] = 2;
        assert_eq!(Frame::decode(&v), Err(FrameError::BadVersion(2)));
        let mut v = good.clone();
        v[1] = 9;
        assert_eq!(Frame::decode(&v), Err(FrameError::UnknownType(9)));
        let mut v = good.clone();
        v[3] = 1;
        assert_eq!(Frame::decode(&v), Err(FrameError::BadFlags(1)));
        // An OPEN carries the suite in bits 0-1 and nothing else.
        let mut open = Frame::new(FrameType::Open, [1; 16], 0, Bytes::from_static(b"m1"));
        open.window = 16;
        for suite in 0..=3u16 {
            open.flags = suite;
            let bytes = open.encode().unwrap();
            assert_eq!(&bytes[2..4], &suite.to_be_bytes());
            let back = Frame::decode(&bytes).unwrap();
            assert_eq!(back.suite_bits(), suite);
            assert_eq!(back, open);
        }
        for bad in [4u16, 0x8000, 0x0105] {
            let mut v = open.encode().unwrap();
            v[2..4].copy_from_slice(&bad.to_be_bytes());
            assert_eq!(Frame::decode(&v), Err(FrameError::BadFlags(bad)));
        }
        // Suite bits are an OPEN's alone.
        let mut v = Frame::new(FrameType::Accept, [1; 16], 0, Bytes::new())
            .encode()
            .unwrap();
        v[3] = 1;
        assert_eq!(Frame::decode(&v), Err(FrameError::BadFlags(1)));
        let big = vec![0u8; MAX_FRAME_BYTES + 1];
        assert_eq!(
            Frame::decode(&big),
            Err(FrameError::TooLarge(MAX_FRAME_BYTES + 1))
        );
        let mut r = Frame::reset([0; 16], "x").encode().unwrap();
        r.extend_from_slice(&[b'y'; 256]);
        assert_eq!(Frame::decode(&r), Err(FrameError::ReasonTooLong));
    }

    #[test]
    fn max_frame_is_accepted_and_one_more_byte_is_not() {
        let f = Frame::new(
            FrameType::Data,
            [1; 16],
            1,
            Bytes::from(vec![0u8; MAX_PAYLOAD_BYTES]),
        );
        let bytes = f.encode().unwrap();
        assert_eq!(bytes.len(), MAX_FRAME_BYTES);
        assert!(Frame::decode(&bytes).is_ok());
        let f = Frame::new(
            FrameType::Data,
            [1; 16],
            1,
            Bytes::from(vec![0u8; MAX_PAYLOAD_BYTES + 1]),
        );
        assert!(f.encode().is_err());
    }

    #[test]
    fn field_rules() {
        let ok = |f: Frame| f.check_rules();
        let mut open = Frame::new(FrameType::Open, [1; 16], 0, Bytes::new());
        open.window = 16;
        assert_eq!(ok(open.clone()), Ok(()));
        assert_eq!(ok(sample()), Err(RuleError::AckBits));
        let mut f = sample();
        f.ack_bits = 0;
        assert_eq!(ok(f.clone()), Ok(()));
        f.seq = 0;
        assert_eq!(ok(f), Err(RuleError::ZeroSeq));
        let mut o = open.clone();
        o.window = 0;
        assert_eq!(ok(o), Err(RuleError::ZeroInitialWindow));
        let mut o = open.clone();
        o.ack = 1;
        assert_eq!(ok(o), Err(RuleError::InitialAck));
        let mut o = open.clone();
        o.seq = 1;
        assert_eq!(ok(o), Err(RuleError::SeqOutsideData));
        let mut o = open.clone();
        o.stream = LINK_STREAM;
        assert_eq!(ok(o), Err(RuleError::LinkStream));
        let r = Frame::new(FrameType::Resume, [1; 16], 0, Bytes::new());
        assert_eq!(ok(r), Err(RuleError::Resume));
        assert_eq!(ok(Frame::reset([1; 16], "x")), Ok(()));
    }

    #[test]
    fn reset_reason_is_capped_on_a_char_boundary() {
        let long = "é".repeat(200); // 400 bytes
        let f = Frame::reset([0; 16], &long);
        assert!(f.payload.len() <= MAX_RESET_REASON_BYTES);
        assert!(std::str::from_utf8(&f.payload).is_ok());
    }

    #[test]
    fn an_unchanged_decoded_frame_goes_out_as_the_message_it_came_from() {
        let mut big = sample();
        big.payload = Bytes::from(vec![7u8; KEEP_WIRE_FROM_BYTES]);
        let msg = big.encode().unwrap();
        let sent = msg.clone();
        let at = sent.as_ptr();
        let f = Frame::decode_owned(sent).unwrap();
        let out = Vec::from(f.into_wire().unwrap());
        // The same buffer, taken back whole: no copy of the payload, no allocation.
        assert_eq!(out.as_ptr(), at);
        assert_eq!(out, msg);
    }

    #[test]
    fn a_changed_field_or_payload_is_encoded_anew() {
        let mut big = sample();
        big.payload = Bytes::from(vec![7u8; KEEP_WIRE_FROM_BYTES]);
        let msg = big.encode().unwrap();
        // Unchanged: the same bytes (and the same buffer: the test above).
        assert_eq!(
            &Frame::decode_owned(msg.clone())
                .unwrap()
                .into_wire()
                .unwrap()[..],
            &msg[..]
        );
        let mut f = Frame::decode_owned(msg.clone()).unwrap();
        f.window = 9;
        let out = f.into_wire().unwrap();
        assert_ne!(&out[..], &msg[..]);
        assert_eq!(Frame::decode(&out).unwrap().window, 9);
        assert_eq!(Frame::decode(&out).unwrap().payload, big.payload);

        let mut f = Frame::decode_owned(msg.clone()).unwrap();
        f.payload = Bytes::from_static(b"other");
        let out = f.into_wire().unwrap();
        assert_eq!(Frame::decode(&out).unwrap().payload, &b"other"[..]);

        // A shorter slice of the same message is a different payload too.
        let mut f = Frame::decode_owned(msg.clone()).unwrap();
        f.payload = f.payload.slice(1..);
        let out = f.into_wire().unwrap();
        assert_eq!(
            Frame::decode(&out).unwrap().payload,
            &vec![7u8; KEEP_WIRE_FROM_BYTES - 1][..]
        );

        // Built, never decoded: encoded.
        assert_eq!(&big.into_wire().unwrap()[..], &msg[..]);
        // A small frame keeps no message: encoded, the same bytes.
        let small = sample().encode().unwrap();
        let f = Frame::decode_owned(small.clone()).unwrap();
        assert_eq!(&f.into_wire().unwrap()[..], &small[..]);
    }

    #[test]
    fn equality_and_dropping_the_payload_ignore_the_kept_message() {
        let mut big = sample();
        big.payload = Bytes::from(vec![7u8; KEEP_WIRE_FROM_BYTES]);
        let mut f = Frame::decode_owned(big.encode().unwrap()).unwrap();
        assert_eq!(f, big);
        f.drop_payload();
        assert!(f.payload.is_empty());
        let out = f.into_wire().unwrap();
        assert_eq!(out.len(), HEADER_BYTES);
        assert_eq!(Frame::decode(&out).unwrap().seq, 7);
    }
}
