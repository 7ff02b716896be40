//! The contract, written down from docs/api.md independently of the domain's own tables: which step
//! each status accepts and what follows (docs/api.md, docs/events.md), the events a step writes with the output item
//! structure of the log (docs/events.md), the cancel table (docs/api.md, P-4) and the recovery table (docs/rules.md, P-7…P-11).
//!
//! The tests compare the domain with this transcription cell by cell; where the two disagree,
//! one of them misreads docs/api.md. Only the domain's vocabulary (statuses, step kinds, refusals,
//! payloads) is borrowed, never one of its decisions.

// Each test binary that includes this module uses its own part of it.
#![allow(dead_code)]

use lmsp_domain::event::{CallItem, ClosedItem, EventKind, EventPayload, QueueReason};
use lmsp_domain::ids::{InstanceId, ItemId};
use lmsp_domain::recovery::{Move, RestartPolicy};
use lmsp_domain::task::{ItemStatus, Task, TaskError};
use lmsp_domain::transition::{Refusal, Step, StepKind};
use lmsp_domain::{CancelReply, Event, TaskErrorCode, TaskStatus, Timestamp};

// ---------------------------------------------------------------------------------------------
// The state machine (docs/api.md: statuses and the cancel table; docs/events.md: the events of a run).
// ---------------------------------------------------------------------------------------------

/// The status a task is in after a step of `step` from `status`, or the refusal the contract
/// predicts: a finished task refuses everything as finished (its cancel is answered 409, or
/// "nothing new" for `cancelled`); a `cancelling` task accepts only the acknowledgement (and a
/// repeated cancel that changes nothing); any other step that does not fit is a wrong status.
pub fn next_status(status: TaskStatus, step: StepKind) -> Result<TaskStatus, Refusal> {
    use StepKind::{AcknowledgeCancel, Claim, Complete, Fail, Loaded, Output, RequestCancel};
    use TaskStatus::{Cancelled, Cancelling, Completed, Failed, Loading, Queued, Running};
    let accepted = match (status, step) {
        // A worker takes a queued task and loads its model; every run goes through `loading`.
        (Queued, Claim) => Some(Loading),
        (Loading, Loaded) => Some(Running),
        (Running, Output) => Some(Running),
        (Running, Complete) => Some(Completed),
        (Loading | Running, Fail) => Some(Failed),
        // docs/api.md, the cancel table.
        (Queued, RequestCancel) => Some(Cancelled),
        (Loading | Running, RequestCancel) => Some(Cancelling),
        (Cancelling, RequestCancel) => Some(Cancelling),
        (Cancelled, RequestCancel) => Some(Cancelled),
        // "the worker stops, then → cancelled + response.cancelled".
        (Cancelling, AcknowledgeCancel) => Some(Cancelled),
        _ => None,
    };
    accepted.ok_or(match status {
        Completed | Failed | Cancelled => Refusal::Finished { status, step },
        Cancelling => Refusal::CancelPending { step },
        Queued | Loading | Running => Refusal::WrongStatus { status, step },
    })
}

/// Whether a step is a worker's, which only the instance in whose care the task is may take
/// (ARCHITECTURE.md: claims carry an owner instance). A claim passes the task into the claimer's
/// care and a cancel may come from any instance.
pub fn is_worker_step(step: StepKind) -> bool {
    matches!(
        step,
        StepKind::Loaded
            | StepKind::Output
            | StepKind::Complete
            | StepKind::Fail
            | StepKind::AcknowledgeCancel
    )
}

/// The refusal a step from instance `by` gets, or `None` when it is accepted: the status decides
/// first (a finished task refuses as finished, whoever asks), then the owner.
pub fn refusal_for(
    status: TaskStatus,
    owner: InstanceId,
    step: StepKind,
    by: InstanceId,
) -> Option<Refusal> {
    match next_status(status, step) {
        Err(refusal) => Some(refusal),
        Ok(_) if is_worker_step(step) && owner != by => Some(Refusal::NotOwner),
        Ok(_) => None,
    }
}

