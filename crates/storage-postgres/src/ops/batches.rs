//! Files and batches (`lmsp_domain::batch`): their records, the staging of a validating batch's
//! tasks and their creation all at once (P-2 for a whole batch), the batch's steps as
//! compare-and-sets on its status, and the purge of ended batches with their tasks (P-5, P-6).
//!
//! A batch's counts are never written here: the `batch_counts` trigger (schema version 4) adds
//! each of its tasks' ends to them in the transaction that ends the task, as the domain's
//! `batch::counted` says.

use lmsp_domain::batch::{Batch, BatchStatus, DuplicateLine, FilePurpose, StoredFile};
use lmsp_domain::event::EventKind;
use lmsp_domain::ids::{BatchId, ClientId, FileId, TaskId};
use lmsp_domain::ports::{BatchPurge, FileDeleteOutcome, ListOrder, Page};
use lmsp_domain::status::TaskStatus;
use lmsp_domain::task::{Response, Task};
use lmsp_domain::time::Timestamp;
use lmsp_domain::writes::PURGED_STATUSES;

use crate::codec::flows::Rows as _;
use crate::codec::query::Param;
use crate::codec::{
    self, flows, ops as shared, BatchRow, EventCode, StagedRow, BATCH_COLUMNS, STAGING_COLUMNS,
};
use crate::ops::{batch_key, corrupt, file_key, to_i64, ulid_of, Db, Res, Rows};

/// The statuses of a batch that has ended.
const FINISHED: &str = "('failed', 'completed', 'expired', 'cancelled')";

/// When an ended batch ended ([`Batch::ended_at`]).
const ENDED_AT: &str = "coalesce(failed_at, completed_at, cancelled_at, expired_at)";

/// A batch line's stored form (`INTEGER`).
pub fn line_key(line: u32) -> Res<i32> {
    i32::try_from(line).map_err(|_| corrupt(format!("batch line {line} is out of range")))
}

/// Stores a file's record.
pub async fn insert_file<C: Db>(db: &C, file: &StoredFile) -> Res<()> {
    shared::insert_file(&Rows(db), file).await
}

/// A file's record.
pub async fn file<C: Db>(db: &C, id: FileId) -> Res<Option<StoredFile>> {
    shared::file(&Rows(db), id).await
}

/// Files in id `order`, past `after` in that order, of `client` (I-7) and with `purpose` when
/// given.
pub async fn list_files<C: Db>(
    db: &C,
    client: Option<ClientId>,
    purpose: Option<FilePurpose>,
    after: Option<FileId>,
    order: ListOrder,
    limit: usize,
) -> Res<Page<StoredFile>> {
    shared::list_files(&Rows(db), client, purpose, after, order, limit).await
}

/// Removes a file's record (and its bytes, which are rows of this database too), unless a batch
/// that has not ended reads it. `client` must own it (I-7).
pub async fn delete_file<C: Db>(
    db: &C,
    id: FileId,
    client: Option<ClientId>,
) -> Res<FileDeleteOutcome> {
    let outcome = flows::delete_file(&Rows(db), id, client).await?;
    if outcome == FileDeleteOutcome::Deleted {
        db.execute(
            "DELETE FROM file_chunks WHERE file_id = $1",
            &[&file_key(id)],
        )
        .await?;
    }
    Ok(outcome)
}

/// Stores a new batch. Its input file's row is share-locked first, so a concurrent delete of the
/// file either finished before (the batch then finds no input when it is validated) or sees
/// this batch and leaves the file in use.
pub async fn insert_batch<C: Db>(db: &C, batch: &Batch) -> Res<()> {
    db.query(
        "SELECT 1 FROM files WHERE id = $1 FOR KEY SHARE",
        &[&file_key(batch.input_file_id)],
    )
    .await?;
    shared::insert_batch(&Rows(db), batch).await
}

/// A batch, with its counts as they are now.
pub async fn batch<C: Db>(db: &C, id: BatchId) -> Res<Option<Batch>> {
    shared::batch(&Rows(db), id).await
}

/// Batches, newest first, before `before`, of `client` when given (I-7).
pub async fn list_batches<C: Db>(
    db: &C,
    client: Option<ClientId>,
    before: Option<BatchId>,
    limit: usize,
) -> Res<Page<Batch>> {
    shared::list_batches(&Rows(db), client, before, limit).await
}

/// The batches that have not ended, oldest first.
pub async fn unfinished_batches<C: Db>(db: &C, limit: usize) -> Res<Vec<Batch>> {
    shared::unfinished_batches(&Rows(db), "batches", limit).await
}

