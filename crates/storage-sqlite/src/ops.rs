//! The SQL of every port method: plain functions over a connection, called by the writer thread
//! (inside a savepoint) or by a pooled read connection.
//!
//! Task rows are decoded column by column; ids of tasks and clients are stored as the 16 bytes of
//! their ULID. Events are stored in their shortest form (see [`EventCode`] and [`event_data`]) and
//! rebuilt into domain [`Event`]s when read.

use std::borrow::Cow;
use std::sync::Arc;

use lmsp_domain::auth::{Client, Pairing, Scopes, SecretHash};
use lmsp_domain::cancel::decide_cancel;
use lmsp_domain::event::{Event, EventKind, EventPayload, QueueReason};
use lmsp_domain::idempotency::{IdempotencyKey, IdempotencyRecord, IdempotencyScope};
use lmsp_domain::ids::{ClientId, ResponseId, TaskId};
use lmsp_domain::model::{FileFingerprint, ModelId, ModelRecord};
use lmsp_domain::ports::{
    CancelOutcome, CreateOutcome, Page, PurgeReport, RecoveryReport, Redemption, ServiceIdentity,
    Snapshot, StartInfo, StepOutcome, TaskFilter,
};
use lmsp_domain::recovery::{recover, RestartPolicy, StartEpoch};
use lmsp_domain::status::TaskStatus;
use lmsp_domain::task::{Response, Task, TaskError};
use lmsp_domain::time::Timestamp;
use lmsp_domain::transition::{advance, Step};
use rusqlite::types::Value;
use rusqlite::{params, Connection, OptionalExtension, Row};
use ulid::Ulid;

use crate::error::DbError;

type Res<T> = Result<T, DbError>;

const FINISHED_SQL: &str = "('completed','failed','cancelled')";

/// The statuses recovery looks at (P-7), in the order it looks at them.
const LEFTOVER_STATUSES: [TaskStatus; 4] = [
    TaskStatus::Queued,
    TaskStatus::Loading,
    TaskStatus::Running,
    TaskStatus::Cancelling,
];

fn to_i64(value: u64) -> Res<i64> {
    i64::try_from(value).map_err(|_| DbError::Corrupt(format!("{value} is out of range")))
}

fn from_i64(value: i64) -> Res<u64> {
    u64::try_from(value).map_err(|_| DbError::Corrupt(format!("{value} is negative")))
}

fn hex_of(hash: &SecretHash) -> String {
    hash.to_hex()
}

fn corrupt(what: impl std::fmt::Display) -> DbError {
    DbError::Corrupt(what.to_string())
}

/// The stored key of a task id: its ULID's 16 bytes.
fn key(id: TaskId) -> [u8; 16] {
    id.ulid().to_bytes()
}

fn client_key(id: ClientId) -> [u8; 16] {
    id.ulid().to_bytes()
}

fn ulid_of(bytes: &[u8]) -> Res<Ulid> {
    let bytes: [u8; 16] = bytes
        .try_into()
        .map_err(|_| corrupt(format!("an id of {} bytes", bytes.len())))?;
    Ok(Ulid::from_bytes(bytes))
}

/// The code of each event kind in `task_events.kind`. Stored on disk: never renumber.
#[derive(Debug, Clone, Copy)]
struct EventCode;

impl EventCode {
    const KINDS: [(EventKind, i64); 10] = [
        (EventKind::Created, 1),
        (EventKind::Loading, 2),
        (EventKind::InProgress, 3),
        (EventKind::OutputTextDelta, 4),
        (EventKind::Cancelling, 5),
        (EventKind::Queued, 6),
        (EventKind::Resumed, 7),
        (EventKind::Completed, 8),
        (EventKind::Failed, 9),
        (EventKind::Cancelled, 10),
    ];

    fn of(kind: EventKind) -> i64 {
        Self::KINDS
            .iter()
            .find(|(known, _)| *known == kind)
            .map_or(0, |(_, code)| *code)
    }

    fn kind(code: i64) -> Res<EventKind> {
        Self::KINDS
            .iter()
            .find(|(_, known)| *known == code)
            .map(|(kind, _)| *kind)
            .ok_or_else(|| corrupt(format!("unknown event code {code}")))
    }
}

