//! The OpenAI-compatible response object and its stream: the second rendering of a task's log.
//!
//! A task's response is OpenAI's `response` object, plus LMSP's own fields (`task_id`,
//! `on_restart`, `seed`, `restarts`, `output_text`). A stream is OpenAI's flat events, each
//! carrying the sequence number of the log event it renders, so resuming after a sequence number
//! gives every later event exactly once. Log events OpenAI has no type for (`response.loading`,
//! `response.cancelling`, `response.resumed`) are left out; a cancel ends the stream with
//! `response.incomplete` carrying the response in status `cancelled`; a failure sends an `error`
//! event before `response.failed`.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{json, Value};
use utoipa::ToSchema;

use lmsp_domain::{
    FunctionTool, ItemId, OutputFormat, Response, Task, TaskError, TaskStatus, ToolChoice,
};

use crate::openapi as schema;
use crate::wire::constant;
use crate::wire::native::TaskErrorObject;
use crate::wire::tools::{self, FunctionCallItem, LogprobObject};

mod stream;
pub use stream::*;

constant!(
    /// `"response"`.
    ResponseTag = "response"
);
constant!(
    /// `"message"`.
    MessageTag = "message"
);
constant!(
    /// `"assistant"`.
    AssistantTag = "assistant"
);
constant!(
    /// `"output_text"`.
    OutputTextTag = "output_text"
);

/// The text part of an output message.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct OutputText {
    // Always `output_text`.
    #[schema(inline)]
    #[serde(rename = "type")]
    pub kind: OutputTextTag,
    /// The text.
    pub text: String,
    /// Always empty.
    pub annotations: Vec<String>,
    /// Always empty (the stream's deltas carry the log probabilities).
    pub logprobs: Vec<LogprobObject>,
}

impl OutputText {
    /// A text part.
    pub fn new(text: impl Into<String>) -> Self {
        Self {
            kind: OutputTextTag::Value,
            text: text.into(),
            annotations: Vec::new(),
            logprobs: Vec::new(),
        }
    }
}

/// An output item: the assistant's message one run of the task produced.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct OutputMessage {
    // Always `message`.
    #[schema(inline)]
    #[serde(rename = "type")]
    pub kind: MessageTag,
    /// Its id (`msg_…`).
    pub id: String,
    // Always `assistant`.
    #[schema(inline)]
    pub role: AssistantTag,
    /// `in_progress`, `completed` or `incomplete`.
    #[schema(schema_with = schema::item_progress)]
    pub status: &'static str,
    /// Its text part (none yet while it is being opened).
    pub content: Vec<OutputText>,
}

impl OutputMessage {
    fn of(item: ItemId, status: &'static str, text: Option<&str>) -> Self {
        Self {
            kind: MessageTag::Value,
            id: item.to_string(),
            role: AssistantTag::Value,
            status,
            content: text.map(OutputText::new).into_iter().collect(),
        }
    }
}

/// An output item: a message or a function call.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(untagged)]
pub enum OutputItem {
    /// The assistant's message.
    Message(OutputMessage),
    /// A call of one of the request's functions.
    FunctionCall(FunctionCallItem),
}

/// `usage.input_tokens_details`.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
pub struct InputTokensDetails {
    /// The input's tokens the run that finished took from the engine's prompt cache or from a
    /// checkpoint instead of evaluating them.
    pub cached_tokens: u64,
    /// Always 0 (OpenAI's SDKs require the field).
    pub cache_write_tokens: u64,
}

/// `usage.output_tokens_details`.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
pub struct OutputTokensDetails {
    /// Always 0.
    pub reasoning_tokens: u64,
}

/// Token counts, in the engine's tokens.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
pub struct UsageObject {
    /// Tokens of the input.
    pub input_tokens: u64,
    /// Tokens generated.
    pub output_tokens: u64,
    /// Both.
    pub total_tokens: u64,
    /// Details of the input's tokens.
    pub input_tokens_details: InputTokensDetails,
    /// Details of the output's tokens.
    pub output_tokens_details: OutputTokensDetails,
}

impl UsageObject {
    fn of(usage: lmsp_domain::Usage) -> Self {
        Self {
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
            total_tokens: usage.total_tokens(),
            input_tokens_details: InputTokensDetails {
                cached_tokens: usage.cached_tokens,
                cache_write_tokens: 0,
            },
            output_tokens_details: OutputTokensDetails {
                reasoning_tokens: 0,
            },
        }
    }
}

