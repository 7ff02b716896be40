//! OpenAI's chat completion shapes, for `POST /v1/chat/completions`: a third view of a task
//! (`chat.completion` once it completed; `chat.completion.chunk`s rendered from its log).
//!
//! A chat stream has no way to take text back, so it shows only the deltas of the task's last
//! run: a stream that begins after a run went back to the queue skips the abandoned run's
//! deltas.

use serde::Serialize;
use utoipa::ToSchema;

use lmsp_domain::{CallItem, Event, EventPayload, Response, Task, TaskStatus};

use crate::openapi as schema;
use crate::wire::constant;
use crate::wire::tools::{self, LogprobObject};

constant!(
    /// `"chat.completion"`.
    ChatCompletionTag = "chat.completion"
);
constant!(
    /// `"chat.completion.chunk"`.
    ChunkTag = "chat.completion.chunk"
);

/// The id of a task's chat completion (`chatcmpl-…`).
pub fn completion_id(task: &Task) -> String {
    format!("chatcmpl-{}", task.id.ulid())
}

/// Why the output ended: `tool_calls` when the run made calls, `length` when it used its whole
/// budget (`max_output_tokens`), else `stop` (the model ended it, or a stop string did: an engine
/// ends its generation at the token that completes a stop string, so its usage counts fewer
/// tokens than the budget unless that token was the budget's last).
fn finish_reason(task: &Task, response: &Response) -> &'static str {
    if !response.calls.is_empty() {
        "tool_calls"
    } else if response.usage.output_tokens >= u64::from(task.spec.max_output_tokens) {
        "length"
    } else {
        "stop"
    }
}

/// The assistant's message.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChatMessage {
    /// Always `assistant`.
    #[schema(schema_with = schema::assistant_role)]
    pub role: &'static str,
    /// The output text (`null` when the run made calls and wrote no text).
    #[schema(required = true)]
    pub content: Option<String>,
    /// The calls the run made (absent when none).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ChatToolCall>,
}

/// A call in a chat message (`{"id": "call_…", "type": "function", "function": {"name",
/// "arguments"}}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct ChatToolCall {
    /// The call's id (`call_…`).
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The function and its arguments.
    pub function: ChatFunction,
}

/// The function of a chat tool call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct ChatFunction {
    /// The function called.
    pub name: String,
    /// Its arguments: JSON text.
    pub arguments: String,
}

/// A piece of a streamed call: its place among the message's calls, and on its first chunk its
/// id, type and name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct ChunkToolCall {
    /// The call's place among the message's calls.
    pub index: u32,
    /// The call's id (first chunk only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `function` (first chunk only).
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    /// The name (first chunk only) and a piece of the arguments.
    pub function: ChunkFunction,
}

/// The function part of a streamed call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct ChunkFunction {
    /// The function (first chunk only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// A piece of the arguments.
    pub arguments: String,
}

/// `logprobs` of a choice: the tokens of its content.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ChoiceLogprobs {
    /// One per token of the content.
    pub content: Vec<LogprobObject>,
}

/// The one choice of a completion.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChatChoice {
    /// Always 0.
    pub index: u32,
    /// The message.
    pub message: ChatMessage,
    /// `stop`, `length` or `tool_calls`.
    #[schema(schema_with = schema::finish_reason)]
    pub finish_reason: &'static str,
    /// The content's token log probabilities when `logprobs` asked for them, else `null`.
    #[schema(required = true)]
    pub logprobs: Option<ChoiceLogprobs>,
}

/// Token counts in chat's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
pub struct ChatUsage {
    /// Tokens of the input.
    pub prompt_tokens: u64,
    /// Tokens generated.
    pub completion_tokens: u64,
    /// Both.
    pub total_tokens: u64,
    /// Details of the input's tokens.
    pub prompt_tokens_details: PromptTokensDetails,
}

