//! Creating tasks and the worker's steps: `create_task` (P-2, I-1, I-8), `append` (P-3, I-2,
//! the compare-and-set on sequence and owner, the output item structure), `finish`, and
//! `claim_next`.

use lmsp_domain::event::{ClosedItem, Event, EventKind, EventPayload};
use lmsp_domain::ids::{ItemId, ResponseId};
use lmsp_domain::ports::{CreateOutcome, StepOutcome};
use lmsp_domain::recovery::RestartPolicy;
use lmsp_domain::status::TaskStatus;
use lmsp_domain::task::{ItemStatus, OutputItems, Task};
use lmsp_domain::transition::{Refusal, Step, StepKind};

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

/// P-3, I-2: appended steps number their events after the log's last one and move the task row
/// in the same transaction: a claim makes the claimer the owner (`loading`, `response.loading`),
/// `Loaded` starts the run (`running`, `response.in_progress`).
pub async fn appended_steps_number_their_events_after_the_last_and_move_the_task_p3_i2<
    F: StoreFactory,
>(
    factory: &F,
) {
    let (store, listener) = fresh_store(factory).await;
    let worker = instance_id();
    let created = create(&store, task(instance_id(), RestartPolicy::Fail)).await;
    let mark = listener.mark();
    let outcome = store
        .append(
            created.id,
            worker,
            1,
            vec![claim(&created), Step::Loaded],
            None,
            time(1),
        )
        .await
        .unwrap();
    let (running, events) = applied(outcome);
    assert_eq!(running.status, TaskStatus::Running);
    assert_eq!(running.last_sequence_number, 3);
    assert_eq!(running.owner, worker, "the claimer owns the task");
    assert_eq!(running.started_at, Some(time(1)));
    let expected = vec![
        Event {
            task_id: created.id,
            sequence_number: 2,
            created_at: time(1),
            payload: EventPayload::Loading {
                model: created.model.clone(),
            },
        },
        Event {
            task_id: created.id,
            sequence_number: 3,
            created_at: time(1),
            payload: EventPayload::InProgress,
        },
    ];
    assert_eq!(events, expected);
    assert_eq!(store.task(created.id).await.unwrap(), Some(running));
    let (_, log) = assert_log_consistent(&store, created.id).await;
    assert_eq!(log[1..], expected[..]);
    assert_eq!(listener.events_since(mark), expected);
}

/// docs/events.md: a run's first output opens its output item and content part with its first delta
/// in one transaction; later outputs are deltas of the same item.
pub async fn the_first_output_of_a_run_opens_its_item_and_later_outputs_are_deltas_of_it<
    F: StoreFactory,
>(
    factory: &F,
) {
    let (store, _listener) = fresh_store(factory).await;
    let worker = instance_id();
    let running = task_in(
        &store,
        task(worker, RestartPolicy::Fail),
        worker,
        TaskStatus::Running,
    )
    .await;
    let item = ItemId::of(running.id, 0);
    let outcome = store
        .append(
            running.id,
            worker,
            running.last_sequence_number,
            vec![output("a "), output("b ")],
            None,
            time(10),
        )
        .await
        .unwrap();
    let (task, events) = applied(outcome);
    let payloads: Vec<EventPayload> = events.iter().map(|e| e.payload.clone()).collect();
    assert_eq!(
        payloads,
        vec![
            EventPayload::OutputItemAdded { item },
            EventPayload::ContentPartAdded { item },
            EventPayload::OutputTextDelta {
                item,
                delta: String::from("a ")
            },
            EventPayload::OutputTextDelta {
                item,
                delta: String::from("b ")
            },
        ]
    );
    assert_eq!(
        task.items,
        OutputItems {
            opened: 1,
            open: true
        }
    );
    assert_eq!(task.last_sequence_number, 7);
    let outcome = store
        .append(task.id, worker, 7, vec![output("c")], None, time(11))
        .await
        .unwrap();
    let (later, events) = applied(outcome);
    assert_eq!(
        events.iter().map(|e| e.payload.clone()).collect::<Vec<_>>(),
        vec![EventPayload::OutputTextDelta {
            item,
            delta: String::from("c")
        }]
    );
    assert_eq!(
        later.items,
        OutputItems {
            opened: 1,
            open: true
        }
    );
    let (stored, log) = assert_log_consistent(&store, task.id).await;
    assert_eq!(stored, later);
    assert_eq!(log.len(), 8);
}

