//! What a store writes, decided by the domain (P-3…P-11, I-3, I-7): a worker's steps, a claim,
//! a cancel and a recovery's move as a `TaskWrite` (row, events, responses, snapshot change), a
//! delete, a purge batch, and a recovery's tally. Part of the `properties` test binary.

use lmsp_domain::cancel::{decide_cancel, plan_cancel};
use lmsp_domain::event::{Event, EventKind, EventPayload};
use lmsp_domain::idempotency::{
    IdempotencyKey, IdempotencyRecord, IdempotencyScope, KeyState, Operation, RequestDigest,
    StoredReply,
};
use lmsp_domain::ids::{ClientId, TaskId};
use lmsp_domain::ports::{
    CancelOutcome, DeleteOutcome, FileDeleteOutcome, PurgeReport, RecoveryReport, Snapshot,
    StepOutcome,
};
use lmsp_domain::recovery::{self, recover, Move, RestartPolicy};
use lmsp_domain::task::Task;
use lmsp_domain::transition::{advance, advance_all, Refusal, Step};
use lmsp_domain::writes::{
    answered_key, decide_delete, decide_file_delete, plan_append, plan_claim, plan_create,
    purge_batch, snapshot_change, tally, CreatePlan, PurgeBatch, SnapshotChange, TaskWrite,
    PURGED_STATUSES,
};
use lmsp_domain::{TaskStatus, Timestamp};
use proptest::prelude::*;
use proptest::sample::select;

use crate::support::{
    any_instance, any_task, claim, complete, config, fail, instance, output, queued_task,
    response_of, ulid,
};

fn at(millis: i64) -> Timestamp {
    Timestamp::from_millis(millis)
}

fn snapshot(covers: u64) -> Snapshot {
    Snapshot {
        sequence_number: covers,
        state: vec![1, 2, 3],
    }
}

fn task_in(status: TaskStatus) -> Task {
    let mut task = queued_task(21, instance(0), RestartPolicy::Resume);
    task.status = status;
    task.last_sequence_number = 5;
    task
}

fn running() -> Task {
    let queued = queued_task(22, instance(0), RestartPolicy::Resume);
    advance_all(
        &queued,
        &[claim(), Step::Loaded],
        instance(0),
        None,
        at(1_100),
    )
    .unwrap()
    .task
}

fn another_client(task: &Task) -> ClientId {
    let other = ClientId::from_ulid(ulid(0xdead));
    assert_ne!(other, task.client_id);
    other
}

// ---------------------------------------------------------------------------------------------
// The snapshot change.
// ---------------------------------------------------------------------------------------------

