//! Property tests of the pure domain against the contract written down in `contract/`: the state
//! machine and the output item structure of the log (P-3, P-4, I-2, I-3), ownership by instance,
//! the cancel table (P-4), the recovery table of docs/rules.md (P-7…P-11, I-5), idempotency decisions
//! (I-8), the pairing limit (I-7) and the request validator (I-9).
//!
//! Each property runs 2 000 cases (fewer when `PROPTEST_CASES` says so: the mutation run); the
//! tables are also checked cell by cell, without randomness. Test names state the claim; doc
//! comments cite the rule (P-n) or invariant (I-n) they check.

// Tests may unwrap; clippy.toml's `allow-unwrap-in-tests` does not reach the helpers outside
// `#[test]` functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod contract;
mod store_writes;
mod support;
mod worker_decisions;

use std::collections::BTreeSet;

use lmsp_domain::auth::{PairingLimit, PAIRING_MAX_FAILURES, PAIRING_TTL_MILLIS};
use lmsp_domain::event::{ClosedItem, EventKind, EventPayload, QueueReason};
use lmsp_domain::idempotency::{
    self, IdempotencyKey, IdempotencyRecord, IdempotencyScope, KeyClaim, KeyDecision, KeyState,
    Operation, RequestDigest, StoredReply,
};
use lmsp_domain::ids::{ClientId, InstanceId, ItemId, ResponseId, TaskId};
use lmsp_domain::recovery::{self, Move, RestartPolicy};
use lmsp_domain::task::{Fraction, Input, ItemStatus, Message, OutputItems, Role, Task};
use lmsp_domain::transition::{
    advance, advance_all, transition, Advanced, Refusal, Step, StepKind,
};
use lmsp_domain::validation::{
    validate_submit, DraftInput, DraftMessage, SubmitDraft, SubmitRequest, MAX_METADATA_PAIRS,
    MAX_OUTPUT_TOKENS,
};
use lmsp_domain::{decide_cancel, Event, TaskErrorCode, TaskStatus, Timestamp};
use proptest::prelude::*;
use proptest::sample::select;

use contract::{
    api_section_4_cancel, api_section_7, expected_batch, expected_move, expected_recovery,
    expected_step, is_worker_step, next_status,
};
use support::{
    any_instance, any_step, any_task, claim, complete, config, fail, instance, output, queued_task,
    response_of, task_in, ulid,
};

fn at(millis: i64) -> Timestamp {
    Timestamp::from_millis(millis)
}

fn kinds(events: &[Event]) -> Vec<EventKind> {
    events.iter().map(Event::kind).collect()
}

fn as_pair(advanced: Advanced) -> (Task, Vec<Event>) {
    (advanced.task, advanced.events)
}

/// Applies `steps` for instance `by` as a worker's batch would (the store's `append`).
fn worker(task: &Task, steps: &[Step], by: InstanceId, when: i64) -> Advanced {
    advance_all(task, steps, by, Some(task.last_sequence_number), at(when)).unwrap()
}

// ---------------------------------------------------------------------------------------------
// The state machine (P-3, P-4).
// ---------------------------------------------------------------------------------------------

/// P-3, P-4: the state machine accepts exactly the (status, step) cells the contract accepts,
/// with the status the contract names, and refuses every other cell with the refusal it
/// predicts: all 7 × 7 cells.
#[test]
fn every_status_accepts_exactly_the_steps_of_the_contract() {
    let mut accepted = 0;
    for &status in TaskStatus::ALL {
        for kind in StepKind::ALL {
            let expected = next_status(status, kind);
            accepted += usize::from(expected.is_ok());
            assert_eq!(transition(status, kind), expected, "{status} / {kind:?}");
        }
    }
    assert_eq!(accepted, 12, "the contract accepts twelve cells");
}

/// Only a worker's steps need the owner: a claim moves the task into the claimer's care and a
/// cancel may come from any instance (ARCHITECTURE.md).
#[test]
fn only_a_workers_steps_need_the_owner() {
    for kind in StepKind::ALL {
        assert_eq!(kind.needs_owner(), is_worker_step(kind), "{kind:?}");
    }
}

proptest! {
    #![proptest_config(config("tests/proptest-regressions/properties.txt"))]

    /// P-3: one step on any task row writes exactly the row and the numbered events the contract
    /// describes (statuses, the output item structure, timestamps, error, a claim's new owner),
    /// or is refused as the contract predicts.
    #[test]
    fn a_step_writes_the_row_and_events_the_contract_describes(
        task in any_task(),
        step in any_step(),
        claimer in any_instance(),
        when in 2_000i64..3_000,
    ) {
        let advanced = advance(&task, &step, claimer, at(when)).map(as_pair);
        prop_assert_eq!(advanced, expected_step(&task, &step, claimer, false, at(when)));
    }

    /// P-3, ownership: a worker's batch is applied in order, all or nothing: refused as stale
    /// when the worker saw another log, refused with `NotOwner` at a worker step of an instance
    /// that does not own the task, refused at the first step the status refuses; else the
    /// row and events of every step, a claim moving the task into the claimer's care.
    #[test]
    fn a_workers_batch_is_all_or_nothing_and_refuses_as_the_contract_predicts(
        task in any_task(),
        steps in prop_oneof![
            proptest::collection::vec(any_step(), 0..5),
            a_window_of_a_whole_run(),
        ],
        by in any_instance(),
        seen in prop_oneof![
            3 => Just(Some(0i64)),
            1 => Just(None),
            1 => (-2i64..=2).prop_map(Some),
        ],
        when in 2_000i64..3_000,
    ) {
        let expected = seen.map(|offset| task.last_sequence_number.saturating_add_signed(offset));
        let advanced = advance_all(&task, &steps, by, expected, at(when)).map(as_pair);
        prop_assert_eq!(advanced, expected_batch(&task, &steps, by, expected, at(when)));
    }
}

/// A contiguous part of a whole run (claim, load, two outputs, complete, or a cancel and its
/// acknowledgement), so that long accepted batches are common.
fn a_window_of_a_whole_run() -> impl Strategy<Value = Vec<Step>> {
    let task = queued_task(1, instance(0), RestartPolicy::Fail);
    let completing = vec![
        claim(),
        Step::Loaded,
        output("Once "),
        output("upon"),
        complete(&task, "Once upon"),
    ];
    let cancelled = vec![
        claim(),
        Step::Loaded,
        output("Once "),
        Step::RequestCancel,
        Step::AcknowledgeCancel,
    ];
    (select(vec![completing, cancelled]), 0usize..5, 0usize..6)
        .prop_map(|(run, from, length)| run.into_iter().skip(from).take(length).collect::<Vec<_>>())
}

proptest! {
    #![proptest_config(config("tests/proptest-regressions/properties.txt"))]

    /// P-4: finished statuses are absorbing: every step on a finished task, from any instance, is
    /// refused as finished, except a cancel of a `cancelled` task, which is answered and changes
    /// nothing; recovery leaves a finished task alone (P-7).
    #[test]
    fn finished_tasks_accept_no_step(
        task in task_in(vec![TaskStatus::Completed, TaskStatus::Failed, TaskStatus::Cancelled]),
        step in any_step(),
        by in any_instance(),
        when in 2_000i64..3_000,
    ) {
        let refused = Refusal::Finished { status: task.status, step: step.kind() };
        let alone = advance(&task, &step, by, at(when));
        let batched = advance_all(&task, std::slice::from_ref(&step), by, None, at(when));
        for outcome in [alone, batched] {
            if (task.status, step.kind()) == (TaskStatus::Cancelled, StepKind::RequestCancel) {
                let advanced = outcome.unwrap();
                prop_assert!(advanced.events.is_empty());
                prop_assert_eq!(&advanced.task, &task);
            } else {
                prop_assert_eq!(outcome, Err(refused));
            }
        }
        prop_assert_eq!(recovery::plan(task.status, task.on_restart), Move::Untouched);
        prop_assert_eq!(recovery::recover(&task, by, None, None, at(when)), None);
    }

    /// P-4, I-3: after `cancelling` the only event that may follow is `response.cancelled`: the
    /// owner's acknowledgement writes it, a repeated cancel from anyone writes nothing, every
    /// other step is refused as cancel-pending; recovery under any policy cancels (P-10) and
    /// closes no item.
    #[test]
    fn after_cancelling_only_cancelled_may_follow(
        task in task_in(vec![TaskStatus::Cancelling]),
        step in any_step(),
        by in any_instance(),
        rescuer in (3u64..5).prop_map(instance),
        when in 2_000i64..3_000,
    ) {
        let outcome = advance_all(&task, std::slice::from_ref(&step), by, None, at(when));
        match step.kind() {
            StepKind::AcknowledgeCancel if by == task.owner => {
                let advanced = outcome.unwrap();
                prop_assert_eq!(advanced.task.status, TaskStatus::Cancelled);
                prop_assert_eq!(kinds(&advanced.events), vec![EventKind::Cancelled]);
                prop_assert_eq!(advanced.task.finished_at, Some(at(when)));
            }
            StepKind::AcknowledgeCancel => prop_assert_eq!(outcome, Err(Refusal::NotOwner)),
            StepKind::RequestCancel => {
                let advanced = outcome.unwrap();
                prop_assert!(advanced.events.is_empty());
                prop_assert_eq!(&advanced.task, &task);
            }
            other => prop_assert_eq!(outcome, Err(Refusal::CancelPending { step: other })),
        }
        let recovered = recovery::recover(&task, rescuer, None, Some("x".into()), at(when)).unwrap();
        prop_assert_eq!(recovered.task.status, TaskStatus::Cancelled);
        prop_assert_eq!(kinds(&recovered.events), vec![EventKind::Cancelled]);
    }
}

