//! Client ↔ relay ↔ environment on a simulated clock: the routing core of
//! `secure-transport.md` §6.3–§6.4 and its window accounting (§7), between real endpoints and
//! hand-written peers.

mod common;

use bytes::Bytes;
use common::*;
use execrelay_protocol::config::QUEUED_FRAME_OVERHEAD_BYTES;
use execrelay_protocol::endpoint::Event;
use execrelay_protocol::frame::{FrameType, HEADER_BYTES, MAX_PAYLOAD_BYTES};
use execrelay_protocol::reason::{CloseReason, Reason};

#[test]
fn a_stream_through_the_relay_carries_data_both_ways_untouched() {
    let clock = Clock::new();
    let mut net = Net::new(relay_cfg());
    net.add_env(clock.now, "env1", cfg());
    net.add_client(clock.now, "env1", cfg());
    establish_via(&mut net, clock.now, 0, 0, 1);
    net.client(0)
        .send(&sid(1), Bytes::from_static(b"ciphertext up"))
        .unwrap();
    net.env(0)
        .send(&sid(1), Bytes::from_static(b"ciphertext down"))
        .unwrap();
    net.env(0)
        .send(&sid(1), Bytes::from_static(b"more"))
        .unwrap();
    net.pump(clock.now);
    assert_eq!(
        data_of(&events(net.env(0))),
        vec![(sid(1), 1, b"ciphertext up".to_vec())]
    );
    assert_eq!(
        data_of(&events(net.client(0))),
        vec![
            (sid(1), 1, b"ciphertext down".to_vec()),
            (sid(1), 2, b"more".to_vec())
        ]
    );
    assert_eq!(net.router.route_count(), 1);
    assert_eq!(net.router.queued_bytes(), 0);
}

/// The Noise suite rides in the `OPEN`'s flags (§3, §5): the relay passes every value of the
/// suite bits through unchanged (reserved ones included: the exec server decides), and the
/// stream is routed like any other.
#[test]
fn the_suite_bits_of_an_open_pass_the_relay_unchanged() {
    let clock = Clock::new();
    let mut net = Net::new(relay_cfg());
    net.add_env(clock.now, "env1", cfg());
    net.add_client(clock.now, "env1", cfg());
    for (stream, flags) in [(1u8, 1u16), (2, 0), (3, 3), (4, 2)] {
        net.client(0)
            .open_with_flags(sid(stream), flags, Bytes::from_static(b"msg1"))
            .unwrap();
        net.pump(clock.now);
        assert_eq!(
            events(net.env(0)),
            vec![Event::OpenRequested {
                stream: sid(stream),
                flags,
                payload: Bytes::from_static(b"msg1")
            }]
        );
    }
    // Anything beyond the suite bits is not an OPEN this engine sends.
    assert!(net
        .client(0)
        .open_with_flags(sid(9), 4, Bytes::from_static(b"msg1"))
        .is_err());
    net.env(0)
        .accept(sid(1), Bytes::from_static(b"msg2"))
        .unwrap();
    net.pump(clock.now);
    assert!(matches!(
        &events(net.client(0))[..],
        [Event::Accepted { .. }]
    ));
}

#[test]
fn an_open_for_a_routed_id_is_busy_and_never_disturbs_the_holder() {
    let clock = Clock::new();
    let mut net = Net::new(relay_cfg());
    net.add_env(clock.now, "env1", cfg());
    net.add_client(clock.now, "env1", cfg());
    net.add_client(clock.now, "env1", cfg());
    establish_via(&mut net, clock.now, 0, 0, 1);
    net.client(1)
        .open(sid(1), Bytes::from_static(b"intruder"))
        .unwrap();
    net.pump(clock.now);
    assert_eq!(events(net.client(1)), vec![peer_reset(1, "busy")]);
    assert!(
        events(net.env(0)).is_empty(),
        "the environment never saw the second OPEN"
    );
    assert_eq!(net.router.counters().resets(Reason::Busy), 1);
    net.client(0)
        .send(&sid(1), Bytes::from_static(b"up"))
        .unwrap();
    net.env(0)
        .send(&sid(1), Bytes::from_static(b"down"))
        .unwrap();
    net.pump(clock.now);
    assert_eq!(
        data_of(&events(net.env(0))),
        vec![(sid(1), 1, b"up".to_vec())]
    );
    assert_eq!(
        data_of(&events(net.client(0))),
        vec![(sid(1), 1, b"down".to_vec())]
    );
    // The intruder's later frames for that id are not forwarded to anyone.
    let c1 = net.clients[1].1;
    net.router
        .handle_frame(clock.now, c1, raw(FrameType::Data, sid(1), 2, 0, 16, b"x"));
    net.pump(clock.now);
    assert!(events(net.env(0)).is_empty());
    assert!(events(net.client(0)).is_empty());
}

