//! The Python side of the interoperability tests: the tests' own virtual environment
//! (`target/interop-venv`), built on first use from `tests/interop/requirements.txt`, and the
//! scripts in `tests/interop/` written from the spec, not from our code.
//!
//! Without Python the tests that need it FAIL with what to install: they never skip.
//! `EXECRELAY_INTEROP_PYTHON` names an interpreter to use instead, which must already have the
//! packages.

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use tokio::process::Command;

use super::text;

/// The independent Noise client (`noise_client.py`).
pub const CLIENT_SCRIPT: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/tests/interop/noise_client.py");
/// The client that pauses its reader under load (`pause_client.py`).
pub const PAUSE_SCRIPT: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/tests/interop/pause_client.py");
pub const REQUIREMENTS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/interop/requirements.txt"
);
/// The modules the client imports.
const IMPORT_CHECK: &str = "import noise.connection, websockets.sync.client, cryptography";
/// Hang guard for `python3 -m venv` (a few seconds normally).
const VENV_TIMEOUT: Duration = Duration::from_secs(120);
/// Hang guard for installing the requirements (downloads a few MB from PyPI).
const PIP_TIMEOUT: Duration = Duration::from_secs(600);
/// Written into the virtual environment once it holds the requirements: their text, so that a
/// changed requirements file rebuilds it.
const READY_STAMP: &str = ".execrelay-requirements";

/// The interpreter that runs the client: `EXECRELAY_INTEROP_PYTHON`, or the tests' own
/// virtual environment, built on first use. Once per test process; a failure (with what to
/// install) fails every test that needs it.
pub async fn python() -> String {
    static PYTHON: tokio::sync::OnceCell<Result<String, String>> =
        tokio::sync::OnceCell::const_new();
    let got = PYTHON
        .get_or_init(|| async {
            match std::env::var("EXECRELAY_INTEROP_PYTHON") {
                Ok(py) => check_imports(&py).await.map(|()| py),
                Err(_) => prepare_venv().await,
            }
        })
        .await;
    match got {
        Ok(py) => py.clone(),
        Err(why) => panic!("{why}"),
    }
}

/// `target/interop-venv` (beside `CARGO_TARGET_TMPDIR`, so it follows `CARGO_TARGET_DIR`).
fn venv_dir() -> PathBuf {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    tmp.parent().unwrap_or(tmp).join("interop-venv")
}

/// Run `cmd` within `limit`; its output, or why it could not run.
pub async fn run_for(cmd: &mut Command, limit: Duration) -> Result<Output, String> {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| e.to_string())?;
    tokio::time::timeout(limit, child.wait_with_output())
        .await
        .map_err(|_| format!("no exit within {limit:?} (hang guard)"))?
        .map_err(|e| e.to_string())
}

async fn check_imports(py: &str) -> Result<(), String> {
    check_imports_of(py, IMPORT_CHECK, REQUIREMENTS).await
}

/// Whether `py` runs `code` (its imports): if not, what to install from `requirements`.
async fn check_imports_of(py: &str, code: &str, requirements: &str) -> Result<(), String> {
    let out = run_for(Command::new(py).args(["-c", code]), VENV_TIMEOUT)
        .await
        .map_err(|e| format!("cannot run `{py}`: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "`{py}` lacks the packages it needs: run `{py} -m pip install -r {requirements}`\n{}",
        text(&out.stderr)
    ))
}

/// Build (or reuse) the interop client's virtual environment and return its interpreter.
async fn prepare_venv() -> Result<String, String> {
    let hint = format!(
        "Or set EXECRELAY_INTEROP_PYTHON to an interpreter with the packages of {REQUIREMENTS}."
    );
    requirements_venv(
        &venv_dir(),
        Path::new(REQUIREMENTS),
        "the Noise interop test",
        &hint,
        Some(IMPORT_CHECK),
    )
    .await
}

/// The interpreter of a virtual environment at `venv` holding `requirements`: reused while
/// its stamp equals the requirements' text (and `imports`, when given, import), else built
/// from scratch with `python3 -m venv` and pip. One builder at a time, across the tests of
/// this process and other test processes (a lock file beside it). Errors say what to
/// install; `needed_by` names who needs it, `hint` is added to the install advice.
pub async fn requirements_venv(
    venv: &Path,
    requirements: &Path,
    needed_by: &str,
    hint: &str,
    imports: Option<&str>,
) -> Result<String, String> {
    let py = venv.join("bin").join("python3").display().to_string();
    let reqs_name = requirements.display().to_string();
    let wanted =
        std::fs::read_to_string(requirements).map_err(|e| format!("read {reqs_name}: {e}"))?;
    let lock_path = venv.with_extension("lock");
    let _lock = tokio::task::spawn_blocking(move || {
        if let Some(dir) = lock_path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        let file = std::fs::File::create(&lock_path)
            .map_err(|e| format!("{}: {e}", lock_path.display()))?;
        nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| format!("lock {}: {e}", lock_path.display()))
    })
    .await
    .map_err(|e| e.to_string())??;

    let imports_ok = |py: String| {
        let reqs = reqs_name.clone();
        async move {
            match imports {
                Some(code) => check_imports_of(&py, code, &reqs).await,
                None => Ok(()),
            }
        }
    };
    let stamp = venv.join(READY_STAMP);
    if std::fs::read_to_string(&stamp).ok().as_deref() == Some(wanted.as_str())
        && imports_ok(py.clone()).await.is_ok()
    {
        return Ok(py);
    }
    // Missing, stale or broken: build it from scratch.
    if venv.exists() {
        std::fs::remove_dir_all(venv).map_err(|e| format!("{}: {e}", venv.display()))?;
    }
    let out = run_for(
        Command::new("python3").arg("-m").arg("venv").arg(venv),
        VENV_TIMEOUT,
    )
    .await
    .map_err(|e| {
        format!(
            "{needed_by} needs Python 3 (`python3`) to build its virtual environment: {e}. \
             Install it (Debian: `apt-get install python3 python3-venv`). {hint}"
        )
    })?;
    if !out.status.success() {
        return Err(format!(
            "`python3 -m venv {}` failed. On Debian and Ubuntu the venv module is a package of \
             its own: `apt-get install python3-venv`. {hint}\n{}{}",
            venv.display(),
            text(&out.stdout),
            text(&out.stderr)
        ));
    }
    let out = run_for(
        Command::new(&py)
            .args([
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--quiet",
            ])
            .arg("-r")
            .arg(requirements),
        PIP_TIMEOUT,
    )
    .await
    .map_err(|e| format!("{py} -m pip install -r {reqs_name}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "`{py} -m pip install -r {reqs_name}` failed (it needs PyPI, or a mirror \
             configured for pip):\n{}{}",
            text(&out.stdout),
            text(&out.stderr)
        ));
    }
    imports_ok(py.clone()).await?;
    std::fs::write(&stamp, &wanted).map_err(|e| format!("{}: {e}", stamp.display()))?;
    Ok(py)
}
