//! Idempotency keys as a use case (I-8): a request with a key claims it (hold → look up →
//! decide, in one store transaction), goes on holding it while it is answered, records its reply,
//! and lets go; a repeat gets the first reply again. The driving adapter reads the key and the
//! request's digest and encodes the reply it wants stored; the rules are the domain's
//! ([`lmsp_domain::idempotency::decide`]), the hold lives in the store, so it holds across
//! processes.

use std::sync::atomic::{AtomicBool, Ordering};

use lmsp_domain::idempotency::{
    IdempotencyKey, IdempotencyRecord, IdempotencyScope, KeyClaim, KeyDecision, Operation,
    RequestDigest, StoredReply,
};
use lmsp_domain::Timestamp;

use crate::clients::Caller;
use crate::error::AppError;
use crate::service::Service;

/// What claiming a key found.
#[derive(Debug)]
pub enum Claimed {
    /// The request holds the key and goes on; let go with [`KeyHold::release`] once answered.
    Proceed(KeyHold),
    /// The same request was answered before: its reply.
    Replay(StoredReply),
}

/// A request's hold on its key. Dropping it without [`KeyHold::release`] lets go in the
/// background; a process that dies lets go when its instance is recovered.
#[derive(Debug)]
pub struct KeyHold {
    service: Service,
    claim: KeyClaim,
    released: AtomicBool,
}

impl Service {
    /// Claims `key` for the caller's request with `digest` to `operation`: 409
    /// ([`AppError::KeyInUse`]) while another request holds it, 422 ([`AppError::KeyReused`]) for
    /// a key answered to another request, the stored reply for the same request again.
    pub async fn claim_key(
        &self,
        caller: &Caller,
        operation: Operation,
        key: IdempotencyKey,
        digest: RequestDigest,
    ) -> Result<Claimed, AppError> {
        let settings = &self.inner.settings;
        let claim = KeyClaim {
            scope: IdempotencyScope {
                client_id: caller.client_id,
                operation,
            },
            key,
            digest,
            holder: self.inner.instance,
            hold_until: self.after(settings.idempotency_hold),
            expires_at: self.after(settings.idempotency_ttl),
        };
        match self.inner.store.claim_key(&claim, self.now()).await? {
            KeyDecision::Proceed => Ok(Claimed::Proceed(KeyHold {
                service: self.clone(),
                claim,
                released: AtomicBool::new(false),
            })),
            KeyDecision::Replay(reply) => Ok(Claimed::Replay(reply)),
            KeyDecision::InUse => Err(AppError::KeyInUse),
            KeyDecision::Reused => Err(AppError::KeyReused),
        }
    }
}

impl KeyHold {
    /// The digest of the request that holds the key.
    pub fn digest(&self) -> RequestDigest {
        self.claim.digest
    }

    /// The record that answers the key with `reply` (committed with the task it creates).
    pub fn answered_record(&self, reply: StoredReply, now: Timestamp) -> IdempotencyRecord {
        self.claim.answered_record(reply, now)
    }

    /// Records the reply of an operation that creates no task.
    pub async fn answer(&self, reply: StoredReply) -> Result<(), AppError> {
        self.service
            .inner
            .store
            .answer_key(&self.claim.scope, &self.claim.key, reply)
            .await?;
        Ok(())
    }

    /// Lets go of the key: its record replays from now on (or, if nothing was answered, the key
    /// is free again).
    pub async fn release(self) {
        self.released.store(true, Ordering::SeqCst);
        let store = &self.service.inner.store;
        if let Err(error) = store.release_key(&self.claim.scope, &self.claim.key).await {
            tracing::warn!(%error, "an idempotency key was not released; its hold runs out later");
        }
    }
}

impl Drop for KeyHold {
    fn drop(&mut self) {
        if self.released.load(Ordering::SeqCst) {
            return;
        }
        // The request was dropped mid-way (its client went away): let go in the background.
        let store = std::sync::Arc::clone(&self.service.inner.store);
        let (scope, key) = (self.claim.scope.clone(), self.claim.key.clone());
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = store.release_key(&scope, &key).await;
            });
        }
    }
}
