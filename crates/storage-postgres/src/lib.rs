//! The PostgreSQL storage adapter of the LMSP service: [`PostgresStore`] implements every
//! storage port of `lmsp_domain::ports` (so it is a [`lmsp_domain::ports::Store`]) for any number
//! of instances sharing one database (README's "Many instances on PostgreSQL"; docs/recovery.md).
//!
//! - Every write port method is **one transaction** (`READ COMMITTED` with row locks): it locks
//!   the rows it reads (`SELECT … FOR UPDATE`), asks the domain, and writes what the domain
//!   returns as a compare-and-set on what it read. A transaction that loses a race it cannot
//!   decide (a deadlock, a row inserted under it) is rolled back and run again.
//! - `claim_next` takes the oldest queued task with `FOR UPDATE SKIP LOCKED`: each task is
//!   claimed once across processes, and claimers never wait on each other.
//! - The maintenance leader holds a session-level advisory lock on a connection of its own.
//! - Committed events and cancels reach the other stores by `NOTIFY` (sent right after commit) and a
//!   `LISTEN` connection per store ([`StoreListener::advanced_elsewhere`],
//!   [`StoreListener::cancel_requested`]); a store's own commits reach its listener through
//!   [`StoreListener::committed`] before the write returns.
//! - The schema is versioned (`schema_migrations`), migrated at [`PostgresStore::connect`] under
//!   an advisory lock.

#![warn(missing_docs)]

mod codec;
mod error;
mod notify;
mod ops;
pub mod schema;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::future::BoxFuture;
use lmsp_domain::auth::{Client, Pairing, SecretHash};
use lmsp_domain::event::Event;
use lmsp_domain::idempotency::{
    IdempotencyKey, IdempotencyRecord, IdempotencyScope, KeyClaim, KeyDecision, StoredReply,
};
use lmsp_domain::ids::{ClientId, InstanceId, ResponseId, TaskId};
use lmsp_domain::model::{FileFingerprint, ModelId, ModelRecord};
use lmsp_domain::ports::{
    CancelOutcome, ClientStore, CommitStats, CreateOutcome, DeleteOutcome, IdempotencyStore,
    Initialized, InstanceInfo, InstanceStore, KeyedInsert, ModelStore, Page, PurgeReport,
    RecoveryReport, Redemption, Registration, ServiceIdentity, ServiceStore, Snapshot, StepOutcome,
    StoreError, StoreListener, TaskFilter, TaskStore,
};
use lmsp_domain::status::TaskStatus;
use lmsp_domain::task::{Response, Task};
use lmsp_domain::time::Timestamp;
use lmsp_domain::transition::Step;
use tokio::task::JoinHandle;
use tokio_postgres::{IsolationLevel, NoTls, Transaction};

use crate::error::DbError;
use crate::ops::Res;

pub use crate::error::DbError as PostgresError;

/// The advisory lock key the maintenance leader holds (`pg_try_advisory_lock`, session level).
const LEADER_LOCK: i64 = 0x6c6d_7370_0002;

/// How the store is opened.
#[derive(Debug, Clone)]
pub struct PostgresOptions {
    /// Pooled connections at most (each write transaction and each read takes one).
    pub pool_size: usize,
    /// How long a caller waits for a pooled connection before the store is reported
    /// unavailable.
    pub connection_timeout: Duration,
    /// Tasks per recovery transaction.
    pub recovery_batch: usize,
    /// Events one purge transaction removes at most (past its first task).
    pub purge_max_events: u64,
    /// How many times a transaction that lost a race (deadlock, concurrent insert) is run
    /// again before the error is reported.
    pub max_attempts: u32,
    /// How long the notification connection waits before reconnecting.
    pub listen_retry: Duration,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        Self {
            pool_size: 16,
            connection_timeout: Duration::from_secs(5),
            recovery_batch: 1000,
            purge_max_events: 300,
            max_attempts: 8,
            listen_retry: Duration::from_secs(1),
        }
    }
}

/// A listener that hears nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoListener;

impl StoreListener for NoListener {
    fn committed(&self, _events: &[Event]) {}
}

/// The maintenance leadership this store holds, if any: the connection whose session holds the
/// advisory lock, and the instance it leads for.
#[derive(Default)]
struct Leadership {
    conn: Option<(tokio_postgres::Client, JoinHandle<()>)>,
    holder: Option<InstanceId>,
}

impl Leadership {
    fn give_up(&mut self) {
        if let Some((client, driver)) = self.conn.take() {
            drop(client);
            driver.abort();
        }
        self.holder = None;
    }
}

