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

/// Version 4: files and batches (the SQLite adapter's version 4). A batch's tasks name it and
/// their line (`tasks.batch_id`, `batch_line`, `task_specs.custom_id`); `batch_staging` keeps a
/// validating batch's tasks aside until they are all created at once; `files` holds the records
/// of uploaded and written files and `file_chunks` their bytes (in the database, because every
/// instance must read them), in parts of at most 1 MiB.
///
/// The trigger keeps each batch's counts in the same transaction as each of its tasks' ends, on
/// every write path that moves a task (`UPDATE tasks SET status = …`: the group-committed steps
/// and cancels, recovery), as the domain's `batch::counted` says: a completed task counts as
/// `completed`, a failed or cancelled one as `failed`. It fires per row, once, on the move from
/// an unfinished status to a finished one. Batch tasks are purged with their batch, from its end,
/// so the index of the purge of finished tasks (`tasks_finished`) leaves them out.
const V4: &str = r#"
ALTER TABLE tasks ADD COLUMN batch_id BYTEA, ADD COLUMN batch_line INTEGER;
ALTER TABLE task_specs ADD COLUMN custom_id TEXT;
CREATE INDEX tasks_batch ON tasks (batch_id, batch_line) WHERE batch_id IS NOT NULL;
-- The purge of finished tasks passes over batch tasks (they go with their batch).
DROP INDEX tasks_finished;
CREATE INDEX tasks_finished ON tasks (finished_at) WHERE finished_at IS NOT NULL AND batch_id IS NULL;

CREATE TABLE files (
    id         BYTEA PRIMARY KEY,
    client_id  BYTEA NOT NULL,
    filename   TEXT NOT NULL,
    purpose    TEXT NOT NULL,
    bytes      BIGINT NOT NULL,
    digest     TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    batch_id   BYTEA
);
CREATE INDEX files_client ON files (client_id, id);

CREATE TABLE file_chunks (
    file_id BYTEA NOT NULL,
    part    INTEGER NOT NULL,
    data    BYTEA NOT NULL,
    PRIMARY KEY (file_id, part)
);

-- `endpoint`: '/v1/responses' or '/v1/chat/completions'; `completion_window` in milliseconds;
-- `status`: `BatchStatus::as_str`; `errors`: a JSON array of {code, message, param, line}, NULL
-- when there is none; `metadata`: the codec's metadata text.
CREATE TABLE batches (
    id                BYTEA PRIMARY KEY,
    client_id         BYTEA NOT NULL,
    endpoint          TEXT NOT NULL,
    input_file_id     BYTEA NOT NULL,
    completion_window BIGINT NOT NULL,
    status            TEXT NOT NULL,
    output_file_id    BYTEA,
    error_file_id     BYTEA,
    errors            TEXT,
    total             BIGINT NOT NULL DEFAULT 0,
    completed         BIGINT NOT NULL DEFAULT 0,
    failed            BIGINT NOT NULL DEFAULT 0,
    metadata          TEXT NOT NULL,
    created_at        BIGINT NOT NULL,
    in_progress_at    BIGINT,
    failed_at         BIGINT,
    finalizing_at     BIGINT,
    completed_at      BIGINT,
    expired_at        BIGINT,
    cancelling_at     BIGINT,
    cancelled_at      BIGINT
);
CREATE INDEX batches_client ON batches (client_id, id);
CREATE INDEX batches_unfinished ON batches (id)
    WHERE status IN ('validating', 'in_progress', 'finalizing', 'cancelling');
CREATE INDEX batches_input ON batches (input_file_id);

CREATE TABLE batch_staging (
    batch_id    BYTEA NOT NULL,
    line        INTEGER NOT NULL,
    task_id     BYTEA NOT NULL,
    client_id   BYTEA NOT NULL,
    custom_id   TEXT NOT NULL,
    model       TEXT NOT NULL,
    on_restart  TEXT NOT NULL,
    tier        SMALLINT NOT NULL,
    response_id TEXT,
    owner       BYTEA NOT NULL,
    spec        TEXT NOT NULL,
    metadata    TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    PRIMARY KEY (batch_id, line)
);

-- `batch::counted`: completed -> `completed`; failed or cancelled -> `failed`.
CREATE FUNCTION lmsp_batch_counts() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    UPDATE batches SET completed = completed + (NEW.status = 'completed')::int,
        failed = failed + (NEW.status <> 'completed')::int
    WHERE id = NEW.batch_id;
    RETURN NULL;
END
$fn$;
CREATE TRIGGER batch_counts AFTER UPDATE OF status ON tasks FOR EACH ROW
    WHEN (NEW.batch_id IS NOT NULL
        AND OLD.status IN ('queued', 'loading', 'running', 'cancelling')
        AND NEW.status IN ('completed', 'failed', 'cancelled'))
    EXECUTE FUNCTION lmsp_batch_counts();
