//! No import circles between files: within each crate (`src/`, `protocol/src/`, `io/src/`,
//! `relay/src/`), the files
//! import one another (`use`, grouped lists and inline paths through `crate::`, `super::` and
//! `self::`, tests aside) without a circle. The layer rule orders modules; this orders the
//! files inside one.
//!
//! A path names the file of the deepest module it reaches (`super::quota::Owner` is
//! `quota.rs`; `crate::session::SessionError` is `session/mod.rs`). A module file's imports of
//! its own submodules (its `pub use child::X` re-exports and the like) are not edges: the
//! parent declares its children, and a child may use what its parent holds. A re-export is not
//! followed to the file that defines the item.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::{code_only, is_ident, rust_files, without_tests};

/// A module path, from the crate root (`[]` is `lib.rs`).
type ModPath = Vec<String>;

/// The module path of a file under a crate's `src/` (`None` for `main.rs`, another crate).
fn mod_path(rel: &Path) -> Option<ModPath> {
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let last = parts.pop()?;
    match last.as_str() {
        "lib.rs" if parts.is_empty() => {}
        "main.rs" if parts.is_empty() => return None,
        "mod.rs" => {}
        other => parts.push(other.trim_end_matches(".rs").to_string()),
    }
    Some(parts)
}

/// Every path of `code` (already stripped) that starts at `crate`, `super` or `self`, each
/// as its segments (a grouped `use a::{b, c::D}` gives one path per leaf), with its offset.
fn module_paths(code: &str) -> Vec<(usize, Vec<String>)> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let starts = ["crate::", "super::", "self::"]
            .iter()
            .find(|p| b[i..].starts_with(p.as_bytes()));
        let boundary = i == 0 || !(is_ident(b[i - 1]) || b[i - 1] == b'$' || b[i - 1] == b':');
        match starts {
            Some(_) if boundary => {
                let mut paths = Vec::new();
                let end = parse_path(b, i, Vec::new(), &mut paths);
                out.extend(paths.into_iter().map(|p| (i, p)));
                i = end.max(i + 1);
            }
            _ => i += 1,
        }
    }
    out
}

/// Parse the path at `i` below `prefix`, pushing each complete path to `out`; returns where
/// it ended.
fn parse_path(
    b: &[u8],
    mut i: usize,
    mut prefix: Vec<String>,
    out: &mut Vec<Vec<String>>,
) -> usize {
    let skip_ws = |mut i: usize| {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        i
    };
    loop {
        i = skip_ws(i);
        if b.get(i) == Some(&b'{') {
            i += 1;
            loop {
                i = skip_ws(i);
                match b.get(i) {
                    None => return i,
                    Some(b'}') => return i + 1,
                    Some(b',') => i += 1,
                    Some(_) => {
                        let before = i;
                        i = parse_path(b, i, prefix.clone(), out);
                        // Skip what follows a leaf (`as Name`) up to the next item.
                        while i < b.len() && b[i] != b',' && b[i] != b'}' {
                            i += 1;
                        }
                        if i == before {
                            i += 1;
                        }
                    }
                }
            }
        }
        let s = i;
        while i < b.len() && is_ident(b[i]) {
            i += 1;
        }
        if i == s {
            // `*`, or nothing: the path so far.
            out.push(prefix);
            return i;
        }
        let seg = String::from_utf8_lossy(&b[s..i]).into_owned();
        if seg != "self" || prefix.is_empty() {
            prefix.push(seg);
        }
        let j = skip_ws(i);
        if b[j..].starts_with(b"::") {
            i = j + 2;
        } else {
            out.push(prefix);
            return i;
        }
    }
}

/// The module `path` names from module `own`, if it names one of `modules`: the deepest.
fn resolve(own: &[String], path: &[String], modules: &BTreeSet<ModPath>) -> Option<ModPath> {
    let mut at: ModPath = own.to_vec();
    let mut rest = path;
    match rest.first().map(String::as_str) {
        Some("crate") => {
            at.clear();
            rest = &rest[1..];
        }
        Some("self") | Some("super") => {
            while let Some(seg) = rest.first() {
                match seg.as_str() {
                    "super" => {
                        at.pop()?;
                    }
                    "self" => {}
                    _ => break,
                }
                rest = &rest[1..];
            }
        }
        _ => return None,
    }
    for seg in rest {
        at.push(seg.clone());
        if !modules.contains(&at) {
            at.pop();
            break;
        }
    }
    Some(at)
}

/// The import graph of the crate whose sources are under `src`: file → files it imports.
pub fn import_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut by_mod: BTreeMap<ModPath, PathBuf> = BTreeMap::new();
    for f in &files {
        if let Some(m) = mod_path(f.strip_prefix(src).expect("under src/")) {
            by_mod.insert(m, f.clone());
        }
    }
    let sources: Vec<(ModPath, String)> = by_mod
        .iter()
        .map(|(m, f)| {
            let text = std::fs::read_to_string(f).expect("read source");
            (m.clone(), text)
        })
        .collect();
    let name = |m: &ModPath| {
        let f = &by_mod[m];
        f.strip_prefix(src)
            .expect("under src/")
            .display()
            .to_string()
    };
    graph_of(&sources, name)
}

