//! The SQL of every port method: plain functions over a connection, called by the writer thread
//! (inside a savepoint) or by a pooled read connection.
//!
//! Task rows are decoded column by column; ids of tasks, clients and instances are stored as the
//! 16 bytes of their ULID. Every write reads the rows it changes inside its transaction, asks the
//! domain, and writes what the domain returns as a compare-and-set on what it read.

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

use lmsp_domain::event::Event;
use lmsp_domain::ids::{ClientId, InstanceId, TaskId};
use lmsp_domain::task::Task;
use lmsp_domain::time::Timestamp;
use lmsp_storage_codec::columns::{Columns, ReadRow};
use lmsp_storage_codec::flows;
use lmsp_storage_codec::query::Param;
use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{
    params, params_from_iter, CachedStatement, Connection, OptionalExtension, Row, Statement, ToSql,
};

use crate::codec;
use crate::error::DbError;

/// The result type of the operations.
pub type Res<T> = Result<T, DbError>;

pub use codec::{from_i64, to_i64};

/// A stored row that makes no sense.
pub fn corrupt(what: impl std::fmt::Display) -> DbError {
    codec::corrupt(what).into()
}

/// A statement both adapters run (`codec::sql`, written with `$N` placeholders), prepared once
/// per connection under its SQLite text (`?N`).
pub fn prepare<'c>(conn: &'c Connection, shared: &str) -> rusqlite::Result<CachedStatement<'c>> {
    conn.prepare_cached(&codec::sql::for_sqlite(shared))
}

/// A SQLite row as the codec reads its values ([`Columns`]).
struct SqliteColumns<'a, 'r>(&'a Row<'r>);

impl Columns for SqliteColumns<'_, '_> {
    type Error = rusqlite::Error;

    fn bytes(&self, index: usize) -> rusqlite::Result<Vec<u8>> {
        self.0.get(index)
    }

    fn bytes_or_null(&self, index: usize) -> rusqlite::Result<Option<Vec<u8>>> {
        self.0.get(index)
    }

    fn text(&self, index: usize) -> rusqlite::Result<String> {
        self.0.get(index)
    }

    fn text_or_null(&self, index: usize) -> rusqlite::Result<Option<String>> {
        self.0.get(index)
    }

    fn int(&self, index: usize) -> rusqlite::Result<i64> {
        self.0.get(index)
    }

    fn int_or_null(&self, index: usize) -> rusqlite::Result<Option<i64>> {
        self.0.get(index)
    }

    fn flag(&self, index: usize) -> rusqlite::Result<bool> {
        self.0.get(index)
    }
}

/// Reads a stored row selected with its columns list (as `query_row` and `query_map` want it).
pub fn read<T: ReadRow>(row: &Row<'_>) -> rusqlite::Result<T> {
    T::read(&SqliteColumns(row))
}

/// A value bound to a statement of the codec's ([`Param`]), as SQLite takes it: borrowed, not
/// copied.
struct Bound<'p>(&'p Param);

impl ToSql for Bound<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match self.0 {
            Param::Blob(bytes) => ValueRef::Blob(bytes),
            Param::Text(text) => ValueRef::Text(text.as_bytes()),
            Param::Integer(number) => ValueRef::Integer(*number),
            Param::Int4(number) => ValueRef::Integer(i64::from(*number)),
            Param::Null(_) => ValueRef::Null,
        }))
    }
}

/// The values bound to a statement of the codec's ([`Param`]), as SQLite takes them.
fn values(params: &[Param]) -> impl Iterator<Item = Bound<'_>> + '_ {
    params.iter().map(Bound)
}

/// The row access of the codec's shared flows ([`flows`]) on a connection, inside the current
/// transaction. Its bodies never wait (rusqlite is synchronous), so a flow over it is done when
/// first polled: [`run`] drives it.
#[derive(Debug, Clone, Copy)]
pub struct Rows<'c>(pub &'c Connection);

