//! The life of a task as one transition function (P-3, P-4).
//!
//! [`transition`] is the state machine: from a status and the kind of a [`Step`], the next
//! status, or a [`Refusal`]. [`advance`] applies a step to a whole [`Task`]: the events it writes
//! (with the output item structure of the log), numbered after the task's
//! `last_sequence_number`, and the timestamps, error and items of the new row. [`advance_all`]
//! folds a worker's batch of steps, refusing steps from an instance that does not own the task
//! or that saw an older log. Storage adapters call these inside their transaction and write
//! exactly what they return, so there is one place where the rules live.

use crate::cancel::decide_cancel;
use crate::event::{CallItem, ClosedItem, Event, EventPayload};
use crate::ids::{InstanceId, ItemId};
use crate::model::ModelId;
use crate::status::TaskStatus;
use crate::task::{ItemStatus, Response, Task, TaskError};
use crate::time::Timestamp;
use crate::tools::TokenLogprob;

/// Something that can happen to a task while the service runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// A worker takes a queued task and starts loading its model (`queued → loading`); the task
    /// passes into the care of the worker's instance.
    Claim {
        /// The model being loaded (the `response.loading` data).
        model: ModelId,
    },
    /// The model is loaded and generation starts (`loading → running`).
    Loaded,
    /// The engine produced output (`running → running`); the run's first output opens its item.
    Output {
        /// The text.
        delta: String,
    },
    /// Output with its tokens' log probabilities (`running → running`), like [`Step::Output`].
    OutputLogprobs {
        /// The text.
        delta: String,
        /// The log probabilities of its tokens.
        logprobs: Vec<TokenLogprob>,
    },
    /// The engine starts a function call (`running → running`): the call opens an item of its
    /// own after the run's message (which stays open until the completion closes it).
    CallStarted {
        /// The function called.
        name: String,
    },
    /// A piece of the open call's arguments (`running → running`).
    CallArguments {
        /// The text.
        delta: String,
    },
    /// The open call is complete (`running → running`): its item is closed.
    CallDone {
        /// The function called.
        name: String,
        /// The whole arguments.
        arguments: String,
    },
    /// The engine finished (`running → completed`): the item is closed and the response stored.
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

/// The kind of a [`Step`], without its data (for the state machine, refusals and logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StepKind {
    /// [`Step::Claim`].
    Claim,
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

impl StepKind {
    /// Every kind.
    pub const ALL: [StepKind; 7] = [
        StepKind::Claim,
        StepKind::Loaded,
        StepKind::Output,
        StepKind::Complete,
        StepKind::Fail,
        StepKind::RequestCancel,
        StepKind::AcknowledgeCancel,
    ];

    /// Whether only the instance that owns the task may take this step (a worker's step); a
    /// cancel may come from any instance, and a claim moves the task into the claimer's care.
    pub const fn needs_owner(self) -> bool {
        !matches!(self, StepKind::Claim | StepKind::RequestCancel)
    }
}

impl Step {
    /// The kind of this step.
    pub const fn kind(&self) -> StepKind {
        match self {
            Step::Claim { .. } => StepKind::Claim,
            Step::Loaded => StepKind::Loaded,
            Step::Output { .. }
            | Step::OutputLogprobs { .. }
            | Step::CallStarted { .. }
            | Step::CallArguments { .. }
            | Step::CallDone { .. } => StepKind::Output,
            Step::Complete { .. } => StepKind::Complete,
            Step::Fail { .. } => StepKind::Fail,
            Step::RequestCancel => StepKind::RequestCancel,
            Step::AcknowledgeCancel => StepKind::AcknowledgeCancel,
        }
    }
}

/// Why a step was refused. Refusals are expected outcomes (a worker lost a race with a cancel, a
/// caller is stale), not failures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
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
    /// A completion carries a response that is not this task's (another id, or another task).
    #[error("the completion carries a response that is not this task's")]
    ForeignResponse,
    /// The step comes from an instance that does not own the task (it was recovered by another).
    #[error("the task is in the care of another instance")]
    NotOwner,
    /// The caller's view of the log is older than the stored one (its earlier write committed
    /// after all, or another writer moved the task).
    #[error("the task's log is at {stored}, not where the caller saw it")]
    Stale {
        /// The stored `last_sequence_number`.
        stored: u64,
    },
}

