//! Two endpoints (client and server) wired back to back on a simulated clock: streams,
//! flow control, resets, budgets and keepalive of `secure-transport.md` §5, §7, §8, §6.4.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use execrelay_protocol::config::{BucketConfig, EndpointConfig, HandshakeBudgetPolicy};
use execrelay_protocol::endpoint::{Event, ResetCause, SendError};
use execrelay_protocol::frame::{FrameType, MAX_FRAME_BYTES, MAX_PAYLOAD_BYTES};
use execrelay_protocol::reason::{CloseReason, DropReason, Reason};
use execrelay_protocol::transmit::Transmit;

#[test]
fn open_accept_then_data_both_ways_with_exact_bytes_and_seqs() {
    let clock = Clock::new();
    let (mut c, mut s) = (client(clock.now, cfg()), server(clock.now, cfg()));
    c.open(sid(1), Bytes::from_static(b"msg1")).unwrap();
    let w = pump(&mut c, &mut s, clock.now);
    assert_eq!(w.ab.len(), 1);
    assert_eq!(
        (w.ab[0].ftype, w.ab[0].window, w.ab[0].ack),
        (FrameType::Open, 16, 0)
    );
    assert!(matches!(&events(&mut s)[..], [Event::OpenRequested { .. }]));
    assert_eq!(
        c.send_ready(&sid(1)),
        Err(SendError::NotOpen),
        "no data before ACCEPT"
    );
    s.accept(sid(1), Bytes::from_static(b"msg2")).unwrap();
    let w = pump(&mut c, &mut s, clock.now);
    assert_eq!((w.ba[0].ftype, w.ba[0].window), (FrameType::Accept, 16));
    assert!(matches!(&events(&mut c)[..], [Event::Accepted { .. }]));

    for (i, p) in [&b"alpha"[..], b"beta", b"gamma"].iter().enumerate() {
        assert_eq!(c.send_ready(&sid(1)), Ok(i as u64 + 1));
        assert_eq!(c.send(&sid(1), Bytes::copy_from_slice(p)), Ok(i as u64 + 1));
    }
    for p in [&b"x"[..], b"yy"] {
        s.send(&sid(1), Bytes::copy_from_slice(p)).unwrap();
    }
    pump(&mut c, &mut s, clock.now);
    assert_eq!(
        data_of(&events(&mut s)),
        vec![
            (sid(1), 1, b"alpha".to_vec()),
            (sid(1), 2, b"beta".to_vec()),
            (sid(1), 3, b"gamma".to_vec())
        ]
    );
    assert_eq!(
        data_of(&events(&mut c)),
        vec![(sid(1), 1, b"x".to_vec()), (sid(1), 2, b"yy".to_vec())]
    );
    assert_eq!(s.counters().data_bytes_in, 14);
}

#[test]
fn a_slow_consumer_stalls_its_sender_at_exactly_the_window_and_it_resumes_on_ack() {
    let clock = Clock::new();
    let (mut c, mut s) = (client(clock.now, cfg()), server(clock.now, cfg()));
    establish(&mut c, &mut s, clock.now, sid(1));
    let payload = |n: u64| Bytes::from(format!("record {n}"));
    let mut next = 1u64;
    let mut send_all = |c: &mut execrelay_protocol::endpoint::Endpoint| {
        let mut sent = 0;
        while c.send_ready(&sid(1)).is_ok() {
            assert_eq!(c.send(&sid(1), payload(next)), Ok(next));
            next += 1;
            sent += 1;
        }
        sent
    };
    assert_eq!(send_all(&mut c), 16, "the window is 16 records");
    assert_eq!(c.send(&sid(1), payload(99)), Err(SendError::Blocked));
    pump(&mut c, &mut s, clock.now);
    let mut got = data_of(&events(&mut s));
    assert_eq!(got.len(), 16);

    // Seven consumed: under half a window, no ACK; the sender stays stalled.
    for seq in 1..=7 {
        s.consumed(&sid(1), seq).unwrap();
    }
    let w = pump(&mut c, &mut s, clock.now);
    assert!(w.ba.is_empty(), "no ACK before half a window: {:?}", w.ba);
    assert_eq!(c.send_ready(&sid(1)), Err(SendError::Blocked));
    assert!(events(&mut c).is_empty());

    // The eighth: a bare ACK (ack 8, window 16), and the sender hears of its credit.
    s.consumed(&sid(1), 8).unwrap();
    let w = pump(&mut c, &mut s, clock.now);
    assert_eq!(w.ba.len(), 1);
    assert_eq!(
        (w.ba[0].ftype, w.ba[0].ack, w.ba[0].window),
        (FrameType::Ack, 8, 16)
    );
    assert_eq!(events(&mut c), vec![Event::Writable { stream: sid(1) }]);
    assert_eq!(c.credit(&sid(1)), 8);
    assert_eq!(send_all(&mut c), 8);
    pump(&mut c, &mut s, clock.now);
    got.extend(data_of(&events(&mut s)));
    for seq in 9..=24 {
        s.consumed(&sid(1), seq).unwrap();
    }
    pump(&mut c, &mut s, clock.now);
    // No loss, no repeat, in order, exact bytes.
    let want: Vec<_> = (1..=24).map(|n| (sid(1), n, payload(n).to_vec())).collect();
    assert_eq!(got, want);
    assert_eq!(
        c.credit(&sid(1)),
        16,
        "everything consumed: a full window again"
    );
}

