//! `execrelay cp` through the built binary against a `ws://` server on this machine: a
//! 200 MB file and a tree, both ways, with identical SHA-256 and modes (and symbolic links,
//! empty directories); scp's rules for the destination; missing paths, a directory without
//! `-r` and permission errors named, on either side (the permission cases run the client or
//! the server as `nobody` through `setpriv`: as root nothing is ever denied).
//!
//! Every wait is on an exit, bounded by the hang guard.

mod common;
use common::binary::{output_of, serve_cmd};
use common::*;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// `execrelay serve --listen ws://127.0.0.1:0`, through `wrap` (e.g. `setpriv …`) if given.
async fn ws_server(wrap: &[&str]) -> (Child, String) {
    let mut child = if wrap.is_empty() {
        serve_cmd("ws://127.0.0.1:0", Stdio::null())
    } else {
        let mut c = Command::new(wrap[0]);
        c.args(&wrap[1..])
            .arg(bin())
            .args([
                "serve",
                "--listen",
                "ws://127.0.0.1:0",
                "--containment-backend",
                "none",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        c
    }
    .env_remove("RUST_LOG")
    .spawn()
    .expect("spawn serve");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let url = tokio::time::timeout(GUARD, lines.next_line())
        .await
        .expect("serve printed its URL (hang guard)")
        .unwrap()
        .expect("a URL line");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, url)
}

/// `execrelay cp ARGS…` (with `wrap` in front, e.g. `setpriv …`).
async fn cp(wrap: &[&str], args: &[&str]) -> Output {
    let mut c = if wrap.is_empty() {
        Command::new(bin())
    } else {
        let mut c = Command::new(wrap[0]);
        c.args(&wrap[1..]).arg(bin());
        c
    };
    c.arg("cp")
        .args(args)
        .env_remove("RUST_LOG")
        .env("HOME", "/");
    output_of(&mut c).await
}

/// `setpriv` to run as `nobody`.
const NOBODY: [&str; 5] = [
    "setpriv",
    "--reuid=65534",
    "--regid=65534",
    "--clear-groups",
    "--",
];

/// SHA-256 of a file, by `sha256sum` (fast on 200 MB in a debug build of the tests).
fn sha256_of(path: &Path) -> String {
    let o = std::process::Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("sha256sum");
    assert!(o.status.success());
    text(&o.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap()
        .permissions()
        .mode()
        & 0o7777
}

/// A test directory anyone may enter (the `nobody` cases use it).
fn open_dir() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_megabytes_both_ways_keep_their_bytes_and_mode() {
    let (_server, url) = ws_server(&[]).await;
    let d = open_dir();
    let src = d.path().join("big.bin");
    let o = std::process::Command::new("head")
        .args(["-c", "200000000", "/dev/urandom"])
        .stdout(std::fs::File::create(&src).unwrap())
        .status()
        .unwrap();
    assert!(o.success());
    std::fs::set_permissions(&src, std::fs::Permissions::from_mode(0o640)).unwrap();
    let sum = sha256_of(&src);
    let remote_dir = d.path().join("remote");
    std::fs::create_dir(&remote_dir).unwrap();
    let t0 = std::time::Instant::now();
    // Into an existing directory: under its own name.
    let o = cp(&[], &[p(&src), &format!("{url}:{}", p(&remote_dir))]).await;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    eprintln!("upload of 200 MB: {:?}", t0.elapsed());
    let there = remote_dir.join("big.bin");
    assert_eq!(sha256_of(&there), sum);
    assert_eq!(mode(&there), 0o640);
    std::fs::remove_file(&src).unwrap();
    // Back, under a new name.
    let back = d.path().join("back.bin");
    let t0 = std::time::Instant::now();
    let o = cp(&[], &[&format!("{url}:{}", p(&there)), p(&back)]).await;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    eprintln!("download of 200 MB: {:?}", t0.elapsed());
    assert_eq!(sha256_of(&back), sum);
    assert_eq!(mode(&back), 0o640);
}

/// Every entry under `root`: its relative path → (kind, mode, contents' hash or link target).
fn listing(root: &Path) -> BTreeMap<PathBuf, (String, u32, String)> {
    let mut out = BTreeMap::new();
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, (String, u32, String)>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let path = e.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let rel = path.strip_prefix(root).unwrap().to_path_buf();
            let m = meta.permissions().mode() & 0o7777;
            if meta.file_type().is_symlink() {
                let to = std::fs::read_link(&path).unwrap().display().to_string();
                out.insert(rel, ("link".into(), 0, to));
            } else if meta.is_dir() {
                out.insert(rel, ("dir".into(), m, String::new()));
                walk(root, &path, out);
            } else {
                out.insert(
                    rel,
                    ("file".into(), m, sha256(&std::fs::read(&path).unwrap())),
                );
            }
        }
    }
    walk(root, root, &mut out);
    out
}

