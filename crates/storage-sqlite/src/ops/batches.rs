//! Files and batches: their records, a validating batch's kept-aside tasks, the batch's start
//! (all its tasks at once, P-2), its compare-and-set steps, and the purge of ended batches.
//! The counts are kept by the `batch_counts` trigger (schema version 4), in the same transaction
//! as each task's end.

use lmsp_domain::batch::{Batch, BatchStatus, FilePurpose, StoredFile};
use lmsp_domain::event::EventKind;
use lmsp_domain::ids::{BatchId, ClientId, FileId};
use lmsp_domain::ports::{BatchPurge, FileDeleteOutcome, Page};
use lmsp_domain::status::TaskStatus;
use lmsp_domain::task::{Response, Task};
use lmsp_domain::time::Timestamp;
use rusqlite::types::Value;
use rusqlite::{params, params_from_iter, Connection, OptionalExtension, Row};

use crate::codec::{
    self, batch_key, file_key, BatchRow, EventCode, FileRow, StagedRow, BATCH_COLUMNS,
    FILE_COLUMNS, STAGING_COLUMNS,
};
use crate::ops::tasks::delete_task_rows;
use crate::ops::{client_key, prepare, raw_task, to_i64, RawTask, Res, TASK_COLUMNS, TASK_FROM};

fn file_row(row: &Row<'_>) -> rusqlite::Result<FileRow> {
    Ok(FileRow {
        id: row.get(0)?,
        client_id: row.get(1)?,
        filename: row.get(2)?,
        purpose: row.get(3)?,
        bytes: row.get(4)?,
        digest: row.get(5)?,
        created_at: row.get(6)?,
        batch_id: row.get(7)?,
    })
}

fn batch_row(row: &Row<'_>) -> rusqlite::Result<BatchRow> {
    Ok(BatchRow {
        id: row.get(0)?,
        client_id: row.get(1)?,
        endpoint: row.get(2)?,
        input_file_id: row.get(3)?,
        completion_window: row.get(4)?,
        status: row.get(5)?,
        output_file_id: row.get(6)?,
        error_file_id: row.get(7)?,
        errors: row.get(8)?,
        total: row.get(9)?,
        completed: row.get(10)?,
        failed: row.get(11)?,
        metadata: row.get(12)?,
        created_at: row.get(13)?,
        times: [
            row.get(14)?,
            row.get(15)?,
            row.get(16)?,
            row.get(17)?,
            row.get(18)?,
            row.get(19)?,
            row.get(20)?,
        ],
    })
}

/// Stores a file's record.
pub fn insert_file(conn: &Connection, file: &StoredFile) -> Res<()> {
    let row = FileRow::encode(file)?;
    conn.prepare_cached(&format!(
        "INSERT INTO files ({FILE_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"
    ))?
    .execute(params![
        row.id,
        row.client_id,
        row.filename,
        row.purpose,
        row.bytes,
        row.digest,
        row.created_at,
        row.batch_id
    ])?;
    Ok(())
}

/// A file's record.
pub fn file(conn: &Connection, id: FileId) -> Res<Option<StoredFile>> {
    conn.prepare_cached(&format!("SELECT {FILE_COLUMNS} FROM files WHERE id = ?1"))?
        .query_row([file_key(id)], file_row)
        .optional()?
        .map(FileRow::decode)
        .transpose()
        .map_err(Into::into)
}

