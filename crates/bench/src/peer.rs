//! The comparison with a peer: the same submit-and-complete workload on LMSP and on apalis 0.6
//! with its SQLite storage. N jobs are pushed from P concurrent clients while W workers complete
//! them; jobs per second run from the first push to the moment all N are completed.
//!
//! LMSP: N background submits (reference engine, `max_output_tokens: 1`, zero delays) to
//! `lmsp serve --workers W`, then `GET /v1/tasks?status=…` every 10 ms until none is unfinished.
//! apalis: the `apalis_peer` example of this crate (apalis is a dev-dependency of the bench
//! crate only), run as a subprocess; its last line carries its jobs per second.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use futures::StreamExt;

use crate::client::{get_json, submit, submit_body, wait_until_all_finished};
use crate::server::{sibling_of_exe, Server};

/// The example binary's name.
pub const PEER_EXAMPLE: &str = "apalis_peer";

/// Finds the peer binary: `--peer-bin`, else `LMSP_BENCH_PEER_BIN`, else
/// `examples/apalis_peer` beside this executable (where `cargo build --examples` and
/// `cargo test` put it).
pub fn find_peer(explicit: Option<&Path>) -> Option<PathBuf> {
    if let Some(path) = explicit {
        return Some(path.to_path_buf());
    }
    if let Some(path) = std::env::var_os("LMSP_BENCH_PEER_BIN") {
        return Some(PathBuf::from(path));
    }
    let beside = sibling_of_exe("examples").ok()?.join(PEER_EXAMPLE);
    beside.exists().then_some(beside)
}

/// The flags the harness starts the service with for this figure.
pub fn serve_flags(workers: usize) -> Vec<String> {
    vec![String::from("--workers"), workers.to_string()]
}

/// LMSP's jobs per second.
pub async fn lmsp(
    http: &reqwest::Client,
    server: &Arc<Server>,
    jobs: usize,
    pushers: usize,
) -> anyhow::Result<f64> {
    let body = Arc::new(submit_body("job", 1));
    let start = Instant::now();
    let results: Vec<anyhow::Result<()>> = futures::stream::iter(0..jobs)
        .map(|_| {
            let (http, server, body) = (http.clone(), Arc::clone(server), Arc::clone(&body));
            async move {
                match submit(&http, &server, &body).await? {
                    (202, _) => Ok(()),
                    (status, _) => Err(anyhow!("submit answered {status}")),
                }
            }
        })
        .buffer_unordered(pushers.max(1))
        .collect()
        .await;
    results.into_iter().collect::<anyhow::Result<()>>()?;
    let done = wait_until_all_finished(http, server, Duration::from_secs(600)).await?;
    let seconds = done.duration_since(start).as_secs_f64();
    let failed = get_json(http, server, "/v1/tasks?status=failed,cancelled&limit=1").await?;
    if !failed["data"].as_array().is_some_and(Vec::is_empty) {
        bail!("an LMSP peer job did not complete: {failed}");
    }
    Ok(jobs as f64 / seconds)
}

/// apalis's jobs per second, from the example run as a subprocess.
pub async fn apalis(
    peer: &Path,
    db: &Path,
    jobs: usize,
    workers: usize,
    pushers: usize,
) -> anyhow::Result<f64> {
    let mut command = Command::new(peer);
    command
        .args(["--jobs", &jobs.to_string()])
        .args(["--workers", &workers.to_string()])
        .args(["--pushers", &pushers.to_string()])
        .arg("--db")
        .arg(db)
        .env("RUST_LOG", "warn");
    let output = tokio::task::spawn_blocking(move || command.output())
        .await?
        .with_context(|| format!("cannot run {}", peer.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        bail!(
            "{} failed: {}{}",
            peer.display(),
            stdout,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    stdout
        .lines()
        .rev()
        .find_map(|line| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix("jobs_per_second="))
        })
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| anyhow!("no jobs_per_second in the peer's output: {stdout}"))
}