/// A tree with nested directories, files of several modes, a link, an empty directory.
fn make_tree(root: &Path) {
    std::fs::create_dir_all(root.join("a/b/c")).unwrap();
    std::fs::create_dir_all(root.join("empty")).unwrap();
    let file = |rel: &str, data: &[u8], m: u32| {
        let f = root.join(rel);
        std::fs::write(&f, data).unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(m)).unwrap();
    };
    file("top.txt", b"top\n", 0o644);
    file("a/run.sh", b"#!/bin/sh\necho hi\n", 0o755);
    file("a/b/secret", b"s3cret", 0o600);
    file(
        "a/b/c/data.bin",
        &(0..300_000u32).map(|i| (i % 251) as u8).collect::<Vec<_>>(),
        0o640,
    );
    file("a/name with spaces", b"x", 0o644);
    std::os::unix::fs::symlink("../top.txt", root.join("a/link")).unwrap();
    std::fs::set_permissions(root.join("a/b"), std::fs::Permissions::from_mode(0o750)).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tree_both_ways_keeps_its_files_modes_and_links() {
    let (_server, url) = ws_server(&[]).await;
    let d = open_dir();
    let tree = d.path().join("tree");
    make_tree(&tree);
    let want = listing(&tree);
    assert!(want.len() >= 9, "{want:?}");
    // Up, as a new name (the destination does not exist).
    let up = d.path().join("up");
    let o = cp(&[], &["-r", p(&tree), &format!("{url}:{}", p(&up))]).await;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(listing(&up), want);
    assert_eq!(mode(&up), mode(&tree));
    // Down, into an existing directory (under its own name).
    let down = d.path().join("down");
    std::fs::create_dir(&down).unwrap();
    let o = cp(&[], &["-r", &format!("{url}:{}", p(&up)), p(&down)]).await;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(listing(&down.join("up")), want);
    // Several files into a directory.
    let multi = d.path().join("multi");
    std::fs::create_dir(&multi).unwrap();
    let o = cp(
        &[],
        &[
            p(&tree.join("top.txt")),
            p(&tree.join("a/run.sh")),
            &format!("{url}:{}", p(&multi)),
        ],
    )
    .await;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(std::fs::read(multi.join("top.txt")).unwrap(), b"top\n");
    assert_eq!(mode(&multi.join("run.sh")), 0o755);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_paths_directories_and_bad_destinations_are_named() {
    let (_server, url) = ws_server(&[]).await;
    let d = open_dir();
    let tree = d.path().join("tree");
    make_tree(&tree);
    let gone = d.path().join("gone");
    let remote = |path: &Path| format!("{url}:{}", p(path));
    let cases: Vec<(Vec<String>, String)> = vec![
        (
            vec![p(&gone).into(), remote(d.path())],
            format!("execrelay: {}: No such file or directory\n", p(&gone)),
        ),
        (
            vec![remote(&gone), p(d.path()).into()],
            format!("execrelay: {}: No such file or directory\n", remote(&gone)),
        ),
        (
            vec![p(&tree).into(), remote(&d.path().join("x"))],
            format!(
                "execrelay: {}: is a directory (cp -r copies it)\n",
                p(&tree)
            ),
        ),
        (
            vec![remote(&tree), p(&d.path().join("y")).into()],
            format!(
                "execrelay: {}: is a directory (cp -r copies it)\n",
                remote(&tree)
            ),
        ),
        (
            vec![
                p(&tree.join("top.txt")).into(),
                p(&tree.join("a/run.sh")).into(),
                remote(&tree.join("top.txt")),
            ],
            format!(
                "execrelay: {}: not a directory\n",
                remote(&tree.join("top.txt"))
            ),
        ),
    ];
    for (args, words) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = cp(&[], &args).await;
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", text(&o.stderr));
        assert_eq!(text(&o.stderr), words, "{args:?}");
    }
    // Both sides local, or both remote: a usage error.
    let o = cp(&[], &[p(&tree), p(d.path())]).await;
    assert_eq!(o.status.code(), Some(2));
    let o = cp(&[], &[&remote(&tree), &remote(d.path())]).await;
    assert_eq!(o.status.code(), Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permission_errors_are_named_on_either_side() {
    // Here: a file `nobody` may not read, copied up by `nobody`.
    let (_server, url) = ws_server(&[]).await;
    let d = open_dir();
    let locked = d.path().join("locked");
    std::fs::write(&locked, "x").unwrap();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o600)).unwrap();
    let o = cp(
        &NOBODY,
        &[p(&locked), &format!("{url}:{}", p(&d.path().join("out")))],
    )
    .await;
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert_eq!(
        text(&o.stderr),
        format!("execrelay: {}: Permission denied\n", p(&locked))
    );
    // There: a server running as `nobody` may not write into a directory of root's.
    let (_server, url) = ws_server(&NOBODY).await;
    let readable = d.path().join("readable");
    std::fs::write(&readable, "x").unwrap();
    std::fs::set_permissions(&readable, std::fs::Permissions::from_mode(0o644)).unwrap();
    let root_only = d.path().join("root-only");
    std::fs::create_dir(&root_only).unwrap();
    std::fs::set_permissions(&root_only, std::fs::Permissions::from_mode(0o755)).unwrap();
    let o = cp(&[], &[p(&readable), &format!("{url}:{}", p(&root_only))]).await;
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    let err = text(&o.stderr);
    assert!(
        err.starts_with(&format!("execrelay: {url}:{}: ", p(&root_only)))
            && err.contains("Permission denied")
            && err.lines().count() == 1,
        "{err}"
    );
    // And may not read a file of root's 0600.
    let o = cp(
        &[],
        &[&format!("{url}:{}", p(&locked)), p(&d.path().join("got"))],
    )
    .await;
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    let err = text(&o.stderr);
    assert!(
        err.contains("Permission denied") && err.contains(p(&locked)),
        "{err}"
    );
    assert!(!d.path().join("got").exists());
}
