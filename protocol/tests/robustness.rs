//! Seeded random traffic from a hostile or confused peer into an endpoint and a router:
//! nothing panics (byte accounting never underflows), budgets end the link rather than the
//! process, and every queue drains back to zero bytes.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use execrelay_protocol::config::BucketConfig;
use execrelay_protocol::endpoint::{Endpoint, Event};
use execrelay_protocol::frame::{Frame, FrameType};
use execrelay_protocol::router::Router;
use execrelay_protocol::transmit::Transmit;

/// xorshift64*: deterministic, so a failure reproduces.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A peer's traffic: mostly plausible (in-order `seq` per stream and target, `ack` 0,
/// window 16), so streams get established and carry data, with a fair share of mistakes and
/// garbage.
struct Traffic {
    rng: Rng,
    seqs: std::collections::HashMap<(u64, u8), u64>,
}

impl Traffic {
    fn new(seed: u64) -> Self {
        Traffic {
            rng: Rng(seed),
            seqs: Default::default(),
        }
    }

    fn msg(&mut self, target: u64) -> Vec<u8> {
        let r = &mut self.rng;
        if r.below(20) == 0 {
            let n = r.below(80) as usize;
            return (0..n).map(|_| r.next() as u8).collect();
        }
        let ftype = match r.below(8) {
            0 => FrameType::Open,
            1 => FrameType::Accept,
            2..=5 => FrameType::Data,
            6 => FrameType::Ack,
            _ => FrameType::Reset,
        };
        let stream = 1 + r.below(5) as u8;
        let plausible = r.below(10) != 0;
        let counter = self.seqs.entry((target, stream)).or_insert(0);
        let seq = match ftype {
            FrameType::Data if plausible => {
                *counter += 1;
                *counter
            }
            FrameType::Data => r.below(20),
            FrameType::Open | FrameType::Reset => {
                *counter = 0;
                0
            }
            _ if plausible => 0,
            _ => r.below(3),
        };
        let mut f = Frame::new(
            ftype,
            sid(stream),
            seq,
            Bytes::from(vec![0xAB; r.below(300) as usize]),
        );
        f.ack = if plausible { 0 } else { r.below(20) };
        f.window = if plausible { 16 } else { r.below(20) as u32 };
        f.ack_bits = (r.below(50) == 0) as u32;
        f.encode().unwrap()
    }
}

fn generous(
    mut c: execrelay_protocol::config::EndpointConfig,
) -> execrelay_protocol::config::EndpointConfig {
    let big = BucketConfig {
        burst: 1_000_000,
        refill: Duration::from_secs(1),
    };
    c.malformed_frames = big;
    c.unknown_stream_frames = big;
    c.handshake_failures = big;
    c
}

fn drain_endpoint(ep: &mut Endpoint, now: std::time::Instant) {
    while ep.poll_transmit(now).is_some() {}
}