/// `usage.prompt_tokens_details`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
pub struct PromptTokensDetails {
    /// The input's tokens the run that finished took from the engine's prompt cache or from a
    /// checkpoint instead of evaluating them.
    pub cached_tokens: u64,
}

impl ChatUsage {
    fn of(usage: lmsp_domain::Usage) -> Self {
        Self {
            prompt_tokens: usage.input_tokens,
            completion_tokens: usage.output_tokens,
            total_tokens: usage.total_tokens(),
            prompt_tokens_details: PromptTokensDetails {
                cached_tokens: usage.cached_tokens,
            },
        }
    }
}

/// A chat completion (`chat.completion`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChatCompletion {
    /// Its id (`chatcmpl-…`).
    pub id: String,
    // Always `chat.completion`.
    #[schema(inline)]
    pub object: ChatCompletionTag,
    /// When the task was created (Unix seconds).
    pub created: i64,
    /// The model.
    pub model: String,
    /// The one choice.
    pub choices: Vec<ChatChoice>,
    /// Token counts.
    pub usage: ChatUsage,
    /// How urgently it ran: `priority`, `default` or `flex`.
    #[schema(schema_with = schema::service_tier)]
    pub service_tier: &'static str,
    /// The task (`task_…`).
    #[schema(schema_with = schema::task_id)]
    pub task_id: String,
}

/// The chat completion of a completed task (with its content's log probabilities when the task
/// asked for them).
pub fn completion(task: &Task, response: &Response) -> ChatCompletion {
    let logprobs = task
        .spec
        .controls
        .top_logprobs
        .map(|_| response.logprobs.as_slice());
    ChatCompletion {
        id: completion_id(task),
        object: ChatCompletionTag::Value,
        created: task.created_at.as_unix_seconds(),
        model: task.model.as_str().to_owned(),
        choices: vec![ChatChoice {
            index: 0,
            message: ChatMessage {
                role: "assistant",
                content: (response.calls.is_empty() || !response.output_text.is_empty())
                    .then(|| response.output_text.clone()),
                tool_calls: response.calls.iter().map(chat_tool_call).collect(),
            },
            finish_reason: finish_reason(task, response),
            logprobs: logprobs.map(|tokens| ChoiceLogprobs {
                content: tools::logprobs(tokens),
            }),
        }],
        usage: ChatUsage::of(response.usage),
        service_tier: task.service_tier.as_str(),
        task_id: task.id.to_string(),
    }
}

fn chat_tool_call(call: &CallItem) -> ChatToolCall {
    ChatToolCall {
        id: call.item.call_id(),
        kind: "function",
        function: ChatFunction {
            name: call.name.clone(),
            arguments: call.arguments.clone(),
        },
    }
}

/// Why a streamed choice ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// The engine ended the output.
    Stop,
    /// The output reached `max_completion_tokens`.
    Length,
    /// The run made function calls.
    ToolCalls,
}

impl FinishReason {
    fn of(task: &Task, response: &Response) -> Self {
        match finish_reason(task, response) {
            "length" => Self::Length,
            "tool_calls" => Self::ToolCalls,
            _ => Self::Stop,
        }
    }
}

/// What a chunk adds to the assistant's message: the role (first chunk), a piece of content, or
/// nothing (the chunk that carries the finish reason).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct ChunkDelta {
    /// `assistant`, in the first chunk only.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = schema::assistant_role)]
    pub role: Option<&'static str>,
    /// A piece of the output text (`""` in the first chunk).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub content: Option<String>,
    /// A piece of a call (absent when the chunk carries none).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ChunkToolCall>,
}

/// The one choice of a chunk.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ChunkChoice {
    /// Always 0.
    pub index: u32,
    /// What this chunk adds.
    pub delta: ChunkDelta,
    /// `stop`, `length` or `tool_calls` in the chunk that ends the choice, else `null`.
    #[schema(required = true)]
    pub finish_reason: Option<FinishReason>,
    /// The chunk's tokens' log probabilities when `logprobs` asked for them, else `null`.
    #[schema(required = true)]
    pub logprobs: Option<ChoiceLogprobs>,
}