/// The kept lines of a batch whose `custom_id` an earlier kept line of it has, in line order,
/// at most `limit`.
pub async fn staged_duplicates<C: Db>(
    db: &C,
    id: BatchId,
    limit: usize,
) -> Res<Vec<DuplicateLine>> {
    let rows = db
        .query(
            codec::sql::STAGED_DUPLICATES,
            &[&batch_key(id), &to_i64(limit as u64)?],
        )
        .await?;
    rows.iter()
        .map(|row| {
            let line: i32 = row.try_get(0)?;
            Ok(codec::batches::duplicate_line(
                i64::from(line),
                row.try_get(1)?,
            )?)
        })
        .collect()
}

/// Keeps the tasks of some lines aside until their batch starts; a line kept already keeps its
/// first task. Only lines of batches still `validating` are kept: their rows are share-locked,
/// so a step out of `validating` (which drops the kept lines) and this one serialize, and no
/// line is left behind for a batch that will never start.
pub async fn stage_batch_tasks<C: Db>(db: &C, tasks: &[Task]) -> Res<()> {
    if tasks.is_empty() {
        return Ok(());
    }
    let mut batch_ids: Vec<Vec<u8>> = Vec::with_capacity(tasks.len());
    let mut lines: Vec<i32> = Vec::with_capacity(tasks.len());
    let mut task_ids: Vec<Vec<u8>> = Vec::with_capacity(tasks.len());
    let mut clients: Vec<Vec<u8>> = Vec::with_capacity(tasks.len());
    let mut custom_ids: Vec<String> = Vec::with_capacity(tasks.len());
    let mut models: Vec<String> = Vec::with_capacity(tasks.len());
    let mut policies: Vec<String> = Vec::with_capacity(tasks.len());
    let mut tiers: Vec<i16> = Vec::with_capacity(tasks.len());
    let mut response_ids: Vec<Option<String>> = Vec::with_capacity(tasks.len());
    let mut owners: Vec<Vec<u8>> = Vec::with_capacity(tasks.len());
    let mut specs: Vec<String> = Vec::with_capacity(tasks.len());
    let mut metadata: Vec<String> = Vec::with_capacity(tasks.len());
    let mut created: Vec<i64> = Vec::with_capacity(tasks.len());
    for task in tasks {
        let row = StagedRow::encode(task)?;
        lines.push(line_key(row.line()?)?);
        tiers.push(
            i16::try_from(row.tier)
                .map_err(|_| corrupt(format!("a tier rank {} out of range", row.tier)))?,
        );
        batch_ids.push(row.batch_id);
        task_ids.push(row.task_id);
        clients.push(row.client_id);
        custom_ids.push(row.custom_id);
        models.push(row.model);
        policies.push(row.on_restart);
        response_ids.push(row.response_id);
        owners.push(row.owner);
        specs.push(row.spec);
        metadata.push(row.metadata);
        created.push(row.created_at);
    }
    let mut batches = batch_ids.clone();
    batches.sort();
    batches.dedup();
    let open: Vec<Vec<u8>> = db
        .query(
            "SELECT id FROM batches WHERE id = ANY($1) AND status = 'validating' ORDER BY id \
             FOR SHARE",
            &[&batches],
        )
        .await?
        .iter()
        .map(|row| row.try_get(0))
        .collect::<Result<_, _>>()?;
    if open.is_empty() {
        return Ok(());
    }
    db.execute(
        &format!(
            "INSERT INTO batch_staging ({STAGING_COLUMNS}) \
         SELECT * FROM unnest($1::bytea[], $2::integer[], $3::bytea[], $4::bytea[], $5::text[], \
         $6::text[], $7::text[], $8::smallint[], $9::text[], $10::bytea[], $11::text[], \
         $12::text[], $13::bigint[]) \
         AS s(batch_id, line, task_id, client_id, custom_id, model, on_restart, tier, \
         response_id, owner, spec, metadata, created_at) \
         WHERE s.batch_id = ANY($14) \
         ON CONFLICT (batch_id, line) DO NOTHING"
        ),
        &[
            &batch_ids,
            &lines,
            &task_ids,
            &clients,
            &custom_ids,
            &models,
            &policies,
            &tiers,
            &response_ids,
            &owners,
            &specs,
            &metadata,
            &created,
            &open,
        ],
    )
    .await?;
    Ok(())
}

