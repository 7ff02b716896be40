//! The app's test harness: a real SQLite store (behind a wrapper that can make writes fail like
//! a full disk), `mockall` mocks of the engine and the model files, and a started service.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use mockall::mock;

use lmsp_app::retry::RetryPolicy;
use lmsp_app::{
    Adapters, BatchWire, Caller, Engines, Listener, ReadLine, Service, Settings, SystemClock,
};
use lmsp_domain::auth::{Client, Pairing, Scope, Scopes, SecretHash};
use lmsp_domain::batch::{
    Batch, BatchEndpoint, BatchStatus, DuplicateLine, FilePurpose, LineOutcome, StoredFile,
};
use lmsp_domain::idempotency::{
    IdempotencyKey, IdempotencyRecord, IdempotencyScope, KeyClaim, KeyDecision, StoredReply,
};
use lmsp_domain::ports::*;
use lmsp_domain::validation::{validate_submit, DraftInput, SubmitDraft};
use lmsp_domain::webhooks::{AttemptOutcome, Delivery, WebhookEndpoint};
use lmsp_domain::*;
use lmsp_storage_sqlite::{FileDir, SqliteOptions, SqliteStore, SyncMode};

mock! {
    pub Engine {}
    #[async_trait]
    impl Engine for Engine {
        async fn load(&self, model: &ModelToLoad) -> Result<(), EngineError>;
        async fn generate(&self, job: GenerationJob) -> Result<Box<dyn Generation>, EngineError>;
    }
}

mock! {
    pub Files {}
    #[async_trait]
    impl ModelFiles for Files {
        async fn fingerprint(&self, path: &str) -> Result<FileFingerprint, ModelFileError>;
        async fn fingerprint_any(&self, path: &str, progress: Option<Progress>) -> Result<FileFingerprint, ModelFileError>;
        async fn verify(&self, known: &FileFingerprint) -> Result<VerifiedFile, ModelFileError>;
        async fn find_models(&self) -> Result<Vec<String>, ModelFileError>;
        async fn install_reference_corpus(&self) -> Result<String, ModelFileError>;
    }
}

/// A scripted generation: its items, each after `delay`; it may panic instead of its `panic_at`th
/// item. Cancel-safe (a dropped pull loses nothing), and its stop takes `stop_delay`.
pub struct Scripted {
    pub items: std::vec::IntoIter<GenerationItem>,
    pub delay: Duration,
    pub panic_at: Option<usize>,
    pub pulled: usize,
}

#[async_trait]
impl Generation for Scripted {
    async fn next_item(&mut self) -> Result<Option<GenerationItem>, EngineError> {
        tokio::time::sleep(self.delay).await;
        if self.panic_at == Some(self.pulled) {
            panic!("the scripted engine panics on purpose");
        }
        self.pulled += 1;
        Ok(self.items.next())
    }

    async fn stop(&mut self) {}
}

/// An engine whose every load takes a minute.
pub struct SlowLoad;

#[async_trait]
impl Engine for SlowLoad {
    async fn load(&self, _model: &ModelToLoad) -> Result<(), EngineError> {
        tokio::time::sleep(Duration::from_secs(60)).await;
        Ok(())
    }
    async fn generate(&self, _job: GenerationJob) -> Result<Box<dyn Generation>, EngineError> {
        Err(EngineError::Failed("never loaded".into()))
    }
}

/// `n` deltas `w0 `, `w1 `, … then the end.
pub fn words(n: usize) -> Vec<GenerationItem> {
    let mut items: Vec<_> = (0..n)
        .map(|i| GenerationItem::Delta {
            text: format!("w{i} "),
            state: vec![i as u8],
        })
        .collect();
    items.push(GenerationItem::Finished {
        usage: Usage {
            input_tokens: 1,
            output_tokens: n as u64,
            cached_tokens: 0,
        },
    });
    items
}

/// An engine that generates `tokens` words, each after `delay`.
pub fn engine_with(delay: Duration, tokens: usize) -> MockEngine {
    let mut engine = MockEngine::new();
    engine.expect_load().returning(|_| Ok(()));
    engine.expect_generate().returning(move |_job| {
        Ok(Box::new(Scripted {
            items: words(tokens).into_iter(),
            delay,
            panic_at: None,
            pulled: 0,
        }) as Box<dyn Generation>)
    });
    engine
}

