//! The purge pass of the app (P-5, P-6, I-4) over a real SQLite store: batch after paced batch
//! until nothing past the cut-off is left, never an unfinished task, and expired keys.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use lmsp_app::purge::purge_pass;
use lmsp_app::Metrics;
use lmsp_domain::{TaskStatus, Timestamp};

use support::*;

/// P-5, P-6, I-4: a pass removes every finished task older than the cut-off, across as many
/// bounded batches as it takes, keeps younger ones, and counts it in the metrics (that no
/// unfinished task is ever purged, P-6, is the storage contract's).
#[tokio::test]
async fn a_purge_pass_removes_every_old_finished_task_in_bounded_batches_p5_p6_i4() {
    let h = harness(
        engine_with(Duration::ZERO, 2),
        files_ok(),
        settings(Duration::from_secs(5)),
    )
    .await;
    let mut old = Vec::new();
    for _ in 0..60 {
        old.push(submit(&h, 2).await);
    }
    for task in &old {
        finished(&h, task).await;
    }
    let cutoff = h.service.now().plus_millis(1);
    tokio::time::sleep(Duration::from_millis(5)).await;
    let young = submit(&h, 2).await;
    let metrics = Metrics::new();
    let totals = purge_pass(
        h.store.as_ref(),
        cutoff,
        Timestamp::from_millis(0),
        &metrics,
    )
    .await
    .unwrap();
    assert_eq!(
        totals.tasks, 60,
        "every old finished task, over more than one batch"
    );
    for task in &old {
        assert!(h.store.task(task.id).await.unwrap().is_none(), "P-5");
    }
    let text = metrics.render(&[(TaskStatus::Completed, 0)]);
    assert!(text.contains("lmsp_purged_tasks_total 60"), "{text}");
    assert!(text.contains("lmsp_purge_runs_total 1"), "{text}");
    assert!(
        h.store.task(young.id).await.unwrap().is_some(),
        "younger than the cut-off"
    );
}
