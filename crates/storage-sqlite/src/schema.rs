//! The schema: versioned migrations applied in order (`rusqlite_migration`, tracked in
//! `PRAGMA user_version`). Version 1 is the layout of the first release; version 2 adds instances
//! and ownership, output items, upstream models, sticky model deletions, and idempotency records
//! that hold a key across processes; version 3 adds service tiers, client limits and the state
//! fair claims need; version 4 adds files and batches; version 5 webhooks; version 6 the queue
//! fronts a claim reads (`schema::queue_fronts`), filled from the tasks there; version 7 keeps a
//! batch's lines apart; version 8 keeps request bodies in rowid tables. A migration that
//! moves data does so in Rust, in the same transaction as its SQL.

use std::sync::LazyLock;

use lmsp_storage_codec::schema::{self, Dialect};
use rusqlite::{params, Connection, Transaction};
use rusqlite_migration::{HookError, HookResult, Migrations, M};
use serde::Deserialize;

use crate::error::DbError;

const SQLITE: Dialect = Dialect::Sqlite;

/// Version 1: the first release.
static V1: LazyLock<String> = LazyLock::new(|| {
    [
        schema::service_config(SQLITE).as_str(),
        &schema::clients_and_pairings(SQLITE),
        r#"
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
"#,
        schema::TASK_INDEXES,
        r#"
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
"#,
        &schema::responses_and_snapshots(SQLITE),
        r#"
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
"#,
    ]
    .join("\n")
});

/// Version 2. Tasks get an owner instance (the first release's tasks belong to the instance
/// `LEGACY_INSTANCE`, stopped, so the next start recovers them), whether they ran in the
/// background, and where their output items are; events name their output item; the response id
/// of a task is its own ULID with the `resp_` prefix unless the first release stored another.
/// Models get an upstream (`models_v2` replaces `models`), and idempotency records a hold
/// (`idempotency_v2`, filled by `move_idempotency_records`).
static V2: LazyLock<String> = LazyLock::new(|| {
    [
        r#"
ALTER TABLE tasks ADD COLUMN owner BLOB NOT NULL DEFAULT x'00000000000000000000000000000000';
ALTER TABLE tasks ADD COLUMN background INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN items_opened INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN item_open INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tasks DROP COLUMN recovered_in;
-- The instance that accepted the task (its first owner): part of what it was when created.
ALTER TABLE task_specs ADD COLUMN accepted_by BLOB;
ALTER TABLE task_events ADD COLUMN item INTEGER;
-- Only the first release's responses have ids of their own; newer ones are their task's ULID.
"#,
        schema::TASKS_BY_RESPONSE,
        &schema::instances(SQLITE),
        r#"-- Stopped, and already recovered when it left no unfinished task (a new database, or a clean
-- stop), so that only a store with leftovers lists it among the stopped instances.
INSERT INTO instances (id, name, started_at, lease_until, retired_at, recovered_at)
    SELECT x'00000000000000000000000000000000', 'release 0.1', 0, 0, 0,
        CASE WHEN EXISTS (SELECT 1 FROM tasks
            WHERE status IN ('queued', 'loading', 'running', 'cancelling')) THEN NULL ELSE 0 END;
"#,
        &schema::models(SQLITE, "models_v2"),
        r#"INSERT INTO models_v2 (id, format, path, size_bytes, modified_millis, digest, created_at)
    SELECT id, format, path, size_bytes, modified_millis, digest, created_at FROM models;
DROP TABLE models;
ALTER TABLE models_v2 RENAME TO models;
"#,
        &schema::removed_model_files(SQLITE),
        &schema::idempotency_keys(SQLITE, "idempotency_v2"),
    ]
    .join("\n")
});

/// Version 2, after its data moved: the old idempotency table goes.
static V2_AFTER: LazyLock<String> = LazyLock::new(|| {
    format!(
        "DROP TABLE idempotency_keys;
ALTER TABLE idempotency_v2 RENAME TO idempotency_keys;
{}DELETE FROM service_config WHERE key = 'start_epoch';
",
        schema::IDEMPOTENCY_INDEXES
    )
});

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
    tx.execute_batch(&V2_AFTER)?;
    Ok(())
}

/// Version 3: service tiers and fairness between clients (`schema::tiers_and_fairness`).
static V3: LazyLock<String> = LazyLock::new(|| schema::tiers_and_fairness(SQLITE));

/// Version 4: files and batches (`schema::files_and_batches`); a file's bytes are in
/// `DATA_DIR/files/`. Batch tasks are purged with their batch, from its end.
static V4: LazyLock<String> = LazyLock::new(|| schema::files_and_batches(SQLITE));

/// Version 5: webhooks (`schema::webhooks`).
static V5: LazyLock<String> = LazyLock::new(|| schema::webhooks(SQLITE));