#[test]
fn random_frames_into_endpoints_never_panic_and_accounting_returns_to_zero() {
    let (mut delivered, mut sent) = (0u64, 0u64);
    for seed in 1..=40u64 {
        let mut r = Rng(seed * 0x9E37_79B9);
        let mut t = Traffic::new(seed);
        let mut clock = Clock::new();
        let mut eps = [
            server(clock.now, generous(cfg())),
            client(clock.now, generous(cfg())),
        ];
        for n in 1..=3 {
            let _ = eps[1].open(sid(n), Bytes::new());
        }
        for step in 0..3000 {
            let now = clock.advance(Duration::from_millis(r.below(50)));
            let i = r.below(2) as usize;
            let ep = &mut eps[i];
            ep.handle_frame(now, t.msg(i as u64));
            // The application does its part, at random.
            while let Some(e) = ep.poll_event() {
                match e {
                    Event::OpenRequested { stream, .. } => {
                        let _ = match r.below(3) {
                            0 => ep.accept(stream, Bytes::new()),
                            1 => ep.handshake_failed(
                                now,
                                stream,
                                execrelay_protocol::reason::Reason::HandshakeFailed,
                            ),
                            _ => Ok(()),
                        };
                    }
                    Event::Data { stream, seq, .. } => {
                        let _ = ep.consumed(&stream, seq);
                    }
                    _ => {}
                }
            }
            let s = sid(r.below(6) as u8);
            if ep.send_ready(&s).is_ok() {
                let _ = ep.send(&s, Bytes::from_static(b"out"));
            }
            if step % 7 == 0 {
                let _ = ep.finish(
                    sid(r.below(6) as u8),
                    execrelay_protocol::reason::Reason::Closed,
                );
            }
            if r.below(4) == 0 {
                drain_endpoint(ep, now);
            }
            ep.handle_timeout(now);
        }
        for ep in eps.iter_mut() {
            drain_endpoint(ep, clock.now);
            assert_eq!(ep.queued_data_bytes(), 0, "seed {seed}");
            delivered += ep.counters().data_bytes_in;
            sent += ep.counters().data_bytes_out;
        }
    }
    // Measured: about 148 kB delivered and 4.4 kB sent over the 40 seeds.
    assert!(
        delivered > 50_000 && sent > 1_000,
        "the traffic reached established streams: {delivered} {sent}"
    );
}

#[test]
fn random_frames_into_a_router_never_panic_and_queues_drain_to_zero() {
    let (mut forwarded, mut routed) = (0u64, 0u64);
    for seed in 1..=40u64 {
        let mut r = Rng(seed * 0x51_7CC1_B727);
        let mut t = Traffic::new(seed);
        let mut clock = Clock::new();
        let mut rcfg = relay_cfg();
        let big = BucketConfig {
            burst: 1_000_000,
            refill: Duration::from_secs(1),
        };
        rcfg.malformed_frames = big;
        rcfg.unknown_stream_frames = big;
        rcfg.opens_per_second = 1_000_000;
        let mut router = Router::new(rcfg).unwrap();
        let mut links = vec![
            router.add_environment_link(clock.now, "e", 1).unwrap(),
            router.add_client_link(clock.now, "e", ADDR, 2).unwrap(),
            router.add_client_link(clock.now, "e", ADDR, 3).unwrap(),
        ];
        for step in 0..3000 {
            let now = clock.advance(Duration::from_millis(r.below(50)));
            let l = links[r.below(links.len() as u64) as usize];
            router.handle_frame(now, l, t.msg(l));
            if r.below(4) == 0 {
                let l = links[r.below(links.len() as u64) as usize];
                while let Some(t) = router.poll_transmit(now, l) {
                    if let Transmit::Ping(p) = t {
                        router.handle_pong(l, &p);
                    }
                }
            }
            if step % 500 == 499 {
                // Links die and come back.
                let l = links.remove(r.below(links.len() as u64) as usize);
                router.link_closed(l, execrelay_protocol::reason::CloseReason::Transport);
                // An environment link only if the id is free (the live holder keeps it).
                let env = (r.below(2) == 0)
                    .then(|| router.add_environment_link(now, "e", step).ok())
                    .flatten();
                links.push(match env {
                    Some(l) => l,
                    None => router.add_client_link(now, "e", ADDR, step).unwrap(),
                });
            }
            router.handle_timeout(now, l);
            while router.poll_event().is_some() {}
        }
        for l in &links {
            while router.poll_transmit(clock.now, *l).is_some() {}
        }
        assert_eq!(router.queued_bytes(), 0, "seed {seed}");
        forwarded += router.counters().frames_out[FrameType::Data as usize];
        routed += router.counters().frames_out[FrameType::Accept as usize];
    }
    // Measured: about 160 DATA frames forwarded and 290 ACCEPTs routed over the 40 seeds.
    assert!(
        forwarded > 50 && routed > 50,
        "the traffic was routed: {forwarded} {routed}"
    );
}
