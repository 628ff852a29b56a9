//! TLS at the relay itself (`secure-transport.md` §6.1: `execrelay-relay --listen wss://…
//! --tls-cert FILE --tls-key FILE`) and the dialers that trust it:
//!
//! - a certificate for `localhost` from a private CA (the README's first recipe), trusted with
//!   the CA as `--ca-file`, by the exec server's environment link and by clients (the library
//!   and `execrelay run relay+wss://…`), with the name checked;
//! - a single self-signed certificate marked `CA:TRUE` (what `openssl req -x509` makes, the
//!   README's second recipe) given itself as `--ca-file`: pinned, with the real binaries
//!   (`execrelay-relay`, `execrelay serve --relay wss://…`, `execrelay run relay+wss://…`);
//! - a certificate replaced on disk while links are up: new links get the new one, links up
//!   live on; a broken replacement is kept out.
//!
//! Certificates are made here with `rcgen`, as the recipes' `openssl` commands make them.

mod common;
use common::noise::{TestAuth, TransportRpc, Verdict};
use common::noise_bin::{relay_server_and_client, run_bin};
use common::relay::{environments_file, BinEnv, BinRelay, InEnv, InRelay};
use common::{eventually, text, PROMPT};

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, KeyPair};
use serde_json::json;

use execrelay::config::ServerConfig;
use execrelay::link::client::{ClientLink, NoiseClientConfig};
use execrelay::link::dial::TlsRoots;
use execrelay::noise::keys::Keypair;
use execrelay_io::tls::{CertificateFiles, TlsListener};

/// PEM of a certificate and of its key.
struct Pem {
    cert: String,
    key: String,
}

/// A private CA and a certificate for `names` signed by it: (CA, leaf). The README's
/// `openssl` recipe for a private CA makes the same kinds of certificates.
fn private_ca(names: &[&str]) -> (Pem, Pem) {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name = DistinguishedName::new();
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "execrelay test CA");
    let ca_key = KeyPair::generate().unwrap();
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let leaf = CertificateParams::new(names)
        .unwrap()
        .signed_by(&leaf_key, &ca, &ca_key)
        .unwrap();
    (
        Pem {
            cert: ca.pem(),
            key: ca_key.serialize_pem(),
        },
        Pem {
            cert: leaf.pem(),
            key: leaf_key.serialize_pem(),
        },
    )
}

/// One self-signed certificate as `openssl req -x509 -newkey … -subj /CN=NAME` makes it:
/// `CA:TRUE` (OpenSSL's default extensions for `-x509`), its name in the subject and SAN.
fn self_signed(name: &str) -> Pem {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec![name.to_string()]).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, name);
    Pem {
        cert: params.self_signed(&key).unwrap().pem(),
        key: key.serialize_pem(),
    }
}

/// Write `pem` as `DIR/NAME.crt` and `DIR/NAME.key` (0600), replacing them as a renewal
/// does (a new file renamed over the old).
fn write_pair(dir: &Path, name: &str, pem: &Pem) -> CertificateFiles {
    let files = CertificateFiles {
        cert: dir.join(format!("{name}.crt")),
        key: dir.join(format!("{name}.key")),
    };
    replace(&files.cert, &pem.cert, 0o644);
    replace(&files.key, &pem.key, 0o600);
    files
}

fn replace(path: &Path, text: &str, mode: u32) {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, text).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode)).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn write_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// A stream through `url` trusting `ca_file`, initialized; or the connect error's text.
async fn stream(
    url: &str,
    client: &Keypair,
    server: &Keypair,
    ca_file: &Path,
) -> Result<TransportRpc, String> {
    let mut cfg = NoiseClientConfig::new(client.clone(), server.public);
    cfg.tls = TlsRoots::CaFile(ca_file.to_path_buf());
    let link = ClientLink::connect(url, cfg)
        .await
        .map_err(|e| e.to_string())?;
    let t = tokio::time::timeout(PROMPT, link.open_stream())
        .await
        .expect("open_stream (hang guard)")
        .map_err(|e| e.to_string())?;
    let mut t = TransportRpc { t, next_id: 0 };
    t.call("initialize", json!({"clientName": "tls"})).await;
    t.send(json!({"jsonrpc": "2.0", "method": "initialized", "params": {}}))
        .await;
    assert_is_server(&mut t).await;
    Ok(t)
}

async fn assert_is_server(t: &mut TransportRpc) {
    let info = t.call("server/info", json!({})).await;
    assert!(info["serverVersion"].is_string(), "{info}");
}

