//! The worker, cancel and visibility paths of the app, with `mockall` mocks of the engine and the
//! model files over a real SQLite store.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use lmsp_app::{AppError, Caller, CancelState};
use lmsp_domain::auth::{Scope, Scopes};
use lmsp_domain::ports::{EngineError, Generation, ModelFileError};
use lmsp_domain::{ClientId, EventKind, Task, TaskErrorCode, TaskStatus};

use support::*;

/// I-2: the log runs `created`, `loading`, `in_progress`, the output's events, `completed`, in
/// that order, although the engine starts while `in_progress` is being written.
#[tokio::test]
async fn a_worker_runs_a_task_through_loading_and_running_to_completed() {
    let h = harness(
        engine_with(Duration::ZERO, 5),
        files_ok(),
        settings(Duration::from_secs(5)),
    )
    .await;
    let task = submit(&h, 5).await;
    let done = finished(&h, &task).await;
    assert_eq!(done.status, TaskStatus::Completed);
    let kinds = kinds(&h, &task).await;
    assert_eq!(
        kinds,
        [
            EventKind::Created,
            EventKind::Loading,
            EventKind::InProgress,
            EventKind::OutputItemAdded,
            EventKind::ContentPartAdded,
            EventKind::OutputTextDelta,
            EventKind::OutputTextDelta,
            EventKind::OutputTextDelta,
            EventKind::OutputTextDelta,
            EventKind::OutputTextDelta,
            EventKind::OutputTextDone,
            EventKind::ContentPartDone,
            EventKind::OutputItemDone,
            EventKind::Completed,
        ]
    );
    let response = h.store.response(task.id).await.unwrap().unwrap();
    assert_eq!(response.output_text, "w0 w1 w2 w3 w4 ");
    assert_eq!(response.id, task.response_id);
}

#[tokio::test]
async fn a_changed_model_file_fails_the_task_with_model_digest_mismatch() {
    let files = files_verifying(|_| Err(ModelFileError::DigestMismatch));
    let h = harness(
        engine_with(Duration::ZERO, 5),
        files,
        settings(Duration::from_secs(5)),
    )
    .await;
    let task = submit(&h, 5).await;
    let done = finished(&h, &task).await;
    assert_eq!(done.status, TaskStatus::Failed);
    let error = done.error.unwrap();
    assert_eq!(error.code, TaskErrorCode::ModelDigestMismatch);
    assert_eq!(
        error.message,
        "the file of model `reference` does not match its stored digest"
    );
}

/// The task's client reads the error: it names the model, never where its file is kept (only
/// `admin` and `models:write` see a model's path).
#[tokio::test]
async fn a_missing_model_file_fails_the_task_with_model_unavailable_naming_the_model() {
    let files = files_verifying(|_| {
        Err(ModelFileError::Unavailable(
            "/srv/secret/models/m2.txt: No such file or directory (os error 2)".into(),
        ))
    });
    let h = harness(
        engine_with(Duration::ZERO, 5),
        files,
        settings(Duration::from_secs(5)),
    )
    .await;
    let task = submit(&h, 5).await;
    let error = finished(&h, &task).await.error.unwrap();
    assert_eq!(error.code, TaskErrorCode::ModelUnavailable);
    assert_eq!(
        error.message,
        "the file of model `reference` is unavailable"
    );
    let failed = h.store.events(task.id, 0, 100).await.unwrap().items;
    assert!(
        !format!("{failed:?}").contains("/srv/secret"),
        "the path is in the task's log: {failed:?}"
    );
}

/// Each engine error becomes its own task error code.
#[tokio::test]
async fn engine_errors_fail_the_task_with_their_codes() {
    for (error, code) in [
        (
            EngineError::Failed("boom".into()),
            TaskErrorCode::EngineError,
        ),
        (
            EngineError::Timeout("silent".into()),
            TaskErrorCode::Timeout,
        ),
        (
            EngineError::UpstreamUnavailable("refused".into()),
            TaskErrorCode::UpstreamUnavailable,
        ),
    ] {
        let mut engine = MockEngine::new();
        engine.expect_load().returning(|_| Ok(()));
        let failing = error.clone();
        engine
            .expect_generate()
            .returning(move |_| Err(failing.clone()));
        let h = harness(engine, files_ok(), settings(Duration::from_secs(5))).await;
        let task = submit(&h, 5).await;
        let done = finished(&h, &task).await;
        assert_eq!(done.error.unwrap().code, code, "{error:?}");
    }
}

