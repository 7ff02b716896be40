//! The schema: versioned migrations applied in order (`rusqlite_migration`, tracked in
//! `PRAGMA user_version`). Version 1 is the layout of the first release; version 2 adds instances
//! and ownership, output items, upstream models, sticky model deletions, and idempotency records
//! that hold a key across processes; version 3 adds service tiers, client limits and the state
//! fair claims need; version 4 adds files and batches; version 5 webhooks. A migration that
//! moves data does so in Rust, in the same transaction as its SQL.

use rusqlite::{params, Connection, Transaction};
use rusqlite_migration::{HookError, HookResult, Migrations, M};
use serde::Deserialize;

use crate::error::DbError;

/// Version 1: the first release.
const V1: &str = r#"
CREATE TABLE service_config (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;

CREATE TABLE clients (
    id         TEXT PRIMARY KEY,
    name       TEXT NOT NULL,
    token_hash TEXT NOT NULL UNIQUE,
    scopes     TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    revoked_at INTEGER
);

CREATE TABLE pairings (
    code_hash  TEXT PRIMARY KEY,
    scopes     TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TABLE models (
    id              TEXT PRIMARY KEY,
    format          TEXT NOT NULL,
    path            TEXT NOT NULL,
    size_bytes      INTEGER NOT NULL,
    modified_millis INTEGER NOT NULL,
    digest          TEXT NOT NULL,
    created_at      INTEGER NOT NULL
) WITHOUT ROWID;

-- Tasks are keyed by the 16 bytes of their ULID (`task_…` without its prefix), so key order is
-- creation order. The row holds only what changes or is small: the spec (input, budget, seed) and
-- metadata are written once into `task_specs`, so an append rewrites a short row whatever the size
-- of the input.
CREATE TABLE tasks (
    id                   BLOB PRIMARY KEY,
    client_id            BLOB NOT NULL,
    status               TEXT NOT NULL,
    model                TEXT NOT NULL,
    on_restart           TEXT NOT NULL,
    created_at           INTEGER NOT NULL,
    started_at           INTEGER,
    finished_at          INTEGER,
    last_sequence_number INTEGER NOT NULL,
    restarts             INTEGER NOT NULL,
    recovered_in         INTEGER,
    error                TEXT,
    response_id          TEXT
) WITHOUT ROWID;
CREATE INDEX tasks_status ON tasks (status, id);
CREATE INDEX tasks_client ON tasks (client_id, id);
CREATE INDEX tasks_finished ON tasks (finished_at) WHERE finished_at IS NOT NULL;

CREATE TABLE task_specs (
    task_id  BLOB PRIMARY KEY REFERENCES tasks (id),
    spec     TEXT NOT NULL,
    metadata TEXT NOT NULL
) WITHOUT ROWID;

-- One row per event. `kind` is a small code (see `ops::EventCode`) and `data` the event's data in
-- its shortest form: a delta's text as is; nothing for `response.created` and
-- `response.completed`, whose task and response are rebuilt from `tasks`/`task_specs` and
-- `responses` when read, so no text is stored twice.
CREATE TABLE task_events (
    task_id         BLOB NOT NULL REFERENCES tasks (id),
    sequence_number INTEGER NOT NULL,
    kind            INTEGER NOT NULL,
    created_at      INTEGER NOT NULL,
    data            TEXT NOT NULL,
    PRIMARY KEY (task_id, sequence_number)
) WITHOUT ROWID;

CREATE TABLE responses (
    id      TEXT PRIMARY KEY,
    task_id BLOB NOT NULL UNIQUE REFERENCES tasks (id),
    doc     TEXT NOT NULL
);

CREATE TABLE snapshots (
    task_id         BLOB PRIMARY KEY REFERENCES tasks (id),
    sequence_number INTEGER NOT NULL,
    state           BLOB NOT NULL
) WITHOUT ROWID;

CREATE TABLE idempotency_keys (
    client_id  TEXT NOT NULL,
    method     TEXT NOT NULL,
    path       TEXT NOT NULL,
    key        TEXT NOT NULL,
    task_id    BLOB REFERENCES tasks (id),
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    doc        TEXT NOT NULL,
    PRIMARY KEY (client_id, method, path, key)
) WITHOUT ROWID;
CREATE INDEX idempotency_expiry ON idempotency_keys (expires_at);
CREATE INDEX idempotency_task ON idempotency_keys (task_id) WHERE task_id IS NOT NULL;
"#;

/// Version 2. Tasks get an owner instance (the first release's tasks belong to the instance
/// `LEGACY_INSTANCE`, stopped, so the next start recovers them), whether they ran in the
/// background, and where their output items are; events name their output item; the response id
/// of a task is its own ULID with the `resp_` prefix unless the first release stored another.
const V2: &str = r#"
ALTER TABLE tasks ADD COLUMN owner BLOB NOT NULL DEFAULT x'00000000000000000000000000000000';
ALTER TABLE tasks ADD COLUMN background INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN items_opened INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN item_open INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tasks DROP COLUMN recovered_in;
-- The instance that accepted the task (its first owner): part of what it was when created.
ALTER TABLE task_specs ADD COLUMN accepted_by BLOB;
ALTER TABLE task_events ADD COLUMN item INTEGER;
-- Only the first release's responses have ids of their own; newer ones are their task's ULID.
CREATE INDEX tasks_response ON tasks (response_id) WHERE response_id IS NOT NULL;

CREATE TABLE instances (
    id           BLOB PRIMARY KEY,
    name         TEXT NOT NULL,
    started_at   INTEGER NOT NULL,
    lease_until  INTEGER NOT NULL,
    retired_at   INTEGER,
    recovered_at INTEGER
) WITHOUT ROWID;
-- Stopped, and already recovered when it left no unfinished task (a new database, or a clean
-- stop), so that only a store with leftovers lists it among the stopped instances.
INSERT INTO instances (id, name, started_at, lease_until, retired_at, recovered_at)
    SELECT x'00000000000000000000000000000000', 'release 0.1', 0, 0, 0,
        CASE WHEN EXISTS (SELECT 1 FROM tasks
            WHERE status IN ('queued', 'loading', 'running', 'cancelling')) THEN NULL ELSE 0 END;

CREATE TABLE models_v2 (
    id              TEXT PRIMARY KEY,
    format          TEXT NOT NULL,
    path            TEXT,
    size_bytes      INTEGER,
    modified_millis INTEGER,
    digest          TEXT,
    upstream_model  TEXT,
    created_at      INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO models_v2 (id, format, path, size_bytes, modified_millis, digest, created_at)
    SELECT id, format, path, size_bytes, modified_millis, digest, created_at FROM models;
DROP TABLE models;
ALTER TABLE models_v2 RENAME TO models;

-- Files whose model a user deleted: not registered again when found at startup.
CREATE TABLE removed_model_files (
    path TEXT PRIMARY KEY
) WITHOUT ROWID;

-- `reply` is NULL while the first request is pending; `held_until` while it is being answered.
CREATE TABLE idempotency_v2 (
    client_id  BLOB NOT NULL,
    operation  TEXT NOT NULL,
    key        TEXT NOT NULL,
    digest     BLOB NOT NULL,
    reply      BLOB,
    reply_task BLOB REFERENCES tasks (id),
    held_until INTEGER,
    held_by    BLOB,
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    PRIMARY KEY (client_id, operation, key)
) WITHOUT ROWID;
"#;

/// Version 2, after its data moved: the old idempotency table goes.
const V2_AFTER: &str = r#"
DROP TABLE idempotency_keys;
ALTER TABLE idempotency_v2 RENAME TO idempotency_keys;
CREATE INDEX idempotency_expiry ON idempotency_keys (expires_at);
CREATE INDEX idempotency_task ON idempotency_keys (reply_task) WHERE reply_task IS NOT NULL;
CREATE INDEX idempotency_holder ON idempotency_keys (held_by) WHERE held_by IS NOT NULL;
DELETE FROM service_config WHERE key = 'start_epoch';
"#;

/// The instance that owns every task the first release wrote.
pub const LEGACY_INSTANCE: [u8; 16] = [0; 16];

/// A first-release idempotency record (`idempotency_keys.doc`).
#[derive(Debug, Deserialize)]
struct LegacyRecord {
    digest: Vec<u8>,
    reply: serde_json::Value,
}

fn hook_failure(error: impl std::fmt::Display) -> HookError {
    HookError::Hook(error.to_string())
}

/// A first-release `idempotency_keys` row: client, path, key, task, created, expires, document.
type LegacyRow = (String, String, String, Option<Vec<u8>>, i64, i64, String);

/// Moves the first release's idempotency records into the new table: the operation from the
/// path, the client id as its 16 bytes, the digest as bytes, and the stored reply kept as the
/// JSON document it was (the HTTP edge reads that shape).
fn move_idempotency_records(tx: &Transaction<'_>) -> HookResult {
    let rows: Vec<LegacyRow> = {
        let mut stmt = tx.prepare(
            "SELECT client_id, path, key, task_id, created_at, expires_at, doc FROM idempotency_keys",
        )?;
        let rows = stmt
            .query_map([], |row| {
                Ok((
                    row.get(0)?,
                    row.get(1)?,
                    row.get(2)?,
                    row.get(3)?,
                    row.get(4)?,
                    row.get(5)?,
                    row.get(6)?,
                ))
            })?
            .collect::<Result<_, _>>()?;
        rows
    };
    for (client, path, key, task, created_at, expires_at, doc) in rows {
        let operation = match path.as_str() {
            "/v1/responses" => "create_response",
            "/v1/models" => "register_model",
            _ => continue,
        };
        let client = lmsp_domain::ClientId::parse(&client).map_err(hook_failure)?;
        let record: LegacyRecord = serde_json::from_str(&doc).map_err(hook_failure)?;
        let reply = serde_json::to_vec(&record.reply).map_err(hook_failure)?;
        tx.execute(
            "INSERT INTO idempotency_v2 (client_id, operation, key, digest, reply, reply_task, \
             held_until, created_at, expires_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, NULL, ?7, ?8)",
            params![
                client.ulid().to_bytes().as_slice(),
                operation,
                key,
                record.digest,
                reply,
                task,
                created_at,
                expires_at
            ],
        )?;
    }
    tx.execute_batch(V2_AFTER)?;
    Ok(())
}

/// Version 3: service tiers and fairness between clients. A task keeps its tier's rank
/// (`priority` 0, `default` 1, `flex` 2; rows written before are `default`); `client_queues`
/// holds, per client (keyed like `tasks.client_id`), when one of its tasks was last claimed and
/// its limits (`NULL`: none). Two partial indexes serve a claim: each client's queued tasks by
/// tier and age (the queue heads), and each client's claimed, unfinished tasks (its load).
const V3: &str = r#"
ALTER TABLE tasks ADD COLUMN tier INTEGER NOT NULL DEFAULT 1;
CREATE INDEX tasks_queue ON tasks (client_id, tier, id) WHERE status = 'queued';
CREATE INDEX tasks_active ON tasks (client_id) WHERE status IN ('loading', 'running', 'cancelling');
CREATE TABLE client_queues (
    client_id   BLOB PRIMARY KEY,
    served_at   INTEGER,
    max_running INTEGER,
    max_queued  INTEGER
) WITHOUT ROWID;
"#;

/// Version 4: files and batches. A batch's tasks name it and their line (`tasks.batch_id`,
/// `batch_line`, `task_specs.custom_id`); `batch_staging` keeps a validating batch's tasks aside
/// until they are all created at once; `files` holds the records of uploaded and written files
/// (their bytes are in `DATA_DIR/files/`). The trigger keeps each batch's counts in the same
/// transaction as each of its tasks' ends, on every write path (a step, a cancel, a recovery
/// cell), as the domain's `batch::counted` says: a completed task counts as `completed`, a
/// failed or cancelled one as `failed`. Batch tasks are purged with their batch, from its end.
const V4: &str = r#"
ALTER TABLE tasks ADD COLUMN batch_id BLOB;
ALTER TABLE tasks ADD COLUMN batch_line INTEGER;
ALTER TABLE task_specs ADD COLUMN custom_id TEXT;
CREATE INDEX tasks_batch ON tasks (batch_id, batch_line) WHERE batch_id IS NOT NULL;
CREATE TABLE files (
    id         BLOB PRIMARY KEY,
    client_id  BLOB NOT NULL,
    filename   TEXT NOT NULL,
    purpose    TEXT NOT NULL,
    bytes      INTEGER NOT NULL,
    digest     TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    batch_id   BLOB
) WITHOUT ROWID;
CREATE INDEX files_client ON files (client_id, id);
CREATE TABLE batches (
    id                BLOB PRIMARY KEY,
    client_id         BLOB NOT NULL,
    endpoint          TEXT NOT NULL,
    input_file_id     BLOB NOT NULL,
    completion_window INTEGER NOT NULL,
    status            TEXT NOT NULL,
    output_file_id    BLOB,
    error_file_id     BLOB,
    errors            TEXT,
    total             INTEGER NOT NULL DEFAULT 0,
    completed         INTEGER NOT NULL DEFAULT 0,
    failed            INTEGER NOT NULL DEFAULT 0,
    metadata          TEXT NOT NULL,
    created_at        INTEGER NOT NULL,
    in_progress_at    INTEGER,
    failed_at         INTEGER,
    finalizing_at     INTEGER,
    completed_at      INTEGER,
    expired_at        INTEGER,
    cancelling_at     INTEGER,
    cancelled_at      INTEGER
) WITHOUT ROWID;
CREATE INDEX batches_client ON batches (client_id, id);
CREATE INDEX batches_unfinished ON batches (id)
    WHERE status IN ('validating', 'in_progress', 'finalizing', 'cancelling');
CREATE INDEX batches_input ON batches (input_file_id);
CREATE TABLE batch_staging (
    batch_id    BLOB NOT NULL,
    line        INTEGER NOT NULL,
    task_id     BLOB NOT NULL,
    client_id   BLOB NOT NULL,
    custom_id   TEXT NOT NULL,
    model       TEXT NOT NULL,
    on_restart  TEXT NOT NULL,
    tier        INTEGER NOT NULL,
    response_id TEXT,
    owner       BLOB NOT NULL,
    spec        TEXT NOT NULL,
    metadata    TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    PRIMARY KEY (batch_id, line)
) WITHOUT ROWID;
CREATE TRIGGER batch_counts AFTER UPDATE OF status ON tasks
    WHEN NEW.batch_id IS NOT NULL
        AND OLD.status IN ('queued', 'loading', 'running', 'cancelling')
        AND NEW.status IN ('completed', 'failed', 'cancelled')
BEGIN
    UPDATE batches SET completed = completed + (NEW.status = 'completed'),
        failed = failed + (NEW.status <> 'completed')
    WHERE id = NEW.batch_id;
END;
"#;

/// Version 5: webhooks. `webhook_endpoints` holds the endpoints (`event_types` as the names
/// between single spaces, with a space before the first and after the last, so a trigger finds
/// one with `instr`); `webhook_deliveries` is the outbox, one row per event and endpoint. The two
/// triggers write an event's deliveries in the same transaction as the end it announces, on
/// every write path, as the domain's `webhooks::task_event` (a background response's task that
/// completed, failed or was cancelled) and `webhooks::batch_event` (a batch that ended) say; the
/// event id is `evt_` and the subject's 32 hex digits (`webhooks::event_id`).
const V5: &str = r#"
CREATE TABLE webhook_endpoints (
    id                   BLOB PRIMARY KEY,
    name                 TEXT NOT NULL,
    url                  TEXT NOT NULL,
    event_types          TEXT NOT NULL,
    secret               TEXT NOT NULL,
    previous_secret      TEXT,
    previous_valid_until INTEGER,
    created_at           INTEGER NOT NULL,
    updated_at           INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE webhook_deliveries (
    endpoint_id     BLOB NOT NULL,
    event_id        TEXT NOT NULL,
    event_type      TEXT NOT NULL,
    subject         BLOB NOT NULL,
    created_at      INTEGER NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER,
    leased_until    INTEGER,
    last_status     INTEGER,
    last_error      TEXT,
    last_attempt_at INTEGER,
    delivered_at    INTEGER,
    given_up_at     INTEGER,
    PRIMARY KEY (endpoint_id, event_id)
) WITHOUT ROWID;
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at)
    WHERE next_attempt_at IS NOT NULL;
CREATE INDEX webhook_deliveries_recent ON webhook_deliveries (endpoint_id, created_at);
CREATE TRIGGER webhook_task_events AFTER UPDATE OF status ON tasks
    WHEN NEW.background = 1
        AND OLD.status IN ('queued', 'loading', 'running', 'cancelling')
        AND NEW.status IN ('completed', 'failed', 'cancelled')
BEGIN
    INSERT OR IGNORE INTO webhook_deliveries
        (endpoint_id, event_id, event_type, subject, created_at, next_attempt_at)
    SELECT e.id, 'evt_' || lower(hex(NEW.id)), 'response.' || NEW.status, NEW.id,
        coalesce(NEW.finished_at, 0), coalesce(NEW.finished_at, 0)
    FROM webhook_endpoints e
    WHERE instr(e.event_types, ' response.' || NEW.status || ' ') > 0;
END;
CREATE TRIGGER webhook_batch_events AFTER UPDATE OF status ON batches
    WHEN OLD.status IN ('validating', 'in_progress', 'finalizing', 'cancelling')
        AND NEW.status IN ('completed', 'failed', 'cancelled', 'expired')
BEGIN
    INSERT OR IGNORE INTO webhook_deliveries
        (endpoint_id, event_id, event_type, subject, created_at, next_attempt_at)
    SELECT e.id, 'evt_' || lower(hex(NEW.id)), 'batch.' || NEW.status, NEW.id,
        coalesce(NEW.completed_at, NEW.failed_at, NEW.cancelled_at, NEW.expired_at, 0),
        coalesce(NEW.completed_at, NEW.failed_at, NEW.cancelled_at, NEW.expired_at, 0)
    FROM webhook_endpoints e
    WHERE instr(e.event_types, ' batch.' || NEW.status || ' ') > 0;
END;
"#;

fn migrations() -> Migrations<'static> {
    Migrations::new(vec![
        M::up(V1),
        M::up_with_hook(V2, move_idempotency_records),
        M::up(V3),
        M::up(V4),
        M::up(V5),
    ])
}

/// The schema version this build writes.
pub const SCHEMA_VERSION: usize = 5;

/// Applies every migration newer than the database's `user_version`, each in its own transaction,
/// then checks that the layout is the one this build expects.
pub fn migrate(conn: &mut Connection) -> Result<(), DbError> {
    // Pre-release builds wrote a different version-1 layout (tasks as JSON documents, no
    // `task_specs`); such a database cannot be read, so say so instead of failing on a query.
    let version: i64 = conn.query_row("PRAGMA user_version", [], |row| row.get(0))?;
    let has_specs: i64 = conn.query_row(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'task_specs'",
        [],
        |row| row.get(0),
    )?;
    if version >= 1 && has_specs != 1 {
        return Err(DbError::Corrupt(String::from(
            "this database was written by a pre-release build of lmsp with another layout; \
             move its data directory aside and start with a new one",
        )));
    }
    if version > SCHEMA_VERSION as i64 {
        return Err(DbError::Corrupt(format!(
            "this database has schema version {version}, newer than this build's \
             {SCHEMA_VERSION}: run a newer lmsp"
        )));
    }
    migrations()
        .to_latest(conn)
        .map_err(|error| DbError::Corrupt(format!("the schema migration failed: {error}")))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn the_migrations_are_valid() {
        assert!(migrations().validate().is_ok());
    }

    /// The plan SQLite picks for each query of a claim.
    fn plan(conn: &Connection, sql: &str) -> String {
        let mut statement = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let details: Vec<String> = statement
            .query_map([Vec::<u8>::new()], |row| row.get::<_, String>(3))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        details.join("; ")
    }

    /// Issue 25: a claim stays O(log n) with a million queued tasks: each of its queries is an
    /// index seek (the `tasks_queue` and `tasks_active` partial indexes), never a scan of the
    /// queue.
    #[test]
    fn the_claims_queries_seek_their_partial_indexes() {
        use crate::ops::tasks::{CLIENT_RUNNING, NEXT_QUEUED_CLIENT, QUEUE_HEAD};
        let mut conn = Connection::open_in_memory().unwrap();
        migrate(&mut conn).unwrap();
        let next = plan(&conn, NEXT_QUEUED_CLIENT);
        assert!(next.contains("INDEX tasks_queue (client_id>?)"), "{next}");
        let head = plan(&conn, &QUEUE_HEAD.replace("?2", "1"));
        assert!(
            head.contains("INDEX tasks_queue (client_id=? AND tier=?)"),
            "{head}"
        );
        let running = plan(&conn, CLIENT_RUNNING);
        assert!(
            running.contains("INDEX tasks_active (client_id=?)"),
            "{running}"
        );
    }
}
