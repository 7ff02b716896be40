//! Statements both adapters run word for word, written once with PostgreSQL's placeholders
//! (`$1`, `$2`, …). The SQLite adapter runs them through [`for_sqlite`], which writes each `$N`
//! as `?N` (in SQLite `$1` would be a *named* parameter, numbered by its first appearance, not by
//! its digits). Binding the values stays each adapter's: the drivers want different Rust types.
//!
//! Only statements that mean the same in both databases are here; where one adapter locks what
//! it reads (`FOR UPDATE`), upserts differently or batches, the statement stays in the adapter.

use lmsp_domain::batch::BatchStatus;

use crate::batches::{BATCH_COLUMNS, FILE_COLUMNS};
use crate::records::{CLIENT_COLUMNS, IDEMPOTENCY_COLUMNS, MODEL_COLUMNS};
use crate::rows::{TASK_COLUMNS, TASK_FROM};
use crate::webhooks::{DELIVERY_COLUMNS, ENDPOINT_COLUMNS};

/// `sql` with every `$N` placeholder outside a string literal written as `?N`.
pub fn for_sqlite(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut chars = sql.chars().peekable();
    let mut in_literal = false;
    while let Some(c) = chars.next() {
        if c == '\'' {
            // A doubled quote inside a literal closes and reopens it: the state comes back.
            in_literal = !in_literal;
        }
        if c == '$' && !in_literal && chars.peek().is_some_and(char::is_ascii_digit) {
            out.push('?');
        } else {
            out.push(c);
        }
    }
    out
}

/// Stores an event of task `$1`: sequence number `$2`, kind `$3`, created at `$4`, data `$5`,
/// item `$6` (the values of an [`crate::EventRow`]).
pub const INSERT_EVENT: &str = "INSERT INTO task_events (task_id, sequence_number, kind, \
     created_at, data, item) VALUES ($1, $2, $3, $4, $5, $6)";

/// Removes up to `$2` idempotency records that expired by `$1`; `pick` is how the store picks
/// them, after `WHERE expires_at <= $1` (PostgreSQL orders them and skips the locked ones).
pub fn purge_expired_keys(pick: &str) -> String {
    format!(
        "DELETE FROM idempotency_keys WHERE (client_id, operation, key) IN \
         (SELECT client_id, operation, key FROM idempotency_keys WHERE expires_at <= $1 {pick})"
    )
}

/// The statuses of a batch that has not ended ([`BatchStatus::UNFINISHED`]) as an SQL list of
/// literals (`'validating', …`): literal, so that a partial index on them serves the query
/// (SQLite uses a partial index only for a query whose condition implies the index's).
pub fn unfinished_batch_statuses() -> String {
    BatchStatus::UNFINISHED
        .map(|status| format!("'{}'", status.as_str()))
        .join(", ")
}

/// Stores a client: its row's six values, in `CLIENT_COLUMNS` order.
pub const INSERT_CLIENT: &str = "INSERT INTO clients (id, name, token_hash, scopes, created_at, \
     revoked_at) VALUES ($1, $2, $3, $4, $5, $6)";

/// The unrevoked client with a token hash (`$1`).
pub fn client_by_token_hash() -> String {
    format!("SELECT {CLIENT_COLUMNS} FROM clients WHERE token_hash = $1 AND revoked_at IS NULL")
}

/// A task by id (`$1`), its [`TASK_COLUMNS`].
pub fn task_by_id() -> String {
    format!("SELECT {TASK_COLUMNS} FROM {TASK_FROM} WHERE t.id = $1")
}

/// The task that stored response id `$1` with it (`tasks.response_id`), its [`TASK_COLUMNS`].
pub fn task_by_stored_response() -> String {
    format!("SELECT {TASK_COLUMNS} FROM {TASK_FROM} WHERE t.response_id = $1")
}

/// A client by id (`$1`).
pub fn client_by_id() -> String {
    format!("SELECT {CLIENT_COLUMNS} FROM clients WHERE id = $1")
}

/// Every client, oldest first.
pub fn all_clients() -> String {
    format!("SELECT {CLIENT_COLUMNS} FROM clients ORDER BY created_at, id")
}

