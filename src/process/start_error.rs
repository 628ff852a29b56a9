//! Why a child could not be started, in terms a person and a client can act on (`protocol.md`
//! §2, `-32007`): **what** failed (the program, the working directory, the terminal, or
//! something else), **which path**, and the OS error's **name** (`ENOENT`), so a client maps a
//! missing program to 127 and one that cannot be executed to 126 as shells do, without reading
//! the message.
//!
//! `std` reports a failed `chdir` or `execvp` in the child as a bare errno: the same
//! `ENOENT` for a missing directory and a missing program. [`classify`] tells them apart
//! after the fact by looking at the working directory and the program the child would have
//! run (the lookup `execvp` does, `policy/resolve.rs`), only when a spawn has already failed:
//! it never refuses a start on its own guess. It must never spawn, and never look at anything
//! but the spec's paths.

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};

use super::spawn::SpawnSpec;
use crate::policy::resolve::resolve_program;

/// Which part of a start failed (`data.what` of `-32007`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartWhat {
    /// The program: not found, not executable, not an executable format.
    Program,
    /// The working directory: missing, not a directory, not searchable.
    Cwd,
    /// The pseudo-terminal could not be opened.
    Pty,
    /// Anything else (out of descriptors or memory, the session's scope, …).
    Other,
}

impl StartWhat {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            StartWhat::Program => "program",
            StartWhat::Cwd => "cwd",
            StartWhat::Pty => "pty",
            StartWhat::Other => "other",
        }
    }
}

/// A start that failed: what, which path, and the OS error (its number and text, kept as
/// plain values so the error can be handed to every start that joined it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartError {
    /// What failed.
    pub what: StartWhat,
    /// The program (as given, or as resolved), the directory, or the program for `other`.
    pub path: String,
    /// The OS error number, when there is one.
    pub errno: Option<i32>,
    /// The OS error's text.
    pub detail: String,
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message())
    }
}

impl std::error::Error for StartError {}

impl StartError {
    /// A failure of `what` at `path` with the OS error `e`.
    pub fn new(what: StartWhat, path: impl Into<String>, e: &io::Error) -> StartError {
        StartError {
            what,
            path: path.into(),
            errno: e.raw_os_error(),
            detail: strip_os_error_suffix(&e.to_string()),
        }
    }

    /// The errno's symbolic name (`ENOENT`), `UNKNOWN` for an error without a number.
    pub fn errno_name(&self) -> String {
        match self.errno {
            Some(n) => match nix::errno::Errno::from_raw(n) {
                nix::errno::Errno::UnknownErrno => format!("E{n}"),
                e => format!("{e:?}"),
            },
            None => "UNKNOWN".into(),
        }
    }

    /// Whether the server ran out of descriptors (its own trouble, not the client's request).
    pub fn out_of_descriptors(&self) -> bool {
        matches!(self.errno, Some(libc::EMFILE | libc::ENFILE))
    }

    /// The message a person reads: `program "nosuchprog" not found in PATH`,
    /// `cwd "/x": no such directory`, …
    pub fn message(&self) -> String {
        let path = quoted(&self.path);
        match (self.what, self.errno) {
            (StartWhat::Program, Some(libc::ENOENT)) if !self.path.contains('/') => {
                format!("program {path} not found in PATH")
            }
            (StartWhat::Program, Some(libc::ENOENT)) => format!("program {path}: no such file"),
            (StartWhat::Program, Some(libc::EACCES)) => {
                format!("program {path}: permission denied (not executable)")
            }
            (StartWhat::Program, Some(libc::ENOEXEC)) => {
                format!("program {path}: not an executable format")
            }
            (StartWhat::Program, _) => format!("program {path}: {}", self.detail),
            (StartWhat::Cwd, Some(libc::ENOENT)) => format!("cwd {path}: no such directory"),
            (StartWhat::Cwd, Some(libc::ENOTDIR)) => format!("cwd {path}: not a directory"),
            (StartWhat::Cwd, Some(libc::EACCES)) => format!("cwd {path}: permission denied"),
            (StartWhat::Cwd, _) => format!("cwd {path}: {}", self.detail),
            (StartWhat::Pty, _) => format!("cannot open a terminal: {}", self.detail),
            (StartWhat::Other, _) if self.out_of_descriptors() => format!(
                "cannot start {path}: the server is out of file descriptors ({})",
                self.detail
            ),
            (StartWhat::Other, _) => format!("cannot start {path}: {}", self.detail),
        }
    }
}

/// `path` as a JSON string literal (quotes, escapes): the messages quote what the client sent.
fn quoted(path: &str) -> String {
    serde_json::Value::String(path.to_owned()).to_string()
}

/// `No such file or directory (os error 2)` → `No such file or directory`: the errno's name
/// travels on its own.
fn strip_os_error_suffix(text: &str) -> String {
    match text.rfind(" (os error ") {
        Some(i) if text.ends_with(')') => text[..i].to_string(),
        _ => text.to_string(),
    }
}

/// Errors of `execve` that are the program's (the file, its interpreter, its path).
const PROGRAM_ERRNOS: [i32; 9] = [
    libc::ENOENT,
    libc::EACCES,
    libc::ENOEXEC,
    libc::ENOTDIR,
    libc::ELOOP,
    libc::ENAMETOOLONG,
    libc::ETXTBSY,
    libc::EISDIR,
    libc::EPERM,
];

