//! The HTTP side of the harness: a reqwest client, background submits, task reads, and a
//! Server-Sent Events reader (`eventsource-stream`) that timestamps each message as its chunk
//! arrives.

use std::pin::Pin;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use eventsource_stream::{Event, EventStream, Eventsource};
use futures::{FutureExt, Stream, StreamExt};
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
    /// `event:` (`message` when the frame names none).
    pub event: String,
    /// `data:`.
    pub data: String,
    /// When the chunk that completed it arrived (ms since the epoch).
    pub arrived_ms: f64,
}

type ByteStream = Pin<Box<dyn Stream<Item = anyhow::Result<Bytes>> + Send>>;

/// Reads Server-Sent Events off a response body with `eventsource-stream` (a character split
/// across two chunks arrives whole), and timestamps each message as its chunk arrives. No task
/// of its own: the reader is polled by whoever reads it (the RSS figure holds 10 000 of them).
pub struct SseReader {
    events: EventStream<ByteStream>,
}

impl std::fmt::Debug for SseReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SseReader").finish_non_exhaustive()
    }
}

impl SseReader {
    /// Reads `response`'s body as SSE (it must be a 200 `text/event-stream`); fails a read after
    /// `idle` without a byte (a keep-alive comment counts).
    pub fn new(response: reqwest::Response, idle: Duration) -> anyhow::Result<Self> {
        if response.status().as_u16() != 200 {
            bail!("expected 200 text/event-stream, got {}", response.status());
        }
        let body = response
            .bytes_stream()
            .map(|chunk| chunk.map_err(|error| anyhow!("SSE body: {error}")));
        Ok(Self::of_bytes(body, idle))
    }

    /// Reads SSE off `body`, failing after `idle` without a chunk.
    fn of_bytes<S>(body: S, idle: Duration) -> Self
    where
        S: Stream<Item = anyhow::Result<Bytes>> + Send + 'static,
    {
        let watched = futures::stream::unfold(Box::pin(body), move |mut body| async move {
            match tokio::time::timeout(idle, body.next()).await {
                Ok(Some(chunk)) => Some((chunk, body)),
                Ok(None) => None,
                Err(_) => Some((Err(anyhow!("no SSE bytes for {idle:?}")), body)),
            }
        });
        let bytes: ByteStream = Box::pin(watched);
        Self {
            events: bytes.eventsource(),
        }
    }

    /// The next message and every other one already received with it (comments skipped), all
    /// stamped with the arrival of the first; `None` at the end of the stream.
    pub async fn next_batch(&mut self) -> anyhow::Result<Option<Vec<SseMessage>>> {
        let Some(first) = self.events.next().await else {
            return Ok(None);
        };
        let arrived_ms = wall_millis();
        let mut messages = vec![message(first?, arrived_ms)];
        // What the parser holds already, or the body has ready, arrived with the first.
        while let Some(Some(next)) = self.events.next().now_or_never() {
            messages.push(message(next?, arrived_ms));
        }
        Ok(Some(messages))
    }
}

/// A parsed event as the harness reads it.
fn message(event: Event, arrived_ms: f64) -> SseMessage {
    SseMessage {
        id: event.id.parse().ok(),
        event: event.event,
        data: event.data,
        arrived_ms,
    }
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

    /// A body that sends `chunks`, one poll each.
    fn body(chunks: &[&[u8]]) -> impl Stream<Item = anyhow::Result<Bytes>> + Send + 'static {
        let chunks: Vec<anyhow::Result<Bytes>> = chunks
            .iter()
            .map(|chunk| Ok(Bytes::copy_from_slice(chunk)))
            .collect();
        futures::stream::iter(chunks)
    }

    #[tokio::test]
    async fn messages_of_one_chunk_come_in_one_batch_and_comments_are_skipped() {
        let chunk = b": keep-alive\n\nid: 3\nevent: response.output_text.delta\ndata: {\"a\":1}\n\nid: 4\nevent: response.completed\ndata: {}\n\n";
        let mut reader = SseReader::of_bytes(body(&[chunk]), Duration::from_secs(5));

        let batch = reader.next_batch().await.unwrap().unwrap();

        assert_eq!(batch.len(), 2, "{batch:?}");
        assert_eq!(batch[0].id, Some(3));
        assert_eq!(batch[0].event, "response.output_text.delta");
        assert_eq!(batch[0].data, "{\"a\":1}");
        assert_eq!(batch[1].id, Some(4));
        assert!(is_terminal(&batch[1].event));
        assert!(reader.next_batch().await.unwrap().is_none());
    }

    #[tokio::test]
    async fn a_character_split_across_two_chunks_arrives_whole() {
        let frame = "id: 1\nevent: response.output_text.delta\ndata: {\"delta\":\"é\"}\n\n";
        let split = frame.find('é').unwrap() + 1;
        let (head, tail) = frame.as_bytes().split_at(split);
        let mut reader = SseReader::of_bytes(body(&[head, tail]), Duration::from_secs(5));

        let batch = reader.next_batch().await.unwrap().unwrap();

        assert_eq!(batch[0].data, "{\"delta\":\"é\"}");
    }

    #[tokio::test]
    async fn a_body_silent_for_the_idle_time_fails_the_read() {
        let silent = futures::stream::pending::<anyhow::Result<Bytes>>();
        let mut reader = SseReader::of_bytes(silent, Duration::from_millis(10));

        let error = reader.next_batch().await.unwrap_err();

        assert!(error.to_string().contains("no SSE bytes"), "{error}");
    }

    #[test]
    fn created_at_reads_as_epoch_millis_and_terminal_events_are_known() {
        let event = json!({"created_at": "2024-01-01T00:00:00.123Z"});
        let ms = event_created_at_millis(&event).unwrap();
        assert_eq!(ms, 1_704_067_200_123.0);
        assert!(is_terminal("response.failed") && !is_terminal("response.queued"));
        assert!(is_terminal("response.incomplete") && !is_terminal("error"));
    }
}
