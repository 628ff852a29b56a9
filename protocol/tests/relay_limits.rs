//! The relay's limits (`secure-transport.md` §6.4) at their edges, on a simulated clock:
//! queued bytes, `OPEN`s per second, streams per link and per environment, budgets, the
//! window clip, keepalive, link admission.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use execrelay_protocol::config::ACK_EVERY_RECORDS;
use execrelay_protocol::endpoint::Event;
use execrelay_protocol::frame::{FrameType, MAX_PAYLOAD_BYTES};
use execrelay_protocol::reason::{CloseReason, DropReason, Reason};
use execrelay_protocol::router::Router;
use execrelay_protocol::transmit::Transmit;

#[test]
fn a_receivers_window_is_clipped_to_the_relays_maximum() {
    let clock = Clock::new();
    let now = clock.now;
    let mut rcfg = relay_cfg();
    rcfg.max_window_records = ACK_EVERY_RECORDS;
    let mut net = Net::new(rcfg);
    net.add_env(now, "env1", cfg());
    net.add_client(now, "env1", cfg());
    let (c, e) = (net.clients[0].1, net.envs[0].1);
    // A hand-written client advertising a window of 1000 records.
    net.router
        .handle_frame(now, c, raw(FrameType::Open, sid(1), 0, 0, 1000, b"msg1"));
    let open = drain(&mut net.router, e, now);
    assert_eq!(
        (open[0].ftype, open[0].window),
        (FrameType::Open, ACK_EVERY_RECORDS),
        "the OPEN reaches the environment with the window the relay will hold it to"
    );
    net.envs[0]
        .0
        .handle_frame(now, open[0].clone().encode().unwrap());
    net.env(0).accept(sid(1), Bytes::new()).unwrap();
    net.pump(now);
    drain(&mut net.router, c, now);
    let edge = u64::from(ACK_EVERY_RECORDS);
    for seq in 1..=edge {
        net.router
            .handle_frame(now, e, raw(FrameType::Data, sid(1), seq, 0, 16, b"x"));
    }
    assert_eq!(net.router.counters().resets(Reason::WindowExceeded), 0);
    // A hand-written environment that ignores the clipped window it was shown.
    net.router
        .handle_frame(now, e, raw(FrameType::Data, sid(1), edge + 1, 0, 16, b"x"));
    assert_eq!(net.router.counters().resets(Reason::WindowExceeded), 1);
}

/// An honest endpoint tuned to a larger window than a relay's (here the smallest a relay
/// accepts) is slowed to the relay's window, never reset or stalled: every `window` the relay
/// forwards is clipped, both ways, so the sender never learns of more, and the receiver
/// acknowledges every `ACK_EVERY_RECORDS` records whatever it advertised. A relay below that
/// is refused at start.
#[test]
fn a_window_larger_than_the_relays_slows_the_sender_and_resets_nothing() {
    let clock = Clock::new();
    let now = clock.now;
    let mut rcfg = relay_cfg();
    rcfg.max_window_records = ACK_EVERY_RECORDS;
    let mut net = Net::new(rcfg);
    let mut big = cfg();
    big.window = 200;
    net.add_env(now, "env1", big.clone());
    net.add_client(now, "env1", big);
    establish_via(&mut net, now, 0, 0, 1);
    let record = |n: u64| Bytes::from(vec![(n % 251) as u8; 100]);
    const TOTAL: u64 = 40;
    // Both directions at once: the environment's output and the client's input.
    let (mut sent_down, mut sent_up) = (0u64, 0u64);
    type Got = Vec<(u64, Vec<u8>)>;
    let (mut down, mut up): (Got, Got) = (vec![], vec![]);
    let mut rounds = 0;
    while (down.len() as u64) < TOTAL || (up.len() as u64) < TOTAL {
        rounds += 1;
        assert!(
            rounds < 200,
            "stalled: down {}, up {}",
            down.len(),
            up.len()
        );
        while sent_down < TOTAL && net.env(0).send_ready(&sid(1)).is_ok() {
            sent_down += 1;
            net.env(0).send(&sid(1), record(sent_down)).unwrap();
        }
        while sent_up < TOTAL && net.client(0).send_ready(&sid(1)).is_ok() {
            sent_up += 1;
            net.client(0).send(&sid(1), record(sent_up)).unwrap();
        }
        assert!(
            sent_down - down.len() as u64 <= u64::from(ACK_EVERY_RECORDS)
                && sent_up - up.len() as u64 <= u64::from(ACK_EVERY_RECORDS),
            "never past the relay's window: down {sent_down}/{}, up {sent_up}/{}",
            down.len(),
            up.len()
        );
        net.pump(now);
        down.extend(
            data_of(&events(net.client(0)))
                .into_iter()
                .map(|(_, s, p)| (s, p)),
        );
        up.extend(
            data_of(&events(net.env(0)))
                .into_iter()
                .map(|(_, s, p)| (s, p)),
        );
        net.client(0).consumed(&sid(1), down.len() as u64).unwrap();
        net.env(0).consumed(&sid(1), up.len() as u64).unwrap();
        net.pump(now);
    }
    assert_eq!(net.router.counters().resets(Reason::WindowExceeded), 0);
    let mut low = relay_cfg();
    low.max_window_records = ACK_EVERY_RECORDS - 1;
    let Err(err) = Router::new(low) else {
        panic!("a relay window below 8 is refused");
    };
    assert!(err.to_string().contains("at least 8 records"), "{err}");
    for got in [&down, &up] {
        assert_eq!(got.len() as u64, TOTAL);
        for (i, (seq, p)) in got.iter().enumerate() {
            assert_eq!(*seq, i as u64 + 1, "in order, nothing repeated");
            assert_eq!(p, &record(*seq).to_vec(), "exact bytes");
        }
    }
}

