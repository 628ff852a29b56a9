//! Hostile peers against the relay's routing core, on a simulated clock: what a client or an
//! environment can make the relay hold by sending frames that each look harmless. Every test
//! names the bound it checks, and failed before its fix.

mod common;

use bytes::Bytes;
use common::*;
use execrelay_protocol::config::QUEUED_FRAME_OVERHEAD_BYTES;
use execrelay_protocol::frame::{FrameType, HEADER_BYTES};
use execrelay_protocol::reason::{CloseReason, Reason};

/// Every frame queued for a client link counts against its share (`client_link_share_bytes`,
/// at its memory cost), refusals included: a client that floods `OPEN`s past its rate and
/// never reads the `RESET busy` answers used to make the relay hold up to a whole control
/// reserve of them (21,000 refusals, about 3 MiB in memory, per link: 601 MB for 320 links
/// of five addresses). Now its link closes (`control_queue_full`) when a refusal would pass
/// its share, exactly at the edge: the refusals that fit are queued, the next closes the
/// link and frees them; nobody else notices.
#[test]
fn a_client_that_floods_opens_and_never_reads_the_refusals_is_closed_at_its_share() {
    let clock = Clock::new();
    let now = clock.now;
    let reset_cost = HEADER_BYTES + "busy".len() + QUEUED_FRAME_OVERHEAD_BYTES;
    let fit = 100;
    let mut rcfg = relay_cfg();
    rcfg.opens_per_second = 1;
    rcfg.client_link_share_bytes = fit * reset_cost;
    let mut net = Net::new(rcfg);
    net.add_env(now, "env1", cfg());
    net.add_client(now, "env1", cfg());
    net.add_client(now, "env1", cfg());
    establish_via(&mut net, now, 1, 0, 200);
    let bad = net.clients[0].1;
    // The first OPEN is admitted (the bucket's one token), the rest refused and queued,
    // unread.
    for n in 0..=fit {
        let mut id = [0u8; 16];
        id[..8].copy_from_slice(&(n as u64 + 1).to_be_bytes());
        net.router
            .handle_frame(now, bad, raw(FrameType::Open, id, 0, 0, 16, b"msg1"));
        assert!(net.router.is_live(bad), "closed after {n} OPENs");
    }
    assert_eq!(net.router.counters().resets(Reason::Busy), fit as u64);
    assert_eq!(net.router.link_share_bytes(bad), fit * reset_cost);
    // One more refusal would pass the share: the link closes instead, its queue freed and
    // its admitted stream reset on the environment.
    net.router.handle_frame(
        now,
        bad,
        raw(FrameType::Open, [0xee; 16], 0, 0, 16, b"msg1"),
    );
    assert!(!net.router.is_live(bad));
    assert_eq!(
        net.router.counters().closes(CloseReason::ControlQueueFull),
        1
    );
    net.pump(now);
    assert_eq!(net.closed, vec![(bad, CloseReason::ControlQueueFull)]);
    // The other client's stream carries on both ways.
    net.client(1)
        .send(&sid(200), Bytes::from_static(b"up"))
        .unwrap();
    net.env(0)
        .send(&sid(200), Bytes::from_static(b"down"))
        .unwrap();
    net.pump(now);
    let env_events = events(net.env(0));
    assert!(data_of(&env_events).contains(&(sid(200), 1, b"up".to_vec())));
    assert_eq!(
        data_of(&events(net.client(1))),
        vec![(sid(200), 1, b"down".to_vec())]
    );
    assert_eq!(net.router.queued_bytes(), 0);
}

