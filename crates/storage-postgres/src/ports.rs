//! The storage ports of `lmsp_domain::ports` implemented by [`PostgresStore`]: each method one
//! transaction (or one read) on a pooled connection, its events published after the commit.

use std::time::{Duration, Instant};

use crate::batch::{Reply, Request};
use crate::error::DbError;
use crate::{no_events, ops, pg, PostgresStore, LEADER_LOCK};
use async_trait::async_trait;
use lmsp_domain::auth::{Client, Pairing, SecretHash};
use lmsp_domain::batch::{Batch, BatchStatus, DuplicateLine, FilePurpose, StoredFile};
use lmsp_domain::event::Event;
use lmsp_domain::idempotency::{
    IdempotencyKey, IdempotencyRecord, IdempotencyScope, KeyClaim, KeyDecision, StoredReply,
};
use lmsp_domain::ids::{
    BatchId, ClientId, FileId, InstanceId, ResponseId, TaskId, WebhookEndpointId,
};
use lmsp_domain::model::{FileFingerprint, ModelId, ModelRecord};
use lmsp_domain::ports::{
    BatchPurge, BatchStore, CancelOutcome, ClientStore, CreateOutcome, DeleteOutcome,
    FileDeleteOutcome, IdempotencyStore, Initialized, InstanceInfo, InstanceStore, KeyedInsert,
    ListOrder, ModelStore, Page, PurgeReport, RecoveryReport, Redemption, Registration,
    ServiceIdentity, ServiceStore, Snapshot, StepOutcome, StoreError, TaskFilter, TaskStore,
    WebhookStore,
};
use lmsp_domain::schedule::{ClientLimits, TierAging};
use lmsp_domain::status::TaskStatus;
use lmsp_domain::task::{Response, Task};
use lmsp_domain::time::Timestamp;
use lmsp_domain::transition::Step;
use lmsp_domain::webhooks::{Delivery, WebhookEndpoint};
use lmsp_storage_codec::recovery::{recovery_pass, RecoveryBatch};
use tokio_postgres::NoTls;

/// How long an empty claim is tried again while claimable tasks are held by other transactions
/// (`TaskStore::claim`): as long as a worker sleeps after an empty claim.
const CONTENDED_FOR: Duration = Duration::from_secs(1);
/// The first pause before such a claim is made again; it doubles.
const CONTENDED_FIRST_PAUSE: Duration = Duration::from_millis(1);
/// The longest pause between such claims.
const CONTENDED_LAST_PAUSE: Duration = Duration::from_millis(32);

/// A reply of another kind than its request's (a bug of the writer, never a caller's).
fn mismatched(reply: &Reply) -> StoreError {
    StoreError::Unavailable(format!("the writer answered with {reply:?}"))
}

#[async_trait]
impl TaskStore for PostgresStore {
    async fn create_task_within(
        &self,
        task: Task,
        idempotency: Option<IdempotencyRecord>,
        service_max_queued: Option<u32>,
    ) -> Result<CreateOutcome, StoreError> {
        match self
            .writer
            .run(Request::Create {
                task,
                idempotency,
                service_max_queued,
            })
            .await?
        {
            Reply::Created(outcome) => Ok(outcome),
            other => Err(mismatched(&other)),
        }
    }

    async fn append(
        &self,
        task_id: TaskId,
        by: InstanceId,
        expected_last_sequence: u64,
        steps: Vec<Step>,
        snapshot: Option<Snapshot>,
        at: Timestamp,
    ) -> Result<StepOutcome, StoreError> {
        let request = Request::Append {
            task_id,
            by,
            expected: Some(expected_last_sequence),
            steps,
            snapshot,
            at,
        };
        match self.writer.run(request).await? {
            Reply::Stepped(outcome) => Ok(outcome),
            other => Err(mismatched(&other)),
        }
    }

