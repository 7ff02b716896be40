//! The tables, indexes and triggers both adapters create, written once: each function returns
//! the DDL in a [`Dialect`], whose few differences (the names of the types, SQLite's
//! `WITHOUT ROWID`, a trigger's wrapping, three functions) are explicit parameters.
//!
//! The adapters compose their migrations from these pieces and what is theirs alone (SQLite's
//! first-release layout and its data move, PostgreSQL's `file_chunks`, its functions and its
//! advisory lock); each keeps its own version numbers. The text a piece renders is the text the
//! adapter wrote before it was shared, so a database created by any build has the same schema.

/// The SQL dialect a piece of DDL is rendered in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// SQLite: every integer is `INTEGER`, bytes are `BLOB`, most tables `WITHOUT ROWID`.
    Sqlite,
    /// PostgreSQL: sized integers, `BYTEA`, triggers that execute a function.
    Postgres,
}

impl Dialect {
    /// Bytes (ids as the 16 bytes of their ULID, digests, states).
    pub const fn bytes(self) -> &'static str {
        match self {
            Dialect::Sqlite => "BLOB",
            Dialect::Postgres => "BYTEA",
        }
    }

    /// A 64-bit integer (times in Unix milliseconds, counts, sizes).
    pub const fn int64(self) -> &'static str {
        match self {
            Dialect::Sqlite => "INTEGER",
            Dialect::Postgres => "BIGINT",
        }
    }

    /// A 32-bit integer (a line, a limit, an attempt count, an HTTP status).
    pub const fn int32(self) -> &'static str {
        "INTEGER"
    }

    /// A 16-bit integer (a tier's rank).
    pub const fn int16(self) -> &'static str {
        match self {
            Dialect::Sqlite => "INTEGER",
            Dialect::Postgres => "SMALLINT",
        }
    }

    /// What follows the closing parenthesis of a table keyed by its primary key alone.
    pub const fn without_rowid(self) -> &'static str {
        match self {
            Dialect::Sqlite => " WITHOUT ROWID",
            Dialect::Postgres => "",
        }
    }

    /// A boolean column read as a condition.
    pub fn is_true(self, column: &str) -> String {
        match self {
            Dialect::Sqlite => format!("{column} = 1"),
            Dialect::Postgres => column.to_owned(),
        }
    }

    /// A condition as the integer 0 or 1.
    pub fn as_int(self, condition: &str) -> String {
        match self {
            Dialect::Sqlite => format!("({condition})"),
            Dialect::Postgres => format!("({condition})::int"),
        }
    }

    /// Bytes as lower-case hexadecimal text.
    pub fn lower_hex(self, bytes: &str) -> String {
        match self {
            Dialect::Sqlite => format!("lower(hex({bytes}))"),
            Dialect::Postgres => format!("encode({bytes}, 'hex')"),
        }
    }

    /// The 1-based position of `needle` in `text` (0 when absent).
    pub fn position(self, text: &str, needle: &str) -> String {
        match self {
            Dialect::Sqlite => format!("instr({text}, {needle})"),
            Dialect::Postgres => format!("strpos({text}, {needle})"),
        }
    }

    /// `INSERT INTO {rest}` that skips a row whose key is already there, as a statement.
    pub fn insert_or_ignore(self, rest: &str) -> String {
        match self {
            Dialect::Sqlite => format!("INSERT OR IGNORE INTO {rest};"),
            Dialect::Postgres => format!("INSERT INTO {rest}\n    ON CONFLICT DO NOTHING;"),
        }
    }

    /// `{a} IS DISTINCT FROM {b}` (NULL is a value like any other).
    pub fn distinct(self, a: &str, b: &str) -> String {
        match self {
            Dialect::Sqlite => format!("{a} IS NOT {b}"),
            Dialect::Postgres => format!("{a} IS DISTINCT FROM {b}"),
        }
    }

    /// An ascending index or sort key whose NULLs come first (SQLite's order, not PostgreSQL's).
    pub fn nulls_first(self, column: &str) -> String {
        match self {
            Dialect::Sqlite => column.to_owned(),
            Dialect::Postgres => format!("{column} NULLS FIRST"),
        }
    }

    /// A trigger body's statement that locks the rows `SELECT … FROM {rest}` reads, in its
    /// order, until the transaction ends, so that its next statements read them (and what the
    /// transactions that held them committed) afresh: in PostgreSQL `PERFORM … FOR UPDATE`; in
    /// SQLite nothing (a single writer holds the whole database).
    pub fn lock_rows(self, rest: &str) -> String {
        match self {
            Dialect::Sqlite => String::new(),
            Dialect::Postgres => format!("    PERFORM 1 FROM {rest} FOR UPDATE;\n"),
        }
    }

    /// A row trigger `name` that runs `body` (statements indented by four spaces, each ending in
    /// `;`) `event` (`AFTER UPDATE OF … ON …`) when `when` holds: in SQLite a `BEGIN … END`
    /// trigger, in PostgreSQL a trigger function `function` and the trigger that executes it.
    pub fn trigger(
        self,
        name: &str,
        function: &str,
        event: &str,
        when: &str,
        body: &str,
    ) -> String {
        match self {
            Dialect::Sqlite => {
                format!("CREATE TRIGGER {name} {event}\n    WHEN {when}\nBEGIN\n{body}\nEND;\n")
            }
            Dialect::Postgres => format!(
                "CREATE FUNCTION {function}() RETURNS trigger\nLANGUAGE plpgsql AS $fn$\nBEGIN\n\
                 {body}\n    RETURN NULL;\nEND\n$fn$;\n\
                 CREATE TRIGGER {name} {event} FOR EACH ROW\n    WHEN ({when})\n    \
                 EXECUTE FUNCTION {function}();\n"
            ),
        }
    }
}

