//! The in-process transport's raw client end (`connection/local.rs`), driven by hand: typed
//! messages, the test reads exactly what it chooses to.

use execrelay::connection::local::LocalClientEnd;
use execrelay::connection::message::{Call, Inbound, Note, Outbound, Reply, RequestId};
use execrelay::rpc::messages::{InitializeParams, StartParams};

use super::PROMPT;

/// `process/start` params for `argv` as `id`.
pub fn start_params(id: &str, argv: &[&str]) -> StartParams {
    serde_json::from_value(serde_json::json!({"processId": id, "argv": argv})).unwrap()
}

/// The next control message, within [`PROMPT`].
pub async fn control(end: &mut LocalClientEnd) -> Outbound {
    tokio::time::timeout(PROMPT, end.control.recv())
        .await
        .expect("no control message (hang guard)")
        .expect("server gone")
}

/// `initialize` + `initialized` on a raw end.
pub async fn handshake(end: &mut LocalClientEnd) {
    end.try_send(Inbound::Request {
        id: RequestId::Int(1),
        call: Call::Initialize(InitializeParams::default()),
    })
    .unwrap();
    match control(end).await {
        Outbound::Result {
            reply: Reply::Initialize(r),
            ..
        } => assert_eq!(r.protocol_version, 1),
        other => panic!("{other:?}"),
    }
    end.try_send(Inbound::Notification(Note::Initialized))
        .unwrap();
}

/// [`handshake`], asking for acks (`capabilities.acks`), which the server must grant.
pub async fn handshake_with_acks(end: &mut LocalClientEnd) {
    use execrelay::rpc::messages::Capabilities;
    end.try_send(Inbound::Request {
        id: RequestId::Int(1),
        call: Call::Initialize(InitializeParams {
            capabilities: Capabilities {
                acks: true,
                ..Capabilities::default()
            },
            ..InitializeParams::default()
        }),
    })
    .unwrap();
    match control(end).await {
        Outbound::Result {
            reply: Reply::Initialize(r),
            ..
        } => assert!(r.capabilities.acks),
        other => panic!("{other:?}"),
    }
    end.try_send(Inbound::Notification(Note::Initialized))
        .unwrap();
}

/// Start `argv` as `id` with request id `n`; its pid.
pub async fn start(end: &mut LocalClientEnd, n: i64, id: &str, argv: &[&str]) -> u32 {
    end.try_send(Inbound::Request {
        id: RequestId::Int(n),
        call: Call::Start(start_params(id, argv)),
    })
    .unwrap();
    match control(end).await {
        Outbound::Result {
            id: RequestId::Int(got),
            reply: Reply::Start(r),
        } if got == n => r.pid,
        other => panic!("{other:?}"),
    }
}
