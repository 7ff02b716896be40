//! Race test (P-4, I-3): 10 000 running tasks each get a `cancel` and a `finish(Complete)` issued
//! concurrently from different tokio worker threads. Exactly one of "cancel accepted" and
//! "completed" wins each race; no log ever holds both `response.cancelling` and
//! `response.completed`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Instant;

use futures::future::join_all;
use lmsp_domain::cancel::CancelDecision;
use lmsp_domain::event::EventKind;
use lmsp_domain::ports::{CancelOutcome, StepOutcome, TaskStore};
use lmsp_domain::recovery::RestartPolicy;
use lmsp_domain::status::TaskStatus;
use lmsp_domain::transition::{Refusal, Step};
use lmsp_storage_contract as contract;
use lmsp_storage_sqlite::{SqliteOptions, SqliteStore, SyncMode};

const TASKS: usize = 10_000;
const CONCURRENCY: usize = 250;

/// P-4, I-3: 10 000 cancel-versus-finish races, each with exactly one winner.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancel_and_finish_races_have_exactly_one_winner_p4_i3() {
    let dir = tempfile::tempdir().unwrap();
    let options = SqliteOptions {
        sync: SyncMode::Normal,
        ..SqliteOptions::default()
    };
    let store =
        Arc::new(SqliteStore::open_without_listener(&dir.path().join("race.db"), options).unwrap());
    let started = Instant::now();
    let mut cancels_won = 0usize;
    let mut completions_won = 0usize;
    let worker = contract::instance_id();
    for chunk in 0..TASKS / CONCURRENCY {
        // Bring a chunk of tasks to `running`.
        let tasks = join_all((0..CONCURRENCY).map(|_| {
            let store = Arc::clone(&store);
            async move {
                let task = contract::task(worker, RestartPolicy::Fail);
                contract::support::task_in(&*store, task, worker, TaskStatus::Running).await
            }
        }))
        .await;
        // Race cancel against finish on separate spawned tasks (separate worker threads).
        let races = tasks.into_iter().enumerate().map(|(index, task)| {
            let store = Arc::clone(&store);
            async move {
                let cancel = {
                    let store = Arc::clone(&store);
                    let id = task.id;
                    tokio::spawn(async move { store.cancel(id, None, contract::T0).await })
                };
                let finish = {
                    let store = Arc::clone(&store);
                    let step = contract::complete(&task, "", contract::T0);
                    let id = task.id;
                    tokio::spawn(async move { store.finish(id, worker, step, contract::T0).await })
                };
                let (cancel, finish) = if index % 2 == 0 {
                    (cancel.await, finish.await)
                } else {
                    let finish = finish.await;
                    (cancel.await, finish)
                };
                (task, cancel.unwrap().unwrap(), finish.unwrap().unwrap())
            }
        });
        for (task, cancel, finish) in join_all(races).await {
            let CancelOutcome::Decided { decision, .. } = cancel else {
                panic!("cancel found no task");
            };
            match (decision, finish) {
                (
                    CancelDecision::CancellingNow,
                    StepOutcome::Refused {
                        refusal: Refusal::CancelPending { .. },
                        ..
                    },
                ) => {
                    cancels_won += 1;
                    let acked = store
                        .finish(task.id, worker, Step::AcknowledgeCancel, contract::T0)
                        .await
                        .unwrap();
                    assert!(
                        matches!(acked, StepOutcome::Applied { ref task, .. } if task.status == TaskStatus::Cancelled)
                    );
                }
                (CancelDecision::NotCancellable, StepOutcome::Applied { task, .. }) => {
                    assert_eq!(task.status, TaskStatus::Completed);
                    completions_won += 1;
                }
                (decision, finish) => {
                    panic!(
                        "both or neither won for {}: {decision:?} / {finish:?}",
                        task.id
                    )
                }
            }
            let (_, events) = contract::assert_log_consistent(&*store, task.id).await;
            let cancelling = events.iter().any(|e| e.kind() == EventKind::Cancelling);
            let completed = events.iter().any(|e| e.kind() == EventKind::Completed);
            assert!(
                cancelling != completed,
                "I-3: {} has both or neither",
                task.id
            );
        }
        let _ = chunk;
    }
    assert_eq!(cancels_won + completions_won, TASKS);
    eprintln!(
        "{TASKS} races: {cancels_won} cancels won, {completions_won} completions won, {:?}",
        started.elapsed()
    );
}
