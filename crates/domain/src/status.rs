//! The seven statuses of a task.

use strum::{EnumIter, EnumString, IntoStaticStr, VariantArray};

/// Where a task is in its life. `completed`, `failed` and `cancelled` are finished and absorbing.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    EnumString,
    IntoStaticStr,
    EnumIter,
    VariantArray,
    strum::Display,
)]
#[strum(serialize_all = "snake_case")]
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
    pub const ALL: &'static [TaskStatus] = Self::VARIANTS;

    /// The statuses a task can be left in when its instance stops (P-7).
    pub const UNFINISHED: [TaskStatus; 4] = [
        TaskStatus::Queued,
        TaskStatus::Loading,
        TaskStatus::Running,
        TaskStatus::Cancelling,
    ];

    /// The finished statuses, never left again (what a purge may remove, P-6).
    pub const FINISHED: [TaskStatus; 3] = [
        TaskStatus::Completed,
        TaskStatus::Failed,
        TaskStatus::Cancelled,
    ];

    /// Whether the task is finished: `completed`, `failed` or `cancelled`, never left again.
    pub const fn is_finished(self) -> bool {
        matches!(
            self,
            TaskStatus::Completed | TaskStatus::Failed | TaskStatus::Cancelled
        )
    }

    /// The name, e.g. `queued`.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Parses a name.
    pub fn parse(text: &str) -> Result<Self, UnknownStatus> {
        text.parse().map_err(|_| UnknownStatus(text.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exactly_three_statuses_are_finished() {
        let finished: Vec<_> = TaskStatus::ALL
            .iter()
            .copied()
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
        assert_eq!(TaskStatus::ALL.len(), 7);
    }

    #[test]
    fn every_status_parses_from_its_name_and_nothing_else_does() {
        let names = [
            "queued",
            "loading",
            "running",
            "cancelling",
            "completed",
            "failed",
            "cancelled",
        ];
        for (status, name) in TaskStatus::ALL.iter().zip(names) {
            assert_eq!(status.as_str(), name);
            assert_eq!(status.to_string(), name);
            assert_eq!(TaskStatus::parse(name), Ok(*status));
        }
        for bad in ["done", "Queued", "", " queued"] {
            assert!(TaskStatus::parse(bad).is_err(), "{bad:?}");
        }
    }
}