/// The window bound holds against a receiver that lies about what it consumed: a client that
/// never reads its link but sends `ACK`s for records still in the relay's queue used to open
/// the environment's window again and again, so the relay queued the environment's output
/// for it without bound (the window check trusts the receiver's report). A report that
/// acknowledges a record the relay has not yet written to that receiver now resets the
/// stream (`malformed_frame`) on both links, and its queue is freed.
#[test]
fn a_receiver_that_acknowledges_records_it_was_never_given_is_reset_and_the_queue_stays_within_one_window(
) {
    let clock = Clock::new();
    let now = clock.now;
    let mut net = Net::new(relay_cfg());
    net.add_env(now, "env1", cfg());
    net.add_client(now, "env1", cfg());
    establish_via(&mut net, now, 0, 0, 1);
    establish_via(&mut net, now, 0, 0, 2);
    let (c, e) = (net.clients[0].1, net.envs[0].1);
    let record = 1000;
    // The environment fills the client's window of 16; nothing is written to the client.
    for seq in 1..=16 {
        net.router.handle_frame(
            now,
            e,
            raw(FrameType::Data, sid(1), seq, 0, 16, &vec![7; record]),
        );
    }
    let one_window = 16 * (HEADER_BYTES + record + QUEUED_FRAME_OVERHEAD_BYTES);
    assert_eq!(net.router.stream_queued_bytes(c, &sid(1)), one_window);
    // The client acknowledges all 16 without having read one.
    net.router
        .handle_frame(now, c, raw(FrameType::Ack, sid(1), 0, 16, 16, b""));
    assert_eq!(net.router.counters().resets(Reason::MalformedFrame), 1);
    assert_eq!(net.router.stream_queued_bytes(c, &sid(1)), 0);
    // More records from the environment are no longer routed (late frames, dropped free).
    net.router.handle_frame(
        now,
        e,
        raw(FrameType::Data, sid(1), 17, 0, 16, &vec![7; record]),
    );
    assert_eq!(net.router.stream_queued_bytes(c, &sid(1)), 0);
    assert_eq!(net.router.route_count(), 1);
    // An honest acknowledgement of records the relay did write is still taken: stream 2.
    for seq in 1..=16 {
        net.router
            .handle_frame(now, e, raw(FrameType::Data, sid(2), seq, 0, 16, b"x"));
    }
    let written = drain(&mut net.router, c, now);
    let data2 = written
        .iter()
        .filter(|f| f.ftype == FrameType::Data && f.stream == sid(2))
        .count();
    assert_eq!(data2, 16);
    net.router
        .handle_frame(now, c, raw(FrameType::Ack, sid(2), 0, 16, 16, b""));
    net.router
        .handle_frame(now, e, raw(FrameType::Data, sid(2), 17, 0, 16, b"x"));
    assert_eq!(net.router.counters().resets(Reason::MalformedFrame), 1);
    assert_eq!(
        net.router.counters().resets(Reason::WindowExceeded),
        0,
        "record 17 is inside the window the honest report opened"
    );
    assert!(net.router.is_live(c) && net.router.is_live(e));
}

/// The same lie from the environment's side (about the client's records) is reset the same
/// way, and only that stream.
#[test]
fn an_environment_that_acknowledges_records_it_was_never_given_is_reset_alone() {
    let clock = Clock::new();
    let now = clock.now;
    let mut net = Net::new(relay_cfg());
    net.add_env(now, "env1", cfg());
    net.add_client(now, "env1", cfg());
    establish_via(&mut net, now, 0, 0, 1);
    establish_via(&mut net, now, 0, 0, 2);
    let (c, e) = (net.clients[0].1, net.envs[0].1);
    for seq in 1..=3 {
        net.router
            .handle_frame(now, c, raw(FrameType::Data, sid(1), seq, 0, 16, b"in"));
    }
    // Two of three written to the environment; it acknowledges three.
    assert_eq!(
        net.router.stream_queued_bytes(e, &sid(1)),
        3 * (HEADER_BYTES + 2 + QUEUED_FRAME_OVERHEAD_BYTES)
    );
    let mut written = 0;
    while written < 2 {
        match net.router.poll_transmit(now, e) {
            Some(execrelay_protocol::transmit::Transmit::Frame(f)) => {
                if f.ftype == FrameType::Data {
                    written += 1;
                }
            }
            Some(_) => {}
            None => panic!("the relay wrote fewer than 2 records"),
        }
    }
    net.router
        .handle_frame(now, e, raw(FrameType::Ack, sid(1), 0, 2, 16, b""));
    assert_eq!(net.router.counters().resets(Reason::MalformedFrame), 0);
    net.router
        .handle_frame(now, e, raw(FrameType::Ack, sid(1), 0, 3, 16, b""));
    assert_eq!(net.router.counters().resets(Reason::MalformedFrame), 1);
    assert_eq!(net.router.route_count(), 1, "stream 2 is untouched");
}

