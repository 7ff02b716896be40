//! Cancelling (P-4, I-3, the table of docs/api.md) and deleting a finished task now
//! (`delete_finished`, P-6).

use lmsp_domain::cancel::{CancelDecision, CancelReply};
use lmsp_domain::event::{Event, EventPayload};
use lmsp_domain::idempotency::KeyDecision;
use lmsp_domain::ports::{CancelOutcome, DeleteOutcome};
use lmsp_domain::recovery::RestartPolicy;
use lmsp_domain::status::TaskStatus;
use lmsp_domain::transition::{Refusal, Step, StepKind};

use crate::fixtures::*;
use crate::support::*;
use crate::{fresh_store, StoreFactory};

/// P-4: a cancel in each of the seven statuses decides, replies, moves and logs as the table of
/// docs/api.md says, in one transaction; the cells that change nothing write nothing.
pub async fn a_cancel_follows_the_table_in_every_status_p4<F: StoreFactory>(factory: &F) {
    let (store, listener) = fresh_store(factory).await;
    let worker = instance_id();
    let table = [
        (
            TaskStatus::Queued,
            CancelDecision::CancelledNow,
            CancelReply::Cancelled,
            TaskStatus::Cancelled,
            Some(EventPayload::Cancelled),
        ),
        (
            TaskStatus::Loading,
            CancelDecision::CancellingNow,
            CancelReply::Accepted,
            TaskStatus::Cancelling,
            Some(EventPayload::Cancelling),
        ),
        (
            TaskStatus::Running,
            CancelDecision::CancellingNow,
            CancelReply::Accepted,
            TaskStatus::Cancelling,
            Some(EventPayload::Cancelling),
        ),
        (
            TaskStatus::Cancelling,
            CancelDecision::AlreadyCancelling,
            CancelReply::Accepted,
            TaskStatus::Cancelling,
            None,
        ),
        (
            TaskStatus::Cancelled,
            CancelDecision::AlreadyCancelled,
            CancelReply::Cancelled,
            TaskStatus::Cancelled,
            None,
        ),
        (
            TaskStatus::Completed,
            CancelDecision::NotCancellable,
            CancelReply::NotCancellable,
            TaskStatus::Completed,
            None,
        ),
        (
            TaskStatus::Failed,
            CancelDecision::NotCancellable,
            CancelReply::NotCancellable,
            TaskStatus::Failed,
            None,
        ),
    ];
    for (status, decision, reply, after, event) in table {
        let before = task_in(&store, task(worker, RestartPolicy::Fail), worker, status).await;
        let mark = listener.mark();
        let outcome = store.cancel(before.id, None, time(100)).await.unwrap();
        let (got, task) = decided(outcome);
        assert_eq!(got, decision, "P-4: the decision for {status}");
        assert_eq!(got.reply(), reply, "P-4: the reply for {status}");
        assert_eq!(
            task.status, after,
            "P-4: the status after a cancel of {status}"
        );
        assert_eq!(store.task(before.id).await.unwrap(), Some(task.clone()));
        let heard = listener.events_since(mark);
        match event {
            Some(payload) => {
                let expected = Event {
                    task_id: before.id,
                    sequence_number: before.last_sequence_number + 1,
                    created_at: time(100),
                    payload,
                };
                assert_eq!(heard, vec![expected.clone()], "the event of {status}");
                assert_eq!(task.last_sequence_number, before.last_sequence_number + 1);
                let (_, log) = assert_log_consistent(&store, before.id).await;
                assert_eq!(log.last(), Some(&expected));
            }
            None => {
                assert_eq!(task, before, "nothing changes for {status}");
                assert!(heard.is_empty(), "nothing is written for {status}");
            }
        }
        if after == TaskStatus::Cancelled && status != TaskStatus::Cancelled {
            assert_eq!(task.finished_at, Some(time(100)));
        }
    }
}

/// P-4, I-3: once a cancel was accepted while work was under way, the only way out of
/// `cancelling` is the owner's acknowledgement: its output, completion and failure are refused,
/// and the acknowledgement ends the task `cancelled` with `response.cancelled`, dropping the
/// snapshot.
pub async fn after_an_accepted_cancel_the_worker_can_only_acknowledge_it_p4_i3<F: StoreFactory>(
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
    let running = step(
        &store,
        &running,
        worker,
        vec![output("a")],
        Some(snapshot(6, b"s")),
        time(10),
    )
    .await;
    let (decision, cancelling) = decided(store.cancel(running.id, None, time(11)).await.unwrap());
    assert_eq!(decision, CancelDecision::CancellingNow);
    let mark = listener.mark();
    let outcome = store
        .append(
            running.id,
            worker,
            cancelling.last_sequence_number,
            vec![output("b")],
            None,
            time(12),
        )
        .await
        .unwrap();
    assert_eq!(
        refused(outcome).1,
        Refusal::CancelPending {
            step: StepKind::Output
        }
    );
    for (step, kind) in [
        (complete(&running, "a", time(12)), StepKind::Complete),
        (fail(), StepKind::Fail),
    ] {
        let outcome = store
            .finish(running.id, worker, step, time(12))
            .await
            .unwrap();
        assert_eq!(refused(outcome).1, Refusal::CancelPending { step: kind });
    }
    let outcome = store
        .finish(running.id, instance_id(), Step::AcknowledgeCancel, time(12))
        .await
        .unwrap();
    assert_eq!(
        refused(outcome).1,
        Refusal::NotOwner,
        "only the owner acknowledges"
    );
    assert!(listener.events_since(mark).is_empty());
    let outcome = store
        .finish(running.id, worker, Step::AcknowledgeCancel, time(13))
        .await
        .unwrap();
    let (cancelled, events) = applied(outcome);
    assert_eq!(cancelled.status, TaskStatus::Cancelled);
    assert_eq!(cancelled.finished_at, Some(time(13)));
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].payload, EventPayload::Cancelled);
    assert_eq!(store.snapshot(running.id).await.unwrap(), None);
    assert_eq!(store.response(running.id).await.unwrap(), None);
    let (_, log) = assert_log_consistent(&store, running.id).await;
    assert!(
        !log.iter()
            .any(|e| e.kind() == lmsp_domain::event::EventKind::Completed),
        "I-3"
    );
}

