//! The session table on a simulated clock: every deadline is a value the test chooses. The
//! actions it queues (spawn, signal a scope, deliver, …) are in `tests/actions.rs`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::*;
use crate::session::quota::AddressKey;

mod actions;

/// Plain values for the driver's handles: a session by name, a process by number.
struct Test;

impl Handles for Test {
    type Session = &'static str;
    type Process = u32;
    type Pending = ();
    type Conn = u64;
    type Spec = &'static str;
}

const TTL: Duration = Duration::from_millis(500);
const RETENTION: Duration = Duration::from_millis(200);
const APPROVAL: Duration = Duration::from_millis(1_000);

fn limits() -> Limits {
    Limits {
        max_sessions: 4,
        max_processes: 3,
        max_sessions_per_key: 2,
        max_sessions_per_address: 3,
        max_processes_per_key: 4,
        max_processes_per_address: 5,
        exited_retention: RETENTION,
        approval_timeout: APPROVAL,
    }
}

fn holder(conn_id: u64, can_answer: bool) -> Holder<u64> {
    Holder {
        conn_id,
        conn: conn_id,
        can_answer,
    }
}

fn anonymous() -> Owner {
    Owner::default()
}

fn keyed(k: u8) -> Owner {
    Owner {
        key: Some(vec![k]),
        address: None,
    }
}