/// Version 6: queue fronts (`schema::queue_fronts`), filled from the tasks already queued and
/// claimed.
static V6: LazyLock<String> = LazyLock::new(|| schema::queue_fronts(SQLITE));

// Version 7: batch lines kept apart (`schema::BATCH_LINES_APART`).

/// Version 8: the tables that hold a request's body, `task_specs` and `batch_staging`, become
/// rowid tables, their rows copied. A `WITHOUT ROWID` table keeps at most about 1 000 bytes of
/// a row in its B-tree page (a quarter of a 4 KiB page less headers) and puts the rest in an
/// overflow page of its own: a body of 1.1 KB took a whole 4 KiB page more, so a batch of
/// 50 000 such lines (a 55 MiB file) took about 223 MiB in each of the two tables. A rowid
/// table keeps up to about 4 000 bytes of a row in place. Their primary keys stay, as unique
/// indexes.
static V8: LazyLock<String> = LazyLock::new(|| {
    format!(
        r#"
CREATE TABLE task_specs_v8 (
    task_id     BLOB PRIMARY KEY REFERENCES tasks (id),
    spec        TEXT NOT NULL,
    metadata    TEXT NOT NULL,
    accepted_by BLOB,
    custom_id   TEXT
);
INSERT INTO task_specs_v8 (task_id, spec, metadata, accepted_by, custom_id)
    SELECT task_id, spec, metadata, accepted_by, custom_id FROM task_specs;
DROP TABLE task_specs;
ALTER TABLE task_specs_v8 RENAME TO task_specs;

{staging};
INSERT INTO batch_staging_v8 ({columns})
    SELECT {columns} FROM batch_staging;
DROP TABLE batch_staging;
ALTER TABLE batch_staging_v8 RENAME TO batch_staging;
CREATE INDEX batch_staging_custom_id ON batch_staging (batch_id, custom_id, line);
"#,
        staging = schema::batch_staging(SQLITE, "batch_staging_v8", ""),
        columns = lmsp_storage_codec::batches::STAGING_COLUMNS,
    )
});

/// Version 9: `queue_fronts_age` holds every front with a head, open or not. It held only the
/// open ones (`schema::OPEN_FRONT`), whose condition reads `running`: every claim and every end
/// rewrote the entries of the client's three tiers (a changed row is reindexed in every partial
/// index whose condition names a column the statement sets), three pages of about twenty that
/// a fair claim across tiers writes. Now an entry moves only when its head does, and the oldest
/// open front's read ([`crate::ops::tasks`]' `OLDEST_FRONT`) passes over the fronts of clients
/// at their `max_running`: at most one per such client.
const V9: &str = "DROP INDEX queue_fronts_age;
CREATE INDEX queue_fronts_age ON queue_fronts (tier, head_created_at) WHERE head_id IS NOT NULL;";

fn migrations() -> Migrations<'static> {
    Migrations::new(vec![
        M::up(V1.as_str()),
        M::up_with_hook(V2.as_str(), move_idempotency_records),
        M::up(V3.as_str()),
        M::up(V4.as_str()),
        M::up(V5.as_str()),
        M::up(V6.as_str()),
        M::up(schema::BATCH_LINES_APART),
        M::up(V8.as_str()),
        M::up(V9),
    ])
}

