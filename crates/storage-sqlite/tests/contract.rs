//! Runs the storage contract suite (`lmsp_storage_sqlite::contract`) against a file-backed
//! SQLite database in a temporary directory, one fresh database per check.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};

use lmsp_domain::event::{Event, EventKind};
use lmsp_domain::ports::{CommittedEvents, Snapshot, TaskStore};
use lmsp_domain::recovery::{RestartPolicy, StartEpoch};
use lmsp_domain::task::TaskError;
use lmsp_domain::transition::Step;
use lmsp_domain::TaskErrorCode;
use lmsp_storage_contract as contract;
use lmsp_storage_sqlite::{SqliteOptions, SqliteStore, SyncMode};

fn store() -> (tempfile::TempDir, SqliteStore) {
    let dir = tempfile::tempdir().unwrap();
    let options = SqliteOptions {
        sync: SyncMode::Normal,
        ..SqliteOptions::default()
    };
    let store = SqliteStore::open_without_hook(&dir.path().join("lmsp.db"), options).unwrap();
    (dir, store)
}

macro_rules! contract_test {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        $(
            $(#[$doc])*
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let (_dir, store) = store();
                contract::$name(&store).await;
            }
        )*
    };
}

contract_test!(
    /// P-2, I-1.
    create_stores_task_with_created_event_p2_i1,
    /// P-2, I-8.
    create_with_idempotency_is_atomic_i8,
    /// P-3, I-2.
    append_is_gapless_and_all_or_nothing_p3_i2,
    /// P-3.
    finish_stores_response_and_drops_snapshot_p3,
    /// Queue order.
    claim_next_takes_the_oldest_queued_task,
    /// P-4, I-3.
    cancel_follows_the_table_p4_i3,
    /// P-5, P-6, I-4.
    purge_removes_only_old_finished_tasks_p5_p6_i4,
    /// P-7..P-11, I-5.
    recovery_follows_the_table_and_is_idempotent_p7_p11_i5,
    /// Listing and counts.
    list_and_count_tasks,
    /// Clients and pairing.
    clients_and_pairings,
    /// P-1.
    models_are_metadata_only_p1,
    /// Start epochs.
    begin_start_keeps_identity_and_counts_epochs,
);

/// Records every event the store reports as committed.
#[derive(Default)]
struct Recorder(Mutex<Vec<Event>>);

impl CommittedEvents for Recorder {
    fn committed(&self, events: &[Event]) {
        self.0.lock().unwrap().extend_from_slice(events);
    }
}

/// The store survives a reopen with its data and the hook hears committed events only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reopen_keeps_data_and_hook_hears_commits() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lmsp.db");
    let recorder = Arc::new(Recorder::default());
    let task = contract::task(contract::client_id(), Default::default());
    {
        let store = SqliteStore::open(&path, SqliteOptions::default(), recorder.clone()).unwrap();
        store.create_task(task.clone(), None).await.unwrap();
    }
    assert_eq!(recorder.0.lock().unwrap().len(), 1);
    let store = SqliteStore::open_without_hook(&path, SqliteOptions::default()).unwrap();
    contract::assert_log_consistent(&store, task.id).await;
}

/// Events are stored in a compact form (the created task and the completed response are not
/// copied into the log): every kind of event reads back exactly as it was committed, including
/// the task of `response.created` after the task has moved on (P-3, I-2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_event_reads_back_as_it_was_committed() {
    let dir = tempfile::tempdir().unwrap();
    let recorder = Arc::new(Recorder::default());
    let store = SqliteStore::open(
        &dir.path().join("lmsp.db"),
        SqliteOptions::default(),
        recorder.clone(),
    )
    .unwrap();
    let at = contract::T0;
    let start = |policy| {
        let store = &store;
        async move {
            let mut task = contract::task(contract::client_id(), policy);
            task.metadata.insert("k".into(), "v".into());
            store.create_task(task.clone(), None).await.unwrap();
            let steps = vec![
                Step::ClaimForLoading {
                    model: contract::model_id(),
                },
                Step::Loaded,
                Step::Output {
                    delta: "forest \"quoted\" ".into(),
                },
            ];
            let snapshot = Snapshot {
                sequence_number: 4,
                state: vec![1, 2, 3],
            };
            store
                .append(task.id, steps, Some(snapshot), at)
                .await
                .unwrap();
            task
        }
    };
    let completed = start(RestartPolicy::Fail).await;
    store
        .finish(completed.id, contract::complete(&completed), at)
        .await
        .unwrap();
    let failed = start(RestartPolicy::Fail).await;
    let error = TaskError {
        code: TaskErrorCode::EngineError,
        message: "it broke".into(),
    };
    store
        .finish(failed.id, Step::Fail { error }, at)
        .await
        .unwrap();
    let cancelled = start(RestartPolicy::Fail).await;
    store.cancel(cancelled.id, None, at).await.unwrap();
    store
        .finish(cancelled.id, Step::AcknowledgeCancel, at)
        .await
        .unwrap();
    let resumed = start(RestartPolicy::Resume).await;
    let requeued = start(RestartPolicy::Retry).await;
    store.recover_leftovers(StartEpoch(1), at).await.unwrap();

    let heard = recorder.0.lock().unwrap().clone();
    let mut kinds = std::collections::HashSet::new();
    for task in [&completed, &failed, &cancelled, &resumed, &requeued] {
        let written: Vec<Event> = heard
            .iter()
            .filter(|event| event.task_id == task.id)
            .cloned()
            .collect();
        let (_, read) = contract::assert_log_consistent(&store, task.id).await;
        assert_eq!(
            read, written,
            "the log of {} reads back as committed",
            task.id
        );
        kinds.extend(read.iter().map(Event::kind));
    }
    assert_eq!(
        kinds.len(),
        EventKind::ALL.len(),
        "every kind was covered: {kinds:?}"
    );
}

/// I-4: a purge transaction stops taking tasks once their events pass the budget (always taking
/// at least one), and says when more are left, so a purge of a huge log runs in short steps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_batch_is_bounded_by_events_and_says_when_more_are_left_i4() {
    let dir = tempfile::tempdir().unwrap();
    let options = SqliteOptions {
        purge_max_events: 10,
        ..SqliteOptions::default()
    };
    let store = SqliteStore::open_without_hook(&dir.path().join("lmsp.db"), options).unwrap();
    let at = contract::T0;
    for _ in 0..3 {
        let task = contract::task(contract::client_id(), RestartPolicy::Fail);
        store.create_task(task.clone(), None).await.unwrap();
        let steps = vec![
            Step::ClaimForLoading {
                model: contract::model_id(),
            },
            Step::Loaded,
            Step::Output { delta: "a ".into() },
            Step::Output { delta: "b ".into() },
        ];
        store.append(task.id, steps, None, at).await.unwrap();
        store
            .finish(task.id, contract::complete(&task), at)
            .await
            .unwrap();
    }
    let cutoff = at.plus_millis(1);
    let mut batches = Vec::new();
    loop {
        let report = store.purge_finished(cutoff, 100).await.unwrap();
        batches.push((report.tasks, report.events));
        if !report.more {
            break;
        }
    }
    assert_eq!(
        batches,
        [(1, 6), (1, 6), (1, 6)],
        "six events a task, ten a batch"
    );
    assert_eq!(store.count_by_status().await.unwrap(), []);
}
