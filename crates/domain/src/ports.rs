//! The ports: what the app needs from the outside world, as `async_trait` traits over domain
//! types only. Adapters (`lmsp-storage-sqlite`, `lmsp-engine-reference`, …) implement them.
//!
//! The storage port is split by concern and combined into [`Store`]. Each method of
//! [`TaskStore`] that writes is **one transaction** in which the adapter reads the current row,
//! asks the domain ([`crate::transition::advance`], [`crate::recovery::recover`],
//! [`crate::cancel::decide_cancel`]) and writes exactly what the domain returns, or reports the
//! refusal as a value. `Err` is only for the storage itself failing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::auth::{Client, Pairing, SecretHash};
use crate::cancel::CancelDecision;
use crate::event::Event;
use crate::idempotency::{IdempotencyKey, IdempotencyRecord, IdempotencyScope};
use crate::ids::{ClientId, ResponseId, ServiceId, TaskId};
use crate::model::{FileFingerprint, ModelId, ModelRecord};
use crate::recovery::{RestartPolicy, StartEpoch};
use crate::status::TaskStatus;
use crate::task::{Response, Task, TaskSpec, Usage};
use crate::time::Timestamp;
use crate::transition::{Refusal, Step};

/// A failure of the storage itself (never an expected outcome such as a refused step).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The disk is full; nothing of the failed command was written.
    #[error("the storage is full")]
    Full,
    /// The database could not be read or written (I/O error, locked too long, closed).
    #[error("the storage is unavailable: {0}")]
    Unavailable(String),
    /// A stored row could not be understood.
    #[error("the storage holds data it cannot read: {0}")]
    Corrupt(String),
}

/// The live fan-out: told about events after, and only after, their transaction committed.
pub trait CommittedEvents: Send + Sync {
    /// Called once per commit with the events it made durable, in log order per task.
    /// Must not block: implementations hand the events on and return.
    fn committed(&self, events: &[Event]);

    /// Called once per transaction the adapter tried to commit, with its size and how long it
    /// took, whether or not it committed (for metrics). Must not block. Does nothing by default.
    fn transaction_measured(&self, _stats: CommitStats) {}
}

/// One transaction of the storage adapter's write path, measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommitStats {
    /// The commands (port calls) the transaction carried (group commit).
    pub commands: usize,
    /// The events it made durable (0 when it did not commit).
    pub events: usize,
    /// From `BEGIN` to the end of `COMMIT` (or of the rollback).
    pub duration: std::time::Duration,
    /// Whether it committed.
    pub committed: bool,
}

/// An engine's resumable state after some output, stored with the output it covers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// The sequence number of the last event this snapshot covers.
    pub sequence_number: u64,
    /// The engine's opaque state.
    pub state: Vec<u8>,
}

/// How `create_task` ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateOutcome {
    /// The task, its `response.created` event and the idempotency record (if any) committed.
    Created(Task),
    /// A record already exists for the idempotency key: nothing was written.
    IdempotencyConflict(IdempotencyRecord),
}

/// How a step on a task ended.
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
        /// The decision of API.md §4.
        decision: CancelDecision,
        /// The task as it is now.
        task: Task,
    },
    /// No such task (or not the caller's).
    NotFound,
}

/// Which tasks to list.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TaskFilter {
    /// Only this client's tasks; `None` for all (admin).
    pub client_id: Option<ClientId>,
    /// Only these statuses; empty for all.
    pub statuses: Vec<TaskStatus>,
    /// Only tasks older than this one (pagination, newest first).
    pub before: Option<TaskId>,
    /// At most this many (the adapter fetches one more to know `has_more`).
    pub limit: usize,
}

/// A page of a list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page<T> {
    /// The items.
    pub items: Vec<T>,
    /// Whether more follow.
    pub has_more: bool,
}

