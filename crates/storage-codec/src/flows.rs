//! The flows both adapters run with the same shape (load the rows, ask the domain, write what it
//! says), written once over [`Rows`] and the row-access traits beside it, which each adapter
//! implements over its own connection or transaction. The SQL is this crate's ([`crate::sql`],
//! with `$N` placeholders); what stays the adapters' is where the databases differ: how a read
//! locks the rows it goes on to change ([`Rows::LOCK`]), how a value ([`Param`]) is bound, which
//! candidates a purge picks, what a lost race means ([`KeyRows`]).
//!
//! One flow, two drivers: PostgreSQL implements the traits over its transaction, with real
//! awaits; SQLite implements them over its connection with bodies that never wait, and drives a
//! flow with [`run_ready`] (its futures never pend, so a flow is done when first polled).

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use lmsp_domain::auth::{Client, SecretHash};
use lmsp_domain::batch::BatchStatus;
use lmsp_domain::cancel::plan_cancel;
use lmsp_domain::event::Event;
use lmsp_domain::idempotency::{
    decide, settle, IdempotencyKey, IdempotencyRecord, IdempotencyScope, KeyClaim, KeyDecision,
    StoredReply,
};
use lmsp_domain::ids::{BatchId, ClientId, FileId, InstanceId, TaskId};
use lmsp_domain::model::{ModelId, ModelRecord};
use lmsp_domain::ports::{
    CancelOutcome, CreateOutcome, DeleteOutcome, FileDeleteOutcome, KeyedInsert, PurgeReport,
    Redemption, Snapshot, StepOutcome,
};
use lmsp_domain::schedule::QueueLimits;
use lmsp_domain::task::{Response, Task};
use lmsp_domain::time::Timestamp;
use lmsp_domain::transition::Step;
use lmsp_domain::writes::{
    answered_key, decide_delete, decide_file_delete, plan_append, plan_claim, plan_create,
    purge_batch, CreatePlan, SnapshotChange, TaskWrite,
};

use crate::batches::{batch_key, file_key};
use crate::columns::ReadRow;
use crate::pairing::{plan_redemption, PAIRING_LIMIT_KEY};
use crate::query::Param;
use crate::records::{IdempotencyRow, ModelRow};
use crate::rows::{key_of, ulid_of};
use crate::{sql, DbError};

/// Statements and row reads inside one transaction, as a shared flow runs them: the row access
/// every flow needs.
///
/// One flow, two drivers: PostgreSQL implements this over its transaction, its futures awaiting
/// the server; SQLite over its connection, with bodies that never wait, so that its futures never
/// pend and it runs a flow to its end with [`run_ready`]. `async fn` with static dispatch (each
/// adapter's own type, no `dyn`): nothing is boxed, and a flow's future is `Send` where the
/// adapter's is.
#[allow(async_fn_in_trait)] // Static dispatch only: each use names the adapter's type.
pub trait Rows {
    /// The adapter's error; a stored row that makes no sense converts into it.
    type Error: From<DbError>;

    /// Appended to a read of the rows a flow goes on to change, so that they cannot change under
    /// it: PostgreSQL locks them to the transaction's end (` FOR UPDATE`); SQLite adds nothing,
    /// its one writer running one transaction at a time.
    const LOCK: &'static str;

    /// Appended to a read whose rows must not change before the transaction ends, though it
    /// changes none of them (PostgreSQL's ` FOR SHARE`).
    const SHARE: &'static str;

    /// The `accepted_by` of a task row that stores none, as a shared read decodes the row
    /// ([`crate::TaskRow::decode`]): SQLite's rows of the first release were accepted by its
    /// legacy instance; `None`, by the task's owner.
    const ACCEPTED_BY_DEFAULT: Option<&'static [u8]>;

    /// Runs a statement of [`crate::sql`]; how many rows it changed.
    async fn execute(&self, sql: &str, params: &[Param]) -> Result<u64, Self::Error>;

    /// Runs a read of at most one row, read as `T`.
    async fn read_one<T: ReadRow>(
        &self,
        sql: &str,
        params: &[Param],
    ) -> Result<Option<T>, Self::Error>;