/// `service_config`: the service's settings, one text value per key.
pub fn service_config(d: Dialect) -> String {
    let no_rowid = d.without_rowid();
    format!(
        r#"CREATE TABLE service_config (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
){no_rowid};
"#
    )
}

/// `clients` (their token hashes and scopes) and `pairings` (the pairing codes' hashes).
pub fn clients_and_pairings(d: Dialect) -> String {
    let (int64, no_rowid) = (d.int64(), d.without_rowid());
    format!(
        r#"CREATE TABLE clients (
    id         TEXT PRIMARY KEY,
    name       TEXT NOT NULL,
    token_hash TEXT NOT NULL UNIQUE,
    scopes     TEXT NOT NULL,
    created_at {int64} NOT NULL,
    revoked_at {int64}
);

CREATE TABLE pairings (
    code_hash  TEXT PRIMARY KEY,
    scopes     TEXT NOT NULL,
    created_at {int64} NOT NULL,
    expires_at {int64} NOT NULL
){no_rowid};
"#
    )
}

/// The table of models (a file, or an upstream model), named `table`.
pub fn models(d: Dialect, table: &str) -> String {
    let (int64, no_rowid) = (d.int64(), d.without_rowid());
    format!(
        r#"CREATE TABLE {table} (
    id              TEXT PRIMARY KEY,
    format          TEXT NOT NULL,
    path            TEXT,
    size_bytes      {int64},
    modified_millis {int64},
    digest          TEXT,
    upstream_model  TEXT,
    created_at      {int64} NOT NULL
){no_rowid};
"#
    )
}

/// `removed_model_files`: files whose model a user deleted, not registered again when found.
pub fn removed_model_files(d: Dialect) -> String {
    let no_rowid = d.without_rowid();
    format!(
        r#"CREATE TABLE removed_model_files (
    path TEXT PRIMARY KEY
){no_rowid};
"#
    )
}

/// `instances`: every instance that ever opened the store, with its lease.
pub fn instances(d: Dialect) -> String {
    let (bytes, int64, no_rowid) = (d.bytes(), d.int64(), d.without_rowid());
    format!(
        r#"CREATE TABLE instances (
    id           {bytes} PRIMARY KEY,
    name         TEXT NOT NULL,
    started_at   {int64} NOT NULL,
    lease_until  {int64} NOT NULL,
    retired_at   {int64},
    recovered_at {int64}
){no_rowid};
"#
    )
}

/// The indexes of `tasks` both adapters have had from their first version: by status, by
/// client, and the finished ones (the purge's).
pub const TASK_INDEXES: &str = r#"CREATE INDEX tasks_status ON tasks (status, id);
CREATE INDEX tasks_client ON tasks (client_id, id);
CREATE INDEX tasks_finished ON tasks (finished_at) WHERE finished_at IS NOT NULL;
"#;

