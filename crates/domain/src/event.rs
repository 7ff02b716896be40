//! Task events: their kinds and names, their payloads, and the status each implies.
//!
//! A task's log is the single truth about it; both the LMSP-native events API and the
//! OpenAI-compatible stream are renderings of it. Besides the lifecycle events it holds the
//! structure of the response's output: a run's first delta opens an output item and its content
//! part (`response.output_item.added`, `response.content_part.added`), the completion closes them
//! (`response.output_text.done`, `response.content_part.done`, `response.output_item.done`), and a
//! run put back in the queue has its open item closed as incomplete.

use strum::{EnumString, IntoStaticStr, VariantArray};

use crate::ids::{ItemId, TaskId};
use crate::model::ModelId;
use crate::status::TaskStatus;
use crate::task::{ItemStatus, Response, Task, TaskError};
use crate::time::Timestamp;
use crate::tools::TokenLogprob;

/// The kind of an event; its name is [`EventKind::name`].
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, EnumString, IntoStaticStr, VariantArray, strum::Display,
)]
pub enum EventKind {
    /// Always sequence 1, with the task's insert.
    #[strum(serialize = "response.created")]
    Created,
    /// The model is being loaded.
    #[strum(serialize = "response.loading")]
    Loading,
    /// Generation starts.
    #[strum(serialize = "response.in_progress")]
    InProgress,
    /// A run opens its output item (with its first delta).
    #[strum(serialize = "response.output_item.added")]
    OutputItemAdded,
    /// A run opens its item's text part (with its first delta).
    #[strum(serialize = "response.content_part.added")]
    ContentPartAdded,
    /// Output.
    #[strum(serialize = "response.output_text.delta")]
    OutputTextDelta,
    /// The item's text is complete (with the completion).
    #[strum(serialize = "response.output_text.done")]
    OutputTextDone,
    /// The item's text part is complete (with the completion).
    #[strum(serialize = "response.content_part.done")]
    ContentPartDone,
    /// The item is closed: completed, or incomplete when its run went back to the queue.
    #[strum(serialize = "response.output_item.done")]
    OutputItemDone,
    /// A cancel was accepted while work was under way.
    #[strum(serialize = "response.cancelling")]
    Cancelling,
    /// Put back in the queue by recovery.
    #[strum(serialize = "response.queued")]
    Queued,
    /// Continued from its snapshot by recovery.
    #[strum(serialize = "response.resumed")]
    Resumed,
    /// Terminal: completed.
    #[strum(serialize = "response.completed")]
    Completed,
    /// Terminal: failed.
    #[strum(serialize = "response.failed")]
    Failed,
    /// Terminal: cancelled.
    #[strum(serialize = "response.cancelled")]
    Cancelled,
    /// A run opens a function call item (OpenAI's `response.output_item.added` of a
    /// `function_call`).
    #[strum(serialize = "response.function_call.added")]
    FunctionCallAdded,
    /// A piece of the open call's arguments.
    #[strum(serialize = "response.function_call_arguments.delta")]
    FunctionCallArgumentsDelta,
    /// The open call's arguments are complete.
    #[strum(serialize = "response.function_call_arguments.done")]
    FunctionCallArgumentsDone,
    /// The call item is closed (OpenAI's `response.output_item.done` of a `function_call`).
    #[strum(serialize = "response.function_call.done")]
    FunctionCallDone,
}

/// A string that names no event kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown event type `{0}`")]
pub struct UnknownEventKind(pub String);

impl EventKind {
    /// Every kind.
    pub const ALL: &'static [EventKind] = Self::VARIANTS;

