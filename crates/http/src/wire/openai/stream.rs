//! The stream of the OpenAI rendering: the events of a Responses stream and the renderer that
//! turns a task's log into them, event by event.

use serde::Serialize;
use utoipa::ToSchema;

use lmsp_domain::{
    ClosedItem, Event, EventPayload, ItemId, ItemStatus, Response, Task, TaskError, TaskStatus,
};

use super::{response_in, OutputItem, OutputMessage, OutputText, ResponseObject};
use crate::openapi as schema;
use crate::wire::constant;
use crate::wire::tools::{self, FunctionCallItem, LogprobObject};

/// The type of a stream event that carries the whole response object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
pub enum LifecycleType {
    /// The task was created (the response `queued`).
    #[serde(rename = "response.created")]
    Created,
    /// The task went back to the queue (a restart).
    #[serde(rename = "response.queued")]
    Queued,
    /// The task runs.
    #[serde(rename = "response.in_progress")]
    InProgress,
    /// The task completed: the response with its output and usage.
    #[serde(rename = "response.completed")]
    Completed,
    /// The task failed: the response with its error (after an `error` event).
    #[serde(rename = "response.failed")]
    Failed,
    /// The task was cancelled: the response in status `cancelled`.
    #[serde(rename = "response.incomplete")]
    Incomplete,
}

impl LifecycleType {
    fn name(self) -> &'static str {
        match self {
            Self::Created => "response.created",
            Self::Queued => "response.queued",
            Self::InProgress => "response.in_progress",
            Self::Completed => "response.completed",
            Self::Failed => "response.failed",
            Self::Incomplete => "response.incomplete",
        }
    }
}

/// A stream event that carries the response as it was at that event.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ResponseLifecycleEvent {
    /// Which lifecycle event.
    #[serde(rename = "type")]
    pub kind: LifecycleType,
    /// The log's sequence number it renders.
    pub sequence_number: u64,
    /// The response.
    pub response: ResponseObject,
}

/// The type of an output item event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
pub enum OutputItemType {
    /// A run opened its message (`in_progress`, no content yet).
    #[serde(rename = "response.output_item.added")]
    Added,
    /// A run closed its message (`completed`, or `incomplete` when the run was cut off).
    #[serde(rename = "response.output_item.done")]
    Done,
}

/// `response.output_item.added` / `response.output_item.done`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct OutputItemEvent {
    /// Which item event.
    #[serde(rename = "type")]
    pub kind: OutputItemType,
    /// The log's sequence number it renders.
    pub sequence_number: u64,
    /// The item's place in the output (one per run of the task).
    pub output_index: u32,
    /// The message or function call.
    pub item: OutputItem,
}

/// The type of a content part event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
pub enum ContentPartType {
    /// The message's text part was opened (empty).
    #[serde(rename = "response.content_part.added")]
    Added,
    /// The message's text part was closed, with its whole text.
    #[serde(rename = "response.content_part.done")]
    Done,
}

/// `response.content_part.added` / `response.content_part.done`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ContentPartEvent {
    /// Which part event.
    #[serde(rename = "type")]
    pub kind: ContentPartType,
    /// The log's sequence number it renders.
    pub sequence_number: u64,
    /// The message's id (`msg_…`).
    pub item_id: String,
    /// The message's place in the output.
    pub output_index: u32,
    /// Always 0: a message has one text part.
    pub content_index: u32,
    /// The text part.
    pub part: OutputText,
}

constant!(
    /// `"response.output_text.delta"`.
    TextDeltaTag = "response.output_text.delta"
);
constant!(
    /// `"response.output_text.done"`.
    TextDoneTag = "response.output_text.done"
);
constant!(
    /// `"error"`.
    ErrorTag = "error"
);