    /// Runs a read, each of its rows read as `T`.
    async fn read_all<T: ReadRow>(
        &self,
        sql: &str,
        params: &[Param],
    ) -> Result<Vec<T>, Self::Error>;
}

/// The record writes of the idempotency flows (I-8): what a write that found a record appeared
/// meanwhile means is the store's.
#[allow(async_fn_in_trait)] // Static dispatch only: each use names the adapter's type.
pub trait KeyRows: Rows {
    /// Writes a record ([`crate::ops::put_record`]); `existed` says whether [`stored_record`]
    /// found one under its key in this transaction (PostgreSQL runs the transaction again when
    /// one appeared meanwhile).
    async fn put_record(
        &self,
        record: &IdempotencyRecord,
        existed: bool,
    ) -> Result<(), Self::Error>;
}

/// Row access that runs SQL ([`Rows`]) and makes the task writes ([`TaskWrites`]), with one
/// error: what the task flows that run SQL of their own need.
pub trait TaskRows: Rows + TaskWrites<Error = <Self as Rows>::Error> {}

impl<R: Rows + TaskWrites<Error = <R as Rows>::Error>> TaskRows for R {}

/// The writes of a task's decided step, as a store makes them: where [`Rows`] runs SQL on a
/// transaction, a store that decides a whole batch of commands before it writes any (PostgreSQL's
/// group commit) implements this over the rows it read, collecting statements; the steps' flows
/// ([`append`], [`cancel`], [`claim`]) and [`write_task`] are written once over it.
#[allow(async_fn_in_trait)] // Static dispatch only: each use names the adapter's type.
pub trait TaskWrites {
    /// The adapter's error; a stored row that makes no sense converts into it.
    type Error: From<DbError>;

    /// A task as read for a write, its row locked until the transaction ends where the store
    /// locks (and as the earlier writes of the transaction left it).
    async fn task_to_write(&self, id: TaskId) -> Result<Option<Task>, Self::Error>;

    /// Writes a task's new row as a compare-and-set on the row as read (`old`), and its events.
    async fn write_advanced(
        &self,
        old: &Task,
        new: &Task,
        events: &[Event],
    ) -> Result<(), Self::Error>;

    /// Stores a response, in place of any under its id.
    async fn put_response(&self, response: &Response) -> Result<(), Self::Error>;

    /// Stores a task's snapshot, in place of any other.
    async fn put_snapshot(&self, task: TaskId, snapshot: &Snapshot) -> Result<(), Self::Error>;

    /// Drops a task's snapshot.
    async fn drop_snapshot(&self, task: TaskId) -> Result<(), Self::Error>;

    /// Records that a claim served `client` at `at` (fairness between clients).
    async fn mark_served(&self, client: ClientId, at: Timestamp) -> Result<(), Self::Error>;
}

/// The reads and writes of a task's creation (P-2, I-1, I-8), beside [`TaskWrites`].
#[allow(async_fn_in_trait)] // Static dispatch only: each use names the adapter's type.
pub trait CreateRows: TaskWrites {
    /// The record stored under the key of `record`, expired or not, its row locked where the
    /// store locks.
    async fn stored_key(
        &self,
        record: &IdempotencyRecord,
    ) -> Result<Option<IdempotencyRecord>, Self::Error>;

    /// The client's `max_queued`, if it has one.
    async fn max_queued(&self, client: ClientId) -> Result<Option<u32>, Self::Error>;

    /// How many tasks submitted one by one are queued: the client's and the store's, each
    /// counted at most up to its limit in `limits` (a store may count nothing where none is).
    async fn queued(
        &self,
        client: ClientId,
        limits: QueueLimits,
    ) -> Result<(u64, u64), Self::Error>;

    /// Inserts a new task's rows with its first events, and the request's key record if it has
    /// a key (`existed`: [`CreateRows::stored_key`] found one under it).
    async fn insert_created(
        &self,
        write: &TaskWrite<'_>,
        record: Option<&IdempotencyRecord>,
        existed: bool,
    ) -> Result<(), Self::Error>;
}

