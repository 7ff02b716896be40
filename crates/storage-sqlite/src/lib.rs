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
mod contents;
mod error;
mod ops;
mod ports;
mod reads;
pub mod schema;
mod writer;

use std::path::Path;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use lmsp_domain::ids::BatchId;
pub use lmsp_domain::ports::NoListener;
use lmsp_domain::ports::{StoreError, StoreListener};
use lmsp_storage_codec::tuning;
use rusqlite::Connection;

pub use crate::contents::FileDir;
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
            recovery_batch: tuning::RECOVERY_BATCH,
            purge_max_events: tuning::PURGE_MAX_EVENTS,
            max_page_count: None,
            writer_restarts: RestartBudget::default(),
        }
    }
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
        return Err(crate::ops::corrupt(format!(
            "journal_mode is {mode}, not wal"
        )));
    }
    let sync = match options.sync {
        SyncMode::Full => "FULL",
        SyncMode::Normal => "NORMAL",
    };
    conn.pragma_update(None, "synchronous", sync)?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    conn.pragma_update(None, "wal_autocheckpoint", 1000)?;
    // Where each command's savepoint journal lives: the writer sets it per transaction
    // (`writer::Journal`); until then, a file past 64 KiB, which bounds what the big commands
    // hold in memory.
    conn.pragma_update(None, "temp_store", "FILE")?;
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

    /// Queues `work` for the writer and waits for its answer, after the commit; its savepoint
    /// journal spills to a file past 64 KiB, so it may change any number of rows.
    async fn write<T: Send + 'static>(&self, work: Work<T>) -> Result<T, StoreError> {
        self.submit(Typed::new(work)).await
    }

    /// Queues `work` for the writer as a command that changes a bounded few rows, whose
    /// savepoint journal may stay in memory (`writer::Journal`): the hot writes of one task.
    async fn write_small<T: Send + 'static>(&self, work: Work<T>) -> Result<T, StoreError> {
        self.submit(Typed::small(work)).await
    }

    async fn submit<T: Send + 'static>(
        &self,
        (command, rx): (
            Typed<T>,
            tokio::sync::oneshot::Receiver<Result<T, StoreError>>,
        ),
    ) -> Result<T, StoreError> {
        self.send(Box::new(command))?;
        rx.await.map_err(|_| {
            let stopped = self.writer_status.borrow().stopped.clone();
            StoreError::Unavailable(match stopped {
                Some(reason) => format!("the writer has stopped: {reason}"),
                None => String::from("the writer failed before it answered"),
            })
        })?
    }

    /// Removes a batch's kept-aside lines a chunk per write (see `ops::batches::drop_staged`).
    async fn drop_staged(&self, batch: BatchId) -> Result<(), StoreError> {
        let chunk = ops::batches::STAGED_DROP_CHUNK;
        loop {
            let removed = self
                .write(Box::new(move |conn| {
                    ops::batches::drop_staged(conn, batch, chunk)
                        .map(|removed| (removed, Vec::new()))
                }))
                .await?;
            if removed < chunk {
                return Ok(());
            }
        }
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