/// `response.output_text.delta`: a piece of output text (whole characters).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TextDeltaEvent {
    // Always `response.output_text.delta`.
    #[schema(inline)]
    #[serde(rename = "type")]
    pub kind: TextDeltaTag,
    /// The log's sequence number it renders.
    pub sequence_number: u64,
    /// The message's id (`msg_…`).
    pub item_id: String,
    /// The message's place in the output.
    pub output_index: u32,
    /// Always 0.
    pub content_index: u32,
    /// The text.
    pub delta: String,
    /// The log probabilities of its tokens (empty unless `include` asked for them).
    pub logprobs: Vec<LogprobObject>,
}

/// `response.output_text.done`: the text part's whole text.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TextDoneEvent {
    // Always `response.output_text.done`.
    #[schema(inline)]
    #[serde(rename = "type")]
    pub kind: TextDoneTag,
    /// The log's sequence number it renders.
    pub sequence_number: u64,
    /// The message's id (`msg_…`).
    pub item_id: String,
    /// The message's place in the output.
    pub output_index: u32,
    /// Always 0.
    pub content_index: u32,
    /// The whole text.
    pub text: String,
    /// Always empty (the deltas carry them).
    pub logprobs: Vec<LogprobObject>,
}

constant!(
    /// `"response.function_call_arguments.delta"`.
    ArgumentsDeltaTag = "response.function_call_arguments.delta"
);
constant!(
    /// `"response.function_call_arguments.done"`.
    ArgumentsDoneTag = "response.function_call_arguments.done"
);

/// `response.function_call_arguments.delta`: a piece of a call's arguments.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ArgumentsDeltaEvent {
    // Always `response.function_call_arguments.delta`.
    #[schema(inline)]
    #[serde(rename = "type")]
    pub kind: ArgumentsDeltaTag,
    /// The log's sequence number it renders.
    pub sequence_number: u64,
    /// The call's item (`fc_…`).
    pub item_id: String,
    /// The call's place in the output.
    pub output_index: u32,
    /// The text.
    pub delta: String,
}

/// `response.function_call_arguments.done`: a call's whole arguments.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ArgumentsDoneEvent {
    // Always `response.function_call_arguments.done`.
    #[schema(inline)]
    #[serde(rename = "type")]
    pub kind: ArgumentsDoneTag,
    /// The log's sequence number it renders.
    pub sequence_number: u64,
    /// The call's item (`fc_…`).
    pub item_id: String,
    /// The call's place in the output.
    pub output_index: u32,
    /// The function called.
    pub name: String,
    /// The whole arguments.
    pub arguments: String,
}

/// `error`: the task failed. Sent just before `response.failed`, with the same sequence number
/// (and no SSE `id:`, so a stream resumed after it repeats neither).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ErrorEvent {
    // Always `error`.
    #[schema(inline)]
    #[serde(rename = "type")]
    pub kind: ErrorTag,
    /// The sequence number of the failure it renders.
    pub sequence_number: u64,
    /// The task's error code.
    #[schema(schema_with = schema::task_error_code)]
    pub code: &'static str,
    /// Human text.
    pub message: String,
    /// Always `null`.
    #[schema(required = true, value_type = Option<String>)]
    pub param: Option<()>,
}

/// One `data:` of a Responses stream (`POST /v1/responses` with `stream: true`,
/// `GET /v1/responses/{id}?stream=true`): OpenAI's flat stream events, each carrying `type` and
/// the log's `sequence_number` (also the frame's SSE `id:`).
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(untagged)]
pub enum ResponseStreamEvent {
    /// `response.created`, `.queued`, `.in_progress`, `.completed`, `.failed`, `.incomplete`.
    Lifecycle(Box<ResponseLifecycleEvent>),
    /// `response.output_item.added`, `.done`.
    OutputItem(OutputItemEvent),
    /// `response.content_part.added`, `.done`.
    ContentPart(ContentPartEvent),
    /// `response.output_text.delta`.
    TextDelta(TextDeltaEvent),
    /// `response.output_text.done`.
    TextDone(TextDoneEvent),
    /// `response.function_call_arguments.delta`.
    ArgumentsDelta(ArgumentsDeltaEvent),
    /// `response.function_call_arguments.done`.
    ArgumentsDone(ArgumentsDoneEvent),
    /// `error`.
    Error(ErrorEvent),
}

