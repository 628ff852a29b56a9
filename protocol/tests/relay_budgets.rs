//! The relay under attack, on the routing core and a simulated clock (`secure-transport.md`
//! §6.4, §8): budgets charged to whoever spends them, refused ids counted as unknown, idle
//! client links reaped, an address's share of an environment's streams, and the queue a
//! client that does not read can make the relay hold. A hostile client comes from one address
//! (`ADDR2`), an honest one from another (`ADDR`); every test failed before its fix and checks
//! its bound at the edge.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use execrelay_protocol::config::{BucketConfig, QUEUED_FRAME_OVERHEAD_BYTES};
use execrelay_protocol::frame::{FrameType, StreamId, HEADER_BYTES};
use execrelay_protocol::reason::{CloseReason, Reason};
use execrelay_protocol::router::{LinkId, Router, RouterEvent};
use execrelay_protocol::transmit::Transmit;

fn id(n: u64) -> StreamId {
    let mut id = [0x5au8; 16];
    id[..8].copy_from_slice(&n.to_be_bytes());
    id
}

fn open(router: &mut Router, now: std::time::Instant, link: LinkId, n: u64) {
    router.handle_frame(now, link, raw(FrameType::Open, id(n), 0, 0, 16, b"msg1"));
}

/// The environment's answer to `OPEN` `n`: a `RESET` with `reason`.
fn answer(router: &mut Router, now: std::time::Instant, env: LinkId, n: u64, reason: &str) {
    router.handle_frame(
        now,
        env,
        raw(FrameType::Reset, id(n), 0, 0, 0, reason.as_bytes()),
    );
}

/// `OPEN`s queued for `env` (forwarded by the relay), drained.
fn forwarded_opens(router: &mut Router, now: std::time::Instant, env: LinkId) -> usize {
    drain(router, env, now)
        .iter()
        .filter(|f| f.ftype == FrameType::Open)
        .count()
}

/// Finding 1: eight garbage `OPEN`s from a client without a key emptied the environment
/// link's handshake budget, and every authorized client got `busy` for the cool-down, for as
/// long as the attacker kept it up. The environment's handshake-failure `RESET`s are now
/// charged by the relay to the client link that sent the `OPEN` (and its address): the one
/// that takes the link's last token (burst 8) closes that link; the environment's budget is
/// never touched, and another client opens streams as before. Refusals that are load
/// (`busy`, `too_many_streams`) are not charged.
#[test]
fn handshake_failures_close_the_link_that_caused_them_never_the_environment() {
    let now = Clock::new().now;
    let mut net = Net::new(relay_cfg());
    net.add_env(now, "env1", cfg());
    net.add_client_from(now, "env1", ADDR, cfg());
    establish_via(&mut net, now, 0, 0, 1);
    let e = net.envs[0].1;
    let hostile = net.router.add_client_link(now, "env1", ADDR2, 7).unwrap();
    // Load is free: twenty `busy` answers cost nothing.
    for n in 100..120 {
        open(&mut net.router, now, hostile, n);
        answer(&mut net.router, now, e, n, "busy");
    }
    assert!(net.router.is_live(hostile));
    for n in 1..=8u64 {
        open(&mut net.router, now, hostile, n);
        answer(&mut net.router, now, e, n, "handshake_failed");
        assert_eq!(net.router.is_live(hostile), n < 8, "after {n} failures");
    }
    assert_eq!(net.router.counters().handshake_failures, 8);
    assert_eq!(
        net.router.counters().closes(CloseReason::HandshakeBudget),
        1
    );
    // The reasons the exec server uses are all failures: a new link, one of each, charged.
    let again = net.router.add_client_link(now, "env1", ADDR2, 8).unwrap();
    for (n, why) in [
        "unauthorized",
        "replayed_handshake",
        "clock_skew",
        "handshake_failed",
    ]
    .iter()
    .enumerate()
    {
        open(&mut net.router, now, again, 200 + n as u64);
        answer(&mut net.router, now, e, 200 + n as u64, why);
    }
    assert_eq!(net.router.counters().handshake_failures, 12);
    // The environment never saw a reason to refuse anyone: the honest client opens a stream.
    let _ = drain(&mut net.router, e, now);
    net.pump(now);
    establish_via(&mut net, now, 0, 0, 2);
    assert!(net.router.is_live(e));
}

