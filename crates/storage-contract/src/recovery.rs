//! Instances and recovery (P-7…P-11, I-5): registering, renewing and retiring, the stopped
//! instances, and `recover_instance` applying the recovery table of docs/rules.md to every leftover
//! task of a stopped instance on behalf of a rescuer.

use lmsp_domain::event::{ClosedItem, EventKind, EventPayload, QueueReason};
use lmsp_domain::ids::{InstanceId, ItemId};
use lmsp_domain::ports::{Registration, Snapshot, Store};
use lmsp_domain::recovery::RestartPolicy;
use lmsp_domain::status::TaskStatus;
use lmsp_domain::task::{ItemStatus, OutputItems, Task, TaskError};
use lmsp_domain::time::Timestamp;
use lmsp_domain::transition::Step;

use crate::fixtures::*;
use crate::support::*;
use crate::{fresh_store, StoreFactory};

/// Retires `stopped` and registers a rescuer; checks that the rescuer sees `stopped` stopped.
async fn stop_and_rescue<S: Store + ?Sized>(
    store: &S,
    stopped: InstanceId,
    at: Timestamp,
) -> InstanceId {
    store.retire_instance(stopped, at).await.unwrap();
    let rescuer = register(store, "rescuer", at).await.id;
    let listed = store.stopped_instances(rescuer, at).await.unwrap();
    assert!(
        listed.contains(&stopped),
        "a retired instance with tasks is stopped: {listed:?}"
    );
    assert!(!listed.contains(&rescuer), "never the asking instance");
    rescuer
}

/// An instance registers on an empty store, renews its lease while it runs, and after it
/// retires its lease no longer renews and it is listed as stopped (it has tasks to recover)
/// until it is recovered; the asking instance is never listed.
pub async fn an_instance_registers_renews_its_lease_and_is_stopped_once_it_retires<
    F: StoreFactory,
>(
    factory: &F,
) {
    let (store, _listener) = fresh_store(factory).await;
    let first = instance("host-a", time(0), 10_000);
    assert_eq!(
        store.register_instance(first.clone()).await.unwrap(),
        Registration::Registered { previous: vec![] }
    );
    assert!(store
        .renew_lease(first.id, time(20_000), time(5_000))
        .await
        .unwrap());
    assert!(store
        .stopped_instances(first.id, time(5_000))
        .await
        .unwrap()
        .is_empty());
    let left = task_in(
        &store,
        task(first.id, RestartPolicy::Fail),
        first.id,
        TaskStatus::Running,
    )
    .await;
    let rescuer = stop_and_rescue(&store, first.id, time(6_000)).await;
    assert!(
        !store
            .renew_lease(first.id, time(40_000), time(7_000))
            .await
            .unwrap(),
        "a retired instance's lease does not renew"
    );
    let report = store
        .recover_instance(first.id, rescuer, time(7_000))
        .await
        .unwrap();
    assert_eq!(report.moved, 1);
    let recovered = store.task(left.id).await.unwrap().expect("the task");
    assert_eq!(recovered.owner, rescuer);
    let listed = store.stopped_instances(rescuer, time(8_000)).await.unwrap();
    assert!(
        !listed.contains(&first.id),
        "a recovered instance is not listed again"
    );
    assert!(store
        .renew_lease(rescuer, time(60_000), time(8_000))
        .await
        .unwrap());
}

/// The lone registered instance leads the maintenance, every time it asks.
pub async fn a_lone_registered_instance_leads_the_maintenance<F: StoreFactory>(factory: &F) {
    let (store, _listener) = fresh_store(factory).await;
    let only = register(&store, "host-a", time(0)).await;
    assert!(store.lead_maintenance(only.id).await.unwrap());
    assert!(store.lead_maintenance(only.id).await.unwrap(), "and again");
}

/// What a leftover task must become, per docs/rules.md.
struct Expected {
    before: Task,
    status: TaskStatus,
    /// The events recovery appends, without their numbers and times.
    events: Vec<EventPayload>,
    snapshot_after: Option<Snapshot>,
}

/// P-7…P-11, I-5: every leftover task of a stopped instance moves exactly per the recovery table
/// (docs/rules.md), each move with its event in the same transaction as its new state (P-11), `restarts + 1`
/// and the rescuer as its owner; a task moved to `failed` gets `server_restarted` (P-9), one moved
/// to `cancelled` gets `response.cancelled` (P-10), a resumed one `response.resumed` naming where
/// its snapshot ends; a queued task that stays queued, finished tasks and the tasks of a live
/// instance are untouched; the report counts the moves and lists the resumed tasks oldest first.
pub async fn recovery_moves_every_leftover_task_per_the_table_p7_p8_p9_p10_p11_i5<
    F: StoreFactory,