/// A finished task keeps no snapshot, whatever a worker offers; an unfinished one stores the
/// offered snapshot, or keeps the one it has.
#[test]
fn a_snapshot_is_dropped_when_the_task_finishes_stored_when_offered_and_kept_otherwise() {
    let offered = snapshot(4);
    for &status in TaskStatus::ALL {
        let (with, without) = (
            snapshot_change(status, Some(&offered)),
            snapshot_change(status, None),
        );
        if status.is_finished() {
            assert_eq!(with, SnapshotChange::Drop, "{status}");
            assert_eq!(without, SnapshotChange::Drop, "{status}");
        } else {
            assert_eq!(with, SnapshotChange::Put(&offered), "{status}");
            assert_eq!(without, SnapshotChange::Keep, "{status}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// A worker's steps and a claim.
// ---------------------------------------------------------------------------------------------

/// P-3: a worker's output with a snapshot writes the advanced row and its events and stores the
/// snapshot; nothing else.
#[test]
fn an_output_with_a_snapshot_writes_the_advanced_row_its_events_and_the_snapshot() {
    let task = running();
    let steps = [output("once "), output("upon")];
    let offered = snapshot(task.last_sequence_number + 2);
    let write = plan_append(
        &task,
        &steps,
        instance(0),
        Some(task.last_sequence_number),
        Some(&offered),
        at(1_200),
    )
    .unwrap();
    let advanced = advance_all(
        &task,
        &steps,
        instance(0),
        Some(task.last_sequence_number),
        at(1_200),
    )
    .unwrap();
    assert_eq!(write.task, advanced.task);
    assert_eq!(write.events, advanced.events);
    assert!(write.responses.is_empty());
    assert_eq!(write.snapshot, SnapshotChange::Put(&offered));
    assert!(!write.resumes());
}

/// P-3: a completion stores its response and drops the snapshot, even one offered with it.
#[test]
fn a_completion_stores_its_response_and_drops_the_snapshot() {
    let task = running();
    let steps = [output("x"), complete(&task, "x")];
    let offered = snapshot(task.last_sequence_number);
    let write = plan_append(&task, &steps, instance(0), None, Some(&offered), at(1_300)).unwrap();
    assert_eq!(write.task.status, TaskStatus::Completed);
    assert_eq!(write.responses, vec![&response_of(&task, "x", at(9_000))]);
    assert_eq!(write.snapshot, SnapshotChange::Drop);
}

/// P-3: a failure stores no response and drops the snapshot.
#[test]
fn a_failure_stores_no_response_and_drops_the_snapshot() {
    let task = running();
    let steps = [fail()];
    let write = plan_append(&task, &steps, instance(0), None, None, at(1_300)).unwrap();
    assert_eq!(write.task.status, TaskStatus::Failed);
    assert!(write.responses.is_empty());
    assert_eq!(write.snapshot, SnapshotChange::Drop);
}

/// A refused batch writes nothing: the refusal is the domain's.
#[test]
fn a_refused_batch_is_the_transition_functions_refusal() {
    let task = running();
    let steps = [output("x")];
    assert_eq!(
        plan_append(&task, &steps, instance(0), Some(1), None, at(1_300)),
        Err(Refusal::Stale {
            stored: task.last_sequence_number
        })
    );
    assert_eq!(
        plan_append(&task, &steps, instance(1), None, None, at(1_300)),
        Err(Refusal::NotOwner)
    );
}

/// Applied, a write answers with the task and its events, and tells the listener the same events.
#[test]
fn an_applied_write_answers_with_its_task_and_events_and_tells_them() {
    let task = running();
    let steps = [output("x")];
    let write = plan_append(&task, &steps, instance(0), None, None, at(1_300)).unwrap();
    let (expected_task, expected_events) = (write.task.clone(), write.events.clone());
    assert_eq!(expected_events.len(), 3);
    let (outcome, told) = write.applied();
    assert_eq!(
        outcome,
        StepOutcome::Applied {
            task: expected_task,
            events: expected_events.clone()
        }
    );
    assert_eq!(told, expected_events);
}

/// A claim moves a queued task into the claimer's care and drops any snapshot (the run starts
/// from nothing); a task that is not queued refuses it.
#[test]
fn a_claim_takes_the_task_for_the_claimer_and_drops_its_snapshot() {
    let task = queued_task(23, instance(0), RestartPolicy::Retry);
    let write = plan_claim(&task, instance(2), at(1_400)).unwrap();
    let advanced = advance(&task, &claim(), instance(2), at(1_400)).unwrap();
    assert_eq!(write.task, advanced.task);
    assert_eq!(write.task.owner, instance(2));
    assert_eq!(write.events, advanced.events);
    assert_eq!(write.snapshot, SnapshotChange::Drop);
    assert!(write.responses.is_empty());
    assert_eq!(
        plan_claim(&running(), instance(2), at(1_400)).map(|write| write.task),
        advance(&running(), &claim(), instance(2), at(1_400)).map(|advanced| advanced.task)
    );
    assert!(plan_claim(&running(), instance(2), at(1_400)).is_err());
}

// ---------------------------------------------------------------------------------------------
// The cancel plan (P-4, I-3, I-7).
// ---------------------------------------------------------------------------------------------

/// P-4: a cancel writes exactly the cells of the table that have an event, as the cancel step of
/// the task's owner, with the snapshot dropped only when the task is finished by it; the other
/// cells answer with the task as read and write nothing.
#[test]
fn a_cancel_plan_writes_the_tables_event_and_answers_with_the_task_after_it() {
    for &status in TaskStatus::ALL {
        let task = task_in(status);
        let decision = decide_cancel(status);
        let plan = plan_cancel(&task, Some(task.client_id), at(2_000)).unwrap();
        match decision.event() {
            None => {
                assert_eq!(plan.write, None, "{status}");
                assert_eq!(
                    plan.outcome,
                    CancelOutcome::Decided {
                        decision,
                        task: task.clone()
                    },
                    "{status}"
                );
            }
            Some(event) => {
                let advanced = advance(&task, &Step::RequestCancel, task.owner, at(2_000)).unwrap();
                let write = plan.write.clone().unwrap();
                assert_eq!(write.task, advanced.task, "{status}");
                assert_eq!(write.events, advanced.events, "{status}");
                assert_eq!(write.events.last().unwrap().kind(), event.kind());
                assert!(write.responses.is_empty());
                let expected = if advanced.task.status.is_finished() {
                    SnapshotChange::Drop
                } else {
                    SnapshotChange::Keep
                };
                assert_eq!(write.snapshot, expected, "{status}");
                assert_eq!(
                    plan.outcome,
                    CancelOutcome::Decided {
                        decision,
                        task: advanced.task
                    },
                    "{status}"
                );
            }
        }
    }
    assert_eq!(
        plan_cancel(&task_in(TaskStatus::Queued), None, at(2_000))
            .unwrap()
            .write
            .unwrap()
            .snapshot,
        SnapshotChange::Drop
    );
    assert_eq!(
        plan_cancel(&task_in(TaskStatus::Running), None, at(2_000))
            .unwrap()
            .write
            .unwrap()
            .snapshot,
        SnapshotChange::Keep
    );
}

/// I-7: another client's task does not exist for a client's cancel, whatever its status; the
/// service itself (`None`) may cancel any task.
#[test]
fn another_clients_task_is_not_found_by_a_cancel_and_the_service_finds_every_task() {
    for &status in TaskStatus::ALL {
        let task = task_in(status);
        let plan = plan_cancel(&task, Some(another_client(&task)), at(2_000)).unwrap();
        assert_eq!(plan.outcome, CancelOutcome::NotFound, "{status}");
        assert_eq!(plan.write, None, "{status}");
        let by_service = plan_cancel(&task, None, at(2_000)).unwrap();
        assert_ne!(by_service.outcome, CancelOutcome::NotFound, "{status}");
        assert_eq!(
            by_service.write.is_some(),
            decide_cancel(status).event().is_some()
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Deletion and the purge (P-5, P-6, I-7).
// ---------------------------------------------------------------------------------------------

/// P-6, I-7: a delete removes only a finished task, and only the caller's (the service may delete
/// any finished task).
#[test]
fn a_delete_removes_only_a_finished_task_of_the_caller() {
    for &status in TaskStatus::ALL {
        let task = task_in(status);
        let expected = if status.is_finished() {
            DeleteOutcome::Deleted
        } else {
            DeleteOutcome::Unfinished
        };
        assert_eq!(
            decide_delete(&task, Some(task.client_id)),
            expected,
            "{status}"
        );
        assert_eq!(decide_delete(&task, None), expected, "{status}");
        assert_eq!(
            decide_delete(&task, Some(another_client(&task))),
            DeleteOutcome::NotFound,
            "{status}"
        );
    }
}

/// P-6: a purge removes the finished statuses, exactly.
#[test]
fn a_purge_removes_exactly_the_finished_statuses() {
    for &status in TaskStatus::ALL {
        assert_eq!(
            PURGED_STATUSES.contains(&status),
            status.is_finished(),
            "{status}"
        );
    }
    assert_eq!(PURGED_STATUSES, TaskStatus::FINISHED);
}

/// P-5: a batch takes tasks in order while they fit: at most `max_tasks`, and past the first no
/// more events than `max_events` in all (a budget met exactly still fits); the first is always
/// taken; `more` says whether any candidate was left.
#[test]
fn a_purge_batch_takes_tasks_in_order_within_its_task_and_event_budgets() {
    let batch = |tasks, more| PurgeBatch { tasks, more };
    assert_eq!(purge_batch(&[], 3, 10), batch(0, false));
    assert_eq!(purge_batch(&[4, 3, 3], 3, 10), batch(3, false));
    assert_eq!(purge_batch(&[4, 3, 4], 3, 10), batch(2, true));
    assert_eq!(purge_batch(&[4, 3, 3, 1], 3, 100), batch(3, true));
    assert_eq!(purge_batch(&[4, 3], 2, 100), batch(2, false));
    assert_eq!(purge_batch(&[50, 1], 5, 10), batch(1, true));
    assert_eq!(purge_batch(&[50], 5, 10), batch(1, false));
    assert_eq!(purge_batch(&[10, 0], 5, 10), batch(2, false));
    assert_eq!(purge_batch(&[0, 0, 11], 5, 10), batch(2, true));
    assert_eq!(purge_batch(&[1, 1], 1, 10), batch(1, true));
    assert_eq!(purge_batch(&[u64::MAX, u64::MAX], 5, 10), batch(1, true));
}

/// I-7: another client's file does not exist for a caller; the owner (or the admin) deletes it
/// unless a batch that has not ended reads it.
#[test]
fn a_file_is_deleted_only_by_its_owner_and_only_when_no_open_batch_reads_it() {
    let owner = ClientId::from_ulid(ulid::Ulid::from_parts(1, 1));
    let other = ClientId::from_ulid(ulid::Ulid::from_parts(1, 2));
    for in_use in [false, true] {
        assert_eq!(
            decide_file_delete(owner, Some(other), in_use),
            FileDeleteOutcome::NotFound
        );
    }
    for caller in [Some(owner), None] {
        assert_eq!(
            decide_file_delete(owner, caller, true),
            FileDeleteOutcome::InUse
        );
        assert_eq!(
            decide_file_delete(owner, caller, false),
            FileDeleteOutcome::Deleted
        );
    }
}

/// P-5: a purge batch's report counts every task it took, the events removed with them, and
/// whether candidates were left.
#[test]
fn a_purge_batchs_report_counts_what_it_took_and_what_it_left() {
    let batch = purge_batch(&[4, 3, 4], 3, 10);
    assert_eq!(
        batch.report(7),
        PurgeReport {
            tasks: 2,
            events: 7,
            more: true
        }
    );
    assert_eq!(purge_batch(&[], 3, 10).report(0), PurgeReport::default());
}

proptest! {
    #![proptest_config(config("tests/proptest-regressions/properties.txt"))]

    /// P-5: whatever the sizes, a batch is a prefix that keeps both budgets (past its first
    /// task), and it stops only where the next candidate would break one.
    #[test]
    fn a_purge_batch_is_the_longest_prefix_within_its_budgets(
        sizes in proptest::collection::vec(0u64..40, 0..12),
        max_tasks in 1usize..8,
        max_events in 0u64..100,
    ) {
        let PurgeBatch { tasks, more } = purge_batch(&sizes, max_tasks, max_events);
        prop_assert!(tasks <= sizes.len());
        prop_assert_eq!(more, tasks < sizes.len());
        prop_assert!(tasks <= max_tasks);
        prop_assert!(tasks >= 1 || sizes.is_empty());
        let used: u64 = sizes[..tasks].iter().sum();
        prop_assert!(tasks <= 1 || used <= max_events);
        if tasks < sizes.len() {
            prop_assert!(tasks == max_tasks || used + sizes[tasks] > max_events);
        }
    }

    /// I-7: a task exists for the service and for its own client only.
    #[test]
    fn a_task_is_visible_to_the_service_and_its_own_client_only(
        task in any_task(),
        seed in any::<u64>(),
    ) {
        let client = ClientId::from_ulid(ulid(seed));
        prop_assert!(task.visible_to(None));
        prop_assert!(task.visible_to(Some(task.client_id)));
        prop_assert_eq!(task.visible_to(Some(client)), client == task.client_id);
    }

    /// P-7…P-11: a recovery's write is the move `recover` decides, its snapshot dropped exactly
    /// when the move finishes the task; the tally counts it moved (and resumed, when it is), or
    /// untouched.
    #[test]
    fn a_recoverys_write_and_tally_follow_the_decided_move(
        task in any_task(),
        rescuer in any_instance(),
        covers in proptest::option::of(0u64..80),
        earlier in select(vec![0u64, 2]),
    ) {
        let recovered = recover(&task, rescuer, covers, Some("text".into()), at(5_000));
        let write = recovered.clone().map(TaskWrite::from_advanced);
        let mut report = RecoveryReport {
            moved: earlier,
            untouched: earlier,
            resumed: vec![TaskId::from_ulid(ulid(1))],
        };
        tally(&mut report, task.id, write.as_ref());
        match (recovered, write) {
            (None, None) => {
                prop_assert_eq!(report.moved, earlier);
                prop_assert_eq!(report.untouched, earlier + 1);
                prop_assert_eq!(report.resumed.len(), 1);
            }
            (Some(advanced), Some(write)) => {
                let resumes = advanced.events.iter().any(|e| e.kind() == EventKind::Resumed);
                prop_assert_eq!(write.resumes(), resumes);
                prop_assert_eq!(
                    write.snapshot,
                    if advanced.task.status.is_finished() {
                        SnapshotChange::Drop
                    } else {
                        SnapshotChange::Keep
                    }
                );
                prop_assert!(write.responses.is_empty());
                prop_assert_eq!(&write.task, &advanced.task);
                prop_assert_eq!(&write.events, &advanced.events);
                prop_assert_eq!(report.moved, earlier + 1);
                prop_assert_eq!(report.untouched, earlier);
                let mut expected = vec![TaskId::from_ulid(ulid(1))];
                if resumes {
                    expected.push(task.id);
                }
                prop_assert_eq!(report.resumed, expected);
            }
            _ => prop_assert!(false, "the write is the recovered move"),
        }
    }
}

/// A resumed running task's write resumes it and keeps the snapshot it continues from.
#[test]
fn a_resumed_tasks_write_resumes_it_and_keeps_its_snapshot() {
    let task = running();
    let write =
        TaskWrite::from_advanced(recover(&task, instance(1), Some(3), None, at(5_000)).unwrap());
    assert!(write.resumes());
    assert_eq!(write.snapshot, SnapshotChange::Keep);
    let mut report = RecoveryReport::default();
    tally(&mut report, task.id, Some(&write));
    assert_eq!(
        report,
        RecoveryReport {
            moved: 1,
            untouched: 0,
            resumed: vec![task.id]
        }
    );
}

// ---------------------------------------------------------------------------------------------
// The recovery table as data (P-7…P-10).
// ---------------------------------------------------------------------------------------------

/// P-7: the table has exactly one cell for each unfinished status under each policy, and none for
/// a finished one; `cells_of` hands out a status's cells, one per policy, and `plan` is each
/// cell's move.
#[test]
fn the_recovery_table_has_one_cell_per_unfinished_status_and_policy_and_plan_reads_it() {
    assert_eq!(
        recovery::TABLE.len(),
        TaskStatus::UNFINISHED.len() * RestartPolicy::ALL.len()
    );
    for &status in TaskStatus::ALL {
        let cells: Vec<_> = recovery::cells_of(status).collect();
        if status.is_finished() {
            assert!(cells.is_empty(), "{status}");
            for &policy in RestartPolicy::ALL {
                assert_eq!(recovery::plan(status, policy), Move::Untouched);
            }
            continue;
        }
        let policies: Vec<_> = cells.iter().map(|cell| cell.policy).collect();
        assert_eq!(policies, RestartPolicy::ALL, "{status}");
        for cell in cells {
            assert_eq!(cell.status, status);
            assert_eq!(recovery::plan(status, cell.policy), cell.moves);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Creation under an idempotency key (P-2, I-1, I-8).
// ---------------------------------------------------------------------------------------------

fn key_record(state: KeyState, expires_at: i64) -> IdempotencyRecord {
    IdempotencyRecord {
        scope: IdempotencyScope {
            client_id: ClientId::from_ulid(ulid(30)),
            operation: Operation::CreateResponse,
        },
        key: IdempotencyKey::parse("create-1").unwrap(),
        digest: RequestDigest::of_canonical(b"{}"),
        state,
        held_until: None,
        held_by: None,
        created_at: at(0),
        expires_at: at(expires_at),
    }
}

fn answered() -> KeyState {
    KeyState::Answered(StoredReply {
        task_id: Some(TaskId::from_ulid(ulid(31))),
        body: b"202 queued".to_vec(),
    })
}

/// I-8: only an answered record that has not expired (its expiry after now) answers a request;
/// a pending one, an expired one and none do not.
#[test]
fn only_an_unexpired_answered_record_answers_a_request() {
    let live = key_record(answered(), 1_001);
    assert_eq!(answered_key(Some(&live), at(1_000)), Some(&live));
    assert_eq!(answered_key(Some(&live), at(1_001)), None);
    assert_eq!(answered_key(Some(&live), at(1_002)), None);
    assert_eq!(
        answered_key(Some(&key_record(KeyState::Pending, 5_000)), at(1_000)),
        None
    );
    assert_eq!(answered_key(None, at(1_000)), None);
}

/// P-2, I-1: a new task is written as created, with its `response.created` event numbered 1 and
/// nothing else; under a key that already answered, nothing is written and the record answers.
#[test]
fn a_new_task_is_written_as_created_with_its_first_event_unless_its_key_answered() {
    let mut task = queued_task(32, instance(1), RestartPolicy::Fail);
    task.last_sequence_number = 7;
    let CreatePlan::Write(write) = plan_create(&task, None) else {
        panic!("a create without a key writes");
    };
    let created = task.as_created();
    assert_eq!(write.task, created);
    assert_eq!(write.task.last_sequence_number, 1);
    assert_eq!(
        write.events,
        vec![Event {
            task_id: task.id,
            sequence_number: 1,
            created_at: task.created_at,
            payload: EventPayload::Created {
                task: Box::new(created.clone())
            },
        }]
    );
    assert!(write.responses.is_empty());
    assert_eq!(write.snapshot, SnapshotChange::Keep);
    let pending = key_record(KeyState::Pending, 9_000);
    let written = |plan: CreatePlan| match plan {
        CreatePlan::Write(write) => Some(write.task),
        CreatePlan::KeyAnswered(_) => None,
    };
    assert_eq!(
        written(plan_create(&task, Some(&pending))),
        Some(created.clone())
    );
    let expired = key_record(answered(), task.created_at.as_millis());
    assert_eq!(written(plan_create(&task, Some(&expired))), Some(created));
    let live = key_record(answered(), task.created_at.as_millis() + 1);
    assert_eq!(
        plan_create(&task, Some(&live)),
        CreatePlan::KeyAnswered(live.clone())
    );
}
