//! The reads and writes of stored records both adapters make word for word, over [`Rows`]:
//! encode a record's row, bind its values ([`Param`], `NULL`s typed by their column) in the
//! order of this crate's statement ([`crate::sql`]) and run it; or read rows and decode them.
//! What stays the adapters' is where the databases differ: the locks PostgreSQL takes first,
//! how a list of many rows is written (PostgreSQL's arrays), what a lost race means.

use lmsp_domain::auth::Client;
use lmsp_domain::batch::{Batch, BatchStatus, FilePurpose, StoredFile};
use lmsp_domain::idempotency::IdempotencyRecord;
use lmsp_domain::ids::{BatchId, ClientId, FileId, ResponseId, TaskId, WebhookEndpointId};
use lmsp_domain::model::{FileFingerprint, ModelId, ModelRecord};
use lmsp_domain::ports::{ListOrder, Page, Snapshot, TaskFilter};
use lmsp_domain::schedule::ClientLimits;
use lmsp_domain::status::TaskStatus;
use lmsp_domain::task::{Response, Task};
use lmsp_domain::time::Timestamp;
use lmsp_domain::webhooks::{Delivery, WebhookEndpoint};

use crate::batches::{batch_key, file_key, BatchRow, FileRow, BATCH_COLUMNS};
use crate::columns::{Columns, ReadRow};
use crate::flows::Rows;
use crate::query::{self, Param, Query};
use crate::records::{ClientRow, IdempotencyRow, ModelRow};
use crate::rows::{from_i64, key_of, to_i64, u32_of, TaskRow, TASK_COLUMN_COUNT};
use crate::webhooks::{endpoint_key, DeliveryRow, EndpointRow};
use crate::{sql, DbError};

/// A stored key (16 bytes) as a bound value.
fn key_param(key: [u8; 16]) -> Param {
    Param::Blob(key.to_vec())
}

/// A `LIMIT` as a bound value.
fn limit_param(limit: usize) -> Result<Param, DbError> {
    Ok(Param::Integer(to_i64(limit as u64)?))
}

/// Rows read as `R`, decoded.
fn decoded<R, T>(rows: Vec<R>, decode: fn(R) -> Result<T, DbError>) -> Result<Vec<T>, DbError> {
    rows.into_iter().map(decode).collect()
}

/// A page of at most `limit` of `rows` (`limit` + 1 read, so that it knows whether there are
/// more), decoded.
fn page<R, T>(
    rows: Vec<R>,
    decode: fn(R) -> Result<T, DbError>,
    limit: usize,
) -> Result<Page<T>, DbError> {
    Ok(Page::of_fetched(decoded(rows, decode)?, limit))
}

/// The row `sql` selects by `key`, decoded.
async fn by_key<R: Rows, S: ReadRow, T>(
    rows: &R,
    sql: &str,
    key: Param,
    decode: fn(S) -> Result<T, DbError>,
) -> Result<Option<T>, R::Error> {
    let row = rows.read_one::<S>(sql, &[key]).await?;
    Ok(row.map(decode).transpose()?)
}

/// The rows `query` (a list built at run time) selects, one more than `limit`, as a page.
async fn query_page<R: Rows, S: ReadRow, T>(
    rows: &R,
    query: &Query,
    decode: fn(S) -> Result<T, DbError>,
    limit: usize,
) -> Result<Page<T>, R::Error> {
    let found = rows.read_all::<S>(&query.sql, &query.params).await?;
    Ok(page(found, decode, limit)?)
}

// Clients.

/// Stores a client.
pub async fn insert_client<R: Rows>(rows: &R, client: &Client) -> Result<(), R::Error> {
    let row = ClientRow::encode(client)?;
    let params = [
        Param::Text(row.id),
        Param::Text(row.name),
        Param::Text(row.token_hash),
        Param::Text(row.scopes),
        Param::Integer(row.created_at),
        Param::integer_or_null(row.revoked_at),
    ];
    rows.execute(sql::INSERT_CLIENT, &params).await?;
    Ok(())
}

