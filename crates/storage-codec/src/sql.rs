//! Statements both adapters run word for word, written once with PostgreSQL's placeholders
//! (`$1`, `$2`, …). The SQLite adapter runs them through [`for_sqlite`], which writes each `$N`
//! as `?N` (in SQLite `$1` would be a *named* parameter, numbered by its first appearance, not by
//! its digits). Binding the values stays each adapter's: the drivers want different Rust types.
//!
//! Only statements that mean the same in both databases are here; where one adapter locks what
//! it reads (`FOR UPDATE`), upserts differently or batches, the statement stays in the adapter.

use crate::records::CLIENT_COLUMNS;
use crate::rows::{TASK_COLUMNS, TASK_FROM};

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

/// Stores a client: its row's six values, in `CLIENT_COLUMNS` order.
pub const INSERT_CLIENT: &str = "INSERT INTO clients (id, name, token_hash, scopes, created_at, \
     revoked_at) VALUES ($1, $2, $3, $4, $5, $6)";

/// The unrevoked client with a token hash (`$1`).
pub fn client_by_token_hash() -> String {
    format!("SELECT {CLIENT_COLUMNS} FROM clients WHERE token_hash = $1 AND revoked_at IS NULL")
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

/// Batch `$1`'s tasks after line `$2` in line order, at most `$3`, each with its stored response
/// document (NULL when it has none): the [`TASK_COLUMNS`] and then `r.doc`.
pub fn batch_answers() -> String {
    format!(
        "SELECT {TASK_COLUMNS}, r.doc FROM {TASK_FROM} LEFT JOIN responses r ON r.task_id = t.id \
         WHERE t.batch_id = $1 AND t.batch_line > $2 ORDER BY t.batch_line LIMIT $3"
    )
}

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
        ] {
            assert!(!sql.contains('?'), "{sql}");
            let sqlite = for_sqlite(&sql);
            assert!(!sqlite.contains('$'), "{sqlite}");
            assert_eq!(sql.contains("$1"), sqlite.contains("?1"), "{sqlite}");
        }
    }
}
