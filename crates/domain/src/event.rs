//! Task events: their kinds with the wire names of API.md §5, their payloads, and what each implies.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::ids::TaskId;
use crate::model::ModelId;
use crate::status::TaskStatus;
use crate::task::{Response, Task, TaskError};
use crate::time::Timestamp;

/// The kind of an event; its wire name is [`EventKind::wire_name`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EventKind {
    /// `response.created`: always sequence 1, with the task's insert.
    #[serde(rename = "response.created")]
    Created,
    /// `response.loading`: the model is being loaded.
    #[serde(rename = "response.loading")]
    Loading,
    /// `response.in_progress`: generation starts.
    #[serde(rename = "response.in_progress")]
    InProgress,
    /// `response.output_text.delta`: output.
    #[serde(rename = "response.output_text.delta")]
    OutputTextDelta,
    /// `response.cancelling`: cancel accepted while work was under way.
    #[serde(rename = "response.cancelling")]
    Cancelling,
    /// `response.queued`: put back in the queue at startup.
    #[serde(rename = "response.queued")]
    Queued,
    /// `response.resumed`: continued from a snapshot at startup.
    #[serde(rename = "response.resumed")]
    Resumed,
    /// `response.completed`: terminal.
    #[serde(rename = "response.completed")]
    Completed,
    /// `response.failed`: terminal.
    #[serde(rename = "response.failed")]
    Failed,
    /// `response.cancelled`: terminal.
    #[serde(rename = "response.cancelled")]
    Cancelled,
}

/// A string that names no event kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown event type `{0}`")]
pub struct UnknownEventKind(pub String);

impl EventKind {
    /// Every kind.
    pub const ALL: [EventKind; 10] = [
        EventKind::Created,
        EventKind::Loading,
        EventKind::InProgress,
        EventKind::OutputTextDelta,
        EventKind::Cancelling,
        EventKind::Queued,
        EventKind::Resumed,
        EventKind::Completed,
        EventKind::Failed,
        EventKind::Cancelled,
    ];

    /// The wire name, e.g. `response.output_text.delta`.
    pub const fn wire_name(self) -> &'static str {
        match self {
            EventKind::Created => "response.created",
            EventKind::Loading => "response.loading",
            EventKind::InProgress => "response.in_progress",
            EventKind::OutputTextDelta => "response.output_text.delta",
            EventKind::Cancelling => "response.cancelling",
            EventKind::Queued => "response.queued",
            EventKind::Resumed => "response.resumed",
            EventKind::Completed => "response.completed",
            EventKind::Failed => "response.failed",
            EventKind::Cancelled => "response.cancelled",
        }
    }

    /// Parses a wire name.
    pub fn parse(text: &str) -> Result<Self, UnknownEventKind> {
        EventKind::ALL
            .into_iter()
            .find(|kind| kind.wire_name() == text)
            .ok_or_else(|| UnknownEventKind(text.to_owned()))
    }

    /// The status a task is in right after this event is its last (P-3, I-2).
    pub const fn implied_status(self) -> TaskStatus {
        match self {
            EventKind::Created | EventKind::Queued => TaskStatus::Queued,
            EventKind::Loading => TaskStatus::Loading,
            EventKind::InProgress | EventKind::OutputTextDelta | EventKind::Resumed => {
                TaskStatus::Running
            }
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

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.wire_name())
    }
}

/// Why a task went back to the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QueueReason {
    /// The service restarted under it (`retry`/`resume` policy).
    ServerRestarted,
}

/// What an event says. The variant decides the [`EventKind`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", content = "data")]
pub enum EventPayload {
    /// The task as it was created.
    #[serde(rename = "response.created")]
    Created {
        /// The task at creation.
        task: Box<Task>,
    },
    /// The model being loaded.
    #[serde(rename = "response.loading")]
    Loading {
        /// Its id.
        model: ModelId,
    },
    /// Generation starts.
    #[serde(rename = "response.in_progress")]
    InProgress {},
    /// A piece of output.
    #[serde(rename = "response.output_text.delta")]
    OutputTextDelta {
        /// The text.
        delta: String,
    },
    /// Cancel accepted while work was under way.
    #[serde(rename = "response.cancelling")]
    Cancelling {},
    /// Put back in the queue.
    #[serde(rename = "response.queued")]
    Queued {
        /// Why.
        reason: QueueReason,
    },
    /// Continued from a snapshot.
    #[serde(rename = "response.resumed")]
    Resumed {
        /// The sequence number of the last event the snapshot covers.
        from_sequence_number: u64,
    },
    /// Completed with this response.
    #[serde(rename = "response.completed")]
    Completed {
        /// The response.
        response: Box<Response>,
    },
    /// Failed with this error.
    #[serde(rename = "response.failed")]
    Failed {
        /// Why.
        error: TaskError,
    },
    /// Cancelled.
    #[serde(rename = "response.cancelled")]
    Cancelled {},
}

impl EventPayload {
    /// The kind of this payload.
    pub const fn kind(&self) -> EventKind {
        match self {
            EventPayload::Created { .. } => EventKind::Created,
            EventPayload::Loading { .. } => EventKind::Loading,
            EventPayload::InProgress {} => EventKind::InProgress,
            EventPayload::OutputTextDelta { .. } => EventKind::OutputTextDelta,
            EventPayload::Cancelling {} => EventKind::Cancelling,
            EventPayload::Queued { .. } => EventKind::Queued,
            EventPayload::Resumed { .. } => EventKind::Resumed,
            EventPayload::Completed { .. } => EventKind::Completed,
            EventPayload::Failed { .. } => EventKind::Failed,
            EventPayload::Cancelled {} => EventKind::Cancelled,
        }
    }
}

/// A stored event of one task's log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
    fn kinds_round_trip_through_their_wire_names() {
        for kind in EventKind::ALL {
            assert_eq!(EventKind::parse(kind.wire_name()), Ok(kind));
            assert_eq!(serde_json::to_value(kind).unwrap(), kind.wire_name());
        }
    }

    #[test]
    fn only_completed_failed_and_cancelled_are_terminal() {
        let terminal: Vec<_> = EventKind::ALL
            .into_iter()
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
    fn a_payload_serialises_with_its_wire_type_and_data() {
        let payload = EventPayload::OutputTextDelta {
            delta: "forest ".into(),
        };
        assert_eq!(
            serde_json::to_value(&payload).unwrap(),
            serde_json::json!({"type": "response.output_text.delta", "data": {"delta": "forest "}})
        );
        let cancelled = EventPayload::Cancelled {};
        let json = serde_json::to_value(&cancelled).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"type": "response.cancelled", "data": {}})
        );
        assert_eq!(
            serde_json::from_value::<EventPayload>(json).unwrap(),
            cancelled
        );
    }
}