/// The index of the tasks whose response has an id of its own (the first release's).
pub const TASKS_BY_RESPONSE: &str =
    "CREATE INDEX tasks_response ON tasks (response_id) WHERE response_id IS NOT NULL;\n";

/// `responses` (a finished task's response document) and `snapshots` (a run's engine state).
pub fn responses_and_snapshots(d: Dialect) -> String {
    let (bytes, int64, no_rowid) = (d.bytes(), d.int64(), d.without_rowid());
    format!(
        r#"CREATE TABLE responses (
    id      TEXT PRIMARY KEY,
    task_id {bytes} NOT NULL UNIQUE REFERENCES tasks (id),
    doc     TEXT NOT NULL
);

CREATE TABLE snapshots (
    task_id         {bytes} PRIMARY KEY REFERENCES tasks (id),
    sequence_number {int64} NOT NULL,
    state           {bytes} NOT NULL
){no_rowid};
"#
    )
}

/// The table of idempotency records, named `table`: `reply` is NULL while the first request is
/// pending; `held_until` set while it is being answered. Its indexes are
/// [`IDEMPOTENCY_INDEXES`].
pub fn idempotency_keys(d: Dialect, table: &str) -> String {
    let (bytes, int64, no_rowid) = (d.bytes(), d.int64(), d.without_rowid());
    format!(
        r#"CREATE TABLE {table} (
    client_id  {bytes} NOT NULL,
    operation  TEXT NOT NULL,
    key        TEXT NOT NULL,
    digest     {bytes} NOT NULL,
    reply      {bytes},
    reply_task {bytes} REFERENCES tasks (id),
    held_until {int64},
    held_by    {bytes},
    created_at {int64} NOT NULL,
    expires_at {int64} NOT NULL,
    PRIMARY KEY (client_id, operation, key)
){no_rowid};
"#
    )
}

/// The indexes of `idempotency_keys`: by expiry, by the task a reply names, by holder.
pub const IDEMPOTENCY_INDEXES: &str = r#"CREATE INDEX idempotency_expiry ON idempotency_keys (expires_at);
CREATE INDEX idempotency_task ON idempotency_keys (reply_task) WHERE reply_task IS NOT NULL;
CREATE INDEX idempotency_holder ON idempotency_keys (held_by) WHERE held_by IS NOT NULL;
"#;

/// Service tiers and fairness between clients. A task keeps its tier's rank (`priority` 0,
/// `default` 1, `flex` 2; rows written before are `default`); `client_queues` holds, per client
/// (keyed like `tasks.client_id`), when one of its tasks was last claimed and its limits
/// (`NULL`: none). Two partial indexes serve a claim: each client's queued tasks by tier and age
/// (the queue heads), and each client's claimed, unfinished tasks (its load).
pub fn tiers_and_fairness(d: Dialect) -> String {
    let (bytes, int64, int32, int16) = (d.bytes(), d.int64(), d.int32(), d.int16());
    let no_rowid = d.without_rowid();
    format!(
        r#"ALTER TABLE tasks ADD COLUMN tier {int16} NOT NULL DEFAULT 1;
CREATE INDEX tasks_queue ON tasks (client_id, tier, id) WHERE status = 'queued';
CREATE INDEX tasks_active ON tasks (client_id) WHERE status IN ('loading', 'running', 'cancelling');
CREATE TABLE client_queues (
    client_id   {bytes} PRIMARY KEY,
    served_at   {int64},
    max_running {int32},
    max_queued  {int32}
){no_rowid};
"#
    )
}

/// The `batch_staging` table (a validating batch's kept lines) named `name`, its closing
/// parenthesis followed by `end` (`Dialect::without_rowid`, or nothing for a rowid table: SQLite
/// schema 8 rebuilds it as one, since a `WITHOUT ROWID` row keeps only about 1 000 bytes in place).
pub fn batch_staging(d: Dialect, name: &str, end: &str) -> String {
    let (bytes, int64, int32, int16) = (d.bytes(), d.int64(), d.int32(), d.int16());
    format!(
        r#"CREATE TABLE {name} (
    batch_id    {bytes} NOT NULL,
    line        {int32} NOT NULL,
    task_id     {bytes} NOT NULL,
    client_id   {bytes} NOT NULL,
    custom_id   TEXT NOT NULL,
    model       TEXT NOT NULL,
    on_restart  TEXT NOT NULL,
    tier        {int16} NOT NULL,
    response_id TEXT,
    owner       {bytes} NOT NULL,
    spec        TEXT NOT NULL,
    metadata    TEXT NOT NULL,
    created_at  {int64} NOT NULL,
    PRIMARY KEY (batch_id, line)
){end}"#
    )
}

