//! The request bodies: parsed by serde into these structs (unknown fields refused, wrong JSON
//! types refused, each naming its field), turned into the domain's typed draft, whose values the
//! domain checks. What LMSP cannot do (tools, images, reasoning, structured output) is a 400
//! naming the field, never silently ignored.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;
use utoipa::ToSchema;

use lmsp_domain::auth::{Scope, Scopes};
use lmsp_domain::validation::{DraftControls, DraftInput, DraftMessage, RequestShape, SubmitDraft};
use lmsp_domain::ToolCall;

use crate::error::ApiError;
use crate::openapi as schema;
use crate::wire::{tools_in, Seed};

/// A message's content: a string, or a list of text parts.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// One part of a message's content. Only text parts are taken; the other kinds are refused by
/// name (their own fields are let through so that the refusal names the kind, not a field).
#[derive(Debug, Clone, Deserialize)]
struct ContentPart {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

/// One item of a Responses `input` list: a message (`{"role", "content"}`, optionally with
/// `"type": "message"`, and the `id`/`status` of an earlier output echoed back).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct InputItem {
    #[serde(rename = "type")]
    #[allow(dead_code)]
    kind: Option<String>,
    role: String,
    content: Content,
    #[allow(dead_code)]
    id: Option<String>,
    #[allow(dead_code)]
    status: Option<String>,
}

/// A Responses `function_call` input item (an earlier call echoed back).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct FunctionCallIn {
    #[serde(rename = "type")]
    #[allow(dead_code)]
    kind: String,
    call_id: String,
    name: String,
    arguments: String,
    #[allow(dead_code)]
    id: Option<String>,
    #[allow(dead_code)]
    status: Option<String>,
}

/// A Responses `function_call_output` input item: a tool's answer to a call.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct FunctionCallOutputIn {
    #[serde(rename = "type")]
    #[allow(dead_code)]
    kind: String,
    call_id: String,
    output: Content,
    #[allow(dead_code)]
    id: Option<String>,
    #[allow(dead_code)]
    status: Option<String>,
}

/// A call in a chat `assistant` message.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ChatToolCallIn {
    id: String,
    #[serde(rename = "type")]
    #[allow(dead_code)]
    kind: Option<String>,
    function: ChatFunctionIn,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ChatFunctionIn {
    name: String,
    arguments: String,
}

/// One message of a chat request.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ChatMessageIn {
    role: String,
    content: Option<Content>,
    #[allow(dead_code)]
    name: Option<String>,
    tool_calls: Option<Vec<ChatToolCallIn>>,
    tool_call_id: Option<String>,
    #[allow(dead_code)]
    refusal: Option<Value>,
    #[allow(dead_code)]
    annotations: Option<Value>,
    #[allow(dead_code)]
    audio: Option<Value>,
    #[allow(dead_code)]
    function_call: Option<Value>,
}

/// Parses one element of a list with serde, its errors naming `prefix` and the inner path.
fn parse_at<T: DeserializeOwned>(prefix: &str, value: &Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(|error| {
        let inner = error.path().to_string();
        let message = error.inner().to_string();
        let named = ["unknown field `", "missing field `"]
            .iter()
            .find_map(|p| message.strip_prefix(p))
            .and_then(|rest| rest.split('`').next());
        let mut param = prefix.to_owned();
        if inner != "." && !inner.is_empty() {
            param = format!("{param}.{inner}");
        }
        if let Some(field) = named {
            param = format!("{param}.{field}");
        }
        ApiError::invalid(&param, message)
    })
}

fn unsupported(param: &str, what: &str) -> ApiError {
    ApiError::invalid(param, format!("{what} is not supported by LMSP"))
}

/// The text of a message's content: the string, or its text parts joined.
fn content_text(content: Content, param: &str) -> Result<String, ApiError> {
    match content {
        Content::Text(text) => Ok(text),
        Content::Parts(parts) => {
            let mut text = String::new();
            for (index, part) in parts.into_iter().enumerate() {
                let at = format!("{param}[{index}]");
                match part.kind.as_str() {
                    "input_text" | "output_text" | "text" => match part.text {
                        Some(piece) => text.push_str(&piece),
                        None => {
                            return Err(ApiError::invalid(
                                &format!("{at}.text"),
                                "`text` is required",
                            ))
                        }
                    },
                    "input_image" | "image_url" => {
                        return Err(unsupported(&format!("{at}.type"), "image input"))
                    }
                    "input_file" | "file" => {
                        return Err(unsupported(&format!("{at}.type"), "file input"))
                    }
                    "input_audio" => return Err(unsupported(&format!("{at}.type"), "audio input")),
                    "refusal" => return Err(unsupported(&format!("{at}.type"), "a refusal part")),
                    other => {
                        return Err(ApiError::invalid(
                            &format!("{at}.type"),
                            format!("unknown content part type `{other}`"),
                        ))
                    }
                }
            }
            Ok(text)
        }
    }
}

