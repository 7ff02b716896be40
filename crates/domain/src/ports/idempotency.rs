//! Idempotency records (I-8): holds, first replies and their expiry.

use async_trait::async_trait;

use crate::idempotency::{IdempotencyKey, IdempotencyScope, KeyClaim, KeyDecision, StoredReply};
use crate::ports::StoreError;
use crate::time::Timestamp;

/// Idempotency records (I-8).
#[async_trait]
pub trait IdempotencyStore: Send + Sync {
    /// Decides a request under its key in one transaction ([`crate::idempotency::decide`] on the
    /// stored record at `now`); on [`KeyDecision::Proceed`] stores the claim's pending record
    /// ([`KeyClaim::pending_record`]), which holds the key, so every other request with the key,
    /// in any process, is told it is in use.
    async fn claim_key(&self, claim: &KeyClaim, now: Timestamp) -> Result<KeyDecision, StoreError>;

    /// Records the first reply of a held key (for operations that create no task; a task's
    /// record is written by [`crate::ports::TaskStore::create_task`]). The hold stays.
    async fn answer_key(
        &self,
        scope: &IdempotencyScope,
        key: &IdempotencyKey,
        reply: StoredReply,
    ) -> Result<(), StoreError>;

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