/// P-2 for a whole batch: every kept line becomes a task exactly as a create writes one (its
/// row `queued` at sequence 1, its spec, its `response.created` event), in one statement that
/// also drops the kept lines. Returns how many tasks it created and the first line's task.
const START_SQL: &str = "WITH staged AS (DELETE FROM batch_staging WHERE batch_id = $1 \
     RETURNING *), \
     t AS (INSERT INTO tasks (id, client_id, status, model, on_restart, created_at, \
     last_sequence_number, restarts, response_id, owner, background, items_opened, item_open, \
     tier, batch_id, batch_line) \
     SELECT task_id, client_id, 'queued', model, on_restart, created_at, 1, 0, response_id, \
     owner, FALSE, 0, FALSE, tier, batch_id, line FROM staged RETURNING id, batch_line), \
     s AS (INSERT INTO task_specs (task_id, spec, metadata, accepted_by, custom_id) \
     SELECT task_id, spec, metadata, owner, custom_id FROM staged), \
     e AS (INSERT INTO task_events (task_id, sequence_number, kind, created_at, data) \
     SELECT task_id, 1, $2::bigint, created_at, '' FROM staged) \
     SELECT count(*), (SELECT id FROM t ORDER BY batch_line LIMIT 1) FROM t";

/// Drops the lines kept for a batch.
async fn drop_staged<C: Db>(db: &C, batch: &[u8]) -> Res<()> {
    db.execute("DELETE FROM batch_staging WHERE batch_id = $1", &[&batch])
        .await?;
    Ok(())
}

/// Drops a batch's kept lines when a step from `from` to `batch` leaves `validating`.
async fn left_validating<C: Db>(db: &C, from: BatchStatus, batch: &Batch) -> Res<()> {
    if from == BatchStatus::Validating && batch.status != BatchStatus::Validating {
        drop_staged(db, &batch_key(batch.id)).await?;
    }
    Ok(())
}

/// Writes `started` (from `validating`) and creates every kept line's task, in the caller's
/// transaction; the batch as stored and the first line's task (to announce), or `None` (with
/// the kept lines dropped) when the batch is no longer `validating`.
pub async fn start_batch<C: Db>(db: &C, started: &Batch) -> Res<(Option<Batch>, Option<TaskId>)> {
    let id = batch_key(started.id);
    if !flows::batch_validating(&Rows(db), started.id).await? {
        drop_staged(db, &id).await?;
        return Ok((None, None));
    }
    let row = db
        .query_opt(START_SQL, &[&id, &EventCode::of(EventKind::Created)])
        .await?
        .ok_or_else(|| corrupt("the start of a batch counted nothing"))?;
    let total: i64 = row.try_get(0)?;
    let first: Option<Vec<u8>> = row.try_get(1)?;
    let mut values = shared::batch_step(started)?;
    values.push(Param::Integer(total));
    let sql = format!(
        "UPDATE batches SET {}, total = $13 WHERE id = $1 RETURNING {BATCH_COLUMNS}",
        codec::sql::BATCH_STEP_SET
    );
    let stored: Option<BatchRow> = Rows(db).read_one(&sql, &values).await?;
    let stored = stored.map(BatchRow::decode).transpose()?;
    let first = first
        .as_deref()
        .map(|bytes| Ok::<_, crate::error::DbError>(TaskId::from_ulid(ulid_of(bytes)?)))
        .transpose()?;
    Ok((stored, first))
}

/// Writes `batch` if the stored one is in status `from` (a compare-and-set; never the counts);
/// leaving `validating` drops its kept lines. The batch as stored now, or `None`.
pub async fn update_batch<C: Db>(db: &C, from: BatchStatus, batch: &Batch) -> Res<Option<Batch>> {
    let stored = shared::update_batch(&Rows(db), from, batch).await?;
    left_validating(db, from, batch).await?;
    Ok(stored)
}

/// [`update_batch`] to the batch's end, with its files' records stored when it was written.
pub async fn end_batch<C: Db>(
    db: &C,
    from: BatchStatus,
    batch: &Batch,
    files: &[StoredFile],
) -> Res<Option<Batch>> {
    let stored = shared::end_batch(&Rows(db), from, batch, files).await?;
    left_validating(db, from, batch).await?;
    Ok(stored)
}

/// A batch's tasks in line order after line `after`, at most `limit`, in one of `statuses` when
/// some are given.
pub async fn batch_tasks<C: Db>(
    db: &C,
    batch: BatchId,
    statuses: &[TaskStatus],
    after: u32,
    limit: usize,
) -> Res<Vec<Task>> {
    shared::batch_tasks(&Rows(db), batch, statuses, after, limit).await
}

/// A batch's tasks in line order after `after`, each with its stored response.
pub async fn batch_answers<C: Db>(
    db: &C,
    batch: BatchId,
    after: u32,
    limit: usize,
) -> Res<Vec<(Task, Option<Response>)>> {
    shared::batch_answers(&Rows(db), batch, after, limit).await
}