/// A non-empty prompt, or a non-empty list of messages (schema: [`schema::response_input`]).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum ResponseInput {
    /// A prompt.
    Text(String),
    /// A conversation (each item is parsed on its own, so its errors name their item).
    Items(Vec<Value>),
}

fn input_draft(input: ResponseInput) -> Result<DraftInput, ApiError> {
    let items = match input {
        ResponseInput::Text(text) => return Ok(DraftInput::Text(text)),
        ResponseInput::Items(items) => items,
    };
    let mut messages: Vec<DraftMessage> = Vec::new();
    for (index, value) in items.iter().enumerate() {
        let at = format!("input[{index}]");
        match value.get("type").and_then(Value::as_str) {
            None | Some("message") => {
                let item: InputItem = parse_at(&at, value)?;
                messages.push(DraftMessage::new(
                    item.role,
                    content_text(item.content, &format!("{at}.content"))?,
                ));
            }
            Some("function_call") => {
                let call: FunctionCallIn = parse_at(&at, value)?;
                let call = ToolCall {
                    call_id: call.call_id,
                    name: call.name,
                    arguments: call.arguments,
                };
                // Calls of one turn follow each other: they join the assistant message before.
                match messages.last_mut() {
                    Some(last) if last.role == "assistant" && !last.tool_calls.is_empty() => {
                        last.tool_calls.push(call);
                    }
                    _ => messages.push(DraftMessage {
                        tool_calls: vec![call],
                        ..DraftMessage::new("assistant", "")
                    }),
                }
            }
            Some("function_call_output") => {
                let output: FunctionCallOutputIn = parse_at(&at, value)?;
                messages.push(DraftMessage {
                    tool_call_id: Some(output.call_id),
                    ..DraftMessage::new(
                        "tool",
                        content_text(output.output, &format!("{at}.output"))?,
                    )
                });
            }
            Some(kind) => {
                return Err(unsupported(
                    &format!("{at}.type"),
                    &format!("an input item of type `{kind}`"),
                ))
            }
        }
    }
    Ok(DraftInput::Messages(messages))
}

/// The output format asked for (`text`): only plain text.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TextParam {
    /// `{"type": "text"}`, `{"type": "json_object"}` or `{"type": "json_schema", "name",
    /// "schema", "strict"}`.
    #[schema(value_type = Option<Object>)]
    pub format: Option<Value>,
    /// `low`, `medium` or `high`; accepted, with no effect.
    pub verbosity: Option<String>,
}

/// The body of `POST /v1/responses`. Unknown fields are refused (400).
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(json!({"model": "reference", "input": "Once upon a time", "background": true,
    "stream": false, "on_restart": "resume", "max_output_tokens": 256, "seed": 42,
    "metadata": {"k": "v"}})))]
