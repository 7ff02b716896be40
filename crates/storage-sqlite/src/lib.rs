//! The SQLite storage adapter of the LMSP service: [`SqliteStore`] implements every storage port
//! of `lmsp_domain::ports` (so it is a [`lmsp_domain::ports::Store`]).
//!
//! Writes go to one writer thread that commits every pending command in one `BEGIN IMMEDIATE`
//! transaction with a savepoint per command (group commit) and only then answers the callers and
//! tells the [`StoreListener`]; a writer whose write path fails is restarted on a fresh connection,
//! within a budget, and past it gives up visibly ([`SqliteStore::writer_status`]). Reads use a
//! small pool of read-only connections on tokio's blocking threads; point reads of one small row (a
//! client by its token hash, a model) run on the caller's thread from a pool of their own, with no
//! hand-off and so no wake-ups. SQLite serves one process: the data directory's lock (taken by the
//! binary before the store is opened) keeps a second one out, so every instance but the current one
//! is stopped. All SQL of the service lives in this crate and `lmsp-storage-postgres`.

mod codec;
mod error;
mod ops;
mod reads;
pub mod schema;
mod writer;

use std::path::Path;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use async_trait::async_trait;
use lmsp_domain::auth::{Client, Pairing, SecretHash};
use lmsp_domain::event::Event;
use lmsp_domain::idempotency::{
    IdempotencyKey, IdempotencyRecord, IdempotencyScope, KeyClaim, KeyDecision, StoredReply,
};
use lmsp_domain::ids::{ClientId, InstanceId, ResponseId, TaskId};
use lmsp_domain::model::{FileFingerprint, ModelId, ModelRecord};
use lmsp_domain::ports::{
    CancelOutcome, ClientStore, CreateOutcome, DeleteOutcome, IdempotencyStore, Initialized,
    InstanceInfo, InstanceStore, KeyedInsert, ModelStore, Page, PurgeReport, RecoveryReport,
    Redemption, Registration, ServiceIdentity, ServiceStore, Snapshot, StepOutcome, StoreError,
    StoreListener, TaskFilter, TaskStore,
};
use lmsp_domain::status::TaskStatus;
use lmsp_domain::task::{Response, Task};
use lmsp_domain::time::Timestamp;
use lmsp_domain::transition::Step;
use rusqlite::Connection;

use crate::error::DbError;
use crate::reads::ReadPool;
use crate::writer::{Command, Typed, Work};
pub use crate::writer::{RestartBudget, WriterStatus};

/// How hard a commit waits for the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SyncMode {
    /// `synchronous=FULL`: every commit is fsync'd (the default; survives power loss).
    #[default]
    Full,
    /// `synchronous=NORMAL`: in WAL mode survives a process crash, may lose the last commits on
    /// power loss.
    Normal,
}

/// How the store is opened.
#[derive(Debug, Clone)]
pub struct SqliteOptions {
    /// The `synchronous` pragma.
    pub sync: SyncMode,
    /// How many read-only connections are kept, and so how many reads run at once.
    pub read_connections: usize,
    /// How long a connection waits for a lock (`busy_timeout`).
    pub busy_timeout: Duration,
    /// Tasks per recovery transaction.
    pub recovery_batch: usize,
    /// Events one purge transaction removes at most (past its first task), so that writers
    /// never wait long behind a purge (I-4): 300 keeps one transaction near a millisecond here.
    pub purge_max_events: u64,
    /// Caps the database size (`PRAGMA max_page_count`); `None` leaves SQLite's default. Tests
    /// use it to provoke a full disk.
    pub max_page_count: Option<u32>,
    /// How often a writer whose write path failed is restarted on a fresh connection before it
    /// gives up (see [`SqliteStore::writer_status`]).
    pub writer_restarts: RestartBudget,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        Self {
            sync: SyncMode::Full,
            read_connections: 8,
            busy_timeout: Duration::from_secs(5),
            recovery_batch: 1000,
            purge_max_events: 300,
            max_page_count: None,
            writer_restarts: RestartBudget::default(),
        }
    }
}

/// A listener that hears nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoListener;

impl StoreListener for NoListener {
    fn committed(&self, _events: &[Event]) {}
}

/// The SQLite storage adapter.
pub struct SqliteStore {
    sender: Mutex<Option<Sender<Box<dyn Command>>>>,
    writer: Mutex<Option<JoinHandle<()>>>,
    writer_status: tokio::sync::watch::Receiver<WriterStatus>,
    reads: Arc<ReadPool>,
    read_permits: tokio::sync::Semaphore,
    point_reads: ReadPool,
    recovery_batch: usize,
    purge_max_events: u64,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.reads.path)
            .finish_non_exhaustive()
    }
}

