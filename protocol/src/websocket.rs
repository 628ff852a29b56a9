//! RFC 6455 framing of a link, sans-IO: the WebSocket frames a link's driver reads and writes
//! once the HTTP upgrade is done.
//!
//! Owns: parsing frame headers and every rule a peer can break in them (reserved bits,
//! opcodes, masking by role, control frames' size and fragmentation, the frame and message
//! size limit, checked from the header before the payload is buffered), reassembling
//! fragmented messages, the close frame's payload (code and UTF-8 reason), and formatting
//! headers and masks for the frames a link sends. [`Boundaries`] tells a reader where frames
//! (and the HTTP head before them) end, so a WebSocket library reading above it never holds
//! bytes past the message it returned.
//!
//! Never: reads or writes a socket, allocates per frame on the read path (payloads are
//! [`Bytes`] slices of the read buffer, unmasked in place), or keeps a peer's words (a close
//! reason is handed up; the driver keeps only reasons of its own).
//!
//! ```text
//! let mut d = Decoder::new(Role::Server, max_message);
//! // the driver reads the socket into d.read_buffer(), then:
//! while let Some(msg) = d.decode()? { /* Binary(Bytes) | Ping | Pong | Close | Text */ }
//! let n = encode_header(&mut hdr, Opcode::Binary, payload.len(), None);
//! // writev([hdr[..n], payload])
//! ```

use bytes::{Buf, Bytes, BytesMut};

/// The longest frame header: 2 bytes, 8 of extended length, 4 of mask.
pub const MAX_HEADER_BYTES: usize = 14;

/// The largest payload of a control frame (ping, pong, close), RFC 6455 §5.5.
pub const MAX_CONTROL_PAYLOAD: usize = 125;

/// Which end of the WebSocket this is: a client masks what it sends and must receive
/// unmasked frames; a server the other way round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Dialled the connection (sends masked frames).
    Client,
    /// Accepted it (sends unmasked frames, requires masked ones).
    Server,
}

/// A frame's opcode (the ones RFC 6455 defines; any other is refused).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opcode {
    /// The next fragment of a message.
    Continuation,
    /// A UTF-8 text message.
    Text,
    /// A binary message (a link frame).
    Binary,
    /// The closing handshake.
    Close,
    /// A ping.
    Ping,
    /// A pong.
    Pong,
}

impl Opcode {
    fn from_bits(b: u8) -> Option<Opcode> {
        Some(match b {
            0x0 => Opcode::Continuation,
            0x1 => Opcode::Text,
            0x2 => Opcode::Binary,
            0x8 => Opcode::Close,
            0x9 => Opcode::Ping,
            0xA => Opcode::Pong,
            _ => return None,
        })
    }

    fn bits(self) -> u8 {
        match self {
            Opcode::Continuation => 0x0,
            Opcode::Text => 0x1,
            Opcode::Binary => 0x2,
            Opcode::Close => 0x8,
            Opcode::Ping => 0x9,
            Opcode::Pong => 0xA,
        }
    }

    /// Ping, pong and close.
    pub fn is_control(self) -> bool {
        matches!(self, Opcode::Close | Opcode::Ping | Opcode::Pong)
    }
}

/// Close codes a link sends and checks (RFC 6455 §7.4.1).
pub mod close_code {
    /// Normal closure.
    pub const NORMAL: u16 = 1000;
    /// The endpoint is going away.
    pub const AWAY: u16 = 1001;
    /// A protocol error.
    pub const PROTOCOL: u16 = 1002;
    /// Data of a type the endpoint does not accept.
    pub const UNSUPPORTED: u16 = 1003;
    /// Data inconsistent with its type (text that is not UTF-8).
    pub const INVALID_DATA: u16 = 1007;
    /// A policy was violated (the link's own close reasons).
    pub const POLICY: u16 = 1008;
    /// A message too big to process.
    pub const TOO_BIG: u16 = 1009;
}

