//! What the harness's smoke tests share: the binaries they run, always built from the sources
//! under test (by the end-to-end harness's `cargo_built`, which asks cargo to build them).
//!
//! `CARGO_BIN_EXE_*` covers only this crate's own binaries (`lmsp-bench`, `engine-bench`); the
//! `lmsp` binary belongs to another crate and the apalis peer is an example.

use std::path::PathBuf;

/// The `lmsp` binary of the sources under test.
pub fn lmsp() -> PathBuf {
    lmsp_tests::lmsp_binary()
}

/// The apalis peer example (the comparison's other job queue) of the sources under test.
#[allow(dead_code)]
pub fn apalis_peer() -> PathBuf {
    lmsp_tests::cargo_built("examples/apalis_peer")
}
