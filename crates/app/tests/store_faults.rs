//! No task is ever stranded: a run whose writes the store cannot commit (a full disk) retries
//! with backoff and goes on when the store is back, or is given up and failed with
//! `storage_unavailable`; a cancel always ends `cancelled`; waiters hear the end.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lmsp_domain::ports::{EngineError, Generation, GenerationItem};
use lmsp_domain::task::Task;
use lmsp_domain::{EventKind, TaskErrorCode, TaskStatus};

use support::*;

/// I-2: appends that fail a few times are retried; the run goes on and completes with every
/// delta once, gapless.
#[tokio::test]
async fn a_run_whose_appends_fail_for_a_while_completes_with_a_gapless_log_i2() {
    let h = harness(
        engine_with(Duration::from_millis(2), 20),
        files_ok(),
        settings(Duration::from_secs(30)),
    )
    .await;
    h.faults.appends.store(5, Ordering::SeqCst);
    let task = submit(&h, 20).await;
    let done = finished(&h, &task).await;
    assert_eq!(done.status, TaskStatus::Completed);
    assert_eq!(
        h.faults.appends.load(Ordering::SeqCst),
        0,
        "every fault was met"
    );
    let events = kinds(&h, &task).await;
    assert_eq!(
        events
            .iter()
            .filter(|k| **k == EventKind::OutputTextDelta)
            .count(),
        20
    );
    let response = h
        .service
        .completed_response(&h.admin, task.id)
        .await
        .unwrap();
    let expected: String = (0..20).map(|i| format!("w{i} ")).collect();
    assert_eq!(response.output_text, expected);
}

/// A finish that fails for a while is retried until it commits.
#[tokio::test]
async fn a_completion_that_fails_for_a_while_is_recorded_when_the_store_is_back() {
    let h = harness(
        engine_with(Duration::ZERO, 3),
        files_ok(),
        settings(Duration::from_secs(30)),
    )
    .await;
    h.faults.finishes.store(8, Ordering::SeqCst);
    let task = submit(&h, 3).await;
    assert_eq!(finished(&h, &task).await.status, TaskStatus::Completed);
}

/// A run the store cannot record within the retry policy is given up; when the store takes
/// writes again the task ends `failed` with `storage_unavailable`, and its waiter hears it.
#[tokio::test]
async fn a_run_the_store_cannot_record_is_failed_with_storage_unavailable() {
    let h = harness(
        engine_with(Duration::from_millis(1), 50),
        files_ok(),
        settings(Duration::from_millis(200)),
    )
    .await;
    h.faults.appends.store(u32::MAX, Ordering::SeqCst);
    let task = submit(&h, 50).await;
    let done = finished(&h, &task).await;
    assert_eq!(done.status, TaskStatus::Failed);
    assert_eq!(done.error.unwrap().code, TaskErrorCode::StorageUnavailable);
    h.faults.appends.store(0, Ordering::SeqCst);
    let next = submit(&h, 2).await;
    assert_eq!(
        finished(&h, &next).await.status,
        TaskStatus::Completed,
        "the worker goes on"
    );
}

/// A generation that never yields and counts its stops.
struct CountsStops(Arc<AtomicUsize>);

#[async_trait]
impl Generation for CountsStops {
    async fn next_item(&mut self) -> Result<Option<GenerationItem>, EngineError> {
        std::future::pending().await
    }

