//! An [`Engine`] that sends the work to an OpenAI-compatible server (llama.cpp's server, Ollama,
//! vLLM) with streaming chat completions.
//!
//! The upstream model name is the model's `upstream_model`. A snapshot's engine state is the count
//! of upstream tokens produced before it (the snapshot envelope's count, `lmsp-engine-kit`), so a
//! resumed task's `max_output_tokens` budget is counted in the upstream's tokens. Resuming sends
//! the conversation with the text produced so far as the start of the assistant's turn: through
//! the raw completion endpoint where the upstream has one (llama.cpp: its own chat template, from
//! `/apply-template`, followed by the text so far), so the continuation does not depend on whether
//! the upstream continues a trailing assistant message; elsewhere as a trailing assistant message
//! of a chat completion.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use async_trait::async_trait;
use eventsource_stream::{Event as SseEvent, EventStreamError, Eventsource};
use futures::StreamExt;
use lmsp_engine_kit::envelope::Reader;
use lmsp_engine_kit::{EngineTag, ResumeState, StateError};
use serde_json::{json, Value};

use lmsp_domain::ports::{
    Engine, EngineError, EngineHealth, Generation, GenerationItem, GenerationJob,
};
use lmsp_domain::{
    Controls, JsonText, Logprob, Message, ModelSource, ModelToLoad, OutputFormat, Role,
    TokenLogprob, ToolChoice, TopLogprob, Usage,
};

/// Where the upstream server is.
#[derive(Debug, Clone)]
pub struct OpenAiSettings {
    /// The API base, e.g. `http://127.0.0.1:8080/v1`.
    pub base_url: String,
    /// How long to wait for the upstream to accept a connection.
    pub connect_timeout: Duration,
    /// How long the upstream may take from the request to the first token (while it loads the
    /// model, queues the request or evaluates the prompt), and to answer the load check.
    pub first_token_timeout: Duration,
    /// How long the upstream may send nothing between two tokens.
    ///
    /// With the other two, a stopped or hung upstream never keeps a task `loading` or `running`:
    /// the task fails with `timeout`.
    pub token_timeout: Duration,
}

/// The OpenAI-compatible engine.
#[derive(Debug, Clone)]
pub struct OpenAiEngine {
    settings: OpenAiSettings,
    http: reqwest::Client,
    /// Whether the upstream is llama.cpp's server (it answers `/props`), learnt at the first load:
    /// it then reports its token count with every chunk and has a raw completion endpoint and
    /// its chat template for resumes.
    llama_cpp: std::sync::Arc<std::sync::OnceLock<bool>>,
    /// The last health probe's answer and when it was asked (see [`Engine::health`]).
    health: std::sync::Arc<tokio::sync::Mutex<Option<(Instant, EngineHealth)>>>,
}

/// How long a health probe's answer is reused: the service object may be read often, the
/// upstream is asked at most this often.
pub const HEALTH_TTL: Duration = Duration::from_secs(5);

/// How long a health probe waits for the upstream (at most; less when the connect timeout is).
const HEALTH_TIMEOUT: Duration = Duration::from_secs(2);

impl OpenAiEngine {
    /// An engine for the upstream at `settings.base_url`.
    pub fn new(settings: OpenAiSettings) -> Result<Self, EngineError> {
        let http = reqwest::Client::builder()
            .connect_timeout(settings.connect_timeout)
            .build()
            .map_err(|e| EngineError::Failed(format!("cannot build the HTTP client: {e}")))?;
        Ok(Self {
            settings,
            http,
            llama_cpp: std::sync::Arc::default(),
            health: std::sync::Arc::default(),
        })
    }

    fn url(&self, path: &str) -> String {
        format!("{}/{path}", self.settings.base_url.trim_end_matches('/'))
    }

    /// A URL on the upstream's root, beside its `/v1` API (llama.cpp's own endpoints).
    fn root_url(&self, path: &str) -> String {
        let base = self.settings.base_url.trim_end_matches('/');
        let root = base.strip_suffix("/v1").unwrap_or(base);
        format!("{root}/{path}")
    }