/// The schema version this build writes.
pub const SCHEMA_VERSION: usize = 9;

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
        return Err(crate::ops::corrupt(String::from(
            "this database was written by a pre-release build of lmsp with another layout; \
             move its data directory aside and start with a new one",
        )));
    }
    if version > SCHEMA_VERSION as i64 {
        return Err(lmsp_storage_codec::newer_schema(version, SCHEMA_VERSION).into());
    }
    migrations()
        .to_latest(conn)
        .map_err(|error| crate::ops::corrupt(format!("the schema migration failed: {error}")))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn the_migrations_are_valid() {
        assert!(migrations().validate().is_ok());
    }

    /// The plan SQLite picks for a query.
    fn plan(conn: &Connection, sql: &str) -> String {
        let mut statement = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let count = statement.parameter_count();
        let values: Vec<i64> = vec![1; count];
        let details: Vec<String> = statement
            .query_map(rusqlite::params_from_iter(values), |row| {
                row.get::<_, String>(3)
            })
            .unwrap()
            .map(Result::unwrap)
            .collect();
        details.join("; ")
    }

    /// Issue 25: a claim stays O(log n) with a million queued tasks over a thousand clients: each
    /// of its reads is a seek in a partial index of the queue fronts, never a scan of the fronts
    /// or the queue, and never a sort.
    #[test]
    fn the_claims_queries_seek_the_open_fronts() {
        use crate::ops::tasks::{FIRST_FRONT, OLDEST_FRONT};
        let mut conn = Connection::open_in_memory().unwrap();
        migrate(&mut conn).unwrap();
        let oldest = plan(&conn, &OLDEST_FRONT);
        assert!(
            oldest.contains("INDEX queue_fronts_age (tier=?)") && !oldest.contains("TEMP B-TREE"),
            "{oldest}"
        );
        let first = plan(&conn, &FIRST_FRONT);
        assert!(
            first.contains("COVERING INDEX queue_fronts_claim (tier=?)")
                && !first.contains("TEMP B-TREE"),
            "{first}"
        );
    }

    /// Issue 24: a batch's duplicate `custom_id`s are found by one pass over its kept lines in
    /// line order (the primary key), with a seek in `batch_staging_custom_id` per line: no
    /// scan of another batch's lines, no sort, nothing held in memory per line.
    #[test]
    fn the_duplicate_custom_id_query_seeks_the_kept_lines_index() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate(&mut conn).unwrap();
        let found = plan(
            &conn,
            &lmsp_storage_codec::sql::for_sqlite(lmsp_storage_codec::sql::STAGED_DUPLICATES),
        );
        assert!(
            found.contains("batch_staging_custom_id (batch_id=? AND custom_id=? AND line<?)")
                && found.contains("(batch_id=?)")
                && !found.contains("TEMP B-TREE"),
            "{found}"
        );
    }

    /// The statements the fronts' triggers run on a claim seek their indexes too: the next head
    /// of a client and tier is a seek in `tasks_queue`.
    #[test]
    fn a_fronts_next_head_is_a_seek_in_the_queue_index() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate(&mut conn).unwrap();
        let next = plan(
            &conn,
            "SELECT t.id, t.created_at FROM tasks t WHERE t.status = 'queued' \
             AND t.client_id = ?1 AND t.tier = ?2 ORDER BY t.id LIMIT 1",
        );
        assert!(
            next.contains("INDEX tasks_queue (client_id=? AND tier=?)"),
            "{next}"
        );
    }

    /// Version 6 upgrades a database that version 5 filled in place: the queue fronts are filled
    /// from the tasks there (each client's heads, its running count, its `served_at` and
    /// `max_running`), so the claims that follow are `next_claim`'s over the heads of the plain
    /// list of tasks (API §16).
    #[test]
    fn version_6_fills_the_queue_fronts_of_a_database_version_5_filled() {
        use lmsp_domain::schedule::{next_claim, ClientLoad, QueueHead, ServiceTier, TierAging};
        use lmsp_domain::status::TaskStatus;
        use lmsp_storage_contract::fixtures::{client_id, instance_id, time, TaskBuilder};

        const MINUTE: i64 = 60_000;
        let mut conn = Connection::open_in_memory().unwrap();
        migrations().to_version(&mut conn, 5).unwrap();
        let owner = instance_id();
        let clients = [client_id(), client_id(), client_id()];
        let mut tasks = Vec::new();
        for n in 0..30_i64 {
            let client = clients[(n % 3) as usize];
            let tier = ServiceTier::ALL[((n / 3) % 3) as usize];
            let mut task = TaskBuilder::new(owner)
                .client(client)
                .tier(tier)
                .created(time((n * 7 % 13) * MINUTE))
                .build();
            if n % 7 == 0 {
                task.status = TaskStatus::Running;
            }
            crate::ops::insert_task_rows(&conn, &task).unwrap();
            tasks.push(task);
        }
        // The second client was served, the third may run two tasks at once.
        let mut served = std::collections::HashMap::new();
        served.insert(clients[1], time(20 * MINUTE));
        conn.execute(
            "INSERT INTO client_queues (client_id, served_at) VALUES (?1, ?2)",
            params![
                clients[1].ulid().to_bytes().as_slice(),
                time(20 * MINUTE).as_millis()
            ],
        )
        .unwrap();
        conn.execute(
            "INSERT INTO client_queues (client_id, max_running) VALUES (?1, 2)",
            params![clients[2].ulid().to_bytes().as_slice()],
        )
        .unwrap();
        migrate(&mut conn).unwrap();
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |row| row.get(0))
            .unwrap();
        assert_eq!(version, SCHEMA_VERSION as i64);
        let fronts: i64 = conn
            .query_row("SELECT count(*) FROM queue_fronts", [], |row| row.get(0))
            .unwrap();
        assert_eq!(fronts, 9, "a row per client and tier");

        let aging = TierAging::from_millis(5 * MINUTE as u64).unwrap();
        let by = instance_id();
        let now = time(21 * MINUTE);
        let claimed = |status: TaskStatus| {
            matches!(
                status,
                TaskStatus::Loading | TaskStatus::Running | TaskStatus::Cancelling
            )
        };
        loop {
            let heads: Vec<(QueueHead, ClientLoad)> = tasks
                .iter()
                .filter(|task| task.status == TaskStatus::Queued)
                .filter(|task| {
                    !tasks.iter().any(|other| {
                        other.status == TaskStatus::Queued
                            && other.client_id == task.client_id
                            && other.service_tier == task.service_tier
                            && other.id < task.id
                    })
                })
                .map(|task| {
                    let load = ClientLoad {
                        running: tasks
                            .iter()
                            .filter(|t| t.client_id == task.client_id && claimed(t.status))
                            .count() as u32,
                        max_running: (task.client_id == clients[2]).then_some(2),
                        last_served: served.get(&task.client_id).copied(),
                    };
                    let head = QueueHead {
                        task: task.id,
                        client: task.client_id,
                        tier: task.service_tier,
                        created_at: task.created_at,
                    };
                    (head, load)
                })
                .collect();
            let expected = next_claim(&heads, aging, now);
            let (got, _) = crate::ops::tasks::claim_next(&conn, by, now, aging).unwrap();
            assert_eq!(got.as_ref().map(|task| task.id), expected);
            let Some(got) = got else { break };
            served.insert(got.client_id, now);
            let known = tasks.iter_mut().find(|task| task.id == got.id).unwrap();
            *known = got;
        }
        let left = tasks
            .iter()
            .filter(|task| task.status == TaskStatus::Queued)
            .count();
        assert!(left > 0, "the third client's tasks wait at its max_running");
    }

    /// P-2, I-1 across an upgrade: version 8 keeps a request's body beside its key, and every
    /// stored task's spec and every kept batch line of a version-7 database is there after the
    /// migration, and 200 bodies of 1.1 KB take about a page per three
    /// bodies instead of one overflow page each.
    #[test]
    fn version_8_keeps_request_bodies_in_place_and_moves_the_rows_there() {
        let body = format!("{{\"input\":\"{}\"}}", "x".repeat(1_100));
        let fill = |conn: &Connection, from: i64| {
            for i in from..from + 200 {
                let key = i.to_be_bytes();
                conn.execute(
                    "INSERT INTO task_specs (task_id, spec, metadata, accepted_by, custom_id) \
                     VALUES (?1, ?2, '{}', ?1, ?3)",
                    params![key.as_slice(), body, format!("line-{i}")],
                )
                .unwrap();
                conn.execute(
                    "INSERT INTO batch_staging (batch_id, line, task_id, client_id, custom_id, \
                     model, on_restart, tier, response_id, owner, spec, metadata, created_at) \
                     VALUES (x'01', ?1, ?2, x'02', ?3, 'm', 'fail', 1, NULL, x'02', ?4, '{}', ?1)",
                    params![i, key.as_slice(), format!("line-{i}"), body],
                )
                .unwrap();
            }
        };
        let pages = |conn: &Connection| -> i64 {
            conn.query_row("PRAGMA page_count", [], |row| row.get(0))
                .unwrap()
        };
        // No foreign keys on this connection: the specs need no tasks here.
        let mut conn = Connection::open_in_memory().unwrap();
        conn.pragma_update(None, "foreign_keys", "OFF").unwrap();
        migrations().to_version(&mut conn, 7).unwrap();
        let before = pages(&conn);
        fill(&conn, 0);
        let grown_at_7 = pages(&conn) - before;
        migrate(&mut conn).unwrap();
        let count = |table: &str| -> i64 {
            conn.query_row(&format!("SELECT count(*) FROM {table}"), [], |row| {
                row.get(0)
            })
            .unwrap()
        };
        assert_eq!((count("task_specs"), count("batch_staging")), (200, 200));
        let (spec, custom_id): (String, String) = conn
            .query_row(
                "SELECT spec, custom_id FROM task_specs WHERE task_id = ?1",
                [7i64.to_be_bytes().as_slice()],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .unwrap();
        assert_eq!(
            (spec.as_str(), custom_id.as_str()),
            (body.as_str(), "line-7")
        );
        let staged: String = conn
            .query_row(
                "SELECT spec FROM batch_staging INDEXED BY batch_staging_custom_id \
                 WHERE batch_id = x'01' AND custom_id = 'line-9'",
                [],
                |row| row.get(0),
            )
            .unwrap();
        assert_eq!(staged, body);

        let before = pages(&conn);
        fill(&conn, 1_000);
        let grown_at_8 = pages(&conn) - before;
        assert!(
            grown_at_7 >= 400 && grown_at_8 * 2 < grown_at_7,
            "pages for 200 bodies in each table: {grown_at_7} at version 7, {grown_at_8} at 8"
        );
    }
}