/// An event's data in its stored form: the shortest text that, with the task's own rows, gives
/// the payload back. The task of `response.created` and the response of `response.completed` are
/// not copied: [`read_payload`] rebuilds them from `tasks`/`task_specs` and `responses`.
fn event_data(payload: &EventPayload) -> Res<Cow<'_, str>> {
    Ok(match payload {
        EventPayload::Created { .. }
        | EventPayload::InProgress {}
        | EventPayload::Cancelling {}
        | EventPayload::Completed { .. }
        | EventPayload::Cancelled {} => Cow::Borrowed(""),
        EventPayload::Loading { model } => Cow::Borrowed(model.as_str()),
        EventPayload::OutputTextDelta { delta } => Cow::Borrowed(delta.as_str()),
        EventPayload::Queued { reason } => Cow::Owned(serde_json::to_string(reason)?),
        EventPayload::Resumed {
            from_sequence_number,
        } => Cow::Owned(from_sequence_number.to_string()),
        EventPayload::Failed { error } => Cow::Owned(serde_json::to_string(error)?),
    })
}

/// Rebuilds a payload from its stored form; `task` and `response` are asked for only by the
/// creation and completion events.
fn read_payload(
    kind: EventKind,
    data: String,
    task: &mut impl FnMut() -> Res<Task>,
    response: &mut impl FnMut() -> Res<Response>,
) -> Res<EventPayload> {
    Ok(match kind {
        EventKind::Created => EventPayload::Created {
            task: Box::new(task()?.as_created()),
        },
        EventKind::Loading => EventPayload::Loading {
            model: ModelId::parse(&data).map_err(corrupt)?,
        },
        EventKind::InProgress => EventPayload::InProgress {},
        EventKind::OutputTextDelta => EventPayload::OutputTextDelta { delta: data },
        EventKind::Cancelling => EventPayload::Cancelling {},
        EventKind::Queued => EventPayload::Queued {
            reason: serde_json::from_str::<QueueReason>(&data)?,
        },
        EventKind::Resumed => EventPayload::Resumed {
            from_sequence_number: data.parse().map_err(corrupt)?,
        },
        EventKind::Completed => EventPayload::Completed {
            response: Box::new(response()?),
        },
        EventKind::Failed => EventPayload::Failed {
            error: serde_json::from_str::<TaskError>(&data)?,
        },
        EventKind::Cancelled => EventPayload::Cancelled {},
    })
}

/// The columns [`task_of_row`] reads, in order (`t` is `tasks`, `s` is `task_specs`).
const TASK_COLUMNS: &str = "t.id, t.client_id, t.status, t.model, t.on_restart, t.created_at, \
     t.started_at, t.finished_at, t.last_sequence_number, t.restarts, t.recovered_in, t.error, \
     t.response_id, s.spec, s.metadata";

/// `tasks` joined with its spec, for `SELECT {TASK_COLUMNS} FROM {TASK_FROM} WHERE …`.
const TASK_FROM: &str = "tasks t JOIN task_specs s ON s.task_id = t.id";

/// A task row as SQLite hands it over; [`RawTask::decode`] checks and converts it.
struct RawTask {
    id: Vec<u8>,
    client_id: Vec<u8>,
    status: String,
    model: String,
    on_restart: String,
    created_at: i64,
    started_at: Option<i64>,
    finished_at: Option<i64>,
    last_sequence_number: i64,
    restarts: i64,
    recovered_in: Option<i64>,
    error: Option<String>,
    response_id: Option<String>,
    spec: String,
    metadata: String,
}

fn task_of_row(row: &Row<'_>) -> rusqlite::Result<RawTask> {
    Ok(RawTask {
        id: row.get(0)?,
        client_id: row.get(1)?,
        status: row.get(2)?,
        model: row.get(3)?,
        on_restart: row.get(4)?,
        created_at: row.get(5)?,
        started_at: row.get(6)?,
        finished_at: row.get(7)?,
        last_sequence_number: row.get(8)?,
        restarts: row.get(9)?,
        recovered_in: row.get(10)?,
        error: row.get(11)?,
        response_id: row.get(12)?,
        spec: row.get(13)?,
        metadata: row.get(14)?,
    })
}