/// The unrevoked client whose token has `hash` (hex).
pub async fn client_by_token_hash<R: Rows>(
    rows: &R,
    hash: String,
) -> Result<Option<Client>, R::Error> {
    let sql = sql::client_by_token_hash();
    by_key(rows, &sql, Param::Text(hash), ClientRow::decode).await
}

/// A client.
pub async fn client<R: Rows>(rows: &R, id: ClientId) -> Result<Option<Client>, R::Error> {
    let sql = sql::client_by_id();
    by_key(rows, &sql, Param::Text(id.to_string()), ClientRow::decode).await
}

/// Every client, oldest first.
pub async fn list_clients<R: Rows>(rows: &R) -> Result<Vec<Client>, R::Error> {
    let found = rows.read_all(&sql::all_clients(), &[]).await?;
    Ok(decoded(found, ClientRow::decode)?)
}

/// Revokes a client at `at`; `false` when there is none or it was revoked already.
pub async fn revoke_client<R: Rows>(
    rows: &R,
    id: ClientId,
    at: Timestamp,
) -> Result<bool, R::Error> {
    let params = [Param::Integer(at.as_millis()), Param::Text(id.to_string())];
    Ok(rows.execute(sql::REVOKE_CLIENT, &params).await? == 1)
}

/// A client's limits (none when it has no row of them).
pub async fn client_limits<R: Rows>(rows: &R, id: ClientId) -> Result<ClientLimits, R::Error> {
    let key = [key_param(key_of(id.ulid()))];
    let stored: Option<LimitsRow> = rows.read_one(sql::CLIENT_LIMITS, &key).await?;
    let LimitsRow(max_running, max_queued) = stored.unwrap_or(LimitsRow(None, None));
    Ok(ClientLimits {
        max_running: max_running.map(u32_of).transpose()?,
        max_queued: max_queued.map(u32_of).transpose()?,
    })
}

/// A client's stored limits ([`sql::CLIENT_LIMITS`]): running, queued.
struct LimitsRow(Option<i64>, Option<i64>);

impl ReadRow for LimitsRow {
    fn read<C: Columns>(row: &C) -> Result<Self, C::Error> {
        Ok(LimitsRow(row.int_or_null(0)?, row.int_or_null(1)?))
    }
}

// Models.

/// Inserts a model's row unless its id exists; whether it did.
pub async fn insert_model_row<R: Rows>(rows: &R, row: &ModelRow) -> Result<bool, R::Error> {
    let params = [
        Param::Text(row.id.clone()),
        Param::Text(row.format.clone()),
        Param::text_or_null(row.path.clone()),
        Param::integer_or_null(row.size_bytes),
        Param::integer_or_null(row.modified_millis),
        Param::text_or_null(row.digest.clone()),
        Param::text_or_null(row.upstream_model.clone()),
        Param::Integer(row.created_at),
    ];
    Ok(rows.execute(&sql::insert_model(), &params).await? == 1)
}

/// A model's record.
pub async fn model<R: Rows>(rows: &R, id: &ModelId) -> Result<Option<ModelRecord>, R::Error> {
    let key = Param::Text(id.as_str().to_owned());
    by_key(rows, &sql::model_by_id(), key, ModelRow::decode).await
}

/// Every model, by id.
pub async fn list_models<R: Rows>(rows: &R) -> Result<Vec<ModelRecord>, R::Error> {
    let found = rows.read_all(&sql::all_models(), &[]).await?;
    Ok(decoded(found, ModelRow::decode)?)
}

/// Records where a file model's file is now (a model of an upstream one is left alone).
pub async fn update_model_file<R: Rows>(
    rows: &R,
    id: &ModelId,
    file: &FileFingerprint,
) -> Result<(), R::Error> {
    let params = [
        Param::Text(file.path.clone()),
        Param::Integer(to_i64(file.size_bytes)?),
        Param::Integer(file.modified_millis),
        Param::Text(file.digest.as_str().to_owned()),
        Param::Text(id.as_str().to_owned()),
    ];
    rows.execute(sql::UPDATE_MODEL_FILE, &params).await?;
    Ok(())
}

// Idempotency records.

