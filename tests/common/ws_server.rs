//! An in-process server (`Server`, the production one) on a `ws://` listener, for the tests
//! that drive it with the client library over a real WebSocket, and the held `sha256sum`
//! child those tests upload to.

use execrelay::client::{Client, ClientOptions, Target};
use execrelay::config::ServerConfig;
use execrelay::server::{Listener, Server};
use tokio_util::sync::CancellationToken;

use super::{sha256, stdout_and_code, text, PROMPT};

/// An in-process server with a `ws://` listener.
pub struct WsServer {
    /// Its `ws://` URL.
    pub url: String,
    /// Its registry: metrics and sessions.
    pub registry: std::sync::Arc<execrelay::session::session_registry::SessionRegistry>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl WsServer {
    /// Serve `cfg` on a WebSocket listener on 127.0.0.1.
    pub async fn start(cfg: ServerConfig) -> WsServer {
        let ws = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("ws://{}", ws.local_addr().unwrap());
        let shutdown = CancellationToken::new();
        let server = Server::new(std::sync::Arc::new(cfg)).expect("server starts");
        let registry = server.registry().clone();
        let task = tokio::spawn(server.run(vec![Listener::Ws(ws)], shutdown.clone()));
        WsServer {
            url,
            registry,
            shutdown,
            task,
        }
    }

    /// A client of this server with `opts`.
    pub async fn client(&self, opts: ClientOptions) -> Client {
        Client::connect(Target::Ws(self.url.clone()), opts)
            .await
            .expect("connect")
    }

    /// Requests this server refused for `limit` (`execrelay_limit_refusals_total`).
    pub fn refusals(&self, limit: &'static str) -> u64 {
        use execrelay::metrics::RefusedLimitLabel;
        self.registry
            .metrics()
            .limit_refusals
            .get_or_create(&RefusedLimitLabel { limit })
            .get()
    }

    /// Requests refused for one of the byte budgets.
    pub fn byte_refusals(&self) -> u64 {
        self.refusals("maxPendingRequestBytes") + self.refusals("maxInboundBytes")
    }

    /// Stop it and wait for its task.
    pub async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(PROMPT, self.task)
            .await
            .expect("server stops")
            .expect("server task");
    }
}

/// `proc` (a `sha256sum` of its stdin) exits 0 and prints the hash of `sent`: every byte
/// arrived once, in order (`what` names the case).
pub async fn sha256sum_of_all(
    proc: &mut execrelay::client::ProcessHandle,
    sent: &[u8],
    what: &str,
) {
    let (out, code) = stdout_and_code(proc).await;
    assert_eq!(code, Some(0), "{what}");
    assert_eq!(
        text(&out).split_whitespace().next(),
        Some(sha256(sent).as_str()),
        "{what}"
    );
}

/// A child held on `fifo` (it reads nothing until released), then `sha256sum` of its stdin.
pub fn held_sha256sum(fifo: &std::path::Path) -> Vec<String> {
    vec![
        "sh".into(),
        "-c".into(),
        r#"read -r _ < "$0"; exec sha256sum"#.into(),
        fifo.to_str().unwrap().into(),
    ]
}
