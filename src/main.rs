//! The `execrelay` binary: parse the command line and hand over to the library, with the
//! relay `execrelay demo` runs in process.
//!
//! The relay server (`execrelay-relay`) is linked here, in the binary, and only with the
//! `demo` feature (on by default): the library never imports it (`tests/crates.rs`).

fn main() {
    std::process::exit(execrelay::cli::main(demo_relay()));
}

/// The demo's relay: the relay server with default settings, on the listener the demo bound.
#[cfg(feature = "demo")]
fn demo_relay() -> Option<execrelay::cli::demo::DemoRelay> {
    use execrelay::cli::demo::DemoRelayConfig;
    use std::future::Future;
    use std::pin::Pin;

    fn start(c: DemoRelayConfig) -> Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>> {
        Box::pin(async move {
            let environments =
                execrelay_protocol::keys::environments::EnvironmentsFile::load(&c.environments)?;
            let config = execrelay_relay::server::RelayServerConfig {
                keys: c.keys,
                environments,
                settings: execrelay_relay::server::settings::RelaySettings::default(),
            };
            execrelay_relay::server::run(c.listener, config, c.stop).await?;
            Ok(())
        })
    }
    Some(start)
}

/// Built without the `demo` feature: `execrelay demo` explains how to get a relay.
#[cfg(not(feature = "demo"))]
fn demo_relay() -> Option<execrelay::cli::demo::DemoRelay> {
    None
}