/// Runs a flow over row access whose futures never pend (SQLite's connection, the rows a batch
/// read) to its end, in place. One that pends is a bug, reported as an error rather than left
/// half done.
pub fn run_ready<T, E: From<DbError>>(flow: impl Future<Output = Result<T, E>>) -> Result<T, E> {
    match pin!(flow).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(result) => result,
        Poll::Pending => Err(crate::corrupt(
            "a shared storage flow waited, over row access that never waits",
        )
        .into()),
    }
}

/// A client's stored key as a bound value.
fn client_param(id: ClientId) -> Param {
    Param::Blob(key_of(id.ulid()).to_vec())
}

/// The values of a key's three columns: client `$1`, operation `$2`, key `$3`.
fn key_params(scope: &IdempotencyScope, key: &IdempotencyKey) -> [Param; 3] {
    [
        client_param(scope.client_id),
        Param::Text(scope.operation.as_str().to_owned()),
        Param::Text(key.as_str().to_owned()),
    ]
}

/// The record stored under a key, expired or not, its row locked ([`Rows::LOCK`]).
pub async fn stored_record<R: Rows>(
    rows: &R,
    scope: &IdempotencyScope,
    key: &IdempotencyKey,
) -> Result<Option<IdempotencyRecord>, R::Error> {
    let sql = format!("{}{}", sql::idempotency_record(), R::LOCK);
    let row: Option<IdempotencyRow> = rows.read_one(&sql, &key_params(scope, key)).await?;
    Ok(row.map(|row| row.decode(scope, key)).transpose()?)
}

/// I-8: decides a request under its key; holds the key when it proceeds.
pub async fn claim_key<R: KeyRows>(
    rows: &R,
    claim: &KeyClaim,
    now: Timestamp,
) -> Result<KeyDecision, R::Error> {
    let stored = stored_record(rows, &claim.scope, &claim.key).await?;
    let decision = decide(stored.as_ref(), &claim.digest, now);
    if decision == KeyDecision::Proceed {
        rows.put_record(&claim.pending_record(now), stored.is_some())
            .await?;
    }
    Ok(decision)
}

/// P-1, I-8: a model and its key's answered record, in one transaction; nothing when another
/// request answered under the key meanwhile or the id is taken.
pub async fn insert_model_with_key<R: KeyRows>(
    rows: &R,
    model: &ModelRecord,
    record: &IdempotencyRecord,
) -> Result<KeyedInsert, R::Error> {
    let stored = stored_record(rows, &record.scope, &record.key).await?;
    if let Some(answered) = answered_key(stored.as_ref(), record.created_at) {
        return Ok(KeyedInsert::KeyAnswered(answered.clone()));
    }
    if !insert_model(rows, model).await? {
        return Ok(KeyedInsert::Taken);
    }
    rows.put_record(record, stored.is_some()).await?;
    Ok(KeyedInsert::Inserted)
}

/// I-8: keeps a final reply with its key while the key still keeps `expected` ([`settle`]).
pub async fn settle_key<R: KeyRows>(
    rows: &R,
    scope: &IdempotencyScope,
    key: &IdempotencyKey,
    expected: &StoredReply,
    reply: StoredReply,
) -> Result<bool, R::Error> {
    let stored = stored_record(rows, scope, key).await?;
    match settle(stored.as_ref(), expected, reply) {
        Some(record) => {
            rows.put_record(&record, true).await?;
            Ok(true)
        }
        None => Ok(false),
    }
}

/// Ends a key's hold: a pending record goes, an answered one stays.
pub async fn release_key<R: Rows>(
    rows: &R,
    scope: &IdempotencyScope,
    key: &IdempotencyKey,
) -> Result<(), R::Error> {
    let params = key_params(scope, key);
    rows.execute(sql::DELETE_PENDING_KEY, &params).await?;
    rows.execute(sql::UNHOLD_KEY, &params).await?;
    Ok(())
}

/// Ends every hold of a stopped instance: its pending records go, its answered ones replay.
pub async fn release_holds_of<R: Rows>(rows: &R, instance: InstanceId) -> Result<(), R::Error> {
    let params = [Param::Blob(key_of(instance.ulid()).to_vec())];
    rows.execute(sql::DELETE_PENDING_KEYS_OF, &params).await?;
    rows.execute(sql::UNHOLD_KEYS_OF, &params).await?;
    Ok(())
}

