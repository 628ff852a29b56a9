//! The actions the table queues, on a simulated clock: it decides, the driver does. A
//! session's end signals its scope once and is then forgotten; a start over a quota spawns
//! nothing; a spawn's result fills or frees its slot; deliveries go to the holder only.

use std::time::Instant;

use super::*;

#[test]
fn an_expiring_session_signals_its_scope_exactly_once_then_is_forgotten() {
    let t0 = Instant::now();
    let mut t = table_with(&["a", "b"]);
    t.reserve("a", "p", Slot::Ready(1)).unwrap();
    t.reserve("a", "q", Slot::Ready(2)).unwrap();
    t.reserve("a", "s", Slot::Starting).unwrap();
    t.detach(t0, "a", 1);
    drain(&mut t);
    t.handle_timeout(t0 + TTL);
    let actions = drain(&mut t);
    let signals: Vec<_> = actions
        .iter()
        .filter_map(|a| match a {
            Action::SignalScope {
                session,
                processes,
                cause,
            } => Some((*session, processes.clone(), *cause)),
            _ => None,
        })
        .collect();
    assert_eq!(signals.len(), 1, "one signal of the scope: {actions:?}");
    let (session, mut processes, cause) = signals[0].clone();
    processes.sort();
    assert_eq!(
        (session, processes, cause),
        ("a", vec![1, 2], EndCause::Expired)
    );
    assert_eq!(cause.exit_reason(), ExitReason::SessionExpired);
    match &actions[..] {
        [Action::SignalScope { .. }, Action::Forget {
            session: "a",
            ended,
        }] => {
            assert!(ended.contains("p") && ended.contains("q"));
            assert!(!ended.contains("s"), "never spawned");
        }
        other => panic!("signal, then forget: {other:?}"),
    }
    assert!(t.session("a").is_none(), "forgotten");
    assert_eq!(t.session("b"), Some("b"), "another session untouched");
    assert!(matches!(
        t.resume("a", &[0], None, holder(5, true)),
        Err(SessionError::UnknownSession)
    ));
    t.handle_timeout(t0 + TTL * 10);
    assert!(t.poll_action().is_none(), "nothing more, ever");
    assert!(!t.close("a"));
    assert!(t.poll_action().is_none());
}

#[test]
fn a_start_spawns_once_and_a_start_over_quota_spawns_nothing() {
    let mut t = table_with(&["a"]);
    let serial = t.start("a", "p", "spec-p", vec![1]).unwrap();
    match &drain(&mut t)[..] {
        [Action::Spawn {
            session: "a",
            process,
            serial: s,
            spec: "spec-p",
        }] => assert_eq!((process.as_str(), *s), ("p", serial)),
        other => panic!("one spawn: {other:?}"),
    }
    assert!(matches!(t.slot("a", "p"), Some((Slot::Starting, s)) if s == serial));
    assert!(matches!(
        t.start("a", "p", "again", vec![1]),
        Err(SessionError::ProcessExists(_))
    ));
    t.start("a", "q", "spec-q", vec![1]).unwrap();
    t.start("a", "r", "spec-r", vec![1]).unwrap();
    drain(&mut t);
    assert!(matches!(
        t.start("a", "over", "spec", vec![1]),
        Err(SessionError::TooManyProcesses(3))
    ));
    assert!(matches!(
        t.start("gone", "p", "spec", vec![1]),
        Err(SessionError::UnknownSession)
    ));
    assert!(t.poll_action().is_none(), "nothing spawned");
    assert_eq!(t.slot_count("a"), 3);

    // The owner's quota, across sessions.
    let mut t = SessionTable::<Test>::new(limits());
    for id in ["k1", "k2"] {
        t.create(id, id, vec![], keyed(9), holder(1, true), TTL)
            .unwrap();
    }
    for p in ["p1", "p2", "p3"] {
        t.start("k1", p, "spec", vec![1]).unwrap();
    }
    t.start("k2", "p4", "spec", vec![1]).unwrap();
    drain(&mut t);
    assert!(matches!(
        t.start("k2", "p5", "spec", vec![1]),
        Err(SessionError::QuotaReached {
            limit: "maxProcessesPerKey",
            value: 4
        })
    ));
    assert!(t.poll_action().is_none(), "over the quota: no spawn");
}

#[test]
fn a_spawn_result_fed_back_fills_or_frees_its_slot() {
    let mut t = table_with(&["a"]);
    let ok = t.start("a", "ok", "spec", vec![1]).unwrap();
    let bad = t.start("a", "bad", "spec", vec![1]).unwrap();
    drain(&mut t);
    assert!(t.handle_spawned("a", "ok", ok, Some(7)));
    assert!(matches!(t.slot("a", "ok"), Some((Slot::Ready(7), _))));
    assert_eq!(t.processes("a"), vec![7]);
    assert!(
        t.poll_action().is_none(),
        "the starter holds the session: it opens delivery itself"
    );
    assert!(t.handle_spawned("a", "bad", bad, None));
    assert!(t.slot("a", "bad").is_none(), "a failed spawn frees its id");
    assert_eq!(t.slot_count("a"), 1);
    assert!(!t.is_ended("a", "bad"), "it never ran");
    assert!(t.poll_action().is_none());
    t.start("a", "bad", "spec", vec![1]).unwrap();

    // Closed while it spawned: the child is let go of, the start fails.
    let late = t.start("a", "late", "spec", vec![1]).unwrap();
    assert!(t.close("a"));
    drain(&mut t);
    assert!(!t.handle_spawned("a", "late", late, Some(8)));
    assert!(matches!(drain(&mut t)[..], [Action::Abandon(8)]));
    assert!(!t.handle_spawned("a", "late", late, None));
    assert!(t.poll_action().is_none());
}

