//! CI's smoke test of `engine-bench`: runs it with `--quick` against the real `lmsp` binary
//! (built from the sources under test, see `common`) and a real llama.cpp server (the venv of
//! `scripts/llamacpp-server-deps`, which `scripts/test` installs; the test fails without it), and
//! checks that every path streamed the model's exact text (the harness checks each reply) and
//! that both comparison rows are printed. It asserts that the harness works, never a speed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::Command;

#[test]
fn engine_bench_quick_streams_every_path_and_prints_both_comparisons() {
    let lmsp = common::lmsp();
    let python =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/llamacpp-venv/bin/python");
    assert!(
        python.is_file(),
        "no llama.cpp server venv at {} (run scripts/llamacpp-server-deps; scripts/test does)",
        python.display()
    );
    let output = Command::new(env!("CARGO_BIN_EXE_engine-bench"))
        .arg("--quick")
        .arg("--lmsp-bin")
        .arg(&lmsp)
        .arg("--python")
        .arg(&python)
        .output()
        .expect("run engine-bench");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "engine-bench --quick failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    for row in [
        "| llama.cpp server, direct |",
        "| LMSP → llama.cpp server (--engine openai) |",
        "| llama-cpp-2 alone, in process |",
        "| LMSP in process (--engine llama) |",
        "| LMSP → llama.cpp server (--engine openai) | llama.cpp server, direct |",
        "| LMSP in process (--engine llama) | llama-cpp-2 alone, in process |",
    ] {
        assert!(stdout.contains(row), "no row {row}:\n{stdout}");
    }
}