#[test]
fn every_data_frame_carries_the_senders_current_report() {
    let clock = Clock::new();
    let (mut c, mut s) = (client(clock.now, cfg()), server(clock.now, cfg()));
    establish(&mut c, &mut s, clock.now, sid(1));
    s.send(&sid(1), Bytes::from_static(b"a")).unwrap();
    pump(&mut c, &mut s, clock.now);
    c.consumed(&sid(1), 1).unwrap(); // below half a window: no bare ACK
    c.send(&sid(1), Bytes::from_static(b"b")).unwrap();
    let w = pump(&mut c, &mut s, clock.now);
    assert_eq!(w.ab.len(), 1, "the DATA frame carries the ack, no bare ACK");
    assert_eq!(
        (w.ab[0].ftype, w.ab[0].ack, w.ab[0].window),
        (FrameType::Data, 1, 16)
    );
}

#[test]
fn a_hand_written_sender_past_its_window_is_reset_alone_and_another_stream_continues() {
    let clock = Clock::new();
    let (mut c, mut s) = (client(clock.now, cfg()), server(clock.now, cfg()));
    establish(&mut c, &mut s, clock.now, sid(1));
    establish(&mut c, &mut s, clock.now, sid(2));
    for seq in 1..=16 {
        s.handle_frame(clock.now, raw(FrameType::Data, sid(1), seq, 0, 16, b"x"));
    }
    assert_eq!(data_of(&events(&mut s)).len(), 16);
    s.handle_frame(clock.now, raw(FrameType::Data, sid(1), 17, 0, 16, b"x"));
    assert_eq!(
        events(&mut s),
        vec![Event::Reset {
            stream: sid(1),
            cause: ResetCause::Local(Reason::WindowExceeded)
        }]
    );
    assert_eq!(s.counters().resets(Reason::WindowExceeded), 1);
    // The rest of its flight is free and harmless.
    s.handle_frame(clock.now, raw(FrameType::Data, sid(1), 18, 0, 16, b"x"));
    assert_eq!(s.counters().drops(DropReason::ClosedStream), 1);
    assert_eq!(s.counters().drops(DropReason::UnknownStream), 0);

    c.send(&sid(2), Bytes::from_static(b"still here")).unwrap();
    s.send(&sid(2), Bytes::from_static(b"and here")).unwrap();
    let w = pump(&mut c, &mut s, clock.now);
    assert_eq!(w.ba[0].ftype, FrameType::Reset);
    assert_eq!(&w.ba[0].payload[..], b"window_exceeded");
    let ev = events(&mut c);
    assert!(ev.contains(&Event::Reset {
        stream: sid(1),
        cause: ResetCause::Peer("window_exceeded".into())
    }));
    assert_eq!(data_of(&ev), vec![(sid(2), 1, b"and here".to_vec())]);
    assert_eq!(
        data_of(&events(&mut s)),
        vec![(sid(2), 1, b"still here".to_vec())]
    );
    assert!(s.is_closed().is_none() && c.is_closed().is_none());
}

#[test]
fn out_of_order_records_reset_the_stream() {
    let clock = Clock::new();
    let (mut c, mut s) = (client(clock.now, cfg()), server(clock.now, cfg()));
    establish(&mut c, &mut s, clock.now, sid(1));
    s.handle_frame(clock.now, raw(FrameType::Data, sid(1), 2, 0, 16, b"x"));
    assert_eq!(
        events(&mut s),
        vec![Event::Reset {
            stream: sid(1),
            cause: ResetCause::Local(Reason::MalformedFrame)
        }]
    );
}

