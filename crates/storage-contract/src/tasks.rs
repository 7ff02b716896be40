//! Creating tasks and claiming them: `create_task` (P-2, I-1, I-8: the task, its first event and
//! its idempotency record in one transaction) and `claim_next`. The worker's steps on a claimed
//! task are in `steps` and `output`.

use lmsp_domain::event::{Event, EventPayload};
use lmsp_domain::ids::ResponseId;
use lmsp_domain::ports::CreateOutcome;
use lmsp_domain::recovery::RestartPolicy;
use lmsp_domain::status::TaskStatus;
use lmsp_domain::task::Task;

use crate::fixtures::*;
use crate::support::*;
use crate::{fresh_store, StoreFactory};

/// P-2, I-1: a created task is stored as given, `queued`, with `response.created` (the task as
/// created) at sequence 1, readable at once; its response id is its own ULID; the listener heard
/// exactly that event.
pub async fn a_created_task_is_queued_with_its_created_event_at_sequence_one_p2_i1<
    F: StoreFactory,
>(
    factory: &F,
) {
    let (store, listener) = fresh_store(factory).await;
    let new = TaskBuilder::new(instance_id())
        .background()
        .metadata("k", "v")
        .build();
    let created = create(&store, new.clone()).await;
    assert_eq!(created, new, "the stored task is the one given");
    assert_eq!(created.status, TaskStatus::Queued);
    assert_eq!(created.last_sequence_number, 1);
    assert_eq!(created.response_id, ResponseId::from_ulid(new.id.ulid()));
    assert_eq!(store.task(new.id).await.unwrap(), Some(new.clone()));
    let (_, events) = assert_log_consistent(&store, new.id).await;
    let expected = Event {
        task_id: new.id,
        sequence_number: 1,
        created_at: new.created_at,
        payload: EventPayload::Created {
            task: Box::new(new.clone()),
        },
    };
    assert_eq!(events, vec![expected]);
    assert_eq!(
        listener.events(),
        events,
        "the listener heard the created event"
    );
    assert_eq!(store.task(task_id()).await.unwrap(), None);
}

/// P-2, I-8: a task and its idempotency record commit together; a second create under a key
/// already answered returns the stored record and writes nothing (no task, no event); once the
/// hold ends, the key replays the first reply.
pub async fn a_task_commits_with_its_idempotency_record_and_a_second_create_under_the_key_writes_nothing_i8<
    F: StoreFactory,
>(
    factory: &F,
) {
    let (store, listener) = fresh_store(factory).await;
    let owner = instance_id();
    let first = task(owner, RestartPolicy::Fail);
    let record = record_for(&first, "create-once");
    let outcome = store
        .create_task(first.clone(), Some(record.clone()))
        .await
        .unwrap();
    assert_eq!(outcome, CreateOutcome::Created(first.clone()));

    let second = TaskBuilder::new(owner).client(first.client_id).build();
    let mark = listener.mark();
    let outcome = store
        .create_task(second.clone(), Some(record_for(&second, "create-once")))
        .await
        .unwrap();
    assert_eq!(
        outcome,
        CreateOutcome::KeyAnswered(record.clone()),
        "I-8: the first record, as it was stored"
    );
    assert_eq!(
        store.task(second.id).await.unwrap(),
        None,
        "I-8: no second task"
    );
    assert!(all_events(&store, second.id).await.is_empty());
    assert!(listener.events_since(mark).is_empty(), "nothing was heard");

    store.release_key(&record.scope, &record.key).await.unwrap();
    let claim = task_claim(&first, "create-once");
    assert_eq!(
        store.claim_key(&claim, time(1_000)).await.unwrap(),
        lmsp_domain::idempotency::KeyDecision::Replay(reply_for(&first)),
        "I-8: the key replays the reply naming the task"
    );
    let answered_after_release = store
        .create_task(second.clone(), Some(record_for(&second, "create-once")))
        .await
        .unwrap();
    let released = lmsp_domain::idempotency::IdempotencyRecord {
        held_until: None,
        held_by: None,
        ..record
    };
    assert_eq!(answered_after_release, CreateOutcome::KeyAnswered(released));
    let elsewhere = TaskBuilder::new(owner).build();
    let outcome = store
        .create_task(
            elsewhere.clone(),
            Some(record_for(&elsewhere, "create-once")),
        )
        .await
        .unwrap();
    assert_eq!(
        outcome,
        CreateOutcome::Created(elsewhere),
        "another client's key of the same text is another key"
    );
    assert_log_consistent(&store, first.id).await;
}

