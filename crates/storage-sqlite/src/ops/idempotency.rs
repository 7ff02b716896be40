//! Idempotency records (I-8): the hold, the first reply (committed with what the request
//! created), the settled final reply, expiry.

use lmsp_domain::idempotency::{
    IdempotencyKey, IdempotencyRecord, IdempotencyScope, KeyClaim, KeyDecision, StoredReply,
};
use lmsp_domain::ids::InstanceId;
use lmsp_domain::model::ModelRecord;
use lmsp_domain::ports::KeyedInsert;
use lmsp_domain::time::Timestamp;
use lmsp_storage_codec::flows::{self, KeyRows};
use rusqlite::{params, Connection};

use crate::codec;
use crate::codec::ops as shared;
use crate::ops::{prepare, run, to_i64, Res, Rows};

/// A record replaces whatever is stored under its key: the writer thread runs one transaction
/// at a time, so none can appear under it.
impl KeyRows for Rows<'_> {
    async fn put_record(&self, record: &IdempotencyRecord, _existed: bool) -> Res<()> {
        shared::put_record(self, record, true).await?;
        Ok(())
    }
}

/// Decides a request under its key; holds the key when it proceeds (the codec's
/// [`flows::claim_key`]).
pub fn claim_key(conn: &Connection, claim: &KeyClaim, now: Timestamp) -> Res<KeyDecision> {
    run(flows::claim_key(&Rows(conn), claim, now))
}

/// P-1, I-8: a model and its key's answered record, in one transaction
/// ([`flows::insert_model_with_key`]).
pub fn insert_model_with_key(
    conn: &Connection,
    model: &ModelRecord,
    record: &IdempotencyRecord,
) -> Res<KeyedInsert> {
    run(flows::insert_model_with_key(&Rows(conn), model, record))
}

/// I-8: keeps a final reply with its key while the key still keeps `expected`
/// ([`flows::settle_key`]).
pub fn settle_key(
    conn: &Connection,
    scope: &IdempotencyScope,
    key_text: &IdempotencyKey,
    expected: &StoredReply,
    reply: StoredReply,
) -> Res<bool> {
    run(flows::settle_key(
        &Rows(conn),
        scope,
        key_text,
        expected,
        reply,
    ))
}

/// Ends a key's hold: a pending record goes, an answered one stays.
pub fn release_key(
    conn: &Connection,
    scope: &IdempotencyScope,
    key_text: &IdempotencyKey,
) -> Res<()> {
    run(flows::release_key(&Rows(conn), scope, key_text))
}

/// Deletes up to `batch` expired records.
pub fn purge_idempotency(conn: &Connection, at: Timestamp, batch: usize) -> Res<u64> {
    let sql = codec::sql::purge_expired_keys("LIMIT $2");
    Ok(prepare(conn, &sql)?.execute(params![at.as_millis(), to_i64(batch as u64)?])? as u64)
}

/// Ends every hold of a stopped instance: its pending records go, its answered ones replay.
pub fn release_holds_of(conn: &Connection, instance: InstanceId) -> Res<()> {
    run(flows::release_holds_of(&Rows(conn), instance))
}