#[test]
fn reset_both_ways_and_finish_sends_its_records_first() {
    let clock = Clock::new();
    let (mut c, mut s) = (client(clock.now, cfg()), server(clock.now, cfg()));
    for n in 1..=3 {
        establish(&mut c, &mut s, clock.now, sid(n));
    }
    c.reset(sid(1), Reason::Closed).unwrap();
    s.reset(sid(2), Reason::BadRecord).unwrap();
    pump(&mut c, &mut s, clock.now);
    assert_eq!(
        events(&mut s),
        vec![Event::Reset {
            stream: sid(1),
            cause: ResetCause::Peer("closed".into())
        }]
    );
    assert_eq!(
        events(&mut c),
        vec![Event::Reset {
            stream: sid(2),
            cause: ResetCause::Peer("bad_record".into())
        }]
    );
    assert_eq!(c.send(&sid(1), Bytes::new()), Err(SendError::NotOpen));

    s.send(&sid(3), Bytes::from_static(b"last words")).unwrap();
    s.send(&sid(3), Bytes::from_static(b"close record"))
        .unwrap();
    s.finish(sid(3), Reason::Closed).unwrap();
    assert_eq!(s.send_ready(&sid(3)), Err(SendError::NotOpen));
    let w = pump(&mut c, &mut s, clock.now);
    let kinds: Vec<_> = w.ba.iter().map(|f| (f.ftype, f.seq)).collect();
    assert_eq!(
        kinds,
        vec![
            (FrameType::Data, 1),
            (FrameType::Data, 2),
            (FrameType::Reset, 0)
        ]
    );
    let ev = events(&mut c);
    assert_eq!(data_of(&ev).len(), 2);
    assert_eq!(
        ev.last(),
        Some(&Event::Reset {
            stream: sid(3),
            cause: ResetCause::Peer("closed".into())
        })
    );
    assert_eq!(s.stream_count(), 0);
    assert_eq!(c.stream_count(), 0);
}

fn tight(f: impl FnOnce(&mut EndpointConfig)) -> EndpointConfig {
    let mut c = cfg();
    f(&mut c);
    c
}

#[test]
fn the_malformed_budget_closes_the_link_one_frame_past_its_edge() {
    let clock = Clock::new();
    let scfg = tight(|c| {
        c.malformed_frames = BucketConfig {
            burst: 3,
            refill: Duration::from_secs(60),
        }
    });
    let (mut c, mut s) = (client(clock.now, cfg()), server(clock.now, scfg));
    establish(&mut c, &mut s, clock.now, sid(1));
    s.handle_frame(clock.now, vec![1, 2, 3]); // truncated
    s.handle_frame(clock.now, raw(FrameType::Resume, sid(9), 0, 0, 0, b"")); // reserved
    s.handle_frame(clock.now, raw(FrameType::Accept, sid(9), 0, 0, 16, b"")); // wrong way
    assert_eq!(
        s.is_closed(),
        None,
        "three malformed frames are within a burst of 3"
    );
    assert_eq!(s.counters().drops(DropReason::Malformed), 3);
    c.send(&sid(1), Bytes::from_static(b"ok")).unwrap();
    pump(&mut c, &mut s, clock.now);
    assert_eq!(
        data_of(&events(&mut s)).len(),
        1,
        "the established stream is untouched"
    );
    s.handle_frame(clock.now, vec![0; 44]); // version 0
    assert_eq!(s.is_closed(), Some(CloseReason::MalformedBudget));
    assert!(events(&mut s).contains(&Event::Closed {
        reason: CloseReason::MalformedBudget
    }));
    assert_eq!(s.poll_transmit(clock.now), None);
}

#[test]
fn a_malformed_frame_naming_a_held_stream_resets_that_stream() {
    let clock = Clock::new();
    let (mut c, mut s) = (client(clock.now, cfg()), server(clock.now, cfg()));
    establish(&mut c, &mut s, clock.now, sid(1));
    let mut f =
        execrelay_protocol::frame::Frame::decode(&raw(FrameType::Ack, sid(1), 0, 0, 16, b""))
            .unwrap();
    f.ack_bits = 1;
    s.handle_frame(clock.now, f.encode().unwrap());
    assert_eq!(
        events(&mut s),
        vec![Event::Reset {
            stream: sid(1),
            cause: ResetCause::Local(Reason::MalformedFrame)
        }]
    );
    pump(&mut c, &mut s, clock.now);
    assert_eq!(
        events(&mut c),
        vec![Event::Reset {
            stream: sid(1),
            cause: ResetCause::Peer("malformed_frame".into())
        }]
    );
    // RESUME is reserved: a stream that uses it is reset the same way.
    establish(&mut c, &mut s, clock.now, sid(2));
    s.handle_frame(clock.now, raw(FrameType::Resume, sid(2), 0, 0, 16, b""));
    assert_eq!(s.stream_state(&sid(2)), None);
    assert_eq!(s.counters().resets(Reason::MalformedFrame), 2);
}