"#;

/// Version 5: webhooks (the SQLite adapter's version 5). `webhook_endpoints` holds the endpoints
/// (`event_types`: the names between single spaces, with a space before the first and after the
/// last, so that a trigger finds one with `strpos`); `webhook_deliveries` is the outbox, one row
/// per event and endpoint, `leased_until` set while a deliverer holds it.
///
/// The two triggers record an event's deliveries, one per endpoint subscribed to it then, due at
/// once, in the same transaction as the end they announce (an outbox: an event is never lost, and
/// never announces an end that was rolled back), on every write path that moves a task or a
/// batch (`UPDATE … SET status = …`: the group-committed steps and cancels, recovery, the batch
/// steps): `lmsp_webhook_task_event` as the domain's `webhooks::task_event` (a background
/// response's task that completed, failed or was cancelled), `lmsp_webhook_batch_event` as
/// `webhooks::batch_event` (a batch that ended). Each fires per row, once, on the move from an
/// unfinished status to a finished one; the event id is `evt_` and the subject's 32 lower-case
/// hex digits, as `webhooks::event_id` writes it (`encode(…, 'hex')` is lower-case).
const V5: &str = r#"
CREATE TABLE webhook_endpoints (
    id                   BYTEA PRIMARY KEY,
    name                 TEXT NOT NULL,
    url                  TEXT NOT NULL,
    event_types          TEXT NOT NULL,
    secret               TEXT NOT NULL,
    previous_secret      TEXT,
    previous_valid_until BIGINT,
    created_at           BIGINT NOT NULL,
    updated_at           BIGINT NOT NULL
);

CREATE TABLE webhook_deliveries (
    endpoint_id     BYTEA NOT NULL,
    event_id        TEXT NOT NULL,
    event_type      TEXT NOT NULL,
    subject         BYTEA NOT NULL,
    created_at      BIGINT NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at BIGINT,
    leased_until    BIGINT,
    last_status     INTEGER,
    last_error      TEXT,
    last_attempt_at BIGINT,
    delivered_at    BIGINT,
    given_up_at     BIGINT,
    PRIMARY KEY (endpoint_id, event_id)
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at)
    WHERE next_attempt_at IS NOT NULL;
CREATE INDEX webhook_deliveries_recent ON webhook_deliveries (endpoint_id, created_at);

-- `webhooks::task_event`: a background response's task that completed, failed or was cancelled.
CREATE FUNCTION lmsp_webhook_task_event() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO webhook_deliveries
        (endpoint_id, event_id, event_type, subject, created_at, next_attempt_at)
    SELECT e.id, 'evt_' || encode(NEW.id, 'hex'), 'response.' || NEW.status, NEW.id,
        coalesce(NEW.finished_at, 0), coalesce(NEW.finished_at, 0)
    FROM webhook_endpoints e
    WHERE strpos(e.event_types, ' response.' || NEW.status || ' ') > 0
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$fn$;
CREATE TRIGGER webhook_task_events AFTER UPDATE OF status ON tasks FOR EACH ROW
    WHEN (NEW.background
        AND OLD.status IN ('queued', 'loading', 'running', 'cancelling')
        AND NEW.status IN ('completed', 'failed', 'cancelled'))
    EXECUTE FUNCTION lmsp_webhook_task_event();

-- `webhooks::batch_event`: a batch that ended; the event's time is the end's.
CREATE FUNCTION lmsp_webhook_batch_event() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO webhook_deliveries
        (endpoint_id, event_id, event_type, subject, created_at, next_attempt_at)
    SELECT e.id, 'evt_' || encode(NEW.id, 'hex'), 'batch.' || NEW.status, NEW.id,
        coalesce(NEW.completed_at, NEW.failed_at, NEW.cancelled_at, NEW.expired_at, 0),
        coalesce(NEW.completed_at, NEW.failed_at, NEW.cancelled_at, NEW.expired_at, 0)
    FROM webhook_endpoints e
    WHERE strpos(e.event_types, ' batch.' || NEW.status || ' ') > 0
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$fn$;
CREATE TRIGGER webhook_batch_events AFTER UPDATE OF status ON batches FOR EACH ROW
    WHEN (OLD.status IN ('validating', 'in_progress', 'finalizing', 'cancelling')
        AND NEW.status IN ('completed', 'failed', 'cancelled', 'expired'))
    EXECUTE FUNCTION lmsp_webhook_batch_event();
"#;

/// The migrations, in order: version `n` is `MIGRATIONS[n - 1]`. Never edit a released one;
/// append a new version.
const MIGRATIONS: &[&str] = &[V1, V2, V3, V4, V5];

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
