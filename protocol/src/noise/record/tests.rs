use super::*;
use crate::keys::Keypair;
use crate::noise::handshake::{read_hello, ClientHandshake};

fn channel() -> (RecordSealer, RecordOpener, RecordSealer, RecordOpener) {
    let client = Keypair::generate().unwrap();
    let server = Keypair::generate().unwrap();
    let sid = [3u8; 16];
    let (c, m1) = ClientHandshake::start(&client, &server.public, "", &sid, None, 1).unwrap();
    let (m2, sk) = read_hello(&server, "", &sid, &m1)
        .unwrap()
        .accept("t")
        .unwrap();
    let (ck, _) = c.finish(&m2).unwrap();
    (
        RecordSealer::new(ck.clone()),
        RecordOpener::new(ck, 1 << 20),
        RecordSealer::new(sk.clone()),
        RecordOpener::new(sk, 1 << 20),
    )
}

#[test]
fn messages_cross_record_boundaries() {
    let (mut cs, _, _, mut so) = channel();
    let big = vec![b'x'; 300 * 1024];
    let records = cs.seal_message(&big).unwrap();
    assert_eq!(records.len(), 5, "300 KiB + 4 bytes in 65,518-byte records");
    assert_eq!(records[0].0, 1, "numbering starts at 1");
    let mut got = Vec::new();
    for (n, ct) in &records {
        assert!(ct.len() <= 65_535);
        if let Opened::Messages(m) = so.open(*n, ct).unwrap() {
            got.extend(m);
        }
    }
    assert_eq!(got, vec![big]);
}

#[test]
fn replays_tampering_and_zero_are_refused() {
    let (mut cs, _, _, mut so) = channel();
    let (n, ct) = cs.seal_message(b"{}").unwrap().remove(0);
    assert!(so.open(n, &ct).is_ok());
    assert_eq!(so.open(n, &ct), Err(RecordError::Replay(1)));
    let (n2, mut ct2) = cs.seal_message(b"{}").unwrap().remove(0);
    ct2[0] ^= 0x80;
    assert_eq!(so.open(n2, &ct2), Err(RecordError::Decrypt));
    assert_eq!(so.open(0, &ct), Err(RecordError::ZeroNonce));
    // A record under another nonce does not decrypt.
    let (_, ct3) = cs.seal_message(b"{}").unwrap().remove(0);
    assert_eq!(so.open(99, &ct3), Err(RecordError::Decrypt));
}

#[test]
fn frames_sealed_in_place_match_records() {
    use crate::frame::Frame;
    let (mut cs, _, _, mut so) = channel();
    let big = vec![b'y'; 200 * 1024];
    let frames = cs.seal_message_frames(&[9; 16], &big).unwrap();
    assert_eq!(frames.len(), 4);
    let mut got = Vec::new();
    for (i, f) in frames.into_iter().enumerate() {
        let f = Frame::decode_owned(f).unwrap();
        assert_eq!(f.seq, i as u64 + 1);
        assert_eq!(f.stream, [9; 16]);
        // Alternate the in-place path (sole owner) and the copying one (shared buffer).
        let keep = (i % 2 == 1).then(|| (f.payload.clone(), f.payload.to_vec()));
        if let Opened::Messages(m) = so.open_owned(f.seq, f.payload).unwrap() {
            got.extend(m);
        }
        if let Some((shared, before)) = keep {
            assert_eq!(
                &shared[..],
                &before[..],
                "a shared buffer is never decrypted in place"
            );
            assert_eq!(so.open(f.seq, &shared), Err(RecordError::Replay(f.seq)));
        }
    }
    assert_eq!(got, vec![big]);
    // Tiny messages too: the prefix alone spans the record start.
    let f = cs.seal_message_frames(&[9; 16], b"x").unwrap().remove(0);
    let f = Frame::decode_owned(f).unwrap();
    assert_eq!(
        so.open(f.seq, &f.payload).unwrap(),
        Opened::Messages(vec![b"x".to_vec()])
    );
}

