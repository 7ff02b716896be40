//! Tasks, the work they carry, and the responses they produce.

use std::collections::BTreeMap;
use std::sync::Arc;

use strum::{EnumString, IntoStaticStr, VariantArray};

use crate::batch::BatchLine;
use crate::error_code::TaskErrorCode;
use crate::event::{CallItem, EventPayload};
use crate::ids::{ClientId, InstanceId, ItemId, ResponseId, TaskId};
use crate::model::ModelId;
use crate::recovery::RestartPolicy;
use crate::schedule::ServiceTier;
use crate::status::TaskStatus;
use crate::time::Timestamp;
use crate::tools::{Controls, TokenLogprob, ToolCall};

/// Free-form string pairs a client attaches to a task (at most 16; see validation).
pub type Metadata = BTreeMap<String, String>;

/// Who speaks a message of a conversation input.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, EnumString, IntoStaticStr, VariantArray, strum::Display,
)]
#[strum(serialize_all = "snake_case")]
pub enum Role {
    /// Instructions for the model.
    System,
    /// Instructions from the application's developer (treated like `system`).
    Developer,
    /// The user's turn.
    User,
    /// The model's earlier turn.
    Assistant,
    /// A tool's answer to a call of the assistant (`tool_call_id` names the call).
    Tool,
}

impl Role {
    /// The name, e.g. `user`.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Parses a name; `None` for an unknown one.
    pub fn parse(text: &str) -> Option<Self> {
        text.parse().ok()
    }
}

/// One message of a conversation input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Who speaks.
    pub role: Role,
    /// What is said.
    pub content: String,
    /// The calls an `assistant` turn made (empty for any other role).
    pub tool_calls: Vec<ToolCall>,
    /// The call a `tool` message answers (`None` for any other role).
    pub tool_call_id: Option<String>,
}

impl Message {
    /// A message of `role` saying `content`, with no tool calls.
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }
}

/// What the model is asked: a plain prompt or a conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// A non-empty prompt.
    Text(String),
    /// A non-empty list of messages.
    Messages(Vec<Message>),
}

impl Input {
    /// The input as messages: a prompt is one `user` message.
    pub fn messages(&self) -> Vec<Message> {
        match self {
            Input::Text(text) => vec![Message::new(Role::User, text.clone())],
            Input::Messages(messages) => messages.clone(),
        }
    }
}

/// A sampling parameter (`temperature`, `top_p`): a finite, non-negative number, compared by
/// value. The only way in is [`Fraction::new`], so it is never NaN.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct Fraction(f64);

// Sound: `new` admits no NaN, so equality is reflexive.
impl Eq for Fraction {}

impl Fraction {
    /// `value` when it is finite and not negative.
    pub fn new(value: f64) -> Option<Self> {
        (value.is_finite() && value >= 0.0).then_some(Self(value))
    }

    /// The number.
    pub fn get(self) -> f64 {
        self.0
    }
}

/// What a task asks of its engine; stored with the task and never changed, so a resumed or
/// retried run asks exactly the same.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskSpec {
    /// The prompt or conversation, with the earlier response's turns first when the request named
    /// a `previous_response_id`.
    pub input: Input,
    /// Instructions that come before the input (a system message).
    pub instructions: Option<String>,
    /// The most tokens to generate.
    pub max_output_tokens: u32,
    /// The sampler's seed.
    pub seed: u64,
    /// The sampling temperature (0 is greedy); `None`: the engine's default.
    pub temperature: Option<Fraction>,
    /// Nucleus sampling's probability mass; `None`: the engine's default.
    pub top_p: Option<Fraction>,
    /// The response whose conversation this one continues, as the request named it.
    pub previous_response_id: Option<ResponseId>,
    /// Tools, the output's format, stop strings, penalties and log probabilities.
    pub controls: Controls,
}

impl TaskSpec {
    /// The whole conversation an engine is given: the instructions as a `system` message, then
    /// the input's messages.
    pub fn conversation(&self) -> Vec<Message> {
        let mut messages = Vec::new();
        if let Some(instructions) = &self.instructions {
            messages.push(Message::new(Role::System, instructions.clone()));
        }
        messages.extend(self.input.messages());
        messages
    }