>(
    factory: &F,
) {
    let (store, listener) = fresh_store(factory).await;
    let gone = register(&store, "gone", time(0)).await.id;
    let mut expected = Vec::new();
    let failed = |before: Task| Expected {
        before,
        status: TaskStatus::Failed,
        events: vec![EventPayload::Failed {
            error: TaskError::server_restarted(),
        }],
        snapshot_after: None,
    };
    let queued = |before: Task| Expected {
        before,
        status: TaskStatus::Queued,
        events: vec![EventPayload::Queued {
            reason: QueueReason::ServerRestarted,
        }],
        snapshot_after: None,
    };
    let cancelled = |before: Task| Expected {
        before,
        status: TaskStatus::Cancelled,
        events: vec![EventPayload::Cancelled],
        snapshot_after: None,
    };
    let untouched = |before: Task| Expected {
        status: before.status,
        before,
        events: vec![],
        snapshot_after: None,
    };
    let new = |policy| task(gone, policy);
    use RestartPolicy::{Fail, Resume, Retry};
    expected.push(failed(
        task_in(&store, new(Fail), gone, TaskStatus::Queued).await,
    ));
    expected.push(untouched(
        task_in(&store, new(Retry), gone, TaskStatus::Queued).await,
    ));
    expected.push(untouched(
        task_in(&store, new(Resume), gone, TaskStatus::Queued).await,
    ));
    expected.push(failed(
        task_in(&store, new(Fail), gone, TaskStatus::Loading).await,
    ));
    expected.push(queued(
        task_in(&store, new(Retry), gone, TaskStatus::Loading).await,
    ));
    expected.push(queued(
        task_in(&store, new(Resume), gone, TaskStatus::Loading).await,
    ));
    expected.push(failed(
        task_in(&store, new(Fail), gone, TaskStatus::Running).await,
    ));
    expected.push(queued(
        task_in(&store, new(Retry), gone, TaskStatus::Running).await,
    ));
    let running = task_in(&store, new(Resume), gone, TaskStatus::Running).await;
    let resumed = step(
        &store,
        &running,
        gone,
        vec![output("a"), output("b")],
        Some(snapshot(6, b"at 6")),
        time(3),
    )
    .await;
    expected.push(Expected {
        before: resumed.clone(),
        status: TaskStatus::Running,
        events: vec![EventPayload::Resumed {
            from_sequence_number: 6,
        }],
        snapshot_after: Some(snapshot(6, b"at 6")),
    });
    let bare = task_in(&store, new(Resume), gone, TaskStatus::Running).await;
    expected.push(Expected {
        before: bare.clone(),
        status: TaskStatus::Running,
        events: vec![EventPayload::Resumed {
            from_sequence_number: 3,
        }],
        snapshot_after: None,
    });
    for policy in [Fail, Retry, Resume] {
        expected.push(cancelled(
            task_in(&store, new(policy), gone, TaskStatus::Cancelling).await,
        ));
    }
    for status in [
        TaskStatus::Completed,
        TaskStatus::Failed,
        TaskStatus::Cancelled,
    ] {
        expected.push(untouched(task_in(&store, new(Retry), gone, status).await));
    }
    let alive = register(&store, "alive", time(0)).await.id;
    let not_leftover = task_in(&store, task(alive, Fail), alive, TaskStatus::Running).await;

    let at = time(1_000);
    let rescuer = stop_and_rescue(&store, gone, at).await;
    let mark = listener.mark();
    let report = store.recover_instance(gone, rescuer, at).await.unwrap();
    assert_eq!(
        report.moved, 11,
        "P-7: every leftover that moves: {report:?}"
    );
    assert_eq!(
        report.untouched, 2,
        "the queued retry and resume tasks: {report:?}"
    );
    assert_eq!(
        report.resumed,
        vec![resumed.id, bare.id],
        "the resumed tasks, oldest first"
    );

    let mut heard_expected = Vec::new();
    for cell in &expected {
        let id = cell.before.id;
        let (after, log) = assert_log_consistent(&store, id).await;
        let what = format!(
            "{} {} under {}",
            id, cell.before.status, cell.before.on_restart
        );
        assert_eq!(after.status, cell.status, "P-8: {what}");
        if cell.events.is_empty() {
            assert_eq!(after, cell.before, "untouched: {what}");
            continue;
        }
        let written = &log[cell.before.last_sequence_number as usize..];
        let payloads: Vec<_> = written.iter().map(|e| e.payload.clone()).collect();
        assert_eq!(
            payloads, cell.events,
            "P-9, P-10, P-11: the events of {what}"
        );
        assert!(written.iter().all(|e| e.created_at == at));
        assert_eq!(
            after.restarts,
            cell.before.restarts + 1,
            "P-11: restarts of {what}"
        );
        assert_eq!(after.owner, rescuer, "the rescuer owns {what}");
        if cell.status == TaskStatus::Failed {
            assert_eq!(
                after.error,
                Some(TaskError::server_restarted()),
                "P-9: {what}"
            );
        }
        if cell.status.is_finished() {
            assert_eq!(after.finished_at, Some(at), "{what}");
            assert_eq!(store.snapshot(id).await.unwrap(), None, "{what}");
        }
        if cell.status == TaskStatus::Running {
            assert_eq!(
                store.snapshot(id).await.unwrap(),
                cell.snapshot_after,
                "{what}"
            );
        }
        heard_expected.extend(written.iter().cloned());
    }
    let mut heard = listener.events_since(mark);
    heard.sort_by_key(|e| (e.task_id, e.sequence_number));
    heard_expected.sort_by_key(|e| (e.task_id, e.sequence_number));
    assert_eq!(
        heard, heard_expected,
        "the listener heard every move's events"
    );
    assert_eq!(
        store.task(not_leftover.id).await.unwrap(),
        Some(not_leftover),
        "a live instance's task is untouched"
    );
    assert!(!store
        .stopped_instances(rescuer, at)
        .await
        .unwrap()
        .contains(&gone));
}

