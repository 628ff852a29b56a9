//! A remote process's events shown on the local terminal: its output to the local stdout and
//! stderr, omitted and lost ranges said on stderr, until its exit notice. Shared by `run` and
//! `attach` (`detached.rs`); it never decides an exit status (`outcome.rs` does).

use tokio::io::AsyncWriteExt;

use super::failure::say;
use crate::client::{ProcessEvent, ProcessHandle};
use crate::rpc::messages::{ExitInfo, StreamName};

/// Hand `proc`'s output to the local stdout and stderr until its exit notice (`Some`), or
/// until the session is lost (`None`). A local stdout that is gone (`| head`) terminates the
/// remote command. Omitted and lost ranges are said on stderr.
pub async fn show_events(proc: &mut ProcessHandle, tty: bool) -> Option<ExitInfo> {
    let mut stdout = tokio::io::stdout();
    let mut stderr = tokio::io::stderr();
    let mut ended = None;
    while let Some(ev) = proc.next_event().await {
        match ev {
            ProcessEvent::Output { stream, data } => {
                let r = match stream {
                    StreamName::Stderr => stderr.write_all(&data).await,
                    _ => {
                        let r = stdout.write_all(&data).await;
                        if tty {
                            let _ = stdout.flush().await;
                        }
                        r
                    }
                };
                if r.is_err() {
                    // Local stdout is gone (e.g. `| head`): stop the remote command.
                    let _ = proc.terminate(None).await;
                }
            }
            ProcessEvent::Omitted {
                stream,
                omitted_bytes,
            } => {
                let _ = stdout.flush().await;
                let _ = stderr.flush().await;
                say(&format!(
                    "{omitted_bytes} bytes of {} omitted here (--output-cap with --keep-tail); the last ones follow",
                    stream.as_str()
                ));
            }
            ProcessEvent::Lost { from, to } => {
                say(&format!(
                    "output events {from}..={to} were no longer held by the server"
                ));
            }
            ProcessEvent::Exited(info) => {
                if info.output_drain_timed_out {
                    tracing::warn!("output was cut at the drain deadline");
                }
                ended = Some(info);
                break;
            }
        }
    }
    let _ = stdout.flush().await;
    let _ = stderr.flush().await;
    ended
}