/// Files in id order after `after`.
pub fn list_files(
    conn: &Connection,
    client: Option<ClientId>,
    purpose: Option<FilePurpose>,
    after: Option<FileId>,
    limit: usize,
) -> Res<Page<StoredFile>> {
    let mut sql = format!("SELECT {FILE_COLUMNS} FROM files WHERE 1 = 1");
    let mut values: Vec<Value> = Vec::new();
    if let Some(client) = client {
        values.push(Value::Blob(client_key(client).to_vec()));
        sql.push_str(&format!(" AND client_id = ?{}", values.len()));
    }
    if let Some(purpose) = purpose {
        values.push(Value::Text(purpose.as_str().to_owned()));
        sql.push_str(&format!(" AND purpose = ?{}", values.len()));
    }
    if let Some(after) = after {
        values.push(Value::Blob(file_key(after).to_vec()));
        sql.push_str(&format!(" AND id > ?{}", values.len()));
    }
    values.push(Value::Integer(to_i64(limit as u64 + 1)?));
    sql.push_str(&format!(" ORDER BY id LIMIT ?{}", values.len()));
    let rows: Vec<FileRow> = conn
        .prepare_cached(&sql)?
        .query_map(params_from_iter(values), file_row)?
        .collect::<Result<_, _>>()?;
    page(rows.into_iter().map(FileRow::decode), limit)
}

fn page<T, E>(items: impl Iterator<Item = Result<T, E>>, limit: usize) -> Res<Page<T>>
where
    crate::error::DbError: From<E>,
{
    let items = items.collect::<Result<Vec<T>, E>>()?;
    Ok(Page::of_fetched(items, limit))
}

/// The statuses of a batch that has not ended, as bound parameters.
fn unfinished() -> [&'static str; 4] {
    BatchStatus::UNFINISHED.map(BatchStatus::as_str)
}

/// Removes a file's record unless a batch that has not ended reads it.
pub fn delete_file(
    conn: &Connection,
    id: FileId,
    client: Option<ClientId>,
) -> Res<FileDeleteOutcome> {
    let Some(stored) = file(conn, id)? else {
        return Ok(FileDeleteOutcome::NotFound);
    };
    if client.is_some_and(|client| client != stored.client_id) {
        return Ok(FileDeleteOutcome::NotFound);
    }
    let [a, b, c, d] = unfinished();
    let in_use: bool = conn
        .prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM batches WHERE input_file_id = ?1 \
             AND status IN (?2, ?3, ?4, ?5))",
        )?
        .query_row(params![file_key(id), a, b, c, d], |row| row.get(0))?;
    if in_use {
        return Ok(FileDeleteOutcome::InUse);
    }
    conn.prepare_cached("DELETE FROM files WHERE id = ?1")?
        .execute([file_key(id)])?;
    Ok(FileDeleteOutcome::Deleted)
}

fn write_batch_row(conn: &Connection, row: &BatchRow) -> Res<()> {
    conn.prepare_cached(&format!(
        "INSERT INTO batches ({BATCH_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, \
         ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21)"
    ))?
    .execute(params![
        row.id,
        row.client_id,
        row.endpoint,
        row.input_file_id,
        row.completion_window,
        row.status,
        row.output_file_id,
        row.error_file_id,
        row.errors,
        row.total,
        row.completed,
        row.failed,
        row.metadata,
        row.created_at,
        row.times[0],
        row.times[1],
        row.times[2],
        row.times[3],
        row.times[4],
        row.times[5],
        row.times[6],
    ])?;
    Ok(())
}

/// Stores a new batch.
pub fn insert_batch(conn: &Connection, batch: &Batch) -> Res<()> {
    write_batch_row(conn, &BatchRow::encode(batch)?)
}

/// A batch.
pub fn batch(conn: &Connection, id: BatchId) -> Res<Option<Batch>> {
    conn.prepare_cached(&format!(
        "SELECT {BATCH_COLUMNS} FROM batches WHERE id = ?1"
    ))?
    .query_row([batch_key(id)], batch_row)
    .optional()?
    .map(BatchRow::decode)
    .transpose()
    .map_err(Into::into)
}

