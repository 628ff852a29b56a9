//! A scripted JSON-RPC server over WebSocket, for the client library's tests of what a server
//! says, or when: each test gives the answer to each request, per connection
//! (`tests/client_odd_servers.rs`, `tests/client_retries.rs`).

use std::sync::Arc;

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;

/// What the fake server does with one request.
pub enum Act {
    /// Send these messages (answers or notifications), in order.
    Send(Vec<Value>),
    /// Close the connection without answering (the request was applied, say).
    Drop,
}

/// A request the fake server saw: its connection (1 for the first) and method.
pub type Seen = (usize, String);

/// A WebSocket server that runs `script` on each request (`conn`, the request) and reports
/// every request it saw on the returned channel, before acting on it.
pub async fn fake_server(
    script: impl Fn(usize, &Value) -> Act + Send + Sync + 'static,
) -> (String, mpsc::UnboundedReceiver<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    let (seen_tx, seen) = mpsc::unbounded_channel();
    let script = Arc::new(script);
    tokio::spawn(async move {
        let mut conn = 0;
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            conn += 1;
            let Ok(mut ws) = tokio_tungstenite::accept_async(tcp).await else {
                continue;
            };
            let (script, seen_tx) = (script.clone(), seen_tx.clone());
            tokio::spawn(async move {
                while let Some(Ok(m)) = ws.next().await {
                    let Message::Text(text) = m else { continue };
                    let Ok(v) = serde_json::from_str::<Value>(&text) else {
                        continue;
                    };
                    let Some(method) = v["method"].as_str() else {
                        continue;
                    };
                    let _ = seen_tx.send((conn, method.to_string()));
                    match script(conn, &v) {
                        Act::Send(msgs) => {
                            for m in msgs {
                                if ws.send(Message::Text(m.to_string().into())).await.is_err() {
                                    return;
                                }
                            }
                        }
                        Act::Drop => return,
                    }
                }
            });
        }
    });
    (url, seen)
}

/// The answer to `request`.
pub fn answer(request: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": request["id"], "result": result})
}

/// `initialize`'s answer on connection `conn`, saying `max_message` bytes.
pub fn initialized(conn: usize, request: &Value, max_message: u64) -> Act {
    Act::Send(vec![answer(
        request,
        json!({
            "protocolVersion": 1, "serverVersion": "fake", "sessionId": "s",
            "resumeToken": "t", "resumed": conn > 1,
            "limits": {"maxMessageBytes": max_message, "maxProcesses": 8,
                "retainedOutputBytes": 8388608, "detachedSessionTtlMs": 60000},
            "capabilities": {"acks": true, "binaryOutput": false,
                "retryRefusedWrites": true}}),
    )])
}
