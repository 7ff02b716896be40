//! Resident memory (`VmRSS` of `/proc/PID/status`) of the service: idle right after it is ready,
//! and with many open SSE streams on tasks that stay unfinished (queued behind the one worker,
//! which sits in a one-hour model load).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail};
use futures::StreamExt;
use tokio::sync::Semaphore;

use crate::client::{submit, submit_body, SseReader};
use crate::server::Server;

/// The flags the harness starts the service with for this figure.
pub const SERVE_FLAGS: &[&str] = &["--workers", "1", "--reference-load-delay", "1h"];

/// Streams being opened at once (keeps the listen backlog from overflowing).
const OPENING: usize = 128;

/// Raises this process's soft limit of open files to its hard limit (children inherit it).
pub fn raise_fd_limit() -> u64 {
    rlimit::increase_nofile_limit(u64::MAX).unwrap_or(0)
}

/// The idle reading: a moment after ready.
pub async fn idle(server: &Server) -> anyhow::Result<f64> {
    tokio::time::sleep(Duration::from_millis(500)).await;
    server.rss_mib()
}

/// Submits `streams / per_task` tasks, opens `per_task` SSE streams on each, waits until every
/// stream has received its first event, and reads the RSS.
pub async fn with_streams(
    http: &reqwest::Client,
    server: &Arc<Server>,
    streams: usize,
    per_task: usize,
) -> anyhow::Result<(f64, usize)> {
    let per_task = per_task.max(1);
    let body = Arc::new(submit_body("Once upon a time", 16));
    let tasks: Vec<String> = futures::stream::iter(0..streams.div_ceil(per_task))
        .map(|_| {
            let (http, server, body) = (http.clone(), Arc::clone(server), Arc::clone(&body));
            async move {
                match submit(&http, &server, &body).await? {
                    (202, Some(id)) => Ok(id),
                    (status, _) => Err(anyhow!("submit answered {status}")),
                }
            }
        })
        .buffer_unordered(64)
        .collect::<Vec<anyhow::Result<String>>>()
        .await
        .into_iter()
        .collect::<anyhow::Result<_>>()?;
    let ids = tasks
        .iter()
        .flat_map(|id| std::iter::repeat_n(id.clone(), per_task))
        .take(streams);
    let gate = Arc::new(Semaphore::new(OPENING));
    let mut handles = Vec::with_capacity(streams);
    for id in ids {
        let (http, server, gate) = (http.clone(), Arc::clone(server), Arc::clone(&gate));
        handles.push(tokio::spawn(async move {
            let permit = gate.acquire_owned().await?;
            let response = http
                .get(server.url(&format!("/v1/tasks/{id}/events")))
                .bearer_auth(&server.token)
                .header("accept", "text/event-stream")
                .send()
                .await?;
            let mut reader = SseReader::new(response, Duration::from_secs(120))?;
            if reader.next_batch().await?.is_none() {
                bail!("the stream of {id} ended at once");
            }
            drop(permit);
            Ok::<_, anyhow::Error>(reader)
        }));
    }
    let mut open = Vec::with_capacity(handles.len());
    for handle in handles {
        open.push(handle.await??);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss = server.rss_mib()?;
    let count = open.len();
    drop(open);
    Ok((rss, count))
}