/// Revokes client `$2` at `$1`, unless it was revoked already.
pub const REVOKE_CLIENT: &str =
    "UPDATE clients SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL";

/// Whether client `$1` exists.
pub const CLIENT_EXISTS: &str = "SELECT 1 FROM clients WHERE id = $1";

/// A client's limits (`client_queues` keyed by `$1`).
pub const CLIENT_LIMITS: &str =
    "SELECT max_running, max_queued FROM client_queues WHERE client_id = $1";

/// Replaces client `$1`'s limits with `$2` (running) and `$3` (queued).
pub const SET_CLIENT_LIMITS: &str = "INSERT INTO client_queues (client_id, max_running, \
     max_queued) VALUES ($1, $2, $3) ON CONFLICT (client_id) DO UPDATE SET \
     max_running = excluded.max_running, max_queued = excluded.max_queued";

/// Uses up the pairing code with hash `$1`.
pub const DELETE_PAIRING: &str = "DELETE FROM pairings WHERE code_hash = $1";

/// Burns every outstanding pairing code (the failure that made the pairing limit).
pub const DELETE_PAIRINGS: &str = "DELETE FROM pairings";

/// The scopes of the pairing code with hash `$1` unless it expired by `$2`. PostgreSQL locks it
/// (`FOR UPDATE` after this text).
pub const PAIRING_SCOPES: &str =
    "SELECT scopes FROM pairings WHERE code_hash = $1 AND expires_at > $2";

/// The `service_config` value under key `$1`. PostgreSQL locks it (`FOR UPDATE` after this
/// text) where a write follows.
pub const CONFIG_VALUE: &str = "SELECT value FROM service_config WHERE key = $1";

/// Stores `$2` as the `service_config` value under key `$1`, replacing what was there.
pub const SET_CONFIG_VALUE: &str = "INSERT INTO service_config (key, value) VALUES ($1, $2) \
     ON CONFLICT (key) DO UPDATE SET value = excluded.value";

/// The idempotency record under client `$1`, operation `$2` and key `$3`: its
/// [`IDEMPOTENCY_COLUMNS`]. PostgreSQL locks it (`FOR UPDATE` after this text).
pub fn idempotency_record() -> String {
    format!(
        "SELECT {IDEMPOTENCY_COLUMNS} FROM idempotency_keys \
         WHERE client_id = $1 AND operation = $2 AND key = $3"
    )
}

/// Stores an idempotency record: client `$1`, operation `$2`, key `$3`, then its row's values
/// in [`IDEMPOTENCY_COLUMNS`] order (`$4…$10`). A record stored under the key already is
/// replaced when `replace`, else left as it is (and the statement changes no row).
pub fn put_idempotency_record(replace: bool) -> String {
    let conflict = if replace {
        "DO UPDATE SET digest = EXCLUDED.digest, reply = EXCLUDED.reply, \
         reply_task = EXCLUDED.reply_task, held_until = EXCLUDED.held_until, \
         held_by = EXCLUDED.held_by, created_at = EXCLUDED.created_at, \
         expires_at = EXCLUDED.expires_at"
    } else {
        "DO NOTHING"
    };
    format!(
        "INSERT INTO idempotency_keys (client_id, operation, key, {IDEMPOTENCY_COLUMNS}) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) \
         ON CONFLICT (client_id, operation, key) {conflict}"
    )
}

/// Ends a key's hold, first step: its record goes if it is pending (client `$1`, operation
/// `$2`, key `$3`).
pub const DELETE_PENDING_KEY: &str = "DELETE FROM idempotency_keys \
     WHERE client_id = $1 AND operation = $2 AND key = $3 AND reply IS NULL";

/// Ends a key's hold, second step: an answered record stays, unheld.
pub const UNHOLD_KEY: &str = "UPDATE idempotency_keys SET held_until = NULL, held_by = NULL \
     WHERE client_id = $1 AND operation = $2 AND key = $3";

/// Ends the holds of instance `$1`, first step: its pending records go.
pub const DELETE_PENDING_KEYS_OF: &str =
    "DELETE FROM idempotency_keys WHERE held_by = $1 AND reply IS NULL";

