//! Per-client quotas: one Noise client key, or one peer address, holds at
//! most its quota of sessions and of processes, so other clients still get theirs. Over
//! `ws://` the peer address is the TCP peer's (an IPv6 address by its /64); over Noise both
//! the key and the link's address count. Each refusal is `-32004` naming the quota.

mod common;
use common::noise::*;
use common::*;

use std::net::IpAddr;
use std::sync::Arc;

use serde_json::{json, Value};

use execrelay::config::ServerConfig;
use execrelay::connection::ConnectionOptions;
use execrelay::session::SessionRegistry;

fn registry(config: ServerConfig) -> Arc<SessionRegistry> {
    new_registry(config)
}

/// A connection on `registry` whose peer is `ip`.
fn connect_from(registry: &Arc<SessionRegistry>, ip: &str) -> InProcess {
    let ip: IpAddr = ip.parse().unwrap();
    let opts = ConnectionOptions {
        peer_addr: Some(ip),
        ..ConnectionOptions::default()
    };
    in_process_with(registry.clone(), 1 << 20, opts)
}

fn assert_quota(e: &Value, limit: &str, value: u64) {
    assert_eq!(e["code"], -32004, "{e}");
    assert_eq!(e["data"]["limit"], limit, "{e}");
    assert_eq!(e["data"]["value"], value, "{e}");
}

fn sleeper(id: &str) -> Value {
    json!({"processId": id, "argv": ["sleep", "1000"]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_holds_its_quota_of_sessions_and_processes() {
    let reg = registry(ServerConfig {
        max_sessions_per_address: 2,
        max_processes_per_address: 3,
        ..cfg()
    });
    let mut a1 = connect_from(&reg, "10.0.0.1");
    let mut a2 = connect_from(&reg, "10.0.0.1");
    let mut a3 = connect_from(&reg, "10.0.0.1");
    a1.client.handshake().await;
    a2.client.handshake().await;
    let e = a3
        .client
        .call_err("initialize", json!({"clientName": "a3"}))
        .await;
    assert_quota(&e, "maxSessionsPerAddress", 2);
    // Another address is not affected.
    let mut b = connect_from(&reg, "10.0.0.2");
    b.client.handshake().await;

    // Processes count over every session of the address.
    let mut pids = Vec::new();
    for id in ["x", "y"] {
        pids.push(a1.client.start(sleeper(id)).await["pid"].clone());
    }
    pids.push(a2.client.start(sleeper("z")).await["pid"].clone());
    let e = a2.client.call_err("process/start", sleeper("w")).await;
    assert_quota(&e, "maxProcessesPerAddress", 3);
    pids.push(b.client.start(sleeper("b")).await["pid"].clone());

    // Closing a session gives its slots back, its processes' too.
    a1.client.call("session/close", json!({})).await;
    a3.client.handshake().await;
    pids.push(a2.client.start(sleeper("w")).await["pid"].clone());
    for pid in &pids {
        kill_group(pid);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ipv6_address_counts_by_its_64_prefix() {
    let reg = registry(ServerConfig {
        max_sessions_per_address: 2,
        ..cfg()
    });
    let mut a = connect_from(&reg, "2001:db8:0:1::1");
    let mut b = connect_from(&reg, "2001:db8:0:1:ffff::2");
    let mut c = connect_from(&reg, "2001:db8:0:1::3");
    let mut d = connect_from(&reg, "2001:db8:0:2::1");
    a.client.handshake().await;
    b.client.handshake().await;
    let e = c
        .client
        .call_err("initialize", json!({"clientName": "c"}))
        .await;
    assert_quota(&e, "maxSessionsPerAddress", 2);
    d.client.handshake().await;
}

/// `initialize` on `st`: the error it gets, if any.
async fn try_init(link: &mut RawLink, st: &mut RawStream) -> Option<Value> {
    let r = link
        .request(st, "initialize", json!({"clientName": "quota"}))
        .await;
    match r.get("error") {
        Some(e) => Some(e.clone()),
        None => {
            let note = json!({"jsonrpc": "2.0", "method": "initialized", "params": {}});
            link.send_json(st, &note).await;
            None
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_key_holds_its_quota_and_another_key_still_gets_sessions() {
    let config = ServerConfig {
        max_sessions_per_key: 2,
        max_processes_per_key: 2,
        ..cfg()
    };
    let a = execrelay::noise::keys::Keypair::generate().unwrap();
    let b = execrelay::noise::keys::Keypair::generate().unwrap();
    let (_auth, srv) = serve_allowing(&[&a, &b], config).await;
    let mut link = RawLink::connect(srv.port).await;
    let mut a1 = link.open(&a, &srv.keys.public).await;
    let mut a2 = link.open(&a, &srv.keys.public).await;
    let mut a3 = link.open(&a, &srv.keys.public).await;
    assert_eq!(try_init(&mut link, &mut a1).await, None);
    assert_eq!(try_init(&mut link, &mut a2).await, None);
    let e = try_init(&mut link, &mut a3).await.expect("refused");
    assert_quota(&e, "maxSessionsPerKey", 2);
    // Key B, on the same link and address, gets its own sessions.
    let mut b1 = link.open(&b, &srv.keys.public).await;
    assert_eq!(try_init(&mut link, &mut b1).await, None);

    // Processes count over every session of the key.
    let mut pids = Vec::new();
    for (st, id) in [(&mut a1, "x"), (&mut a2, "y")] {
        pids.push(link.call(st, "process/start", sleeper(id)).await["pid"].clone());
    }
    let r = link.request(&mut a1, "process/start", sleeper("z")).await;
    assert_quota(error_of(&r), "maxProcessesPerKey", 2);
    pids.push(link.call(&mut b1, "process/start", sleeper("b")).await["pid"].clone());
    for pid in &pids {
        kill_group(pid);
    }
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_noise_the_link_address_counts_too() {
    let config = ServerConfig {
        max_sessions_per_address: 1,
        ..cfg()
    };
    let a = execrelay::noise::keys::Keypair::generate().unwrap();
    let b = execrelay::noise::keys::Keypair::generate().unwrap();
    let (_auth, srv) = serve_allowing(&[&a, &b], config).await;
    let mut link = RawLink::connect(srv.port).await;
    let mut a1 = link.open(&a, &srv.keys.public).await;
    assert_eq!(try_init(&mut link, &mut a1).await, None);
    // Another key from the same address (every link here comes from 127.0.0.1).
    let mut other = RawLink::connect(srv.port).await;
    let mut b1 = other.open(&b, &srv.keys.public).await;
    let e = try_init(&mut other, &mut b1).await.expect("refused");
    assert_quota(&e, "maxSessionsPerAddress", 1);
    srv.stop().await;
}
