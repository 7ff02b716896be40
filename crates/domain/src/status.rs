//! The seven statuses of a task (API.md §4).

use std::fmt;

use serde::{Deserialize, Serialize};

/// Where a task is in its life. `completed`, `failed` and `cancelled` are finished and absorbing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskStatus {
    /// Accepted and waiting for a worker.
    Queued,
    /// A worker is loading its model.
    Loading,
    /// A worker is generating output.
    Running,
    /// A cancel was accepted while work was under way; the worker is stopping.
    Cancelling,
    /// Finished with a response.
    Completed,
    /// Finished with an error.
    Failed,
    /// Finished by a cancel.
    Cancelled,
}

/// A string that names no status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown task status `{0}`")]
pub struct UnknownStatus(pub String);

impl TaskStatus {
    /// All seven statuses, unfinished first.
    pub const ALL: [TaskStatus; 7] = [
        TaskStatus::Queued,
        TaskStatus::Loading,
        TaskStatus::Running,
        TaskStatus::Cancelling,
        TaskStatus::Completed,
        TaskStatus::Failed,
        TaskStatus::Cancelled,
    ];

    /// The statuses a task can be left in when the process stops (P-7).
    pub const UNFINISHED: [TaskStatus; 4] = [
        TaskStatus::Queued,
        TaskStatus::Loading,
        TaskStatus::Running,
        TaskStatus::Cancelling,
    ];

    /// Whether the task is finished: `completed`, `failed` or `cancelled`, never left again.
    pub const fn is_finished(self) -> bool {
        matches!(
            self,
            TaskStatus::Completed | TaskStatus::Failed | TaskStatus::Cancelled
        )
    }

    /// The wire name, e.g. `queued`.
    pub const fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Queued => "queued",
            TaskStatus::Loading => "loading",
            TaskStatus::Running => "running",
            TaskStatus::Cancelling => "cancelling",
            TaskStatus::Completed => "completed",
            TaskStatus::Failed => "failed",
            TaskStatus::Cancelled => "cancelled",
        }
    }

    /// Parses a wire name.
    pub fn parse(text: &str) -> Result<Self, UnknownStatus> {
        TaskStatus::ALL
            .into_iter()
            .find(|status| status.as_str() == text)
            .ok_or_else(|| UnknownStatus(text.to_owned()))
    }
}

impl fmt::Display for TaskStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exactly_three_statuses_are_finished() {
        let finished: Vec<_> = TaskStatus::ALL
            .into_iter()
            .filter(|s| s.is_finished())
            .collect();
        assert_eq!(
            finished,
            [
                TaskStatus::Completed,
                TaskStatus::Failed,
                TaskStatus::Cancelled
            ]
        );
        assert!(TaskStatus::UNFINISHED.iter().all(|s| !s.is_finished()));
    }

    #[test]
    fn every_status_parses_from_its_wire_name() {
        for status in TaskStatus::ALL {
            assert_eq!(TaskStatus::parse(status.as_str()), Ok(status));
            assert_eq!(
                serde_json::to_value(status).unwrap(),
                serde_json::Value::String(status.as_str().into())
            );
        }
        assert!(TaskStatus::parse("done").is_err());
    }
}
