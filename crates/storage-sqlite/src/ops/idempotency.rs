//! Idempotency records (I-8): the hold, the first reply (committed with what the request
//! created), the settled final reply, expiry.

use lmsp_domain::idempotency::{
    decide, settle, IdempotencyKey, IdempotencyRecord, IdempotencyScope, KeyClaim, KeyDecision,
    StoredReply,
};
use lmsp_domain::ids::InstanceId;
use lmsp_domain::model::ModelRecord;
use lmsp_domain::ports::KeyedInsert;
use lmsp_domain::time::Timestamp;
use lmsp_domain::writes::answered_key;
use rusqlite::{params, Connection, OptionalExtension};

use crate::codec::{sql, IdempotencyRow};
use crate::ops::models::insert_model;
use crate::ops::{client_key, instance_key, prepare, read, to_i64, Res};

/// The record stored under a key, expired or not.
pub fn stored_record(
    conn: &Connection,
    scope: &IdempotencyScope,
    key_text: &IdempotencyKey,
) -> Res<Option<IdempotencyRecord>> {
    let row = prepare(conn, &sql::idempotency_record())?
        .query_row(
            params![
                client_key(scope.client_id),
                scope.operation.as_str(),
                key_text.as_str()
            ],
            read::<IdempotencyRow>,
        )
        .optional()?;
    Ok(row.map(|row| row.decode(scope, key_text)).transpose()?)
}

/// Writes a record, replacing whatever was stored under its key.
pub fn put_record(conn: &Connection, record: &IdempotencyRecord) -> Res<()> {
    let row = IdempotencyRow::encode(record);
    prepare(conn, &sql::put_idempotency_record(true))?.execute(params![
        client_key(record.scope.client_id),
        record.scope.operation.as_str(),
        record.key.as_str(),
        row.digest,
        row.reply,
        row.reply_task,
        row.held_until,
        row.held_by,
        row.created_at,
        row.expires_at,
    ])?;
    Ok(())
}

/// Decides a request under its key; holds the key when it proceeds.
pub fn claim_key(conn: &Connection, claim: &KeyClaim, now: Timestamp) -> Res<KeyDecision> {
    let stored = stored_record(conn, &claim.scope, &claim.key)?;
    let decision = decide(stored.as_ref(), &claim.digest, now);
    if decision == KeyDecision::Proceed {
        put_record(conn, &claim.pending_record(now))?;
    }
    Ok(decision)
}

/// P-1, I-8: a model and its key's answered record, in one transaction; nothing when another
/// request answered under the key meanwhile or the id is taken.
pub fn insert_model_with_key(
    conn: &Connection,
    model: &ModelRecord,
    record: &IdempotencyRecord,
) -> Res<KeyedInsert> {
    let stored = stored_record(conn, &record.scope, &record.key)?;
    if let Some(answered) = answered_key(stored.as_ref(), record.created_at) {
        return Ok(KeyedInsert::KeyAnswered(answered.clone()));
    }
    if !insert_model(conn, model)? {
        return Ok(KeyedInsert::Taken);
    }
    put_record(conn, record)?;
    Ok(KeyedInsert::Inserted)
}

/// I-8: keeps a final reply with its key while the key still keeps `expected` ([`settle`]).
pub fn settle_key(
    conn: &Connection,
    scope: &IdempotencyScope,
    key_text: &IdempotencyKey,
    expected: &StoredReply,
    reply: StoredReply,
) -> Res<bool> {
    let stored = stored_record(conn, scope, key_text)?;
    match settle(stored.as_ref(), expected, reply) {
        Some(record) => {
            put_record(conn, &record)?;
            Ok(true)
        }
        None => Ok(false),
    }
}

/// Ends a key's hold: a pending record goes, an answered one stays.
pub fn release_key(
    conn: &Connection,
    scope: &IdempotencyScope,
    key_text: &IdempotencyKey,
) -> Res<()> {
    let id = client_key(scope.client_id);
    prepare(conn, sql::DELETE_PENDING_KEY)?.execute(params![
        id,
        scope.operation.as_str(),
        key_text.as_str()
    ])?;
    prepare(conn, sql::UNHOLD_KEY)?.execute(params![
        id,
        scope.operation.as_str(),
        key_text.as_str()
    ])?;
    Ok(())
}

/// Deletes up to `batch` expired records.
pub fn purge_idempotency(conn: &Connection, at: Timestamp, batch: usize) -> Res<u64> {
    Ok(conn
        .prepare_cached(
            "DELETE FROM idempotency_keys WHERE (client_id, operation, key) IN \
             (SELECT client_id, operation, key FROM idempotency_keys \
             WHERE expires_at <= ?1 LIMIT ?2)",
        )?
        .execute(params![at.as_millis(), to_i64(batch as u64)?])? as u64)
}

/// Ends every hold of a stopped instance: its pending records go, its answered ones replay.
pub fn release_holds_of(conn: &Connection, instance: InstanceId) -> Res<()> {
    let id = instance_key(instance);
    prepare(conn, sql::DELETE_PENDING_KEYS_OF)?.execute([id])?;
    prepare(conn, sql::UNHOLD_KEYS_OF)?.execute([id])?;
    Ok(())
}
