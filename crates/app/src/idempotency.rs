//! Idempotency keys (I-8) as a wrapper around any idempotent use case: [`idempotent`] claims the
//! request's key (hold → look up → decide, in one store transaction), runs the use case while the
//! request holds it, and lets go once the use case answered; a repeat of an answered request gets
//! the reply kept under the key instead, and the use case decides how to give it again. The use
//! case commits the reply a retry is to get together with what it creates
//! ([`KeyHold::answered_record`]); a reply known only later is kept with [`KeyHold::settle`]. The
//! rules are the domain's ([`lmsp_domain::idempotency::decide`],
//! [`lmsp_domain::idempotency::settle`]), and the hold lives in the store, so it holds across
//! processes. The app keeps the replies' bytes and never looks inside.

use std::future::Future;
use std::sync::Arc;

use lmsp_domain::idempotency::{
    decide, IdempotencyKey, IdempotencyRecord, IdempotencyScope, KeyClaim, KeyDecision, Operation,
    RequestDigest, StoredReply,
};

use crate::caller::Caller;
use crate::error::AppError;
use crate::shared::Core;

/// The `Idempotency-Key` of a request and the digest of the request's canonical form, as the
/// driving adapter read them.
#[derive(Debug, Clone)]
pub struct IdempotentRequest {
    /// The key.
    pub key: IdempotencyKey,
    /// The digest of the request's canonical form.
    pub digest: RequestDigest,
}

/// What an idempotent operation that creates no task answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Keyed<T> {
    /// It ran now.
    Fresh(T),
    /// The same request was answered before: the reply kept under the key, to give again as it
    /// is (`Idempotent-Replayed`).
    Replay(StoredReply),
}

/// What running a use case under a request's key came to.
pub(crate) enum Ran<T> {
    /// The use case ran (under the key, if the request has one) and answered this.
    Answered(T),
    /// The same request was answered before: the claim it made now, and the reply kept.
    Replay(KeyClaim, StoredReply),
}

/// A request's hold on its key, as the use case it wraps sees it: the claim, to commit the
/// reply a retry is to get with what the use case creates, or to keep a later reply.
#[derive(Clone)]
pub(crate) struct KeyHold {
    core: Arc<Core>,
    claim: KeyClaim,
}

/// Lets go of a key when the request is dropped mid-way (its client went away) without having
/// let go; a process that dies lets go when its instance is recovered.
struct ReleaseOnDrop {
    hold: Option<KeyHold>,
}

/// I-8: runs `act` for a request to `operation`, under the request's idempotency key if it has
/// one: 409 ([`AppError::KeyInUse`]) while another request holds the key, 422
/// ([`AppError::KeyReused`]) for a key answered to another request, [`Ran::Replay`] with the kept
/// reply for the same request again (`act` does not run). The key is let go once `act` answered,
/// whatever it answered: its record replays from then on (or, if nothing was answered, the key is
/// free again).
pub(crate) async fn idempotent<T, F, Fut>(
    core: &Arc<Core>,
    caller: &Caller,
    operation: Operation,
    key: Option<IdempotentRequest>,
    act: F,
) -> Result<Ran<T>, AppError>
where
    F: FnOnce(Option<KeyHold>) -> Fut,
    Fut: Future<Output = Result<T, AppError>>,
{
    let Some(IdempotentRequest { key, digest }) = key else {
        return act(None).await.map(Ran::Answered);
    };
    let settings = &core.settings;
    let claim = KeyClaim {
        scope: IdempotencyScope {
            client_id: caller.client_id,
            operation,
        },
        key,
        digest,
        holder: core.instance,
        hold_until: core.after(settings.idempotency_hold),
        expires_at: core.after(settings.idempotency_ttl),
    };
    match core.store.claim_key(&claim, core.now()).await? {
        KeyDecision::Proceed => {}
        KeyDecision::Replay(reply) => return Ok(Ran::Replay(claim, reply)),
        KeyDecision::InUse => return Err(AppError::KeyInUse),
        KeyDecision::Reused => return Err(AppError::KeyReused),
    }
    let hold = KeyHold {
        core: Arc::clone(core),
        claim,
    };
    let mut guard = ReleaseOnDrop {
        hold: Some(hold.clone()),
    };
    let answered = act(Some(hold)).await;
    if let Some(hold) = guard.hold.take() {
        hold.release().await;
    }
    answered.map(Ran::Answered)
}

impl KeyHold {
    /// The claim the request made.
    pub(crate) fn claim(&self) -> &KeyClaim {
        &self.claim
    }

    /// The record that answers the key with `reply` (committed with what the request creates).
    pub(crate) fn answered_record(&self, reply: StoredReply) -> IdempotencyRecord {
        self.claim.answered_record(reply, self.core.now())
    }

    /// When this request's hold ran out and another request answered under the key meanwhile
    /// (the store refused to commit this one's answer): what this request gets instead.
    pub(crate) fn answered_elsewhere(
        &self,
        record: &IdempotencyRecord,
    ) -> Result<StoredReply, AppError> {
        match decide(Some(record), &self.claim.digest, self.core.now()) {
            KeyDecision::Replay(reply) => Ok(reply),
            KeyDecision::InUse => Err(AppError::KeyInUse),
            _ => Err(AppError::KeyReused),
        }
    }

    /// Lets go of the key.
    async fn release(&self) {
        let store = &self.core.store;
        if let Err(error) = store.release_key(&self.claim.scope, &self.claim.key).await {
            tracing::warn!(%error, "an idempotency key was not released; its hold runs out later");
        }
    }
}

/// Keeps `reply` under the key of `claim` in place of `kept` (a pointer to a task, committed
/// with it), once the reply is known; only while the key still keeps `kept`
/// ([`lmsp_domain::idempotency::settle`]). A failure is logged: a retry rebuilds the same reply
/// from the task as long as the task is kept.
pub(crate) async fn settle(core: &Core, claim: &KeyClaim, kept: &StoredReply, reply: StoredReply) {
    let settled = core.store.settle_key(&claim.scope, &claim.key, kept, reply);
    if let Err(error) = settled.await {
        tracing::warn!(%error, "a request's final reply was not kept with its key");
    }
}

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        let Some(hold) = self.hold.take() else {
            return;
        };
        // The request was dropped mid-way (its client went away): let go in the background.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move { hold.release().await });
        }
    }
}