    /// The conversation as one prompt text: the messages' contents joined by newlines.
    pub fn prompt_text(&self) -> String {
        self.conversation()
            .iter()
            .map(|m| m.content.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Why a task failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskError {
    /// The stable code.
    pub code: TaskErrorCode,
    /// Human text.
    pub message: String,
}

impl TaskError {
    /// An error with this code and message.
    pub fn new(code: TaskErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// The error recovery gives a task whose policy is `fail` (P-9).
    pub fn server_restarted() -> Self {
        Self::new(
            TaskErrorCode::ServerRestarted,
            "the service restarted while the task was unfinished",
        )
    }
}

/// Where a task's output items are: how many its runs opened, and whether the last is open.
///
/// Each run that produces output opens one item (`response.output_item.added`); a resumed run
/// continues the open item; a run put back in the queue has its item closed as incomplete, and
/// the next run opens the next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OutputItems {
    /// How many items were opened.
    pub opened: u32,
    /// Whether the last opened item is still open.
    pub open: bool,
}

impl OutputItems {
    /// The open item of `task`, if any.
    pub fn open_item(&self, task: TaskId) -> Option<ItemId> {
        (self.open && self.opened > 0).then(|| ItemId::of(task, self.opened - 1))
    }

    /// The item the next run opens.
    pub fn next_item(&self, task: TaskId) -> ItemId {
        ItemId::of(task, self.opened)
    }

    /// Follows a log being replayed: counts the item `payload` is about (if any) as opened, so
    /// that a rendering holding an older copy of the task names the item its last run produced.
    pub fn follow(&mut self, payload: &EventPayload) {
        if let Some(item) = payload.item() {
            self.opened = self.opened.max(item.output_index() + 1);
        }
    }
}

/// A task: one unit of inference work and everything the service knows about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Task {
    /// Its id.
    pub id: TaskId,
    /// Its response's id, assigned at creation (its own ULID with the `resp_` prefix): a task
    /// has exactly one.
    pub response_id: ResponseId,
    /// The client that submitted it (isolation, I-7).
    pub client_id: ClientId,
    /// The instance in whose care it is: the one that accepted it, claimed it or recovered it.
    pub owner: InstanceId,
    /// The instance that accepted it (its first owner).
    pub accepted_by: InstanceId,
    /// Where it is.
    pub status: TaskStatus,
    /// The model it runs on.
    pub model: ModelId,
    /// What happens to it when its instance stops before it finishes.
    pub on_restart: RestartPolicy,
    /// Whether the request returned at once instead of waiting for the result.
    pub background: bool,
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
    /// How many restarts moved it (recovery).
    pub restarts: u32,
    /// Why it failed, when it did.
    pub error: Option<TaskError>,
    /// Its output items.
    pub items: OutputItems,
    /// How urgently it is claimed (never changes; aging is computed at claim time).
    pub service_tier: ServiceTier,
    /// The batch line it answers, when a batch created it.
    pub batch: Option<BatchLine>,
}

/// What the app knows of a new task before it is stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewTask {
    /// Its id.
    pub id: TaskId,
    /// The client that submits it.
    pub client_id: ClientId,
    /// The instance that accepts it.
    pub owner: InstanceId,
    /// The model.
    pub model: ModelId,
    /// The restart policy (the request's, or the service's default).
    pub on_restart: RestartPolicy,
    /// Whether the request returns at once.
    pub background: bool,
    /// What it asks.
    pub spec: TaskSpec,
    /// The client's metadata.
    pub metadata: Metadata,
    /// When it is accepted.
    pub created_at: Timestamp,
    /// How urgently it is claimed.
    pub service_tier: ServiceTier,
}

impl Task {
    /// A new task in `queued` with no events yet; [`crate::ports::TaskStore::create_task`]
    /// stores it together with its `response.created` event (P-2).
    pub fn new_queued(new: NewTask) -> Self {
        Self {
            id: new.id,
            response_id: ResponseId::from_ulid(new.id.ulid()),
            client_id: new.client_id,
            owner: new.owner,
            accepted_by: new.owner,
            status: TaskStatus::Queued,
            model: new.model,
            on_restart: new.on_restart,
            background: new.background,
            spec: Arc::new(new.spec),
            metadata: new.metadata,
            created_at: new.created_at,
            started_at: None,
            finished_at: None,
            last_sequence_number: 1,
            restarts: 0,
            error: None,
            items: OutputItems::default(),
            service_tier: new.service_tier,
            batch: None,
        }
    }

