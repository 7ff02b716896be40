//! LMSP's own task objects and event log rendering (`/v1/tasks…`): every stored event as it is,
//! with its type and data.

use std::collections::BTreeMap;

use serde::Serialize;
use utoipa::ToSchema;

use lmsp_domain::{ClosedItem, Event, EventPayload, ItemId, Task, TaskError, TaskStatus};

use crate::openapi as schema;
use crate::wire::openai::{self, ResponseObject};
use crate::wire::tools::{self, CallDoneData, CallEventData, LogprobObject};
use crate::wire::{constant, list_of, time};

constant!(
    /// `"task"`.
    TaskTag = "task"
);
constant!(
    /// `"event"`.
    EventTag = "event"
);

/// Why a task failed (`task.error`, `response.failed`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TaskErrorObject {
    /// The task error code.
    #[schema(schema_with = schema::task_error_code)]
    pub code: &'static str,
    /// Human text.
    pub message: String,
}

impl TaskErrorObject {
    /// The wire form of a task error.
    pub fn of(error: &TaskError) -> Self {
        Self {
            code: error.code.as_str(),
            message: error.message.clone(),
        }
    }
}

/// A task: one unit of inference work.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TaskObject {
    // Always `task`.
    #[schema(inline)]
    pub object: TaskTag,
    /// Its id.
    #[schema(schema_with = schema::task_id)]
    pub id: String,
    /// Where it is; `completed`, `failed` and `cancelled` are finished and never left.
    #[schema(schema_with = schema::task_status)]
    pub status: &'static str,
    /// The model it runs on.
    pub model: String,
    /// The client that submitted it.
    #[schema(schema_with = schema::client_id)]
    pub client_id: String,
    /// The sampler's seed: the request's, or the one the service drew when it named none (a
    /// retried or resumed run uses the same).
    pub seed: i64,
    /// What happens to it when the service restarts before it finishes.
    #[schema(schema_with = schema::restart_policy)]
    pub on_restart: &'static str,
    /// When it was accepted.
    #[schema(schema_with = schema::timestamp)]
    pub created_at: String,
    /// When a worker first claimed it, or `null`.
    #[schema(schema_with = schema::nullable_timestamp, required = true)]
    pub started_at: Option<String>,
    /// When it finished, or `null`.
    #[schema(schema_with = schema::nullable_timestamp, required = true)]
    pub finished_at: Option<String>,
    /// The highest sequence number of its event log.
    pub last_sequence_number: u64,
    /// How many service restarts moved it.
    pub restarts: u32,
    /// How urgently it runs: `priority`, `default` or `flex`.
    #[schema(schema_with = schema::service_tier)]
    pub service_tier: &'static str,
    /// Why it failed, or `null`.
    #[schema(required = true)]
    pub error: Option<TaskErrorObject>,
    /// Its response's id (assigned at creation; the response is stored when the task completes).
    #[schema(schema_with = schema::response_id)]
    pub response_id: String,
    /// The client's string pairs.
    pub metadata: BTreeMap<String, String>,
    /// The batch whose line it answers (`batch_…`); absent for a request's task.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch_id: Option<String>,
    /// Its batch line's `custom_id`; absent for a request's task.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub custom_id: Option<String>,
}

/// A task object.
pub fn task(task: &Task) -> TaskObject {
    TaskObject {
        object: TaskTag::Value,
        id: task.id.to_string(),
        status: task.status.as_str(),
        model: task.model.as_str().to_owned(),
        client_id: task.client_id.to_string(),
        seed: crate::wire::shown_seed(task.spec.seed),
        on_restart: task.on_restart.as_str(),
        created_at: time(task.created_at),
        started_at: task.started_at.map(time),
        finished_at: task.finished_at.map(time),
        last_sequence_number: task.last_sequence_number,
        restarts: task.restarts,
        service_tier: task.service_tier.as_str(),
        error: task.error.as_ref().map(TaskErrorObject::of),
        response_id: task.response_id.to_string(),
        metadata: task.metadata.clone(),
        batch_id: task.batch.as_ref().map(|line| line.batch_id.to_string()),
        custom_id: task.batch.as_ref().map(|line| line.custom_id.clone()),
    }
}

/// `data` of `response.created`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CreatedData {
    /// The task as it was created.
    pub task: TaskObject,
}

/// `data` of `response.loading`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct LoadingData {
    /// The model being loaded.
    pub model: String,
}

