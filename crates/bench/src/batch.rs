//! The Batch API figures (OpenAI's Files + Batch API): a file of `/v1/responses` lines uploaded
//! (multipart `POST /v1/files`, streamed from the harness as it is generated) with the service's
//! RSS sampled meanwhile; a batch created from it and timed to `in_progress` (every line checked,
//! then one task per line created), RSS sampled meanwhile; its lines run to `completed`, while an
//! interactive client sends a synchronous request every few tens of milliseconds; and, for the
//! comparison, the same lines posted one by one as background submits and run to completion.
//!
//! Every line asks for `max_output_tokens` 1 of the reference engine with no delays, so the
//! engine is not what is measured: the service's own work per line is.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use futures::StreamExt;
use serde_json::{json, Value};

use crate::client::{get_json, submit, wait_until_all_finished};
use crate::server::Server;
use crate::stats::Latencies;

/// The flags the harness starts the service with for these figures (the reference engine's
/// delays are zero by default; said here so the output shows it).
pub const SERVE_FLAGS: &[&str] = &[
    "--workers",
    "4",
    "--reference-token-delay",
    "0ms",
    "--reference-load-delay",
    "0ms",
];

/// Output tokens of every line (and of each background submit of the comparison).
pub const LINE_TOKENS: u32 = 1;
/// Output tokens of each interactive request.
pub const INTERACTIVE_TOKENS: u32 = 2;
/// How often the RSS is read during the upload and the validation.
const RSS_EVERY: Duration = Duration::from_millis(5);
/// Lines per chunk of the streamed upload (about 150 KiB).
const LINES_PER_CHUNK: usize = 1_000;
/// How long a batch may take at most before the harness gives up.
const BATCH_TIMEOUT: Duration = Duration::from_secs(1_800);

/// The body of line `i` (also what the comparison posts, with `background: true`).
pub fn line_body(i: usize) -> Value {
    json!({
        "model": "reference",
        "input": format!("batch line {i}: say one word"),
        "max_output_tokens": LINE_TOKENS,
    })
}

/// Line `i` of the input file, with its newline; `pad` more characters of input text (the
/// memory figure's larger files).
fn line(i: usize, pad: usize) -> String {
    let mut body = line_body(i);
    if pad > 0 {
        body["input"] = Value::from(format!("batch line {i}: say one word {}", "x".repeat(pad)));
    }
    let mut text = json!({
        "custom_id": format!("line-{i}"),
        "method": "POST",
        "url": "/v1/responses",
        "body": body,
    })
    .to_string();
    text.push('\n');
    text
}

/// The size of the input file of `lines` lines, in bytes.
pub fn file_bytes(lines: usize) -> u64 {
    padded_file_bytes(lines, 0)
}

/// The size of the input file of `lines` lines padded by `pad`, in bytes.
pub fn padded_file_bytes(lines: usize, pad: usize) -> u64 {
    (0..lines).map(|i| line(i, pad).len() as u64).sum()
}

/// The highest `VmRSS` seen between [`RssWatch::start`] and [`RssWatch::finish`], read every
/// [`RSS_EVERY`] on a thread of its own.
#[derive(Debug)]
pub struct RssWatch {
    stop: Arc<AtomicBool>,
    sampler: Option<tokio::task::JoinHandle<f64>>,
    /// The reading just before the watch started, MiB.
    pub before: f64,
}

impl RssWatch {
    /// Starts watching (`None` for a service given by `--url`: no process to read).
    pub fn start(server: &Arc<Server>) -> Option<Self> {
        let before = server.rss_mib().ok()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let server = Arc::clone(server);
        let sampler = tokio::task::spawn_blocking(move || {
            let mut peak = before;
            loop {
                let done = stopped.load(Ordering::Relaxed);
                if let Ok(rss) = server.rss_mib() {
                    peak = peak.max(rss);
                }
                if done {
                    return peak;
                }
                std::thread::sleep(RSS_EVERY);
            }
        });
        Some(Self {
            stop,
            sampler: Some(sampler),
            before,
        })
    }

    /// Ends the watch: (before, peak) in MiB.
    pub async fn finish(mut self) -> anyhow::Result<(f64, f64)> {
        self.stop.store(true, Ordering::Relaxed);
        let peak = match self.sampler.take() {
            Some(sampler) => sampler.await?,
            None => self.before,
        };
        Ok((self.before, peak))
    }
}