#[test]
fn environment_offline_then_gone_then_offline_again() {
    let clock = Clock::new();
    let mut net = Net::new(relay_cfg());
    net.add_client(clock.now, "env1", cfg());
    net.client(0).open(sid(1), Bytes::new()).unwrap();
    net.pump(clock.now);
    assert_eq!(
        events(net.client(0)),
        vec![peer_reset(1, "environment_offline")]
    );

    net.add_env(clock.now, "env1", cfg());
    establish_via(&mut net, clock.now, 0, 0, 2);
    let env_link = net.envs[0].1;
    net.router.link_closed(env_link, CloseReason::Transport);
    net.pump(clock.now);
    assert_eq!(
        events(net.client(0)),
        vec![peer_reset(2, "environment_gone")]
    );
    assert_eq!(net.router.route_count(), 0);
    assert_eq!(net.router.counters().resets(Reason::EnvironmentGone), 1);
    net.client(0).open(sid(3), Bytes::new()).unwrap();
    net.pump(clock.now);
    assert_eq!(
        events(net.client(0)),
        vec![peer_reset(3, "environment_offline")]
    );
    assert_eq!(net.router.counters().resets(Reason::EnvironmentOffline), 2);
}

/// A revoked environment's streams are reset `environment_revoked`, and so are its `OPEN`s
/// until it is listed (and links) again: its clients stop instead of waiting for it.
#[test]
fn a_revoked_environment_says_so_to_its_streams_and_its_opens() {
    let clock = Clock::new();
    let mut net = Net::new(relay_cfg());
    net.add_client(clock.now, "env1", cfg());
    net.add_env(clock.now, "env1", cfg());
    establish_via(&mut net, clock.now, 0, 0, 1);
    net.router.remove_environment("env1");
    net.pump(clock.now);
    assert_eq!(
        events(net.client(0)),
        vec![peer_reset(1, "environment_revoked")]
    );
    assert!(net.router.is_revoked("env1"));
    net.client(0).open(sid(2), Bytes::new()).unwrap();
    net.pump(clock.now);
    assert_eq!(
        events(net.client(0)),
        vec![peer_reset(2, "environment_revoked")]
    );
    assert_eq!(net.router.counters().resets(Reason::EnvironmentRevoked), 2);
    // Listed again and linked: streams flow, and a later loss of its link is `environment_gone`.
    net.add_env(clock.now, "env1", cfg());
    assert!(!net.router.is_revoked("env1"));
    establish_via(&mut net, clock.now, 0, 1, 3);
    let env_link = net.envs[1].1;
    net.router.link_closed(env_link, CloseReason::Transport);
    net.pump(clock.now);
    assert_eq!(
        events(net.client(0)),
        vec![peer_reset(3, "environment_gone")]
    );
}

#[test]
fn a_client_link_death_resets_its_streams_on_the_environment_and_nothing_else() {
    let clock = Clock::new();
    let mut net = Net::new(relay_cfg());
    net.add_env(clock.now, "env1", cfg());
    net.add_client(clock.now, "env1", cfg());
    net.add_client(clock.now, "env1", cfg());
    establish_via(&mut net, clock.now, 0, 0, 1);
    establish_via(&mut net, clock.now, 1, 0, 2);
    net.client(0)
        .send(&sid(1), Bytes::from_static(b"stdin before death"))
        .unwrap();
    let (r, (ep, link)) = (&mut net.router, &mut net.clients[0]);
    push_up(r, ep, *link, clock.now);
    net.router
        .link_closed(net.clients[0].1, CloseReason::Transport);
    net.pump(clock.now);
    let ev = events(net.env(0));
    assert_eq!(
        ev,
        vec![
            Event::Data {
                stream: sid(1),
                seq: 1,
                payload: Bytes::from_static(b"stdin before death")
            },
            peer_reset(1, "client_gone")
        ],
        "queued data first, then the reset"
    );
    net.client(1)
        .send(&sid(2), Bytes::from_static(b"alive"))
        .unwrap();
    net.pump(clock.now);
    assert_eq!(
        data_of(&events(net.env(0))),
        vec![(sid(2), 1, b"alive".to_vec())]
    );
}

