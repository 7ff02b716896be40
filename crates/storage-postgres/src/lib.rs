//! The PostgreSQL storage adapter of the LMSP service: [`PostgresStore`] implements every
//! storage port of `lmsp_domain::ports` (so it is a [`lmsp_domain::ports::Store`]) for any number
//! of instances sharing one database (README's "Many instances on PostgreSQL"; docs/recovery.md).
//!
//! - Every write port method is **one transaction** (`READ COMMITTED` with row locks): it locks
//!   the rows it reads (`SELECT … FOR UPDATE`), asks the domain, and writes what the domain
//!   returns as a compare-and-set on what it read. A transaction that loses a race it cannot
//!   decide (a deadlock, a row inserted under it) is rolled back and run again.
//! - The hot writes (creates, steps, claims, cancels) are group-committed (`batch.rs`): what
//!   has gathered is written in one transaction. A create without a key, and a step of a task
//!   whose row this store last committed, is one statement decided without a read (its premise
//!   checked inside it: the queue limits, the row's compare-and-set), so a batch of them is one
//!   round trip, `BEGIN` to `COMMIT` (`batch/fast.rs`); the others take one pipelined round
//!   trip for the batch's reads and one for its writes. Those writes go without savepoints
//!   first; only when one fails is the transaction written again with each command in a
//!   savepoint of its own, so that it fails alone.
//! - The hot reads (a token's client, a model, a task, a stream's events) run on a few
//!   connections of their own, each shared by every caller at once (their requests pipelined);
//!   the event reads that gather while one is answered are one statement (`reader.rs`).
//! - `claim_next` takes the oldest queued task with `FOR UPDATE SKIP LOCKED`: each task is
//!   claimed once across processes, and claimers never wait on each other. A claim that found
//!   every claimable head held by another claim is made again after a short pause (for at most
//!   a second) rather than answered empty.
//! - The maintenance leader holds a session-level advisory lock on a connection of its own.
//! - Committed events and cancels reach the other stores by `NOTIFY` (sent right after commit,
//!   gathered, one statement on a connection of the notifier's own) and a `LISTEN` connection per
//!   store ([`StoreListener::advanced_elsewhere`], [`StoreListener::cancel_requested`]); the
//!   streams an instance wakes for them read the events with one gathered statement; a store's
//!   own commits reach its listener through [`StoreListener::committed`] before the write
//!   returns.
//! - The schema is versioned (`schema_migrations`), migrated at [`PostgresStore::connect`] under
//!   an advisory lock.
//! - Files' bytes are rows of the shared database ([`PostgresStore::file_contents`]), so every
//!   instance reads what any of them wrote; a batch's counts are kept by a trigger in the
//!   transaction of each of its tasks' ends (schema version 4).
//! - Webhook deliveries are an outbox written by triggers in the transaction of the end they
//!   announce (schema version 5); claims lease them under an advisory lock with `SKIP LOCKED`,
//!   so instances never send one twice at once nor two of a busy endpoint.

#![warn(missing_docs)]

mod batch;
mod codec;
mod contents;
mod error;
mod notify;
mod ops;
mod ports;
mod reader;
pub mod schema;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use lmsp_domain::event::Event;
use lmsp_domain::ids::InstanceId;
pub use lmsp_domain::ports::NoListener;
use lmsp_domain::ports::{CommitStats, FileContents, StoreError, StoreListener};
use lmsp_storage_codec::{no_events, tuning};
use tokio::task::JoinHandle;
use tokio_postgres::{IsolationLevel, NoTls};

use crate::error::DbError;
use crate::ops::Res;

pub use crate::contents::{PostgresFileContents, PART_BYTES};
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
    /// Lanes of the group commit of the hot writes (creates, steps, claims, cancels): each
    /// writes what has gathered in one transaction on a pooled connection while the others
    /// gather.
    pub write_lanes: usize,
    /// Connections of the hot reads (a token's client, a model, a task, a stream's events),
    /// each shared by every caller at once (their reads pipelined), besides the pool.
    pub read_connections: usize,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        Self {
            pool_size: 16,
            connection_timeout: Duration::from_secs(5),
            recovery_batch: tuning::RECOVERY_BATCH,
            purge_max_events: tuning::PURGE_MAX_EVENTS,
            max_attempts: 8,
            listen_retry: Duration::from_secs(1),
            write_lanes: 3,
            read_connections: 2,
        }
    }
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
    notifier: notify::Notifier,
    writer: batch::Writer,
    readers: Arc<reader::Readers>,
    gathers: reader::Gathers,
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

/// A pooled connection as the operations' [`ops::Db`] (with its statement cache).
fn pg(conn: &deadpool_postgres::Object) -> &deadpool_postgres::ClientWrapper {
    conn
}

/// A pooled connection, to open a transaction on (whose statements share its cache).
fn pg_mut(conn: &mut deadpool_postgres::Object) -> &mut deadpool_postgres::ClientWrapper {
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
            schema::migrate(&mut conn).await?;
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
        let notifier = notify::Notifier::start(config.clone(), options.connection_timeout);
        let readers = Arc::new(reader::Readers::new(
            config.clone(),
            options.read_connections,
            options.connection_timeout,
        ));
        let gathers = reader::Gathers::start(&readers);
        let writer = batch::Writer::start(
            batch::Shared {
                pool: pool.clone(),
                listener: Arc::clone(&listener),
                notifier: notifier.clone(),
                origin: Arc::clone(&origin),
                max_attempts: options.max_attempts.max(1),
                rows: batch::Rows::default(),
            },
            options.write_lanes,
        );
        Ok(PostgresStore {
            writer,
            notifier,
            readers,
            gathers,
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
        self.writer.stop();
        self.gathers.stop();
        self.readers.close();
        self.listening.abort();
        self.leadership.lock().await.give_up();
        self.pool.close();
    }

    /// The bytes of files ([`FileContents`]), kept in this store's database: every instance on it
    /// reads what any of them wrote.
    pub fn file_contents(&self) -> Arc<dyn FileContents> {
        Arc::new(PostgresFileContents::new(self.pool.clone()))
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
        F: for<'t> Fn(&'t deadpool_postgres::Transaction<'t>) -> BoxFuture<'t, Written<T>>
            + Send
            + Sync,
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
        F: for<'t> Fn(&'t deadpool_postgres::Transaction<'t>) -> BoxFuture<'t, Written<T>>
            + Send
            + Sync,
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
                // After the commit, never inside it, and gathered with other writes' news by
                // the notifier (PostgreSQL serializes notifying commits; see
                // `notify::Notifier`). If it is lost (a crash in between), the other
                // instances' polling covers it.
                self.notifier.send(&self.origin, &events, cancel);
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
        self.writer.stop();
        self.gathers.stop();
        self.readers.close();
        self.listening.abort();
        if let Ok(mut leadership) = self.leadership.try_lock() {
            leadership.give_up();
        }
        self.pool.close();
    }
}
