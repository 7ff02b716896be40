//! The worker, cancel and recovery paths of the app, with `mockall` mocks of the engine, the model
//! files and the clock where a real one would hide the case, over a real SQLite store.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use mockall::mock;

use lmsp_app::{
    Caller, CommitListeners, LiveEvents, Metrics, Service, Settings, SubmitReply, SystemClock,
};
use lmsp_domain::auth::{Scope, Scopes};
use lmsp_domain::ports::{
    CommittedEvents, Engine, EngineError, Generation, GenerationItem, GenerationJob,
    ModelFileError, ModelFiles, Store,
};
use lmsp_domain::{
    ClientId, Digest, EventKind, FileFingerprint, Input, ModelId, ModelRecord, RestartPolicy,
    SubmitRequest, TaskStatus, Timestamp, Usage,
};
use lmsp_storage_sqlite::{SqliteOptions, SqliteStore};

mock! {
    pub Engine {}
    #[async_trait]
    impl Engine for Engine {
        async fn load(&self, model: &ModelRecord) -> Result<(), EngineError>;
        async fn generate(&self, job: GenerationJob) -> Result<Box<dyn Generation>, EngineError>;
    }
}

mock! {
    pub Files {}
    #[async_trait]
    impl ModelFiles for Files {
        async fn fingerprint(&self, path: &str) -> Result<FileFingerprint, ModelFileError>;
        async fn verify(&self, known: &FileFingerprint) -> Result<Option<FileFingerprint>, ModelFileError>;
    }
}

/// A scripted generation: yields its items, or stops at the cancel flag.
struct Scripted {
    items: std::vec::IntoIter<GenerationItem>,
    job: GenerationJob,
    delay: Duration,
}

#[async_trait]
impl Generation for Scripted {
    async fn next_item(&mut self) -> Result<Option<GenerationItem>, EngineError> {
        tokio::time::sleep(self.delay).await;
        if self.job.cancel.is_raised() {
            return Ok(Some(GenerationItem::Cancelled));
        }
        Ok(self.items.next())
    }
}

fn words(n: usize) -> Vec<GenerationItem> {
    let mut items: Vec<_> = (0..n)
        .map(|i| GenerationItem::Delta {
            text: format!("w{i} "),
            state: vec![i as u8],
        })
        .collect();
    items.push(GenerationItem::Finished {
        usage: Usage {
            input_tokens: 1,
            output_tokens: n as u64,
        },
    });
    items
}

struct Harness {
    service: Service,
    store: Arc<dyn Store>,
    admin: Caller,
    _dir: tempfile::TempDir,
}

async fn harness(engine: MockEngine, files: MockFiles) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let live = LiveEvents::new();
    let metrics = Arc::new(Metrics::new());
    let store: Arc<dyn Store> = Arc::new(
        SqliteStore::open(
            &dir.path().join("lmsp.db"),
            SqliteOptions::default(),
            CommitListeners::new(vec![
                live.clone() as Arc<dyn CommittedEvents>,
                metrics.clone() as Arc<dyn CommittedEvents>,
            ]),
        )
        .unwrap(),
    );
    let model = ModelRecord {
        id: ModelId::parse("reference").unwrap(),
        format: "text".into(),
        file: FileFingerprint {
            path: "/models/reference.txt".into(),
            size_bytes: 3,
            modified_millis: 0,
            digest: Digest::from_sha256([1; 32]),
        },
        created_at: Timestamp::from_millis(0),
    };
    store.insert_model(model).await.unwrap();
    let settings = Settings {
        workers: 1,
        retention: Duration::from_secs(3600),
        purge_interval: Duration::from_secs(3600),
        idempotency_ttl: Duration::from_secs(3600),
        default_on_restart: RestartPolicy::Fail,
        version: "test".into(),
    };
    let service = Service::start(
        store.clone(),
        Arc::new(engine),
        Arc::new(files),
        Arc::new(SystemClock),
        live,
        metrics,
        settings,
    )
    .await
    .unwrap();
    service.spawn_background();
    let admin = Caller {
        client_id: ClientId::from_ulid(ulid_now()),
        scopes: Scopes::new([Scope::Admin]),
    };
    Harness {
        service,
        store,
        admin,
        _dir: dir,
    }
}

fn ulid_now() -> ulid::Ulid {
    ulid::Ulid::new()
}

fn request(tokens: u32) -> SubmitRequest {
    SubmitRequest {
        model: ModelId::parse("reference").unwrap(),
        input: Input::Text("hi".into()),
        background: true,
        stream: false,
        on_restart: None,
        max_output_tokens: tokens,
        seed: Some(1),
        metadata: Default::default(),
    }
}

fn engine_with(delay: Duration, tokens: usize) -> MockEngine {
    let mut engine = MockEngine::new();
    engine.expect_load().returning(|_| Ok(()));
    engine.expect_generate().returning(move |job| {
        Ok(Box::new(Scripted {
            items: words(tokens).into_iter(),
            job,
            delay,
        }) as Box<dyn Generation>)
    });
    engine
}

fn files_ok() -> MockFiles {
    let mut files = MockFiles::new();
    files.expect_verify().returning(|_| Ok(None));
    files
}