/// A message sealed from parts is the same message as their concatenation, at every
/// cut: parts that are empty, that end at a record boundary, or that span several records.
#[test]
fn parts_seal_as_their_concatenation() {
    let (mut cs, _, _, mut so) = channel();
    let big: Vec<u8> = (0..2 * MAX_RECORD_BODY + 77)
        .map(|i| (i % 251) as u8)
        .collect();
    let cuts: [&[usize]; 5] = [
        &[0],
        &[12],
        &[0, 0, 5],
        &[MAX_RECORD_BODY - 4],
        &[1, MAX_RECORD_BODY, MAX_RECORD_BODY + 3],
    ];
    for cut in cuts {
        let mut parts: Vec<&[u8]> = Vec::new();
        let mut at = 0;
        for &c in cut {
            parts.push(&big[at..c]);
            at = c;
        }
        parts.push(&big[at..]);
        let frames = cs.seal_message_parts(&[9; 16], &parts).unwrap();
        let mut got = Vec::new();
        for f in frames {
            let f = crate::frame::Frame::decode_owned(f).unwrap();
            if let Opened::Messages(m) = so.open_owned(f.seq, f.payload).unwrap() {
                got.extend(m);
            }
        }
        assert_eq!(got, vec![big.clone()], "cut at {cut:?}");
    }
}

#[test]
fn close_record_carries_its_reason() {
    let (_, mut co, mut ss, _) = channel();
    let (n, ct) = ss.seal_close("bye").unwrap();
    assert_eq!(co.open(n, &ct).unwrap(), Opened::Close("bye".into()));
}

#[test]
fn window_accepts_out_of_order_once() {
    let mut w = ReplayWindow::default();
    for n in [3, 1, 2] {
        w.check(n).unwrap();
        w.mark(n);
    }
    assert!(w.check(2).is_err());
    w.mark(200);
    assert!(w.check(72).is_err(), "older than the window");
    assert!(w.check(73).is_ok());
}

#[test]
fn deframer_reassembles_at_every_cut() {
    let mut stream = Vec::new();
    for m in [&b"first"[..], b"x", &[7u8; 300][..]] {
        stream.extend_from_slice(&(m.len() as u32).to_be_bytes());
        stream.extend_from_slice(m);
    }
    for cut in 0..=stream.len() {
        let mut d = MessageDeframer::new(1000);
        let mut got = d.push(&stream[..cut]).unwrap();
        got.extend(d.push(&stream[cut..]).unwrap());
        assert_eq!(got.len(), 3, "cut at {cut}");
        assert_eq!((&got[0][..], &got[1][..]), (&b"first"[..], &b"x"[..]));
        assert_eq!(got[2], vec![7u8; 300]);
    }
    // One byte at a time.
    let mut d = MessageDeframer::new(1000);
    let got: Vec<Vec<u8>> = stream.iter().flat_map(|b| d.push(&[*b]).unwrap()).collect();
    assert_eq!(got.len(), 3);
}

#[test]
fn a_declared_length_reserves_at_most_the_cap() {
    let big = MAX_MESSAGE_RESERVE * 4;
    let mut d = MessageDeframer::new(big);
    assert_eq!(d.push(&(big as u32).to_be_bytes()), Ok(vec![]));
    let cap = d.partial.as_ref().map(|(v, _)| v.capacity()).unwrap_or(0);
    assert!(cap <= MAX_MESSAGE_RESERVE, "reserved {cap}");
    let body = vec![1u8; big];
    assert_eq!(d.push(&body[..big - 1]), Ok(vec![]));
    let cap = d.partial.as_ref().map(|(v, _)| v.capacity()).unwrap_or(0);
    assert!(cap <= big, "grew to {cap}, past the declared {big}");
    assert_eq!(d.push(&body[big - 1..]), Ok(vec![body]));
}

/// A length that does not fit the 4-byte prefix is an error, never a truncated prefix
/// (a 4 GiB message once went out declared as 0 bytes long).
#[test]
fn a_length_prefix_is_checked_not_truncated() {
    assert_eq!(length_prefix(1), Ok([0, 0, 0, 1]));
    assert_eq!(length_prefix(u32::MAX as usize), Ok([0xff; 4]));
    let over = u32::MAX as usize + 1;
    assert_eq!(length_prefix(over), Err(RecordError::MessageTooLong(over)));
}

