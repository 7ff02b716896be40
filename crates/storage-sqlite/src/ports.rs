//! The storage ports of `lmsp_domain::ports` implemented by [`SqliteStore`]: each method a
//! write through the writer thread, a read on the read pool, or a point read on the caller's thread.

use crate::{ops, SqliteStore};
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
use lmsp_storage_codec::no_events;
use lmsp_storage_codec::recovery::{recovery_pass, RecoveryBatch};

#[async_trait]
impl TaskStore for SqliteStore {
    async fn create_task_within(
        &self,
        task: Task,
        idempotency: Option<IdempotencyRecord>,
        service_max_queued: Option<u32>,
    ) -> Result<CreateOutcome, StoreError> {
        self.write_small(Box::new(move |conn| {
            ops::tasks::create_task(conn, task, idempotency, service_max_queued)
        }))
        .await
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
        self.write_small(Box::new(move |conn| {
            ops::tasks::append(
                conn,
                task_id,
                by,
                Some(expected_last_sequence),
                &steps,
                snapshot.as_ref(),
                at,
            )
        }))
        .await
    }

    async fn finish(
        &self,
        task_id: TaskId,
        by: InstanceId,
        step: Step,
        at: Timestamp,
    ) -> Result<StepOutcome, StoreError> {
        self.write_small(Box::new(move |conn| {
            ops::tasks::append(
                conn,
                task_id,
                by,
                None,
                std::slice::from_ref(&step),
                None,
                at,
            )
        }))
        .await
    }

    async fn claim(
        &self,
        by: InstanceId,
        at: Timestamp,
        aging: TierAging,
    ) -> Result<Option<Task>, StoreError> {
        self.write_small(Box::new(move |conn| {
            ops::tasks::claim_next(conn, by, at, aging)
        }))
        .await
    }

    async fn cancel(
        &self,
        task_id: TaskId,
        client_id: Option<ClientId>,
        at: Timestamp,
    ) -> Result<CancelOutcome, StoreError> {
        self.write_small(Box::new(move |conn| {
            ops::tasks::cancel(conn, task_id, client_id, at)
        }))
        .await
    }

    async fn purge_finished(
        &self,
        cutoff: Timestamp,
        batch: usize,
    ) -> Result<PurgeReport, StoreError> {
        let max_events = self.purge_max_events;
        self.write(Box::new(move |conn| {
            ops::purge::purge_finished(conn, cutoff, batch, max_events).map(no_events)
        }))
        .await
    }

    async fn delete_finished(
        &self,
        task_id: TaskId,
        client_id: Option<ClientId>,
    ) -> Result<DeleteOutcome, StoreError> {
        self.write(Box::new(move |conn| {
            ops::tasks::delete_finished(conn, task_id, client_id).map(no_events)
        }))
        .await
    }

    async fn task(&self, task_id: TaskId) -> Result<Option<Task>, StoreError> {
        self.read(move |conn| ops::load_task(conn, task_id)).await
    }

    async fn task_by_response(&self, response_id: ResponseId) -> Result<Option<Task>, StoreError> {
        self.read(move |conn| ops::tasks::task_by_response(conn, response_id))
            .await
    }

    async fn list_tasks(&self, filter: TaskFilter) -> Result<Page<Task>, StoreError> {
        self.read(move |conn| ops::tasks::list_tasks(conn, &filter))
            .await
    }

    async fn events(
        &self,
        task_id: TaskId,
        after: u64,
        limit: usize,
    ) -> Result<Page<Event>, StoreError> {
        self.read(move |conn| ops::events::events(conn, task_id, after, limit))
            .await
    }

    async fn response(&self, task_id: TaskId) -> Result<Option<Response>, StoreError> {
        self.read(move |conn| ops::tasks::response(conn, task_id))
            .await
    }

    async fn snapshot(&self, task_id: TaskId) -> Result<Option<Snapshot>, StoreError> {
        self.read(move |conn| ops::tasks::snapshot(conn, task_id))
            .await
    }

    async fn count_by_status(&self) -> Result<Vec<(TaskStatus, u64)>, StoreError> {
        self.read(ops::tasks::count_by_status).await
    }

    async fn cancelling_tasks(&self, owner: InstanceId) -> Result<Vec<TaskId>, StoreError> {
        self.read(move |conn| ops::tasks::cancelling_tasks(conn, owner))
            .await
    }
}

#[async_trait]
impl ClientStore for SqliteStore {
    async fn insert_client(&self, client: Client) -> Result<(), StoreError> {
        self.write(Box::new(move |conn| {
            ops::clients::insert_client(conn, &client).map(no_events)
        }))
        .await
    }

