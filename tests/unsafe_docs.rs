//! Every `unsafe fn` of the crate has a `# Safety` section in its doc comment, saying what its
//! caller must guarantee (clippy's `missing_safety_doc` checks public functions only; the
//! crate's are private; `unsafe` blocks are held to `// SAFETY:` comments by
//! `clippy::undocumented_unsafe_blocks` in `src/lib.rs`). Reads the sources under `src/`.

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