/// A `chat.completion.chunk`: one `data:` of a chat completion stream.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ChatCompletionChunk {
    /// The completion's id (`chatcmpl-…`), the same in every chunk.
    pub id: String,
    // Always `chat.completion.chunk`.
    #[schema(inline)]
    pub object: ChunkTag,
    /// When the task was created (Unix seconds).
    pub created: i64,
    /// The model.
    pub model: String,
    /// The one choice; empty in the usage chunk.
    pub choices: Vec<ChunkChoice>,
    /// Only in the last chunk before `[DONE]`, with `stream_options.include_usage`: the token
    /// counts (its `choices` is empty).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub usage: Option<ChatUsage>,
    /// How urgently it ran: `priority`, `default` or `flex` (in every chunk, as OpenAI sends it).
    #[schema(schema_with = schema::service_tier)]
    pub service_tier: &'static str,
}

/// The inside of a chat stream's error chunk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct ChatStreamErrorBody {
    /// The task's error code, or `task_cancelled`.
    #[schema(schema_with = schema::error_code)]
    pub code: &'static str,
    /// Human text.
    pub message: String,
    /// Always `null`.
    #[schema(required = true, value_type = Option<String>)]
    pub param: Option<()>,
    /// `server_error` (the task failed) or `invalid_request_error` (it was cancelled).
    #[schema(schema_with = schema::error_type)]
    #[serde(rename = "type")]
    pub kind: &'static str,
}

/// The chunk a chat stream ends with, before `[DONE]`, when its task failed or was cancelled
/// (OpenAI's SDKs raise it as an API error).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct ChatStreamError {
    /// What went wrong.
    pub error: ChatStreamErrorBody,
}

/// One JSON `data:` of a chat completion stream (the stream ends with `data: [DONE]`, which is
/// not JSON).
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[serde(untagged)]
pub enum ChatStreamData {
    /// A `chat.completion.chunk`.
    Chunk(ChatCompletionChunk),
    /// The task failed or was cancelled.
    Error(ChatStreamError),
}

/// What one chunk of a chat stream is.
#[derive(Debug, Clone, PartialEq)]
pub enum Chunk {
    /// A `chat.completion.chunk` (or the error chunk).
    Data(ChatStreamData),
    /// The stream's end: `data: [DONE]`.
    Done,
}

/// Renders a task's log as chat completion chunks.
#[derive(Debug, Clone)]
pub struct ChunkRenderer {
    task: Task,
    include_usage: bool,
    /// Deltas of items before this one belong to runs put back in the queue.
    first_item: u32,
    started: bool,
    /// The calls streamed so far (their place among the message's calls).
    calls: u32,
}

impl ChunkRenderer {
    /// A renderer for `task`'s log as the task is now; with `include_usage`, the last chunk
    /// before `[DONE]` carries the usage.
    pub fn new(task: Task, include_usage: bool) -> Self {
        let items = task.items;
        let first_item = if items.open || task.status == TaskStatus::Completed {
            items.opened.saturating_sub(1)
        } else {
            items.opened
        };
        Self {
            task,
            include_usage,
            first_item,
            started: false,
            calls: 0,
        }
    }

    fn frame(&self, choices: Vec<ChunkChoice>, usage: Option<ChatUsage>) -> Chunk {
        Chunk::Data(ChatStreamData::Chunk(ChatCompletionChunk {
            id: completion_id(&self.task),
            object: ChunkTag::Value,
            created: self.task.created_at.as_unix_seconds(),
            model: self.task.model.as_str().to_owned(),
            choices,
            usage,
            service_tier: self.task.service_tier.as_str(),
        }))
    }

    fn chunk(&self, delta: ChunkDelta, finish_reason: Option<FinishReason>) -> Chunk {
        self.chunk_with(delta, finish_reason, None)
    }

