//! Typed failures of process operations. The connection layer maps them to JSON-RPC errors
//! (`connection/error_map.rs`); this layer never builds a wire error itself.

use super::event_log::ReadError;

/// Why an operation on a process failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProcessError {
    /// Signalling the process group failed (not: the group is gone, which is no error).
    #[error("signal failed: {0}")]
    Signal(std::io::Error),
    /// `process/resize` of a process without a PTY; carries the process id.
    #[error("process {0:?} is not a tty process")]
    NotTty(String),
    /// A terminal size with zero rows or columns.
    #[error("rows and cols must be positive")]
    ZeroSize,
    /// The PTY refused the new size.
    #[error("resize failed: {0}")]
    Resize(std::io::Error),
    /// `process/read` asked for events already released: `from_seq..=to_seq` are gone.
    #[error("output no longer retained: seq {from_seq}..={to_seq}")]
    NotRetained {
        /// First missing seq.
        from_seq: u64,
        /// Last missing seq.
        to_seq: u64,
    },
    /// A long poll ended because its connection closed or the session moved.
    #[error("connection closed")]
    ReadCancelled,
}

impl From<ReadError> for ProcessError {
    fn from(e: ReadError) -> Self {
        match e {
            ReadError::Released { from_seq, to_seq } => {
                ProcessError::NotRetained { from_seq, to_seq }
            }
        }
    }
}
