//! Idempotency records (I-8): the hold, the first reply (committed with what the request
//! created), the settled final reply, expiry. The record's row is locked while a request is
//! decided, and a record inserted by a concurrent request under the transaction makes it run
//! again, so one request proceeds across every process.

use lmsp_domain::idempotency::{
    decide, settle, IdempotencyKey, IdempotencyRecord, IdempotencyScope, KeyClaim, KeyDecision,
    StoredReply,
};
use lmsp_domain::ids::InstanceId;
use lmsp_domain::model::ModelRecord;
use lmsp_domain::ports::KeyedInsert;
use lmsp_domain::time::Timestamp;
use lmsp_domain::writes::answered_key;

use crate::codec::{sql, IdempotencyRow};
use crate::error::DbError;
use crate::ops::models::insert_model;
use crate::ops::{client_key, instance_key, read, to_i64, Db, Res};

/// The record stored under a key, expired or not, its row locked until the transaction ends.
pub async fn locked_record<C: Db>(
    db: &C,
    scope: &IdempotencyScope,
    key_text: &IdempotencyKey,
) -> Res<Option<IdempotencyRecord>> {
    let Some(row) = db
        .query_opt(
            &crate::batch::lock_key_sql(),
            &[
                &client_key(scope.client_id),
                &scope.operation.as_str(),
                &key_text.as_str(),
            ],
        )
        .await?
    else {
        return Ok(None);
    };
    Ok(Some(decode_record(&row, scope, key_text)?))
}

/// Decodes a record read with [`IDEMPOTENCY_COLUMNS`](crate::codec::IDEMPOTENCY_COLUMNS) (its key
/// given).
pub fn decode_record(
    row: &tokio_postgres::Row,
    scope: &IdempotencyScope,
    key_text: &IdempotencyKey,
) -> Res<IdempotencyRecord> {
    Ok(read::<IdempotencyRow>(row)?.decode(scope, key_text)?)
}

/// Writes a record. When the transaction found (and locked) a record under the key, it is
/// replaced; when it found none and a concurrent transaction inserted one meanwhile, the
/// transaction runs again ([`DbError::Retry`]) to decide on that record.
pub async fn put_record<C: Db>(db: &C, record: &IdempotencyRecord, existed: bool) -> Res<()> {
    let row = IdempotencyRow::encode(record);
    let sql = sql::put_idempotency_record(existed);
    let written = db
        .execute(
            &sql,
            &[
                &client_key(record.scope.client_id),
                &record.scope.operation.as_str(),
                &record.key.as_str(),
                &row.digest,
                &row.reply,
                &row.reply_task,
                &row.held_until,
                &row.held_by,
                &row.created_at,
                &row.expires_at,
            ],
        )
        .await?;
    if written != 1 {
        return Err(DbError::Retry);
    }
    Ok(())
}

/// Decides a request under its key; holds the key when it proceeds.
pub async fn claim_key<C: Db>(db: &C, claim: &KeyClaim, now: Timestamp) -> Res<KeyDecision> {
    let stored = locked_record(db, &claim.scope, &claim.key).await?;
    let decision = decide(stored.as_ref(), &claim.digest, now);
    if decision == KeyDecision::Proceed {
        put_record(db, &claim.pending_record(now), stored.is_some()).await?;
    }
    Ok(decision)
}

/// P-1, I-8: a model and its key's answered record, in one transaction; nothing when another
/// request answered under the key meanwhile or the id is taken.
pub async fn insert_model_with_key<C: Db>(
    db: &C,
    model: &ModelRecord,
    record: &IdempotencyRecord,
) -> Res<KeyedInsert> {
    let existing = locked_record(db, &record.scope, &record.key).await?;
    if let Some(answered) = answered_key(existing.as_ref(), record.created_at) {
        return Ok(KeyedInsert::KeyAnswered(answered.clone()));
    }
    if !insert_model(db, model).await? {
        return Ok(KeyedInsert::Taken);
    }
    put_record(db, record, existing.is_some()).await?;
    Ok(KeyedInsert::Inserted)
}

/// I-8: keeps a final reply with its key while the key still keeps `expected` ([`settle`]).
pub async fn settle_key<C: Db>(
    db: &C,
    scope: &IdempotencyScope,
    key_text: &IdempotencyKey,
    expected: &StoredReply,
    reply: StoredReply,
) -> Res<bool> {
    let stored = locked_record(db, scope, key_text).await?;
    match settle(stored.as_ref(), expected, reply) {
        Some(record) => {
            put_record(db, &record, true).await?;
            Ok(true)
        }
        None => Ok(false),
    }
}

/// Ends a key's hold: a pending record goes, an answered one stays.
pub async fn release_key<C: Db>(
    db: &C,
    scope: &IdempotencyScope,
    key_text: &IdempotencyKey,
) -> Res<()> {
    let id = client_key(scope.client_id);
    db.execute(
        sql::DELETE_PENDING_KEY,
        &[&id, &scope.operation.as_str(), &key_text.as_str()],
    )
    .await?;
    db.execute(
        sql::UNHOLD_KEY,
        &[&id, &scope.operation.as_str(), &key_text.as_str()],
    )
    .await?;
    Ok(())
}

/// Deletes up to `batch` expired records.
pub async fn purge_idempotency<C: Db>(db: &C, at: Timestamp, batch: usize) -> Res<u64> {
    Ok(db
        .execute(
            "DELETE FROM idempotency_keys WHERE (client_id, operation, key) IN \
             (SELECT client_id, operation, key FROM idempotency_keys \
             WHERE expires_at <= $1 ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED)",
            &[&at.as_millis(), &to_i64(batch as u64)?],
        )
        .await?)
}

/// Ends every hold of a stopped instance: its pending records go, its answered ones replay.
pub async fn release_holds_of<C: Db>(db: &C, instance: InstanceId) -> Res<()> {
    let id = instance_key(instance);
    db.execute(sql::DELETE_PENDING_KEYS_OF, &[&id]).await?;
    db.execute(sql::UNHOLD_KEYS_OF, &[&id]).await?;
    Ok(())
}
