//! The SQL of every port method: async functions over a connection or a transaction.
//!
//! Every write runs inside one transaction (see [`crate::PostgresStore`]): it locks the rows it
//! changes (`SELECT … FOR UPDATE`), asks the domain, and writes what the domain returns as a
//! compare-and-set on what it read. Ids of tasks, clients and instances are the 16 bytes of their
//! ULID.

pub mod batches;
pub mod clients;
pub mod events;
pub mod idempotency;
pub mod instances;
pub mod models;
pub mod purge;
pub mod service;
pub mod tasks;
pub mod webhooks;

use std::sync::LazyLock;

use async_trait::async_trait;
use lmsp_domain::event::Event;
use lmsp_domain::ids::{BatchId, ClientId, FileId, InstanceId, TaskId};
use lmsp_domain::task::Task;
use lmsp_domain::time::Timestamp;
use lmsp_storage_codec::columns::{Columns, ReadRow};
use lmsp_storage_codec::flows;
use lmsp_storage_codec::query::{Kind, Param};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Row;

use crate::codec;
use crate::error::DbError;

/// The result type of the operations.
pub type Res<T> = Result<T, DbError>;

/// What an operation runs on: a pooled connection (reads) or a transaction on one (writes).
///
/// Each statement is prepared once per connection and kept (deadpool's statement cache, keyed by
/// the SQL text), so running it again is one round trip instead of a parse and then an execute.
/// The SQL of the operations is fixed text (the task list's filters combine a handful of
/// clauses), so the cache stays small.
#[async_trait]
pub trait Db: Sync {
    /// Runs a statement; how many rows it changed.
    async fn execute(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, tokio_postgres::Error>;

    /// Runs a query; its rows.
    async fn query(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, tokio_postgres::Error>;

    /// Runs a query of at most one row.
    async fn query_opt(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, tokio_postgres::Error>;
}

/// Implements [`Db`] for a deadpool type that has `prepare_cached` and derefs to a
/// `tokio_postgres` client or transaction.
macro_rules! cached_db {
    ($($ty:ty),*) => {$(
        #[async_trait]
        impl Db for $ty {
            async fn execute(
                &self,
                sql: &str,
                params: &[&(dyn ToSql + Sync)],
            ) -> Result<u64, tokio_postgres::Error> {
                let statement = self.prepare_cached(sql).await?;
                (**self).execute(&statement, params).await
            }

            async fn query(
                &self,
                sql: &str,
                params: &[&(dyn ToSql + Sync)],
            ) -> Result<Vec<Row>, tokio_postgres::Error> {
                let statement = self.prepare_cached(sql).await?;
                (**self).query(&statement, params).await
            }

            async fn query_opt(
                &self,
                sql: &str,
                params: &[&(dyn ToSql + Sync)],
            ) -> Result<Option<Row>, tokio_postgres::Error> {
                let statement = self.prepare_cached(sql).await?;
                (**self).query_opt(&statement, params).await
            }
        }
    )*};
}

cached_db!(
    deadpool_postgres::ClientWrapper,
    deadpool_postgres::Transaction<'_>
);

pub use codec::{from_i64, to_i64, TASK_COLUMNS, TASK_COLUMN_COUNT, TASK_FROM};

/// A stored row that makes no sense.
pub fn corrupt(what: impl std::fmt::Display) -> DbError {
    codec::corrupt(what).into()
}

/// A PostgreSQL row as the codec reads its values ([`Columns`]): an integer reads from a
/// `smallint`, an `integer` or a `bigint` column alike (tiers, lines and attempts are kept
/// narrow here, and every integer is an `INTEGER` in SQLite).
struct PgColumns<'r>(&'r Row);

impl PgColumns<'_> {
    fn width(&self, index: usize) -> Option<&Type> {
        self.0.columns().get(index).map(|column| column.type_())
    }
}

impl Columns for PgColumns<'_> {
    type Error = tokio_postgres::Error;

    fn bytes(&self, index: usize) -> Result<Vec<u8>, Self::Error> {
        self.0.try_get(index)
    }

    fn bytes_or_null(&self, index: usize) -> Result<Option<Vec<u8>>, Self::Error> {
        self.0.try_get(index)
    }

    fn text(&self, index: usize) -> Result<String, Self::Error> {
        self.0.try_get(index)
    }

    fn text_or_null(&self, index: usize) -> Result<Option<String>, Self::Error> {
        self.0.try_get(index)
    }