pub struct CreateResponseRequest {
    /// The model to run (a registered model id).
    #[schema(min_length = 1, max_length = 128)]
    pub model: String,
    /// A non-empty prompt, or a non-empty list of messages (`{"role", "content"}`, content a
    /// string or `input_text` parts; roles `system`, `developer`, `user`, `assistant`).
    #[schema(schema_with = schema::response_input)]
    pub input: ResponseInput,
    /// Instructions that come before the input.
    pub instructions: Option<String>,
    /// `true`: answer 202 with the response at once; `false` (default): wait for it.
    #[schema(default = false)]
    pub background: Option<bool>,
    /// `true`: answer 200 `text/event-stream` of the response's events.
    #[schema(default = false)]
    pub stream: Option<bool>,
    /// What happens to the task when the service restarts before it finishes; defaults to the
    /// service's `--default-on-restart`.
    #[schema(schema_with = schema::nullable_restart_policy)]
    pub on_restart: Option<String>,
    /// The most tokens to generate, 1…100000.
    #[schema(minimum = 1, maximum = 100_000, default = 256)]
    pub max_output_tokens: Option<u64>,
    /// The sampler's seed, an int64 (echoed as sent); without one the service picks one below
    /// 2^53 and stores it with the task.
    #[schema(value_type = Option<i64>)]
    pub seed: Option<Seed>,
    /// The sampling temperature, 0…2 (0 is greedy).
    #[schema(minimum = 0, maximum = 2)]
    pub temperature: Option<f64>,
    /// Nucleus sampling's probability mass, 0…1.
    #[schema(minimum = 0, maximum = 1)]
    pub top_p: Option<f64>,
    /// At most 16 string pairs (keys 1–64 characters, values at most 512).
    #[schema(schema_with = schema::metadata_request)]
    pub metadata: Option<BTreeMap<String, String>>,
    /// An earlier response of this client whose input and output come first.
    #[schema(schema_with = schema::nullable_response_id)]
    pub previous_response_id: Option<String>,
    /// Accepted; every task is stored whatever it says.
    pub store: Option<bool>,
    /// Accepted, with no effect.
    pub user: Option<String>,
    /// How urgently it runs: `priority`, `default` (also `auto`, and when absent) or `flex`.
    pub service_tier: Option<String>,
    /// The output format: `{"format": {"type": "text" | "json_object" | "json_schema", …}}`.
    pub text: Option<TextParam>,
    /// Function tools (`{"type": "function", "name", "description", "parameters",
    /// "strict"}`); any other type is a 400 naming it.
    #[schema(value_type = Option<Vec<Object>>)]
    pub tools: Option<Vec<Value>>,
    /// `auto` (default), `none`, `required` or `{"type": "function", "name"}`.
    #[schema(value_type = Option<Object>)]
    pub tool_choice: Option<Value>,
    /// Whether a run may make several calls (default `true`).
    pub parallel_tool_calls: Option<bool>,
    /// Only `null`: LMSP does no reasoning.
    #[schema(value_type = Option<Object>)]
    pub reasoning: Option<Value>,
    /// Only `message.output_text.logprobs` (the deltas carry their tokens' log probabilities).
    pub include: Option<Vec<String>>,
    /// With `include: ["message.output_text.logprobs"]`: how many alternatives per token, 0…20.
    #[schema(minimum = 0, maximum = 20)]
    pub top_logprobs: Option<u64>,
    /// `disabled` or `auto`; accepted, with no effect.
    pub truncation: Option<String>,
}

impl CreateResponseRequest {
    /// The domain's draft of this request, or the 400 for what LMSP cannot do.
    pub fn into_draft(self) -> Result<SubmitDraft, ApiError> {
        let tools = tools_in::response_tools(self.tools.as_deref().unwrap_or_default())?;
        let tool_choice = tools_in::tool_choice(self.tool_choice.as_ref())?;
        if self.reasoning.as_ref().is_some_and(|r| !r.is_null()) {
            return Err(unsupported("reasoning", "reasoning"));
        }
        let mut logprobs = false;
        for (index, include) in self.include.iter().flatten().enumerate() {
            if include == "message.output_text.logprobs" {
                logprobs = true;
            } else {
                return Err(unsupported(
                    &format!("include[{index}]"),
                    &format!("including `{include}`"),
                ));
            }
        }
        let format =
            tools_in::text_format(self.text.as_ref().and_then(|text| text.format.as_ref()))?;
        if let Some(truncation) = &self.truncation {
            if truncation != "disabled" && truncation != "auto" {
                return Err(ApiError::invalid(
                    "truncation",
                    "`truncation` must be disabled or auto",
                ));
            }
        }
        Ok(SubmitDraft {
            model: self.model,
            input: input_draft(self.input)?,
            instructions: self.instructions,
            background: self.background,
            stream: self.stream,
            on_restart: self.on_restart,
            max_output_tokens: self.max_output_tokens,
            seed: self.seed.map(|seed| seed.0),
            temperature: self.temperature,
            top_p: self.top_p,
            metadata: self.metadata,
            previous_response_id: self.previous_response_id,
            service_tier: self.service_tier,
            controls: DraftControls {
                tools,
                tool_choice,
                parallel_tool_calls: self.parallel_tool_calls,
                format,
                top_logprobs: logprobs.then(|| self.top_logprobs.unwrap_or(0)),
                ..DraftControls::default()
            },
            shape: RequestShape::Responses,
        })
    }
}

