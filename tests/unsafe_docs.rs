//! Every `unsafe fn` of the crate has a `# Safety` section in its doc comment, saying what its
//! caller must guarantee (clippy's `missing_safety_doc` checks public functions only; the
//! crate's are private; `unsafe` blocks are held to `// SAFETY:` comments by
//! `clippy::undocumented_unsafe_blocks` in `src/lib.rs`). Reads the sources under `src/`.
//! Also: the files of `src/` and `relay/src/` that hold `unsafe` are exactly the ones
//! `ARCHITECTURE.md` lists (section "`unsafe`").

use std::path::Path;

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src/") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The `unsafe fn`s of `text` (by line number) whose doc comment lacks `# Safety`.
fn undocumented(text: &str) -> Vec<usize> {
    let lines: Vec<&str> = text.lines().collect();
    let mut missing = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let code = line.trim_start();
        let declares = ["unsafe fn ", "pub unsafe fn ", "pub(crate) unsafe fn "]
            .iter()
            .any(|p| code.starts_with(p));
        if !declares {
            continue;
        }
        // The doc comment and attributes right above the declaration.
        let doc = lines[..i]
            .iter()
            .rev()
            .map(|l| l.trim_start())
            .take_while(|l| l.starts_with("///") || l.starts_with("#["));
        if !doc.into_iter().any(|l| l.trim_end() == "/// # Safety") {
            missing.push(i + 1);
        }
    }
    missing
}

#[test]
fn every_unsafe_fn_has_a_safety_section() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut missing = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).expect("read a source file");
        for line in undocumented(&text) {
            missing.push(format!("{}:{line}", f.display()));
        }
    }
    assert!(
        missing.is_empty(),
        "`unsafe fn` without `# Safety`: {missing:?}"
    );
}

#[test]
fn the_check_sees_a_missing_section() {
    let bad = "/// Does things.\nunsafe fn f() {}\n";
    let good = "/// Does things.\n///\n/// # Safety\n///\n/// Only in a child.\n#[inline]\nunsafe fn f() {}\n";
    assert_eq!(undocumented(bad), vec![2]);
    assert!(undocumented(good).is_empty());
}

/// Whether `text` holds `unsafe` code (a block, fn, impl or trait; comments aside).
fn holds_unsafe(text: &str) -> bool {
    text.lines().any(|l| {
        let code = l.split("//").next().unwrap_or("");
        [
            "unsafe {",
            "unsafe fn ",
            "unsafe impl",
            "unsafe trait",
            "unsafe extern",
        ]
        .iter()
        .any(|k| code.contains(k))
    })
}

/// The files `ARCHITECTURE.md` lists between its `unsafe-sites` markers.
fn listed_sites(doc: &str) -> Vec<String> {
    let start = doc
        .find("<!-- unsafe-sites -->")
        .expect("ARCHITECTURE.md: the start marker");
    let end = doc
        .find("<!-- /unsafe-sites -->")
        .expect("ARCHITECTURE.md: the end marker");
    doc[start..end]
        .lines()
        .filter_map(|l| l.strip_prefix("- `"))
        .filter_map(|l| l.split('`').next())
        .map(String::from)
        .collect()
}

#[test]
fn the_unsafe_sites_are_the_ones_architecture_lists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    for dir in ["src", "protocol/src", "io/src", "relay/src"] {
        let mut files = Vec::new();
        rust_files(&root.join(dir), &mut files);
        for f in files {
            let text = std::fs::read_to_string(&f).expect("read a source file");
            if holds_unsafe(&text) {
                let rel = f.strip_prefix(root).expect("under the repository");
                found.push(rel.display().to_string());
            }
        }
    }
    found.sort();
    let doc = std::fs::read_to_string(root.join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let mut listed = listed_sites(&doc);
    listed.sort();
    assert_eq!(
        found, listed,
        "files holding `unsafe` (left) against ARCHITECTURE.md's list (right)"
    );
}

#[test]
fn the_unsafe_checks_see_what_they_look_for() {
    assert!(holds_unsafe("fn f() {\n    let r = unsafe { g() };\n}\n"));
    assert!(holds_unsafe("unsafe fn f() {}\n"));
    assert!(!holds_unsafe(
        "// unsafe { in a comment }\n#![forbid(unsafe_code)]\n"
    ));
    let doc = "x\n<!-- unsafe-sites -->\n- `a/b.rs`: why.\n  more\n- `c.rs`: why.\n<!-- /unsafe-sites -->\n- `d.rs`\n";
    assert_eq!(listed_sites(doc), vec!["a/b.rs", "c.rs"]);
}