#[test]
fn unknown_stream_frames_are_budgeted_but_frames_of_recently_closed_streams_are_free() {
    let clock = Clock::new();
    let scfg = tight(|c| {
        c.unknown_stream_frames = BucketConfig {
            burst: 2,
            refill: Duration::from_secs(60),
        }
    });
    let (mut c, mut s) = (client(clock.now, cfg()), server(clock.now, scfg));
    establish(&mut c, &mut s, clock.now, sid(1));
    s.reset(sid(1), Reason::Closed).unwrap();
    for seq in 1..=20 {
        s.handle_frame(clock.now, raw(FrameType::Data, sid(1), seq, 0, 16, b"late"));
    }
    assert_eq!(s.counters().drops(DropReason::ClosedStream), 20);
    assert_eq!(s.is_closed(), None);
    s.handle_frame(clock.now, raw(FrameType::Data, sid(7), 1, 0, 16, b"?"));
    s.handle_frame(clock.now, raw(FrameType::Ack, sid(8), 0, 0, 16, b""));
    assert_eq!(
        s.is_closed(),
        None,
        "two unknown-stream frames are within a burst of 2"
    );
    let w = pump(&mut c, &mut s, clock.now);
    let resets: Vec<_> =
        w.ba.iter()
            .map(|f| (f.stream, f.payload.to_vec()))
            .collect();
    assert!(
        resets.contains(&(sid(7), b"unknown_stream".to_vec())),
        "DATA is answered"
    );
    assert!(!resets.iter().any(|(id, _)| *id == sid(8)), "an ACK is not");
    // A RESET for a stream we never knew asks for nothing: counted, never charged (RESETs
    // cross ours, more than the closed set may remember).
    for _ in 0..100 {
        s.handle_frame(clock.now, raw(FrameType::Reset, sid(9), 0, 0, 0, b"x"));
    }
    assert_eq!(s.is_closed(), None);
    assert_eq!(s.counters().drops(DropReason::UnknownStream), 102);
    s.handle_frame(clock.now, raw(FrameType::Ack, sid(9), 0, 0, 16, b""));
    assert_eq!(s.is_closed(), Some(CloseReason::UnknownStreamBudget));
}

#[test]
fn an_empty_handshake_bucket_refuses_opens_for_a_cooldown_and_spares_established_streams() {
    let mut clock = Clock::new();
    let (mut c, mut s) = (client(clock.now, cfg()), server(clock.now, cfg()));
    establish(&mut c, &mut s, clock.now, sid(100));
    for n in 1..=8u8 {
        c.open(sid(n), Bytes::from_static(b"bad msg1")).unwrap();
        pump(&mut c, &mut s, clock.now);
        assert!(matches!(&events(&mut s)[..], [Event::OpenRequested { .. }]));
        s.handshake_failed(clock.now, sid(n), Reason::HandshakeFailed)
            .unwrap();
    }
    pump(&mut c, &mut s, clock.now);
    events(&mut c);
    // The eighth failure emptied the bucket: new OPENs are refused, unreported.
    c.open(sid(20), Bytes::from_static(b"msg1")).unwrap();
    pump(&mut c, &mut s, clock.now);
    assert!(events(&mut s).is_empty());
    assert_eq!(
        events(&mut c),
        vec![Event::Reset {
            stream: sid(20),
            cause: ResetCause::Peer("busy".into())
        }]
    );
    // The established stream carries on both ways.
    c.send(&sid(100), Bytes::from_static(b"up")).unwrap();
    s.send(&sid(100), Bytes::from_static(b"down")).unwrap();
    pump(&mut c, &mut s, clock.now);
    assert_eq!(
        data_of(&events(&mut s)),
        vec![(sid(100), 1, b"up".to_vec())]
    );
    assert_eq!(
        data_of(&events(&mut c)),
        vec![(sid(100), 1, b"down".to_vec())]
    );
    // Just before the end of the cool-down: still refused. At its end: reported again.
    clock.advance(Duration::from_secs(10) - Duration::from_millis(1));
    c.open(sid(21), Bytes::from_static(b"msg1")).unwrap();
    pump(&mut c, &mut s, clock.now);
    assert!(events(&mut s).is_empty());
    clock.advance(Duration::from_millis(1));
    c.open(sid(22), Bytes::from_static(b"msg1")).unwrap();
    pump(&mut c, &mut s, clock.now);
    assert!(matches!(&events(&mut s)[..], [Event::OpenRequested { .. }]));
    assert_eq!(s.is_closed(), None);
}

#[test]
fn on_a_direct_listener_an_empty_handshake_bucket_closes_the_link() {
    let clock = Clock::new();
    let scfg = tight(|c| {
        c.on_handshake_budget_empty = HandshakeBudgetPolicy::CloseLink;
        c.handshake_failures = BucketConfig {
            burst: 2,
            refill: Duration::from_secs(60),
        };
    });
    let (mut c, mut s) = (client(clock.now, cfg()), server(clock.now, scfg));
    // Early DATA on a pending stream: one failure.
    c.open(sid(1), Bytes::from_static(b"msg1")).unwrap();
    pump(&mut c, &mut s, clock.now);
    s.handle_frame(clock.now, raw(FrameType::Data, sid(1), 1, 0, 16, b"early"));
    assert_eq!(s.counters().resets(Reason::DataBeforeAccept), 1);
    assert_eq!(s.is_closed(), None);
    // A second OPEN on a pending stream: the second failure empties a burst of 2.
    c.open(sid(2), Bytes::from_static(b"msg1")).unwrap();
    pump(&mut c, &mut s, clock.now);
    s.handle_frame(clock.now, raw(FrameType::Open, sid(2), 0, 0, 16, b"again"));
    assert_eq!(s.counters().resets(Reason::DuplicateOpen), 1);
    assert_eq!(s.is_closed(), Some(CloseReason::HandshakeBudget));
}