/// P-1: stores a model unless the id exists; a stored model's file is no longer one whose model
/// a user deleted.
pub async fn insert_model<R: Rows>(rows: &R, model: &ModelRecord) -> Result<bool, R::Error> {
    let row = ModelRow::encode(model)?;
    let inserted = crate::ops::insert_model_row(rows, &row).await?;
    if inserted {
        if let Some(path) = &row.path {
            let params = [Param::Text(path.clone())];
            rows.execute(sql::FORGET_REMOVED_MODEL_FILE, &params)
                .await?;
        }
    }
    Ok(inserted)
}

/// Stores a model found at startup unless its id exists or its file's model was deleted.
pub async fn insert_found_model<R: Rows>(rows: &R, model: &ModelRecord) -> Result<bool, R::Error> {
    if let Some(file) = model.file() {
        let sql = format!("{}{}", sql::REMOVED_MODEL_FILE, R::SHARE);
        let removed: Option<i64> = rows
            .read_one(&sql, &[Param::Text(file.path.clone())])
            .await?;
        if removed.is_some() {
            return Ok(false);
        }
    }
    insert_model(rows, model).await
}

/// Deletes a model (its row locked first), remembering its file so that a scan at startup does
/// not bring it back.
pub async fn delete_model<R: Rows>(rows: &R, id: &ModelId) -> Result<bool, R::Error> {
    let id = [Param::Text(id.as_str().to_owned())];
    let sql = format!("{}{}", sql::model_by_id(), R::LOCK);
    let Some(found) = rows.read_one::<ModelRow>(&sql, &id).await? else {
        return Ok(false);
    };
    if let Some(file) = found.decode()?.file() {
        let path = [Param::Text(file.path.clone())];
        rows.execute(sql::REMEMBER_REMOVED_MODEL_FILE, &path)
            .await?;
    }
    Ok(rows.execute(sql::DELETE_MODEL, &id).await? == 1)
}

/// Removes one task's rows (`id` its stored key); its idempotency records stay, pointing at
/// nothing (a key outlives its task and keeps its reply until it expires). How many events went.
pub async fn delete_task_rows<R: Rows>(rows: &R, id: &[u8]) -> Result<u64, R::Error> {
    let key = [Param::Blob(id.to_vec())];
    let events = rows.execute(sql::DELETE_TASK_EVENTS, &key).await?;
    for statement in sql::DELETE_TASK_ROWS {
        rows.execute(statement, &key).await?;
    }
    Ok(events)
}

/// Deletes one finished task now (P-6: never an unfinished one, the domain's [`decide_delete`]
/// on the task as read and locked).
pub async fn delete_finished<R: TaskRows>(
    rows: &R,
    task_id: TaskId,
    client_id: Option<ClientId>,
) -> Result<DeleteOutcome, <R as Rows>::Error> {
    let Some(task) = rows.task_to_write(task_id).await? else {
        return Ok(DeleteOutcome::NotFound);
    };
    let outcome = decide_delete(&task, client_id);
    if outcome == DeleteOutcome::Deleted {
        delete_task_rows(rows, &key_of(task_id.ulid())).await?;
    }
    Ok(outcome)
}

/// One bounded purge batch (P-5, P-6, I-4): of `candidates` (finished tasks past the retention,
/// oldest first, each one's stored key and event count, as the adapter picks and locks them), as
/// many as the domain's [`purge_batch`] takes, so one transaction stays short whatever the tasks'
/// sizes.
pub async fn purge_finished<R: Rows>(
    rows: &R,
    candidates: &[(Vec<u8>, u64)],
    max_tasks: usize,
    max_events: u64,
) -> Result<PurgeReport, R::Error> {
    let sizes: Vec<u64> = candidates.iter().map(|(_, events)| *events).collect();
    let batch = purge_batch(&sizes, max_tasks, max_events);
    let mut events = 0;
    for (id, _) in candidates.iter().take(batch.tasks) {
        events += delete_task_rows(rows, id).await?;
    }
    Ok(batch.report(events))
}