    /// The name, e.g. `response.output_text.delta`.
    pub fn name(self) -> &'static str {
        self.into()
    }

    /// Parses a name.
    pub fn parse(text: &str) -> Result<Self, UnknownEventKind> {
        text.parse().map_err(|_| UnknownEventKind(text.to_owned()))
    }

    /// The status a task is in right after this event is its last (P-3, I-2).
    pub const fn implied_status(self) -> TaskStatus {
        match self {
            EventKind::Created | EventKind::Queued => TaskStatus::Queued,
            EventKind::Loading => TaskStatus::Loading,
            EventKind::InProgress
            | EventKind::OutputItemAdded
            | EventKind::ContentPartAdded
            | EventKind::OutputTextDelta
            | EventKind::OutputTextDone
            | EventKind::ContentPartDone
            | EventKind::OutputItemDone
            | EventKind::FunctionCallAdded
            | EventKind::FunctionCallArgumentsDelta
            | EventKind::FunctionCallArgumentsDone
            | EventKind::FunctionCallDone
            | EventKind::Resumed => TaskStatus::Running,
            EventKind::Cancelling => TaskStatus::Cancelling,
            EventKind::Completed => TaskStatus::Completed,
            EventKind::Failed => TaskStatus::Failed,
            EventKind::Cancelled => TaskStatus::Cancelled,
        }
    }

    /// Whether this event ends the task's log.
    pub const fn is_terminal(self) -> bool {
        self.implied_status().is_finished()
    }
}

/// Why a task went back to the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EnumString, IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum QueueReason {
    /// The service restarted under it (or its instance died): `retry`/`resume` policy.
    ServerRestarted,
}

impl QueueReason {
    /// The name, e.g. `server_restarted`.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// An output item closed by `response.output_text.done`, `response.content_part.done` or
/// `response.output_item.done`: which item, its text, and how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClosedItem {
    /// The item.
    pub item: ItemId,
    /// Its whole text.
    pub text: String,
    /// How it ended.
    pub status: ItemStatus,
}

/// A function call of a run: its item (whose index makes its ids, `fc_…` and `call_…`), the
/// function and its arguments (whole, or so far).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallItem {
    /// The item.
    pub item: ItemId,
    /// The function called.
    pub name: String,
    /// The arguments: JSON text as the engine wrote it.
    pub arguments: String,
}

/// What an event says. The variant decides the [`EventKind`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventPayload {
    /// The task as it was created.
    Created {
        /// The task at creation.
        task: Box<Task>,
    },
    /// The model being loaded.
    Loading {
        /// Its id.
        model: ModelId,
    },
    /// Generation starts.
    InProgress,
    /// A run opens its output item.
    OutputItemAdded {
        /// The item.
        item: ItemId,
    },
    /// A run opens its item's text part.
    ContentPartAdded {
        /// The item.
        item: ItemId,
    },
    /// A piece of output of the open item.
    OutputTextDelta {
        /// The item it belongs to.
        item: ItemId,
        /// The text.
        delta: String,
    },
    /// A piece of output of the open item with its tokens' log probabilities (when the task asked
    /// for them); of kind [`EventKind::OutputTextDelta`] like a plain delta.
    OutputTextLogprobs {
        /// The item it belongs to.
        item: ItemId,
        /// The text.
        delta: String,
        /// The log probabilities of the tokens that make the text.
        logprobs: Vec<TokenLogprob>,
    },
    /// A run opens a function call item.
    FunctionCallAdded {
        /// The item.
        item: ItemId,
        /// The function called.
        name: String,
    },
    /// A piece of the open call's arguments.
    FunctionCallArgumentsDelta {
        /// The call's item.
        item: ItemId,
        /// The text.
        delta: String,
    },
    /// The call's arguments are complete.
    FunctionCallArgumentsDone(CallItem),
    /// The call item is closed.
    FunctionCallDone(CallItem),
    /// The item's text is complete.
    OutputTextDone(ClosedItem),
    /// The item's text part is complete.
    ContentPartDone(ClosedItem),
    /// The item is closed.
    OutputItemDone(ClosedItem),
    /// Cancel accepted while work was under way.
    Cancelling,
    /// Put back in the queue.
    Queued {
        /// Why.
        reason: QueueReason,
    },
    /// Continued from a snapshot.
    Resumed {
        /// The sequence number of the last event the snapshot covers.
        from_sequence_number: u64,
    },
    /// Completed with this response.
    Completed {
        /// The response.
        response: Box<Response>,
    },
    /// Failed with this error.
    Failed {
        /// Why.
        error: TaskError,
    },
    /// Cancelled.
    Cancelled,
}