/// Finding 1, over many links: an address's bucket (burst 4 here) is shared by all its
/// links, and the relay forwards an address's `OPEN`s only while those awaiting an answer are
/// fewer than its tokens. The environment sees at most `burst + t / refill` failures from the
/// address, however many links it opens or closes: closing its links does not refill it.
/// An `ACCEPT` gives the token back.
#[test]
fn an_address_pays_in_advance_for_the_failures_its_opens_can_cause() {
    let mut clock = Clock::new();
    let now = clock.now;
    let mut rcfg = relay_cfg();
    rcfg.address_handshake_failures = BucketConfig {
        burst: 4,
        refill: Duration::from_secs(1),
    };
    rcfg.handshake_failures = BucketConfig {
        burst: 100,
        refill: Duration::from_secs(1),
    };
    let mut net = Net::new(rcfg);
    net.add_env(now, "env1", cfg());
    let e = net.envs[0].1;
    let links: Vec<LinkId> = (0..3)
        .map(|i| net.router.add_client_link(now, "env1", ADDR2, i).unwrap())
        .collect();
    for n in 1..=6u64 {
        open(&mut net.router, now, links[n as usize % 3], n);
    }
    assert_eq!(forwarded_opens(&mut net.router, now, e), 4, "the burst");
    assert_eq!(net.router.counters().resets(Reason::Busy), 2);
    // One answer fails: three pending, three tokens: still no room.
    answer(&mut net.router, now, e, 1, "handshake_failed");
    open(&mut net.router, now, links[0], 7);
    assert_eq!(forwarded_opens(&mut net.router, now, e), 0);
    for n in 2..=4 {
        answer(&mut net.router, now, e, n, "handshake_failed");
    }
    assert_eq!(net.router.counters().handshake_failures, 4);
    // The failure that took the address's last token closed its link (link 4 % 3 = 1).
    assert!(!net.router.is_live(links[1]));
    // A new link of the same address: nothing forwarded until a token returns.
    let fresh = net.router.add_client_link(now, "env1", ADDR2, 9).unwrap();
    open(&mut net.router, now, fresh, 8);
    assert_eq!(forwarded_opens(&mut net.router, now, e), 0);
    let later = clock.advance(Duration::from_millis(999));
    open(&mut net.router, later, fresh, 9);
    assert_eq!(forwarded_opens(&mut net.router, later, e), 0, "not before");
    let later = clock.advance(Duration::from_millis(1));
    open(&mut net.router, later, fresh, 10);
    open(&mut net.router, later, fresh, 11);
    assert_eq!(
        forwarded_opens(&mut net.router, later, e),
        1,
        "one per refill"
    );
    // Accepted: its token comes back at once.
    net.router
        .handle_frame(later, e, raw(FrameType::Accept, id(10), 0, 0, 16, b"msg2"));
    open(&mut net.router, later, fresh, 12);
    assert_eq!(forwarded_opens(&mut net.router, later, e), 1);
    // The honest address has its own bucket, full.
    let honest = net.router.add_client_link(later, "env1", ADDR, 10).unwrap();
    for n in 20..24 {
        open(&mut net.router, later, honest, n);
    }
    assert_eq!(forwarded_opens(&mut net.router, later, e), 4);
    // 1 s of attack: at most 4 + 1 failures could have reached the environment.
    assert!(net.router.counters().handshake_failures <= 5);
}

/// An `OPEN` whose route ends before its answer by the client's doing (its `RESET`, its
/// link's death) spends its token: otherwise a client could send `OPEN`s that fail and `RESET`
/// them (or close its link) before the failures come back, uncharged, and repeat at will. An
/// environment that goes away refunds its pending `OPEN`s.
#[test]
fn an_open_abandoned_before_its_answer_spends_its_token() {
    let now = Clock::new().now;
    let mut rcfg = relay_cfg();
    rcfg.address_handshake_failures = BucketConfig {
        burst: 3,
        refill: Duration::from_secs(3600),
    };
    let mut net = Net::new(rcfg);
    net.add_env(now, "env1", cfg());
    let e = net.envs[0].1;
    let a = net.router.add_client_link(now, "env1", ADDR2, 1).unwrap();
    open(&mut net.router, now, a, 1);
    net.router
        .handle_frame(now, a, raw(FrameType::Reset, id(1), 0, 0, 0, b"bye"));
    let b = net.router.add_client_link(now, "env1", ADDR2, 2).unwrap();
    open(&mut net.router, now, b, 2);
    net.router.link_closed(b, CloseReason::Transport);
    assert_eq!(net.router.counters().abandoned_opens, 2);
    assert_eq!(forwarded_opens(&mut net.router, now, e), 2);
    // One token left: one more OPEN, then nothing.
    open(&mut net.router, now, a, 3);
    open(&mut net.router, now, a, 4);
    assert_eq!(forwarded_opens(&mut net.router, now, e), 1);
    // The environment goes: its pending OPEN is refunded (not the client's doing).
    net.router.link_closed(e, CloseReason::Transport);
    net.add_env(now, "env1", cfg());
    let e2 = net.envs[1].1;
    open(&mut net.router, now, a, 5);
    assert_eq!(forwarded_opens(&mut net.router, now, e2), 1);
}

