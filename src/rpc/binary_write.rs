//! Both directions of the binary write (`protocol.md` §5.2, `capabilities.binaryInput`): a
//! `process/write` sent as one binary message instead of JSON with base64, so an upload pays
//! neither the 4/3 nor a JSON pass on either side.
//!
//! # What this module owns
//!
//! - The layout, in one place (integers big-endian):
//!
//!   | offset | size | field |
//!   |---|---|---|
//!   | 0 | 1 | kind = [`KIND_WRITE`] |
//!   | 1 | 1 | flags: bit 0 = close stdin after this chunk ([`FLAG_CLOSE_STDIN`]); other bits 0 |
//!   | 2 | 8 | the request id, a JSON-RPC number id, 0…[`MAX_WRITE_REQUEST_ID`] |
//!   | 10 | 2 | length L of the process id, 1…[`MAX_PROCESS_ID_BYTES`] |
//!   | 12 | 1 | length W of the `writeId`, 0…255 (0: none) |
//!   | 13 | L | the process id, UTF-8 |
//!   | 13+L | W | the `writeId`, UTF-8 |
//!   | 13+L+W | rest | the raw stdin bytes, 0…[`MAX_CHUNK_BYTES`] |
//!
//! - [`encode_write_head`]: the client's head (`13 + L + W` bytes); the chunk follows it as the
//!   transport's second part (`OutMessage::Binary`), never copied here.
//! - [`decode_binary_write`]: the server's checked decoder, each field checked before it is
//!   trusted, a typed [`BinaryWriteError`] naming what is wrong (answered `-32700`, id `null`);
//!   the chunk a slice of the received buffer.
//!
//! # What it must never do
//!
//! - Copy the chunk, or panic on anything a peer sends (every length is checked before use).
//! - Decide what a write means: it yields wire values; the connection makes them a
//!   `process/write` (same ordering, `writeId` dedupe and bounds as the JSON one).

use bytes::{BufMut, Bytes, BytesMut};

use crate::config::{MAX_CHUNK_BYTES, MAX_PROCESS_ID_BYTES};

/// The kind byte of a binary `process/write` request.
pub const KIND_WRITE: u8 = 0x01;
/// Flag bit 0: close stdin right after this chunk.
pub const FLAG_CLOSE_STDIN: u8 = 0x01;
/// Bytes of the head before the process id: kind, flags, id, L, W.
pub const WRITE_HEAD_FIXED_BYTES: usize = 13;
/// The largest request id a binary write carries: a JSON-RPC number id a JSON peer can read
/// exactly (2^53 − 1).
pub const MAX_WRITE_REQUEST_ID: u64 = (1 << 53) - 1;
/// The longest `writeId` the layout can carry (its length is one byte). The JSON form allows
/// up to `MAX_WRITE_ID_BYTES` (256); a client with a longer id sends that write as JSON.
pub const MAX_BINARY_WRITE_ID_BYTES: usize = u8::MAX as usize;

/// A decoded binary write: the fields of a `process/write` and its request id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BinaryWrite {
    /// The request id (a JSON-RPC number id).
    pub id: u64,
    /// Close stdin right after this chunk.
    pub close_stdin: bool,
    /// The process.
    pub process_id: String,
    /// The idempotency key, if any.
    pub write_id: Option<String>,
    /// The raw stdin bytes: a slice of the received message.
    pub data: Bytes,
}

/// Why a binary message is not a valid binary write. The words are what the client sees in
/// the `-32700`'s message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BinaryWriteError {
    /// Shorter than the fixed head.
    #[error("binary write of {0} bytes is shorter than its 13-byte head")]
    Truncated(usize),
    /// A kind byte other than 0x01.
    #[error("unknown binary message kind {0:#04x} (a client sends only 0x01, process/write)")]
    UnknownKind(u8),
    /// Flag bits other than bit 0.
    #[error("binary write flags {0:#04x} set reserved bits (only bit 0, close stdin, is defined)")]
    ReservedFlags(u8),
    /// A request id above 2^53 − 1.
    #[error("binary write request id {0} is above 2^53 - 1")]
    IdTooLarge(u64),
    /// A process id length outside 1…256.
    #[error("binary write process id length {0} is outside 1..={MAX_PROCESS_ID_BYTES}")]
    ProcessIdLength(usize),
    /// The lengths name more bytes than the message has.
    #[error(
        "binary write lengths do not add up: the head names {needed} bytes, the message has {got}"
    )]
    Short {
        /// Bytes the head and its ids need.
        needed: usize,
        /// Bytes present.
        got: usize,
    },
    /// The process id or the `writeId` is not UTF-8.
    #[error("binary write {0} is not UTF-8")]
    NotUtf8(&'static str),
    /// More stdin bytes than one chunk.
    #[error("binary write chunk of {0} bytes exceeds {MAX_CHUNK_BYTES}")]
    ChunkTooLarge(usize),
}

