//! Idempotency records (I-8): a claim holds its key in the store (so any process sees it in
//! use), a task commits its record with itself, a released hold replays an answered key and
//! frees a pending one, and records are scoped by client and operation and end when they expire.

use lmsp_domain::idempotency::StoredReply;
use lmsp_domain::idempotency::{KeyDecision, Operation};
use lmsp_domain::ports::{CreateOutcome, Store};
use lmsp_domain::task::Task;

use crate::fixtures::*;
use crate::support::*;
use crate::{fresh_store, StoreFactory};

/// I-8: a claimed key is in use for every other request until the task commits its record;
/// once the hold ends, the same request replays the stored reply and another body is told the
/// key was reused. Nothing of a refused claim reaches the listener.
pub async fn a_claimed_key_is_in_use_then_replays_its_reply_i8<F: StoreFactory>(factory: &F) {
    let (store, listener) = fresh_store(factory).await;
    let new = TaskBuilder::new(instance_id()).build();
    let claim = task_claim(&new, "key-1");
    let at = new.created_at;
    assert_eq!(
        store.claim_key(&claim, at).await.unwrap(),
        KeyDecision::Proceed
    );
    let mark = listener.mark();
    assert_eq!(
        store.claim_key(&claim, at.plus_millis(1)).await.unwrap(),
        KeyDecision::InUse,
        "I-8: a held key is in use"
    );
    assert!(
        listener.events_since(mark).is_empty(),
        "a claim writes no event"
    );
    let created = store
        .create_task(new.clone(), Some(record_for(&new, "key-1")))
        .await
        .unwrap();
    assert!(matches!(created, CreateOutcome::Created(_)), "{created:?}");
    assert_eq!(
        store.claim_key(&claim, at.plus_millis(2)).await.unwrap(),
        KeyDecision::InUse,
        "the request still holds the key until it has answered"
    );
    store.release_key(&claim.scope, &claim.key).await.unwrap();
    assert_eq!(
        store.claim_key(&claim, at.plus_millis(3)).await.unwrap(),
        KeyDecision::Replay(reply_for(&new)),
        "I-8: the same request replays the first reply"
    );
    let mut other = claim.clone();
    other.digest = digest("{\"model\":\"other\"}");
    assert_eq!(
        store.claim_key(&other, at.plus_millis(4)).await.unwrap(),
        KeyDecision::Reused,
        "I-8: another request under the key is refused"
    );
    assert_eq!(
        store.task(new.id).await.unwrap().map(|task| task.id),
        Some(new.id),
        "exactly the one task exists"
    );
}

/// I-8: a request that fails before it creates anything releases its pending hold, and the key
/// is free again, for another body too.
pub async fn a_released_pending_key_is_free_again_i8<F: StoreFactory>(factory: &F) {
    let (store, _listener) = fresh_store(factory).await;
    let client = client_id();
    let claim = key_claim(
        client,
        Operation::CreateResponse,
        "free-me",
        "{}",
        instance_id(),
        time(0),
    );
    assert_eq!(
        store.claim_key(&claim, time(0)).await.unwrap(),
        KeyDecision::Proceed
    );
    store.release_key(&claim.scope, &claim.key).await.unwrap();
    let other = key_claim(
        client,
        Operation::CreateResponse,
        "free-me",
        "{\"other\":1}",
        instance_id(),
        time(1),
    );
    assert_eq!(
        store.claim_key(&other, time(1)).await.unwrap(),
        KeyDecision::Proceed
    );
}

/// I-8: a pending hold whose time ran out (its request died) no longer holds the key: a crash
/// never leaves a key held.
pub async fn a_pending_hold_that_ran_out_frees_its_key_i8<F: StoreFactory>(factory: &F) {
    let (store, _listener) = fresh_store(factory).await;
    let claim = key_claim(
        client_id(),
        Operation::CreateResponse,
        "dies",
        "{}",
        instance_id(),
        time(0),
    );
    assert_eq!(
        store.claim_key(&claim, time(0)).await.unwrap(),
        KeyDecision::Proceed
    );
    assert_eq!(
        store
            .claim_key(&claim, time(HOLD_MILLIS - 1))
            .await
            .unwrap(),
        KeyDecision::InUse
    );
    let later = key_claim(
        claim.scope.client_id,
        Operation::CreateResponse,
        "dies",
        "{}",
        instance_id(),
        time(HOLD_MILLIS),
    );
    assert_eq!(
        store.claim_key(&later, time(HOLD_MILLIS)).await.unwrap(),
        KeyDecision::Proceed,
        "the hold ran out"
    );
}

