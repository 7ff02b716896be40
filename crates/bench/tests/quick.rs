//! CI's smoke test of the benchmark harness: runs `lmsp-bench --quick` end to end against the
//! real `lmsp` binary and the apalis peer example, and checks that it completes and prints every
//! figure of the README's performance targets with its ceiling — the PostgreSQL ones included,
//! on a throwaway cluster of PostgreSQL 15's binaries (`/usr/lib/postgresql/15/bin`, which CI
//! has; the test fails without them). It asserts that the harness works, never a speed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The target profile directory this test runs from (`target/debug`).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    exe.parent()
        .and_then(Path::parent)
        .expect("target profile dir")
        .to_path_buf()
}

/// A binary of this build, built with cargo when it is missing (as `tests/src/lib.rs` does for
/// the e2e tests: `CARGO_BIN_EXE_*` only covers this crate's own binaries).
fn built(path: PathBuf, cargo_args: &[&str]) -> PathBuf {
    if !path.exists() {
        let status = Command::new(env!("CARGO"))
            .args(cargo_args)
            .status()
            .expect("cargo build");
        assert!(status.success(), "cargo {cargo_args:?} failed");
    }
    path
}

#[test]
fn quick_mode_runs_end_to_end_and_prints_every_figure() {
    let lmsp = match std::env::var_os("LMSP_BIN") {
        Some(path) => PathBuf::from(path),
        None => built(
            profile_dir().join("lmsp"),
            &["build", "-p", "lmsp", "--bin", "lmsp"],
        ),
    };
    let peer = built(
        profile_dir().join("examples").join("apalis_peer"),
        &["build", "-p", "lmsp-bench", "--example", "apalis_peer"],
    );
    let work = tempfile::tempdir().expect("tempdir");
    let chart = work.path().join("chart.png");
    let output = Command::new(env!("CARGO_BIN_EXE_lmsp-bench"))
        .arg("--quick")
        .arg("--lmsp-bin")
        .arg(&lmsp)
        .arg("--peer-bin")
        .arg(&peer)
        .arg("--work-dir")
        .arg(work.path())
        .arg("--chart")
        .arg(&chart)
        .output()
        .expect("run lmsp-bench");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "lmsp-bench --quick failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    for figure in [
        "| durable background submits (202) per second, 64 clients |",
        "| persisted events per second,",
        "| p99 submit latency at half the peak rate",
        "| startup recovery of 2 000 leftover tasks",
        "| writer p99 commit latency while purging",
        "| RSS idle |",
        "| RSS with 100 open SSE streams |",
        "| submits per second, 1 client |",
        "| submits per second, 16 clients |",
        "| submits per second, 256 clients |",
        "| event created_at → SSE arrival, p50 / p99",
        "| startup on an empty data directory",
        "| HTTP floor: GET /v1/health",
        "| peer: LMSP jobs/s",
        "raw ceilings (min / median / max)",
        "| durable submits/s vs the same server's GET /v1/health rate, 64 connections |",
        "| service context switches per submit, 64 clients (/proc, all threads) |",
        "| service threads, most seen during the submit runs, by clients",
        "| service context switches per submit, 1 client |",
        "| service context switches per GET /v1/health, 64 clients |",
        "| service threads idle",
        "| service threads, most seen while submitting, 256 clients |",
        // PostgreSQL: CI has PostgreSQL 15's binaries in /usr/lib/postgresql/15/bin; without
        // them these rows say why, and the test fails (it never skips them silently).
        "| durable background submits (202) per second on PostgreSQL, one instance, 64 clients |",
        "| durable background submits (202) per second on PostgreSQL, 3 instances on one database",
        "| PostgreSQL: submit latency p50 / p99, one instance",
        "| PostgreSQL: submits per second, one instance, 64 clients, vs SQLite |",
        "| PostgreSQL: persisted events per second, 32 tasks × 16 tokens streaming, one instance |",
        "| PostgreSQL: event created_at → SSE arrival",
        "PostgreSQL ceiling (min / median / max): pgbench single-row insert commits/s",
    ] {
        let line = stdout
            .lines()
            .find(|line| line.contains(figure))
            .unwrap_or_else(|| panic!("no line with {figure:?} in:\n{stdout}"));
        assert!(
            !line.contains("not run") && !line.contains("failed") && !line.contains("n/a"),
            "figure not measured: {line}"
        );
    }
    assert!(
        stdout.contains("apalis 0.6 + SQLite jobs/s: ") && !stdout.contains("skipped"),
        "the peer did not run:\n{stdout}"
    );
    assert!(
        stdout.contains("chart written to") || stdout.contains("chart not written"),
        "the chart step did not report:\n{stdout}"
    );
}