async fn submit(h: &Harness, tokens: u32) -> lmsp_domain::Task {
    let task = h
        .service
        .prepare_task(&h.admin, &request(tokens))
        .await
        .unwrap();
    match h.service.submit(task, None).await.unwrap() {
        SubmitReply::Created(task) => task,
        SubmitReply::Existing(_) => panic!("no idempotency key was given"),
    }
}

async fn kinds(h: &Harness, task: &lmsp_domain::Task) -> Vec<EventKind> {
    h.store
        .events(task.id, 0, 10_000)
        .await
        .unwrap()
        .items
        .iter()
        .map(|e| e.kind())
        .collect()
}

#[tokio::test]
async fn a_worker_runs_a_task_through_loading_and_running_to_completed() {
    let h = harness(engine_with(Duration::ZERO, 5), files_ok()).await;
    let task = submit(&h, 5).await;
    let done = tokio::time::timeout(Duration::from_secs(10), h.service.wait_finished(task.id))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(done.status, TaskStatus::Completed);
    let kinds = kinds(&h, &task).await;
    assert_eq!(
        &kinds[..3],
        [
            EventKind::Created,
            EventKind::Loading,
            EventKind::InProgress
        ]
    );
    assert_eq!(
        kinds
            .iter()
            .filter(|k| **k == EventKind::OutputTextDelta)
            .count(),
        5
    );
    let response = h
        .store
        .response(done.response_id.unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(response.output_text, "w0 w1 w2 w3 w4 ");
}

#[tokio::test]
async fn a_changed_model_file_fails_the_task_with_model_digest_mismatch() {
    let mut files = MockFiles::new();
    files
        .expect_verify()
        .returning(|_| Err(ModelFileError::DigestMismatch));
    let h = harness(engine_with(Duration::ZERO, 5), files).await;
    let task = submit(&h, 5).await;
    let done = tokio::time::timeout(Duration::from_secs(10), h.service.wait_finished(task.id))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(done.status, TaskStatus::Failed);
    assert_eq!(
        done.error.unwrap().code,
        lmsp_domain::TaskErrorCode::ModelDigestMismatch
    );
}

#[tokio::test]
async fn a_missing_model_file_fails_the_task_with_model_unavailable() {
    let mut files = MockFiles::new();
    files
        .expect_verify()
        .returning(|_| Err(ModelFileError::Unavailable("gone".into())));
    let h = harness(engine_with(Duration::ZERO, 5), files).await;
    let task = submit(&h, 5).await;
    let done = tokio::time::timeout(Duration::from_secs(10), h.service.wait_finished(task.id))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        done.error.unwrap().code,
        lmsp_domain::TaskErrorCode::ModelUnavailable
    );
}

#[tokio::test]
async fn an_engine_error_fails_the_task_with_engine_error() {
    let mut engine = MockEngine::new();
    engine.expect_load().returning(|_| Ok(()));
    engine
        .expect_generate()
        .returning(|_| Err(EngineError::Failed("boom".into())));
    let h = harness(engine, files_ok()).await;
    let task = submit(&h, 5).await;
    let done = tokio::time::timeout(Duration::from_secs(10), h.service.wait_finished(task.id))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        done.error.unwrap().code,
        lmsp_domain::TaskErrorCode::EngineError
    );
}

/// P-4, I-3: a cancel accepted while the worker generates ends the task `cancelled`, and nothing
/// but `response.cancelled` follows `response.cancelling`.
#[tokio::test]
async fn a_cancel_during_generation_ends_cancelled_with_nothing_after_cancelling_i3() {
    let h = harness(engine_with(Duration::from_millis(20), 1000), files_ok()).await;
    let task = submit(&h, 1000).await;
    loop {
        let now = h.store.task(task.id).await.unwrap().unwrap();
        if now.status == TaskStatus::Running && now.last_sequence_number > 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (decision, _) = h.service.cancel(&h.admin, task.id).await.unwrap();
    assert_eq!(decision, lmsp_domain::CancelDecision::CancellingNow);
    let done = tokio::time::timeout(Duration::from_secs(10), h.service.wait_finished(task.id))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(done.status, TaskStatus::Cancelled);
    let kinds = kinds(&h, &task).await;
    let at = kinds
        .iter()
        .position(|k| *k == EventKind::Cancelling)
        .unwrap();
    assert_eq!(&kinds[at + 1..], [EventKind::Cancelled]);
}

/// Another client's task is not found: it cannot be read or cancelled (I-7).
#[tokio::test]
async fn another_clients_task_is_not_found_i7() {
    let h = harness(engine_with(Duration::from_millis(50), 100), files_ok()).await;
    let task = submit(&h, 100).await;
    let stranger = Caller {
        client_id: ClientId::from_ulid(ulid_now()),
        scopes: Scopes::new([Scope::ResponsesRead, Scope::ResponsesWrite]),
    };
    assert!(matches!(
        h.service.task(&stranger, task.id).await,
        Err(lmsp_app::AppError::NotFound)
    ));
    assert!(matches!(
        h.service.cancel(&stranger, task.id).await,
        Err(lmsp_app::AppError::NotFound)
    ));
}
