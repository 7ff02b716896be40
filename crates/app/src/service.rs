//! The service's use cases, behind one cheap-to-clone handle.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::stream::{BoxStream, StreamExt};
use rand::RngCore;
use tokio::sync::{broadcast, Notify};

use lmsp_domain::auth::{looks_like_token, Client, Scope, Scopes, Secret};
use lmsp_domain::idempotency::IdempotencyRecord;
use lmsp_domain::ports::{
    CancelFlag, CancelOutcome, Clock, CreateOutcome, Engine, ModelFiles, Page, ServiceIdentity,
    StartInfo, Store, TaskFilter,
};
use lmsp_domain::recovery::RestartPolicy;
use lmsp_domain::{
    CancelDecision, ClientId, Event, ModelId, ModelRecord, Response, ResponseId, ServiceId,
    SubmitRequest, Task, TaskId, TaskSpec, TaskStatus, Timestamp,
};

use crate::error::AppError;
use crate::live::LiveEvents;
use crate::metrics::Metrics;
use crate::worker;

/// How the service behaves; built by `main` from flags and environment.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Tasks run at once.
    pub workers: usize,
    /// How long finished tasks are kept.
    pub retention: Duration,
    /// How often the purge job runs.
    pub purge_interval: Duration,
    /// How long idempotency keys are kept.
    pub idempotency_ttl: Duration,
    /// The policy of tasks whose request names none.
    pub default_on_restart: RestartPolicy,
    /// The version string shown by `GET /v1/service`.
    pub version: String,
}

/// Who is calling: an authenticated client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The client.
    pub client_id: ClientId,
    /// Its scopes.
    pub scopes: Scopes,
}

impl Caller {
    /// `Ok` when the caller has `scope` (admin has all), else `Forbidden`.
    pub fn require(&self, scope: Scope) -> Result<(), AppError> {
        if self.scopes.allows(scope) {
            Ok(())
        } else {
            Err(AppError::Forbidden(scope.as_str()))
        }
    }

    /// The client whose tasks this caller may see; `None` for admin (all of them).
    pub fn visibility(&self) -> Option<ClientId> {
        (!self.scopes.allows(Scope::Admin)).then_some(self.client_id)
    }

    fn may_see(&self, task: &Task) -> bool {
        self.visibility()
            .is_none_or(|client| client == task.client_id)
    }
}

/// What a submit produced.
#[derive(Debug, Clone)]
pub enum SubmitReply {
    /// A new task.
    Created(Task),
    /// An idempotency record already existed for the key: the stored reply.
    Existing(IdempotencyRecord),
}

pub(crate) struct Inner {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) engine: Arc<dyn Engine>,
    pub(crate) model_files: Arc<dyn ModelFiles>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) live: Arc<LiveEvents>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) settings: Settings,
    pub(crate) start: StartInfo,
    pub(crate) started_at: Timestamp,
    pub(crate) work_available: Notify,
    pub(crate) resumed: Mutex<VecDeque<TaskId>>,
    pub(crate) cancel_flags: Mutex<HashMap<TaskId, CancelFlag>>,
    pub(crate) shutting_down: AtomicBool,
    pub(crate) stop_workers: tokio_util_like::StopSignal,
    pub(crate) pairing_failures: crate::pairing::PairingFailures,
    ids: Mutex<ulid::Generator>,
}

/// A tiny shared stop signal (a watch channel) for the background loops.
pub(crate) mod tokio_util_like {
    use tokio::sync::watch;

    /// Raised once; every loop that watches it stops.
    #[derive(Debug)]
    pub(crate) struct StopSignal {
        sender: watch::Sender<bool>,
    }

    impl StopSignal {
        pub(crate) fn new() -> Self {
            Self {
                sender: watch::channel(false).0,
            }
        }
        pub(crate) fn raise(&self) {
            self.sender.send_replace(true);
        }
        pub(crate) fn is_raised(&self) -> bool {
            *self.sender.borrow()
        }
        pub(crate) async fn raised(&self) {
            let mut receiver = self.sender.subscribe();
            // An error means the sender is gone, which only happens at teardown.
            let _ = receiver.wait_for(|raised| *raised).await;
        }
    }
}

