//! The stall watchdog's rule, sans-IO: from periodic observations of one process and the
//! connection it delivers to, whether its output has stopped for a reason that is the
//! server's own bug rather than the client's pace.
//!
//! Output may stop for good reasons: the client does not read (the transport holds the
//! writer: no window credit, a full socket), does not acknowledge (with acks, the log waits
//! for them), the session is detached, or other processes hold the output budget. It must
//! never stop while nothing outside the server holds it back. A process is **stalled** when,
//! for longer than the bound, none of its log's counters moved (appended, written, released,
//! acknowledged) and one of these held the whole time:
//!
//! 1. **Events wait and the transport would take them**: unwritten events, and the writer is
//!    not waiting for its transport, or it is while the transport says it has credit and room
//!    (a wake-up lost between the writer, the ready queue and the flow control); and the link
//!    the transport shares with other streams has nothing queued. A link with bytes queued is
//!    congestion, not a stall: its own writer is behind (the relay reads slowly, or the host
//!    runs the server's tasks late), and a writer whose wake-up was really lost is still
//!    found once the link has drained, since nothing else would wake it.
//! 2. **The child waits and the client owes nothing**: a pump waits for room, nothing is
//!    unwritten, and the client owes no acknowledgement; unless the pump waits for the
//!    server-wide budget and that budget really has no room (another process's client holds
//!    it). A pump there waits for a release no one will make.
//!
//! "None of its counters moved" includes the transport's own count of what it sent. And the
//! bound must pass under looks that came on time: a look that comes more than
//! [`LATE_LOOK_FACTOR`] intervals after the previous one means the server did not run its
//! own tasks meanwhile (the watchdog is one of them: an overloaded host, a blocked runtime
//! thread), so nothing is concluded across that gap and the suspicion starts again. A real
//! lost wake-up lasts forever and is reported after one bound of on-time looks.
//!
//! This module owns only the rule ([`StallWatch`]): it never reads a clock or a process (the
//! driver in `session/` observes and passes `now`), and it decides nothing but "stalled".

use std::time::{Duration, Instant};

use super::output_budget::Blocked;
use super::ready_set::WriterPhase;

/// One look at a process that delivers to a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observation {
    /// The log's counters: any change is progress (`next_seq`, `written_through`,
    /// `released_through`, `acked_through`).
    pub progress: [u64; 4],
    /// Events wait to be written.
    pub unwritten: bool,
    /// With acks: events were written and not yet acknowledged.
    pub owed_by_client: bool,
    /// A pump waits for room, and for what.
    pub pump_waiting: Option<Blocked>,
    /// A whole chunk would be admitted now (the pump's own check, made again).
    pub would_admit: bool,
    /// What the connection's writer is doing.
    pub writer: WriterPhase,
    /// Whether the transport would take a message now, where it can say (Noise streams).
    pub transport_can_send: Option<bool>,
    /// What the transport sent so far, where it can say: any change is progress.
    pub transport_sent: Option<u64>,
    /// Bytes queued on the link the transport shares with other streams, where it can say.
    pub link_queued_bytes: Option<u64>,
}

/// A look that comes later than this many look intervals after the previous one restarts
/// the suspicion (module docs).
pub const LATE_LOOK_FACTOR: u32 = 2;

/// Why a process is stalled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StallKind {
    /// Rule 1: events wait, the transport would take them, nothing is written.
    Delivery,
    /// Rule 2: the child is held back for room that nothing will make.
    Admission,
}

impl StallKind {
    /// For logs.
    pub fn as_str(self) -> &'static str {
        match self {
            StallKind::Delivery => "events wait and the transport has room, nothing is written",
            StallKind::Admission => "the child waits for room and the client owes nothing",
        }
    }
}

impl Observation {
    /// Which rule this look satisfies, if any (ignoring time).
    pub fn suspect(&self) -> Option<StallKind> {
        if self.unwritten {
            let transport_holds = match self.writer {
                WriterPhase::Outlet => self.transport_can_send != Some(true),
                // The connection is ending: the session detaches from it next.
                WriterPhase::Closed => true,
                WriterPhase::Busy | WriterPhase::Idle => false,
            };
            let link_congested = self.link_queued_bytes.is_some_and(|b| b > 0);
            return (!transport_holds && !link_congested).then_some(StallKind::Delivery);
        }
        let waits_for_nothing = match self.pump_waiting {
            None => false,
            Some(Blocked::Budget) => self.would_admit,
            Some(Blocked::Retention | Blocked::FairShare) => true,
        };
        (waits_for_nothing && !self.owed_by_client).then_some(StallKind::Admission)
    }
}

