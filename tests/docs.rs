//! The protocol documents in `docs/` are the specification's revision `docs/README.md` names:
//! each file's SHA-256 is the one listed there, and where the specification's folder is
//! present beside the repository (`../shared/spec/`, as on the developers' machines and in
//! CI) the copies are the same as the originals, so a change of the spec is noticed.

use sha2::{Digest, Sha256};

const DOCS: [&str; 3] = ["protocol.md", "processes.md", "secure-transport.md"];

fn root() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn each_document_is_the_revision_docs_readme_names() {
    let readme = std::fs::read_to_string(root().join("docs/README.md")).expect("docs/README.md");
    for name in DOCS {
        let text = std::fs::read(root().join("docs").join(name)).expect(name);
        let sum = hex(&Sha256::digest(&text));
        let row = readme
            .lines()
            .find(|l| l.starts_with(&format!("| `{name}` |")))
            .unwrap_or_else(|| panic!("docs/README.md has no row for {name}"));
        assert!(
            row.contains(&format!("`{sum}`")),
            "docs/{name} is not the revision docs/README.md names (its SHA-256 is {sum}): update the row with the copy"
        );
    }
}

#[test]
fn the_documents_are_kept_in_step_with_the_specification() {
    let spec = root().join("..").join("shared").join("spec");
    let spec = if spec.is_dir() {
        spec
    } else {
        let other = root().join("..").join("..").join("shared").join("spec");
        if !other.is_dir() {
            eprintln!("SKIPPED: no specification folder beside the repository to compare with");
            return;
        }
        other
    };
    for name in DOCS {
        let ours = std::fs::read(root().join("docs").join(name)).expect(name);
        let theirs = std::fs::read(spec.join(name)).expect(name);
        assert!(
            ours == theirs,
            "docs/{name} differs from {}: copy the new revision and update docs/README.md",
            spec.join(name).display()
        );
    }
}