/// Cancels a task a worker has, and checks that this cancel moved it to `cancelling` (P-4).
async fn cancel_while_it_works(h: &Harness, task: &Task) {
    let cancel = h.service.cancel(&h.admin, task.id).await.unwrap();
    assert_eq!(
        (cancel.state, cancel.changed),
        (CancelState::Cancelling, true),
        "this cancel moved the task to cancelling"
    );
}

/// P-4, I-3: a cancel accepted while the worker generates ends the task `cancelled`, and nothing
/// but `response.cancelled` follows `response.cancelling`.
#[tokio::test]
async fn a_cancel_during_generation_ends_cancelled_with_nothing_after_cancelling_i3() {
    let h = harness(
        engine_with(Duration::from_millis(20), 1000),
        files_ok(),
        settings(Duration::from_secs(5)),
    )
    .await;
    let task = submit(&h, 1000).await;
    running_past(&h, &task, 6).await;
    cancel_while_it_works(&h, &task).await;
    let done = finished(&h, &task).await;
    assert_eq!(done.status, TaskStatus::Cancelled);
    let kinds = kinds(&h, &task).await;
    let at = kinds
        .iter()
        .position(|k| *k == EventKind::Cancelling)
        .unwrap();
    assert_eq!(&kinds[at + 1..], [EventKind::Cancelled]);
}

/// A cancel while the model loads stops the load: the task does not wait for it to end.
#[tokio::test]
async fn a_cancel_during_a_slow_load_ends_cancelled_at_once() {
    let h = harness(SlowLoad, files_ok(), settings(Duration::from_secs(5))).await;
    let task = submit(&h, 1).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while h.service.task(&h.admin, task.id).await.unwrap().status != TaskStatus::Loading {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the task never started loading"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    cancel_while_it_works(&h, &task).await;
    let done = finished(&h, &task).await;
    assert_eq!(done.status, TaskStatus::Cancelled);
    assert_eq!(
        kinds(&h, &task).await,
        [
            EventKind::Created,
            EventKind::Loading,
            EventKind::Cancelling,
            EventKind::Cancelled
        ]
    );
}

/// I-7: another client's task is not found: it cannot be read or cancelled.
#[tokio::test]
async fn another_clients_task_is_not_found_i7() {
    let h = harness(
        engine_with(Duration::from_millis(50), 100),
        files_ok(),
        settings(Duration::from_secs(5)),
    )
    .await;
    let task = submit(&h, 100).await;
    let stranger = Caller {
        client_id: ClientId::from_ulid(ulid::Ulid::new()),
        scopes: Scopes::new([Scope::ResponsesRead, Scope::ResponsesWrite]),
    };
    assert!(matches!(
        h.service.task(&stranger, task.id).await,
        Err(AppError::NotFound)
    ));
    assert!(matches!(
        h.service.cancel(&stranger, task.id).await,
        Err(AppError::NotFound)
    ));
    assert!(matches!(
        h.service
            .task_of_response(&stranger, task.response_id)
            .await,
        Err(AppError::NotFound)
    ));
}

/// A worker whose engine panics is replaced: the task it ran fails with `engine_error`, and the
/// next task runs to completion on the new worker.
#[tokio::test]
async fn a_panicking_worker_is_replaced_and_its_task_fails() {
    let mut engine = MockEngine::new();
    engine.expect_load().returning(|_| Ok(()));
    let mut first = true;
    engine.expect_generate().returning(move |_| {
        let panic_at = first.then_some(2);
        first = false;
        Ok(Box::new(Scripted {
            items: words(3).into_iter(),
            delay: Duration::ZERO,
            panic_at,
            pulled: 0,
        }) as Box<dyn Generation>)
    });
    let h = harness(engine, files_ok(), settings(Duration::from_secs(5))).await;
    let doomed = submit(&h, 3).await;
    let failed = finished(&h, &doomed).await;
    assert_eq!(failed.status, TaskStatus::Failed);
    assert_eq!(failed.error.unwrap().code, TaskErrorCode::EngineError);
    let next = submit(&h, 3).await;
    assert_eq!(finished(&h, &next).await.status, TaskStatus::Completed);
}