    /// Sends a request and waits for its response's headers until `deadline`.
    async fn send(
        &self,
        request: reqwest::RequestBuilder,
        deadline: Instant,
    ) -> Result<reqwest::Response, EngineError> {
        match tokio::time::timeout_at(deadline, request.send()).await {
            Err(_) => Err(EngineError::Timeout(String::from(
                "the upstream did not answer in time",
            ))),
            Ok(Err(error)) => Err(request_failed(&error)),
            Ok(Ok(response)) => Ok(response),
        }
    }

    /// Asks the upstream's `GET /models` (the request a load makes): `Ok` on a success status.
    /// The reason never names the upstream's address (any client may read it).
    async fn probe_health(&self) -> EngineHealth {
        let deadline = Instant::now() + HEALTH_TIMEOUT.min(self.settings.first_token_timeout);
        match self.send(self.http.get(self.url("models")), deadline).await {
            Ok(response) if response.status().is_success() => EngineHealth::Ok,
            Ok(response) => EngineHealth::Unavailable(format!(
                "the upstream answered {} to GET /models",
                response.status()
            )),
            Err(EngineError::Timeout(_)) => {
                EngineHealth::Unavailable(String::from("the upstream did not answer in time"))
            }
            Err(_) => EngineHealth::Unavailable(String::from("the upstream does not answer")),
        }
    }

    /// Whether the upstream is llama.cpp's server: asked until it gives a definite answer (a
    /// server still loading its model may answer 503 at first).
    async fn is_llama_cpp(&self) -> Result<bool, EngineError> {
        if let Some(known) = self.llama_cpp.get() {
            return Ok(*known);
        }
        let deadline = Instant::now() + self.settings.first_token_timeout;
        let response = self
            .send(self.http.get(self.root_url("props")), deadline)
            .await?;
        let status = response.status();
        if status.is_server_error() {
            return Ok(false);
        }
        let known = if status.is_success() {
            let props: Value = tokio::time::timeout_at(deadline, response.json())
                .await
                .map_err(|_| {
                    EngineError::Timeout(String::from("the upstream did not answer in time"))
                })?
                .unwrap_or(Value::Null);
            props.get("default_generation_settings").is_some()
        } else {
            false
        };
        // Another task may have learnt it meanwhile: the answer is the same.
        let _ = self.llama_cpp.set(known);
        Ok(known)
    }

    /// The prompt llama.cpp's chat template makes of a conversation, ending where the
    /// assistant's turn begins.
    async fn templated_prompt(&self, conversation: &[Message]) -> Result<String, EngineError> {
        let deadline = Instant::now() + self.settings.first_token_timeout;
        let request = self
            .http
            .post(self.root_url("apply-template"))
            .json(&json!({ "messages": messages(conversation, None) }));
        let response = self.send(request, deadline).await?;
        let status = response.status();
        let text = tokio::time::timeout_at(deadline, response.text())
            .await
            .map_err(|_| EngineError::Timeout(String::from("the upstream did not answer in time")))?
            .map_err(|e| request_failed(&e))?;
        if !status.is_success() {
            return Err(EngineError::UpstreamUnavailable(format!(
                "the upstream answered {status} to /apply-template: {}",
                upstream_message(&text)
            )));
        }
        serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|doc| doc["prompt"].as_str().map(str::to_owned))
            .ok_or_else(|| {
                EngineError::UpstreamUnavailable(String::from(
                    "the upstream's /apply-template answer has no prompt",
                ))
            })
    }
}

/// An error of a request that got no response: a timeout (connect included) is `Timeout`,
/// anything else (refused, reset, unresolvable) `UpstreamUnavailable`, with the whole chain of
/// causes (reqwest's own message alone says only "error sending request").
fn request_failed(error: &reqwest::Error) -> EngineError {
    let message = with_causes(error);
    if error.is_timeout() {
        EngineError::Timeout(format!("the upstream did not answer in time: {message}"))
    } else {
        EngineError::UpstreamUnavailable(format!("the upstream does not answer: {message}"))
    }
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::System | Role::Developer => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    }
}

/// A message in Chat Completions' shape: an assistant's calls as `tool_calls`, a tool's answer
/// with its `tool_call_id`.
fn message_json(message: &Message) -> Value {
    let mut json = json!({"role": role_name(message.role), "content": message.content});
    if !message.tool_calls.is_empty() {
        json["tool_calls"] = message
            .tool_calls
            .iter()
            .map(|call| {
                json!({
                    "id": call.call_id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                })
            })
            .collect();
    }
    if let Some(id) = &message.tool_call_id {
        json["tool_call_id"] = json!(id);
    }
    json
}