/// The running service: cheap to clone, shared by every request handler and worker.
#[derive(Clone)]
pub struct Service {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("id", &self.inner.start.identity.id)
            .finish()
    }
}

impl Service {
    /// Records the start, runs recovery to completion (P-7), and returns the service, ready to
    /// serve; call [`Service::spawn_background`] to start the workers and the purge job.
    ///
    /// `live` and `metrics` must be the listeners the store reports its commits to (see
    /// [`crate::CommitListeners`]): `live` feeds event streams, `metrics` the `/metrics` counters.
    pub async fn start(
        store: Arc<dyn Store>,
        engine: Arc<dyn Engine>,
        model_files: Arc<dyn ModelFiles>,
        clock: Arc<dyn Clock>,
        live: Arc<LiveEvents>,
        metrics: Arc<Metrics>,
        settings: Settings,
    ) -> Result<Self, AppError> {
        let now = clock.now();
        let candidate = ServiceIdentity {
            id: ServiceId::from_ulid(ulid::Ulid::new()),
            created_at: now,
        };
        let start = store.begin_start(candidate).await?;
        let report = store.recover_leftovers(start.epoch, clock.now()).await?;
        tracing::info!(
            moved = report.moved,
            untouched = report.untouched,
            resumed = report.resumed.len(),
            "recovery finished"
        );
        metrics.record_recovery(&report);
        let inner = Inner {
            store,
            engine,
            model_files,
            clock,
            live,
            metrics,
            settings,
            start,
            started_at: now,
            work_available: Notify::new(),
            resumed: Mutex::new(report.resumed.into_iter().collect()),
            cancel_flags: Mutex::new(HashMap::new()),
            shutting_down: AtomicBool::new(false),
            stop_workers: tokio_util_like::StopSignal::new(),
            pairing_failures: Default::default(),
            ids: Mutex::new(ulid::Generator::new()),
        };
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    /// Starts `settings.workers` workers and the purge job; returns their handles.
    pub fn spawn_background(&self) -> Vec<tokio::task::JoinHandle<()>> {
        let mut handles: Vec<_> = (0..self.inner.settings.workers.max(1))
            .map(|_| tokio::spawn(worker::run_worker(self.clone())))
            .collect();
        handles.push(tokio::spawn(crate::purge::run_purge(self.clone())));
        handles
    }

    /// What this start learnt from the store.
    pub fn start_info(&self) -> &StartInfo {
        &self.inner.start
    }

    /// When this process started.
    pub fn started_at(&self) -> Timestamp {
        self.inner.started_at
    }

    /// The settings.
    pub fn settings(&self) -> &Settings {
        &self.inner.settings
    }

    /// The store, for the HTTP edge's reads that need no rule.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// Now, by the service's clock.
    pub fn now(&self) -> Timestamp {
        self.inner.clock.now()
    }

    /// The next id, monotonic within this process so creation order is id order.
    pub(crate) fn next_ulid(&self) -> ulid::Ulid {
        let mut ids = self
            .inner
            .ids
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        ids.generate().unwrap_or_else(|_| ulid::Ulid::new())
    }

    /// Stops accepting work (new task requests get 503); reads go on.
    pub fn begin_shutdown(&self) {
        self.inner.shutting_down.store(true, Ordering::SeqCst);
        self.inner.stop_workers.raise();
        self.inner.work_available.notify_waiters();
    }

    /// Whether shutdown has begun.
    pub fn is_shutting_down(&self) -> bool {
        self.inner.shutting_down.load(Ordering::SeqCst)
    }

    /// Tasks being worked on by this process right now.
    pub fn tasks_in_flight(&self) -> usize {
        self.inner
            .cancel_flags
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Checks a bearer token against the stored hashes (a revoked client fails at once).
    pub async fn authenticate(&self, token: &str) -> Result<Caller, AppError> {
        if !looks_like_token(token) {
            return Err(AppError::Unauthorized);
        }
        let hash = Secret::new(token).hash();
        match self.inner.store.client_by_token_hash(hash).await? {
            Some(client) if client.revoked_at.is_none() => Ok(Caller {
                client_id: client.id,
                scopes: client.scopes,
            }),
            _ => Err(AppError::Unauthorized),
        }
    }

    /// Builds the task a request asks for, without storing it.
    pub async fn prepare_task(
        &self,
        caller: &Caller,
        request: &SubmitRequest,
    ) -> Result<Task, AppError> {
        caller.require(Scope::ResponsesWrite)?;
        if self.is_shutting_down() {
            return Err(AppError::ShuttingDown);
        }
        if self.inner.store.model(&request.model).await?.is_none() {
            return Err(AppError::ModelNotFound(request.model.to_string()));
        }
        let seed = request.seed.unwrap_or_else(|| rand::rngs::OsRng.next_u64());
        Ok(Task::new_queued(
            TaskId::from_ulid(self.next_ulid()),
            caller.client_id,
            request.model.clone(),
            request
                .on_restart
                .unwrap_or(self.inner.settings.default_on_restart),
            TaskSpec {
                input: request.input.clone(),
                max_output_tokens: request.max_output_tokens,
                seed,
            },
            request.metadata.clone(),
            self.now(),
        ))
    }

    /// P-2: stores a prepared task with its first event (and idempotency record) and wakes a
    /// worker. Returns only after the commit.
    pub async fn submit(
        &self,
        task: Task,
        idempotency: Option<IdempotencyRecord>,
    ) -> Result<SubmitReply, AppError> {
        if self.is_shutting_down() {
            return Err(AppError::ShuttingDown);
        }
        match self.inner.store.create_task(task, idempotency).await? {
            CreateOutcome::Created(task) => {
                self.inner.work_available.notify_one();
                Ok(SubmitReply::Created(task))
            }
            CreateOutcome::IdempotencyConflict(record) => Ok(SubmitReply::Existing(record)),
        }
    }

    /// A task the caller may see.
    pub async fn task(&self, caller: &Caller, task_id: TaskId) -> Result<Task, AppError> {
        caller.require(Scope::ResponsesRead)?;
        self.visible_task(caller, task_id).await
    }

    async fn visible_task(&self, caller: &Caller, task_id: TaskId) -> Result<Task, AppError> {
        match self.inner.store.task(task_id).await? {
            Some(task) if caller.may_see(&task) => Ok(task),
            _ => Err(AppError::NotFound),
        }
    }

    /// The caller's tasks, newest first.
    pub async fn list_tasks(
        &self,
        caller: &Caller,
        statuses: Vec<TaskStatus>,
        before: Option<TaskId>,
        limit: usize,
    ) -> Result<Page<Task>, AppError> {
        caller.require(Scope::ResponsesRead)?;
        let filter = TaskFilter {
            client_id: caller.visibility(),
            statuses,
            before,
            limit,
        };
        Ok(self.inner.store.list_tasks(filter).await?)
    }

    /// Stored events of a task after `after`.
    pub async fn events(
        &self,
        caller: &Caller,
        task_id: TaskId,
        after: u64,
        limit: usize,
    ) -> Result<Page<Event>, AppError> {
        caller.require(Scope::ResponsesRead)?;
        self.visible_task(caller, task_id).await?;
        Ok(self.inner.store.events(task_id, after, limit).await?)
    }

    /// A stored response the caller may see.
    pub async fn response(
        &self,
        caller: &Caller,
        response_id: ResponseId,
    ) -> Result<Response, AppError> {
        caller.require(Scope::ResponsesRead)?;
        let response = self
            .inner
            .store
            .response(response_id)
            .await?
            .ok_or(AppError::NotFound)?;
        self.visible_task(caller, response.task_id).await?;
        Ok(response)
    }

    /// P-4: cancels a task per API.md §4; tells its worker to stop when one runs it.
    pub async fn cancel(
        &self,
        caller: &Caller,
        task_id: TaskId,
    ) -> Result<(CancelDecision, Task), AppError> {
        caller.require(Scope::ResponsesWrite)?;
        match self
            .inner
            .store
            .cancel(task_id, caller.visibility(), self.now())
            .await?
        {
            CancelOutcome::NotFound => Err(AppError::NotFound),
            CancelOutcome::Decided {
                decision: CancelDecision::NotCancellable,
                task,
            } => Err(AppError::NotCancellable(task.status.as_str())),
            CancelOutcome::Decided { decision, task } => {
                if decision.stops_worker() {
                    let flags = self
                        .inner
                        .cancel_flags
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner);
                    if let Some(flag) = flags.get(&task_id) {
                        flag.raise();
                    }
                }
                Ok((decision, task))
            }
        }
    }

    /// The task's events after `after`: what is stored, then live ones as they commit; the
    /// stream ends after the terminal event. Nothing is yielded before it is committed, and every
    /// event is yielded once, in order. The stream is driven by its consumer (no task of its own),
    /// so a dropped consumer costs nothing further.
    pub async fn follow_events(
        &self,
        caller: &Caller,
        task_id: TaskId,
        after: u64,
    ) -> Result<BoxStream<'static, Event>, AppError> {
        caller.require(Scope::ResponsesRead)?;
        self.visible_task(caller, task_id).await?;
        let follower = Follower {
            store: Arc::clone(&self.inner.store),
            // Subscribed before the first read: an event committed in between is read or heard.
            live: self.inner.live.subscribe(task_id),
            live_events: Arc::clone(&self.inner.live),
            task_id,
            last: after,
            pending: VecDeque::new(),
            replaying: true,
            ended: false,
        };
        Ok(futures::stream::unfold(follower, Follower::next).boxed())
    }

