//! The purge pass of the app (P-5, P-6, I-4) over a real SQLite store: batch after paced batch
//! until nothing past the cut-off is left, never an unfinished task, keys expired at `now` too.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use lmsp_app::purge::purge_pass;
use lmsp_app::Metrics;
use lmsp_domain::ports::{IdempotencyStore, TaskStore};
use lmsp_domain::recovery::RestartPolicy;
use lmsp_domain::transition::Step;
use lmsp_storage_contract as contract;
use lmsp_storage_sqlite::{SqliteOptions, SqliteStore, SyncMode};

/// P-5, P-6, I-4: a pass removes every finished task older than the cut-off, across as many
/// bounded batches as it takes, keeps unfinished and young ones, purges expired keys, and counts
/// all of it in the metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_pass_removes_every_old_finished_task_in_bounded_batches_p5_p6_i4() {
    let dir = tempfile::tempdir().unwrap();
    let options = SqliteOptions {
        sync: SyncMode::Normal,
        purge_max_events: 5,
        ..SqliteOptions::default()
    };
    let store = SqliteStore::open_without_hook(&dir.path().join("lmsp.db"), options).unwrap();
    let old = contract::T0;
    let mut finished = Vec::new();
    for _ in 0..6 {
        let task = contract::task(contract::client_id(), RestartPolicy::Fail);
        store.create_task(task.clone(), None).await.unwrap();
        store.cancel(task.id, None, old).await.unwrap();
        finished.push(task.id);
    }
    let unfinished = contract::task(contract::client_id(), RestartPolicy::Fail);
    let key = contract::record(&unfinished, "expired-key");
    store
        .create_task(unfinished.clone(), Some(key.clone()))
        .await
        .unwrap();
    let claim = Step::ClaimForLoading {
        model: contract::model_id(),
    };
    store
        .append(unfinished.id, vec![claim], None, old)
        .await
        .unwrap();
    let young = contract::task(contract::client_id(), RestartPolicy::Fail);
    store.create_task(young.clone(), None).await.unwrap();
    store
        .cancel(young.id, None, old.plus_millis(10_000))
        .await
        .unwrap();

    let metrics = Metrics::new();
    let cutoff = old.plus_millis(1);
    let now = key.expires_at.plus_millis(1);
    let totals = purge_pass(&store, cutoff, now, &metrics).await.unwrap();

    assert_eq!(
        totals.tasks, 6,
        "every old finished task, over several batches"
    );
    assert_eq!(totals.events, 12, "created + cancelled each");
    assert_eq!(totals.idempotency_keys, 1, "the expired key");
    for id in finished {
        assert!(store.task(id).await.unwrap().is_none(), "P-5");
    }
    assert!(store.task(unfinished.id).await.unwrap().is_some(), "P-6");
    assert!(
        store.task(young.id).await.unwrap().is_some(),
        "younger than the cut-off"
    );
    assert!(store
        .idempotency_record(&key.scope, &key.key, old)
        .await
        .unwrap()
        .is_none());
    let text = metrics.render(&[]);
    assert!(text.contains("lmsp_purged_tasks_total 6"), "{text}");
    assert!(text.contains("lmsp_purge_runs_total 1"), "{text}");
}