/// A budget of `max` bytes counted in a shared cell: the deframer's side of the budget
/// contract, without the exec server's `ByteBudget` (whose own tests are in
/// `execrelay::bounds::reassembly`).
#[derive(Debug, Clone)]
struct Capped {
    used: std::rc::Rc<std::cell::Cell<usize>>,
    max: usize,
}

#[derive(Debug, Default)]
struct CappedCharge {
    of: Option<Capped>,
    bytes: usize,
}

impl Capped {
    fn take(&self, n: usize) -> Result<(), OverBudget> {
        match self.used.get().checked_add(n) {
            Some(total) if total <= self.max => {
                self.used.set(total);
                Ok(())
            }
            _ => Err(OverBudget {
                limit: "capped",
                max: self.max,
            }),
        }
    }
}

impl ReassemblyBudget for Capped {
    type Charge = CappedCharge;
    fn try_charge(&self, bytes: usize) -> Result<CappedCharge, OverBudget> {
        self.take(bytes)?;
        Ok(CappedCharge {
            of: Some(self.clone()),
            bytes,
        })
    }
}

impl BudgetCharge for CappedCharge {
    fn bytes(&self) -> usize {
        self.bytes
    }
    fn try_grow(&mut self, more: usize) -> Result<(), OverBudget> {
        if let Some(of) = &self.of {
            of.take(more)?;
        }
        self.bytes += more;
        Ok(())
    }
}

impl Drop for CappedCharge {
    fn drop(&mut self) {
        if let Some(of) = &self.of {
            of.used.set(of.used.get() - self.bytes);
        }
    }
}

/// The deframer charges a message's reserve at its prefix and its growth before it
/// allocates, fails with the budget's refusal, and hands the charge of a completed
/// message to the caller (given back when dropped, or at the next push if not taken).
#[test]
fn the_deframer_charges_its_budget_and_reports_its_refusal() {
    let used = std::rc::Rc::new(std::cell::Cell::new(0));
    let budget = Capped {
        used: used.clone(),
        max: 10,
    };
    let mut d = MessageDeframer::with_budget(100, budget.clone());
    assert_eq!(d.push(&[0, 0, 0, 4, b'a']), Ok(vec![]));
    assert_eq!((d.held_bytes(), used.get()), (4, 4));
    assert_eq!(d.push(b"bcd"), Ok(vec![b"abcd".to_vec()]));
    assert_eq!(
        (d.held_bytes(), used.get()),
        (0, 4),
        "complete: the charge waits"
    );
    let charge = d.take_charge();
    assert_eq!(charge.bytes(), 4);
    drop(charge);
    assert_eq!(used.get(), 0);
    assert_eq!(d.push(&[0, 0, 0, 2, b'o', b'k']), Ok(vec![b"ok".to_vec()]));
    assert_eq!(used.get(), 2);
    assert_eq!(
        d.push(&[0, 0, 0, 11]),
        Err(RecordError::OverBudget(OverBudget {
            limit: "capped",
            max: 10
        }))
    );
    assert_eq!(used.get(), 0, "the untaken charge went back at the push");
}

#[test]
fn deframer_rejects_bad_lengths_at_the_prefix() {
    let mut d = MessageDeframer::new(10);
    assert_eq!(d.push(&[0, 0, 0, 0]), Err(RecordError::BadLength(0)));
    let mut d = MessageDeframer::new(10);
    assert_eq!(d.push(&[0, 0, 0, 11]), Err(RecordError::BadLength(11)));
    let mut d = MessageDeframer::new(10);
    assert_eq!(d.push(&[0, 0, 0, 2, b'a']), Ok(vec![]));
    assert_eq!(
        d.push(&[b'b', 0, 0, 0, 1, b'c']),
        Ok(vec![b"ab".to_vec(), b"c".to_vec()])
    );
}
