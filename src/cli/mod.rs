//! The `execrelay` command line: `serve`, `run`, `demo`. `main.rs` only calls [`main`].

pub mod run;
pub mod serve;

use clap::{Parser, Subcommand};

/// execrelay: run processes on a host over JSON-RPC.
#[derive(Debug, Parser)]
#[command(name = "execrelay", version, about)]
pub struct Cli {
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run an exec server.
    Serve(serve::ServeArgs),
    /// Run a command on a server, like `ssh host cmd`.
    Run(run::RunArgs),
    /// Start a local server and run a demo command through it.
    Demo(run::DemoArgs),
}

/// Entry point of the binary; returns the process exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => serve::main(args),
        Command::Run(args) => run::main(args),
        Command::Demo(args) => run::demo_main(args),
    }
}

/// Install the tracing subscriber: stderr, `RUST_LOG` (default `default`), text or JSON.
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