    async fn client_by_token_hash(&self, hash: SecretHash) -> Result<Option<Client>, StoreError> {
        self.point_read(|conn| ops::clients::client_by_token_hash(conn, &hash))
    }

    async fn client(&self, client_id: ClientId) -> Result<Option<Client>, StoreError> {
        self.point_read(|conn| ops::clients::client(conn, client_id))
    }

    async fn list_clients(&self) -> Result<Vec<Client>, StoreError> {
        self.read(ops::clients::list_clients).await
    }

    async fn revoke_client(&self, client_id: ClientId, at: Timestamp) -> Result<bool, StoreError> {
        self.write(Box::new(move |conn| {
            ops::clients::revoke_client(conn, client_id, at).map(no_events)
        }))
        .await
    }

    async fn client_limits(&self, client_id: ClientId) -> Result<ClientLimits, StoreError> {
        self.point_read(|conn| ops::clients::client_limits(conn, client_id))
    }

    async fn set_client_limits(
        &self,
        client_id: ClientId,
        limits: ClientLimits,
    ) -> Result<bool, StoreError> {
        self.write(Box::new(move |conn| {
            ops::clients::set_client_limits(conn, client_id, limits).map(no_events)
        }))
        .await
    }

    async fn insert_pairing(&self, pairing: Pairing) -> Result<(), StoreError> {
        self.write(Box::new(move |conn| {
            ops::clients::insert_pairing(conn, &pairing).map(no_events)
        }))
        .await
    }

    async fn redeem_pairing(
        &self,
        code_hash: SecretHash,
        client: Client,
        at: Timestamp,
    ) -> Result<Redemption, StoreError> {
        self.write(Box::new(move |conn| {
            ops::clients::redeem_pairing(conn, &code_hash, &client, at).map(no_events)
        }))
        .await
    }
}

#[async_trait]
impl ModelStore for SqliteStore {
    async fn insert_model(&self, model: ModelRecord) -> Result<bool, StoreError> {
        self.write(Box::new(move |conn| {
            ops::models::insert_model(conn, &model).map(no_events)
        }))
        .await
    }

    async fn insert_found_model(&self, model: ModelRecord) -> Result<bool, StoreError> {
        self.write(Box::new(move |conn| {
            ops::models::insert_found_model(conn, &model).map(no_events)
        }))
        .await
    }

    async fn model(&self, model_id: &ModelId) -> Result<Option<ModelRecord>, StoreError> {
        self.point_read(|conn| ops::models::model(conn, model_id))
    }

    async fn list_models(&self) -> Result<Vec<ModelRecord>, StoreError> {
        self.read(ops::models::list_models).await
    }

    async fn delete_model(&self, model_id: &ModelId) -> Result<bool, StoreError> {
        let model_id = model_id.clone();
        self.write(Box::new(move |conn| {
            ops::models::delete_model(conn, &model_id).map(no_events)
        }))
        .await
    }

    async fn update_model_file(
        &self,
        model_id: &ModelId,
        file: FileFingerprint,
    ) -> Result<(), StoreError> {
        let model_id = model_id.clone();
        self.write(Box::new(move |conn| {
            ops::models::update_model_file(conn, &model_id, &file).map(no_events)
        }))
        .await
    }
}

#[async_trait]
impl IdempotencyStore for SqliteStore {
    async fn claim_key(&self, claim: &KeyClaim, now: Timestamp) -> Result<KeyDecision, StoreError> {
        let claim = claim.clone();
        self.write_small(Box::new(move |conn| {
            ops::idempotency::claim_key(conn, &claim, now).map(no_events)
        }))
        .await
    }

    async fn insert_model_with_key(
        &self,
        model: ModelRecord,
        record: IdempotencyRecord,
    ) -> Result<KeyedInsert, StoreError> {
        self.write(Box::new(move |conn| {
            ops::idempotency::insert_model_with_key(conn, &model, &record).map(no_events)
        }))
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
        self.write_small(Box::new(move |conn| {
            ops::idempotency::settle_key(conn, &scope, &key, &expected, reply).map(no_events)
        }))
        .await
    }

    async fn release_key(
        &self,
        scope: &IdempotencyScope,
        key: &IdempotencyKey,
    ) -> Result<(), StoreError> {
        let (scope, key) = (scope.clone(), key.clone());
        self.write_small(Box::new(move |conn| {
            ops::idempotency::release_key(conn, &scope, &key).map(no_events)
        }))
        .await
    }

    async fn purge_idempotency(&self, at: Timestamp, batch: usize) -> Result<u64, StoreError> {
        self.write(Box::new(move |conn| {
            ops::idempotency::purge_idempotency(conn, at, batch).map(no_events)
        }))
        .await
    }
}