/// The state machine: the status after a step of `kind` from `status`, or why not.
pub fn transition(status: TaskStatus, kind: StepKind) -> Result<TaskStatus, Refusal> {
    if kind == StepKind::RequestCancel {
        return decide_cancel(status)
            .new_status()
            .ok_or(Refusal::Finished { status, step: kind });
    }
    if status.is_finished() {
        return Err(Refusal::Finished { status, step: kind });
    }
    if status == TaskStatus::Cancelling && kind != StepKind::AcknowledgeCancel {
        return Err(Refusal::CancelPending { step: kind });
    }
    match (status, kind) {
        (TaskStatus::Queued, StepKind::Claim) => Ok(TaskStatus::Loading),
        (TaskStatus::Loading, StepKind::Loaded) => Ok(TaskStatus::Running),
        (TaskStatus::Running, StepKind::Output) => Ok(TaskStatus::Running),
        (TaskStatus::Running, StepKind::Complete) => Ok(TaskStatus::Completed),
        (TaskStatus::Loading | TaskStatus::Running, StepKind::Fail) => Ok(TaskStatus::Failed),
        (TaskStatus::Cancelling, StepKind::AcknowledgeCancel) => Ok(TaskStatus::Cancelled),
        _ => Err(Refusal::WrongStatus { status, step: kind }),
    }
}

/// What a permitted step does: the new status and the events to append, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    /// The status after the step.
    pub status: TaskStatus,
    /// The events to append; empty when the step changes nothing (a repeated cancel).
    pub events: Vec<EventPayload>,
}

/// The events a permitted step writes, with the output structure of the log.
fn events_of(task: &Task, step: &Step) -> Vec<EventPayload> {
    let open = task.items.open_item(task.id);
    let opening = || {
        let item = task.items.next_item(task.id);
        [
            EventPayload::OutputItemAdded { item },
            EventPayload::ContentPartAdded { item },
        ]
    };
    match step {
        Step::Claim { model } => vec![EventPayload::Loading {
            model: model.clone(),
        }],
        Step::Loaded => vec![EventPayload::InProgress],
        Step::Output { delta } => {
            let mut events = Vec::with_capacity(3);
            let item = match open {
                Some(item) => item,
                None => {
                    events.extend(opening());
                    task.items.next_item(task.id)
                }
            };
            events.push(EventPayload::OutputTextDelta {
                item,
                delta: delta.clone(),
            });
            events
        }
        Step::OutputLogprobs { delta, logprobs } => {
            let mut events = Vec::with_capacity(3);
            let item = match open {
                Some(item) => item,
                None => {
                    events.extend(opening());
                    task.items.next_item(task.id)
                }
            };
            events.push(EventPayload::OutputTextLogprobs {
                item,
                delta: delta.clone(),
                logprobs: logprobs.clone(),
            });
            events
        }
        Step::CallStarted { name } => vec![EventPayload::FunctionCallAdded {
            item: task.items.next_item(task.id),
            name: name.clone(),
        }],
        Step::CallArguments { delta } => vec![EventPayload::FunctionCallArgumentsDelta {
            item: open.unwrap_or_else(|| last_item(task)),
            delta: delta.clone(),
        }],
        Step::CallDone { name, arguments } => {
            let call = CallItem {
                item: open.unwrap_or_else(|| last_item(task)),
                name: name.clone(),
                arguments: arguments.clone(),
            };
            vec![
                EventPayload::FunctionCallArgumentsDone(call.clone()),
                EventPayload::FunctionCallDone(call),
            ]
        }
        Step::Complete { response } => {
            let mut events = Vec::with_capacity(6);
            // A run that made calls has a message only when it wrote text before them: the item
            // before its first call, closed now like any message.
            let item = match (response.calls.first(), open) {
                (None, Some(item)) => Some(item),
                (None, None) => {
                    events.extend(opening());
                    Some(task.items.next_item(task.id))
                }
                (Some(first), _) => first
                    .item
                    .previous()
                    .filter(|_| !response.output_text.is_empty()),
            };
            if let Some(item) = item {
                events.extend(closing(item, &response.output_text));
            }
            events.push(EventPayload::Completed {
                response: response.clone(),
            });
            events
        }
        Step::Fail { error } => vec![EventPayload::Failed {
            error: error.clone(),
        }],
        Step::RequestCancel => decide_cancel(task.status).event().into_iter().collect(),
        Step::AcknowledgeCancel => vec![EventPayload::Cancelled],
    }
}

