//! Where a WebSocket connection's units end in its byte stream (the HTTP head, then each
//! frame), so that a library reading above can be handed whole units and the connection taken
//! from it without losing bytes. Reads headers' lengths only; every rule is checked by the
//! decoder or the library above, never here.

use super::MAX_HEADER_BYTES;

/// Where the units of a WebSocket connection end in its byte stream: the HTTP head (for the
/// client side of an upgrade, the response ends at its empty line), then each frame. A reader
/// that hands a WebSocket library at most [`take`](Self::take) bytes at a time stops at each
/// end, so the library never buffers bytes past the message it returned: the connection can
/// then be taken from it without losing any.
#[derive(Debug, Clone)]
pub struct Boundaries {
    state: Unit,
}

#[derive(Debug, Clone)]
enum Unit {
    /// Inside the HTTP head: how many bytes of `\r\n\r\n` were just seen, how many bytes of
    /// the head came before, and whether its status so far reads `101`.
    Head {
        seen: usize,
        at: usize,
        switching: bool,
    },
    /// After the head of a refused upgrade (any status but `101`): no frames follow, only the
    /// answer's body, which is handed on as it comes (the library reads the refusal's words
    /// from the bytes that arrived with the head).
    Body,
    /// Inside a frame header: its bytes so far.
    FrameHeader([u8; MAX_HEADER_BYTES], usize),
    /// Inside a frame's payload: bytes left.
    Payload(u64),
}

impl Boundaries {
    /// A stream of frames from its first byte (the server side, after the upgrade).
    pub fn frames() -> Self {
        Boundaries {
            state: Unit::FrameHeader([0; MAX_HEADER_BYTES], 0),
        }
    }

    /// An HTTP response head, then frames (the client side of an upgrade).
    pub fn http_then_frames() -> Self {
        Boundaries {
            state: Unit::Head {
                seen: 0,
                at: 0,
                switching: true,
            },
        }
    }

    /// How many of `bytes` (the next ones of the stream) to hand on now: up to the end of the
    /// current unit, at least one when `bytes` is not empty. The state moves past them.
    pub fn take(&mut self, bytes: &[u8]) -> usize {
        let mut n = 0;
        while n < bytes.len() {
            match &mut self.state {
                Unit::Head {
                    seen,
                    at,
                    switching,
                } => {
                    const END: &[u8; 4] = b"\r\n\r\n";
                    // `HTTP/1.1 101 …`: the status code is the head's bytes 9 to 11.
                    const STATUS: (usize, &[u8; 3]) = (9, b"101");
                    let b = bytes[n];
                    if let Some(want) = at.checked_sub(STATUS.0).and_then(|i| STATUS.1.get(i)) {
                        *switching &= b == *want;
                    }
                    *at += 1;
                    n += 1;
                    *seen = if b == END[*seen] {
                        *seen + 1
                    } else if b == b'\r' {
                        1
                    } else {
                        0
                    };
                    if *seen == END.len() {
                        if !*switching {
                            self.state = Unit::Body;
                            return bytes.len();
                        }
                        self.state = Unit::FrameHeader([0; MAX_HEADER_BYTES], 0);
                        return n;
                    }
                }
                Unit::Body => return bytes.len(),
                Unit::FrameHeader(h, have) => {
                    h[*have] = bytes[n];
                    *have += 1;
                    n += 1;
                    if let Some(len) = header_total(&h[..*have]) {
                        if *have == len.0 {
                            let payload = len.1;
                            self.state = Unit::Payload(payload);
                            if payload == 0 {
                                self.state = Unit::FrameHeader([0; MAX_HEADER_BYTES], 0);
                                return n;
                            }
                        }
                    }
                }
                Unit::Payload(left) => {
                    let k = (*left).min((bytes.len() - n) as u64);
                    n += k as usize;
                    *left -= k;
                    if *left == 0 {
                        self.state = Unit::FrameHeader([0; MAX_HEADER_BYTES], 0);
                        return n;
                    }
                }
            }
        }
        n
    }
}

/// A header's total length and its payload length, once enough of it is known (no rules
/// checked: the library above does).
fn header_total(h: &[u8]) -> Option<(usize, u64)> {
    let b1 = *h.get(1)?;
    let mask = if b1 & 0x80 != 0 { 4 } else { 0 };
    match b1 & 0x7F {
        126 => {
            let l = h.get(2..4)?;
            Some((4 + mask, u64::from(u16::from_be_bytes([l[0], l[1]]))))
        }
        127 => {
            let l = h.get(2..10)?;
            let mut a = [0u8; 8];
            a.copy_from_slice(l);
            Some((10 + mask, u64::from_be_bytes(a)))
        }
        n => Some((2 + mask, u64::from(n))),
    }
}