    /// Whether the task exists for `client` (I-7): every task exists for the service itself
    /// (`None`), a client's own tasks for the client, no other.
    pub fn visible_to(&self, client: Option<ClientId>) -> bool {
        client.is_none_or(|client| client == self.client_id)
    }

    /// The task as it was when it was created: the data of its `response.created` event.
    ///
    /// Only fields that never change are kept; every other field is at its initial value. So a
    /// store may keep the creation event's task as a reference to the task instead of a copy.
    pub fn as_created(&self) -> Task {
        Task {
            owner: self.accepted_by,
            status: TaskStatus::Queued,
            started_at: None,
            finished_at: None,
            last_sequence_number: 1,
            restarts: 0,
            error: None,
            items: OutputItems::default(),
            ..self.clone()
        }
    }
}

/// Token counts of a response, in the engine's own tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Tokens in the input.
    pub input_tokens: u64,
    /// Tokens generated.
    pub output_tokens: u64,
    /// Of the input's tokens, how many the run that finished did not evaluate because it took
    /// them from the engine's prompt cache or from a checkpoint of the task (0 for an engine that
    /// keeps neither). It describes the last run only: an uninterrupted run and a resumed one
    /// produce the same tokens but may reuse different amounts.
    pub cached_tokens: u64,
}

impl Usage {
    /// Input and output together.
    pub fn total_tokens(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }
}

/// The result of a completed task, stored when it completes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// Its id (the task's `response_id`).
    pub id: ResponseId,
    /// The task that produced it.
    pub task_id: TaskId,
    /// The model that produced it.
    pub model: ModelId,
    /// The generated text: the deltas after the last `response.queued`, joined.
    pub output_text: String,
    /// The function calls the run made after its text, in order (each an output item of its
    /// own); empty when it made none.
    pub calls: Vec<CallItem>,
    /// The log probabilities of the output text's tokens, when the task asked for them.
    pub logprobs: Vec<TokenLogprob>,
    /// Token counts.
    pub usage: Usage,
    /// When its task was created.
    pub created_at: Timestamp,
    /// When its task completed.
    pub completed_at: Timestamp,
}

/// The status of an output item when it is closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EnumString, IntoStaticStr, strum::Display)]
#[strum(serialize_all = "snake_case")]
pub enum ItemStatus {
    /// The run finished the item.
    Completed,
    /// The run was interrupted and put back in the queue.
    Incomplete,
}

impl ItemStatus {
    /// The name, e.g. `completed`.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::ClosedItem;
    use ulid::Ulid;

    #[test]
    fn following_a_log_counts_each_item_it_names_once() {
        let task = TaskId::from_ulid(Ulid::from_parts(1_700_000_000_000, 7));
        let mut items = OutputItems::default();
        items.follow(&EventPayload::InProgress);
        assert_eq!(items.opened, 0, "an event about no item opens none");
        items.follow(&EventPayload::OutputItemAdded {
            item: ItemId::of(task, 0),
        });
        items.follow(&EventPayload::ContentPartAdded {
            item: ItemId::of(task, 0),
        });
        assert_eq!(items.opened, 1, "events about one item count it once");
        items.follow(&EventPayload::OutputItemAdded {
            item: ItemId::of(task, 1),
        });
        assert_eq!(items.opened, 2);
        items.follow(&EventPayload::OutputItemDone(ClosedItem {
            item: ItemId::of(task, 0),
            text: String::new(),
            status: ItemStatus::Incomplete,
        }));
        assert_eq!(
            items.opened, 2,
            "a later event about an earlier item counts nothing"
        );
    }
}