#[async_trait]
impl InstanceStore for SqliteStore {
    async fn register_instance(&self, instance: InstanceInfo) -> Result<Registration, StoreError> {
        self.write(Box::new(move |conn| {
            ops::instances::register(conn, &instance).map(no_events)
        }))
        .await
    }

    async fn renew_lease(
        &self,
        instance: InstanceId,
        lease_until: Timestamp,
        _at: Timestamp,
    ) -> Result<bool, StoreError> {
        self.write_small(Box::new(move |conn| {
            ops::instances::renew(conn, instance, lease_until).map(no_events)
        }))
        .await
    }

    async fn retire_instance(&self, instance: InstanceId, at: Timestamp) -> Result<(), StoreError> {
        self.write(Box::new(move |conn| {
            ops::instances::retire(conn, instance, at).map(no_events)
        }))
        .await
    }

    async fn stopped_instances(
        &self,
        me: InstanceId,
        at: Timestamp,
    ) -> Result<Vec<InstanceId>, StoreError> {
        self.read(move |conn| ops::instances::stopped(conn, me, at))
            .await
    }

    async fn recover_instance(
        &self,
        stopped: InstanceId,
        rescuer: InstanceId,
        at: Timestamp,
    ) -> Result<RecoveryReport, StoreError> {
        let limit = self.recovery_batch;
        let first = RecoveryBatch::first(stopped, rescuer, at, limit);
        let report = recovery_pass(first, |batch| {
            self.write(Box::new(move |conn| {
                ops::instances::recover_batch(conn, batch)
            }))
        })
        .await?;
        self.write(Box::new(move |conn| {
            ops::instances::mark_recovered(conn, stopped, at).map(no_events)
        }))
        .await?;
        Ok(report)
    }

    async fn lead_maintenance(&self, _instance: InstanceId) -> Result<bool, StoreError> {
        // One process at a time uses a SQLite store: it always leads.
        Ok(true)
    }
}

#[async_trait]
impl ServiceStore for SqliteStore {
    async fn initialize(
        &self,
        candidate: ServiceIdentity,
        admin: Client,
    ) -> Result<Initialized, StoreError> {
        self.write(Box::new(move |conn| {
            ops::service::initialize(conn, &candidate, &admin).map(no_events)
        }))
        .await
    }

    async fn check_writable(&self, at: Timestamp) -> Result<(), StoreError> {
        self.write(Box::new(move |conn| {
            ops::service::probe(conn, at).map(no_events)
        }))
        .await
    }
}

#[async_trait]
impl BatchStore for SqliteStore {
    async fn insert_file(&self, file: StoredFile) -> Result<(), StoreError> {
        self.write(Box::new(move |conn| {
            ops::batches::insert_file(conn, &file).map(no_events)
        }))
        .await
    }

    async fn file(&self, id: FileId) -> Result<Option<StoredFile>, StoreError> {
        self.point_read(|conn| ops::batches::file(conn, id))
    }

    async fn list_files(
        &self,
        client: Option<ClientId>,
        purpose: Option<FilePurpose>,
        after: Option<FileId>,
        order: ListOrder,
        limit: usize,
    ) -> Result<Page<StoredFile>, StoreError> {
        self.read(move |conn| ops::batches::list_files(conn, client, purpose, after, order, limit))
            .await
    }

    async fn delete_file(
        &self,
        id: FileId,
        client: Option<ClientId>,
    ) -> Result<FileDeleteOutcome, StoreError> {
        self.write(Box::new(move |conn| {
            ops::batches::delete_file(conn, id, client).map(no_events)
        }))
        .await
    }

    async fn insert_batch(&self, batch: Batch) -> Result<(), StoreError> {
        self.write(Box::new(move |conn| {
            ops::batches::insert_batch(conn, &batch).map(no_events)
        }))
        .await
    }

    async fn batch(&self, id: BatchId) -> Result<Option<Batch>, StoreError> {
        self.point_read(|conn| ops::batches::batch(conn, id))
    }

    async fn list_batches(
        &self,
        client: Option<ClientId>,
        before: Option<BatchId>,
        limit: usize,
    ) -> Result<Page<Batch>, StoreError> {
        self.read(move |conn| ops::batches::list_batches(conn, client, before, limit))
            .await
    }

    async fn unfinished_batches(&self, limit: usize) -> Result<Vec<Batch>, StoreError> {
        self.read(move |conn| ops::batches::unfinished_batches(conn, limit))
            .await
    }

    async fn stage_batch_tasks(&self, tasks: Vec<Task>) -> Result<(), StoreError> {
        self.write(Box::new(move |conn| {
            ops::batches::stage_batch_tasks(conn, &tasks).map(no_events)
        }))
        .await
    }

