//! What the CLI's integration tests share.

use std::process::Command;

/// Runs `offload ARGS…`: whether it succeeded, its stdout and its stderr.
pub fn offload(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_offload"))
        .args(args)
        .output()
        .expect("the binary runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
