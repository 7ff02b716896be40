//! CI's smoke test of `engine-bench`: runs it with `--quick` against the real `lmsp` binary
//! (built from the sources under test, see `common`) and a real llama.cpp server (the venv of
//! `scripts/llamacpp-server-deps`, which `scripts/test` installs; the test fails without it), and
//! checks that every path streamed the model's exact text (the harness checks each reply) and
//! that every table is printed: the paths and both comparisons, LMSP in process beside
//! llama.cpp's server (time to first token of a new and a repeated prompt, 1 and 4 streams,
//! with and without checkpoints), and resume latency after a kill -9 at each of the quick run's
//! points (8 and 40 text deltas) with and without checkpoints. It asserts that the harness
//! works, never a speed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::Command;

#[test]
fn engine_bench_quick_streams_every_path_and_prints_every_table() {
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
        "| LMSP in process (--engine llama, --checkpoint-every 8) |",
        "| LMSP in process (--engine llama, --checkpoint-every 0) |",
        "| LMSP → llama.cpp server (--engine openai) | llama.cpp server, direct |",
        "| LMSP in process (--engine llama, --checkpoint-every 8) | llama-cpp-2 alone, in process |",
        "| TTFT p50, a new prompt (",
        "| TTFT p50, a repeated prompt (",
        "| tokens/s, 1 stream (",
        "| tokens/s, 4 streams at once, all together (",
        "| tokens/s, 1 stream, LMSP with checkpoints (every 8) / without |",
        "| 8 (",
        "| 40 (",
        "| with checkpoints: after 40 ≤ 1.2 × after 8 |",
        "| without checkpoints: after 40 ≤ 1.2 × after 8 |",
    ] {
        assert!(stdout.contains(row), "no row {row}:\n{stdout}");
    }
    assert!(
        !stdout.contains("not run"),
        "a figure was not measured:\n{stdout}"
    );
}
