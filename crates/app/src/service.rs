//! The running service: its settings, its adapters, startup (initialize, register the instance,
//! recover, models), the background jobs, and shutdown.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use lmsp_domain::auth::{Scope, Scopes, Secret};
use lmsp_domain::ports::{
    Clock, Engine, EngineHealth, InstanceInfo, ModelFiles, RecoveryReport, Registration,
    ServiceIdentity, Store,
};
use lmsp_domain::{EngineKind, InstanceId, RestartPolicy, ServiceId, TaskId, Timestamp};

use crate::credentials::new_client;
use crate::error::AppError;
use crate::listener::Listener;
use crate::retry::RetryPolicy;

/// How the service behaves; built by the binary from flags and environment.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Tasks run at once (at least 1).
    pub workers: usize,
    /// How long finished tasks are kept.
    pub retention: Duration,
    /// How often the purge job runs.
    pub purge_interval: Duration,
    /// How long idempotency keys are kept.
    pub idempotency_ttl: Duration,
    /// How long a request may hold its idempotency key at most (it is released when the request
    /// is answered, and when its instance stops).
    pub idempotency_hold: Duration,
    /// The policy of tasks whose request names none.
    pub default_on_restart: RestartPolicy,
    /// The version string shown by `GET /v1/service`.
    pub version: String,
    /// This instance's stable name (its incarnations share it).
    pub instance_name: String,
    /// How long an instance's lease runs without renewal.
    pub lease: Duration,
    /// For a store shared by several processes: how often to look for what notifications may
    /// have missed (cancels, events); `None` for a single-process store, whose notices are exact.
    pub poll_fallback: Option<Duration>,
    /// How store writes of a running task are retried when the store cannot commit.
    pub store_retry: RetryPolicy,
    /// How long a worker waits, after a cancel, for its engine to stop before it drops it.
    pub engine_stop_grace: Duration,
}

impl Settings {
    /// Settings with the defaults of `lmsp serve`.
    pub fn with_defaults(version: impl Into<String>) -> Self {
        Self {
            workers: 4,
            retention: Duration::from_secs(7 * 24 * 3600),
            purge_interval: Duration::from_secs(60),
            idempotency_ttl: Duration::from_secs(24 * 3600),
            idempotency_hold: Duration::from_secs(600),
            default_on_restart: RestartPolicy::Fail,
            version: version.into(),
            instance_name: String::from("lmsp"),
            lease: Duration::from_secs(10),
            poll_fallback: None,
            store_retry: RetryPolicy::default(),
            engine_stop_grace: Duration::from_secs(30),
        }
    }
}

/// The engines, by the kind of model they run.
#[derive(Clone, Default)]
pub struct Engines {
    by_kind: HashMap<EngineKind, Arc<dyn Engine>>,
}

impl std::fmt::Debug for Engines {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.by_kind.keys()).finish()
    }
}

impl Engines {
    /// No engine.
    pub fn new() -> Self {
        Self::default()
    }

    /// With `engine` running the models of `kind`.
    pub fn with(mut self, kind: EngineKind, engine: Arc<dyn Engine>) -> Self {
        self.by_kind.insert(kind, engine);
        self
    }

    /// The engine of `kind`, if this service has one.
    pub fn get(&self, kind: EngineKind) -> Option<&Arc<dyn Engine>> {
        self.by_kind.get(&kind)
    }

    /// Whether the service runs models of `kind`.
    pub fn runs(&self, kind: EngineKind) -> bool {
        self.by_kind.contains_key(&kind)
    }

    /// The engine the service was started for: the upstream or llama.cpp engine when it has
    /// one (at most one of them runs beside the reference engine), else the reference engine.
    pub fn primary(&self) -> Option<(EngineKind, &Arc<dyn Engine>)> {
        [
            EngineKind::Upstream,
            EngineKind::Llama,
            EngineKind::Reference,
        ]
        .into_iter()
        .find_map(|kind| self.get(kind).map(|engine| (kind, engine)))
    }
}

/// The adapters the service runs on.
#[derive(Clone)]
pub struct Adapters {
    /// The store.
    pub store: Arc<dyn Store>,
    /// The engines.
    pub engines: Engines,
    /// The model files.
    pub model_files: Arc<dyn ModelFiles>,
    /// The clock.
    pub clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for Adapters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Adapters")
            .field("engines", &self.engines)
            .finish_non_exhaustive()
    }
}

/// A started service and what starting it found.
#[derive(Debug)]
pub struct Started {
    /// The service, ready to serve (call [`Service::spawn_background`]).
    pub service: Service,
    /// The token of the `admin` client, when this start created it (shown once).
    pub admin_token: Option<Secret>,
    /// What recovery did.
    pub recovery: RecoveryReport,
}