/// Writes an idempotency record (`replace`: in place of one stored under its key, see
/// [`sql::put_idempotency_record`]); how many rows it wrote.
pub async fn put_record<R: Rows>(
    rows: &R,
    record: &IdempotencyRecord,
    replace: bool,
) -> Result<u64, R::Error> {
    let params = record_params(record);
    rows.execute(&sql::put_idempotency_record(replace), &params)
        .await
}

/// An idempotency record's values in the order of its columns: its key's (client, operation,
/// key), then [`IdempotencyRow`]'s (`$1…$10` of [`sql::put_idempotency_record`]).
pub fn record_params(record: &IdempotencyRecord) -> [Param; 10] {
    let row = IdempotencyRow::encode(record);
    [
        key_param(key_of(record.scope.client_id.ulid())),
        Param::Text(record.scope.operation.as_str().to_owned()),
        Param::Text(record.key.as_str().to_owned()),
        Param::Blob(row.digest),
        Param::blob_or_null(row.reply),
        Param::blob_or_null(row.reply_task),
        Param::integer_or_null(row.held_until),
        Param::blob_or_null(row.held_by),
        Param::Integer(row.created_at),
        Param::Integer(row.expires_at),
    ]
}

// Files and batches.

/// Stores a file's record.
pub async fn insert_file<R: Rows>(rows: &R, file: &StoredFile) -> Result<(), R::Error> {
    let row = FileRow::encode(file)?;
    let params = [
        Param::Blob(row.id),
        Param::Blob(row.client_id),
        Param::Text(row.filename),
        Param::Text(row.purpose),
        Param::Integer(row.bytes),
        Param::Text(row.digest),
        Param::Integer(row.created_at),
        Param::blob_or_null(row.batch_id),
    ];
    rows.execute(&sql::insert_file(), &params).await?;
    Ok(())
}

/// A file's record.
pub async fn file<R: Rows>(rows: &R, id: FileId) -> Result<Option<StoredFile>, R::Error> {
    let key = key_param(file_key(id));
    by_key(rows, &sql::file_by_id(), key, FileRow::decode).await
}

/// Files in id `order`, past `after` in that order, of `client` (I-7) and with `purpose` when
/// given, at most `limit`.
pub async fn list_files<R: Rows>(
    rows: &R,
    client: Option<ClientId>,
    purpose: Option<FilePurpose>,
    after: Option<FileId>,
    order: ListOrder,
    limit: usize,
) -> Result<Page<StoredFile>, R::Error> {
    let query = query::files_page(client, purpose, after, order, limit)?;
    query_page(rows, &query, FileRow::decode, limit).await
}

/// Stores a new batch.
pub async fn insert_batch<R: Rows>(rows: &R, batch: &Batch) -> Result<(), R::Error> {
    let row = BatchRow::encode(batch)?;
    let mut params = vec![
        Param::Blob(row.id),
        Param::Blob(row.client_id),
        Param::Text(row.endpoint),
        Param::Blob(row.input_file_id),
        Param::Integer(row.completion_window),
        Param::Text(row.status),
        Param::blob_or_null(row.output_file_id),
        Param::blob_or_null(row.error_file_id),
        Param::text_or_null(row.errors),
        Param::Integer(row.total),
        Param::Integer(row.completed),
        Param::Integer(row.failed),
        Param::Text(row.metadata),
        Param::Integer(row.created_at),
    ];
    params.extend(row.times.map(Param::integer_or_null));
    rows.execute(&sql::insert_batch(), &params).await?;
    Ok(())
}

/// A batch, with its counts as they are now.
pub async fn batch<R: Rows>(rows: &R, id: BatchId) -> Result<Option<Batch>, R::Error> {
    let key = key_param(batch_key(id));
    by_key(rows, &sql::batch_by_id(), key, BatchRow::decode).await
}

/// Batches, newest first, before `before`, of `client` when given (I-7), at most `limit`.
pub async fn list_batches<R: Rows>(
    rows: &R,
    client: Option<ClientId>,
    before: Option<BatchId>,
    limit: usize,
) -> Result<Page<Batch>, R::Error> {
    let query = query::batches_page(client, before, limit)?;
    query_page(rows, &query, BatchRow::decode, limit).await
}