/// What one observation changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Flowing, or held back by the client (or not long enough to say).
    Fine,
    /// Stalled from now on: log it and count it (once).
    Stalled(StallKind),
    /// Still stalled (already reported).
    StillStalled,
    /// It was stalled and moves again.
    Recovered,
}

/// The watch over one process.
#[derive(Debug, Clone)]
pub struct StallWatch {
    bound: Duration,
    /// How often the driver looks.
    interval: Duration,
    progress: Option<([u64; 4], Option<u64>)>,
    /// When the previous look was made.
    last_look: Option<Instant>,
    /// Since when the current suspicion has held, with the progress unchanged.
    suspect_since: Option<Instant>,
    stalled: bool,
}

impl StallWatch {
    /// A watch that declares a stall after `bound` (not zero), looked at every quarter of it.
    pub fn new(bound: Duration) -> Self {
        Self::with_interval(bound, bound / 4)
    }

    /// A watch that declares a stall after `bound`, looked at every `interval`.
    pub fn with_interval(bound: Duration, interval: Duration) -> Self {
        StallWatch {
            bound,
            interval,
            progress: None,
            last_look: None,
            suspect_since: None,
            stalled: false,
        }
    }

    /// Whether the process is stalled now.
    pub fn is_stalled(&self) -> bool {
        self.stalled
    }