/// `stream_options` of a chat request.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    /// Whether the last chunk before `[DONE]` carries the usage.
    pub include_usage: Option<bool>,
}

/// The body of `POST /v1/chat/completions`. Unknown fields are refused (400).
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(json!({"model": "reference", "messages": [{"role": "user", "content": "hi"}],
    "max_completion_tokens": 16, "stream": true, "stream_options": {"include_usage": true}})))]
pub struct ChatCompletionRequest {
    /// The model to run (a registered model id).
    pub model: String,
    /// A non-empty conversation (`{"role", "content"}`; content a string or `text` parts).
    #[schema(value_type = Vec<Object>)]
    pub messages: Vec<Value>,
    /// `true`: answer with `chat.completion.chunk`s as Server-Sent Events, ending `[DONE]`.
    pub stream: Option<bool>,
    /// For a stream: whether to end with a usage chunk.
    pub stream_options: Option<StreamOptions>,
    /// The most tokens to generate (the older name).
    pub max_tokens: Option<u64>,
    /// The most tokens to generate, 1…100000 (default 256).
    pub max_completion_tokens: Option<u64>,
    /// The sampling temperature, 0…2.
    pub temperature: Option<f64>,
    /// Nucleus sampling's mass, 0…1.
    pub top_p: Option<f64>,
    /// The sampler's seed, an int64 (echoed as sent); without one the service picks one below
    /// 2^53.
    #[schema(value_type = Option<i64>)]
    pub seed: Option<Seed>,
    /// Only 1.
    pub n: Option<u64>,
    /// Up to 4 strings: the text ends before the first one generated, which is not returned.
    #[schema(value_type = Option<Vec<String>>)]
    pub stop: Option<Value>,
    /// At most 16 string pairs.
    #[schema(schema_with = schema::metadata_request)]
    pub metadata: Option<BTreeMap<String, String>>,
    /// Accepted; every task is stored.
    pub store: Option<bool>,
    /// Accepted, with no effect.
    pub user: Option<String>,
    /// How urgently it runs: `priority`, `default` (also `auto`, and when absent) or `flex`.
    pub service_tier: Option<String>,
    /// Function tools (`{"type": "function", "function": {"name", "description",
    /// "parameters", "strict"}}`).
    #[schema(value_type = Option<Vec<Object>>)]
    pub tools: Option<Vec<Value>>,
    /// `auto`, `none`, `required` or `{"type": "function", "function": {"name"}}`.
    #[schema(value_type = Option<Object>)]
    pub tool_choice: Option<Value>,
    /// Whether a run may make several calls (default `true`).
    pub parallel_tool_calls: Option<bool>,
    /// `{"type": "text"}`, `{"type": "json_object"}` or `{"type": "json_schema", "json_schema":
    /// {"name", "schema", "strict"}}`.
    #[schema(value_type = Option<Object>)]
    pub response_format: Option<Value>,
    /// Whether to return the content's token log probabilities.
    pub logprobs: Option<bool>,
    /// With `logprobs`: how many alternatives per token, 0…20.
    pub top_logprobs: Option<u64>,
    /// -2…2.
    pub frequency_penalty: Option<f64>,
    /// -2…2.
    pub presence_penalty: Option<f64>,
    /// LMSP: what happens to the task when the service restarts before it finishes.
    #[schema(schema_with = schema::nullable_restart_policy)]
    pub on_restart: Option<String>,
}

/// A chat request as the domain's draft, with whether its stream ends with a usage chunk.
#[derive(Debug, Clone)]
pub struct ChatDraft {
    /// The draft.
    pub draft: SubmitDraft,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
}

