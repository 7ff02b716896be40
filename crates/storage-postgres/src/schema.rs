//! The schema: versioned migrations, recorded in `schema_migrations`, applied in one transaction
//! under a transaction-level advisory lock so that instances starting at the same time do not
//! race (the second waits, then finds the migrations applied).
//!
//! The layout follows the SQLite adapter's (version 2 there): ids of tasks, clients and instances
//! are the 16 bytes of their ULID (`bytea`, whose order is creation order), times are Unix
//! milliseconds (`bigint`), documents are the codecs' JSON text.

use tokio_postgres::Client;

use crate::error::DbError;

/// The advisory lock key the migrations are applied under (`pg_advisory_xact_lock`).
const MIGRATION_LOCK: i64 = 0x6c6d_7370_0001;

/// Version 1: the whole layout.
const V1: &str = r#"
CREATE TABLE service_config (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
-- The pairing limit always has a row, so that redemptions serialize on it (`FOR UPDATE`).
INSERT INTO service_config (key, value) VALUES ('pairing_limit', '{"failures":[],"locked_until":null}');

CREATE TABLE clients (
    id         TEXT PRIMARY KEY,
    name       TEXT NOT NULL,
    token_hash TEXT NOT NULL UNIQUE,
    scopes     TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    revoked_at BIGINT
);

CREATE TABLE pairings (
    code_hash  TEXT PRIMARY KEY,
    scopes     TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL
);

CREATE TABLE models (
    id              TEXT PRIMARY KEY,
    format          TEXT NOT NULL,
    path            TEXT,
    size_bytes      BIGINT,
    modified_millis BIGINT,
    digest          TEXT,
    upstream_model  TEXT,
    created_at      BIGINT NOT NULL
);

CREATE TABLE removed_model_files (
    path TEXT PRIMARY KEY
);

CREATE TABLE instances (
    id           BYTEA PRIMARY KEY,
    name         TEXT NOT NULL,
    started_at   BIGINT NOT NULL,
    lease_until  BIGINT NOT NULL,
    retired_at   BIGINT,
    recovered_at BIGINT
);
CREATE INDEX instances_name ON instances (name);

CREATE TABLE tasks (
    id                   BYTEA PRIMARY KEY,
    client_id            BYTEA NOT NULL,
    status               TEXT NOT NULL,
    model                TEXT NOT NULL,
    on_restart           TEXT NOT NULL,
    created_at           BIGINT NOT NULL,
    started_at           BIGINT,
    finished_at          BIGINT,
    last_sequence_number BIGINT NOT NULL,
    restarts             BIGINT NOT NULL,
    error                TEXT,
    response_id          TEXT,
    owner                BYTEA NOT NULL,
    background           BOOLEAN NOT NULL,
    items_opened         BIGINT NOT NULL,
    item_open            BOOLEAN NOT NULL
);
CREATE INDEX tasks_status ON tasks (status, id);
CREATE INDEX tasks_client ON tasks (client_id, id);
CREATE INDEX tasks_owner ON tasks (owner, status, id);
CREATE INDEX tasks_finished ON tasks (finished_at) WHERE finished_at IS NOT NULL;
CREATE INDEX tasks_response ON tasks (response_id) WHERE response_id IS NOT NULL;

CREATE TABLE task_specs (
    task_id     BYTEA PRIMARY KEY REFERENCES tasks (id),
    spec        TEXT NOT NULL,
    metadata    TEXT NOT NULL,
    accepted_by BYTEA
);

CREATE TABLE task_events (
    task_id         BYTEA NOT NULL REFERENCES tasks (id),
    sequence_number BIGINT NOT NULL,
    kind            BIGINT NOT NULL,
    created_at      BIGINT NOT NULL,
    data            TEXT NOT NULL,
    item            BIGINT,
    PRIMARY KEY (task_id, sequence_number)
);

CREATE TABLE responses (
    id      TEXT PRIMARY KEY,
    task_id BYTEA NOT NULL UNIQUE REFERENCES tasks (id),
    doc     TEXT NOT NULL
);

CREATE TABLE snapshots (
    task_id         BYTEA PRIMARY KEY REFERENCES tasks (id),
    sequence_number BIGINT NOT NULL,
    state           BYTEA NOT NULL
);

-- `reply` is NULL while the first request is pending; `held_until` while it is being answered.
CREATE TABLE idempotency_keys (
    client_id  BYTEA NOT NULL,
    operation  TEXT NOT NULL,
    key        TEXT NOT NULL,
    digest     BYTEA NOT NULL,
    reply      BYTEA,
    reply_task BYTEA REFERENCES tasks (id),
    held_until BIGINT,
    held_by    BYTEA,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    PRIMARY KEY (client_id, operation, key)
);
CREATE INDEX idempotency_expiry ON idempotency_keys (expires_at);
CREATE INDEX idempotency_task ON idempotency_keys (reply_task) WHERE reply_task IS NOT NULL;
CREATE INDEX idempotency_holder ON idempotency_keys (held_by) WHERE held_by IS NOT NULL;
"#;

/// Version 2: the check the group-committed writes (`batch.rs`) make inside their single
/// statement: a compare-and-set that changed no row fails the statement as a lost race
/// (SQLSTATE 40001, a serialization failure: the command is run again), so that the savepoint
/// around it is rolled back instead of released.
const V2: &str = r#"
CREATE FUNCTION lmsp_expect_one(changed BIGINT) RETURNS BIGINT
LANGUAGE plpgsql AS $fn$
BEGIN
    IF changed <> 1 THEN
        RAISE EXCEPTION 'the row moved under the transaction (% rows changed)', changed
            USING ERRCODE = 'serialization_failure';
    END IF;
    RETURN changed;
END
$fn$;
"#;

/// Version 3: service tiers and fairness between clients. A task keeps its tier's rank
/// (`priority` 0, `default` 1, `flex` 2; rows written before are `default`); `client_queues`
/// holds, per client (keyed like `tasks.client_id`), when one of its tasks was last claimed and
/// its limits (`NULL`: none). Two partial indexes serve a claim: each client's queued tasks by
/// tier and age (the queue heads), and each client's claimed, unfinished tasks (its load).
const V3: &str = r#"
ALTER TABLE tasks ADD COLUMN tier SMALLINT NOT NULL DEFAULT 1;
CREATE INDEX tasks_queue ON tasks (client_id, tier, id) WHERE status = 'queued';
CREATE INDEX tasks_active ON tasks (client_id) WHERE status IN ('loading', 'running', 'cancelling');
CREATE TABLE client_queues (
    client_id   BYTEA PRIMARY KEY,
    served_at   BIGINT,
    max_running INTEGER,
    max_queued  INTEGER
);
"#;

/// The migrations, in order: version `n` is `MIGRATIONS[n - 1]`. Never edit a released one;
/// append a new version.
const MIGRATIONS: &[&str] = &[V1, V2, V3];

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Applies every migration newer than the database's, in one transaction under the migration
/// lock; refuses a database newer than this build.
pub async fn migrate(client: &mut Client) -> Result<(), DbError> {
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations (
            version    BIGINT PRIMARY KEY,
            applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
        )",
    )
    .await?;
    let row = tx
        .query_one(
            "SELECT coalesce(max(version), 0) FROM schema_migrations",
            &[],
        )
        .await?;
    let current: i64 = row.try_get(0)?;
    if current > SCHEMA_VERSION {
        return Err(DbError::Corrupt(format!(
            "this database has schema version {current}, newer than this build's \
             {SCHEMA_VERSION}: run a newer lmsp"
        )));
    }
    for (index, sql) in MIGRATIONS.iter().enumerate() {
        let version = index as i64 + 1;
        if version <= current {
            continue;
        }
        tx.batch_execute(sql).await?;
        tx.execute(
            "INSERT INTO schema_migrations (version) VALUES ($1)",
            &[&version],
        )
        .await?;
    }
    tx.commit().await?;
    Ok(())
}