impl flows::Rows for Rows<'_> {
    type Error = DbError;

    // The writer thread runs one transaction at a time: nothing to lock against.
    const LOCK: &'static str = "";
    const SHARE: &'static str = "";
    const ACCEPTED_BY_DEFAULT: Option<&'static [u8]> = ACCEPTED_BY_DEFAULT;

    async fn execute(&self, sql: &str, params: &[Param]) -> Res<u64> {
        let changed = prepare(self.0, sql)?.execute(params_from_iter(values(params)))?;
        Ok(changed as u64)
    }

    async fn read_one<T: ReadRow>(&self, sql: &str, params: &[Param]) -> Res<Option<T>> {
        Ok(prepare(self.0, sql)?
            .query_row(params_from_iter(values(params)), read::<T>)
            .optional()?)
    }

    async fn read_all<T: ReadRow>(&self, sql: &str, params: &[Param]) -> Res<Vec<T>> {
        Ok(prepare(self.0, sql)?
            .query_map(params_from_iter(values(params)), read::<T>)?
            .collect::<Result<_, _>>()?)
    }
}

/// Runs one of the codec's shared flows over [`Rows`] to its end ([`flows::run_ready`]):
/// SQLite's row access never waits, so the flow is done when first polled.
pub fn run<T>(flow: impl std::future::Future<Output = Res<T>>) -> Res<T> {
    flows::run_ready(flow)
}

/// The stored key of a task id: its ULID's 16 bytes (so key order is creation order).
pub fn key(id: TaskId) -> [u8; 16] {
    id.ulid().to_bytes()
}

/// The stored key of a client id.
pub fn client_key(id: ClientId) -> [u8; 16] {
    id.ulid().to_bytes()
}

/// The stored key of an instance id.
pub fn instance_key(id: InstanceId) -> [u8; 16] {
    id.ulid().to_bytes()
}

/// A ULID from its stored 16 bytes (the codec's, its error converting with `?`).
pub use codec::ulid_of;

/// The owner of every task the first release wrote (see the v2 migration), which stores no
/// `accepted_by`: such a task was accepted by it.
const ACCEPTED_BY_DEFAULT: Option<&[u8]> = Some(&crate::schema::LEGACY_INSTANCE);

/// A task row as SQLite hands it over; [`RawTask::decode`] checks and converts it.
pub struct RawTask(codec::TaskRow);

/// Reads a task row selected with [`TASK_COLUMNS`].
pub fn raw_task(row: &Row<'_>) -> rusqlite::Result<RawTask> {
    Ok(RawTask(read(row)?))
}

impl RawTask {
    /// The domain task; a row of the first release, which stores no `accepted_by`, was accepted
    /// by the legacy instance.
    pub fn decode(self) -> Res<Task> {
        Ok(self.0.decode(ACCEPTED_BY_DEFAULT)?)
    }
}

/// [`codec::sql::task_by_id`] in SQLite's placeholders, made once (every step reads its task).
static TASK_BY_ID: LazyLock<String> =
    LazyLock::new(|| codec::sql::for_sqlite(&codec::sql::task_by_id()));

/// Reads a task inside the current transaction.
pub fn load_task(conn: &Connection, id: TaskId) -> Res<Option<Task>> {
    conn.prepare_cached(&TASK_BY_ID)?
        .query_row([key(id)], raw_task)
        .optional()?
        .map(RawTask::decode)
        .transpose()
}

/// Inserts a new task's rows (`tasks` and `task_specs`).
pub fn insert_task_rows(conn: &Connection, task: &Task) -> Res<()> {
    conn.prepare_cached(
        "INSERT INTO tasks (id, client_id, status, model, on_restart, created_at, started_at, \
         finished_at, last_sequence_number, restarts, error, response_id, owner, background, \
         items_opened, item_open, tier) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)",
    )?
    .execute(params![
        key(task.id),
        client_key(task.client_id),
        task.status.as_str(),
        task.model.as_str(),
        task.on_restart.as_str(),
        task.created_at.as_millis(),
        task.started_at.map(Timestamp::as_millis),
        task.finished_at.map(Timestamp::as_millis),
        to_i64(task.last_sequence_number)?,
        task.restarts,
        codec::error_text(task)?,
        codec::stored_response_id(task),
        instance_key(task.owner),
        task.background,
        task.items.opened,
        task.items.open,
        codec::tier_rank(task.service_tier),
    ])?;
    conn.prepare_cached(
        "INSERT INTO task_specs (task_id, spec, metadata, accepted_by) VALUES (?1, ?2, ?3, ?4)",
    )?
    .execute(params![
        key(task.id),
        codec::spec_to_text(&task.spec)?,
        codec::metadata_to_text(&task.metadata)?,
        instance_key(task.accepted_by),
    ])?;
    Ok(())
}