fn configure_writer(conn: &Connection, options: &SqliteOptions) -> Result<(), DbError> {
    conn.busy_timeout(options.busy_timeout)?;
    let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |row| row.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(DbError::Corrupt(format!("journal_mode is {mode}, not wal")));
    }
    let sync = match options.sync {
        SyncMode::Full => "FULL",
        SyncMode::Normal => "NORMAL",
    };
    conn.pragma_update(None, "synchronous", sync)?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    conn.pragma_update(None, "wal_autocheckpoint", 1000)?;
    // Each command runs in a savepoint, whose statement journal (the pages it changed, for a
    // rollback to the savepoint) SQLite spills to a temporary file past 64 KiB: a recovery or
    // purge batch wrote every page it touched there. It is never needed after a crash (the WAL
    // is the durable log), so it stays in memory.
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    conn.set_prepared_statement_cache_capacity(128);
    Ok(())
}

/// Applies the size cap of the options, if any (after the migrations, which it must not stop).
fn cap_pages(conn: &Connection, options: &SqliteOptions) -> Result<(), DbError> {
    if let Some(pages) = options.max_page_count {
        conn.query_row(&format!("PRAGMA max_page_count = {pages}"), [], |_| Ok(()))?;
    }
    Ok(())
}

/// A fresh write connection on `path`, configured like the first; the schema is there already.
fn open_writer(path: &Path, options: &SqliteOptions) -> Result<Connection, DbError> {
    let conn = Connection::open(path)?;
    configure_writer(&conn, options)?;
    cap_pages(&conn, options)?;
    Ok(conn)
}

impl SqliteStore {
    /// Opens (creating and migrating if needed) the database at `path`; what it commits is told
    /// to `listener`.
    pub fn open(
        path: &Path,
        options: SqliteOptions,
        listener: Arc<dyn StoreListener>,
    ) -> Result<SqliteStore, StoreError> {
        let mut conn = Connection::open(path).map_err(DbError::from)?;
        configure_writer(&conn, &options)?;
        schema::migrate(&mut conn)?;
        cap_pages(&conn, &options)?;
        let (sender, receiver) = std::sync::mpsc::channel::<Box<dyn Command>>();
        let (status, writer_status) = tokio::sync::watch::channel(WriterStatus::default());
        let reopen: writer::Reopen = {
            let (path, options) = (path.to_path_buf(), options.clone());
            Box::new(move || open_writer(&path, &options))
        };
        let budget = options.writer_restarts;
        let writer = std::thread::Builder::new()
            .name(String::from("lmsp-sqlite-writer"))
            .spawn(move || {
                writer::supervise(conn, reopen, receiver, listener, budget, Arc::new(status));
            })
            .map_err(|e| StoreError::Unavailable(format!("cannot start the writer: {e}")))?;
        let reads = Arc::new(ReadPool::new(
            path.to_path_buf(),
            options.busy_timeout,
            options.read_connections,
        ));
        // Point reads run on the caller's thread, at most one per thread at a time: keep one
        // connection per core, which is how many runtime threads there are by default.
        let cores = std::thread::available_parallelism().map_or(2, std::num::NonZeroUsize::get);
        let point_reads = ReadPool::new(path.to_path_buf(), options.busy_timeout, cores);
        Ok(SqliteStore {
            sender: Mutex::new(Some(sender)),
            writer: Mutex::new(Some(writer)),
            writer_status,
            read_permits: tokio::sync::Semaphore::new(reads.size()),
            point_reads,
            reads,
            recovery_batch: options.recovery_batch.max(1),
            purge_max_events: options.purge_max_events.max(1),
        })
    }

    /// Opens the store with a listener that hears nothing.
    pub fn open_without_listener(
        path: &Path,
        options: SqliteOptions,
    ) -> Result<SqliteStore, StoreError> {
        Self::open(path, options, Arc::new(NoListener))
    }

    /// Stops the writer after the commands already queued; later writes fail as unavailable.
    pub fn close(&self) {
        if let Ok(mut sender) = self.sender.lock() {
            sender.take();
        }
        let handle = self.writer.lock().ok().and_then(|mut writer| writer.take());
        if let Some(handle) = handle {
            let _ = handle.join();
        }
    }

    /// The writer's restarts and, once it has given up, why: a watch that changes with them.
    /// A writer that gave up never comes back; the process should exit non-zero so that its
    /// supervisor starts it afresh.
    pub fn writer_status(&self) -> tokio::sync::watch::Receiver<WriterStatus> {
        self.writer_status.clone()
    }

    /// Test seam, never used by the service: makes the write path itself fail once (a panic
    /// outside any command), as a bug in the writer would, so that tests can watch the writer
    /// be restarted or give up.
    #[doc(hidden)]
    pub fn fail_writer_for_tests(&self) -> Result<(), StoreError> {
        self.send(Box::new(writer::FailTheWriter))
    }

