//! OpenAI's chat completion shapes, for `POST /v1/chat/completions`: a third view of a task
//! (`chat.completion` once it completed; `chat.completion.chunk`s rendered from its log).
//!
//! A chat stream has no way to take text back, so it shows only the deltas of the task's last
//! run: a stream that begins after a run went back to the queue skips the abandoned run's
//! deltas.

use serde::Serialize;
use utoipa::ToSchema;

use lmsp_domain::{Event, EventPayload, Response, Task, TaskStatus};

use crate::openapi as schema;
use crate::wire::constant;

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

/// Why the output ended: `length` when it reached the budget, else `stop`.
fn finish_reason(task: &Task, response: &Response) -> &'static str {
    if response.usage.output_tokens >= u64::from(task.spec.max_output_tokens) {
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
    /// The output text.
    pub content: String,
}

/// The one choice of a completion.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChatChoice {
    /// Always 0.
    pub index: u32,
    /// The message.
    pub message: ChatMessage,
    /// `stop` or `length`.
    #[schema(schema_with = schema::finish_reason)]
    pub finish_reason: &'static str,
    /// Always `null`.
    #[schema(required = true, value_type = Option<String>)]
    pub logprobs: Option<()>,
}

/// Token counts in chat's names.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
pub struct ChatUsage {
    /// Tokens of the input.
    pub prompt_tokens: u64,
    /// Tokens generated.
    pub completion_tokens: u64,
    /// Both.
    pub total_tokens: u64,
}

impl ChatUsage {
    fn of(usage: lmsp_domain::Usage) -> Self {
        Self {
            prompt_tokens: usage.input_tokens,
            completion_tokens: usage.output_tokens,
            total_tokens: usage.total_tokens(),
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
    /// The task (`task_…`).
    #[schema(schema_with = schema::task_id)]
    pub task_id: String,
}

/// The chat completion of a completed task.
pub fn completion(task: &Task, response: &Response) -> ChatCompletion {
    ChatCompletion {
        id: completion_id(task),
        object: ChatCompletionTag::Value,
        created: task.created_at.as_unix_seconds(),
        model: task.model.as_str().to_owned(),
        choices: vec![ChatChoice {
            index: 0,
            message: ChatMessage {
                role: "assistant",
                content: response.output_text.clone(),
            },
            finish_reason: finish_reason(task, response),
            logprobs: None,
        }],
        usage: ChatUsage::of(response.usage),
        task_id: task.id.to_string(),
    }
}

/// What one chunk of a chat stream is.
#[derive(Debug, Clone, PartialEq)]
pub enum Chunk {
    /// A `chat.completion.chunk`.
    Data(serde_json::Value),
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
        }
    }

    fn chunk(&self, delta: serde_json::Value, finish: Option<&str>) -> Chunk {
        Chunk::Data(serde_json::json!({
            "id": completion_id(&self.task),
            "object": ChunkTag::Value,
            "created": self.task.created_at.as_unix_seconds(),
            "model": self.task.model.as_str(),
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": null}],
        }))
    }

    /// The first chunk, naming the role, once.
    fn open(&mut self, chunks: &mut Vec<Chunk>) {
        if !self.started {
            self.started = true;
            chunks.push(self.chunk(
                serde_json::json!({"role": "assistant", "content": ""}),
                None,
            ));
        }
    }

    /// The chunks of one log event.
    pub fn render(&mut self, event: &Event) -> Vec<Chunk> {
        let mut chunks = Vec::new();
        match &event.payload {
            EventPayload::OutputTextDelta { item, delta }
                if item.output_index() >= self.first_item =>
            {
                self.open(&mut chunks);
                chunks.push(self.chunk(serde_json::json!({"content": delta}), None));
            }
            EventPayload::Completed { response } => {
                self.open(&mut chunks);
                let finish = finish_reason(&self.task, response);
                chunks.push(self.chunk(serde_json::json!({}), Some(finish)));
                if self.include_usage {
                    chunks.push(Chunk::Data(serde_json::json!({
                        "id": completion_id(&self.task),
                        "object": ChunkTag::Value,
                        "created": self.task.created_at.as_unix_seconds(),
                        "model": self.task.model.as_str(),
                        "choices": [],
                        "usage": ChatUsage::of(response.usage),
                    })));
                }
                chunks.push(Chunk::Done);
            }
            EventPayload::Failed { error } => {
                chunks.push(Chunk::Data(serde_json::json!({
                    "error": {"code": error.code.as_str(), "message": error.message,
                              "param": null, "type": "server_error"}
                })));
                chunks.push(Chunk::Done);
            }
            EventPayload::Cancelled => {
                chunks.push(Chunk::Data(serde_json::json!({
                    "error": {"code": "task_cancelled", "message": "the task was cancelled",
                              "param": null, "type": "invalid_request_error"}
                })));
                chunks.push(Chunk::Done);
            }
            _ => {}
        }
        chunks
    }
}