#[test]
fn pending_opens_and_streams_are_limited_at_their_edges() {
    let clock = Clock::new();
    let scfg = tight(|c| {
        c.max_pending_opens = 2;
        c.max_streams = 3;
    });
    let (mut c, mut s) = (client(clock.now, cfg()), server(clock.now, scfg));
    for n in 1..=3 {
        c.open(sid(n), Bytes::new()).unwrap();
    }
    pump(&mut c, &mut s, clock.now);
    assert_eq!(events(&mut s).len(), 2, "two pending at most");
    assert!(events(&mut c).contains(&Event::Reset {
        stream: sid(3),
        cause: ResetCause::Peer("busy".into())
    }));
    s.accept(sid(1), Bytes::new()).unwrap();
    s.accept(sid(2), Bytes::new()).unwrap();
    for n in 4..=5 {
        c.open(sid(n), Bytes::new()).unwrap();
    }
    pump(&mut c, &mut s, clock.now);
    assert_eq!(events(&mut s).len(), 1, "the third stream is the limit");
    assert!(events(&mut c).contains(&Event::Reset {
        stream: sid(5),
        cause: ResetCause::Peer("too_many_streams".into())
    }));
    assert_eq!(s.stream_count(), 3);
}

#[test]
fn a_peer_that_lets_our_control_frames_pile_up_loses_its_link() {
    let clock = Clock::new();
    let scfg = tight(|c| c.control_queue_frames = 4);
    let mut s = server(clock.now, scfg);
    for n in 1..=4 {
        s.handle_frame(clock.now, raw(FrameType::Data, sid(n), 1, 0, 16, b"?"));
    }
    assert_eq!(s.is_closed(), None, "four RESETs fit");
    s.handle_frame(clock.now, raw(FrameType::Data, sid(5), 1, 0, 16, b"?"));
    assert_eq!(s.is_closed(), Some(CloseReason::ControlQueueFull));
}

#[test]
fn a_full_send_queue_blocks_then_reports_writable_as_it_drains() {
    let clock = Clock::new();
    let ccfg = tight(|c| c.send_queue_bytes = MAX_FRAME_BYTES);
    let (mut c, mut s) = (client(clock.now, ccfg), server(clock.now, cfg()));
    establish(&mut c, &mut s, clock.now, sid(1));
    establish(&mut c, &mut s, clock.now, sid(2));
    assert_eq!(c.send_ready(&sid(1)), Ok(1));
    c.send(&sid(1), Bytes::from(vec![7; MAX_PAYLOAD_BYTES]))
        .unwrap();
    assert_eq!(c.send_ready(&sid(2)), Err(SendError::Blocked));
    assert_eq!(
        c.credit(&sid(2)),
        16,
        "blocked by the link's queue, not the window"
    );
    assert!(c.poll_transmit(clock.now).is_some());
    assert_eq!(events(&mut c), vec![Event::Writable { stream: sid(2) }]);
    assert_eq!(c.send_ready(&sid(2)), Ok(1));
}

/// The writers of many streams waiting for room in the link's send queue (a fan-in of a
/// thousand processes on one link): each frame the writer takes must tell as many of them
/// as its room takes, oldest first, not every one of them (each told stream's task runs, and
/// all but one found the queue full again).
#[test]
fn a_drained_frame_tells_as_many_queue_waiters_as_its_room_takes_oldest_first() {
    let clock = Clock::new();
    let now = clock.now;
    let ccfg = tight(|c| c.send_queue_bytes = 2 * MAX_FRAME_BYTES);
    let (mut c, mut s) = (client(now, ccfg), server(now, cfg()));
    for n in 1..=10 {
        establish(&mut c, &mut s, now, sid(n));
    }
    let full = || Bytes::from(vec![3u8; MAX_PAYLOAD_BYTES]);
    for _ in 0..2 {
        c.send_ready(&sid(1)).unwrap();
        c.send(&sid(1), full()).unwrap();
    }
    for n in 2..=10 {
        assert_eq!(c.send_ready(&sid(n)), Err(SendError::Blocked), "stream {n}");
    }
    let _ = events(&mut c);
    for n in 2..=10 {
        // One frame leaves: room for one, so one waiter is told, the oldest.
        assert!(c.poll_transmit(now).is_some());
        assert_eq!(
            events(&mut c),
            vec![Event::Writable { stream: sid(n) }],
            "after a frame left, only stream {n} is told"
        );
        // Told and sending: it fills the room; nobody else is told.
        assert!(c.send_ready(&sid(n)).is_ok());
        c.send(&sid(n), full()).unwrap();
        assert_eq!(events(&mut c), vec![], "the room is taken");
    }
}

