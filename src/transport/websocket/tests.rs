use std::future::Future;
use std::net::SocketAddr;

use execrelay_io::http::FrameQueue;
use futures_util::StreamExt;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data as OpData, OpCode};
use tokio_tungstenite::tungstenite::protocol::frame::Frame;

use super::*;

/// Upper bound on any single awaited step, so a regression fails instead of hanging. It is
/// a guard, never a means of synchronisation.
const STEP_GUARD: Duration = Duration::from_secs(10);

async fn step<T>(future: impl Future<Output = T>) -> T {
    tokio::time::timeout(STEP_GUARD, future)
        .await
        .expect("test step did not finish in time")
}

/// The server end of the framing, on WebSockets accepted by tungstenite itself (the HTTP
/// front has its own tests; here only the framing is under test).
struct TestServer {
    addr: SocketAddr,
    transports: mpsc::UnboundedReceiver<Transport>,
    task: JoinHandle<()>,
}

impl TestServer {
    async fn start(max_message_bytes: usize) -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let (sender, transports) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            while let Ok((tcp, peer)) = listener.accept().await {
                let config = websocket_config(max_message_bytes);
                // As the HTTP front accepts them: over a read-ahead buffer and a frame
                // queue, so the server's messages take the queue's path.
                let stream = ReadAhead::new(FrameQueue::new(tcp));
                let ws = tokio_tungstenite::accept_async_with_config(stream, Some(config)).await;
                if let Ok(ws) = ws {
                    let _ = sender.send(framed(
                        ws,
                        Role::Server,
                        max_message_bytes,
                        peer.to_string(),
                    ));
                }
            }
        });
        TestServer {
            addr,
            transports,
            task,
        }
    }

    async fn next_transport(&mut self) -> Transport {
        step(self.transports.recv())
            .await
            .expect("server delivered a transport")
    }

    /// A raw tungstenite client connected to this server, and the server's transport.
    async fn connect_raw(
        &mut self,
    ) -> (
        tokio_tungstenite::WebSocketStream<
            tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
        >,
        Transport,
    ) {
        let (raw, _) = step(tokio_tungstenite::connect_async(format!(
            "ws://{}/",
            self.addr
        )))
        .await
        .expect("connect");
        (raw, self.next_transport().await)
    }

    fn stop(self) {
        self.task.abort();
    }
}

