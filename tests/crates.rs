//! The workspace's dependency directions (ARCHITECTURE.md, "Crates"), checked in Cargo's
//! resolved graph (`cargo tree`, `cargo metadata`) rather than in the sources:
//!
//! - `execrelay-protocol` (the sans-IO link engine and the Noise record layer) has no tokio,
//!   hyper or clap anywhere in its dependency tree, and no other crate of the workspace;
//! - `execrelay-io` (the shared I/O) builds on `execrelay-protocol` and on no server;
//! - the exec server's library does not link the relay server (`execrelay-relay`): the
//!   dependency is optional and only the `demo` feature turns it on, for the binary's `demo`;
//! - the relay server does not link the exec server.
//!
//! `tests/layers/crates.rs` checks the same directions in the sources (what the crates name).

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

/// Crates the link engine must never pull in: an async runtime, an HTTP server, a command-line
/// parser (with their own sub-crates: `tokio-util`, `hyper-util`, `clap_builder`, …).
const NOT_IN_PROTOCOL: &[&str] = &["tokio", "hyper", "clap", "mio", "async-nats"];

/// The workspace's crates.
const PROTOCOL: &str = "execrelay-protocol";
const IO: &str = "execrelay-io";
const RELAY: &str = "execrelay-relay";
const EXEC: &str = "execrelay";

fn cargo(args: &[&str]) -> String {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let out = Command::new(&cargo)
        .args(args)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")))
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cargo}: {e}"));
    assert!(
        out.status.success(),
        "cargo {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("cargo prints UTF-8")
}

/// The package names in `cargo tree --prefix none --format {p}` output (`name vX.Y.Z …`).
fn package_names(tree: &str) -> BTreeSet<String> {
    tree.lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// Every package `package` links (its normal and build dependencies, transitively, for this
/// host), itself included. `extra`: more flags (`--no-default-features`).
fn linked(package: &str, extra: &[&str]) -> BTreeSet<String> {
    let mut args = vec![
        "tree",
        "--locked",
        "--offline",
        "-p",
        package,
        "-e",
        "normal,build",
        "--prefix",
        "none",
        "--format",
        "{p}",
    ];
    args.extend_from_slice(extra);
    let names = package_names(&cargo(&args));
    assert!(names.contains(package), "cargo tree did not list {package}");
    names
}

/// The names in `names` that are, or belong to, a crate of `forbidden` (`tokio-util` is
/// tokio's, `clap_builder` clap's).
fn forbidden_in<'a>(names: &'a BTreeSet<String>, forbidden: &[&str]) -> Vec<&'a str> {
    names
        .iter()
        .map(String::as_str)
        .filter(|n| {
            forbidden
                .iter()
                .any(|f| *n == *f || n.strip_prefix(f).is_some_and(|r| r.starts_with(['-', '_'])))
        })
        .collect()
}

#[test]
fn the_link_engine_pulls_in_no_runtime_http_server_or_command_line_parser() {
    let names = linked(PROTOCOL, &[]);
    let bad = forbidden_in(&names, NOT_IN_PROTOCOL);
    assert!(bad.is_empty(), "{PROTOCOL} links {bad:?}");
    for other in [IO, RELAY, EXEC] {
        assert!(!names.contains(other), "{PROTOCOL} links {other}");
    }
    // The tree was really walked: the engine's and the record layer's own dependencies (the
    // record AEAD's `ring`, the handshake's `snow`) are there.
    for dep in ["bytes", "snow", "serde_json", "ring", "zeroize"] {
        assert!(
            names.contains(dep),
            "{PROTOCOL}'s tree lacks {dep}: {names:?}"
        );
    }
}

#[test]
fn the_shared_io_builds_on_the_link_engine_and_no_server() {
    let names = linked(IO, &[]);
    assert!(names.contains(PROTOCOL), "{IO} does not link {PROTOCOL}");
    assert!(names.contains("tokio") && names.contains("hyper"));
    for server in [RELAY, EXEC] {
        assert!(!names.contains(server), "{IO} links {server}");
    }
}

#[test]
fn the_relay_server_does_not_link_the_exec_server() {
    let names = linked(RELAY, &[]);
    assert!(names.contains(PROTOCOL) && names.contains(IO));
    assert!(!names.contains(EXEC), "{RELAY} links {EXEC}");
}

#[test]
fn the_exec_server_links_the_relay_server_only_through_the_demo_feature() {
    let without = linked(EXEC, &["--no-default-features"]);
    assert!(without.contains(PROTOCOL) && without.contains(IO));
    assert!(
        !without.contains(RELAY),
        "{EXEC} without features links {RELAY}"
    );
    // With its default features the binary has the demo's relay.
    assert!(linked(EXEC, &[]).contains(RELAY));

    // The manifest: the dependency is optional, and `demo` is the only feature enabling it.
    let meta: serde_json::Value = serde_json::from_str(&cargo(&[
        "metadata",
        "--locked",
        "--offline",
        "--no-deps",
        "--format-version",
        "1",
    ]))
    .expect("cargo metadata prints JSON");
    let packages = meta["packages"].as_array().expect("packages");
    let exec = packages
        .iter()
        .find(|p| p["name"] == EXEC)
        .expect("the execrelay package");
    let normal_relay: Vec<&serde_json::Value> = exec["dependencies"]
        .as_array()
        .expect("dependencies")
        .iter()
        .filter(|d| d["name"] == RELAY && d["kind"].is_null())
        .collect();
    assert_eq!(normal_relay.len(), 1, "{normal_relay:?}");
    assert_eq!(
        normal_relay[0]["optional"], true,
        "{RELAY} must be optional"
    );
    let features = exec["features"].as_object().expect("features");
    let enabling: Vec<&String> = features
        .iter()
        .filter(|(_, v)| {
            v.as_array().is_some_and(|v| {
                v.iter()
                    .any(|s| s.as_str().is_some_and(|s| s.contains(RELAY)))
            })
        })
        .map(|(k, _)| k)
        .collect();
    assert_eq!(enabling, vec!["demo"], "features enabling {RELAY}");
}

#[test]
fn the_checks_see_what_they_forbid() {
    let tree = "execrelay-protocol v0.1.0 (/w/protocol)\nbytes v1.0.0\ntokio-util v0.7.0\n\
                clap_builder v4.0.0\ntokioish v1.0.0\nhyper v1.0.0 (*)\n";
    let names = package_names(tree);
    assert_eq!(
        forbidden_in(&names, NOT_IN_PROTOCOL),
        vec!["clap_builder", "hyper", "tokio-util"]
    );
}