/// A task whose id is taken is not stored again: the create fails, the stored task and its log
/// stay as they were, and the listener hears nothing.
pub async fn creating_a_task_whose_id_exists_fails_and_changes_nothing<F: StoreFactory>(
    factory: &F,
) {
    let (store, listener) = fresh_store(factory).await;
    let worker = instance_id();
    let first = task(instance_id(), RestartPolicy::Fail);
    let loading = task_in(&store, first.clone(), worker, TaskStatus::Loading).await;
    let again = Task {
        on_restart: RestartPolicy::Retry,
        ..first
    };
    let mark = listener.mark();
    assert!(store.create_task(again, None).await.is_err());
    assert_eq!(store.task(loading.id).await.unwrap(), Some(loading.clone()));
    let (_, events) = assert_log_consistent(&store, loading.id).await;
    assert_eq!(events.len(), 2);
    assert!(listener.events_since(mark).is_empty());
}

/// `claim_next` takes the oldest queued task (creation order), skipping tasks in other statuses;
/// the claimer becomes its owner (`loading` + `response.loading`, `started_at`); each task is
/// claimed once, and with none left there is nothing to claim.
pub async fn claim_next_takes_the_oldest_queued_task_and_makes_the_claimer_its_owner<
    F: StoreFactory,
>(
    factory: &F,
) {
    let (store, listener) = fresh_store(factory).await;
    let acceptor = instance_id();
    let worker = instance_id();
    assert_eq!(store.claim_next(worker, time(0)).await.unwrap(), None);
    let a = create(&store, task(acceptor, RestartPolicy::Fail)).await;
    task_in(
        &store,
        task(acceptor, RestartPolicy::Fail),
        acceptor,
        TaskStatus::Cancelled,
    )
    .await;
    let b = create(&store, task(acceptor, RestartPolicy::Retry)).await;
    task_in(
        &store,
        task(acceptor, RestartPolicy::Fail),
        acceptor,
        TaskStatus::Running,
    )
    .await;
    let c = create(&store, task(acceptor, RestartPolicy::Resume)).await;
    let mark = listener.mark();
    let claimed = store
        .claim_next(worker, time(10))
        .await
        .unwrap()
        .expect("a queued task");
    assert_eq!(claimed.id, a.id, "the oldest first");
    assert_eq!(claimed.status, TaskStatus::Loading);
    assert_eq!(claimed.owner, worker);
    assert_eq!(claimed.started_at, Some(time(10)));
    assert_eq!(claimed.last_sequence_number, 2);
    let loading = Event {
        task_id: a.id,
        sequence_number: 2,
        created_at: time(10),
        payload: EventPayload::Loading {
            model: a.model.clone(),
        },
    };
    assert_eq!(listener.events_since(mark), vec![loading.clone()]);
    let (stored, log) = assert_log_consistent(&store, a.id).await;
    assert_eq!(stored, claimed);
    assert_eq!(log.last(), Some(&loading));
    let order: Vec<_> = [
        store.claim_next(worker, time(11)).await.unwrap(),
        store.claim_next(worker, time(12)).await.unwrap(),
    ]
    .into_iter()
    .map(|task| task.expect("a queued task").id)
    .collect();
    assert_eq!(order, vec![b.id, c.id]);
    assert_eq!(store.claim_next(worker, time(13)).await.unwrap(), None);
}
