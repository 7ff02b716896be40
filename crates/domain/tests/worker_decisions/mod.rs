//! What a worker makes of its task as stored (P-4, I-6): the meaning of a refused step
//! (`worker::after_refusal`), of a resumed task (`worker::resumed`), and where a resumed run
//! continues (`resume::resume_point`). Part of the `properties` test binary.

use lmsp_domain::event::{Event, EventPayload, QueueReason};
use lmsp_domain::ids::ItemId;
use lmsp_domain::ports::Snapshot;
use lmsp_domain::recovery::RestartPolicy;
use lmsp_domain::resume::resume_point;
use lmsp_domain::task::Task;
use lmsp_domain::transition::{Refusal, StepKind};
use lmsp_domain::worker::{after_refusal, owes_acknowledgement, resumed, AfterRefusal, Resumed};
use lmsp_domain::{TaskStatus, Timestamp};
use proptest::prelude::*;
use proptest::sample::select;

use crate::support::{any_instance, any_task, config, instance, queued_task};

fn stored(status: TaskStatus, owner: u64, last_sequence_number: u64) -> Task {
    let mut task = queued_task(7, instance(owner), RestartPolicy::Resume);
    task.status = status;
    task.last_sequence_number = last_sequence_number;
    task
}

fn every_refusal(stored_at: u64) -> Vec<Refusal> {
    vec![
        Refusal::Finished {
            status: TaskStatus::Completed,
            step: StepKind::Output,
        },
        Refusal::CancelPending {
            step: StepKind::Output,
        },
        Refusal::WrongStatus {
            status: TaskStatus::Queued,
            step: StepKind::Output,
        },
        Refusal::ForeignResponse,
        Refusal::NotOwner,
        Refusal::Stale { stored: stored_at },
    ]
}

/// P-4: a task `cancelling` in the worker's care is the worker's to acknowledge, whatever the
/// refusal said (a stale append lost the race with the cancel, a finishing step met it).
#[test]
fn a_cancel_the_workers_instance_owes_is_acknowledged_after_any_refusal_p4() {
    let task = stored(TaskStatus::Cancelling, 0, 12);
    for refusal in every_refusal(12) {
        for expected in [None, Some(12), Some(11)] {
            assert_eq!(
                after_refusal(refusal, &task, instance(0), expected),
                AfterRefusal::Acknowledge,
                "{refusal:?} {expected:?}"
            );
        }
    }
}

/// P-4: a cancel of a task in another instance's care is that instance's to acknowledge; a
/// worker that is no longer the owner leaves it, even when its write looked already applied.
#[test]
fn a_cancelling_task_of_another_instance_is_left() {
    let task = stored(TaskStatus::Cancelling, 1, 12);
    for refusal in every_refusal(12) {
        assert_eq!(
            after_refusal(refusal, &task, instance(0), Some(11)),
            AfterRefusal::Leave,
            "{refusal:?}"
        );
    }
    assert!(!owes_acknowledgement(&task, instance(0)));
    assert!(owes_acknowledgement(&task, instance(1)));
}

/// A retried append whose first try committed after all finds the log exactly where its steps
/// lead: the write is done. A stale log anywhere else, or a write that named no position, is
/// left.
#[test]
fn a_stale_refusal_at_the_expected_position_is_an_already_applied_write() {
    let task = stored(TaskStatus::Running, 0, 15);
    let stale = Refusal::Stale { stored: 15 };
    assert_eq!(
        after_refusal(stale, &task, instance(0), Some(15)),
        AfterRefusal::AlreadyApplied
    );
    assert_eq!(
        after_refusal(stale, &task, instance(0), Some(14)),
        AfterRefusal::Leave
    );
    assert_eq!(
        after_refusal(stale, &task, instance(0), Some(16)),
        AfterRefusal::Leave
    );
    assert_eq!(
        after_refusal(stale, &task, instance(0), None),
        AfterRefusal::Leave
    );
}

/// Every other refusal of a task that is not `cancelling` in the worker's care ends the worker's
/// part: finished, another instance's, or a confused step.
#[test]
fn other_refusals_leave_the_task() {
    for status in [
        TaskStatus::Running,
        TaskStatus::Loading,
        TaskStatus::Completed,
        TaskStatus::Failed,
        TaskStatus::Cancelled,
    ] {
        let task = stored(status, 0, 15);
        assert!(!owes_acknowledgement(&task, instance(0)), "{status}");
        for refusal in every_refusal(15) {
            if refusal == (Refusal::Stale { stored: 15 }) {
                continue;
            }
            assert_eq!(
                after_refusal(refusal, &task, instance(0), Some(15)),
                AfterRefusal::Leave,
                "{status} {refusal:?}"
            );
        }
    }
}

fn any_refusal() -> impl Strategy<Value = Refusal> {
    (0u64..60).prop_flat_map(|at| select(every_refusal(at)))
}