/// What a startup recovery did (P-7…P-11).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RecoveryReport {
    /// Tasks moved (each with one event and `restarts + 1`).
    pub moved: u64,
    /// Tasks left untouched (`queued` under `retry`/`resume`).
    pub untouched: u64,
    /// Tasks moved to `running` + `response.resumed`, oldest first: the worker continues them.
    pub resumed: Vec<TaskId>,
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
    /// and, when given, its idempotency record, in one transaction. When a record already exists
    /// for the record's scope and key, writes nothing and returns it.
    async fn create_task(
        &self,
        task: Task,
        idempotency: Option<IdempotencyRecord>,
    ) -> Result<CreateOutcome, StoreError>;

    /// P-3, I-2: applies `steps` in order to the task (each through
    /// [`crate::transition::advance`]) and stores the new status, `last_sequence_number` and events
    /// in one transaction, with `snapshot` when given. All or nothing: if the domain refuses any
    /// step, nothing is written and the refusal is returned.
    async fn append(
        &self,
        task_id: TaskId,
        steps: Vec<Step>,
        snapshot: Option<Snapshot>,
        at: Timestamp,
    ) -> Result<StepOutcome, StoreError>;

    /// Finishes a task (`Complete`, `Fail` or `AcknowledgeCancel`): like [`TaskStore::append`], and
    /// with `Complete` also stores the response; drops the task's snapshot.
    async fn finish(
        &self,
        task_id: TaskId,
        step: Step,
        at: Timestamp,
    ) -> Result<StepOutcome, StoreError>;

    /// Claims the oldest `queued` task (creation order): `queued → loading` with
    /// `response.loading`, atomically against a concurrent cancel. Drops any old snapshot.
    async fn claim_next(&self, at: Timestamp) -> Result<Option<Task>, StoreError>;

    /// P-4, I-3: decides and applies a cancel in one transaction, atomically against a concurrent
    /// finish. `client_id` restricts it to that client's tasks (`None`: any task).
    async fn cancel(
        &self,
        task_id: TaskId,
        client_id: Option<ClientId>,
        at: Timestamp,
    ) -> Result<CancelOutcome, StoreError>;

    /// P-7…P-11, I-5: moves every leftover task per [`crate::recovery::recover`], each move with its
    /// event in one transaction, in batches; runs to completion. Running it again in the same start
    /// changes nothing.
    async fn recover_leftovers(
        &self,
        start: StartEpoch,
        at: Timestamp,
    ) -> Result<RecoveryReport, StoreError>;

    /// P-5, P-6, I-4: removes at most `batch` finished tasks with `finished_at < cutoff`, oldest
    /// first, with their events, response, snapshot and idempotency records, in one short
    /// transaction. An adapter may take fewer to keep the transaction short (a bound on events);
    /// [`PurgeReport::more`] says whether to call again. Never touches an unfinished task.
    async fn purge_finished(
        &self,
        cutoff: Timestamp,
        batch: usize,
    ) -> Result<PurgeReport, StoreError>;

    /// A task by id.
    async fn task(&self, task_id: TaskId) -> Result<Option<Task>, StoreError>;

    /// Tasks, newest first.
    async fn list_tasks(&self, filter: TaskFilter) -> Result<Page<Task>, StoreError>;

    /// Events of a task with `sequence_number > after`, ascending, at most `limit`.
    async fn events(
        &self,
        task_id: TaskId,
        after: u64,
        limit: usize,
    ) -> Result<Page<Event>, StoreError>;

    /// A stored response by id.
    async fn response(&self, response_id: ResponseId) -> Result<Option<Response>, StoreError>;

    /// The task's latest snapshot, if any.
    async fn snapshot(&self, task_id: TaskId) -> Result<Option<Snapshot>, StoreError>;

    /// How many tasks are in each status.
    async fn count_by_status(&self) -> Result<Vec<(TaskStatus, u64)>, StoreError>;
}

/// How redeeming a pairing code ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Redemption {
    /// The code was used up and the client stored.
    Paired,
    /// The code exists but does not grant every requested scope; nothing changed.
    ScopesNotGranted,
    /// No unexpired code has this hash (wrong, used or expired); nothing changed.
    NoSuchCode,
}