/// The PostgreSQL storage adapter: a connection pool, a `LISTEN` connection, and (while it
/// leads the maintenance) the leader's connection.
pub struct PostgresStore {
    pool: deadpool_postgres::Pool,
    config: tokio_postgres::Config,
    listener: Arc<dyn StoreListener>,
    origin: Arc<str>,
    listening: JoinHandle<()>,
    leadership: tokio::sync::Mutex<Leadership>,
    options: PostgresOptions,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("database", &self.config.get_dbname())
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

/// The work of one write transaction: its reply and the events it wrote.
type Written<T> = Res<(T, Vec<Event>)>;

fn no_events<T>(value: T) -> (T, Vec<Event>) {
    (value, Vec::new())
}

fn pg(conn: &deadpool_postgres::Object) -> &tokio_postgres::Client {
    conn
}

fn pg_mut(conn: &mut deadpool_postgres::Object) -> &mut tokio_postgres::Client {
    conn
}

impl PostgresStore {
    /// Connects to the database at `url` (`postgres://user@host:port/db`), applies the
    /// migrations, starts listening for the other instances' notifications, and returns the
    /// store; what it commits, and what it hears others commit, is told to `listener`. Must be
    /// called inside a tokio runtime.
    pub async fn connect(
        url: &str,
        options: PostgresOptions,
        listener: Arc<dyn StoreListener>,
    ) -> Result<PostgresStore, StoreError> {
        let config: tokio_postgres::Config = url
            .parse()
            .map_err(|e| StoreError::Unavailable(format!("not a PostgreSQL URL: {e}")))?;
        let manager = deadpool_postgres::Manager::from_config(
            config.clone(),
            NoTls,
            deadpool_postgres::ManagerConfig {
                recycling_method: deadpool_postgres::RecyclingMethod::Fast,
            },
        );
        let pool = deadpool_postgres::Pool::builder(manager)
            .max_size(options.pool_size.max(1))
            .wait_timeout(Some(options.connection_timeout))
            .create_timeout(Some(options.connection_timeout))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .build()
            .map_err(|e| StoreError::Unavailable(format!("cannot build the pool: {e}")))?;
        {
            let mut conn = pool.get().await.map_err(DbError::from)?;
            schema::migrate(pg_mut(&mut conn)).await?;
        }
        let origin: Arc<str> = Arc::from(ulid::Ulid::new().to_string());
        let first = notify::open(&config, Arc::clone(&listener), Arc::clone(&origin)).await?;
        let listening = notify::supervise(
            first,
            config.clone(),
            Arc::clone(&listener),
            Arc::clone(&origin),
            options.listen_retry,
        );
        Ok(PostgresStore {
            pool,
            config,
            listener,
            origin,
            listening,
            leadership: tokio::sync::Mutex::new(Leadership::default()),
            options,
        })
    }

    /// Connects with a listener that hears nothing (offline commands).
    pub async fn connect_without_listener(
        url: &str,
        options: PostgresOptions,
    ) -> Result<PostgresStore, StoreError> {
        Self::connect(url, options, Arc::new(NoListener)).await
    }

    /// Closes the pool and the notification and leader connections; later calls fail as
    /// unavailable. Dropping the store does the same.
    pub async fn close(&self) {
        self.listening.abort();
        self.leadership.lock().await.give_up();
        self.pool.close();
    }

    /// The name of the database the store is connected to (as its URL gave it).
    pub fn database(&self) -> Option<String> {
        self.config.get_dbname().map(str::to_owned)
    }

    async fn conn(&self) -> Result<deadpool_postgres::Object, DbError> {
        Ok(self.pool.get().await?)
    }

    /// Runs `op` in one transaction, committing what it wrote, then notifying the other
    /// instances and telling the listener, and running it again when it lost a race (see [`DbError::is_retryable`]).
    async fn write<T, F>(&self, cancel: bool, op: F) -> Result<T, StoreError>
    where
        T: Send,
        F: for<'t> Fn(&'t Transaction<'t>) -> BoxFuture<'t, Written<T>> + Send + Sync,
    {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let started = Instant::now();
            let outcome = self.attempt(cancel, &op).await;
            let (committed, events) = match &outcome {
                Ok((_, events)) => (true, events.len()),
                Err(_) => (false, 0),
            };
            self.listener.transaction_measured(CommitStats {
                commands: 1,
                events,
                duration: started.elapsed(),
                committed,
            });
            match outcome {
                Ok((value, events)) => {
                    if !events.is_empty() {
                        self.listener.committed(&events);
                    }
                    return Ok(value);
                }
                Err(error) if error.is_retryable() && attempt < self.options.max_attempts => {
                    tokio::time::sleep(Duration::from_millis(u64::from(attempt) * 2)).await;
                }
                Err(error) => return Err(error.into()),
            }
        }
    }

