//! Concurrency within one store: claimers, cancels and finishes, appends and key claims racing
//! each other. Each race has exactly one winner, and the log stays consistent (I-1, I-2).

use std::collections::HashSet;
use std::sync::Arc;

use lmsp_domain::cancel::CancelDecision;
use lmsp_domain::idempotency::{KeyDecision, Operation};
use lmsp_domain::ports::StepOutcome;
use lmsp_domain::recovery::RestartPolicy;
use lmsp_domain::status::TaskStatus;
use lmsp_domain::transition::Refusal;

use crate::fixtures::*;
use crate::support::*;
use crate::{fresh_store, StoreFactory};

/// Four claimers racing over twenty queued tasks claim every task exactly once, and each claim
/// makes the claimer the owner.
pub async fn concurrent_claimers_take_each_task_once<F: StoreFactory>(factory: &F) {
    let (store, _listener) = fresh_store(factory).await;
    let store = Arc::new(store);
    let mut created = HashSet::new();
    for _ in 0..20 {
        created.insert(
            create(&*store, task(instance_id(), RestartPolicy::Fail))
                .await
                .id,
        );
    }
    let mut claimers = Vec::new();
    for _ in 0..4 {
        let store = Arc::clone(&store);
        claimers.push(tokio::spawn(async move {
            let me = instance_id();
            let mut mine = Vec::new();
            while let Some(claimed) = store.claim_next(me, time(10)).await.unwrap() {
                assert_eq!(claimed.owner, me, "the claimer owns what it claimed");
                assert_eq!(claimed.status, TaskStatus::Loading);
                mine.push(claimed.id);
            }
            mine
        }));
    }
    let mut claimed = Vec::new();
    for claimer in claimers {
        claimed.extend(claimer.await.unwrap());
    }
    let unique: HashSet<_> = claimed.iter().copied().collect();
    assert_eq!(unique.len(), claimed.len(), "a task was claimed twice");
    assert_eq!(unique, created, "every task was claimed");
    for id in created {
        assert_log_consistent(&*store, id).await;
    }
}

/// P-4, I-3: a cancel racing the worker's completion of a running task: either the completion
/// wins (the cancel finds nothing to cancel) or the cancel wins (the completion is refused and
/// the worker acknowledges); never both, and the log holds one terminal event at most.
pub async fn a_cancel_racing_a_completion_has_one_winner_p4_i3<F: StoreFactory>(factory: &F) {
    let (store, _listener) = fresh_store(factory).await;
    let store = Arc::new(store);
    let worker = instance_id();
    for round in 0..10 {
        let running = task_in(
            &*store,
            task(worker, RestartPolicy::Fail),
            worker,
            TaskStatus::Running,
        )
        .await;
        let canceller = {
            let store = Arc::clone(&store);
            tokio::spawn(async move { store.cancel(running.id, None, time(100 + round)).await })
        };
        let finisher = {
            let store = Arc::clone(&store);
            let running = running.clone();
            tokio::spawn(async move {
                store
                    .finish(
                        running.id,
                        worker,
                        complete(&running, "", time(100 + round)),
                        time(100 + round),
                    )
                    .await
            })
        };
        let (decision, _) = decided(canceller.await.unwrap().unwrap());
        let finished = finisher.await.unwrap().unwrap();
        let (after, _) = assert_log_consistent(&*store, running.id).await;
        match (&finished, decision) {
            (StepOutcome::Applied { .. }, CancelDecision::NotCancellable) => {
                assert_eq!(after.status, TaskStatus::Completed);
            }
            (StepOutcome::Refused { refusal, .. }, CancelDecision::CancellingNow) => {
                assert!(
                    matches!(refusal, Refusal::CancelPending { .. }),
                    "{refusal:?}"
                );
                assert_eq!(after.status, TaskStatus::Cancelling);
            }
            other => panic!("P-4: both or neither won: {other:?}"),
        }
    }
}

/// P-3: two appends at the same sequence number race; exactly one applies, the other is refused
/// as stale, and the log has no gap or repeat.
pub async fn racing_appends_at_one_sequence_number_apply_once_p3<F: StoreFactory>(factory: &F) {
    let (store, _listener) = fresh_store(factory).await;
    let store = Arc::new(store);
    let worker = instance_id();
    let running = task_in(
        &*store,
        task(worker, RestartPolicy::Fail),
        worker,
        TaskStatus::Running,
    )
    .await;
    let mut racers = Vec::new();
    for text in ["left", "right"] {
        let store = Arc::clone(&store);
        let expected = running.last_sequence_number;
        racers.push(tokio::spawn(async move {
            store
                .append(
                    running.id,
                    worker,
                    expected,
                    vec![output(text)],
                    None,
                    time(50),
                )
                .await
                .unwrap()
        }));
    }
    let mut applied_count = 0;
    for racer in racers {
        match racer.await.unwrap() {
            StepOutcome::Applied { .. } => applied_count += 1,
            StepOutcome::Refused { refusal, .. } => {
                assert!(matches!(refusal, Refusal::Stale { .. }), "{refusal:?}")
            }
            StepOutcome::NotFound => panic!("the task exists"),
        }
    }
    assert_eq!(applied_count, 1, "P-3: exactly one append applied");
    let (after, _) = assert_log_consistent(&*store, running.id).await;
    assert!(after.last_sequence_number > running.last_sequence_number);
}

/// I-8: eight requests racing to claim one key: exactly one proceeds, the others are told it is
/// in use.
pub async fn racing_claims_of_one_key_let_one_proceed_i8<F: StoreFactory>(factory: &F) {
    let (store, _listener) = fresh_store(factory).await;
    let store = Arc::new(store);
    let claim = key_claim(
        client_id(),
        Operation::CreateResponse,
        "race",
        "{}",
        instance_id(),
        time(0),
    );
    let mut racers = Vec::new();
    for _ in 0..8 {
        let store = Arc::clone(&store);
        let claim = claim.clone();
        racers.push(tokio::spawn(async move {
            store.claim_key(&claim, time(1)).await.unwrap()
        }));
    }
    let mut proceeded = 0;
    for racer in racers {
        match racer.await.unwrap() {
            KeyDecision::Proceed => proceeded += 1,
            KeyDecision::InUse => {}
            other => panic!("unexpected decision: {other:?}"),
        }
    }
    assert_eq!(proceeded, 1, "I-8: one request holds the key");
}
