//! Both directions of the binary output message (`protocol.md` §5.1): the server's encoder of
//! an output delta's head and the client's decoder of a whole message.
//!
//! # What this module owns
//!
//! - The layout, in one place (integers big-endian):
//!
//!   | offset | size | field |
//!   |---|---|---|
//!   | 0 | 1 | kind = [`KIND_OUTPUT_DELTA`] (other values are reserved; a receiver rejects them) |
//!   | 1 | 1 | stream: 0 `stdout`, 1 `stderr`, 2 `pty` |
//!   | 2 | 8 | `seq` |
//!   | 10 | 2 | length L of the process id, 1…[`MAX_PROCESS_ID_BYTES`] |
//!   | 12 | L | the process id, UTF-8 |
//!   | 12+L | rest | the raw output chunk, 1…[`MAX_CHUNK_BYTES`] bytes |
//!
//! - [`encode_output_head`]: the first `12 + L` bytes, built once per chunk; the chunk itself
//!   follows as the transport's second part (`OutMessage::Binary`), never copied here.
//! - [`decode_output_message`]: the client's decoder. It checks every field before it trusts
//!   it (the kind, the stream, the id's length against the bytes present and the protocol's
//!   range, the id's UTF-8, the chunk's length) and returns a typed [`BinaryMessageError`]
//!   for anything else; the chunk is a slice of the received buffer, not a copy.
//! - [`is_binary_message`]: how a receiver tells a binary message from a JSON text on a
//!   transport without frame types (a Noise stream): by its first byte.
//!
//! # What it must never do
//!
//! - Copy the chunk, or panic on anything a peer sends (every length is checked before use).
//! - Know where events come from: it takes wire values (seq, stream, bytes).

use bytes::{BufMut, Bytes, BytesMut};

use super::messages::StreamName;
use super::notification::OutputDelta;
use crate::config::{MAX_CHUNK_BYTES, MAX_PROCESS_ID_BYTES};

/// The kind byte of an output delta, the only kind of binary message (`protocol.md` §5.1).
pub const KIND_OUTPUT_DELTA: u8 = 0x00;

/// Bytes of the head before the process id: kind (1), stream (1), seq (8), id length (2).
pub const HEAD_FIXED_BYTES: usize = 12;

/// The longest head: the fixed fields and the longest process id.
pub const MAX_HEAD_BYTES: usize = HEAD_FIXED_BYTES + MAX_PROCESS_ID_BYTES;

/// The stream's code in the binary layout.
pub fn stream_code(stream: StreamName) -> u8 {
    match stream {
        StreamName::Stdout => 0,
        StreamName::Stderr => 1,
        StreamName::Pty => 2,
    }
}

/// The stream of a code; `None` for a code the layout does not define.
pub fn stream_of_code(code: u8) -> Option<StreamName> {
    match code {
        0 => Some(StreamName::Stdout),
        1 => Some(StreamName::Stderr),
        2 => Some(StreamName::Pty),
        _ => None,
    }
}

/// Why a binary message was refused. Every variant is a peer's fault: the message is
/// dropped, and the receiver treats the connection as broken (a server that sends one cannot
/// be trusted with the rest of the stream).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BinaryMessageError {
    /// No bytes at all.
    #[error("empty binary message")]
    Empty,
    /// A kind byte other than [`KIND_OUTPUT_DELTA`] (reserved values).
    #[error("binary message of unknown kind 0x{0:02x}")]
    UnknownKind(u8),
    /// Shorter than its declared fields.
    #[error("binary output message of {len} bytes is shorter than its head ({needed} bytes)")]
    Truncated {
        /// Bytes received.
        len: usize,
        /// Bytes the head declares (fixed fields and process id).
        needed: usize,
    },
    /// A stream code the layout does not define.
    #[error("binary output message names unknown stream {0}")]
    UnknownStream(u8),
    /// A process id length outside 1…[`MAX_PROCESS_ID_BYTES`].
    #[error("binary output message has a process id of {0} bytes (allowed: 1 to {max})", max = MAX_PROCESS_ID_BYTES)]
    ProcessIdLength(usize),
    /// A process id that is not UTF-8.
    #[error("binary output message has a process id that is not UTF-8")]
    ProcessIdNotUtf8,
    /// No output bytes after the head.
    #[error("binary output message carries an empty chunk")]
    EmptyChunk,
    /// More output bytes than one chunk may hold.
    #[error("binary output message carries {0} bytes, more than a chunk ({max})", max = MAX_CHUNK_BYTES)]
    ChunkTooLong(usize),
}