    fn int(&self, index: usize) -> Result<i64, Self::Error> {
        match self.width(index) {
            Some(&Type::INT2) => self.0.try_get::<_, i16>(index).map(i64::from),
            Some(&Type::INT4) => self.0.try_get::<_, i32>(index).map(i64::from),
            _ => self.0.try_get(index),
        }
    }

    fn int_or_null(&self, index: usize) -> Result<Option<i64>, Self::Error> {
        match self.width(index) {
            Some(&Type::INT2) => Ok(self.0.try_get::<_, Option<i16>>(index)?.map(i64::from)),
            Some(&Type::INT4) => Ok(self.0.try_get::<_, Option<i32>>(index)?.map(i64::from)),
            _ => self.0.try_get(index),
        }
    }

    fn flag(&self, index: usize) -> Result<bool, Self::Error> {
        self.0.try_get(index)
    }
}

/// Reads a stored row selected with its columns list.
pub fn read<T: ReadRow>(row: &Row) -> Res<T> {
    Ok(T::read(&PgColumns(row))?)
}

/// The values bound to a statement of the codec's ([`Param`]), as tokio-postgres takes them.
fn values(params: &[Param]) -> Vec<&(dyn ToSql + Sync)> {
    params
        .iter()
        .map(|param| match param {
            Param::Blob(bytes) => bytes as &(dyn ToSql + Sync),
            Param::Text(text) => text,
            Param::Integer(number) => number,
            Param::Int4(number) => number,
            Param::Null(kind) => null_of(kind),
        })
        .collect()
}

/// A value bound to a statement of the codec's ([`Param`]), owned: as a statement of the group
/// commit keeps its parameters until its batch is written.
pub fn boxed(param: Param) -> Box<dyn ToSql + Sync + Send> {
    match param {
        Param::Blob(bytes) => Box::new(bytes),
        Param::Text(text) => Box::new(text),
        Param::Integer(number) => Box::new(number),
        Param::Int4(number) => Box::new(number),
        Param::Null(Kind::Blob) => Box::new(None::<Vec<u8>>),
        Param::Null(Kind::Text) => Box::new(None::<String>),
        Param::Null(Kind::Integer) => Box::new(None::<i64>),
        Param::Null(Kind::Int4) => Box::new(None::<i32>),
    }
}

/// A `NULL` of a column's kind, as tokio-postgres checks it against the column's type.
fn null_of(kind: &Kind) -> &'static (dyn ToSql + Sync) {
    static BLOB: Option<Vec<u8>> = None;
    static TEXT: Option<String> = None;
    static INTEGER: Option<i64> = None;
    static INT4: Option<i32> = None;
    match kind {
        Kind::Blob => &BLOB,
        Kind::Text => &TEXT,
        Kind::Integer => &INTEGER,
        Kind::Int4 => &INT4,
    }
}

/// The row access of the codec's shared flows ([`flows`]) on a connection or a transaction:
/// reads of rows a flow goes on to change lock them (`FOR UPDATE`) until the transaction ends.
#[derive(Debug, Clone, Copy)]
pub struct Rows<'a, C>(pub &'a C);

impl<C: Db> flows::Rows for Rows<'_, C> {
    type Error = DbError;

    const LOCK: &'static str = " FOR UPDATE";
    const SHARE: &'static str = " FOR SHARE";
    const ACCEPTED_BY_DEFAULT: Option<&'static [u8]> = ACCEPTED_BY_DEFAULT;

    async fn execute(&self, sql: &str, params: &[Param]) -> Res<u64> {
        Ok(self.0.execute(sql, &values(params)).await?)
    }

    async fn read_one<T: ReadRow>(&self, sql: &str, params: &[Param]) -> Res<Option<T>> {
        let row = self.0.query_opt(sql, &values(params)).await?;
        row.as_ref().map(read::<T>).transpose()
    }

    async fn read_all<T: ReadRow>(&self, sql: &str, params: &[Param]) -> Res<Vec<T>> {
        let rows = self.0.query(sql, &values(params)).await?;
        rows.iter().map(read::<T>).collect()
    }
}

/// The stored key of a task id: its ULID's 16 bytes (so key order is creation order).
pub fn key(id: TaskId) -> Vec<u8> {
    id.ulid().to_bytes().to_vec()
}

/// The stored key of a client id.
pub fn client_key(id: ClientId) -> Vec<u8> {
    id.ulid().to_bytes().to_vec()
}

/// The stored key of an instance id.
pub fn instance_key(id: InstanceId) -> Vec<u8> {
    id.ulid().to_bytes().to_vec()
}