/// A step of a batch's values: its id (`$1`), then `$2…$12` of [`sql::BATCH_STEP_SET`].
pub fn batch_step(batch: &Batch) -> Result<Vec<Param>, DbError> {
    let row = BatchRow::encode(batch)?;
    let mut params = vec![
        Param::Blob(row.id),
        Param::Text(row.status),
        Param::blob_or_null(row.output_file_id),
        Param::blob_or_null(row.error_file_id),
        Param::text_or_null(row.errors),
    ];
    params.extend(row.times.map(Param::integer_or_null));
    Ok(params)
}

/// Writes `batch` if the stored one is in status `from` (a compare-and-set; never the counts);
/// the batch as stored now, or `None`.
pub async fn update_batch<R: Rows>(
    rows: &R,
    from: BatchStatus,
    batch: &Batch,
) -> Result<Option<Batch>, R::Error> {
    let mut params = batch_step(batch)?;
    params.push(Param::Text(from.as_str().to_owned()));
    let stored = rows.read_one(&sql::update_batch(), &params).await?;
    Ok(stored.map(BatchRow::decode).transpose()?)
}

/// [`update_batch`] to the batch's end, with its files' records stored when it was written.
pub async fn end_batch<R: Rows>(
    rows: &R,
    from: BatchStatus,
    batch: &Batch,
    files: &[StoredFile],
) -> Result<Option<Batch>, R::Error> {
    let stored = update_batch(rows, from, batch).await?;
    if stored.is_some() {
        for file in files {
            insert_file(rows, file).await?;
        }
    }
    Ok(stored)
}

/// The batches that have not ended, oldest first, at most `limit`; `from` is the table as the
/// store names it (SQLite with the partial index `batches_unfinished`, which it uses only for
/// the query whose condition implies the index's: the statuses are literal).
pub async fn unfinished_batches<R: Rows>(
    rows: &R,
    from: &str,
    limit: usize,
) -> Result<Vec<Batch>, R::Error> {
    let statuses = sql::unfinished_batch_statuses();
    let sql = format!(
        "SELECT {BATCH_COLUMNS} FROM {from} WHERE status IN ({statuses}) ORDER BY id LIMIT $1"
    );
    let found = rows.read_all(&sql, &[limit_param(limit)?]).await?;
    Ok(decoded(found, BatchRow::decode)?)
}

// Webhook endpoints and deliveries.

/// An endpoint's row's values but its `created_at` (the first 7 of [`sql::insert_endpoint`],
/// and [`sql::UPDATE_ENDPOINT`]'s), then its `updated_at`.
fn endpoint_params(row: EndpointRow, created: bool) -> Vec<Param> {
    let mut params = vec![
        Param::Blob(row.id),
        Param::Text(row.name),
        Param::Text(row.url),
        Param::Text(row.event_types),
        Param::Text(row.secret),
        Param::text_or_null(row.previous_secret),
        Param::integer_or_null(row.previous_valid_until),
    ];
    if created {
        params.push(Param::Integer(row.created_at));
    }
    params.push(Param::Integer(row.updated_at));
    params
}

/// Stores a new endpoint.
pub async fn insert_endpoint<R: Rows>(
    rows: &R,
    endpoint: &WebhookEndpoint,
) -> Result<(), R::Error> {
    let params = endpoint_params(EndpointRow::encode(endpoint), true);
    rows.execute(&sql::insert_endpoint(), &params).await?;
    Ok(())
}

/// An endpoint.
pub async fn endpoint<R: Rows>(
    rows: &R,
    id: WebhookEndpointId,
) -> Result<Option<WebhookEndpoint>, R::Error> {
    let key = key_param(endpoint_key(id));
    by_key(rows, &sql::endpoint_by_id(), key, EndpointRow::decode).await
}

