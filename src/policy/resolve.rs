//! The program's **resolved path**: which file `execvp` will run for the child, the second
//! name an exec policy rule is matched against (`argv[0]` is the first).
//!
//! The child is started by `execvp` after its environment and working directory are set
//! (`process/spawn.rs`), so the lookup here uses the **child's** effective `PATH` and `cwd`:
//!
//! - `argv[0]` with a `/`: that path; a relative one is taken from the child's working
//!   directory (`.` components dropped, nothing else rewritten). It need not exist.
//! - otherwise each entry of the child's `PATH` in order (an empty entry is the working
//!   directory, a relative one is taken from it; an unset `PATH` is glibc's default
//!   `/bin:/usr/bin`): the first `ENTRY/argv[0]` that is a regular file with an execute bit.
//!   None found: no resolved path (the spawn will fail with `ENOENT` anyway).
//!
//! **Symlinks are not canonicalised**: the resolved path is the one `execve` is given, the
//! name the operator sees in `PATH`. Canonicalising would fold every program of a multi-call
//! binary (busybox, coreutils' single binary: `/bin/rm` → `/bin/busybox`) into one name that
//! no rule could tell apart, and would buy no safety: a client that can run programs can copy
//! one under any name (the policy is not a sandbox, see `SECURITY.md`).

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

/// glibc's `PATH` for `execvp` when the variable is unset (`confstr(_CS_PATH)`).
pub const DEFAULT_EXEC_PATH: &str = "/bin:/usr/bin";

/// The most `PATH` entries one lookup examines. Each costs a `stat` (and a path built from
/// the entry and the program) on the server's runtime, and the client chooses `PATH`: without
/// a bound, one `process/start` of a few MiB held a worker thread for seconds. A lookup that
/// reaches this many entries without finding the program fails with [`PathTooLong`]: the
/// child's `execvp` would go on looking, so answering "not found" would let a client hide the
/// program from every rule on its resolved path behind junk entries. A real `PATH` has tens.
pub const MAX_PATH_LOOKUP_ENTRIES: usize = 1024;

/// The longest program name (`argv[0]` without a `/`) `execvp` looks up: glibc and musl fail
/// with `ENAMETOOLONG` above `NAME_MAX`, so nothing can run and nothing is looked up.
pub const MAX_LOOKUP_NAME_BYTES: usize = 255;

/// The lookup reached [`MAX_PATH_LOOKUP_ENTRIES`] entries of `PATH` without finding the
/// program: what the child would run cannot be told.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("PATH has more than {MAX_PATH_LOOKUP_ENTRIES} entries")]
pub struct PathTooLong;

/// The file `execvp(program)` runs for a child whose `PATH` is `path_var` (`None`: unset) and
/// whose working directory is `cwd` (absolute). `Ok(None)` when the lookup finds nothing (or
/// the name is too long for `execvp`); [`PathTooLong`] when it gave up (see
/// [`MAX_PATH_LOOKUP_ENTRIES`]).
pub fn resolve_program(
    program: &str,
    cwd: &Path,
    path_var: Option<&OsStr>,
) -> Result<Option<PathBuf>, PathTooLong> {
    if program.is_empty() {
        return Ok(None);
    }
    if program.contains('/') {
        return Ok(Some(clean(&cwd.join(program))));
    }
    if program.len() > MAX_LOOKUP_NAME_BYTES {
        return Ok(None);
    }
    let path_var = path_var.unwrap_or(OsStr::new(DEFAULT_EXEC_PATH));
    for (i, entry) in std::env::split_paths(path_var).enumerate() {
        if i == MAX_PATH_LOOKUP_ENTRIES {
            return Err(PathTooLong);
        }
        let dir = if entry.as_os_str().is_empty() {
            cwd.to_path_buf()
        } else {
            cwd.join(entry)
        };
        let candidate = clean(&dir.join(program));
        if is_executable_file(&candidate) {
            return Ok(Some(candidate));
        }
    }
    Ok(None)
}

/// `path` without `.` components (`Path::components` drops the inner ones; a leading one goes
/// too, as `path` is absolute here). `..` is kept: resolving it lexically would be wrong
/// across a symlink.
fn clean(path: &Path) -> PathBuf {
    path.components()
        .filter(|c| !matches!(c, Component::CurDir))
        .collect()
}

