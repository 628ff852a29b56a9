//! The framing rules, byte by byte, without sockets.

use super::*;

const MASK: [u8; 4] = [0x11, 0x22, 0x33, 0x44];

/// A frame as a client sends it (masked) or a server (not).
fn frame(b0: u8, payload: &[u8], mask: Option<[u8; 4]>) -> Vec<u8> {
    let mut hdr = [0u8; MAX_HEADER_BYTES];
    // Header with FIN from encode_header, then the first byte replaced as asked.
    let n = encode_header(&mut hdr, Opcode::Binary, payload.len(), mask);
    hdr[0] = b0;
    let mut v = hdr[..n].to_vec();
    let mut p = payload.to_vec();
    if let Some(m) = mask {
        apply_mask(&mut p, m);
    }
    v.extend_from_slice(&p);
    v
}

fn decode_all(role: Role, max: usize, bytes: &[u8]) -> Result<Vec<Message>, WsError> {
    let mut d = Decoder::new(role, max);
    d.read_buffer().extend_from_slice(bytes);
    let mut out = Vec::new();
    while let Some(m) = d.decode()? {
        out.push(m);
    }
    Ok(out)
}

fn server_err(bytes: &[u8]) -> WsError {
    decode_all(Role::Server, 1 << 16, bytes).unwrap_err()
}

#[test]
fn masked_binary_frames_decode_byte_by_byte_and_whole() {
    let payloads: [&[u8]; 4] = [b"", b"hello", &[7u8; 300], &[9u8; 70_000]];
    let mut wire = Vec::new();
    for p in payloads {
        wire.extend(frame(0x82, p, Some(MASK)));
    }
    let whole = decode_all(Role::Server, 1 << 17, &wire).unwrap();
    let want: Vec<Message> = payloads
        .iter()
        .map(|p| Message::Binary(Bytes::copy_from_slice(p)))
        .collect();
    assert_eq!(whole, want);
    // One byte at a time: nothing until each frame is whole.
    let mut d = Decoder::new(Role::Server, 1 << 17);
    let mut got = Vec::new();
    for b in &wire {
        d.read_buffer().extend_from_slice(&[*b]);
        while let Some(m) = d.decode().unwrap() {
            got.push(m);
        }
    }
    assert_eq!(got, want);
    assert!(!d.mid_message());
}

#[test]
fn a_client_decodes_unmasked_frames_and_control_frames() {
    let mut wire = frame(0x82, b"data", None);
    wire.extend(frame(0x89, b"ping", None));
    wire.extend(frame(0x8A, b"pong", None));
    wire.extend(frame(0x88, &close_payload(1008, "revoked"), None));
    assert_eq!(
        decode_all(Role::Client, 100, &wire).unwrap(),
        vec![
            Message::Binary(Bytes::from_static(b"data")),
            Message::Ping(Bytes::from_static(b"ping")),
            Message::Pong(Bytes::from_static(b"pong")),
            Message::Close(Some(CloseFrame {
                code: 1008,
                reason: "revoked".into()
            })),
        ]
    );
    assert_eq!(
        decode_all(Role::Client, 100, &frame(0x88, b"", None)).unwrap(),
        vec![Message::Close(None)]
    );
}

#[test]
fn fragmented_messages_are_reassembled_with_control_frames_between() {
    let mut wire = frame(0x02, b"ab", Some(MASK));
    wire.extend(frame(0x89, b"p", Some(MASK)));
    wire.extend(frame(0x00, b"cd", Some(MASK)));
    wire.extend(frame(0x80, b"ef", Some(MASK)));
    wire.extend(frame(0x01, "é".as_bytes(), Some(MASK)));
    wire.extend(frame(0x80, b"!", Some(MASK)));
    assert_eq!(
        decode_all(Role::Server, 100, &wire).unwrap(),
        vec![
            Message::Ping(Bytes::from_static(b"p")),
            Message::Binary(Bytes::from_static(b"abcdef")),
            Message::Text(Bytes::from("é!".as_bytes())),
        ]
    );
}

#[test]
fn reserved_bits_are_a_protocol_error() {
    for b0 in [0xC2, 0xA2, 0x92] {
        let e = server_err(&frame(b0, b"x", Some(MASK)));
        assert_eq!(e, WsError::ReservedBits);
        assert_eq!(e.close_code(), close_code::PROTOCOL);
    }
}

#[test]
fn unknown_opcodes_are_a_protocol_error() {
    for op in [3u8, 7, 0xB, 0xF] {
        let e = server_err(&frame(0x80 | op, b"x", Some(MASK)));
        assert_eq!(e, WsError::BadOpcode(op));
        assert_eq!(e.close_code(), 1002);
    }
}