/// The head of a binary write (`13 + L + W` bytes); the chunk follows it. The caller keeps
/// to the layout's ranges (`id` ≤ [`MAX_WRITE_REQUEST_ID`], `process_id` 1…256 bytes,
/// `write_id` ≤ 255 bytes, the chunk ≤ [`MAX_CHUNK_BYTES`]): [`fits_binary_write`] says
/// whether it can; a value out of range is cut to its field rather than written with a length
/// that does not fit (the server then refuses it, naming why).
pub fn encode_write_head(id: u64, close_stdin: bool, process_id: &str, write_id: &str) -> Bytes {
    let pid = &process_id.as_bytes()[..process_id.len().min(MAX_PROCESS_ID_BYTES)];
    let wid = &write_id.as_bytes()[..write_id.len().min(MAX_BINARY_WRITE_ID_BYTES)];
    let mut b = BytesMut::with_capacity(WRITE_HEAD_FIXED_BYTES + pid.len() + wid.len());
    b.put_u8(KIND_WRITE);
    b.put_u8(if close_stdin { FLAG_CLOSE_STDIN } else { 0 });
    b.put_u64(id);
    b.put_u16(pid.len() as u16);
    b.put_u8(wid.len() as u8);
    b.put_slice(pid);
    b.put_slice(wid);
    b.freeze()
}

/// Whether a write of these values can travel as a binary write (else it goes as JSON).
pub fn fits_binary_write(id: u64, process_id: &str, write_id: &str, chunk_len: usize) -> bool {
    id <= MAX_WRITE_REQUEST_ID
        && (1..=MAX_PROCESS_ID_BYTES).contains(&process_id.len())
        && write_id.len() <= MAX_BINARY_WRITE_ID_BYTES
        && chunk_len <= MAX_CHUNK_BYTES
}