    fn send(&self, command: Box<dyn Command>) -> Result<(), StoreError> {
        let guard = self
            .sender
            .lock()
            .map_err(|_| StoreError::Unavailable(String::from("the writer lock is poisoned")))?;
        let sender = guard
            .as_ref()
            .ok_or_else(|| StoreError::Unavailable(String::from("the store is closed")))?;
        sender.send(command).map_err(|_| {
            let stopped = self.writer_status.borrow().stopped.clone();
            StoreError::Unavailable(match stopped {
                Some(reason) => format!("the writer has stopped: {reason}"),
                None => String::from("the writer has stopped"),
            })
        })
    }

    async fn write<T: Send + 'static>(&self, work: Work<T>) -> Result<T, StoreError> {
        let (command, rx) = Typed::new(work);
        self.send(Box::new(command))?;
        rx.await.map_err(|_| {
            let stopped = self.writer_status.borrow().stopped.clone();
            StoreError::Unavailable(match stopped {
                Some(reason) => format!("the writer has stopped: {reason}"),
                None => String::from("the writer failed before it answered"),
            })
        })?
    }

    async fn read<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, DbError> + Send + 'static,
    {
        // At most `read_connections` reads at once, so each finds an idle connection instead of
        // opening (and parsing the schema of) a new one; the others wait their turn here.
        let _permit = self
            .read_permits
            .acquire()
            .await
            .map_err(|_| StoreError::Unavailable(String::from("the store is closed")))?;
        let reads = Arc::clone(&self.reads);
        tokio::task::spawn_blocking(move || reads.with(f))
            .await
            .map_err(|e| StoreError::Unavailable(format!("read task failed: {e}")))?
            .map_err(StoreError::from)
    }
}

impl SqliteStore {
    /// A point read (one small row by its key) on the calling thread: it takes microseconds, less
    /// than handing it to a blocking thread and back would cost in wake-ups.
    fn point_read<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, DbError>,
    ) -> Result<T, StoreError> {
        self.point_reads.with(f).map_err(StoreError::from)
    }
}

/// Writes a consistent copy of the database at `database` to `out` with SQLite's online backup,
/// whether or not a server is writing it meanwhile; `out` must not exist yet.
pub fn backup(database: &Path, out: &Path) -> Result<(), StoreError> {
    if out.exists() {
        return Err(StoreError::Unavailable(format!(
            "{} exists already; name a new file",
            out.display()
        )));
    }
    let source = Connection::open_with_flags(database, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .map_err(DbError::from)?;
    source
        .busy_timeout(Duration::from_secs(10))
        .map_err(DbError::from)?;
    let mut target = Connection::open(out).map_err(DbError::from)?;
    {
        let copy = rusqlite::backup::Backup::new(&source, &mut target).map_err(DbError::from)?;
        copy.run_to_completion(256, Duration::from_millis(5), None)
            .map_err(DbError::from)?;
    }
    // The copy is a plain database file, not in WAL mode, so that it is one complete file.
    target
        .pragma_update(None, "journal_mode", "DELETE")
        .map_err(DbError::from)?;
    Ok(())
}

impl Drop for SqliteStore {
    fn drop(&mut self) {
        self.close();
    }
}

fn no_events<T>(value: T) -> (T, Vec<Event>) {
    (value, Vec::new())
}

#[async_trait]
impl TaskStore for SqliteStore {
    async fn create_task(
        &self,
        task: Task,
        idempotency: Option<IdempotencyRecord>,
    ) -> Result<CreateOutcome, StoreError> {
        let at = task.created_at;
        self.write(Box::new(move |conn| {
            ops::tasks::create_task(conn, task, idempotency, at)
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
        self.write(Box::new(move |conn| {
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
        self.write(Box::new(move |conn| {
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

    async fn claim_next(&self, by: InstanceId, at: Timestamp) -> Result<Option<Task>, StoreError> {
        self.write(Box::new(move |conn| ops::tasks::claim_next(conn, by, at)))
            .await
    }

    async fn cancel(
        &self,
        task_id: TaskId,
        client_id: Option<ClientId>,
        at: Timestamp,
    ) -> Result<CancelOutcome, StoreError> {
        self.write(Box::new(move |conn| {
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
        self.write(Box::new(move |conn| {
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
        self.write(Box::new(move |conn| {
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
        self.write(Box::new(move |conn| {
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
        self.write(Box::new(move |conn| {
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
        let mut report = RecoveryReport::default();
        let mut cursor = Some(ops::instances::RecoveryCursor::START);
        let limit = self.recovery_batch;
        while let Some(from) = cursor {
            let (part, next) = self
                .write(Box::new(move |conn| {
                    ops::instances::recover_batch(conn, stopped, rescuer, at, from, limit)
                }))
                .await?;
            report.absorb(part);
            cursor = next;
        }
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
