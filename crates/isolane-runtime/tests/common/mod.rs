//! Helpers shared by the runtime's integration tests.
#![allow(dead_code)] // each test module uses part of it

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

/// Writes an executable script through a separate `sh`, so that this process never holds a
/// descriptor to it: a child forked by another thread while we held it open for writing would
/// keep it open until its exec, and exec'ing the script would fail with `Text file busy`.
pub fn write_executable(path: &Path, text: &str) {
    let mut sh = Command::new("/bin/sh")
        .args(["-c", r#"cat > "$1" && chmod 755 "$1""#, "sh"])
        .arg(path)
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    sh.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    assert!(sh.wait().unwrap().success());
}