/// The payloads an accepted `step` writes (docs/events.md), given the status it is taken in, the run's
/// open output item (if any) and the item a run opens next.
///
/// A run's first output opens its item and content part in the delta's transaction; later output
/// is a delta of the open item. Completion closes the item (`output_text.done`,
/// `content_part.done`, `output_item.done` with status `completed` and the response's text)
/// just before `response.completed`, opening it first when the run produced no output.
pub fn expected_events(
    status: TaskStatus,
    open_item: Option<ItemId>,
    next_item: ItemId,
    step: &Step,
) -> Vec<EventPayload> {
    let mut events = Vec::new();
    let item_of_the_run = |events: &mut Vec<EventPayload>| match open_item {
        Some(item) => item,
        None => {
            events.push(EventPayload::OutputItemAdded { item: next_item });
            events.push(EventPayload::ContentPartAdded { item: next_item });
            next_item
        }
    };
    match step {
        Step::Claim { model } => events.push(EventPayload::Loading {
            model: model.clone(),
        }),
        Step::Loaded => events.push(EventPayload::InProgress),
        Step::Output { delta } => {
            let item = item_of_the_run(&mut events);
            events.push(EventPayload::OutputTextDelta {
                item,
                delta: delta.clone(),
            });
        }
        Step::OutputLogprobs { delta, logprobs } => {
            let item = item_of_the_run(&mut events);
            events.push(EventPayload::OutputTextLogprobs {
                item,
                delta: delta.clone(),
                logprobs: logprobs.clone(),
            });
        }
        // A call opens an item of its own; its arguments and its end are about the open item
        // (the last one opened).
        Step::CallStarted { name } => events.push(EventPayload::FunctionCallAdded {
            item: next_item,
            name: name.clone(),
        }),
        Step::CallArguments { delta } => events.push(EventPayload::FunctionCallArgumentsDelta {
            item: open_item.unwrap_or(next_item.previous().unwrap_or(next_item)),
            delta: delta.clone(),
        }),
        Step::CallDone { name, arguments } => {
            let call = CallItem {
                item: open_item.unwrap_or(next_item.previous().unwrap_or(next_item)),
                name: name.clone(),
                arguments: arguments.clone(),
            };
            events.push(EventPayload::FunctionCallArgumentsDone(call.clone()));
            events.push(EventPayload::FunctionCallDone(call));
        }
        Step::Complete { response } => {
            let item = item_of_the_run(&mut events);
            let closed = ClosedItem {
                item,
                text: response.output_text.clone(),
                status: ItemStatus::Completed,
            };
            events.push(EventPayload::OutputTextDone(closed.clone()));
            events.push(EventPayload::ContentPartDone(closed.clone()));
            events.push(EventPayload::OutputItemDone(closed));
            events.push(EventPayload::Completed {
                response: response.clone(),
            });
        }
        Step::Fail { error } => events.push(EventPayload::Failed {
            error: error.clone(),
        }),
        Step::RequestCancel => match status {
            TaskStatus::Queued => events.push(EventPayload::Cancelled),
            TaskStatus::Loading | TaskStatus::Running => events.push(EventPayload::Cancelling),
            // `cancelling` / `cancelled`: "nothing new".
            _ => {}
        },
        Step::AcknowledgeCancel => events.push(EventPayload::Cancelled),
    }
    events
}

/// A task's open output item and the item its next run opens, read from its row.
pub fn items_of(task: &Task) -> (Option<ItemId>, ItemId) {
    let open = (task.items.open && task.items.opened > 0)
        .then(|| ItemId::of(task.id, task.items.opened - 1));
    (open, ItemId::of(task.id, task.items.opened))
}

/// Numbers `payloads` after the task's last event, as they must be stored (P-3).
pub fn numbered(task: &Task, payloads: Vec<EventPayload>, at: Timestamp) -> Vec<Event> {
    payloads
        .into_iter()
        .zip(task.last_sequence_number + 1..)
        .map(|(payload, sequence_number)| Event {
            task_id: task.id,
            sequence_number,
            created_at: at,
            payload,
        })
        .collect()
}

/// The row after `events` were written to `task` (P-3): the last sequence number, the items they
/// open and close, and the time it finished if it did now.
pub fn row_after(task: &Task, status: TaskStatus, events: &[Event], at: Timestamp) -> Task {
    let mut row = task.clone();
    row.status = status;
    row.last_sequence_number += events.len() as u64;
    for event in events {
        match &event.payload {
            EventPayload::OutputItemAdded { .. } => {
                row.items.opened += 1;
                row.items.open = true;
            }
            EventPayload::OutputItemDone(_) => row.items.open = false,
            EventPayload::Failed { error } => row.error = Some(error.clone()),
            _ => {}
        }
    }
    if status.is_finished() && !task.status.is_finished() {
        row.finished_at = Some(at);
    }
    row
}

