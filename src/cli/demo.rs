//! `execrelay demo`: the whole path on one machine (throwaway keys, a relay in this process,
//! an exec server registered with it, a client through it), ending with the demo command's
//! own exit status and words (`exited with status 7`, `killed by SIGKILL`).
//!
//! The relay is the `execrelay-relay` crate's server, which this library never links: the
//! `execrelay` binary (built with the `demo` feature, on by default) hands it in as a
//! [`DemoRelay`]. A build without the feature says so and how to get one.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use clap::Args;

use super::outcome::{how, plain_status};
use crate::client::{Client, ClientOptions, ProcessEvent, StartOptions, Target};

/// Flags of `execrelay demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Command to run instead of the built-in demo script.
    #[arg(last = true)]
    pub argv: Vec<String>,
}

/// What the demo's relay is given: a bound listener, the relay's keys, the environments file
/// that lists the demo's exec server, and the token that stops it.
pub struct DemoRelayConfig {
    /// The relay's listener, bound to a free port of 127.0.0.1.
    pub listener: tokio::net::TcpListener,
    /// The relay's static key pair.
    pub keys: crate::noise::keys::Keypair,
    /// The environments file (one line: the demo's environment id and exec server key).
    pub environments: std::path::PathBuf,
    /// Cancelled when the demo is done; the relay then shuts down and its future ends.
    pub stop: tokio_util::sync::CancellationToken,
}

/// Runs the demo's relay until its stop token is cancelled. The `execrelay` binary passes
/// one that runs `execrelay_relay::server::run` when built with the `demo` feature.
pub type DemoRelay =
    fn(DemoRelayConfig) -> Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>>;

/// The exit code of `demo` in a build without a relay (as for a usage error).
pub const NO_RELAY_EXIT: i32 = 2;

/// `execrelay demo`: the whole path on one machine. Throwaway keys; a relay in this process
/// (`relay`, from the binary); an exec server (`execrelay serve --relay …`, a child process)
/// registered with it; and the demo client running a command through the relay over Noise.
pub fn demo_main(args: DemoArgs, relay: Option<DemoRelay>) -> i32 {
    let Some(relay) = relay else {
        eprintln!(
            "execrelay demo: this execrelay was built without the `demo` feature, so it has no \
             relay to run in process; rebuild with `cargo build --features demo` (on by default), \
             or start `execrelay-relay` and `execrelay serve --relay` yourself (README)"
        );
        return NO_RELAY_EXIT;
    };
    // The relay's own link notices (a link closing at shutdown) are not the demo's story.
    crate::cli::init_logging(
        "warn,execrelay_relay=error,execrelay_io=error,execrelay_protocol=error",
        false,
    );
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("execrelay demo: {e}");
            return 1;
        }
    };
    match rt.block_on(demo(args, relay)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("execrelay demo: {e}");
            1
        }
    }
}

/// How long the demo waits for the exec server to register with the relay.
const DEMO_REGISTER_TIMEOUT: Duration = Duration::from_secs(15);

