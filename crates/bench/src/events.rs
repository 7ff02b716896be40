//! Persisted events per second with many tasks streaming at once, and the delay from an event's
//! commit to its arrival at an SSE subscriber.
//!
//! Each of N clients posts `{"background": true, "stream": true}` and reads the reply's stream —
//! OpenAI's stream events, each frame's `id` being the task log's sequence number — to its
//! terminal event; the service runs N workers on the reference engine with zero delays.
//! Persisted events are the sum of the tasks' `last_sequence_number` (read back after the run)
//! over the wall time from the first POST to the last terminal event. The delay of each event
//! is its arrival time (taken when its chunk is read) minus its `created_at` — a millisecond
//! timestamp the worker takes just before it queues the append for commit — so it is an upper
//! bound of commit → arrival, at 1 ms resolution. OpenAI's stream events carry no `created_at`,
//! so it is read after the run from the task's stored log (`GET /v1/tasks/{id}/events`), matched
//! by sequence number; events that rendering leaves out (`response.loading`) have no arrival.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};
use serde_json::json;

use crate::client::{event_created_at_millis, get_json, is_terminal, SseReader};
use crate::server::Server;
use crate::stats::Latencies;

/// Events asked for per page when reading a log back.
const PAGE: usize = 1000;

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
    /// Frames received over SSE.
    pub received: u64,
    /// p50 of created_at → arrival, ms.
    pub delay_p50_ms: f64,
    /// p99 of created_at → arrival, ms.
    pub delay_p99_ms: f64,
    /// Wall time, s.
    pub seconds: f64,
}

/// What one streaming client saw: its task, when each sequence number first arrived (ms since
/// the epoch), how many frames, and when the terminal one came.
type Streamed = (String, BTreeMap<u64, f64>, u64, Instant);

/// Posts one streaming task and reads its stream to the terminal event.
async fn stream_one(
    http: reqwest::Client,
    server: Arc<Server>,
    i: usize,
    tokens: u32,
) -> anyhow::Result<Streamed> {
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
        .ok_or_else(|| anyhow!("no Lmsp-Task-Id header (status {})", response.status()))?;
    let mut reader = SseReader::new(response, Duration::from_secs(120))?;
    let mut arrivals = BTreeMap::new();
    let mut received = 0u64;
    let mut finished = false;
    while let Some(batch) = reader.next_batch().await? {
        for message in batch {
            received += 1;
            let seq = message
                .id
                .ok_or_else(|| anyhow!("a frame of {task_id} has no id"))?;
            // Both renderings number their frames by the log: the id is the data's own.
            let data: serde_json::Value = serde_json::from_str(&message.data)?;
            if data["sequence_number"].as_u64() != Some(seq) {
                bail!(
                    "frame {seq} of {task_id} carries {}",
                    data["sequence_number"]
                );
            }
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
    Ok((task_id, arrivals, received, Instant::now()))
}

/// Reads a task's stored log back and adds each streamed event's delay (arrival − created_at);
/// returns the number of events stored.
async fn delays_of(
    http: &reqwest::Client,
    server: &Server,
    task_id: &str,
    arrivals: &BTreeMap<u64, f64>,
    delays: &mut Latencies,
) -> anyhow::Result<u64> {
    let log = stored_log(http, server, task_id).await?;
    for (seq, event) in &log {
        if let Some(arrived) = arrivals.get(seq) {
            delays.push_millis(arrived - event_created_at_millis(event)?);
        }
    }
    Ok(log.len() as u64)
}

/// A task's stored log, page by page, each event with its sequence number; an error when the
/// numbers are not 1, 2, 3, … without a gap.
pub(crate) async fn stored_log(
    http: &reqwest::Client,
    server: &Server,
    task_id: &str,
) -> anyhow::Result<Vec<(u64, serde_json::Value)>> {
    let mut after = 0u64;
    let mut log = Vec::new();
    loop {
        let mut page = get_json(
            http,
            server,
            &format!("/v1/tasks/{task_id}/events?after={after}&limit={PAGE}"),
        )
        .await?;
        let has_more = page["has_more"].as_bool().unwrap_or(false);
        let serde_json::Value::Array(events) = page["data"].take() else {
            bail!("the events of {task_id} are not a list: {page}");
        };
        for event in events {
            let seq = event["sequence_number"]
                .as_u64()
                .ok_or_else(|| anyhow!("an event of {task_id} has no sequence_number"))?;
            if seq != after + 1 {
                bail!("the log of {task_id} jumps from {after} to {seq}");
            }
            after = seq;
            log.push((seq, event));
        }
        if !has_more {
            return Ok(log);
        }
    }
}

/// Runs `tasks` streaming tasks of `tokens` output tokens each.
pub async fn run(
    http: &reqwest::Client,
    server: &Arc<Server>,
    tasks: usize,
    tokens: u32,
) -> anyhow::Result<EventsRun> {
    let start = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|i| tokio::spawn(stream_one(http.clone(), Arc::clone(server), i, tokens)))
        .collect();
    let mut streamed = Vec::with_capacity(tasks);
    let mut received = 0;
    let mut last = start;
    for handle in handles {
        let one = handle.await??;
        received += one.2;
        last = last.max(one.3);
        streamed.push(one);
    }
    let seconds = last.duration_since(start).as_secs_f64();
    let mut delays = Latencies::new();
    let mut events = 0u64;
    for (id, arrivals, _, _) in &streamed {
        let task = get_json(http, server, &format!("/v1/tasks/{id}")).await?;
        let last_sequence = task["last_sequence_number"]
            .as_u64()
            .ok_or_else(|| anyhow!("task {id} has no last_sequence_number"))?;
        if task["status"] != "completed" {
            bail!("task {id} ended {}, not completed", task["status"]);
        }
        let stored = delays_of(http, server, id, arrivals, &mut delays).await?;
        if stored != last_sequence {
            bail!(
                "task {id} stores {stored} events but its last_sequence_number is {last_sequence}"
            );
        }
        events += last_sequence;
    }
    if delays.is_empty() {
        bail!("no event arrived over SSE");
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
