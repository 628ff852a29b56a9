//! The layer rule of `ARCHITECTURE.md`, checked: every `crate::X` path in `src/` (in `use`
//! lines, grouped `use crate::{…}` lists and inline paths; comments and string literals
//! aside) names a module of a strictly lower layer than the file's own, or its own module.
//! A violation fails the test naming `file:line`.
//!
//! `layers/circles.rs` checks, with the same lexer, that no files of `src/` or `relay/src/`
//! import one another in a circle.
//!
//! The checker is a small lexer, not a parser: it blanks comments and literals, then looks
//! for `crate::`. Paths through `super::` stay inside a module by house style and are not
//! followed. The checker itself is tested on fake sources below.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

// The file-level check: no import circles inside a crate.
#[path = "layers/circles.rs"]
mod circles;

/// Each top-level module of `src/` and its layer (`ARCHITECTURE.md`, "Layers"). A module
/// may use `crate::X` only for X of a strictly lower layer, or itself.
const LAYERS: &[(&str, u8)] = &[
    ("sync", 0),
    ("faults", 0),
    ("config", 0),
    ("bounds", 0),
    ("metrics", 1),
    ("rpc", 1),
    ("transport", 1),
    ("noise", 1),
    ("policy", 1),
    ("process", 2),
    ("session", 3),
    ("connection", 4),
    ("link", 5),
    ("server", 6),
    ("client", 7),
    ("cli", 8),
];

/// Files that only declare modules or hand over to the library.
const ROOTS: &[&str] = &["lib.rs", "main.rs"];

fn layer_of(module: &str) -> Option<u8> {
    LAYERS.iter().find(|(m, _)| *m == module).map(|(_, l)| *l)
}

/// One import against the rule.
#[derive(Debug, PartialEq, Eq)]
struct Violation {
    file: String,
    line: usize,
    module: String,
    target: String,
    why: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}: `{}` uses `crate::{}`: {}",
            self.file, self.line, self.module, self.target, self.why
        )
    }
}

/// `source` with comments, string, byte-string, raw-string and char literals replaced by
/// spaces (newlines kept, so line numbers hold).
fn code_only(source: &str) -> String {
    let b = source.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let blank = |c: u8| if c == b'\n' { b'\n' } else { b' ' };
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        // Line comment (doc comments included).
        if c == b'/' && next == Some(b'/') {
            while i < b.len() && b[i] != b'\n' {
                out.push(b' ');
                i += 1;
            }
            continue;
        }
        // Block comment, nested as in Rust.
        if c == b'/' && next == Some(b'*') {
            let mut depth = 0usize;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(b[i]));
                    i += 1;
                }
            }
            continue;
        }
        // Raw strings: r"…", r#"…"#, br#"…"# (the prefix must not end an identifier).
        let ident_before = i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
        if !ident_before && (c == b'r' || (c == b'b' && next == Some(b'r'))) {
            let start = if c == b'b' { i + 2 } else { i + 1 };
            let mut j = start;
            while b.get(j) == Some(&b'#') {
                j += 1;
            }
            if b.get(j) == Some(&b'"') {
                let hashes = j - start;
                let mut k = j + 1;
                loop {
                    if k >= b.len() {
                        break;
                    }
                    if b[k] == b'"'
                        && b[k + 1..]
                            .iter()
                            .take(hashes)
                            .filter(|&&h| h == b'#')
                            .count()
                            == hashes
                    {
                        k += 1 + hashes;
                        break;
                    }
                    k += 1;
                }
                out.extend(b[i..k.min(b.len())].iter().map(|&x| blank(x)));
                i = k;
                continue;
            }
        }
        // Strings and byte strings.
        if c == b'"' {
            out.push(b' ');
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' && i + 1 < b.len() {
                    out.push(b' ');
                    i += 1;
                }
                out.push(blank(b[i]));
                i += 1;
            }
            out.push(b' ');
            i += 1;
            continue;
        }
        // Char literals ('"', '\'', '\u{1F600}'); a lifetime ('a) has no closing quote.
        if c == b'\'' {
            let end = if next == Some(b'\\') {
                // Escaped: the closing quote comes after the escape's first character.
                b.get(i + 3..)
                    .and_then(|rest| rest.iter().position(|&x| x == b'\''))
                    .map(|p| i + 3 + p)
            } else if b.get(i + 2) == Some(&b'\'') {
                Some(i + 2)
            } else {
                None
            };
            if let Some(end) = end {
                out.extend(std::iter::repeat_n(b' ', end + 1 - i));
                i = end + 1;
                continue;
            }
        }
        out.push(c);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The top-level modules named by `crate::` paths in `code` (already stripped), with the