/// Files and batches. A batch's tasks name it and their line (`tasks.batch_id`, `batch_line`,
/// `task_specs.custom_id`); `files` holds the records of uploaded and written files (where their
/// bytes are is the adapter's); `batches` the batches (`endpoint`: `/v1/responses` or
/// `/v1/chat/completions`; `completion_window` in milliseconds; `status`:
/// `BatchStatus::as_str`; `errors`: a JSON array of {code, message, param, line}, NULL when
/// there is none; `metadata`: the codec's metadata text); `batch_staging` keeps a validating
/// batch's tasks aside until they are all created at once.
///
/// The trigger `batch_counts` keeps each batch's counts in the same transaction as each of its
/// tasks' ends, on every write path that moves a task (a step, a cancel, a recovery cell), as
/// the domain's `batch::counted` says: a completed task counts as `completed`, a failed or
/// cancelled one as `failed`. It fires per row, once, on the move from an unfinished status to a
/// finished one.
pub fn files_and_batches(d: Dialect) -> String {
    let (bytes, int64, int32) = (d.bytes(), d.int64(), d.int32());
    let no_rowid = d.without_rowid();
    let staging = batch_staging(d, "batch_staging", no_rowid);
    let counts = d.trigger(
        "batch_counts",
        "lmsp_batch_counts",
        "AFTER UPDATE OF status ON tasks",
        "NEW.batch_id IS NOT NULL
        AND OLD.status IN ('queued', 'loading', 'running', 'cancelling')
        AND NEW.status IN ('completed', 'failed', 'cancelled')",
        &format!(
            "    UPDATE batches SET completed = completed + {},
        failed = failed + {}
    WHERE id = NEW.batch_id;",
            d.as_int("NEW.status = 'completed'"),
            d.as_int("NEW.status <> 'completed'"),
        ),
    );
    format!(
        r#"ALTER TABLE tasks ADD COLUMN batch_id {bytes};
ALTER TABLE tasks ADD COLUMN batch_line {int32};
ALTER TABLE task_specs ADD COLUMN custom_id TEXT;
CREATE INDEX tasks_batch ON tasks (batch_id, batch_line) WHERE batch_id IS NOT NULL;
CREATE TABLE files (
    id         {bytes} PRIMARY KEY,
    client_id  {bytes} NOT NULL,
    filename   TEXT NOT NULL,
    purpose    TEXT NOT NULL,
    bytes      {int64} NOT NULL,
    digest     TEXT NOT NULL,
    created_at {int64} NOT NULL,
    batch_id   {bytes}
){no_rowid};
CREATE INDEX files_client ON files (client_id, id);
CREATE TABLE batches (
    id                {bytes} PRIMARY KEY,
    client_id         {bytes} NOT NULL,
    endpoint          TEXT NOT NULL,
    input_file_id     {bytes} NOT NULL,
    completion_window {int64} NOT NULL,
    status            TEXT NOT NULL,
    output_file_id    {bytes},
    error_file_id     {bytes},
    errors            TEXT,
    total             {int64} NOT NULL DEFAULT 0,
    completed         {int64} NOT NULL DEFAULT 0,
    failed            {int64} NOT NULL DEFAULT 0,
    metadata          TEXT NOT NULL,
    created_at        {int64} NOT NULL,
    in_progress_at    {int64},
    failed_at         {int64},
    finalizing_at     {int64},
    completed_at      {int64},
    expired_at        {int64},
    cancelling_at     {int64},
    cancelled_at      {int64}
){no_rowid};
CREATE INDEX batches_client ON batches (client_id, id);
CREATE INDEX batches_unfinished ON batches (id)
    WHERE status IN ('validating', 'in_progress', 'finalizing', 'cancelling');
CREATE INDEX batches_input ON batches (input_file_id);
{staging};
{counts}"#
    )
}