/// The chat messages for a job: its conversation, and when resuming, the text so far as the
/// assistant's.
fn messages(conversation: &[Message], text_so_far: Option<&str>) -> Vec<Value> {
    let mut messages: Vec<Value> = conversation.iter().map(message_json).collect();
    if let Some(text) = text_so_far.filter(|t| !t.is_empty()) {
        messages.push(json!({"role": "assistant", "content": text}));
    }
    messages
}

#[async_trait]
impl Engine for OpenAiEngine {
    /// Whether the upstream answers `GET /models`, asked at most every [`HEALTH_TTL`]
    /// (concurrent callers share one probe).
    async fn health(&self) -> EngineHealth {
        let mut cached = self.health.lock().await;
        if let Some((asked, health)) = cached.as_ref() {
            if asked.elapsed() < HEALTH_TTL {
                return health.clone();
            }
        }
        let health = self.probe_health().await;
        *cached = Some((Instant::now(), health.clone()));
        health
    }

    async fn load(&self, _model: &ModelToLoad) -> Result<(), EngineError> {
        // The upstream loads its models itself; check that it answers.
        let deadline = Instant::now() + self.settings.first_token_timeout;
        let response = self
            .send(self.http.get(self.url("models")), deadline)
            .await?;
        if !response.status().is_success() {
            let status = response.status();
            let text = response.text().await.unwrap_or_default();
            return Err(EngineError::UpstreamUnavailable(format!(
                "the upstream answered {status}: {}",
                upstream_message(&text)
            )));
        }
        self.is_llama_cpp().await.map(drop)
    }

    async fn generate(&self, job: GenerationJob) -> Result<Box<dyn Generation>, EngineError> {
        let text_so_far = job
            .resume
            .as_ref()
            .map(|r| r.text_so_far.clone())
            .unwrap_or_default();
        // The snapshot's state counts the upstream tokens produced before it, so a resumed task's
        // budget is counted in tokens, never in words.
        let resumed = match &job.resume {
            Some(resume) => Some(read_state(&resume.state)?),
            None => None,
        };
        let resumed_in_call = resumed.as_ref().map(in_call).transpose()?.unwrap_or(false);
        let produced = resumed.as_ref().map_or(0, |state| state.produced);
        let remaining = match &resumed {
            Some(state) => state.remaining(job.spec.max_output_tokens)?,
            None => u64::from(job.spec.max_output_tokens),
        };
        if remaining == 0 {
            return Ok(Box::new(UpstreamGeneration::finished(Usage {
                input_tokens: 0,
                output_tokens: produced,
                cached_tokens: 0,
            })));
        }
        let model = match &job.model.record.source {
            ModelSource::Upstream { name } => name.clone(),
            ModelSource::File { .. } => job.model.record.id.as_str().to_owned(),
        };
        let llama_cpp = self.is_llama_cpp().await?;
        let conversation = job.spec.conversation();
        let mut body = json!({
            "model": model,
            "stream": true,
            "stream_options": {"include_usage": true},
            "max_tokens": remaining,
            // The int64 of the seed's 64 bits, as the client sent it: OpenAI's API takes an
            // int64, never a number past 2^63.
            "seed": job.spec.seed.cast_signed(),
        });
        let endpoint = if llama_cpp && !text_so_far.is_empty() {
            // Resume through the raw completion endpoint: the chat template's prompt and the
            // text so far, continued whether or not the server prefills assistant messages.
            let prompt = self.templated_prompt(&conversation).await?;
            body["prompt"] = json!(prompt + &text_so_far);
            "completions"
        } else {
            body["messages"] = json!(messages(&conversation, Some(&text_so_far)));
            "chat/completions"
        };
        if llama_cpp {
            // llama.cpp then reports the tokens predicted so far with every chunk.
            body["timings_per_token"] = json!(true);
        }
        if resumed_in_call {
            return Err(EngineError::Failed(String::from(
                "the upstream engine cannot continue a function call's arguments after a restart",
            )));
        }
        add_controls(
            &mut body,
            &job.spec.controls,
            endpoint == "chat/completions",
        );
        if let Some(temperature) = job.spec.temperature {
            body["temperature"] = json!(temperature.get());
        }
        if let Some(top_p) = job.spec.top_p {
            body["top_p"] = json!(top_p.get());
        }
        let first_token_deadline = Instant::now() + self.settings.first_token_timeout;
        let request = self.http.post(self.url(endpoint)).json(&body);
        let response = self.send(request, first_token_deadline).await?;
        if !response.status().is_success() {
            let status = response.status();
            let text = tokio::time::timeout_at(first_token_deadline, response.text())
                .await
                .ok()
                .and_then(Result::ok)
                .unwrap_or_default();
            return Err(EngineError::UpstreamUnavailable(format!(
                "the upstream answered {status}: {}",
                upstream_message(&text)
            )));
        }
        Ok(Box::new(UpstreamGeneration {
            events: Box::pin(response.bytes_stream().eventsource()),
            first_token_deadline: Some(first_token_deadline),
            token_timeout: self.settings.token_timeout,
            pending: VecDeque::new(),
            usage: Usage {
                input_tokens: 0,
                output_tokens: produced,
                cached_tokens: 0,
            },
            before: produced,
            finish_reason_seen: false,
            done: false,
            in_call: false,
            logprobs: job.spec.controls.top_logprobs.is_some(),
        }))
    }
}

