//! The in-process transport's promises (`connection/local.rs`), driven through its raw client
//! end (typed messages, the test reads exactly what it chooses to): a control reply
//! (`terminate`) is answered while the event queue is full and unread; a full client → server
//! queue is reported at once (never a wait); shutdown with both queues full and nobody
//! reading finishes within its deadline and leaves no child. And through the library:
//! `Client::in_process` answers `-32004` with `data.limit = "inProcessQueue"` at once when its
//! queue is full. With a receiver installed (`LocalClientEnd::receive_directly`, as the library
//! does), replies and events are handed over without the channels: each start's result still
//! comes before its output, output before the exit notice, and a request that has to wait still
//! answers.
//!
//! The behaviour shared with the WebSocket client is in `client_behaviour.rs`.

mod common;
use common::local::{control, handshake, handshake_with_acks, start};
use common::process::pid_exists;
use common::*;

use std::sync::Arc;
use std::time::{Duration, Instant};

use execrelay::config::{ServerConfig, CONTROL_LANE_SLACK, CONTROL_REQUEST_SLOTS};
use execrelay::connection::local::{LocalClientEnd, LocalLimits, LocalSendError};
use execrelay::connection::message::{Call, Inbound, Outbound, Reply, RequestId};
use execrelay::rpc::messages::TerminateParams;
use execrelay::server::LocalServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminate_is_answered_while_the_event_queue_is_full_and_unread() {
    let limits = LocalLimits {
        requests: 16,
        control: 16,
        events: 4,
    };
    let (server, mut end) =
        LocalServer::start(Arc::new(ServerConfig::default()), None, limits).expect("server starts");
    handshake(&mut end).await;
    let pid = start(&mut end, 2, "flood", &["yes"]).await;
    eventually("the event queue is full", || {
        end.events_queued() == limits.events
    })
    .await;

    let asked = Instant::now();
    end.try_send(Inbound::Request {
        id: RequestId::Int(3),
        call: Call::Terminate(TerminateParams {
            process_id: "flood".into(),
            grace_ms: Some(0),
        }),
    })
    .unwrap();
    match control(&mut end).await {
        Outbound::Result {
            id: RequestId::Int(3),
            reply: Reply::Terminate { running },
        } => assert!(running),
        other => panic!("{other:?}"),
    }
    assert!(
        asked.elapsed() < PROMPT,
        "answered without anyone reading events"
    );
    assert_eq!(
        end.events_queued(),
        limits.events,
        "no event was dropped or read"
    );
    // The exit notice is not lost either: it comes after the output, once events are read.
    let mut seq = 0;
    loop {
        let ev = tokio::time::timeout(GUARD, end.events.recv())
            .await
            .expect("events flow again (hang guard)")
            .expect("event");
        assert_eq!(ev.seq, seq + 1, "no gap");
        seq = ev.seq;
        if matches!(ev.body, execrelay::process::event_log::EventBody::Exited(_)) {
            break;
        }
    }
    assert!(!pid_exists(pid as i32) || !group_alive(pid as i32));
    server.shutdown(Duration::from_secs(5)).await;
}

/// `/proc/PID/stat` of every member of process group `pgid` (for a failure's message).
fn members(pgid: i32) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        let Some(after) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        let f: Vec<&str> = after.split_whitespace().collect();
        if f.get(2).and_then(|g| g.parse::<i32>().ok()) == Some(pgid) {
            out.push(stat);
        }
    }
    out
}

/// How many `server/info` requests the server takes off a connection's request queue while
/// its client reads none of the replies, before its reader stops for good: the control channel
/// full, one reply in the writer's hand, the writer's control lane full, every control-request
/// slot held by a request waiting for room in that lane, and one more in the reader's hand (it
/// waits to queue the limit error that request gets). Counted from the documented bounds, so
/// that the test knows when the queue is full for good instead of guessing from a moment
/// where it happened to be full (the reader, on the other worker, may simply be behind).
fn taken_while_replies_unread(cfg: &ServerConfig, limits: LocalLimits) -> usize {
    let lane = cfg.max_pending_requests + CONTROL_REQUEST_SLOTS + CONTROL_LANE_SLACK;
    limits.control + 1 + lane + CONTROL_REQUEST_SLOTS + 1
}