/// Webhooks. `webhook_endpoints` holds the endpoints (`event_types`: the names between single
/// spaces, with a space before the first and after the last, so that a trigger finds one by its
/// position); `webhook_deliveries` is the outbox, one row per event and endpoint,
/// `leased_until` set while a deliverer holds it.
///
/// The two triggers record an event's deliveries, one per endpoint subscribed to it then, due at
/// once, in the same transaction as the end they announce (an event is never lost, and never
/// announces an end that was rolled back), on every write path that moves a task or a batch:
/// `webhook_task_events` as the domain's `webhooks::task_event` (a background response's task
/// that completed, failed or was cancelled), `webhook_batch_events` as `webhooks::batch_event`
/// (a batch that ended; the event's time is the end's). Each fires per row, once, on the move
/// from an unfinished status to a finished one; the event id is `evt_` and the subject's 32
/// lower-case hex digits, as `webhooks::event_id` writes it.
pub fn webhooks(d: Dialect) -> String {
    let (bytes, int64, int32, no_rowid) = (d.bytes(), d.int64(), d.int32(), d.without_rowid());
    // `times`: the delivery's `created_at` and `next_attempt_at`, both the end's time.
    let deliveries = |kind: &str, times: &str| {
        let position = d.position("e.event_types", &format!("' {kind}.' || NEW.status || ' '"));
        let insert = d.insert_or_ignore(&format!(
            "webhook_deliveries
        (endpoint_id, event_id, event_type, subject, created_at, next_attempt_at)
    SELECT e.id, 'evt_' || {hex}, '{kind}.' || NEW.status, NEW.id,
        {times}
    FROM webhook_endpoints e
    WHERE {position} > 0",
            hex = d.lower_hex("NEW.id"),
        ));
        format!("    {insert}")
    };
    let task_events = d.trigger(
        "webhook_task_events",
        "lmsp_webhook_task_event",
        "AFTER UPDATE OF status ON tasks",
        &format!(
            "{}
        AND OLD.status IN ('queued', 'loading', 'running', 'cancelling')
        AND NEW.status IN ('completed', 'failed', 'cancelled')",
            d.is_true("NEW.background")
        ),
        &deliveries(
            "response",
            "coalesce(NEW.finished_at, 0), coalesce(NEW.finished_at, 0)",
        ),
    );
    let batch_events = d.trigger(
        "webhook_batch_events",
        "lmsp_webhook_batch_event",
        "AFTER UPDATE OF status ON batches",
        "OLD.status IN ('validating', 'in_progress', 'finalizing', 'cancelling')
        AND NEW.status IN ('completed', 'failed', 'cancelled', 'expired')",
        &deliveries(
            "batch",
            "coalesce(NEW.completed_at, NEW.failed_at, NEW.cancelled_at, NEW.expired_at, 0),
        coalesce(NEW.completed_at, NEW.failed_at, NEW.cancelled_at, NEW.expired_at, 0)",
        ),
    );
    format!(
        r#"CREATE TABLE webhook_endpoints (
    id                   {bytes} PRIMARY KEY,
    name                 TEXT NOT NULL,
    url                  TEXT NOT NULL,
    event_types          TEXT NOT NULL,
    secret               TEXT NOT NULL,
    previous_secret      TEXT,
    previous_valid_until {int64},
    created_at           {int64} NOT NULL,
    updated_at           {int64} NOT NULL
){no_rowid};
CREATE TABLE webhook_deliveries (
    endpoint_id     {bytes} NOT NULL,
    event_id        TEXT NOT NULL,
    event_type      TEXT NOT NULL,
    subject         {bytes} NOT NULL,
    created_at      {int64} NOT NULL,
    attempts        {int32} NOT NULL DEFAULT 0,
    next_attempt_at {int64},
    leased_until    {int64},
    last_status     {int32},
    last_error      TEXT,
    last_attempt_at {int64},
    delivered_at    {int64},
    given_up_at     {int64},
    PRIMARY KEY (endpoint_id, event_id)
){no_rowid};
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at)
    WHERE next_attempt_at IS NOT NULL;
CREATE INDEX webhook_deliveries_recent ON webhook_deliveries (endpoint_id, created_at);
{task_events}{batch_events}"#
    )
}

/// The statuses of a claimed, unfinished task: a client's running tasks.
const ACTIVE: &str = "('loading', 'running', 'cancelling')";

/// The condition of an *open* queue front: one with a queued head whose client may start
/// another task (`ClientLoad::may_start`). The claim indexes hold only these; a claim's queries
/// repeat it word for word so that both SQLite and PostgreSQL use them.
pub const OPEN_FRONT: &str =
    "head_id IS NOT NULL AND (max_running IS NULL OR running < max_running)";

