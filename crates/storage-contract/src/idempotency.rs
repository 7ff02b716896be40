//! Idempotency records (I-8): a claim holds its key in the store (so any process sees it in
//! use), a task or a model commits its record with itself, a released hold replays an answered
//! key and frees a pending one, a synchronous request's final reply is settled with its key and
//! outlives its task, and records are scoped by client and operation and end when they expire.

use lmsp_domain::idempotency::{KeyDecision, KeyState, Operation, StoredReply};
use lmsp_domain::ids::InstanceId;
use lmsp_domain::ports::{CreateOutcome, DeleteOutcome, KeyedInsert, Store};
use lmsp_domain::task::Task;
use lmsp_domain::transition::Step;

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

/// P-1, I-8: a model registers with its key's answered record in one transaction: the key
/// replays that reply once let go; a taken id writes nothing (the key is free again once its
/// hold is released); a request whose hold ran out while another answered under the key writes
/// nothing either and is given that record.
pub async fn a_model_registers_with_its_keys_reply_in_one_transaction_i8<F: StoreFactory>(
    factory: &F,
) {
    let (store, listener) = fresh_store(factory).await;
    let client = client_id();
    let claim = key_claim(
        client,
        Operation::RegisterModel,
        "register",
        "{\"id\":\"m\"}",
        instance_id(),
        time(0),
    );
    let reply = StoredReply {
        task_id: None,
        body: b"201 {\"id\":\"m\"}".to_vec(),
    };
    assert_eq!(
        store.claim_key(&claim, time(0)).await.unwrap(),
        KeyDecision::Proceed
    );
    let mark = listener.mark();
    assert_eq!(
        store
            .insert_model_with_key(
                upstream_model("m", "upstream"),
                claim.answered_record(reply.clone(), time(0))
            )
            .await
            .unwrap(),
        KeyedInsert::Inserted
    );
    assert!(listener.events_since(mark).is_empty(), "no event");
    assert!(store.model(&model("m")).await.unwrap().is_some(), "P-1");
    assert_eq!(
        store.claim_key(&claim, time(1)).await.unwrap(),
        KeyDecision::InUse,
        "answered but still held"
    );
    store.release_key(&claim.scope, &claim.key).await.unwrap();
    assert_eq!(
        store.claim_key(&claim, time(2)).await.unwrap(),
        KeyDecision::Replay(reply.clone()),
        "I-8: the reply committed with the model"
    );

    let taken = key_claim(
        client,
        Operation::RegisterModel,
        "taken",
        "{\"id\":\"m\"}",
        instance_id(),
        time(3),
    );
    assert_eq!(
        store.claim_key(&taken, time(3)).await.unwrap(),
        KeyDecision::Proceed
    );
    assert_eq!(
        store
            .insert_model_with_key(
                file_model("m", "other.gguf"),
                taken.answered_record(reply.clone(), time(3))
            )
            .await
            .unwrap(),
        KeyedInsert::Taken
    );
    store.release_key(&taken.scope, &taken.key).await.unwrap();
    let mut another = taken.clone();
    another.digest = digest("{\"id\":\"m4\"}");
    assert_eq!(
        store.claim_key(&another, time(4)).await.unwrap(),
        KeyDecision::Proceed,
        "a taken id wrote no record: the key is free again"
    );
    assert_eq!(
        store.model(&model("m")).await.unwrap().map(|m| m.source),
        Some(upstream_model("m", "upstream").source),
        "the registered model is untouched"
    );

    let late = claim.answered_record(
        StoredReply {
            task_id: None,
            body: b"201 late".to_vec(),
        },
        time(5),
    );
    match store
        .insert_model_with_key(upstream_model("m5", "upstream"), late)
        .await
        .unwrap()
    {
        KeyedInsert::KeyAnswered(record) => {
            assert_eq!(record.state, KeyState::Answered(reply), "the first reply")
        }
        other => panic!("I-8: a key answered already writes nothing, not {other:?}"),
    }
    assert_eq!(store.model(&model("m5")).await.unwrap(), None);
}