/// A snapshot is stored with the output it covers, replaced by the next one, and kept by an
/// append that brings none.
pub async fn a_snapshot_is_stored_with_its_output_and_replaced_by_the_next<F: StoreFactory>(
    factory: &F,
) {
    let (store, _listener) = fresh_store(factory).await;
    let worker = instance_id();
    let running = task_in(
        &store,
        task(worker, RestartPolicy::Resume),
        worker,
        TaskStatus::Running,
    )
    .await;
    assert_eq!(store.snapshot(running.id).await.unwrap(), None);
    let first = step(
        &store,
        &running,
        worker,
        vec![output("a")],
        Some(snapshot(6, b"one")),
        time(10),
    )
    .await;
    assert_eq!(
        store.snapshot(running.id).await.unwrap(),
        Some(snapshot(6, b"one"))
    );
    let second = step(
        &store,
        &first,
        worker,
        vec![output("b")],
        Some(snapshot(7, b"two")),
        time(11),
    )
    .await;
    assert_eq!(
        store.snapshot(running.id).await.unwrap(),
        Some(snapshot(7, b"two"))
    );
    step(&store, &second, worker, vec![output("c")], None, time(12)).await;
    assert_eq!(
        store.snapshot(running.id).await.unwrap(),
        Some(snapshot(7, b"two"))
    );
    assert_eq!(store.snapshot(task_id()).await.unwrap(), None);
}

/// P-3: a batch of steps is all or nothing: when a later step is refused, the earlier ones, their
/// events and the snapshot are not written; the refusal carries the task as stored.
pub async fn a_refused_step_writes_nothing_of_its_batch_p3<F: StoreFactory>(factory: &F) {
    let (store, listener) = fresh_store(factory).await;
    let worker = instance_id();
    let running = task_in(
        &store,
        task(worker, RestartPolicy::Fail),
        worker,
        TaskStatus::Running,
    )
    .await;
    let before = step(
        &store,
        &running,
        worker,
        vec![output("a")],
        Some(snapshot(6, b"s1")),
        time(3),
    )
    .await;
    let mark = listener.mark();
    let outcome = store
        .append(
            before.id,
            worker,
            before.last_sequence_number,
            vec![output("b"), Step::Loaded],
            Some(snapshot(7, b"s2")),
            time(4),
        )
        .await
        .unwrap();
    let (task, refusal) = refused(outcome);
    assert_eq!(
        refusal,
        Refusal::WrongStatus {
            status: TaskStatus::Running,
            step: StepKind::Loaded
        }
    );
    assert_eq!(task, before, "the refusal carries the task as stored");
    assert_eq!(store.task(before.id).await.unwrap(), Some(before.clone()));
    assert_eq!(
        all_events(&store, before.id).await.len(),
        6,
        "nothing of the batch"
    );
    assert_eq!(
        store.snapshot(before.id).await.unwrap(),
        Some(snapshot(6, b"s1"))
    );
    assert!(listener.events_since(mark).is_empty());
}

/// A worker that saw an older (or a newer) log than the stored one is refused as stale: the
/// compare-and-set on `last_sequence_number`; nothing is written.
pub async fn an_append_at_a_stale_sequence_number_is_refused_as_stale<F: StoreFactory>(
    factory: &F,
) {
    let (store, listener) = fresh_store(factory).await;
    let worker = instance_id();
    let running = task_in(
        &store,
        task(worker, RestartPolicy::Fail),
        worker,
        TaskStatus::Running,
    )
    .await;
    let mark = listener.mark();
    for seen in [1, 2, 4] {
        let outcome = store
            .append(running.id, worker, seen, vec![output("x")], None, time(5))
            .await
            .unwrap();
        let (task, refusal) = refused(outcome);
        assert_eq!(refusal, Refusal::Stale { stored: 3 }, "seen {seen}");
        assert_eq!(task, running);
    }
    assert_eq!(store.task(running.id).await.unwrap(), Some(running.clone()));
    assert!(listener.events_since(mark).is_empty());
}