/// Redeems a pairing code under the pairing limit, all in the current transaction: the limit's
/// row and the code's are read (and locked) first, so redemptions take their turn, and what
/// [`plan_redemption`] returns is written.
pub async fn redeem_pairing<R: Rows>(
    rows: &R,
    hash: &SecretHash,
    client: &Client,
    at: Timestamp,
) -> Result<Redemption, R::Error> {
    let limit_key = Param::Text(PAIRING_LIMIT_KEY.to_owned());
    let sql = format!("{}{}", sql::CONFIG_VALUE, R::LOCK);
    let limit: Option<String> = rows
        .read_one(&sql, std::slice::from_ref(&limit_key))
        .await?;
    let code = Param::Text(hash.to_hex());
    let sql = format!("{}{}", sql::PAIRING_SCOPES, R::LOCK);
    let params = [code.clone(), Param::Integer(at.as_millis())];
    let scopes: Option<String> = rows.read_one(&sql, &params).await?;
    let plan = plan_redemption(limit.as_deref(), scopes.as_deref(), &client.scopes, at)?;
    if let Some(limit) = plan.limit {
        let params = [limit_key, Param::Text(limit)];
        rows.execute(sql::SET_CONFIG_VALUE, &params).await?;
    }
    if plan.burn_codes {
        rows.execute(sql::DELETE_PAIRINGS, &[]).await?;
    }
    if plan.pair {
        rows.execute(sql::DELETE_PAIRING, &[code]).await?;
        crate::ops::insert_client(rows, client).await?;
    }
    Ok(plan.redemption)
}

/// Writes what the domain decided for a task read (and locked) as `old`: its row as a
/// compare-and-set with its events, the responses, the snapshot change.
pub async fn write_task<R: TaskWrites>(
    rows: &R,
    old: &Task,
    write: &TaskWrite<'_>,
) -> Result<(), R::Error> {
    rows.write_advanced(old, &write.task, &write.events).await?;
    for response in &write.responses {
        rows.put_response(response).await?;
    }
    match write.snapshot {
        SnapshotChange::Keep => Ok(()),
        SnapshotChange::Drop => rows.drop_snapshot(old.id).await,
        SnapshotChange::Put(snapshot) => rows.put_snapshot(old.id, snapshot).await,
    }
}

/// P-2, I-1, I-8: the task, its `response.created` event and its idempotency record, as the
/// domain's [`plan_create`] decides from the record stored under the key, unless a queue limit
/// ([`QueueLimits::admit`]) refuses it.
pub async fn create_task<R: CreateRows>(
    rows: &R,
    task: &Task,
    idempotency: Option<&IdempotencyRecord>,
    service_max_queued: Option<u32>,
) -> Result<(CreateOutcome, Vec<Event>), R::Error> {
    let stored = match idempotency {
        Some(record) => rows.stored_key(record).await?,
        None => None,
    };
    let write = match plan_create(task, stored.as_ref()) {
        CreatePlan::Write(write) => write,
        CreatePlan::KeyAnswered(record) => {
            return Ok((CreateOutcome::KeyAnswered(record), Vec::new()))
        }
    };
    let limits = QueueLimits {
        client: rows.max_queued(task.client_id).await?,
        service: service_max_queued,
    };
    if limits.any() {
        let (client_queued, service_queued) = rows.queued(task.client_id, limits).await?;
        if let Err(full) = limits.admit(client_queued, service_queued) {
            return Ok((CreateOutcome::QueueFull(full), Vec::new()));
        }
    }
    rows.insert_created(&write, idempotency, stored.is_some())
        .await?;
    Ok((CreateOutcome::Created(write.task), write.events))
}

/// P-3, I-2: folds a worker's steps through the domain ([`plan_append`]), all or nothing.
pub async fn append<R: TaskWrites>(
    rows: &R,
    task_id: TaskId,
    by: InstanceId,
    expected: Option<u64>,
    steps: &[Step],
    snapshot: Option<&Snapshot>,
    at: Timestamp,
) -> Result<(StepOutcome, Vec<Event>), R::Error> {
    let Some(old) = rows.task_to_write(task_id).await? else {
        return Ok((StepOutcome::NotFound, Vec::new()));
    };
    match plan_append(&old, steps, by, expected, snapshot, at) {
        Ok(write) => {
            write_task(rows, &old, &write).await?;
            Ok(write.applied())
        }
        Err(refusal) => Ok((StepOutcome::Refused { task: old, refusal }, Vec::new())),
    }
}

