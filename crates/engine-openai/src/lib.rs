//! An [`Engine`] that sends the work to an OpenAI-compatible server (llama.cpp's server, Ollama,
//! vLLM) with streaming chat completions.
//!
//! The upstream model name is the task's model id. A snapshot needs no engine state: resuming
//! re-sends the prompt with the text produced so far as the start of the assistant's turn, and
//! continues from there (the README).

use std::collections::VecDeque;
use std::time::Duration;

use async_trait::async_trait;
use eventsource_stream::{Event as SseEvent, EventStreamError, Eventsource};
use futures::StreamExt;
use serde_json::{json, Value};

use lmsp_domain::ports::{Engine, EngineError, Generation, GenerationItem, GenerationJob};
use lmsp_domain::{Message, ModelSource, ModelToLoad, Role, Usage};

/// Where the upstream server is.
#[derive(Debug, Clone)]
pub struct OpenAiSettings {
    /// The API base, e.g. `http://127.0.0.1:8080/v1`.
    pub base_url: String,
    /// How long to wait for the upstream to accept a connection.
    pub connect_timeout: Duration,
    /// How long the upstream may send nothing (no header, no chunk) before the task fails with
    /// `timeout`: a stopped or hung upstream never keeps a task `loading` or `running`.
    pub read_timeout: Duration,
}

/// The OpenAI-compatible engine.
#[derive(Debug, Clone)]
pub struct OpenAiEngine {
    settings: OpenAiSettings,
    http: reqwest::Client,
}

impl OpenAiEngine {
    /// An engine for the upstream at `settings.base_url`.
    pub fn new(settings: OpenAiSettings) -> Result<Self, EngineError> {
        let http = reqwest::Client::builder()
            .connect_timeout(settings.connect_timeout)
            .build()
            .map_err(|e| EngineError::Failed(format!("cannot build the HTTP client: {e}")))?;
        Ok(Self { settings, http })
    }

    fn url(&self, path: &str) -> String {
        format!("{}/{path}", self.settings.base_url.trim_end_matches('/'))
    }
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::System | Role::Developer => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
    }
}

/// The chat messages for a job: its conversation, and when resuming, the text so far as the
/// assistant's.
fn messages(conversation: &[Message], text_so_far: Option<&str>) -> Vec<Value> {
    let mut messages: Vec<Value> = conversation
        .iter()
        .map(|m| json!({"role": role_name(m.role), "content": m.content}))
        .collect();
    if let Some(text) = text_so_far.filter(|t| !t.is_empty()) {
        messages.push(json!({"role": "assistant", "content": text}));
    }
    messages
}

#[async_trait]
impl Engine for OpenAiEngine {
    async fn load(&self, _model: &ModelToLoad) -> Result<(), EngineError> {
        // The upstream loads its models itself; check that it answers.
        let asked = self.http.get(self.url("models")).send();
        let response = tokio::time::timeout(self.settings.read_timeout, asked)
            .await
            .map_err(|_| {
                EngineError::Timeout(format!(
                    "the upstream did not answer within {:?}",
                    self.settings.read_timeout
                ))
            })?
            .map_err(|e| {
                EngineError::UpstreamUnavailable(format!("the upstream does not answer: {e}"))
            })?;
        if response.status().is_success() {
            Ok(())
        } else {
            Err(EngineError::UpstreamUnavailable(format!(
                "the upstream answered {}",
                response.status()
            )))
        }
    }

    async fn generate(&self, job: GenerationJob) -> Result<Box<dyn Generation>, EngineError> {
        let text_so_far = job
            .resume
            .as_ref()
            .map(|r| r.text_so_far.clone())
            .unwrap_or_default();
        // The snapshot's state is the count of tokens produced before it (one streamed chunk is
        // one token), so a resumed task's budget is counted in tokens, never in words.
        let produced = job.resume.as_ref().map_or(0, |r| tokens_in_state(&r.state));
        let remaining = u64::from(job.spec.max_output_tokens).saturating_sub(produced);
        if remaining == 0 {
            return Ok(Box::new(UpstreamGeneration::finished(Usage {
                input_tokens: 0,
                output_tokens: produced,
            })));
        }
        let model = match &job.model.record.source {
            ModelSource::Upstream { name } => name.clone(),
            ModelSource::File { .. } => job.model.record.id.as_str().to_owned(),
        };
        let mut body = json!({
            "model": model,
            "messages": messages(&job.spec.conversation(), Some(&text_so_far)),
            "stream": true,
            "stream_options": {"include_usage": true},
            "max_tokens": remaining,
            "seed": job.spec.seed,
        });
        if let Some(temperature) = job.spec.temperature {
            body["temperature"] = json!(temperature.get());
        }
        if let Some(top_p) = job.spec.top_p {
            body["top_p"] = json!(top_p.get());
        }
        let sent = self
            .http
            .post(self.url("chat/completions"))
            .json(&body)
            .send();
        let response = tokio::time::timeout(self.settings.read_timeout, sent)
            .await
            .map_err(|_| {
                EngineError::Timeout(format!(
                    "the upstream did not answer within {:?}",
                    self.settings.read_timeout
                ))
            })?
            .map_err(|e| {
                EngineError::UpstreamUnavailable(format!("the upstream does not answer: {e}"))
            })?;
        if !response.status().is_success() {
            let status = response.status();
            let text = response.text().await.unwrap_or_default();
            return Err(EngineError::UpstreamUnavailable(format!(
                "the upstream answered {status}: {}",
                upstream_message(&text)
            )));
        }
        Ok(Box::new(UpstreamGeneration {
            events: Box::pin(response.bytes_stream().eventsource()),
            read_timeout: self.settings.read_timeout,
            pending: VecDeque::new(),
            usage: Usage {
                input_tokens: 0,
                output_tokens: produced,
            },
            before: produced,
            finish_reason_seen: false,
            done: false,
        }))
    }
}