/// Queue fronts: what a claim reads instead of every client's queue heads, so that its cost does
/// not grow with the number of clients with queued work (issue 25).
///
/// `queue_fronts` has one row per client and tier, for every client that has had a queued or
/// claimed task (or limits, or a claim): `head_id` and `head_created_at` are its oldest queued
/// task of that tier (by id, as `tasks_queue` orders them; NULL when it has none), `running`,
/// `served_at` and `max_running` a copy of the client's load (its `loading`, `running` and
/// `cancelling` tasks; `client_queues`' columns). A client's rows are never deleted, so every
/// write that moves one of its tasks finds them, whichever transaction created them.
///
/// Two partial indexes hold the open fronts (`OPEN_FRONT`): `queue_fronts_claim` in claim order
/// within a tier (fewest running, least recently served with never first, oldest head; it also
/// carries the head's creation time and `max_running`, so that a claim that walks past the heads
/// too young for an aged tier reads only the index), and `queue_fronts_age` by the head's age
/// within a tier (`lmsp_domain::schedule::claim_window`'s input). This is the layout of SQLite's
/// schema version 6; its version 9 makes `queue_fronts_age` hold every front with a head, since
/// a condition that reads `running` had every claim and end rewrite three of its entries.
///
/// Triggers keep them in the transaction of every write, on every write path (a create, a batch's
/// bulk insert, a claim, a step that ends a task, a cancel, recovery's requeues and failures, a
/// purge, a client's limits, a claim's `served_at`), so no caller needs to know of them:
///
/// - `queue_fronts_task_insert`: a queued or claimed task inserted (its client's rows first made
///   if missing): its client's running count, or its tier's head if it is older than the head.
/// - `queue_fronts_task_status`: a task's status moving into or out of `queued` or the claimed
///   set: its client's running count; a head that left the queue is replaced by the next queued
///   task of its client and tier (an index seek in `tasks_queue`); a task back in the queue
///   (recovery) becomes the head if it is older.
/// - `queue_fronts_task_delete`: a queued or claimed task deleted (a purge deletes only finished
///   ones; kept for any other path).
/// - `queue_fronts_load_insert` and `queue_fronts_load_update`: a client's `served_at` or
///   `max_running` copied to its rows (made if missing).
///
/// In PostgreSQL each trigger first locks the client's rows it changes (in tier order), then
/// reads what it writes in statements of its own: so a transaction that replaces a head sees
/// the tasks that a concurrent one, committed meanwhile, queued or claimed, and a head never
/// points at a task that is no longer queued.
///
/// The migration fills the rows from the tasks already there.
pub fn queue_fronts(d: Dialect) -> String {
    let (bytes, int64, int32, int16, no_rowid) = (
        d.bytes(),
        d.int64(),
        d.int32(),
        d.int16(),
        d.without_rowid(),
    );
    let served_first = d.nulls_first("served_at");
    let tiers = "(SELECT 0 AS tier UNION ALL SELECT 1 UNION ALL SELECT 2) AS r";
    // The rows of client `{row}.client_id`, made if missing, with its load as `client_queues`
    // keeps it (a client with no rows yet has no claimed task).
    let ensure = |row: &str, served: &str, max: &str| {
        let insert = d.insert_or_ignore(&format!(
            "queue_fronts (client_id, tier, running, served_at, max_running)
        SELECT {row}.client_id, r.tier, 0, {served}, {max}
        FROM {tiers}
        WHERE NOT EXISTS (SELECT 1 FROM queue_fronts f WHERE f.client_id = {row}.client_id)"
        ));
        format!("    {insert}\n")
    };
    let lock_client = |row: &str| {
        d.lock_rows(&format!(
            "queue_fronts WHERE client_id = {row}.client_id ORDER BY tier"
        ))
    };
    let is_active = |row: &str| d.as_int(&format!("{row}.status IN {ACTIVE}"));
    // The head of `{row}`'s client and tier again, when it was `{row}`.
    let next_head = |row: &str| {
        format!(
            "    UPDATE queue_fronts SET (head_id, head_created_at) = (
        SELECT t.id, t.created_at FROM tasks t
        WHERE t.status = 'queued' AND t.client_id = {row}.client_id AND t.tier = {row}.tier
        ORDER BY t.id LIMIT 1)
    WHERE client_id = {row}.client_id AND tier = {row}.tier AND {row}.status = 'queued'
        AND head_id = {row}.id;\n"
        )
    };
    // `NEW` as its client and tier's head, when it is queued and older than the head.
    let new_head = "    UPDATE queue_fronts SET head_id = NEW.id, head_created_at = NEW.created_at
    WHERE client_id = NEW.client_id AND tier = NEW.tier AND NEW.status = 'queued'
        AND (head_id IS NULL OR head_id > NEW.id);\n";
    let task_insert = d.trigger(
        "queue_fronts_task_insert",
        "lmsp_queue_fronts_task_insert",
        "AFTER INSERT ON tasks",
        &format!("NEW.status = 'queued' OR NEW.status IN {ACTIVE}"),
        format!(
            "{ensure}{lock_client}    UPDATE queue_fronts SET running = running + 1
    WHERE client_id = NEW.client_id AND NEW.status IN {ACTIVE};
{new_head}",
            ensure = ensure(
                "NEW",
                "(SELECT q.served_at FROM client_queues q WHERE q.client_id = NEW.client_id)",
                "(SELECT q.max_running FROM client_queues q WHERE q.client_id = NEW.client_id)",
            ),
            lock_client = lock_client("NEW"),
        )
        .trim_end(),
    );
    let task_status = d.trigger(
        "queue_fronts_task_status",
        "lmsp_queue_fronts_task_status",
        "AFTER UPDATE OF status ON tasks",
        &format!(
            "OLD.status <> NEW.status
        AND (OLD.status = 'queued' OR NEW.status = 'queued'
            OR OLD.status IN {ACTIVE} OR NEW.status IN {ACTIVE})"
        ),
        format!(
            "{lock_client}    UPDATE queue_fronts SET running = running + {new_active} - {old_active}
    WHERE client_id = NEW.client_id AND {new_active} <> {old_active};
{next_head}{new_head}",
            lock_client = lock_client("NEW"),
            new_active = is_active("NEW"),
            old_active = is_active("OLD"),
            next_head = next_head("OLD"),
        )
        .trim_end(),
    );
    let task_delete = d.trigger(
        "queue_fronts_task_delete",
        "lmsp_queue_fronts_task_delete",
        "AFTER DELETE ON tasks",
        &format!("OLD.status = 'queued' OR OLD.status IN {ACTIVE}"),
        format!(
            "{lock_client}    UPDATE queue_fronts SET running = running - 1
    WHERE client_id = OLD.client_id AND OLD.status IN {ACTIVE};
{next_head}",
            lock_client = lock_client("OLD"),
            next_head = next_head("OLD"),
        )
        .trim_end(),
    );
    let load_body = format!(
        "{ensure}{lock_client}    UPDATE queue_fronts SET served_at = NEW.served_at, max_running = NEW.max_running
    WHERE client_id = NEW.client_id;",
        ensure = ensure("NEW", "NEW.served_at", "NEW.max_running"),
        lock_client = lock_client("NEW"),
    );
    let load_insert = d.trigger(
        "queue_fronts_load_insert",
        "lmsp_queue_fronts_load_insert",
        "AFTER INSERT ON client_queues",
        "NEW.served_at IS NOT NULL OR NEW.max_running IS NOT NULL",
        &load_body,
    );
    let load_update = d.trigger(
        "queue_fronts_load_update",
        "lmsp_queue_fronts_load_update",
        "AFTER UPDATE OF served_at, max_running ON client_queues",
        &format!(
            "{} OR {}",
            d.distinct("OLD.served_at", "NEW.served_at"),
            d.distinct("OLD.max_running", "NEW.max_running")
        ),
        &load_body,
    );
    format!(
        r#"CREATE TABLE queue_fronts (
    client_id       {bytes} NOT NULL,
    tier            {int16} NOT NULL,
    head_id         {bytes},
    head_created_at {int64},
    running         {int32} NOT NULL DEFAULT 0,
    served_at       {int64},
    max_running     {int32},
    PRIMARY KEY (client_id, tier)
){no_rowid};
INSERT INTO queue_fronts (client_id, tier, running, served_at, max_running)
    SELECT c.client_id, r.tier,
        (SELECT count(*) FROM tasks a WHERE a.client_id = c.client_id AND a.status IN {ACTIVE}),
        q.served_at, q.max_running
    FROM (SELECT DISTINCT client_id FROM tasks
          UNION SELECT client_id FROM client_queues) AS c
    CROSS JOIN {tiers}
    LEFT JOIN client_queues q ON q.client_id = c.client_id;