/// `RESET`s that cross are never charged, however many streams closed meanwhile. Reproduce
/// (before): one address, no key, 20 client links (of its 64) each send a burst of 64
/// `OPEN`s (their rate) and then `RESET` them all. The relay forwards 1,280 `OPEN`s and then
/// the 1,280 `RESET`s; the environment refuses the `OPEN`s past its pending cap (`busy`) and
/// remembers only the last 1,024 closed ids, so the clients' `RESET`s of the first refused
/// ones were charged to the environment's unknown-stream budget (64) and the environment's
/// engine closed its link to the relay; the relay likewise remembered only 1,024 ids on the
/// environment link, so the environment's crossing `RESET busy` answers were charged there
/// and the relay closed the environment link too. Every client of that environment lost its
/// streams, and the attack could be repeated as soon as the environment came back. A `RESET`
/// for a stream a link does not hold asks for nothing and is now dropped free (counted).
#[test]
fn crossing_resets_beyond_the_closed_set_cannot_close_an_environment_link() {
    flood_then_cross(FrameType::Reset);
}

/// The same with `ACK`s in place of the `RESET`s: the relay used to forward a client's `ACK`
/// before the environment's `ACCEPT`, so those `ACK`s reached the environment after its
/// refusals and were charged there (an `ACK` is rightly charged when it names a stream
/// never known). A client has nothing to acknowledge before the `ACCEPT`: the relay now
/// resets a stream whose client sends an `ACK` first (`malformed_frame`; its `DATA` first
/// was already reset `window_exceeded`), so no frame of a client reaches an environment for
/// a stream the environment has not accepted, except its `OPEN` and `RESET`.
#[test]
fn a_client_ack_before_the_accept_is_not_forwarded_and_cannot_close_an_environment_link() {
    flood_then_cross(FrameType::Ack);
}

fn flood_then_cross(second: FrameType) {
    let clock = Clock::new();
    let now = clock.now;
    let mut net = Net::new(relay_cfg());
    net.add_env(now, "env1", cfg());
    net.add_client(now, "env1", cfg());
    establish_via(&mut net, now, 0, 0, 1);
    let e = net.envs[0].1;
    let links: Vec<_> = (0..20)
        .map(|_| {
            net.router
                .add_client_link(now, "env1", ADDR, 9)
                .expect("a client link")
        })
        .collect();
    let id = |k: usize, j: usize| {
        let mut id = [0xa5u8; 16];
        id[..8].copy_from_slice(&((k * 64 + j) as u64).to_be_bytes());
        id
    };
    for (k, &l) in links.iter().enumerate() {
        for j in 0..64 {
            net.router
                .handle_frame(now, l, raw(FrameType::Open, id(k, j), 0, 0, 16, b"msg1"));
        }
    }
    for (k, &l) in links.iter().enumerate() {
        for j in 0..64 {
            let window = if second == FrameType::Ack { 16 } else { 0 };
            net.router
                .handle_frame(now, l, raw(second, id(k, j), 0, 0, window, b""));
        }
    }
    net.pump(now);
    assert!(net.closed.is_empty(), "links closed: {:?}", net.closed);
    assert!(net.router.is_live(e));
    assert_eq!(net.env(0).is_closed(), None);
    // The bystander's stream carries on both ways.
    let _ = events(net.env(0));
    let _ = events(net.client(0));
    net.client(0)
        .send(&sid(1), Bytes::from_static(b"up"))
        .unwrap();
    net.env(0)
        .send(&sid(1), Bytes::from_static(b"down"))
        .unwrap();
    net.pump(now);
    assert_eq!(
        data_of(&events(net.env(0))),
        vec![(sid(1), 1, b"up".to_vec())]
    );
    assert_eq!(
        data_of(&events(net.client(0))),
        vec![(sid(1), 1, b"down".to_vec())]
    );
}