/// A worker step of an instance that does not own the task (another claimed or recovered it) is
/// refused as not the owner, with nothing written; a finished task refuses as finished, whoever
/// asks.
pub async fn a_step_by_an_instance_that_does_not_own_the_task_is_refused<F: StoreFactory>(
    factory: &F,
) {
    let (store, listener) = fresh_store(factory).await;
    let worker = instance_id();
    let stranger = instance_id();
    let running = task_in(
        &store,
        task(worker, RestartPolicy::Fail),
        worker,
        TaskStatus::Running,
    )
    .await;
    let mark = listener.mark();
    let outcome = store
        .append(running.id, stranger, 3, vec![output("x")], None, time(5))
        .await
        .unwrap();
    assert_eq!(refused(outcome).1, Refusal::NotOwner);
    for step in [complete(&running, "x", time(5)), fail()] {
        let outcome = store
            .finish(running.id, stranger, step, time(5))
            .await
            .unwrap();
        assert_eq!(refused(outcome).1, Refusal::NotOwner);
    }
    assert_eq!(store.task(running.id).await.unwrap(), Some(running.clone()));
    assert!(listener.events_since(mark).is_empty());
    let done = finish(&store, &running, worker, complete(&running, "", time(6))).await;
    let outcome = store
        .finish(done.id, stranger, fail(), time(7))
        .await
        .unwrap();
    assert_eq!(
        refused(outcome).1,
        Refusal::Finished {
            status: TaskStatus::Completed,
            step: StepKind::Fail
        }
    );
}

/// Steps on a task that does not exist find nothing, and write nothing.
pub async fn steps_on_an_unknown_task_find_nothing<F: StoreFactory>(factory: &F) {
    let (store, listener) = fresh_store(factory).await;
    let worker = instance_id();
    let missing = task_id();
    let claim_step = Step::Claim { model: model_id() };
    assert_eq!(
        store
            .append(missing, worker, 1, vec![claim_step], None, time(1))
            .await
            .unwrap(),
        StepOutcome::NotFound
    );
    assert_eq!(
        store
            .finish(missing, worker, fail(), time(1))
            .await
            .unwrap(),
        StepOutcome::NotFound
    );
    assert!(listener.events().is_empty());
}

/// P-3, docs/events.md: completing stores the response and drops the snapshot; the item's text, part
/// and item are closed with the response's text just before `response.completed`, in the same
/// transaction; the task is finished and accepts no further step.
pub async fn completing_stores_the_response_drops_the_snapshot_and_closes_the_item_p3<
    F: StoreFactory,
>(
    factory: &F,
) {
    let (store, listener) = fresh_store(factory).await;
    let worker = instance_id();
    let running = task_in(
        &store,
        task(worker, RestartPolicy::Resume),
        worker,
        TaskStatus::Running,
    )
    .await;
    let with_output = step(
        &store,
        &running,
        worker,
        vec![output("to "), output("be")],
        Some(snapshot(7, b"state")),
        time(10),
    )
    .await;
    let answer = response(&with_output, "to be", time(50));
    let mark = listener.mark();
    let outcome = store
        .finish(
            with_output.id,
            worker,
            Step::Complete {
                response: Box::new(answer.clone()),
            },
            time(50),
        )
        .await
        .unwrap();
    let (done, events) = applied(outcome);
    assert_eq!(done.status, TaskStatus::Completed);
    assert_eq!(done.finished_at, Some(time(50)));
    assert_eq!(
        done.items,
        OutputItems {
            opened: 1,
            open: false
        }
    );
    assert_eq!(done.last_sequence_number, 11);
    let closed = ClosedItem {
        item: ItemId::of(done.id, 0),
        text: String::from("to be"),
        status: ItemStatus::Completed,
    };
    assert_eq!(
        events.iter().map(|e| e.payload.clone()).collect::<Vec<_>>(),
        vec![
            EventPayload::OutputTextDone(closed.clone()),
            EventPayload::ContentPartDone(closed.clone()),
            EventPayload::OutputItemDone(closed),
            EventPayload::Completed {
                response: Box::new(answer.clone())
            },
        ]
    );
    assert_eq!(listener.events_since(mark), events);
    assert_eq!(store.response(done.id).await.unwrap(), Some(answer.clone()));
    assert_eq!(
        store.snapshot(done.id).await.unwrap(),
        None,
        "the snapshot is dropped"
    );
    assert_eq!(
        store.task_by_response(answer.id).await.unwrap(),
        Some(done.clone())
    );
    let (_, log) = assert_log_consistent(&store, done.id).await;
    assert_eq!(log[7..], events[..]);
    let again = store
        .finish(
            done.id,
            worker,
            complete(&done, "again", time(60)),
            time(60),
        )
        .await
        .unwrap();
    assert_eq!(
        refused(again).1,
        Refusal::Finished {
            status: TaskStatus::Completed,
            step: StepKind::Complete
        },
        "finished is absorbing"
    );
    let later = store
        .append(done.id, worker, 11, vec![output("more")], None, time(61))
        .await
        .unwrap();
    assert!(matches!(
        later,
        StepOutcome::Refused {
            refusal: Refusal::Finished { .. },
            ..
        }
    ));
    assert_eq!(store.response(done.id).await.unwrap(), Some(answer));
}