impl Drop for RssWatch {
    /// A watch dropped on an error path stops its thread (which holds the service).
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Ends an optional watch.
async fn finish(watch: Option<RssWatch>) -> anyhow::Result<Option<(f64, f64)>> {
    match watch {
        Some(watch) => Ok(Some(watch.finish().await?)),
        None => Ok(None),
    }
}

/// One upload.
#[derive(Debug, Clone)]
pub struct Upload {
    /// The file's id.
    pub file_id: String,
    /// Its size, bytes.
    pub bytes: u64,
    /// From sending the request to its reply.
    pub seconds: f64,
    /// The service's RSS before and at its highest meanwhile, MiB (a service the harness runs).
    pub rss: Option<(f64, f64)>,
}

/// Uploads a file of `lines` lines (multipart `POST /v1/files`, `purpose` `batch`), generating
/// and streaming it chunk by chunk (chunked transfer encoding: neither side holds the file).
pub async fn upload(
    http: &reqwest::Client,
    server: &Arc<Server>,
    lines: usize,
) -> anyhow::Result<Upload> {
    upload_padded(http, server, lines, 0).await
}

/// [`upload`] with every line's input padded by `pad` characters.
pub async fn upload_padded(
    http: &reqwest::Client,
    server: &Arc<Server>,
    lines: usize,
    pad: usize,
) -> anyhow::Result<Upload> {
    let boundary = "lmsp-bench-boundary-7f3a9c";
    let head = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"bench-{lines}.jsonl\"\r\nContent-Type: application/jsonl\r\n\r\n"
    );
    let tail = format!("\r\n--{boundary}--\r\n");
    let chunks = lines.div_ceil(LINES_PER_CHUNK);
    let body_chunks = (0..chunks).map(move |c| {
        let mut text = String::with_capacity(LINES_PER_CHUNK * 160);
        for i in c * LINES_PER_CHUNK..((c + 1) * LINES_PER_CHUNK).min(lines) {
            text.push_str(&line(i, pad));
        }
        Bytes::from(text)
    });
    let parts = std::iter::once(Bytes::from(head))
        .chain(body_chunks)
        .chain(std::iter::once(Bytes::from(tail)))
        .map(Ok::<Bytes, std::io::Error>);
    let body = reqwest::Body::wrap_stream(futures::stream::iter(parts));
    let watch = RssWatch::start(server);
    let sent = Instant::now();
    let response = http
        .post(server.url("/v1/files"))
        .bearer_auth(&server.token)
        .header(
            "content-type",
            format!("multipart/form-data; boundary={boundary}"),
        )
        .body(body)
        .send()
        .await
        .context("POST /v1/files")?;
    let status = response.status();
    let text = response.text().await?;
    let seconds = sent.elapsed().as_secs_f64();
    let rss = finish(watch).await?;
    if !status.is_success() {
        bail!("POST /v1/files: {status}: {text}");
    }
    let file: Value = serde_json::from_str(&text).context("POST /v1/files: not JSON")?;
    let file_id = file["id"]
        .as_str()
        .ok_or_else(|| anyhow!("POST /v1/files: no id in {text}"))?
        .to_owned();
    let bytes = file["bytes"].as_u64().unwrap_or(0);
    Ok(Upload {
        file_id,
        bytes,
        seconds,
        rss,
    })
}

/// A batch from `POST /v1/batches` to `completed`.
#[derive(Debug, Clone)]
pub struct BatchRun {
    /// `POST /v1/batches` sent → first seen `in_progress` (checked, its tasks created).
    pub to_in_progress_s: f64,
    /// The service's RSS before the POST and at its highest until `in_progress`, MiB.
    pub create_rss: Option<(f64, f64)>,
    /// First seen `in_progress` → first seen `completed`.
    pub run_s: f64,
    /// First seen `in_progress` → first seen with every line counted (completed + failed).
    pub counted_s: f64,
    /// First seen with every line counted → first seen `completed` (the upkeep noticing, then
    /// writing the output file).
    pub finalize_s: f64,
    /// `POST /v1/batches` sent → first seen `completed`.
    pub total_s: f64,
    /// Lines completed (`request_counts.completed`).
    pub completed: u64,
    /// The interactive requests' latencies while the batch ran (`in_progress` → `completed`).
    pub interactive: Interactive,
    /// When every line was first seen counted (splits the interactive requests: lines running,
    /// then the upkeep noticing and writing the files).
    pub counted_at: Instant,
}