/// Endpoints, newest first (ids are ULIDs: their order is creation order), older than `before`,
/// at most `limit`.
pub async fn list_endpoints<R: Rows>(
    rows: &R,
    before: Option<WebhookEndpointId>,
    limit: usize,
) -> Result<Page<WebhookEndpoint>, R::Error> {
    let fetch = limit_param(limit + 1)?;
    let found = match before {
        Some(before) => {
            let params = [key_param(endpoint_key(before)), fetch];
            rows.read_all(&sql::endpoints_before(), &params).await?
        }
        None => rows.read_all(&sql::newest_endpoints(), &[fetch]).await?,
    };
    Ok(page(found, EndpointRow::decode, limit)?)
}

/// Rewrites an endpoint (every column but its id and `created_at`); `false` when there is none.
pub async fn update_endpoint<R: Rows>(
    rows: &R,
    endpoint: &WebhookEndpoint,
) -> Result<bool, R::Error> {
    let params = endpoint_params(EndpointRow::encode(endpoint), false);
    Ok(rows.execute(sql::UPDATE_ENDPOINT, &params).await? == 1)
}

/// Removes an endpoint and its deliveries; `false` when there is no such endpoint. The endpoint
/// first: where rows are locked (PostgreSQL), its row lock orders this delete after a trigger
/// that is writing a delivery for it, so no delivery of it is left behind.
pub async fn delete_endpoint<R: Rows>(rows: &R, id: WebhookEndpointId) -> Result<bool, R::Error> {
    let key = [key_param(endpoint_key(id))];
    let deleted = rows.execute(sql::DELETE_ENDPOINT, &key).await?;
    rows.execute(sql::DELETE_ENDPOINT_DELIVERIES, &key).await?;
    Ok(deleted == 1)
}

/// Stores a delivery after an attempt and ends its lease.
pub async fn record_attempt<R: Rows>(rows: &R, delivery: &Delivery) -> Result<(), R::Error> {
    let row = DeliveryRow::encode(delivery);
    let params = [
        Param::Blob(row.endpoint_id),
        Param::Text(row.event_id),
        Param::int4(row.attempts, "an attempt count")?,
        Param::integer_or_null(row.next_attempt_at),
        Param::int4_or_null(row.last_status, "an HTTP status")?,
        Param::text_or_null(row.last_error),
        Param::integer_or_null(row.last_attempt_at),
        Param::integer_or_null(row.delivered_at),
        Param::integer_or_null(row.given_up_at),
    ];
    rows.execute(sql::RECORD_ATTEMPT, &params).await?;
    Ok(())
}

/// An endpoint's deliveries, the most recent event first, at most `limit`.
pub async fn deliveries<R: Rows>(
    rows: &R,
    endpoint: WebhookEndpointId,
    limit: usize,
) -> Result<Vec<Delivery>, R::Error> {
    let params = [key_param(endpoint_key(endpoint)), limit_param(limit)?];
    let found = rows.read_all(&sql::deliveries_of(), &params).await?;
    Ok(decoded(found, DeliveryRow::decode)?)
}

// Tasks: the reads of no write path.

/// A task row read by a shared read, decoded as the store's rows are.
fn task_of<R: Rows>(row: TaskRow) -> Result<Task, DbError> {
    row.decode(R::ACCEPTED_BY_DEFAULT)
}

/// The task whose response has this id: a task's own response id is its ULID, unless another
/// one was stored with the task (the row's `response_id`).
pub async fn task_by_response<R: Rows>(
    rows: &R,
    response_id: ResponseId,
) -> Result<Option<Task>, R::Error> {
    let own = key_param(key_of(response_id.ulid()));
    if let Some(task) = by_key(rows, &sql::task_by_id(), own, task_of::<R>).await? {
        if task.response_id == response_id {
            return Ok(Some(task));
        }
    }
    let stored = Param::Text(response_id.to_string());
    by_key(rows, &sql::task_by_stored_response(), stored, task_of::<R>).await
}

/// Tasks, newest first, as `filter` says.
pub async fn list_tasks<R: Rows>(rows: &R, filter: &TaskFilter) -> Result<Page<Task>, R::Error> {
    let query = query::tasks_page(filter)?;
    query_page(rows, &query, task_of::<R>, filter.limit).await
}