/// A stream the queue told it may send that then sends nothing (it finished, was reset, or
/// found its window spent) must pass the room on: the next waiter is told at once, without
/// waiting for another frame to leave.
#[test]
fn a_told_stream_that_sends_nothing_passes_the_room_to_the_next_waiter() {
    let clock = Clock::new();
    let now = clock.now;
    let ccfg = tight(|c| c.send_queue_bytes = 2 * MAX_FRAME_BYTES);
    let (mut c, mut s) = (client(now, ccfg), server(now, cfg()));
    for n in 1..=5 {
        establish(&mut c, &mut s, now, sid(n));
    }
    for _ in 0..2 {
        c.send_ready(&sid(1)).unwrap();
        c.send(&sid(1), Bytes::from(vec![3u8; MAX_PAYLOAD_BYTES]))
            .unwrap();
    }
    for n in 2..=5 {
        assert_eq!(c.send_ready(&sid(n)), Err(SendError::Blocked));
    }
    let _ = events(&mut c);
    // One frame leaves (one stays queued): room for one.
    assert!(c.poll_transmit(now).is_some());
    assert_eq!(events(&mut c), vec![Event::Writable { stream: sid(2) }]);
    // Stream 2 finishes without sending: stream 3 is told.
    c.finish(sid(2), Reason::Closed).unwrap();
    assert_eq!(events(&mut c), vec![Event::Writable { stream: sid(3) }]);
    // Stream 3 is reset: stream 4 is told.
    c.reset(sid(3), Reason::Closed).unwrap();
    assert_eq!(events(&mut c), vec![Event::Writable { stream: sid(4) }]);
    // Stream 4 asks and sends a small record: room is left, so stream 5 is told too.
    assert!(c.send_ready(&sid(4)).is_ok());
    c.send(&sid(4), Bytes::from_static(b"small")).unwrap();
    assert_eq!(events(&mut c), vec![Event::Writable { stream: sid(5) }]);
    assert!(c.send_ready(&sid(5)).is_ok());
}

/// Told streams whose senders never ask again (a send future dropped mid-wait, the stream
/// left open) must not hold the other waiters back for good: once the queue is empty, no
/// frame will leave to wake anyone, so every waiter is told.
#[test]
fn told_streams_that_never_ask_cannot_hold_back_the_others_once_the_queue_is_empty() {
    let clock = Clock::new();
    let now = clock.now;
    let ccfg = tight(|c| c.send_queue_bytes = 2 * MAX_FRAME_BYTES);
    let (mut c, mut s) = (client(now, ccfg), server(now, cfg()));
    for n in 1..=6 {
        establish(&mut c, &mut s, now, sid(n));
    }
    for _ in 0..2 {
        c.send_ready(&sid(1)).unwrap();
        c.send(&sid(1), Bytes::from(vec![3u8; MAX_PAYLOAD_BYTES]))
            .unwrap();
    }
    for n in 2..=6 {
        assert_eq!(c.send_ready(&sid(n)), Err(SendError::Blocked));
    }
    let _ = events(&mut c);
    // The first frame leaves: stream 2 is told, and (as if its sender were gone) never asks.
    assert!(c.poll_transmit(now).is_some());
    assert_eq!(events(&mut c), vec![Event::Writable { stream: sid(2) }]);
    // The last frame leaves: the queue is empty, so every other waiter is told at once.
    assert!(c.poll_transmit(now).is_some());
    assert_eq!(
        events(&mut c),
        (3..=6)
            .map(|n| Event::Writable { stream: sid(n) })
            .collect::<Vec<_>>()
    );
    for n in 3..=6 {
        assert!(c.send_ready(&sid(n)).is_ok(), "stream {n} may send");
    }
}

/// A stream blocked on both its window and the link's queue must still hear `Writable` when
/// the second of the two clears: here the queue drains while it has no credit (so the queue's
/// wake-up finds it still blocked), then its credit returns while the queue is full again
/// (refilled by another stream), then the queue drains. Found by the relay benchmark (four
/// streams, 1 GiB): a sender waited forever for a wake-up that had been spent.
#[test]
fn a_stream_blocked_on_window_and_queue_hears_writable_when_both_clear() {
    let clock = Clock::new();
    let now = clock.now;
    let ccfg = tight(|c| {
        c.send_queue_bytes = MAX_FRAME_BYTES;
        c.window = 1;
    });
    let scfg = tight(|c| c.window = 1);
    let (mut c, mut s) = (client(now, ccfg), server(now, scfg));
    for n in 1..=3 {
        establish(&mut c, &mut s, now, sid(n));
    }
    let record = || Bytes::from(vec![1u8; 40_000]);
    // A and B each take their one record of credit; the queue is over its limit.
    for n in [1, 2] {
        assert_eq!(c.send_ready(&sid(n)), Ok(1));
        c.send(&sid(n), record()).unwrap();
    }
    // A: no credit and no room.
    assert_eq!(c.send_ready(&sid(1)), Err(SendError::Blocked));
    // The queue drains A's record: room again, but A still has no credit.
    let f = c.poll_transmit(now).unwrap();
    let execrelay_protocol::transmit::Transmit::Frame(f) = f else {
        panic!("{f:?}")
    };
    assert_eq!(f.stream, sid(1));
    s.handle_frame(now, f.encode().unwrap());
    assert!(!events(&mut c)
        .iter()
        .any(|e| matches!(e, Event::Writable { stream } if *stream == sid(1))));
    // C fills the queue again.
    assert_eq!(c.send_ready(&sid(3)), Ok(1));
    c.send(&sid(3), record()).unwrap();
    // The server consumes A's record: its ACK gives A credit while the queue is full.
    let got = data_of(&events(&mut s));
    assert_eq!(got.len(), 1);
    s.consumed(&sid(1), 1).unwrap();
    while let Some(t) = s.poll_transmit(now) {
        if let execrelay_protocol::transmit::Transmit::Frame(f) = t {
            c.handle_frame(now, f.encode().unwrap());
        }
    }
    assert_eq!(c.credit(&sid(1)), 1);
    let _ = events(&mut c);
    // The queue drains: now A may send, and must be told.
    while let Some(t) = c.poll_transmit(now) {
        if let execrelay_protocol::transmit::Transmit::Frame(f) = t {
            s.handle_frame(now, f.encode().unwrap());
        }
    }
    assert!(
        events(&mut c)
            .iter()
            .any(|e| matches!(e, Event::Writable { stream } if *stream == sid(1))),
        "A was never told it may send"
    );
    assert_eq!(c.send_ready(&sid(1)), Ok(2));
}