    /// Waits until a task is finished and returns it.
    pub async fn wait_finished(&self, task_id: TaskId) -> Result<Task, AppError> {
        let mut live = self.inner.live.subscribe(task_id);
        loop {
            let task = self
                .inner
                .store
                .task(task_id)
                .await?
                .ok_or(AppError::NotFound)?;
            if task.status.is_finished() {
                return Ok(task);
            }
            // Wake on the next committed event, or re-check now and then.
            let _ = tokio::time::timeout(Duration::from_secs(1), live.recv()).await;
            if matches!(live.try_recv(), Err(broadcast::error::TryRecvError::Closed)) {
                live = self.inner.live.subscribe(task_id);
            }
        }
    }

    /// The registered models.
    pub async fn models(&self, caller: &Caller) -> Result<Vec<ModelRecord>, AppError> {
        caller.require(Scope::ModelsRead)?;
        Ok(self.inner.store.list_models().await?)
    }

    /// A registered model.
    pub async fn model(
        &self,
        caller: &Caller,
        model_id: &ModelId,
    ) -> Result<ModelRecord, AppError> {
        caller.require(Scope::ModelsRead)?;
        self.inner
            .store
            .model(model_id)
            .await?
            .ok_or(AppError::NotFound)
    }

    /// P-1: registers the file at `path` (inside the models directory, links followed) as model
    /// `model_id`, hashing it as a stream; the database keeps only its metadata and digest.
    pub async fn register_model(
        &self,
        caller: &Caller,
        model_id: ModelId,
        path: &str,
    ) -> Result<ModelRecord, AppError> {
        caller.require(Scope::ModelsWrite)?;
        // Checked first so a taken id costs no hashing; the insert checks again atomically.
        if self.inner.store.model(&model_id).await?.is_some() {
            return Err(AppError::AlreadyExists(model_id.to_string()));
        }
        let file = self.inner.model_files.fingerprint(path).await?;
        let record = ModelRecord {
            id: model_id,
            format: lmsp_domain::model::format_of_path(&file.path),
            file,
            created_at: self.now(),
        };
        if self.inner.store.insert_model(record.clone()).await? {
            Ok(record)
        } else {
            Err(AppError::AlreadyExists(record.id.to_string()))
        }
    }

