//! Tasks, events, responses and snapshots.

use async_trait::async_trait;

use crate::cancel::CancelDecision;
use crate::event::Event;
use crate::idempotency::IdempotencyRecord;
use crate::ids::{ClientId, InstanceId, ResponseId, TaskId};
use crate::model::ModelId;
use crate::ports::StoreError;
use crate::schedule::{QueueFull, TierAging};
use crate::status::TaskStatus;
use crate::task::{Response, Task};
use crate::time::Timestamp;
use crate::transition::{Refusal, Step};

/// An engine's resumable state after some output, stored with the output it covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The sequence number of the last event this snapshot covers.
    pub sequence_number: u64,
    /// The engine's opaque state.
    pub state: Vec<u8>,
}

/// How `create_task` ended.
// `Task` is not boxed: the value is matched at once and returned once per request.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateOutcome {
    /// The task, its `response.created` event and the idempotency record (if any) committed.
    Created(Task),
    /// Another request already answered under the idempotency key: nothing was written.
    KeyAnswered(IdempotencyRecord),
    /// A queue was full: nothing was written.
    QueueFull(QueueFull),
}

/// How a step on a task ended.
// `Task` is not boxed: the value is matched at once and returned once per step.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepOutcome {
    /// The steps were applied and committed; the task as it is now, and the events written.
    Applied {
        /// The task after the steps.
        task: Task,
        /// The events written.
        events: Vec<Event>,
    },
    /// The domain refused a step; nothing was written. The task as it is now.
    Refused {
        /// The task as stored.
        task: Task,
        /// Why.
        refusal: Refusal,
    },
    /// No such task.
    NotFound,
}

/// How a cancel request ended.
// `Task` is not boxed: callers match on `task` directly and the value is returned once per request.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CancelOutcome {
    /// The decision taken and the task after it (unchanged for the "nothing" cells).
    Decided {
        /// The decision.
        decision: CancelDecision,
        /// The task as it is now.
        task: Task,
    },
    /// No such task (or not the caller's).
    NotFound,
}

/// How deleting a finished task ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteOutcome {
    /// The task, its events, response and snapshot are gone.
    Deleted,
    /// The task is unfinished; nothing changed.
    Unfinished,
    /// No such task (or not the caller's).
    NotFound,
}

/// Which tasks to list.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TaskFilter {
    /// Only this client's tasks; `None` for all.
    pub client_id: Option<ClientId>,
    /// Only these statuses; empty for all.
    pub statuses: Vec<TaskStatus>,
    /// Only tasks of this model.
    pub model: Option<ModelId>,
    /// Only tasks older than this one (pagination, newest first).
    pub before: Option<TaskId>,
    /// At most this many (the adapter fetches one more to know `has_more`).
    pub limit: usize,
}

/// The order of a list read by id, its cursor continuing in that order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ListOrder {
    /// Oldest first: a page continues with the ids after its cursor.
    Asc,
    /// Newest first: a page continues with the ids before its cursor.
    #[default]
    Desc,
}

impl ListOrder {
    /// `asc` or `desc`, as OpenAI's list parameters spell it; `None` for anything else.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "asc" => Some(ListOrder::Asc),
            "desc" => Some(ListOrder::Desc),
            _ => None,
        }
    }
}

/// A page of a list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page<T> {
    /// The items.
    pub items: Vec<T>,
    /// Whether more follow.
    pub has_more: bool,
}

impl<T> Page<T> {
    /// The page of a read that fetched up to `limit + 1` items: the first `limit`, and whether
    /// there was one more (it only says that more follow).
    pub fn of_fetched(mut items: Vec<T>, limit: usize) -> Self {
        let has_more = items.len() > limit;
        items.truncate(limit);
        Page { items, has_more }
    }
}

/// What a recovery did (P-7…P-11).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RecoveryReport {
    /// Tasks moved (each with its events and `restarts + 1`), those resumed included.
    pub moved: u64,
    /// Tasks left untouched (`queued` under `retry`/`resume`).
    pub untouched: u64,
    /// Tasks moved to `running` + `response.resumed`, oldest first: the rescuer continues them.
    pub resumed: Vec<TaskId>,
}

impl RecoveryReport {
    /// Adds another part of a recovery to this one.
    pub fn absorb(&mut self, part: RecoveryReport) {
        self.moved += part.moved;
        self.untouched += part.untouched;
        self.resumed.extend(part.resumed);
    }
}

/// What one purge batch removed (P-5, P-6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PurgeReport {
    /// Finished tasks removed, with their events, response and snapshot.
    pub tasks: u64,
    /// Events removed with them.
    pub events: u64,
    /// Whether more tasks past the cut-off were left for a later batch.
    pub more: bool,
}

/// Tasks, events, responses and snapshots.
#[async_trait]
pub trait TaskStore: Send + Sync {
    /// P-2, I-1, I-8: stores a new `queued` task with its `response.created` event (sequence 1)
    /// and, when given, its idempotency record (replacing the key's hold), in one transaction.
    /// When an unexpired record already answered under the key, writes nothing and returns it.
    async fn create_task(
        &self,
        task: Task,
        idempotency: Option<IdempotencyRecord>,
    ) -> Result<CreateOutcome, StoreError> {
        self.create_task_within(task, idempotency, None).await
    }

