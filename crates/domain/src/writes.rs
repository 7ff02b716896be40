//! What a storage write writes, decided from the rows it read, as data (P-3…P-6).
//!
//! A store's write is "load the rows, ask the domain, write what it says": a step, a claim, a
//! cancel or a recovery comes back as a [`TaskWrite`] (the task's new row, its events, the
//! responses to store and what happens to its snapshot), a delete as a [`DeleteOutcome`], a purge
//! batch as a [`PurgeBatch`]. Each adapter turns these into its own SQL; none decides anything
//! of its own, so two adapters cannot drift apart.

use crate::event::{Event, EventKind, EventPayload};
use crate::idempotency::{IdempotencyRecord, KeyState};
use crate::ids::{ClientId, InstanceId, TaskId};
use crate::ports::{
    DeleteOutcome, FileDeleteOutcome, PurgeReport, RecoveryReport, Snapshot, StepOutcome,
};
use crate::status::TaskStatus;
use crate::task::{Response, Task};
use crate::time::Timestamp;
use crate::transition::{advance, advance_all, Advanced, Refusal, Step};

/// What a write does to a task's stored snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotChange<'a> {
    /// Leave it as it is.
    Keep,
    /// Delete it: the task finished (a snapshot is only for continuing a run), or a new run
    /// starts from nothing.
    Drop,
    /// Store this one in place of any other.
    Put(&'a Snapshot),
}

/// The snapshot change of a write that leaves a task in `status`, with the worker's `offered`
/// snapshot: a finished task keeps none (whatever was offered), an unfinished one stores the
/// offered one, or keeps what it has.
pub fn snapshot_change(status: TaskStatus, offered: Option<&Snapshot>) -> SnapshotChange<'_> {
    match offered {
        _ if status.is_finished() => SnapshotChange::Drop,
        Some(snapshot) => SnapshotChange::Put(snapshot),
        None => SnapshotChange::Keep,
    }
}

/// A task's decided write: the row as it must be stored (a compare-and-set on the row as read),
/// the events to append, the responses to store and the snapshot change, in one transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskWrite<'a> {
    /// The task's new row.
    pub task: Task,
    /// The events to append.
    pub events: Vec<Event>,
    /// The responses to store (a completion's).
    pub responses: Vec<&'a Response>,
    /// What happens to the task's snapshot.
    pub snapshot: SnapshotChange<'a>,
}

impl<'a> TaskWrite<'a> {
    /// The write of a decided step that stores no response and offers no snapshot (a claim's,
    /// a cancel's, a recovery's move): the snapshot dropped when the step finished the task, kept
    /// otherwise (a resumed run continues from it).
    pub fn from_advanced(advanced: Advanced) -> TaskWrite<'a> {
        TaskWrite {
            snapshot: snapshot_change(advanced.task.status, None),
            task: advanced.task,
            events: advanced.events,
            responses: Vec::new(),
        }
    }

    /// How the step is answered once written, and the events to tell the listener.
    pub fn applied(self) -> (StepOutcome, Vec<Event>) {
        let events = self.events.clone();
        (
            StepOutcome::Applied {
                task: self.task,
                events: self.events,
            },
            events,
        )
    }

    /// Whether the write resumes the task (a recovery's `response.resumed`).
    pub fn resumes(&self) -> bool {
        self.events
            .iter()
            .any(|event| event.kind() == EventKind::Resumed)
    }
}

/// I-8: the record stored under a request's key that already answered another request and has
/// not expired at `at`: the request writes nothing and is answered from it.
pub fn answered_key(
    stored: Option<&IdempotencyRecord>,
    at: Timestamp,
) -> Option<&IdempotencyRecord> {
    stored.filter(|record| record.expires_at > at && matches!(record.state, KeyState::Answered(_)))
}

/// What a create writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreatePlan {
    /// The new task's row with its first event (and the request's key record, the caller's).
    Write(TaskWrite<'static>),
    /// Another request already answered under the key: nothing is written; this record answers.
    KeyAnswered(IdempotencyRecord),
}

/// P-2, I-1, I-8: a new task as stored (the row of [`Task::as_created`]) with its
/// `response.created` event (sequence 1); or, when the record stored under the request's key
/// already answered at the task's creation ([`answered_key`]), that record and nothing to write.
pub fn plan_create(task: &Task, stored_key: Option<&IdempotencyRecord>) -> CreatePlan {
    if let Some(answered) = answered_key(stored_key, task.created_at) {
        return CreatePlan::KeyAnswered(answered.clone());
    }
    let task = task.as_created();
    let event = Event {
        task_id: task.id,
        sequence_number: 1,
        created_at: task.created_at,
        payload: EventPayload::Created {
            task: Box::new(task.clone()),
        },
    };
    CreatePlan::Write(TaskWrite {
        task,
        events: vec![event],
        responses: Vec::new(),
        snapshot: SnapshotChange::Keep,
    })
}