#[test]
fn masking_must_follow_the_role() {
    let e = server_err(&frame(0x82, b"x", None));
    assert_eq!(e, WsError::UnmaskedClientFrame);
    assert_eq!(e.close_code(), 1002);
    let e = decode_all(Role::Client, 100, &frame(0x82, b"x", Some(MASK))).unwrap_err();
    assert_eq!(e, WsError::MaskedServerFrame);
    assert_eq!(e.close_code(), 1002);
}

#[test]
fn oversized_frames_are_refused_from_the_header_alone() {
    // Only the header of a 1 GiB frame: refused before any payload.
    let mut hdr = [0u8; MAX_HEADER_BYTES];
    let n = encode_header(&mut hdr, Opcode::Binary, 1 << 30, Some(MASK));
    let e = server_err(&hdr[..n]);
    assert_eq!(
        e,
        WsError::Oversized {
            len: 1 << 30,
            max: 1 << 16
        }
    );
    assert_eq!(e.close_code(), close_code::TOO_BIG);
    // The edge: exactly the limit passes, one more byte does not.
    assert!(decode_all(Role::Server, 10, &frame(0x82, &[0; 10], Some(MASK))).is_ok());
    assert_eq!(
        decode_all(Role::Server, 10, &frame(0x82, &[0; 11], Some(MASK))).unwrap_err(),
        WsError::Oversized { len: 11, max: 10 }
    );
    // A fragmented message is bounded as a whole.
    let mut wire = frame(0x02, &[0; 6], Some(MASK));
    wire.extend(frame(0x80, &[0; 5], Some(MASK)));
    assert_eq!(
        decode_all(Role::Server, 10, &wire).unwrap_err(),
        WsError::Oversized { len: 11, max: 10 }
    );
    // A 64-bit length with its top bit set.
    let mut bad = vec![0x82, 0xFF];
    bad.extend_from_slice(&u64::MAX.to_be_bytes());
    bad.extend_from_slice(&MASK);
    assert_eq!(server_err(&bad), WsError::BadLength);
}

#[test]
fn control_frames_may_not_be_fragmented_or_long() {
    let e = server_err(&frame(0x09, b"p", Some(MASK)));
    assert_eq!(e, WsError::FragmentedControl);
    assert_eq!(e.close_code(), 1002);
    let e = server_err(&frame(0x89, &[0; 126], Some(MASK)));
    assert_eq!(e, WsError::ControlTooLong(126));
    assert!(decode_all(Role::Server, 1000, &frame(0x89, &[0; 125], Some(MASK))).is_ok());
}

#[test]
fn continuation_rules() {
    assert_eq!(
        server_err(&frame(0x80, b"x", Some(MASK))),
        WsError::UnexpectedContinuation
    );
    let mut wire = frame(0x02, b"x", Some(MASK));
    wire.extend(frame(0x82, b"y", Some(MASK)));
    assert_eq!(server_err(&wire), WsError::UnfinishedMessage);
}

#[test]
fn bad_close_payloads_are_refused_with_their_code() {
    let e = server_err(&frame(0x88, &[3], Some(MASK)));
    assert_eq!(e, WsError::CloseTooShort);
    assert_eq!(e.close_code(), 1002);
    for code in [0u16, 999, 1004, 1005, 1006, 1015, 1016, 2999, 5000] {
        let e = server_err(&frame(0x88, &code.to_be_bytes(), Some(MASK)));
        assert_eq!(e, WsError::BadCloseCode(code));
        assert_eq!(e.close_code(), 1002);
    }
    let mut bad = 1000u16.to_be_bytes().to_vec();
    bad.extend_from_slice(&[0xff, 0xfe]);
    let e = server_err(&frame(0x88, &bad, Some(MASK)));
    assert_eq!(e, WsError::CloseReasonNotUtf8);
    assert_eq!(e.close_code(), close_code::INVALID_DATA);
    for code in [1000u16, 1003, 1007, 1011, 3000, 4999] {
        assert!(close_code_allowed(code));
    }
}

#[test]
fn text_that_is_not_utf8_is_invalid_data() {
    let e = server_err(&frame(0x81, &[0xC3, 0x28], Some(MASK)));
    assert_eq!(e, WsError::TextNotUtf8);
    assert_eq!(e.close_code(), close_code::INVALID_DATA);
}

#[test]
fn close_payloads_fit_a_control_frame_at_a_char_boundary() {
    let long = "é".repeat(100);
    let p = close_payload(1008, &long);
    assert!(p.len() <= MAX_CONTROL_PAYLOAD);
    let c = parse_close(&p).unwrap().unwrap();
    assert_eq!(c.code, 1008);
    assert!(long.starts_with(&c.reason));
}