/// An environment link is never closed for frames of streams it does not hold. Reproduce
/// (before): honest clients reset streams while the environment's records are in flight
/// (at most a window each: normal at every interrupted download); those late frames are free
/// only while the link's closed set remembers the ids, and any client (no key) evicts them by
/// opening and resetting streams at its rate. Five interrupted streams then cost the
/// environment link 80 charges against a budget of 64, and the relay closed it, cutting every
/// client of the environment. The same held on the environment's side of its link.
#[test]
fn late_frames_of_forgotten_streams_never_close_an_environment_link() {
    let clock = Clock::new();
    let now = clock.now;
    let mut rcfg = relay_cfg();
    rcfg.closed_streams_remembered = 4;
    let mut net = Net::new(rcfg);
    net.add_env(now, "env1", cfg());
    net.add_client(now, "env1", cfg());
    net.add_client(now, "env1", cfg());
    establish_via(&mut net, now, 0, 0, 9);
    for n in 1..=5 {
        establish_via(&mut net, now, 1, 0, n);
    }
    let (c, e) = (net.clients[1].1, net.envs[0].1);
    for n in 1..=5 {
        net.router.handle_frame(
            now,
            c,
            raw(FrameType::Reset, sid(n), 0, 0, 0, b"interrupted"),
        );
    }
    // Another client churns streams: the relay forgets the five ids.
    let churn = net.router.add_client_link(now, "env1", ADDR, 7).unwrap();
    for n in 100..110 {
        net.router
            .handle_frame(now, churn, raw(FrameType::Open, sid(n), 0, 0, 16, b"msg1"));
        net.router
            .handle_frame(now, churn, raw(FrameType::Reset, sid(n), 0, 0, 0, b"bye"));
    }
    // The environment's records that were in flight: a window of each stream.
    for n in 1..=5 {
        for seq in 1..=16 {
            net.router
                .handle_frame(now, e, raw(FrameType::Data, sid(n), seq, 0, 16, b"late"));
        }
    }
    assert!(net.router.is_live(e), "the environment link was closed");
    assert_eq!(
        net.router
            .counters()
            .closes(CloseReason::UnknownStreamBudget),
        0
    );
    // The bystander carries on.
    net.pump(now);
    let _ = events(net.env(0));
    net.client(0)
        .send(&sid(9), Bytes::from_static(b"up"))
        .unwrap();
    net.pump(now);
    assert_eq!(
        data_of(&events(net.env(0))),
        vec![(sid(9), 1, b"up".to_vec())]
    );
}

/// The environment's engine on a link to a relay (`unknown_streams_close_link: false`)
/// drops frames of streams it does not hold instead of closing; `DATA` is still answered
/// with `RESET`. A direct link (the default) still closes past the budget.
#[test]
fn an_environment_endpoint_drops_unknown_stream_frames_instead_of_closing() {
    let clock = Clock::new();
    let now = clock.now;
    let env_cfg = execrelay_protocol::config::EndpointConfig {
        unknown_streams_close_link: false,
        ..cfg()
    };
    let mut env = server(now, env_cfg);
    let mut direct = server(now, cfg());
    for n in 0..100u8 {
        env.handle_frame(now, raw(FrameType::Ack, [n + 1; 16], 0, 0, 16, b""));
        direct.handle_frame(now, raw(FrameType::Ack, [n + 1; 16], 0, 0, 16, b""));
    }
    assert_eq!(env.is_closed(), None);
    assert_eq!(direct.is_closed(), Some(CloseReason::UnknownStreamBudget));
    env.handle_frame(now, raw(FrameType::Data, sid(200), 1, 0, 16, b"?"));
    let out: Vec<_> = std::iter::from_fn(|| env.poll_transmit(now))
        .filter_map(|t| match t {
            execrelay_protocol::transmit::Transmit::Frame(f) => Some(f),
            _ => None,
        })
        .collect();
    assert_eq!(out.len(), 1);
    assert_eq!(
        (out[0].ftype, out[0].stream, &out[0].payload[..]),
        (FrameType::Reset, sid(200), &b"unknown_stream"[..])
    );
}

