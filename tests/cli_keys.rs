//! Keys through the built binary: `keygen` writes the default key without `-o` and refuses to
//! overwrite without `--force`; `keygen -l` prints the fingerprint the server logs for that
//! client (from the private or the public key); `keygen -y` the public line; a public key
//! given where a private one is needed (and the reverse) is named as such; a missing
//! `--server-key` file is said to be missing; a bad line of `authorized_keys` is skipped with
//! a warning naming the file and line, and the other keys still work.

mod common;
use common::binary::output_of;
use common::noise_bin::{keygen, run_bin, server_and_client, BinServer};
use common::*;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Output;

use tokio::process::Command;

/// `execrelay keygen ARGS…` with `XDG_CONFIG_HOME` = `config`.
async fn keygen_in(config: &Path, args: &[&str]) -> Output {
    output_of(
        Command::new(bin())
            .arg("keygen")
            .args(args)
            .env("XDG_CONFIG_HOME", config)
            .env_remove("RUST_LOG"),
    )
    .await
}

#[tokio::test]
async fn keygen_writes_the_default_key_and_never_overwrites_without_force() {
    let d = tempfile::tempdir().unwrap();
    let config = d.path().join("config");
    let o = keygen_in(&config, &["-c", "me@here"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let id = config.join("execrelay").join("id");
    let line = std::fs::read_to_string(id.with_file_name("id.pub")).unwrap();
    assert_eq!(text(&o.stdout), line, "the public line is printed");
    assert!(line.starts_with("execrelay-x25519 ") && line.trim_end().ends_with(" me@here"));
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&id), 0o600);
    assert_eq!(mode(&id.with_file_name("id.pub")), 0o644);
    assert_eq!(mode(&config.join("execrelay")), 0o700);
    let private = std::fs::read(&id).unwrap();
    // Again: refused, nothing touched.
    let o = keygen_in(&config, &[]).await;
    assert_eq!(o.status.code(), Some(255));
    assert_eq!(
        text(&o.stderr),
        format!(
            "execrelay: {} exists: not overwritten (--force replaces {} and {}.pub)\n",
            id.display(),
            id.display(),
            id.display()
        )
    );
    assert_eq!(std::fs::read(&id).unwrap(), private);
    // With --force: a new key.
    let o = keygen_in(&config, &["--force"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_ne!(std::fs::read(&id).unwrap(), private);
    // -o refuses too.
    let named = d.path().join("k");
    assert_eq!(
        keygen_in(&config, &["-o", named.to_str().unwrap()])
            .await
            .status
            .code(),
        Some(0)
    );
    assert_eq!(
        keygen_in(&config, &["-o", named.to_str().unwrap()])
            .await
            .status
            .code(),
        Some(255)
    );
}

#[tokio::test]
async fn keygen_l_prints_the_fingerprint_the_server_logs_and_y_the_public_line() {
    let d = tempfile::tempdir().unwrap();
    let (server, client, auth) = server_and_client(d.path()).await;
    let config = d.path().join("unused");
    let o = keygen_in(&config, &["-l", "-f", client.p()]).await;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let fp = text(&o.stdout).trim().to_string();
    assert!(
        fp.starts_with("SHA256:") && fp.len() == "SHA256:".len() + 16,
        "{fp}"
    );
    // From the public key: the same, with its comment.
    let o = keygen_in(&config, &["-l", "-f", client.pubs()]).await;
    assert_eq!(text(&o.stdout).trim(), format!("{fp} client"));
    // -y: the public line of the private key.
    let o = keygen_in(&config, &["-y", "-f", client.p(), "-c", "client"]).await;
    assert_eq!(text(&o.stdout).trim(), client.public_line());
    let o = keygen_in(&config, &["-y", "-f", client.pubs()]).await;
    assert_eq!(o.status.code(), Some(255));
    assert!(
        text(&o.stderr).contains("this is a public key already"),
        "{}",
        text(&o.stderr)
    );
    // The server's log names the client by the same fingerprint.
    let noise = BinServer::with_keys(d.path(), &server, &auth, &[], Some("info")).await;
    let out = run_bin(&noise.url, server.pubs(), client.p(), &[], &["true"], None).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let log = noise.stop().await;
    assert!(
        log.contains(&format!("client={fp}")),
        "{fp} not in the log:\n{log}"
    );
}

#[tokio::test]
async fn keys_given_in_the_wrong_place_are_named_and_bad_authorized_lines_skipped() {
    let d = tempfile::tempdir().unwrap();
    let (server, client, auth) = server_and_client(d.path()).await;
    // A bad line between two good ones: skipped with a warning naming it; the keys around it
    // still work.
    let other = keygen(d.path(), "other").await;
    std::fs::write(
        &auth,
        format!(
            "# keys\n{}\nexecrelay-x25519 not-base64!\n{}\n",
            other.public_line(),
            client.public_line()
        ),
    )
    .unwrap();
    let noise = BinServer::with_keys(d.path(), &server, &auth, &[], None).await;
    let ok = run_bin(
        &noise.url,
        server.pubs(),
        client.p(),
        &[],
        &["echo", "in"],
        None,
    )
    .await;
    assert_eq!(text(&ok.stdout), "in\n", "{}", text(&ok.stderr));
    // The public key where the private one goes, and the reverse.
    let o = run_bin(
        &noise.url,
        server.pubs(),
        client.pubs(),
        &[],
        &["true"],
        None,
    )
    .await;
    assert_eq!(o.status.code(), Some(255));
    assert_eq!(
        text(&o.stderr),
        format!(
            "execrelay: --key: {}: this is a public key (execrelay-x25519 …), and a private key is needed here: give the file without .pub\n",
            client.pubs()
        )
    );
    let o = run_bin(&noise.url, server.p(), client.p(), &[], &["true"], None).await;
    assert_eq!(o.status.code(), Some(255));
    assert_eq!(
        text(&o.stderr),
        format!(
            "execrelay: --server-key: {}: this is a private key, and a public key is needed here: give {}\n",
            server.p(),
            server.pubs()
        )
    );
    let missing = d.path().join("missing.pub");
    let o = run_bin(
        &noise.url,
        missing.to_str().unwrap(),
        client.p(),
        &[],
        &["true"],
        None,
    )
    .await;
    assert_eq!(o.status.code(), Some(255));
    let err = text(&o.stderr);
    assert!(
        err.contains("no such file") && !err.contains("base64"),
        "{err}"
    );
    let log = noise.stop().await;
    assert!(
        log.contains(&format!("{}:3: ", auth.display())) && log.contains("skipped a line"),
        "the skipped line is named in the log:\n{log}"
    );
}
