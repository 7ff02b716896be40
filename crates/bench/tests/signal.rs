//! A signal stops `lmsp-bench` cleanly: the throwaway PostgreSQL cluster it started is stopped
//! and its directory removed, so that `timeout` or Ctrl-C leaves no server running. It needs
//! PostgreSQL 15's binaries (`/usr/lib/postgresql/15/bin`, which CI has; it fails without them).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};

#[test]
fn sigterm_stops_the_run_and_the_cluster_it_started() {
    let lmsp = common::lmsp();
    let work = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(env!("CARGO_BIN_EXE_lmsp-bench"))
        .args(["--quick", "--only", "pg-claims"])
        .arg("--lmsp-bin")
        .arg(&lmsp)
        .arg("--work-dir")
        .arg(work.path())
        .env_remove("LMSP_BENCH_POSTGRES_URL")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run lmsp-bench");
    // The phase's heading names the cluster's directory once the cluster runs; the signal comes
    // right after it, while the phase creates its database and queues its tasks.
    let stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut cluster: Option<PathBuf> = None;
    let mut seen = Vec::new();
    for line in stdout.lines() {
        let line = line.expect("a line of stdout");
        if let Some((_, rest)) = line.split_once("initdb in ") {
            let dir = rest.split(',').next().expect("a directory");
            cluster = Some(PathBuf::from(dir));
            break;
        }
        seen.push(line);
    }
    let cluster = cluster.unwrap_or_else(|| panic!("no cluster was started: {seen:?}"));
    assert!(cluster.join("data").join("postmaster.pid").exists());
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    let output = child.wait_with_output().expect("lmsp-bench ends");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "a stopped run is not a success");
    assert!(stderr.contains("stopped by SIGTERM"), "{stderr}");
    assert!(
        !cluster.exists(),
        "the cluster's directory {} is gone (so is its server)",
        cluster.display()
    );
}
