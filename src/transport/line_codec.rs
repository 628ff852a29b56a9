//! Newline framing for stdio and plain TCP (`protocol.md` §1): one message per line, a
//! trailing `\r` tolerated, blank lines skipped, and a size limit enforced while scanning so
//! that no more than the limit plus one read is ever buffered.

use bytes::BytesMut;
use tokio_util::codec::{Decoder, Encoder};

use super::{binary_unsupported, FramingError, OutMessage};

/// Line codec with a message size limit.
#[derive(Debug)]
pub struct LineCodec {
    max: usize,
    /// Bytes of the buffer already scanned for `\n`.
    scanned: usize,
}

impl LineCodec {
    /// A codec rejecting messages over `max` bytes.
    pub fn new(max: usize) -> Self {
        LineCodec { max, scanned: 0 }
    }
}

impl Decoder for LineCodec {
    type Item = Vec<u8>;
    type Error = FramingError;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Vec<u8>>, FramingError> {
        loop {
            let found = memchr::memchr(b'\n', &buf[self.scanned..]);
            match found {
                Some(off) => {
                    let end = self.scanned + off;
                    self.scanned = 0;
                    let mut line = buf.split_to(end + 1);
                    line.truncate(end);
                    if line.last() == Some(&b'\r') {
                        line.truncate(end - 1);
                    }
                    if line.len() > self.max {
                        return Err(FramingError::TooLarge { limit: self.max });
                    }
                    if line.iter().all(|b| b.is_ascii_whitespace()) {
                        continue;
                    }
                    return Ok(Some(line.to_vec()));
                }
                None => {
                    // A message may end with `\r\n`: allow one byte for the `\r`.
                    if buf.len() > self.max + 1 {
                        return Err(FramingError::TooLarge { limit: self.max });
                    }
                    self.scanned = buf.len();
                    return Ok(None);
                }
            }
        }
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> Result<Option<Vec<u8>>, FramingError> {
        match self.decode(buf)? {
            Some(m) => Ok(Some(m)),
            None => {
                // A last message without a newline still counts.
                self.scanned = 0;
                if buf.iter().all(|b| b.is_ascii_whitespace()) {
                    buf.clear();
                    return Ok(None);
                }
                let line = buf.split_to(buf.len());
                let mut v = line.to_vec();
                if v.last() == Some(&b'\r') {
                    v.pop();
                }
                Ok(Some(v))
            }
        }
    }
}

impl Encoder<String> for LineCodec {
    type Error = std::io::Error;

    fn encode(&mut self, item: String, dst: &mut BytesMut) -> Result<(), std::io::Error> {
        dst.reserve(item.len() + 1);
        dst.extend_from_slice(item.as_bytes());
        dst.extend_from_slice(b"\n");
        Ok(())
    }
}

/// Lines carry JSON texts only: a binary message is refused (`protocol.md` §5.1: stdio stays
/// JSON lines, and the server never negotiates binary output on it).
impl Encoder<OutMessage> for LineCodec {
    type Error = std::io::Error;

    fn encode(&mut self, item: OutMessage, dst: &mut BytesMut) -> Result<(), std::io::Error> {
        match item {
            OutMessage::Text(text) => self.encode(text, dst),
            OutMessage::Binary { .. } => Err(binary_unsupported("a line transport")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(codec: &mut LineCodec, input: &[u8]) -> Vec<Result<Vec<u8>, String>> {
        let mut buf = BytesMut::from(input);
        let mut out = Vec::new();
        loop {
            match codec.decode(&mut buf) {
                Ok(Some(m)) => out.push(Ok(m)),
                Ok(None) => break,
                Err(e) => {
                    out.push(Err(e.to_string()));
                    break;
                }
            }
        }
        out
    }

    #[test]
    fn splits_lines_tolerates_cr_and_skips_blanks() {
        let mut c = LineCodec::new(100);
        let out = decode_all(&mut c, b"a\r\n\n  \nbb\nc");
        assert_eq!(out, vec![Ok(b"a".to_vec()), Ok(b"bb".to_vec())]);
    }

    #[test]
    fn exactly_the_limit_passes_and_one_more_fails() {
        let mut c = LineCodec::new(4);
        assert_eq!(decode_all(&mut c, b"abcd\n"), vec![Ok(b"abcd".to_vec())]);
        let mut c = LineCodec::new(4);
        assert!(decode_all(&mut c, b"abcde\n")[0].is_err());
    }

    #[test]
    fn overrun_is_detected_before_the_newline_arrives() {
        let mut c = LineCodec::new(4);
        let mut buf = BytesMut::from(&b"abcdef"[..]);
        assert!(matches!(
            c.decode(&mut buf),
            Err(FramingError::TooLarge { limit: 4 })
        ));
    }

    #[test]
    fn a_binary_message_is_refused_and_a_text_is_a_line() {
        let mut c = LineCodec::new(100);
        let mut dst = BytesMut::new();
        c.encode(OutMessage::Text("{}".into()), &mut dst).unwrap();
        assert_eq!(&dst[..], b"{}\n");
        let binary = OutMessage::Binary {
            head: bytes::Bytes::from_static(&[0]),
            payload: bytes::Bytes::from_static(b"x"),
        };
        let e = c.encode(binary, &mut dst).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
        assert_eq!(&dst[..], b"{}\n", "nothing of it was written");
    }

    #[test]
    fn incremental_input_is_not_rescanned_wrongly() {
        let mut c = LineCodec::new(100);
        let mut buf = BytesMut::from(&b"ab"[..]);
        assert_eq!(c.decode(&mut buf).unwrap(), None);
        buf.extend_from_slice(b"c\nd");
        assert_eq!(c.decode(&mut buf).unwrap(), Some(b"abc".to_vec()));
        assert_eq!(c.decode(&mut buf).unwrap(), None);
        assert_eq!(c.decode_eof(&mut buf).unwrap(), Some(b"d".to_vec()));
    }
}