/// Two links for one environment id (two exec servers sharing a key): the live holder keeps
/// the id. Before, each new link replaced the other, without end (7 times in 30 s, each
/// resetting every stream). A second link is refused while the holder answers a probe; a
/// holder that does not answer within the probe timeout is closed (`keepalive_timeout`), its
/// streams reset `environment_gone`, and the next claim takes the id.
#[test]
fn the_live_holder_keeps_the_environment_id_and_a_silent_one_loses_it_to_a_probe() {
    use execrelay_protocol::router::{AddLinkError, RouterEvent};
    let mut clock = Clock::new();
    let mut net = Net::new(relay_cfg());
    net.add_env(clock.now, "env1", cfg());
    net.add_client(clock.now, "env1", cfg());
    establish_via(&mut net, clock.now, 0, 0, 1);
    let holder = net.envs[0].1;
    let claim = net.router.add_environment_link(clock.now, "env1", 9);
    assert_eq!(claim, Err(AddLinkError::Held { holder }));
    // The holder answers the probe's ping: it keeps the id.
    net.router.probe(clock.now, holder);
    while let Some(t) = net.router.poll_transmit(clock.now, holder) {
        if let execrelay_protocol::transmit::Transmit::Ping(p) = t {
            net.router.handle_pong(holder, &p);
        }
    }
    let answered: Vec<_> = std::iter::from_fn(|| net.router.poll_event()).collect();
    assert!(answered.contains(&RouterEvent::ProbeAnswered { link: holder }));
    clock.advance(relay_cfg().environment_probe_timeout * 2);
    net.router.handle_timeout(clock.now, holder);
    assert!(net.router.is_live(holder));
    assert_eq!(
        net.router.add_environment_link(clock.now, "env1", 9),
        Err(AddLinkError::Held { holder })
    );
    // Now the holder goes silent (its pings are never answered) and is probed again.
    net.router.probe(clock.now, holder);
    while net.router.poll_transmit(clock.now, holder).is_some() {}
    let deadline = net.router.poll_timeout(holder).unwrap();
    assert_eq!(deadline, clock.now + relay_cfg().environment_probe_timeout);
    net.router
        .handle_timeout(deadline - std::time::Duration::from_millis(1), holder);
    assert!(net.router.is_live(holder));
    net.router.handle_timeout(deadline, holder);
    assert!(!net.router.is_live(holder));
    net.pump(deadline);
    assert!(net
        .closed
        .contains(&(holder, CloseReason::KeepaliveTimeout)));
    assert_eq!(
        events(net.client(0)),
        vec![peer_reset(1, "environment_gone")]
    );
    // The claim succeeds now, and new streams reach the new link.
    net.add_env(deadline, "env1", cfg());
    establish_via(&mut net, deadline, 0, 1, 2);
    assert_eq!(net.router.environment_count(), 1);
}

#[test]
fn the_relay_resets_a_sender_past_its_window_alone_and_holds_at_most_one_window() {
    let clock = Clock::new();
    let mut net = Net::new(relay_cfg());
    net.add_env(clock.now, "env1", cfg());
    net.add_client(clock.now, "env1", cfg());
    establish_via(&mut net, clock.now, 0, 0, 1);
    establish_via(&mut net, clock.now, 0, 0, 2);
    let (c, e) = (net.clients[0].1, net.envs[0].1);
    // A hand-written client sender: 16 records fit the environment's window of 16.
    for seq in 1..=16 {
        net.router.handle_frame(
            clock.now,
            c,
            raw(FrameType::Data, sid(1), seq, 0, 16, &[9; 1000]),
        );
    }
    assert_eq!(
        net.router.stream_queued_bytes(e, &sid(1)),
        16 * (HEADER_BYTES + 1000 + QUEUED_FRAME_OVERHEAD_BYTES)
    );
    net.router.handle_frame(
        clock.now,
        c,
        raw(FrameType::Data, sid(1), 17, 0, 16, &[9; 1000]),
    );
    assert_eq!(net.router.counters().resets(Reason::WindowExceeded), 1);
    assert_eq!(
        net.router.stream_queued_bytes(e, &sid(1)),
        0,
        "its queue is dropped"
    );
    let to_client = drain(&mut net.router, c, clock.now);
    assert_eq!(to_client.len(), 1);
    assert_eq!(
        (to_client[0].ftype, &to_client[0].payload[..]),
        (FrameType::Reset, &b"window_exceeded"[..])
    );
    net.pump(clock.now);
    assert_eq!(events(net.env(0)), vec![peer_reset(1, "window_exceeded")]);
    // The other stream of the same link carries on both ways.
    net.client(0)
        .send(&sid(2), Bytes::from_static(b"up"))
        .unwrap();
    net.env(0)
        .send(&sid(2), Bytes::from_static(b"down"))
        .unwrap();
    net.pump(clock.now);
    assert_eq!(
        data_of(&events(net.env(0))),
        vec![(sid(2), 1, b"up".to_vec())]
    );
    assert!(data_of(&events(net.client(0))).contains(&(sid(2), 1, b"down".to_vec())));
    assert!(net.closed.is_empty());
}