/// Batches, newest first, before `before`.
pub fn list_batches(
    conn: &Connection,
    client: Option<ClientId>,
    before: Option<BatchId>,
    limit: usize,
) -> Res<Page<Batch>> {
    let mut sql = format!("SELECT {BATCH_COLUMNS} FROM batches WHERE 1 = 1");
    let mut values: Vec<Value> = Vec::new();
    if let Some(client) = client {
        values.push(Value::Blob(client_key(client).to_vec()));
        sql.push_str(&format!(" AND client_id = ?{}", values.len()));
    }
    if let Some(before) = before {
        values.push(Value::Blob(batch_key(before).to_vec()));
        sql.push_str(&format!(" AND id < ?{}", values.len()));
    }
    values.push(Value::Integer(to_i64(limit as u64 + 1)?));
    sql.push_str(&format!(" ORDER BY id DESC LIMIT ?{}", values.len()));
    let rows: Vec<BatchRow> = conn
        .prepare_cached(&sql)?
        .query_map(params_from_iter(values), batch_row)?
        .collect::<Result<_, _>>()?;
    page(rows.into_iter().map(BatchRow::decode), limit)
}

/// The batches that have not ended, oldest first. The statuses are written into the SQL (the
/// domain's [`BatchStatus::UNFINISHED`]), as the partial index `batches_unfinished` is: SQLite
/// uses a partial index only for a query whose condition implies the index's.
pub fn unfinished_batches(conn: &Connection, limit: usize) -> Res<Vec<Batch>> {
    let statuses = unfinished().map(|status| format!("'{status}'")).join(", ");
    let rows: Vec<BatchRow> = conn
        .prepare_cached(&format!(
            "SELECT {BATCH_COLUMNS} FROM batches INDEXED BY batches_unfinished \
             WHERE status IN ({statuses}) ORDER BY id LIMIT ?1"
        ))?
        .query_map(params![to_i64(limit as u64)?], batch_row)?
        .collect::<Result<_, _>>()?;
    rows.into_iter()
        .map(|row| row.decode().map_err(Into::into))
        .collect()
}

/// Keeps lines' tasks aside; a line kept already keeps its first task.
pub fn stage_batch_tasks(conn: &Connection, tasks: &[Task]) -> Res<()> {
    let mut stmt = conn.prepare_cached(&format!(
        "INSERT OR IGNORE INTO batch_staging ({STAGING_COLUMNS}) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)"
    ))?;
    for task in tasks {
        let row = StagedRow::encode(task)?;
        stmt.execute(params![
            row.batch_id,
            row.line,
            row.task_id,
            row.client_id,
            row.custom_id,
            row.model,
            row.on_restart,
            row.tier,
            row.response_id,
            row.owner,
            row.spec,
            row.metadata,
            row.created_at,
        ])?;
    }
    Ok(())
}

/// How many kept-aside lines one write removes once their batch has left `validating`.
pub const STAGED_DROP_CHUNK: usize = 1_000;

/// Removes up to `limit` of a batch's kept-aside lines; how many went.
///
/// A batch's lines are removed a chunk per write *after* the write that starts or refuses it,
/// never inside it: every command runs in a savepoint, whose journal keeps (in memory) each
/// page the command changes that existed before it, so removing 50 000 lines inside the start
/// held about 18 MiB of them until it committed. Lines left behind by a crash between the two
/// are harmless (only a `validating` batch's lines are read) and go with their batch's purge.
pub fn drop_staged(conn: &Connection, id: BatchId, limit: usize) -> Res<usize> {
    drop_staged_rows(conn, &batch_key(id), limit)
}

fn drop_staged_rows(conn: &Connection, batch: &[u8], limit: usize) -> Res<usize> {
    let removed = conn
        .prepare_cached(
            "DELETE FROM batch_staging WHERE batch_id = ?1 AND line IN \
             (SELECT line FROM batch_staging WHERE batch_id = ?1 ORDER BY line LIMIT ?2)",
        )?
        .execute(params![batch, to_i64(limit as u64)?])?;
    Ok(removed)
}

