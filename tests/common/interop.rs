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
async fn run_for(cmd: &mut Command, limit: Duration) -> Result<Output, String> {
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
    let out = run_for(Command::new(py).args(["-c", IMPORT_CHECK]), VENV_TIMEOUT)
        .await
        .map_err(|e| format!("the Noise interop test cannot run `{py}`: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "`{py}` lacks the interop client's packages: run `{py} -m pip install -r {REQUIREMENTS}`\n{}",
        text(&out.stderr)
    ))
}

/// Build (or reuse) the tests' virtual environment and return its interpreter.
async fn prepare_venv() -> Result<String, String> {
    let venv = venv_dir();
    let venv_python = venv.join("bin").join("python3");
    let py = venv_python.display().to_string();
    let requirements =
        std::fs::read_to_string(REQUIREMENTS).map_err(|e| format!("read {REQUIREMENTS}: {e}"))?;
    // One builder at a time, across the tests of this process and other test processes.
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

    let stamp = venv.join(READY_STAMP);
    if std::fs::read_to_string(&stamp).ok().as_deref() == Some(requirements.as_str())
        && check_imports(&py).await.is_ok()
    {
        return Ok(py);
    }
    // Missing, stale or broken: build it from scratch.
    if venv.exists() {
        std::fs::remove_dir_all(&venv).map_err(|e| format!("{}: {e}", venv.display()))?;
    }
    let out = run_for(
        Command::new("python3").arg("-m").arg("venv").arg(&venv),
        VENV_TIMEOUT,
    )
    .await
    .map_err(|e| {
        format!(
            "the Noise interop test needs Python 3 (`python3`) to build its virtual \
             environment: {e}. Install it (Debian: `apt-get install python3 python3-venv`), \
             or set EXECRELAY_INTEROP_PYTHON to an interpreter with the packages of \
             {REQUIREMENTS}"
        )
    })?;
    if !out.status.success() {
        return Err(format!(
            "`python3 -m venv {}` failed. On Debian and Ubuntu the venv module is a package of \
             its own: `apt-get install python3-venv`. Or set EXECRELAY_INTEROP_PYTHON to an \
             interpreter with the packages of {REQUIREMENTS}.\n{}{}",
            venv.display(),
            text(&out.stdout),
            text(&out.stderr)
        ));
    }
    let out = run_for(
        Command::new(&venv_python)
            .args([
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--quiet",
            ])
            .arg("-r")
            .arg(REQUIREMENTS),
        PIP_TIMEOUT,
    )
    .await
    .map_err(|e| format!("{py} -m pip install -r {REQUIREMENTS}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "`{py} -m pip install -r {REQUIREMENTS}` failed (it needs PyPI, or a mirror \
             configured for pip):\n{}{}",
            text(&out.stdout),
            text(&out.stderr)
        ));
    }
    check_imports(&py).await?;
    std::fs::write(&stamp, &requirements).map_err(|e| format!("{}: {e}", stamp.display()))?;
    Ok(py)
}
