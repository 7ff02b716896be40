//! The worker's steps as a compare-and-set: `append` numbers its events after the log's last one
//! and moves the task row in the same transaction (P-3, I-2), and refuses, writing nothing, a
//! batch with a refused step, a stale sequence number, a worker that does not own the task, or a
//! task that does not exist.

use lmsp_domain::event::{Event, EventPayload};
use lmsp_domain::ports::StepOutcome;
use lmsp_domain::recovery::RestartPolicy;
use lmsp_domain::status::TaskStatus;
use lmsp_domain::transition::{Refusal, Step, StepKind};

use crate::fixtures::*;
use crate::support::*;
use crate::{fresh_store, StoreFactory};

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