#[test]
fn api_misuse_is_refused_with_a_typed_error() {
    use execrelay_protocol::endpoint::UseError;
    let clock = Clock::new();
    let (mut c, mut s) = (client(clock.now, cfg()), server(clock.now, cfg()));
    assert_eq!(s.open(sid(1), Bytes::new()), Err(UseError::WrongSide));
    assert_eq!(c.open([0; 16], Bytes::new()), Err(UseError::LinkStream));
    assert_eq!(c.accept(sid(1), Bytes::new()), Err(UseError::WrongSide));
    establish(&mut c, &mut s, clock.now, sid(1));
    assert_eq!(c.open(sid(1), Bytes::new()), Err(UseError::Exists));
    assert_eq!(s.accept(sid(1), Bytes::new()), Err(UseError::WrongState));
    assert_eq!(s.consumed(&sid(1), 1), Err(UseError::NotReceived));
    assert_eq!(
        c.send(&sid(1), Bytes::from(vec![0; MAX_PAYLOAD_BYTES + 1])),
        Err(SendError::TooLarge)
    );
}

#[test]
fn keepalive_declares_the_link_dead_exactly_at_the_pong_timeout_even_while_data_flows() {
    let mut clock = Clock::new();
    let (mut c, mut s) = (client(clock.now, cfg()), server(clock.now, cfg()));
    establish(&mut c, &mut s, clock.now, sid(1));
    // The server keeps sending data every second and consuming, but never answers a ping.
    let mut received = 0u64;
    let t0 = clock.now;
    loop {
        let now = clock.advance(Duration::from_millis(500));
        c.handle_timeout(now);
        s.handle_timeout(now);
        if c.is_closed().is_some() {
            break;
        }
        if s.send_ready(&sid(1)).is_ok() {
            s.send(&sid(1), Bytes::from_static(b"tick")).unwrap();
        }
        pump_with(&mut c, &mut s, now, true, false);
        for (_, seq, _) in data_of(&events(&mut c)) {
            received += 1;
            c.consumed(&sid(1), seq).unwrap();
        }
        assert!(now - t0 < Duration::from_secs(60), "never declared dead");
    }
    // First ping at 15 s, unanswered: dead at exactly 45 s, not a tick before.
    assert_eq!(clock.now - t0, Duration::from_secs(45));
    assert_eq!(c.is_closed(), Some(CloseReason::KeepaliveTimeout));
    assert!(received >= 80, "data flowed the whole time: {received}");
    assert_eq!(
        s.is_closed(),
        None,
        "the side whose pings were answered lives"
    );
}

#[test]
fn keepalive_death_is_exact_to_the_nanosecond() {
    let mut clock = Clock::new();
    let t0 = clock.now;
    let mut c = client(clock.now, cfg());
    assert_eq!(c.poll_timeout(), Some(t0 + Duration::from_secs(15)));
    c.handle_timeout(clock.advance(Duration::from_secs(15)));
    assert!(matches!(
        c.poll_transmit(clock.now),
        Some(execrelay_protocol::transmit::Transmit::Ping(_))
    ));
    assert_eq!(c.poll_timeout(), Some(t0 + Duration::from_secs(30)));
    c.handle_timeout(t0 + Duration::from_secs(45) - Duration::from_nanos(1));
    assert_eq!(c.is_closed(), None);
    c.handle_timeout(t0 + Duration::from_secs(45));
    assert_eq!(c.is_closed(), Some(CloseReason::KeepaliveTimeout));
}