/// Decode a whole binary message as a binary write, checking every field.
pub fn decode_binary_write(message: Bytes) -> Result<BinaryWrite, BinaryWriteError> {
    let len = message.len();
    if len < WRITE_HEAD_FIXED_BYTES {
        // An unknown kind is named even in a short message.
        if let Some(&k) = message.first() {
            if k != KIND_WRITE {
                return Err(BinaryWriteError::UnknownKind(k));
            }
        }
        return Err(BinaryWriteError::Truncated(len));
    }
    if message[0] != KIND_WRITE {
        return Err(BinaryWriteError::UnknownKind(message[0]));
    }
    let flags = message[1];
    if flags & !FLAG_CLOSE_STDIN != 0 {
        return Err(BinaryWriteError::ReservedFlags(flags));
    }
    let mut id = [0u8; 8];
    id.copy_from_slice(&message[2..10]);
    let id = u64::from_be_bytes(id);
    if id > MAX_WRITE_REQUEST_ID {
        return Err(BinaryWriteError::IdTooLarge(id));
    }
    let l = usize::from(u16::from_be_bytes([message[10], message[11]]));
    if !(1..=MAX_PROCESS_ID_BYTES).contains(&l) {
        return Err(BinaryWriteError::ProcessIdLength(l));
    }
    let w = usize::from(message[12]);
    let needed = WRITE_HEAD_FIXED_BYTES + l + w;
    if needed > len {
        return Err(BinaryWriteError::Short { needed, got: len });
    }
    let chunk = len - needed;
    if chunk > MAX_CHUNK_BYTES {
        return Err(BinaryWriteError::ChunkTooLarge(chunk));
    }
    let text = |at: usize, n: usize, what: &'static str| {
        std::str::from_utf8(&message[at..at + n])
            .map(str::to_string)
            .map_err(|_| BinaryWriteError::NotUtf8(what))
    };
    let process_id = text(WRITE_HEAD_FIXED_BYTES, l, "process id")?;
    let write_id = match w {
        0 => None,
        _ => Some(text(WRITE_HEAD_FIXED_BYTES + l, w, "writeId")?),
    };
    Ok(BinaryWrite {
        id,
        close_stdin: flags & FLAG_CLOSE_STDIN != 0,
        process_id,
        write_id,
        data: message.slice(needed..),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn whole(head: &Bytes, chunk: &[u8]) -> Bytes {
        let mut b = head.to_vec();
        b.extend_from_slice(chunk);
        Bytes::from(b)
    }

    #[test]
    fn the_layout_is_exactly_this() {
        let head = encode_write_head(0x0102, true, "p1", "w-1");
        assert_eq!(
            &head[..],
            &[1, 1, 0, 0, 0, 0, 0, 0, 1, 2, 0, 2, 3, b'p', b'1', b'w', b'-', b'1'][..]
        );
        assert_eq!(
            &encode_write_head(7, false, "p", "")[..],
            &[1, 0, 0, 0, 0, 0, 0, 0, 0, 7, 0, 1, 0, b'p'][..]
        );
    }

    #[test]
    fn round_trips_keep_every_field_and_the_chunk_is_not_copied() {
        for (pid, wid, close, chunk) in [
            ("p", "", false, vec![]),
            ("ü-process", "w-ü", true, vec![0u8, 1, 2, 255]),
            (
                &"x".repeat(256)[..],
                &"y".repeat(255)[..],
                false,
                vec![7; MAX_CHUNK_BYTES],
            ),
        ] {
            let head = encode_write_head(MAX_WRITE_REQUEST_ID, close, pid, wid);
            let msg = whole(&head, &chunk);
            let base = msg.as_ptr() as usize;
            let w = decode_binary_write(msg).unwrap();
            assert_eq!(w.id, MAX_WRITE_REQUEST_ID);
            assert_eq!(w.close_stdin, close);
            assert_eq!(w.process_id, pid);
            assert_eq!(w.write_id.as_deref(), (!wid.is_empty()).then_some(wid));
            assert_eq!(&w.data[..], &chunk[..]);
            if !chunk.is_empty() {
                assert_eq!(w.data.as_ptr() as usize, base + head.len(), "a slice");
            }
            assert!(fits_binary_write(w.id, pid, wid, chunk.len()));
        }
    }

    /// `protocol.md` §5.2: every malformed layout gets its own error.
    #[test]
    fn every_malformed_layout_is_refused_with_its_reason() {
        let good = whole(&encode_write_head(9, false, "p", "w"), b"data");
        let with = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut v = good.to_vec();
            f(&mut v);
            decode_binary_write(Bytes::from(v)).unwrap_err()
        };
        use BinaryWriteError as E;
        assert_eq!(with(&|v| v.truncate(12)), E::Truncated(12));
        assert_eq!(with(&|v| v.truncate(0)), E::Truncated(0));
        assert_eq!(with(&|v| v[0] = 0x02), E::UnknownKind(2));
        assert_eq!(with(&|v| v.truncate(3)), E::Truncated(3));
        assert_eq!(
            decode_binary_write(Bytes::from_static(&[0x05, 0])).unwrap_err(),
            E::UnknownKind(5)
        );
        assert_eq!(with(&|v| v[1] = 0x02), E::ReservedFlags(2));
        assert_eq!(with(&|v| v[1] = 0x81), E::ReservedFlags(0x81));
        assert_eq!(
            with(&|v| v[2..10].copy_from_slice(&(1u64 << 53).to_be_bytes())),
            E::IdTooLarge(1 << 53)
        );
        assert_eq!(
            with(&|v| v[10..12].copy_from_slice(&[0, 0])),
            E::ProcessIdLength(0)
        );
        assert_eq!(
            with(&|v| v[10..12].copy_from_slice(&[1, 1])),
            E::ProcessIdLength(257)
        );
        assert_eq!(
            with(&|v| v[12] = 200),
            E::Short {
                needed: 13 + 1 + 200,
                got: good.len()
            }
        );
        assert_eq!(with(&|v| v[13] = 0xff), E::NotUtf8("process id"));
        assert_eq!(with(&|v| v[14] = 0xc3), E::NotUtf8("writeId"));
        let mut big = encode_write_head(1, false, "p", "").to_vec();
        big.resize(big.len() + MAX_CHUNK_BYTES + 1, 0);
        assert_eq!(
            decode_binary_write(Bytes::from(big)).unwrap_err(),
            E::ChunkTooLarge(MAX_CHUNK_BYTES + 1)
        );
        // Every message says what is wrong.
        assert!(E::ReservedFlags(2).to_string().contains("reserved"));
        assert!(E::Short { needed: 9, got: 3 }
            .to_string()
            .contains("do not add up"));
    }

    #[test]
    fn what_does_not_fit_the_layout_is_sent_as_json() {
        assert!(!fits_binary_write(1 << 53, "p", "", 0));
        assert!(!fits_binary_write(1, "", "", 0));
        assert!(!fits_binary_write(1, "p", &"w".repeat(256), 0));
        assert!(!fits_binary_write(1, "p", "", MAX_CHUNK_BYTES + 1));
    }
}