pub(crate) struct Inner {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) engines: Engines,
    pub(crate) model_files: Arc<dyn ModelFiles>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) listener: Arc<Listener>,
    pub(crate) settings: Settings,
    pub(crate) identity: ServiceIdentity,
    pub(crate) instance: InstanceId,
    pub(crate) started_at: Timestamp,
    pub(crate) work_available: Notify,
    pub(crate) resumed: Mutex<VecDeque<TaskId>>,
    pub(crate) shutting_down: AtomicBool,
    /// Workers stop taking new work.
    pub(crate) stop_taking_work: CancellationToken,
    /// Everything stops now (the grace has passed): running tasks are left for recovery.
    pub(crate) stop_now: CancellationToken,
    /// Raised when the service cannot go on (its lease was lost): the process must exit.
    pub(crate) fatal: CancellationToken,
    /// The background jobs and the jobs of requests that outlive their request.
    pub(crate) tracker: TaskTracker,
    /// The workers (their supervisors). After `begin_shutdown` a worker ends as soon as it has
    /// no task, so this process runs no task once they have all ended.
    pub(crate) workers: TaskTracker,
    ids: Mutex<ulid::Generator>,
}

/// The running service: cheap to clone, shared by every request handler and worker.
#[derive(Clone)]
pub struct Service {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("id", &self.inner.identity.id)
            .field("instance", &self.inner.instance)
            .finish()
    }
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

impl Service {
    /// Starts the service on its adapters: initializes the store (identity and the `admin`
    /// client, in one transaction), registers this instance, recovers every stopped instance's
    /// leftover tasks to completion (P-7), and registers the built-in reference model and the
    /// model files of the models directory. Returns the service ready to serve; call
    /// [`Service::spawn_background`] to start the workers and the jobs.
    ///
    /// `listener` must be the one the store reports its commits to.
    pub async fn start(
        adapters: Adapters,
        listener: Arc<Listener>,
        settings: Settings,
    ) -> Result<Started, AppError> {
        let Adapters {
            store,
            engines,
            model_files,
            clock,
        } = adapters;
        let now = clock.now();
        let (admin, admin_token) = new_client("admin", Scopes::new([Scope::Admin]), now);
        let candidate = ServiceIdentity {
            id: ServiceId::from_ulid(ulid::Ulid::new()),
            created_at: now,
        };
        let initialized = store.initialize(candidate, admin).await?;
        let instance = InstanceId::from_ulid(ulid::Ulid::new());
        let previous = register(store.as_ref(), clock.as_ref(), &settings, instance).await?;
        let inner = Inner {
            store,
            engines,
            model_files,
            clock,
            listener,
            settings,
            identity: initialized.identity,
            instance,
            started_at: now,
            work_available: Notify::new(),
            resumed: Mutex::new(VecDeque::new()),
            shutting_down: AtomicBool::new(false),
            stop_taking_work: CancellationToken::new(),
            stop_now: CancellationToken::new(),
            fatal: CancellationToken::new(),
            tracker: TaskTracker::new(),
            workers: TaskTracker::new(),
            ids: Mutex::new(ulid::Generator::new()),
        };
        let service = Self {
            inner: Arc::new(inner),
        };
        let mut recovery = RecoveryReport::default();
        for stopped in previous {
            recovery.absorb(service.recover(stopped).await?);
        }
        recovery.absorb(service.recover_stopped_instances().await?);
        tracing::info!(
            moved = recovery.moved - recovery.resumed.len() as u64,
            resumed = recovery.resumed.len(),
            untouched = recovery.untouched,
            "recovery finished"
        );
        service.inner.listener.metrics.record_recovery(&recovery);
        service.register_builtin_models().await;
        Ok(Started {
            service,
            admin_token: initialized.first_start.then_some(admin_token),
            recovery,
        })
    }

    /// Recovers one stopped instance; its resumed tasks go to this instance's workers first.
    pub(crate) async fn recover(&self, stopped: InstanceId) -> Result<RecoveryReport, AppError> {
        let inner = &self.inner;
        let report = inner
            .store
            .recover_instance(stopped, inner.instance, self.now())
            .await?;
        if !report.resumed.is_empty() {
            inner
                .resumed
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .extend(report.resumed.iter().copied());
            inner.work_available.notify_waiters();
        }
        Ok(report)
    }

    /// Recovers every instance the store knows to have stopped.
    pub(crate) async fn recover_stopped_instances(&self) -> Result<RecoveryReport, AppError> {
        let stopped = self
            .inner
            .store
            .stopped_instances(self.inner.instance, self.now())
            .await?;
        let mut report = RecoveryReport::default();
        for instance in stopped {
            report.absorb(self.recover(instance).await?);
        }
        Ok(report)
    }

    /// Starts the workers and the background jobs: purge, lease renewal, the rescuer of stopped
    /// instances, the health probe and, for a shared store, the poll for missed cancels.
    pub fn spawn_background(&self) {
        let tracker = &self.inner.tracker;
        for _ in 0..self.inner.settings.workers.max(1) {
            crate::worker::spawn_worker(self.clone());
        }
        tracker.spawn(crate::purge::run_purge(self.clone()));
        tracker.spawn(crate::jobs::run_lease(self.clone()));
        tracker.spawn(crate::jobs::run_rescuer(self.clone()));
        tracker.spawn(crate::jobs::run_health_probe(self.clone()));
        if let Some(every) = self.inner.settings.poll_fallback {
            tracker.spawn(crate::jobs::run_cancel_poll(self.clone(), every));
        }
    }