/// Writes `batch` if the stored one is in `from`; the batch as stored after, or `None`.
pub fn update_batch(conn: &Connection, from: BatchStatus, batch: &Batch) -> Res<Option<Batch>> {
    let row = BatchRow::encode(batch)?;
    let changed = conn
        .prepare_cached(
            "UPDATE batches SET status = ?1, output_file_id = ?2, error_file_id = ?3, \
             errors = ?4, in_progress_at = ?5, failed_at = ?6, finalizing_at = ?7, \
             completed_at = ?8, expired_at = ?9, cancelling_at = ?10, cancelled_at = ?11 \
             WHERE id = ?12 AND status = ?13",
        )?
        .execute(params![
            row.status,
            row.output_file_id,
            row.error_file_id,
            row.errors,
            row.times[0],
            row.times[1],
            row.times[2],
            row.times[3],
            row.times[4],
            row.times[5],
            row.times[6],
            row.id,
            from.as_str(),
        ])?;
    if changed == 0 {
        return Ok(None);
    }
    self::batch(conn, batch.id)
}

/// P-2 for a whole batch: every kept task created (`queued`, with its `response.created`
/// event), the total set and the batch `in_progress`, set-based, in the caller's transaction.
/// A line's task is not `background`: its answer is the one a synchronous request gets.
pub fn start_batch(conn: &Connection, started: &Batch) -> Res<Option<Batch>> {
    let id = batch_key(started.id);
    let status: Option<String> = conn
        .prepare_cached("SELECT status FROM batches WHERE id = ?1")?
        .query_row([id], |row| row.get(0))
        .optional()?;
    if status.as_deref() != Some(BatchStatus::Validating.as_str()) {
        return Ok(None);
    }
    let created = conn
        .prepare_cached(
            "INSERT INTO tasks (id, client_id, status, model, on_restart, created_at, \
             last_sequence_number, restarts, response_id, owner, background, items_opened, \
             item_open, tier, batch_id, batch_line) \
             SELECT task_id, client_id, ?2, model, on_restart, created_at, 1, 0, response_id, \
             owner, 0, 0, 0, tier, batch_id, line FROM batch_staging WHERE batch_id = ?1",
        )?
        .execute(params![id, TaskStatus::Queued.as_str()])?;
    conn.prepare_cached(
        "INSERT INTO task_specs (task_id, spec, metadata, accepted_by, custom_id) \
         SELECT task_id, spec, metadata, owner, custom_id FROM batch_staging WHERE batch_id = ?1",
    )?
    .execute([id])?;
    conn.prepare_cached(
        "INSERT INTO task_events (task_id, sequence_number, kind, created_at, data, item) \
         SELECT task_id, 1, ?2, created_at, '', NULL FROM batch_staging WHERE batch_id = ?1",
    )?
    .execute(params![id, EventCode::of(EventKind::Created)])?;
    conn.prepare_cached("UPDATE batches SET total = ?1 WHERE id = ?2")?
        .execute(params![to_i64(created as u64)?, id])?;
    update_batch(conn, BatchStatus::Validating, started)
}

/// [`update_batch`] to a batch's end, with its files' records.
pub fn end_batch(
    conn: &Connection,
    from: BatchStatus,
    batch: &Batch,
    files: &[StoredFile],
) -> Res<Option<Batch>> {
    let Some(ended) = update_batch(conn, from, batch)? else {
        return Ok(None);
    };
    for file in files {
        insert_file(conn, file)?;
    }
    Ok(Some(ended))
}