#[test]
fn above_the_queued_bytes_limit_new_streams_are_busy_and_old_ones_carry_on() {
    let clock = Clock::new();
    let now = clock.now;
    let mut rcfg = relay_cfg();
    rcfg.max_queued_bytes = 2 * MAX_PAYLOAD_BYTES;
    let mut net = Net::new(rcfg);
    net.add_env(now, "env1", cfg());
    net.add_client(now, "env1", cfg());
    establish_via(&mut net, now, 0, 0, 1);
    let c = net.clients[0].1;
    for _ in 0..2 {
        net.env(0)
            .send(&sid(1), Bytes::from(vec![1; MAX_PAYLOAD_BYTES]))
            .unwrap();
    }
    let (r, (ep, link)) = (&mut net.router, &mut net.envs[0]);
    push_up(r, ep, *link, now);
    assert!(net.router.queued_bytes() >= 2 * MAX_PAYLOAD_BYTES);
    net.router
        .handle_frame(now, c, raw(FrameType::Open, sid(2), 0, 0, 16, b"msg1"));
    let out = drain(&mut net.router, c, now);
    assert_eq!(out[0].ftype, FrameType::Reset);
    assert_eq!((out[0].stream, &out[0].payload[..]), (sid(2), &b"busy"[..]));
    assert_eq!(
        out.iter().filter(|f| f.ftype == FrameType::Data).count(),
        2,
        "the old stream's data"
    );
    assert_eq!(net.router.queued_bytes(), 0);
    // Below the limit again: admitted.
    net.router
        .handle_frame(now, c, raw(FrameType::Open, sid(3), 0, 0, 16, b"msg1"));
    net.pump(now);
    assert!(events(net.env(0))
        .iter()
        .any(|e| matches!(e, Event::OpenRequested { stream, .. } if *stream == sid(3))));
}

#[test]
fn opens_per_second_streams_per_link_and_per_environment_are_limited_at_their_edges() {
    let mut clock = Clock::new();
    let mut rcfg = relay_cfg();
    rcfg.opens_per_second = 4;
    rcfg.max_streams_per_client_link = 5;
    rcfg.max_streams_per_environment = 6;
    let mut net = Net::new(rcfg);
    net.add_env(clock.now, "env1", cfg());
    net.add_client(clock.now, "env1", cfg());
    net.add_client(clock.now, "env1", cfg());
    for n in 1..=5 {
        net.client(0).open(sid(n), Bytes::new()).unwrap();
    }
    net.pump(clock.now);
    assert_eq!(
        events(net.env(0)).len(),
        4,
        "four OPENs in the same instant"
    );
    assert_eq!(events(net.client(0)), vec![peer_reset(5, "busy")]);
    clock.advance(Duration::from_millis(250));
    for n in 6..=7 {
        net.client(0).open(sid(n), Bytes::new()).unwrap();
    }
    net.pump(clock.now);
    assert_eq!(events(net.env(0)).len(), 1, "one token back after 250 ms");
    assert_eq!(events(net.client(0)), vec![peer_reset(7, "busy")]);
    clock.advance(Duration::from_secs(1));
    net.client(0).open(sid(8), Bytes::new()).unwrap();
    net.pump(clock.now);
    assert_eq!(
        events(net.client(0)),
        vec![peer_reset(8, "busy")],
        "five streams per client link"
    );
    net.client(1).open(sid(20), Bytes::new()).unwrap();
    net.client(1).open(sid(21), Bytes::new()).unwrap();
    net.pump(clock.now);
    assert_eq!(events(net.env(0)).len(), 1, "six streams per environment");
    assert_eq!(events(net.client(1)), vec![peer_reset(21, "busy")]);
    assert_eq!(net.router.route_count(), 6);
}