/// I-7: a cancel restricted to a client finds only that client's tasks; another client's task
/// is not found and not touched; an unknown task is not found.
pub async fn a_cancel_for_a_client_finds_only_that_clients_tasks_i7<F: StoreFactory>(factory: &F) {
    let (store, listener) = fresh_store(factory).await;
    let queued = create(&store, task(instance_id(), RestartPolicy::Fail)).await;
    let mark = listener.mark();
    assert_eq!(
        store
            .cancel(queued.id, Some(client_id()), time(1))
            .await
            .unwrap(),
        CancelOutcome::NotFound
    );
    assert_eq!(store.task(queued.id).await.unwrap(), Some(queued.clone()));
    assert_eq!(
        store.cancel(task_id(), None, time(1)).await.unwrap(),
        CancelOutcome::NotFound
    );
    assert!(listener.events_since(mark).is_empty());
    let (decision, task) = decided(
        store
            .cancel(queued.id, Some(queued.client_id), time(2))
            .await
            .unwrap(),
    );
    assert_eq!(decision, CancelDecision::CancelledNow);
    assert_eq!(task.status, TaskStatus::Cancelled);
}

/// P-6: `delete_finished` removes a finished task now with its events, response and snapshot;
/// an unfinished task is refused and kept; another client's task and an unknown one are not
/// found; the idempotency record of a deleted task stays, its reply no longer naming the task.
pub async fn delete_finished_removes_only_a_finished_task_of_the_client_p6<F: StoreFactory>(
    factory: &F,
) {
    let (store, listener) = fresh_store(factory).await;
    let worker = instance_id();
    let new = task(worker, RestartPolicy::Fail);
    let record = record_for(&new, "deleted-task");
    store
        .create_task(new.clone(), Some(record.clone()))
        .await
        .unwrap();
    store.release_key(&record.scope, &record.key).await.unwrap();
    let running = step(
        &store,
        &new,
        worker,
        vec![claim(&new), Step::Loaded, output("x")],
        None,
        time(1),
    )
    .await;
    let done = finish(&store, &running, worker, complete(&running, "x", time(2))).await;
    let unfinished = task_in(
        &store,
        task(worker, RestartPolicy::Fail),
        worker,
        TaskStatus::Running,
    )
    .await;
    let mark = listener.mark();
    assert_eq!(
        store.delete_finished(unfinished.id, None).await.unwrap(),
        DeleteOutcome::Unfinished,
        "P-6"
    );
    assert_eq!(
        store.task(unfinished.id).await.unwrap(),
        Some(unfinished.clone())
    );
    assert_eq!(
        store
            .delete_finished(done.id, Some(client_id()))
            .await
            .unwrap(),
        DeleteOutcome::NotFound,
        "I-7: another client's task"
    );
    assert!(store.task(done.id).await.unwrap().is_some());
    assert_eq!(
        store.delete_finished(task_id(), None).await.unwrap(),
        DeleteOutcome::NotFound
    );
    assert_eq!(
        store
            .delete_finished(done.id, Some(done.client_id))
            .await
            .unwrap(),
        DeleteOutcome::Deleted
    );
    assert_eq!(store.task(done.id).await.unwrap(), None);
    assert!(all_events(&store, done.id).await.is_empty());
    assert_eq!(store.response(done.id).await.unwrap(), None);
    assert_eq!(
        store.task_by_response(done.response_id).await.unwrap(),
        None
    );
    assert_eq!(store.snapshot(done.id).await.unwrap(), None);
    assert_eq!(
        store.delete_finished(done.id, None).await.unwrap(),
        DeleteOutcome::NotFound,
        "gone"
    );
    assert!(
        listener.events_since(mark).is_empty(),
        "a deletion writes no event"
    );
    let claim = task_claim(&new, "deleted-task");
    let reply = match store.claim_key(&claim, time(10)).await.unwrap() {
        KeyDecision::Replay(reply) => reply,
        other => panic!("the key of a deleted task still replays, not {other:?}"),
    };
    assert_eq!(
        reply.task_id, None,
        "the reply no longer names the deleted task"
    );
    assert_eq!(reply.body, reply_for(&new).body);
    assert_log_consistent(&store, unfinished.id).await;
}