/// I-5: running the recovery of a stopped instance again, by the same rescuer or another one,
/// changes nothing: no task moves, no event is written or heard.
pub async fn a_second_recovery_changes_nothing_i5<F: StoreFactory>(factory: &F) {
    let (store, listener) = fresh_store(factory).await;
    let gone = register(&store, "gone", time(0)).await.id;
    let mut ids = Vec::new();
    for policy in RestartPolicy::ALL {
        for status in TaskStatus::UNFINISHED {
            ids.push(task_in(&store, task(gone, *policy), gone, status).await.id);
        }
    }
    let rescuer = stop_and_rescue(&store, gone, time(1_000)).await;
    let first = store
        .recover_instance(gone, rescuer, time(1_000))
        .await
        .unwrap();
    assert_eq!(first.moved, 10);
    let mut before = Vec::new();
    for id in &ids {
        before.push(assert_log_consistent(&store, *id).await);
    }
    let mark = listener.mark();
    let again = store
        .recover_instance(gone, rescuer, time(2_000))
        .await
        .unwrap();
    assert_eq!((again.moved, again.resumed.len()), (0, 0), "I-5: {again:?}");
    let other = register(&store, "another rescuer", time(3_000)).await.id;
    let by_other = store
        .recover_instance(gone, other, time(3_000))
        .await
        .unwrap();
    assert_eq!(
        (by_other.moved, by_other.resumed.len()),
        (0, 0),
        "I-5: {by_other:?}"
    );
    for (id, (task, log)) in ids.iter().zip(before) {
        let (now, now_log) = assert_log_consistent(&store, *id).await;
        assert_eq!(now, task, "I-5: {id}");
        assert_eq!(now_log, log, "I-5: {id}");
    }
    assert!(listener.events_since(mark).is_empty(), "I-5: nothing heard");
}

/// docs/events.md, docs/rules.md: a `retry` task put back in the queue has its open item closed as incomplete,
/// with the item's text so far, just before `response.queued`; its next run starts from nothing
/// (claiming it drops the old snapshot) and opens the next item, whose text is the response's.
pub async fn a_requeued_task_closes_its_open_item_as_incomplete_and_its_next_run_opens_a_new_one<
    F: StoreFactory,
