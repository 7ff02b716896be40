//! Resume latency: one background task with `on_restart: "resume"`, its service killed with
//! SIGKILL once the task's event stream has shown N text deltas, for each N in turn, and started
//! again on the same data directory; measured from the restarted process's spawn (and from its
//! "listening" line, i.e. after recovery) to the first text delta of the resumed run on the
//! task's event stream (`GET /v1/tasks/{id}/events`, after the `response.resumed` event).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};
use serde_json::{json, Value};

use lmsp_bench::server::Server;

use super::stream::{read_events, Ask};

/// One kill and restart.
#[derive(Debug, Clone)]
pub struct ResumeSample {
    /// Text deltas stored before the kill (≥ `seen`: the service stores each before streaming).
    pub stored: u64,
    /// Spawn of the restarted service → the resumed run's first text delta.
    pub from_start: Duration,
    /// The restarted service's "listening" line (recovery done) → that delta.
    pub from_listening: Duration,
    /// The output tokens covered by the newest KV checkpoint in place at the kill that covers
    /// no more than the deltas stored (what the resume restores, give or take a character of
    /// several tokens), when there is one: the resume replays the tokens after it.
    pub checkpoint: Option<u64>,
}

/// The output tokens covered by the KV checkpoints in place in `data_dir` (their names are
/// `<run>-<k>.meta`, docs/engines.md; the chain's one task is the directory's only run).
fn sealed_checkpoints(data_dir: &Path) -> Vec<u64> {
    let Ok(entries) = std::fs::read_dir(data_dir.join("checkpoints")) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            name.strip_suffix(".meta")?
                .rsplit('-')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .collect()
}

/// What the task's event stream showed.
enum Seen {
    /// `on_event` stopped the stream; the last sequence number it was handed.
    Deltas { last_sequence: u64 },
    /// The task finished before the kill point.
    Finished(String),
}

/// Runs one task through kills after each of `points` text deltas; `args` start the service.
pub async fn chain(
    http: &reqwest::Client,
    lmsp: &Path,
    data_dir: &Path,
    args: &[String],
    model: &str,
    ask: &Ask,
    points: &[u64],
) -> anyhow::Result<Vec<ResumeSample>> {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut server = tokio::task::block_in_place(|| Server::start(lmsp, data_dir, &args))?;
    let token = server.token.clone();
    let body = json!({
        "model": model, "instructions": ask.system, "input": ask.user, "background": true,
        "on_restart": "resume", "max_output_tokens": ask.tokens, "temperature": 0, "seed": 1,
    });
    let submitted = http
        .post(server.url("/v1/responses"))
        .bearer_auth(&token)
        .json(&body)
        .send()
        .await?;
    if !submitted.status().is_success() {
        bail!("the resume task was refused: {}", submitted.status());
    }
    let task = submitted
        .headers()
        .get("lmsp-task-id")
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| anyhow!("no Lmsp-Task-Id header"))?
        .to_owned();
    let mut samples = Vec::new();
    let mut after = 0u64;
    let mut deltas = 0u64;
    for &point in points {
        // Follow the task until it has shown `point` deltas, then kill its service.
        let wanted = point.saturating_sub(deltas);
        let mut counted = 0u64;
        let seen = follow(http, &server, &task, after, |event| {
            if event["type"] == "response.output_text.delta" {
                counted += 1;
                return counted >= wanted;
            }
            false
        })
        .await?;
        match seen {
            Seen::Finished(kind) => {
                bail!("the resume task ended ({kind}) after {deltas} text deltas, before {point}")
            }
            Seen::Deltas { last_sequence } => after = last_sequence,
        }
        server.kill();
        deltas += counted;
        let seen_at_kill = deltas;
        // What the restarted service finds.
        let sealed = sealed_checkpoints(data_dir);

        // Start again and wait for the resumed run's first delta.
        let spawned = Instant::now();
        server = tokio::task::block_in_place(|| Server::start(lmsp, data_dir, &args))?;
        server.token.clone_from(&token);
        let listening = spawned + server.ready_after;
        let mut resumed = false;
        let mut stored_unseen = 0u64;
        let mut first_new = None;
        let seen = follow(http, &server, &task, after, |event| {
            match event["type"].as_str() {
                Some("response.resumed") => resumed = true,
                Some("response.output_text.delta") if resumed => {
                    first_new = Some(Instant::now());
                    return true;
                }
                Some("response.output_text.delta") => stored_unseen += 1,
                _ => {}
            }
            false
        })
        .await?;
        let Some(at) = first_new else {
            bail!("the resumed task sent no new text delta after {point}");
        };
        if let Seen::Deltas { last_sequence } = seen {
            after = last_sequence;
        }
        deltas += stored_unseen + 1;
        let stored = seen_at_kill + stored_unseen;
        let checkpoint = sealed.into_iter().filter(|&k| k <= stored).max();
        eprintln!(
            "engine-bench: killed after {point} text deltas ({stored} stored, newest checkpoint \
             {checkpoint:?}), resumed in {} ms",
            at.duration_since(spawned).as_millis()
        );
        samples.push(ResumeSample {
            stored,
            from_start: at.duration_since(spawned),
            from_listening: at.duration_since(listening),
            checkpoint,
        });
    }
    drop(server);
    Ok(samples)
}

/// Streams the task's own event log after sequence number `after`, handing each event to
/// `on_event` until it says stop; reports the last sequence number handed over, or the end of
/// the task.
async fn follow(
    http: &reqwest::Client,
    server: &Server,
    task: &str,
    after: u64,
    mut on_event: impl FnMut(&Value) -> bool,
) -> anyhow::Result<Seen> {
    let response = http
        .get(server.url(&format!(
            "/v1/tasks/{task}/events?stream=true&after={after}"
        )))
        .bearer_auth(&server.token)
        .header("Accept", "text/event-stream")
        .send()
        .await?;
    let mut last_sequence = after;
    let mut finished = None;
    let mut stopped = false;
    read_events(response, |event| {
        last_sequence = event["sequence_number"].as_u64().unwrap_or(last_sequence);
        if let Some(kind @ ("response.completed" | "response.failed" | "response.cancelled")) =
            event["type"].as_str()
        {
            finished = Some(kind.to_owned());
            return true;
        }
        stopped = on_event(event);
        stopped
    })
    .await?;
    match finished {
        Some(kind) => Ok(Seen::Finished(kind)),
        None if stopped => Ok(Seen::Deltas { last_sequence }),
        None => bail!("the task's event stream ended early"),
    }
}
