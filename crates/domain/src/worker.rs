//! What a worker makes of its task as the store holds it: after a refused step, whether to
//! acknowledge a cancel, take the write as done, or leave the task; and what to do with a task
//! recovery handed to its instance to resume. The one place where a worker's race with a cancel
//! (P-4) is interpreted.

use crate::ids::InstanceId;
use crate::status::TaskStatus;
use crate::task::Task;
use crate::transition::Refusal;

/// What a worker does after the store refused its step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AfterRefusal {
    /// A cancel committed and the task is in this worker's care: stop the run and acknowledge
    /// the cancel (P-4). Leaving it would strand the task `cancelling`.
    Acknowledge,
    /// An earlier try of the same write committed after all: the log is exactly where the steps
    /// lead, so the write is done.
    AlreadyApplied,
    /// The task is no longer this worker's to write (it finished, another instance took it, or
    /// its log moved elsewhere): write nothing more.
    Leave,
}

/// Whether `worker`'s instance owes `task` the acknowledgement of a cancel: a cancel was
/// accepted (`cancelling`) while the task is in that instance's care, and only its worker may
/// finish it.
pub fn owes_acknowledgement(task: &Task, worker: InstanceId) -> bool {
    task.status == TaskStatus::Cancelling && task.owner == worker
}

/// What a refused step means for the worker of instance `worker` that asked for it, from the
/// refusal and the task as stored when it was refused.
///
/// `expected` is the `last_sequence_number` the worker's steps lead to, when it wrote them with
/// the log position it saw (an append); `None` for a write without one (a finishing step). A
/// cancel this worker owes wins over everything else: even a stale write (a cancel committed
/// since the worker last looked) leaves the acknowledgement to it.
pub fn after_refusal(
    refusal: Refusal,
    stored: &Task,
    worker: InstanceId,
    expected: Option<u64>,
) -> AfterRefusal {
    if owes_acknowledgement(stored, worker) {
        return AfterRefusal::Acknowledge;
    }
    match refusal {
        Refusal::Stale { stored } if Some(stored) == expected => AfterRefusal::AlreadyApplied,
        _ => AfterRefusal::Leave,
    }
}

/// What a worker does with a task that recovery handed to its instance to resume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Resumed {
    /// Still running in this instance's care: resume the run from its snapshot.
    Run,
    /// Cancelled since recovery, and no worker heard of it: acknowledge the cancel.
    Acknowledge,
    /// Finished, or in another instance's care since: nothing to do here.
    Skip,
}

/// What the worker of instance `worker` does with a resumed task, as stored now.
pub fn resumed(stored: &Task, worker: InstanceId) -> Resumed {
    if owes_acknowledgement(stored, worker) {
        Resumed::Acknowledge
    } else if stored.status == TaskStatus::Running && stored.owner == worker {
        Resumed::Run
    } else {
        Resumed::Skip
    }
}
