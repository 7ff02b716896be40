//! Recovery against an oracle (P-11, I-5): whatever way an adapter writes a recovery (task by
//! task, or each cell of the table as set-based statements), the rows and events it leaves are
//! exactly what the domain's `recover` decides for each task alone.

use lmsp_domain::event::{Event, EventPayload};
use lmsp_domain::ids::{InstanceId, ItemId, TaskId};
use lmsp_domain::ports::Store;
use lmsp_domain::recovery::{self, needs_open_item_text, recover, RestartPolicy};
use lmsp_domain::status::TaskStatus;
use lmsp_domain::task::Task;
use lmsp_domain::time::Timestamp;
use lmsp_domain::transition::Advanced;

use crate::fixtures::*;
use crate::support::*;
use crate::{fresh_store, StoreFactory};

/// How much a leftover had done before its instance stopped.
#[derive(Debug, Clone, Copy)]
enum Progress {
    /// Nothing beyond its status.
    Bare,
    /// Output in an open item, no snapshot.
    Output,
    /// Output in an open item and a snapshot covering part of it.
    OutputAndSnapshot,
}

/// A leftover of instance `gone` in `status` under `policy`, having done `progress`
/// (output needs a run: for `queued` and `loading` only `Bare` applies).
async fn leftover<S: Store + ?Sized>(
    store: &S,
    gone: InstanceId,
    status: TaskStatus,
    policy: RestartPolicy,
    progress: Progress,
) -> Task {
    let with_output = matches!(status, TaskStatus::Running | TaskStatus::Cancelling)
        && !matches!(progress, Progress::Bare);
    if !with_output {
        return task_in(store, task(gone, policy), gone, status).await;
    }
    let running = task_in(store, task(gone, policy), gone, TaskStatus::Running).await;
    let first = step(
        store,
        &running,
        gone,
        vec![output("once "), output("upon ")],
        None,
        time(3),
    )
    .await;
    let covered = first.last_sequence_number;
    let snapshot = matches!(progress, Progress::OutputAndSnapshot).then(|| snapshot(covered, b"s"));
    let later = step(
        store,
        &first,
        gone,
        vec![output("a time")],
        snapshot,
        time(4),
    )
    .await;
    if status == TaskStatus::Cancelling {
        decided(store.cancel(later.id, None, time(5)).await.expect("cancel")).1
    } else {
        later
    }
}

/// The text of a task's open item so far: its deltas, joined.
fn open_item_text(task: &Task, log: &[Event]) -> String {
    let open = ItemId::of(task.id, task.items.opened.saturating_sub(1));
    log.iter()
        .filter_map(|event| match &event.payload {
            EventPayload::OutputTextDelta { item, delta } if *item == open => Some(delta.as_str()),
            _ => None,
        })
        .collect()
}

/// What the domain decides for one leftover, from what is stored of it: its row, its log and
/// its snapshot.
async fn decided_alone<S: Store + ?Sized>(
    store: &S,
    id: TaskId,
    rescuer: InstanceId,
    at: Timestamp,
) -> (Task, Option<Advanced>) {
    let before = store.task(id).await.unwrap().expect("the leftover");
    let log = all_events(store, id).await;
    let covers = match before.status {
        TaskStatus::Running => store
            .snapshot(id)
            .await
            .unwrap()
            .map(|snapshot| snapshot.sequence_number),
        _ => None,
    };
    let text = needs_open_item_text(&before).then(|| open_item_text(&before, &log));
    let decided = recover(&before, rescuer, covers, text, at);
    (before, decided)
}

/// P-11, I-5: every leftover of every cell of the table — with and without output in an open
/// item, with and without a snapshot — beside tasks of a live instance and finished ones, is
/// recovered into exactly the row and events that the domain's `recover` decides for it alone;
/// snapshots stay only with unfinished tasks; the report counts what moved, what stayed, and
/// names the resumed tasks oldest first.
pub async fn recovery_writes_exactly_what_the_domain_decides_for_each_task_p11_i5<
    F: StoreFactory,
>(
    factory: &F,
) {
    let (store, _listener) = fresh_store(factory).await;
    let gone = register(&store, "gone", time(0)).await.id;
    let mut ids = Vec::new();
    // Cell by cell of the domain's recovery table as data (every unfinished status under every
    // policy), whatever way the adapter writes a cell.
    for cell in &recovery::TABLE {
        for progress in [
            Progress::Bare,
            Progress::Output,
            Progress::OutputAndSnapshot,
        ] {
            ids.push(
                leftover(&store, gone, cell.status, cell.policy, progress)
                    .await
                    .id,
            );
        }
    }
    for status in [
        TaskStatus::Completed,
        TaskStatus::Failed,
        TaskStatus::Cancelled,
    ] {
        ids.push(
            task_in(&store, task(gone, RestartPolicy::Resume), gone, status)
                .await
                .id,
        );
    }
    store.retire_instance(gone, time(900)).await.unwrap();
    let rescuer = register(&store, "rescuer", time(950)).await.id;
    let live = task_in(
        &store,
        task(rescuer, RestartPolicy::Fail),
        rescuer,
        TaskStatus::Running,
    )
    .await;
    ids.push(live.id);
    let at = time(1_000);
    let mut expected = Vec::new();
    for id in &ids {
        expected.push(decided_alone(&store, *id, rescuer, at).await);
    }

    let report = store.recover_instance(gone, rescuer, at).await.unwrap();

    let mut resumed = Vec::new();
    let (mut moved, mut untouched) = (0, 0);
    for (before, decided) in &expected {
        let after = store.task(before.id).await.unwrap().expect("the task");
        let new_events: Vec<Event> = all_events(&store, before.id)
            .await
            .into_iter()
            .filter(|event| event.sequence_number > before.last_sequence_number)
            .collect();
        match decided {
            Some(advanced) => {
                moved += 1;
                assert_eq!(after, advanced.task, "the row of {:?}", before.status);
                assert_eq!(
                    new_events, advanced.events,
                    "the events of {:?}",
                    before.status
                );
                if new_events
                    .iter()
                    .any(|event| matches!(event.payload, EventPayload::Resumed { .. }))
                {
                    resumed.push(before.id);
                }
            }
            None => {
                if !before.status.is_finished() && before.owner == gone {
                    untouched += 1;
                }
                assert_eq!(&after, before, "an untouched task is unchanged");
                assert!(new_events.is_empty(), "an untouched task gets no event");
            }
        }
        if after.status.is_finished() {
            assert_eq!(store.snapshot(before.id).await.unwrap(), None);
        }
        assert_log_consistent(&store, before.id).await;
    }
    resumed.sort_unstable();
    assert_eq!(report.moved, moved);
    assert_eq!(report.untouched, untouched);
    assert_eq!(report.resumed, resumed);
    assert!(
        !resumed.is_empty() && moved > 20,
        "every kind of move was exercised"
    );
}
