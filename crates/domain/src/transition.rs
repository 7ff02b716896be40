//! The life of a task as one transition function (P-3, P-4).
//!
//! [`transition`] decides, from a status and a [`Step`], the next status and the events to append,
//! or refuses with a [`Refusal`]. [`advance`] applies that decision to a whole [`Task`]: it numbers
//! the events after the task's `last_sequence_number` and sets the timestamps, error and response
//! id. Storage adapters call [`advance`] inside their transaction and write exactly what it returns,
//! so there is one place where the rules live.

use serde::{Deserialize, Serialize};

use crate::cancel::decide_cancel;
use crate::event::{Event, EventPayload};
use crate::model::ModelId;
use crate::status::TaskStatus;
use crate::task::{Response, Task, TaskError};
use crate::time::Timestamp;

/// Something that can happen to a task while the service runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Step {
    /// A worker takes a queued task and starts loading its model (`queued → loading`).
    ClaimForLoading {
        /// The model being loaded (the `response.loading` data).
        model: ModelId,
    },
    /// The model is loaded and generation starts (`loading → running`).
    Loaded,
    /// The engine produced output (`running → running`).
    Output {
        /// The text.
        delta: String,
    },
    /// The engine finished (`running → completed`).
    Complete {
        /// The stored response.
        response: Box<Response>,
    },
    /// The work failed (`loading|running → failed`).
    Fail {
        /// Why.
        error: TaskError,
    },
    /// A client asked to cancel (see [`decide_cancel`]).
    RequestCancel,
    /// The worker stopped after a cancel (`cancelling → cancelled`).
    AcknowledgeCancel,
}

/// The kind of a [`Step`], without its data (for refusals and logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepKind {
    /// [`Step::ClaimForLoading`].
    ClaimForLoading,
    /// [`Step::Loaded`].
    Loaded,
    /// [`Step::Output`].
    Output,
    /// [`Step::Complete`].
    Complete,
    /// [`Step::Fail`].
    Fail,
    /// [`Step::RequestCancel`].
    RequestCancel,
    /// [`Step::AcknowledgeCancel`].
    AcknowledgeCancel,
}

impl Step {
    /// The kind of this step.
    pub const fn kind(&self) -> StepKind {
        match self {
            Step::ClaimForLoading { .. } => StepKind::ClaimForLoading,
            Step::Loaded => StepKind::Loaded,
            Step::Output { .. } => StepKind::Output,
            Step::Complete { .. } => StepKind::Complete,
            Step::Fail { .. } => StepKind::Fail,
            Step::RequestCancel => StepKind::RequestCancel,
            Step::AcknowledgeCancel => StepKind::AcknowledgeCancel,
        }
    }
}

/// Why a step was refused. Refusals are expected outcomes (a worker lost a race with a cancel, a
/// caller is stale), not failures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, thiserror::Error)]
pub enum Refusal {
    /// The task is finished; finished statuses are absorbing.
    #[error("the task is {status} and accepts no {step:?}")]
    Finished {
        /// Its status.
        status: TaskStatus,
        /// The refused step.
        step: StepKind,
    },
    /// A cancel was accepted: the only way out of `cancelling` is `cancelled` (P-4).
    #[error("the task is cancelling and accepts only the cancel acknowledgement, not {step:?}")]
    CancelPending {
        /// The refused step.
        step: StepKind,
    },
    /// The step does not fit the status (a stale or confused caller).
    #[error("a task in {status} accepts no {step:?}")]
    WrongStatus {
        /// Its status.
        status: TaskStatus,
        /// The refused step.
        step: StepKind,
    },
}

/// What a permitted step does: the new status and the events to append, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    /// The status after the step.
    pub status: TaskStatus,
    /// The events to append; empty when the step changes nothing (a repeated cancel).
    pub events: Vec<EventPayload>,
}

/// Decides a step from a status: the heart of the task state machine.
pub fn transition(status: TaskStatus, step: &Step) -> Result<Transition, Refusal> {
    let kind = step.kind();
    if let Step::RequestCancel = step {
        return cancel_transition(status);
    }
    if status.is_finished() {
        return Err(Refusal::Finished { status, step: kind });
    }
    if status == TaskStatus::Cancelling && kind != StepKind::AcknowledgeCancel {
        return Err(Refusal::CancelPending { step: kind });
    }
    let moved = |status, payload| {
        Ok(Transition {
            status,
            events: vec![payload],
        })
    };
    match (status, step) {
        (TaskStatus::Queued, Step::ClaimForLoading { model }) => moved(
            TaskStatus::Loading,
            EventPayload::Loading {
                model: model.clone(),
            },
        ),
        (TaskStatus::Loading, Step::Loaded) => {
            moved(TaskStatus::Running, EventPayload::InProgress {})
        }
        (TaskStatus::Running, Step::Output { delta }) => moved(
            TaskStatus::Running,
            EventPayload::OutputTextDelta {
                delta: delta.clone(),
            },
        ),
        (TaskStatus::Running, Step::Complete { response }) => moved(
            TaskStatus::Completed,
            EventPayload::Completed {
                response: response.clone(),
            },
        ),
        (TaskStatus::Loading | TaskStatus::Running, Step::Fail { error }) => moved(
            TaskStatus::Failed,
            EventPayload::Failed {
                error: error.clone(),
            },
        ),
        (TaskStatus::Cancelling, Step::AcknowledgeCancel) => {
            moved(TaskStatus::Cancelled, EventPayload::Cancelled {})
        }
        _ => Err(Refusal::WrongStatus { status, step: kind }),
    }
}

fn cancel_transition(status: TaskStatus) -> Result<Transition, Refusal> {
    let decision = decide_cancel(status);
    match decision.new_status() {
        Some(new_status) => Ok(Transition {
            status: new_status,
            events: decision.event().into_iter().collect(),
        }),
        None => Err(Refusal::Finished {
            status,
            step: StepKind::RequestCancel,
        }),
    }
}

/// A task after a permitted step, and the numbered events to store with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Advanced {
    /// The task as it must be stored.
    pub task: Task,
    /// The events to append, numbered after the task's previous `last_sequence_number`.
    pub events: Vec<Event>,
}

/// Applies a step to a task at a time: the new task row and its numbered events (P-3).
///
/// `started_at` is set on the first claim, `finished_at` when the task finishes, `error` on a
/// failure and `response_id` on completion. `last_sequence_number` becomes the last new event's.
pub fn advance(task: &Task, step: &Step, at: Timestamp) -> Result<Advanced, Refusal> {
    let decided = transition(task.status, step)?;
    Ok(apply(task, decided, at))
}

/// Writes a decided transition into a task: shared by [`advance`] and recovery.
pub(crate) fn apply(task: &Task, decided: Transition, at: Timestamp) -> Advanced {
    let mut next = task.clone();
    next.status = decided.status;
    let mut events = Vec::with_capacity(decided.events.len());
    for payload in decided.events {
        match &payload {
            EventPayload::Loading { .. } if next.started_at.is_none() => {
                next.started_at = Some(at);
            }
            EventPayload::Failed { error } => next.error = Some(error.clone()),
            EventPayload::Completed { response } => next.response_id = Some(response.id),
            _ => {}
        }
        next.last_sequence_number += 1;
        events.push(Event {
            task_id: task.id,
            sequence_number: next.last_sequence_number,
            created_at: at,
            payload,
        });
    }
    if next.status.is_finished() && !task.status.is_finished() {
        next.finished_at = Some(at);
    }
    Advanced { task: next, events }
}