    async fn attempt<T, F>(&self, cancel: bool, op: &F) -> Written<T>
    where
        T: Send,
        F: for<'t> Fn(&'t Transaction<'t>) -> BoxFuture<'t, Written<T>> + Send + Sync,
    {
        let mut conn = self.conn().await?;
        let tx = pg_mut(&mut conn)
            .build_transaction()
            .isolation_level(IsolationLevel::ReadCommitted)
            .start()
            .await?;
        match op(&tx).await {
            Ok((value, events)) => {
                tx.commit().await?;
                // After the commit, never inside it: PostgreSQL serializes the commits of
                // notifying transactions (one lock held through the WAL flush), which would
                // cap every write at one fsync at a time. The news is sent once the write is
                // durable; if it is lost (a crash in between), the other instances' polling
                // covers it.
                notify::send(pg(&conn), &self.origin, &events, cancel).await;
                Ok((value, events))
            }
            Err(error) => {
                let _ = tx.rollback().await;
                Err(error)
            }
        }
    }
}

impl Drop for PostgresStore {
    fn drop(&mut self) {
        self.listening.abort();
        if let Ok(mut leadership) = self.leadership.try_lock() {
            leadership.give_up();
        }
        self.pool.close();
    }
}

#[async_trait]
impl TaskStore for PostgresStore {
    async fn create_task(
        &self,
        task: Task,
        idempotency: Option<IdempotencyRecord>,
    ) -> Result<CreateOutcome, StoreError> {
        let at = task.created_at;
        self.write(false, move |tx| {
            let (task, idempotency) = (task.clone(), idempotency.clone());
            Box::pin(
                async move { ops::tasks::create_task(tx, &task, idempotency.as_ref(), at).await },
            )
        })
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
        self.write(false, move |tx| {
            let (steps, snapshot) = (steps.clone(), snapshot.clone());
            Box::pin(async move {
                ops::tasks::append(
                    tx,
                    task_id,
                    by,
                    Some(expected_last_sequence),
                    &steps,
                    snapshot.as_ref(),
                    at,
                )
                .await
            })
        })
        .await
    }

    async fn finish(
        &self,
        task_id: TaskId,
        by: InstanceId,
        step: Step,
        at: Timestamp,
    ) -> Result<StepOutcome, StoreError> {
        self.write(false, move |tx| {
            let step = step.clone();
            Box::pin(async move {
                ops::tasks::append(tx, task_id, by, None, std::slice::from_ref(&step), None, at)
                    .await
            })
        })
        .await
    }

    async fn claim_next(&self, by: InstanceId, at: Timestamp) -> Result<Option<Task>, StoreError> {
        self.write(false, move |tx| {
            Box::pin(async move { ops::tasks::claim_next(tx, by, at).await })
        })
        .await
    }

    async fn cancel(
        &self,
        task_id: TaskId,
        client_id: Option<ClientId>,
        at: Timestamp,
    ) -> Result<CancelOutcome, StoreError> {
        self.write(true, move |tx| {
            Box::pin(async move { ops::tasks::cancel(tx, task_id, client_id, at).await })
        })
        .await
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
        let conn = self.conn().await?;
        Ok(ops::load_task(pg(&conn), task_id).await?)
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
        let mut conn = self.conn().await?;
        // One snapshot: the events and the task and response they are rebuilt from agree even
        // while a purge or a writer runs.
        let tx = pg_mut(&mut conn)
            .build_transaction()
            .isolation_level(IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await
            .map_err(DbError::from)?;
        let page = ops::events::events_in(&tx, task_id, after, limit).await?;
        tx.commit().await.map_err(DbError::from)?;
        Ok(page)
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
        let conn = self.conn().await?;
        Ok(ops::clients::client_by_token_hash(pg(&conn), &hash).await?)
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
        let conn = self.conn().await?;
        Ok(ops::models::model(pg(&conn), model_id).await?)
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
        let mut report = RecoveryReport::default();
        let mut cursor = Some(ops::instances::RecoveryCursor::START);
        let limit = self.options.recovery_batch.max(1);
        while let Some(from) = cursor {
            let (part, next) = self
                .write(false, move |tx| {
                    Box::pin(async move {
                        ops::instances::recover_batch(tx, stopped, rescuer, at, from, limit).await
                    })
                })
                .await?;
            report.absorb(part);
            cursor = next;
        }
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