/// One event of the OpenAI rendering: its type and its JSON (with `type` and `sequence_number`).
#[derive(Debug, Clone)]
pub struct StreamEvent {
    /// The event's type.
    pub kind: &'static str,
    /// The log's sequence number it renders.
    pub sequence_number: u64,
    /// The event, as its `data:` shows it.
    pub data: ResponseStreamEvent,
}

/// Renders a task's log as OpenAI's stream events, event by event. It keeps the task as it was
/// when the stream began, so that each lifecycle event carries the whole response object.
#[derive(Debug, Clone)]
pub struct StreamRenderer {
    task: Task,
}

fn item_json(closed: &ClosedItem) -> OutputItem {
    let status = match closed.status {
        ItemStatus::Completed => "completed",
        ItemStatus::Incomplete => "incomplete",
    };
    OutputItem::Message(OutputMessage::of(closed.item, status, Some(&closed.text)))
}

impl StreamRenderer {
    /// A renderer for `task`'s log.
    pub fn new(task: Task) -> Self {
        Self { task }
    }

    fn lifecycle(
        &self,
        kind: LifecycleType,
        seq: u64,
        status: TaskStatus,
        stored: Option<&Response>,
        error: Option<&TaskError>,
    ) -> StreamEvent {
        StreamEvent {
            kind: kind.name(),
            sequence_number: seq,
            data: ResponseStreamEvent::Lifecycle(Box::new(ResponseLifecycleEvent {
                kind,
                sequence_number: seq,
                response: response_in(&self.task, status, stored, error),
            })),
        }
    }

