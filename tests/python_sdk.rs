//! The Python package (`clients/python`) and the client conformance kit (`conformance/`),
//! run from the workspace's test command against the binaries this build made.
//!
//! - `python_package_tests`: installs the package with pip (from a copy of
//!   `clients/python`, so the source tree stays clean) into the tests' own virtual
//!   environment, `target/python-sdk-venv`, and runs its pytest suite
//!   (`clients/python/tests`: every README example, every transport, a resume under a cut
//!   link with 200 MB compared by SHA-256, 100 commands at once, approvals, refused keys, a
//!   missing program, and the server features not every server has yet).
//! - `conformance_python` / `conformance_rust`: `conformance/run.sh` with the Python
//!   package's adapter and with the Rust client library's (`examples/conformance-adapter`,
//!   built here when missing).
//!
//! Needs `python3` with the `venv` module (Debian: `python3-venv`) and PyPI reachable the
//! first time (the environment is reused while `clients/python/tests/requirements.txt` is
//! unchanged). Without Python these tests FAIL with what to install: they never skip. The
//! three run one at a time (a lock), each bounded by a hang guard.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use tokio::process::Command;

use common::interop::{requirements_venv, run_for};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
/// Hang guard for pip (downloads a few MB from PyPI on first use).
const PIP_TIMEOUT: Duration = Duration::from_secs(600);
/// Hang guard for the pytest suite (about two minutes on 2 loaded cores).
const PYTEST_TIMEOUT: Duration = Duration::from_secs(900);
/// Hang guard for one run of the conformance kit.
const KIT_TIMEOUT: Duration = Duration::from_secs(900);

/// One of these tests at a time: each starts servers and pushes hundreds of MB.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn requirements() -> PathBuf {
    Path::new(ROOT).join("clients/python/tests/requirements.txt")
}

fn target_dir() -> PathBuf {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    tmp.parent().unwrap_or(tmp).to_path_buf()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The environment's interpreter, with the requirements and the package freshly installed.
async fn python() -> String {
    static PY: tokio::sync::OnceCell<Result<String, String>> = tokio::sync::OnceCell::const_new();
    match PY.get_or_init(prepare).await {
        Ok(py) => py.clone(),
        Err(why) => panic!("{why}"),
    }
}

async fn prepare() -> Result<String, String> {
    let venv = target_dir().join("python-sdk-venv");
    let py = requirements_venv(
        &venv,
        &requirements(),
        "the Python package's tests",
        "",
        None,
    )
    .await?;
    // The package itself, every run (its sources change): from a copy, so pip's build
    // leaves nothing in the source tree; no build isolation, so nothing is downloaded.
    let copy = target_dir().join("python-sdk-build");
    if copy.exists() {
        std::fs::remove_dir_all(&copy).map_err(|e| format!("{}: {e}", copy.display()))?;
    }
    copy_tree(&Path::new(ROOT).join("clients/python"), &copy)?;
    let out = run_for(
        Command::new(&py)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--no-deps",
                "--no-build-isolation",
                "--force-reinstall",
            ])
            .arg(&copy),
        PIP_TIMEOUT,
    )
    .await?;
    if !out.status.success() {
        return Err(format!(
            "`pip install clients/python` failed:\n{}{}",
            text(&out.stdout),
            text(&out.stderr)
        ));
    }
    Ok(py)
}

/// Copy `from` to `to` (files and folders; caches and build output left behind).
fn copy_tree(from: &Path, to: &Path) -> Result<(), String> {
    std::fs::create_dir_all(to).map_err(|e| format!("{}: {e}", to.display()))?;
    for entry in std::fs::read_dir(from).map_err(|e| format!("{}: {e}", from.display()))? {
        let entry = entry.map_err(|e| e.to_string())?;
        let name = entry.file_name();
        let n = name.to_string_lossy();
        if n == "__pycache__" || n == "build" || n.ends_with(".egg-info") || n == ".pytest_cache" {
            continue;
        }
        let (src, dst) = (entry.path(), to.join(&name));
        if entry.file_type().map_err(|e| e.to_string())?.is_dir() {
            copy_tree(&src, &dst)?;
        } else {
            std::fs::copy(&src, &dst).map_err(|e| format!("{}: {e}", src.display()))?;
        }
    }
    Ok(())
}

/// Environment for anything that starts servers: this build's binaries, no stray bytecode.
fn server_env(cmd: &mut Command) -> &mut Command {
    cmd.env("EXECRELAY_BIN", common::bin())
        .env("EXECRELAY_RELAY_BIN", common::relay::relay_bin())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env_remove("EXECRELAY_CONFIG")
        .current_dir(ROOT)
}

fn report(what: &str, out: &Output) -> String {
    format!(
        "{what} failed ({}):\n--- stdout ---\n{}\n--- stderr ---\n{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_package_tests() {
    let _one = SERIAL.lock().await;
    let py = python().await;
    let out = run_for(
        server_env(&mut Command::new(&py)).args([
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            "clients/python",
            "clients/python/tests",
        ]),
        PYTEST_TIMEOUT,
    )
    .await
    .unwrap_or_else(|e| panic!("pytest: {e}"));
    assert!(
        out.status.success(),
        "{}",
        report("pytest clients/python/tests", &out)
    );
    let stdout = text(&out.stdout);
    assert!(stdout.contains(" passed"), "pytest ran no test:\n{stdout}");
}

async fn conformance(adapter: Vec<String>, name: &str) {
    let report_path = target_dir().join(format!("conformance-{name}.json"));
    let out = run_for(
        server_env(&mut Command::new("bash"))
            .arg(Path::new(ROOT).join("conformance/run.sh"))
            .args(&adapter)
            .env("CONFORMANCE_NAME", name)
            .env("CONFORMANCE_REPORT", &report_path),
        KIT_TIMEOUT,
    )
    .await
    .unwrap_or_else(|e| panic!("conformance/run.sh: {e}"));
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n(report: {})",
        report(&format!("the conformance kit for the {name} client"), &out),
        report_path.display()
    );
    assert!(
        stdout.lines().any(|l| l.ends_with(" passed, 0 failed")),
        "no summary line:\n{stdout}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_python() {
    let _one = SERIAL.lock().await;
    let py = python().await;
    let adapter = Path::new(ROOT).join("conformance/adapters/python/adapter.py");
    conformance(vec![py, adapter.display().to_string()], "python").await;
}

/// `examples/conformance-adapter` next to the test binaries, brought up to date first (a
/// `cargo test --test python_sdk` alone does not build examples, and a stale adapter would
/// test an older client library).
fn rust_adapter() -> PathBuf {
    let path = Path::new(common::bin())
        .with_file_name("examples")
        .join("conformance-adapter");
    {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = std::process::Command::new(cargo)
            .args(["build", "--quiet", "--example", "conformance-adapter"])
            .current_dir(ROOT)
            .status()
            .expect("run cargo build --example conformance-adapter");
        assert!(
            status.success(),
            "cargo build --example conformance-adapter failed"
        );
    }
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_rust() {
    let _one = SERIAL.lock().await;
    let adapter = rust_adapter();
    conformance(vec![adapter.display().to_string()], "rust").await;
}