/// `max_client_links_per_address` counts an IPv6 /64 as one address (as the HTTP front does):
/// one host owns a whole /64, and counting single IPv6 addresses let it take every client
/// link of the relay (`max_client_links`), one source address per link. An IPv4-mapped
/// address counts as its IPv4 address.
#[test]
fn client_links_per_address_count_an_ipv6_slash_64_as_one_address() {
    use std::net::IpAddr;
    let now = Clock::new().now;
    let mut rcfg = relay_cfg();
    rcfg.max_client_links_per_address = 2;
    let mut router = execrelay_protocol::router::Router::new(rcfg).unwrap();
    let v6 = |s: &str| -> IpAddr { s.parse().unwrap() };
    router
        .add_client_link(now, "env1", v6("2001:db8:1:2::1"), 1)
        .unwrap();
    router
        .add_client_link(now, "env1", v6("2001:db8:1:2:ffff::2"), 1)
        .unwrap();
    assert!(router
        .add_client_link(now, "env1", v6("2001:db8:1:2::3"), 1)
        .is_err());
    // Another /64 is another address.
    router
        .add_client_link(now, "env1", v6("2001:db8:1:3::1"), 1)
        .unwrap();
    // IPv4-mapped: the same address as its IPv4 form.
    router
        .add_client_link(now, "env1", v6("192.0.2.7"), 1)
        .unwrap();
    let first = router
        .add_client_link(now, "env1", v6("::ffff:192.0.2.7"), 1)
        .unwrap();
    assert!(router
        .add_client_link(now, "env1", v6("192.0.2.7"), 1)
        .is_err());
    // A freed slot lets the next in.
    router.link_closed(first, CloseReason::Transport);
    router
        .add_client_link(now, "env1", v6("192.0.2.7"), 1)
        .unwrap();
}

/// One environment and two clients; the second holds stream 7 (established, drained).
fn one_env_two_clients(now: std::time::Instant) -> Net {
    let mut net = Net::new(relay_cfg());
    net.add_env(now, "env1", cfg());
    net.add_client(now, "env1", cfg());
    net.add_client(now, "env1", cfg());
    establish_via(&mut net, now, 1, 0, 7);
    net
}

/// A client's `OPEN` that breaks a rule of §5 on an id it does not hold (a window of 0, a
/// sequence number, an acknowledgement) is answered `RESET
/// malformed_frame` on its own link, so that its implementer learns why; nothing reaches the
/// environment, and the id's holder (another client) is not disturbed. Before, it was dropped
/// in silence and the client waited for its own timeout.
#[test]
fn a_malformed_open_is_refused_malformed_frame_to_its_sender_alone() {
    let clock = Clock::new();
    let now = clock.now;
    let mut net = one_env_two_clients(now);
    let (bad, env_link) = (net.clients[0].1, net.envs[0].1);
    drain(&mut net.router, bad, now);
    drain(&mut net.router, env_link, now);
    let cases = [
        (
            "a window of 0",
            raw(FrameType::Open, sid(1), 0, 0, 0, b"msg1"),
        ),
        (
            "a sequence number",
            raw(FrameType::Open, sid(3), 5, 0, 16, b"msg1"),
        ),
        (
            "an acknowledgement",
            raw(FrameType::Open, sid(4), 0, 9, 16, b"msg1"),
        ),
        // The id another client holds (stream 7 of client 1).
        (
            "on a held id",
            raw(FrameType::Open, sid(7), 1, 0, 16, b"msg1"),
        ),
    ];
    for (n, (what, frame)) in cases.into_iter().enumerate() {
        let id = execrelay_protocol::frame::Frame::decode(&frame)
            .expect("a frame that decodes")
            .stream;
        net.router.handle_frame(now, bad, frame);
        let sent = drain(&mut net.router, bad, now);
        assert_eq!(sent.len(), 1, "{what}: one answer");
        assert_eq!(sent[0].ftype, FrameType::Reset, "{what}");
        assert_eq!(sent[0].stream, id, "{what}");
        assert_eq!(&sent[0].payload[..], b"malformed_frame", "{what}");
        assert!(
            drain(&mut net.router, env_link, now).is_empty(),
            "{what}: nothing forwarded"
        );
        assert_eq!(
            net.router.counters().resets(Reason::MalformedFrame),
            n as u64 + 1,
            "{what}"
        );
    }
    // On stream id 0 (the link's own): charged, never answered there.
    net.router
        .handle_frame(now, bad, raw(FrameType::Open, [0; 16], 0, 0, 16, b"msg1"));
    assert!(drain(&mut net.router, bad, now).is_empty());
    assert!(net.router.is_live(bad));
    // The holder's stream carries on.
    net.env(0)
        .send(&sid(7), Bytes::from_static(b"still here"))
        .unwrap();
    net.pump(now);
    assert_eq!(
        data_of(&events(net.client(1))),
        vec![(sid(7), 1, b"still here".to_vec())]
    );
}

