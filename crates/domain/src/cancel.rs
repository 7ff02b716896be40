//! The cancel decision (P-4): what a cancel request does to a task in each status.

use crate::event::EventPayload;
use crate::ids::ClientId;
use crate::ports::CancelOutcome;
use crate::status::TaskStatus;
use crate::task::Task;
use crate::time::Timestamp;
use crate::transition::{advance, Refusal, Step};
use crate::writes::TaskWrite;

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

/// A decided cancel: how it is answered, and what it writes (`None`: nothing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CancelPlan {
    /// The answer: the decision with the task as it is after the cancel, or `NotFound`.
    pub outcome: CancelOutcome,
    /// The task's new row with the cancel's event, and its snapshot dropped when the cancel
    /// finished it; written as a compare-and-set on the task as read.
    pub write: Option<TaskWrite<'static>>,
}

/// P-4, I-3, I-7: a cancel request by `client` (`None`: the service itself) on the task as read
/// at `at`. Another client's task is not found; the [`decide_cancel`] cells that write nothing
/// answer with the task as read; the others advance it by [`Step::RequestCancel`] on behalf of
/// its owner. A refusal of that step would contradict the cancel table: the adapter reports it
/// as a store that makes no sense.
pub fn plan_cancel(
    task: &Task,
    client: Option<ClientId>,
    at: Timestamp,
) -> Result<CancelPlan, Refusal> {
    if !task.visible_to(client) {
        return Ok(CancelPlan {
            outcome: CancelOutcome::NotFound,
            write: None,
        });
    }
    let decision = decide_cancel(task.status);
    if decision.event().is_none() {
        return Ok(CancelPlan {
            outcome: CancelOutcome::Decided {
                decision,
                task: task.clone(),
            },
            write: None,
        });
    }
    let write = TaskWrite::from_advanced(advance(task, &Step::RequestCancel, task.owner, at)?);
    Ok(CancelPlan {
        outcome: CancelOutcome::Decided {
            decision,
            task: write.task.clone(),
        },
        write: Some(write),
    })
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