    async fn staged_duplicates(
        &self,
        batch: BatchId,
        limit: usize,
    ) -> Result<Vec<DuplicateLine>, StoreError> {
        self.read(move |conn| ops::batches::staged_duplicates(conn, batch, limit))
            .await
    }

    async fn start_batch(&self, started: Batch) -> Result<Option<Batch>, StoreError> {
        let id = started.id;
        let outcome = self
            .write(Box::new(move |conn| {
                ops::batches::start_batch(conn, &started).map(no_events)
            }))
            .await?;
        self.drop_staged(id).await?;
        Ok(outcome)
    }

    async fn update_batch(
        &self,
        from: BatchStatus,
        batch: Batch,
    ) -> Result<Option<Batch>, StoreError> {
        let id = batch.id;
        let outcome = self
            .write(Box::new(move |conn| {
                ops::batches::update_batch(conn, from, &batch).map(no_events)
            }))
            .await?;
        if from == BatchStatus::Validating && outcome.is_some() {
            self.drop_staged(id).await?;
        }
        Ok(outcome)
    }

    async fn end_batch(
        &self,
        from: BatchStatus,
        batch: Batch,
        files: Vec<StoredFile>,
    ) -> Result<Option<Batch>, StoreError> {
        self.write(Box::new(move |conn| {
            ops::batches::end_batch(conn, from, &batch, &files).map(no_events)
        }))
        .await
    }

    async fn batch_tasks(
        &self,
        batch: BatchId,
        statuses: &[TaskStatus],
        after: u32,
        limit: usize,
    ) -> Result<Vec<Task>, StoreError> {
        let statuses = statuses.to_vec();
        self.read(move |conn| ops::batches::batch_tasks(conn, batch, &statuses, after, limit))
            .await
    }

    async fn batch_answers(
        &self,
        batch: BatchId,
        after: u32,
        limit: usize,
    ) -> Result<Vec<(Task, Option<Response>)>, StoreError> {
        self.read(move |conn| ops::batches::batch_answers(conn, batch, after, limit))
            .await
    }

    async fn purge_batches(
        &self,
        cutoff: Timestamp,
        batch: usize,
    ) -> Result<BatchPurge, StoreError> {
        self.write(Box::new(move |conn| {
            ops::batches::purge_batches(conn, cutoff, batch).map(no_events)
        }))
        .await
    }
}

#[async_trait]
impl WebhookStore for SqliteStore {
    async fn insert_endpoint(&self, endpoint: WebhookEndpoint) -> Result<(), StoreError> {
        self.write(Box::new(move |conn| {
            ops::webhooks::insert_endpoint(conn, &endpoint).map(no_events)
        }))
        .await
    }

    async fn endpoint(&self, id: WebhookEndpointId) -> Result<Option<WebhookEndpoint>, StoreError> {
        self.point_read(|conn| ops::webhooks::endpoint(conn, id))
    }

    async fn list_endpoints(
        &self,
        before: Option<WebhookEndpointId>,
        limit: usize,
    ) -> Result<Page<WebhookEndpoint>, StoreError> {
        self.read(move |conn| ops::webhooks::list_endpoints(conn, before, limit))
            .await
    }

    async fn update_endpoint(&self, endpoint: WebhookEndpoint) -> Result<bool, StoreError> {
        self.write(Box::new(move |conn| {
            ops::webhooks::update_endpoint(conn, &endpoint).map(no_events)
        }))
        .await
    }

    async fn delete_endpoint(&self, id: WebhookEndpointId) -> Result<bool, StoreError> {
        self.write(Box::new(move |conn| {
            ops::webhooks::delete_endpoint(conn, id).map(no_events)
        }))
        .await
    }

    async fn claim_deliveries(
        &self,
        now: Timestamp,
        lease_until: Timestamp,
        per_endpoint: usize,
        limit: usize,
    ) -> Result<Vec<Delivery>, StoreError> {
        // Every instance polls this a few times a second: nothing due, no writer command.
        if !self.point_read(|conn| ops::webhooks::any_due(conn, now))? {
            return Ok(Vec::new());
        }
        self.write(Box::new(move |conn| {
            ops::webhooks::claim_deliveries(conn, now, lease_until, per_endpoint, limit)
                .map(no_events)
        }))
        .await
    }

    async fn record_attempt(&self, delivery: Delivery) -> Result<(), StoreError> {
        self.write_small(Box::new(move |conn| {
            ops::webhooks::record_attempt(conn, &delivery).map(no_events)
        }))
        .await
    }

    async fn deliveries(
        &self,
        endpoint: WebhookEndpointId,
        limit: usize,
    ) -> Result<Vec<Delivery>, StoreError> {
        self.read(move |conn| ops::webhooks::deliveries(conn, endpoint, limit))
            .await
    }
}