    async fn finish(
        &self,
        task_id: TaskId,
        by: InstanceId,
        step: Step,
        at: Timestamp,
    ) -> Result<StepOutcome, StoreError> {
        let request = Request::Append {
            task_id,
            by,
            expected: None,
            steps: vec![step],
            snapshot: None,
            at,
        };
        match self.writer.run(request).await? {
            Reply::Stepped(outcome) => Ok(outcome),
            other => Err(mismatched(&other)),
        }
    }

    async fn claim(
        &self,
        by: InstanceId,
        at: Timestamp,
        aging: TierAging,
    ) -> Result<Option<Task>, StoreError> {
        // A claim reads the queue's heads `SKIP LOCKED`, so it takes nothing when concurrent
        // claims (another lane's, another instance's) hold every head it read, however many
        // tasks wait behind them; its worker would then sleep until the next wake-up. Such a
        // claim is answered `Held` (its read counted claimable tasks it could not take), and is
        // made again after pauses doubling from 1 ms to 32 ms, as the holders commit, for at
        // most `CONTENDED_FOR`. An empty queue, or one whose clients are all at their
        // `max_running`, answers `None` at once. A claim made later than asked is made at `at`
        // plus the time waited.
        let started = Instant::now();
        let mut pause = CONTENDED_FIRST_PAUSE;
        loop {
            let waited = i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX);
            let request = Request::Claim {
                by,
                at: at.plus_millis(waited),
                aging,
            };
            match self.writer.run(request).await? {
                Reply::Claimed(task) => return Ok(task),
                Reply::Held if started.elapsed() < CONTENDED_FOR => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(CONTENDED_LAST_PAUSE);
                }
                Reply::Held => return Ok(None),
                other => return Err(mismatched(&other)),
            }
        }
    }

    async fn cancel(
        &self,
        task_id: TaskId,
        client_id: Option<ClientId>,
        at: Timestamp,
    ) -> Result<CancelOutcome, StoreError> {
        let request = Request::Cancel {
            task_id,
            client_id,
            at,
        };
        match self.writer.run(request).await? {
            Reply::Cancelled(outcome) => Ok(outcome),
            other => Err(mismatched(&other)),
        }
    }

    async fn purge_finished(
        &self,
        cutoff: Timestamp,
        batch: usize,
    ) -> Result<PurgeReport, StoreError> {
        let max_events = self.options.purge_max_events.max(1);
        self.write(false, move |tx| {
            Box::pin(async move {
                ops::purge::purge_finished(tx, cutoff, batch, max_events)
                    .await
                    .map(no_events)
            })
        })
        .await
    }

    async fn delete_finished(
        &self,
        task_id: TaskId,
        client_id: Option<ClientId>,
    ) -> Result<DeleteOutcome, StoreError> {
        self.write(false, move |tx| {
            Box::pin(async move {
                ops::tasks::delete_finished(tx, task_id, client_id)
                    .await
                    .map(no_events)
            })
        })
        .await
    }

    async fn task(&self, task_id: TaskId) -> Result<Option<Task>, StoreError> {
        let conn = self.readers.conn().await?;
        Ok(ops::load_task(conn.as_ref(), task_id).await?)
    }

    async fn task_by_response(&self, response_id: ResponseId) -> Result<Option<Task>, StoreError> {
        let conn = self.conn().await?;
        Ok(ops::tasks::task_by_response(pg(&conn), response_id).await?)
    }

    async fn list_tasks(&self, filter: TaskFilter) -> Result<Page<Task>, StoreError> {
        let conn = self.conn().await?;
        Ok(ops::tasks::list_tasks(pg(&conn), &filter).await?)
    }

    async fn events(
        &self,
        task_id: TaskId,
        after: u64,
        limit: usize,
    ) -> Result<Page<Event>, StoreError> {
        // Gathered with the other streams' reads, in one statement (one snapshot).
        Ok(self.gathers.events.get((task_id, after, limit)).await?)
    }

    async fn response(&self, task_id: TaskId) -> Result<Option<Response>, StoreError> {
        let conn = self.conn().await?;
        Ok(ops::tasks::response(pg(&conn), task_id).await?)
    }

    async fn snapshot(&self, task_id: TaskId) -> Result<Option<Snapshot>, StoreError> {
        let conn = self.conn().await?;
        Ok(ops::tasks::snapshot(pg(&conn), task_id).await?)
    }

    async fn count_by_status(&self) -> Result<Vec<(TaskStatus, u64)>, StoreError> {
        let conn = self.conn().await?;
        Ok(ops::tasks::count_by_status(pg(&conn)).await?)
    }

    async fn cancelling_tasks(&self, owner: InstanceId) -> Result<Vec<TaskId>, StoreError> {
        let conn = self.conn().await?;
        Ok(ops::tasks::cancelling_tasks(pg(&conn), owner).await?)
    }
}