/// What one step must do to a task, written from the contract: the new row and its numbered
/// events, or the refusal. `by` is the instance taking the step; the owner is checked when
/// `check_owner` (a worker's batch), and a claim passes the task into `by`'s care, setting
/// `started_at` the first time only.
pub fn expected_step(
    task: &Task,
    step: &Step,
    by: InstanceId,
    check_owner: bool,
    at: Timestamp,
) -> Result<(Task, Vec<Event>), Refusal> {
    let status = next_status(task.status, step.kind())?;
    if check_owner && is_worker_step(step.kind()) && task.owner != by {
        return Err(Refusal::NotOwner);
    }
    // A task has exactly one response id: a completion must carry the task's own response.
    if let Step::Complete { response } = step {
        if response.id != task.response_id || response.task_id != task.id {
            return Err(Refusal::ForeignResponse);
        }
    }
    let (open, next) = items_of(task);
    let events = numbered(task, expected_events(task.status, open, next, step), at);
    let mut row = row_after(task, status, &events, at);
    if step.kind() == StepKind::Claim {
        row.owner = by;
        row.started_at = row.started_at.or(Some(at));
    }
    Ok((row, events))
}

/// What a worker's batch must do (the store's `append`): refused as stale when the caller saw
/// another log than the stored one; else every step in order, all or nothing.
pub fn expected_batch(
    task: &Task,
    steps: &[Step],
    by: InstanceId,
    expected: Option<u64>,
    at: Timestamp,
) -> Result<(Task, Vec<Event>), Refusal> {
    if expected.is_some_and(|seen| seen != task.last_sequence_number) {
        return Err(Refusal::Stale {
            stored: task.last_sequence_number,
        });
    }
    let mut row = task.clone();
    let mut events = Vec::new();
    for step in steps {
        let (next, written) = expected_step(&row, step, by, true, at)?;
        row = next;
        events.extend(written);
    }
    Ok((row, events))
}

// ---------------------------------------------------------------------------------------------
// The cancel table (docs/api.md, P-4).
// ---------------------------------------------------------------------------------------------

/// One row of docs/api.md's cancel table: the status after the cancel (`None`: nothing, 409), the
/// reply, the event it writes, and whether a worker may be running the task and must stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CancelRow {
    /// The status after the cancel.
    pub new_status: Option<TaskStatus>,
    /// 200, 202 or 409.
    pub reply: CancelReply,
    /// The event written, if any.
    pub event: Option<EventKind>,
    /// Whether the worker must be told to stop.
    pub stops_worker: bool,
}

/// docs/api.md, row by row.
pub fn api_section_4_cancel(status: TaskStatus) -> CancelRow {
    use TaskStatus::{Cancelled, Cancelling, Completed, Failed, Loading, Queued, Running};
    let row = |new_status, reply, event, stops_worker| CancelRow {
        new_status,
        reply,
        event,
        stops_worker,
    };
    match status {
        // | `queued` | → `cancelled` + `response.cancelled` | 200, task |
        Queued => row(
            Some(Cancelled),
            CancelReply::Cancelled,
            Some(EventKind::Cancelled),
            false,
        ),
        // | `loading`, `running` | → `cancelling` + `response.cancelling`; the worker stops | 202 |
        Loading | Running => row(
            Some(Cancelling),
            CancelReply::Accepted,
            Some(EventKind::Cancelling),
            true,
        ),
        // | `cancelling` / `cancelled` | nothing new | 202 / 200, task |
        // (a cancelling task's worker is still stopping: it is told again.)
        Cancelling => row(Some(Cancelling), CancelReply::Accepted, None, true),
        Cancelled => row(Some(Cancelled), CancelReply::Cancelled, None, false),
        // | `completed`, `failed` | nothing | 409 `task_not_cancellable` |
        Completed | Failed => row(None, CancelReply::NotCancellable, None, false),
    }
}

// ---------------------------------------------------------------------------------------------
// The recovery table (docs/rules.md, P-7…P-11), with the item rule of docs/events.md.
// ---------------------------------------------------------------------------------------------