/// Finding 7: frames for an id whose `OPEN` was refused were free (the id was remembered as
/// closed), so a client could send them without end at no cost. They are now charged to the
/// unknown-stream budget (an honest client sends nothing after an `OPEN` but waits for its
/// answer): 64 back to back, and the 65th closes the link. The same for an `OPEN` the
/// environment refused.
#[test]
fn frames_for_an_id_whose_open_was_refused_count_as_unknown() {
    for refused_by_environment in [false, true] {
        let now = Clock::new().now;
        let mut net = Net::new(relay_cfg());
        let env = if refused_by_environment {
            net.add_env(now, "env1", cfg());
            Some(net.envs[0].1)
        } else {
            None
        };
        let c = net.router.add_client_link(now, "env1", ADDR2, 1).unwrap();
        open(&mut net.router, now, c, 1);
        match env {
            Some(e) => answer(&mut net.router, now, e, 1, "busy"),
            None => assert_eq!(net.router.counters().resets(Reason::EnvironmentOffline), 1),
        }
        for seq in 1..=64 {
            net.router
                .handle_frame(now, c, raw(FrameType::Ack, id(1), 0, seq, 16, b""));
            assert!(net.router.is_live(c), "after {seq}");
        }
        net.router
            .handle_frame(now, c, raw(FrameType::Ack, id(1), 0, 65, 16, b""));
        assert!(!net.router.is_live(c));
        assert_eq!(
            net.router
                .counters()
                .closes(CloseReason::UnknownStreamBudget),
            1
        );
    }
}

/// Answer every ping `link` has due (an honest peer).
fn answer_pings(router: &mut Router, now: std::time::Instant, link: LinkId) {
    while let Some(t) = router.poll_transmit(now, link) {
        if let Transmit::Ping(p) = t {
            router.handle_pong(link, &p);
        }
    }
}

/// Drive `link`'s timers from `from` to `to`, answering its pings (so only idleness can
/// close it).
fn live_until(router: &mut Router, from: std::time::Instant, to: std::time::Instant, link: LinkId) {
    let mut now = from;
    while let Some(t) = router.poll_timeout(link).filter(|t| *t <= to) {
        now = now.max(t);
        router.handle_timeout(now, link);
        answer_pings(router, now, link);
        if !router.is_live(link) {
            return;
        }
    }
}