/// A close code a peer may put on the wire: 1000–1003, 1007–1011 (1004–1006 and 1015 are
/// reserved, 1012–2999 unassigned), or 3000–4999 (registered and private).
pub fn close_code_allowed(code: u16) -> bool {
    matches!(code, 1000..=1003 | 1007..=1011 | 3000..=4999)
}

/// A WebSocket rule the peer broke. Each closes the link with [`close_code`](Self::close_code).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WsError {
    /// RSV1–3 set: no extension was negotiated.
    #[error("a WebSocket frame has reserved bits set (no extension was negotiated)")]
    ReservedBits,
    /// An opcode RFC 6455 does not define.
    #[error("a WebSocket frame has the unknown opcode {0:#x}")]
    BadOpcode(u8),
    /// A server received an unmasked frame (§5.1).
    #[error("a WebSocket frame from the client is not masked")]
    UnmaskedClientFrame,
    /// A client received a masked frame (§5.1).
    #[error("a WebSocket frame from the server is masked")]
    MaskedServerFrame,
    /// A control frame without FIN (§5.5).
    #[error("a WebSocket control frame is fragmented")]
    FragmentedControl,
    /// A control frame's payload over [`MAX_CONTROL_PAYLOAD`] (§5.5).
    #[error("a WebSocket control frame carries {0} bytes (at most 125)")]
    ControlTooLong(u64),
    /// A 64-bit length with its top bit set (§5.2).
    #[error("a WebSocket frame's length has its top bit set")]
    BadLength,
    /// A frame, or a fragmented message so far, over the size limit: refused from its header.
    #[error("a WebSocket message of {len} bytes exceeds the limit of {max}")]
    Oversized {
        /// Its size (so far, for a fragmented message).
        len: u64,
        /// The limit.
        max: usize,
    },
    /// A continuation frame with no message begun.
    #[error("a WebSocket continuation frame without a message to continue")]
    UnexpectedContinuation,
    /// A new text or binary frame while a fragmented message is unfinished.
    #[error("a WebSocket data frame while a fragmented message is unfinished")]
    UnfinishedMessage,
    /// A close payload of one byte (a code is two).
    #[error("a WebSocket close frame with a one-byte payload")]
    CloseTooShort,
    /// A close code not allowed on the wire.
    #[error("a WebSocket close frame with the code {0}, which may not be sent")]
    BadCloseCode(u16),
    /// A close reason that is not UTF-8.
    #[error("a WebSocket close reason that is not UTF-8")]
    CloseReasonNotUtf8,
    /// A text message that is not UTF-8.
    #[error("a WebSocket text message that is not UTF-8")]
    TextNotUtf8,
}

impl WsError {
    /// The close code that says so (RFC 6455 §7.4.1): 1009 for a message too big, 1007 for
    /// text that is not UTF-8, 1002 for the rest.
    pub fn close_code(&self) -> u16 {
        match self {
            WsError::Oversized { .. } => close_code::TOO_BIG,
            WsError::TextNotUtf8 | WsError::CloseReasonNotUtf8 => close_code::INVALID_DATA,
            _ => close_code::PROTOCOL,
        }
    }
}

/// A parsed frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The last fragment of its message.
    pub fin: bool,
    /// What it carries.
    pub opcode: Opcode,
    /// Its masking key, if masked.
    pub mask: Option<[u8; 4]>,
    /// Payload bytes.
    pub len: u64,
    /// Header bytes (2–14).
    pub header_len: usize,
}