/// What docs/rules.md says one cell does: `None` for "untouched, no event", else the new status, the
/// event kind, whether the engine continues from the snapshot, and whether an open output item
/// is closed as incomplete first (docs/events.md: "when recovery puts a run back in the queue, its open item
/// gets `response.output_item.done` with status `incomplete` in the same transaction as
/// `response.queued`").
pub type Cell = Option<(TaskStatus, EventKind, bool, bool)>;

/// docs/rules.md, row by row (plus the finished statuses, which are not leftovers: P-7).
pub fn api_section_7(status: TaskStatus, policy: RestartPolicy) -> Cell {
    use RestartPolicy::{Fail, Resume, Retry};
    use TaskStatus::{Cancelled, Cancelling, Completed, Failed, Loading, Queued, Running};
    match (status, policy) {
        // | `queued` | `failed` + `response.failed` (`server_restarted`) | stays `queued`, no event | same |
        (Queued, Fail) => Some((Failed, EventKind::Failed, false, false)),
        (Queued, Retry | Resume) => None,
        // | `loading` | `failed` + `response.failed` | `queued` + `response.queued` | same |
        (Loading, Fail) => Some((Failed, EventKind::Failed, false, false)),
        (Loading, Retry | Resume) => Some((Queued, EventKind::Queued, false, true)),
        // | `running` | `failed` | `queued` + `response.queued` | `running` + `response.resumed` |
        (Running, Fail) => Some((Failed, EventKind::Failed, false, false)),
        (Running, Retry) => Some((Queued, EventKind::Queued, false, true)),
        (Running, Resume) => Some((Running, EventKind::Resumed, true, false)),
        // | `cancelling` | `cancelled` + `response.cancelled` | same | same |
        (Cancelling, _) => Some((Cancelled, EventKind::Cancelled, false, false)),
        (Completed | Failed | Cancelled, _) => None,
    }
}

/// The cell as the domain's [`Move`].
pub fn expected_move(status: TaskStatus, policy: RestartPolicy) -> Move {
    match api_section_7(status, policy) {
        None => Move::Untouched,
        Some((new_status, event, resumes, closes)) => Move::Moved {
            status: new_status,
            event,
            // P-9: a move to `failed` carries `server_restarted`; no other move has a code.
            error_code: (event == EventKind::Failed).then_some(TaskErrorCode::ServerRestarted),
            // docs/rules.md: "each move that writes an event … increments `task.restarts`".
            increments_restarts: true,
            resumes_from_snapshot: resumes,
            closes_open_item: closes,
        },
    }
}

/// What recovery by `rescuer` must write for `task` (P-8…P-11): nothing for a finished task, a
/// task already in the rescuer's care or an untouched cell; else the new row (in the rescuer's
/// care, `restarts + 1`) with its events in one transaction: the open item closed as incomplete
/// with `open_item_text` when the cell requeues the run, then the cell's event.
pub fn expected_recovery(
    task: &Task,
    rescuer: InstanceId,
    snapshot_covers: Option<u64>,
    open_item_text: &str,
    at: Timestamp,
) -> Option<(Task, Vec<Event>)> {
    if task.status.is_finished() || task.owner == rescuer {
        return None;
    }
    let (status, event, _resumes, closes) = api_section_7(task.status, task.on_restart)?;
    let mut payloads = Vec::new();
    if let (true, (Some(item), _)) = (closes, items_of(task)) {
        payloads.push(EventPayload::OutputItemDone(ClosedItem {
            item,
            text: open_item_text.to_owned(),
            status: ItemStatus::Incomplete,
        }));
    }
    payloads.push(match event {
        EventKind::Failed => EventPayload::Failed {
            error: TaskError::server_restarted(),
        },
        EventKind::Queued => EventPayload::Queued {
            reason: QueueReason::ServerRestarted,
        },
        EventKind::Resumed => EventPayload::Resumed {
            from_sequence_number: snapshot_covers.unwrap_or(task.last_sequence_number),
        },
        _ => EventPayload::Cancelled,
    });
    let events = numbered(task, payloads, at);
    let mut row = row_after(task, status, &events, at);
    row.restarts += 1;
    row.owner = rescuer;
    Some((row, events))
}