/// Finding 4: client links that hold nothing were never reaped (64 of 64 alive after 75 s,
/// their pongs keeping them up), so 64 addresses could hold all 4,096 slots. A client link
/// with no stream for `idle_link_timeout` (60 s) is closed (`idle`), exactly at the timeout;
/// idleness counts from its last stream's end, and a link with a stream is never idle. The
/// environment link never is.
#[test]
fn a_client_link_without_a_stream_is_closed_at_the_idle_timeout() {
    let mut clock = Clock::new();
    let t0 = clock.now;
    let idle = relay_cfg().idle_link_timeout;
    let mut net = Net::new(relay_cfg());
    net.add_env(t0, "env1", cfg());
    let e = net.envs[0].1;
    let empty = net.router.add_client_link(t0, "env1", ADDR2, 1).unwrap();
    live_until(
        &mut net.router,
        t0,
        t0 + idle - Duration::from_millis(1),
        empty,
    );
    assert!(net.router.is_live(empty), "not before the timeout");
    net.router.handle_timeout(t0 + idle, empty);
    assert!(!net.router.is_live(empty));
    assert_eq!(net.router.counters().closes(CloseReason::Idle), 1);

    // A link with a stream lives on; its idleness counts from its stream's end.
    net.add_client_from(t0, "env1", ADDR, cfg());
    establish_via(&mut net, t0, 0, 0, 1);
    let c = net.clients[0].1;
    let t1 = clock.advance(idle * 3);
    live_until(&mut net.router, t0, t1, c);
    live_until(&mut net.router, t0, t1, e);
    net.router.handle_timeout(t1, c);
    net.router.handle_timeout(t1, e);
    assert!(net.router.is_live(c) && net.router.is_live(e));
    // The environment goes at t1: the client's last stream ends with it, and the client
    // link's reader is told to look at its timer again (its deadline moved).
    let _ = std::iter::from_fn(|| net.router.poll_event()).count();
    net.router.link_closed(e, CloseReason::Transport);
    let events: Vec<_> = std::iter::from_fn(|| net.router.poll_event()).collect();
    assert!(
        events.contains(&RouterEvent::Rearm { link: c }),
        "{events:?}"
    );
    assert!(net.router.poll_timeout(c).is_some_and(|t| t <= t1 + idle));
    live_until(&mut net.router, t1, t1 + idle - Duration::from_millis(1), c);
    assert!(net.router.is_live(c));
    net.router.handle_timeout(t1 + idle, c);
    assert!(!net.router.is_live(c));
}

/// Finding 6, at the relay: one address holds at most `max_streams_per_address_per_environment`
/// streams to one environment (the relay cannot see client keys; the exec server holds each
/// key to `max_streams_per_key`). At the edge: 3 of 3 over two links, the 4th `busy`; another
/// address, or another environment, is not concerned; a stream's end frees its slot.
#[test]
fn an_address_holds_at_most_its_share_of_an_environments_streams() {
    let now = Clock::new().now;
    let mut rcfg = relay_cfg();
    rcfg.max_streams_per_address_per_environment = 3;
    let mut net = Net::new(rcfg);
    net.add_env(now, "env1", cfg());
    net.add_env(now, "env2", cfg());
    let (e1, e2) = (net.envs[0].1, net.envs[1].1);
    let a = net.router.add_client_link(now, "env1", ADDR2, 1).unwrap();
    let b = net.router.add_client_link(now, "env1", ADDR2, 2).unwrap();
    for (n, l) in [(1, a), (2, b), (3, a), (4, b)] {
        open(&mut net.router, now, l, n);
    }
    assert_eq!(forwarded_opens(&mut net.router, now, e1), 3);
    assert_eq!(net.router.counters().resets(Reason::Busy), 1);
    let other_env = net.router.add_client_link(now, "env2", ADDR2, 3).unwrap();
    open(&mut net.router, now, other_env, 5);
    assert_eq!(forwarded_opens(&mut net.router, now, e2), 1);
    let other_addr = net.router.add_client_link(now, "env1", ADDR, 4).unwrap();
    open(&mut net.router, now, other_addr, 6);
    assert_eq!(forwarded_opens(&mut net.router, now, e1), 1);
    // One stream ends (accepted, then closed by the environment): one more fits.
    net.router
        .handle_frame(now, e1, raw(FrameType::Accept, id(1), 0, 0, 16, b"msg2"));
    answer(&mut net.router, now, e1, 1, "closed");
    open(&mut net.router, now, b, 7);
    assert_eq!(forwarded_opens(&mut net.router, now, e1), 1);
    open(&mut net.router, now, b, 8);
    assert_eq!(forwarded_opens(&mut net.router, now, e1), 0);
}

