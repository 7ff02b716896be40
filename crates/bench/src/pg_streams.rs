//! Streams over several PostgreSQL instances: how committed events reach streams on the
//! instances that did not commit them.
//!
//! `streams` background tasks are posted round-robin to the instances (`POST /v1/responses`,
//! `background: true`), and each task's events are streamed from *another* instance than the one
//! it was posted to (`GET /v1/tasks/{id}/events`, `Accept: text/event-stream`, on instance
//! `i + 1`), so nearly every stream follows a task that another instance runs and commits: its
//! events reach it through the notifications and whatever that instance reads for them. The
//! instances run with `--reference-load-delay` so that every stream is open before the tokens
//! flow (the first claim on each instance loads the model for that long, and every task claimed
//! meanwhile waits for it).
//!
//! Figures: persisted events per second — the events of the run's tasks over the span from the
//! first `response.in_progress` to the last terminal event, both as the stored log's
//! `created_at` — and each streamed event's delay from `created_at` to its arrival (ms
//! resolution), as the one-instance events figure measures it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail};
use serde_json::json;

use crate::client::{event_created_at_millis, is_terminal, submit, SseReader};
use crate::events::stored_log;
use crate::server::Server;
use crate::stats::Latencies;

/// One run.
#[derive(Debug, Clone)]
pub struct StreamsRun {
    /// Events stored by the run's tasks.
    pub events: u64,
    /// Events per second, first `response.in_progress` → last terminal event (stored times).
    pub per_s: f64,
    /// p50 of created_at → arrival, ms.
    pub delay_p50_ms: f64,
    /// p99 of created_at → arrival, ms.
    pub delay_p99_ms: f64,
    /// Streams that followed a task posted to another instance (all of them, by construction).
    pub streams: usize,
}

/// What one stream saw: its task and the arrival (ms since the epoch) of each sequence number.
type Streamed = (String, BTreeMap<u64, f64>);

/// Posts task `i` to `post_to`, then streams its events from `stream_from` to the terminal one.
async fn one(
    http: reqwest::Client,
    post_to: Arc<Server>,
    stream_from: Arc<Server>,
    i: usize,
    tokens: u32,
) -> anyhow::Result<Streamed> {
    let body = json!({
        "model": "reference",
        "input": format!("stream number {i}"),
        "background": true,
        "max_output_tokens": tokens,
        "seed": i,
    });
    let (status, task_id) = submit(&http, &post_to, &body).await?;
    let task_id = task_id.ok_or_else(|| anyhow!("no Lmsp-Task-Id header (status {status})"))?;
    if status != 202 {
        bail!("POST of stream {i}: status {status}");
    }
    let response = http
        .get(stream_from.url(&format!("/v1/tasks/{task_id}/events")))
        .bearer_auth(&stream_from.token)
        .header("accept", "text/event-stream")
        .send()
        .await?;
    let mut reader = SseReader::new(response, Duration::from_secs(120))?;
    let mut arrivals = BTreeMap::new();
    let mut finished = false;
    while let Some(batch) = reader.next_batch().await? {
        for message in batch {
            let seq = message
                .id
                .ok_or_else(|| anyhow!("a frame of {task_id} has no id"))?;
            arrivals.entry(seq).or_insert(message.arrived_ms);
            finished |= is_terminal(&message.event);
        }
        if finished {
            break;
        }
    }
    if !finished {
        bail!("the stream of {task_id} ended before its terminal event");
    }
    Ok((task_id, arrivals))
}

/// Runs `streams` streams of `tokens`-token tasks over `servers` (at least two).
pub async fn run(
    http: &reqwest::Client,
    servers: &[Arc<Server>],
    streams: usize,
    tokens: u32,
) -> anyhow::Result<StreamsRun> {
    if servers.len() < 2 {
        bail!("streams across instances need at least two instances");
    }
    let handles: Vec<_> = (0..streams)
        .map(|i| {
            let post_to = Arc::clone(&servers[i % servers.len()]);
            let stream_from = Arc::clone(&servers[(i + 1) % servers.len()]);
            tokio::spawn(one(http.clone(), post_to, stream_from, i, tokens))
        })
        .collect();
    let mut streamed = Vec::with_capacity(streams);
    for handle in handles {
        streamed.push(handle.await??);
    }
    let reader = &servers[0];
    let mut delays = Latencies::new();
    let mut events = 0u64;
    let (mut first, mut last) = (f64::MAX, f64::MIN);
    for (task_id, arrivals) in &streamed {
        for (seq, event) in stored_log(http, reader, task_id).await? {
            events += 1;
            let created = event_created_at_millis(&event)?;
            let kind = event["type"].as_str().unwrap_or_default();
            if kind == "response.in_progress" {
                first = first.min(created);
            }
            if is_terminal(kind) {
                if kind != "response.completed" {
                    bail!("task {task_id} ended with {kind}");
                }
                last = last.max(created);
            }
            if let Some(arrived) = arrivals.get(&seq) {
                delays.push_millis(arrived - created);
            }
        }
    }
    if delays.is_empty() || first >= last {
        bail!("no event streamed (first in_progress {first}, last end {last})");
    }
    Ok(StreamsRun {
        events,
        per_s: events as f64 / ((last - first) / 1000.0),
        delay_p50_ms: delays.quantile_ms(0.5),
        delay_p99_ms: delays.quantile_ms(0.99),
        streams,
    })
}