    /// [`TaskStore::create_task`] under the queue limits: when the task's client has
    /// `max_queued` tasks queued ([`ClientStore::set_client_limits`]) or the store has
    /// `service_max_queued` queued in all, writes nothing and answers
    /// [`CreateOutcome::QueueFull`] (checked after the idempotency key, so a replay is never
    /// refused). On a store shared by several processes, submits racing in different processes
    /// may each see the last free place.
    ///
    /// [`ClientStore::set_client_limits`]: crate::ports::ClientStore::set_client_limits
    async fn create_task_within(
        &self,
        task: Task,
        idempotency: Option<IdempotencyRecord>,
        service_max_queued: Option<u32>,
    ) -> Result<CreateOutcome, StoreError>;

    /// P-3, I-2: applies a worker's `steps` in order to the task through
    /// [`crate::transition::advance_all`] on behalf of instance `by`, which saw the log at
    /// `expected_last_sequence`, and stores the new row and events in one transaction, with
    /// `snapshot` when given. All or nothing: a refused step writes nothing.
    async fn append(
        &self,
        task_id: TaskId,
        by: InstanceId,
        expected_last_sequence: u64,
        steps: Vec<Step>,
        snapshot: Option<Snapshot>,
        at: Timestamp,
    ) -> Result<StepOutcome, StoreError>;

    /// Finishes a task (`Complete`, `Fail` or `AcknowledgeCancel`) on behalf of instance `by`:
    /// like [`TaskStore::append`]; with `Complete` also stores the response; drops the snapshot.
    async fn finish(
        &self,
        task_id: TaskId,
        by: InstanceId,
        step: Step,
        at: Timestamp,
    ) -> Result<StepOutcome, StoreError>;

    /// Claims the next `queued` task for instance `by`: `queued → loading` with
    /// `response.loading`, atomically against a concurrent cancel and other claimers (each task
    /// is claimed once). Drops any old snapshot. The task is the one
    /// [`crate::schedule::next_claim`] picks from every client's queue heads: the most urgent
    /// service tier (moved up by `aging`), then the client with the fewest tasks running, then
    /// the client served least recently, then the oldest; a client at its `max_running` is passed
    /// over. The claim records when its client was served.
    async fn claim(
        &self,
        by: InstanceId,
        at: Timestamp,
        aging: TierAging,
    ) -> Result<Option<Task>, StoreError>;

    /// [`TaskStore::claim`] with the default aging ([`TierAging::DEFAULT`]).
    async fn claim_next(&self, by: InstanceId, at: Timestamp) -> Result<Option<Task>, StoreError> {
        self.claim(by, at, TierAging::DEFAULT).await
    }

    /// P-4, I-3: decides and applies a cancel in one transaction, atomically against a concurrent
    /// finish. `client_id` restricts it to that client's tasks (`None`: any task).
    async fn cancel(
        &self,
        task_id: TaskId,
        client_id: Option<ClientId>,
        at: Timestamp,
    ) -> Result<CancelOutcome, StoreError>;

    /// P-5, P-6, I-4: removes at most `batch` finished tasks with `finished_at < cutoff`, oldest
    /// first, with their events, response and snapshot, in one short transaction; their
    /// idempotency records stay until they expire. An adapter may take fewer to keep the
    /// transaction short (a bound on events); [`PurgeReport::more`] says whether to call again.
    /// Never touches an unfinished task.
    async fn purge_finished(
        &self,
        cutoff: Timestamp,
        batch: usize,
    ) -> Result<PurgeReport, StoreError>;

    /// Removes one finished task with its events, response and snapshot, now (P-6: never an
    /// unfinished one). `client_id` restricts it to that client's tasks.
    async fn delete_finished(
        &self,
        task_id: TaskId,
        client_id: Option<ClientId>,
    ) -> Result<DeleteOutcome, StoreError>;

    /// A task by id.
    async fn task(&self, task_id: TaskId) -> Result<Option<Task>, StoreError>;

    /// The task whose response has this id.
    async fn task_by_response(&self, response_id: ResponseId) -> Result<Option<Task>, StoreError>;

    /// Tasks, newest first.
    async fn list_tasks(&self, filter: TaskFilter) -> Result<Page<Task>, StoreError>;

    /// Events of a task with `sequence_number > after`, ascending, at most `limit`.
    async fn events(
        &self,
        task_id: TaskId,
        after: u64,
        limit: usize,
    ) -> Result<Page<Event>, StoreError>;

    /// The stored response of a completed task.
    async fn response(&self, task_id: TaskId) -> Result<Option<Response>, StoreError>;

    /// The task's latest snapshot, if any.
    async fn snapshot(&self, task_id: TaskId) -> Result<Option<Snapshot>, StoreError>;

    /// How many tasks are in each status.
    async fn count_by_status(&self) -> Result<Vec<(TaskStatus, u64)>, StoreError>;

    /// The `cancelling` tasks in the care of `owner` (the fallback for lost cancel notices).
    async fn cancelling_tasks(&self, owner: InstanceId) -> Result<Vec<TaskId>, StoreError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_keeps_its_limit_and_says_whether_more_follow() {
        assert_eq!(
            Page::of_fetched(vec![1, 2, 3], 2),
            Page {
                items: vec![1, 2],
                has_more: true
            }
        );
        assert_eq!(
            Page::of_fetched(vec![1, 2], 2),
            Page {
                items: vec![1, 2],
                has_more: false
            }
        );
        assert_eq!(
            Page::of_fetched(Vec::<u8>::new(), 0),
            Page {
                items: vec![],
                has_more: false
            }
        );
    }
}