    /// Forgets a model; its file is never touched (P-1).
    pub async fn delete_model(&self, caller: &Caller, model_id: &ModelId) -> Result<(), AppError> {
        caller.require(Scope::ModelsWrite)?;
        if self.inner.store.delete_model(model_id).await? {
            Ok(())
        } else {
            Err(AppError::NotFound)
        }
    }

    /// Every client (admin).
    pub async fn clients(&self, caller: &Caller) -> Result<Vec<Client>, AppError> {
        caller.require(Scope::Admin)?;
        Ok(self.inner.store.list_clients().await?)
    }

    /// Revokes a client (admin); its token stops working at once.
    pub async fn revoke_client(
        &self,
        caller: &Caller,
        client_id: ClientId,
    ) -> Result<(), AppError> {
        caller.require(Scope::Admin)?;
        if self
            .inner
            .store
            .revoke_client(client_id, self.now())
            .await?
        {
            Ok(())
        } else {
            Err(AppError::NotFound)
        }
    }

    /// The metrics in the Prometheus text format (admin), with tasks by status as stored now.
    pub async fn metrics_text(&self, caller: &Caller) -> Result<String, AppError> {
        caller.require(Scope::Admin)?;
        let counts = self.inner.store.count_by_status().await?;
        Ok(self.inner.metrics.render(&counts))
    }

