//! One streamed request and what it measured, on each HTTP path: a streaming chat completion
//! straight to llama.cpp's server, or a streaming `POST /v1/responses` through LMSP.

use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use eventsource_stream::Eventsource;
use futures::StreamExt;
use serde_json::{json, Value};

use lmsp_bench::server::Server;

/// What a request asks: a system message, a user message, and the most tokens to generate
/// (greedy, seed 1).
#[derive(Debug, Clone)]
pub struct Ask {
    pub system: String,
    pub user: String,
    pub tokens: u64,
}

/// What one streamed request measured.
#[derive(Debug, Clone)]
pub struct Streamed {
    pub sent: Instant,
    /// When the first text arrived.
    pub first: Instant,
    /// When the last text arrived.
    pub last: Instant,
    /// Output tokens, as the server counted them.
    pub tokens: u64,
    /// Prompt tokens, and how many of them came from a cache, when the server said so.
    pub prompt_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
    pub text: String,
}

impl Streamed {
    /// Request sent → first text received.
    pub fn first_token(&self) -> Duration {
        self.first.duration_since(self.sent)
    }

    /// Tokens per second after the first.
    pub fn tokens_per_second(&self) -> f64 {
        let after_first = self.tokens.saturating_sub(1) as f64;
        after_first / self.last.duration_since(self.first).as_secs_f64().max(1e-9)
    }
}

/// Tokens per second of streams run together: every token after each stream's first, over the
/// time from the earliest first token to the latest last one.
pub fn aggregate_rate(streams: &[Streamed]) -> f64 {
    let (Some(start), Some(end)) = (
        streams.iter().map(|s| s.first).min(),
        streams.iter().map(|s| s.last).max(),
    ) else {
        return f64::NAN;
    };
    let tokens: u64 = streams.iter().map(|s| s.tokens.saturating_sub(1)).sum();
    tokens as f64 / end.duration_since(start).as_secs_f64().max(1e-9)
}

/// Accumulates the text of a stream with the times of its first and last pieces.
pub struct Clock {
    sent: Instant,
    first: Option<Instant>,
    last: Instant,
    text: String,
    pub prompt_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
}

impl Clock {
    pub fn start() -> Self {
        let now = Instant::now();
        Self {
            sent: now,
            first: None,
            last: now,
            text: String::new(),
            prompt_tokens: None,
            cached_tokens: None,
        }
    }

    pub fn text(&mut self, piece: &str) {
        if piece.is_empty() {
            return;
        }
        let now = Instant::now();
        self.first.get_or_insert(now);
        self.last = now;
        self.text.push_str(piece);
    }

    pub fn done(self, tokens: u64) -> anyhow::Result<Streamed> {
        let first = self
            .first
            .ok_or_else(|| anyhow!("the stream sent no text"))?;
        Ok(Streamed {
            sent: self.sent,
            first,
            last: self.last,
            tokens,
            prompt_tokens: self.prompt_tokens,
            cached_tokens: self.cached_tokens,
            text: self.text,
        })
    }
}

/// Reads an SSE response, handing each event's JSON to `on_event`; stops at `[DONE]`, at the
/// end of the body, or when `on_event` says so.
pub async fn read_events(
    response: reqwest::Response,
    mut on_event: impl FnMut(&Value) -> bool,
) -> anyhow::Result<()> {
    if !response.status().is_success() {
        bail!("the stream answered {}", response.status());
    }
    let mut events = response.bytes_stream().eventsource();
    while let Some(event) = events.next().await {
        let event = event.map_err(|e| anyhow!("the stream broke: {e}"))?;
        if event.data.trim() == "[DONE]" {
            break;
        }
        let value: Value = serde_json::from_str(&event.data).context("an event's JSON")?;
        if on_event(&value) {
            break;
        }
    }
    Ok(())
}

/// A streaming chat completion straight to llama.cpp's server (its prompt cache on).
pub async fn stream_direct(
    http: &reqwest::Client,
    api: &str,
    ask: &Ask,
) -> anyhow::Result<Streamed> {
    let body = json!({
        "model": "bench",
        "messages": [
            {"role": "system", "content": ask.system},
            {"role": "user", "content": ask.user},
        ],
        "stream": true, "max_tokens": ask.tokens, "temperature": 0, "seed": 1,
        "cache_prompt": true,
        "stream_options": {"include_usage": true},
    });
    let mut clock = Clock::start();
    let request = http.post(format!("{api}/chat/completions")).json(&body);
    // llama.cpp's server closes idle keep-alive connections on its own schedule: a request sent
    // on one it just closed never reached it, so it is sent again (on a new connection).
    let response = match request.try_clone().map(|r| r.send()) {
        Some(sent) => match sent.await {
            Ok(response) => response,
            Err(error) if error.is_request() || error.is_connect() => {
                clock = Clock::start();
                request.send().await?
            }
            Err(error) => return Err(error.into()),
        },
        None => request.send().await?,
    };
    let mut counted = 0;
    read_events(response, |chunk| {
        if let Some(text) = chunk["choices"][0]["delta"]["content"].as_str() {
            clock.text(text);
        }
        let usage = &chunk["usage"];
        if let Some(n) = usage["completion_tokens"].as_u64() {
            counted = n;
            clock.prompt_tokens = usage["prompt_tokens"].as_u64();
            clock.cached_tokens = usage["prompt_tokens_details"]["cached_tokens"].as_u64();
        }
        false
    })
    .await?;
    clock.done(counted)
}

/// A streaming `POST /v1/responses` through LMSP.
pub async fn stream_lmsp(
    http: &reqwest::Client,
    server: &Server,
    model: &str,
    ask: &Ask,
) -> anyhow::Result<Streamed> {
    let body = json!({
        "model": model, "instructions": ask.system, "input": ask.user, "stream": true,
        "max_output_tokens": ask.tokens, "temperature": 0, "seed": 1,
    });
    let mut clock = Clock::start();
    let response = http
        .post(server.url("/v1/responses"))
        .bearer_auth(&server.token)
        .json(&body)
        .send()
        .await?;
    let mut counted = 0;
    let mut ended = None;
    read_events(response, |event| {
        match event["type"].as_str() {
            Some("response.output_text.delta") => {
                clock.text(event["delta"].as_str().unwrap_or_default());
            }
            Some(kind @ ("response.completed" | "response.failed" | "response.incomplete")) => {
                let usage = &event["response"]["usage"];
                counted = usage["output_tokens"].as_u64().unwrap_or(0);
                clock.prompt_tokens = usage["input_tokens"].as_u64();
                clock.cached_tokens = usage["input_tokens_details"]["cached_tokens"].as_u64();
                ended = Some(kind.to_owned());
                return true;
            }
            _ => {}
        }
        false
    })
    .await?;
    if ended.as_deref() != Some("response.completed") {
        bail!("the LMSP stream ended with {ended:?}");
    }
    clock.done(counted)
}