/// docs/events.md: a run that completes without output still opens and closes its item: the item and
/// its part are added with the completion.
pub async fn a_completion_without_output_opens_and_closes_its_item<F: StoreFactory>(factory: &F) {
    let (store, _listener) = fresh_store(factory).await;
    let worker = instance_id();
    let running = task_in(
        &store,
        task(worker, RestartPolicy::Fail),
        worker,
        TaskStatus::Running,
    )
    .await;
    let outcome = store
        .finish(
            running.id,
            worker,
            complete(&running, "", time(20)),
            time(20),
        )
        .await
        .unwrap();
    let (done, events) = applied(outcome);
    assert_eq!(
        kinds(&events),
        vec![
            EventKind::OutputItemAdded,
            EventKind::ContentPartAdded,
            EventKind::OutputTextDone,
            EventKind::ContentPartDone,
            EventKind::OutputItemDone,
            EventKind::Completed,
        ]
    );
    assert_eq!(
        done.items,
        OutputItems {
            opened: 1,
            open: false
        }
    );
    assert_log_consistent(&store, done.id).await;
}

/// A failure, while loading or running, stores its error with `response.failed` and drops the
/// snapshot; no response is stored.
pub async fn a_failure_stores_its_error_and_drops_the_snapshot<F: StoreFactory>(factory: &F) {
    let (store, listener) = fresh_store(factory).await;
    let worker = instance_id();
    let loading = task_in(
        &store,
        task(worker, RestartPolicy::Fail),
        worker,
        TaskStatus::Loading,
    )
    .await;
    let mark = listener.mark();
    let outcome = store
        .finish(loading.id, worker, fail(), time(30))
        .await
        .unwrap();
    let (failed, events) = applied(outcome);
    assert_eq!(failed.status, TaskStatus::Failed);
    assert_eq!(failed.error, Some(engine_error()));
    assert_eq!(failed.finished_at, Some(time(30)));
    assert_eq!(
        events,
        vec![Event {
            task_id: failed.id,
            sequence_number: 3,
            created_at: time(30),
            payload: EventPayload::Failed {
                error: engine_error()
            },
        }]
    );
    assert_eq!(listener.events_since(mark), events);
    assert_eq!(store.task(failed.id).await.unwrap(), Some(failed.clone()));

    let running = task_in(
        &store,
        task(worker, RestartPolicy::Resume),
        worker,
        TaskStatus::Running,
    )
    .await;
    let with_snapshot = step(
        &store,
        &running,
        worker,
        vec![output("x")],
        Some(snapshot(6, b"s")),
        time(31),
    )
    .await;
    let failed = finish(&store, &with_snapshot, worker, fail()).await;
    assert_eq!(failed.status, TaskStatus::Failed);
    assert_eq!(store.snapshot(failed.id).await.unwrap(), None);
    assert_eq!(store.response(failed.id).await.unwrap(), None);
    assert_log_consistent(&store, failed.id).await;
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