/// Finding 2: unread refusals escaped `max_queued_bytes` (about 78,000 refusals per link, and
/// 24 non-reading links of one address made a *different* environment refuse new streams).
/// Now every frame queued for a client link counts against its share and the total, at its
/// memory cost, and a link past its share is closed: an address that reads nothing holds at
/// most `links per address × share` of the total, however often it reconnects (the settings
/// refuse a share that lets one address fill a quarter of the total), and another
/// environment's clients open streams.
#[test]
fn an_address_that_reads_nothing_cannot_push_the_total_to_where_others_are_refused() {
    let now = Clock::new().now;
    let reset_cost = HEADER_BYTES + "environment_offline".len() + QUEUED_FRAME_OVERHEAD_BYTES;
    let mut rcfg = relay_cfg();
    rcfg.max_client_links_per_address = 4;
    rcfg.client_link_share_bytes = 20 * reset_cost;
    rcfg.max_queued_bytes = 4 * 4 * rcfg.client_link_share_bytes;
    rcfg.opens_per_second = 1_000_000;
    let mut net = Net::new(rcfg.clone());
    net.add_env(now, "healthy", cfg());
    let mut n = 0;
    for _round in 0..5 {
        // Four links (its maximum), each flooding OPENs to an offline id until closed.
        for _ in 0..4 {
            let l = net
                .router
                .add_client_link(now, "offline", ADDR2, 1)
                .unwrap();
            while net.router.is_live(l) {
                n += 1;
                open(&mut net.router, now, l, n);
                assert!(
                    net.router.queued_bytes() <= 4 * rcfg.client_link_share_bytes,
                    "{}",
                    net.router.queued_bytes()
                );
            }
        }
    }
    assert_eq!(
        net.router.counters().closes(CloseReason::ControlQueueFull),
        20
    );
    // Every one of those links is closed and its queue freed.
    assert_eq!(net.router.queued_bytes(), 0);
    net.add_client_from(now, "healthy", ADDR, cfg());
    establish_via(&mut net, now, 0, 0, 1);
    net.client(0)
        .send(&sid(1), Bytes::from_static(b"up"))
        .unwrap();
    net.pump(now);
    assert_eq!(
        data_of(&events(net.env(0))),
        vec![(sid(1), 1, b"up".to_vec())]
    );
}

/// The address table: an address that closes all its links keeps its spent bucket (it cannot
/// refill it by coming back), an address with nothing to remember is forgotten at the next
/// sweep, and the table never holds more than `MAX_TRACKED_ADDRESSES` entries, however many
/// addresses (IPv6 /64s) an attacker spreads over.
#[test]
fn the_address_table_remembers_spent_buckets_and_stays_bounded() {
    use execrelay_protocol::router::MAX_TRACKED_ADDRESSES;
    use std::net::{IpAddr, Ipv6Addr};
    let now = Clock::new().now;
    let mut rcfg = relay_cfg();
    rcfg.address_handshake_failures = BucketConfig {
        burst: 1,
        refill: Duration::from_secs(3600),
    };
    let mut router = Router::new(rcfg).unwrap();
    let mut clock = Clock::new();
    let e = router.add_environment_link(now, "env1", 1).unwrap();
    let prefix = |i: u64| IpAddr::V6(Ipv6Addr::from((u128::from(i) << 64) | 1));
    let attacker = MAX_TRACKED_ADDRESSES as u64 * 5 / 4 + 1;
    let mut now = now;
    for i in 0..attacker {
        now = clock.advance(Duration::from_micros(1));
        let l = router.add_client_link(now, "env1", prefix(i), i).unwrap();
        open(&mut router, now, l, i);
        assert_eq!(forwarded_opens(&mut router, now, e), 1, "at {i}");
        answer(&mut router, now, e, i, "handshake_failed");
        router.link_closed(l, CloseReason::Transport);
        assert!(
            router.tracked_addresses() <= MAX_TRACKED_ADDRESSES,
            "at {i}"
        );
    }
    assert_eq!(router.counters().handshake_failures, attacker);
    // The latest address comes back: its bucket is still spent, nothing is forwarded.
    let l = router
        .add_client_link(now, "env1", prefix(attacker - 1), 9)
        .unwrap();
    open(&mut router, now, l, attacker + 1);
    assert_eq!(forwarded_opens(&mut router, now, e), 0);
    // The least recently charged went first: the first address's bucket is forgotten.
    let first = router.add_client_link(now, "env1", prefix(0), 10).unwrap();
    open(&mut router, now, first, attacker + 2);
    assert_eq!(forwarded_opens(&mut router, now, e), 1);
    // Honest addresses with nothing spent leave nothing behind once their links close.
    let mut r2 = Router::new(relay_cfg()).unwrap();
    for i in 0..1000u64 {
        let l = r2.add_client_link(now, "env1", prefix(i), i).unwrap();
        r2.link_closed(l, CloseReason::Transport);
    }
    assert_eq!(r2.tracked_addresses(), 0);
}