/// A regular file (after symlinks) with an execute bit, as `execve` needs.
fn is_executable_file(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn exe(dir: &Path, name: &str) -> PathBuf {
        let p = dir.join(name);
        fs::write(&p, "#!/bin/sh\n").unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    #[test]
    fn a_name_is_looked_up_in_the_childs_path_in_order() {
        let t = tempfile::tempdir().unwrap();
        let (a, b) = (t.path().join("a"), t.path().join("b"));
        fs::create_dir_all(&a).unwrap();
        fs::create_dir_all(&b).unwrap();
        exe(&b, "tool");
        let path = std::env::join_paths([&a, &b]).unwrap();
        assert_eq!(
            resolve_program("tool", Path::new("/"), Some(&path)),
            Ok(Some(b.join("tool")))
        );
        // The first entry wins once it has the program too.
        exe(&a, "tool");
        assert_eq!(
            resolve_program("tool", Path::new("/"), Some(&path)),
            Ok(Some(a.join("tool")))
        );
        assert_eq!(
            resolve_program("nope", Path::new("/"), Some(&path)),
            Ok(None)
        );
    }

    #[test]
    fn files_without_an_execute_bit_and_directories_are_skipped() {
        let t = tempfile::tempdir().unwrap();
        let (a, b) = (t.path().join("a"), t.path().join("b"));
        fs::create_dir_all(a.join("tool")).unwrap();
        fs::create_dir_all(&b).unwrap();
        fs::write(b.join("tool"), "x").unwrap();
        let c = t.path().join("c");
        fs::create_dir_all(&c).unwrap();
        exe(&c, "tool");
        let path = std::env::join_paths([&a, &b, &c]).unwrap();
        assert_eq!(
            resolve_program("tool", Path::new("/"), Some(&path)),
            Ok(Some(c.join("tool")))
        );
    }

    #[test]
    fn empty_and_relative_entries_are_taken_from_the_childs_cwd() {
        let t = tempfile::tempdir().unwrap();
        fs::create_dir_all(t.path().join("sub")).unwrap();
        exe(&t.path().join("sub"), "tool");
        exe(t.path(), "here");
        assert_eq!(
            resolve_program("tool", t.path(), Some(OsStr::new("sub"))),
            Ok(Some(t.path().join("sub/tool")))
        );
        assert_eq!(
            resolve_program("here", t.path(), Some(OsStr::new("/nonexistent:"))),
            Ok(Some(t.path().join("here")))
        );
    }

    #[test]
    fn a_path_with_a_slash_is_not_looked_up_and_symlinks_are_kept() {
        let t = tempfile::tempdir().unwrap();
        let real = exe(t.path(), "real");
        let link = t.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert_eq!(
            resolve_program("./link", t.path(), None),
            Ok(Some(link.clone())),
            "the symlink's own path, not its target"
        );
        assert_eq!(
            resolve_program("/x/./y", Path::new("/"), None),
            Ok(Some(PathBuf::from("/x/y")))
        );
        assert_eq!(
            resolve_program("a/../b", Path::new("/w"), None),
            Ok(Some(PathBuf::from("/w/a/../b"))),
            "`..` is never resolved lexically"
        );
        let path = std::env::join_paths([t.path()]).unwrap();
        assert_eq!(
            resolve_program("link", Path::new("/"), Some(&path)),
            Ok(Some(link))
        );
    }

    #[test]
    fn a_lookup_gives_up_after_its_bound_and_skips_names_execvp_refuses() {
        let t = tempfile::tempdir().unwrap();
        exe(t.path(), "tool");
        let junk = |n: usize| vec![PathBuf::from("/nonexistent"); n];
        // Found in the last entry the bound allows.
        let mut entries = junk(MAX_PATH_LOOKUP_ENTRIES - 1);
        entries.push(t.path().to_path_buf());
        let path = std::env::join_paths(&entries).unwrap();
        assert_eq!(
            resolve_program("tool", Path::new("/"), Some(&path)),
            Ok(Some(t.path().join("tool")))
        );
        // One entry further: the lookup gives up, it does not say "not found".
        let mut entries = junk(MAX_PATH_LOOKUP_ENTRIES);
        entries.push(t.path().to_path_buf());
        let path = std::env::join_paths(&entries).unwrap();
        assert_eq!(
            resolve_program("tool", Path::new("/"), Some(&path)),
            Err(PathTooLong)
        );
        // A name longer than NAME_MAX is never looked up (execvp fails with ENAMETOOLONG).
        let long = "x".repeat(MAX_LOOKUP_NAME_BYTES + 1);
        assert_eq!(
            resolve_program(&long, Path::new("/"), Some(&path)),
            Ok(None)
        );
    }

    #[test]
    fn an_unset_path_is_glibcs_default() {
        // `sh` is in /bin or /usr/bin on every system these tests run on.
        let r = resolve_program("sh", Path::new("/"), None)
            .ok()
            .flatten()
            .expect("sh in /bin:/usr/bin");
        assert!(
            r == Path::new("/bin/sh") || r == Path::new("/usr/bin/sh"),
            "{r:?}"
        );
        assert_eq!(resolve_program("", Path::new("/"), None), Ok(None));
    }
}