fn table_with(names: &[&'static str]) -> SessionTable<Test> {
    let mut t = SessionTable::new(limits());
    for (i, &n) in names.iter().enumerate() {
        t.create(
            n,
            n,
            vec![i as u8],
            anonymous(),
            holder(i as u64 + 1, true),
            TTL,
        )
        .unwrap();
    }
    t
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Every action queued, in order.
fn drain(t: &mut SessionTable<Test>) -> Vec<Action<Test>> {
    std::iter::from_fn(|| t.poll_action()).collect()
}

/// The queued actions, the wake-ups of the timer left out.
fn effects(t: &mut SessionTable<Test>) -> Vec<Action<Test>> {
    drain(t)
        .into_iter()
        .filter(|a| !matches!(a, Action::Arm(_)))
        .collect()
}

#[test]
fn a_detached_session_expires_at_its_ttl_and_not_before() {
    let t0 = Instant::now();
    let mut t = table_with(&["a"]);
    assert_eq!(t.poll_timeout(), None, "attached: no deadline");
    assert!(!t.detach(t0, "a", 99), "not the holder: nothing");
    assert!(t.poll_action().is_none());
    assert!(t.detach(t0, "a", 1));
    assert!(matches!(drain(&mut t)[..], [Action::Arm(at)] if at == t0 + TTL));
    assert_eq!(t.poll_timeout(), Some(t0 + TTL));
    t.handle_timeout(t0 + TTL - ms(1));
    assert!(t.poll_action().is_none());
    assert_eq!(t.session("a"), Some("a"));
    t.handle_timeout(t0 + TTL);
    match &drain(&mut t)[..] {
        [Action::SignalScope {
            session: "a",
            cause: EndCause::Expired,
            ..
        }, Action::Forget { session: "a", .. }] => {}
        other => panic!("expected the session to expire: {other:?}"),
    }
    assert_eq!(t.session("a"), None, "gone at once");
    assert_eq!(t.poll_timeout(), None);
}

#[test]
fn a_stale_expiry_never_closes_a_resumed_session() {
    let t0 = Instant::now();
    let mut t = table_with(&["a"]);
    t.detach(t0, "a", 1); // due at 500
    t.resume("a", &[0], None, holder(2, true)).unwrap(); // t=300
    t.detach(t0 + ms(400), "a", 2); // due at 900
    drain(&mut t);
    t.handle_timeout(t0 + ms(600));
    assert!(t.poll_action().is_none(), "the first deadline was disarmed");
    t.handle_timeout(t0 + ms(900));
    assert!(matches!(
        t.poll_action(),
        Some(Action::SignalScope {
            cause: EndCause::Expired,
            ..
        })
    ));
}

#[test]
fn a_session_ttl_set_later_counts_from_the_next_detach() {
    let t0 = Instant::now();
    let mut t = table_with(&["a"]);
    t.set_ttl("a", Duration::from_secs(3600));
    t.detach(t0, "a", 1);
    assert_eq!(t.poll_timeout(), Some(t0 + Duration::from_secs(3600)));
}

#[test]
fn resume_evicts_the_previous_holder_and_checks_token_and_key() {
    let mut t = SessionTable::<Test>::new(limits());
    t.create("a", "a", vec![7; 4], keyed(1), holder(1, true), TTL)
        .unwrap();
    for (token, key) in [
        (&[7u8; 3][..], Some(&[1u8][..])),
        (&[8; 4][..], Some(&[1][..])),
        (&[7; 4][..], Some(&[2][..])),
        (&[7; 4][..], None),
    ] {
        assert!(matches!(
            t.resume("a", token, key, holder(2, true)),
            Err(SessionError::UnknownSession)
        ));
    }
    assert!(matches!(
        t.resume("b", &[7; 4], Some(&[1]), holder(2, true)),
        Err(SessionError::UnknownSession)
    ));
    assert_eq!(t.holder("a").map(|h| h.conn_id), Some(1), "unchanged");
    assert!(t.poll_action().is_none(), "a failed resume does nothing");
    let s = t.resume("a", &[7; 4], Some(&[1]), holder(2, true)).unwrap();
    assert_eq!(s, "a");
    assert!(matches!(drain(&mut t)[..], [Action::Evict(1)]));
    t.resume("a", &[7; 4], Some(&[1]), holder(2, true)).unwrap();
    assert!(
        t.poll_action().is_none(),
        "the same connection evicts nobody"
    );
}

#[test]
fn sessions_are_bounded_by_max_sessions_and_the_owners_quota() {
    let mut t = SessionTable::<Test>::new(limits());
    let create = |t: &mut SessionTable<Test>, id: &'static str, o: Owner| {
        t.create(id, id, vec![], o, holder(1, true), TTL)
    };
    create(&mut t, "k1", keyed(1)).unwrap();
    create(&mut t, "k2", keyed(1)).unwrap();
    assert!(matches!(
        create(&mut t, "k3", keyed(1)),
        Err(SessionError::QuotaReached {
            limit: "maxSessionsPerKey",
            value: 2
        })
    ));
    create(&mut t, "o1", keyed(2)).unwrap();
    create(&mut t, "o2", anonymous()).unwrap();
    assert!(matches!(
        create(&mut t, "o3", anonymous()),
        Err(SessionError::TooManySessions(4))
    ));
    assert!(t.close("o2"));
    create(&mut t, "o3", anonymous()).unwrap();
}

#[test]
fn process_slots_are_bounded_per_session_and_per_owner_across_sessions() {
    let mut t = SessionTable::<Test>::new(limits());
    let addr = Owner {
        key: None,
        address: Some(AddressKey::V4([10, 0, 0, 1])),
    };
    for id in ["a", "b"] {
        t.create(id, id, vec![], addr.clone(), holder(1, true), TTL)
            .unwrap();
    }
    t.reserve("a", "p1", Slot::Starting).unwrap();
    assert!(matches!(
        t.reserve("a", "p1", Slot::Starting),
        Err(SessionError::ProcessExists(_))
    ));
    t.reserve("a", "p2", Slot::Pending(())).unwrap();
    t.reserve("a", "p3", Slot::Ready(3)).unwrap();
    assert!(matches!(
        t.reserve("a", "p4", Slot::Starting),
        Err(SessionError::TooManyProcesses(3))
    ));
    t.reserve("b", "q1", Slot::Starting).unwrap();
    t.reserve("b", "q2", Slot::Starting).unwrap();
    assert!(matches!(
        t.reserve("b", "q3", Slot::Starting),
        Err(SessionError::QuotaReached {
            limit: "maxProcessesPerAddress",
            value: 5
        })
    ));
    assert_eq!(t.processes("a"), vec![3], "only spawned ones are processes");
    assert!(matches!(
        t.reserve("gone", "p", Slot::Starting),
        Err(SessionError::UnknownSession)
    ));
}

#[test]
fn an_exited_process_is_forgotten_after_retention_without_acks_and_at_once_with() {
    let t0 = Instant::now();
    let mut t = table_with(&["a"]);
    let s1 = t.reserve("a", "p", Slot::Ready(1)).unwrap();
    let s2 = t.reserve("a", "q", Slot::Ready(2)).unwrap();
    t.exit_delivered(t0, "a", "p", s1, false, vec![]);
    t.exit_delivered(t0, "a", "q", s2, true, vec![]);
    assert!(t.slot("a", "q").is_none(), "acked: gone at once");
    assert_eq!(t.poll_timeout(), Some(t0 + RETENTION));
    t.handle_timeout(t0 + RETENTION - ms(1));
    assert!(t.slot("a", "p").is_some());
    t.handle_timeout(t0 + RETENTION);
    assert!(t.slot("a", "p").is_none(), "retention over");
    assert_eq!(t.poll_timeout(), None);
}

#[test]
fn a_forgotten_process_keeps_its_last_write_ids_on_both_paths() {
    let t0 = Instant::now();
    let mut t = table_with(&["a"]);
    let s1 = t.reserve("a", "p", Slot::Ready(1)).unwrap();
    let s2 = t.reserve("a", "q", Slot::Ready(2)).unwrap();
    let w = |ids: &[&str]| ids.iter().map(|&i| Arc::<str>::from(i)).collect::<Vec<_>>();
    t.exit_delivered(t0, "a", "p", s1, false, w(&["p-1", "p-2"]));
    t.exit_delivered(t0, "a", "q", s2, true, w(&["q-1"]));
    assert!(
        t.ended_wrote("a", "q", "q-1"),
        "acked: forgotten with its writes"
    );
    assert!(!t.ended_wrote("a", "q", "q-2"));
    assert!(
        !t.ended_wrote("a", "p", "p-1"),
        "not forgotten before its retention"
    );
    t.handle_timeout(t0 + RETENTION);
    assert!(
        t.ended_wrote("a", "p", "p-2"),
        "retention over: forgotten with its writes"
    );
    assert!(!t.ended_wrote("a", "p", "q-1"), "another process's write");
    assert!(!t.ended_wrote("b", "p", "p-1"), "another session");
}

#[test]
fn a_slot_taken_again_is_not_reaped_by_the_old_one() {
    let t0 = Instant::now();
    let mut t = table_with(&["a"]);
    let old = t.reserve("a", "p", Slot::Ready(1)).unwrap();
    t.exit_delivered(t0, "a", "p", old, true, vec![]);
    let new = t.reserve("a", "p", Slot::Ready(2)).unwrap();
    t.exit_delivered(t0, "a", "p", old, false, vec![]);
    assert!(!t.approved("a", "p", old, "x", vec![]), "stale serial");
    assert!(!t.handle_spawned("a", "p", old, Some(9)), "stale serial");
    assert!(matches!(effects(&mut t)[..], [Action::Abandon(9)]));
    assert!(t.free("a", "p", old).is_none());
    assert_eq!(t.poll_timeout(), None, "no deadline for a stale slot");
    assert!(matches!(t.slot("a", "p"), Some((Slot::Ready(2), s)) if s == new));
}

type Log = Arc<Mutex<Vec<Resolution>>>;

fn params() -> ApproveParams {
    ApproveParams {
        process_id: "p".into(),
        argv: vec!["rm".into()],
        cwd: "/".into(),
        env_names: vec![],
        tty: false,
        rule: "r".into(),
    }
}

fn register(t: &mut SessionTable<Test>, now: Instant, log: &Log) -> Option<Registered> {
    let log = log.clone();
    t.register_approval(now, "a", params(), move |r| log.lock().unwrap().push(r))
}

#[test]
fn an_unanswered_approval_times_out_at_its_deadline() {
    let t0 = Instant::now();
    let mut t = table_with(&["a"]);
    let log = Log::default();
    let Some(Registered::Send(r)) = register(&mut t, t0, &log) else {
        panic!("the holder can answer: sent")
    };
    assert_eq!(r.id, "s-1");
    assert_eq!(t.poll_timeout(), Some(t0 + APPROVAL));
    assert!(matches!(
        effects(&mut t)[..],
        [Action::Request { to: 1, .. }]
    ));
    t.handle_timeout(t0 + APPROVAL);
    let Some(Action::Resolve {
        request,
        resolution,
    }) = t.poll_action()
    else {
        panic!("expected a timeout")
    };
    assert_eq!(
        resolution,
        Resolution::Refused {
            reason: reason::TIMED_OUT
        }
    );
    request.resolve(resolution);
    assert_eq!(log.lock().unwrap().len(), 1);
    assert_eq!(
        t.answer("a", "s-1", Resolution::Approved),
        AnswerOutcome::LateOrDuplicate
    );
    assert!(t.poll_action().is_none(), "a late answer resolves nothing");
}

#[test]
fn an_answer_disarms_the_deadline() {
    let t0 = Instant::now();
    let mut t = table_with(&["a"]);
    let log = Log::default();
    register(&mut t, t0, &log);
    drain(&mut t);
    let o = t.answer("a", "s-1", Resolution::Approved);
    assert_eq!(o, AnswerOutcome::Answered);
    let Some(Action::Resolve {
        request,
        resolution: Resolution::Approved,
    }) = t.poll_action()
    else {
        panic!("the answer resolves it")
    };
    request.resolve(Resolution::Approved);
    assert_eq!(*log.lock().unwrap(), [Resolution::Approved]);
    assert_eq!(t.poll_timeout(), None);
    assert_eq!(
        t.answer("a", "s-9", Resolution::Approved),
        AnswerOutcome::NeverSent
    );
}

#[test]
fn approvals_wait_for_a_resume_and_are_withdrawn_when_nobody_can_answer() {
    let t0 = Instant::now();
    let mut t = table_with(&["a"]);
    let log = Log::default();
    t.detach(t0, "a", 1);
    assert!(matches!(
        register(&mut t, t0, &log),
        Some(Registered::Held(_))
    ));
    drain(&mut t);
    assert!(t.attach("a", holder(2, true)));
    match &drain(&mut t)[..] {
        [Action::Request { to: 2, request }] => assert_eq!(request.id, "s-1", "same id"),
        other => panic!("sent again: {other:?}"),
    }
    assert!(t.attach("a", holder(3, false)));
    let refused = Resolution::Refused {
        reason: reason::RESUMED_WITHOUT_CAPABILITY,
    };
    match &drain(&mut t)[..] {
        [Action::Evict(2), Action::Resolve { resolution, .. }] => assert_eq!(resolution, &refused),
        other => panic!("nobody can answer it now: {other:?}"),
    }
    assert_eq!(t.poll_timeout(), None, "its deadline went with it");
    assert!(matches!(
        register(&mut t, t0, &log),
        Some(Registered::Refused(_))
    ));
    assert!(matches!(
        &drain(&mut t)[..],
        [Action::Resolve { resolution, .. }] if *resolution == refused
    ));
}

#[test]
fn close_takes_everything_out_once() {
    let t0 = Instant::now();
    let mut t = table_with(&["a"]);
    let log = Log::default();
    let s = t.reserve("a", "p", Slot::Ready(1)).unwrap();
    t.exit_delivered(t0, "a", "p", s, false, vec![]);
    register(&mut t, t0, &log);
    t.detach(t0, "a", 1);
    drain(&mut t);
    assert!(t.close("a"));
    match &drain(&mut t)[..] {
        [Action::SignalScope {
            session: "a",
            processes,
            cause: EndCause::Closed,
        }, Action::Resolve { resolution, .. }, Action::Forget { session: "a", .. }] => {
            assert_eq!(processes, &[1]);
            assert_eq!(
                resolution,
                &Resolution::Refused {
                    reason: reason::SESSION_CLOSED
                }
            );
        }
        other => panic!("one end of the session: {other:?}"),
    }
    assert_eq!(t.poll_timeout(), None, "every deadline of it disarmed");
    assert!(!t.close("a"), "idempotent");
    assert!(t.poll_action().is_none(), "a second close does nothing");
    assert!(matches!(
        t.resume("a", &[0], None, holder(5, true)),
        Err(SessionError::UnknownSession)
    ));
    assert!(t.register_approval(t0, "a", params(), |_| {}).is_none());
}

#[test]
fn a_forgotten_process_is_an_ended_one_until_its_id_is_taken_again() {
    let t0 = Instant::now();
    let mut t = table_with(&["a"]);
    let p = t.reserve("a", "p", Slot::Ready(1)).unwrap();
    let q = t.reserve("a", "q", Slot::Ready(2)).unwrap();
    let r = t.reserve("a", "r", Slot::Starting).unwrap();
    assert!(!t.is_ended("a", "p"), "live");
    // Acknowledged: forgotten and ended at once.
    t.exit_delivered(t0, "a", "p", p, true, vec![]);
    assert!(t.is_ended("a", "p"));
    // Retained without acks: ended only once the retention is over.
    t.exit_delivered(t0, "a", "q", q, false, vec![]);
    assert!(!t.is_ended("a", "q"));
    t.handle_timeout(t0 + RETENTION);
    assert!(t.is_ended("a", "q"));
    // A start that failed never ran: its id is not an ended one.
    assert!(t.free("a", "r", r).is_some());
    assert!(!t.is_ended("a", "r"));
    assert!(!t.is_ended("a", "never"));
    assert!(!t.is_ended("gone", "p"));
    // A new start takes the id back.
    t.reserve("a", "p", Slot::Ready(3)).unwrap();
    assert!(!t.is_ended("a", "p"));
}

#[test]
fn close_hands_over_the_ended_ids_and_the_ones_it_ends() {
    let t0 = Instant::now();
    let mut t = table_with(&["a"]);
    let p = t.reserve("a", "p", Slot::Ready(1)).unwrap();
    t.reserve("a", "q", Slot::Ready(2)).unwrap();
    t.reserve("a", "w", Slot::Pending(())).unwrap();
    t.exit_delivered(t0, "a", "p", p, true, vec![]);
    drain(&mut t);
    assert!(t.close("a"));
    let Some(Action::Forget { ended, .. }) = drain(&mut t).pop() else {
        panic!("the close forgets the session last")
    };
    assert!(ended.contains("p"), "forgotten before");
    assert!(ended.contains("q"), "ended by the close");
    assert!(
        !ended.contains("w"),
        "a start waiting for approval never ran"
    );
    assert_eq!(ended.len(), 2);
}