/// Paired clients and pairing codes.
#[async_trait]
pub trait ClientStore: Send + Sync {
    /// Stores a new client.
    async fn insert_client(&self, client: Client) -> Result<(), StoreError>;
    /// The unrevoked client whose token has this hash.
    async fn client_by_token_hash(&self, hash: SecretHash) -> Result<Option<Client>, StoreError>;
    /// Every client, oldest first.
    async fn list_clients(&self) -> Result<Vec<Client>, StoreError>;
    /// Revokes a client; `false` when there is no such unrevoked client.
    async fn revoke_client(&self, client_id: ClientId, at: Timestamp) -> Result<bool, StoreError>;
    /// Stores a pairing code (hashed).
    async fn insert_pairing(&self, pairing: Pairing) -> Result<(), StoreError>;
    /// Redeems a pairing code in one transaction: when an unexpired code with this hash exists
    /// and grants every scope `client` asks for, deletes the code (one use) and stores the
    /// client. A code that does not grant the scopes stays usable.
    async fn redeem_pairing(
        &self,
        code_hash: SecretHash,
        client: Client,
        at: Timestamp,
    ) -> Result<Redemption, StoreError>;
    /// Deletes every outstanding pairing code (after too many wrong tries).
    async fn burn_pairings(&self) -> Result<u64, StoreError>;
}

/// Registered models (metadata only, P-1).
#[async_trait]
pub trait ModelStore: Send + Sync {
    /// Stores a model; `false` (and nothing written) when the id exists.
    async fn insert_model(&self, model: ModelRecord) -> Result<bool, StoreError>;
    /// A model by id.
    async fn model(&self, model_id: &ModelId) -> Result<Option<ModelRecord>, StoreError>;
    /// Every model, by id.
    async fn list_models(&self) -> Result<Vec<ModelRecord>, StoreError>;
    /// Deletes a model record; `false` when there is none.
    async fn delete_model(&self, model_id: &ModelId) -> Result<bool, StoreError>;
    /// Records a re-hashed file's fingerprint.
    async fn update_model_file(
        &self,
        model_id: &ModelId,
        file: FileFingerprint,
    ) -> Result<(), StoreError>;
}

/// Idempotency records (API.md §6).
#[async_trait]
pub trait IdempotencyStore: Send + Sync {
    /// The unexpired record for a key.
    async fn idempotency_record(
        &self,
        scope: &IdempotencyScope,
        key: &IdempotencyKey,
        at: Timestamp,
    ) -> Result<Option<IdempotencyRecord>, StoreError>;
    /// Stores a record unless one exists; returns the existing one then.
    async fn insert_idempotency_record(
        &self,
        record: IdempotencyRecord,
    ) -> Result<Option<IdempotencyRecord>, StoreError>;
    /// Removes records expired at `at`; returns how many.
    async fn purge_idempotency(&self, at: Timestamp, batch: usize) -> Result<u64, StoreError>;
}

/// The service's identity and settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceIdentity {
    /// `svc_…`, fixed for a data directory.
    pub id: ServiceId,
    /// When the data directory was first used.
    pub created_at: Timestamp,
}

/// What a start learns from the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartInfo {
    /// The identity (the stored one, or the candidate when the store was empty).
    pub identity: ServiceIdentity,
    /// This start's epoch, larger than every earlier one.
    pub epoch: StartEpoch,
    /// Whether this is the first start on this store.
    pub first_start: bool,
}

/// Service identity and start bookkeeping.
#[async_trait]
pub trait ServiceStore: Send + Sync {
    /// Records a start: stores `candidate` as the identity if there is none yet, and takes the next
    /// start epoch, in one transaction.
    async fn begin_start(&self, candidate: ServiceIdentity) -> Result<StartInfo, StoreError>;
}

/// The whole storage port, as the app holds it (`Arc<dyn Store>`).
pub trait Store: TaskStore + ClientStore + ModelStore + IdempotencyStore + ServiceStore {}