/// `data` of `response.output_text.delta`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct DeltaData {
    /// A piece of output; the deltas after the last `response.queued` joined are `output_text`.
    pub delta: String,
    /// The log probabilities of its tokens, when the task asked for them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Vec<LogprobObject>>,
}

/// `data` of `response.output_item.added` and `response.content_part.added`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ItemData {
    /// The output item (`msg_…`).
    pub item_id: String,
    /// Its index in the response's `output`.
    pub output_index: u32,
    /// The index of its text part (always 0).
    pub content_index: u32,
}

impl ItemData {
    fn of(item: ItemId) -> Self {
        Self {
            item_id: item.to_string(),
            output_index: item.output_index(),
            content_index: 0,
        }
    }
}

/// `data` of `response.output_text.done`, `response.content_part.done` and
/// `response.output_item.done`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ItemDoneData {
    /// The output item (`msg_…`).
    pub item_id: String,
    /// Its index in the response's `output`.
    pub output_index: u32,
    /// The index of its text part (always 0).
    pub content_index: u32,
    /// The item's whole text.
    pub text: String,
    /// `completed`, or `incomplete` when its run was put back in the queue.
    #[schema(schema_with = schema::item_status)]
    pub status: &'static str,
}

impl ItemDoneData {
    fn of(closed: &ClosedItem) -> Self {
        Self {
            item_id: closed.item.to_string(),
            output_index: closed.item.output_index(),
            content_index: 0,
            text: closed.text.clone(),
            status: closed.status.as_str(),
        }
    }
}

/// `data` of `response.queued`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct QueuedData {
    /// Why the task went back to the queue.
    #[schema(schema_with = schema::queue_reason)]
    pub reason: &'static str,
}

/// `data` of `response.resumed`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ResumedData {
    /// The sequence number of the last event the snapshot covers.
    pub from_sequence_number: u64,
}

/// `data` of `response.completed`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CompletedData {
    /// The response.
    pub response: ResponseObject,
}

/// `data` of `response.failed`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct FailedData {
    /// Why the task failed.
    pub error: TaskErrorObject,
}

/// `data` of `response.in_progress`, `response.cancelling` and `response.cancelled`: `{}`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct EmptyData {}

/// An event's `type` with its `data`.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(tag = "type", content = "data")]
pub enum EventBody {
    /// Always sequence 1, with the task's insert.
    #[serde(rename = "response.created")]
    Created(CreatedData),
    /// The model is being loaded.
    #[serde(rename = "response.loading")]
    Loading(LoadingData),
    /// Generation starts.
    #[serde(rename = "response.in_progress")]
    InProgress(EmptyData),
    /// A run opens its output item (with its first delta).
    #[serde(rename = "response.output_item.added")]
    OutputItemAdded(ItemData),
    /// A run opens its item's text part (with its first delta).
    #[serde(rename = "response.content_part.added")]
    ContentPartAdded(ItemData),
    /// Output.
    #[serde(rename = "response.output_text.delta")]
    OutputTextDelta(DeltaData),
    /// The item's text is complete (with the completion).
    #[serde(rename = "response.output_text.done")]
    OutputTextDone(ItemDoneData),
    /// The item's part is complete (with the completion).
    #[serde(rename = "response.content_part.done")]
    ContentPartDone(ItemDoneData),
    /// The item is closed: completed, or incomplete when its run went back to the queue.
    #[serde(rename = "response.output_item.done")]
    OutputItemDone(ItemDoneData),
    /// A cancel was accepted while work was under way.
    #[serde(rename = "response.cancelling")]
    Cancelling(EmptyData),
    /// Put back in the queue at startup.
    #[serde(rename = "response.queued")]
    Queued(QueuedData),
    /// Continued from its snapshot at startup.
    #[serde(rename = "response.resumed")]
    Resumed(ResumedData),
    /// Terminal: completed.
    #[serde(rename = "response.completed")]
    Completed(CompletedData),
    /// Terminal: failed.
    #[serde(rename = "response.failed")]
    Failed(FailedData),
    /// Terminal: cancelled.
    #[serde(rename = "response.cancelled")]
    Cancelled(EmptyData),
    /// A run opens a function call item.
    #[serde(rename = "response.function_call.added")]
    FunctionCallAdded(CallEventData),
    /// A piece of the open call's arguments.
    #[serde(rename = "response.function_call_arguments.delta")]
    FunctionCallArgumentsDelta(CallEventData),
    /// The call's arguments are complete.
    #[serde(rename = "response.function_call_arguments.done")]
    FunctionCallArgumentsDone(CallDoneData),
    /// The call item is closed.
    #[serde(rename = "response.function_call.done")]
    FunctionCallDone(CallDoneData),
}

