//! Where the server is ([`Target`]), and opening one transport to it: a spawned stdio server,
//! a plain WebSocket, or a virtual stream on a shared Noise link. It never retries: waiting
//! for an offline environment on the first connection and resuming are the session's
//! (`establish.rs`, `supervise.rs`).

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;

use super::ClientError;
use crate::transport::stdio::line_transport;
use crate::transport::Transport;

/// Where the server is.
#[derive(Debug, Clone)]
pub enum Target {
    /// Spawn `program args…` and speak over its stdin/stdout (e.g. `execrelay serve --listen
    /// stdio`). The server lives as long as the connection: no reconnection.
    Spawn {
        /// Program.
        program: PathBuf,
        /// Arguments.
        args: Vec<String>,
    },
    /// A plain WebSocket URL, `ws://HOST:PORT` (or `wss://`, trusting the platform's roots).
    Ws(String),
    /// A Noise-encrypted server, `noise+ws://HOST:PORT`: one virtual stream on a physical
    /// link shared with every other client of the same `pool` talking to the same server
    /// with the same keys (clones of a target share its pool).
    Noise {
        /// `noise+ws://HOST:PORT`.
        url: String,
        /// Keys and pinned server key.
        config: Arc<crate::link::client::NoiseClientConfig>,
        /// The links this client may share (a fresh pool: a link of its own).
        pool: crate::link::client::LinkPool,
    },
}

impl Target {
    /// Spawn this very binary as a stdio server.
    pub fn local() -> Result<Target, ClientError> {
        let exe = std::env::current_exe().map_err(|e| ClientError::Connect(e.to_string()))?;
        Ok(Target::Spawn {
            program: exe,
            args: vec!["serve".into(), "--listen".into(), "stdio".into()],
        })
    }

    pub(super) fn can_reconnect(&self) -> bool {
        matches!(self, Target::Ws(_) | Target::Noise { .. })
    }
}

pub(super) async fn open_transport(target: &Target, max: usize) -> Result<Transport, ClientError> {
    match target {
        Target::Spawn { program, args } => {
            let mut cmd = tokio::process::Command::new(program);
            cmd.args(args);
            // A local server is plumbing: keep its logs to warnings unless asked otherwise.
            if std::env::var_os("RUST_LOG").is_none() {
                cmd.env("RUST_LOG", "warn");
            }
            // Its own process group: a Ctrl-C at the terminal is the client's to forward,
            // not a shutdown request for the server.
            cmd.process_group(0);
            let mut child = cmd
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .kill_on_drop(true)
                .spawn()
                .map_err(|e| ClientError::Connect(format!("{}: {e}", program.display())))?;
            let stdin = child
                .stdin
                .take()
                .ok_or_else(|| ClientError::Connect("no stdin".into()))?;
            let stdout = child
                .stdout
                .take()
                .ok_or_else(|| ClientError::Connect("no stdout".into()))?;
            // Reap the server when it exits; kill_on_drop covers an abandoned client.
            tokio::spawn(async move {
                let _ = child.wait().await;
            });
            Ok(line_transport(stdout, stdin, max, "spawned server"))
        }
        Target::Ws(url) => {
            // `wss://` trusts the platform's roots, as the relay dialers do by default.
            let tls = match url.starts_with("wss://") {
                true => Some(
                    crate::link::trust::TlsRoots::Platform
                        .client_config()
                        .map_err(|e| ClientError::Connect(e.to_string()))?,
                ),
                false => None,
            };
            crate::transport::websocket::connect_websocket_with_tls(url, max, tls)
                .await
                .map_err(|e| ClientError::Connect(e.to_string()))
        }
        Target::Noise { url, config, pool } => {
            use crate::link::client::NoiseError;
            let link = pool.link(url, config).await.map_err(|e| match e {
                NoiseError::EnvironmentRevoked(_) => ClientError::Revoked(e.to_string()),
                e => ClientError::Connect(e.to_string()),
            })?;
            match link.open_stream_with(config.suite).await {
                Ok(t) => Ok(t),
                // A refusal is final: retrying the same keys will not help.
                Err(
                    e @ (NoiseError::Refused(_)
                    | NoiseError::ServerKey
                    | NoiseError::UnsupportedSuite(_)),
                ) => Err(ClientError::Refused(e.to_string())),
                Err(e @ NoiseError::EnvironmentRevoked(_)) => {
                    Err(ClientError::Revoked(e.to_string()))
                }
                Err(e) => match &e {
                    NoiseError::EnvironmentOffline(environment, _)
                    | NoiseError::Moved(environment) => Err(ClientError::EnvironmentOffline {
                        environment: environment.clone(),
                        why: e.to_string(),
                    }),
                    _ => Err(ClientError::Connect(e.to_string())),
                },
            }
        }
    }
}
