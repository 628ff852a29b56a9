//! The built binary: running it to completion, `serve`'s first line (its bound URL), a
//! [`RawClient`] over a WebSocket to it, and raw HTTP exchanges with its listener.

use std::process::{Output, Stdio};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

use execrelay::transport::Transport;

use super::{bin, RawClient, GUARD};

/// Run `cmd` to completion within [`GUARD`]: stdin null, stdout and stderr piped, killed if
/// the test gives up on it.
pub async fn output_of(cmd: &mut Command) -> Output {
    output_with_stdin(cmd, Stdio::null()).await
}

/// [`output_of`], with `stdin` as the command's stdin (a file, a pipe).
pub async fn output_with_stdin(cmd: &mut Command, stdin: impl Into<Stdio>) -> Output {
    let child = cmd
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the command");
    tokio::time::timeout(GUARD, child.wait_with_output())
        .await
        .expect("the command did not exit (hang guard)")
        .expect("wait for the command")
}

/// `execrelay serve --listen LISTEN`: stdin null, stdout piped, stderr to `stderr`, killed
/// on drop. The caller adds arguments and environment.
pub fn serve_cmd(listen: &str, stderr: impl Into<Stdio>) -> Command {
    let mut c = Command::new(bin());
    c.args(["serve", "--listen", listen])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .kill_on_drop(true);
    c
}

/// The first line of `child`'s stdout within `limit` (`serve` prints its bound URL there;
/// `None` if stdout closed first), and the rest of its stdout, to keep open so that the
/// server never writes to a closed pipe.
pub async fn first_line(
    child: &mut Child,
    limit: Duration,
) -> (Option<String>, Lines<BufReader<ChildStdout>>) {
    let mut lines = BufReader::new(child.stdout.take().expect("stdout is piped")).lines();
    let first = tokio::time::timeout(limit, lines.next_line())
        .await
        .expect("no first line on stdout (hang guard)")
        .expect("read stdout");
    (first, lines)
}

/// A `RawClient` over a WebSocket transport: a pair of tasks turn messages into lines.
pub fn ws_client(t: Transport) -> RawClient {
    let (near, far) = tokio::io::duplex(1 << 20);
    let (far_r, mut far_w) = tokio::io::split(far);
    let Transport {
        mut incoming,
        mut outgoing,
        ..
    } = t;
    tokio::spawn(async move {
        while let Some(Ok(m)) = incoming.next().await {
            if far_w.write_all(&m).await.is_err() || far_w.write_all(b"\n").await.is_err() {
                break;
            }
        }
        let _ = far_w.shutdown().await;
    });
    tokio::spawn(async move {
        let mut lines = BufReader::new(far_r).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if outgoing.send(line.into()).await.is_err() {
                break;
            }
        }
        let _ = outgoing.close().await;
    });
    let (r, w) = tokio::io::split(near);
    RawClient::new(r, w)
}

/// Send `request` as raw bytes to `addr` and read the whole answer until the server closes.
pub async fn http_exchange(addr: &str, request: &str) -> String {
    let mut tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    tcp.write_all(request.as_bytes()).await.expect("write");
    let mut response = Vec::new();
    tokio::time::timeout(GUARD, tcp.read_to_end(&mut response))
        .await
        .expect("the server answers and closes")
        .expect("read");
    String::from_utf8_lossy(&response).into_owned()
}