/// An exec server registered as `env` with the relay at `relay_url`, trusting `ca_file`.
async fn env_over_wss(
    relay_url: String,
    relay: &InRelay,
    server: &Keypair,
    client: &Keypair,
    ca_file: &Path,
) -> InEnv {
    let (auth, _) = TestAuth::new(&[(client, Verdict::Allow)]);
    let dial = execrelay::link::environment::RelayDial {
        relay_url,
        env_id: "env".into(),
        relay_public: relay.keys.public,
        tls: TlsRoots::CaFile(ca_file.to_path_buf()),
    };
    let env = InEnv::start_dial(dial, server.clone(), auth, ServerConfig::default()).await;
    env.registered().await;
    env
}

/// A relay on `wss://` with a leaf from a private CA, reached by both dialers trusting only
/// that CA; the name is checked on this path, and the platform's roots refuse the leaf.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_on_wss_with_a_ca_signed_leaf_serves_both_dialers() {
    let dir = tempfile::tempdir().unwrap();
    let (server, client) = (Keypair::generate().unwrap(), Keypair::generate().unwrap());
    let envs = environments_file(dir.path(), &[("env", &server)]);
    let (ca, leaf) = private_ca(&["localhost"]);
    let ca_file = write_file(dir.path(), "ca.pem", &ca.cert);
    let tls = TlsListener::new(write_pair(dir.path(), "relay", &leaf)).unwrap();
    let relay = InRelay::start_tls(&envs, tls).await;
    let port = relay.port;

    let env = env_over_wss(
        format!("wss://localhost:{port}"),
        &relay,
        &server,
        &client,
        &ca_file,
    )
    .await;
    let url = format!("relay+wss://localhost:{port}/env");
    let mut t = stream(&url, &client, &server, &ca_file).await.unwrap();
    assert_is_server(&mut t).await;
    // The same through `execrelay run relay+wss://… --ca-file`.
    client.write(&dir.path().join("client"), "client").unwrap();
    let server_pub = write_file(
        dir.path(),
        "server.pub",
        &execrelay::noise::keys::public_line(&server.public, "server"),
    );
    let out = run_bin(
        &url,
        server_pub.to_str().unwrap(),
        dir.path().join("client").to_str().unwrap(),
        &["--ca-file", ca_file.to_str().unwrap()],
        &["sh", "-c", "echo through-a-private-ca; exit 3"],
        None,
    )
    .await;
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "through-a-private-ca\n");

    // Dialled by an address the certificate does not name: refused, saying so.
    let by_ip = format!("relay+wss://127.0.0.1:{port}/env");
    let err = stream(&by_ip, &client, &server, &ca_file)
        .await
        .err()
        .expect("a certificate for localhost was taken for 127.0.0.1");
    assert!(
        err.contains("is not pinned in --ca-file")
            && err.contains("not valid for the name \"127.0.0.1\"")
            && err.contains("it names localhost"),
        "{err}"
    );
    // Trusting the platform's roots instead, the private CA's leaf is refused.
    let plain = NoiseClientConfig::new(client.clone(), server.public);
    let err = match ClientLink::connect(&url, plain).await {
        Ok(_) => panic!("a certificate from a private CA was trusted without --ca-file"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("is not trusted through a CA") && err.contains("pass --ca-file"),
        "{err}"
    );
    env.stop().await;
    relay.stop().await;
}

/// The usual one-liner's certificate (self-signed, `CA:TRUE`) given itself as `--ca-file`,
/// with the real binaries: `execrelay-relay --listen wss://…`, `execrelay serve --relay
/// wss://…`, `execrelay run relay+wss://…`. The pin holds whatever name the relay is dialled
/// by; another self-signed certificate is refused with both reasons.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_self_signed_certificate_is_pinned_by_the_real_binaries() {
    let dir = tempfile::tempdir().unwrap();
    let (relay_keys, server, client, envs, auth) =
        relay_server_and_client(dir.path(), "env-1").await;
    let cert = self_signed("relay.example");
    let files = write_pair(dir.path(), "relay", &cert);
    let relay = BinRelay::start_on(
        "wss://127.0.0.1:0",
        &relay_keys.private,
        &envs,
        &[
            "--tls-cert",
            files.cert.to_str().unwrap(),
            "--tls-key",
            files.key.to_str().unwrap(),
        ],
        &dir.path().join("relay.log"),
    )
    .await;
    let ca = files.cert.to_str().unwrap();
    let env = BinEnv::start(
        &relay.url,
        "env-1",
        &relay_keys.public,
        &server.private,
        &auth,
        &["--ca-file", ca],
        &dir.path().join("server.log"),
    )
    .await;

    let url = format!("relay+{}/env-1", relay.url);
    let out = run_bin(
        &url,
        server.pubs(),
        client.p(),
        &["--ca-file", ca],
        &["sh", "-c", "echo through-tls; exit 4"],
        None,
    )
    .await;
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "through-tls\n");

    let other = write_file(dir.path(), "other.pem", &self_signed("relay.example").cert);
    let out = run_bin(
        &url,
        server.pubs(),
        client.p(),
        &["--ca-file", other.to_str().unwrap()],
        &["true"],
        None,
    )
    .await;
    assert_ne!(out.status.code(), Some(0));
    let err = text(&out.stderr);
    assert!(
        err.contains("is not pinned in --ca-file")
            && err.contains("other.pem")
            && err.contains("it is a CA certificate (basicConstraints CA:TRUE"),
        "{err}"
    );

    // A broken replacement: kept out, and the relay's log says why; the certificate in force
    // still serves new links.
    replace(&files.key, &self_signed("relay.example").key, 0o600);
    let log = dir.path().join("relay.log");
    eventually("the relay logs the replacement it kept out", || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        text.contains(
            "TLS certificate files changed but cannot be used: keeping the previous certificate",
        ) && text.contains("is not the private key of --tls-cert")
    })
    .await;
    let out = run_bin(
        &url,
        server.pubs(),
        client.p(),
        &["--ca-file", ca],
        &["echo", "still"],
        None,
    )
    .await;
    assert_eq!(text(&out.stdout), "still\n", "{}", text(&out.stderr));
    drop(env);
    drop(relay);
}