/// Parse the header at the start of `b` as received by `role`: `Ok(None)` while incomplete.
/// Every rule that the header alone can break is checked here, before any payload is read.
pub fn parse_header(b: &[u8], role: Role) -> Result<Option<Header>, WsError> {
    let (Some(&b0), Some(&b1)) = (b.first(), b.get(1)) else {
        return Ok(None);
    };
    if b0 & 0x70 != 0 {
        return Err(WsError::ReservedBits);
    }
    let opcode = Opcode::from_bits(b0 & 0x0F).ok_or(WsError::BadOpcode(b0 & 0x0F))?;
    let fin = b0 & 0x80 != 0;
    let masked = b1 & 0x80 != 0;
    match (role, masked) {
        (Role::Server, false) => return Err(WsError::UnmaskedClientFrame),
        (Role::Client, true) => return Err(WsError::MaskedServerFrame),
        _ => {}
    }
    let len7 = b1 & 0x7F;
    if opcode.is_control() {
        if !fin {
            return Err(WsError::FragmentedControl);
        }
        if usize::from(len7) > MAX_CONTROL_PAYLOAD {
            return Err(WsError::ControlTooLong(u64::from(len7)));
        }
    }
    let (len, mut at) = match len7 {
        126 => match b.get(2..4) {
            Some(l) => (u64::from(u16::from_be_bytes([l[0], l[1]])), 4),
            None => return Ok(None),
        },
        127 => match b.get(2..10) {
            Some(l) => {
                let mut a = [0u8; 8];
                a.copy_from_slice(l);
                let len = u64::from_be_bytes(a);
                if len >> 63 != 0 {
                    return Err(WsError::BadLength);
                }
                (len, 10)
            }
            None => return Ok(None),
        },
        n => (u64::from(n), 2),
    };
    let mask = if masked {
        let Some(m) = b.get(at..at + 4) else {
            return Ok(None);
        };
        at += 4;
        Some([m[0], m[1], m[2], m[3]])
    } else {
        None
    };
    Ok(Some(Header {
        fin,
        opcode,
        mask,
        len,
        header_len: at,
    }))
}

/// Write a header for a final frame of `len` payload bytes into `out`; returns its length.
/// With `mask`, the payload must be masked with it ([`apply_mask`]) before it is sent.
pub fn encode_header(
    out: &mut [u8; MAX_HEADER_BYTES],
    opcode: Opcode,
    len: usize,
    mask: Option<[u8; 4]>,
) -> usize {
    out[0] = 0x80 | opcode.bits();
    let mask_bit = if mask.is_some() { 0x80 } else { 0 };
    let mut at = match len {
        0..=125 => {
            out[1] = mask_bit | len as u8;
            2
        }
        126..=0xFFFF => {
            out[1] = mask_bit | 126;
            out[2..4].copy_from_slice(&(len as u16).to_be_bytes());
            4
        }
        _ => {
            out[1] = mask_bit | 127;
            out[2..10].copy_from_slice(&(len as u64).to_be_bytes());
            10
        }
    };
    if let Some(m) = mask {
        out[at..at + 4].copy_from_slice(&m);
        at += 4;
    }
    at
}

/// XOR `buf` with `mask` (masking and unmasking are the same), eight bytes at a time.
pub fn apply_mask(buf: &mut [u8], mask: [u8; 4]) {
    let wide = u64::from_ne_bytes([
        mask[0], mask[1], mask[2], mask[3], mask[0], mask[1], mask[2], mask[3],
    ]);
    let mut chunks = buf.chunks_exact_mut(8);
    for c in &mut chunks {
        let mut a = [0u8; 8];
        a.copy_from_slice(c);
        c.copy_from_slice(&(u64::from_ne_bytes(a) ^ wide).to_ne_bytes());
    }
    for (i, b) in chunks.into_remainder().iter_mut().enumerate() {
        *b ^= mask[i & 3];
    }
}

/// The payload of a close frame: `code` and `reason`, cut at a character boundary to fit a
/// control frame.
pub fn close_payload(code: u16, reason: &str) -> Bytes {
    let mut end = reason.len().min(MAX_CONTROL_PAYLOAD - 2);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    let mut b = BytesMut::with_capacity(2 + end);
    b.extend_from_slice(&code.to_be_bytes());
    b.extend_from_slice(&reason.as_bytes()[..end]);
    b.freeze()
}