/// Ends the holds of instance `$1`, second step: its answered records stay, unheld.
pub const UNHOLD_KEYS_OF: &str =
    "UPDATE idempotency_keys SET held_until = NULL, held_by = NULL WHERE held_by = $1";

/// Stores a model (its row's eight values, in [`MODEL_COLUMNS`] order) unless its id exists.
pub fn insert_model() -> String {
    format!(
        "INSERT INTO models ({MODEL_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
         ON CONFLICT (id) DO NOTHING"
    )
}

/// A model by id (`$1`). PostgreSQL locks it (`FOR UPDATE` after this text) when it deletes it.
pub fn model_by_id() -> String {
    format!("SELECT {MODEL_COLUMNS} FROM models WHERE id = $1")
}

/// Every model, by id.
pub fn all_models() -> String {
    format!("SELECT {MODEL_COLUMNS} FROM models ORDER BY id")
}

/// Deletes model `$1`.
pub const DELETE_MODEL: &str = "DELETE FROM models WHERE id = $1";

/// Records model `$5`'s new fingerprint: path `$1`, size `$2`, modification time `$3`, digest
/// `$4` (never an upstream model's).
pub const UPDATE_MODEL_FILE: &str = "UPDATE models SET path = $1, size_bytes = $2, \
     modified_millis = $3, digest = $4 WHERE id = $5 AND upstream_model IS NULL";

/// Whether the model at path `$1` was deleted by a user (then it is not registered again when
/// found). PostgreSQL share-locks the row (`FOR SHARE` after this text).
pub const REMOVED_MODEL_FILE: &str = "SELECT 1 FROM removed_model_files WHERE path = $1";

/// Remembers that the model at path `$1` was deleted.
pub const REMEMBER_REMOVED_MODEL_FILE: &str =
    "INSERT INTO removed_model_files (path) VALUES ($1) ON CONFLICT (path) DO NOTHING";

/// Forgets that the model at path `$1` was deleted (a model registered there again).
pub const FORGET_REMOVED_MODEL_FILE: &str = "DELETE FROM removed_model_files WHERE path = $1";

/// Stores a webhook endpoint: its row's nine values, in [`ENDPOINT_COLUMNS`] order.
pub fn insert_endpoint() -> String {
    format!(
        "INSERT INTO webhook_endpoints ({ENDPOINT_COLUMNS}) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"
    )
}

/// A webhook endpoint by id (`$1`).
pub fn endpoint_by_id() -> String {
    format!("SELECT {ENDPOINT_COLUMNS} FROM webhook_endpoints WHERE id = $1")
}

/// Webhook endpoints, newest first, at most `$1`.
pub fn newest_endpoints() -> String {
    format!("SELECT {ENDPOINT_COLUMNS} FROM webhook_endpoints ORDER BY id DESC LIMIT $1")
}

/// Webhook endpoints older than `$1`, newest first, at most `$2`.
pub fn endpoints_before() -> String {
    format!(
        "SELECT {ENDPOINT_COLUMNS} FROM webhook_endpoints WHERE id < $1 \
         ORDER BY id DESC LIMIT $2"
    )
}

/// Rewrites endpoint `$1`: name `$2`, URL `$3`, event types `$4`, secret `$5`, previous secret
/// `$6` and until when it is valid `$7`, the update's time `$8`.
pub const UPDATE_ENDPOINT: &str = "UPDATE webhook_endpoints SET name = $2, url = $3, \
     event_types = $4, secret = $5, previous_secret = $6, previous_valid_until = $7, \
     updated_at = $8 WHERE id = $1";

/// Removes endpoint `$1`.
pub const DELETE_ENDPOINT: &str = "DELETE FROM webhook_endpoints WHERE id = $1";

/// Removes the deliveries of endpoint `$1`.
pub const DELETE_ENDPOINT_DELIVERIES: &str =
    "DELETE FROM webhook_deliveries WHERE endpoint_id = $1";

