//! The `noise+ws://` transport through the built binary (`secure-transport.md` §1–§3, §8):
//! `keygen` → `serve` → `run` end to end, key file errors at start, a wrong server key, an
//! unauthorized client and revocation by editing the authorized-keys file while the server
//! runs, and logs that never hold key material, tokens or plaintext.
//!
//! Every wait is on a line of output or a process exit, never on a sleep; every wait is
//! bounded by a hang guard. (The in-process server and the raw link client are in
//! `noise_handshake.rs` and `noise_transport.rs`.)

mod common;
use common::binary::output_of;
use common::noise_bin::*;
use common::*;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Output;
use std::sync::Arc;

use tokio::process::Command;

use execrelay::client::{Client, ClientOptions, ProcessEvent, StartOptions, Target};
use execrelay::link::client::NoiseClientConfig;
use execrelay::noise::keys::{load_public, Keypair};
use execrelay::rpc::messages::StreamName;

// =============================================================================================
// 1. The binary, end to end.

/// keygen → serve → run: stdout, stderr and the exit status cross a Noise stream intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_round_trip_over_noise() {
    let dir = tempfile::tempdir().unwrap();
    let server = keygen(dir.path(), "server").await;
    let client = keygen(dir.path(), "client").await;
    assert_eq!(
        std::fs::metadata(&server.private)
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
    assert!(server.public_line().starts_with("execrelay-x25519 "));
    let auth = dir.path().join("auth");
    std::fs::write(
        &auth,
        format!("# who may connect\n\n{}\n", client.public_line()),
    )
    .unwrap();
    let srv = BinServer::with_keys(dir.path(), &server, &auth, &[], None).await;
    let out = run_bin(
        &srv.url,
        server.pubs(),
        client.p(),
        &[],
        &["sh", "-c", "echo out; echo err >&2; exit 3"],
        None,
    )
    .await;
    assert_eq!(text(&out.stdout), "out\n");
    assert_eq!(text(&out.stderr), "err\n");
    assert_eq!(out.status.code(), Some(3));
    // The server key may also be given as the line itself.
    let line = server.public_line();
    let out = run_bin(
        &srv.url,
        &line,
        client.p(),
        &[],
        &["printf", "%s", "inline-key"],
        None,
    )
    .await;
    assert_eq!(text(&out.stdout), "inline-key", "{}", text(&out.stderr));
    assert_eq!(out.status.code(), Some(0));
    srv.stop().await;
}

// =============================================================================================
// 2. Key file errors at start.

