//! Shared harness of the sans-IO tests: a simulated clock, endpoints and a router wired back
//! to back in memory, and hand-written frames.
#![allow(dead_code)]

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use bytes::Bytes;
use execrelay_protocol::config::{EndpointConfig, KeepaliveConfig, RelayConfig};
use execrelay_protocol::endpoint::{Endpoint, Event, ResetCause, Side};
use execrelay_protocol::frame::{Frame, FrameType, StreamId};
use execrelay_protocol::router::{LinkId, Router, RouterEvent};
use execrelay_protocol::transmit::Transmit;

/// A clock the test moves by hand.
pub struct Clock {
    pub now: Instant,
}

impl Clock {
    pub fn new() -> Self {
        Clock {
            now: Instant::now(),
        }
    }
    pub fn advance(&mut self, d: Duration) -> Instant {
        self.now += d;
        self.now
    }
}

/// Keepalive without jitter, so deadlines are exact.
pub fn exact_keepalive() -> KeepaliveConfig {
    KeepaliveConfig {
        jitter: Duration::ZERO,
        ..KeepaliveConfig::default()
    }
}

pub fn cfg() -> EndpointConfig {
    EndpointConfig {
        keepalive: exact_keepalive(),
        ..EndpointConfig::default()
    }
}

pub fn relay_cfg() -> RelayConfig {
    RelayConfig {
        keepalive: exact_keepalive(),
        ..RelayConfig::default()
    }
}

pub fn sid(n: u8) -> StreamId {
    [n; 16]
}

pub fn client(now: Instant, cfg: EndpointConfig) -> Endpoint {
    Endpoint::new(Side::Client, cfg, now, 1).unwrap()
}

pub fn server(now: Instant, cfg: EndpointConfig) -> Endpoint {
    Endpoint::new(Side::Server, cfg, now, 2).unwrap()
}

/// What moved over a wire during a pump.
#[derive(Debug, Default)]
pub struct Wire {
    /// Frames a → b and b → a, in order.
    pub ab: Vec<Frame>,
    pub ba: Vec<Frame>,
    pub pings_ab: usize,
    pub pings_ba: usize,
}

/// Move everything each endpoint wants to write to the other until both are quiet. Pings are
/// answered (pong echoing the payload) by a side whose `answers` flag is set.
pub fn pump_with(
    a: &mut Endpoint,
    b: &mut Endpoint,
    now: Instant,
    a_answers: bool,
    b_answers: bool,
) -> Wire {
    let mut w = Wire::default();
    loop {
        let mut moved = false;
        while let Some(t) = a.poll_transmit(now) {
            moved = true;
            match t {
                Transmit::Frame(f) => {
                    w.ab.push(f.clone());
                    b.handle_frame(now, f.encode().unwrap());
                }
                Transmit::Ping(p) => {
                    w.pings_ab += 1;
                    if b_answers {
                        a.handle_pong(now, &p);
                    }
                }
            }
        }
        while let Some(t) = b.poll_transmit(now) {
            moved = true;
            match t {
                Transmit::Frame(f) => {
                    w.ba.push(f.clone());
                    a.handle_frame(now, f.encode().unwrap());
                }
                Transmit::Ping(p) => {
                    w.pings_ba += 1;
                    if a_answers {
                        b.handle_pong(now, &p);
                    }
                }
            }
        }
        if !moved {
            return w;
        }
    }
}

pub fn pump(a: &mut Endpoint, b: &mut Endpoint, now: Instant) -> Wire {
    pump_with(a, b, now, true, true)
}

pub fn events(ep: &mut Endpoint) -> Vec<Event> {
    std::iter::from_fn(|| ep.poll_event()).collect()
}

/// Open `stream` from `c` and accept it on `s`; both sides drained of events.
pub fn establish(c: &mut Endpoint, s: &mut Endpoint, now: Instant, stream: StreamId) {
    c.open(stream, Bytes::from_static(b"msg1")).unwrap();
    pump(c, s, now);
    let ev = events(s);
    assert_eq!(
        ev,
        vec![Event::OpenRequested {
            stream,
            flags: 0,
            payload: Bytes::from_static(b"msg1")
        }]
    );
    s.accept(stream, Bytes::from_static(b"msg2")).unwrap();
    pump(c, s, now);
    assert_eq!(
        events(c),
        vec![Event::Accepted {
            stream,
            payload: Bytes::from_static(b"msg2")
        }]
    );
}

/// The `Data` events of a list, as (stream, seq, payload).
pub fn data_of(ev: &[Event]) -> Vec<(StreamId, u64, Vec<u8>)> {
    ev.iter()
        .filter_map(|e| match e {
            Event::Data {
                stream,
                seq,
                payload,
            } => Some((*stream, *seq, payload.to_vec())),
            _ => None,
        })
        .collect()
}