/// Stores delivery (`$1` endpoint, `$2` event) after an attempt and ends its lease: attempts
/// `$3`, next attempt `$4`, last status `$5`, last error `$6`, last attempt `$7`, delivered `$8`,
/// given up `$9`.
pub const RECORD_ATTEMPT: &str = "UPDATE webhook_deliveries SET attempts = $3, \
     next_attempt_at = $4, last_status = $5, last_error = $6, last_attempt_at = $7, \
     delivered_at = $8, given_up_at = $9, leased_until = NULL \
     WHERE endpoint_id = $1 AND event_id = $2";

/// Endpoint `$1`'s deliveries, the most recent event first, at most `$2`.
pub fn deliveries_of() -> String {
    format!(
        "SELECT {DELIVERY_COLUMNS} FROM webhook_deliveries WHERE endpoint_id = $1 \
         ORDER BY created_at DESC, event_id DESC LIMIT $2"
    )
}

/// Stores a file's record: its row's eight values, in [`FILE_COLUMNS`] order.
pub fn insert_file() -> String {
    format!("INSERT INTO files ({FILE_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)")
}

/// A file's record by id (`$1`).
pub fn file_by_id() -> String {
    format!("SELECT {FILE_COLUMNS} FROM files WHERE id = $1")
}

/// Removes file `$1`'s record.
pub const DELETE_FILE: &str = "DELETE FROM files WHERE id = $1";

/// Stores a new batch: its row's 21 values, in [`BATCH_COLUMNS`] order.
pub fn insert_batch() -> String {
    let marks: Vec<String> = (1..=BATCH_COLUMNS.split(',').count())
        .map(|n| format!("${n}"))
        .collect();
    format!(
        "INSERT INTO batches ({BATCH_COLUMNS}) VALUES ({})",
        marks.join(", ")
    )
}

/// A batch by id (`$1`).
pub fn batch_by_id() -> String {
    format!("SELECT {BATCH_COLUMNS} FROM batches WHERE id = $1")
}

/// The columns a step of a batch writes (never its counts, which are the `batch_counts`
/// trigger's), `$2…$12` (`$1` is the batch's id): the values of [`crate::ops::batch_step`].
pub const BATCH_STEP_SET: &str = "status = $2, output_file_id = $3, error_file_id = $4, \
     errors = $5, in_progress_at = $6, failed_at = $7, finalizing_at = $8, completed_at = $9, \
     expired_at = $10, cancelling_at = $11, cancelled_at = $12";

/// Writes a step of batch `$1` ([`BATCH_STEP_SET`]) if its status is `$13`; the row as written.
pub fn update_batch() -> String {
    format!(
        "UPDATE batches SET {BATCH_STEP_SET} WHERE id = $1 AND status = $13 \
         RETURNING {BATCH_COLUMNS}"
    )
}

/// Removes batch `$1`.
pub const DELETE_BATCH: &str = "DELETE FROM batches WHERE id = $1";

/// Task `$1`'s stored response document.
pub const RESPONSE_DOC: &str = "SELECT doc FROM responses WHERE task_id = $1";

/// Removes task `$1`'s events, first (how many went is what a purge counts).
pub const DELETE_TASK_EVENTS: &str = "DELETE FROM task_events WHERE task_id = $1";

/// Removes the rest of task `$1`'s rows after [`DELETE_TASK_EVENTS`], the task's own row last;
/// its idempotency records stay, pointing at nothing (a key outlives its task and keeps its
/// reply until it expires).
pub const DELETE_TASK_ROWS: [&str; 5] = [
    "DELETE FROM responses WHERE task_id = $1",
    "DELETE FROM snapshots WHERE task_id = $1",
    "UPDATE idempotency_keys SET reply_task = NULL WHERE reply_task = $1",
    "DELETE FROM task_specs WHERE task_id = $1",
    "DELETE FROM tasks WHERE id = $1",
];

/// Batch `$1`'s tasks after line `$2` in line order, at most `$3`, each with its stored response
/// document (NULL when it has none): the [`TASK_COLUMNS`] and then `r.doc`. `$2` is compared as a
/// `bigint`, so that PostgreSQL takes a 64-bit line for it, as SQLite does.
pub fn batch_answers() -> String {
    format!(
        "SELECT {TASK_COLUMNS}, r.doc FROM {TASK_FROM} LEFT JOIN responses r ON r.task_id = t.id \
         WHERE t.batch_id = $1 AND t.batch_line > CAST($2 AS BIGINT) ORDER BY t.batch_line LIMIT $3"
    )
}