// ---------------------------------------------------------------------------------------------
// Ownership by instance (ARCHITECTURE.md, ARCHITECTURE.md).
// ---------------------------------------------------------------------------------------------

/// A task of instance 0 that instance 0 has brought to `running`.
fn running_task() -> Task {
    let task = queued_task(7, instance(0), RestartPolicy::Resume);
    worker(&task, &[claim(), Step::Loaded], instance(0), 2_000).task
}

/// Each worker step, in a status that accepts it, is refused with `NotOwner` when an instance
/// that does not own the task takes it, and accepted from the owner.
#[test]
fn a_worker_step_from_an_instance_that_does_not_own_the_task_is_refused_as_not_owner() {
    let running = running_task();
    let loading = worker(
        &queued_task(8, instance(0), RestartPolicy::Fail),
        &[claim()],
        instance(0),
        2_000,
    )
    .task;
    let cancelling = worker(&running, &[Step::RequestCancel], instance(0), 2_100).task;
    let cases = [
        (&loading, Step::Loaded),
        (&loading, fail()),
        (&running, output("x")),
        (&running, complete(&running, "x")),
        (&running, fail()),
        (&cancelling, Step::AcknowledgeCancel),
    ];
    for (task, step) in cases {
        let stranger = advance_all(
            task,
            std::slice::from_ref(&step),
            instance(1),
            None,
            at(3_000),
        );
        assert_eq!(stranger, Err(Refusal::NotOwner), "{step:?}");
        let owner = advance_all(
            task,
            std::slice::from_ref(&step),
            instance(0),
            None,
            at(3_000),
        );
        assert!(owner.is_ok(), "{step:?}: {owner:?}");
    }
}

/// A claim from any instance moves the task into the claimer's care: the claimer's worker steps
/// are accepted, even in the claim's own batch, and the former owner's are refused.
#[test]
fn a_claim_moves_the_task_into_the_claimers_care() {
    let task = queued_task(9, instance(0), RestartPolicy::Retry);

    let claimed = worker(&task, &[claim(), Step::Loaded], instance(1), 2_000);

    assert_eq!(claimed.task.owner, instance(1));
    assert_eq!(claimed.task.status, TaskStatus::Running);
    let former = advance_all(&claimed.task, &[output("x")], instance(0), None, at(2_100));
    assert_eq!(former, Err(Refusal::NotOwner));
}

/// A cancel may come from any instance (ARCHITECTURE.md: "a cancel sent to any instance"), and it
/// leaves the task in its owner's care.
#[test]
fn a_cancel_from_any_instance_is_accepted_and_leaves_the_owner() {
    let running = running_task();

    let cancelled = advance_all(
        &running,
        &[Step::RequestCancel],
        instance(2),
        None,
        at(3_000),
    );

    let cancelled = cancelled.unwrap();
    assert_eq!(cancelled.task.status, TaskStatus::Cancelling);
    assert_eq!(cancelled.task.owner, instance(0));
    assert_eq!(kinds(&cancelled.events), vec![EventKind::Cancelling]);
}

/// A worker that saw another log than the stored one (its earlier write committed after all, or
/// another writer moved the task) is refused as stale, whatever it asks and whoever owns the
/// task; the log it saw is accepted.
#[test]
fn a_worker_that_saw_another_log_is_refused_as_stale() {
    let running = running_task();
    let stored = running.last_sequence_number;
    let finished = worker(&running, &[complete(&running, "")], instance(0), 3_000).task;
    for task in [&running, &finished] {
        let stored = task.last_sequence_number;
        for seen in [stored - 1, stored + 1, 0] {
            let outcome = advance_all(task, &[output("x")], instance(0), Some(seen), at(3_100));
            assert_eq!(outcome, Err(Refusal::Stale { stored }), "seen {seen}");
        }
    }
    assert!(advance_all(
        &running,
        &[output("x")],
        instance(0),
        Some(stored),
        at(3_100)
    )
    .is_ok());
}

/// A batch with a refused step is refused whole, with the first refusal: nothing of the steps
/// before it is kept.
#[test]
fn a_batch_with_a_refused_step_is_refused_whole() {
    let running = running_task();

    let outcome = advance_all(
        &running,
        &[output("a"), output("b"), Step::Loaded, output("c")],
        instance(0),
        None,
        at(3_000),
    );

    assert_eq!(
        outcome,
        Err(Refusal::WrongStatus {
            status: TaskStatus::Running,
            step: StepKind::Loaded
        })
    );
}

/// `started_at` is the time of the first claim and stays when a requeued task is claimed again;
/// `finished_at` is the time it finished.
#[test]
fn started_at_is_the_first_claims_time_and_finished_at_the_finishing_steps() {
    let task = queued_task(10, instance(0), RestartPolicy::Retry);
    let loading = worker(&task, &[claim()], instance(0), 2_000).task;
    let requeued = recovery::recover(&loading, instance(1), None, None, at(2_500))
        .unwrap()
        .task;
    assert_eq!(requeued.status, TaskStatus::Queued);

    let again = worker(&requeued, &[claim(), Step::Loaded], instance(1), 3_000).task;
    let done = worker(&again, &[complete(&again, "")], instance(1), 4_000).task;

    assert_eq!(done.started_at, Some(at(2_000)));
    assert_eq!(done.finished_at, Some(at(4_000)));
    assert_eq!(again.finished_at, None);
}

// ---------------------------------------------------------------------------------------------
// The output item structure of the log (docs/events.md).
// ---------------------------------------------------------------------------------------------

fn item(task: &Task, output_index: u32) -> ItemId {
    ItemId::of(task.id, output_index)
}

fn closed(item: ItemId, text: &str, status: ItemStatus) -> ClosedItem {
    ClosedItem {
        item,
        text: text.to_owned(),
        status,
    }
}

fn payloads(advanced: &Advanced) -> Vec<EventPayload> {
    advanced.events.iter().map(|e| e.payload.clone()).collect()
}

/// A run's first output opens its item and content part (`output_index` 0 for the first run) in
/// the delta's transaction.
#[test]
fn a_runs_first_output_opens_its_item_and_content_part_with_the_delta() {
    let running = running_task();

    let first = worker(&running, &[output("Once ")], instance(0), 3_000);

    let opened = item(&running, 0);
    assert_eq!(
        payloads(&first),
        vec![
            EventPayload::OutputItemAdded { item: opened },
            EventPayload::ContentPartAdded { item: opened },
            EventPayload::OutputTextDelta {
                item: opened,
                delta: "Once ".into()
            },
        ]
    );
    assert_eq!(opened.output_index(), 0);
    assert_eq!(
        first.task.items,
        OutputItems {
            opened: 1,
            open: true
        }
    );
}

/// Later output of the same run is only a delta of the open item.
#[test]
fn later_outputs_of_a_run_write_only_a_delta_of_the_open_item() {
    let running = running_task();
    let first = worker(&running, &[output("Once ")], instance(0), 3_000).task;

    let later = worker(&first, &[output("upon")], instance(0), 3_100);

    assert_eq!(
        payloads(&later),
        vec![EventPayload::OutputTextDelta {
            item: item(&running, 0),
            delta: "upon".into()
        }]
    );
    assert_eq!(later.task.items, first.items);
}