UPDATE queue_fronts SET (head_id, head_created_at) = (
    SELECT t.id, t.created_at FROM tasks t
    WHERE t.status = 'queued' AND t.client_id = queue_fronts.client_id
        AND t.tier = queue_fronts.tier
    ORDER BY t.id LIMIT 1);
CREATE INDEX queue_fronts_claim
    ON queue_fronts (tier, running, {served_first}, head_id, head_created_at, max_running)
    WHERE {OPEN_FRONT};
CREATE INDEX queue_fronts_age ON queue_fronts (tier, head_created_at)
    WHERE {OPEN_FRONT};
{task_insert}{task_status}{task_delete}{load_insert}{load_update}"#
    )
}

/// Batch lines kept apart, two indexes:
///
/// - `batch_staging_custom_id` finds a validating batch's kept lines by `custom_id`
///   (`sql::STAGED_DUPLICATES`): a batch's `custom_id`s are checked unique in the store, so that
///   validation's memory does not grow with the file;
/// - `tasks_queued_direct` holds the queued tasks submitted one by one (no batch), which the
///   queue limits count (`max_queued` of a client, `--max-queued` of the service): a batch's
///   lines never make another request wait for a place, and the count never reads past them.
pub const BATCH_LINES_APART: &str =
    "CREATE INDEX batch_staging_custom_id ON batch_staging (batch_id, custom_id, line);