/// An event's `type` and `data`; `task` is the event's task (for the response of
/// `response.completed`, whose status, output and usage come from the event itself).
pub fn event_body(payload: &EventPayload, task: &Task) -> EventBody {
    match payload {
        EventPayload::Created { task: created } => EventBody::Created(CreatedData {
            task: self::task(created),
        }),
        EventPayload::Loading { model } => EventBody::Loading(LoadingData {
            model: model.as_str().to_owned(),
        }),
        EventPayload::InProgress => EventBody::InProgress(EmptyData {}),
        EventPayload::OutputItemAdded { item } => EventBody::OutputItemAdded(ItemData::of(*item)),
        EventPayload::ContentPartAdded { item } => EventBody::ContentPartAdded(ItemData::of(*item)),
        EventPayload::OutputTextDelta { delta, .. } => EventBody::OutputTextDelta(DeltaData {
            delta: delta.clone(),
            logprobs: None,
        }),
        EventPayload::OutputTextLogprobs {
            delta, logprobs, ..
        } => EventBody::OutputTextDelta(DeltaData {
            delta: delta.clone(),
            logprobs: Some(tools::logprobs(logprobs)),
        }),
        EventPayload::FunctionCallAdded { item, name } => {
            EventBody::FunctionCallAdded(CallEventData::added(*item, name))
        }
        EventPayload::FunctionCallArgumentsDelta { item, delta } => {
            EventBody::FunctionCallArgumentsDelta(CallEventData::delta(*item, delta))
        }
        EventPayload::FunctionCallArgumentsDone(call) => {
            EventBody::FunctionCallArgumentsDone(CallDoneData::of(call))
        }
        EventPayload::FunctionCallDone(call) => EventBody::FunctionCallDone(CallDoneData::of(call)),
        EventPayload::OutputTextDone(closed) => EventBody::OutputTextDone(ItemDoneData::of(closed)),
        EventPayload::ContentPartDone(closed) => {
            EventBody::ContentPartDone(ItemDoneData::of(closed))
        }
        EventPayload::OutputItemDone(closed) => EventBody::OutputItemDone(ItemDoneData::of(closed)),
        EventPayload::Cancelling => EventBody::Cancelling(EmptyData {}),
        EventPayload::Queued { reason } => EventBody::Queued(QueuedData {
            reason: reason.as_str(),
        }),
        EventPayload::Resumed {
            from_sequence_number,
        } => EventBody::Resumed(ResumedData {
            from_sequence_number: *from_sequence_number,
        }),
        // The response as the event completed it, whatever the status of `task` (a live stream
        // holds the task as it was when the stream opened).
        EventPayload::Completed { response } => EventBody::Completed(CompletedData {
            response: openai::response_in(task, TaskStatus::Completed, Some(response), None),
        }),
        EventPayload::Failed { error } => EventBody::Failed(FailedData {
            error: TaskErrorObject::of(error),
        }),
        EventPayload::Cancelled => EventBody::Cancelled(EmptyData {}),
    }
}

/// One event of a task's log; `type` decides the shape of `data`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct EventObject {
    // Always `event`.
    #[schema(inline)]
    pub object: EventTag,
    /// The task whose log holds it.
    #[schema(schema_with = schema::task_id)]
    pub task_id: String,
    /// 1, 2, 3, … without gap or repeat within the task.
    pub sequence_number: u64,
    /// When it was written.
    #[schema(schema_with = schema::timestamp)]
    pub created_at: String,
    /// `type` and `data`.
    #[serde(flatten)]
    pub body: EventBody,
}

/// An event object; `task` is the event's task (for the response a completion carries).
pub fn event(event: &Event, task: &Task) -> EventObject {
    EventObject {
        object: EventTag::Value,
        task_id: event.task_id.to_string(),
        sequence_number: event.sequence_number,
        created_at: time(event.created_at),
        body: event_body(&event.payload, task),
    }
}

list_of!(
    /// A page of tasks, newest first.
    TaskList of TaskObject
);
list_of!(
    /// A page of a task's events, ascending.
    EventList of EventObject
);
