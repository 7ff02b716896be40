//! The SQL of every port method: plain functions over a connection, called by the writer thread
//! (inside a savepoint) or by a pooled read connection.

use lmsp_domain::auth::{Client, Pairing, Scopes, SecretHash};
use lmsp_domain::cancel::decide_cancel;
use lmsp_domain::event::{Event, EventKind, EventPayload};
use lmsp_domain::idempotency::{IdempotencyKey, IdempotencyRecord, IdempotencyScope};
use lmsp_domain::ids::{ClientId, ResponseId, TaskId};
use lmsp_domain::model::{FileFingerprint, ModelId, ModelRecord};
use lmsp_domain::ports::{
    CancelOutcome, CreateOutcome, Page, PurgeReport, RecoveryReport, ServiceIdentity, Snapshot,
    StartInfo, StepOutcome, TaskFilter,
};
use lmsp_domain::recovery::{recover, StartEpoch};
use lmsp_domain::status::TaskStatus;
use lmsp_domain::task::{Response, Task};
use lmsp_domain::time::Timestamp;
use lmsp_domain::transition::{advance, Step};
use rusqlite::types::Value;
use rusqlite::{params, Connection, OptionalExtension};

use crate::error::DbError;

type Res<T> = Result<T, DbError>;

const FINISHED_SQL: &str = "('completed','failed','cancelled')";
const UNFINISHED_SQL: &str = "('queued','loading','running','cancelling')";

fn to_i64(value: u64) -> Res<i64> {
    i64::try_from(value).map_err(|_| DbError::Corrupt(format!("{value} is out of range")))
}

fn from_i64(value: i64) -> Res<u64> {
    u64::try_from(value).map_err(|_| DbError::Corrupt(format!("{value} is negative")))
}

fn hex_of(hash: &SecretHash) -> String {
    hash.to_hex()
}

/// Reads a task row inside the current transaction.
pub fn load_task(conn: &Connection, id: TaskId) -> Res<Option<Task>> {
    let doc: Option<String> = conn
        .prepare_cached("SELECT doc FROM tasks WHERE id = ?1")?
        .query_row([id.to_string()], |row| row.get(0))
        .optional()?;
    doc.map(|doc| serde_json::from_str(&doc).map_err(DbError::from))
        .transpose()
}

fn insert_task_row(conn: &Connection, task: &Task) -> Res<()> {
    conn.prepare_cached(
        "INSERT INTO tasks (id, client_id, status, created_at, finished_at, last_sequence_number, \
         restarts, recovered_in, doc) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
    )?
    .execute(params![
        task.id.to_string(),
        task.client_id.to_string(),
        task.status.as_str(),
        task.created_at.as_millis(),
        task.finished_at.map(Timestamp::as_millis),
        to_i64(task.last_sequence_number)?,
        task.restarts,
        task.recovered_in.map(|e| to_i64(e.0)).transpose()?,
        serde_json::to_string(task)?,
    ])?;
    Ok(())
}

fn insert_events(conn: &Connection, events: &[Event]) -> Res<()> {
    let mut stmt = conn.prepare_cached(
        "INSERT INTO task_events (task_id, sequence_number, kind, created_at, payload) \
         VALUES (?1, ?2, ?3, ?4, ?5)",
    )?;
    for event in events {
        stmt.execute(params![
            event.task_id.to_string(),
            to_i64(event.sequence_number)?,
            event.kind().wire_name(),
            event.created_at.as_millis(),
            serde_json::to_string(&event.payload)?,
        ])?;
    }
    Ok(())
}

/// Writes a task after a decided step: compare-and-set on status and last sequence number.
fn write_advanced(conn: &Connection, old: &Task, new: &Task, events: &[Event]) -> Res<()> {
    let changed = conn
        .prepare_cached(
            "UPDATE tasks SET status = ?1, finished_at = ?2, last_sequence_number = ?3, \
             restarts = ?4, recovered_in = ?5, doc = ?6 \
             WHERE id = ?7 AND status = ?8 AND last_sequence_number = ?9",
        )?
        .execute(params![
            new.status.as_str(),
            new.finished_at.map(Timestamp::as_millis),
            to_i64(new.last_sequence_number)?,
            new.restarts,
            new.recovered_in.map(|e| to_i64(e.0)).transpose()?,
            serde_json::to_string(new)?,
            old.id.to_string(),
            old.status.as_str(),
            to_i64(old.last_sequence_number)?,
        ])?;
    if changed != 1 {
        return Err(DbError::Corrupt(format!(
            "task {} moved under its transaction",
            old.id
        )));
    }
    insert_events(conn, events)
}