/// Completion closes the run's item with the response's text (`output_text.done`,
/// `content_part.done`, `output_item.done` with status `completed`), just before
/// `response.completed`, all in one transaction.
#[test]
fn completion_closes_the_item_with_the_responses_text_then_completes() {
    let running = running_task();
    let spoken = worker(
        &running,
        &[output("Once "), output("upon")],
        instance(0),
        3_000,
    )
    .task;
    let response = Box::new(response_of(&spoken, "Once upon", at(3_100)));
    let finish = Step::Complete {
        response: response.clone(),
    };

    let completed = worker(&spoken, &[finish], instance(0), 3_100);

    let done = closed(item(&running, 0), "Once upon", ItemStatus::Completed);
    assert_eq!(
        payloads(&completed),
        vec![
            EventPayload::OutputTextDone(done.clone()),
            EventPayload::ContentPartDone(done.clone()),
            EventPayload::OutputItemDone(done),
            EventPayload::Completed { response },
        ]
    );
    assert_eq!(completed.task.status, TaskStatus::Completed);
    assert!(!completed.task.items.open);
}

/// A completion without any output still has its item: it is opened first, in the same
/// transaction.
#[test]
fn a_completion_without_output_opens_the_item_first() {
    let running = running_task();

    let completed = worker(&running, &[complete(&running, "")], instance(0), 3_000);

    assert_eq!(
        kinds(&completed.events),
        vec![
            EventKind::OutputItemAdded,
            EventKind::ContentPartAdded,
            EventKind::OutputTextDone,
            EventKind::ContentPartDone,
            EventKind::OutputItemDone,
            EventKind::Completed,
        ]
    );
    assert!(completed
        .events
        .iter()
        .filter_map(|e| e.payload.item())
        .all(|i| i == item(&running, 0)));
}

/// A run put back in the queue has its open item closed as `incomplete` with its text, in the
/// transaction of `response.queued`; the next run opens a new item at the next `output_index`.
#[test]
fn after_a_requeue_the_next_run_opens_the_next_output_index() {
    let task = queued_task(11, instance(0), RestartPolicy::Retry);
    let spoken = worker(
        &task,
        &[claim(), Step::Loaded, output("Once ")],
        instance(0),
        2_000,
    )
    .task;
    assert!(recovery::needs_open_item_text(&spoken));

    let requeued =
        recovery::recover(&spoken, instance(1), None, Some("Once ".into()), at(2_500)).unwrap();
    let rerun = worker(
        &requeued.task,
        &[claim(), Step::Loaded, output("Long ")],
        instance(1),
        3_000,
    );

    assert_eq!(
        payloads(&requeued),
        vec![
            EventPayload::OutputItemDone(closed(item(&task, 0), "Once ", ItemStatus::Incomplete)),
            EventPayload::Queued {
                reason: QueueReason::ServerRestarted
            },
        ]
    );
    let second = item(&task, 1);
    assert_eq!(second.output_index(), 1);
    assert_eq!(
        payloads(&rerun)[2..],
        [
            EventPayload::OutputItemAdded { item: second },
            EventPayload::ContentPartAdded { item: second },
            EventPayload::OutputTextDelta {
                item: second,
                delta: "Long ".into()
            },
        ]
    );
}

/// A run interrupted while loading had no item: it goes back to the queue with no item closed.
#[test]
fn a_loading_run_put_back_in_the_queue_has_no_item_to_close() {
    let task = queued_task(12, instance(0), RestartPolicy::Resume);
    let loading = worker(&task, &[claim()], instance(0), 2_000).task;
    assert!(!recovery::needs_open_item_text(&loading));

    let requeued = recovery::recover(&loading, instance(1), None, None, at(2_500)).unwrap();

    assert_eq!(kinds(&requeued.events), vec![EventKind::Queued]);
    assert_eq!(requeued.task.items, OutputItems::default());
}

/// A resumed run continues the item it had open: its next output is only a delta of that item.
#[test]
fn a_resumed_run_continues_the_same_item() {
    let running = running_task();
    let spoken = worker(&running, &[output("Once ")], instance(0), 3_000).task;
    assert!(!recovery::needs_open_item_text(&spoken));

    let resumed = recovery::recover(&spoken, instance(1), Some(3), None, at(3_500)).unwrap();
    let continued = worker(&resumed.task, &[output("upon")], instance(1), 4_000);

    assert_eq!(
        payloads(&resumed),
        vec![EventPayload::Resumed {
            from_sequence_number: 3
        }]
    );
    assert_eq!(
        payloads(&continued),
        vec![EventPayload::OutputTextDelta {
            item: item(&running, 0),
            delta: "upon".into()
        }]
    );
}

// ---------------------------------------------------------------------------------------------
// The cancel table (docs/api.md, P-4).
// ---------------------------------------------------------------------------------------------