#[test]
fn masking_is_its_own_inverse_at_every_length() {
    for len in 0..40 {
        let orig: Vec<u8> = (0..len as u8).collect();
        let mut b = orig.clone();
        apply_mask(&mut b, MASK);
        for (i, (m, o)) in b.iter().zip(&orig).enumerate() {
            assert_eq!(*m, o ^ MASK[i % 4]);
        }
        apply_mask(&mut b, MASK);
        assert_eq!(b, orig);
    }
    let mut keys = MaskKeys::default();
    let distinct: std::collections::HashSet<[u8; 4]> = (0..200).map(|_| keys.next_key()).collect();
    assert!(distinct.len() > 190, "keys repeat: {}", distinct.len());
}

#[test]
fn payloads_are_slices_of_the_read_buffer() {
    let mut d = Decoder::new(Role::Client, 1 << 16);
    d.read_buffer().reserve(1 << 16);
    let start = d.read_buffer().as_ptr() as usize;
    d.read_buffer()
        .extend_from_slice(&frame(0x82, &[5u8; 1000], None));
    let Some(Message::Binary(b)) = d.decode().unwrap() else {
        panic!("no message")
    };
    assert_eq!(b.as_ptr() as usize, start + 4, "no copy of the payload");
    d.release_if_empty();
    assert_eq!(d.read_buffer().capacity(), 0);
    // Below `share_from`, a copy: the buffer is not pinned by a small message.
    let mut d = Decoder::new(Role::Client, 1 << 16).share_from(2000);
    d.read_buffer().reserve(1 << 16);
    let start = d.read_buffer().as_ptr() as usize;
    d.read_buffer()
        .extend_from_slice(&frame(0x82, &[5u8; 1000], None));
    let Some(Message::Binary(b)) = d.decode().unwrap() else {
        panic!("no message")
    };
    assert_ne!(b.as_ptr() as usize, start + 4);
    assert_eq!(&b[..], &[5u8; 1000][..]);
}

#[test]
fn boundaries_stop_at_the_end_of_the_head_and_of_each_frame() {
    let head = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n";
    let f1 = frame(0x82, &[1u8; 300], None);
    let f2 = frame(0x89, b"", None);
    let f3 = frame(0x82, &[2u8; 70_000], Some(MASK));
    let mut all = head.to_vec();
    all.extend(&f1);
    all.extend(&f2);
    all.extend(&f3);
    let mut b = Boundaries::http_then_frames();
    let mut at = 0;
    let mut cuts = Vec::new();
    while at < all.len() {
        let n = b.take(&all[at..]);
        assert!(n > 0);
        at += n;
        cuts.push(at);
    }
    let h = head.len();
    assert_eq!(
        cuts,
        vec![h, h + f1.len(), h + f1.len() + f2.len(), all.len()]
    );
    // Fed in small pieces, it never crosses an end.
    let mut b = Boundaries::frames();
    let frames = [f1.clone(), f2.clone(), f3.clone()].concat();
    let mut at = 0;
    let mut ends = Vec::new();
    while at < frames.len() {
        let piece = &frames[at..(at + 7).min(frames.len())];
        let n = b.take(piece);
        at += n;
        if [f1.len(), f1.len() + f2.len(), frames.len()].contains(&at) {
            ends.push(at);
        }
    }
    assert_eq!(ends, vec![f1.len(), f1.len() + f2.len(), frames.len()]);
}

/// A refused upgrade's head is not cut from its body: the library reads the refusal's words
/// from the bytes that came with the head (a relay's `404` says what it is). A `101` with a
/// body-like tail is still cut at the head, and a status that only starts like `101` (`1010`
/// is no status; `201`) is a refusal.
#[test]
fn boundaries_hand_on_a_refusals_body_with_its_head() {
    let refusal = b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\n\r\nno route\n";
    let mut b = Boundaries::http_then_frames();
    assert_eq!(b.take(refusal), refusal.len());
    assert_eq!(b.take(b"more"), 4);
    for status in [
        &b"HTTP/1.1 201 Created"[..],
        b"HTTP/1.1 100 Continue",
        b"HTTP/1.1 10",
    ] {
        let mut head = status.to_vec();
        head.extend_from_slice(b"\r\n\r\n");
        let mut all = head.clone();
        all.extend_from_slice(&[0x81, 0]);
        let mut b = Boundaries::http_then_frames();
        assert_eq!(
            b.take(&all),
            all.len(),
            "{:?}",
            String::from_utf8_lossy(status)
        );
    }
    // Fed a byte at a time, a `101` head still ends where it ends.
    let head = b"HTTP/1.1 101 Switching Protocols\r\n\r\n";
    let mut all = head.to_vec();
    all.extend_from_slice(&[0x81, 0]);
    let mut b = Boundaries::http_then_frames();
    let mut at = 0;
    while at < head.len() {
        at += b.take(&all[at..at + 1]);
    }
    assert_eq!(at, head.len());
    assert_eq!(b.take(&all[at..]), 2);
}
