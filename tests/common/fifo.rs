//! A named pipe a child blocks on until the test releases it: lets a test hold a child back
//! without the child reading its stdin, and without any sleep.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::GUARD;

/// Create the FIFO `go` in `dir`.
pub fn make_fifo(dir: &Path) -> PathBuf {
    let path = dir.join("go");
    let c = std::ffi::CString::new(path.to_str().expect("utf-8 path")).expect("no NUL");
    let r = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    assert_eq!(r, 0, "mkfifo: {}", std::io::Error::last_os_error());
    path
}

/// Let the child blocked in `read -r _ < FIFO` go on.
pub async fn release(fifo: &Path) {
    let fifo = fifo.to_path_buf();
    let open = tokio::task::spawn_blocking(move || {
        use std::io::Write;
        // Blocks until the child has the FIFO open for reading.
        let mut f = std::fs::OpenOptions::new().write(true).open(&fifo)?;
        f.write_all(b"go\n")
    });
    tokio::time::timeout(GUARD, open)
        .await
        .expect("the child opens the FIFO")
        .expect("join")
        .expect("write to the FIFO");
}

/// argv of a child that waits for [`release`], then copies stdin to stdout.
pub fn held_cat(fifo: &Path) -> Value {
    json!([
        "sh",
        "-c",
        r#"read -r _ < "$0"; exec cat"#,
        fifo.to_str().unwrap()
    ])
}