/// byte offset of each.
fn crate_paths(code: &str) -> Vec<(usize, String)> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(p) = code[from..].find("crate::") {
        let at = from + p;
        from = at + "crate::".len();
        // `$crate::` (macros) and identifiers ending in `crate` are not this crate's paths.
        if at > 0 && (is_ident(b[at - 1]) || b[at - 1] == b'$') {
            continue;
        }
        let mut i = from;
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        if b.get(i) == Some(&b'{') {
            // `crate::{a::X, b, c::{Y, Z}}`: the first segment of each item at depth 1.
            let mut depth = 0usize;
            let mut expect_item = true;
            while i < b.len() {
                match b[i] {
                    b'{' => {
                        depth += 1;
                        if depth == 1 {
                            expect_item = true;
                        }
                    }
                    b'}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    b',' if depth == 1 => expect_item = true,
                    c if depth == 1 && expect_item && is_ident(c) => {
                        let s = i;
                        while i < b.len() && is_ident(b[i]) {
                            i += 1;
                        }
                        out.push((s, code[s..i].to_string()));
                        expect_item = false;
                        continue;
                    }
                    _ => {}
                }
                i += 1;
            }
        } else {
            let s = i;
            while i < b.len() && is_ident(b[i]) {
                i += 1;
            }
            if i > s {
                out.push((s, code[s..i].to_string()));
            }
        }
    }
    out
}

/// Every reference of `source` (a file of `module`, shown as `file`) against the rule.
fn violations(file: &str, module: &str, source: &str) -> Vec<Violation> {
    let code = code_only(source);
    let Some(own) = layer_of(module) else {
        return vec![Violation {
            file: file.to_string(),
            line: 1,
            module: module.to_string(),
            target: String::new(),
            why: format!("module `{module}` has no layer: add it to LAYERS and ARCHITECTURE.md"),
        }];
    };
    let mut out = Vec::new();
    for (at, target) in crate_paths(&code) {
        if target == module || target == "self" {
            continue;
        }
        let why = match layer_of(&target) {
            None => format!("`{target}` has no layer"),
            Some(l) if l < own => continue,
            Some(l) if l == own => {
                format!("`{target}` is a sibling in the same layer {own}")
            }
            Some(l) => format!("`{target}` is in layer {l}, above `{module}` (layer {own})"),
        };
        out.push(Violation {
            file: file.to_string(),
            line: code[..at].matches('\n').count() + 1,
            module: module.to_string(),
            target,
            why,
        });
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The top-level module a file of `src/` belongs to (`None` for the crate roots).
fn module_of(rel: &Path) -> Option<String> {
    let mut parts = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned());
    let first = parts.next()?;
    if parts.next().is_some() {
        return Some(first);
    }
    if ROOTS.contains(&first.as_str()) {
        return None;
    }
    Some(first.trim_end_matches(".rs").to_string())
}

#[test]
fn no_module_imports_its_own_layer_or_above() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(
        files.len() > 20,
        "found only {} files under src/",
        files.len()
    );
    let mut all = Vec::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for path in &files {
        let rel = path.strip_prefix(&src).expect("under src/");
        let Some(module) = module_of(rel) else {
            continue;
        };
        *seen.entry(module.clone()).or_default() += 1;
        let source = std::fs::read_to_string(path).expect("read source");
        let shown = format!("src/{}", rel.display());
        all.extend(violations(&shown, &module, &source));
    }
    let report: Vec<String> = all.iter().map(ToString::to_string).collect();
    assert!(
        report.is_empty(),
        "{} import(s) against the layer rule (ARCHITECTURE.md, \"Layers\"):\n{}",
        report.len(),
        report.join("\n")
    );
    // The table names only modules that exist (the HTTP front is `execrelay_relay::http`, in
    // the relay crate beneath every layer).
    for (m, _) in LAYERS {
        assert!(
            seen.contains_key(*m),
            "LAYERS names `{m}`, which is not in src/"
        );
    }
}