#[test]
fn deliveries_go_to_the_attached_connection_only_and_nowhere_while_detached() {
    let t0 = Instant::now();
    let mut t = table_with(&["a"]);
    // Started on connection 1, which then lost the session to 2 before the spawn ended: 2
    // gets the events at once (1's start result will never reach 2's stream).
    let s = t.start("a", "p", "spec", vec![1]).unwrap();
    t.attach("a", holder(2, true));
    drain(&mut t);
    assert!(t.handle_spawned("a", "p", s, Some(5)));
    assert!(matches!(
        drain(&mut t)[..],
        [Action::Deliver {
            process: 5,
            to: Some(2),
            replay: false
        }]
    ));
    // A connection that does not hold the session opens nothing.
    t.enable_delivery("a", 1, 5);
    assert!(t.poll_action().is_none());
    t.enable_delivery("a", 2, 5);
    assert!(matches!(
        drain(&mut t)[..],
        [Action::Deliver {
            process: 5,
            to: Some(2),
            replay: false
        }]
    ));
    // Detached: nowhere, and nothing opens delivery until a resume.
    assert!(!t.detach(t0, "a", 1), "1 does not hold it");
    assert!(t.detach(t0, "a", 2));
    assert!(matches!(
        effects(&mut t)[..],
        [Action::Deliver {
            process: 5,
            to: None,
            ..
        }]
    ));
    t.enable_delivery("a", 2, 5);
    let s = t.start("a", "q", "spec", vec![2]).unwrap();
    drain(&mut t);
    assert!(t.handle_spawned("a", "q", s, Some(6)));
    assert!(t.poll_action().is_none(), "detached: delivered to nobody");
    // The resume replays both, to the new holder only.
    t.resume("a", &[0], None, holder(3, true)).unwrap();
    let mut to: Vec<(u32, Option<u64>, bool)> = drain(&mut t)
        .into_iter()
        .map(|a| match a {
            Action::Deliver {
                process,
                to,
                replay,
            } => (process, to, replay),
            other => panic!("only deliveries: {other:?}"),
        })
        .collect();
    to.sort();
    assert_eq!(to, [(5, Some(3), true), (6, Some(3), true)]);
}

#[test]
fn an_approved_start_spawns_once_for_all_its_starters_and_a_refused_one_never() {
    let mut t = table_with(&["a"]);
    let s = t.reserve("a", "p", Slot::Pending(())).unwrap();
    assert!(t.poll_action().is_none(), "waiting: nothing spawned");
    // Approved on connection 1 for starts of 1 and 2; 2 holds the session by then.
    t.attach("a", holder(2, true));
    drain(&mut t);
    assert!(t.approved("a", "p", s, "spec", vec![2, 1]));
    assert!(matches!(
        drain(&mut t)[..],
        [Action::Spawn { serial, .. }] if serial == s
    ));
    assert!(!t.approved("a", "p", s, "spec", vec![1]), "once");
    assert!(t.poll_action().is_none());
    assert!(t.handle_spawned("a", "p", s, Some(4)));
    assert!(
        t.poll_action().is_none(),
        "the holder is a starter: it opens delivery after its result"
    );
    // Refused: freed, never spawned; approved after a close: nothing.
    let r = t.reserve("a", "r", Slot::Pending(())).unwrap();
    assert!(t.free("a", "r", r).is_some());
    let c = t.reserve("a", "c", Slot::Pending(())).unwrap();
    t.close("a");
    drain(&mut t);
    assert!(!t.approved("a", "c", c, "spec", vec![1]));
    assert!(t.poll_action().is_none());
}

#[test]
fn the_timer_is_woken_only_for_an_earlier_deadline() {
    let t0 = Instant::now();
    let mut t = table_with(&["a", "b"]);
    t.detach(t0, "a", 1);
    assert!(matches!(drain(&mut t)[..], [Action::Arm(at)] if at == t0 + TTL));
    t.detach(t0 + ms(10), "b", 2);
    assert!(
        t.poll_action().is_none(),
        "later than the first: no wake-up"
    );
    let s = t.reserve("b", "p", Slot::Ready(1)).unwrap();
    t.exit_delivered(t0, "b", "p", s, false, vec![]);
    assert!(
        matches!(drain(&mut t)[..], [Action::Arm(at)] if at == t0 + RETENTION),
        "the retention ends first"
    );
    assert_eq!(t.poll_timeout(), Some(t0 + RETENTION));
}
