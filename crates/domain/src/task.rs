//! Tasks, the work they carry, and the responses they produce.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error_code::TaskErrorCode;
use crate::ids::{ClientId, ResponseId, TaskId};
use crate::model::ModelId;
use crate::recovery::{RestartPolicy, StartEpoch};
use crate::status::TaskStatus;
use crate::time::Timestamp;

/// Free-form string pairs a client attaches to a task (at most 16; see validation).
pub type Metadata = BTreeMap<String, String>;

/// Who speaks a message of a conversation input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Instructions for the model.
    System,
    /// The user's turn.
    User,
    /// The model's earlier turn.
    Assistant,
}

/// One message of a conversation input.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// Who speaks.
    pub role: Role,
    /// What is said.
    pub content: String,
}

/// What the model is asked: a plain prompt or a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Input {
    /// A non-empty prompt.
    Text(String),
    /// A non-empty list of messages.
    Messages(Vec<Message>),
}

impl Input {
    /// The input as one prompt text: the string, or the messages' contents joined by newlines.
    pub fn prompt_text(&self) -> String {
        match self {
            Input::Text(text) => text.clone(),
            Input::Messages(messages) => messages
                .iter()
                .map(|m| m.content.as_str())
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }
}

/// A validated `POST /v1/responses` request (see [`crate::validation`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubmitRequest {
    /// The model to run.
    pub model: ModelId,
    /// The prompt or conversation.
    pub input: Input,
    /// Whether the request returns at once (202) instead of waiting for the result.
    pub background: bool,
    /// Whether the reply is an event stream.
    pub stream: bool,
    /// The restart policy; `None` means the service default.
    pub on_restart: Option<RestartPolicy>,
    /// 1…100 000.
    pub max_output_tokens: u32,
    /// The sampler's seed; `None` means the service picks one and stores it.
    pub seed: Option<u64>,
    /// At most 16 string pairs.
    pub metadata: Metadata,
}

/// The default of `max_output_tokens`.
pub const DEFAULT_MAX_OUTPUT_TOKENS: u32 = 256;

/// What a task asks of its engine; stored with the task and never changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskSpec {
    /// The prompt or conversation.
    pub input: Input,
    /// The most tokens to generate.
    pub max_output_tokens: u32,
    /// The sampler's seed.
    pub seed: u64,
}

/// Why a task failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskError {
    /// The stable code.
    pub code: TaskErrorCode,
    /// Human text.
    pub message: String,
}

impl TaskError {
    /// The error recovery gives a task whose policy is `fail` (P-9).
    pub fn server_restarted() -> Self {
        Self {
            code: TaskErrorCode::ServerRestarted,
            message: String::from("the service restarted while the task was unfinished"),
        }
    }
}

/// A task: one unit of inference work and everything the service knows about it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Task {
    /// Its id.
    pub id: TaskId,
    /// The client that submitted it (isolation, I-7).
    pub client_id: ClientId,
    /// Where it is.
    pub status: TaskStatus,
    /// The model it runs on.
    pub model: ModelId,
    /// What happens to it when the service restarts before it finishes.
    pub on_restart: RestartPolicy,
    /// What it asks; shared, since it never changes and may be large (an input up to 2 MiB).
    pub spec: Arc<TaskSpec>,
    /// The client's metadata.
    pub metadata: Metadata,
    /// When it was accepted.
    pub created_at: Timestamp,
    /// When a worker first claimed it.
    pub started_at: Option<Timestamp>,
    /// When it finished.
    pub finished_at: Option<Timestamp>,
    /// The highest event sequence number stored for it (P-3).
    pub last_sequence_number: u64,
    /// How many restarts moved it (API.md §7).
    pub restarts: u32,
    /// Why it failed, when it did.
    pub error: Option<TaskError>,
    /// Its response, once completed.
    pub response_id: Option<ResponseId>,
    /// The start whose recovery last moved it, so one start never moves it twice (I-5).
    pub recovered_in: Option<StartEpoch>,
}

impl Task {
    /// A new task in `queued` with no events yet; [`crate::ports::TaskStore::create_task`]
    /// stores it together with its `response.created` event (P-2).
    pub fn new_queued(
        id: TaskId,
        client_id: ClientId,
        model: ModelId,
        on_restart: RestartPolicy,
        spec: TaskSpec,
        metadata: Metadata,
        created_at: Timestamp,
    ) -> Self {
        Self {
            id,
            client_id,
            status: TaskStatus::Queued,
            model,
            on_restart,
            spec: Arc::new(spec),
            metadata,
            created_at,
            started_at: None,
            finished_at: None,
            last_sequence_number: 1,
            restarts: 0,
            error: None,
            response_id: None,
            recovered_in: None,
        }
    }
}

impl Task {
    /// The task as it was when it was created: the data of its `response.created` event.
    ///
    /// Only fields that never change are kept; every other field is at its initial value. So a
    /// store may keep the creation event's task as a reference to the task instead of a copy.
    pub fn as_created(&self) -> Task {
        Task {
            id: self.id,
            client_id: self.client_id,
            status: TaskStatus::Queued,
            model: self.model.clone(),
            on_restart: self.on_restart,
            spec: Arc::clone(&self.spec),
            metadata: self.metadata.clone(),
            created_at: self.created_at,
            started_at: None,
            finished_at: None,
            last_sequence_number: 1,
            restarts: 0,
            error: None,
            response_id: None,
            recovered_in: None,
        }
    }
}

/// Token counts of a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens in the input.
    pub input_tokens: u64,
    /// Tokens generated.
    pub output_tokens: u64,
}

/// The result of a completed task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Response {
    /// Its id.
    pub id: ResponseId,
    /// The task that produced it.
    pub task_id: TaskId,
    /// The model that produced it.
    pub model: ModelId,
    /// The generated text: the deltas after the last `response.queued`, joined.
    pub output_text: String,
    /// Token counts.
    pub usage: Usage,
    /// When its task was created.
    pub created_at: Timestamp,
    /// When its task completed.
    pub completed_at: Timestamp,
}