/// Adds the task's tools, format, stop strings, penalties and log probabilities to an upstream
/// request (tools and the format only to Chat Completions: the raw completion a resume uses
/// takes text only).
fn add_controls(body: &mut Value, controls: &Controls, chat: bool) {
    let parsed =
        |text: &JsonText| serde_json::from_str::<Value>(text.as_str()).unwrap_or(json!({}));
    if chat && !controls.tools.is_empty() {
        body["tools"] = controls
            .tools
            .iter()
            .map(|tool| {
                let mut function = json!({"name": tool.name, "strict": tool.strict});
                if let Some(description) = &tool.description {
                    function["description"] = json!(description);
                }
                if let Some(parameters) = &tool.parameters {
                    function["parameters"] = parsed(parameters);
                }
                json!({"type": "function", "function": function})
            })
            .collect();
        body["tool_choice"] = match &controls.tool_choice {
            ToolChoice::Auto => json!("auto"),
            ToolChoice::None => json!("none"),
            ToolChoice::Required => json!("required"),
            ToolChoice::Function(name) => json!({"type": "function", "function": {"name": name}}),
        };
        if !controls.parallel_tool_calls {
            body["parallel_tool_calls"] = json!(false);
        }
    }
    if chat {
        match &controls.format {
            OutputFormat::Text => {}
            OutputFormat::JsonObject => body["response_format"] = json!({"type": "json_object"}),
            OutputFormat::JsonSchema {
                name,
                schema,
                strict,
            } => {
                body["response_format"] = json!({"type": "json_schema", "json_schema": {
                    "name": name, "schema": parsed(schema), "strict": strict}});
            }
        }
    }
    if !controls.stop.is_empty() {
        body["stop"] = json!(controls.stop);
    }
    if let Some(penalty) = controls.presence_penalty {
        body["presence_penalty"] = json!(penalty.get());
    }
    if let Some(penalty) = controls.frequency_penalty {
        body["frequency_penalty"] = json!(penalty.get());
    }
    if let Some(top) = controls.top_logprobs {
        if chat {
            body["logprobs"] = json!(true);
            body["top_logprobs"] = json!(top);
        } else {
            body["n_probs"] = json!(top);
        }
    }
}

/// The tag of this engine's states in the snapshot envelope.
const STATE_TAG: EngineTag = EngineTag::new("openai");

/// The state after `tokens` upstream tokens: the engine's own byte is 1 when it is inside a
/// call's arguments (which a resume cannot continue), else 0.
fn state_of(tokens: u64, in_call: bool) -> Vec<u8> {
    ResumeState::new(tokens, vec![u8::from(in_call)]).encode(STATE_TAG)
}

/// A snapshot's state: the envelope, or a state of the formats the first releases wrote.
fn read_state(bytes: &[u8]) -> Result<ResumeState, StateError> {
    ResumeState::decode_or_legacy(bytes, STATE_TAG, read_legacy_state)
}