/// Rewrites a task's changing columns, as a compare-and-set on status, last sequence number and
/// owner: bound by [`update_task`].
pub const TASK_UPDATE: &str = "UPDATE tasks SET status = ?1, started_at = ?2, finished_at = ?3, \
     last_sequence_number = ?4, restarts = ?5, error = ?6, owner = ?7, items_opened = ?8, \
     item_open = ?9 WHERE id = ?10 AND status = ?11 AND last_sequence_number = ?12 AND owner = ?13";

/// Runs [`TASK_UPDATE`] (prepared by the caller) from `old` to `new`; the rows it changed.
pub fn update_task(stmt: &mut Statement<'_>, old: &Task, new: &Task) -> Res<usize> {
    Ok(stmt.execute(params![
        new.status.as_str(),
        new.started_at.map(Timestamp::as_millis),
        new.finished_at.map(Timestamp::as_millis),
        to_i64(new.last_sequence_number)?,
        new.restarts,
        codec::error_text(new)?,
        instance_key(new.owner),
        new.items.opened,
        new.items.open,
        key(old.id),
        old.status.as_str(),
        to_i64(old.last_sequence_number)?,
        instance_key(old.owner),
    ])?)
}

/// Writes a task after a decided step: a compare-and-set on status, last sequence number and
/// owner, so a row that moved under the transaction is never overwritten; then its events.
pub fn write_advanced(conn: &Connection, old: &Task, new: &Task, events: &[Event]) -> Res<()> {
    let only_progress = old.status == new.status
        && old.started_at == new.started_at
        && old.finished_at == new.finished_at
        && old.restarts == new.restarts
        && old.error == new.error
        && old.owner == new.owner
        && old.items == new.items;
    let changed = if only_progress {
        // Output: only the sequence number moves, and an UPDATE that names no indexed column
        // leaves the status and finish indexes alone.
        conn.prepare_cached(
            "UPDATE tasks SET last_sequence_number = ?1 \
             WHERE id = ?2 AND status = ?3 AND last_sequence_number = ?4 AND owner = ?5",
        )?
        .execute(params![
            to_i64(new.last_sequence_number)?,
            key(old.id),
            old.status.as_str(),
            to_i64(old.last_sequence_number)?,
            instance_key(old.owner),
        ])?
    } else {
        let mut stmt = conn.prepare_cached(TASK_UPDATE)?;
        update_task(&mut stmt, old, new)?
    };
    if changed != 1 {
        return Err(corrupt(format!(
            "task {} moved under its transaction",
            old.id
        )));
    }
    events::insert_events(conn, events)
}

/// Drops a task's snapshot (bound to its key).
pub const SNAPSHOT_DELETE: &str = "DELETE FROM snapshots WHERE task_id = ?1";

/// Drops a task's snapshot.
pub fn delete_snapshot(conn: &Connection, id: TaskId) -> Res<()> {
    conn.prepare_cached(SNAPSHOT_DELETE)?.execute([key(id)])?;
    Ok(())
}

/// Reads a `service_config` value.
pub fn config_value(conn: &Connection, name: &str) -> Res<Option<String>> {
    Ok(prepare(conn, codec::sql::CONFIG_VALUE)?
        .query_row([name], |row| row.get(0))
        .optional()?)
}

/// Writes a `service_config` value.
pub fn set_config_value(conn: &Connection, name: &str, value: &str) -> Res<()> {
    prepare(conn, codec::sql::SET_CONFIG_VALUE)?.execute([name, value])?;
    Ok(())
}
