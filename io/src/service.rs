//! What both server binaries (`execrelay serve`, `execrelay-relay`) do around their servers:
//! logs on stderr ([`init_logging`]) and graceful shutdown on SIGTERM/SIGINT
//! ([`spawn_signal_handler`]), so that both log and stop alike.
//!
//! It owns process-wide set-up only; it must never know a server, a setting or a route. Once
//! serving, nothing here (or in either binary) may write to stdout or stderr with `print!`
//! or `eprint!`: they panic when the stream is a broken pipe ([`note`] does not).

use tokio_util::sync::CancellationToken;

/// Install the tracing subscriber: stderr, `RUST_LOG` (default `default`), text or JSON. Both
/// binaries use it, so both log alike.
///
/// A log line that cannot be written (stderr is a pipe whose reader is gone: a log collector
/// that died, `| head`) is dropped in silence. By default the subscriber would report that
/// failure with `eprintln!`, which panics when stderr is broken: every task that logged would
/// die, the signal handler's included, and `SIGTERM` would no longer stop the server.
pub fn init_logging(default: &str, json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .log_internal_errors(false)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

/// Write one line to stderr, ignoring a failure: for what a serving binary prints beside its
/// logs (its probe URLs), where `eprintln!` would panic on a broken pipe.
pub fn note(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut err = std::io::stderr().lock();
    let _ = err.write_fmt(line);
    let _ = err.write_all(b"\n");
}

/// Cancel `shutdown` on SIGTERM or SIGINT (both binaries' graceful shutdown). The handlers are
/// registered before this returns (not in the spawned task), so a signal sent right after is
/// never lost to the default action.
pub fn spawn_signal_handler(shutdown: CancellationToken) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::warn!("cannot install signal handlers");
        return;
    };
    let shutdown = std::sync::Arc::new(shutdown);
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::info!("signal received: shutting down");
        shutdown.cancel();
    });
}