// The checker, checked.

#[test]
fn an_upward_import_is_reported_with_file_and_line() {
    let src = "//! doc\n\nuse std::sync::Arc;\nuse crate::session::Session;\n";
    let v = violations("src/process/fake.rs", "process", src);
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!(v[0].line, 4);
    assert_eq!(v[0].target, "session");
    assert!(
        v[0].to_string()
            .starts_with("src/process/fake.rs:4: `process` uses `crate::session`"),
        "{}",
        v[0]
    );
}

#[test]
fn a_sibling_in_the_same_layer_is_reported() {
    let v = violations(
        "src/transport/x.rs",
        "transport",
        "use crate::rpc::RpcError;\n",
    );
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].why.contains("sibling"), "{}", v[0]);
}

#[test]
fn lower_layers_and_the_own_module_are_allowed() {
    let src = "use crate::rpc::messages::ExitInfo;\nuse crate::config::X;\n\
               use crate::process::event_log::Event;\nuse crate::sync::lock;\n";
    assert_eq!(violations("src/process/x.rs", "process", src), vec![]);
    assert_eq!(
        violations("src/cli/x.rs", "cli", "use crate::client::Client;\n"),
        vec![]
    );
}

#[test]
fn grouped_and_inline_paths_are_seen() {
    let src = "use crate::{\n    config::X,\n    connection::{a, b},\n};\n\
               fn f() { let _ = crate::server::run(); }\n";
    let v = violations("src/session/x.rs", "session", src);
    let found: Vec<(usize, &str)> = v.iter().map(|v| (v.line, v.target.as_str())).collect();
    assert_eq!(found, vec![(3, "connection"), (5, "server")]);
}

#[test]
fn comments_strings_and_macros_are_not_imports() {
    let src = "// use crate::cli::X;\n/* crate::cli\n /* nested */ crate::cli */\n\
               /// [`X`](crate::cli::X)\nconst S: &str = \"crate::cli\";\n\
               const R: &str = r#\"crate::cli \"quoted\"\"#;\nconst C: char = '\"';\n\
               const Q: char = '\\'';\nconst U: char = '\\u{22}';\n\
               macro_rules! m { () => { $crate::cli::X } }\nfn g<'a>(x: &'a str) {}\n\
               pub(crate) fn h() {}\n";
    assert_eq!(violations("src/rpc/x.rs", "rpc", src), vec![]);
    // And code after each of them is still seen.
    let after = format!("{src}use crate::cli::Y;\n");
    let v = violations("src/rpc/x.rs", "rpc", &after);
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!(v[0].line, after.lines().count());
}

#[test]
fn a_module_without_a_layer_is_reported() {
    let v = violations("src/shiny.rs", "shiny", "fn main() {}\n");
    assert_eq!(v.len(), 1);
    assert!(v[0].why.contains("has no layer"), "{}", v[0]);
    let v = violations("src/rpc/x.rs", "rpc", "use crate::shiny::X;\n");
    assert_eq!(v.len(), 1);
}

#[test]
fn files_map_to_their_top_level_module() {
    assert_eq!(module_of(Path::new("lib.rs")), None);
    assert_eq!(module_of(Path::new("server.rs")), Some("server".into()));
    assert_eq!(
        module_of(Path::new("connection/processor.rs")),
        Some("connection".into())
    );
    assert_eq!(module_of(Path::new("rpc/mod.rs")), Some("rpc".into()));
}

// The sans-IO cores: plain structs fed `now` and events. They name no runtime, no lock, no
// file, socket, thread or process of the OS; the driver beside each does all of that.

