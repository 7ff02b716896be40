//! The cancel decision (P-4): what a cancel request does to a task in each status.

use crate::event::EventPayload;
use crate::status::TaskStatus;

/// What a cancel request does to a task in a given status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CancelDecision {
    /// `queued`: cancelled at once (`→ cancelled` + `response.cancelled`), 200.
    CancelledNow,
    /// `loading`/`running`: the worker must stop (`→ cancelling` + `response.cancelling`), 202.
    CancellingNow,
    /// `cancelling`: nothing new, 202.
    AlreadyCancelling,
    /// `cancelled`: nothing new, 200.
    AlreadyCancelled,
    /// `completed`/`failed`: nothing, 409 `task_not_cancellable`.
    NotCancellable,
}

/// How a cancel request is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CancelReply {
    /// 200 with the task: it is cancelled.
    Cancelled,
    /// 202 with the task: it will be cancelled once the worker stops.
    Accepted,
    /// 409 `task_not_cancellable`.
    NotCancellable,
}

impl CancelDecision {
    /// How the request is answered.
    pub const fn reply(self) -> CancelReply {
        match self {
            CancelDecision::CancelledNow | CancelDecision::AlreadyCancelled => {
                CancelReply::Cancelled
            }
            CancelDecision::CancellingNow | CancelDecision::AlreadyCancelling => {
                CancelReply::Accepted
            }
            CancelDecision::NotCancellable => CancelReply::NotCancellable,
        }
    }

    /// The status after the cancel, or `None` when the task cannot be cancelled.
    pub const fn new_status(self) -> Option<TaskStatus> {
        match self {
            CancelDecision::CancelledNow | CancelDecision::AlreadyCancelled => {
                Some(TaskStatus::Cancelled)
            }
            CancelDecision::CancellingNow | CancelDecision::AlreadyCancelling => {
                Some(TaskStatus::Cancelling)
            }
            CancelDecision::NotCancellable => None,
        }
    }

    /// The event the cancel appends, if any.
    pub const fn event(self) -> Option<EventPayload> {
        match self {
            CancelDecision::CancelledNow => Some(EventPayload::Cancelled),
            CancelDecision::CancellingNow => Some(EventPayload::Cancelling),
            _ => None,
        }
    }

    /// Whether a worker may be running the task and must be told to stop.
    pub const fn stops_worker(self) -> bool {
        matches!(
            self,
            CancelDecision::CancellingNow | CancelDecision::AlreadyCancelling
        )
    }
}

/// Decides a cancel request from the task's status.
pub const fn decide_cancel(status: TaskStatus) -> CancelDecision {
    match status {
        TaskStatus::Queued => CancelDecision::CancelledNow,
        TaskStatus::Loading | TaskStatus::Running => CancelDecision::CancellingNow,
        TaskStatus::Cancelling => CancelDecision::AlreadyCancelling,
        TaskStatus::Cancelled => CancelDecision::AlreadyCancelled,
        TaskStatus::Completed | TaskStatus::Failed => CancelDecision::NotCancellable,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// P-4: the cancel table, cell by cell.
    #[test]
    fn cancel_decisions_follow_the_table_of_api_section_4_p4() {
        let table = [
            (
                TaskStatus::Queued,
                Some(TaskStatus::Cancelled),
                CancelReply::Cancelled,
                true,
            ),
            (
                TaskStatus::Loading,
                Some(TaskStatus::Cancelling),
                CancelReply::Accepted,
                true,
            ),
            (
                TaskStatus::Running,
                Some(TaskStatus::Cancelling),
                CancelReply::Accepted,
                true,
            ),
            (
                TaskStatus::Cancelling,
                Some(TaskStatus::Cancelling),
                CancelReply::Accepted,
                false,
            ),
            (
                TaskStatus::Cancelled,
                Some(TaskStatus::Cancelled),
                CancelReply::Cancelled,
                false,
            ),
            (
                TaskStatus::Completed,
                None,
                CancelReply::NotCancellable,
                false,
            ),
            (TaskStatus::Failed, None, CancelReply::NotCancellable, false),
        ];
        for (status, new_status, reply, writes_event) in table {
            let decision = decide_cancel(status);
            assert_eq!(decision.new_status(), new_status, "{status}");
            assert_eq!(decision.reply(), reply, "{status}");
            assert_eq!(decision.event().is_some(), writes_event, "{status}");
        }
    }
}
