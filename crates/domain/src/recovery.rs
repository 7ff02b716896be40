//! Restart policies and the recovery table of API.md §7 (P-7…P-11).
//!
//! At startup every leftover task (`queued`, `loading`, `running`, `cancelling`) moves by its
//! `on_restart` policy. [`plan`] is the table itself; [`recover`] applies it to a task and returns
//! the new row with its one event, to be written in one transaction (P-11).
//!
//! Recovery must be idempotent (I-5): run twice in one start, the second run changes nothing. The
//! only cell whose new status is itself a leftover that the table moves again is `running` under
//! `resume`; so each start has a [`StartEpoch`] and a task moved in this start is not moved again in
//! it ([`needs_recovery`]). A later start moves it again, as it should: it was interrupted again.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error_code::TaskErrorCode;
use crate::event::{EventKind, EventPayload, QueueReason};
use crate::status::TaskStatus;
use crate::task::{Task, TaskError};
use crate::time::Timestamp;
use crate::transition::{apply, Advanced, Transition};

/// What happens to an unfinished task when the service restarts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RestartPolicy {
    /// Fail it with `server_restarted` (the default).
    #[default]
    Fail,
    /// Put it back in the queue and run it again from nothing.
    Retry,
    /// Continue a running task from its snapshot; otherwise like `retry`.
    Resume,
}

/// A string that names no policy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown restart policy `{0}` (expected fail, retry or resume)")]
pub struct UnknownPolicy(pub String);

impl RestartPolicy {
    /// All three policies.
    pub const ALL: [RestartPolicy; 3] = [
        RestartPolicy::Fail,
        RestartPolicy::Retry,
        RestartPolicy::Resume,
    ];

    /// The wire name.
    pub const fn as_str(self) -> &'static str {
        match self {
            RestartPolicy::Fail => "fail",
            RestartPolicy::Retry => "retry",
            RestartPolicy::Resume => "resume",
        }
    }

    /// Parses a wire name.
    pub fn parse(text: &str) -> Result<Self, UnknownPolicy> {
        RestartPolicy::ALL
            .into_iter()
            .find(|policy| policy.as_str() == text)
            .ok_or_else(|| UnknownPolicy(text.to_owned()))
    }
}

impl fmt::Display for RestartPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for RestartPolicy {
    type Err = UnknownPolicy;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// The number of a service start; each start has a larger one than the last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct StartEpoch(pub u64);

/// One cell of the recovery table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Move {
    /// Nothing is written: a finished task, or a `queued` task that stays `queued`.
    Untouched,
    /// The task moves, with one event, in one transaction.
    Moved {
        /// The new status.
        status: TaskStatus,
        /// The one event written with it.
        event: EventKind,
        /// The task error code, for moves to `failed` (P-9).
        error_code: Option<TaskErrorCode>,
        /// Whether `task.restarts` increments (every move that writes an event).
        increments_restarts: bool,
        /// Whether the engine continues from the task's snapshot.
        resumes_from_snapshot: bool,
    },
}

/// The recovery table of API.md §7 / spec 11.3 (P-8…P-10).
pub const fn plan(status: TaskStatus, policy: RestartPolicy) -> Move {
    const fn moved(status: TaskStatus, event: EventKind, resumes: bool) -> Move {
        Move::Moved {
            status,
            event,
            error_code: match event {
                EventKind::Failed => Some(TaskErrorCode::ServerRestarted),
                _ => None,
            },
            increments_restarts: true,
            resumes_from_snapshot: resumes,
        }
    }
    match (status, policy) {
        (TaskStatus::Completed | TaskStatus::Failed | TaskStatus::Cancelled, _) => Move::Untouched,
        (TaskStatus::Cancelling, _) => moved(TaskStatus::Cancelled, EventKind::Cancelled, false),
        (TaskStatus::Queued | TaskStatus::Loading | TaskStatus::Running, RestartPolicy::Fail) => {
            moved(TaskStatus::Failed, EventKind::Failed, false)
        }
        (TaskStatus::Queued, RestartPolicy::Retry | RestartPolicy::Resume) => Move::Untouched,
        (TaskStatus::Loading, RestartPolicy::Retry | RestartPolicy::Resume)
        | (TaskStatus::Running, RestartPolicy::Retry) => {
            moved(TaskStatus::Queued, EventKind::Queued, false)
        }
        (TaskStatus::Running, RestartPolicy::Resume) => {
            moved(TaskStatus::Running, EventKind::Resumed, true)
        }
    }
}

/// Whether a task must be looked at by recovery in the start `current` (P-7): it is unfinished
/// and was not already moved by this same start.
pub fn needs_recovery(task: &Task, current: StartEpoch) -> bool {
    !task.status.is_finished() && task.recovered_in != Some(current)
}

/// Applies [`plan`] to a leftover task in the start `current` at time `at`.
///
/// `snapshot_covers` is the sequence number of the last event the task's stored snapshot covers,
/// if it has one; a resumed task's `response.resumed` names it (or, with no snapshot, the task's
/// last event: the resumed run then starts from nothing, which is where the log leaves it).
/// Returns `None` when nothing is to be written.
pub fn recover(
    task: &Task,
    current: StartEpoch,
    snapshot_covers: Option<u64>,
    at: Timestamp,
) -> Option<Advanced> {
    if !needs_recovery(task, current) {
        return None;
    }
    let Move::Moved {
        status,
        event,
        increments_restarts,
        ..
    } = plan(task.status, task.on_restart)
    else {
        return None;
    };
    let payload = match event {
        EventKind::Failed => EventPayload::Failed {
            error: TaskError::server_restarted(),
        },
        EventKind::Queued => EventPayload::Queued {
            reason: QueueReason::ServerRestarted,
        },
        EventKind::Resumed => EventPayload::Resumed {
            from_sequence_number: snapshot_covers.unwrap_or(task.last_sequence_number),
        },
        _ => EventPayload::Cancelled {},
    };
    let mut advanced = apply(
        task,
        Transition {
            status,
            events: vec![payload],
        },
        at,
    );
    if increments_restarts {
        advanced.task.restarts += 1;
    }
    advanced.task.recovered_in = Some(current);
    Some(advanced)
}