/// P-3, I-2: a worker's steps on the task as read, all or nothing (see [`advance_all`]): the
/// completion's response stored, the worker's snapshot stored (dropped when the task finished).
pub fn plan_append<'a>(
    task: &Task,
    steps: &'a [Step],
    by: InstanceId,
    expected: Option<u64>,
    snapshot: Option<&'a Snapshot>,
    at: Timestamp,
) -> Result<TaskWrite<'a>, Refusal> {
    let advanced = advance_all(task, steps, by, expected, at)?;
    let responses = steps
        .iter()
        .filter_map(|step| match step {
            Step::Complete { response } => Some(response.as_ref()),
            _ => None,
        })
        .collect();
    Ok(TaskWrite {
        snapshot: snapshot_change(advanced.task.status, snapshot),
        task: advanced.task,
        events: advanced.events,
        responses,
    })
}

/// A claim of a queued task by `by`: the new run starts from nothing, so any snapshot goes.
pub fn plan_claim(
    task: &Task,
    by: InstanceId,
    at: Timestamp,
) -> Result<TaskWrite<'static>, Refusal> {
    let step = Step::Claim {
        model: task.model.clone(),
    };
    let advanced = advance(task, &step, by, at)?;
    Ok(TaskWrite {
        snapshot: SnapshotChange::Drop,
        ..TaskWrite::from_advanced(advanced)
    })
}

/// P-6: whether deleting the task as read deletes it: only a finished task, and only the
/// caller's (`client`, when given: another client's task does not exist for it, I-7).
pub fn decide_delete(task: &Task, client: Option<ClientId>) -> DeleteOutcome {
    if !task.visible_to(client) {
        DeleteOutcome::NotFound
    } else if task.status.is_finished() {
        DeleteOutcome::Deleted
    } else {
        DeleteOutcome::Unfinished
    }
}

/// Whether deleting a stored file (of `owner`) deletes it: only the caller's (`client`, when
/// given: another client's file does not exist for it, I-7), and never while a batch that has
/// not ended reads it (`in_use`).
pub fn decide_file_delete(
    owner: ClientId,
    client: Option<ClientId>,
    in_use: bool,
) -> FileDeleteOutcome {
    if client.is_some_and(|client| client != owner) {
        FileDeleteOutcome::NotFound
    } else if in_use {
        FileDeleteOutcome::InUse
    } else {
        FileDeleteOutcome::Deleted
    }
}

/// The statuses a purge removes (P-6: never an unfinished one), for an adapter's
/// `status IN (…)`.
pub const PURGED_STATUSES: [TaskStatus; 3] = TaskStatus::FINISHED;

/// How much of a purge's candidates one batch removes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PurgeBatch {
    /// How many of the candidates, from the first.
    pub tasks: usize,
    /// Whether candidates are left for a later batch.
    pub more: bool,
}

impl PurgeBatch {
    /// The batch's report once its tasks were removed with `events` events in all: every task
    /// it took counts, and whether more were left is the batch's own finding.
    pub fn report(&self, events: u64) -> PurgeReport {
        PurgeReport {
            tasks: self.tasks as u64,
            events,
            more: self.more,
        }
    }
}

/// P-5: one bounded purge batch over `candidates` (the event count of each finished task past
/// the cut-off, oldest first; an adapter reads one more than `max_tasks` to know whether more
/// are left): at most `max_tasks` tasks and, past the first, no more than `max_events` events
/// in all, so one transaction stays short whatever the tasks' sizes. The first task is always
/// taken, so a task of more events than the budget is still purged.
pub fn purge_batch(candidates: &[u64], max_tasks: usize, max_events: u64) -> PurgeBatch {
    let mut used: u64 = 0;
    for (index, events) in candidates.iter().copied().enumerate() {
        let over_budget = index > 0 && used.saturating_add(events) > max_events;
        if index >= max_tasks || over_budget {
            return PurgeBatch {
                tasks: index,
                more: true,
            };
        }
        used = used.saturating_add(events);
    }
    PurgeBatch {
        tasks: candidates.len(),
        more: false,
    }
}

/// P-7…P-11: counts one leftover into a recovery's report: moved (and resumed, when its write
/// resumes it) or left untouched (`write` is `None`).
pub fn tally(report: &mut RecoveryReport, task: TaskId, write: Option<&TaskWrite<'_>>) {
    match write {
        None => report.untouched += 1,
        Some(write) => {
            report.moved += 1;
            if write.resumes() {
                report.resumed.push(task);
            }
        }
    }
}