    async fn stop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// Counts of what an engine of [`CountsStops`] generations was asked.
#[derive(Default)]
struct Counts {
    generates: AtomicUsize,
    stops: Arc<AtomicUsize>,
}

/// An engine whose generations never yield, counting its generations and their stops.
fn counting_engine() -> (MockEngine, Arc<Counts>) {
    let counts = Arc::new(Counts::default());
    let mut engine = MockEngine::new();
    engine.expect_load().returning(|_| Ok(()));
    let seen = Arc::clone(&counts);
    engine.expect_generate().returning(move |_job| {
        seen.generates.fetch_add(1, Ordering::SeqCst);
        Ok(Box::new(CountsStops(Arc::clone(&seen.stops))) as Box<dyn Generation>)
    });
    (engine, counts)
}

/// The engine starts while the task's `in_progress` step commits; when that step cannot be
/// recorded, the run ends (`storage_unavailable`) and the engine it started is stopped, not left
/// generating for nobody.
#[tokio::test]
async fn an_engine_started_beside_a_step_that_cannot_be_recorded_is_stopped() {
    let (engine, counts) = counting_engine();
    let h = harness(engine, files_ok(), settings(Duration::from_millis(200))).await;
    h.faults.appends.store(u32::MAX, Ordering::SeqCst);
    let task = submit(&h, 5).await;
    let done = finished(&h, &task).await;
    assert_eq!(done.error.unwrap().code, TaskErrorCode::StorageUnavailable);
    assert_eq!(counts.stops.load(Ordering::SeqCst), 1);
}

/// P-4, I-3: a cancel that lands while the worker's `in_progress` step is being written (the
/// engine already started beside it) ends the task `cancelled`, with nothing generated, and the
/// started engine is stopped.
#[tokio::test]
async fn a_cancel_during_the_in_progress_step_ends_cancelled_and_stops_the_engine_i3() {
    let (engine, counts) = counting_engine();
    let h = harness(engine, files_ok(), settings(Duration::from_secs(30))).await;
    let task = submit_and_hold_its_in_progress_step(&h, &counts).await;
    h.service.cancel(&h.admin, task.id).await.unwrap();
    h.faults.appends_held.send_replace(false);
    let done = finished(&h, &task).await;
    assert_eq!(done.status, TaskStatus::Cancelled);
    let events = kinds(&h, &task).await;
    assert!(!events.contains(&EventKind::OutputTextDelta));
    assert_eq!(events.last(), Some(&EventKind::Cancelled));
    assert_eq!(
        counts.stops.load(Ordering::SeqCst),
        1,
        "the started engine is stopped"
    );
}

/// I-5: the process stopping while the worker's `in_progress` step is being written leaves the
/// run as it is, for the next start to recover and resume: nothing more is written, and the
/// engine started beside the step is dropped, not stopped (a stop tells an engine that nothing
/// will resume the run, so that it may drop what it kept for a resume).
#[tokio::test]
async fn a_stop_during_the_in_progress_step_leaves_the_run_to_resume_i5() {
    let (engine, counts) = counting_engine();
    let h = harness(engine, files_ok(), settings(Duration::from_secs(30))).await;
    let task = submit_and_hold_its_in_progress_step(&h, &counts).await;
    h.service.stop().await;
    h.faults.appends_held.send_replace(false);
    let stored = h.store.task(task.id).await.unwrap().unwrap();
    assert_eq!(stored.status, TaskStatus::Loading, "left as claimed");
    assert_eq!(
        kinds(&h, &task).await.last(),
        Some(&EventKind::Loading),
        "nothing written after the claim"
    );
    assert_eq!(
        counts.stops.load(Ordering::SeqCst),
        0,
        "the started engine is dropped, not stopped"
    );
}

/// Submits a task while appends are held, and waits (at most 10 s) until its worker writes the
/// `in_progress` step with the engine started beside it.
async fn submit_and_hold_its_in_progress_step(h: &Harness, counts: &Counts) -> Task {
    h.faults.appends_held.send_replace(true);
    let task = submit(h, 5).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while h.faults.appends_waited.load(Ordering::SeqCst) == 0
        || counts.generates.load(Ordering::SeqCst) == 0
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the worker never wrote its step beside a started engine"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    task
}

/// P-4, I-3: a task cancelled while its run cannot write ends `cancelled` once the store is back,
/// never `completed`. The steps wait for what they need instead of sleeping: the outage has
/// refused one of the run's appends before the cancel, and refuses another after it.
#[tokio::test]
async fn a_cancel_during_a_store_outage_ends_cancelled_i3() {
    let h = harness(
        engine_with(Duration::from_millis(5), 400),
        files_ok(),
        settings(Duration::from_secs(60)),
    )
    .await;
    let task = submit(&h, 400).await;
    running_past(&h, &task, 6).await;
    h.faults.appends.store(u32::MAX, Ordering::SeqCst);
    refused_appends_reach(&h, 1).await;
    h.service.cancel(&h.admin, task.id).await.unwrap();
    let before = refused_appends(&h);
    refused_appends_reach(&h, before + 1).await;
    h.faults.appends.store(0, Ordering::SeqCst);
    let done = finished(&h, &task).await;
    assert_eq!(done.status, TaskStatus::Cancelled);
    let events = kinds(&h, &task).await;
    assert!(!events.contains(&EventKind::Completed));
    assert_eq!(events.last(), Some(&EventKind::Cancelled));
}

/// How many appends the outage has refused so far (the fault counter counts down from
/// `u32::MAX`).
fn refused_appends(h: &Harness) -> u32 {
    u32::MAX - h.faults.appends.load(Ordering::SeqCst)
}

/// Waits (at most 10 s) until the outage has refused `count` appends in all.
async fn refused_appends_reach(h: &Harness, count: u32) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while refused_appends(h) < count {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the run never tried to write during the outage"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}