/// Removes many tasks' rows at once (`codec::flows::delete_task_rows`'s statements, set-based);
/// their idempotency records stay, pointing at nothing.
async fn delete_tasks_rows<C: Db>(db: &C, ids: &[Vec<u8>]) -> Res<()> {
    for sql in [
        "DELETE FROM task_events WHERE task_id = ANY($1)",
        "DELETE FROM responses WHERE task_id = ANY($1)",
        "DELETE FROM snapshots WHERE task_id = ANY($1)",
        "UPDATE idempotency_keys SET reply_task = NULL WHERE reply_task = ANY($1)",
        "DELETE FROM task_specs WHERE task_id = ANY($1)",
        "DELETE FROM tasks WHERE id = ANY($1)",
    ] {
        db.execute(sql, &[&ids]).await?;
    }
    Ok(())
}

/// P-5, P-6 for batches: the batches that ended before `cutoff`, oldest end first (locked with
/// `SKIP LOCKED`), lose their finished tasks, at most `max_tasks` of them in all; a batch left
/// with no task goes, with its output and error files' records (and bytes). A batch that still
/// had an unfinished task (none should) keeps it and stays. Never a batch that has not ended,
/// nor an uploaded file.
pub async fn purge_batches<C: Db>(db: &C, cutoff: Timestamp, max_tasks: usize) -> Res<BatchPurge> {
    let budget_total = max_tasks.max(1);
    let sql = format!(
        "SELECT id FROM batches \
         WHERE status IN {FINISHED} AND {ENDED_AT} < $1 \
         ORDER BY {ENDED_AT}, id LIMIT $2 FOR UPDATE SKIP LOCKED"
    );
    let candidates = db
        .query(
            &sql,
            &[&cutoff.as_millis(), &to_i64(budget_total as u64 + 1)?],
        )
        .await?;
    let finished: Vec<&'static str> = PURGED_STATUSES
        .iter()
        .map(|status| status.as_str())
        .collect();
    let mut purge = BatchPurge::default();
    let mut budget = budget_total;
    for (index, row) in candidates.iter().enumerate() {
        if budget == 0 || index == budget_total {
            purge.more = true;
            break;
        }
        let id: Vec<u8> = row.try_get(0)?;
        let tasks: Vec<Vec<u8>> = db
            .query(
                "SELECT id FROM tasks WHERE batch_id = $1 AND status = ANY($2) \
                 ORDER BY batch_line LIMIT $3 FOR UPDATE",
                &[&id, &finished, &to_i64(budget as u64 + 1)?],
            )
            .await?
            .iter()
            .map(|row| row.try_get(0))
            .collect::<Result<_, _>>()?;
        let taken = tasks.len().min(budget);
        if taken > 0 {
            delete_tasks_rows(db, &tasks[..taken]).await?;
            budget -= taken;
            purge.tasks += taken as u64;
        }
        if tasks.len() > taken {
            purge.more = true;
            break;
        }
        let left = db
            .query_opt("SELECT 1 FROM tasks WHERE batch_id = $1 LIMIT 1", &[&id])
            .await?;
        if left.is_some() {
            // P-6: an unfinished task is never purged; its batch waits for it.
            continue;
        }
        // The files this batch wrote (its output and error files): never an upload.
        let gone: Vec<Vec<u8>> = db
            .query("DELETE FROM files WHERE batch_id = $1 RETURNING id", &[&id])
            .await?
            .iter()
            .map(|row| row.try_get(0))
            .collect::<Result<_, _>>()?;
        if !gone.is_empty() {
            db.execute("DELETE FROM file_chunks WHERE file_id = ANY($1)", &[&gone])
                .await?;
        }
        for file in &gone {
            purge.files.push(FileId::from_ulid(ulid_of(file)?));
        }
        drop_staged(db, &id).await?;
        db.execute(codec::sql::DELETE_BATCH, &[&id]).await?;
        purge.batches += 1;
    }
    Ok(purge)
}

#[cfg(test)]
mod tests {
    use lmsp_domain::batch::BatchStatus;

    /// The SQL lists of statuses are the domain's: the unfinished ones, and every other.
    #[test]
    fn the_sql_status_lists_are_the_domains() {
        let listed = |sql: &str| -> Vec<String> {
            sql.trim_matches(|c| c == '(' || c == ')')
                .split(", ")
                .map(|name| name.trim_matches('\'').to_owned())
                .collect()
        };
        let unfinished: Vec<String> = BatchStatus::UNFINISHED
            .iter()
            .map(|status| status.as_str().to_owned())
            .collect();
        let shared = format!("({})", crate::codec::sql::unfinished_batch_statuses());
        assert_eq!(listed(&shared), unfinished);
        for name in listed(super::FINISHED) {
            let status = BatchStatus::parse(&name);
            assert!(status.is_some_and(BatchStatus::is_finished), "{name}");
        }
        // Eight statuses in all (`BatchStatus`'s variants).
        assert_eq!(listed(super::FINISHED).len() + unfinished.len(), 8);
    }
}