proptest! {
    #![proptest_config(config("tests/proptest-regressions/properties.txt"))]

    /// P-4: after any refusal, a worker acknowledges exactly when the stored task is
    /// `cancelling` in its instance's care; otherwise it takes the write as done exactly when
    /// the log is stale at the position its steps lead to.
    #[test]
    fn a_workers_reading_of_a_refusal_follows_the_stored_task_p4(
        task in any_task(),
        refusal in any_refusal(),
        worker in any_instance(),
        expected in proptest::option::of(0u64..60),
    ) {
        let verdict = after_refusal(refusal, &task, worker, expected);
        let owed = task.status == TaskStatus::Cancelling && task.owner == worker;
        let applied = matches!(refusal, Refusal::Stale { stored } if Some(stored) == expected);
        let want = if owed {
            AfterRefusal::Acknowledge
        } else if applied {
            AfterRefusal::AlreadyApplied
        } else {
            AfterRefusal::Leave
        };
        prop_assert_eq!(verdict, want);
    }
}

/// A resumed task still running in the instance's care resumes; one cancelled since recovery is
/// acknowledged (P-4: the cancel found no worker); anything else is not this worker's.
#[test]
fn a_resumed_task_runs_is_acknowledged_or_skipped_by_its_stored_state() {
    let mine = instance(0);
    assert_eq!(
        resumed(&stored(TaskStatus::Running, 0, 9), mine),
        Resumed::Run
    );
    assert_eq!(
        resumed(&stored(TaskStatus::Cancelling, 0, 9), mine),
        Resumed::Acknowledge
    );
    assert_eq!(
        resumed(&stored(TaskStatus::Running, 1, 9), mine),
        Resumed::Skip
    );
    assert_eq!(
        resumed(&stored(TaskStatus::Cancelling, 1, 9), mine),
        Resumed::Skip
    );
    for status in [
        TaskStatus::Queued,
        TaskStatus::Loading,
        TaskStatus::Completed,
        TaskStatus::Failed,
        TaskStatus::Cancelled,
    ] {
        assert_eq!(
            resumed(&stored(status, 0, 9), mine),
            Resumed::Skip,
            "{status}"
        );
    }
}

fn logged(task: &Task, payloads: Vec<EventPayload>) -> Vec<Event> {
    payloads
        .into_iter()
        .zip(1u64..)
        .map(|(payload, sequence_number)| Event {
            task_id: task.id,
            sequence_number,
            created_at: Timestamp::from_millis(2_000),
            payload,
        })
        .collect()
}

fn delta(item: ItemId, text: &str) -> EventPayload {
    EventPayload::OutputTextDelta {
        item,
        delta: text.to_owned(),
    }
}

/// I-6: a resumed run continues after the text of its open item's deltas up to and including
/// the snapshot's last event, with the snapshot's state; other items' deltas and everything
/// after the snapshot are not its text.
#[test]
fn a_resume_point_is_the_open_items_text_up_to_the_snapshot_i6() {
    let mut task = stored(TaskStatus::Running, 0, 0);
    task.items.opened = 2;
    task.items.open = true;
    let (earlier, open) = (ItemId::of(task.id, 0), ItemId::of(task.id, 1));
    let log = logged(
        &task,
        vec![
            delta(earlier, "old "),
            EventPayload::Queued {
                reason: QueueReason::ServerRestarted,
            },
            delta(open, "Once "),
            delta(earlier, "stray "),
            delta(open, "upon "),
            delta(open, "a time"),
        ],
    );
    let point = resume_point(
        &task,
        Snapshot {
            sequence_number: 5,
            state: vec![4, 2],
        },
        &log,
    );
    assert_eq!(point.text_so_far, "Once upon ");
    assert_eq!(point.state, vec![4, 2]);
    let whole = resume_point(
        &task,
        Snapshot {
            sequence_number: 6,
            state: Vec::new(),
        },
        &log,
    );
    assert_eq!(whole.text_so_far, "Once upon a time");
}

/// I-6: a task the first release wrote has no open item: its run's text is what follows its last
/// `response.queued`, up to the snapshot.
#[test]
fn without_an_open_item_the_resume_text_starts_after_the_last_requeue_i6() {
    let task = stored(TaskStatus::Running, 0, 0);
    assert_eq!(task.items.open_item(task.id), None);
    let item = ItemId::of(task.id, 0);
    let log = logged(
        &task,
        vec![
            delta(item, "first run "),
            EventPayload::Queued {
                reason: QueueReason::ServerRestarted,
            },
            delta(item, "second "),
            delta(ItemId::of(task.id, 3), "run"),
            delta(item, " later"),
        ],
    );
    let point = resume_point(
        &task,
        Snapshot {
            sequence_number: 4,
            state: vec![1],
        },
        &log,
    );
    assert_eq!(point.text_so_far, "second run");
    assert_eq!(point.state, vec![1]);
}

/// I-6: with an open item, the text is that item's deltas whatever else the log holds: a
/// `response.queued` between them does not start it over (the open item is the run's).
#[test]
fn with_an_open_item_a_requeue_does_not_start_the_text_over_i6() {
    let mut task = stored(TaskStatus::Running, 0, 0);
    task.items.opened = 1;
    task.items.open = true;
    let item = ItemId::of(task.id, 0);
    let log = logged(
        &task,
        vec![
            delta(item, "Once "),
            EventPayload::Queued {
                reason: QueueReason::ServerRestarted,
            },
            delta(item, "upon"),
        ],
    );
    let point = resume_point(
        &task,
        Snapshot {
            sequence_number: 3,
            state: Vec::new(),
        },
        &log,
    );
    assert_eq!(point.text_so_far, "Once upon");
}