    /// Stops accepting work: new task requests get 503 and workers take no new task; reads and
    /// running tasks go on.
    pub fn begin_shutdown(&self) {
        self.inner.shutting_down.store(true, Ordering::SeqCst);
        self.inner.stop_taking_work.cancel();
        self.inner.work_available.notify_waiters();
    }

    /// After [`Service::begin_shutdown`]: waits until no task runs here any more (every worker
    /// has finished its task and ended), or `grace` has passed; `true` when none runs. Woken by
    /// the last worker's end, not by polling. (Before `begin_shutdown` workers never end, and
    /// this waits out the grace.)
    pub async fn wait_until_idle(&self, grace: Duration) -> bool {
        let workers = &self.inner.workers;
        workers.close();
        tokio::time::timeout(grace, workers.wait()).await.is_ok()
    }

    /// Stops everything: running tasks are left for recovery; then ends this instance's lease so
    /// that others (or the next start) recover what is left.
    pub async fn stop(&self) {
        self.begin_shutdown();
        self.inner.stop_now.cancel();
        let (workers, jobs) = (&self.inner.workers, &self.inner.tracker);
        workers.close();
        jobs.close();
        let ended = async { tokio::join!(workers.wait(), jobs.wait()) };
        let _ = tokio::time::timeout(Duration::from_secs(5), ended).await;
        if let Err(error) = self
            .inner
            .store
            .retire_instance(self.inner.instance, self.now())
            .await
        {
            tracing::warn!(%error, "could not end this instance's lease");
        }
    }

    /// Resolves when the service stops for good (the shutdown grace has passed): waiting
    /// requests and open streams end then.
    pub fn stopping(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.inner.stop_now.clone().cancelled_owned()
    }

    /// Resolves when the service cannot go on (its lease was lost to another instance): the
    /// process should exit non-zero so that a supervisor starts it afresh.
    pub async fn failed(&self) {
        self.inner.fatal.cancelled().await;
    }

    /// Whether shutdown has begun.
    pub fn is_shutting_down(&self) -> bool {
        self.inner.shutting_down.load(Ordering::SeqCst)
    }

    /// Tasks being worked on by this process right now.
    pub fn tasks_in_flight(&self) -> usize {
        self.inner.listener.running.count()
    }

    /// This service's identity.
    pub fn identity(&self) -> &ServiceIdentity {
        &self.inner.identity
    }

    /// This process's instance id.
    pub fn instance(&self) -> InstanceId {
        self.inner.instance
    }

    /// When this process started.
    pub fn started_at(&self) -> Timestamp {
        self.inner.started_at
    }

    /// The settings.
    pub fn settings(&self) -> &Settings {
        &self.inner.settings
    }

    /// Whether the store accepts commits (health).
    pub fn store_is_healthy(&self) -> bool {
        self.inner.listener.health.is_healthy()
    }

    /// Whether this service runs models of `kind`.
    pub fn runs(&self, kind: EngineKind) -> bool {
        self.inner.engines.runs(kind)
    }

    /// The primary engine (see [`Engines::primary`]) and whether it can take work now, or
    /// `None` for a service without engines. Bounded in time: an engine that asks another
    /// server caches its answer.
    pub async fn engine_health(&self) -> Option<(EngineKind, EngineHealth)> {
        let (kind, engine) = self.inner.engines.primary()?;
        Some((kind, engine.health().await))
    }

    /// Now, by the service's clock.
    pub fn now(&self) -> Timestamp {
        self.inner.clock.now()
    }

    /// `now` plus `duration`.
    pub(crate) fn after(&self, duration: Duration) -> Timestamp {
        self.now().plus_millis(millis(duration))
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
}

/// Registers this instance. When another incarnation of the same name still holds a lease (it
/// crashed a moment ago, or it runs), waits for that lease to run out once, then tries again.
async fn register(
    store: &dyn Store,
    clock: &dyn Clock,
    settings: &Settings,
    instance: InstanceId,
) -> Result<Vec<InstanceId>, AppError> {
    for attempt in 0..2 {
        let now = clock.now();
        let info = InstanceInfo {
            id: instance,
            name: settings.instance_name.clone(),
            started_at: now,
            lease_until: now.plus_millis(millis(settings.lease)),
        };
        match store.register_instance(info).await? {
            Registration::Registered { previous } => return Ok(previous),
            Registration::NameInUse { lease_until } if attempt == 0 => {
                let wait = lease_until.millis_since(now) + 100;
                tracing::warn!(
                    name = %settings.instance_name,
                    wait_ms = wait,
                    "an instance of this name holds a lease; waiting for it to run out"
                );
                tokio::time::sleep(Duration::from_millis(wait)).await;
            }
            Registration::NameInUse { .. } => break,
        }
    }
    Err(AppError::InstanceNameInUse(settings.instance_name.clone()))
}
