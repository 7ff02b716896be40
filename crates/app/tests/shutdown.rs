//! A graceful stop: after `begin_shutdown` the running task may finish within the grace, and
//! `wait_until_idle` says whether it did — woken when the last worker ends, or giving up when the
//! grace runs out with a task still running (left for recovery).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use lmsp_domain::TaskStatus;

use support::*;

/// A bound on each test, so that a wait that never ends fails the test instead of hanging it.
const DEADLINE: Duration = Duration::from_secs(30);

/// The running task finishes within the grace: `wait_until_idle` returns `true` once it has
/// ended (not before, not only when the grace runs out), and nothing runs any more.
#[tokio::test]
async fn waiting_for_idle_returns_when_the_running_task_has_finished() {
    let h = harness(
        engine_with(Duration::from_millis(5), 40),
        files_ok(),
        settings(Duration::from_secs(30)),
    )
    .await;
    let task = submit(&h, 40).await;
    running_past(&h, &task, 3).await;

    h.service.begin_shutdown();
    let idle = tokio::time::timeout(
        DEADLINE,
        h.service.wait_until_idle(Duration::from_secs(3600)),
    )
    .await
    .expect("idle long before an hour's grace ran out");

    assert!(idle, "no task runs once the workers have ended");
    assert_eq!(h.service.tasks_in_flight(), 0);
    let stored = h.store.task(task.id).await.unwrap().unwrap();
    assert_eq!(
        stored.status,
        TaskStatus::Completed,
        "the running task finished"
    );
    h.service.stop().await;
}

/// With nothing running, a shutdown is idle at once.
#[tokio::test]
async fn waiting_for_idle_with_no_task_running_returns_at_once() {
    let h = harness(
        engine_with(Duration::ZERO, 1),
        files_ok(),
        settings(Duration::from_secs(30)),
    )
    .await;

    h.service.begin_shutdown();
    let idle = tokio::time::timeout(
        DEADLINE,
        h.service.wait_until_idle(Duration::from_secs(3600)),
    )
    .await
    .expect("idle at once");

    assert!(idle);
    h.service.stop().await;
}

/// A task that outlasts the grace: `wait_until_idle` gives up with `false`, the task still
/// running; the stop then leaves it for recovery.
#[tokio::test]
async fn waiting_for_idle_gives_up_when_the_grace_runs_out() {
    let h = harness(
        engine_with(Duration::from_secs(3600), 1),
        files_ok(),
        settings(Duration::from_secs(30)),
    )
    .await;
    let task = submit(&h, 1).await;
    running_past(&h, &task, 2).await;

    h.service.begin_shutdown();
    let idle = h.service.wait_until_idle(Duration::from_millis(50)).await;

    assert!(!idle, "the task still runs");
    assert_eq!(h.service.tasks_in_flight(), 1);
    h.service.stop().await;
    let stored = h.store.task(task.id).await.unwrap().unwrap();
    assert_eq!(stored.status, TaskStatus::Running, "left for recovery");
}