    fn chunk_with(
        &self,
        delta: ChunkDelta,
        finish_reason: Option<FinishReason>,
        logprobs: Option<ChoiceLogprobs>,
    ) -> Chunk {
        self.frame(
            vec![ChunkChoice {
                index: 0,
                delta,
                finish_reason,
                logprobs,
            }],
            None,
        )
    }

    fn call_chunk(&self, call: ChunkToolCall) -> Chunk {
        let delta = ChunkDelta {
            role: None,
            content: None,
            tool_calls: vec![call],
        };
        self.chunk(delta, None)
    }

    /// The first chunk, naming the role, once.
    fn open(&mut self, chunks: &mut Vec<Chunk>) {
        if !self.started {
            self.started = true;
            let delta = ChunkDelta {
                role: Some("assistant"),
                content: Some(String::new()),
                tool_calls: Vec::new(),
            };
            chunks.push(self.chunk(delta, None));
        }
    }

    fn error(code: &'static str, message: String, kind: &'static str) -> Chunk {
        Chunk::Data(ChatStreamData::Error(ChatStreamError {
            error: ChatStreamErrorBody {
                code,
                message,
                param: None,
                kind,
            },
        }))
    }

    /// The chunks of one log event.
    pub fn render(&mut self, event: &Event) -> Vec<Chunk> {
        let mut chunks = Vec::new();
        match &event.payload {
            EventPayload::OutputTextDelta { item, delta }
                if item.output_index() >= self.first_item =>
            {
                self.open(&mut chunks);
                let delta = ChunkDelta {
                    role: None,
                    content: Some(delta.clone()),
                    tool_calls: Vec::new(),
                };
                chunks.push(self.chunk(delta, None));
            }
            EventPayload::OutputTextLogprobs {
                item,
                delta,
                logprobs,
            } if item.output_index() >= self.first_item => {
                self.open(&mut chunks);
                let delta = ChunkDelta {
                    role: None,
                    content: Some(delta.clone()),
                    tool_calls: Vec::new(),
                };
                let logprobs = ChoiceLogprobs {
                    content: tools::logprobs(logprobs),
                };
                chunks.push(self.chunk_with(delta, None, Some(logprobs)));
            }
            EventPayload::FunctionCallAdded { item, name } => {
                self.open(&mut chunks);
                self.calls += 1;
                chunks.push(self.call_chunk(ChunkToolCall {
                    index: self.calls - 1,
                    id: Some(item.call_id()),
                    kind: Some("function"),
                    function: ChunkFunction {
                        name: Some(name.clone()),
                        arguments: String::new(),
                    },
                }));
            }
            EventPayload::FunctionCallArgumentsDelta { delta, .. } => {
                self.open(&mut chunks);
                chunks.push(self.call_chunk(ChunkToolCall {
                    index: self.calls.saturating_sub(1),
                    id: None,
                    kind: None,
                    function: ChunkFunction {
                        name: None,
                        arguments: delta.clone(),
                    },
                }));
            }
            EventPayload::Completed { response } => {
                self.open(&mut chunks);
                let finish = FinishReason::of(&self.task, response);
                let empty = ChunkDelta {
                    role: None,
                    content: None,
                    tool_calls: Vec::new(),
                };
                chunks.push(self.chunk(empty, Some(finish)));
                if self.include_usage {
                    chunks.push(self.frame(Vec::new(), Some(ChatUsage::of(response.usage))));
                }
                chunks.push(Chunk::Done);
            }
            EventPayload::Failed { error } => {
                chunks.push(Self::error(
                    error.code.as_str(),
                    error.message.clone(),
                    "server_error",
                ));
                chunks.push(Chunk::Done);
            }
            EventPayload::Cancelled => {
                chunks.push(Self::error(
                    "task_cancelled",
                    String::from("the task was cancelled"),
                    "invalid_request_error",
                ));
                chunks.push(Chunk::Done);
            }
            _ => {}
        }
        chunks
    }
}