/// The tokens a snapshot's state says were produced before it.
fn tokens_in_state(state: &[u8]) -> u64 {
    <[u8; 8]>::try_from(state).map_or(0, u64::from_le_bytes)
}

/// The message of an upstream's error document (`{"error": {"message": …}}`), or its text.
fn upstream_message(text: &str) -> String {
    serde_json::from_str::<Value>(text)
        .ok()
        .and_then(|doc| {
            doc["error"]["message"]
                .as_str()
                .or_else(|| doc["error"].as_str())
                .map(str::to_owned)
        })
        .unwrap_or_else(|| text.chars().take(500).collect())
}

type Events = std::pin::Pin<
    Box<dyn futures::Stream<Item = Result<SseEvent, EventStreamError<reqwest::Error>>> + Send>,
>;

struct UpstreamGeneration {
    /// The upstream's server-sent events, parsed by `eventsource-stream` (which decodes whole
    /// lines, so a character split between two network chunks arrives intact).
    events: Events,
    read_timeout: Duration,
    pending: VecDeque<GenerationItem>,
    usage: Usage,
    /// Tokens produced before a resume (this run's usage counts only its own).
    before: u64,
    /// Whether the upstream gave a finish reason: a stream that ends without one (or `[DONE]`)
    /// was cut off.
    finish_reason_seen: bool,
    done: bool,
}

impl UpstreamGeneration {
    /// A generation with nothing left to produce (a resumed task whose budget is spent).
    fn finished(usage: Usage) -> Self {
        let mut generation = Self {
            events: Box::pin(futures::stream::empty()),
            read_timeout: Duration::ZERO,
            pending: VecDeque::new(),
            usage,
            before: usage.output_tokens,
            finish_reason_seen: true,
            done: false,
        };
        generation.finish();
        generation
    }

    /// Turns one event's data into items.
    fn take(&mut self, data: &str) -> Result<(), EngineError> {
        let data = data.trim();
        if data == "[DONE]" {
            self.finish();
            return Ok(());
        }
        let chunk: Value = serde_json::from_str(data)
            .map_err(|e| EngineError::Failed(format!("the upstream sent malformed JSON: {e}")))?;
        if let Some(error) = chunk.get("error") {
            return Err(EngineError::UpstreamUnavailable(format!(
                "the upstream failed: {}",
                upstream_message(&json!({ "error": error }).to_string())
            )));
        }
        if let Some(usage) = chunk.get("usage").filter(|usage| usage.is_object()) {
            if let Some(prompt) = usage["prompt_tokens"].as_u64() {
                self.usage.input_tokens = prompt;
            }
            if let Some(completion) = usage["completion_tokens"].as_u64() {
                self.usage.output_tokens = self.before + completion;
            }
        }
        let choice = &chunk["choices"][0];
        if let Some(text) = choice["delta"]["content"]
            .as_str()
            .filter(|t| !t.is_empty())
        {
            self.usage.output_tokens += 1;
            self.pending.push_back(GenerationItem::Delta {
                text: text.to_owned(),
                state: self.usage.output_tokens.to_le_bytes().to_vec(),
            });
        }
        if choice["finish_reason"].is_string() {
            // The usage chunk (`stream_options.include_usage`) comes after the finish reason;
            // the generation finishes at `[DONE]` or at the end of the stream.
            self.finish_reason_seen = true;
        }
        Ok(())
    }

    fn finish(&mut self) {
        if !self.done {
            self.done = true;
            self.pending
                .push_back(GenerationItem::Finished { usage: self.usage });
        }
    }
}

#[async_trait]
impl Generation for UpstreamGeneration {
    async fn next_item(&mut self) -> Result<Option<GenerationItem>, EngineError> {
        loop {
            if let Some(item) = self.pending.pop_front() {
                return Ok(Some(item));
            }
            if self.done {
                return Ok(None);
            }
            let next = tokio::time::timeout(self.read_timeout, self.events.next()).await;
            match next {
                Err(_) => {
                    return Err(EngineError::Timeout(format!(
                        "the upstream sent nothing for {:?}",
                        self.read_timeout
                    )))
                }
                Ok(Some(Ok(event))) => self.take(&event.data)?,
                Ok(Some(Err(error))) => {
                    return Err(EngineError::UpstreamUnavailable(format!(
                        "the upstream stream broke: {error}"
                    )))
                }
                Ok(None) if self.finish_reason_seen => self.finish(),
                Ok(None) => {
                    // A stream that ends without `[DONE]` or a finish reason was cut off:
                    // completing the task would store truncated text as its answer.
                    return Err(EngineError::UpstreamUnavailable(String::from(
                        "the upstream ended its stream before it finished",
                    )));
                }
            }
        }
    }

    async fn stop(&mut self) {
        // Dropping the stream closes the upstream request; what was already read goes too.
        self.events = Box::pin(futures::stream::empty());
        self.pending.clear();
        self.done = true;
    }
}