impl ChatCompletionRequest {
    /// The domain's draft of this request, or the 400 for what LMSP cannot do.
    pub fn into_draft(self) -> Result<ChatDraft, ApiError> {
        let tools = tools_in::chat_tools(self.tools.as_deref().unwrap_or_default())?;
        let tool_choice = tools_in::tool_choice(self.tool_choice.as_ref())?;
        let stop = tools_in::stop(self.stop.as_ref())?;
        let format = tools_in::response_format(self.response_format.as_ref())?;
        if self.top_logprobs.is_some() && self.logprobs != Some(true) {
            return Err(ApiError::invalid(
                "top_logprobs",
                "`top_logprobs` needs `logprobs: true`",
            ));
        }
        if self.messages.is_empty() {
            return Err(ApiError::invalid(
                "messages",
                "`messages` must not be empty",
            ));
        }
        let messages = self
            .messages
            .iter()
            .enumerate()
            .map(|(index, value)| {
                let at = format!("messages[{index}]");
                let message: ChatMessageIn = parse_at(&at, value)?;
                if message.role == "function" {
                    return Err(unsupported(&format!("{at}.role"), "a `function` message"));
                }
                let content = match message.content {
                    Some(content) => content_text(content, &format!("{at}.content"))?,
                    None => String::new(),
                };
                Ok(DraftMessage {
                    role: message.role,
                    content,
                    tool_calls: message
                        .tool_calls
                        .unwrap_or_default()
                        .into_iter()
                        .map(|call| ToolCall {
                            call_id: call.id,
                            name: call.function.name,
                            arguments: call.function.arguments,
                        })
                        .collect(),
                    tool_call_id: message.tool_call_id,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let include_usage = self
            .stream_options
            .as_ref()
            .and_then(|options| options.include_usage)
            .unwrap_or(false);
        Ok(ChatDraft {
            draft: SubmitDraft {
                model: self.model,
                input: DraftInput::Messages(messages),
                instructions: None,
                background: Some(false),
                stream: self.stream,
                on_restart: self.on_restart,
                max_output_tokens: self.max_completion_tokens.or(self.max_tokens),
                seed: self.seed.map(|seed| seed.0),
                temperature: self.temperature,
                top_p: self.top_p,
                metadata: self.metadata,
                previous_response_id: None,
                service_tier: self.service_tier,
                controls: DraftControls {
                    tools,
                    tool_choice,
                    parallel_tool_calls: self.parallel_tool_calls,
                    format,
                    stop,
                    presence_penalty: self.presence_penalty,
                    frequency_penalty: self.frequency_penalty,
                    top_logprobs: (self.logprobs == Some(true))
                        .then(|| self.top_logprobs.unwrap_or(0)),
                    n: self.n,
                },
                shape: RequestShape::Chat {
                    max_tokens: self.max_completion_tokens.is_none() && self.max_tokens.is_some(),
                },
            },
            include_usage,
        })
    }
}

/// The body of `POST /v1/models`: a file, or an upstream model. Unknown fields are refused.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(json!({"id": "my-model", "path": "my-model.gguf"})))]
pub struct CreateModelRequest {
    /// The new model's id: 1–128 letters, digits, `.`, `_`, `-`, `:`, `/`, not starting with `.`
    /// or `/`.
    #[schema(min_length = 1, max_length = 128)]
    pub id: String,
    /// A model file (`.gguf`, `.txt`): absolute, or relative to `--models-dir`; after following
    /// links it must be a regular file inside `--models-dir`. Either this or `upstream_model`.
    #[schema(min_length = 1)]
    pub path: Option<String>,
    /// The name of a model the upstream server (`--engine openai`) runs. Either this or `path`.
    #[schema(min_length = 1)]
    pub upstream_model: Option<String>,
}

/// The body of `POST /v1/pairings`. Unknown fields are refused (400).
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(json!({"scopes": ["responses:write", "responses:read"]})))]
pub struct CreatePairingRequest {
    /// The scopes a client paired with the code may receive.
    #[schema(schema_with = schema::scopes_request)]
    pub scopes: Vec<String>,
}

/// The body of `POST /v1/pair`. Unknown fields are refused (400).
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(json!({"code": "483-921", "name": "laptop", "scopes": ["responses:read"]})))]
pub struct PairRequest {
    /// The one-time code.
    #[schema(pattern = "^[0-9]{3}-[0-9]{3}$", examples("483-921"))]
    pub code: String,
    /// A human name for the new client, 1–128 characters.
    #[schema(min_length = 1, max_length = 128)]
    pub name: String,
    /// The scopes asked for: a subset of the code's (else 403).
    #[schema(schema_with = schema::scopes_request)]
    pub scopes: Vec<String>,
}

/// Scope names as a non-empty set of scopes.
pub fn parse_scopes(names: &[String]) -> Result<Scopes, ApiError> {
    if names.is_empty() {
        return Err(ApiError::invalid("scopes", "`scopes` must not be empty"));
    }
    let scopes = names
        .iter()
        .enumerate()
        .map(|(index, name)| {
            Scope::parse(name)
                .map_err(|e| ApiError::invalid(&format!("scopes[{index}]"), e.to_string()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Scopes::new(scopes))
}