impl<T> Store for T where T: TaskStore + ClientStore + ModelStore + IdempotencyStore + ServiceStore {}

/// A source of the current time.
pub trait Clock: Send + Sync {
    /// Now.
    fn now(&self) -> Timestamp;
}

/// A flag a worker raises to tell its engine to stop; cheap to clone and to check.
#[derive(Debug, Clone, Default)]
pub struct CancelFlag(Arc<AtomicBool>);

impl CancelFlag {
    /// A lowered flag.
    pub fn new() -> Self {
        Self::default()
    }
    /// Raises the flag.
    pub fn raise(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
    /// Whether the flag is raised.
    pub fn is_raised(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// Why an engine failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// The model file is missing or unreadable.
    #[error("the model is unavailable: {0}")]
    ModelUnavailable(String),
    /// The model file does not match its stored digest.
    #[error("the model file does not match its digest")]
    DigestMismatch,
    /// Anything else.
    #[error("the engine failed: {0}")]
    Failed(String),
}

/// One item of a generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GenerationItem {
    /// Output text, and the state to resume from right after it.
    Delta {
        /// The text.
        text: String,
        /// The engine state after this text.
        state: Vec<u8>,
    },
    /// The generation noticed its cancel flag and stopped.
    Cancelled,
    /// The generation finished.
    Finished {
        /// Token counts of the whole output (including any part before a resume).
        usage: Usage,
    },
}

/// A running generation: pulled item by item.
#[async_trait]
pub trait Generation: Send {
    /// The next item; after `Finished` or `Cancelled` there is none.
    async fn next_item(&mut self) -> Result<Option<GenerationItem>, EngineError>;
}

/// What a generation is asked to do.
#[derive(Debug, Clone)]
pub struct GenerationJob {
    /// The model (loaded with [`Engine::load`]).
    pub model: ModelRecord,
    /// The task's input, budget and seed.
    pub spec: Arc<TaskSpec>,
    /// When resuming: the state of the snapshot and the text produced before it.
    pub resume: Option<ResumePoint>,
    /// The flag the engine checks between tokens.
    pub cancel: CancelFlag,
}

/// Where a resumed generation continues.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResumePoint {
    /// The snapshot's engine state.
    pub state: Vec<u8>,
    /// The text produced up to the snapshot.
    pub text_so_far: String,
}

/// A model engine.
#[async_trait]
pub trait Engine: Send + Sync {
    /// Loads a model (a no-op when it is loaded already), verifying it as the engine needs.
    async fn load(&self, model: &ModelRecord) -> Result<(), EngineError>;
    /// Starts generating; resumes from `job.resume` when given.
    async fn generate(&self, job: GenerationJob) -> Result<Box<dyn Generation>, EngineError>;
}

/// Why a model file could not be checked or registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelFileError {
    /// The path is outside the models directory, not a regular file, or does not resolve.
    #[error("the path is not a regular file inside the models directory: {0}")]
    PathRejected(String),
    /// The file is missing or unreadable.
    #[error("the model file is unavailable: {0}")]
    Unavailable(String),
    /// The file no longer matches its stored digest.
    #[error("the model file does not match its stored digest")]
    DigestMismatch,
}

/// Model files on disk: hashing and checking; never writes or deletes a user's file.
#[async_trait]
pub trait ModelFiles: Send + Sync {
    /// Resolves `path` (links followed) inside the models directory and hashes it, streaming.
    async fn fingerprint(&self, path: &str) -> Result<FileFingerprint, ModelFileError>;
    /// Checks a registered file: re-hashes only when size or modification time changed. Returns
    /// the fingerprint to store when it was re-hashed and still matches.
    async fn verify(
        &self,
        known: &FileFingerprint,
    ) -> Result<Option<FileFingerprint>, ModelFileError>;
}

/// The policy a task gets when its request names none.
pub fn effective_policy(requested: Option<RestartPolicy>, default: RestartPolicy) -> RestartPolicy {
    requested.unwrap_or(default)
}