/// The sans-IO files of `src/` (tests of each may use anything).
const SANS_IO: &[&str] = &[
    "session/table.rs",
    "session/table/action.rs",
    "session/table/requests.rs",
    "session/table/slots.rs",
    "session/approvals.rs",
    "session/ended_ids.rs",
    "session/quota.rs",
    "process/event_log.rs",
    "process/output_drain.rs",
    "process/stall_watch.rs",
    "process/write_ids.rs",
    "process/tail_ring.rs",
    "bounds/idle.rs",
];

/// What a sans-IO file must not name.
const NOT_IN_SANS_IO: &[&str] = &[
    "tokio",
    "nix::",
    "libc::",
    "Mutex",
    "RwLock",
    "std::fs",
    "std::thread",
    "std::process",
    "std::net::Tcp",
    "std::net::Udp",
    "Instant::now",
    "SystemTime::now",
];

/// The only modules the session core may import (`super::X` or `crate::X`): its own plain
/// parts and the wire types. Never `process` (spawning) nor the driver files.
const SESSION_CORE_IMPORTS: &[&str] = &["approvals", "ended_ids", "error", "quota", "rpc"];

/// `source` without its `#[cfg(test)] mod tests` (the last item of a file, by house style).
fn without_tests(source: &str) -> &str {
    match source.find("#[cfg(test)]\nmod tests") {
        Some(i) => &source[..i],
        None => source,
    }
}

/// What `source` (a sans-IO file) names against the rule, as `line: token`.
fn sans_io_violations(source: &str) -> Vec<String> {
    let code = code_only(without_tests(source));
    let mut out = Vec::new();
    for (n, line) in code.lines().enumerate() {
        for bad in NOT_IN_SANS_IO {
            if line.contains(bad) {
                out.push(format!("{}: `{bad}`", n + 1));
            }
        }
    }
    out
}

/// The modules `source` imports through `use super::X` or `use crate::X` (first segment).
fn imported_modules(source: &str) -> Vec<String> {
    let code = code_only(without_tests(source));
    let mut out: Vec<String> = crate_paths(&code).into_iter().map(|(_, m)| m).collect();
    for line in code.lines() {
        if let Some(rest) = line.trim_start().strip_prefix("use super::") {
            let m: String = rest.chars().take_while(|c| is_ident(*c as u8)).collect();
            out.push(m);
        }
    }
    out
}

#[test]
fn sans_io_cores_name_no_runtime_lock_or_os_resource() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut report = Vec::new();
    for file in SANS_IO {
        let source = std::fs::read_to_string(src.join(file))
            .unwrap_or_else(|e| panic!("SANS_IO names src/{file}, which cannot be read: {e}"));
        for v in sans_io_violations(&source) {
            report.push(format!("src/{file}:{v}"));
        }
    }
    assert!(
        report.is_empty(),
        "sans-IO files naming I/O (ARCHITECTURE.md, \"Invariants\"):\n{}",
        report.join("\n")
    );
}

#[test]
fn the_session_core_imports_only_its_plain_parts() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let source = std::fs::read_to_string(src.join("session/table.rs")).expect("session core");
    let bad: Vec<String> = imported_modules(&source)
        .into_iter()
        .filter(|m| !SESSION_CORE_IMPORTS.contains(&m.as_str()))
        .collect();
    assert!(
        bad.is_empty(),
        "src/session/table.rs imports {bad:?}; it may import only {SESSION_CORE_IMPORTS:?}"
    );
}

#[test]
fn the_sans_io_checks_see_what_they_forbid() {
    let src = "use std::sync::Mutex;\nuse tokio::time::sleep;\n// tokio in a comment\n\
               fn f() { let _ = std::time::Instant::now(); }\n\
               #[cfg(test)]\nmod tests {\n    use tokio::time::pause;\n}\n";
    assert_eq!(
        sans_io_violations(src),
        vec!["1: `Mutex`", "2: `tokio`", "4: `Instant::now`"]
    );
    let src = "use super::quota::Owner;\nuse super::session::Live;\nuse crate::process::X;\n\
               #[cfg(test)]\nmod tests {\n    use super::*;\n}\n";
    assert_eq!(imported_modules(src), vec!["process", "quota", "session"]);
}