/// The states written before the envelope, as the envelope's: the token count (u64 LE), then a
/// byte 1 when inside a call's arguments. An empty state counts nothing (as the first releases
/// read it). The format has no mark of its own: what tells other bytes apart is only the length
/// and a count that fits the task's budget (a `u32`).
fn read_legacy_state(bytes: &[u8]) -> Result<ResumeState, StateError> {
    if bytes.is_empty() {
        return Ok(ResumeState::new(0, vec![0]));
    }
    let unrecognized = StateError::Unrecognized { engine: STATE_TAG };
    let mut reader = Reader::new(bytes);
    let produced = reader
        .array::<8>()
        .map(u64::from_le_bytes)
        .map_err(|_| unrecognized.clone())?;
    let flag = match reader.rest() {
        [] => 0,
        [flag @ (0 | 1)] => *flag,
        _ => return Err(unrecognized),
    };
    if u32::try_from(produced).is_err() {
        return Err(unrecognized);
    }
    Ok(ResumeState::new(produced, vec![flag]))
}

/// Whether a state is inside a call's arguments.
fn in_call(state: &ResumeState) -> Result<bool, StateError> {
    match state.engine.as_slice() {
        [0] => Ok(false),
        [1] => Ok(true),
        _ => Err(StateError::Malformed(
            "its call flag is not one byte 0 or 1",
        )),
    }
}

/// The log probabilities of a chunk's tokens (`logprobs.content`).
fn token_logprobs(content: &[Value]) -> Vec<TokenLogprob> {
    let bytes_of = |entry: &Value, token: &str| -> Vec<u8> {
        entry["bytes"]
            .as_array()
            .map(|bytes| {
                bytes
                    .iter()
                    .filter_map(|b| b.as_u64().and_then(|b| u8::try_from(b).ok()))
                    .collect()
            })
            .unwrap_or_else(|| token.as_bytes().to_vec())
    };
    content
        .iter()
        .map(|entry| {
            let token = entry["token"].as_str().unwrap_or_default().to_owned();
            TokenLogprob {
                bytes: bytes_of(entry, &token),
                logprob: Logprob::clamped(entry["logprob"].as_f64().unwrap_or(f64::NAN)),
                top: entry["top_logprobs"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|top| {
                        let text = top["token"].as_str().unwrap_or_default().to_owned();
                        TopLogprob {
                            bytes: bytes_of(top, &text),
                            logprob: Logprob::clamped(top["logprob"].as_f64().unwrap_or(f64::NAN)),
                            token: text,
                        }
                    })
                    .collect(),
                token,
            }
        })
        .collect()
}

/// An error's message followed by its causes'.
fn with_causes(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
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
    /// Until the first token: when the upstream must have sent it (`None` once it came).
    first_token_deadline: Option<Instant>,
    /// After the first token: how long the upstream may send nothing.
    token_timeout: Duration,
    pending: VecDeque<GenerationItem>,
    usage: Usage,
    /// Tokens produced before a resume (this run's usage counts only its own).
    before: u64,
    /// Whether the upstream gave a finish reason: a stream that ends without one (or `[DONE]`)
    /// was cut off.
    finish_reason_seen: bool,
    done: bool,
    /// Whether the upstream is writing a call's arguments.
    in_call: bool,
    /// Whether the task asked for log probabilities.
    logprobs: bool,
}

