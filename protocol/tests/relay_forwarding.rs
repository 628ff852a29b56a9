//! A relay-to-relay link on a simulated clock, sans-IO: client → relay B (its forwarding link
//! stands for the environment) → relay A (which serves it as one more client link) →
//! environment. Data crosses both hops untouched, flow control holds across them, traffic is
//! counted as forwarded, a relay link is never reaped for idleness, and closing an
//! environment's client links takes the relay links with them.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use execrelay_protocol::endpoint::Endpoint;
use execrelay_protocol::frame::MAX_PAYLOAD_BYTES;
use execrelay_protocol::reason::{CloseReason, Reason};
use execrelay_protocol::router::{Forwarded, LinkId, Router, RouterEvent};
use execrelay_protocol::transmit::Transmit;

const ENV: &str = "env1";

struct Hop {
    a: Router,
    b: Router,
    env: Endpoint,
    client: Endpoint,
    a_env: LinkId,
    a_relay: LinkId,
    b_fwd: LinkId,
    b_client: LinkId,
    closed: Vec<(char, LinkId, CloseReason)>,
}

impl Hop {
    fn new(now: std::time::Instant) -> Hop {
        let mut a = Router::new(relay_cfg()).unwrap();
        let mut b = Router::new(relay_cfg()).unwrap();
        let a_env = a.add_environment_link(now, ENV, 1).unwrap();
        let a_relay = a.add_relay_client_link(now, ENV, 2);
        let b_fwd = b.add_forward_environment_link(now, ENV, 3).unwrap();
        let b_client = b.add_client_link(now, ENV, ADDR, 4).unwrap();
        Hop {
            a,
            b,
            env: server(now, cfg()),
            client: client(now, cfg()),
            a_env,
            a_relay,
            b_fwd,
            b_client,
            closed: Vec::new(),
        }
    }

    /// Move frames everywhere until quiet; pings answered.
    fn pump(&mut self, now: std::time::Instant) {
        loop {
            let mut moved = false;
            while let Some(t) = self.client.poll_transmit(now) {
                moved = true;
                match t {
                    Transmit::Frame(f) => {
                        self.b.handle_frame(now, self.b_client, f.encode().unwrap())
                    }
                    Transmit::Ping(p) => self.client.handle_pong(now, &p),
                }
            }
            while let Some(t) = self.env.poll_transmit(now) {
                moved = true;
                match t {
                    Transmit::Frame(f) => self.a.handle_frame(now, self.a_env, f.encode().unwrap()),
                    Transmit::Ping(p) => self.env.handle_pong(now, &p),
                }
            }
            while let Some(t) = self.b.poll_transmit(now, self.b_client) {
                moved = true;
                match t {
                    Transmit::Frame(f) => self.client.handle_frame(now, f.encode().unwrap()),
                    Transmit::Ping(p) => self.b.handle_pong(self.b_client, &p),
                }
            }
            while let Some(t) = self.b.poll_transmit(now, self.b_fwd) {
                moved = true;
                match t {
                    Transmit::Frame(f) => {
                        self.a.handle_frame(now, self.a_relay, f.encode().unwrap())
                    }
                    Transmit::Ping(p) => self.b.handle_pong(self.b_fwd, &p),
                }
            }
            while let Some(t) = self.a.poll_transmit(now, self.a_relay) {
                moved = true;
                match t {
                    Transmit::Frame(f) => self.b.handle_frame(now, self.b_fwd, f.encode().unwrap()),
                    Transmit::Ping(p) => self.a.handle_pong(self.a_relay, &p),
                }
            }
            while let Some(t) = self.a.poll_transmit(now, self.a_env) {
                moved = true;
                match t {
                    Transmit::Frame(f) => self.env.handle_frame(now, f.encode().unwrap()),
                    Transmit::Ping(p) => self.a.handle_pong(self.a_env, &p),
                }
            }
            for (name, r) in [('a', &mut self.a), ('b', &mut self.b)] {
                while let Some(e) = r.poll_event() {
                    if let RouterEvent::Close { link, reason } = e {
                        self.closed.push((name, link, reason));
                    }
                }
            }
            if !moved {
                return;
            }
        }
    }

    fn establish(&mut self, now: std::time::Instant, stream: u8) {
        self.client
            .open(sid(stream), Bytes::from_static(b"msg1"))
            .unwrap();
        self.pump(now);
        assert!(matches!(
            events(&mut self.env).as_slice(),
            [execrelay_protocol::endpoint::Event::OpenRequested { .. }]
        ));
        self.env
            .accept(sid(stream), Bytes::from_static(b"msg2"))
            .unwrap();
        self.pump(now);
        assert!(matches!(
            events(&mut self.client).as_slice(),
            [execrelay_protocol::endpoint::Event::Accepted { .. }]
        ));
    }
}