    /// The service's identity.
    pub fn identity(&self) -> &ServiceIdentity {
        &self.inner.start.identity
    }
}

const REPLAY_PAGE: usize = 500;

/// The state of one event stream: replaying stored pages, then following live events; a gap or a
/// lag in the live events sends it back to the store.
struct Follower {
    store: Arc<dyn Store>,
    live: broadcast::Receiver<Arc<Event>>,
    live_events: Arc<LiveEvents>,
    task_id: TaskId,
    last: u64,
    pending: VecDeque<Event>,
    replaying: bool,
    ended: bool,
}

impl Follower {
    async fn next(mut self) -> Option<(Event, Self)> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                self.last = event.sequence_number;
                self.ended = event.kind().is_terminal();
                return Some((event, self));
            }
            if self.ended {
                return None;
            }
            if self.replaying {
                match self
                    .store
                    .events(self.task_id, self.last, REPLAY_PAGE)
                    .await
                {
                    Ok(page) if page.items.is_empty() => {
                        // Nothing stored after `last`: if the task is already finished, nothing
                        // will ever come (a reconnect at or past its terminal event), so end.
                        match self.store.task(self.task_id).await {
                            Ok(Some(task)) if !task.status.is_finished() => self.replaying = false,
                            // It finished since the read: read again what it wrote meanwhile.
                            Ok(Some(task)) if task.last_sequence_number > self.last => {}
                            Ok(_) => return None,
                            Err(error) => {
                                tracing::warn!(task_id = %self.task_id, %error, "event stream ended early");
                                return None;
                            }
                        }
                    }
                    Ok(page) => {
                        self.replaying = page.has_more;
                        self.pending.extend(page.items);
                    }
                    Err(error) => {
                        tracing::warn!(task_id = %self.task_id, %error, "event stream ended early");
                        return None;
                    }
                }
                continue;
            }
            match self.live.recv().await {
                // A terminal event at or before `last` (a stream started past the end): done.
                Ok(event) if event.sequence_number <= self.last && event.kind().is_terminal() => {
                    return None;
                }
                Ok(event) if event.sequence_number <= self.last => {}
                Ok(event) if event.sequence_number == self.last + 1 => {
                    self.pending.push_back((*event).clone());
                }
                // A gap or a lag: read the rest from the store.
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => self.replaying = true,
                // The fan-out dropped the channel (after a terminal event, or when it had no
                // listener for a moment): listen again, then catch up from the store.
                Err(broadcast::error::RecvError::Closed) => {
                    self.live = self.live_events.subscribe(self.task_id);
                    self.replaying = true;
                }
            }
        }
    }
}
