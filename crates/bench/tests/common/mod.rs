//! What the harness's smoke tests share: the binaries they run, always built from the sources
//! under test.
//!
//! `CARGO_BIN_EXE_*` covers only this crate's own binaries (`lmsp-bench`, `engine-bench`); the
//! `lmsp` binary belongs to another crate and the apalis peer is an example, so a test asks
//! cargo to build them. Cargo rebuilds what changed and does nothing when they are up to date,
//! so a test never runs a binary left over from an earlier build.

#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The target profile directory this test runs from (`target/debug`): test binaries live in
/// its `deps`.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    exe.parent()
        .and_then(Path::parent)
        .expect("a test binary sits in <profile>/deps")
        .to_path_buf()
}

/// The cargo profile that builds into `profile_dir` (`target/debug` is `dev`'s).
fn profile_name(profile_dir: &Path) -> String {
    match profile_dir.file_name().and_then(|name| name.to_str()) {
        Some("debug") | None => String::from("dev"),
        Some(name) => name.to_owned(),
    }
}

/// Runs `cargo build` with `args` in this test's profile, then returns `path` (relative to the
/// profile directory), which the build must have left there.
fn build(args: &[&str], path: &str) -> PathBuf {
    let profile = profile_dir();
    let output = Command::new(env!("CARGO"))
        .arg("build")
        .args(["--profile", &profile_name(&profile)])
        .args(args)
        .output()
        .expect("cargo runs");
    assert!(
        output.status.success(),
        "cargo build {args:?} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let built = profile.join(path);
    assert!(built.is_file(), "cargo built no {}", built.display());
    built
}

/// The `lmsp` binary of the sources under test.
pub fn lmsp() -> PathBuf {
    build(&["-p", "lmsp", "--bin", "lmsp"], "lmsp")
}

/// The apalis peer example (the comparison's other job queue) of the sources under test.
pub fn apalis_peer() -> PathBuf {
    build(
        &["-p", "lmsp-bench", "--example", "apalis_peer"],
        "examples/apalis_peer",
    )
}