/// A task's snapshot.
pub async fn snapshot<R: Rows>(rows: &R, task_id: TaskId) -> Result<Option<Snapshot>, R::Error> {
    let sql = "SELECT sequence_number, state FROM snapshots WHERE task_id = $1";
    let key = key_param(key_of(task_id.ulid()));
    by_key(rows, sql, key, SnapshotRow::decode).await
}

/// A snapshot's row: its sequence number and its state.
struct SnapshotRow(i64, Vec<u8>);

impl ReadRow for SnapshotRow {
    fn read<C: Columns>(row: &C) -> Result<Self, C::Error> {
        Ok(SnapshotRow(row.int(0)?, row.bytes(1)?))
    }
}

impl SnapshotRow {
    fn decode(self) -> Result<Snapshot, DbError> {
        Ok(Snapshot {
            sequence_number: from_i64(self.0)?,
            state: self.1,
        })
    }
}

/// How many tasks are in each status (the statuses some task is in, by name).
pub async fn count_by_status<R: Rows>(rows: &R) -> Result<Vec<(TaskStatus, u64)>, R::Error> {
    let sql = "SELECT status, COUNT(*) FROM tasks GROUP BY status ORDER BY status";
    let found = rows.read_all(sql, &[]).await?;
    Ok(decoded(found, StatusCount::decode)?)
}

/// A status and how many tasks are in it.
struct StatusCount(String, i64);

impl ReadRow for StatusCount {
    fn read<C: Columns>(row: &C) -> Result<Self, C::Error> {
        Ok(StatusCount(row.text(0)?, row.int(1)?))
    }
}

impl StatusCount {
    fn decode(self) -> Result<(TaskStatus, u64), DbError> {
        let status = TaskStatus::parse(&self.0).map_err(crate::corrupt)?;
        Ok((status, from_i64(self.1)?))
    }
}

/// The stored response of a task, with its id checked against the task's.
pub async fn response_of_task<R: Rows>(
    rows: &R,
    task_id: TaskId,
) -> Result<Option<Response>, R::Error> {
    let key = [key_param(key_of(task_id.ulid()))];
    let doc: Option<String> = rows.read_one(sql::RESPONSE_DOC, &key).await?;
    Ok(crate::response_of_task(task_id, doc.as_deref())?)
}

/// A batch's tasks in line order after line `after`, at most `limit`, in one of `statuses` when
/// some are given.
pub async fn batch_tasks<R: Rows>(
    rows: &R,
    batch: BatchId,
    statuses: &[TaskStatus],
    after: u32,
    limit: usize,
) -> Result<Vec<Task>, R::Error> {
    let query = query::batch_tasks(batch, statuses, after, limit)?;
    let found = rows.read_all(&query.sql, &query.params).await?;
    Ok(decoded(found, task_of::<R>)?)
}

/// A batch's tasks in line order after line `after`, at most `limit`, each with its stored
/// response.
pub async fn batch_answers<R: Rows>(
    rows: &R,
    batch: BatchId,
    after: u32,
    limit: usize,
) -> Result<Vec<(Task, Option<Response>)>, R::Error> {
    let params = [
        key_param(batch_key(batch)),
        Param::Integer(i64::from(after)),
        limit_param(limit)?,
    ];
    let found: Vec<AnswerRow> = rows.read_all(&sql::batch_answers(), &params).await?;
    let answer = |AnswerRow(row, doc): AnswerRow| {
        let task = task_of::<R>(row)?;
        let response = crate::response_of_task(task.id, doc.as_deref())?;
        Ok::<_, DbError>((task, response))
    };
    Ok(found.into_iter().map(answer).collect::<Result<_, _>>()?)
}

/// A task row and its stored response's document ([`sql::batch_answers`]).
struct AnswerRow(TaskRow, Option<String>);

impl ReadRow for AnswerRow {
    fn read<C: Columns>(row: &C) -> Result<Self, C::Error> {
        Ok(AnswerRow(
            TaskRow::read(row)?,
            row.text_or_null(TASK_COLUMN_COUNT)?,
        ))
    }
}