/// `text`: the output's format.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TextConfig {
    /// `{"type": "text"}`, `{"type": "json_object"}` or `{"type": "json_schema", "name",
    /// "schema", "strict"}`.
    #[schema(value_type = Object)]
    pub format: Value,
}

/// The output format as the request gave it.
fn format_json(format: &OutputFormat) -> Value {
    match format {
        OutputFormat::Text => json!({"type": "text"}),
        OutputFormat::JsonObject => json!({"type": "json_object"}),
        OutputFormat::JsonSchema {
            name,
            schema,
            strict,
        } => json!({
            "type": "json_schema",
            "name": name,
            "schema": serde_json::from_str::<Value>(schema.as_str()).unwrap_or(Value::Null),
            "strict": strict,
        }),
    }
}

/// A function tool as the request gave it.
fn tool_json(tool: &FunctionTool) -> Value {
    json!({
        "type": "function",
        "name": tool.name,
        "description": tool.description,
        "parameters": tool
            .parameters
            .as_ref()
            .and_then(|p| serde_json::from_str::<Value>(p.as_str()).ok()),
        "strict": tool.strict,
    })
}

/// The tool choice as the request gave it.
fn tool_choice_json(choice: &ToolChoice) -> Value {
    match choice {
        ToolChoice::Auto => json!("auto"),
        ToolChoice::None => json!("none"),
        ToolChoice::Required => json!("required"),
        ToolChoice::Function(name) => json!({"type": "function", "name": name}),
    }
}

/// The output items of a completed response: its message (when it wrote text, or made no call),
/// then its calls.
pub fn output_items(task: &Task, response: &Response) -> Vec<OutputItem> {
    let mut items = Vec::new();
    let message = match response.calls.first() {
        None => Some(last_item(task)),
        Some(first) => first
            .item
            .previous()
            .filter(|_| !response.output_text.is_empty()),
    };
    if let Some(item) = message {
        let mut message = OutputMessage::of(item, "completed", Some(&response.output_text));
        if task.spec.controls.top_logprobs.is_some() {
            for part in &mut message.content {
                part.logprobs = tools::logprobs(&response.logprobs);
            }
        }
        items.push(OutputItem::Message(message));
    }
    items.extend(
        response
            .calls
            .iter()
            .map(|call| OutputItem::FunctionCall(FunctionCallItem::completed(call))),
    );
    items
}

/// A response: OpenAI's `response` object, with LMSP's own fields.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ResponseObject {
    // Always `response`.
    #[schema(inline)]
    pub object: ResponseTag,
    /// Its id (`resp_…`), from the task's creation on.
    #[schema(schema_with = schema::response_id)]
    pub id: String,
    /// `queued`; `in_progress` while the task loads, runs or is being cancelled; then
    /// `completed`, `failed` or `cancelled`.
    #[schema(schema_with = schema::response_status)]
    pub status: &'static str,
    /// The model.
    pub model: String,
    /// When the task was created (Unix seconds).
    pub created_at: i64,
    /// When it completed (Unix seconds), or `null`.
    #[schema(required = true)]
    pub completed_at: Option<i64>,
    /// Whether the request returned at once.
    pub background: bool,
    /// The output budget.
    pub max_output_tokens: u32,
    /// The client's string pairs.
    pub metadata: BTreeMap<String, String>,
    /// The last run's message and function calls, once the task completed; empty before.
    pub output: Vec<OutputItem>,
    /// The output's text (`""` until the task completed).
    pub output_text: String,
    /// Token counts once completed, or `null`.
    #[schema(required = true)]
    pub usage: Option<UsageObject>,
    /// Why the task failed, or `null`.
    #[schema(required = true)]
    pub error: Option<TaskErrorObject>,
    /// Always `null`.
    #[schema(required = true, value_type = Option<String>)]
    pub incomplete_details: Option<()>,
    /// The request's instructions, or `null`.
    #[schema(required = true)]
    pub instructions: Option<String>,
    /// The response this one continues, or `null`.
    #[schema(required = true)]
    pub previous_response_id: Option<String>,
    /// The sampling temperature asked for, or `null`.
    #[schema(required = true)]
    pub temperature: Option<f64>,
    /// Nucleus sampling's mass asked for, or `null`.
    #[schema(required = true)]
    pub top_p: Option<f64>,
    /// The function tools the request gave.
    #[schema(value_type = Vec<Object>)]
    pub tools: Vec<Value>,
    /// `auto`, `none`, `required` or `{"type": "function", "name"}`.
    #[schema(value_type = serde_json::Value)]
    pub tool_choice: Value,
    /// Whether a run may make several calls.
    pub parallel_tool_calls: bool,
    /// The output format.
    pub text: TextConfig,
    /// Always `true`: every task is stored.
    pub store: bool,
    /// The task (`task_…`).
    #[schema(schema_with = schema::task_id)]
    pub task_id: String,
    /// What happens to the task when the service restarts before it finishes.
    #[schema(schema_with = schema::restart_policy)]
    pub on_restart: &'static str,
    /// The sampler's seed (the request's, or the one the service picked).
    pub seed: i64,
    /// How many service restarts moved the task.
    pub restarts: u32,
    /// How urgently it runs: `priority`, `default` or `flex`.
    #[schema(schema_with = schema::service_tier)]
    pub service_tier: &'static str,
}

