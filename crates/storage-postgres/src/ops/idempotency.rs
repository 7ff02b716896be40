//! Idempotency records (I-8): the hold, the first reply (committed with what the request
//! created), the settled final reply, expiry. The record's row is locked while a request is
//! decided, and a record inserted by a concurrent request under the transaction makes it run
//! again, so one request proceeds across every process.

use lmsp_domain::idempotency::{
    IdempotencyKey, IdempotencyRecord, IdempotencyScope, KeyClaim, KeyDecision, StoredReply,
};
use lmsp_domain::ids::InstanceId;
use lmsp_domain::model::ModelRecord;
use lmsp_domain::ports::KeyedInsert;
use lmsp_domain::time::Timestamp;
use lmsp_storage_codec::flows::{self, KeyRows};

use crate::codec::{self, ops as shared, IdempotencyRow};
use crate::error::DbError;
use crate::ops::{read, to_i64, Db, Res, Rows};

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
    let written = shared::put_record(&Rows(db), record, existed).await?;
    if written != 1 {
        return Err(DbError::Retry);
    }
    Ok(())
}

/// A record written where [`flows::stored_record`] found (and locked) one, or found none.
impl<C: Db> KeyRows for Rows<'_, C> {
    async fn put_record(&self, record: &IdempotencyRecord, existed: bool) -> Res<()> {
        put_record(self.0, record, existed).await
    }
}

/// Decides a request under its key; holds the key when it proceeds (the codec's
/// [`flows::claim_key`], the record's row locked).
pub async fn claim_key<C: Db>(db: &C, claim: &KeyClaim, now: Timestamp) -> Res<KeyDecision> {
    flows::claim_key(&Rows(db), claim, now).await
}

/// P-1, I-8: a model and its key's answered record, in one transaction
/// ([`flows::insert_model_with_key`]).
pub async fn insert_model_with_key<C: Db>(
    db: &C,
    model: &ModelRecord,
    record: &IdempotencyRecord,
) -> Res<KeyedInsert> {
    flows::insert_model_with_key(&Rows(db), model, record).await
}

/// I-8: keeps a final reply with its key while the key still keeps `expected`
/// ([`flows::settle_key`]).
pub async fn settle_key<C: Db>(
    db: &C,
    scope: &IdempotencyScope,
    key_text: &IdempotencyKey,
    expected: &StoredReply,
    reply: StoredReply,
) -> Res<bool> {
    flows::settle_key(&Rows(db), scope, key_text, expected, reply).await
}

/// Ends a key's hold: a pending record goes, an answered one stays.
pub async fn release_key<C: Db>(
    db: &C,
    scope: &IdempotencyScope,
    key_text: &IdempotencyKey,
) -> Res<()> {
    flows::release_key(&Rows(db), scope, key_text).await
}

/// Deletes up to `batch` expired records.
pub async fn purge_idempotency<C: Db>(db: &C, at: Timestamp, batch: usize) -> Res<u64> {
    let sql = codec::sql::purge_expired_keys("ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED");
    Ok(db
        .execute(&sql, &[&at.as_millis(), &to_i64(batch as u64)?])
        .await?)
}

/// Ends every hold of a stopped instance: its pending records go, its answered ones replay.
pub async fn release_holds_of<C: Db>(db: &C, instance: InstanceId) -> Res<()> {
    flows::release_holds_of(&Rows(db), instance).await
}