/// A frame whose header reads but does not decode (reserved flag bits, a type this version
/// lacks) is answered as one that breaks a rule: an `OPEN` on an id the sender does not hold
/// is refused `malformed_frame` to its sender alone, and a frame on a stream the sender holds
/// resets that stream. A message with no readable header (too short, another version) names
/// nothing and is only charged. Before, every frame that failed decoding was only charged,
/// and a client whose `OPEN` carried a flag this relay does not know waited for its timeout.
#[test]
fn a_frame_that_does_not_decode_is_answered_on_the_stream_its_header_names() {
    let clock = Clock::new();
    let now = clock.now;
    let mut net = one_env_two_clients(now);
    let (bad, holder, env_link) = (net.clients[0].1, net.clients[1].1, net.envs[0].1);
    for link in [bad, holder, env_link] {
        drain(&mut net.router, link, now);
    }
    let with_flags = |mut frame: Vec<u8>, flags: u16| {
        frame[2..4].copy_from_slice(&flags.to_be_bytes());
        frame
    };
    // An OPEN with a reserved flag bit (bit 2) on a new id: refused to its sender.
    let open = with_flags(raw(FrameType::Open, sid(5), 0, 0, 16, b"msg1"), 0x0004);
    assert!(execrelay_protocol::frame::Frame::decode(&open).is_err());
    net.router.handle_frame(now, bad, open);
    let sent = drain(&mut net.router, bad, now);
    assert_eq!(sent.len(), 1, "one answer");
    assert_eq!(
        (sent[0].ftype, sent[0].stream, &sent[0].payload[..]),
        (FrameType::Reset, sid(5), &b"malformed_frame"[..])
    );
    assert!(drain(&mut net.router, env_link, now).is_empty());
    assert_eq!(net.router.counters().resets(Reason::MalformedFrame), 1);
    // No readable header: too short, or another version. Charged, never answered.
    let mut other_version = raw(FrameType::Open, sid(6), 0, 0, 16, b"msg1");
    other_version[0] = 2;
    for frame in [vec![1u8; HEADER_BYTES - 1], other_version] {
        net.router.handle_frame(now, bad, frame);
        assert!(drain(&mut net.router, bad, now).is_empty());
    }
    // A type this version lacks, on an id nobody holds: charged, not answered (only an OPEN
    // is refused).
    let mut unknown = raw(FrameType::Ack, sid(8), 0, 0, 0, b"");
    unknown[1] = 9;
    net.router.handle_frame(now, bad, unknown);
    assert!(drain(&mut net.router, bad, now).is_empty());
    assert!(net.router.is_live(bad), "within the malformed budget");
    assert_eq!(net.router.counters().resets(Reason::MalformedFrame), 1);
    // The same client's undecodable frame on an id another client holds disturbs nothing.
    let data = with_flags(raw(FrameType::Data, sid(7), 1, 0, 0, b"x"), 0x0001);
    net.router.handle_frame(now, bad, data.clone());
    assert!(drain(&mut net.router, holder, now).is_empty());
    assert!(drain(&mut net.router, env_link, now).is_empty());
    // The holder's own undecodable frame on its stream resets that stream, both ends.
    net.router.handle_frame(now, holder, data);
    for (end, link) in [("client", holder), ("environment", env_link)] {
        let sent = drain(&mut net.router, link, now);
        assert_eq!(sent.len(), 1, "{end}: one RESET");
        assert_eq!(
            (sent[0].ftype, sent[0].stream, &sent[0].payload[..]),
            (FrameType::Reset, sid(7), &b"malformed_frame"[..]),
            "{end}"
        );
    }
    assert_eq!(net.router.counters().resets(Reason::MalformedFrame), 2);
}
