//! Files and batches: their records, a validating batch's kept-aside tasks, the batch's start
//! (all its tasks at once, P-2), its compare-and-set steps, and the purge of ended batches.
//! The counts are kept by the `batch_counts` trigger (schema version 4), in the same transaction
//! as each task's end.

use lmsp_domain::batch::{Batch, BatchStatus, DuplicateLine, FilePurpose, StoredFile};
use lmsp_domain::event::EventKind;
use lmsp_domain::ids::{BatchId, ClientId, FileId};
use lmsp_domain::ports::{BatchPurge, FileDeleteOutcome, ListOrder, Page};
use lmsp_domain::status::TaskStatus;
use lmsp_domain::task::{Response, Task};
use lmsp_domain::time::Timestamp;
use rusqlite::{params, Connection};

use crate::codec::{self, batch_key, flows, ops as shared, EventCode, StagedRow, STAGING_COLUMNS};
use crate::ops::tasks::delete_task_rows;
use crate::ops::{prepare, run, to_i64, Res, Rows};

/// Stores a file's record.
pub fn insert_file(conn: &Connection, file: &StoredFile) -> Res<()> {
    run(shared::insert_file(&Rows(conn), file))
}

/// A file's record.
pub fn file(conn: &Connection, id: FileId) -> Res<Option<StoredFile>> {
    run(shared::file(&Rows(conn), id))
}

/// Files in id `order`, past `after` in that order.
pub fn list_files(
    conn: &Connection,
    client: Option<ClientId>,
    purpose: Option<FilePurpose>,
    after: Option<FileId>,
    order: ListOrder,
    limit: usize,
) -> Res<Page<StoredFile>> {
    run(shared::list_files(
        &Rows(conn),
        client,
        purpose,
        after,
        order,
        limit,
    ))
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
    run(flows::delete_file(&Rows(conn), id, client))
}

/// Stores a new batch.
pub fn insert_batch(conn: &Connection, batch: &Batch) -> Res<()> {
    run(shared::insert_batch(&Rows(conn), batch))
}

/// A batch.
pub fn batch(conn: &Connection, id: BatchId) -> Res<Option<Batch>> {
    run(shared::batch(&Rows(conn), id))
}

/// Batches, newest first, before `before`.
pub fn list_batches(
    conn: &Connection,
    client: Option<ClientId>,
    before: Option<BatchId>,
    limit: usize,
) -> Res<Page<Batch>> {
    run(shared::list_batches(&Rows(conn), client, before, limit))
}

/// The batches that have not ended, oldest first. The statuses are written into the SQL (the
/// domain's [`BatchStatus::UNFINISHED`]), as the partial index `batches_unfinished` is: SQLite
/// uses a partial index only for a query whose condition implies the index's.
pub fn unfinished_batches(conn: &Connection, limit: usize) -> Res<Vec<Batch>> {
    let from = "batches INDEXED BY batches_unfinished";
    run(shared::unfinished_batches(&Rows(conn), from, limit))
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

/// The kept lines of a batch whose `custom_id` an earlier kept line of it has, in line order,
/// at most `limit`.
pub fn staged_duplicates(conn: &Connection, id: BatchId, limit: usize) -> Res<Vec<DuplicateLine>> {
    // A one-off pass over every kept line: run with a small page cache, so that it does not grow
    // the reading connection's cache by its 2 MiB (memory a batch's validation would otherwise
    // add). Lowering the cache drops the pages that connection kept, so its next reads start
    // cold; its size is restored whatever the pass came to.
    let limit = to_i64(limit as u64)?;
    let cache: i64 = conn.query_row("PRAGMA cache_size", [], |row| row.get(0))?;
    conn.pragma_update(None, "cache_size", SCAN_CACHE_KIB)?;
    let rows = prepare(conn, codec::sql::STAGED_DUPLICATES).and_then(|mut statement| {
        statement
            .query_map(params![batch_key(id), limit], |row| {
                Ok((row.get::<_, i64>(0)?, row.get::<_, String>(1)?))
            })?
            .collect::<Result<Vec<_>, _>>()
    });
    conn.pragma_update(None, "cache_size", cache)?;
    rows?
        .into_iter()
        .map(|(line, custom_id)| Ok(codec::batches::duplicate_line(line, custom_id)?))
        .collect()
}

/// The page cache of a one-off pass over a batch's kept lines, as `PRAGMA cache_size` takes it
/// (negative: KiB).
const SCAN_CACHE_KIB: i64 = -256;

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
    run(shared::update_batch(&Rows(conn), from, batch))
}

/// P-2 for a whole batch: every kept task created (`queued`, with its `response.created`
/// event), the total set and the batch `in_progress`, set-based, in the caller's transaction.
/// A line's task is not `background`: its answer is the one a synchronous request gets.
pub fn start_batch(conn: &Connection, started: &Batch) -> Res<Option<Batch>> {
    if !run(flows::batch_validating(&Rows(conn), started.id))? {
        return Ok(None);
    }
    let id = batch_key(started.id);
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
    run(shared::end_batch(&Rows(conn), from, batch, files))
}

/// A batch's tasks in line order after `after`.
pub fn batch_tasks(
    conn: &Connection,
    id: BatchId,
    statuses: &[TaskStatus],
    after: u32,
    limit: usize,
) -> Res<Vec<Task>> {
    run(shared::batch_tasks(&Rows(conn), id, statuses, after, limit))
}

/// A batch's tasks in line order after `after`, each with its stored response.
pub fn batch_answers(
    conn: &Connection,
    id: BatchId,
    after: u32,
    limit: usize,
) -> Res<Vec<(Task, Option<Response>)>> {
    run(shared::batch_answers(&Rows(conn), id, after, limit))
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
        prepare(conn, codec::sql::DELETE_BATCH)?.execute([&id])?;
        purge.batches += 1;
        if budget == 0 {
            purge.more = true;
            break;
        }
    }
    Ok(purge)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use lmsp_domain::ids::BatchId;
    use rusqlite::Connection;
    use ulid::Ulid;

    /// The pass over a batch's kept lines runs with a small cache and gives the connection its
    /// own back, so that a validation neither grows a reader's cache nor changes it for later
    /// reads.
    #[test]
    fn the_duplicates_pass_restores_the_connections_cache() {
        let mut conn = Connection::open_in_memory().unwrap();
        crate::schema::migrate(&mut conn).unwrap();
        conn.pragma_update(None, "cache_size", -3000).unwrap();
        let found = super::staged_duplicates(&conn, BatchId::from_ulid(Ulid::new()), 10).unwrap();
        assert!(found.is_empty());
        let cache: i64 = conn
            .query_row("PRAGMA cache_size", [], |row| row.get(0))
            .unwrap();
        assert_eq!(cache, -3000);
    }
}
