//! Idempotency records (I-8): holds, first replies, settled final replies, and their expiry.

use async_trait::async_trait;

use crate::idempotency::{
    IdempotencyKey, IdempotencyRecord, IdempotencyScope, KeyClaim, KeyDecision, StoredReply,
};
use crate::model::ModelRecord;
use crate::ports::StoreError;
use crate::time::Timestamp;

/// How registering a model together with its idempotency record ended.
// The record is not boxed: the value is matched at once and returned once per request.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyedInsert {
    /// The model and the key's record committed together.
    Inserted,
    /// A model with this id exists: nothing was written.
    Taken,
    /// Another request already answered under the key (this one's hold had run out): nothing
    /// was written; the record it left.
    KeyAnswered(IdempotencyRecord),
}

/// Idempotency records (I-8).
#[async_trait]
pub trait IdempotencyStore: Send + Sync {
    /// Decides a request under its key in one transaction ([`crate::idempotency::decide`] on the
    /// stored record at `now`); on [`KeyDecision::Proceed`] stores the claim's pending record
    /// ([`KeyClaim::pending_record`]), which holds the key, so every other request with the key,
    /// in any process, is told it is in use.
    async fn claim_key(&self, claim: &KeyClaim, now: Timestamp) -> Result<KeyDecision, StoreError>;

    /// P-1, I-8: registers `model` and stores `record` (the key's answered record, replacing its
    /// hold) in one transaction, so a model registered under a key always replays. When an
    /// unexpired record already answered under the key (at `record.created_at`), or the model id
    /// is taken, writes nothing.
    async fn insert_model_with_key(
        &self,
        model: ModelRecord,
        record: IdempotencyRecord,
    ) -> Result<KeyedInsert, StoreError>;

    /// I-8: keeps a request's final reply with its key once it is known (a synchronous request
    /// whose task finished), in one transaction: the record takes `reply` only while its reply is
    /// still `expected` ([`crate::idempotency::settle`]). Whether it did.
    async fn settle_key(
        &self,
        scope: &IdempotencyScope,
        key: &IdempotencyKey,
        expected: &StoredReply,
        reply: StoredReply,
    ) -> Result<bool, StoreError>;

    /// Ends a hold: an answered record stays (and replays), a pending one is removed (the request
    /// failed before it created anything, so the key is free again).
    async fn release_key(
        &self,
        scope: &IdempotencyScope,
        key: &IdempotencyKey,
    ) -> Result<(), StoreError>;

    /// Removes records expired at `at`, at most `batch`; returns how many.
    async fn purge_idempotency(&self, at: Timestamp, batch: usize) -> Result<u64, StoreError>;
}