/// P-4: each status's cancel decision is the row of docs/api.md: the new status, the reply, the
/// event, whether the worker is told to stop; and a cancel step from any instance writes that
/// event and moves to that status, or is refused as finished where the reply is 409.
#[test]
fn cancel_decisions_follow_api_section_4() {
    for &status in TaskStatus::ALL {
        let row = api_section_4_cancel(status);
        let decision = decide_cancel(status);
        assert_eq!(decision.new_status(), row.new_status, "{status}");
        assert_eq!(decision.reply(), row.reply, "{status}");
        assert_eq!(decision.event().map(|e| e.kind()), row.event, "{status}");
        assert_eq!(decision.stops_worker(), row.stops_worker, "{status}");

        let mut task = queued_task(13, instance(0), RestartPolicy::Fail);
        task.status = status;
        let outcome = advance_all(&task, &[Step::RequestCancel], instance(1), None, at(2_000));
        match row.new_status {
            None => assert_eq!(
                outcome,
                Err(Refusal::Finished {
                    status,
                    step: StepKind::RequestCancel
                })
            ),
            Some(new_status) => {
                let advanced = outcome.unwrap();
                assert_eq!(advanced.task.status, new_status, "{status}");
                assert_eq!(
                    kinds(&advanced.events),
                    Vec::from_iter(row.event),
                    "{status}"
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Recovery (docs/rules.md, P-7…P-11, I-5).
// ---------------------------------------------------------------------------------------------

/// The exhaustive form: all 7 × 3 cells of the table, each spelled out (P-7…P-10).
#[test]
fn recovery_table_cells_are_exactly_api_section_7() {
    use RestartPolicy::{Fail, Resume, Retry};
    use TaskStatus::{Cancelled, Cancelling, Completed, Failed, Loading, Queued, Running};
    let moved = |status, event, resumes_from_snapshot, closes_open_item| Move::Moved {
        status,
        event,
        error_code: (status == Failed).then_some(TaskErrorCode::ServerRestarted),
        increments_restarts: true,
        resumes_from_snapshot,
        closes_open_item,
    };
    let failed = moved(Failed, EventKind::Failed, false, false);
    let requeued = moved(Queued, EventKind::Queued, false, true);
    let resumed = moved(Running, EventKind::Resumed, true, false);
    let cancelled = moved(Cancelled, EventKind::Cancelled, false, false);
    let table = [
        (Queued, Fail, failed),
        (Queued, Retry, Move::Untouched),
        (Queued, Resume, Move::Untouched),
        (Loading, Fail, failed),
        (Loading, Retry, requeued),
        (Loading, Resume, requeued),
        (Running, Fail, failed),
        (Running, Retry, requeued),
        (Running, Resume, resumed),
        (Cancelling, Fail, cancelled),
        (Cancelling, Retry, cancelled),
        (Cancelling, Resume, cancelled),
        (Completed, Fail, Move::Untouched),
        (Completed, Retry, Move::Untouched),
        (Completed, Resume, Move::Untouched),
        (Failed, Fail, Move::Untouched),
        (Failed, Retry, Move::Untouched),
        (Failed, Resume, Move::Untouched),
        (Cancelled, Fail, Move::Untouched),
        (Cancelled, Retry, Move::Untouched),
        (Cancelled, Resume, Move::Untouched),
    ];
    let cells: BTreeSet<_> = table.iter().map(|(s, p, _)| (*s, p.as_str())).collect();
    assert_eq!(
        cells.len(),
        TaskStatus::ALL.len() * RestartPolicy::ALL.len()
    );
    for (status, policy, expected) in table {
        assert_eq!(
            recovery::plan(status, policy),
            expected,
            "{status} / {policy}"
        );
        assert_eq!(
            expected_move(status, policy),
            expected,
            "{status} / {policy}"
        );
    }
}

/// Each cell carried out on a task with an open item, without randomness: what is written, by
/// whom the task is then owned, and which text the closed item gets (P-8…P-11).
#[test]
fn recovery_carries_out_each_cell_on_a_task_with_an_open_item() {
    for &status in TaskStatus::ALL {
        for &policy in RestartPolicy::ALL {
            let mut task = queued_task(14, instance(0), policy);
            task.status = status;
            task.last_sequence_number = 9;
            task.items = OutputItems {
                opened: 2,
                open: true,
            };
            let text = recovery::needs_open_item_text(&task).then(|| String::from("Once "));
            let closes = matches!(api_section_7(status, policy), Some((_, _, _, true)));
            assert_eq!(text.is_some(), closes, "{status} / {policy}");

            let recovered = recovery::recover(&task, instance(1), Some(7), text, at(5_000));

            assert_eq!(
                recovered.map(as_pair),
                expected_recovery(&task, instance(1), Some(7), "Once ", at(5_000)),
                "{status} / {policy}"
            );
            assert_eq!(
                recovery::recover(&task, instance(0), Some(7), None, at(5_000)),
                None,
                "a task in the rescuer's own care is no leftover: {status} / {policy}"
            );
        }
    }
}

proptest! {
    #![proptest_config(config("tests/proptest-regressions/properties.txt"))]

    /// P-7…P-11: every (status, policy) cell of `recovery::plan` is the cell of docs/rules.md, and
    /// `recovery::recover` carries it out on any task row: nothing for a finished task, a task
    /// in the rescuer's own care or an untouched cell; else the new status with the cell's event
    /// in one transaction (P-11), preceded by the open item's `response.output_item.done`
    /// (`incomplete`, with its text) when the run goes back to the queue; `server_restarted` for
    /// a move to `failed` (P-9); `restarts + 1`; the task in the rescuer's care.
    #[test]
    fn recovery_table_matches_api_section_7(
        task in any_task(),
        rescuer in any_instance(),
        covers in proptest::option::of(0u64..60),
        text in "[a-z ]{0,8}",
        when in 2_000i64..3_000,
    ) {
        let planned = recovery::plan(task.status, task.on_restart);
        prop_assert_eq!(planned, expected_move(task.status, task.on_restart));
        if let Move::Moved { status, event, .. } = planned {
            prop_assert_eq!(event.implied_status(), status);
        }
        prop_assert_eq!(
            recovery::is_leftover(&task, rescuer),
            !task.status.is_finished() && task.owner != rescuer
        );
        let closes = matches!(planned, Move::Moved { closes_open_item: true, .. });
        let needs_text = recovery::needs_open_item_text(&task);
        prop_assert_eq!(needs_text, closes && task.items.open);

        let recovered = recovery::recover(
            &task, rescuer, covers, needs_text.then(|| text.clone()), at(when),
        );

        let expected = expected_recovery(&task, rescuer, covers, &text, at(when));
        if let Some((row, events)) = &expected {
            prop_assert_eq!(row.owner, rescuer);
            prop_assert_eq!(row.restarts, task.restarts + 1);
            if let Some(EventPayload::Failed { error }) = events.last().map(|e| &e.payload) {
                prop_assert_eq!(error.code, TaskErrorCode::ServerRestarted);
            }
        }
        prop_assert_eq!(recovered.map(as_pair), expected);
    }

    /// I-5: recovery is idempotent: a moved task is in the rescuer's care, so a second recovery by
    /// the same rescuer writes nothing, whatever snapshot or time it is given; the next restart
    /// (another rescuer) moves the task again by the table, as it was interrupted again.
    #[test]
    fn recovery_is_idempotent(
        task in any_task(),
        rescuer in (3u64..5).prop_map(instance),
        covers in proptest::option::of(0u64..60),
        when in 2_000i64..3_000,
        later in 0i64..1_000,
    ) {
        let text = recovery::needs_open_item_text(&task).then(|| String::from("Once "));
        let once = recovery::recover(&task, rescuer, covers, text, at(when));
        let after_once = once.map_or_else(|| task.clone(), |advanced| advanced.task);

        let twice = recovery::recover(
            &after_once, rescuer, covers.map(|c| c + 1), Some("x".into()), at(when + later),
        );

        prop_assert_eq!(twice, None, "the second recovery by one rescuer wrote something");
        let next_restart = recovery::recover(&after_once, instance(5), covers, None, at(when + later));
        prop_assert_eq!(
            next_restart.map(as_pair),
            expected_recovery(&after_once, instance(5), covers, "", at(when + later))
        );
    }
}

/// Restart policies are parsed from their names, and nothing else is one.
#[test]
fn restart_policies_parse_from_their_names_only() {
    let names = [
        (RestartPolicy::Fail, "fail"),
        (RestartPolicy::Retry, "retry"),
        (RestartPolicy::Resume, "resume"),
    ];
    assert_eq!(RestartPolicy::ALL.len(), names.len());
    for (policy, name) in names {
        assert_eq!(policy.as_str(), name);
        assert_eq!(RestartPolicy::parse(name), Ok(policy));
    }
    for bad in ["", "Fail", "later", " retry"] {
        assert!(RestartPolicy::parse(bad).is_err(), "{bad:?}");
    }
    assert_eq!(RestartPolicy::default(), RestartPolicy::Fail);
}

// ---------------------------------------------------------------------------------------------
// Idempotency (docs/api.md, I-8).
// ---------------------------------------------------------------------------------------------

fn scope() -> IdempotencyScope {
    IdempotencyScope {
        client_id: ClientId::from_ulid(ulid(20)),
        operation: Operation::CreateResponse,
    }
}

fn reply() -> StoredReply {
    StoredReply {
        task_id: Some(TaskId::from_ulid(ulid(21))),
        body: b"202 queued".to_vec(),
    }
}

fn first_digest() -> RequestDigest {
    RequestDigest::of_canonical(br#"{"input":"Once","model":"reference"}"#)
}

fn record(state: KeyState, held_until: Option<i64>, expires_at: i64) -> IdempotencyRecord {
    IdempotencyRecord {
        scope: scope(),
        key: IdempotencyKey::parse("retry-1").unwrap(),
        digest: first_digest(),
        state,
        held_until: held_until.map(at),
        held_by: held_until.map(|_| instance(0)),
        created_at: at(0),
        expires_at: at(expires_at),
    }
}

/// The rule of docs/api.md with holds, written down: an expired record (its expiry not after now)
/// is no record; a key held past now is in use whatever the body; a pending record whose hold
/// ended belonged to a request that died before creating anything, so the new request proceeds;
/// an answered record replays the same request and refuses another as reused.
fn expected_decision(
    stored: Option<&IdempotencyRecord>,
    digest: &RequestDigest,
    now: Timestamp,
) -> KeyDecision {
    match stored {
        None => KeyDecision::Proceed,
        Some(record) if record.expires_at <= now => KeyDecision::Proceed,
        Some(record) if record.held_until.is_some_and(|until| now < until) => KeyDecision::InUse,
        Some(IdempotencyRecord {
            state: KeyState::Pending,
            ..
        }) => KeyDecision::Proceed,
        Some(IdempotencyRecord {
            state: KeyState::Answered(reply),
            digest: first,
            ..
        }) if first == digest => KeyDecision::Replay(reply.clone()),
        Some(_) => KeyDecision::Reused,
    }
}

/// I-8: the decision table, with the edges of the expiry and of the hold (a record expiring at
/// now is expired; a hold ending at now has ended).
#[test]
fn an_idempotency_record_decides_a_new_request_as_api_section_6_says() {
    let same = first_digest();
    let other = RequestDigest::of_canonical(b"{}");
    let answered = || KeyState::Answered(reply());
    let now = 100;
    let cases = [
        (None, &same, KeyDecision::Proceed),
        (
            Some(record(answered(), None, 1_000)),
            &same,
            KeyDecision::Replay(reply()),
        ),
        (
            Some(record(answered(), None, 1_000)),
            &other,
            KeyDecision::Reused,
        ),
        (
            Some(record(answered(), None, 101)),
            &other,
            KeyDecision::Reused,
        ),
        (
            Some(record(answered(), None, 100)),
            &same,
            KeyDecision::Proceed,
        ),
        (
            Some(record(answered(), None, 99)),
            &other,
            KeyDecision::Proceed,
        ),
        (
            Some(record(answered(), Some(101), 1_000)),
            &same,
            KeyDecision::InUse,
        ),
        (
            Some(record(answered(), Some(100), 1_000)),
            &same,
            KeyDecision::Replay(reply()),
        ),
        (
            Some(record(answered(), Some(99), 1_000)),
            &other,
            KeyDecision::Reused,
        ),
        (
            Some(record(KeyState::Pending, Some(101), 1_000)),
            &same,
            KeyDecision::InUse,
        ),
        (
            Some(record(KeyState::Pending, Some(101), 1_000)),
            &other,
            KeyDecision::InUse,
        ),
        (
            Some(record(KeyState::Pending, Some(100), 1_000)),
            &other,
            KeyDecision::Proceed,
        ),
        (
            Some(record(KeyState::Pending, None, 1_000)),
            &same,
            KeyDecision::Proceed,
        ),
        (
            Some(record(KeyState::Pending, Some(500), 100)),
            &same,
            KeyDecision::Proceed,
        ),
    ];
    for (index, (stored, digest, expected)) in cases.into_iter().enumerate() {
        assert_eq!(
            expected_decision(stored.as_ref(), digest, at(now)),
            expected,
            "the written-down rule, case {index}"
        );
        assert_eq!(
            idempotency::decide(stored.as_ref(), digest, at(now)),
            expected,
            "case {index}"
        );
    }
}

/// A claim's pending record holds the key for its holder until the hold ends; its answered
/// record carries the reply and keeps the hold until it is released.
#[test]
fn a_key_claim_stores_a_pending_hold_and_then_its_answer() {
    let claim = KeyClaim {
        scope: scope(),
        key: IdempotencyKey::parse("retry-1").unwrap(),
        digest: first_digest(),
        holder: instance(0),
        hold_until: at(500),
        expires_at: at(10_000),
    };

    let pending = claim.pending_record(at(100));
    let answered = claim.answered_record(reply(), at(200));

    assert_eq!(
        pending,
        IdempotencyRecord {
            state: KeyState::Pending,
            held_until: Some(at(500)),
            held_by: Some(instance(0)),
            created_at: at(100),
            ..record(KeyState::Pending, None, 10_000)
        }
    );
    assert_eq!(answered.state, KeyState::Answered(reply()));
    assert_eq!(answered.held_until, Some(at(500)));
    assert_eq!(answered.created_at, at(200));
    assert_eq!(
        idempotency::decide(Some(&pending), &first_digest(), at(499)),
        KeyDecision::InUse
    );
}

/// I-8: a key settles (takes a synchronous request's final reply) only while it still keeps the
/// reply the settler read, byte for byte; the settled record keeps the task it names as stored
/// (none once the task is gone), its hold, its digest and its expiry, and takes the new body.
#[test]
fn a_key_settles_only_while_it_keeps_the_reply_that_was_read() {
    let pointer = reply();
    let final_reply = StoredReply {
        task_id: Some(TaskId::from_ulid(ulid(22))),
        body: b"200 completed".to_vec(),
    };
    let held = record(KeyState::Answered(pointer.clone()), Some(500), 1_000);
    let task_gone = record(
        KeyState::Answered(StoredReply {
            task_id: None,
            ..pointer.clone()
        }),
        None,
        1_000,
    );
    let settled_already = record(KeyState::Answered(final_reply.clone()), None, 1_000);
    let pending = record(KeyState::Pending, Some(500), 1_000);

    let settled = idempotency::settle(Some(&held), &pointer, final_reply.clone());
    let settled_gone = idempotency::settle(Some(&task_gone), &pointer, final_reply.clone());

    assert_eq!(
        settled,
        Some(IdempotencyRecord {
            state: KeyState::Answered(StoredReply {
                task_id: pointer.task_id,
                body: final_reply.body.clone(),
            }),
            ..held
        })
    );
    assert_eq!(
        settled_gone,
        Some(IdempotencyRecord {
            state: KeyState::Answered(StoredReply {
                task_id: None,
                body: final_reply.body.clone(),
            }),
            ..task_gone
        }),
        "a key whose task is gone settles and still names no task"
    );
    for (other, why) in [
        (Some(&settled_already), "settled already"),
        (Some(&pending), "pending"),
        (None, "no record"),
    ] {
        assert_eq!(
            idempotency::settle(other, &pointer, final_reply.clone()),
            None,
            "{why}"
        );
    }
}

fn any_key_state() -> impl Strategy<Value = KeyState> {
    prop_oneof![Just(KeyState::Pending), Just(KeyState::Answered(reply()))]
}

/// Times near `now` (the edges matter) and far from it.
fn around(now: i64) -> impl Strategy<Value = i64> {
    prop_oneof![(-2i64..=2).prop_map(move |d| now + d), 0i64..2_000]
}

proptest! {
    #![proptest_config(config("tests/proptest-regressions/properties.txt"))]

    /// I-8: whatever the stored record and the time, `decide` follows the written-down rule.
    #[test]
    fn a_key_decision_follows_the_idempotency_rule(
        present in any::<bool>(),
        state in any_key_state(),
        held_until in proptest::option::of(around(1_000)),
        expires_at in around(1_000),
        same_body in any::<bool>(),
        now in around(1_000),
    ) {
        let mut stored = record(state, None, expires_at);
        stored.held_until = held_until.map(at);
        let stored = present.then_some(stored);
        let digest = if same_body { first_digest() } else { RequestDigest::of_canonical(b"other") };

        let decided = idempotency::decide(stored.as_ref(), &digest, at(now));

        prop_assert_eq!(decided, expected_decision(stored.as_ref(), &digest, at(now)));
    }

    /// docs/api.md: an `Idempotency-Key` is 1–255 visible ASCII characters; a well-formed key is
    /// kept as it was sent.
    #[test]
    fn idempotency_keys_are_one_to_255_visible_ascii_characters(
        text in prop_oneof![
            "[!-~]{0,300}",
            "[ -~]{0,8}",
            any::<String>(),
            Just("k".repeat(255)),
            Just("k".repeat(256)),
        ],
    ) {
        let well_formed = (1..=255).contains(&text.len())
            && text.bytes().all(|b| (b'!'..=b'~').contains(&b));
        match IdempotencyKey::parse(&text) {
            Ok(key) => {
                prop_assert!(well_formed, "{:?} was accepted", text);
                prop_assert_eq!(key.as_str(), text.as_str());
                prop_assert_eq!(format!("{key:?}"), format!("IdempotencyKey({text})"));
            }
            Err(_) => prop_assert!(!well_formed, "{:?} was refused", text),
        }
    }
}

/// The request digest is the SHA-256 of the canonical bytes (the standard test vector), so two
/// instances, or an old and a new build, agree on it.
#[test]
fn a_request_digest_is_the_sha256_of_its_canonical_bytes() {
    let digest = RequestDigest::of_canonical(b"abc");

    let hex: String = digest.0.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        hex,
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
    assert_ne!(RequestDigest::of_canonical(b"abd"), digest);
}

/// A key is scoped to an operation by its stored name, which never changes.
#[test]
fn operations_have_stable_stored_names() {
    let names = [
        (Operation::CreateResponse, "create_response"),
        (Operation::CreateChatCompletion, "create_chat_completion"),
        (Operation::RegisterModel, "register_model"),
    ];
    for (operation, name) in names {
        assert_eq!(operation.as_str(), name);
        assert_eq!(Operation::parse(name), Some(operation));
    }
    assert_eq!(Operation::parse("POST /v1/responses"), None);
}

// ---------------------------------------------------------------------------------------------
// The pairing limit (docs/api.md).
// ---------------------------------------------------------------------------------------------

/// The pairing limit as docs/api.md says it, kept as a list: "after 5 wrong codes within 10
/// minutes every outstanding code is burnt, and `/v1/pair` answers 429 … until that window has
/// passed". A wrong code that is exactly 10 minutes old is outside the window.
#[derive(Debug, Default)]
struct PairingReference {
    failures: Vec<i64>,
    locked_until: Option<i64>,
}

impl PairingReference {
    fn locked_at(&self, now: i64) -> Option<i64> {
        self.locked_until.filter(|until| now < *until)
    }

    /// A wrong code at `now` (only asked while pairing is open): whether it burns the codes.
    fn wrong_code(&mut self, now: i64) -> bool {
        self.failures.retain(|then| now - then < PAIRING_TTL_MILLIS);
        self.failures.push(now);
        if self.failures.len() >= 5 {
            self.failures.clear();
            self.locked_until = Some(now + PAIRING_TTL_MILLIS);
            true
        } else {
            self.locked_until = None;
            false
        }
    }

    fn as_limit(&self) -> PairingLimit {
        PairingLimit {
            failures: self.failures.iter().copied().map(at).collect(),
            locked_until: self.locked_until.map(at),
        }
    }
}

/// Five wrong codes within ten minutes burn the codes and lock pairing for ten minutes from the
/// fifth; pairing opens again exactly when the lock ends.
#[test]
fn five_wrong_codes_within_ten_minutes_lock_pairing_for_ten_minutes() {
    assert_eq!(PAIRING_MAX_FAILURES, 5);
    assert_eq!(PAIRING_TTL_MILLIS, 600_000);
    let start = 1_000_000;
    let mut limit = PairingLimit::default();
    for i in 0..4 {
        assert_eq!(limit.check(at(start + i)), Ok(()));
        let after = limit.after_failure(at(start + i));
        assert!(!after.burn_codes, "failure {i}");
        limit = after.limit;
    }

    let fifth = limit.after_failure(at(start + 599_999));

    assert!(fifth.burn_codes);
    let until = at(start + 599_999 + PAIRING_TTL_MILLIS);
    assert_eq!(fifth.limit.locked_until, Some(until));
    assert_eq!(fifth.limit.check(at(start + 599_999)), Err(until));
    assert_eq!(fifth.limit.check(until.plus_millis(-1)), Err(until));
    assert_eq!(fifth.limit.check(until), Ok(()));
}

/// A wrong code exactly ten minutes old is forgotten: the fifth code then does not lock.
#[test]
fn a_wrong_code_ten_minutes_old_is_outside_the_window() {
    let start = 1_000_000;
    let mut limit = PairingLimit::default();
    for i in 0..4 {
        limit = limit.after_failure(at(start + i * 10)).limit;
    }

    let fifth = limit.after_failure(at(start + PAIRING_TTL_MILLIS));

    assert!(!fifth.burn_codes);
    assert_eq!(
        fifth.limit.failures,
        [10, 20, 30, PAIRING_TTL_MILLIS]
            .map(|offset| at(start + offset))
            .to_vec()
    );
}

proptest! {
    #![proptest_config(config("tests/proptest-regressions/properties.txt"))]

    /// docs/api.md, I-7: through any sequence of pairing attempts (wrong codes only while pairing
    /// is open, as the store checks the lock first), the limit burns the codes and locks exactly
    /// when the written-down window says, and holds the same failures and lock.
    #[test]
    fn the_pairing_limit_follows_the_window_of_api_section_3(
        earlier in proptest::collection::vec(0i64..PAIRING_TTL_MILLIS, 0..8),
        gaps in proptest::collection::vec(
            prop_oneof![
                0i64..1_000,
                Just(PAIRING_TTL_MILLIS),
                (PAIRING_TTL_MILLIS - 2)..(PAIRING_TTL_MILLIS + 2),
                0i64..(2 * PAIRING_TTL_MILLIS),
            ],
            1..24,
        ),
    ) {
        // A stored state with any number of recent failures, even more than a limit writes.
        let start = 10 * PAIRING_TTL_MILLIS;
        let mut failures: Vec<i64> = earlier.iter().map(|offset| start - offset).collect();
        failures.sort_unstable();
        let mut reference = PairingReference { failures, locked_until: None };
        let mut limit = reference.as_limit();
        let mut now = start;
        for gap in gaps {
            now += gap;
            let locked = reference.locked_at(now);
            prop_assert_eq!(limit.check(at(now)), locked.map(at).map_or(Ok(()), Err));
            if locked.is_some() {
                continue;
            }
            let after = limit.after_failure(at(now));
            prop_assert_eq!(after.burn_codes, reference.wrong_code(now), "at {}", now);
            prop_assert_eq!(&after.limit, &reference.as_limit());
            limit = after.limit;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Validation (docs/api.md, docs/openai-sdk.md; I-9).
// ---------------------------------------------------------------------------------------------

/// The params of `draft` that break a rule of docs/api.md (and the id rules), written down: the
/// validator must reject exactly the drafts that have one, naming one of them.
fn broken_params(draft: &SubmitDraft) -> BTreeSet<String> {
    let mut broken = BTreeSet::new();
    let mut breaks = |param: String, is_broken: bool| {
        if is_broken {
            broken.insert(param);
        }
    };
    let model_char = |c: char| c.is_ascii_alphanumeric() || "._-:/".contains(c);
    breaks(
        "model".into(),
        draft.model.is_empty()
            || draft.model.len() > 128
            || !draft.model.chars().all(model_char)
            || draft.model.starts_with(['.', '/']),
    );
    match &draft.input {
        DraftInput::Text(text) => breaks("input".into(), text.trim().is_empty()),
        DraftInput::Messages(messages) => {
            breaks("input".into(), messages.is_empty());
            for (index, message) in messages.iter().enumerate() {
                let known = ["system", "developer", "user", "assistant"];
                breaks(
                    format!("input[{index}].role"),
                    !known.contains(&message.role.as_str()),
                );
            }
        }
    }
    if let Some(policy) = &draft.on_restart {
        breaks(
            "on_restart".into(),
            !["fail", "retry", "resume"].contains(&policy.as_str()),
        );
    }
    if let Some(tokens) = draft.max_output_tokens {
        breaks(
            "max_output_tokens".into(),
            !(1..=MAX_OUTPUT_TOKENS).contains(&tokens),
        );
    }
    let in_range = |value: f64, max: f64| (0.0..=max).contains(&value);
    if let Some(temperature) = draft.temperature {
        breaks("temperature".into(), !in_range(temperature, 2.0));
    }
    if let Some(top_p) = draft.top_p {
        breaks("top_p".into(), !in_range(top_p, 1.0));
    }
    if let Some(metadata) = &draft.metadata {
        breaks("metadata".into(), metadata.len() > 16);
        for (key, value) in metadata {
            let key_chars = key.chars().count();
            breaks(
                format!("metadata.{key}"),
                key_chars == 0 || key_chars > 64 || value.chars().count() > 512,
            );
        }
    }
    if let Some(id) = &draft.previous_response_id {
        breaks(
            "previous_response_id".into(),
            ResponseId::parse(id).is_err(),
        );
    }
    broken
}

/// The request a valid draft must become: its values, with the defaults of docs/api.md for what
/// it leaves out.
fn expected_request(draft: &SubmitDraft) -> SubmitRequest {
    let role = |name: &str| Role::parse(name).unwrap();
    SubmitRequest {
        model: lmsp_domain::ModelId::parse(&draft.model).unwrap(),
        input: match &draft.input {
            DraftInput::Text(text) => Input::Text(text.clone()),
            DraftInput::Messages(messages) => Input::Messages(
                messages
                    .iter()
                    .map(|m| Message::new(role(&m.role), m.content.clone()))
                    .collect(),
            ),
        },
        instructions: draft.instructions.clone().filter(|text| !text.is_empty()),
        background: draft.background.unwrap_or(false),
        stream: draft.stream.unwrap_or(false),
        on_restart: draft
            .on_restart
            .as_deref()
            .map(|name| RestartPolicy::parse(name).unwrap()),
        max_output_tokens: draft
            .max_output_tokens
            .map_or(256, |n| u32::try_from(n).unwrap()),
        seed: draft.seed,
        temperature: draft.temperature.map(|t| Fraction::new(t).unwrap()),
        top_p: draft.top_p.map(|p| Fraction::new(p).unwrap()),
        metadata: draft.metadata.clone().unwrap_or_default(),
        previous_response_id: draft
            .previous_response_id
            .as_deref()
            .map(|id| ResponseId::parse(id).unwrap()),
        service_tier: draft
            .service_tier
            .as_deref()
            .map_or(lmsp_domain::ServiceTier::Default, |name| {
                lmsp_domain::ServiceTier::parse(name).unwrap()
            }),
        controls: Default::default(),
        shape: draft.shape,
    }
}

fn a_response_id() -> impl Strategy<Value = String> {
    any::<u64>().prop_map(|seed| ResponseId::from_ulid(ulid(seed)).to_string())
}

fn valid_input() -> impl Strategy<Value = DraftInput> {
    let role = select(vec!["system", "developer", "user", "assistant"]);
    prop_oneof![
        "[a-zA-Z ]{0,12}[a-z][a-zA-Z ]{0,12}".prop_map(DraftInput::Text),
        proptest::collection::vec(
            (role, ".{0,10}").prop_map(|(role, content)| DraftMessage::new(role, content)),
            1..4
        )
        .prop_map(DraftInput::Messages),
    ]
}

/// `n` distinct metadata keys, each 1–64 characters.
fn distinct_keys(n: usize) -> impl Strategy<Value = Vec<String>> {
    proptest::collection::vec("[a-z]{1,60}", n).prop_map(|stems| {
        stems
            .into_iter()
            .enumerate()
            .map(|(index, stem)| format!("{stem}{index:02}"))
            .collect()
    })
}

/// Pairs of `keys` and `values`, with `first_key` and `first_value` (if any) for the first pair.
fn pairs(
    keys: Vec<String>,
    values: Vec<String>,
    first_key: Option<String>,
    first_value: Option<String>,
) -> lmsp_domain::Metadata {
    let mut pairs: Vec<(String, String)> = keys.into_iter().zip(values).collect();
    if let Some(first) = pairs.first_mut() {
        first.0 = first_key.unwrap_or(first.0.clone());
        first.1 = first_value.unwrap_or(first.1.clone());
    }
    pairs.into_iter().collect()
}

/// Metadata within the rules: up to 16 pairs (often exactly 0 or 16), keys up to 64 characters
/// and values up to 512, counted in characters, not bytes.
fn valid_metadata() -> impl Strategy<Value = lmsp_domain::Metadata> {
    let count = prop_oneof![
        Just(0usize),
        Just(MAX_METADATA_PAIRS),
        0..=MAX_METADATA_PAIRS
    ];
    count.prop_flat_map(|n| {
        let values = proptest::collection::vec(".{0,20}", n);
        let first_key = proptest::option::of(Just("é".repeat(64)));
        let first_value = proptest::option::of(select(vec!["v".repeat(512), "é".repeat(512)]));
        (distinct_keys(n), values, first_key, first_value)
            .prop_map(|(keys, values, key, value)| pairs(keys, values, key, value))
    })
}

prop_compose! {
    /// A draft that keeps every rule, with any subset of the optional fields.
    fn valid_draft()(
        model in prop_oneof!["[a-zA-Z0-9][a-zA-Z0-9._:/-]{0,40}", Just("x".repeat(128))],
        input in valid_input(),
        instructions in proptest::option::of(".{0,8}"),
        background in proptest::option::of(any::<bool>()),
        stream in proptest::option::of(any::<bool>()),
        on_restart in proptest::option::of(select(vec!["fail", "retry", "resume"])),
        max_output_tokens in proptest::option::of(prop_oneof![
            Just(1u64), Just(MAX_OUTPUT_TOKENS), 1u64..=MAX_OUTPUT_TOKENS
        ]),
        seed in proptest::option::of(any::<u64>()),
        temperature in proptest::option::of(prop_oneof![Just(0.0), Just(2.0), 0.0f64..=2.0]),
        top_p in proptest::option::of(prop_oneof![Just(0.0), Just(1.0), 0.0f64..=1.0]),
        metadata in proptest::option::of(valid_metadata()),
        previous_response_id in proptest::option::of(a_response_id()),
        service_tier in proptest::option::of(select(vec!["auto", "default", "priority", "flex"])),
    ) -> SubmitDraft {
        SubmitDraft {
            model,
            input,
            instructions,
            background,
            stream,
            on_restart: on_restart.map(String::from),
            max_output_tokens,
            seed,
            temperature,
            top_p,
            metadata,
            previous_response_id,
            controls: Default::default(),
            service_tier: service_tier.map(String::from),
            shape: Default::default(),
        }
    }
}

fn any_text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        " {1,3}".boxed(),
        "[a-z]{1,8}".boxed(),
        any::<String>().boxed(),
    ]
}

fn any_number(max: f64) -> impl Strategy<Value = f64> {
    prop_oneof![
        select(vec![
            0.0,
            -0.0,
            max,
            max + 1e-9,
            -1e-9,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
        ]),
        any::<f64>(),
        -1.0f64..(max + 1.0),
    ]
}

/// Metadata that may break a rule: 16 or 17 pairs and more, a key that is empty or longer than
/// 64 characters, a value longer than 512.
fn any_metadata() -> impl Strategy<Value = lmsp_domain::Metadata> {
    let count = prop_oneof![
        Just(MAX_METADATA_PAIRS),
        Just(MAX_METADATA_PAIRS + 1),
        0..=MAX_METADATA_PAIRS + 3
    ];
    count.prop_flat_map(|n| {
        let values = proptest::collection::vec(".{0,12}", n);
        let first_key = proptest::option::of(prop_oneof![
            Just(String::new()),
            Just("x".repeat(65)),
            Just("é".repeat(65)),
            any::<String>(),
        ]);
        let first_value = proptest::option::of(select(vec!["v".repeat(513), "é".repeat(513)]));
        (distinct_keys(n), values, first_key, first_value)
            .prop_map(|(keys, values, key, value)| pairs(keys, values, key, value))
    })
}

prop_compose! {
    /// Any draft: each field valid, broken, or arbitrary.
    fn any_draft()(
        valid in valid_draft(),
        model in proptest::option::of(prop_oneof![
            any_text(), Just("../etc".into()), Just("/abs".into()), Just(".x".into()),
            Just("a b".into()), Just("x".repeat(129)),
        ]),
        input in proptest::option::of(prop_oneof![
            any_text().prop_map(DraftInput::Text),
            proptest::collection::vec(
                (prop_oneof![
                    select(vec!["system", "user", "bot", "User", ""]).prop_map(String::from),
                    any::<String>(),
                ], any_text()).prop_map(|(role, content)| DraftMessage::new(role, content)),
                0..4,
            ).prop_map(DraftInput::Messages),
        ]),
        on_restart in proptest::option::of(proptest::option::of(prop_oneof![
            select(vec!["Fail", "later", "", " retry"]).prop_map(String::from),
            any_text(),
        ])),
        max_output_tokens in proptest::option::of(proptest::option::of(prop_oneof![
            select(vec![0u64, 1, MAX_OUTPUT_TOKENS, MAX_OUTPUT_TOKENS + 1, u64::MAX]),
            any::<u64>(),
        ])),
        temperature in proptest::option::of(proptest::option::of(any_number(2.0))),
        top_p in proptest::option::of(proptest::option::of(any_number(1.0))),
        metadata in proptest::option::of(proptest::option::of(any_metadata())),
        previous_response_id in proptest::option::of(proptest::option::of(prop_oneof![
            a_response_id().prop_map(|id| id.replace("resp_", "task_")),
            a_response_id().prop_map(|id| id.to_lowercase()),
            a_response_id().prop_map(|id| format!("{id}0")),
            any_text(),
        ])),
    ) -> SubmitDraft {
        // `None` keeps the valid value; `Some(value)` replaces it.
        SubmitDraft {
            model: model.unwrap_or(valid.model),
            input: input.unwrap_or(valid.input),
            on_restart: on_restart.unwrap_or(valid.on_restart),
            max_output_tokens: max_output_tokens.unwrap_or(valid.max_output_tokens),
            temperature: temperature.unwrap_or(valid.temperature),
            top_p: top_p.unwrap_or(valid.top_p),
            metadata: metadata.unwrap_or(valid.metadata),
            previous_response_id: previous_response_id.unwrap_or(valid.previous_response_id),
            ..valid
        }
    }
}

/// Whether `param` names a field the draft has, or a required one.
fn names_a_field_of(param: &str, draft: &SubmitDraft) -> bool {
    let field = param.split(['.', '[']).next().unwrap_or_default();
    match field {
        "model" | "input" => true,
        "on_restart" => draft.on_restart.is_some(),
        "max_output_tokens" => draft.max_output_tokens.is_some(),
        "temperature" => draft.temperature.is_some(),
        "top_p" => draft.top_p.is_some(),
        "metadata" => draft.metadata.is_some(),
        "previous_response_id" => draft.previous_response_id.is_some(),
        _ => false,
    }
}

proptest! {
    #![proptest_config(config("tests/proptest-regressions/properties.txt"))]

    /// I-9: whatever draft arrives, the validator does not panic; it rejects exactly the drafts
    /// that break a rule, with a non-empty message naming a param the draft has (or a required
    /// one) that breaks a rule; it accepts every other draft with its values.
    #[test]
    fn the_validator_rejects_exactly_the_drafts_that_break_a_rule(draft in any_draft()) {
        let broken = broken_params(&draft);

        match validate_submit(draft.clone()) {
            Err(error) => {
                prop_assert!(!error.message.trim().is_empty());
                prop_assert_eq!(error.to_string(), error.message.clone());
                let param = error.param.clone().unwrap_or_default();
                prop_assert!(names_a_field_of(&param, &draft), "{} names nothing in {:?}", param, draft);
                prop_assert!(broken.contains(&param), "{} breaks no rule; broken: {:?}", param, broken);
            }
            Ok(request) => {
                prop_assert!(broken.is_empty(), "accepted, yet {:?} break a rule", broken);
                prop_assert_eq!(request, expected_request(&draft));
            }
        }
    }

    /// I-9: a valid draft is accepted with its values, and the defaults fill what it leaves out.
    #[test]
    fn a_valid_draft_is_accepted_with_its_values(draft in valid_draft()) {
        prop_assert!(broken_params(&draft).is_empty(), "the strategy made {:?}", draft);

        let request = validate_submit(draft.clone());

        prop_assert_eq!(request, Ok(expected_request(&draft)));
    }
}

/// One rule broken in an otherwise valid draft.
#[derive(Debug, Clone)]
enum Breakage {
    Model(String),
    BlankInput(String),
    NoMessages,
    Role { index: usize, role: String },
    Policy(String),
    Tokens(u64),
    Temperature(f64),
    TopP(f64),
    TooManyPairs,
    Key(String),
    Value(String),
    PreviousResponse(String),
}

fn any_breakage() -> impl Strategy<Value = Breakage> {
    let bad_number = |max: f64| select(vec![-1e-9, max + 1e-9, f64::NAN, f64::INFINITY, -max]);
    prop_oneof![
        select(vec!["", "../etc", "/abs", ".hidden", "a b", "ü"])
            .prop_map(|m| Breakage::Model(m.into())),
        Just(Breakage::Model("x".repeat(129))),
        select(vec!["", " ", "\t\n"]).prop_map(|t| Breakage::BlankInput(t.into())),
        Just(Breakage::NoMessages),
        (0usize..3, select(vec!["bot", "User", "", "function"])).prop_map(|(index, role)| {
            Breakage::Role {
                index,
                role: role.into(),
            }
        }),
        select(vec!["", "Fail", "later", " retry"]).prop_map(|p| Breakage::Policy(p.into())),
        select(vec![0, MAX_OUTPUT_TOKENS + 1, u64::MAX]).prop_map(Breakage::Tokens),
        bad_number(2.0).prop_map(Breakage::Temperature),
        bad_number(1.0).prop_map(Breakage::TopP),
        Just(Breakage::TooManyPairs),
        select(vec![String::new(), "x".repeat(65), "é".repeat(65)]).prop_map(Breakage::Key),
        select(vec!["v".repeat(513), "é".repeat(513)]).prop_map(Breakage::Value),
        select(vec![
            "",
            "resp_",
            "task_01ARZ3NDEKTSV4RRFFQ69G5FAV",
            "resp_01arz3ndektsv4rrffq69g5fav"
        ])
        .prop_map(|id| Breakage::PreviousResponse(id.into())),
    ]
}

/// Breaks one rule of a valid draft; returns the param the rejection must name.
fn break_one_rule(draft: &mut SubmitDraft, breakage: Breakage) -> String {
    match breakage {
        Breakage::Model(model) => {
            draft.model = model;
            "model".into()
        }
        Breakage::BlankInput(text) => {
            draft.input = DraftInput::Text(text);
            "input".into()
        }
        Breakage::NoMessages => {
            draft.input = DraftInput::Messages(Vec::new());
            "input".into()
        }
        Breakage::Role { index, role } => {
            let mut messages: Vec<DraftMessage> = (0..=index)
                .map(|_| DraftMessage::new("user", "hi"))
                .collect();
            messages[index].role = role;
            draft.input = DraftInput::Messages(messages);
            format!("input[{index}].role")
        }
        Breakage::Policy(policy) => {
            draft.on_restart = Some(policy);
            "on_restart".into()
        }
        Breakage::Tokens(tokens) => {
            draft.max_output_tokens = Some(tokens);
            "max_output_tokens".into()
        }
        Breakage::Temperature(temperature) => {
            draft.temperature = Some(temperature);
            "temperature".into()
        }
        Breakage::TopP(top_p) => {
            draft.top_p = Some(top_p);
            "top_p".into()
        }
        Breakage::TooManyPairs => {
            draft.metadata = Some(
                (0..=MAX_METADATA_PAIRS)
                    .map(|i| (format!("k{i}"), "v".to_string()))
                    .collect(),
            );
            "metadata".into()
        }
        Breakage::Key(key) => {
            let param = format!("metadata.{key}");
            draft.metadata = Some([(key, "v".to_string())].into());
            param
        }
        Breakage::Value(value) => {
            draft.metadata = Some([("k".to_string(), value)].into());
            "metadata.k".into()
        }
        Breakage::PreviousResponse(id) => {
            draft.previous_response_id = Some(id);
            "previous_response_id".into()
        }
    }
}

proptest! {
    #![proptest_config(config("tests/proptest-regressions/properties.txt"))]

    /// I-9: a valid draft with exactly one rule broken is rejected, naming the broken field.
    #[test]
    fn a_valid_draft_with_one_broken_rule_is_rejected_naming_that_field(
        draft in valid_draft(),
        breakage in any_breakage(),
    ) {
        let mut draft = draft;
        let param = break_one_rule(&mut draft, breakage);
        prop_assert_eq!(broken_params(&draft), BTreeSet::from([param.clone()]));

        let rejected = validate_submit(draft);

        let error = rejected.unwrap_err();
        prop_assert_eq!(error.param, Some(param));
        prop_assert!(!error.message.trim().is_empty());
    }
}

// Holes found by review, now closed.

mod closed_holes {
    use super::*;
    use lmsp_domain::auth::PairingLimit;
    use lmsp_domain::{ResponseId, TaskId};
    use support::{claim, response_of, ulid};

    fn at(millis: i64) -> Timestamp {
        Timestamp::from_millis(millis)
    }

    /// `Task::as_created` promises "every other field is at its initial value", so that a store
    /// may render `response.created`'s task from the row; but it keeps the current `owner`, which
    /// changes with every claim and recovery. A task claimed by another instance then shows that
    /// instance in its creation event.
    #[test]
    fn the_creation_data_of_a_claimed_task_is_the_task_as_it_was_created() {
        let created = queued_task(1, instance(0), RestartPolicy::Retry);
        let claimed = advance_all(&created, &[claim()], instance(1), None, at(2_000))
            .unwrap()
            .task;

        assert_eq!(claimed.as_created(), created);
    }

    /// A `Complete` step must not store whatever response the worker hands it: one whose id is not the
    /// task's `response_id` ("each task has exactly one response id"), or that names another task,
    /// is written into the log and would be stored as the task's response.
    #[test]
    fn a_completion_carrying_another_tasks_response_is_refused() {
        let task = queued_task(2, instance(0), RestartPolicy::Fail);
        let running = advance_all(
            &task,
            &[claim(), Step::Loaded],
            instance(0),
            None,
            at(2_000),
        )
        .unwrap()
        .task;
        let mut other_id = response_of(&running, "text", at(3_000));
        other_id.id = ResponseId::from_ulid(ulid(77));
        let mut other_task = response_of(&running, "text", at(3_000));
        other_task.task_id = TaskId::from_ulid(ulid(78));

        for response in [other_id, other_task] {
            let step = Step::Complete {
                response: Box::new(response.clone()),
            };
            let outcome = advance_all(&running, &[step], instance(0), None, at(3_000));
            assert!(outcome.is_err(), "accepted {response:?}");
        }
    }

    /// A wrong code counted while pairing is locked keeps the lock: `/v1/pair` stays locked until
    /// the window has passed.
    #[test]
    fn a_wrong_code_counted_while_pairing_is_locked_keeps_the_lock() {
        let start = 1_000_000;
        let mut limit = PairingLimit::default();
        for i in 0..5 {
            limit = limit.after_failure(at(start + i)).limit;
        }
        let until = limit.check(at(start + 10)).unwrap_err();

        let after = limit.after_failure(at(start + 10)).limit;

        assert_eq!(after.check(at(start + 11)), Err(until));
    }
}