#[async_trait]
impl ClientStore for PostgresStore {
    async fn insert_client(&self, client: Client) -> Result<(), StoreError> {
        self.write(false, move |tx| {
            let client = client.clone();
            Box::pin(async move {
                ops::clients::insert_client(tx, &client)
                    .await
                    .map(no_events)
            })
        })
        .await
    }

    async fn client_by_token_hash(&self, hash: SecretHash) -> Result<Option<Client>, StoreError> {
        // Gathered with the other lookups of tokens meanwhile, in one statement.
        Ok(self.gathers.tokens.get(hash).await?)
    }

    async fn client(&self, client_id: ClientId) -> Result<Option<Client>, StoreError> {
        let conn = self.conn().await?;
        Ok(ops::clients::client(pg(&conn), client_id).await?)
    }

    async fn list_clients(&self) -> Result<Vec<Client>, StoreError> {
        let conn = self.conn().await?;
        Ok(ops::clients::list_clients(pg(&conn)).await?)
    }

    async fn revoke_client(&self, client_id: ClientId, at: Timestamp) -> Result<bool, StoreError> {
        self.write(false, move |tx| {
            Box::pin(async move {
                ops::clients::revoke_client(tx, client_id, at)
                    .await
                    .map(no_events)
            })
        })
        .await
    }

    async fn client_limits(&self, client_id: ClientId) -> Result<ClientLimits, StoreError> {
        let conn = self.conn().await?;
        Ok(ops::clients::client_limits(pg(&conn), client_id).await?)
    }

    async fn set_client_limits(
        &self,
        client_id: ClientId,
        limits: ClientLimits,
    ) -> Result<bool, StoreError> {
        self.write(false, move |tx| {
            Box::pin(async move {
                ops::clients::set_client_limits(tx, client_id, limits)
                    .await
                    .map(no_events)
            })
        })
        .await
    }

    async fn insert_pairing(&self, pairing: Pairing) -> Result<(), StoreError> {
        self.write(false, move |tx| {
            let pairing = pairing.clone();
            Box::pin(async move {
                ops::clients::insert_pairing(tx, &pairing)
                    .await
                    .map(no_events)
            })
        })
        .await
    }

    async fn redeem_pairing(
        &self,
        code_hash: SecretHash,
        client: Client,
        at: Timestamp,
    ) -> Result<Redemption, StoreError> {
        self.write(false, move |tx| {
            let client = client.clone();
            Box::pin(async move {
                ops::clients::redeem_pairing(tx, &code_hash, &client, at)
                    .await
                    .map(no_events)
            })
        })
        .await
    }
}

#[async_trait]
impl ModelStore for PostgresStore {
    async fn insert_model(&self, model: ModelRecord) -> Result<bool, StoreError> {
        self.write(false, move |tx| {
            let model = model.clone();
            Box::pin(async move { ops::models::insert_model(tx, &model).await.map(no_events) })
        })
        .await
    }

    async fn insert_found_model(&self, model: ModelRecord) -> Result<bool, StoreError> {
        self.write(false, move |tx| {
            let model = model.clone();
            Box::pin(async move {
                ops::models::insert_found_model(tx, &model)
                    .await
                    .map(no_events)
            })
        })
        .await
    }