fn delete_snapshot(conn: &Connection, id: TaskId) -> Res<()> {
    conn.prepare_cached("DELETE FROM snapshots WHERE task_id = ?1")?
        .execute([id.to_string()])?;
    Ok(())
}

fn existing_idempotency(
    conn: &Connection,
    scope: &IdempotencyScope,
    key: &IdempotencyKey,
) -> Res<Option<IdempotencyRecord>> {
    let doc: Option<String> = conn
        .prepare_cached(
            "SELECT doc FROM idempotency_keys \
             WHERE client_id = ?1 AND method = ?2 AND path = ?3 AND key = ?4",
        )?
        .query_row(
            params![
                scope.client_id.to_string(),
                scope.method,
                scope.path,
                key.as_str()
            ],
            |row| row.get(0),
        )
        .optional()?;
    doc.map(|doc| serde_json::from_str(&doc).map_err(DbError::from))
        .transpose()
}

/// Stores a record unless an unexpired one exists (an expired one is replaced).
fn put_idempotency(
    conn: &Connection,
    record: &IdempotencyRecord,
) -> Res<Option<IdempotencyRecord>> {
    if let Some(existing) = existing_idempotency(conn, &record.scope, &record.key)? {
        if existing.expires_at > record.created_at {
            return Ok(Some(existing));
        }
    }
    conn.prepare_cached(
        "INSERT OR REPLACE INTO idempotency_keys \
         (client_id, method, path, key, task_id, created_at, expires_at, doc) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?
    .execute(params![
        record.scope.client_id.to_string(),
        record.scope.method,
        record.scope.path,
        record.key.as_str(),
        record.reply.task_id.map(|id| id.to_string()),
        record.created_at.as_millis(),
        record.expires_at.as_millis(),
        serde_json::to_string(record)?,
    ])?;
    Ok(None)
}

/// P-2, I-1, I-8: the task, its `response.created` event and its idempotency record.
pub fn create_task(
    conn: &Connection,
    task: Task,
    idempotency: Option<IdempotencyRecord>,
) -> Res<(CreateOutcome, Vec<Event>)> {
    if let Some(record) = &idempotency {
        if let Some(existing) = existing_idempotency(conn, &record.scope, &record.key)? {
            if existing.expires_at > record.created_at {
                return Ok((CreateOutcome::IdempotencyConflict(existing), Vec::new()));
            }
        }
    }
    let mut task = task;
    task.last_sequence_number = 1;
    let event = Event {
        task_id: task.id,
        sequence_number: 1,
        created_at: task.created_at,
        payload: EventPayload::Created {
            task: Box::new(task.clone()),
        },
    };
    insert_task_row(conn, &task)?;
    let events = vec![event];
    insert_events(conn, &events)?;
    if let Some(record) = &idempotency {
        put_idempotency(conn, record)?;
    }
    Ok((CreateOutcome::Created(task), events))
}

/// P-3, I-2: folds the steps through the domain, all or nothing.
pub fn append(
    conn: &Connection,
    task_id: TaskId,
    steps: &[Step],
    snapshot: Option<&Snapshot>,
    at: Timestamp,
    finishing: bool,
) -> Res<(StepOutcome, Vec<Event>)> {
    let Some(old) = load_task(conn, task_id)? else {
        return Ok((StepOutcome::NotFound, Vec::new()));
    };
    let mut current = old.clone();
    let mut events = Vec::new();
    for step in steps {
        match advance(&current, step, at) {
            Ok(advanced) => {
                current = advanced.task;
                events.extend(advanced.events);
            }
            Err(refusal) => {
                return Ok((StepOutcome::Refused { task: old, refusal }, Vec::new()));
            }
        }
    }
    write_advanced(conn, &old, &current, &events)?;
    for step in steps {
        if let Step::Complete { response } = step {
            conn.prepare_cached(
                "INSERT OR REPLACE INTO responses (id, task_id, doc) VALUES (?1, ?2, ?3)",
            )?
            .execute(params![
                response.id.to_string(),
                task_id.to_string(),
                serde_json::to_string(response.as_ref())?,
            ])?;
        }
    }
    if finishing || current.status.is_finished() {
        delete_snapshot(conn, task_id)?;
    } else if let Some(snapshot) = snapshot {
        conn.prepare_cached(
            "INSERT OR REPLACE INTO snapshots (task_id, sequence_number, state) VALUES (?1, ?2, ?3)",
        )?
        .execute(params![
            task_id.to_string(),
            to_i64(snapshot.sequence_number)?,
            snapshot.state,
        ])?;
    }
    Ok((
        StepOutcome::Applied {
            task: current,
            events: events.clone(),
        },
        events,
    ))
}

/// Claims the oldest queued task.
pub fn claim_next(conn: &Connection, at: Timestamp) -> Res<(Option<Task>, Vec<Event>)> {
    let doc: Option<String> = conn
        .prepare_cached("SELECT doc FROM tasks WHERE status = 'queued' ORDER BY id LIMIT 1")?
        .query_row([], |row| row.get(0))
        .optional()?;
    let Some(doc) = doc else {
        return Ok((None, Vec::new()));
    };
    let old: Task = serde_json::from_str(&doc)?;
    let step = Step::ClaimForLoading {
        model: old.model.clone(),
    };
    let advanced = advance(&old, &step, at)
        .map_err(|refusal| DbError::Corrupt(format!("queued task refused a claim: {refusal}")))?;
    write_advanced(conn, &old, &advanced.task, &advanced.events)?;
    delete_snapshot(conn, old.id)?;
    Ok((Some(advanced.task), advanced.events))
}

/// P-4, I-3: decides and applies a cancel.
pub fn cancel(
    conn: &Connection,
    task_id: TaskId,
    client_id: Option<ClientId>,
    at: Timestamp,
) -> Res<(CancelOutcome, Vec<Event>)> {
    let Some(old) = load_task(conn, task_id)? else {
        return Ok((CancelOutcome::NotFound, Vec::new()));
    };
    if client_id.is_some_and(|client| client != old.client_id) {
        return Ok((CancelOutcome::NotFound, Vec::new()));
    }
    let decision = decide_cancel(old.status);
    if decision.event().is_none() {
        return Ok((
            CancelOutcome::Decided {
                decision,
                task: old,
            },
            Vec::new(),
        ));
    }
    let advanced = advance(&old, &Step::RequestCancel, at)
        .map_err(|refusal| DbError::Corrupt(format!("cancel refused: {refusal}")))?;
    write_advanced(conn, &old, &advanced.task, &advanced.events)?;
    if advanced.task.status.is_finished() {
        delete_snapshot(conn, task_id)?;
    }
    Ok((
        CancelOutcome::Decided {
            decision,
            task: advanced.task,
        },
        advanced.events,
    ))
}

/// What one recovery batch did: its part of the report, the last id looked at, and whether the
/// batch was full (more may follow).
pub type RecoveryStep = (RecoveryReport, Option<TaskId>, bool);

/// One recovery batch: the tasks after `after` (id order). Returns the report part, the last id
/// looked at and whether the batch was full.
pub fn recover_batch(
    conn: &Connection,
    start: StartEpoch,
    at: Timestamp,
    after: Option<TaskId>,
    limit: usize,
) -> Res<(RecoveryStep, Vec<Event>)> {
    let sql = format!(
        "SELECT t.doc, s.sequence_number FROM tasks t LEFT JOIN snapshots s ON s.task_id = t.id \
         WHERE t.status IN {UNFINISHED_SQL} AND (t.recovered_in IS NULL OR t.recovered_in != ?1) \
         AND t.id > ?2 ORDER BY t.id LIMIT ?3"
    );
    let rows: Vec<(String, Option<i64>)> = conn
        .prepare_cached(&sql)?
        .query_map(
            params![
                to_i64(start.0)?,
                after.map(|id| id.to_string()).unwrap_or_default(),
                to_i64(limit as u64)?
            ],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )?
        .collect::<Result<_, _>>()?;
    let full = rows.len() >= limit;
    let mut report = RecoveryReport::default();
    let mut last = after;
    let mut all_events = Vec::new();
    for (doc, snapshot_seq) in rows {
        let task: Task = serde_json::from_str(&doc)?;
        last = Some(task.id);
        let covers = snapshot_seq.map(from_i64).transpose()?;
        match recover(&task, start, covers, at) {
            None => report.untouched += 1,
            Some(advanced) => {
                write_advanced(conn, &task, &advanced.task, &advanced.events)?;
                if advanced.task.status.is_finished() {
                    delete_snapshot(conn, task.id)?;
                }
                if advanced
                    .events
                    .iter()
                    .any(|event| event.kind() == EventKind::Resumed)
                {
                    report.resumed.push(task.id);
                }
                report.moved += 1;
                all_events.extend(advanced.events);
            }
        }
    }
    Ok(((report, last, full), all_events))
}

/// P-5, P-6, I-4: one bounded purge batch of finished tasks.
pub fn purge_finished(conn: &Connection, cutoff: Timestamp, batch: usize) -> Res<PurgeReport> {
    let sql = format!(
        "SELECT id FROM tasks WHERE status IN {FINISHED_SQL} AND finished_at IS NOT NULL \
         AND finished_at < ?1 ORDER BY finished_at LIMIT ?2"
    );
    let ids: Vec<String> = conn
        .prepare_cached(&sql)?
        .query_map(params![cutoff.as_millis(), to_i64(batch as u64)?], |row| {
            row.get(0)
        })?
        .collect::<Result<_, _>>()?;
    let mut report = PurgeReport::default();
    for id in ids {
        let events = conn
            .prepare_cached("DELETE FROM task_events WHERE task_id = ?1")?
            .execute([&id])?;
        conn.prepare_cached("DELETE FROM responses WHERE task_id = ?1")?
            .execute([&id])?;
        conn.prepare_cached("DELETE FROM snapshots WHERE task_id = ?1")?
            .execute([&id])?;
        conn.prepare_cached("DELETE FROM idempotency_keys WHERE task_id = ?1")?
            .execute([&id])?;
        let sql = format!("DELETE FROM tasks WHERE id = ?1 AND status IN {FINISHED_SQL}");
        report.tasks += conn.prepare_cached(&sql)?.execute([&id])? as u64;
        report.events += events as u64;
    }
    Ok(report)
}

/// Tasks, newest first.
pub fn list_tasks(conn: &Connection, filter: &TaskFilter) -> Res<Page<Task>> {
    let mut sql = String::from("SELECT doc FROM tasks WHERE 1 = 1");
    let mut values: Vec<Value> = Vec::new();
    if let Some(client) = filter.client_id {
        values.push(Value::Text(client.to_string()));
        sql.push_str(&format!(" AND client_id = ?{}", values.len()));
    }
    if !filter.statuses.is_empty() {
        let mut marks = Vec::new();
        for status in &filter.statuses {
            values.push(Value::Text(status.as_str().to_owned()));
            marks.push(format!("?{}", values.len()));
        }
        sql.push_str(&format!(" AND status IN ({})", marks.join(",")));
    }
    if let Some(before) = filter.before {
        values.push(Value::Text(before.to_string()));
        sql.push_str(&format!(" AND id < ?{}", values.len()));
    }
    values.push(Value::Integer(to_i64(filter.limit as u64 + 1)?));
    sql.push_str(&format!(" ORDER BY id DESC LIMIT ?{}", values.len()));
    let docs: Vec<String> = conn
        .prepare_cached(&sql)?
        .query_map(rusqlite::params_from_iter(values), |row| row.get(0))?
        .collect::<Result<_, _>>()?;
    let mut items = docs
        .iter()
        .map(|doc| serde_json::from_str(doc).map_err(DbError::from))
        .collect::<Res<Vec<Task>>>()?;
    let has_more = items.len() > filter.limit;
    items.truncate(filter.limit);
    Ok(Page { items, has_more })
}

/// Events after `after`, ascending.
pub fn events(conn: &Connection, task_id: TaskId, after: u64, limit: usize) -> Res<Page<Event>> {
    let rows: Vec<(i64, i64, String)> = conn
        .prepare_cached(
            "SELECT sequence_number, created_at, payload FROM task_events \
             WHERE task_id = ?1 AND sequence_number > ?2 ORDER BY sequence_number LIMIT ?3",
        )?
        .query_map(
            params![
                task_id.to_string(),
                to_i64(after)?,
                to_i64(limit as u64 + 1)?
            ],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
        )?
        .collect::<Result<_, _>>()?;
    let mut items = Vec::with_capacity(rows.len());
    for (seq, created_at, payload) in rows {
        items.push(Event {
            task_id,
            sequence_number: from_i64(seq)?,
            created_at: Timestamp::from_millis(created_at),
            payload: serde_json::from_str(&payload)?,
        });
    }
    let has_more = items.len() > limit;
    items.truncate(limit);
    Ok(Page { items, has_more })
}

/// A stored response.
pub fn response(conn: &Connection, id: ResponseId) -> Res<Option<Response>> {
    let doc: Option<String> = conn
        .prepare_cached("SELECT doc FROM responses WHERE id = ?1")?
        .query_row([id.to_string()], |row| row.get(0))
        .optional()?;
    doc.map(|doc| serde_json::from_str(&doc).map_err(DbError::from))
        .transpose()
}

/// A task's snapshot.
pub fn snapshot(conn: &Connection, task_id: TaskId) -> Res<Option<Snapshot>> {
    let row: Option<(i64, Vec<u8>)> = conn
        .prepare_cached("SELECT sequence_number, state FROM snapshots WHERE task_id = ?1")?
        .query_row([task_id.to_string()], |row| Ok((row.get(0)?, row.get(1)?)))
        .optional()?;
    row.map(|(seq, state)| {
        Ok(Snapshot {
            sequence_number: from_i64(seq)?,
            state,
        })
    })
    .transpose()
}

/// Counts per status.
pub fn count_by_status(conn: &Connection) -> Res<Vec<(TaskStatus, u64)>> {
    let rows: Vec<(String, i64)> = conn
        .prepare_cached("SELECT status, COUNT(*) FROM tasks GROUP BY status ORDER BY status")?
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?
        .collect::<Result<_, _>>()?;
    rows.into_iter()
        .map(|(status, count)| {
            let status = TaskStatus::parse(&status)
                .map_err(|e| DbError::Corrupt(format!("bad status: {e}")))?;
            Ok((status, from_i64(count)?))
        })
        .collect()
}

fn client_of_row(
    row: &rusqlite::Row<'_>,
) -> rusqlite::Result<(String, String, String, String, i64, Option<i64>)> {
    Ok((
        row.get(0)?,
        row.get(1)?,
        row.get(2)?,
        row.get(3)?,
        row.get(4)?,
        row.get(5)?,
    ))
}

fn parse_hash(text: &str) -> Res<SecretHash> {
    let bytes = text.as_bytes();
    if bytes.len() != 64 {
        return Err(DbError::Corrupt(String::from("bad hash length")));
    }
    let mut out = [0u8; 32];
    for (i, chunk) in bytes.chunks(2).enumerate() {
        let pair = std::str::from_utf8(chunk).map_err(|e| DbError::Corrupt(e.to_string()))?;
        out[i] = u8::from_str_radix(pair, 16).map_err(|e| DbError::Corrupt(e.to_string()))?;
    }
    Ok(SecretHash(out))
}

fn build_client(fields: (String, String, String, String, i64, Option<i64>)) -> Res<Client> {
    let (id, name, hash, scopes, created_at, revoked_at) = fields;
    Ok(Client {
        id: ClientId::parse(&id).map_err(|e| DbError::Corrupt(e.to_string()))?,
        name,
        scopes: serde_json::from_str::<Scopes>(&scopes)?,
        token_hash: parse_hash(&hash)?,
        created_at: Timestamp::from_millis(created_at),
        revoked_at: revoked_at.map(Timestamp::from_millis),
    })
}

const CLIENT_COLUMNS: &str = "id, name, token_hash, scopes, created_at, revoked_at";

/// Stores a client.
pub fn insert_client(conn: &Connection, client: &Client) -> Res<()> {
    conn.prepare_cached(
        "INSERT INTO clients (id, name, token_hash, scopes, created_at, revoked_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?
    .execute(params![
        client.id.to_string(),
        client.name,
        hex_of(&client.token_hash),
        serde_json::to_string(&client.scopes)?,
        client.created_at.as_millis(),
        client.revoked_at.map(Timestamp::as_millis),
    ])?;
    Ok(())
}

/// The unrevoked client with this token hash.
pub fn client_by_token_hash(conn: &Connection, hash: &SecretHash) -> Res<Option<Client>> {
    let sql = format!(
        "SELECT {CLIENT_COLUMNS} FROM clients WHERE token_hash = ?1 AND revoked_at IS NULL"
    );
    let row = conn
        .prepare_cached(&sql)?
        .query_row([hex_of(hash)], client_of_row)
        .optional()?;
    row.map(build_client).transpose()
}

/// Every client, oldest first.
pub fn list_clients(conn: &Connection) -> Res<Vec<Client>> {
    let sql = format!("SELECT {CLIENT_COLUMNS} FROM clients ORDER BY created_at, id");
    let rows: Vec<_> = conn
        .prepare_cached(&sql)?
        .query_map([], client_of_row)?
        .collect::<Result<_, _>>()?;
    rows.into_iter().map(build_client).collect()
}

/// Revokes a client.
pub fn revoke_client(conn: &Connection, id: ClientId, at: Timestamp) -> Res<bool> {
    let changed = conn
        .prepare_cached("UPDATE clients SET revoked_at = ?1 WHERE id = ?2 AND revoked_at IS NULL")?
        .execute(params![at.as_millis(), id.to_string()])?;
    Ok(changed == 1)
}

/// Stores a pairing code hash.
pub fn insert_pairing(conn: &Connection, pairing: &Pairing) -> Res<()> {
    conn.prepare_cached(
        "INSERT OR REPLACE INTO pairings (code_hash, scopes, created_at, expires_at) \
         VALUES (?1, ?2, ?3, ?4)",
    )?
    .execute(params![
        hex_of(&pairing.code_hash),
        serde_json::to_string(&pairing.scopes)?,
        pairing.created_at.as_millis(),
        pairing.expires_at.as_millis(),
    ])?;
    Ok(())
}

/// Takes an unexpired pairing (one use).
pub fn take_pairing(conn: &Connection, hash: &SecretHash, at: Timestamp) -> Res<Option<Pairing>> {
    let row: Option<(String, i64, i64)> = conn
        .prepare_cached(
            "SELECT scopes, created_at, expires_at FROM pairings \
             WHERE code_hash = ?1 AND expires_at > ?2",
        )?
        .query_row(params![hex_of(hash), at.as_millis()], |row| {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?))
        })
        .optional()?;
    let Some((scopes, created_at, expires_at)) = row else {
        return Ok(None);
    };
    conn.prepare_cached("DELETE FROM pairings WHERE code_hash = ?1")?
        .execute([hex_of(hash)])?;
    Ok(Some(Pairing {
        code_hash: *hash,
        scopes: serde_json::from_str(&scopes)?,
        created_at: Timestamp::from_millis(created_at),
        expires_at: Timestamp::from_millis(expires_at),
    }))
}