/// A batch's (`$1`) kept lines whose `custom_id` an earlier kept line of it has: line and
/// `custom_id`, in line order, at most `$2`. Each is a seek in `batch_staging_custom_id`.
pub const STAGED_DUPLICATES: &str = "SELECT s.line, s.custom_id FROM batch_staging s \
     WHERE s.batch_id = $1 AND EXISTS (SELECT 1 FROM batch_staging e \
     WHERE e.batch_id = s.batch_id AND e.custom_id = s.custom_id AND e.line < s.line) \
     ORDER BY s.line LIMIT $2";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_become_numbered_question_marks() {
        assert_eq!(
            for_sqlite("SELECT a FROM t WHERE b = $1 AND c IN ($2, $10) AND d = $12"),
            "SELECT a FROM t WHERE b = ?1 AND c IN (?2, ?10) AND d = ?12"
        );
    }

    #[test]
    fn literals_and_other_dollars_are_left_alone() {
        assert_eq!(
            for_sqlite("SELECT '$1', 'it''s $2', $3, x$y, $fn$ FROM t"),
            "SELECT '$1', 'it''s $2', ?3, x$y, $fn$ FROM t"
        );
    }

    #[test]
    fn a_batch_is_inserted_with_a_placeholder_per_column() {
        let sql = insert_batch();
        assert!(sql.ends_with("$20, $21)"), "{sql}");
        assert!(!sql.contains("$22"), "{sql}");
    }

    #[test]
    fn the_shared_statements_read_the_same_in_sqlite() {
        for sql in [
            INSERT_CLIENT.to_owned(),
            client_by_token_hash(),
            client_by_id(),
            all_clients(),
            REVOKE_CLIENT.to_owned(),
            CLIENT_EXISTS.to_owned(),
            CLIENT_LIMITS.to_owned(),
            SET_CLIENT_LIMITS.to_owned(),
            DELETE_PAIRING.to_owned(),
            DELETE_PENDING_KEY.to_owned(),
            UNHOLD_KEY.to_owned(),
            DELETE_PENDING_KEYS_OF.to_owned(),
            UNHOLD_KEYS_OF.to_owned(),
            idempotency_record(),
            put_idempotency_record(true),
            put_idempotency_record(false),
            insert_model(),
            model_by_id(),
            all_models(),
            DELETE_MODEL.to_owned(),
            UPDATE_MODEL_FILE.to_owned(),
            REMOVED_MODEL_FILE.to_owned(),
            REMEMBER_REMOVED_MODEL_FILE.to_owned(),
            FORGET_REMOVED_MODEL_FILE.to_owned(),
            task_by_id(),
            task_by_stored_response(),
            insert_endpoint(),
            endpoint_by_id(),
            newest_endpoints(),
            endpoints_before(),
            UPDATE_ENDPOINT.to_owned(),
            DELETE_ENDPOINT.to_owned(),
            DELETE_ENDPOINT_DELIVERIES.to_owned(),
            RECORD_ATTEMPT.to_owned(),
            deliveries_of(),
            DELETE_TASK_EVENTS.to_owned(),
            insert_file(),
            file_by_id(),
            DELETE_FILE.to_owned(),
            insert_batch(),
            batch_by_id(),
            update_batch(),
            DELETE_BATCH.to_owned(),
            RESPONSE_DOC.to_owned(),
            INSERT_EVENT.to_owned(),
            purge_expired_keys("LIMIT $2"),
            STAGED_DUPLICATES.to_owned(),
        ]
        .into_iter()
        .chain(DELETE_TASK_ROWS.map(str::to_owned))
        {
            assert!(!sql.contains('?'), "{sql}");
            let sqlite = for_sqlite(&sql);
            assert!(!sqlite.contains('$'), "{sqlite}");
            assert_eq!(sql.contains("$1"), sqlite.contains("?1"), "{sqlite}");
        }
    }
}