/// A ULID from its stored 16 bytes (the codec's, its error converting with `?`).
pub use codec::ulid_of;

/// The stored key of a batch id.
pub fn batch_key(id: BatchId) -> Vec<u8> {
    id.ulid().to_bytes().to_vec()
}

/// The stored key of a file id.
pub fn file_key(id: FileId) -> Vec<u8> {
    id.ulid().to_bytes().to_vec()
}

/// An instance id from its stored bytes.
pub fn instance_of(bytes: &[u8]) -> Res<InstanceId> {
    Ok(InstanceId::from_ulid(ulid_of(bytes)?))
}

/// A row that stores no `accepted_by` was accepted by its owner.
const ACCEPTED_BY_DEFAULT: Option<&[u8]> = None;

/// Decodes a task row selected with [`TASK_COLUMNS`].
pub fn decode_task(row: &Row) -> Res<Task> {
    Ok(read::<codec::TaskRow>(row)?.decode(ACCEPTED_BY_DEFAULT)?)
}

/// [`codec::sql::task_by_id`], made once; and with the task's row locked.
static TASK_BY_ID: LazyLock<String> = LazyLock::new(codec::sql::task_by_id);
static TASK_BY_ID_LOCKED: LazyLock<String> =
    LazyLock::new(|| format!("{} FOR UPDATE OF t", codec::sql::task_by_id()));

/// Reads a task (no lock: a read).
pub async fn load_task<C: Db>(db: &C, id: TaskId) -> Res<Option<Task>> {
    db.query_opt(TASK_BY_ID.as_str(), &[&key(id)])
        .await?
        .as_ref()
        .map(decode_task)
        .transpose()
}

/// Reads a task and locks its row until the transaction ends (`FOR UPDATE`), so the
/// compare-and-set that follows cannot lose to a concurrent writer.
pub async fn lock_task<C: Db>(db: &C, id: TaskId) -> Res<Option<Task>> {
    db.query_opt(TASK_BY_ID_LOCKED.as_str(), &[&key(id)])
        .await?
        .as_ref()
        .map(decode_task)
        .transpose()
}

/// Writes a task after a decided step: a compare-and-set on status, last sequence number and
/// owner, so a row that moved under the transaction is never overwritten; then its events.
pub async fn write_advanced<C: Db>(db: &C, old: &Task, new: &Task, events: &[Event]) -> Res<()> {
    let changed = db
        .execute(
            "UPDATE tasks SET status = $1, started_at = $2, finished_at = $3, \
             last_sequence_number = $4, restarts = $5, error = $6, owner = $7, \
             items_opened = $8, item_open = $9 \
             WHERE id = $10 AND status = $11 AND last_sequence_number = $12 AND owner = $13",
            &[
                &new.status.as_str(),
                &new.started_at.map(Timestamp::as_millis),
                &new.finished_at.map(Timestamp::as_millis),
                &to_i64(new.last_sequence_number)?,
                &i64::from(new.restarts),
                &codec::error_text(new)?,
                &instance_key(new.owner),
                &i64::from(new.items.opened),
                &new.items.open,
                &key(old.id),
                &old.status.as_str(),
                &to_i64(old.last_sequence_number)?,
                &instance_key(old.owner),
            ],
        )
        .await?;
    if changed != 1 {
        // The row was locked when read, so this is a lost race the transaction cannot decide:
        // run it again on what is stored now.
        return Err(DbError::Retry);
    }
    events::insert_events(db, events).await
}

/// Drops a task's snapshot.
pub async fn delete_snapshot<C: Db>(db: &C, id: TaskId) -> Res<()> {
    db.execute("DELETE FROM snapshots WHERE task_id = $1", &[&key(id)])
        .await?;
    Ok(())
}

/// Reads a `service_config` value, locking its row when `lock`.
pub async fn config_value<C: Db>(db: &C, name: &str, lock: bool) -> Res<Option<String>> {
    let sql = format!(
        "{}{}",
        codec::sql::CONFIG_VALUE,
        if lock { " FOR UPDATE" } else { "" }
    );
    Ok(match db.query_opt(&sql, &[&name]).await? {
        Some(row) => Some(row.try_get(0)?),
        None => None,
    })
}

/// Writes a `service_config` value.
pub async fn set_config_value<C: Db>(db: &C, name: &str, value: &str) -> Res<()> {
    db.execute(codec::sql::SET_CONFIG_VALUE, &[&name, &value])
        .await?;
    Ok(())
}
