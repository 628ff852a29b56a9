//! The `execrelay` command line: `serve`, `run`, `demo`. `main.rs` only calls [`main`].

pub mod duration;
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
    Serve(Box<serve::ServeArgs>),
    /// Run a command on a server, like `ssh host cmd`.
    Run(run::RunArgs),
    /// Start a local server and run a demo command through it.
    Demo(run::DemoArgs),
    /// Generate a static X25519 key pair: NAME (private, mode 0600) and NAME.pub.
    Keygen(KeygenArgs),
}

/// Flags of `execrelay keygen`.
#[derive(Debug, clap::Args)]
pub struct KeygenArgs {
    /// Where to write the private key; the public key goes to NAME.pub.
    #[arg(short = 'o', long = "output", value_name = "NAME")]
    pub output: std::path::PathBuf,
    /// Comment on the public key line [default: user@host].
    #[arg(short = 'c', long)]
    pub comment: Option<String>,
}

fn keygen(args: KeygenArgs) -> i32 {
    let comment = args.comment.unwrap_or_else(|| {
        let user = std::env::var("USER").unwrap_or_else(|_| "user".into());
        let host = nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .unwrap_or_else(|| "host".into());
        format!("{user}@{host}")
    });
    let kp = match crate::noise::keys::Keypair::generate() {
        Ok(k) => k,
        Err(e) => {
            eprintln!("execrelay keygen: {e}");
            return 1;
        }
    };
    match kp.write(&args.output, &comment) {
        Ok(()) => {
            println!("{}", crate::noise::keys::public_line(&kp.public, &comment));
            0
        }
        Err(e) => {
            eprintln!("execrelay keygen: {e}");
            1
        }
    }
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

/// Entry point of the binary; returns the process exit code.
pub fn main() -> i32 {
    tune_allocator();
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => serve::main(*args),
        Command::Run(args) => run::main(args),
        Command::Demo(args) => run::demo_main(args),
        Command::Keygen(args) => keygen(args),
    }
}

/// Install the tracing subscriber: stderr, `RUST_LOG` (default `default`), text or JSON.
pub use execrelay_relay::server::cli::init_logging;