CREATE INDEX tasks_queued_direct ON tasks (client_id) WHERE status = 'queued' AND batch_id IS NULL;";

#[cfg(test)]
mod tests {
    use super::*;

    fn all(d: Dialect) -> String {
        [
            service_config(d),
            clients_and_pairings(d),
            models(d, "models"),
            removed_model_files(d),
            instances(d),
            TASK_INDEXES.to_owned(),
            TASKS_BY_RESPONSE.to_owned(),
            responses_and_snapshots(d),
            idempotency_keys(d, "idempotency_keys"),
            IDEMPOTENCY_INDEXES.to_owned(),
            tiers_and_fairness(d),
            files_and_batches(d),
            webhooks(d),
            queue_fronts(d),
        ]
        .concat()
    }

    #[test]
    fn each_dialect_names_only_its_own_types_and_functions() {
        let sqlite = all(Dialect::Sqlite);
        let postgres = all(Dialect::Postgres);
        for foreign in [
            "BYTEA",
            "BIGINT",
            "SMALLINT",
            "strpos",
            "encode(",
            "ON CONFLICT",
            "$fn$",
        ] {
            assert!(!sqlite.contains(foreign), "{foreign} in SQLite's DDL");
        }
        for foreign in [
            "BLOB",
            "WITHOUT ROWID",
            "instr(",
            "hex(",
            "OR IGNORE",
            "\nEND;",
        ] {
            assert!(!postgres.contains(foreign), "{foreign} in PostgreSQL's DDL");
        }
        for ddl in [&sqlite, &postgres] {
            assert!(!ddl.contains('{'), "an unfilled parameter");
        }
    }

    #[test]
    fn a_trigger_is_wrapped_per_dialect() {
        let body = "    UPDATE t SET n = n + 1;";
        assert_eq!(
            Dialect::Sqlite.trigger(
                "t_n",
                "lmsp_t_n",
                "AFTER UPDATE OF s ON u",
                "NEW.s = 1",
                body
            ),
            "CREATE TRIGGER t_n AFTER UPDATE OF s ON u\n    WHEN NEW.s = 1\nBEGIN\n    \
             UPDATE t SET n = n + 1;\nEND;\n"
        );
        assert_eq!(
            Dialect::Postgres.trigger(
                "t_n",
                "lmsp_t_n",
                "AFTER UPDATE OF s ON u",
                "NEW.s = 1",
                body
            ),
            "CREATE FUNCTION lmsp_t_n() RETURNS trigger\nLANGUAGE plpgsql AS $fn$\nBEGIN\n    \
             UPDATE t SET n = n + 1;\n    RETURN NULL;\nEND\n$fn$;\n\
             CREATE TRIGGER t_n AFTER UPDATE OF s ON u FOR EACH ROW\n    WHEN (NEW.s = 1)\n    \
             EXECUTE FUNCTION lmsp_t_n();\n"
        );
    }
}