impl RawTask {
    fn decode(self) -> Res<Task> {
        Ok(Task {
            id: TaskId::from_ulid(ulid_of(&self.id)?),
            client_id: ClientId::from_ulid(ulid_of(&self.client_id)?),
            status: TaskStatus::parse(&self.status).map_err(corrupt)?,
            model: ModelId::parse(&self.model).map_err(corrupt)?,
            on_restart: RestartPolicy::parse(&self.on_restart).map_err(corrupt)?,
            spec: Arc::new(serde_json::from_str(&self.spec)?),
            metadata: serde_json::from_str(&self.metadata)?,
            created_at: Timestamp::from_millis(self.created_at),
            started_at: self.started_at.map(Timestamp::from_millis),
            finished_at: self.finished_at.map(Timestamp::from_millis),
            last_sequence_number: from_i64(self.last_sequence_number)?,
            restarts: u32::try_from(self.restarts).map_err(corrupt)?,
            recovered_in: self
                .recovered_in
                .map(|epoch| from_i64(epoch).map(StartEpoch))
                .transpose()?,
            error: self
                .error
                .map(|error| serde_json::from_str(&error))
                .transpose()?,
            response_id: self
                .response_id
                .map(|id| ResponseId::parse(&id).map_err(corrupt))
                .transpose()?,
        })
    }
}

/// Reads a task inside the current transaction.
pub fn load_task(conn: &Connection, id: TaskId) -> Res<Option<Task>> {
    let sql = format!("SELECT {TASK_COLUMNS} FROM {TASK_FROM} WHERE t.id = ?1");
    conn.prepare_cached(&sql)?
        .query_row([key(id)], task_of_row)
        .optional()?
        .map(RawTask::decode)
        .transpose()
}

fn error_json(task: &Task) -> Res<Option<String>> {
    Ok(task.error.as_ref().map(serde_json::to_string).transpose()?)
}

fn insert_task_rows(conn: &Connection, task: &Task) -> Res<()> {
    conn.prepare_cached(
        "INSERT INTO tasks (id, client_id, status, model, on_restart, created_at, started_at, \
         finished_at, last_sequence_number, restarts, recovered_in, error, response_id) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
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
        task.recovered_in.map(|e| to_i64(e.0)).transpose()?,
        error_json(task)?,
        task.response_id.map(|id| id.to_string()),
    ])?;
    conn.prepare_cached("INSERT INTO task_specs (task_id, spec, metadata) VALUES (?1, ?2, ?3)")?
        .execute(params![
            key(task.id),
            serde_json::to_string(task.spec.as_ref())?,
            serde_json::to_string(&task.metadata)?,
        ])?;
    Ok(())
}

fn insert_events(conn: &Connection, events: &[Event]) -> Res<()> {
    let mut stmt = conn.prepare_cached(
        "INSERT INTO task_events (task_id, sequence_number, kind, created_at, data) \
         VALUES (?1, ?2, ?3, ?4, ?5)",
    )?;
    for event in events {
        stmt.execute(params![
            key(event.task_id),
            to_i64(event.sequence_number)?,
            EventCode::of(event.kind()),
            event.created_at.as_millis(),
            event_data(&event.payload)?.as_ref(),
        ])?;
    }
    Ok(())
}

/// Writes a task after a decided step: compare-and-set on status and last sequence number, so a
/// row that moved under the transaction is never overwritten.
fn write_advanced(conn: &Connection, old: &Task, new: &Task, events: &[Event]) -> Res<()> {
    let only_progress = old.status == new.status
        && old.started_at == new.started_at
        && old.finished_at == new.finished_at
        && old.restarts == new.restarts
        && old.recovered_in == new.recovered_in
        && old.error == new.error
        && old.response_id == new.response_id;
    let changed = if only_progress {
        // Output: only the sequence number moves, and an UPDATE that names no indexed column
        // leaves the status and finish indexes alone.
        conn.prepare_cached(
            "UPDATE tasks SET last_sequence_number = ?1 \
             WHERE id = ?2 AND status = ?3 AND last_sequence_number = ?4",
        )?
        .execute(params![
            to_i64(new.last_sequence_number)?,
            key(old.id),
            old.status.as_str(),
            to_i64(old.last_sequence_number)?,
        ])?
    } else {
        conn.prepare_cached(
            "UPDATE tasks SET status = ?1, started_at = ?2, finished_at = ?3, \
             last_sequence_number = ?4, restarts = ?5, recovered_in = ?6, error = ?7, \
             response_id = ?8 WHERE id = ?9 AND status = ?10 AND last_sequence_number = ?11",
        )?
        .execute(params![
            new.status.as_str(),
            new.started_at.map(Timestamp::as_millis),
            new.finished_at.map(Timestamp::as_millis),
            to_i64(new.last_sequence_number)?,
            new.restarts,
            new.recovered_in.map(|e| to_i64(e.0)).transpose()?,
            error_json(new)?,
            new.response_id.map(|id| id.to_string()),
            key(old.id),
            old.status.as_str(),
            to_i64(old.last_sequence_number)?,
        ])?
    };
    if changed != 1 {
        return Err(corrupt(format!(
            "task {} moved under its transaction",
            old.id
        )));
    }
    insert_events(conn, events)
}

