//! The `execrelay` command line: `serve`, `run`, `attach`, `ps`, `kill`, `cp`, `keygen`,
//! `demo`. `main.rs` only calls [`main`].
//!
//! Layout: one file per command (`serve.rs`, `run.rs`, `detached.rs` for `run --detach`,
//! `attach`, `ps` and `kill`, `cp.rs`, `keygen.rs`, `demo.rs`) and what they share:
//! `words.rs` (where `run`'s options end and its command begins), `connect.rs` and `hosts.rs`
//! (a target and the key flags → the library's `Target`, host aliases from the configuration
//! file), `failure.rs` and `outcome.rs` (exit statuses and their words), `show.rs` (a process's
//! events on the local terminal), `terminal.rs` (raw mode, size, the resume notices, approval
//! prompts), `duration.rs`. It holds no logic the
//! library lacks: everything it does to a server goes through `crate::client`.

pub mod connect;
pub mod cp;
pub mod demo;
pub mod detached;
pub mod duration;
pub mod failure;
pub mod hosts;
pub mod keygen;
pub mod outcome;
pub mod run;
pub mod serve;
pub mod show;
pub mod terminal;
pub mod words;

use std::ffi::OsString;

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
    Serve(Box<serve::ServeArgs>),
    /// Run a command on a server, as `ssh host cmd` does.
    Run(run::RunArgs),
    /// Show a detached command's output and wait for its end (Ctrl-C detaches again).
    Attach(detached::AttachArgs),
    /// List the detached commands this client started on a server.
    Ps(detached::PsArgs),
    /// Send a signal to a detached command.
    Kill(detached::KillArgs),
    /// Copy files and directories to or from a server (tar over an exec, as `kubectl cp`).
    Cp(cp::CpArgs),
    /// Start a local server and run a demo command through it.
    Demo(demo::DemoArgs),
    /// Make a key pair (NAME, mode 0600, and NAME.pub), or show a key's fingerprint (-l) or
    /// public line (-y).
    Keygen(keygen::KeygenArgs),
}

/// Keep freed memory in the process instead of handing it back to the kernel after every
/// large message: output moves through 64–88 KiB buffers, and glibc's default trim and mmap
/// thresholds made the kernel fault in and zero those pages again for every chunk.
pub fn tune_allocator() {
    const KEEP: libc::c_int = 64 * 1024 * 1024;
    // SAFETY: mallopt only adjusts allocator parameters; called before other threads start.
    unsafe {
        libc::mallopt(libc::M_TRIM_THRESHOLD, KEEP);
        libc::mallopt(libc::M_MMAP_THRESHOLD, KEEP);
    }
}

/// The words after `run` on the command line (what `run` reads again to find its command).
fn words_after_run(raw: &[OsString]) -> Vec<OsString> {
    match raw.iter().skip(1).position(|w| w == "run") {
        Some(i) => raw[i + 2..].to_vec(),
        None => Vec::new(),
    }
}

/// Entry point of the binary; returns the process exit code. `demo_relay` is the relay
/// `execrelay demo` runs in process (the binary's, with the `demo` feature), or `None`.
pub fn main(demo_relay: Option<demo::DemoRelay>) -> i32 {
    tune_allocator();
    let raw: Vec<OsString> = std::env::args_os().collect();
    let cli = Cli::parse_from(&raw);
    match cli.command {
        Command::Serve(args) => serve::main(*args),
        Command::Run(args) => run::main(args, &words_after_run(&raw)),
        Command::Attach(args) => detached::attach_main(args),
        Command::Ps(args) => detached::ps_main(args),
        Command::Kill(args) => detached::kill_main(args),
        Command::Cp(args) => cp::main(args),
        Command::Demo(args) => demo::demo_main(args, demo_relay),
        Command::Keygen(args) => keygen::main(args),
    }
}

/// Install the tracing subscriber: stderr, `RUST_LOG` (default `default`), text or JSON.
pub use execrelay_io::service::init_logging;