    async fn model(&self, model_id: &ModelId) -> Result<Option<ModelRecord>, StoreError> {
        // Gathered with the other lookups of models meanwhile, in one statement.
        Ok(self.gathers.models.get(model_id.clone()).await?)
    }

    async fn list_models(&self) -> Result<Vec<ModelRecord>, StoreError> {
        let conn = self.conn().await?;
        Ok(ops::models::list_models(pg(&conn)).await?)
    }

    async fn delete_model(&self, model_id: &ModelId) -> Result<bool, StoreError> {
        let model_id = model_id.clone();
        self.write(false, move |tx| {
            let model_id = model_id.clone();
            Box::pin(async move {
                ops::models::delete_model(tx, &model_id)
                    .await
                    .map(no_events)
            })
        })
        .await
    }

    async fn update_model_file(
        &self,
        model_id: &ModelId,
        file: FileFingerprint,
    ) -> Result<(), StoreError> {
        let model_id = model_id.clone();
        self.write(false, move |tx| {
            let (model_id, file) = (model_id.clone(), file.clone());
            Box::pin(async move {
                ops::models::update_model_file(tx, &model_id, &file)
                    .await
                    .map(no_events)
            })
        })
        .await
    }
}

#[async_trait]
impl IdempotencyStore for PostgresStore {
    async fn claim_key(&self, claim: &KeyClaim, now: Timestamp) -> Result<KeyDecision, StoreError> {
        let claim = claim.clone();
        self.write(false, move |tx| {
            let claim = claim.clone();
            Box::pin(async move {
                ops::idempotency::claim_key(tx, &claim, now)
                    .await
                    .map(no_events)
            })
        })
        .await
    }

    async fn insert_model_with_key(
        &self,
        model: ModelRecord,
        record: IdempotencyRecord,
    ) -> Result<KeyedInsert, StoreError> {
        self.write(false, move |tx| {
            let (model, record) = (model.clone(), record.clone());
            Box::pin(async move {
                ops::idempotency::insert_model_with_key(tx, &model, &record)
                    .await
                    .map(no_events)
            })
        })
        .await
    }

    async fn settle_key(
        &self,
        scope: &IdempotencyScope,
        key: &IdempotencyKey,
        expected: &StoredReply,
        reply: StoredReply,
    ) -> Result<bool, StoreError> {
        let (scope, key, expected) = (scope.clone(), key.clone(), expected.clone());
        self.write(false, move |tx| {
            let (scope, key) = (scope.clone(), key.clone());
            let (expected, reply) = (expected.clone(), reply.clone());
            Box::pin(async move {
                ops::idempotency::settle_key(tx, &scope, &key, &expected, reply)
                    .await
                    .map(no_events)
            })
        })
        .await
    }

    async fn release_key(
        &self,
        scope: &IdempotencyScope,
        key: &IdempotencyKey,
    ) -> Result<(), StoreError> {
        let (scope, key) = (scope.clone(), key.clone());
        self.write(false, move |tx| {
            let (scope, key) = (scope.clone(), key.clone());
            Box::pin(async move {
                ops::idempotency::release_key(tx, &scope, &key)
                    .await
                    .map(no_events)
            })
        })
        .await
    }

    async fn purge_idempotency(&self, at: Timestamp, batch: usize) -> Result<u64, StoreError> {
        self.write(false, move |tx| {
            Box::pin(async move {
                ops::idempotency::purge_idempotency(tx, at, batch)
                    .await
                    .map(no_events)
            })
        })
        .await
    }
}

#[async_trait]
impl InstanceStore for PostgresStore {
    async fn register_instance(&self, instance: InstanceInfo) -> Result<Registration, StoreError> {
        self.write(false, move |tx| {
            let instance = instance.clone();
            Box::pin(async move { ops::instances::register(tx, &instance).await.map(no_events) })
        })
        .await
    }

