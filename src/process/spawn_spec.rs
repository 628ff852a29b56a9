//! [`SpawnSpec`]: what to start, validated by the connection and handed down; plain data, read
//! by `spawn.rs` (which starts it) and `start_error.rs` (which explains a failed start).

use crate::rpc::messages::TermSize;

/// What to start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpawnSpec {
    /// Program and arguments (non-empty).
    pub argv: Vec<String>,
    /// Working directory, absolute.
    pub cwd: Option<String>,
    /// Overlay: `Some` sets, `None` removes.
    pub env: Vec<(String, Option<String>)>,
    /// Start from the server's environment.
    pub inherit_env: bool,
    /// Run on a PTY of this size.
    pub tty: Option<TermSize>,
    /// Give the child a stdin pipe (ignored with a PTY, where stdin is the terminal).
    pub pipe_stdin: bool,
}
