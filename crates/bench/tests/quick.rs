//! CI's smoke test of the benchmark harness: runs `lmsp-bench --quick` end to end against the
//! real `lmsp` binary and the apalis peer example (both built from the sources under test, see
//! `common`), and checks that it completes and prints every figure of the README's performance
//! targets with its ceiling — the PostgreSQL ones included, on a throwaway cluster of PostgreSQL
//! 15's binaries (`/usr/lib/postgresql/15/bin`, which CI has; the test fails without them) — and
//! the Batch API's on a 500-line batch. It asserts that the harness works, never a speed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Command;

#[test]
fn quick_mode_runs_end_to_end_and_prints_every_figure() {
    let lmsp = common::lmsp();
    let peer = common::apalis_peer();
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
        "| p99 submit latency on PostgreSQL at half the peak rate",
        "| persisted events per second on PostgreSQL, 32 tasks × 16 tokens streaming, one instance |",
        "| PostgreSQL: persisted events per second, 32 tasks × 16 tokens streaming, vs SQLite (same workload) |",
        "| PostgreSQL: submit latency p99 paced at half the peak",
        "| pgbench: single-row insert p99 paced at the same rate",
        "| PostgreSQL: persisted events per second, 30 streams over 3 instances",
        "| PostgreSQL: event created_at → SSE arrival, p50 / p99, 30 streams over 3 instances |",
        "PostgreSQL ceiling (min / median / max): pgbench single-row insert commits/s",
        // The Batch API (a 500-line batch in quick mode).
        "| batch: upload of a 500-line file (",
        "| batch: service RSS peak during the upload |",
        "| batch: POST /v1/batches → in_progress (validate + create 500 tasks) |",
        "| batch: service RSS peak during validate + create |",
        "| batch: lines finished per second, in_progress → completed |",
        "| batch: interactive p99 latency while the batch runs",
        "| batch: background submits of the same lines",
        "| batch: lines per second end to end, POST /v1/batches → completed |",
        "| batch: every line counted → completed",
        "| batch: interactive latency p50 / p99, idle service |",
        "| batch: interactive latency p50 / p99, while the batch runs |",
        "| claims: claims per second, 3 000 tasks queued across 3 tiers and 100 clients,",
        "| claims: claims per second, 3 000 tasks of one client in the default tier",
        "| webhooks: completions per second with a receiver that hangs",
        "| webhooks: deliveries still pending at the end",
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
