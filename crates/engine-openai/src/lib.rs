//! An [`Engine`] that sends the work to an OpenAI-compatible server (llama.cpp's server, Ollama,
//! vLLM) with streaming chat completions.
//!
//! The upstream model name is the task's model id. A snapshot needs no engine state: resuming
//! re-sends the prompt with the text produced so far as the start of the assistant's turn, and
//! continues from there (API.md §1).

use std::collections::VecDeque;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use serde_json::{json, Value};

use lmsp_domain::ports::{Engine, EngineError, Generation, GenerationItem, GenerationJob};
use lmsp_domain::{Message, ModelSource, ModelToLoad, Role, Usage};

/// Where the upstream server is.
#[derive(Debug, Clone)]
pub struct OpenAiSettings {
    /// The API base, e.g. `http://127.0.0.1:8080/v1`.
    pub base_url: String,
    /// How long to wait for the upstream to answer at all.
    pub connect_timeout: Duration,
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
        let response = self
            .http
            .get(self.url("models"))
            .send()
            .await
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
        let produced = text_so_far.split_whitespace().count() as u64;
        let remaining = u64::from(job.spec.max_output_tokens)
            .saturating_sub(produced)
            .max(1);
        let model = match &job.model.record.source {
            ModelSource::Upstream { name } => name.clone(),
            ModelSource::File { .. } => job.model.record.id.as_str().to_owned(),
        };
        let body = json!({
            "model": model,
            "messages": messages(&job.spec.conversation(), Some(&text_so_far)),
            "stream": true,
            "max_tokens": remaining,
            "seed": job.spec.seed,
        });
        let response = self
            .http
            .post(self.url("chat/completions"))
            .json(&body)
            .send()
            .await
            .map_err(|e| {
                EngineError::UpstreamUnavailable(format!("the upstream does not answer: {e}"))
            })?;
        if !response.status().is_success() {
            return Err(EngineError::UpstreamUnavailable(format!(
                "the upstream answered {}",
                response.status()
            )));
        }
        let input_tokens = job.spec.prompt_text().split_whitespace().count() as u64;
        Ok(Box::new(UpstreamGeneration {
            body: Box::pin(response.bytes_stream()),
            buffer: Vec::new(),
            pending: VecDeque::new(),
            usage: Usage {
                input_tokens,
                output_tokens: produced,
            },
            done: false,
        }))
    }
}

type ByteStream =
    std::pin::Pin<Box<dyn futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>;

struct UpstreamGeneration {
    body: ByteStream,
    /// Bytes of the stream not yet parsed: whole lines only are decoded, so a character split
    /// between two chunks is never mangled.
    buffer: Vec<u8>,
    pending: VecDeque<GenerationItem>,
    usage: Usage,
    done: bool,
}

impl UpstreamGeneration {
    /// Parses complete `data:` lines from the buffer into items.
    fn drain_lines(&mut self) -> Result<(), EngineError> {
        while let Some(end) = self.buffer.iter().position(|byte| *byte == b'\n') {
            let bytes: Vec<u8> = self.buffer.drain(..=end).collect();
            let line = String::from_utf8_lossy(&bytes);
            let Some(data) = line.trim().strip_prefix("data:") else {
                continue;
            };
            let data = data.trim();
            if data == "[DONE]" {
                self.finish();
                continue;
            }
            let chunk: Value = serde_json::from_str(data).map_err(|e| {
                EngineError::Failed(format!("the upstream sent malformed JSON: {e}"))
            })?;
            if let Some(usage) = chunk
                .get("usage")
                .and_then(|u| u.get("completion_tokens"))
                .and_then(Value::as_u64)
            {
                self.usage.output_tokens = usage;
            }
            let choice = &chunk["choices"][0];
            if let Some(text) = choice["delta"]["content"]
                .as_str()
                .filter(|t| !t.is_empty())
            {
                self.usage.output_tokens += 1;
                self.pending.push_back(GenerationItem::Delta {
                    text: text.to_owned(),
                    state: Vec::new(),
                });
            }
            if choice["finish_reason"].is_string() {
                self.finish();
            }
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
            match self.body.next().await {
                Some(Ok(bytes)) => {
                    self.buffer.extend_from_slice(&bytes);
                    self.drain_lines()?;
                }
                Some(Err(error)) => {
                    return Err(EngineError::UpstreamUnavailable(format!(
                        "the upstream stream broke: {error}"
                    )))
                }
                None => {
                    self.buffer.push(b'\n');
                    self.drain_lines()?;
                    if !self.done {
                        // A stream that ends without `[DONE]` or a finish reason was cut off:
                        // completing the task would store truncated text as its answer.
                        return Err(EngineError::UpstreamUnavailable(String::from(
                            "the upstream ended its stream before it finished",
                        )));
                    }
                }
            }
        }
    }

    async fn stop(&mut self) {
        // Dropping the body closes the upstream request; what was already read is dropped too.
        self.body = Box::pin(futures::stream::empty());
        self.pending.clear();
        self.done = true;
    }
}