    async fn renew_lease(
        &self,
        instance: InstanceId,
        lease_until: Timestamp,
        at: Timestamp,
    ) -> Result<bool, StoreError> {
        self.write(false, move |tx| {
            Box::pin(async move {
                ops::instances::renew(tx, instance, lease_until, at)
                    .await
                    .map(no_events)
            })
        })
        .await
    }

    async fn retire_instance(&self, instance: InstanceId, at: Timestamp) -> Result<(), StoreError> {
        self.write(false, move |tx| {
            Box::pin(async move {
                ops::instances::retire(tx, instance, at)
                    .await
                    .map(no_events)
            })
        })
        .await?;
        let mut leadership = self.leadership.lock().await;
        if leadership.holder == Some(instance) {
            // A retired instance leads nothing: closing its session frees the lock for another.
            leadership.give_up();
        }
        Ok(())
    }

    async fn stopped_instances(
        &self,
        me: InstanceId,
        at: Timestamp,
    ) -> Result<Vec<InstanceId>, StoreError> {
        let conn = self.conn().await?;
        Ok(ops::instances::stopped(pg(&conn), me, at).await?)
    }

    async fn recover_instance(
        &self,
        stopped: InstanceId,
        rescuer: InstanceId,
        at: Timestamp,
    ) -> Result<RecoveryReport, StoreError> {
        let limit = self.options.recovery_batch.max(1);
        let first = RecoveryBatch::first(stopped, rescuer, at, limit);
        let report = recovery_pass(first, |batch| {
            self.write(false, move |tx| {
                Box::pin(async move { ops::instances::recover_batch(tx, batch).await })
            })
        })
        .await?;
        self.write(false, move |tx| {
            Box::pin(async move {
                ops::instances::mark_recovered(tx, stopped, at)
                    .await
                    .map(no_events)
            })
        })
        .await?;
        Ok(report)
    }

    async fn lead_maintenance(&self, instance: InstanceId) -> Result<bool, StoreError> {
        let mut leadership = self.leadership.lock().await;
        if leadership
            .conn
            .as_ref()
            .is_some_and(|(client, _)| client.is_closed())
        {
            // The session that held the lock is gone, and the lock with it.
            leadership.give_up();
        }
        if let Some(holder) = leadership.holder {
            if holder != instance {
                return Ok(false);
            }
            let alive = match &leadership.conn {
                Some((client, _)) => client.simple_query("SELECT 1").await.is_ok(),
                None => false,
            };
            if alive {
                return Ok(true);
            }
            leadership.give_up();
        }
        if leadership.conn.is_none() {
            let (client, connection) = self.config.connect(NoTls).await.map_err(DbError::from)?;
            let driver = tokio::spawn(async move {
                let _ = connection.await;
            });
            leadership.conn = Some((client, driver));
        }
        let Some((client, _)) = &leadership.conn else {
            return Ok(false);
        };
        let leads: bool = match client
            .query_one("SELECT pg_try_advisory_lock($1)", &[&LEADER_LOCK])
            .await
        {
            Ok(row) => row.try_get(0).map_err(DbError::from)?,
            Err(error) => {
                leadership.give_up();
                return Err(DbError::from(error).into());
            }
        };
        if leads {
            leadership.holder = Some(instance);
        }
        Ok(leads)
    }
}

#[async_trait]
impl ServiceStore for PostgresStore {
    async fn initialize(
        &self,
        candidate: ServiceIdentity,
        admin: Client,
    ) -> Result<Initialized, StoreError> {
        self.write(false, move |tx| {
            let (candidate, admin) = (candidate.clone(), admin.clone());
            Box::pin(async move {
                ops::service::initialize(tx, &candidate, &admin)
                    .await
                    .map(no_events)
            })
        })
        .await
    }

    async fn check_writable(&self, at: Timestamp) -> Result<(), StoreError> {
        self.write(false, move |tx| {
            Box::pin(async move { ops::service::probe(tx, at).await.map(no_events) })
        })
        .await
    }
}

