//! The running service: its adapters, startup (initialize, register the instance, recover,
//! models), the workers and background jobs, and shutdown. The model use cases are [`Models`]'s;
//! the other use cases are `impl Service` blocks of their own modules (tasks, submitting,
//! following, clients, pairing, files and batches), which read the parts held here.

use std::sync::Arc;
use std::time::Duration;

use lmsp_domain::auth::{Scope, Scopes, Secret};
use lmsp_domain::ports::{
    Clock, EngineHealth, FileContents, InstanceInfo, ModelFiles, RecoveryReport, Registration,
    ServiceIdentity, Store, WebhookSender,
};
use lmsp_domain::{EngineKind, InstanceId, ServiceId, Timestamp};

use crate::batches::BatchWire;
use crate::credentials::new_client;
use crate::engines::Engines;
use crate::error::AppError;
use crate::jobs;
use crate::lifecycle::Lifecycle;
use crate::listener::Listener;
use crate::models::Models;
use crate::settings::Settings;
use crate::shared::{millis, Core};
use crate::worker::Workers;

/// The adapters the service runs on.
#[derive(Clone)]
pub struct Adapters {
    /// The store.
    pub store: Arc<dyn Store>,
    /// The engines.
    pub engines: Engines,
    /// The model files.
    pub model_files: Arc<dyn ModelFiles>,
    /// Where uploaded and written files' bytes are kept.
    pub file_contents: Arc<dyn FileContents>,
    /// How batch lines are read and answered (the driving adapter's request shapes).
    pub batch_wire: Arc<dyn BatchWire>,
    /// How webhook deliveries are sent.
    pub webhook_sender: Arc<dyn WebhookSender>,
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

/// The parts of the running service, each owning what changes together.
pub(crate) struct Inner {
    /// The ports, the settings and this instance's id: what every part shares.
    pub(crate) core: Arc<Core>,
    /// When this process stops taking work, stops, or fails; and the jobs it waits for.
    pub(crate) life: Arc<Lifecycle>,
    /// The worker pool.
    pub(crate) workers: Workers,
    /// The registered models and the model files.
    pub(crate) models: Models,
    /// This service's identity.
    pub(crate) identity: ServiceIdentity,
    /// When this process started.
    pub(crate) started_at: Timestamp,
    /// Files' bytes.
    pub(crate) contents: Arc<dyn FileContents>,
    /// Batch lines' reading and answers.
    pub(crate) batch_wire: Arc<dyn BatchWire>,
    /// Wakes the batch upkeep (a batch was created or cancelled).
    pub(crate) batch_upkeep: tokio::sync::Notify,
    /// Sends webhook deliveries.
    pub(crate) webhook_sender: Arc<dyn WebhookSender>,
}

/// The running service: cheap to clone, shared by every request handler.
#[derive(Clone)]
pub struct Service {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("id", &self.inner.identity.id)
            .field("instance", &self.inner.core.instance)
            .finish()
    }
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
            file_contents,
            batch_wire,
            webhook_sender,
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
        let core = Arc::new(Core::new(store, clock, listener, settings, instance));
        let life = Arc::new(Lifecycle::default());
        let models = Models::new(Arc::clone(&core), model_files);
        let workers = Workers::new(
            Arc::clone(&core),
            Arc::clone(&life),
            engines,
            models.clone(),
        );
        let mut recovery = RecoveryReport::default();
        for stopped in previous {
            recovery.absorb(jobs::recover(&core, &workers, stopped).await?);
        }
        recovery.absorb(jobs::recover_stopped_instances(&core, &workers).await?);
        tracing::info!(
            moved = recovery.moved - recovery.resumed.len() as u64,
            resumed = recovery.resumed.len(),
            untouched = recovery.untouched,
            "recovery finished"
        );
        core.listener.metrics.record_recovery(&recovery);
        models.register_builtin().await;
        let inner = Inner {
            core,
            life,
            workers,
            models,
            identity: initialized.identity,
            started_at: now,
            contents: file_contents,
            batch_wire,
            batch_upkeep: tokio::sync::Notify::new(),
            webhook_sender,
        };
        Ok(Started {
            service: Self {
                inner: Arc::new(inner),
            },
            admin_token: initialized.first_start.then_some(admin_token),
            recovery,
        })
    }

    /// Starts the workers and the background jobs: purge, lease renewal, the rescuer of stopped
    /// instances, the health probe and, for a shared store, the poll for missed cancels.
    pub fn spawn_background(&self) {
        let Inner {
            core,
            life,
            workers,
            ..
        } = self.inner.as_ref();
        workers.spawn(core.settings.workers);
        let jobs = &life.jobs;
        let (core, life) = (Arc::clone(core), Arc::clone(life));
        jobs.spawn(crate::purge::run_purge(
            Arc::clone(&core),
            Arc::clone(&life),
            Arc::clone(&self.inner.contents),
        ));
        jobs.spawn(self.clone().run_batch_upkeep());
        jobs.spawn(self.clone().run_deliverer());
        jobs.spawn(jobs::run_lease(Arc::clone(&core), Arc::clone(&life)));
        jobs.spawn(jobs::run_rescuer(
            Arc::clone(&core),
            Arc::clone(&life),
            workers.clone(),
        ));
        jobs.spawn(jobs::run_health_probe(Arc::clone(&core), Arc::clone(&life)));
        if let Some(every) = core.settings.poll_fallback {
            jobs.spawn(jobs::run_cancel_poll(core, life, every));
        }
    }

    /// Stops accepting work: new task requests get 503 and workers take no new task; reads and
    /// running tasks go on.
    pub fn begin_shutdown(&self) {
        self.inner.life.stop_taking_work.cancel();
        self.inner.workers.wake_all();
    }

    /// After [`Service::begin_shutdown`]: waits until no task runs here any more (every worker
    /// has finished its task and ended), or `grace` has passed; `true` when none runs. Woken by
    /// the last worker's end, not by polling. (Before `begin_shutdown` workers never end, and
    /// this waits out the grace.)
    pub async fn wait_until_idle(&self, grace: Duration) -> bool {
        let ended = self.inner.workers.ended();
        tokio::time::timeout(grace, ended).await.is_ok()
    }

    /// Stops everything: running tasks are left for recovery; then ends this instance's lease so
    /// that others (or the next start) recover what is left.
    pub async fn stop(&self) {
        self.begin_shutdown();
        let Inner {
            core,
            life,
            workers,
            ..
        } = self.inner.as_ref();
        life.stop_now.cancel();
        life.jobs.close();
        let ended = async { tokio::join!(workers.ended(), life.jobs.wait()) };
        let _ = tokio::time::timeout(Duration::from_secs(5), ended).await;
        if let Err(error) = core.store.retire_instance(core.instance, core.now()).await {
            tracing::warn!(%error, "could not end this instance's lease");
        }
    }

    /// Resolves when the service stops for good (the shutdown grace has passed): waiting
    /// requests and open streams end then.
    pub fn stopping(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.inner.life.stop_now.clone().cancelled_owned()
    }

    /// Resolves when the service cannot go on (its lease was lost to another instance): the
    /// process should exit non-zero so that a supervisor starts it afresh.
    pub async fn failed(&self) {
        self.inner.life.fatal.cancelled().await;
    }

    /// Whether shutdown has begun.
    pub fn is_shutting_down(&self) -> bool {
        self.inner.life.is_shutting_down()
    }

    /// Tasks being worked on by this process right now.
    pub fn tasks_in_flight(&self) -> usize {
        self.inner.core.listener.running.count()
    }

    /// This service's identity.
    pub fn identity(&self) -> &ServiceIdentity {
        &self.inner.identity
    }

    /// This process's instance id.
    pub fn instance(&self) -> InstanceId {
        self.inner.core.instance
    }

    /// When this process started.
    pub fn started_at(&self) -> Timestamp {
        self.inner.started_at
    }

    /// The settings.
    pub fn settings(&self) -> &Settings {
        &self.inner.core.settings
    }

    /// Whether the store accepts commits (health).
    pub fn store_is_healthy(&self) -> bool {
        self.inner.core.listener.health.is_healthy()
    }

    /// Whether this service runs models of `kind`.
    pub fn runs(&self, kind: EngineKind) -> bool {
        self.inner.workers.engines().runs(kind)
    }

    /// The primary engine (see [`Engines::primary`]) and whether it can take work now, or
    /// `None` for a service without engines. Bounded in time: an engine that asks another
    /// server caches its answer.
    pub async fn engine_health(&self) -> Option<(EngineKind, EngineHealth)> {
        let (kind, engine) = self.inner.workers.engines().primary()?;
        Some((kind, engine.health().await))
    }

    /// Now, by the service's clock.
    pub fn now(&self) -> Timestamp {
        self.inner.core.now()
    }

    /// The model use cases: the registered models, registering and forgetting them.
    pub fn models(&self) -> &Models {
        &self.inner.models
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
