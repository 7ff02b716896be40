//! A run's output and its end: the output item structure of docs/events.md (the first output
//! opens the item, later ones are its deltas, the end closes it), the snapshot stored with the
//! output it covers, and `finish` (completion stores the response, failure its error; both drop
//! the snapshot, P-3).

use lmsp_domain::event::{ClosedItem, Event, EventKind, EventPayload};
use lmsp_domain::ids::ItemId;
use lmsp_domain::ports::StepOutcome;
use lmsp_domain::recovery::RestartPolicy;
use lmsp_domain::status::TaskStatus;
use lmsp_domain::task::{ItemStatus, OutputItems};
use lmsp_domain::transition::{Refusal, Step, StepKind};

use crate::fixtures::*;
use crate::support::*;
use crate::{fresh_store, StoreFactory};

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
