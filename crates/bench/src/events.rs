//! Persisted events per second with many tasks streaming at once, and the delay from an event's
//! commit to its arrival at an SSE subscriber.
//!
//! Each of N clients posts `{"background": true, "stream": true}` and reads the task's SSE to its
//! terminal event; the service runs N workers on the reference engine with zero delays. Persisted
//! events are the sum of the tasks' `last_sequence_number` (read back after the run) over the
//! wall time from the first POST to the last terminal event. The delay of each event is its
//! arrival time (taken when its chunk is read) minus its `created_at` — a millisecond timestamp
//! the worker takes just before it queues the append for commit — so it is an upper bound of
//! commit → arrival, at 1 ms resolution.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};
use serde_json::json;

use crate::client::{created_at_millis, get_json, is_terminal, SseReader};
use crate::server::Server;
use crate::stats::Latencies;

/// The flags the harness starts the service with for this figure (plus `--workers N`).
pub fn serve_flags(tasks: usize) -> Vec<String> {
    vec![String::from("--workers"), tasks.to_string()]
}

/// One run.
#[derive(Debug, Clone)]
pub struct EventsRun {
    /// Events committed by the run's tasks.
    pub events: u64,
    /// Events per second.
    pub per_s: f64,
    /// Events received over SSE.
    pub received: u64,
    /// p50 of created_at → arrival, ms.
    pub delay_p50_ms: f64,
    /// p99 of created_at → arrival, ms.
    pub delay_p99_ms: f64,
    /// Wall time, s.
    pub seconds: f64,
}

/// Runs `tasks` streaming tasks of `tokens` output tokens each.
pub async fn run(
    http: &reqwest::Client,
    server: &Arc<Server>,
    tasks: usize,
    tokens: u32,
) -> anyhow::Result<EventsRun> {
    let start = Instant::now();
    let mut handles = Vec::with_capacity(tasks);
    for i in 0..tasks {
        let (http, server) = (http.clone(), Arc::clone(server));
        handles.push(tokio::spawn(async move {
            let response = http
                .post(server.url("/v1/responses"))
                .bearer_auth(&server.token)
                .json(&json!({
                    "model": "reference",
                    "input": format!("stream number {i}"),
                    "background": true,
                    "stream": true,
                    "max_output_tokens": tokens,
                    "seed": i,
                }))
                .send()
                .await?;
            let task_id = response
                .headers()
                .get("lmsp-task-id")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
                .ok_or_else(|| anyhow!("no Lmsp-Task-Id header"))?;
            let mut reader = SseReader::new(response)?;
            let mut delays = Latencies::new();
            let mut received = 0u64;
            let mut finished = false;
            while let Some(batch) = reader.next_batch(Duration::from_secs(120)).await? {
                for message in batch {
                    received += 1;
                    delays.push_millis(message.arrived_ms - created_at_millis(&message.data)?);
                    finished |= is_terminal(&message.event);
                }
                if finished {
                    break;
                }
            }
            if !finished {
                bail!("the stream of {task_id} ended before its terminal event");
            }
            Ok::<_, anyhow::Error>((task_id, delays, received, Instant::now()))
        }));
    }
    let mut delays = Latencies::new();
    let mut received = 0;
    let mut last = start;
    let mut ids = Vec::with_capacity(tasks);
    for handle in handles {
        let (task_id, part, count, done) = handle.await??;
        delays.extend(part);
        received += count;
        last = last.max(done);
        ids.push(task_id);
    }
    if delays.is_empty() {
        bail!("no event arrived over SSE");
    }
    let seconds = last.duration_since(start).as_secs_f64();
    let mut events = 0u64;
    for id in ids {
        let task = get_json(http, server, &format!("/v1/tasks/{id}")).await?;
        events += task["last_sequence_number"]
            .as_u64()
            .ok_or_else(|| anyhow!("task {id} has no last_sequence_number"))?;
    }
    Ok(EventsRun {
        events,
        per_s: events as f64 / seconds,
        received,
        delay_p50_ms: delays.quantile_ms(0.5),
        delay_p99_ms: delays.quantile_ms(0.99),
        seconds,
    })
}
