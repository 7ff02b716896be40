//! The schema: versioned migrations applied in order, tracked in `PRAGMA user_version`.

use rusqlite::Connection;

use crate::error::DbError;

/// The migrations, in order; migration `i` brings the database to `user_version = i + 1`.
const MIGRATIONS: &[&str] = &[r#"
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
"#];

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Applies every migration newer than the database's `user_version`, each in its own transaction,
/// then checks that the layout is the one this build expects.
pub fn migrate(conn: &mut Connection) -> Result<(), DbError> {
    apply_migrations(conn)?;
    // Pre-release builds wrote a different version-1 layout (tasks as JSON documents, no
    // `task_specs`); such a database cannot be read, so say so instead of failing on a query.
    let expected: i64 = conn.query_row(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'task_specs'",
        [],
        |row| row.get(0),
    )?;
    if expected != 1 {
        return Err(DbError::Corrupt(String::from(
            "this database was written by a pre-release build of lmsp with another layout; \
             move its data directory aside and start with a new one",
        )));
    }
    Ok(())
}

fn apply_migrations(conn: &mut Connection) -> rusqlite::Result<()> {
    let current: i64 = conn.query_row("PRAGMA user_version", [], |row| row.get(0))?;
    for (index, script) in MIGRATIONS.iter().enumerate() {
        let version = index as i64 + 1;
        if version <= current {
            continue;
        }
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        tx.execute_batch(script)?;
        tx.pragma_update(None, "user_version", version)?;
        tx.commit()?;
    }
    Ok(())
}