/// I-8: a synchronous request's key keeps a pointer to its task until the task finishes; then
/// its final reply is settled with the key, and a retry gets that reply even after the task was
/// purged. A second settle against the pointer finds it gone and changes nothing; a settle
/// writes no event.
pub async fn a_settled_key_keeps_its_final_reply_after_its_task_is_purged_i8<F: StoreFactory>(
    factory: &F,
) {
    let (store, listener) = fresh_store(factory).await;
    let worker = instance_id();
    let new = TaskBuilder::new(worker).build();
    let claim = task_claim(&new, "settle");
    assert_eq!(
        store.claim_key(&claim, new.created_at).await.unwrap(),
        KeyDecision::Proceed
    );
    create_with(&store, &new, "settle").await;
    store.release_key(&claim.scope, &claim.key).await.unwrap();
    let pointer = reply_for(&new);
    let done = run_to_completion(&store, &new, worker).await;
    let final_reply = StoredReply {
        task_id: Some(done.id),
        body: format!("200 {} done", done.id).into_bytes(),
    };

    let mark = listener.mark();
    let settled = store
        .settle_key(&claim.scope, &claim.key, &pointer, final_reply.clone())
        .await
        .unwrap();
    let again = store
        .settle_key(
            &claim.scope,
            &claim.key,
            &pointer,
            StoredReply {
                task_id: Some(done.id),
                body: b"another".to_vec(),
            },
        )
        .await
        .unwrap();
    let purged = store
        .purge_finished(time(1_000_000_000), 100)
        .await
        .unwrap();

    assert!(settled, "the key still kept the pointer");
    assert!(!again, "the pointer was replaced already");
    assert!(
        listener.events_since(mark).is_empty(),
        "a settle writes no event"
    );
    assert_eq!(purged.tasks, 1);
    assert_eq!(store.task(done.id).await.unwrap(), None);
    assert_eq!(
        store.claim_key(&claim, time(2_000)).await.unwrap(),
        KeyDecision::Replay(StoredReply {
            task_id: None,
            body: final_reply.body,
        }),
        "I-8: the final reply outlives the task"
    );
}

/// I-8: a settle applies only to a record that still keeps the reply the settler read: none
/// for a key never claimed, a pending hold, or a key answered otherwise; a pointer whose task was
/// deleted meanwhile still takes it (the settler holds the final reply).
pub async fn a_key_settles_only_while_it_keeps_the_reply_that_was_read_i8<F: StoreFactory>(
    factory: &F,
) {
    let (store, _listener) = fresh_store(factory).await;
    let worker = instance_id();
    let new = TaskBuilder::new(worker).build();
    let pointer = reply_for(&new);
    let final_reply = StoredReply {
        task_id: Some(new.id),
        body: b"200 final".to_vec(),
    };
    let never = task_claim(&new, "never-claimed");
    assert!(!store
        .settle_key(&never.scope, &never.key, &pointer, final_reply.clone())
        .await
        .unwrap());
    assert_eq!(
        store.claim_key(&never, time(1)).await.unwrap(),
        KeyDecision::Proceed,
        "a settle creates no record"
    );
    assert!(
        !store
            .settle_key(&never.scope, &never.key, &pointer, final_reply.clone())
            .await
            .unwrap(),
        "a pending hold is not settled"
    );
    assert_eq!(
        store.claim_key(&never, time(2)).await.unwrap(),
        KeyDecision::InUse,
        "the hold is untouched"
    );

    let claim = task_claim(&new, "deleted");
    assert_eq!(
        store.claim_key(&claim, new.created_at).await.unwrap(),
        KeyDecision::Proceed
    );
    create_with(&store, &new, "deleted").await;
    store.release_key(&claim.scope, &claim.key).await.unwrap();
    let other = StoredReply {
        task_id: Some(new.id),
        body: b"not what the key keeps".to_vec(),
    };
    assert!(
        !store
            .settle_key(&claim.scope, &claim.key, &other, final_reply.clone())
            .await
            .unwrap(),
        "a key that keeps another reply is not settled"
    );
    let done = run_to_completion(&store, &new, worker).await;
    assert_eq!(
        store.delete_finished(done.id, None).await.unwrap(),
        DeleteOutcome::Deleted
    );
    assert!(store
        .settle_key(&claim.scope, &claim.key, &pointer, final_reply.clone())
        .await
        .unwrap());
    assert_eq!(
        store.claim_key(&claim, time(3_000)).await.unwrap(),
        KeyDecision::Replay(StoredReply {
            task_id: None,
            body: final_reply.body,
        }),
        "the record still names no task once its task is gone"
    );
}

/// Runs `task` (created, queued) to `completed` on behalf of `worker`.
async fn run_to_completion<S: Store + ?Sized>(store: &S, task: &Task, worker: InstanceId) -> Task {
    let created = store.task(task.id).await.unwrap().expect("the task");
    let running = step(
        store,
        &created,
        worker,
        vec![claim(&created), Step::Loaded, output("done")],
        None,
        time(1),
    )
    .await;
    finish(
        store,
        &running,
        worker,
        complete(&running, "done", time(100)),
    )
    .await
}

/// Creates `task` with its idempotency record under `key_text`.
async fn create_with<S: Store + ?Sized>(store: &S, task: &Task, key_text: &str) {
    let outcome = store
        .create_task(task.clone(), Some(record_for(task, key_text)))
        .await
        .unwrap();
    assert!(matches!(outcome, CreateOutcome::Created(_)), "{outcome:?}");
}