#[test]
fn a_silent_link_that_answers_pings_lives_through_many_intervals() {
    let mut clock = Clock::new();
    let (mut c, mut s) = (client(clock.now, cfg()), server(clock.now, cfg()));
    establish(&mut c, &mut s, clock.now, sid(1));
    let (mut pings_c, mut pings_s) = (0, 0);
    let t0 = clock.now;
    while clock.now - t0 < Duration::from_secs(4 * 15 + 1) {
        let now = clock.advance(Duration::from_secs(1));
        c.handle_timeout(now);
        s.handle_timeout(now);
        let w = pump(&mut c, &mut s, now);
        assert!(w.ab.is_empty() && w.ba.is_empty(), "no frames: silence");
        pings_c += w.pings_ab;
        pings_s += w.pings_ba;
    }
    assert_eq!((pings_c, pings_s), (4, 4));
    assert_eq!((c.is_closed(), s.is_closed()), (None, None));
    assert_eq!(
        s.stream_state(&sid(1)),
        Some(execrelay_protocol::endpoint::StreamState::Open)
    );
}

/// A stream blocked by its window whose credit returns while the link's send queue is full
/// must still be told it may send once the queue drains (the credit alone woke no one: the
/// stream was in neither the credit nor the queue's wait list, and its sender waited forever).
#[test]
fn credit_that_returns_while_the_send_queue_is_full_wakes_the_stream_when_it_drains() {
    let clock = Clock::new();
    let ccfg = tight(|c| c.send_queue_bytes = MAX_FRAME_BYTES);
    let scfg = tight(|c| c.window = 1);
    let (mut c, mut s) = (client(clock.now, ccfg), server(clock.now, scfg));
    establish(&mut c, &mut s, clock.now, sid(1));
    establish(&mut c, &mut s, clock.now, sid(2));
    // Stream 2 spends its one record of credit; the record goes out.
    assert_eq!(c.send_ready(&sid(2)), Ok(1));
    c.send(&sid(2), Bytes::from_static(b"r1")).unwrap();
    while let Some(t) = c.poll_transmit(clock.now) {
        if let Transmit::Frame(f) = t {
            s.handle_frame(clock.now, f.encode().unwrap());
        }
    }
    assert_eq!(c.send_ready(&sid(2)), Err(SendError::Blocked), "no credit");
    // Stream 1 fills the link's send queue.
    assert_eq!(c.send_ready(&sid(1)), Ok(1));
    c.send(&sid(1), Bytes::from(vec![7; MAX_PAYLOAD_BYTES]))
        .unwrap();
    // The server consumes stream 2's record: its ACK brings credit while the queue is full.
    let _ = events(&mut s);
    s.consumed(&sid(2), 1).unwrap();
    while let Some(t) = s.poll_transmit(clock.now) {
        if let Transmit::Frame(f) = t {
            c.handle_frame(clock.now, f.encode().unwrap());
        }
    }
    assert_eq!(c.credit(&sid(2)), 1);
    assert!(
        events(&mut c).is_empty(),
        "not writable yet: the queue is full"
    );
    // The queue drains: stream 2 is told.
    while c.poll_transmit(clock.now).is_some() {}
    assert_eq!(events(&mut c), vec![Event::Writable { stream: sid(2) }]);
    assert_eq!(c.send_ready(&sid(2)), Ok(2));
}

/// Both directions of a stream's flow control as a watchdog reads them: the sender's
/// (`stream_flow`) and the receiver's (`stream_recv_flow`: received, consumed, reported), which
/// together say who waits for whom.
#[test]
fn the_receivers_side_of_a_stream_says_what_it_took_and_reported() {
    let clock = Clock::new();
    let (mut c, mut s) = (client(clock.now, cfg()), server(clock.now, cfg()));
    establish(&mut c, &mut s, clock.now, sid(1));
    for n in 1..=10u64 {
        c.send(&sid(1), Bytes::from(format!("r{n}"))).unwrap();
    }
    pump(&mut c, &mut s, clock.now);
    let r = s.stream_recv_flow(&sid(1)).unwrap();
    assert_eq!(
        (
            r.received,
            r.consumed,
            r.reported,
            r.window,
            r.queued_records
        ),
        (10, 0, 0, 16, 10)
    );
    for seq in 1..=8 {
        s.consumed(&sid(1), seq).unwrap();
    }
    // Consumed, not yet reported: the report leaves with the next frame.
    let r = s.stream_recv_flow(&sid(1)).unwrap();
    assert_eq!((r.consumed, r.reported, r.queued_records), (8, 0, 2));
    pump(&mut c, &mut s, clock.now);
    let r = s.stream_recv_flow(&sid(1)).unwrap();
    assert_eq!((r.consumed, r.reported), (8, 8));
    assert_eq!(
        r.to_string(),
        "received 10 consumed 8 reported 8 window 16 queued 2 records"
    );
    let f = c.stream_flow(&sid(1)).unwrap();
    assert_eq!((f.sent, f.acked, f.credit), (10, 8, 14));
    assert!(s.stream_recv_flow(&sid(9)).is_none(), "no such stream");
}
