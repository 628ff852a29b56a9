//! The methods of `protocol.md` §4 as one enum, parsed once per message from one table, with
//! the ordering class of each (§6).
//!
//! The connection parses a method name once ([`Method::parse`]) and routes on the enum from
//! then on; the client names the methods it calls through [`Method::as_str`]. Adding a method
//! is one line in [`TABLE`] and one in [`Method::class`].

/// A method of the protocol, in either direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Method {
    /// `initialize` (request).
    Initialize,
    /// `initialized` (notification).
    Initialized,
    /// `server/info`.
    ServerInfo,
    /// `session/close` (an extension: the client ends its session at once).
    SessionClose,
    /// `process/start`.
    ProcessStart,
    /// `process/read`.
    ProcessRead,
    /// `process/write`.
    ProcessWrite,
    /// `process/closeStdin`.
    ProcessCloseStdin,
    /// `process/resize`.
    ProcessResize,
    /// `process/signal`.
    ProcessSignal,
    /// `process/terminate`.
    ProcessTerminate,
    /// `process/list`.
    ProcessList,
    /// `process/ack` (a notification; answered `{}` if sent as a request).
    ProcessAck,
    /// `process/outputDelta` (server → client notification).
    ProcessOutputDelta,
    /// `process/exited` (server → client notification).
    ProcessExited,
    /// `process/outputOmitted` (server → client notification, `outputCapKeep:
    /// "headAndTail"`).
    ProcessOutputOmitted,
    /// `process/approve` (server → client request, `protocol.md` §7).
    ProcessApprove,
}

/// How the connection treats a method the client sends (`protocol.md` §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MethodClass {
    /// Connection setup (`initialize`, `initialized`): the connection's state machine.
    Setup,
    /// Runs at once in its own task and never enters a queue, so control is never stuck
    /// behind data: `signal`, `terminate`, `server/info`, `process/list`, `session/close`.
    Control,
    /// Per process, FIFO, one at a time: `start`, `write`, `closeStdin`, `resize`.
    Exclusive,
    /// Per process, alongside other shared requests, never before an earlier exclusive one:
    /// `read` (a long poll must not hold anything up).
    Shared,
    /// `process/ack`: applied by the reader at once (answered `{}` if sent as a request).
    Ack,
    /// Sent by the server only (notifications, and `process/approve`, a request the server
    /// makes); a client sending it gets `-32601`.
    ServerToClient,
}

/// Every method and its wire name: the one table.
pub const TABLE: [(Method, &str); 17] = [
    (Method::Initialize, "initialize"),
    (Method::Initialized, "initialized"),
    (Method::ServerInfo, "server/info"),
    (Method::SessionClose, "session/close"),
    (Method::ProcessStart, "process/start"),
    (Method::ProcessRead, "process/read"),
    (Method::ProcessWrite, "process/write"),
    (Method::ProcessCloseStdin, "process/closeStdin"),
    (Method::ProcessResize, "process/resize"),
    (Method::ProcessSignal, "process/signal"),
    (Method::ProcessTerminate, "process/terminate"),
    (Method::ProcessList, "process/list"),
    (Method::ProcessAck, "process/ack"),
    (Method::ProcessOutputDelta, "process/outputDelta"),
    (Method::ProcessExited, "process/exited"),
    (Method::ProcessOutputOmitted, "process/outputOmitted"),
    (Method::ProcessApprove, "process/approve"),
];

impl Method {
    /// Parse a wire name; `None` for a method this server does not know.
    pub fn parse(name: &str) -> Option<Method> {
        TABLE.iter().find(|(_, n)| *n == name).map(|(m, _)| *m)
    }

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        // The table holds every variant (a test checks it); the fallback is never taken.
        TABLE
            .iter()
            .find(|(m, _)| *m == self)
            .map_or("", |(_, n)| n)
    }

    /// How the connection orders it.
    pub fn class(self) -> MethodClass {
        match self {
            Method::Initialize | Method::Initialized => MethodClass::Setup,
            Method::ServerInfo
            | Method::SessionClose
            | Method::ProcessSignal
            | Method::ProcessTerminate
            | Method::ProcessList => MethodClass::Control,
            Method::ProcessStart
            | Method::ProcessWrite
            | Method::ProcessCloseStdin
            | Method::ProcessResize => MethodClass::Exclusive,
            Method::ProcessRead => MethodClass::Shared,
            Method::ProcessAck => MethodClass::Ack,
            Method::ProcessOutputDelta
            | Method::ProcessExited
            | Method::ProcessOutputOmitted
            | Method::ProcessApprove => MethodClass::ServerToClient,
        }
    }
}

impl std::fmt::Display for Method {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_parses_to_its_method_and_back() {
        for (m, name) in TABLE {
            assert_eq!(Method::parse(name), Some(m), "{name}");
            assert_eq!(m.as_str(), name);
        }
        let mut names: Vec<&str> = TABLE.iter().map(|(_, n)| *n).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), TABLE.len(), "a name appears twice");
    }

    #[test]
    fn unknown_names_do_not_parse() {
        for name in [
            "",
            "process/Start",
            "process/start ",
            "process/",
            "x",
            "initialize\0",
        ] {
            assert_eq!(Method::parse(name), None, "{name:?}");
        }
    }

    /// The classes of `protocol.md` §6.
    #[test]
    fn classes_match_the_protocol() {
        let class = |n| Method::parse(n).map(Method::class);
        for n in [
            "process/signal",
            "process/terminate",
            "server/info",
            "process/list",
            "session/close",
        ] {
            assert_eq!(class(n), Some(MethodClass::Control), "{n}");
        }
        for n in [
            "process/start",
            "process/write",
            "process/closeStdin",
            "process/resize",
        ] {
            assert_eq!(class(n), Some(MethodClass::Exclusive), "{n}");
        }
        assert_eq!(class("process/read"), Some(MethodClass::Shared));
        assert_eq!(class("process/ack"), Some(MethodClass::Ack));
        assert_eq!(class("initialize"), Some(MethodClass::Setup));
        assert_eq!(class("initialized"), Some(MethodClass::Setup));
        assert_eq!(
            class("process/outputDelta"),
            Some(MethodClass::ServerToClient)
        );
        assert_eq!(class("process/exited"), Some(MethodClass::ServerToClient));
        assert_eq!(class("process/approve"), Some(MethodClass::ServerToClient));
    }
}
