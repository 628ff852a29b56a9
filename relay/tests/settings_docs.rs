//! The relay's settings as documented: the README's relay configuration table is the one
//! `SETTINGS` generates (each row: name, default from its constant, what it bounds), so the
//! documentation cannot drift from the code.

use execrelay_relay::server::settings::{SETTINGS, TEXT_SETTINGS};

#[test]
fn the_readme_table_is_the_generated_one() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("README.md");
    // The numbers, then the words (`trusted_front`), in one table.
    let rows: Vec<String> = SETTINGS
        .iter()
        .map(|s| s.readme_row())
        .chain(TEXT_SETTINGS.iter().map(|s| s.readme_row()))
        .collect();
    let missing: Vec<&String> = rows
        .iter()
        .filter(|r| !readme.contains(r.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "README.md's relay table differs; it should hold these rows, in order:\n{}",
        rows.join("\n")
    );
    // In order, one block.
    let block = rows.join("\n");
    assert!(readme.contains(&block), "rows out of order:\n{block}");
}