/// Why the spawn of `spec` failed with `e` (from `fork`/`chdir`/`execvp` in `std`): the
/// working directory when it cannot be entered, else the program for the errors `execve`
/// gives about a program, else `other`.
pub fn classify(spec: &SpawnSpec, e: &io::Error) -> StartError {
    let program = spec.argv.first().map(String::as_str).unwrap_or("");
    if let Some(cwd) = &spec.cwd {
        if let Some(err) = cwd_problem(Path::new(cwd)) {
            return StartError::new(StartWhat::Cwd, cwd.clone(), &err);
        }
    }
    match e.raw_os_error() {
        Some(n) if PROGRAM_ERRNOS.contains(&n) => {
            let path = resolved(spec).map_or_else(
                || program.to_string(),
                |p| {
                    if program.contains('/') {
                        program.to_string()
                    } else {
                        p.display().to_string()
                    }
                },
            );
            StartError::new(StartWhat::Program, path, e)
        }
        _ => StartError::new(StartWhat::Other, program, e),
    }
}

/// Why `chdir(dir)` would fail, if it would: missing, not a directory, not searchable.
fn cwd_problem(dir: &Path) -> Option<io::Error> {
    match std::fs::metadata(dir) {
        Err(e) => Some(e),
        Ok(m) if !m.is_dir() => Some(io::Error::from_raw_os_error(libc::ENOTDIR)),
        Ok(_) => nix::unistd::access(dir, nix::unistd::AccessFlags::X_OK)
            .err()
            .map(|e| io::Error::from_raw_os_error(e as i32)),
    }
}

/// The file `execvp` would run for `spec` (its `PATH` and working directory), if any.
fn resolved(spec: &SpawnSpec) -> Option<PathBuf> {
    let program = spec.argv.first()?;
    let cwd = match &spec.cwd {
        Some(c) => PathBuf::from(c),
        None => std::env::current_dir().ok()?,
    };
    let overlay = spec.env.iter().rev().find(|(k, _)| k == "PATH");
    let path_var: Option<OsString> = match overlay {
        Some((_, v)) => v.as_ref().map(OsString::from),
        None if spec.inherit_env => std::env::var_os("PATH"),
        None => None,
    };
    resolve_program(program, &cwd, path_var.as_deref())
        .ok()
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn spec(argv: &[&str], cwd: Option<&str>) -> SpawnSpec {
        SpawnSpec {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            cwd: cwd.map(str::to_string),
            env: Vec::new(),
            inherit_env: true,
            tty: None,
            pipe_stdin: false,
        }
    }

    fn errno(n: i32) -> io::Error {
        io::Error::from_raw_os_error(n)
    }

    #[test]
    fn a_missing_program_and_a_missing_directory_are_told_apart() {
        let e = classify(&spec(&["nosuchprog-xyz"], None), &errno(libc::ENOENT));
        assert_eq!(e.what, StartWhat::Program);
        assert_eq!(e.path, "nosuchprog-xyz");
        assert_eq!(e.errno_name(), "ENOENT");
        assert_eq!(e.message(), "program \"nosuchprog-xyz\" not found in PATH");

        let t = tempfile::tempdir().unwrap();
        let gone = t.path().join("gone");
        let e = classify(
            &spec(&["sh"], Some(gone.to_str().unwrap())),
            &errno(libc::ENOENT),
        );
        assert_eq!(e.what, StartWhat::Cwd);
        assert_eq!(e.path, gone.to_str().unwrap());
        assert_eq!(e.errno_name(), "ENOENT");
        assert_eq!(e.message(), format!("cwd {:?}: no such directory", gone));

        let file = t.path().join("file");
        std::fs::write(&file, "x").unwrap();
        let e = classify(
            &spec(&["sh"], Some(file.to_str().unwrap())),
            &errno(libc::ENOTDIR),
        );
        assert_eq!((e.what, e.errno_name()), (StartWhat::Cwd, "ENOTDIR".into()));
        assert!(
            e.message().ends_with(": not a directory"),
            "{}",
            e.message()
        );
    }

    #[test]
    fn a_program_that_cannot_be_executed_names_its_path() {
        let t = tempfile::tempdir().unwrap();
        let script = t.path().join("noexec");
        std::fs::write(&script, "echo hi\n").unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
        let p = script.to_str().unwrap();
        let e = classify(&spec(&[p], None), &errno(libc::EACCES));
        assert_eq!((e.what, e.path.as_str()), (StartWhat::Program, p));
        assert_eq!(e.errno_name(), "EACCES");
        assert_eq!(
            e.message(),
            format!("program {p:?}: permission denied (not executable)")
        );
        let e = classify(&spec(&[p], None), &errno(libc::ENOEXEC));
        assert_eq!(e.errno_name(), "ENOEXEC");
        assert_eq!(
            e.message(),
            format!("program {p:?}: not an executable format")
        );
        // A name found in PATH is reported by the path `execvp` ran.
        let e = classify(&spec(&["sh"], None), &errno(libc::ENOEXEC));
        assert!(e.path.ends_with("/sh"), "{}", e.path);
    }

    #[test]
    fn other_failures_are_other_and_keep_the_os_text() {
        let e = classify(&spec(&["sh"], None), &errno(libc::EMFILE));
        assert_eq!(
            (e.what, e.errno_name()),
            (StartWhat::Other, "EMFILE".into())
        );
        assert!(e.out_of_descriptors());
        assert!(
            e.message().starts_with(
                "cannot start \"sh\": the server is out of file descriptors (Too many open files"
            ),
            "{}",
            e.message()
        );
        let e = StartError::new(StartWhat::Pty, "", &errno(libc::ENXIO));
        assert_eq!(e.errno_name(), "ENXIO");
        assert!(
            e.message().starts_with("cannot open a terminal: "),
            "{}",
            e.message()
        );
        let e = StartError::new(StartWhat::Other, "x", &io::Error::other("odd"));
        assert_eq!(e.errno_name(), "UNKNOWN");
        assert_eq!(e.message(), "cannot start \"x\": odd");
    }
}