/// A close frame's content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloseFrame {
    /// Its code.
    pub code: u16,
    /// Its reason (UTF-8, at most 123 bytes).
    pub reason: String,
}

/// Parse a close frame's payload: empty (no code), or a code allowed on the wire and a UTF-8
/// reason.
pub fn parse_close(payload: &[u8]) -> Result<Option<CloseFrame>, WsError> {
    match payload {
        [] => Ok(None),
        [_] => Err(WsError::CloseTooShort),
        [a, b, reason @ ..] => {
            let code = u16::from_be_bytes([*a, *b]);
            if !close_code_allowed(code) {
                return Err(WsError::BadCloseCode(code));
            }
            let reason = std::str::from_utf8(reason).map_err(|_| WsError::CloseReasonNotUtf8)?;
            Ok(Some(CloseFrame {
                code,
                reason: reason.to_owned(),
            }))
        }
    }
}

/// A whole message received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// A binary message (a link frame), a slice of the read buffer.
    Binary(Bytes),
    /// A text message, checked to be UTF-8.
    Text(Bytes),
    /// A ping: answer with a pong carrying the same bytes.
    Ping(Bytes),
    /// A pong.
    Pong(Bytes),
    /// The peer closes (its code and reason, if it gave them).
    Close(Option<CloseFrame>),
}

/// Turns the bytes read from a socket into [`Message`]s. The driver reads into
/// [`read_buffer`](Self::read_buffer) (uninitialised spare capacity, never zero-filled), and
/// [`decode`](Self::decode) splits each whole frame's payload off that buffer as [`Bytes`]
/// and unmasks it in place: no copy of an unfragmented message's payload.
#[derive(Debug)]
pub struct Decoder {
    role: Role,
    max_message: usize,
    buf: BytesMut,
    /// A fragmented message so far: its opcode and bytes (copied together; the only copy).
    partial: Option<(Opcode, BytesMut)>,
    /// Messages shorter than this are copied out of the read buffer instead of sharing it,
    /// so a small message held in a queue does not pin a large buffer.
    share_from: usize,
}

impl Decoder {
    /// A decoder for the `role` end, refusing frames and messages over `max_message` bytes.
    pub fn new(role: Role, max_message: usize) -> Self {
        Decoder::with_buffered(role, max_message, BytesMut::new())
    }

    /// A decoder that starts with bytes already read from the socket.
    pub fn with_buffered(role: Role, max_message: usize, buffered: BytesMut) -> Self {
        Decoder {
            role,
            max_message,
            buf: buffered,
            partial: None,
            share_from: 0,
        }
    }

    /// Copy messages shorter than `bytes` out of the read buffer (a held slice keeps its
    /// whole buffer alive; a copy of a small message costs little). Control frames are
    /// always copied. Default 0: every data message is a slice.
    pub fn share_from(mut self, bytes: usize) -> Self {
        self.share_from = bytes;
        self
    }

    /// The buffer to read the socket into (append only).
    pub fn read_buffer(&mut self) -> &mut BytesMut {
        &mut self.buf
    }

    /// Bytes read and not yet decoded.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Something of a message has arrived and the message is not whole yet.
    pub fn mid_message(&self) -> bool {
        !self.buf.is_empty() || self.partial.is_some()
    }

    /// Bytes the frame at the head of the buffer still needs (0 when no header is whole).
    pub fn frame_remaining(&self) -> usize {
        match parse_header(&self.buf, self.role) {
            Ok(Some(h)) => (h.header_len as u64 + h.len)
                .saturating_sub(self.buf.len() as u64)
                .try_into()
                .unwrap_or(usize::MAX),
            _ => 0,
        }
    }