    /// The OpenAI events of one log event (none for the events OpenAI has no type for).
    pub fn render(&mut self, event: &Event) -> Vec<StreamEvent> {
        // The completed response names the item the task's last run produced.
        self.task.items.follow(&event.payload);
        let seq = event.sequence_number;
        let item_event = |kind: &'static str, data: ResponseStreamEvent| StreamEvent {
            kind,
            sequence_number: seq,
            data,
        };
        let part = |kind: ContentPartType, item: ItemId, part: OutputText| {
            ResponseStreamEvent::ContentPart(ContentPartEvent {
                kind,
                sequence_number: seq,
                item_id: item.to_string(),
                output_index: item.output_index(),
                content_index: 0,
                part,
            })
        };
        let text_delta = |item: ItemId, delta: &str, logprobs: Vec<LogprobObject>| {
            item_event(
                "response.output_text.delta",
                ResponseStreamEvent::TextDelta(TextDeltaEvent {
                    kind: TextDeltaTag::Value,
                    sequence_number: seq,
                    item_id: item.to_string(),
                    output_index: item.output_index(),
                    content_index: 0,
                    delta: delta.to_owned(),
                    logprobs,
                }),
            )
        };
        match &event.payload {
            EventPayload::Created { .. } => {
                vec![self.lifecycle(LifecycleType::Created, seq, TaskStatus::Queued, None, None)]
            }
            EventPayload::Queued { .. } => {
                vec![self.lifecycle(LifecycleType::Queued, seq, TaskStatus::Queued, None, None)]
            }
            EventPayload::InProgress => vec![self.lifecycle(
                LifecycleType::InProgress,
                seq,
                TaskStatus::Running,
                None,
                None,
            )],
            EventPayload::Loading { .. }
            | EventPayload::Cancelling
            | EventPayload::Resumed { .. } => Vec::new(),
            EventPayload::OutputItemAdded { item } => vec![item_event(
                "response.output_item.added",
                ResponseStreamEvent::OutputItem(OutputItemEvent {
                    kind: OutputItemType::Added,
                    sequence_number: seq,
                    output_index: item.output_index(),
                    item: OutputItem::Message(OutputMessage::of(*item, "in_progress", None)),
                }),
            )],
            EventPayload::FunctionCallAdded { item, name } => vec![item_event(
                "response.output_item.added",
                ResponseStreamEvent::OutputItem(OutputItemEvent {
                    kind: OutputItemType::Added,
                    sequence_number: seq,
                    output_index: item.output_index(),
                    item: OutputItem::FunctionCall(FunctionCallItem::of(
                        *item,
                        name,
                        "",
                        "in_progress",
                    )),
                }),
            )],
            EventPayload::FunctionCallArgumentsDelta { item, delta } => vec![item_event(
                "response.function_call_arguments.delta",
                ResponseStreamEvent::ArgumentsDelta(ArgumentsDeltaEvent {
                    kind: ArgumentsDeltaTag::Value,
                    sequence_number: seq,
                    item_id: item.function_call_id(),
                    output_index: item.output_index(),
                    delta: delta.clone(),
                }),
            )],
            EventPayload::FunctionCallArgumentsDone(call) => vec![item_event(
                "response.function_call_arguments.done",
                ResponseStreamEvent::ArgumentsDone(ArgumentsDoneEvent {
                    kind: ArgumentsDoneTag::Value,
                    sequence_number: seq,
                    item_id: call.item.function_call_id(),
                    output_index: call.item.output_index(),
                    name: call.name.clone(),
                    arguments: call.arguments.clone(),
                }),
            )],
            EventPayload::FunctionCallDone(call) => vec![item_event(
                "response.output_item.done",
                ResponseStreamEvent::OutputItem(OutputItemEvent {
                    kind: OutputItemType::Done,
                    sequence_number: seq,
                    output_index: call.item.output_index(),
                    item: OutputItem::FunctionCall(FunctionCallItem::completed(call)),
                }),
            )],
            EventPayload::ContentPartAdded { item } => vec![item_event(
                "response.content_part.added",
                part(ContentPartType::Added, *item, OutputText::new("")),
            )],
            EventPayload::OutputTextDelta { item, delta } => {
                vec![text_delta(*item, delta, Vec::new())]
            }
            EventPayload::OutputTextLogprobs {
                item,
                delta,
                logprobs,
            } => vec![text_delta(*item, delta, tools::logprobs(logprobs))],
            EventPayload::OutputTextDone(closed) => vec![item_event(
                "response.output_text.done",
                ResponseStreamEvent::TextDone(TextDoneEvent {
                    kind: TextDoneTag::Value,
                    sequence_number: seq,
                    item_id: closed.item.to_string(),
                    output_index: closed.item.output_index(),
                    content_index: 0,
                    text: closed.text.clone(),
                    logprobs: Vec::new(),
                }),
            )],
            EventPayload::ContentPartDone(closed) => vec![item_event(
                "response.content_part.done",
                part(
                    ContentPartType::Done,
                    closed.item,
                    OutputText::new(closed.text.clone()),
                ),
            )],
            EventPayload::OutputItemDone(closed) => vec![item_event(
                "response.output_item.done",
                ResponseStreamEvent::OutputItem(OutputItemEvent {
                    kind: OutputItemType::Done,
                    sequence_number: seq,
                    output_index: closed.item.output_index(),
                    item: item_json(closed),
                }),
            )],
            EventPayload::Completed { response } => vec![self.lifecycle(
                LifecycleType::Completed,
                seq,
                TaskStatus::Completed,
                Some(response),
                None,
            )],
            EventPayload::Failed { error } => vec![
                item_event(
                    "error",
                    ResponseStreamEvent::Error(ErrorEvent {
                        kind: ErrorTag::Value,
                        sequence_number: seq,
                        code: error.code.as_str(),
                        message: error.message.clone(),
                        param: None,
                    }),
                ),
                self.lifecycle(
                    LifecycleType::Failed,
                    seq,
                    TaskStatus::Failed,
                    None,
                    Some(error),
                ),
            ],
            EventPayload::Cancelled => vec![self.lifecycle(
                LifecycleType::Incomplete,
                seq,
                TaskStatus::Cancelled,
                None,
                None,
            )],
        }
    }
}