/// Fill the request queue of `end` for good: send, waiting for room each time, exactly as many
/// requests as the server takes before its reader stops plus the queue's capacity. Each wait
/// ends only because the server took a request, so when this returns the reader has stopped
/// and the queue is full; a server that took fewer than counted hangs here (caught by the
/// guard), one that took more leaves room that the caller's `try_send` finds.
async fn fill_requests(end: &LocalClientEnd, total: usize) {
    let sender = end.sender();
    for n in 0..total {
        let msg = Inbound::Request {
            id: RequestId::Int(1000 + n as i64),
            call: Call::ServerInfo,
        };
        match tokio::time::timeout(GUARD, sender.send(msg)).await {
            Ok(sent) => assert!(sent.is_ok(), "server gone"),
            Err(_) => panic!("the server stopped taking requests after {n} of {total}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_request_queue_is_reported_at_once_and_shutdown_with_full_queues_is_bounded() {
    let limits = LocalLimits {
        requests: 4,
        control: 2,
        events: 4,
    };
    let cfg = Arc::new(ServerConfig {
        max_pending_requests: 4,
        ..ServerConfig::default()
    });
    let (server, mut end) = LocalServer::start(cfg.clone(), None, limits).expect("server starts");
    handshake(&mut end).await;
    let flood = start(&mut end, 2, "flood", &["yes"]).await;
    // A child that ignores SIGTERM: only SIGKILL ends it.
    let stubborn = start(
        &mut end,
        3,
        "stubborn",
        &["sh", "-c", "trap '' TERM; while :; do sleep 1; done"],
    )
    .await;
    eventually("the event queue is full", || {
        end.events_queued() == limits.events
    })
    .await;
    fill_requests(
        &end,
        taken_while_replies_unread(&cfg, limits) + limits.requests,
    )
    .await;
    // Full means full: an immediate error, again and again, never a wait.
    for _ in 0..3 {
        let t = Instant::now();
        assert_eq!(
            end.try_send(Inbound::Request {
                id: RequestId::Int(1),
                call: Call::ServerInfo,
            }),
            Err(LocalSendError::Full)
        );
        assert!(t.elapsed() < Duration::from_secs(1));
    }

    let deadline = Duration::from_secs(3);
    let t = Instant::now();
    tokio::time::timeout(GUARD, server.shutdown(deadline))
        .await
        .expect("shutdown returned (hang guard)");
    let took = t.elapsed();
    assert!(
        took < deadline + Duration::from_secs(2),
        "shutdown took {took:?}, deadline {deadline:?}"
    );
    for pid in [flood, stubborn] {
        assert!(!pid_exists(pid as i32), "child {pid} outlived the shutdown");
        // Zombies run nothing (a member whose parent died is init's to reap, which in a
        // container may take its time).
        let live: Vec<String> = members(pid as i32)
            .into_iter()
            .filter(|stat| {
                !stat[stat.rfind(')').unwrap() + 1..]
                    .trim_start()
                    .starts_with('Z')
            })
            .collect();
        assert!(
            live.is_empty(),
            "group {pid} outlived the shutdown: {live:?}"
        );
    }
    drop(end);
}

/// `Client::in_process`: a request that finds the queue full is answered `-32004` at once.
/// Single-threaded on purpose: every call's first poll (which queues its request) runs before
/// the server's reader can take any, so the queue's capacity decides exactly how many fit.
#[tokio::test]
async fn the_in_process_client_answers_an_overload_at_once() {
    use execrelay::client::{Client, ClientError, ClientOptions, InProcessConfig};
    let config = InProcessConfig {
        limits: Some(LocalLimits {
            requests: 2,
            control: 1024,
            events: 64,
        }),
        ..InProcessConfig::default()
    };
    let client = Client::in_process(config, ClientOptions::default())
        .await
        .unwrap();
    // Answered: the server has taken everything queued before (`initialized` too).
    client.server_info().await.unwrap();
    let calls = (0..50).map(|_| client.server_info());
    let results = futures_util::future::join_all(calls).await;
    let overloads: Vec<&ClientError> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    let served = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(served, 2, "the queue holds two");
    assert_eq!(overloads.len(), 48);
    for e in overloads {
        match e {
            ClientError::Rpc { code, data, .. } => {
                assert_eq!(*code, -32004);
                let data = data.as_ref().unwrap();
                assert_eq!(data["limit"], "inProcessQueue");
                assert_eq!(data["value"], 2);
            }
            other => panic!("{other:?}"),
        }
    }
    // Once the server caught up, requests go through again.
    assert!(client.server_info().await.is_ok());
    client.shutdown().await;
}

/// What a [`Recorder`] was handed, in the order the server handed it over.
#[derive(Debug)]
enum Got {
    Control(Outbound),
    Event(execrelay::connection::outlet::EventMessage),
}

/// A receiver that records what the server hands it, in order.
struct Recorder(tokio::sync::mpsc::UnboundedSender<Got>);

impl execrelay::connection::local::LocalReceiver for Recorder {
    fn control(&self, m: Outbound) -> bool {
        self.0.send(Got::Control(m)).is_ok()
    }
    fn event(&self, e: execrelay::connection::outlet::EventMessage) -> bool {
        self.0.send(Got::Event(e)).is_ok()
    }
}

async fn next_got(rx: &mut tokio::sync::mpsc::UnboundedReceiver<Got>) -> Got {
    tokio::time::timeout(GUARD, rx.recv())
        .await
        .expect("nothing handed over (hang guard)")
        .expect("server gone")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_direct_receiver_gets_each_result_before_its_output_and_a_waiting_request_answers() {
    use execrelay::process::event_log::EventBody;
    let (server, mut end) = LocalServer::start(
        Arc::new(ServerConfig::default()),
        None,
        LocalLimits::for_config(&ServerConfig::default()),
    )
    .expect("server starts");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    assert!(end.receive_directly(Arc::new(Recorder(tx))));
    let (other, _) = tokio::sync::mpsc::unbounded_channel();
    assert!(
        !end.receive_directly(Arc::new(Recorder(other))),
        "a second receiver is refused"
    );
    end.try_send(Inbound::Request {
        id: RequestId::Int(1),
        call: Call::Initialize(Default::default()),
    })
    .unwrap();
    match next_got(&mut rx).await {
        Got::Control(Outbound::Result {
            id: RequestId::Int(1),
            reply: Reply::Initialize(_),
        }) => {}
        other => panic!("{other:?}"),
    }
    end.try_send(Inbound::Notification(
        execrelay::connection::message::Note::Initialized,
    ))
    .unwrap();

    // Short processes whose output is ready as soon as they start, started back to back: the
    // result of each start is handed over before any event of its process, and each
    // process's output before its exit notice.
    const STARTS: i64 = 20;
    for n in 0..STARTS {
        end.try_send(Inbound::Request {
            id: RequestId::Int(10 + n),
            call: Call::Start(common::local::start_params(
                &format!("p{n}"),
                &["echo", "hello"],
            )),
        })
        .unwrap();
    }
    let mut started = std::collections::HashSet::new();
    let mut output = std::collections::HashMap::<String, Vec<u8>>::new();
    let mut exited = 0;
    while exited < STARTS {
        match next_got(&mut rx).await {
            Got::Control(Outbound::Result {
                id: RequestId::Int(n),
                reply: Reply::Start(_),
            }) => assert!(started.insert(format!("p{}", n - 10))),
            Got::Event(e) => {
                assert!(
                    started.contains(&e.process_id),
                    "an event of {} before its start result",
                    e.process_id
                );
                match e.body {
                    EventBody::Output { chunk, .. } => output
                        .entry(e.process_id)
                        .or_default()
                        .extend_from_slice(&chunk),
                    EventBody::Exited(_) => {
                        assert_eq!(
                            output.get(&e.process_id).map(Vec::as_slice),
                            Some(&b"hello\n"[..]),
                            "all of {}'s output before its exit notice",
                            e.process_id
                        );
                        exited += 1;
                    }
                    other => panic!("{other:?}"),
                }
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(
        end.control.try_recv().is_err() && end.events_queued() == 0,
        "nothing went through the channels"
    );

    // A request that waits (a long poll on a process with nothing to say) goes on in a task
    // of its own and is answered from there once the process ends.
    let mut params = common::local::start_params("quiet", &["cat"]);
    params.pipe_stdin = true;
    end.try_send(Inbound::Request {
        id: RequestId::Int(100),
        call: Call::Start(params),
    })
    .unwrap();
    match next_got(&mut rx).await {
        Got::Control(Outbound::Result {
            id: RequestId::Int(100),
            reply: Reply::Start(_),
        }) => {}
        other => panic!("{other:?}"),
    }
    end.try_send(Inbound::Request {
        id: RequestId::Int(101),
        call: Call::Read(execrelay::rpc::messages::ReadParams {
            process_id: "quiet".into(),
            after_seq: 0,
            max_bytes: None,
            wait_ms: 60_000,
        }),
    })
    .unwrap();
    end.try_send(Inbound::Request {
        id: RequestId::Int(102),
        call: Call::Terminate(TerminateParams {
            process_id: "quiet".into(),
            grace_ms: Some(0),
        }),
    })
    .unwrap();
    let mut terminated = false;
    let mut read_answered = false;
    let mut exit_event = false;
    while !(read_answered && exit_event && terminated) {
        match next_got(&mut rx).await {
            Got::Control(Outbound::Result {
                id: RequestId::Int(102),
                reply: Reply::Terminate { running },
            }) => {
                assert!(running);
                terminated = true;
            }
            Got::Control(Outbound::Result {
                id: RequestId::Int(101),
                reply: Reply::Read(r),
            }) => {
                // Its answer holds the exit notice: it was answered after the terminate
                // was sent, so it waited (the terminate itself may be handed over first or
                // not: the two are made on different threads).
                assert!(r.exited, "{r:?}");
                assert!(matches!(
                    r.events.last().map(|e| &e.body),
                    Some(EventBody::Exited(_))
                ));
                read_answered = true;
            }
            Got::Event(e) => {
                assert_eq!(e.process_id, "quiet");
                assert!(matches!(e.body, EventBody::Exited(_)), "{e:?}");
                exit_event = true;
            }
            other => panic!("{other:?}"),
        }
    }
    drop(end);
    server.shutdown(Duration::from_secs(5)).await;
}

/// With acks, an exited process stays known until its exit notice is acknowledged (writing
/// the notice, or anything else, does not end the wait) and goes once it is: the wait for
/// the acknowledgement is woken by the ack.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_acks_an_exited_process_is_forgotten_once_its_exit_notice_is_acknowledged() {
    use execrelay::connection::message::Note;
    use execrelay::process::event_log::EventBody;
    use execrelay::rpc::messages::AckParams;
    let config = ServerConfig {
        exited_retention_ms: 0,
        ..ServerConfig::default()
    };
    let (server, mut end) = LocalServer::start(
        Arc::new(config.clone()),
        None,
        LocalLimits::for_config(&config),
    )
    .expect("server starts");
    handshake_with_acks(&mut end).await;
    start(&mut end, 2, "short", &["echo", "bye"]).await;
    let exit_seq = loop {
        let ev = tokio::time::timeout(GUARD, end.events.recv())
            .await
            .expect("events (hang guard)")
            .expect("event");
        if matches!(ev.body, EventBody::Exited(_)) {
            break ev.seq;
        }
    };
    let listed = |end: &mut LocalClientEnd, n: i64| {
        end.try_send(Inbound::Request {
            id: RequestId::Int(n),
            call: Call::List,
        })
        .unwrap();
    };
    // Written, not acknowledged: still known.
    listed(&mut end, 3);
    match control(&mut end).await {
        Outbound::Result {
            reply: Reply::List(list),
            ..
        } => assert!(
            list.iter().any(|p| p.process_id == "short"),
            "forgotten before its exit notice was acknowledged: {list:?}"
        ),
        other => panic!("{other:?}"),
    }
    end.try_send(Inbound::Notification(Note::Ack(Some(AckParams {
        process_id: "short".into(),
        seq: exit_seq,
    }))))
    .unwrap();
    let deadline = Instant::now() + GUARD;
    let mut n = 4;
    loop {
        listed(&mut end, n);
        n += 1;
        match control(&mut end).await {
            Outbound::Result {
                reply: Reply::List(list),
                ..
            } if list.is_empty() => break,
            Outbound::Result {
                reply: Reply::List(_),
                ..
            } => {}
            other => panic!("{other:?}"),
        }
        assert!(
            Instant::now() < deadline,
            "still known after its exit notice was acknowledged"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(end);
    server.shutdown(Duration::from_secs(5)).await;
}

/// The ack finishes the exit itself: the connection's reader, handling the ack, forgets the
/// process before it reads the next message (no task waits for the ack and needs a turn
/// first). On one thread, so nothing else can run between the two: a list sent right behind
/// the ack no longer shows the process, and a start behind it is served as usual.
#[tokio::test(flavor = "current_thread")]
async fn the_ack_forgets_the_exited_process_before_the_next_message_is_read() {
    use execrelay::connection::message::Note;
    use execrelay::process::event_log::EventBody;
    use execrelay::rpc::messages::AckParams;
    let config = ServerConfig::default();
    let (server, mut end) = LocalServer::start(
        Arc::new(config.clone()),
        None,
        LocalLimits::for_config(&config),
    )
    .expect("server starts");
    handshake_with_acks(&mut end).await;
    for round in 0..3i64 {
        let id = format!("short-{round}");
        start(&mut end, 10 + 10 * round, &id, &["true"]).await;
        let exit_seq = loop {
            let ev = tokio::time::timeout(GUARD, end.events.recv())
                .await
                .expect("events (hang guard)")
                .expect("event");
            assert_eq!(ev.process_id, id);
            if matches!(ev.body, EventBody::Exited(_)) {
                break ev.seq;
            }
        };
        // Queued back to back: the reader takes both in one turn.
        end.try_send(Inbound::Notification(Note::Ack(Some(AckParams {
            process_id: id.clone(),
            seq: exit_seq,
        }))))
        .unwrap();
        end.try_send(Inbound::Request {
            id: RequestId::Int(11 + 10 * round),
            call: Call::List,
        })
        .unwrap();
        match control(&mut end).await {
            Outbound::Result {
                reply: Reply::List(list),
                ..
            } => assert!(
                list.is_empty(),
                "still known right after its exit notice was acknowledged: {list:?}"
            ),
            other => panic!("{other:?}"),
        }
    }
    drop(end);
    server.shutdown(Duration::from_secs(5)).await;
}
