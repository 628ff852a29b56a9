//! What both server binaries (`execrelay serve`, `execrelay-relay`) do around their servers:
//! logs on stderr ([`init_logging`]) and graceful shutdown on SIGTERM/SIGINT
//! ([`spawn_signal_handler`]), so that both log and stop alike.
//!
//! It owns process-wide set-up only; it must never know a server, a setting or a route.

use tokio_util::sync::CancellationToken;

/// Install the tracing subscriber: stderr, `RUST_LOG` (default `default`), text or JSON. Both
/// binaries use it, so both log alike.
pub fn init_logging(default: &str, json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
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