/// Certificates replaced on disk while links are up: the relay serves new links with the new
/// certificate (a client pinning the old one is refused, one pinning the new one gets in),
/// while the environment link and a client's stream set up under the old one live on. A
/// broken replacement, then a half one (new certificate, old key), are kept out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_replaced_while_links_are_up() {
    let dir = tempfile::tempdir().unwrap();
    let (server, client) = (Keypair::generate().unwrap(), Keypair::generate().unwrap());
    let envs = environments_file(dir.path(), &[("env", &server)]);
    let old = self_signed("localhost");
    let new = self_signed("localhost");
    let old_pin = write_file(dir.path(), "old.pem", &old.cert);
    let new_pin = write_file(dir.path(), "new.pem", &new.cert);
    let files = write_pair(dir.path(), "relay", &old);
    let tls = TlsListener::new(files.clone()).unwrap();
    let store = tls.store().clone();
    let relay = InRelay::start_tls(&envs, tls).await;
    let base = format!("wss://localhost:{}", relay.port);
    let url = format!("relay+{base}/env");
    let env = env_over_wss(base, &relay, &server, &client, &old_pin).await;
    let mut up = stream(&url, &client, &server, &old_pin).await.unwrap();
    let fingerprint = |pem: &Pem| execrelay_io::tls::certificate_fingerprint(&pem_der(&pem.cert));

    // A broken file: kept out; the old certificate still serves new links.
    replace(&files.cert, "-----BEGIN CERTIFICATE-----\nbroken\n", 0o644);
    eventually("the broken certificate was looked at", || {
        store.figures().reload_errors == 1
    })
    .await;
    assert_eq!(store.current().fingerprint, fingerprint(&old));
    stream(&url, &client, &server, &old_pin).await.unwrap();

    // Half a renewal (the new certificate, the old key): kept out too.
    replace(&files.cert, &new.cert, 0o644);
    eventually("the half renewal was looked at", || {
        store.figures().reload_errors == 2
    })
    .await;
    assert_eq!(store.current().fingerprint, fingerprint(&old));

    // The key follows: the new pair is in force.
    replace(&files.key, &new.key, 0o600);
    eventually("the new certificate is in force", || {
        store.figures().reloads == 1
    })
    .await;
    assert_eq!(store.current().fingerprint, fingerprint(&new));
    let err = stream(&url, &client, &server, &old_pin)
        .await
        .err()
        .expect("a new link was served the old certificate");
    assert!(err.contains("is not pinned in --ca-file"), "{err}");
    let mut fresh = stream(&url, &client, &server, &new_pin).await.unwrap();
    assert_is_server(&mut fresh).await;

    // The links up before the change live on: the old stream answers, and the environment
    // link never went down (it came up once).
    assert_is_server(&mut up).await;
    assert_eq!(env.links(), 1);
    let metrics = env.registry.metrics().render(&env.registry.stats());
    assert!(
        metrics
            .lines()
            .any(|l| l == "execrelay_environment_link_ups_total 1"),
        "{metrics}"
    );
    env.stop().await;
    relay.stop().await;
}

/// The DER of the first certificate of a PEM text.
fn pem_der(pem: &str) -> Vec<u8> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::from_pem_slice(pem.as_bytes())
        .unwrap()
        .to_vec()
}