async fn demo(args: DemoArgs, start_relay: DemoRelay) -> anyhow::Result<i32> {
    use crate::link::client::{LinkPool, NoiseClientConfig};
    use crate::noise::keys::{fingerprint, public_line, Keypair};
    use tokio::io::AsyncBufReadExt;

    // 1. Throwaway keys, as `execrelay keygen` writes them.
    let dir = std::env::temp_dir().join(format!("execrelay-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    struct Cleanup(std::path::PathBuf);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _cleanup = Cleanup(dir.clone());
    let (relay_keys, server_keys, client_keys) = (
        Keypair::generate()?,
        Keypair::generate()?,
        Keypair::generate()?,
    );
    relay_keys.write(&dir.join("relay"), "demo-relay")?;
    server_keys.write(&dir.join("server"), "demo-server")?;
    let env_id = "demo";
    std::fs::write(
        dir.join("environments"),
        format!(
            "{env_id} {}\n",
            public_line(&server_keys.public, "demo-server")
        ),
    )?;
    std::fs::write(
        dir.join("authorized_keys"),
        format!("{}\n", public_line(&client_keys.public, "demo-client")),
    )?;
    println!(
        "demo: keys in {} (relay, exec server, client; deleted at the end)",
        dir.display()
    );

    // 2. The relay, in this process.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let relay_url = format!("ws://{}", listener.local_addr()?);
    let relay_stop = tokio_util::sync::CancellationToken::new();
    let relay = tokio::spawn(start_relay(DemoRelayConfig {
        listener,
        keys: relay_keys.clone(),
        environments: dir.join("environments"),
        stop: relay_stop.clone(),
    }));
    println!(
        "demo: relay listening on {relay_url} (key {}); it routes frames and reads none",
        fingerprint(&relay_keys.public)
    );

    // 3. The exec server, a child process that dials out to the relay.
    let exe = std::env::current_exe()?;
    let mut cmd = tokio::process::Command::new(exe);
    if std::env::var_os("RUST_LOG").is_none() {
        // Keep the demo's own output readable; RUST_LOG=info shows the server's logs.
        cmd.env("RUST_LOG", "warn");
    }
    let mut server = cmd
        .arg("serve")
        .args(["--relay", &relay_url, "--environment-id", env_id])
        .arg("--relay-key")
        .arg(dir.join("relay.pub"))
        .arg("--key")
        .arg(dir.join("server"))
        .arg("--authorized-keys")
        .arg(dir.join("authorized_keys"))
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| anyhow::anyhow!("cannot start the exec server: {e}"))?;
    let out = server
        .stdout
        .take()
        .ok_or_else(|| anyhow::anyhow!("no stdout"))?;
    let mut lines = tokio::io::BufReader::new(out).lines();
    let url = lines
        .next_line()
        .await?
        .ok_or_else(|| anyhow::anyhow!("the exec server did not print its URL"))?;
    println!(
        "demo: exec server (pid {}) dialled out as environment {env_id:?}; clients reach it at {url}",
        server.id().unwrap_or(0)
    );

    // 4. The client, through the relay, end to end encrypted to the exec server's key.
    let config = NoiseClientConfig::new(client_keys, server_keys.public);
    let target = Target::Noise {
        url: url.clone(),
        config: std::sync::Arc::new(config),
        pool: LinkPool::new(),
    };
    let deadline = tokio::time::Instant::now() + DEMO_REGISTER_TIMEOUT;
    let client = loop {
        match Client::connect(target.clone(), ClientOptions::default()).await {
            Ok(c) => break c,
            // The exec server may not have registered yet.
            Err(e)
                if tokio::time::Instant::now() < deadline && e.to_string().contains("offline") =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e.into()),
        }
    };
    println!(
        "demo: client -> relay -> exec server: Noise_IK stream open, session {}",
        client.session_id().unwrap_or_default()
    );
    let argv = if args.argv.is_empty() {
        vec![
            "sh".to_string(),
            "-c".to_string(),
            "for i in 1 2 3 4 5; do echo \"tick $i from pid $$\"; sleep 0.2; done; echo 'a line on stderr' >&2".to_string(),
        ]
    } else {
        args.argv
    };
    println!("demo: running {argv:?}");
    let mut p = client.start(StartOptions::new("demo-1", argv)).await?;
    // 255 (as `run`) if no exit notice comes: the session was lost.
    let mut status = super::failure::NOT_THE_COMMAND;
    while let Some(ev) = p.next_event().await {
        match ev {
            ProcessEvent::Output { stream, data } => {
                for line in String::from_utf8_lossy(&data).lines() {
                    println!("[{}] {line}", stream.as_str());
                }
            }
            ProcessEvent::Lost { from, to } => println!("[lost] events {from}..={to}"),
            ProcessEvent::Omitted {
                stream,
                omitted_bytes,
            } => {
                println!("[{}] ({omitted_bytes} bytes omitted)", stream.as_str())
            }
            ProcessEvent::Exited(info) => {
                println!(
                    "demo: the command {} ({} bytes on stdout, {} on stderr, in {} ms)",
                    how(&info),
                    info.stdout_bytes,
                    info.stderr_bytes,
                    info.duration_ms
                );
                status = plain_status(&info);
                break;
            }
        }
    }
    client.shutdown().await;
    if let Some(pid) = server.id() {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    let _ = tokio::time::timeout(Duration::from_secs(10), server.wait()).await;
    relay_stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(10), relay).await;
    println!("demo: done (every byte between client and exec server crossed the relay encrypted)");
    Ok(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A build without the `demo` feature has no relay to hand in: `demo` refuses at once
    /// (before making keys or starting a server) with the usage-error status.
    #[test]
    fn without_a_relay_demo_exits_2_before_starting_anything() {
        let args = DemoArgs { argv: Vec::new() };
        assert_eq!(demo_main(args, None), NO_RELAY_EXIT);
        assert_eq!(NO_RELAY_EXIT, 2);
    }
}