#[tokio::test]
async fn text_message_round_trip() {
    let mut server = TestServer::start(1024).await;
    let mut client = step(connect_websocket(
        &format!("ws://{}/any/path", server.addr),
        1024,
    ))
    .await
    .expect("connect");
    let mut accepted = server.next_transport().await;

    assert_eq!(client.peer, server.addr.to_string());
    let server_peer: SocketAddr = accepted.peer.parse().expect("peer is a socket address");
    assert!(server_peer.ip().is_loopback());

    step(client.outgoing.send(r#"{"id":1}"#.to_owned().into()))
        .await
        .expect("client send");
    let received = step(accepted.incoming.next()).await;
    assert_eq!(
        received.expect("a message").expect("framed"),
        &br#"{"id":1}"#[..]
    );

    step(
        accepted
            .outgoing
            .send(r#"{"id":1,"result":{}}"#.to_owned().into()),
    )
    .await
    .expect("server send");
    let reply = step(client.incoming.next()).await;
    assert_eq!(
        reply.expect("a message").expect("framed"),
        &br#"{"id":1,"result":{}}"#[..]
    );
    server.stop();
}

#[tokio::test]
async fn message_over_the_limit_is_too_large() {
    const LIMIT: usize = 1024;
    let mut server = TestServer::start(LIMIT).await;
    let url = format!("ws://{}/", server.addr);
    let mut client = step(connect_websocket(&url, 4 * LIMIT))
        .await
        .expect("connect");
    let mut accepted = server.next_transport().await;

    // Exactly at the limit is fine.
    step(client.outgoing.send("a".repeat(LIMIT).into()))
        .await
        .expect("send");
    let at_limit = step(accepted.incoming.next()).await;
    assert_eq!(at_limit.expect("a message").expect("framed").len(), LIMIT);

    // One byte more ends the connection.
    step(client.outgoing.send("a".repeat(LIMIT + 1).into()))
        .await
        .expect("send");
    match step(accepted.incoming.next()).await {
        Some(Err(FramingError::TooLarge { limit })) => assert_eq!(limit, LIMIT),
        other => panic!("expected TooLarge, got {other:?}"),
    }
    assert!(step(accepted.incoming.next()).await.is_none());

    // The server can still tell the client why before closing (protocol.md §1).
    let error = r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32600}}"#;
    step(accepted.outgoing.send(error.to_owned().into()))
        .await
        .expect("send the framing error");
    step(accepted.outgoing.close()).await.expect("close");
    let told = step(client.incoming.next()).await;
    assert_eq!(told.expect("a message").expect("framed"), error.as_bytes());
    server.stop();
}

#[tokio::test]
async fn fragmented_message_over_the_limit_is_too_large() {
    const LIMIT: usize = 1024;
    let mut server = TestServer::start(LIMIT).await;
    let (mut raw, mut accepted) = server.connect_raw().await;

    // Each fragment is under the limit; together they are over it.
    let first = Frame::message(vec![b'a'; 600], OpCode::Data(OpData::Text), false);
    let last = Frame::message(vec![b'a'; 600], OpCode::Data(OpData::Continue), true);
    step(raw.send(Message::Frame(first))).await.expect("send");
    step(raw.send(Message::Frame(last))).await.expect("send");
    match step(accepted.incoming.next()).await {
        Some(Err(FramingError::TooLarge { limit })) => assert_eq!(limit, LIMIT),
        other => panic!("expected TooLarge, got {other:?}"),
    }
    server.stop();
}

#[tokio::test]
async fn binary_message_is_accepted() {
    let mut server = TestServer::start(1024).await;
    let (mut raw, mut accepted) = server.connect_raw().await;

    let payload = vec![b'{', 0, 0x9f, 0xff, b'}'];
    step(raw.send(Message::Binary(payload.clone().into())))
        .await
        .expect("send");
    let received = step(accepted.incoming.next()).await;
    assert_eq!(received.expect("a message").expect("framed"), payload);
    server.stop();
}

/// A binary message leaves as one binary frame of its two parts joined, a text as a text
/// frame: a peer tells them apart by the frame's opcode.
#[tokio::test]
async fn a_binary_message_is_one_binary_frame() {
    let mut server = TestServer::start(1024).await;
    let (mut raw, mut accepted) = server.connect_raw().await;
    assert!(accepted.binary_messages);
    let message = OutMessage::Binary {
        head: bytes::Bytes::from_static(&[0, 1, 2]),
        payload: bytes::Bytes::from_static(b"payload"),
    };
    step(accepted.outgoing.send(message)).await.expect("send");
    step(accepted.outgoing.send("{}".to_owned().into()))
        .await
        .expect("send");
    match step(raw.next()).await {
        Some(Ok(Message::Binary(bytes))) => assert_eq!(bytes, &b"\x00\x01\x02payload"[..]),
        other => panic!("expected a binary frame, got {other:?}"),
    }
    match step(raw.next()).await {
        Some(Ok(Message::Text(text))) => assert_eq!(text, "{}"),
        other => panic!("expected a text frame, got {other:?}"),
    }
    server.stop();
}

#[tokio::test]
async fn ping_is_answered_while_the_server_only_reads() {
    let mut server = TestServer::start(1024).await;
    let (mut raw, mut accepted) = server.connect_raw().await;
    let reader = tokio::spawn(async move {
        while let Some(Ok(_)) = accepted.incoming.next().await {}
        accepted
    });

    step(raw.send(Message::Ping(Bytes::from_static(b"are you there"))))
        .await
        .expect("send ping");
    match step(raw.next()).await {
        Some(Ok(Message::Pong(payload))) => assert_eq!(payload, &b"are you there"[..]),
        other => panic!("expected a pong, got {other:?}"),
    }
    drop(raw);
    step(reader).await.expect("reader task");
    server.stop();
}

#[tokio::test]
async fn closing_the_sink_ends_the_peers_stream() {
    let mut server = TestServer::start(1024).await;
    // No path at all, as `execrelay serve` prints its URL.
    let mut client = step(connect_websocket(&format!("ws://{}", server.addr), 1024))
        .await
        .expect("connect");
    let mut accepted = server.next_transport().await;

    step(client.outgoing.close()).await.expect("close");
    assert!(step(accepted.incoming.next()).await.is_none());
    // The server answered the close frame; once it drops the connection the client's
    // stream ends cleanly too.
    drop(accepted);
    assert!(step(client.incoming.next()).await.is_none());
    server.stop();
}

/// The server's messages leave from their own buffers through the frame queue: messages on
/// both sides of the queue's copy threshold and of its write batch, text and binary,
/// arrive whole and in order while the client's pings are answered in between.
#[tokio::test]
async fn queued_messages_arrive_whole_and_in_order_between_pongs() {
    use execrelay_io::http::frame_queue::COPY_BELOW_BYTES;
    use execrelay_io::http::FRAME_QUEUE_BYTES;
    let mut server = TestServer::start(1024).await;
    let (raw, _) = step(tokio_tungstenite::connect_async(format!(
        "ws://{}/",
        server.addr
    )))
    .await
    .expect("connect");
    let (mut raw_tx, mut raw_rx) = raw.split();
    let accepted = server.next_transport().await;
    let (mut outgoing, mut incoming) = (accepted.outgoing, accepted.incoming);
    // The server's reader answers pings (tungstenite queues the pong as it reads).
    let reader = tokio::spawn(async move { while let Some(Ok(_)) = incoming.next().await {} });
    let sizes = [
        1,
        COPY_BELOW_BYTES - 1,
        COPY_BELOW_BYTES,
        65_536,
        FRAME_QUEUE_BYTES - 14,
        FRAME_QUEUE_BYTES,
        FRAME_QUEUE_BYTES + 1,
        3,
    ];
    let expected: Vec<Message> = sizes
        .iter()
        .enumerate()
        .map(|(i, &len)| {
            let body: Vec<u8> = (0..len).map(|j| b'a' + ((i + j) % 26) as u8).collect();
            if i % 2 == 0 {
                Message::Binary(Bytes::from(body))
            } else {
                Message::Text(String::from_utf8(body).expect("ascii").into())
            }
        })
        .collect();
    let sender = {
        let expected = expected.clone();
        tokio::spawn(async move {
            for m in expected {
                let out = match m {
                    Message::Binary(b) => OutMessage::Binary {
                        head: b.slice(..1),
                        payload: b.slice(1..),
                    },
                    Message::Text(t) => OutMessage::Text(t.as_str().to_owned()),
                    _ => unreachable!("only data messages are built"),
                };
                outgoing.feed(out).await.expect("feed");
            }
            outgoing.flush().await.expect("flush");
            outgoing
        })
    };
    let mut got = Vec::new();
    let mut pongs = 0;
    let mut pinged = 0;
    while got.len() < expected.len() || pongs < pinged {
        if pinged < 3 {
            step(raw_tx.send(Message::Ping(Bytes::from_static(b"p"))))
                .await
                .expect("ping");
            pinged += 1;
        }
        match step(raw_rx.next()).await {
            Some(Ok(Message::Pong(p))) => {
                assert_eq!(p, &b"p"[..]);
                pongs += 1;
            }
            Some(Ok(m)) => got.push(m),
            other => panic!("the stream ended early: {other:?}"),
        }
    }
    assert_eq!(got, expected);
    let _outgoing = step(sender).await.expect("sender");
    drop(raw_tx);
    drop(raw_rx);
    step(reader).await.expect("reader");
    server.stop();
}

/// Once the peer's close frame is read, no data message is queued behind the close reply:
/// the send fails, and the peer sees the close and nothing after it.
#[tokio::test]
async fn no_data_frame_follows_the_close() {
    let mut server = TestServer::start(1024).await;
    let (mut raw, mut accepted) = server.connect_raw().await;
    step(raw.send(Message::Close(None))).await.expect("close");
    assert!(step(accepted.incoming.next()).await.is_none());
    let sent = step(accepted.outgoing.send("{}".to_owned().into())).await;
    assert!(sent.is_err(), "data after the close was accepted");
    match step(raw.next()).await {
        Some(Ok(Message::Close(_))) | None => {}
        other => panic!("expected the close reply, got {other:?}"),
    }
    // Nothing after the close reply, until the server drops the connection.
    drop(accepted);
    assert!(step(raw.next()).await.is_none());
    server.stop();
}

/// A server that writes its first frames in the same packet as the `101` answer: the client
/// must lose none of them (tungstenite's handshake stops at the end of the HTTP head and the
/// crate's own codec reads from the next byte).
#[tokio::test]
async fn frames_in_the_handshake_packet_are_not_lost() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let server = tokio::spawn(async move {
        let (mut tcp, _) = listener.accept().await.expect("accept");
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            tcp.read_exact(&mut byte).await.expect("request head");
            head.push(byte[0]);
        }
        let head = String::from_utf8(head).expect("ascii head");
        let key = head
            .lines()
            .find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.eq_ignore_ascii_case("sec-websocket-key")
                    .then(|| value.trim().to_owned())
            })
            .expect("a key");
        let mut packet = format!(
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Accept: {}\r\n\r\n",
            derive_accept_key(key.as_bytes())
        )
        .into_bytes();
        // A text frame, a ping and a binary frame of 300 bytes, unmasked (server to client).
        packet.extend_from_slice(&[0x81, 2, b'{', b'}']);
        packet.extend_from_slice(&[0x89, 1, b'p']);
        packet.extend_from_slice(&[0x82, 126, 0x01, 0x2c]);
        packet.extend((0..300u32).map(|i| i as u8));
        tcp.write_all(&packet).await.expect("one write");
        // The client answers the ping with a masked pong carrying `p`.
        let mut pong = [0u8; 7];
        tcp.read_exact(&mut pong).await.expect("pong");
        assert_eq!(pong[0], 0x8a);
        assert_eq!(pong[1], 0x80 | 1);
        assert_eq!(pong[6] ^ pong[2], b'p');
        tcp
    });
    let mut client = step(connect_websocket(&format!("ws://{addr}/"), 1024))
        .await
        .expect("connect");
    let first = step(client.incoming.next()).await;
    assert_eq!(first.expect("a message").expect("framed"), &b"{}"[..]);
    let second = step(client.incoming.next()).await;
    let expected: Vec<u8> = (0..300u32).map(|i| i as u8).collect();
    assert_eq!(second.expect("a message").expect("framed"), expected);
    let _tcp = step(server).await.expect("server task");
}