/// The events that close a message item as completed with `text`.
fn closing(item: ItemId, text: &str) -> [EventPayload; 3] {
    let closed = ClosedItem {
        item,
        text: text.to_owned(),
        status: ItemStatus::Completed,
    };
    [
        EventPayload::OutputTextDone(closed.clone()),
        EventPayload::ContentPartDone(closed.clone()),
        EventPayload::OutputItemDone(closed),
    ]
}

/// The last item `task` opened (the first, when it opened none).
fn last_item(task: &Task) -> ItemId {
    ItemId::of(task.id, task.items.opened.saturating_sub(1))
}

/// A task after permitted steps, and the numbered events to store with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Advanced {
    /// The task as it must be stored.
    pub task: Task,
    /// The events to append, numbered after the task's previous `last_sequence_number`.
    pub events: Vec<Event>,
}

/// Applies a step to a task at a time: the new task row and its numbered events (P-3).
///
/// A claim moves the task into the care of `claimer` and sets `started_at` the first time;
/// a finishing step sets `finished_at`; a failure sets `error`; output opens and completion closes
/// the run's output item. `last_sequence_number` becomes the last new event's.
pub fn advance(
    task: &Task,
    step: &Step,
    claimer: InstanceId,
    at: Timestamp,
) -> Result<Advanced, Refusal> {
    let status = transition(task.status, step.kind())?;
    if let Step::Complete { response } = step {
        if response.id != task.response_id || response.task_id != task.id {
            return Err(Refusal::ForeignResponse);
        }
    }
    let events = events_of(task, step);
    let mut advanced = apply(task, Transition { status, events }, at);
    if step.kind() == StepKind::Claim {
        advanced.task.owner = claimer;
    }
    Ok(advanced)
}

/// Applies a worker's batch of steps in order, all or nothing: each step through [`advance`], and
/// every step that needs the owner refused unless `by` owns the task. When `expected` is given,
/// the task's stored `last_sequence_number` must equal it (the log is where the worker saw it).
pub fn advance_all(
    task: &Task,
    steps: &[Step],
    by: InstanceId,
    expected: Option<u64>,
    at: Timestamp,
) -> Result<Advanced, Refusal> {
    if let Some(expected) = expected {
        if expected != task.last_sequence_number {
            return Err(Refusal::Stale {
                stored: task.last_sequence_number,
            });
        }
    }
    let mut current = Advanced {
        task: task.clone(),
        events: Vec::with_capacity(steps.len()),
    };
    for step in steps {
        if step.kind().needs_owner() && current.task.owner != by {
            // A finished task refuses as finished, whoever asks: the more telling answer.
            transition(current.task.status, step.kind())?;
            return Err(Refusal::NotOwner);
        }
        let next = advance(&current.task, step, by, at)?;
        current.task = next.task;
        current.events.extend(next.events);
    }
    Ok(current)
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
            EventPayload::OutputItemAdded { .. } => {
                next.items.opened += 1;
                next.items.open = true;
            }
            EventPayload::FunctionCallAdded { .. } => {
                next.items.opened += 1;
                next.items.open = true;
            }
            EventPayload::OutputItemDone(_) | EventPayload::FunctionCallDone(_) => {
                next.items.open = false;
            }
            EventPayload::Failed { error } => next.error = Some(error.clone()),
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