/// A batch's tasks in line order after `after`.
pub fn batch_tasks(
    conn: &Connection,
    id: BatchId,
    statuses: &[TaskStatus],
    after: u32,
    limit: usize,
) -> Res<Vec<Task>> {
    let mut sql = format!(
        "SELECT {TASK_COLUMNS} FROM {TASK_FROM} WHERE t.batch_id = ?1 AND t.batch_line > ?2"
    );
    let mut values: Vec<Value> = vec![
        Value::Blob(batch_key(id).to_vec()),
        Value::Integer(i64::from(after)),
    ];
    if !statuses.is_empty() {
        let mut marks = Vec::new();
        for status in statuses {
            values.push(Value::Text(status.as_str().to_owned()));
            marks.push(format!("?{}", values.len()));
        }
        sql.push_str(&format!(" AND t.status IN ({})", marks.join(",")));
    }
    values.push(Value::Integer(to_i64(limit as u64)?));
    sql.push_str(&format!(" ORDER BY t.batch_line LIMIT ?{}", values.len()));
    let raws: Vec<RawTask> = conn
        .prepare_cached(&sql)?
        .query_map(params_from_iter(values), raw_task)?
        .collect::<Result<_, _>>()?;
    raws.into_iter().map(RawTask::decode).collect()
}

/// A batch's tasks in line order after `after`, each with its stored response.
pub fn batch_answers(
    conn: &Connection,
    id: BatchId,
    after: u32,
    limit: usize,
) -> Res<Vec<(Task, Option<Response>)>> {
    let rows: Vec<(RawTask, Option<String>)> = prepare(conn, &codec::sql::batch_answers())?
        .query_map(
            params![batch_key(id), i64::from(after), to_i64(limit as u64)?],
            |row| Ok((raw_task(row)?, row.get(codec::TASK_COLUMN_COUNT)?)),
        )?
        .collect::<Result<_, _>>()?;
    rows.into_iter()
        .map(|(raw, doc)| {
            let task = raw.decode()?;
            let response = codec::response_of_task(task.id, doc.as_deref())?;
            Ok((task, response))
        })
        .collect()
}

/// Removes ended batches older than `cutoff`: their tasks first (at most `max_tasks`), then,
/// for a batch with none left, its output and error files' records and itself.
pub fn purge_batches(conn: &Connection, cutoff: Timestamp, max_tasks: usize) -> Res<BatchPurge> {
    let [a, b, c, d] = unfinished();
    let ended: Vec<Vec<u8>> = conn
        .prepare_cached(
            "SELECT id FROM batches WHERE status NOT IN (?1, ?2, ?3, ?4) \
             AND coalesce(completed_at, cancelled_at, expired_at, failed_at) < ?5 \
             ORDER BY id LIMIT 16",
        )?
        .query_map(params![a, b, c, d, cutoff.as_millis()], |row| row.get(0))?
        .collect::<Result<_, _>>()?;
    let mut purge = BatchPurge {
        more: ended.len() == 16,
        ..BatchPurge::default()
    };
    let mut budget = max_tasks;
    for id in ended {
        // Lines a crash left behind after the batch started or was refused.
        budget -= drop_staged_rows(conn, &id, budget)?;
        if budget == 0 {
            purge.more = true;
            break;
        }
        let tasks: Vec<Vec<u8>> = conn
            .prepare_cached("SELECT id FROM tasks WHERE batch_id = ?1 LIMIT ?2")?
            .query_map(params![id, to_i64(budget as u64 + 1)?], |row| row.get(0))?
            .collect::<Result<_, _>>()?;
        for task in tasks.iter().take(budget) {
            delete_task_rows(conn, task)?;
            purge.tasks += 1;
        }
        if tasks.len() > budget {
            purge.more = true;
            break;
        }
        budget -= tasks.len();
        let files: Vec<Vec<u8>> = conn
            .prepare_cached("SELECT id FROM files WHERE batch_id = ?1")?
            .query_map([&id], |row| row.get(0))?
            .collect::<Result<_, _>>()?;
        for file in &files {
            purge
                .files
                .push(FileId::from_ulid(crate::ops::ulid_of(file)?));
        }
        conn.prepare_cached("DELETE FROM files WHERE batch_id = ?1")?
            .execute([&id])?;
        conn.prepare_cached("DELETE FROM batches WHERE id = ?1")?
            .execute([&id])?;
        purge.batches += 1;
        if budget == 0 {
            purge.more = true;
            break;
        }
    }
    Ok(purge)
}
