//! The crate rule of `ARCHITECTURE.md` ("Crates"), checked in the sources: a crate's files
//! name only crates of a strictly lower tier (`execrelay_protocol` beneath `execrelay_io`
//! beneath the exec server and the relay, which never name each other). Comments and
//! literals aside, as for the layer rule. `tests/crates.rs` checks the same directions in
//! Cargo's resolved dependency graph; this catches a path that a re-export would hide there.
//!
//! Also: the link engine's files in `protocol/src/` are sans-IO by the rule of `src/`'s
//! sans-IO cores, except the key files (`keys/`, which read them with `std::fs` and keep the
//! authorized keys behind a lock) and the lock helpers (`sync.rs`).

use std::path::Path;

use super::{code_only, rust_files, sans_io_violations};

/// Each crate's source folder, its tier and the name its dependents use for it.
const CRATES: &[(&str, u8, &str)] = &[
    ("protocol/src", 0, "execrelay_protocol"),
    ("io/src", 1, "execrelay_io"),
    ("relay/src", 2, "execrelay_relay"),
    ("src", 2, "execrelay"),
];

/// Binaries, which are not the library: `src/main.rs` links the relay server for
/// `execrelay demo` (the `demo` feature).
const BINARIES: &[&str] = &["src/main.rs"];

/// Files of `protocol/src/` that may do I/O (see the module doc).
const PROTOCOL_IO: &[&str] = &["keys/", "sync.rs"];

/// The workspace crates `code` names (`name::` after a non-identifier character).
pub fn named_crates(code: &str) -> Vec<(usize, &'static str)> {
    let mut out = Vec::new();
    for (n, line) in code.lines().enumerate() {
        for (_, _, name) in CRATES {
            let needle = format!("{name}::");
            let mut from = 0;
            while let Some(i) = line[from..].find(&needle) {
                let at = from + i;
                let before = line[..at].chars().next_back();
                if !before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                    out.push((n + 1, *name));
                    break;
                }
                from = at + needle.len();
            }
        }
    }
    out
}

/// What the file `shown`, of a crate of tier `tier` called `own`, names against the rule.
pub fn crate_violations(shown: &str, tier: u8, own: &str, source: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (line, name) in named_crates(&code_only(source)) {
        let their = CRATES
            .iter()
            .find(|(_, _, n)| *n == name)
            .map(|(_, t, _)| *t);
        if name != own && their.is_some_and(|t| t >= tier) {
            out.push(format!(
                "{shown}:{line}: names `{name}`, not of a lower tier than `{own}`"
            ));
        }
    }
    out
}

#[test]
fn no_crate_names_a_crate_of_its_own_tier_or_above() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut report = Vec::new();
    for (dir, tier, own) in CRATES {
        let mut files = Vec::new();
        rust_files(&root.join(dir), &mut files);
        assert!(!files.is_empty(), "no sources under {dir}");
        for path in files {
            let shown = path
                .strip_prefix(root)
                .expect("under the workspace")
                .display()
                .to_string();
            if BINARIES.contains(&shown.as_str()) {
                continue;
            }
            let source = std::fs::read_to_string(&path).expect("read source");
            report.extend(crate_violations(&shown, *tier, own, &source));
        }
    }
    assert!(
        report.is_empty(),
        "crate paths against the crate rule (ARCHITECTURE.md, \"Crates\"):\n{}",
        report.join("\n")
    );
}

#[test]
fn the_link_engine_is_sans_io() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("protocol/src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut report = Vec::new();
    let mut checked = 0;
    for path in files {
        let rel = path.strip_prefix(&src).expect("under protocol/src");
        let rel = rel.to_string_lossy();
        if PROTOCOL_IO.iter().any(|p| rel.starts_with(p)) || rel.contains("/tests") {
            continue;
        }
        checked += 1;
        let source = std::fs::read_to_string(&path).expect("read source");
        for v in sans_io_violations(&source) {
            report.push(format!("protocol/src/{rel}:{v}"));
        }
    }
    assert!(checked > 15, "checked only {checked} files of protocol/src");
    assert!(
        report.is_empty(),
        "link engine files naming I/O:\n{}",
        report.join("\n")
    );
}

#[test]
fn the_crate_checker_sees_what_it_forbids() {
    let src = "use execrelay_io::http::Front;\n// execrelay_relay::server in a comment\n\
               let s = \"execrelay_relay::x\";\nuse execrelay_protocol::frame::Frame;\n\
               use my_execrelay_io::x;\n";
    assert_eq!(
        crate_violations("protocol/src/x.rs", 0, "execrelay_protocol", src),
        vec!["protocol/src/x.rs:1: names `execrelay_io`, not of a lower tier than `execrelay_protocol`"]
    );
    assert!(crate_violations("io/src/x.rs", 1, "execrelay_io", src).is_empty());
    let lib = "use execrelay_relay::server::run;\nuse execrelay_io::http;\n";
    assert_eq!(
        crate_violations("src/cli/demo.rs", 2, "execrelay", lib),
        vec!["src/cli/demo.rs:1: names `execrelay_relay`, not of a lower tier than `execrelay`"]
    );
}
