//! A TCP proxy on loopback that holds every chunk for a fixed one-way delay in each
//! direction: a far client (a round trip of tens of milliseconds) on one machine, for the
//! benchmark of the stream window (`BENCH_RTT_MS`). The kernel's `netem` would do this, but it
//! is not on every machine (nor in this one's kernel); a proxy needs nothing installed.
//!
//! Bytes are never reordered or dropped; the delay is added to whatever the proxy's own
//! hops cost (two loopback sockets and a task each way).

use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

/// Chunks held per direction at once: the link's flow control (the stream window) bounds what
/// is in flight; this only keeps a runaway sender from growing the proxy without bound.
const HELD_CHUNKS: usize = 4096;

/// Listen on `127.0.0.1:0`, forwarding each connection to `127.0.0.1:upstream` with `one_way`
/// delay each way. Returns the port; the proxy lives as long as the runtime.
pub async fn start(upstream: u16, one_way: Duration) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        while let Ok((down, _)) = listener.accept().await {
            let Ok(up) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                continue;
            };
            let _ = down.set_nodelay(true);
            let _ = up.set_nodelay(true);
            let (dr, dw) = down.into_split();
            let (ur, uw) = up.into_split();
            tokio::spawn(pipe(dr, uw, one_way));
            tokio::spawn(pipe(ur, dw, one_way));
        }
    });
    port
}

/// One direction: each chunk read is written `one_way` after it was read.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    one_way: Duration,
) {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(Instant, Bytes)>(HELD_CHUNKS);
    let reader = tokio::spawn(async move {
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    let chunk = Bytes::copy_from_slice(&buf[..n]);
                    if tx.send((Instant::now() + one_way, chunk)).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
    while let Some((due, chunk)) = rx.recv().await {
        tokio::time::sleep_until(due).await;
        if to.write_all(&chunk).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
    reader.abort();
}