/// Model files that always check out.
pub fn files_ok() -> MockFiles {
    files_verifying(|known| {
        Ok(VerifiedFile {
            path: format!("/models/{}", known.path),
            rehashed: None,
        })
    })
}

/// Model files whose check of a registered file answers with `verify`.
pub fn files_verifying(
    verify: impl Fn(&FileFingerprint) -> Result<VerifiedFile, ModelFileError> + Send + 'static,
) -> MockFiles {
    let mut files = MockFiles::new();
    files.expect_verify().returning(verify);
    files
        .expect_install_reference_corpus()
        .returning(|| Err(ModelFileError::Unavailable("not in tests".into())));
    files.expect_find_models().returning(|| Ok(Vec::new()));
    files
}

/// Which writes fail, and how often.
#[derive(Debug, Default)]
pub struct Faults {
    /// Appends (worker steps) still to fail with a full disk.
    pub appends: AtomicU32,
    /// Finishes still to fail with a full disk.
    pub finishes: AtomicU32,
    /// While true, appends wait (a write in flight, for a test that acts meanwhile).
    pub appends_held: tokio::sync::watch::Sender<bool>,
    /// Appends that have waited while held.
    pub appends_waited: AtomicU32,
}

fn take(counter: &AtomicU32) -> bool {
    counter
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

/// The SQLite store, with writes that fail on demand as on a full disk.
pub struct FaultyStore {
    pub inner: SqliteStore,
    pub faults: Arc<Faults>,
}

#[async_trait]
impl TaskStore for FaultyStore {
    async fn create_task_within(
        &self,
        task: Task,
        idempotency: Option<IdempotencyRecord>,
        service_max_queued: Option<u32>,
    ) -> Result<CreateOutcome, StoreError> {
        self.inner
            .create_task_within(task, idempotency, service_max_queued)
            .await
    }
    async fn append(
        &self,
        task_id: TaskId,
        by: InstanceId,
        expected: u64,
        steps: Vec<Step>,
        snapshot: Option<Snapshot>,
        at: Timestamp,
    ) -> Result<StepOutcome, StoreError> {
        if take(&self.faults.appends) {
            return Err(StoreError::Full);
        }
        let mut held = self.faults.appends_held.subscribe();
        if *held.borrow_and_update() {
            self.faults.appends_waited.fetch_add(1, Ordering::SeqCst);
            let _ = held.wait_for(|held| !*held).await;
        }
        self.inner
            .append(task_id, by, expected, steps, snapshot, at)
            .await
    }
    async fn finish(
        &self,
        task_id: TaskId,
        by: InstanceId,
        step: Step,
        at: Timestamp,
    ) -> Result<StepOutcome, StoreError> {
        if take(&self.faults.finishes) {
            return Err(StoreError::Full);
        }
        self.inner.finish(task_id, by, step, at).await
    }
    async fn claim(
        &self,
        by: InstanceId,
        at: Timestamp,
        aging: TierAging,
    ) -> Result<Option<Task>, StoreError> {
        self.inner.claim(by, at, aging).await
    }
    async fn cancel(
        &self,
        task_id: TaskId,
        client_id: Option<ClientId>,
        at: Timestamp,
    ) -> Result<CancelOutcome, StoreError> {
        self.inner.cancel(task_id, client_id, at).await
    }
    async fn purge_finished(
        &self,
        cutoff: Timestamp,
        batch: usize,
    ) -> Result<PurgeReport, StoreError> {
        self.inner.purge_finished(cutoff, batch).await
    }
    async fn delete_finished(
        &self,
        task_id: TaskId,
        client_id: Option<ClientId>,
    ) -> Result<DeleteOutcome, StoreError> {
        self.inner.delete_finished(task_id, client_id).await
    }
    async fn task(&self, task_id: TaskId) -> Result<Option<Task>, StoreError> {
        self.inner.task(task_id).await
    }
    async fn task_by_response(&self, response_id: ResponseId) -> Result<Option<Task>, StoreError> {
        self.inner.task_by_response(response_id).await
    }
    async fn list_tasks(&self, filter: TaskFilter) -> Result<Page<Task>, StoreError> {
        self.inner.list_tasks(filter).await
    }
    async fn events(
        &self,
        task_id: TaskId,
        after: u64,
        limit: usize,
    ) -> Result<Page<Event>, StoreError> {
        self.inner.events(task_id, after, limit).await
    }
    async fn response(&self, task_id: TaskId) -> Result<Option<Response>, StoreError> {
        self.inner.response(task_id).await
    }
    async fn snapshot(&self, task_id: TaskId) -> Result<Option<Snapshot>, StoreError> {
        self.inner.snapshot(task_id).await
    }
    async fn count_by_status(&self) -> Result<Vec<(TaskStatus, u64)>, StoreError> {
        self.inner.count_by_status().await
    }
    async fn cancelling_tasks(&self, owner: InstanceId) -> Result<Vec<TaskId>, StoreError> {
        self.inner.cancelling_tasks(owner).await
    }
}

#[async_trait]
impl ClientStore for FaultyStore {
    async fn insert_client(&self, client: Client) -> Result<(), StoreError> {
        self.inner.insert_client(client).await
    }
    async fn client_by_token_hash(&self, hash: SecretHash) -> Result<Option<Client>, StoreError> {
        self.inner.client_by_token_hash(hash).await
    }
    async fn client(&self, client_id: ClientId) -> Result<Option<Client>, StoreError> {
        self.inner.client(client_id).await
    }
    async fn list_clients(&self) -> Result<Vec<Client>, StoreError> {
        self.inner.list_clients().await
    }
    async fn revoke_client(&self, client_id: ClientId, at: Timestamp) -> Result<bool, StoreError> {
        self.inner.revoke_client(client_id, at).await
    }
    async fn client_limits(&self, client_id: ClientId) -> Result<ClientLimits, StoreError> {
        self.inner.client_limits(client_id).await
    }
    async fn set_client_limits(
        &self,
        client_id: ClientId,
        limits: ClientLimits,
    ) -> Result<bool, StoreError> {
        self.inner.set_client_limits(client_id, limits).await
    }
    async fn insert_pairing(&self, pairing: Pairing) -> Result<(), StoreError> {
        self.inner.insert_pairing(pairing).await
    }
    async fn redeem_pairing(
        &self,
        code_hash: SecretHash,
        client: Client,
        at: Timestamp,
    ) -> Result<Redemption, StoreError> {
        self.inner.redeem_pairing(code_hash, client, at).await
    }
}

#[async_trait]
impl ModelStore for FaultyStore {
    async fn insert_model(&self, model: ModelRecord) -> Result<bool, StoreError> {
        self.inner.insert_model(model).await
    }
    async fn insert_found_model(&self, model: ModelRecord) -> Result<bool, StoreError> {
        self.inner.insert_found_model(model).await
    }
    async fn model(&self, model_id: &ModelId) -> Result<Option<ModelRecord>, StoreError> {
        self.inner.model(model_id).await
    }
    async fn list_models(&self) -> Result<Vec<ModelRecord>, StoreError> {
        self.inner.list_models().await
    }
    async fn delete_model(&self, model_id: &ModelId) -> Result<bool, StoreError> {
        self.inner.delete_model(model_id).await
    }
    async fn update_model_file(
        &self,
        model_id: &ModelId,
        file: FileFingerprint,
    ) -> Result<(), StoreError> {
        self.inner.update_model_file(model_id, file).await
    }
}

/// Files and batches pass through untouched: the faults are the task write path's.
#[async_trait]
impl BatchStore for FaultyStore {
    async fn insert_file(&self, file: StoredFile) -> Result<(), StoreError> {
        self.inner.insert_file(file).await
    }
    async fn file(&self, id: FileId) -> Result<Option<StoredFile>, StoreError> {
        self.inner.file(id).await
    }
    async fn list_files(
        &self,
        client: Option<ClientId>,
        purpose: Option<FilePurpose>,
        after: Option<FileId>,
        order: ListOrder,
        limit: usize,
    ) -> Result<Page<StoredFile>, StoreError> {
        self.inner
            .list_files(client, purpose, after, order, limit)
            .await
    }
    async fn delete_file(
        &self,
        id: FileId,
        client: Option<ClientId>,
    ) -> Result<FileDeleteOutcome, StoreError> {
        self.inner.delete_file(id, client).await
    }
    async fn insert_batch(&self, batch: Batch) -> Result<(), StoreError> {
        self.inner.insert_batch(batch).await
    }
    async fn batch(&self, id: BatchId) -> Result<Option<Batch>, StoreError> {
        self.inner.batch(id).await
    }
    async fn list_batches(
        &self,
        client: Option<ClientId>,
        before: Option<BatchId>,
        limit: usize,
    ) -> Result<Page<Batch>, StoreError> {
        self.inner.list_batches(client, before, limit).await
    }
    async fn unfinished_batches(&self, limit: usize) -> Result<Vec<Batch>, StoreError> {
        self.inner.unfinished_batches(limit).await
    }
    async fn stage_batch_tasks(&self, tasks: Vec<Task>) -> Result<(), StoreError> {
        self.inner.stage_batch_tasks(tasks).await
    }

    async fn staged_duplicates(
        &self,
        batch: BatchId,
        limit: usize,
    ) -> Result<Vec<DuplicateLine>, StoreError> {
        self.inner.staged_duplicates(batch, limit).await
    }
    async fn start_batch(&self, started: Batch) -> Result<Option<Batch>, StoreError> {
        self.inner.start_batch(started).await
    }
    async fn update_batch(
        &self,
        from: BatchStatus,
        batch: Batch,
    ) -> Result<Option<Batch>, StoreError> {
        self.inner.update_batch(from, batch).await
    }
    async fn end_batch(
        &self,
        from: BatchStatus,
        batch: Batch,
        files: Vec<StoredFile>,
    ) -> Result<Option<Batch>, StoreError> {
        self.inner.end_batch(from, batch, files).await
    }
    async fn batch_tasks(
        &self,
        batch: BatchId,
        statuses: &[TaskStatus],
        after: u32,
        limit: usize,
    ) -> Result<Vec<Task>, StoreError> {
        self.inner.batch_tasks(batch, statuses, after, limit).await
    }
    async fn batch_answers(
        &self,
        batch: BatchId,
        after: u32,
        limit: usize,
    ) -> Result<Vec<(Task, Option<Response>)>, StoreError> {
        self.inner.batch_answers(batch, after, limit).await
    }
    async fn purge_batches(
        &self,
        cutoff: Timestamp,
        batch: usize,
    ) -> Result<BatchPurge, StoreError> {
        self.inner.purge_batches(cutoff, batch).await
    }
}

/// Webhooks pass through untouched: the faults are the task write path's.
#[async_trait]
impl WebhookStore for FaultyStore {
    async fn insert_endpoint(&self, endpoint: WebhookEndpoint) -> Result<(), StoreError> {
        self.inner.insert_endpoint(endpoint).await
    }
    async fn endpoint(&self, id: WebhookEndpointId) -> Result<Option<WebhookEndpoint>, StoreError> {
        self.inner.endpoint(id).await
    }
    async fn list_endpoints(
        &self,
        before: Option<WebhookEndpointId>,
        limit: usize,
    ) -> Result<Page<WebhookEndpoint>, StoreError> {
        self.inner.list_endpoints(before, limit).await
    }
    async fn update_endpoint(&self, endpoint: WebhookEndpoint) -> Result<bool, StoreError> {
        self.inner.update_endpoint(endpoint).await
    }
    async fn delete_endpoint(&self, id: WebhookEndpointId) -> Result<bool, StoreError> {
        self.inner.delete_endpoint(id).await
    }
    async fn claim_deliveries(
        &self,
        now: Timestamp,
        lease_until: Timestamp,
        per_endpoint: usize,
        limit: usize,
    ) -> Result<Vec<Delivery>, StoreError> {
        self.inner
            .claim_deliveries(now, lease_until, per_endpoint, limit)
            .await
    }
    async fn record_attempt(&self, delivery: Delivery) -> Result<(), StoreError> {
        self.inner.record_attempt(delivery).await
    }
    async fn deliveries(
        &self,
        endpoint: WebhookEndpointId,
        limit: usize,
    ) -> Result<Vec<Delivery>, StoreError> {
        self.inner.deliveries(endpoint, limit).await
    }
}

#[async_trait]
impl IdempotencyStore for FaultyStore {
    async fn claim_key(&self, claim: &KeyClaim, now: Timestamp) -> Result<KeyDecision, StoreError> {
        self.inner.claim_key(claim, now).await
    }
    async fn insert_model_with_key(
        &self,
        model: ModelRecord,
        record: IdempotencyRecord,
    ) -> Result<KeyedInsert, StoreError> {
        self.inner.insert_model_with_key(model, record).await
    }
    async fn settle_key(
        &self,
        scope: &IdempotencyScope,
        key: &IdempotencyKey,
        expected: &StoredReply,
        reply: StoredReply,
    ) -> Result<bool, StoreError> {
        self.inner.settle_key(scope, key, expected, reply).await
    }
    async fn release_key(
        &self,
        scope: &IdempotencyScope,
        key: &IdempotencyKey,
    ) -> Result<(), StoreError> {
        self.inner.release_key(scope, key).await
    }
    async fn purge_idempotency(&self, at: Timestamp, batch: usize) -> Result<u64, StoreError> {
        self.inner.purge_idempotency(at, batch).await
    }
}

#[async_trait]
impl InstanceStore for FaultyStore {
    async fn register_instance(&self, instance: InstanceInfo) -> Result<Registration, StoreError> {
        self.inner.register_instance(instance).await
    }
    async fn renew_lease(
        &self,
        instance: InstanceId,
        lease_until: Timestamp,
        at: Timestamp,
    ) -> Result<bool, StoreError> {
        self.inner.renew_lease(instance, lease_until, at).await
    }
    async fn retire_instance(&self, instance: InstanceId, at: Timestamp) -> Result<(), StoreError> {
        self.inner.retire_instance(instance, at).await
    }
    async fn stopped_instances(
        &self,
        me: InstanceId,
        at: Timestamp,
    ) -> Result<Vec<InstanceId>, StoreError> {
        self.inner.stopped_instances(me, at).await
    }
    async fn recover_instance(
        &self,
        stopped: InstanceId,
        rescuer: InstanceId,
        at: Timestamp,
    ) -> Result<RecoveryReport, StoreError> {
        self.inner.recover_instance(stopped, rescuer, at).await
    }
    async fn lead_maintenance(&self, instance: InstanceId) -> Result<bool, StoreError> {
        self.inner.lead_maintenance(instance).await
    }
}

#[async_trait]
impl ServiceStore for FaultyStore {
    async fn initialize(
        &self,
        candidate: ServiceIdentity,
        admin: Client,
    ) -> Result<Initialized, StoreError> {
        self.inner.initialize(candidate, admin).await
    }
    async fn check_writable(&self, at: Timestamp) -> Result<(), StoreError> {
        self.inner.check_writable(at).await
    }
}

/// A started service on a fresh store.
pub struct Harness {
    pub service: Service,
    pub store: Arc<dyn Store>,
    pub faults: Arc<Faults>,
    pub admin: Caller,
    pub listener: Arc<Listener>,
    _dir: tempfile::TempDir,
}

/// The batch lines of the app's tests, which drive no HTTP: every line reads as no JSON object
/// (the HTTP edge reads and answers lines; its tests and the end-to-end suite cover batches).
pub struct NoBatchLines;

impl BatchWire for NoBatchLines {
    fn read_line(&self, _endpoint: BatchEndpoint, _text: &[u8]) -> Option<ReadLine> {
        None
    }

    fn answer(
        &self,
        _endpoint: BatchEndpoint,
        _task: &Task,
        _response: Option<&Response>,
        _outcome: LineOutcome,
    ) -> Vec<u8> {
        Vec::new()
    }
}

/// The webhook receivers of the app's tests: none answers (no test registers an endpoint; the
/// end-to-end suite sends to real receivers).
pub struct NoReceivers;

#[async_trait]
impl WebhookSender for NoReceivers {
    async fn send(
        &self,
        _url: &str,
        _event: &OutgoingEvent,
        _secrets: &[String],
        _now: Timestamp,
        _timeout: Duration,
    ) -> AttemptOutcome {
        AttemptOutcome::NoAnswer(String::from("no receiver in the app's tests"))
    }
}

/// Settings for tests: one worker, fast store retries that give up after `give_up_after`.
pub fn settings(give_up_after: Duration) -> Settings {
    let mut settings = Settings::with_defaults("test");
    settings.workers = 1;
    settings.store_retry = RetryPolicy {
        first_delay: Duration::from_millis(5),
        max_delay: Duration::from_millis(20),
        give_up_after,
    };
    settings.engine_stop_grace = Duration::from_secs(2);
    settings
}

/// A started service with `engine` and `files`, the reference model registered as a text file.
pub async fn harness(
    engine: impl Engine + 'static,
    files: MockFiles,
    settings: Settings,
) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let listener = Listener::new();
    let options = SqliteOptions {
        sync: SyncMode::Normal,
        ..SqliteOptions::default()
    };
    let faults = Arc::new(Faults::default());
    let inner = SqliteStore::open(&dir.path().join("lmsp.db"), options, listener.clone()).unwrap();
    let store: Arc<dyn Store> = Arc::new(FaultyStore {
        inner,
        faults: Arc::clone(&faults),
    });
    let model = ModelRecord {
        id: ModelId::parse("reference").unwrap(),
        source: ModelSource::File {
            format: ModelFormat::Text,
            file: FileFingerprint {
                path: "reference.txt".into(),
                size_bytes: 3,
                modified_millis: 0,
                digest: Digest::from_sha256([1; 32]),
            },
        },
        created_at: Timestamp::from_millis(0),
    };
    store.insert_model(model).await.unwrap();
    let adapters = Adapters {
        store: Arc::clone(&store),
        engines: Engines::new().with(EngineKind::Reference, Arc::new(engine)),
        model_files: Arc::new(files),
        file_contents: Arc::new(FileDir::open(&dir.path().join("files")).unwrap()),
        batch_wire: Arc::new(NoBatchLines),
        webhook_sender: Arc::new(NoReceivers),
        clock: Arc::new(SystemClock),
    };
    let started = Service::start(adapters, Arc::clone(&listener), settings)
        .await
        .unwrap();
    started.service.spawn_background();
    let admin = Caller {
        client_id: ClientId::from_ulid(ulid::Ulid::new()),
        scopes: Scopes::new([Scope::Admin]),
    };
    Harness {
        service: started.service,
        store,
        faults,
        admin,
        listener,
        _dir: dir,
    }
}