#[async_trait]
impl BatchStore for PostgresStore {
    async fn insert_file(&self, file: StoredFile) -> Result<(), StoreError> {
        self.write(false, move |tx| {
            let file = file.clone();
            Box::pin(async move { ops::batches::insert_file(tx, &file).await.map(no_events) })
        })
        .await
    }

    async fn file(&self, id: FileId) -> Result<Option<StoredFile>, StoreError> {
        let conn = self.conn().await?;
        Ok(ops::batches::file(pg(&conn), id).await?)
    }

    async fn list_files(
        &self,
        client: Option<ClientId>,
        purpose: Option<FilePurpose>,
        after: Option<FileId>,
        order: ListOrder,
        limit: usize,
    ) -> Result<Page<StoredFile>, StoreError> {
        let conn = self.conn().await?;
        Ok(ops::batches::list_files(pg(&conn), client, purpose, after, order, limit).await?)
    }

    async fn delete_file(
        &self,
        id: FileId,
        client: Option<ClientId>,
    ) -> Result<FileDeleteOutcome, StoreError> {
        self.write(false, move |tx| {
            Box::pin(async move {
                ops::batches::delete_file(tx, id, client)
                    .await
                    .map(no_events)
            })
        })
        .await
    }

    async fn insert_batch(&self, batch: Batch) -> Result<(), StoreError> {
        self.write(false, move |tx| {
            let batch = batch.clone();
            Box::pin(async move { ops::batches::insert_batch(tx, &batch).await.map(no_events) })
        })
        .await
    }

    async fn batch(&self, id: BatchId) -> Result<Option<Batch>, StoreError> {
        let conn = self.conn().await?;
        Ok(ops::batches::batch(pg(&conn), id).await?)
    }

    async fn list_batches(
        &self,
        client: Option<ClientId>,
        before: Option<BatchId>,
        limit: usize,
    ) -> Result<Page<Batch>, StoreError> {
        let conn = self.conn().await?;
        Ok(ops::batches::list_batches(pg(&conn), client, before, limit).await?)
    }

    async fn unfinished_batches(&self, limit: usize) -> Result<Vec<Batch>, StoreError> {
        let conn = self.conn().await?;
        Ok(ops::batches::unfinished_batches(pg(&conn), limit).await?)
    }

    async fn stage_batch_tasks(&self, tasks: Vec<Task>) -> Result<(), StoreError> {
        let tasks = std::sync::Arc::new(tasks);
        self.write(false, move |tx| {
            let tasks = std::sync::Arc::clone(&tasks);
            Box::pin(async move {
                ops::batches::stage_batch_tasks(tx, &tasks)
                    .await
                    .map(no_events)
            })
        })
        .await
    }

    async fn staged_duplicates(
        &self,
        batch: BatchId,
        limit: usize,
    ) -> Result<Vec<DuplicateLine>, StoreError> {
        let conn = self.conn().await?;
        Ok(ops::batches::staged_duplicates(pg(&conn), batch, limit).await?)
    }

    async fn start_batch(&self, started: Batch) -> Result<Option<Batch>, StoreError> {
        let (stored, first) = self
            .write(false, move |tx| {
                let started = started.clone();
                Box::pin(
                    async move { ops::batches::start_batch(tx, &started).await.map(no_events) },
                )
            })
            .await?;
        if let Some(first) = first {
            // After the commit: the other instances hear of the new work as of a create's.
            self.notifier.announce(&self.origin, first, 1);
        }
        Ok(stored)
    }

    async fn update_batch(
        &self,
        from: BatchStatus,
        batch: Batch,
    ) -> Result<Option<Batch>, StoreError> {
        self.write(false, move |tx| {
            let batch = batch.clone();
            Box::pin(async move {
                ops::batches::update_batch(tx, from, &batch)
                    .await
                    .map(no_events)
            })
        })
        .await
    }

