//! The chaos soak and its tools, one binary (`cargo bench --bench soak -- COMMAND`; the
//! scripts `benches/soak.sh` and `benches/load.sh` build and run it):
//!
//! - `run`: the soak (`soak.rs`): a relay, two exec servers, clients through fault proxies,
//!   the stall detector, the end checks.
//! - `load`: 1,000 processes from 50 clients through one relay, with the latency of
//!   `process/terminate` and of a small run under that load and on an idle server (`load.rs`).
//! - `proxy`: one fault proxy on its own, from a seed (`proxy.rs`): to replay a link's faults
//!   in front of anything.
//! - `capture`: the fuzz targets' seed corpus from real traffic (`capture.rs`).
//! - `child`, `sleep`: the processes the soak and the load run (`child.rs`).
//!
//! A bench target, not a binary of the crate: it is a tool for this repository, built on
//! demand (in release, like every benchmark), and it may use the dev-dependencies.

mod capture;
mod child;
mod deploy;
mod load;
mod proxy;
mod rng;
mod soak;
mod stall;
mod verify;
mod workload;

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "soak",
    about = "execrelay's chaos soak, load benchmark and their tools"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// The chaos soak (see benches/soak.sh).
    Run(soak::SoakArgs),
    /// The load benchmark (see benches/load.sh).
    Load(load::LoadArgs),
    /// One fault proxy, from a seed, until interrupted.
    Proxy(ProxyArgs),
    /// Write the fuzz targets' seed corpus from real traffic.
    Capture(capture::CaptureArgs),
    /// A process of the soak (see child.rs).
    Child(child::ChildArgs),
    /// Sleep this many seconds (the grandchild some children leave behind).
    Sleep {
        /// Seconds.
        secs: u64,
    },
}

/// `soak proxy`'s flags.
#[derive(clap::Args)]
struct ProxyArgs {
    /// Where to listen (loopback only; port 0 picks one, printed first).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Where to connect (loopback only).
    #[arg(long)]
    upstream: SocketAddr,
    /// The seed of its faults.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Its name (part of each connection's seed, and of each log line).
    #[arg(long, default_value = "proxy")]
    name: String,
    /// Mean quiet spell between two faults on one connection (s).
    #[arg(long, default_value_t = 20.0)]
    mean_gap_s: f64,
    /// The pong timeout of the links it carries (ms).
    #[arg(long, default_value_t = 30_000)]
    pong_ms: u64,
    /// The fault log (default: stderr is not used; this file).
    #[arg(long, default_value = "faults.log")]
    log: std::path::PathBuf,
}

fn main() {
    // `cargo bench` passes `--bench` to every bench binary.
    let args: Vec<String> = std::env::args().filter(|a| a != "--bench").collect();
    let cli = Cli::parse_from(args);
    let code = match cli.cmd {
        Cmd::Child(a) => child::main(&a),
        Cmd::Sleep { secs } => child::sleep(secs),
        Cmd::Run(a) => runtime(soak::run(a)),
        Cmd::Load(a) => runtime(load::run(a)),
        Cmd::Capture(a) => runtime(capture::run(a)),
        Cmd::Proxy(a) => runtime(async move {
            let log = proxy::FaultLog::create(&a.log, std::time::Instant::now())?;
            let p = proxy::Proxy::start(
                &a.name,
                a.listen,
                a.upstream,
                a.seed,
                proxy::FaultPlan::new(
                    Duration::from_secs_f64(a.mean_gap_s),
                    Duration::from_millis(a.pong_ms),
                ),
                log.clone(),
            )
            .await?;
            println!("{}", p.addr);
            loop {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => break,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => log.flush(),
                }
            }
            log.flush();
            Ok(0)
        }),
    };
    std::process::exit(code);
}

fn runtime(f: impl std::future::Future<Output = anyhow::Result<i32>>) -> i32 {
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("soak: cannot start a runtime: {e}");
            return 2;
        }
    };
    match rt.block_on(f) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("soak: {e:#}");
            2
        }
    }
}
