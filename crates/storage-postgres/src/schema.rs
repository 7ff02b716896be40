//! The schema: versioned migrations, recorded in `schema_migrations`, applied in one transaction
//! under a transaction-level advisory lock so that instances starting at the same time do not
//! race (the second waits, then finds the migrations applied).
//!
//! The layout follows the SQLite adapter's (version 2 there): ids of tasks, clients and instances
//! are the 16 bytes of their ULID (`bytea`, whose order is creation order), times are Unix
//! milliseconds (`bigint`), documents are the codecs' JSON text.

use std::sync::LazyLock;

use lmsp_storage_codec::schema::{self, Dialect};
use tokio_postgres::Client;

use crate::error::DbError;

const POSTGRES: Dialect = Dialect::Postgres;

/// The advisory lock key the migrations are applied under (`pg_advisory_xact_lock`).
const MIGRATION_LOCK: i64 = 0x6c6d_7370_0001;

/// Version 1: the whole layout.
fn v1() -> String {
    [
        schema::service_config(POSTGRES).as_str(),
        r#"-- The pairing limit always has a row, so that redemptions serialize on it (`FOR UPDATE`).
INSERT INTO service_config (key, value) VALUES ('pairing_limit', '{"failures":[],"locked_until":null}');
"#,
        &schema::clients_and_pairings(POSTGRES),
        &schema::models(POSTGRES, "models"),
        &schema::removed_model_files(POSTGRES),
        &schema::instances(POSTGRES),
        r#"CREATE INDEX instances_name ON instances (name);

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
CREATE INDEX tasks_owner ON tasks (owner, status, id);
"#,
        schema::TASK_INDEXES,
        schema::TASKS_BY_RESPONSE,
        r#"
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
"#,
        &schema::responses_and_snapshots(POSTGRES),
        &schema::idempotency_keys(POSTGRES, "idempotency_keys"),
        schema::IDEMPOTENCY_INDEXES,
    ]
    .join("\n")
}

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

/// Version 4: files and batches (`schema::files_and_batches`, as the SQLite adapter's version
/// 4), with their bytes in the database (`file_chunks`, in parts of at most 1 MiB), because
/// every instance must read them. Batch tasks are purged with their batch, from its end, so the
/// index of the purge of finished tasks (`tasks_finished`) leaves them out.
fn v4() -> String {
    schema::files_and_batches(POSTGRES)
        + r#"
-- The purge of finished tasks passes over batch tasks (they go with their batch).
DROP INDEX tasks_finished;
CREATE INDEX tasks_finished ON tasks (finished_at) WHERE finished_at IS NOT NULL AND batch_id IS NULL;

CREATE TABLE file_chunks (
    file_id BYTEA NOT NULL,
    part    INTEGER NOT NULL,
    data    BYTEA NOT NULL,
    PRIMARY KEY (file_id, part)
);
"#
}

/// Version 7: `task_events` without its foreign key to `tasks`. Its check ran once per inserted
/// event (a lookup of the task's row, locked `FOR KEY SHARE`): 18 % of a stream's append of
/// about 27 events. The adapter keeps what it guarded: every event is written in the statement
/// or transaction that has just inserted its task's row or moved it by a compare-and-set (so
/// the row is there and locked until the commit: `batch.rs`, `batch/fast.rs`,
/// `ops::batches`' start, `ops::write_advanced`), and a task's events are deleted before the
/// task (`flows::delete_task_rows`, `ops::batches::delete_tasks_rows`), which only a finished
/// task reaches, and a finished task takes no more events. The contract tests count events
/// without their task at the end of every check.
const V7: &str = "ALTER TABLE task_events DROP CONSTRAINT IF EXISTS task_events_task_id_fkey;";

/// Version 8: `task_specs` without its foreign key to `tasks`, for the same reason as version 7:
/// its check ran once per create (a lookup of the new task's row, locked `FOR KEY SHARE`, which
/// writes the lock to the row and the WAL), on the hot path of every submit. The adapter keeps
/// what it guarded: a spec is inserted only by the statement that inserts its task
/// (`batch.rs`, `batch/fast.rs`, `ops::batches`' start), and deleted with it, before it, in one
/// transaction (`flows::delete_task_rows`, `ops::batches::delete_tasks_rows`). The contract
/// tests count specs without their task at the end of every check, as they count events.
const V8: &str = "ALTER TABLE task_specs DROP CONSTRAINT IF EXISTS task_specs_task_id_fkey;";

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = 8;

/// The migrations, in order: version `n` is `MIGRATIONS[n - 1]`. Never change what a released
/// one creates; append a new version. Versions 3 (service tiers and fairness between clients)
/// and 5 (webhooks) are the SQLite adapter's, in this dialect; version 6 keeps batch lines
/// apart (`schema::BATCH_LINES_APART`, SQLite's version 7).
static MIGRATIONS: LazyLock<[String; SCHEMA_VERSION as usize]> = LazyLock::new(|| {
    [
        v1(),
        V2.to_owned(),
        schema::tiers_and_fairness(POSTGRES),
        v4(),
        schema::webhooks(POSTGRES),
        schema::BATCH_LINES_APART.to_owned(),
        V7.to_owned(),
        V8.to_owned(),
    ]
});

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
        return Err(lmsp_storage_codec::newer_schema(current, SCHEMA_VERSION).into());
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