/// I-8: an answered record replays only until it expires; after that the key starts afresh.
pub async fn an_expired_record_is_no_record_i8<F: StoreFactory>(factory: &F) {
    let (store, _listener) = fresh_store(factory).await;
    let new = TaskBuilder::new(instance_id()).build();
    let claim = task_claim(&new, "expires");
    assert_eq!(
        store.claim_key(&claim, new.created_at).await.unwrap(),
        KeyDecision::Proceed
    );
    create_with(&store, &new, "expires").await;
    store.release_key(&claim.scope, &claim.key).await.unwrap();
    let after_ttl = claim.expires_at.plus_millis(1);
    let mut other = claim.clone();
    other.digest = digest("{\"something\":\"else\"}");
    other.hold_until = after_ttl.plus_millis(HOLD_MILLIS);
    other.expires_at = after_ttl.plus_millis(TTL_MILLIS);
    assert_eq!(
        store.claim_key(&other, after_ttl).await.unwrap(),
        KeyDecision::Proceed
    );
}

/// I-8: a key is scoped by client and by operation: the same text under another client or for
/// another operation is another key.
pub async fn keys_are_scoped_by_client_and_operation_i8<F: StoreFactory>(factory: &F) {
    let (store, _listener) = fresh_store(factory).await;
    let holder = instance_id();
    let client = client_id();
    let first = key_claim(
        client,
        Operation::CreateResponse,
        "shared",
        "{}",
        holder,
        time(0),
    );
    assert_eq!(
        store.claim_key(&first, time(0)).await.unwrap(),
        KeyDecision::Proceed
    );
    let other_client = key_claim(
        client_id(),
        Operation::CreateResponse,
        "shared",
        "{}",
        holder,
        time(0),
    );
    assert_eq!(
        store.claim_key(&other_client, time(0)).await.unwrap(),
        KeyDecision::Proceed,
        "another client's key"
    );
    let other_operation = key_claim(
        client,
        Operation::CreateChatCompletion,
        "shared",
        "{}",
        holder,
        time(0),
    );
    assert_eq!(
        store.claim_key(&other_operation, time(0)).await.unwrap(),
        KeyDecision::Proceed,
        "another operation's key"
    );
    assert_eq!(
        store.claim_key(&first, time(1)).await.unwrap(),
        KeyDecision::InUse,
        "the first is still held"
    );
}

/// I-8: an operation that creates no task records its reply with `answer_key`; after the hold
/// ends the reply replays, byte for byte.
pub async fn an_answered_key_without_a_task_replays_its_reply_i8<F: StoreFactory>(factory: &F) {
    let (store, _listener) = fresh_store(factory).await;
    let claim = key_claim(
        client_id(),
        Operation::RegisterModel,
        "register",
        "{\"id\":\"m\"}",
        instance_id(),
        time(0),
    );
    assert_eq!(
        store.claim_key(&claim, time(0)).await.unwrap(),
        KeyDecision::Proceed
    );
    let reply = StoredReply {
        task_id: None,
        body: b"201 {\"id\":\"m\"}".to_vec(),
    };
    store
        .answer_key(&claim.scope, &claim.key, reply.clone())
        .await
        .unwrap();
    assert_eq!(
        store.claim_key(&claim, time(1)).await.unwrap(),
        KeyDecision::InUse,
        "answered but still held"
    );
    store.release_key(&claim.scope, &claim.key).await.unwrap();
    assert_eq!(
        store.claim_key(&claim, time(2)).await.unwrap(),
        KeyDecision::Replay(reply)
    );
}

/// Creates `task` with its idempotency record under `key_text`.
async fn create_with<S: Store + ?Sized>(store: &S, task: &Task, key_text: &str) {
    let outcome = store
        .create_task(task.clone(), Some(record_for(task, key_text)))
        .await
        .unwrap();
    assert!(matches!(outcome, CreateOutcome::Created(_)), "{outcome:?}");
}