/// Claims `old`, a queued task read (and locked) for the claim, for `by`, and records when its
/// client was served; the task as claimed and its events.
pub async fn claim<R: TaskWrites>(
    rows: &R,
    old: &Task,
    by: InstanceId,
    at: Timestamp,
) -> Result<(Task, Vec<Event>), R::Error> {
    let write = plan_claim(old, by, at)
        .map_err(|refusal| crate::corrupt(format!("a queued task refused a claim: {refusal}")))?;
    write_task(rows, old, &write).await?;
    rows.mark_served(old.client_id, at).await?;
    Ok((write.task, write.events))
}

/// P-4, I-3: decides ([`plan_cancel`]) and applies a cancel.
pub async fn cancel<R: TaskWrites>(
    rows: &R,
    task_id: TaskId,
    client_id: Option<ClientId>,
    at: Timestamp,
) -> Result<(CancelOutcome, Vec<Event>), R::Error> {
    let Some(old) = rows.task_to_write(task_id).await? else {
        return Ok((CancelOutcome::NotFound, Vec::new()));
    };
    let plan = plan_cancel(&old, client_id, at)
        .map_err(|refusal| crate::corrupt(format!("a cancel was refused: {refusal}")))?;
    let Some(write) = plan.write else {
        return Ok((plan.outcome, Vec::new()));
    };
    write_task(rows, &old, &write).await?;
    Ok((plan.outcome, write.events))
}

/// Replaces a client's limits, `limits` (running, queued) bound as the store keeps them (the
/// column's range is the store's); `false` when there is no such client.
pub async fn set_client_limits<R: Rows>(
    rows: &R,
    id: ClientId,
    limits: [Param; 2],
) -> Result<bool, R::Error> {
    let exists: Option<i64> = rows
        .read_one(sql::CLIENT_EXISTS, &[Param::Text(id.to_string())])
        .await?;
    if exists.is_none() {
        return Ok(false);
    }
    let [running, queued] = limits;
    let params = [client_param(id), running, queued];
    rows.execute(sql::SET_CLIENT_LIMITS, &params).await?;
    Ok(true)
}

/// Removes a file's record unless a batch that has not ended reads it; `client` must own it
/// (I-7: the domain's [`decide_file_delete`]). The file's row is read with [`Rows::LOCK`], so a
/// batch created meanwhile (which locks it first) is seen.
pub async fn delete_file<R: Rows>(
    rows: &R,
    id: FileId,
    client: Option<ClientId>,
) -> Result<FileDeleteOutcome, R::Error> {
    let key = [Param::Blob(file_key(id).to_vec())];
    let sql = format!("SELECT client_id FROM files WHERE id = $1{}", R::LOCK);
    let Some(owner) = rows.read_one::<Vec<u8>>(&sql, &key).await? else {
        return Ok(FileDeleteOutcome::NotFound);
    };
    let sql = format!(
        "SELECT 1 FROM batches WHERE input_file_id = $1 AND status IN ({}) LIMIT 1",
        sql::unfinished_batch_statuses()
    );
    let in_use = rows.read_one::<i64>(&sql, &key).await?.is_some();
    let owner = ClientId::from_ulid(ulid_of(&owner)?);
    let outcome = decide_file_delete(owner, client, in_use);
    if outcome == FileDeleteOutcome::Deleted {
        rows.execute(sql::DELETE_FILE, &key).await?;
    }
    Ok(outcome)
}

/// Whether a batch is `validating` (the one status it starts from), its row read with
/// [`Rows::LOCK`].
pub async fn batch_validating<R: Rows>(rows: &R, id: BatchId) -> Result<bool, R::Error> {
    let sql = format!("SELECT status FROM batches WHERE id = $1{}", R::LOCK);
    let key = [Param::Blob(batch_key(id).to_vec())];
    let status: Option<String> = rows.read_one(&sql, &key).await?;
    Ok(status.as_deref() == Some(BatchStatus::Validating.as_str()))
}