    /// Take one observation made at `now`.
    pub fn observe(&mut self, now: Instant, o: &Observation) -> Verdict {
        let counters = (o.progress, o.transport_sent);
        let moved = self.progress.is_some_and(|p| p != counters);
        self.progress = Some(counters);
        let late = self
            .last_look
            .is_some_and(|at| now.saturating_duration_since(at) > self.interval * LATE_LOOK_FACTOR);
        self.last_look = Some(now);
        if late && !self.stalled {
            // The server did not run its tasks meanwhile: start the bound again from here.
            self.suspect_since = None;
        }
        let suspect = o.suspect();
        if moved || suspect.is_none() {
            self.suspect_since = None;
            if self.stalled {
                self.stalled = false;
                return Verdict::Recovered;
            }
            return Verdict::Fine;
        }
        if self.stalled {
            return Verdict::StillStalled;
        }
        let since = *self.suspect_since.get_or_insert(now);
        match suspect {
            Some(kind) if now.saturating_duration_since(since) >= self.bound => {
                self.stalled = true;
                Verdict::Stalled(kind)
            }
            _ => Verdict::Fine,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUND: Duration = Duration::from_secs(10);

    fn obs() -> Observation {
        Observation {
            progress: [5, 4, 0, 0],
            unwritten: false,
            owed_by_client: false,
            pump_waiting: None,
            would_admit: true,
            writer: WriterPhase::Idle,
            transport_can_send: None,
            transport_sent: None,
            link_queued_bytes: None,
        }
    }

    /// The look at `secs`, after on-time looks (one a second) with the same observation from
    /// the previous look on; the verdicts of those looks must be `Fine` or `StillStalled`.
    fn after(w: &mut StallWatch, t0: Instant, secs: u64, o: &Observation) -> Verdict {
        let at = t0 + Duration::from_secs(secs);
        if let Some(mut t) = w.last_look {
            t += Duration::from_secs(1);
            while t < at {
                let v = w.observe(t, o);
                assert!(
                    matches!(v, Verdict::Fine | Verdict::StillStalled),
                    "{v:?} at {:?} before {secs} s",
                    t - t0
                );
                t += Duration::from_secs(1);
            }
        }
        w.observe(at, o)
    }

    /// The stall that was seen: a full log, everything written, no acks, its pump waiting.
    #[test]
    fn a_pump_waiting_for_room_nobody_owes_is_a_stall_after_the_bound() {
        let t0 = Instant::now();
        let mut w = StallWatch::new(BOUND);
        let o = Observation {
            pump_waiting: Some(Blocked::Retention),
            would_admit: false,
            ..obs()
        };
        assert_eq!(after(&mut w, t0, 0, &o), Verdict::Fine);
        assert_eq!(after(&mut w, t0, 9, &o), Verdict::Fine);
        assert_eq!(
            after(&mut w, t0, 10, &o),
            Verdict::Stalled(StallKind::Admission)
        );
        assert_eq!(
            after(&mut w, t0, 11, &o),
            Verdict::StillStalled,
            "reported once"
        );
        let moved = Observation {
            progress: [6, 4, 0, 0],
            ..o.clone()
        };
        assert_eq!(after(&mut w, t0, 12, &moved), Verdict::Recovered);
        assert!(!w.is_stalled());
    }

    /// Waiting on the client is never a stall: unacknowledged events, a transport without
    /// credit, a budget that other processes really hold.
    #[test]
    fn waiting_on_the_client_is_never_a_stall() {
        let t0 = Instant::now();
        let cases = [
            Observation {
                pump_waiting: Some(Blocked::Retention),
                owed_by_client: true,
                ..obs()
            },
            Observation {
                unwritten: true,
                pump_waiting: Some(Blocked::FairShare),
                writer: WriterPhase::Outlet,
                transport_can_send: Some(false),
                ..obs()
            },
            Observation {
                unwritten: true,
                writer: WriterPhase::Outlet,
                transport_can_send: None,
                ..obs()
            },
            Observation {
                unwritten: true,
                writer: WriterPhase::Closed,
                ..obs()
            },
            Observation {
                pump_waiting: Some(Blocked::Budget),
                would_admit: false,
                ..obs()
            },
            // Silence: nothing waits at all.
            obs(),
        ];
        for (i, o) in cases.iter().enumerate() {
            let mut w = StallWatch::new(BOUND);
            for s in 0..100 {
                assert_eq!(after(&mut w, t0, s, o), Verdict::Fine, "case {i} at {s} s");
            }
        }
    }

    /// A writer that is not waiting for its transport while events wait, or one that waits
    /// while the transport has credit and room: a lost wake-up.
    #[test]
    fn events_the_transport_would_take_and_nobody_writes_are_a_stall() {
        let t0 = Instant::now();
        for o in [
            Observation {
                unwritten: true,
                writer: WriterPhase::Idle,
                ..obs()
            },
            Observation {
                unwritten: true,
                writer: WriterPhase::Outlet,
                transport_can_send: Some(true),
                ..obs()
            },
        ] {
            let mut w = StallWatch::new(BOUND);
            assert_eq!(after(&mut w, t0, 0, &o), Verdict::Fine);
            assert_eq!(
                after(&mut w, t0, 10, &o),
                Verdict::Stalled(StallKind::Delivery)
            );
        }
    }

    /// The budget rule: a pump waiting for the budget while the budget would admit it lost
    /// its wake-up.
    #[test]
    fn a_pump_waiting_for_a_budget_that_has_room_is_a_stall() {
        let t0 = Instant::now();
        let mut w = StallWatch::new(BOUND);
        let o = Observation {
            pump_waiting: Some(Blocked::Budget),
            would_admit: true,
            ..obs()
        };
        after(&mut w, t0, 0, &o);
        assert_eq!(
            after(&mut w, t0, 10, &o),
            Verdict::Stalled(StallKind::Admission)
        );
    }

    /// Progress, or a suspicion that lapses, restarts the clock: only an unbroken bound counts.
    #[test]
    fn progress_or_a_lapse_restarts_the_clock() {
        let t0 = Instant::now();
        let mut w = StallWatch::new(BOUND);
        let stuck = Observation {
            unwritten: true,
            writer: WriterPhase::Idle,
            ..obs()
        };
        after(&mut w, t0, 0, &stuck);
        after(&mut w, t0, 8, &stuck);
        // The writer waits for its transport for a moment: not suspect.
        let held = Observation {
            writer: WriterPhase::Outlet,
            ..stuck.clone()
        };
        assert_eq!(after(&mut w, t0, 9, &held), Verdict::Fine);
        // Suspect again from 10 s (one look a second).
        assert_eq!(after(&mut w, t0, 19, &stuck), Verdict::Fine);
        assert_eq!(
            after(&mut w, t0, 20, &stuck),
            Verdict::Stalled(StallKind::Delivery)
        );
        let mut w = StallWatch::new(BOUND);
        after(&mut w, t0, 0, &stuck);
        let moved = Observation {
            progress: [5, 5, 0, 0],
            ..stuck.clone()
        };
        // Moved at 1 s, suspect again from the next look (2 s): the bound counts from there.
        assert_eq!(after(&mut w, t0, 1, &moved), Verdict::Fine);
        assert_eq!(after(&mut w, t0, 11, &moved), Verdict::Fine);
        assert_eq!(
            after(&mut w, t0, 12, &moved),
            Verdict::Stalled(StallKind::Delivery)
        );
        // What the transport sent is progress too.
        let mut w = StallWatch::new(BOUND);
        let sending = |n| Observation {
            transport_sent: Some(n),
            ..stuck.clone()
        };
        for s in 0..30 {
            assert_eq!(after(&mut w, t0, s, &sending(s)), Verdict::Fine, "at {s} s");
        }
        assert_eq!(after(&mut w, t0, 39, &sending(29)), Verdict::Fine);
        assert_eq!(
            after(&mut w, t0, 40, &sending(29)),
            Verdict::Stalled(StallKind::Delivery)
        );
    }

    /// The delivery rule, case by case, on a Noise stream: only a writer whose stream has
    /// credit, whose link has nothing queued and which sends nothing, with events waiting,
    /// is stalled.
    #[test]
    fn a_stream_with_credit_on_an_empty_link_that_sends_nothing_is_a_stall() {
        let t0 = Instant::now();
        let genuine = Observation {
            unwritten: true,
            writer: WriterPhase::Outlet,
            transport_can_send: Some(true),
            transport_sent: Some(7),
            link_queued_bytes: Some(0),
            ..obs()
        };
        let mut w = StallWatch::new(BOUND);
        assert_eq!(after(&mut w, t0, 0, &genuine), Verdict::Fine);
        assert_eq!(after(&mut w, t0, 9, &genuine), Verdict::Fine);
        assert_eq!(
            after(&mut w, t0, 10, &genuine),
            Verdict::Stalled(StallKind::Delivery)
        );
        for (why, o) in [
            // Congestion: the shared link has bytes queued (its own writer is behind).
            (
                "link queued",
                Observation {
                    link_queued_bytes: Some(1_678_879),
                    ..genuine.clone()
                },
            ),
            // The client does not read: no credit.
            (
                "no credit",
                Observation {
                    transport_can_send: Some(false),
                    ..genuine.clone()
                },
            ),
            // Nothing to write.
            (
                "no output pending",
                Observation {
                    unwritten: false,
                    ..genuine.clone()
                },
            ),
        ] {
            let mut w = StallWatch::new(BOUND);
            for s in 0..60 {
                assert_eq!(after(&mut w, t0, s, &o), Verdict::Fine, "{why} at {s} s");
            }
        }
        // Congestion that drains while the writer still writes nothing: a stall, one bound
        // after the link emptied.
        let mut w = StallWatch::new(BOUND);
        let congested = Observation {
            link_queued_bytes: Some(100_000),
            ..genuine.clone()
        };
        assert_eq!(after(&mut w, t0, 30, &congested), Verdict::Fine);
        assert_eq!(after(&mut w, t0, 40, &genuine), Verdict::Fine);
        assert_eq!(
            after(&mut w, t0, 41, &genuine),
            Verdict::Stalled(StallKind::Delivery)
        );
    }

    /// Looks that come late (the server did not run its tasks, the watchdog among them) are
    /// no evidence: the bound must pass under on-time looks.
    #[test]
    fn a_late_look_restarts_the_bound() {
        let t0 = Instant::now();
        let stuck = Observation {
            unwritten: true,
            writer: WriterPhase::Outlet,
            transport_can_send: Some(true),
            link_queued_bytes: Some(0),
            ..obs()
        };
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut w = StallWatch::new(BOUND);
        assert_eq!(w.observe(at(0), &stuck), Verdict::Fine);
        // Twelve seconds without a look: more than twice the 2.5 s interval.
        assert_eq!(w.observe(at(12), &stuck), Verdict::Fine, "late");
        // On time from there (every 2.5 s at most 5 s apart): a stall one bound later.
        for s in [14, 16, 18, 20] {
            assert_eq!(w.observe(at(s), &stuck), Verdict::Fine, "at {s} s");
        }
        assert_eq!(
            w.observe(at(22), &stuck),
            Verdict::Stalled(StallKind::Delivery)
        );
        // Exactly twice the interval apart is still on time.
        let mut w = StallWatch::new(BOUND);
        for s in [0, 5] {
            assert_eq!(w.observe(at(s), &stuck), Verdict::Fine);
        }
        assert_eq!(
            w.observe(at(10), &stuck),
            Verdict::Stalled(StallKind::Delivery)
        );
        // A reported stall stays reported across a late look, until something moves.
        assert_eq!(w.observe(at(40), &stuck), Verdict::StillStalled);
    }
}