/// A hand-written frame, encoded.
pub fn raw(
    ftype: FrameType,
    stream: StreamId,
    seq: u64,
    ack: u64,
    window: u32,
    payload: &[u8],
) -> Vec<u8> {
    let mut f = Frame::new(ftype, stream, seq, Bytes::copy_from_slice(payload));
    f.ack = ack;
    f.window = window;
    f.encode().unwrap()
}

// ---- relay wiring ---------------------------------------------------------------------------

pub const ADDR: IpAddr = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
/// Another address (the hostile one, in the budget tests).
pub const ADDR2: IpAddr = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 2));

/// A relay with endpoints attached to its links.
pub struct Net {
    pub router: Router,
    /// (endpoint, relay link) of each client.
    pub clients: Vec<(Endpoint, LinkId)>,
    /// (endpoint, relay link) of each environment link (the newest last).
    pub envs: Vec<(Endpoint, LinkId)>,
    pub closed: Vec<(LinkId, execrelay_protocol::reason::CloseReason)>,
}

impl Net {
    pub fn new(rcfg: RelayConfig) -> Self {
        Net {
            router: Router::new(rcfg).unwrap(),
            clients: Vec::new(),
            envs: Vec::new(),
            closed: Vec::new(),
        }
    }

    pub fn add_env(&mut self, now: Instant, env: &str, cfg: EndpointConfig) -> usize {
        let link = self.router.add_environment_link(now, env, 3).unwrap();
        self.envs.push((server(now, cfg), link));
        self.envs.len() - 1
    }

    pub fn add_client(&mut self, now: Instant, env: &str, cfg: EndpointConfig) -> usize {
        self.add_client_from(now, env, ADDR, cfg)
    }

    /// A client link from `addr`.
    pub fn add_client_from(
        &mut self,
        now: Instant,
        env: &str,
        addr: IpAddr,
        cfg: EndpointConfig,
    ) -> usize {
        let link = self.router.add_client_link(now, env, addr, 4).unwrap();
        self.clients.push((client(now, cfg), link));
        self.clients.len() - 1
    }

    /// Move frames until everything is quiet. Pings are answered.
    pub fn pump(&mut self, now: Instant) {
        loop {
            let mut moved = false;
            for (ep, link) in self.clients.iter_mut().chain(self.envs.iter_mut()) {
                if !self.router.is_live(*link) {
                    continue;
                }
                while let Some(t) = ep.poll_transmit(now) {
                    moved = true;
                    match t {
                        Transmit::Frame(f) => {
                            self.router.handle_frame(now, *link, f.encode().unwrap())
                        }
                        Transmit::Ping(p) => ep.handle_pong(now, &p),
                    }
                }
                while let Some(t) = self.router.poll_transmit(now, *link) {
                    moved = true;
                    match t {
                        Transmit::Frame(f) => ep.handle_frame(now, f.encode().unwrap()),
                        Transmit::Ping(p) => self.router.handle_pong(*link, &p),
                    }
                }
            }
            while let Some(e) = self.router.poll_event() {
                if let RouterEvent::Close { link, reason } = e {
                    self.closed.push((link, reason));
                }
            }
            if !moved {
                return;
            }
        }
    }

    pub fn client(&mut self, i: usize) -> &mut Endpoint {
        &mut self.clients[i].0
    }

    pub fn env(&mut self, i: usize) -> &mut Endpoint {
        &mut self.envs[i].0
    }
}

pub fn peer_reset(stream: u8, why: &str) -> Event {
    Event::Reset {
        stream: sid(stream),
        cause: ResetCause::Peer(why.into()),
    }
}

/// Open `stream` from client `c` and accept it on environment link `e`.
pub fn establish_via(net: &mut Net, now: Instant, c: usize, e: usize, stream: u8) {
    net.client(c)
        .open(sid(stream), Bytes::from_static(b"msg1"))
        .unwrap();
    net.pump(now);
    assert_eq!(
        events(net.env(e)),
        vec![Event::OpenRequested {
            stream: sid(stream),
            flags: 0,
            payload: Bytes::from_static(b"msg1")
        }]
    );
    net.env(e)
        .accept(sid(stream), Bytes::from_static(b"msg2"))
        .unwrap();
    net.pump(now);
    assert_eq!(
        events(net.client(c)),
        vec![Event::Accepted {
            stream: sid(stream),
            payload: Bytes::from_static(b"msg2")
        }]
    );
}

/// Hand everything `ep` wants to write to the router on `link` (not the other way).
pub fn push_up(router: &mut Router, ep: &mut Endpoint, link: LinkId, now: Instant) {
    while let Some(t) = ep.poll_transmit(now) {
        if let Transmit::Frame(f) = t {
            router.handle_frame(now, link, f.encode().unwrap());
        }
    }
}

/// The frames the router has for `link`, drained.
pub fn drain(
    router: &mut Router,
    link: LinkId,
    now: Instant,
) -> Vec<execrelay_protocol::frame::Frame> {
    std::iter::from_fn(|| router.poll_transmit(now, link))
        .filter_map(|t| match t {
            Transmit::Frame(f) => Some(f),
            Transmit::Ping(_) => None,
        })
        .collect()
}