/// `GET /v1/batches/{id}`.
async fn batch(http: &reqwest::Client, server: &Server, id: &str) -> anyhow::Result<Value> {
    get_json(http, server, &format!("/v1/batches/{id}")).await
}

/// A batch created and seen `in_progress`.
#[derive(Debug, Clone)]
pub struct Created {
    /// The batch's id.
    pub id: String,
    /// When `POST /v1/batches` was sent.
    pub sent: Instant,
    /// When the batch was first seen `in_progress` (checked, its tasks created).
    pub started: Instant,
    /// The service's RSS before the POST and at its highest until then, MiB.
    pub rss: Option<(f64, f64)>,
}

/// Creates a batch from `file_id` and polls it every 10 ms until `in_progress`, RSS sampled.
pub async fn create_batch(
    http: &reqwest::Client,
    server: &Arc<Server>,
    file_id: &str,
) -> anyhow::Result<Created> {
    let watch = RssWatch::start(server);
    let sent = Instant::now();
    let response = http
        .post(server.url("/v1/batches"))
        .bearer_auth(&server.token)
        .json(&json!({
            "input_file_id": file_id,
            "endpoint": "/v1/responses",
            "completion_window": "24h",
        }))
        .send()
        .await
        .context("POST /v1/batches")?;
    let status = response.status();
    let text = response.text().await?;
    if !status.is_success() {
        let _ = finish(watch).await;
        bail!("POST /v1/batches: {status}: {text}");
    }
    let created: Value = serde_json::from_str(&text).context("POST /v1/batches: not JSON")?;
    let id = created["id"]
        .as_str()
        .ok_or_else(|| anyhow!("POST /v1/batches: no id in {text}"))?
        .to_owned();
    let started = loop {
        let now = batch(http, server, &id).await?;
        match now["status"].as_str() {
            Some("validating") => {}
            Some("in_progress" | "finalizing" | "completed") => break Instant::now(),
            other => {
                let _ = finish(watch).await;
                bail!("batch {id} went {other:?} while validating: {now}");
            }
        }
        if sent.elapsed() > BATCH_TIMEOUT {
            bail!("batch {id} still validating after {BATCH_TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let rss = finish(watch).await?;
    Ok(Created {
        id,
        sent,
        started,
        rss,
    })
}

/// Creates a batch from `file_id`, times it to `in_progress` (polling every 10 ms, RSS sampled),
/// then runs `interactive_every` synchronous requests from a client of their own until it is
/// `completed` (polling every 25 ms).
pub async fn run_batch(
    http: &reqwest::Client,
    server: &Arc<Server>,
    file_id: &str,
    lines: usize,
    interactive_every: Duration,
) -> anyhow::Result<BatchRun> {
    let created = create_batch(http, server, file_id).await?;
    let (id, sent, started) = (created.id, created.sent, created.started);
    let create_rss = created.rss;
    let to_in_progress_s = started.duration_since(sent).as_secs_f64();

    let pacer = Pacer::start(server, interactive_every)?;
    let mut counted: Option<Instant> = None;
    let (done, last) = loop {
        let now = batch(http, server, &id).await?;
        let counts = &now["request_counts"];
        let total = counts["total"].as_u64().unwrap_or(0);
        let finished =
            counts["completed"].as_u64().unwrap_or(0) + counts["failed"].as_u64().unwrap_or(0);
        if counted.is_none() && total > 0 && finished >= total {
            counted = Some(Instant::now());
        }
        match now["status"].as_str() {
            Some("in_progress" | "finalizing") => {}
            Some("completed") => break (Instant::now(), now),
            other => {
                let _ = pacer.finish().await;
                bail!("batch {id} went {other:?} while running: {now}");
            }
        }
        if sent.elapsed() > BATCH_TIMEOUT {
            bail!("batch {id} not completed after {BATCH_TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    let interactive = pacer.finish().await?;
    let counted = counted.unwrap_or(done);
    let completed = last["request_counts"]["completed"].as_u64().unwrap_or(0);
    let failed = last["request_counts"]["failed"].as_u64().unwrap_or(0);
    if completed != lines as u64 || failed != 0 {
        bail!("batch {id}: {completed} lines completed and {failed} failed of {lines}: {last}");
    }
    let output = last["output_file_id"]
        .as_str()
        .ok_or_else(|| anyhow!("batch {id} completed without an output file: {last}"))?;
    let answered = count_lines(http, server, output).await?;
    if answered != lines as u64 {
        bail!("batch {id}: its output file has {answered} lines, not {lines}");
    }
    Ok(BatchRun {
        to_in_progress_s,
        create_rss,
        run_s: done.duration_since(started).as_secs_f64(),
        counted_s: counted.duration_since(started).as_secs_f64(),
        finalize_s: done.duration_since(counted).as_secs_f64(),
        counted_at: counted,
        total_s: done.duration_since(sent).as_secs_f64(),
        completed,
        interactive,
    })
}

/// The lines of a file's content, counted as it streams in.
async fn count_lines(
    http: &reqwest::Client,
    server: &Server,
    file_id: &str,
) -> anyhow::Result<u64> {
    let response = http
        .get(server.url(&format!("/v1/files/{file_id}/content")))
        .bearer_auth(&server.token)
        .send()
        .await?;
    if !response.status().is_success() {
        bail!("GET /v1/files/{file_id}/content: {}", response.status());
    }
    let mut body = response.bytes_stream();
    let mut lines = 0u64;
    while let Some(chunk) = body.next().await {
        lines += chunk?.iter().filter(|&&b| b == b'\n').count() as u64;
    }
    Ok(lines)
}

/// `lines` background submits of the same bodies, `clients` at a time, from the first POST to
/// every task finished (all must complete): lines per second.
pub async fn background(
    http: &reqwest::Client,
    server: &Arc<Server>,
    lines: usize,
    clients: usize,
) -> anyhow::Result<(f64, f64)> {
    let start = Instant::now();
    let results: Vec<anyhow::Result<()>> = futures::stream::iter(0..lines)
        .map(|i| {
            let (http, server) = (http.clone(), Arc::clone(server));
            async move {
                let mut body = line_body(i);
                body["background"] = json!(true);
                match submit(&http, &server, &body).await? {
                    (202, _) => Ok(()),
                    (status, _) => Err(anyhow!("a background submit answered {status}")),
                }
            }
        })
        .buffer_unordered(clients.max(1))
        .collect()
        .await;
    results.into_iter().collect::<anyhow::Result<()>>()?;
    let submitted = start.elapsed().as_secs_f64();
    let done = wait_until_all_finished(http, server, BATCH_TIMEOUT).await?;
    let seconds = done.duration_since(start).as_secs_f64();
    let failed = get_json(http, server, "/v1/tasks?status=failed,cancelled&limit=1").await?;
    if !failed["data"].as_array().is_some_and(Vec::is_empty) {
        bail!("a background submit of the comparison did not complete: {failed}");
    }
    Ok((lines as f64 / seconds, submitted))
}

/// What the interactive client saw.
#[derive(Debug, Clone, Default)]
pub struct Interactive {
    /// Answered 200.
    pub latencies: Latencies,
    /// Each answered request's send time and latency.
    pub sent: Vec<(Instant, Duration)>,
    /// Other replies, and transport errors.
    pub errors: u64,
}

impl Interactive {
    /// The p99 of the requests sent before `at`, and of those sent from `at` on (ms; zero for
    /// none), with how many each.
    pub fn p99_split(&self, at: Instant) -> ((f64, usize), (f64, usize)) {
        let (mut before, mut after) = (Latencies::new(), Latencies::new());
        for &(sent, latency) in &self.sent {
            if sent < at {
                before.push(latency);
            } else {
                after.push(latency);
            }
        }
        let (nb, na) = (before.len(), after.len());
        (
            (before.quantile_ms(0.99), nb),
            (after.quantile_ms(0.99), na),
        )
    }

    /// "N requests, p50 X ms, p99 Y ms, Z errors".
    pub fn describe(&mut self) -> String {
        format!(
            "{} interactive requests, p50 {:.2} ms, p99 {:.2} ms, errors {}",
            self.latencies.len(),
            self.latencies.quantile_ms(0.5),
            self.latencies.quantile_ms(0.99),
            self.errors
        )
    }
}

/// An interactive client: a synchronous `POST /v1/responses` (small output) every `every`, on a
/// schedule (a slow reply does not delay the next request), from an HTTP client of its own.
#[derive(Debug)]
pub struct Pacer {
    stop: Arc<AtomicBool>,
    runner: Option<tokio::task::JoinHandle<anyhow::Result<Interactive>>>,
}

impl Pacer {
    /// Starts sending.
    pub fn start(server: &Arc<Server>, every: Duration) -> anyhow::Result<Self> {
        let http = crate::client::http_client()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let server = Arc::clone(server);
        let runner = tokio::spawn(async move {
            let start = tokio::time::Instant::now();
            let mut handles = Vec::new();
            let mut n: u32 = 0;
            while !stopped.load(Ordering::Relaxed) {
                tokio::time::sleep_until(start + every * n).await;
                n += 1;
                let (http, server) = (http.clone(), Arc::clone(&server));
                handles.push(tokio::spawn(async move {
                    let body = json!({
                        "model": "reference",
                        "input": format!("interactive {n}"),
                        "max_output_tokens": INTERACTIVE_TOKENS,
                    });
                    let sent = Instant::now();
                    let response = http
                        .post(server.url("/v1/responses"))
                        .bearer_auth(&server.token)
                        .json(&body)
                        .send()
                        .await;
                    match response {
                        Ok(response) if response.status().as_u16() == 200 => {
                            response.bytes().await.ok().map(|_| (sent, sent.elapsed()))
                        }
                        _ => None,
                    }
                }));
            }
            let mut seen = Interactive::default();
            for handle in handles {
                match handle.await? {
                    Some((sent, latency)) => {
                        seen.latencies.push(latency);
                        seen.sent.push((sent, latency));
                    }
                    None => seen.errors += 1,
                }
            }
            Ok(seen)
        });
        Ok(Self {
            stop,
            runner: Some(runner),
        })
    }

    /// Stops sending, waits for the requests in flight, and returns what they saw.
    pub async fn finish(mut self) -> anyhow::Result<Interactive> {
        self.stop.store(true, Ordering::Relaxed);
        match self.runner.take() {
            Some(runner) => runner.await?,
            None => Ok(Interactive::default()),
        }
    }
}

impl Drop for Pacer {
    /// A client dropped on an error path stops sending (its task holds the service).
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The interactive client alone on the (idle) service for `duration`, after a few warm-up
/// requests.
pub async fn interactive_idle(
    server: &Arc<Server>,
    every: Duration,
    duration: Duration,
) -> anyhow::Result<Interactive> {
    let warm = Pacer::start(server, Duration::from_millis(10))?;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let warmed = warm.finish().await?;
    if warmed.errors > 0 {
        bail!(
            "interactive warm-up requests failed ({} errors)",
            warmed.errors
        );
    }
    let pacer = Pacer::start(server, every)?;
    tokio::time::sleep(duration).await;
    pacer.finish().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_json_objects_of_the_batch_shape() {
        let text = line(7, 0);
        assert!(text.ends_with('\n'));
        let value: Value = serde_json::from_str(text.trim_end()).unwrap_or_default();
        assert_eq!(value["custom_id"], "line-7");
        assert_eq!(value["url"], "/v1/responses");
        assert_eq!(value["body"]["max_output_tokens"], LINE_TOKENS);
        assert_eq!(file_bytes(2), (line(0, 0).len() + line(1, 0).len()) as u64);
        // A padded line is the same line with a longer input.
        let padded: Value = serde_json::from_str(line(7, 10).trim_end()).unwrap_or_default();
        assert_eq!(padded["custom_id"], "line-7");
        assert!(padded["body"]["input"]
            .as_str()
            .is_some_and(|input| input.ends_with(" xxxxxxxxxx")));
        assert_eq!(padded_file_bytes(1, 10), line(0, 10).len() as u64);
    }
}