impl EventPayload {
    /// The kind of this payload.
    pub const fn kind(&self) -> EventKind {
        match self {
            EventPayload::Created { .. } => EventKind::Created,
            EventPayload::Loading { .. } => EventKind::Loading,
            EventPayload::InProgress => EventKind::InProgress,
            EventPayload::OutputItemAdded { .. } => EventKind::OutputItemAdded,
            EventPayload::ContentPartAdded { .. } => EventKind::ContentPartAdded,
            EventPayload::OutputTextDelta { .. } | EventPayload::OutputTextLogprobs { .. } => {
                EventKind::OutputTextDelta
            }
            EventPayload::FunctionCallAdded { .. } => EventKind::FunctionCallAdded,
            EventPayload::FunctionCallArgumentsDelta { .. } => {
                EventKind::FunctionCallArgumentsDelta
            }
            EventPayload::FunctionCallArgumentsDone(_) => EventKind::FunctionCallArgumentsDone,
            EventPayload::FunctionCallDone(_) => EventKind::FunctionCallDone,
            EventPayload::OutputTextDone(_) => EventKind::OutputTextDone,
            EventPayload::ContentPartDone(_) => EventKind::ContentPartDone,
            EventPayload::OutputItemDone(_) => EventKind::OutputItemDone,
            EventPayload::Cancelling => EventKind::Cancelling,
            EventPayload::Queued { .. } => EventKind::Queued,
            EventPayload::Resumed { .. } => EventKind::Resumed,
            EventPayload::Completed { .. } => EventKind::Completed,
            EventPayload::Failed { .. } => EventKind::Failed,
            EventPayload::Cancelled => EventKind::Cancelled,
        }
    }

    /// The output text this event adds, if it is a delta (with or without log probabilities).
    pub fn text_delta(&self) -> Option<(ItemId, &str)> {
        match self {
            EventPayload::OutputTextDelta { item, delta }
            | EventPayload::OutputTextLogprobs { item, delta, .. } => Some((*item, delta)),
            _ => None,
        }
    }

    /// The output item this event is about, if any.
    pub fn item(&self) -> Option<ItemId> {
        match self {
            EventPayload::OutputItemAdded { item }
            | EventPayload::ContentPartAdded { item }
            | EventPayload::OutputTextDelta { item, .. }
            | EventPayload::OutputTextLogprobs { item, .. }
            | EventPayload::FunctionCallAdded { item, .. }
            | EventPayload::FunctionCallArgumentsDelta { item, .. } => Some(*item),
            EventPayload::FunctionCallArgumentsDone(call)
            | EventPayload::FunctionCallDone(call) => Some(call.item),
            EventPayload::OutputTextDone(closed)
            | EventPayload::ContentPartDone(closed)
            | EventPayload::OutputItemDone(closed) => Some(closed.item),
            _ => None,
        }
    }
}

/// A stored event of one task's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The task whose log holds it.
    pub task_id: TaskId,
    /// 1, 2, 3, … without gap or repeat within the task (I-2).
    pub sequence_number: u64,
    /// When it was written.
    pub created_at: Timestamp,
    /// What it says.
    pub payload: EventPayload,
}

impl Event {
    /// The kind of this event.
    pub const fn kind(&self) -> EventKind {
        self.payload.kind()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_through_their_names() {
        assert_eq!(EventKind::ALL.len(), 19);
        for kind in EventKind::ALL {
            assert_eq!(EventKind::parse(kind.name()), Ok(*kind));
            assert!(kind.name().starts_with("response."), "{kind:?}");
        }
        assert_eq!(
            EventKind::OutputTextDelta.name(),
            "response.output_text.delta"
        );
        assert!(EventKind::parse("response.done").is_err());
    }

    #[test]
    fn only_completed_failed_and_cancelled_are_terminal() {
        let terminal: Vec<_> = EventKind::ALL
            .iter()
            .copied()
            .filter(|k| k.is_terminal())
            .collect();
        assert_eq!(
            terminal,
            [
                EventKind::Completed,
                EventKind::Failed,
                EventKind::Cancelled
            ]
        );
    }

    #[test]
    fn the_output_structure_events_leave_a_task_running() {
        for kind in [
            EventKind::OutputItemAdded,
            EventKind::ContentPartAdded,
            EventKind::OutputTextDone,
            EventKind::ContentPartDone,
            EventKind::OutputItemDone,
        ] {
            assert_eq!(kind.implied_status(), TaskStatus::Running, "{kind:?}");
        }
    }
}