    async fn end_batch(
        &self,
        from: BatchStatus,
        batch: Batch,
        files: Vec<StoredFile>,
    ) -> Result<Option<Batch>, StoreError> {
        self.write(false, move |tx| {
            let (batch, files) = (batch.clone(), files.clone());
            Box::pin(async move {
                ops::batches::end_batch(tx, from, &batch, &files)
                    .await
                    .map(no_events)
            })
        })
        .await
    }

    async fn batch_tasks(
        &self,
        batch: BatchId,
        statuses: &[TaskStatus],
        after: u32,
        limit: usize,
    ) -> Result<Vec<Task>, StoreError> {
        let conn = self.conn().await?;
        Ok(ops::batches::batch_tasks(pg(&conn), batch, statuses, after, limit).await?)
    }

    async fn batch_answers(
        &self,
        batch: BatchId,
        after: u32,
        limit: usize,
    ) -> Result<Vec<(Task, Option<Response>)>, StoreError> {
        let conn = self.conn().await?;
        Ok(ops::batches::batch_answers(pg(&conn), batch, after, limit).await?)
    }

    async fn purge_batches(
        &self,
        cutoff: Timestamp,
        batch: usize,
    ) -> Result<BatchPurge, StoreError> {
        self.write(false, move |tx| {
            Box::pin(async move {
                ops::batches::purge_batches(tx, cutoff, batch)
                    .await
                    .map(no_events)
            })
        })
        .await
    }
}

#[async_trait]
impl WebhookStore for PostgresStore {
    async fn insert_endpoint(&self, endpoint: WebhookEndpoint) -> Result<(), StoreError> {
        self.write(false, move |tx| {
            let endpoint = endpoint.clone();
            Box::pin(async move {
                ops::webhooks::insert_endpoint(tx, &endpoint)
                    .await
                    .map(no_events)
            })
        })
        .await
    }

    async fn endpoint(&self, id: WebhookEndpointId) -> Result<Option<WebhookEndpoint>, StoreError> {
        let conn = self.conn().await?;
        Ok(ops::webhooks::endpoint(pg(&conn), id).await?)
    }

    async fn list_endpoints(
        &self,
        before: Option<WebhookEndpointId>,
        limit: usize,
    ) -> Result<Page<WebhookEndpoint>, StoreError> {
        let conn = self.conn().await?;
        Ok(ops::webhooks::list_endpoints(pg(&conn), before, limit).await?)
    }

    async fn update_endpoint(&self, endpoint: WebhookEndpoint) -> Result<bool, StoreError> {
        self.write(false, move |tx| {
            let endpoint = endpoint.clone();
            Box::pin(async move {
                ops::webhooks::update_endpoint(tx, &endpoint)
                    .await
                    .map(no_events)
            })
        })
        .await
    }

    async fn delete_endpoint(&self, id: WebhookEndpointId) -> Result<bool, StoreError> {
        self.write(false, move |tx| {
            Box::pin(async move { ops::webhooks::delete_endpoint(tx, id).await.map(no_events) })
        })
        .await
    }

    async fn claim_deliveries(
        &self,
        now: Timestamp,
        lease_until: Timestamp,
        per_endpoint: usize,
        limit: usize,
    ) -> Result<Vec<Delivery>, StoreError> {
        self.write(false, move |tx| {
            Box::pin(async move {
                ops::webhooks::claim_deliveries(tx, now, lease_until, per_endpoint, limit)
                    .await
                    .map(no_events)
            })
        })
        .await
    }

    async fn record_attempt(&self, delivery: Delivery) -> Result<(), StoreError> {
        self.write(false, move |tx| {
            let delivery = delivery.clone();
            Box::pin(async move {
                ops::webhooks::record_attempt(tx, &delivery)
                    .await
                    .map(no_events)
            })
        })
        .await
    }

    async fn deliveries(
        &self,
        endpoint: WebhookEndpointId,
        limit: usize,
    ) -> Result<Vec<Delivery>, StoreError> {
        let conn = self.conn().await?;
        Ok(ops::webhooks::deliveries(pg(&conn), endpoint, limit).await?)
    }
}