#[test]
fn a_slow_client_holds_back_the_environment_through_the_relay_without_loss() {
    let clock = Clock::new();
    let now = clock.now;
    let mut net = Net::new(relay_cfg());
    net.add_env(now, "env1", cfg());
    net.add_client(now, "env1", cfg());
    establish_via(&mut net, now, 0, 0, 1);
    let c = net.clients[0].1;
    let record = |n: u64| Bytes::from(vec![(n % 251) as u8; MAX_PAYLOAD_BYTES - 16]);
    const TOTAL: u64 = 48;
    let (mut sent, mut consumed) = (0u64, 0u64);
    let mut got: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut rounds = 0;
    while consumed < TOTAL {
        rounds += 1;
        assert!(rounds < 100, "stalled: sent {sent}, consumed {consumed}");
        // The environment sends all its window allows.
        while sent < TOTAL && net.env(0).send_ready(&sid(1)).is_ok() {
            sent += 1;
            net.env(0).send(&sid(1), record(sent)).unwrap();
        }
        assert!(sent - consumed <= 16, "never past the client's window");
        let (r, (ep, link)) = (&mut net.router, &mut net.envs[0]);
        push_up(r, ep, *link, now);
        let queued = net.router.stream_queued_bytes(c, &sid(1));
        assert!(
            queued <= 16 * (HEADER_BYTES + MAX_PAYLOAD_BYTES + QUEUED_FRAME_OVERHEAD_BYTES),
            "{queued}"
        );
        // The client reads its frames but consumes at most 8 records a round.
        for f in drain(&mut net.router, c, now) {
            net.client(0).handle_frame(now, f.encode().unwrap());
        }
        got.extend(
            data_of(&events(net.client(0)))
                .into_iter()
                .map(|(_, s, p)| (s, p)),
        );
        consumed = (consumed + 8).min(got.len() as u64);
        net.client(0).consumed(&sid(1), consumed).unwrap();
        net.pump(now);
    }
    assert_eq!(net.router.counters().resets(Reason::WindowExceeded), 0);
    assert_eq!(got.len() as u64, TOTAL);
    for (i, (seq, p)) in got.iter().enumerate() {
        assert_eq!(*seq, i as u64 + 1, "in order, nothing repeated");
        assert_eq!(p, &record(*seq).to_vec(), "exact bytes");
    }
    assert_eq!(
        rounds, 6,
        "16 in the first round, then 8 per round as the client consumes"
    );
}

#[test]
fn control_frames_overtake_a_full_data_queue() {
    let clock = Clock::new();
    let now = clock.now;
    let mut net = Net::new(relay_cfg());
    net.add_env(now, "env1", cfg());
    net.add_client(now, "env1", cfg());
    for n in 1..=3 {
        establish_via(&mut net, now, 0, 0, n);
    }
    let (c, e) = (net.clients[0].1, net.envs[0].1);
    for _ in 0..16 {
        net.env(0)
            .send(&sid(1), Bytes::from(vec![1; MAX_PAYLOAD_BYTES]))
            .unwrap();
    }
    let (r, (ep, link)) = (&mut net.router, &mut net.envs[0]);
    push_up(r, ep, *link, now);
    assert!(net.router.link_queued_bytes(c) >= 16 * MAX_PAYLOAD_BYTES);
    // Behind a full window of data: a reset of another stream and an ACK of a third.
    net.env(0).reset(sid(2), Reason::Closed).unwrap();
    let (r, (ep, link)) = (&mut net.router, &mut net.envs[0]);
    push_up(r, ep, *link, now);
    net.router
        .handle_frame(now, e, raw(FrameType::Ack, sid(3), 0, 0, 16, b""));
    let out: Vec<_> = drain(&mut net.router, c, now)
        .iter()
        .map(|f| (f.ftype, f.stream[0]))
        .collect();
    assert_eq!(out.len(), 18);
    assert_eq!(
        &out[..3],
        &[
            (FrameType::Reset, 2),
            (FrameType::Ack, 3),
            (FrameType::Data, 1)
        ]
    );
    assert_eq!(net.router.queued_bytes(), 0);
}

#[test]
fn data_from_the_environment_before_its_accept_resets_the_stream() {
    let clock = Clock::new();
    let now = clock.now;
    let mut net = Net::new(relay_cfg());
    net.add_env(now, "env1", cfg());
    net.add_client(now, "env1", cfg());
    net.client(0).open(sid(1), Bytes::new()).unwrap();
    net.pump(now);
    let e = net.envs[0].1;
    net.router
        .handle_frame(now, e, raw(FrameType::Data, sid(1), 1, 0, 16, b"early"));
    net.pump(now);
    assert_eq!(
        events(net.client(0)),
        vec![peer_reset(1, "malformed_frame")]
    );
    assert_eq!(net.router.route_count(), 0);
}
