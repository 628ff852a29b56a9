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

impl SpawnSpec {
    /// `argv` on pipes, in the server's environment and working directory, without a stdin
    /// pipe: the plainest start (tests and embedders build on it with struct update syntax).
    pub fn command<S: AsRef<str>>(argv: &[S]) -> SpawnSpec {
        SpawnSpec {
            argv: argv.iter().map(|s| s.as_ref().to_string()).collect(),
            cwd: None,
            env: Vec::new(),
            inherit_env: true,
            tty: None,
            pipe_stdin: false,
        }
    }
}