/// Whether `message` is a binary message rather than a JSON text, by its first byte: a JSON
/// text starts with optional whitespace (space, tab, line feed, carriage return) and then a
/// value, so any other byte below 0x20 (the kind [`KIND_OUTPUT_DELTA`] = 0x00 among them) can
/// only start a binary message. That is how a Noise stream, which has no frame types, tells
/// them apart; a WebSocket client applies the same rule to both kinds of frame.
pub fn is_binary_message(message: &[u8]) -> bool {
    message
        .first()
        .is_some_and(|&b| b < 0x20 && !matches!(b, b'\t' | b'\n' | b'\r'))
}

/// The head of an output delta's binary message (`12 + L` bytes); the chunk follows it.
/// `process_id` is 1 to [`MAX_PROCESS_ID_BYTES`] bytes: the server checked it at
/// `process/start`. A longer id (a caller's bug) is cut at the limit on a character boundary
/// rather than written with a length that would not fit its field.
pub fn encode_output_head(process_id: &str, seq: u64, stream: StreamName) -> Bytes {
    let mut end = process_id.len().min(MAX_PROCESS_ID_BYTES);
    while !process_id.is_char_boundary(end) {
        end -= 1;
    }
    let id = &process_id.as_bytes()[..end];
    let mut head = BytesMut::with_capacity(HEAD_FIXED_BYTES + id.len());
    head.put_u8(KIND_OUTPUT_DELTA);
    head.put_u8(stream_code(stream));
    head.put_u64(seq);
    // At most MAX_PROCESS_ID_BYTES (256): fits the two-byte field.
    head.put_u16(id.len() as u16);
    head.put_slice(id);
    head.freeze()
}

/// The whole binary message of an output delta, joined (tests, fuzzing and tools; the server
/// sends the head and the chunk as two parts and never joins them).
pub fn encode_output_message(
    process_id: &str,
    seq: u64,
    stream: StreamName,
    chunk: &[u8],
) -> Vec<u8> {
    let head = encode_output_head(process_id, seq, stream);
    let mut message = Vec::with_capacity(head.len() + chunk.len());
    message.extend_from_slice(&head);
    message.extend_from_slice(chunk);
    message
}

