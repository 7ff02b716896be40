//! The HTTP side of the harness: a reqwest client, background submits, task reads, and a small
//! Server-Sent Events reader that timestamps each chunk as it arrives.

use std::pin::Pin;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use futures::{Stream, StreamExt};
use serde_json::{json, Value};

use crate::server::Server;

/// A client for many concurrent connections to one service.
pub fn http_client() -> anyhow::Result<reqwest::Client> {
    reqwest::Client::builder()
        .pool_idle_timeout(Duration::from_secs(90))
        .tcp_nodelay(true)
        .build()
        .context("cannot build the HTTP client")
}

/// The body of a background submit.
pub fn submit_body(input: &str, max_output_tokens: u32) -> Value {
    json!({
        "model": "reference",
        "input": input,
        "background": true,
        "max_output_tokens": max_output_tokens,
    })
}

/// `POST /v1/responses` with `body`; returns the status and the task id (when one came back).
pub async fn submit(
    http: &reqwest::Client,
    server: &Server,
    body: &Value,
) -> anyhow::Result<(u16, Option<String>)> {
    let response = http
        .post(server.url("/v1/responses"))
        .bearer_auth(&server.token)
        .json(body)
        .send()
        .await?;
    let status = response.status().as_u16();
    let task_id = response
        .headers()
        .get("lmsp-task-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    // Read the body so the connection is reused.
    let _ = response.bytes().await?;
    Ok((status, task_id))
}

/// `GET path` as JSON.
pub async fn get_json(
    http: &reqwest::Client,
    server: &Server,
    path: &str,
) -> anyhow::Result<Value> {
    let response = http
        .get(server.url(path))
        .bearer_auth(&server.token)
        .send()
        .await?;
    let status = response.status();
    let text = response.text().await?;
    if !status.is_success() {
        bail!("GET {path}: {status}: {text}");
    }
    serde_json::from_str(&text).with_context(|| format!("GET {path}: not JSON"))
}

/// Milliseconds since the epoch, with sub-millisecond digits.
pub fn wall_millis() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

/// One SSE message.
#[derive(Debug, Clone)]
pub struct SseMessage {
    /// `id:` as a number (the task log's sequence number, in every rendering of LMSP).
    pub id: Option<u64>,
    /// `event:`.
    pub event: String,
    /// `data:`.
    pub data: String,
    /// When the chunk that completed it arrived (ms since the epoch).
    pub arrived_ms: f64,
}

type ByteStream = Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>;

/// Reads Server-Sent Events off a response body.
pub struct SseReader {
    body: ByteStream,
    buffer: Vec<u8>,
}

impl std::fmt::Debug for SseReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SseReader")
            .field("buffered", &self.buffer.len())
            .finish_non_exhaustive()
    }
}

impl SseReader {
    /// Reads `response`'s body as SSE (it must be a 200 `text/event-stream`).
    pub fn new(response: reqwest::Response) -> anyhow::Result<Self> {
        if response.status().as_u16() != 200 {
            bail!("expected 200 text/event-stream, got {}", response.status());
        }
        Ok(Self {
            body: Box::pin(response.bytes_stream()),
            buffer: Vec::new(),
        })
    }

    /// Every complete message of the next chunk (comments skipped); `None` at the end of the
    /// stream, or after `idle` without a byte.
    pub async fn next_batch(&mut self, idle: Duration) -> anyhow::Result<Option<Vec<SseMessage>>> {
        loop {
            let chunk = match tokio::time::timeout(idle, self.body.next()).await {
                Err(_) => bail!("no SSE bytes for {idle:?}"),
                Ok(None) => return Ok(None),
                Ok(Some(chunk)) => chunk.map_err(|e| anyhow!("SSE body: {e}"))?,
            };
            let arrived_ms = wall_millis();
            self.buffer.extend_from_slice(&chunk);
            let mut messages = Vec::new();
            while let Some(end) = find_blank_line(&self.buffer) {
                let block: Vec<u8> = self.buffer.drain(..end + 2).collect();
                if let Some(message) = parse_block(&block, arrived_ms) {
                    messages.push(message);
                }
            }
            if !messages.is_empty() {
                return Ok(Some(messages));
            }
        }
    }
}

fn find_blank_line(buffer: &[u8]) -> Option<usize> {
    buffer.windows(2).position(|pair| pair == b"\n\n")
}

fn parse_block(block: &[u8], arrived_ms: f64) -> Option<SseMessage> {
    let text = String::from_utf8_lossy(block);
    let mut id = None;
    let mut event = String::new();
    let mut data = String::new();
    for line in text.lines() {
        if let Some(value) = line.strip_prefix("id:") {
            id = value.trim().parse().ok();
        } else if let Some(value) = line.strip_prefix("event:") {
            event = value.trim().to_owned();
        } else if let Some(value) = line.strip_prefix("data:") {
            if !data.is_empty() {
                data.push('\n');
            }
            data.push_str(value.strip_prefix(' ').unwrap_or(value));
        }
    }
    (!data.is_empty()).then_some(SseMessage {
        id,
        event,
        data,
        arrived_ms,
    })
}

/// Whether an event type ends a task's stream: the terminal events of the LMSP-native rendering,
/// and of the OpenAI one (where a cancelled response ends with `response.incomplete`).
pub fn is_terminal(event: &str) -> bool {
    matches!(
        event,
        "response.completed" | "response.failed" | "response.cancelled" | "response.incomplete"
    )
}

/// The `created_at` of an LMSP-native event object, in ms since the epoch.
pub fn event_created_at_millis(value: &Value) -> anyhow::Result<f64> {
    let text = value["created_at"]
        .as_str()
        .ok_or_else(|| anyhow!("event without created_at"))?;
    let at = chrono::DateTime::parse_from_rfc3339(text)
        .with_context(|| format!("bad created_at {text}"))?;
    Ok(at.timestamp_millis() as f64)
}

/// Polls `GET /v1/tasks?status=…&limit=1` until no task is unfinished, or `timeout`.
pub async fn wait_until_all_finished(
    http: &reqwest::Client,
    server: &Server,
    timeout: Duration,
) -> anyhow::Result<Instant> {
    let deadline = Instant::now() + timeout;
    loop {
        let page = get_json(
            http,
            server,
            "/v1/tasks?status=queued,loading,running,cancelling&limit=1",
        )
        .await?;
        if page["data"].as_array().is_some_and(Vec::is_empty) {
            return Ok(Instant::now());
        }
        if Instant::now() > deadline {
            bail!("tasks still unfinished after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_parse_and_comments_are_skipped() {
        let block = b"id: 3\nevent: response.output_text.delta\ndata: {\"a\":1}\n\n";
        let message = parse_block(block, 1.0).unwrap();
        assert_eq!(message.id, Some(3));
        assert_eq!(message.event, "response.output_text.delta");
        assert_eq!(message.data, "{\"a\":1}");
        assert!(parse_block(b":\n\n", 1.0).is_none());
        assert_eq!(find_blank_line(b"a\n\nb"), Some(1));
        let event = json!({"created_at": "2024-01-01T00:00:00.123Z"});
        let ms = event_created_at_millis(&event).unwrap();
        assert_eq!(ms, 1_704_067_200_123.0);
        assert!(is_terminal("response.failed") && !is_terminal("response.queued"));
        assert!(is_terminal("response.incomplete") && !is_terminal("error"));
    }
}
