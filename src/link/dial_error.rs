//! [`DialError`]: why a link could not be dialled, for the dialer (`dial.rs`) and what it
//! trusts (`trust.rs`) alike, so neither imports the other for it.

use std::time::Duration;

/// Why a link could not be dialled.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum DialError {
    /// Not a URL form this dialer knows.
    #[error("{0}")]
    Url(String),
    /// TCP, TLS or the WebSocket handshake failed.
    #[error("cannot connect to {url}: {why}")]
    Connect {
        /// The URL dialled.
        url: String,
        /// What failed.
        why: String,
    },
    /// No answer within the deadline.
    #[error("cannot connect to {0}: no answer within {1:?}")]
    Timeout(String, Duration),
    /// The TLS settings could not be built (`--ca-file`).
    #[error("{0}")]
    Tls(String),
}