async fn serve_fails(dir: &Path, key: &Path, auth: &Path) -> Output {
    let out = output_of(
        Command::new(bin())
            .args(["serve", "--listen", "noise+ws://127.0.0.1:0", "--key"])
            .arg(key)
            .arg("--authorized-keys")
            .arg(auth)
            .env_remove("RUST_LOG")
            .current_dir(dir),
    )
    .await;
    assert_ne!(out.status.code(), Some(0), "serve must refuse to start");
    assert!(out.status.code().is_some(), "exits, not killed");
    assert!(
        out.stdout.is_empty(),
        "no URL is printed: {:?}",
        text(&out.stdout)
    );
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_file_errors_are_reported_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let (server, client, auth) = server_and_client(dir.path()).await;

    // A private key readable by others.
    let open = dir.path().join("open-key");
    std::fs::copy(&server.private, &open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = serve_fails(dir.path(), &open, &auth).await;
    let err = text(&out.stderr);
    assert!(err.contains("permissions"), "{err}");
    assert!(err.contains("open-key"), "names the file: {err}");

    // Garbage in a (well-protected) key file.
    let garbage = dir.path().join("garbage-key");
    std::fs::write(&garbage, "this is not a key\n").unwrap();
    std::fs::set_permissions(&garbage, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = serve_fails(dir.path(), &garbage, &auth).await;
    let err = text(&out.stderr);
    assert!(
        err.contains("garbage-key") && err.contains("not a private key"),
        "{err}"
    );

    // A key of the wrong length.
    let short = dir.path().join("short-key");
    std::fs::write(&short, "AAAA\n").unwrap();
    std::fs::set_permissions(&short, std::fs::Permissions::from_mode(0o600)).unwrap();
    let err = text(&serve_fails(dir.path(), &short, &auth).await.stderr);
    assert!(err.contains("32 bytes"), "{err}");

    // An authorized-keys file with a bad third line: the line is skipped with a warning that
    // names file:LINE (as sshd does), and the key on the second line still works.
    let bad_auth = dir.path().join("bad-auth");
    std::fs::write(
        &bad_auth,
        format!(
            "# ops\n{}\nexecrelay-x25519 not-base64!! someone\n",
            client.public_line()
        ),
    )
    .unwrap();
    let noise = BinServer::with_keys(dir.path(), &server, &bad_auth, &[], None).await;
    let ok = run_bin(
        &noise.url,
        server.pubs(),
        client.p(),
        &[],
        &["echo", "ok"],
        None,
    )
    .await;
    assert_eq!(text(&ok.stdout), "ok\n", "{}", text(&ok.stderr));
    let log = noise.stop().await;
    assert!(
        log.contains(&format!("{}:3", bad_auth.display())),
        "names the line: {log}"
    );

    // The client refuses an open private key too, before connecting.
    let out = run_bin(
        "noise+ws://127.0.0.1:9",
        server.pubs(),
        open.to_str().unwrap(),
        &[],
        &["true"],
        None,
    )
    .await;
    assert_eq!(out.status.code(), Some(255));
    assert!(
        text(&out.stderr).contains("permissions"),
        "{}",
        text(&out.stderr)
    );
}

// =============================================================================================
// 3. Wrong server key, unauthorized client, revocation while the server runs.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_server_key_unauthorized_client_and_revocation() {
    let dir = tempfile::tempdir().unwrap();
    let server = keygen(dir.path(), "server").await;
    let other = keygen(dir.path(), "other").await;
    let a = keygen(dir.path(), "client-a").await;
    let b = keygen(dir.path(), "client-b").await;
    let stranger = keygen(dir.path(), "stranger").await;
    let auth = dir.path().join("auth");
    std::fs::write(&auth, format!("{}\n{}\n", a.public_line(), b.public_line())).unwrap();
    let srv = BinServer::with_keys(dir.path(), &server, &auth, &[], None).await;

    // The client pins the wrong server key.
    let out = run_bin(&srv.url, other.pubs(), a.p(), &[], &["echo", "x"], None).await;
    assert_refused(&out, "--server-key");

    // A key that is not authorized.
    let out = run_bin(
        &srv.url,
        server.pubs(),
        stranger.p(),
        &[],
        &["echo", "x"],
        None,
    )
    .await;
    assert_refused(&out, "not authorized");

    // A's key works before the revocation.
    let out = run_bin(&srv.url, server.pubs(), a.p(), &[], &["echo", "a-ok"], None).await;
    assert_eq!(text(&out.stdout), "a-ok\n", "{}", text(&out.stderr));

    // B holds an established stream with a running `cat`.
    let b_keys = Keypair::load(&b.private).unwrap();
    let target = Target::Noise {
        url: srv.url.clone(),
        config: Arc::new(NoiseClientConfig::new(
            b_keys,
            load_public(server.pubs()).unwrap(),
        )),
        pool: execrelay::link::client::LinkPool::new(),
    };
    let client_b = Client::connect(target, ClientOptions::default())
        .await
        .unwrap();
    let mut start = StartOptions::new("cat-1", ["cat"]);
    start.params.pipe_stdin = true;
    let mut cat = client_b.start(start).await.unwrap();
    async fn echo(cat: &mut execrelay::client::ProcessHandle, line: &str) {
        assert_eq!(cat.write(line.as_bytes()).await.unwrap(), "accepted");
        let mut got = Vec::new();
        while got.len() < line.len() {
            match tokio::time::timeout(PROMPT, cat.next_event())
                .await
                .expect("echo (hang guard)")
            {
                Some(ProcessEvent::Output {
                    stream: StreamName::Stdout,
                    data,
                }) => got.extend_from_slice(&data),
                other => panic!("unexpected event {other:?}"),
            }
        }
        assert_eq!(text(&got), line);
    }
    echo(&mut cat, "before revocation\n").await;

    // Revoke A by rewriting the file without it.
    replace_file(&auth, &format!("# a revoked\n{}\n", b.public_line()));
    let out = run_bin(&srv.url, server.pubs(), a.p(), &[], &["echo", "x"], None).await;
    assert_refused(&out, "not authorized");

    // B's established stream is unaffected, and B may still open new ones.
    echo(&mut cat, "after revocation\n").await;
    let out = run_bin(&srv.url, server.pubs(), b.p(), &[], &["echo", "b-ok"], None).await;
    assert_eq!(text(&out.stdout), "b-ok\n", "{}", text(&out.stderr));
    cat.close_stdin().await.unwrap();
    match tokio::time::timeout(PROMPT, cat.next_event())
        .await
        .unwrap()
    {
        Some(ProcessEvent::Exited(info)) => assert_eq!(info.exit_code, Some(0)),
        other => panic!("expected the exit, got {other:?}"),
    }
    client_b.close();
    srv.stop().await;
}

// =============================================================================================
// 14. Logs never contain key material, tokens or plaintext.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debug_logs_hold_no_secrets_or_plaintext() {
    let dir = tempfile::tempdir().unwrap();
    let (server, client, auth) = server_and_client(dir.path()).await;
    let token = "s3cret-token-xyz";
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    let extra = ["--auth-token-file", token_file.to_str().unwrap()];
    let srv = BinServer::with_keys(dir.path(), &server, &auth, &extra, Some("debug")).await;
    let marker = "PLAINTEXT-MARKER-42";
    let out = run_bin(
        &srv.url,
        server.pubs(),
        client.p(),
        &["--token-file", token_file.to_str().unwrap()],
        &["echo", marker],
        Some("debug"),
    )
    .await;
    assert_eq!(
        text(&out.stdout),
        format!("{marker}\n"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(0));
    // Without the token the same key is refused.
    let refused = run_bin(
        &srv.url,
        server.pubs(),
        client.p(),
        &[],
        &["echo", marker],
        None,
    )
    .await;
    assert_refused(&refused, "not authorized");

    let log = srv.stop().await;
    assert!(
        log.contains("stream open") && log.contains("DEBUG"),
        "debug logging was on: {log}"
    );
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let sk = unb64(&server.private_b64());
    let ck = unb64(&client.private_b64());
    let forbidden = [
        ("the server's private key", server.private_b64()),
        ("the client's private key", client.private_b64()),
        ("the server's private key (hex)", hex(&sk)),
        ("the client's private key (hex)", hex(&ck)),
        ("the token", token.to_string()),
        ("the plaintext", marker.to_string()),
        (
            "the plaintext (base64)",
            b64(format!("{marker}\n").as_bytes()),
        ),
        ("the plaintext (base64, no newline)", b64(marker.as_bytes())),
    ];
    for (what, secret) in &forbidden {
        assert!(
            !log.contains(secret.as_str()),
            "the server log contains {what}"
        );
        assert!(
            !text(&out.stderr).contains(secret.as_str()),
            "the client's debug log contains {what}"
        );
    }
}
