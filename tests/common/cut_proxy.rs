//! A TCP proxy on 127.0.0.1 that a test can cut (every connection dropped, new ones refused
//! at once) and restore, and whose destination it can change: the network failures a client
//! must resume through, or give up on with the right words.

use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// The proxy; dropping it stops it.
pub struct CutProxy {
    /// The port clients connect to.
    pub port: u16,
    up: Arc<AtomicBool>,
    to: Arc<AtomicU16>,
    /// Bumped on every cut: live connections watch it and drop.
    cuts: watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.task.abort();
        self.cut();
    }
}

impl CutProxy {
    /// A proxy to `127.0.0.1:to`, up.
    pub async fn start(to: u16) -> CutProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().unwrap().port();
        let up = Arc::new(AtomicBool::new(true));
        let dest = Arc::new(AtomicU16::new(to));
        let (cuts, _) = watch::channel(0u64);
        let (u, d, c) = (up.clone(), dest.clone(), cuts.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                if !u.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let port = d.load(Ordering::SeqCst);
                let mut cut = c.subscribe();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(("127.0.0.1", port)).await else {
                        return;
                    };
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    tokio::select! {
                        _ = tokio::io::copy(&mut cr, &mut sw) => {}
                        _ = tokio::io::copy(&mut sr, &mut cw) => {}
                        _ = cut.changed() => {}
                    }
                });
            }
        });
        CutProxy {
            port,
            up,
            to: dest,
            cuts,
            task,
        }
    }

    /// `ws://127.0.0.1:PORT` (or another scheme's form) through the proxy.
    pub fn url(&self, scheme: &str) -> String {
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// Drop every connection and refuse new ones until [`restore`](Self::restore).
    pub fn cut(&self) {
        self.up.store(false, Ordering::SeqCst);
        self.cuts.send_modify(|n| *n += 1);
    }

    /// Accept connections again.
    pub fn restore(&self) {
        self.up.store(true, Ordering::SeqCst);
    }

    /// Send new connections to `127.0.0.1:port` from now on.
    pub fn redirect(&self, port: u16) {
        self.to.store(port, Ordering::SeqCst);
    }
}