/// The OpenAI status of a task in `status`.
pub fn response_status(status: TaskStatus) -> &'static str {
    match status {
        TaskStatus::Queued => "queued",
        TaskStatus::Loading | TaskStatus::Running | TaskStatus::Cancelling => "in_progress",
        TaskStatus::Completed => "completed",
        TaskStatus::Failed => "failed",
        TaskStatus::Cancelled => "cancelled",
    }
}

/// The item the completed output of `task` is (its last opened one).
fn last_item(task: &Task) -> ItemId {
    ItemId::of(task.id, task.items.opened.saturating_sub(1))
}

/// The response object of `task` as it is now, with its stored `response` once completed.
pub fn response(task: &Task, stored: Option<&Response>) -> ResponseObject {
    response_in(task, task.status, stored, task.error.as_ref())
}

/// The response object of `task` as it was in `status`.
pub fn response_in(
    task: &Task,
    status: TaskStatus,
    stored: Option<&Response>,
    error: Option<&TaskError>,
) -> ResponseObject {
    let stored = stored.filter(|_| status == TaskStatus::Completed);
    ResponseObject {
        object: ResponseTag::Value,
        id: task.response_id.to_string(),
        status: response_status(status),
        model: task.model.as_str().to_owned(),
        created_at: task.created_at.as_unix_seconds(),
        completed_at: stored.map(|r| r.completed_at.as_unix_seconds()),
        background: task.background,
        max_output_tokens: task.spec.max_output_tokens,
        metadata: task.metadata.clone(),
        output: stored.map(|r| output_items(task, r)).unwrap_or_default(),
        output_text: stored.map(|r| r.output_text.clone()).unwrap_or_default(),
        usage: stored.map(|r| UsageObject::of(r.usage)),
        error: error
            .filter(|_| status == TaskStatus::Failed)
            .map(TaskErrorObject::of),
        incomplete_details: None,
        instructions: task.spec.instructions.clone(),
        previous_response_id: task.spec.previous_response_id.map(|id| id.to_string()),
        temperature: task.spec.temperature.map(|t| t.get()),
        top_p: task.spec.top_p.map(|t| t.get()),
        tools: task.spec.controls.tools.iter().map(tool_json).collect(),
        tool_choice: tool_choice_json(&task.spec.controls.tool_choice),
        parallel_tool_calls: task.spec.controls.parallel_tool_calls,
        text: TextConfig {
            format: format_json(&task.spec.controls.format),
        },
        store: true,
        task_id: task.id.to_string(),
        on_restart: task.on_restart.as_str(),
        seed: crate::wire::shown_seed(task.spec.seed),
        restarts: task.restarts,
        service_tier: task.service_tier.as_str(),
    }
}

/// `DELETE /v1/responses/{id}`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct DeletedResponse {
    /// The response's id.
    #[schema(schema_with = schema::response_id)]
    pub id: String,
    /// Always `response.deleted`.
    #[schema(schema_with = schema::deleted_tag)]
    pub object: &'static str,
    /// Always `true`.
    pub deleted: bool,
}