/// A background request for `tokens` words.
pub fn request(tokens: u64) -> SubmitRequest {
    validate_submit(SubmitDraft {
        model: "reference".into(),
        input: DraftInput::Text("hi".into()),
        background: Some(true),
        max_output_tokens: Some(tokens),
        seed: Some(1),
        ..SubmitDraft::default()
    })
    .unwrap()
}

/// Submits a background request for `tokens` words.
pub async fn submit(h: &Harness, tokens: u64) -> Task {
    h.service.submit(&h.admin, &request(tokens)).await.unwrap()
}

/// Waits (at most 10 s) for the task to finish.
pub async fn finished(h: &Harness, task: &Task) -> Task {
    h.service
        .wait_finished(task.id, Some(Duration::from_secs(10)))
        .await
        .unwrap()
        .expect("the task finished within 10 s")
}

/// The kinds of a task's events.
pub async fn kinds(h: &Harness, task: &Task) -> Vec<EventKind> {
    h.store
        .events(task.id, 0, 10_000)
        .await
        .unwrap()
        .items
        .iter()
        .map(|e| e.kind())
        .collect()
}

/// Waits (at most 10 s) until the task is running with more than `seq` events.
pub async fn running_past(h: &Harness, task: &Task, seq: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let now = h.store.task(task.id).await.unwrap().unwrap();
        if now.status == TaskStatus::Running && now.last_sequence_number > seq {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the task did not get running"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