>(
    factory: &F,
) {
    let (store, listener) = fresh_store(factory).await;
    let gone = register(&store, "gone", time(0)).await.id;
    let running = task_in(
        &store,
        task(gone, RestartPolicy::Retry),
        gone,
        TaskStatus::Running,
    )
    .await;
    let running = step(
        &store,
        &running,
        gone,
        vec![output("a "), output("b ")],
        Some(snapshot(7, b"s")),
        time(3),
    )
    .await;
    let rescuer = stop_and_rescue(&store, gone, time(1_000)).await;
    let mark = listener.mark();
    store
        .recover_instance(gone, rescuer, time(1_000))
        .await
        .unwrap();
    let first_item = ItemId::of(running.id, 0);
    let heard: Vec<_> = listener
        .events_since(mark)
        .into_iter()
        .map(|e| e.payload)
        .collect();
    assert_eq!(
        heard,
        vec![
            EventPayload::OutputItemDone(ClosedItem {
                item: first_item,
                text: String::from("a b "),
                status: ItemStatus::Incomplete,
            }),
            EventPayload::Queued {
                reason: QueueReason::ServerRestarted
            },
        ]
    );
    let (queued, _) = assert_log_consistent(&store, running.id).await;
    assert_eq!(
        queued.items,
        OutputItems {
            opened: 1,
            open: false
        }
    );
    assert_eq!(queued.status, TaskStatus::Queued);

    let claimed = store
        .claim_next(rescuer, time(1_001))
        .await
        .unwrap()
        .expect("the requeued task");
    assert_eq!(claimed.id, running.id);
    assert_eq!(
        store.snapshot(running.id).await.unwrap(),
        None,
        "the new run starts from nothing"
    );
    let loaded = step(
        &store,
        &claimed,
        rescuer,
        vec![Step::Loaded],
        None,
        time(1_002),
    )
    .await;
    let outcome = store
        .append(
            loaded.id,
            rescuer,
            loaded.last_sequence_number,
            vec![output("c")],
            None,
            time(1_003),
        )
        .await
        .unwrap();
    let (second_run, events) = applied(outcome);
    let next_item = ItemId::of(running.id, 1);
    assert_eq!(
        kinds(&events),
        vec![
            EventKind::OutputItemAdded,
            EventKind::ContentPartAdded,
            EventKind::OutputTextDelta
        ]
    );
    assert!(
        events.iter().all(|e| e.payload.item() == Some(next_item)),
        "the next item"
    );
    let done = finish(
        &store,
        &second_run,
        rescuer,
        complete(&second_run, "c", time(1_004)),
    )
    .await;
    let (_, log) = assert_log_consistent(&store, done.id).await;
    let closed: Vec<_> = log
        .iter()
        .filter(|e| e.kind() == EventKind::OutputItemDone)
        .map(|e| e.payload.clone())
        .collect();
    assert_eq!(closed.len(), 2);
    assert_eq!(
        closed[1],
        EventPayload::OutputItemDone(ClosedItem {
            item: next_item,
            text: String::from("c"),
            status: ItemStatus::Completed,
        })
    );
    assert_eq!(
        store
            .response(done.id)
            .await
            .unwrap()
            .map(|r| r.output_text),
        Some(String::from("c"))
    );
}

/// docs/events.md, docs/rules.md: a `resume` task continued from its snapshot keeps its open item: the resumed
/// run's output continues that item with deltas only.
pub async fn a_resumed_task_continues_its_open_item<F: StoreFactory>(factory: &F) {
    let (store, _listener) = fresh_store(factory).await;
    let gone = register(&store, "gone", time(0)).await.id;
    let running = task_in(
        &store,
        task(gone, RestartPolicy::Resume),
        gone,
        TaskStatus::Running,
    )
    .await;
    let running = step(
        &store,
        &running,
        gone,
        vec![output("a ")],
        Some(snapshot(6, b"s")),
        time(3),
    )
    .await;
    let rescuer = stop_and_rescue(&store, gone, time(1_000)).await;
    let report = store
        .recover_instance(gone, rescuer, time(1_000))
        .await
        .unwrap();
    assert_eq!(report.resumed, vec![running.id]);
    let (resumed, _) = assert_log_consistent(&store, running.id).await;
    assert_eq!(resumed.status, TaskStatus::Running);
    assert_eq!(
        resumed.items,
        OutputItems {
            opened: 1,
            open: true
        }
    );
    assert_eq!(
        store.snapshot(running.id).await.unwrap(),
        Some(snapshot(6, b"s"))
    );
    let outcome = store
        .append(
            resumed.id,
            rescuer,
            resumed.last_sequence_number,
            vec![output("b")],
            None,
            time(1_001),
        )
        .await
        .unwrap();
    let (_, events) = applied(outcome);
    assert_eq!(
        events.iter().map(|e| e.payload.clone()).collect::<Vec<_>>(),
        vec![EventPayload::OutputTextDelta {
            item: ItemId::of(running.id, 0),
            delta: String::from("b")
        }]
    );
    let stale_owner = store
        .append(
            resumed.id,
            gone,
            resumed.last_sequence_number + 1,
            vec![output("x")],
            None,
            time(1_002),
        )
        .await
        .unwrap();
    assert_eq!(
        refused(stale_owner).1,
        lmsp_domain::transition::Refusal::NotOwner,
        "the stopped instance lost it"
    );
}