impl UpstreamGeneration {
    /// A generation with nothing left to produce (a resumed task whose budget is spent).
    fn finished(usage: Usage) -> Self {
        let mut generation = Self {
            events: Box::pin(futures::stream::empty()),
            first_token_deadline: None,
            token_timeout: Duration::ZERO,
            pending: VecDeque::new(),
            usage,
            before: usage.output_tokens,
            finish_reason_seen: true,
            done: false,
            in_call: false,
            logprobs: false,
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
                // A resumed run's prompt holds the text so far: that is output, counted once.
                self.usage.input_tokens = prompt.saturating_sub(self.before);
            }
            if let Some(completion) = usage["completion_tokens"].as_u64() {
                self.usage.output_tokens = self.before + completion;
            }
        }
        let choice = &chunk["choices"][0];
        // A chat completion's chunk has `delta.content`, a raw completion's `text`.
        let text = choice["delta"]["content"]
            .as_str()
            .or_else(|| choice["text"].as_str())
            .filter(|t| !t.is_empty());
        if let Some(text) = text {
            // llama.cpp counts the tokens predicted so far (`timings_per_token`): a character of
            // several tokens arrives as one chunk. Elsewhere one chunk is counted as one token
            // until the usage chunk says otherwise.
            self.usage.output_tokens = match chunk["timings"]["predicted_n"].as_u64() {
                Some(predicted) => (self.before + predicted).max(self.usage.output_tokens),
                None => self.usage.output_tokens + 1,
            };
            self.first_token_deadline = None;
            if self.logprobs {
                if let Some(content) = choice["logprobs"]["content"].as_array() {
                    self.pending.push_back(GenerationItem::Logprobs {
                        tokens: token_logprobs(content),
                    });
                }
            }
            self.in_call = false;
            self.pending.push_back(GenerationItem::Delta {
                text: text.to_owned(),
                state: state_of(self.usage.output_tokens, false),
            });
        }
        for call in choice["delta"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            self.first_token_deadline = None;
            self.usage.output_tokens = match chunk["timings"]["predicted_n"].as_u64() {
                Some(predicted) => (self.before + predicted).max(self.usage.output_tokens),
                None => self.usage.output_tokens + 1,
            };
            let function = &call["function"];
            if let Some(name) = function["name"].as_str().filter(|n| !n.is_empty()) {
                self.in_call = true;
                self.pending.push_back(GenerationItem::CallStarted {
                    name: name.to_owned(),
                    state: state_of(self.usage.output_tokens, true),
                });
            }
            if let Some(arguments) = function["arguments"].as_str().filter(|a| !a.is_empty()) {
                self.pending.push_back(GenerationItem::ArgumentsDelta {
                    text: arguments.to_owned(),
                    state: state_of(self.usage.output_tokens, true),
                });
            }
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

    /// When the next chunk must have arrived, and what a timeout then means.
    fn deadline(&self) -> (Instant, &'static str) {
        match self.first_token_deadline {
            Some(deadline) => (
                deadline,
                "the upstream sent no token within the first-token timeout",
            ),
            None => (
                Instant::now() + self.token_timeout,
                "the upstream sent nothing within the between-token timeout",
            ),
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
            let (deadline, silence) = self.deadline();
            match tokio::time::timeout_at(deadline, self.events.next()).await {
                Err(_) => return Err(EngineError::Timeout(String::from(silence))),
                Ok(Some(Ok(event))) => self.take(&event.data)?,
                Ok(Some(Err(error))) => {
                    let message = match &error {
                        EventStreamError::Transport(error) => with_causes(error),
                        other => other.to_string(),
                    };
                    return Err(EngineError::UpstreamUnavailable(format!(
                        "the upstream stream broke: {message}"
                    )));
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn states_of_the_first_releases_still_resume() {
        // A token count (u64 LE), and a byte 1 inside a call's arguments.
        let plain = read_state(&[7, 0, 0, 0, 0, 0, 0, 0]).unwrap();
        assert_eq!((plain.produced, in_call(&plain).unwrap()), (7, false));
        let calling = read_state(&[0, 1, 0, 0, 0, 0, 0, 0, 1]).unwrap();
        assert_eq!((calling.produced, in_call(&calling).unwrap()), (256, true));
        let empty = read_state(&[]).unwrap();
        assert_eq!((empty.produced, in_call(&empty).unwrap()), (0, false));
        // Read as the envelope this release writes for the same point.
        assert_eq!(read_state(&state_of(7, false)).unwrap(), plain);
        assert_eq!(read_state(&state_of(256, true)).unwrap(), calling);
    }

    #[test]
    fn other_engines_states_are_refused() {
        let foreign = ResumeState::new(7, vec![0]).encode(EngineTag::new("reference"));
        assert!(matches!(
            read_state(&foreign),
            Err(StateError::Foreign { found, .. }) if found == "reference"
        ));
        // The reference engine's text state of the first releases, the llama engine's (one
        // token), and 9 bytes whose count is past any budget.
        for bytes in [
            &[1, 3, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, b'a'][..],
            b"LLS1\x01\0\0\0\x05\0\0\0\0",
            &[2, 0, 0, 0, 0, 0, 0, 1, 0],
        ] {
            assert_eq!(
                read_state(bytes),
                Err(StateError::Unrecognized { engine: STATE_TAG })
            );
        }
    }
}