fn delete_snapshot(conn: &Connection, id: TaskId) -> Res<()> {
    conn.prepare_cached("DELETE FROM snapshots WHERE task_id = ?1")?
        .execute([key(id)])?;
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
        record.reply.task_id.map(key),
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
    let task = task.as_created();
    let event = Event {
        task_id: task.id,
        sequence_number: 1,
        created_at: task.created_at,
        payload: EventPayload::Created {
            task: Box::new(task.clone()),
        },
    };
    insert_task_rows(conn, &task)?;
    let events = vec![event];
    insert_events(conn, &events)?;
    if let Some(record) = &idempotency {
        put_idempotency(conn, record)?;
    }
    Ok((CreateOutcome::Created(task), events))
}

fn insert_response(conn: &Connection, response: &Response) -> Res<()> {
    conn.prepare_cached("INSERT OR REPLACE INTO responses (id, task_id, doc) VALUES (?1, ?2, ?3)")?
        .execute(params![
            response.id.to_string(),
            key(response.task_id),
            serde_json::to_string(response)?,
        ])?;
    Ok(())
}

fn put_snapshot(conn: &Connection, task_id: TaskId, snapshot: &Snapshot) -> Res<()> {
    conn.prepare_cached(
        "INSERT OR REPLACE INTO snapshots (task_id, sequence_number, state) VALUES (?1, ?2, ?3)",
    )?
    .execute(params![
        key(task_id),
        to_i64(snapshot.sequence_number)?,
        snapshot.state,
    ])?;
    Ok(())
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
    let mut events = Vec::with_capacity(steps.len());
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
            insert_response(conn, response)?;
        }
    }
    if finishing || current.status.is_finished() {
        delete_snapshot(conn, task_id)?;
    } else if let Some(snapshot) = snapshot {
        put_snapshot(conn, task_id, snapshot)?;
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
    let sql = format!(
        "SELECT {TASK_COLUMNS} FROM {TASK_FROM} WHERE t.status = 'queued' ORDER BY t.id LIMIT 1"
    );
    let Some(raw) = conn
        .prepare_cached(&sql)?
        .query_row([], task_of_row)
        .optional()?
    else {
        return Ok((None, Vec::new()));
    };
    let old = raw.decode()?;
    let step = Step::ClaimForLoading {
        model: old.model.clone(),
    };
    let advanced = advance(&old, &step, at)
        .map_err(|refusal| corrupt(format!("queued task refused a claim: {refusal}")))?;
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
        .map_err(|refusal| corrupt(format!("cancel refused: {refusal}")))?;
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

/// Where a recovery pass has got to: the status it is looking at, and the last task id of that
/// status it looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecoveryCursor {
    status_index: usize,
    after: Option<TaskId>,
}

impl RecoveryCursor {
    /// The start of a pass.
    pub const START: RecoveryCursor = RecoveryCursor {
        status_index: 0,
        after: None,
    };
}

/// What one recovery batch did, and where the next one starts (`None`: the pass is complete).
pub type RecoveryStep = (RecoveryReport, Option<RecoveryCursor>);