    /// Give the read buffer's memory back when it holds nothing (an idle link pins none).
    pub fn release_if_empty(&mut self) {
        if self.buf.is_empty() && self.buf.capacity() > 0 {
            self.buf = BytesMut::new();
        }
    }

    /// The next whole message, if the buffer holds one. After an error the link must close:
    /// the decoder's state is not defined.
    pub fn decode(&mut self) -> Result<Option<Message>, WsError> {
        loop {
            let Some(h) = parse_header(&self.buf, self.role)? else {
                return Ok(None);
            };
            let so_far = match (&self.partial, h.opcode) {
                (Some((_, p)), Opcode::Continuation) => p.len() as u64,
                _ => 0,
            };
            if so_far + h.len > self.max_message as u64 {
                return Err(WsError::Oversized {
                    len: so_far + h.len,
                    max: self.max_message,
                });
            }
            // Within the limit, so within usize.
            let len = h.len as usize;
            if self.buf.len() < h.header_len + len {
                return Ok(None);
            }
            self.buf.advance(h.header_len);
            let mut payload = self.buf.split_to(len);
            if let Some(m) = h.mask {
                apply_mask(&mut payload, m);
            }
            match h.opcode {
                Opcode::Ping => return Ok(Some(Message::Ping(Bytes::copy_from_slice(&payload)))),
                Opcode::Pong => return Ok(Some(Message::Pong(Bytes::copy_from_slice(&payload)))),
                Opcode::Close => return parse_close(&payload).map(|c| Some(Message::Close(c))),
                Opcode::Text | Opcode::Binary => {
                    if self.partial.is_some() {
                        return Err(WsError::UnfinishedMessage);
                    }
                    if h.fin {
                        return finish(h.opcode, payload, self.share_from).map(Some);
                    }
                    self.partial = Some((h.opcode, payload));
                }
                Opcode::Continuation => {
                    let Some((op, mut so_far)) = self.partial.take() else {
                        return Err(WsError::UnexpectedContinuation);
                    };
                    so_far.extend_from_slice(&payload);
                    if h.fin {
                        // Its own buffer already: nothing to pin.
                        return finish(op, so_far, 0).map(Some);
                    }
                    self.partial = Some((op, so_far));
                }
            }
        }
    }
}

fn finish(op: Opcode, payload: BytesMut, share_from: usize) -> Result<Message, WsError> {
    if op == Opcode::Text && std::str::from_utf8(&payload).is_err() {
        return Err(WsError::TextNotUtf8);
    }
    let bytes = if payload.len() < share_from {
        Bytes::copy_from_slice(&payload)
    } else {
        payload.freeze()
    };
    Ok(match op {
        Opcode::Text => Message::Text(bytes),
        _ => Message::Binary(bytes),
    })
}

/// Masking keys for a client's frames, drawn from the system's random source in blocks (one
/// system call per 64 frames, not one per frame): RFC 6455 §5.3 asks for unpredictable keys.
#[derive(Debug, Default)]
pub struct MaskKeys {
    pool: Vec<[u8; 4]>,
}

impl MaskKeys {
    /// The next key. If the random source fails, a key from std's per-process random hash
    /// keys is used instead (masking guards intermediaries, not secrets).
    pub fn next_key(&mut self) -> [u8; 4] {
        if self.pool.is_empty() {
            let mut block = [0u8; 256];
            if getrandom::getrandom(&mut block).is_err() {
                use std::hash::{BuildHasher, Hasher};
                let mut h = std::collections::hash_map::RandomState::new().build_hasher();
                h.write_usize(block.as_ptr() as usize);
                return (h.finish() as u32).to_ne_bytes();
            }
            self.pool = block
                .chunks_exact(4)
                .map(|c| [c[0], c[1], c[2], c[3]])
                .collect();
        }
        self.pool.pop().unwrap_or([0x5a, 0xa5, 0x3c, 0xc3])
    }
}

mod boundaries;
pub use boundaries::Boundaries;

#[cfg(test)]
mod tests;
