//! The one place where the typed errors of the layers below ([`SessionError`],
//! [`ProcessError`]) become JSON-RPC errors: which code, which message, which data.
//!
//! Handlers propagate those errors with `?`; the conversions below decide what the client
//! sees. The wire messages are part of the protocol's contract (tests check them): change one
//! here or nowhere.

use serde_json::json;

use crate::process::ProcessError;
use crate::rpc::RpcError;
use crate::session::SessionError;

impl From<SessionError> for RpcError {
    fn from(e: SessionError) -> Self {
        use SessionError as E;
        match e {
            E::UnknownSession => RpcError::unknown_session(),
            E::TooManySessions(n) => RpcError::limit_reached("maxSessions", n as u64),
            E::TooManyProcesses(n) => RpcError::limit_reached("maxProcesses", n as u64),
            E::QuotaReached { limit, value } => RpcError::limit_reached(limit, value as u64),
            E::ProcessExists(id) => RpcError::process_exists(&id),
            E::UnknownProcess(id) => RpcError::unknown_process(&id),
            // What failed, which path, which errno (`protocol.md` §2); out of descriptors is
            // said plainly (the OS text alone reads like a client error).
            E::Start(e) => {
                RpcError::start_failed(e.message(), e.what.as_str(), &e.path, &e.errno_name())
            }
            E::NotApproved { reason, rule } => RpcError::not_approved(reason, rule.as_deref()),
            E::Containment(e) => RpcError::internal(e.to_string()),
        }
    }
}

impl From<ProcessError> for RpcError {
    fn from(e: ProcessError) -> Self {
        use ProcessError as E;
        match e {
            E::Signal(e) => RpcError::internal(format!("signal failed: {e}")),
            E::NotTty(id) => {
                RpcError::invalid_params(format!("process {} is not a tty process", json!(id)))
            }
            E::ZeroSize => RpcError::invalid_params("rows and cols must be positive"),
            E::Resize(e) => RpcError::internal(format!("resize failed: {e}")),
            E::NotRetained { from_seq, to_seq } => RpcError::output_not_retained(from_seq, to_seq),
            E::ReadCancelled => RpcError::invalid_request("connection closed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::{StartError, StartWhat};
    use crate::rpc::ErrorCode;

    fn wire(e: impl Into<RpcError>) -> (i64, String) {
        let e: RpcError = e.into();
        (e.code.code(), e.message)
    }

    /// Codes and messages as clients have always seen them.
    #[test]
    fn session_errors_keep_their_codes_and_messages() {
        assert_eq!(
            wire(SessionError::UnknownSession),
            (
                -32003,
                "unknown or expired session, or wrong resume token".into()
            )
        );
        assert_eq!(
            wire(SessionError::TooManySessions(64)),
            (-32004, "limit reached: maxSessions (64)".into())
        );
        assert_eq!(
            wire(SessionError::TooManyProcesses(3)),
            (-32004, "limit reached: maxProcesses (3)".into())
        );
        assert_eq!(
            wire(SessionError::ProcessExists("a\"b".into())),
            (-32002, "process id \"a\\\"b\" already exists".into())
        );
        assert_eq!(
            wire(SessionError::UnknownProcess("x".into())),
            (-32001, "unknown process id \"x\"".into())
        );
        let e: RpcError = SessionError::NotApproved {
            reason: "denied by the client",
            rule: Some("deletes files".into()),
        }
        .into();
        assert_eq!(e.code.code(), -32006);
        assert_eq!(e.message, "not approved: denied by the client");
        assert_eq!(
            e.data,
            Some(json!({"reason": "denied by the client", "rule": "deletes files"}))
        );
        let start = |what, path: &str, errno| {
            SessionError::Start(StartError::new(
                what,
                path,
                &std::io::Error::from_raw_os_error(errno),
            ))
        };
        let e: RpcError = start(StartWhat::Program, "nosuchprog", libc::ENOENT).into();
        assert_eq!(e.code.code(), -32007);
        assert_eq!(e.message, "program \"nosuchprog\" not found in PATH");
        assert_eq!(
            e.data,
            Some(json!({"what": "program", "path": "nosuchprog", "errno": "ENOENT"}))
        );
        let e: RpcError = start(StartWhat::Cwd, "/x", libc::ENOENT).into();
        assert_eq!(e.message, "cwd \"/x\": no such directory");
        assert_eq!(
            e.data,
            Some(json!({"what": "cwd", "path": "/x", "errno": "ENOENT"}))
        );
        let (code, msg) = wire(start(StartWhat::Other, "sh", libc::EMFILE));
        assert_eq!(code, -32007);
        assert!(
            msg.starts_with(
                "cannot start \"sh\": the server is out of file descriptors (Too many open files"
            ),
            "{msg}"
        );
        let e: RpcError = SessionError::QuotaReached {
            limit: "maxProcessesPerKey",
            value: 5,
        }
        .into();
        assert_eq!(e.code.code(), -32004);
        assert_eq!(e.message, "limit reached: maxProcessesPerKey (5)");
        assert_eq!(
            e.data,
            Some(json!({"limit": "maxProcessesPerKey", "value": 5}))
        );
    }

    #[test]
    fn process_errors_keep_their_codes_and_messages() {
        assert_eq!(
            wire(ProcessError::NotTty("p\"1".into())),
            (-32602, "process \"p\\\"1\" is not a tty process".into())
        );
        assert_eq!(
            wire(ProcessError::ZeroSize),
            (-32602, "rows and cols must be positive".into())
        );
        assert_eq!(
            wire(ProcessError::ReadCancelled),
            (-32600, "connection closed".into())
        );
        let (code, msg) = wire(ProcessError::Signal(std::io::Error::from_raw_os_error(1)));
        assert_eq!(code, -32603);
        assert!(msg.starts_with("signal failed: "), "{msg}");
        let (code, msg) = wire(ProcessError::Resize(std::io::Error::from_raw_os_error(25)));
        assert_eq!(code, -32603);
        assert!(msg.starts_with("resize failed: "), "{msg}");
        let e: RpcError = ProcessError::NotRetained {
            from_seq: 3,
            to_seq: 9,
        }
        .into();
        assert_eq!(e.code, ErrorCode::OutputNotRetained);
        assert_eq!(e.message, "output no longer retained: seq 3..=9");
        assert_eq!(e.data, Some(json!({"fromSeq": 3, "toSeq": 9})));
    }
}