/// The import graph of `sources` (module path, text), files named by `name`.
fn graph_of(
    sources: &[(ModPath, String)],
    name: impl Fn(&ModPath) -> String,
) -> BTreeMap<String, BTreeSet<String>> {
    let modules: BTreeSet<ModPath> = sources.iter().map(|(m, _)| m.clone()).collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (own, text) in sources {
        let code = code_only(without_tests(text));
        let edges = graph.entry(name(own)).or_default();
        for (_, path) in module_paths(&code) {
            let Some(target) = resolve(own, &path, &modules) else {
                continue;
            };
            // Itself, or one of its own submodules (the parent declares its children).
            if target.starts_with(own) {
                continue;
            }
            edges.insert(name(&target));
        }
    }
    graph
}

/// The circles of `graph`: each strongly connected set of two or more files (Tarjan).
pub fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct St<'a> {
        g: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(st: &mut St<'a>, v: &'a str) {
        st.index.insert(v, st.next);
        st.low.insert(v, st.next);
        st.next += 1;
        st.stack.push(v);
        st.on.insert(v);
        let g = st.g;
        for w in g.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !st.index.contains_key(w) {
                visit(st, w);
                let lw = st.low[w];
                let lv = st.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if st.on.contains(w) {
                let iw = st.index[w];
                let lv = st.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if st.low[v] == st.index[v] {
            let mut set = Vec::new();
            while let Some(w) = st.stack.pop() {
                st.on.remove(w);
                set.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if set.len() > 1 {
                set.sort();
                st.out.push(set);
            }
        }
    }
    let mut st = St {
        g: graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !st.index.contains_key(v.as_str()) {
            visit(&mut st, v);
        }
    }
    st.out
}

/// `min_files`: fewer files than that means the walk went wrong (a moved folder).
fn assert_no_circles(crate_dir: &str, min_files: usize) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(crate_dir);
    let graph = import_graph(&src);
    assert!(
        graph.len() >= min_files,
        "found only {} files under {crate_dir}",
        graph.len()
    );
    let found = circles(&graph);
    let shown: Vec<String> = found.iter().map(|c| c.join(" <-> ")).collect();
    assert!(
        found.is_empty(),
        "import circles between files of {crate_dir} (ARCHITECTURE.md, \"Invariants\"):\n{}",
        shown.join("\n")
    );
}

#[test]
fn no_import_circles_between_the_files_of_the_exec_server() {
    assert_no_circles("src", 100);
}

#[test]
fn no_import_circles_between_the_files_of_the_link_engine() {
    assert_no_circles("protocol/src", 20);
}

#[test]
fn no_import_circles_between_the_files_of_the_shared_io_crate() {
    assert_no_circles("io/src", 15);
}

#[test]
fn no_import_circles_between_the_files_of_the_relay_server() {
    assert_no_circles("relay/src", 8);
}

// The checker, checked.

fn m(s: &str) -> ModPath {
    if s.is_empty() {
        Vec::new()
    } else {
        s.split('/').map(String::from).collect()
    }
}

fn fake(files: &[(&str, &str)]) -> BTreeMap<String, BTreeSet<String>> {
    let sources: Vec<(ModPath, String)> =
        files.iter().map(|(p, t)| (m(p), t.to_string())).collect();
    graph_of(&sources, |p| {
        if p.is_empty() {
            "lib".into()
        } else {
            p.join("/")
        }
    })
}

#[test]
fn paths_are_read_from_use_lists_groups_and_inline_code() {
    let code = code_only(
        "use super::quota::Owner;\nuse crate::{a::X, b::{self, c::Y}};\n\
         use super::super::z::*;\nfn f() { let _ = self::w::g(); } // super::not::this\n",
    );
    let paths: Vec<String> = module_paths(&code)
        .into_iter()
        .map(|(_, p)| p.join("::"))
        .collect();
    assert_eq!(
        paths,
        vec![
            "super::quota::Owner",
            "crate::a::X",
            "crate::b",
            "crate::b::c::Y",
            "super::super::z",
            "self::w::g",
        ]
    );
}

#[test]
fn a_circle_is_found_and_a_parent_declaring_its_children_is_not_one() {
    let g = fake(&[
        ("", "pub mod s;\npub mod t;\n"),
        ("s", "mod a;\nmod b;\npub use a::A;\npub use b::B;\n"),
        ("s/a", "use super::b::B;\npub struct A;\n"),
        ("s/b", "use crate::s::a::A;\npub struct B;\n"),
        (
            "t",
            "use crate::s::A;\n#[cfg(test)]\nmod tests {\n    use crate::t::*;\n}\n",
        ),
    ]);
    assert_eq!(g["s/a"], BTreeSet::from(["s/b".to_string()]));
    assert_eq!(g["t"], BTreeSet::from(["s".to_string()]));
    assert!(
        g["s"].is_empty(),
        "s only declares and re-exports its children"
    );
    assert_eq!(
        circles(&g),
        vec![vec!["s/a".to_string(), "s/b".to_string()]]
    );

    let g = fake(&[
        ("", "pub mod s;\n"),
        ("s", "mod a;\nmod b;\n"),
        ("s/a", "use super::b::B;\npub struct A;\n"),
        ("s/b", "pub struct B;\nfn f() -> super::s::Nothing {}\n"),
    ]);
    assert!(circles(&g).is_empty(), "{g:?}");
}