/// Deletes every pairing.
pub fn burn_pairings(conn: &Connection) -> Res<u64> {
    Ok(conn.prepare_cached("DELETE FROM pairings")?.execute([])? as u64)
}

fn model_of_row(
    row: &rusqlite::Row<'_>,
) -> rusqlite::Result<(String, String, String, i64, i64, String, i64)> {
    Ok((
        row.get(0)?,
        row.get(1)?,
        row.get(2)?,
        row.get(3)?,
        row.get(4)?,
        row.get(5)?,
        row.get(6)?,
    ))
}

fn build_model(fields: (String, String, String, i64, i64, String, i64)) -> Res<ModelRecord> {
    let (id, format, path, size, mtime, digest, created_at) = fields;
    Ok(ModelRecord {
        id: ModelId::parse(&id).map_err(|e| DbError::Corrupt(e.to_string()))?,
        format,
        file: FileFingerprint {
            path,
            size_bytes: from_i64(size)?,
            modified_millis: mtime,
            digest: lmsp_domain::model::Digest::parse(&digest)
                .map_err(|e| DbError::Corrupt(e.to_string()))?,
        },
        created_at: Timestamp::from_millis(created_at),
    })
}

const MODEL_COLUMNS: &str = "id, format, path, size_bytes, modified_millis, digest, created_at";