/// One recovery batch (P-7…P-11, I-5): up to `limit` leftover tasks from `cursor` on, each moved
/// per [`recover`] with its one event. Returns the batch's part of the report and where the next
/// batch starts, or `None` when the pass is complete.
pub fn recover_batch(
    conn: &Connection,
    start: StartEpoch,
    at: Timestamp,
    cursor: RecoveryCursor,
    limit: usize,
) -> Res<(RecoveryStep, Vec<Event>)> {
    let Some(status) = LEFTOVER_STATUSES.get(cursor.status_index) else {
        return Ok(((RecoveryReport::default(), None), Vec::new()));
    };
    // Only a running task's snapshot decides anything (where `resume` continues); the others
    // skip the lookup.
    let snapshot = if *status == TaskStatus::Running {
        "(SELECT n.sequence_number FROM snapshots n WHERE n.task_id = t.id)"
    } else {
        "NULL"
    };
    let sql = format!(
        "SELECT {TASK_COLUMNS}, {snapshot} FROM {TASK_FROM} \
         WHERE t.status = ?1 AND t.id > ?2 AND (t.recovered_in IS NULL OR t.recovered_in != ?3) \
         ORDER BY t.id LIMIT ?4"
    );
    let after = cursor.after.map(key).unwrap_or_default();
    let rows: Vec<(RawTask, Option<i64>)> = conn
        .prepare_cached(&sql)?
        .query_map(
            params![
                status.as_str(),
                after.as_slice(),
                to_i64(start.0)?,
                to_i64(limit as u64)?
            ],
            |row| Ok((task_of_row(row)?, row.get(15)?)),
        )?
        .collect::<Result<_, _>>()?;
    let full = rows.len() >= limit;
    let mut report = RecoveryReport::default();
    let mut last = cursor.after;
    let mut all_events = Vec::new();
    for (raw, snapshot_seq) in rows {
        let task = raw.decode()?;
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
    let next = if full {
        RecoveryCursor {
            status_index: cursor.status_index,
            after: last,
        }
    } else {
        RecoveryCursor {
            status_index: cursor.status_index + 1,
            after: None,
        }
    };
    let next = (next.status_index < LEFTOVER_STATUSES.len()).then_some(next);
    Ok(((report, next), all_events))
}

/// P-5, P-6, I-4: one bounded purge batch: finished tasks with `finished_at < cutoff`, oldest
/// first, at most `max_tasks` of them and, past the first, no more than `max_events` events in
/// all, so one transaction stays short whatever the tasks' sizes.
pub fn purge_finished(
    conn: &Connection,
    cutoff: Timestamp,
    max_tasks: usize,
    max_events: u64,
) -> Res<PurgeReport> {
    let sql = format!(
        "SELECT id, last_sequence_number FROM tasks WHERE finished_at IS NOT NULL \
         AND finished_at < ?1 AND status IN {FINISHED_SQL} ORDER BY finished_at LIMIT ?2"
    );
    let candidates: Vec<(Vec<u8>, i64)> = conn
        .prepare_cached(&sql)?
        .query_map(
            params![cutoff.as_millis(), to_i64(max_tasks as u64 + 1)?],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )?
        .collect::<Result<_, _>>()?;
    let mut report = PurgeReport::default();
    let mut budget_used: u64 = 0;
    for (index, (id, events)) in candidates.iter().enumerate() {
        let events = from_i64(*events)?;
        let over_budget = index > 0 && budget_used + events > max_events;
        if index >= max_tasks || over_budget {
            report.more = true;
            break;
        }
        budget_used += events;
        let id = id.as_slice();
        let deleted = conn
            .prepare_cached("DELETE FROM task_events WHERE task_id = ?1")?
            .execute([id])?;
        for sql in [
            "DELETE FROM responses WHERE task_id = ?1",
            "DELETE FROM snapshots WHERE task_id = ?1",
            // A key outlives its task when the retention is shorter than the key's TTL: it keeps
            // its stored reply and expires on its own (API.md §6).
            "UPDATE idempotency_keys SET task_id = NULL WHERE task_id = ?1",
            "DELETE FROM task_specs WHERE task_id = ?1",
        ] {
            conn.prepare_cached(sql)?.execute([id])?;
        }
        let sql = format!("DELETE FROM tasks WHERE id = ?1 AND status IN {FINISHED_SQL}");
        report.tasks += conn.prepare_cached(&sql)?.execute([id])? as u64;
        report.events += deleted as u64;
    }
    Ok(report)
}

/// Tasks, newest first.
pub fn list_tasks(conn: &Connection, filter: &TaskFilter) -> Res<Page<Task>> {
    let mut sql = format!("SELECT {TASK_COLUMNS} FROM {TASK_FROM} WHERE 1 = 1");
    let mut values: Vec<Value> = Vec::new();
    if let Some(client) = filter.client_id {
        values.push(Value::Blob(client_key(client).to_vec()));
        sql.push_str(&format!(" AND t.client_id = ?{}", values.len()));
    }
    if !filter.statuses.is_empty() {
        let mut marks = Vec::new();
        for status in &filter.statuses {
            values.push(Value::Text(status.as_str().to_owned()));
            marks.push(format!("?{}", values.len()));
        }
        sql.push_str(&format!(" AND t.status IN ({})", marks.join(",")));
    }
    if let Some(before) = filter.before {
        values.push(Value::Blob(key(before).to_vec()));
        sql.push_str(&format!(" AND t.id < ?{}", values.len()));
    }
    values.push(Value::Integer(to_i64(filter.limit as u64 + 1)?));
    sql.push_str(&format!(" ORDER BY t.id DESC LIMIT ?{}", values.len()));
    let raws: Vec<RawTask> = conn
        .prepare_cached(&sql)?
        .query_map(rusqlite::params_from_iter(values), task_of_row)?
        .collect::<Result<_, _>>()?;
    let mut items = raws
        .into_iter()
        .map(RawTask::decode)
        .collect::<Res<Vec<Task>>>()?;
    let has_more = items.len() > filter.limit;
    items.truncate(filter.limit);
    Ok(Page { items, has_more })
}

fn response_of_task(conn: &Connection, task_id: TaskId) -> Res<Response> {
    let doc: Option<String> = conn
        .prepare_cached("SELECT doc FROM responses WHERE task_id = ?1")?
        .query_row([key(task_id)], |row| row.get(0))
        .optional()?;
    let doc = doc.ok_or_else(|| corrupt(format!("task {task_id} completed without a response")))?;
    Ok(serde_json::from_str(&doc)?)
}

/// Events after `after`, ascending. One read transaction, so the events and the task and response
/// they are rebuilt from are one snapshot even while a purge runs.
pub fn events(conn: &Connection, task_id: TaskId, after: u64, limit: usize) -> Res<Page<Event>> {
    let snapshot = conn.unchecked_transaction()?;
    let page = events_in(&snapshot, task_id, after, limit)?;
    snapshot.commit()?;
    Ok(page)
}

fn events_in(conn: &Connection, task_id: TaskId, after: u64, limit: usize) -> Res<Page<Event>> {
    // Sequence numbers fit in i64; an `after` past that simply has nothing after it.
    let after_key = i64::try_from(after).unwrap_or(i64::MAX);
    let rows: Vec<(i64, i64, i64, String)> = conn
        .prepare_cached(
            "SELECT sequence_number, kind, created_at, data FROM task_events \
             WHERE task_id = ?1 AND sequence_number > ?2 ORDER BY sequence_number LIMIT ?3",
        )?
        .query_map(
            params![key(task_id), after_key, to_i64(limit as u64 + 1)?],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)),
        )?
        .collect::<Result<_, _>>()?;
    let has_more = rows.len() > limit;
    let mut task =
        || load_task(conn, task_id)?.ok_or_else(|| corrupt(format!("events of no task {task_id}")));
    let mut response = || response_of_task(conn, task_id);
    let mut items = Vec::with_capacity(rows.len().min(limit));
    for (seq, code, created_at, data) in rows.into_iter().take(limit) {
        items.push(Event {
            task_id,
            sequence_number: from_i64(seq)?,
            created_at: Timestamp::from_millis(created_at),
            payload: read_payload(EventCode::kind(code)?, data, &mut task, &mut response)?,
        });
    }
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
        .query_row([key(task_id)], |row| Ok((row.get(0)?, row.get(1)?)))
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
            let status = TaskStatus::parse(&status).map_err(corrupt)?;
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
    SecretHash::from_hex(text).ok_or_else(|| corrupt("a stored hash is not 64 hex digits"))
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

/// Redeems a pairing code: the client is stored and the code deleted only when the code is
/// unexpired and grants every scope the client asks for.
pub fn redeem_pairing(
    conn: &Connection,
    hash: &SecretHash,
    client: &Client,
    at: Timestamp,
) -> Res<Redemption> {
    let scopes: Option<String> = conn
        .prepare_cached("SELECT scopes FROM pairings WHERE code_hash = ?1 AND expires_at > ?2")?
        .query_row(params![hex_of(hash), at.as_millis()], |row| row.get(0))
        .optional()?;
    let Some(scopes) = scopes else {
        return Ok(Redemption::NoSuchCode);
    };
    let granted: Scopes = serde_json::from_str(&scopes)?;
    if !client.scopes.is_subset_of(&granted) {
        return Ok(Redemption::ScopesNotGranted);
    }
    conn.prepare_cached("DELETE FROM pairings WHERE code_hash = ?1")?
        .execute([hex_of(hash)])?;
    insert_client(conn, client)?;
    Ok(Redemption::Paired)
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