#[test]
fn a_stream_crosses_two_relays_untouched_and_is_counted_as_forwarded() {
    let clock = Clock::new();
    let now = clock.now;
    let mut hop = Hop::new(now);
    hop.establish(now, 1);
    hop.client
        .send(&sid(1), Bytes::from_static(b"ciphertext up"))
        .unwrap();
    hop.env
        .send(&sid(1), Bytes::from_static(b"ciphertext down"))
        .unwrap();
    hop.pump(now);
    assert_eq!(
        data_of(&events(&mut hop.env)),
        vec![(sid(1), 1, b"ciphertext up".to_vec())]
    );
    assert_eq!(
        data_of(&events(&mut hop.client)),
        vec![(sid(1), 1, b"ciphertext down".to_vec())]
    );
    let both = (b"ciphertext up".len() + b"ciphertext down".len()) as u64;
    // B opened one stream across its forwarding link; both relays count the bytes on the hop.
    assert_eq!(
        hop.b.forwarded(),
        Forwarded {
            streams: 1,
            bytes: both
        }
    );
    assert_eq!(hop.a.forwarded().bytes, both);
    assert_eq!((hop.a.route_count(), hop.b.route_count()), (1, 1));
}

#[test]
fn a_slow_client_holds_back_the_environment_across_both_hops_without_loss() {
    let clock = Clock::new();
    let now = clock.now;
    let mut hop = Hop::new(now);
    hop.establish(now, 1);
    let record = |n: u64| Bytes::from(vec![(n % 251) as u8; MAX_PAYLOAD_BYTES - 16]);
    const TOTAL: u64 = 48;
    let (mut sent, mut consumed) = (0u64, 0u64);
    let mut got: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut rounds = 0;
    while consumed < TOTAL {
        rounds += 1;
        assert!(rounds < 100, "stalled: sent {sent}, consumed {consumed}");
        while sent < TOTAL && hop.env.send_ready(&sid(1)).is_ok() {
            sent += 1;
            hop.env.send(&sid(1), record(sent)).unwrap();
        }
        assert!(sent - consumed <= 16, "never past the client's window");
        hop.pump(now);
        got.extend(
            data_of(&events(&mut hop.client))
                .into_iter()
                .map(|(_, s, p)| (s, p)),
        );
        consumed = (consumed + 8).min(got.len() as u64);
        hop.client.consumed(&sid(1), consumed).unwrap();
        hop.pump(now);
    }
    for r in [&hop.a, &hop.b] {
        assert_eq!(r.counters().resets(Reason::WindowExceeded), 0);
    }
    assert_eq!(got.len() as u64, TOTAL);
    for (i, (seq, p)) in got.iter().enumerate() {
        assert_eq!(*seq, i as u64 + 1, "in order, nothing repeated");
        assert_eq!(p, &record(*seq).to_vec(), "exact bytes");
    }
}

#[test]
fn a_relay_link_is_never_reaped_for_idleness_but_a_client_link_is() {
    let mut clock = Clock::new();
    let mut hop = Hop::new(clock.now);
    let idle = hop.a.config().idle_link_timeout;
    let plain = hop.a.add_client_link(clock.now, ENV, ADDR, 9).unwrap();
    for _ in 0..3 {
        let now = clock.advance(idle + Duration::from_secs(1));
        for l in [hop.a_relay, plain] {
            if hop.a.is_live(l) {
                hop.a.handle_timeout(now, l);
            }
        }
        hop.pump(now);
    }
    assert!(hop.a.is_live(hop.a_relay), "the relay link stays");
    assert!(!hop.a.is_live(plain), "the idle client link goes");
    assert!(hop.closed.contains(&('a', plain, CloseReason::Idle)));
}

#[test]
fn an_environment_that_goes_takes_its_client_and_relay_links_along() {
    let clock = Clock::new();
    let now = clock.now;
    let mut hop = Hop::new(now);
    hop.establish(now, 1);
    // A: the environment moves; its client links, the relay link included, are closed.
    assert!(hop.a.close_environment(ENV, CloseReason::Moved));
    assert_eq!(hop.a.close_clients(ENV, CloseReason::Moved), 1);
    hop.pump(now);
    assert!(hop.closed.contains(&('a', hop.a_env, CloseReason::Moved)));
    assert!(hop.closed.contains(&('a', hop.a_relay, CloseReason::Moved)));
    // B: its forwarding link ends (the driver reports it), and B's clients are closed.
    hop.b.link_closed(hop.b_fwd, CloseReason::Transport);
    assert_eq!(hop.b.client_link_count(ENV), 1);
    assert_eq!(hop.b.close_clients(ENV, CloseReason::Moved), 1);
    hop.pump(now);
    assert!(hop
        .closed
        .contains(&('b', hop.b_client, CloseReason::Moved)));
    assert_eq!(hop.b.client_link_count(ENV), 0);
    assert!(
        !hop.a.close_environment(ENV, CloseReason::Moved),
        "nothing left to close"
    );
}
