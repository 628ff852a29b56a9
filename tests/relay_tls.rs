//! Both dialers speak `wss://` (`secure-transport.md` §6.1): a relay behind a TLS-terminating
//! proxy (written here: tokio-rustls with a certificate from a private CA made by `rcgen`),
//! the exec server's environment link dialling `wss://…` and a client using
//! `relay+wss://…`, both trusting only that CA (`--ca-file`). A client trusting the platform's
//! roots instead is refused by TLS before anything else.

mod common;
use common::noise::{TestAuth, TransportRpc, Verdict};
use common::relay::{environments_file, InEnv, InRelay};
use common::PROMPT;

use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::json;
use tokio::net::{TcpListener, TcpStream};

use execrelay::config::ServerConfig;
use execrelay::link::client::{ClientLink, NoiseClientConfig};
use execrelay::link::dial::TlsRoots;
use execrelay::noise::keys::Keypair;

/// A private CA, and a certificate for `localhost` signed by it: (CA PEM, leaf DER, key).
fn private_ca() -> (String, CertificateDer<'static>, PrivateKeyDer<'static>) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_key = KeyPair::generate().unwrap();
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .signed_by(&leaf_key, &ca, &ca_key)
        .unwrap();
    (
        ca.pem(),
        leaf.der().clone(),
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der())),
    )
}

/// A TLS-terminating proxy in front of `port`; returns its port.
async fn tls_proxy(port: u16, cert: CertificateDer<'static>, key: PrivateKeyDer<'static>) -> u16 {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let front = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                if let Ok(mut out) = TcpStream::connect(("127.0.0.1", port)).await {
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut out).await;
                }
            });
        }
    });
    front
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_dialers_speak_wss_through_a_tls_terminating_proxy() {
    let dir = tempfile::tempdir().unwrap();
    let server = Keypair::generate().unwrap();
    let client = Keypair::generate().unwrap();
    let envs = environments_file(dir.path(), &[("env", &server)]);
    let relay = InRelay::start(&envs).await;
    let (ca_pem, cert, key) = private_ca();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca_pem).unwrap();
    let port = tls_proxy(relay.port, cert, key).await;

    // The environment link over wss://, trusting only the private CA.
    let (auth, _) = TestAuth::new(&[(&client, Verdict::Allow)]);
    let dial = execrelay::link::environment::RelayDial {
        relay_url: format!("wss://localhost:{port}"),
        env_id: "env".into(),
        relay_public: relay.keys.public,
        tls: TlsRoots::CaFile(ca_file.clone()),
    };
    let env = InEnv::start_dial(dial, server.clone(), auth, ServerConfig::default()).await;
    env.registered().await;

    // A client over relay+wss://, trusting the same CA.
    let url = format!("relay+wss://localhost:{port}/env");
    let mut cfg = NoiseClientConfig::new(client.clone(), server.public);
    cfg.tls = TlsRoots::CaFile(ca_file);
    let link = ClientLink::connect(&url, cfg).await.unwrap();
    let t = tokio::time::timeout(PROMPT, link.open_stream())
        .await
        .unwrap()
        .unwrap();
    let mut t = TransportRpc { t, next_id: 0 };
    t.call("initialize", json!({"clientName": "tls"})).await;
    t.send(json!({"jsonrpc": "2.0", "method": "initialized", "params": {}}))
        .await;
    let info = t.call("server/info", json!({})).await;
    assert!(info["serverVersion"].is_string(), "{info}");

    // Trusting the platform's roots, the private CA's certificate is refused.
    let plain = NoiseClientConfig::new(client, server.public);
    let err = match ClientLink::connect(&url, plain).await {
        Ok(_) => panic!("a certificate from a private CA was trusted without --ca-file"),
        Err(e) => e.to_string(),
    };
    assert!(err.to_lowercase().contains("certificate"), "{err}");
    env.stop().await;
    relay.stop().await;
}