/// Decode a binary message: an output delta whose chunk is a slice of `message` (no copy), or
/// the reason it is malformed.
pub fn decode_output_message(message: Bytes) -> Result<OutputDelta, BinaryMessageError> {
    let len = message.len();
    let kind = *message.first().ok_or(BinaryMessageError::Empty)?;
    if kind != KIND_OUTPUT_DELTA {
        return Err(BinaryMessageError::UnknownKind(kind));
    }
    let fixed = message
        .get(..HEAD_FIXED_BYTES)
        .ok_or(BinaryMessageError::Truncated {
            len,
            needed: HEAD_FIXED_BYTES,
        })?;
    let stream = stream_of_code(fixed[1]).ok_or(BinaryMessageError::UnknownStream(fixed[1]))?;
    let mut seq = [0u8; 8];
    seq.copy_from_slice(&fixed[2..10]);
    let seq = u64::from_be_bytes(seq);
    let id_len = usize::from(u16::from_be_bytes([fixed[10], fixed[11]]));
    if id_len == 0 || id_len > MAX_PROCESS_ID_BYTES {
        return Err(BinaryMessageError::ProcessIdLength(id_len));
    }
    let head_len = HEAD_FIXED_BYTES + id_len;
    let id = message
        .get(HEAD_FIXED_BYTES..head_len)
        .ok_or(BinaryMessageError::Truncated {
            len,
            needed: head_len,
        })?;
    let process_id = std::str::from_utf8(id)
        .map_err(|_| BinaryMessageError::ProcessIdNotUtf8)?
        .to_owned();
    let chunk_len = len - head_len;
    if chunk_len == 0 {
        return Err(BinaryMessageError::EmptyChunk);
    }
    if chunk_len > MAX_CHUNK_BYTES {
        return Err(BinaryMessageError::ChunkTooLong(chunk_len));
    }
    Ok(OutputDelta {
        process_id,
        seq,
        stream,
        data: message.slice(head_len..),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const STREAMS: [StreamName; 3] = [StreamName::Stdout, StreamName::Stderr, StreamName::Pty];

    fn chunk(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 131 % 251) as u8).collect()
    }

    /// The layout of §5.1, byte for byte.
    #[test]
    fn the_message_bytes_are_exactly_these() {
        assert_eq!(
            encode_output_message("p1", 7, StreamName::Stderr, b"hi\n"),
            [
                0x00, // kind
                0x01, // stderr
                0, 0, 0, 0, 0, 0, 0, 7, // seq
                0, 2, // id length
                b'p', b'1', // id
                b'h', b'i', b'\n', // chunk
            ]
        );
        assert_eq!(
            encode_output_message("é", u64::MAX, StreamName::Pty, &[0]),
            [0, 2, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 2, 0xc3, 0xa9, 0]
        );
        assert_eq!(
            &encode_output_head("x", 0x0102_0304_0506_0708, StreamName::Stdout)[..],
            &[0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 1, b'x']
        );
    }

    /// What the server encodes, the client decodes exactly: every stream kind, the largest
    /// chunk and the smallest, a 256-byte process id and a one-byte one, multi-byte UTF-8, and
    /// the seq extremes.
    #[test]
    fn every_stream_id_chunk_and_seq_round_trips() {
        let ids = [
            "p".to_string(),
            "ünïcödé ✓".to_string(),
            "x".repeat(MAX_PROCESS_ID_BYTES),
            // 256 bytes made of two-byte characters.
            "é".repeat(MAX_PROCESS_ID_BYTES / 2),
        ];
        for id in &ids {
            for stream in STREAMS {
                for len in [1, 2, 1000, MAX_CHUNK_BYTES] {
                    for seq in [0, 1, u64::from(u32::MAX) + 1, u64::MAX] {
                        let data = chunk(len);
                        let head = encode_output_head(id, seq, stream);
                        assert_eq!(head.len(), HEAD_FIXED_BYTES + id.len());
                        assert!(head.len() <= MAX_HEAD_BYTES);
                        let message = encode_output_message(id, seq, stream, &data);
                        assert!(is_binary_message(&message));
                        let d = decode_output_message(Bytes::from(message)).unwrap();
                        assert_eq!(
                            (d.process_id.as_str(), d.seq, d.stream),
                            (id.as_str(), seq, stream)
                        );
                        assert_eq!(&d.data[..], &data[..]);
                    }
                }
            }
        }
    }

    /// The chunk is a view of the received buffer, not a copy.
    #[test]
    fn the_chunk_is_not_copied() {
        let message = Bytes::from(encode_output_message("p", 1, StreamName::Stdout, b"abc"));
        let start = message.as_ptr() as usize;
        let d = decode_output_message(message).unwrap();
        assert_eq!(d.data.as_ptr() as usize, start + HEAD_FIXED_BYTES + 1);
    }

    fn with(mut message: Vec<u8>, at: usize, bytes: &[u8]) -> Vec<u8> {
        message[at..at + bytes.len()].copy_from_slice(bytes);
        message
    }

    /// Every malformed message is refused with its reason, never a panic.
    #[test]
    fn malformed_messages_are_refused_with_their_reason() {
        let good = encode_output_message("abc", 5, StreamName::Stdout, b"xyz");
        let cases: Vec<(Vec<u8>, BinaryMessageError)> = vec![
            (vec![], BinaryMessageError::Empty),
            (
                with(good.clone(), 0, &[1]),
                BinaryMessageError::UnknownKind(1),
            ),
            (
                with(good.clone(), 0, &[0xff]),
                BinaryMessageError::UnknownKind(0xff),
            ),
            (
                good[..11].to_vec(),
                BinaryMessageError::Truncated {
                    len: 11,
                    needed: 12,
                },
            ),
            (
                vec![0],
                BinaryMessageError::Truncated { len: 1, needed: 12 },
            ),
            (
                with(good.clone(), 1, &[3]),
                BinaryMessageError::UnknownStream(3),
            ),
            (
                with(good.clone(), 1, &[0xff]),
                BinaryMessageError::UnknownStream(0xff),
            ),
            (
                with(good.clone(), 10, &[0, 0]),
                BinaryMessageError::ProcessIdLength(0),
            ),
            (
                with(good.clone(), 10, &[1, 1]),
                BinaryMessageError::ProcessIdLength(257),
            ),
            (
                with(good.clone(), 10, &[0xff, 0xff]),
                BinaryMessageError::ProcessIdLength(65_535),
            ),
            // The id claims more bytes than the message has.
            (
                with(good.clone(), 10, &[0, 7]),
                BinaryMessageError::Truncated {
                    len: 18,
                    needed: 19,
                },
            ),
            // The id takes every byte: nothing is left for the chunk.
            (
                with(good.clone(), 10, &[0, 6]),
                BinaryMessageError::EmptyChunk,
            ),
            (good[..15].to_vec(), BinaryMessageError::EmptyChunk),
            (
                with(good.clone(), 12, &[0xc3, 0x28]),
                BinaryMessageError::ProcessIdNotUtf8,
            ),
            (
                encode_output_message("p", 1, StreamName::Stdout, &chunk(MAX_CHUNK_BYTES + 1)),
                BinaryMessageError::ChunkTooLong(MAX_CHUNK_BYTES + 1),
            ),
        ];
        for (message, expected) in cases {
            assert_eq!(
                decode_output_message(Bytes::from(message.clone())),
                Err(expected.clone()),
                "{message:?}"
            );
            // The reason reads for people.
            assert!(!expected.to_string().is_empty());
        }
    }

    /// JSON texts (with or without leading whitespace) are never taken for binary messages;
    /// the kind byte and the other control bytes always are.
    #[test]
    fn binary_messages_are_told_from_json_by_the_first_byte() {
        for json in [
            &b"{}"[..],
            b" {}",
            b"\t{}",
            b"\n{}",
            b"\r\n{}",
            b"[1]",
            b"\"s\"",
            b"1",
        ] {
            assert!(!is_binary_message(json), "{json:?}");
        }
        assert!(!is_binary_message(b""));
        for b in (0u8..0x20).filter(|b| !matches!(b, b'\t' | b'\n' | b'\r')) {
            assert!(is_binary_message(&[b, b'{']), "{b}");
        }
    }

    /// An id longer than the protocol allows (a caller's bug) is cut on a character boundary,
    /// so the head is still well formed and decodes.
    #[test]
    fn an_overlong_id_is_cut_at_the_limit() {
        let id = format!("a{}", "é".repeat(MAX_PROCESS_ID_BYTES));
        let head = encode_output_head(&id, 1, StreamName::Stdout);
        assert_eq!(head.len(), HEAD_FIXED_BYTES + MAX_PROCESS_ID_BYTES - 1);
        let mut message = head.to_vec();
        message.push(b'x');
        let d = decode_output_message(Bytes::from(message)).unwrap();
        assert!(id.starts_with(&d.process_id));
    }
}