#[test]
fn budgets_close_only_the_offending_client_link() {
    let clock = Clock::new();
    let now = clock.now;
    let mut rcfg = relay_cfg();
    rcfg.malformed_frames.burst = 2;
    rcfg.unknown_stream_frames.burst = 2;
    let mut net = Net::new(rcfg);
    net.add_env(now, "env1", cfg());
    for _ in 0..3 {
        net.add_client(now, "env1", cfg());
    }
    establish_via(&mut net, now, 0, 0, 1);
    let (bad_m, bad_u) = (net.clients[1].1, net.clients[2].1);
    // Malformed: garbage, stream 0, an ACCEPT from a client.
    net.router.handle_frame(now, bad_m, vec![0xff; 50]);
    net.router
        .handle_frame(now, bad_m, raw(FrameType::Open, [0; 16], 0, 0, 16, b""));
    assert!(net.router.is_live(bad_m));
    net.router
        .handle_frame(now, bad_m, raw(FrameType::Accept, sid(9), 0, 0, 16, b""));
    assert!(!net.router.is_live(bad_m));
    // Unknown streams, including the id another client holds: never forwarded.
    for _ in 0..2 {
        net.router
            .handle_frame(now, bad_u, raw(FrameType::Data, sid(1), 1, 0, 16, b"x"));
    }
    assert!(net.router.is_live(bad_u));
    // A RESET of a stream it does not hold is dropped free (RESETs cross; never forwarded).
    net.router
        .handle_frame(now, bad_u, raw(FrameType::Reset, sid(1), 0, 0, 0, b"x"));
    assert!(net.router.is_live(bad_u));
    net.router
        .handle_frame(now, bad_u, raw(FrameType::Ack, sid(1), 0, 0, 16, b""));
    assert!(!net.router.is_live(bad_u));
    net.pump(now);
    assert_eq!(
        net.closed,
        vec![
            (bad_m, CloseReason::MalformedBudget),
            (bad_u, CloseReason::UnknownStreamBudget)
        ]
    );
    assert!(
        events(net.env(0)).is_empty(),
        "nothing reached the environment"
    );
    assert_eq!(net.router.counters().drops(DropReason::UnknownStream), 4);
    net.client(0)
        .send(&sid(1), Bytes::from_static(b"fine"))
        .unwrap();
    net.pump(now);
    assert_eq!(
        data_of(&events(net.env(0))),
        vec![(sid(1), 1, b"fine".to_vec())]
    );
    assert_eq!(net.router.route_count(), 1);
}

#[test]
fn relay_links_that_stop_answering_pings_are_closed_at_the_pong_timeout() {
    let mut clock = Clock::new();
    let t0 = clock.now;
    let mut net = Net::new(relay_cfg());
    net.add_env(t0, "env1", cfg());
    let e = net.envs[0].1;
    net.router
        .handle_timeout(clock.advance(Duration::from_secs(15)), e);
    assert!(
        matches!(net.router.poll_event(), Some(execrelay_protocol::router::RouterEvent::Wake { link }) if link == e)
    );
    assert!(matches!(
        net.router.poll_transmit(clock.now, e),
        Some(Transmit::Ping(_))
    ));
    net.router
        .handle_timeout(t0 + Duration::from_secs(45) - Duration::from_nanos(1), e);
    assert!(net.router.is_live(e));
    net.router.handle_timeout(t0 + Duration::from_secs(45), e);
    assert!(!net.router.is_live(e));
    assert_eq!(
        net.router.counters().closes(CloseReason::KeepaliveTimeout),
        1
    );
}

#[test]
fn link_admission_limits_and_revocation() {
    let clock = Clock::new();
    let now = clock.now;
    let mut rcfg = relay_cfg();
    rcfg.max_client_links_per_address = 2;
    rcfg.max_environments = 1;
    let mut r = Router::new(rcfg).unwrap();
    let a = r.add_client_link(now, "env1", ADDR, 0).unwrap();
    r.add_client_link(now, "env1", ADDR, 0).unwrap();
    assert!(r.add_client_link(now, "env1", ADDR, 0).is_err());
    r.link_closed(a, CloseReason::Transport);
    assert!(
        r.add_client_link(now, "env1", ADDR, 0).is_ok(),
        "a slot is free again"
    );
    let e = r.add_environment_link(now, "env1", 0).unwrap();
    assert!(r.add_environment_link(now, "env2", 0).is_err());
    r.remove_environment("env1");
    assert!(!r.is_live(e));
    assert!(r.add_environment_link(now, "env2", 0).is_ok());
}