/// Stores a model unless the id exists.
pub fn insert_model(conn: &Connection, model: &ModelRecord) -> Res<bool> {
    let changed = conn
        .prepare_cached(
            "INSERT OR IGNORE INTO models (id, format, path, size_bytes, modified_millis, digest, \
             created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )?
        .execute(params![
            model.id.as_str(),
            model.format,
            model.file.path,
            to_i64(model.file.size_bytes)?,
            model.file.modified_millis,
            model.file.digest.as_str(),
            model.created_at.as_millis(),
        ])?;
    Ok(changed == 1)
}

/// A model by id.
pub fn model(conn: &Connection, id: &ModelId) -> Res<Option<ModelRecord>> {
    let sql = format!("SELECT {MODEL_COLUMNS} FROM models WHERE id = ?1");
    let row = conn
        .prepare_cached(&sql)?
        .query_row([id.as_str()], model_of_row)
        .optional()?;
    row.map(build_model).transpose()
}

/// Every model by id.
pub fn list_models(conn: &Connection) -> Res<Vec<ModelRecord>> {
    let sql = format!("SELECT {MODEL_COLUMNS} FROM models ORDER BY id");
    let rows: Vec<_> = conn
        .prepare_cached(&sql)?
        .query_map([], model_of_row)?
        .collect::<Result<_, _>>()?;
    rows.into_iter().map(build_model).collect()
}

/// Deletes a model.
pub fn delete_model(conn: &Connection, id: &ModelId) -> Res<bool> {
    Ok(conn
        .prepare_cached("DELETE FROM models WHERE id = ?1")?
        .execute([id.as_str()])?
        == 1)
}

/// Records a model's new fingerprint.
pub fn update_model_file(conn: &Connection, id: &ModelId, file: &FileFingerprint) -> Res<()> {
    conn.prepare_cached(
        "UPDATE models SET path = ?1, size_bytes = ?2, modified_millis = ?3, digest = ?4 \
         WHERE id = ?5",
    )?
    .execute(params![
        file.path,
        to_i64(file.size_bytes)?,
        file.modified_millis,
        file.digest.as_str(),
        id.as_str()
    ])?;
    Ok(())
}

/// The unexpired idempotency record.
pub fn idempotency_record(
    conn: &Connection,
    scope: &IdempotencyScope,
    key: &IdempotencyKey,
    at: Timestamp,
) -> Res<Option<IdempotencyRecord>> {
    Ok(existing_idempotency(conn, scope, key)?.filter(|record| record.expires_at > at))
}

/// Stores a record unless one exists.
pub fn insert_idempotency_record(
    conn: &Connection,
    record: &IdempotencyRecord,
) -> Res<Option<IdempotencyRecord>> {
    put_idempotency(conn, record)
}

/// Deletes up to `batch` expired records.
pub fn purge_idempotency(conn: &Connection, at: Timestamp, batch: usize) -> Res<u64> {
    Ok(conn
        .prepare_cached(
            "DELETE FROM idempotency_keys WHERE (client_id, method, path, key) IN \
             (SELECT client_id, method, path, key FROM idempotency_keys \
             WHERE expires_at <= ?1 LIMIT ?2)",
        )?
        .execute(params![at.as_millis(), to_i64(batch as u64)?])? as u64)
}

/// Records a start.
pub fn begin_start(conn: &Connection, candidate: &ServiceIdentity) -> Res<StartInfo> {
    let stored: Option<String> = conn
        .prepare_cached("SELECT value FROM service_config WHERE key = 'identity'")?
        .query_row([], |row| row.get(0))
        .optional()?;
    let (identity, first_start) = match stored {
        Some(doc) => (serde_json::from_str(&doc)?, false),
        None => {
            conn.prepare_cached("INSERT INTO service_config (key, value) VALUES ('identity', ?1)")?
                .execute([serde_json::to_string(candidate)?])?;
            (candidate.clone(), true)
        }
    };
    let previous: Option<String> = conn
        .prepare_cached("SELECT value FROM service_config WHERE key = 'start_epoch'")?
        .query_row([], |row| row.get(0))
        .optional()?;
    let previous: u64 = match previous {
        Some(text) => text
            .parse()
            .map_err(|_| DbError::Corrupt(format!("bad start epoch {text}")))?,
        None => 0,
    };
    let epoch = previous + 1;
    conn.prepare_cached(
        "INSERT OR REPLACE INTO service_config (key, value) VALUES ('start_epoch', ?1)",
    )?
    .execute([epoch.to_string()])?;
    Ok(StartInfo {
        identity,
        epoch: StartEpoch(epoch),
        first_start,
    })
}
