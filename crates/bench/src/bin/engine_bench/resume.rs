//! Resume latency: one background task with `on_restart: "resume"`, its service killed with
//! SIGKILL once the task's event stream has shown N text deltas, for each N in turn, and started
//! again on the same data directory; measured from the restarted process's spawn (and from its
//! "listening" line, i.e. after recovery) to the first text delta of the resumed run on the
//! task's event stream (`GET /v1/tasks/{id}/events`, after the `response.resumed` event).
//!
//! A resume replays the tokens after the newest KV checkpoint, so its time depends on where the
//! kill falls between two checkpoints. With checkpoints on, a point's kills are therefore placed
//! at evenly spread phases of one checkpoint interval ([`Kill::Phase`]): the first checkpoint
//! sealed at or after the point, `c`, and the spacing before it, `s` (checkpoints come closer
//! together as the context grows, so the next one may come a little before `c + s`), the `i`-th
//! of `n` kills at `c + (i + ½) / n × s`. Their mean is then the expected resume time of a kill
//! at a random moment of that interval, not of wherever a fixed delta count happens to fall.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};
use serde_json::{json, Value};

use lmsp_bench::server::Server;

use super::stream::{read_events, Ask};

/// Where to kill the service, in the text deltas the task's event stream has shown.
#[derive(Debug, Clone, Copy)]
pub enum Kill {
    /// After this many deltas.
    At(u64),
    /// Kill `index` of `of` in the checkpoint interval that starts at the first checkpoint
    /// sealed at or after `point` deltas (the module's doc).
    Phase { point: u64, index: u64, of: u64 },
}

/// One kill and restart.
#[derive(Debug, Clone)]
pub struct ResumeSample {
    /// The index of the kill's point in the chain's points.
    pub group: usize,
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

/// The checkpoint interval a point's phased kills fall in: its first checkpoint and the spacing
/// before it.
#[derive(Debug, Clone, Copy)]
struct Interval {
    start: u64,
    spacing: u64,
}

impl Interval {
    /// The first checkpoint in `sealed` at or after `point` and the one before it (the run's
    /// newest two checkpoints stay in place, docs/engines.md; none before: the prompt, 0).
    fn find(sealed: &[u64], point: u64) -> Option<Self> {
        let start = sealed.iter().copied().filter(|&k| k >= point).min()?;
        let before = sealed
            .iter()
            .copied()
            .filter(|&k| k < start)
            .max()
            .unwrap_or(0);
        Some(Self {
            start,
            spacing: start - before,
        })
    }

    /// The delta count of kill `index` of `of`: at the middle of its `1 / of` of the interval.
    fn kill_at(self, index: u64, of: u64) -> u64 {
        self.start + ((2 * index + 1) * self.spacing).div_ceil(2 * of.max(1))
    }
}

/// Runs one task through `kills` in turn, each tagged with its point's index; `args` start
/// the service.
pub async fn chain(
    http: &reqwest::Client,
    lmsp: &Path,
    data_dir: &Path,
    args: &[String],
    model: &str,
    ask: &Ask,
    kills: &[(usize, Kill)],
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
    // The interval of the point whose phased kills are under way.
    let mut interval: Option<(u64, Interval)> = None;
    for &(group, kill) in kills {
        // Follow the task until it has shown the kill's deltas, then kill its service.
        let point = match kill {
            Kill::At(point) | Kill::Phase { point, .. } => point,
        };
        let mut counted = 0u64;
        let seen = follow(http, &server, &task, after, |event| {
            if event["type"] != "response.output_text.delta" {
                return false;
            }
            counted += 1;
            let now = deltas + counted;
            match kill {
                Kill::At(at) => now >= at,
                Kill::Phase { point, index, of } => {
                    let known = interval.filter(|&(of_point, _)| of_point == point);
                    let found = known.map(|(_, found)| found).or_else(|| {
                        (now >= point)
                            .then(|| Interval::find(&sealed_checkpoints(data_dir), point))
                            .flatten()
                    });
                    let Some(found) = found else {
                        return false;
                    };
                    interval = Some((point, found));
                    now >= found.kill_at(index, of)
                }
            }
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
            group,
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

#[cfg(test)]
mod tests {
    use super::Interval;

    #[test]
    fn a_points_kills_fall_at_the_middles_of_equal_parts_of_its_interval() {
        // Checkpoints at 256 and 479 in place: a point of 300 waits for 479, spaced 223.
        let interval = Interval::find(&[256, 479], 300).expect("479 is at or after 300");
        assert_eq!((interval.start, interval.spacing), (479, 223));
        let kills: Vec<u64> = (0..4).map(|i| interval.kill_at(i, 4)).collect();
        assert_eq!(kills, [479 + 28, 479 + 84, 479 + 140, 479 + 196]);
        // The first checkpoint is spaced from the prompt.
        let first = Interval::find(&[256], 100).expect("256 is at or after 100");
        assert_eq!((first.start, first.spacing), (256, 256));
        assert_eq!(first.kill_at(0, 1), 256 + 128);
        // No checkpoint at or after the point yet: wait.
        assert!(Interval::find(&[256, 479], 500).is_none());
    }
}
