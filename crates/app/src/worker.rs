//! The worker pool.
//!
//! A worker takes resumed tasks first (they were under way before the restart), then the oldest
//! queued task, and drives it through the store: every step is a store transaction that the
//! domain may refuse. Output is batched: the engine runs in its own task and feeds a channel; the
//! worker commits whatever has piled up (up to [`MAX_BATCH`] deltas) in one append, so a fast
//! engine fills group commits and a slow one gets each token out at once.

use std::sync::PoisonError;
use std::time::Duration;

use tokio::sync::mpsc;

use lmsp_domain::ports::{
    CancelFlag, EngineError, GenerationItem, GenerationJob, ModelFileError, ResumePoint, Snapshot,
    StepOutcome,
};
use lmsp_domain::transition::Refusal;
use lmsp_domain::{
    EventPayload, Response, ResponseId, Step, Task, TaskError, TaskErrorCode, TaskId, TaskStatus,
    Usage,
};

use crate::error::AppError;
use crate::service::Service;

/// The most deltas committed in one append.
pub(crate) const MAX_BATCH: usize = 64;

pub(crate) async fn run_worker(service: Service) {
    let inner = &service.inner;
    while !inner.stop_workers.is_raised() {
        let next = match next_work(&service).await {
            Ok(next) => next,
            Err(error) => {
                tracing::error!(%error, "worker could not take work");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        match next {
            Some((task, resumed)) => {
                let task_id = task.id;
                if let Err(error) = run_task(&service, task, resumed).await {
                    tracing::error!(%task_id, %error, "task run failed; it stays for recovery");
                }
                service.forget_flag(task_id);
            }
            None => {
                tokio::select! {
                    _ = inner.work_available.notified() => {}
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = inner.stop_workers.raised() => {}
                }
            }
        }
    }
}

async fn next_work(service: &Service) -> Result<Option<(Task, bool)>, AppError> {
    let inner = &service.inner;
    loop {
        let resumed = inner
            .resumed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop_front();
        let Some(task_id) = resumed else { break };
        match inner.store.task(task_id).await? {
            Some(task) if task.status == TaskStatus::Running => {
                service.flag_for(task.id);
                return Ok(Some((task, true)));
            }
            // Cancelled (or gone) since recovery: the cancel finished it.
            Some(task) if task.status == TaskStatus::Cancelling => {
                finish(service, task.id, Step::AcknowledgeCancel).await?;
            }
            _ => {}
        }
    }
    let claimed = inner.store.claim_next(service.now()).await?;
    Ok(claimed.map(|task| {
        service.flag_for(task.id);
        (task, false)
    }))
}

impl Service {
    fn flag_for(&self, task_id: TaskId) -> CancelFlag {
        let mut flags = self
            .inner
            .cancel_flags
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        flags.entry(task_id).or_default().clone()
    }

    fn forget_flag(&self, task_id: TaskId) {
        let mut flags = self
            .inner
            .cancel_flags
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        flags.remove(&task_id);
    }
}

fn task_error(code: TaskErrorCode, message: impl Into<String>) -> TaskError {
    TaskError {
        code,
        message: message.into(),
    }
}

/// Finishes a task; when a cancel won the race, acknowledges it instead (P-4).
async fn finish(service: &Service, task_id: TaskId, step: Step) -> Result<(), AppError> {
    let store = &service.inner.store;
    match store.finish(task_id, step, service.now()).await? {
        StepOutcome::Refused {
            refusal: Refusal::CancelPending { .. },
            ..
        } => {
            store
                .finish(task_id, Step::AcknowledgeCancel, service.now())
                .await?;
        }
        StepOutcome::Refused { task, refusal } => {
            tracing::warn!(%task_id, status = %task.status, %refusal, "finish refused");
        }
        StepOutcome::Applied { .. } | StepOutcome::NotFound => {}
    }
    Ok(())
}

/// Appends steps; `Ok(None)` when a cancel is pending (the caller must stop and acknowledge).
async fn append(
    service: &Service,
    task_id: TaskId,
    steps: Vec<Step>,
    snapshot: Option<Snapshot>,
) -> Result<Option<Task>, AppError> {
    match service
        .inner
        .store
        .append(task_id, steps, snapshot, service.now())
        .await?
    {
        StepOutcome::Applied { task, .. } => Ok(Some(task)),
        StepOutcome::Refused {
            refusal: Refusal::CancelPending { .. },
            ..
        } => Ok(None),
        StepOutcome::Refused { refusal, .. } => {
            tracing::warn!(%task_id, %refusal, "append refused");
            Ok(None)
        }
        StepOutcome::NotFound => Ok(None),
    }
}

async fn run_task(service: &Service, task: Task, resumed: bool) -> Result<(), AppError> {
    let inner = &service.inner;
    let task_id = task.id;
    let cancel = service.flag_for(task_id);
    let Some(mut model) = inner.store.model(&task.model).await? else {
        let error = task_error(
            TaskErrorCode::ModelNotFound,
            format!("model `{}` is not registered", task.model),
        );
        return finish(service, task_id, Step::Fail { error }).await;
    };
    match inner.model_files.verify(&model.file).await {
        Ok(None) => {}
        Ok(Some(rehashed)) => {
            inner
                .store
                .update_model_file(&model.id, rehashed.clone())
                .await?;
            model.file = rehashed;
        }
        Err(error) => {
            let code = match error {
                ModelFileError::DigestMismatch => TaskErrorCode::ModelDigestMismatch,
                _ => TaskErrorCode::ModelUnavailable,
            };
            return finish(
                service,
                task_id,
                Step::Fail {
                    error: task_error(code, error.to_string()),
                },
            )
            .await;
        }
    }
    // A cancel while the model loads stops the load: the task need not wait for it to end.
    let loaded = tokio::select! {
        loaded = inner.engine.load(&model) => loaded,
        () = raised(&cancel) => {
            return finish(service, task_id, Step::AcknowledgeCancel).await;
        }
    };
    if let Err(error) = loaded {
        return finish(
            service,
            task_id,
            Step::Fail {
                error: engine_task_error(&error),
            },
        )
        .await;
    }
    let (mut current, resume, mut output) = if resumed {
        let (resume, text) = resume_point(service, &task).await?;
        (task, resume, text)
    } else {
        match append(service, task_id, vec![Step::Loaded], None).await? {
            Some(task) => (task, None, String::new()),
            None => return finish(service, task_id, Step::AcknowledgeCancel).await,
        }
    };
    let job = GenerationJob {
        model: model.clone(),
        spec: current.spec.clone(),
        resume,
        cancel: cancel.clone(),
    };
    let mut generation = match inner.engine.generate(job).await {
        Ok(generation) => generation,
        Err(error) => {
            return finish(
                service,
                task_id,
                Step::Fail {
                    error: engine_task_error(&error),
                },
            )
            .await
        }
    };
    // The engine runs ahead in its own task; the worker commits what has piled up.
    let (items_sender, mut items) =
        mpsc::channel::<Result<GenerationItem, EngineError>>(MAX_BATCH * 4);
    let producer = tokio::spawn(async move {
        loop {
            let item = generation.next_item().await;
            let last = !matches!(item, Ok(Some(GenerationItem::Delta { .. })));
            match item {
                Ok(Some(item)) => {
                    if items_sender.send(Ok(item)).await.is_err() {
                        return;
                    }
                }
                Ok(None) => return,
                Err(error) => {
                    let _ = items_sender.send(Err(error)).await;
                    return;
                }
            }
            if last {
                return;
            }
        }
    });
    let outcome = drive(service, &mut current, &mut items, &mut output, &cancel).await;
    producer.abort();
    let finishing = match outcome? {
        Ending::Completed(usage) => {
            let response = Response {
                id: ResponseId::from_ulid(service.next_ulid()),
                task_id,
                model: current.model.clone(),
                output_text: output,
                usage,
                created_at: current.created_at,
                completed_at: service.now(),
            };
            Step::Complete {
                response: Box::new(response),
            }
        }
        Ending::Failed(error) => Step::Fail { error },
        Ending::Cancelled => Step::AcknowledgeCancel,
    };
    finish(service, task_id, finishing).await
}

enum Ending {
    Completed(Usage),
    Failed(TaskError),
    Cancelled,
}

async fn drive(
    service: &Service,
    current: &mut Task,
    items: &mut mpsc::Receiver<Result<GenerationItem, EngineError>>,
    output: &mut String,
    cancel: &CancelFlag,
) -> Result<Ending, AppError> {
    loop {
        let Some(first) = items.recv().await else {
            return Ok(Ending::Failed(task_error(
                TaskErrorCode::EngineError,
                "the engine stopped without finishing",
            )));
        };
        let mut steps = Vec::new();
        let mut state = None;
        let mut ending = None;
        let mut item = Some(first);
        while let Some(next) = item.take() {
            match next {
                Ok(GenerationItem::Delta { text, state: after }) => {
                    output.push_str(&text);
                    steps.push(Step::Output { delta: text });
                    state = Some(after);
                }
                Ok(GenerationItem::Finished { usage }) => ending = Some(Ending::Completed(usage)),
                Ok(GenerationItem::Cancelled) => ending = Some(Ending::Cancelled),
                Err(error) => ending = Some(Ending::Failed(engine_task_error(&error))),
            }
            if ending.is_none() && steps.len() < MAX_BATCH {
                item = items.try_recv().ok();
            }
        }
        if !steps.is_empty() {
            let covered = current.last_sequence_number + steps.len() as u64;
            let snapshot = state.map(|state| Snapshot {
                sequence_number: covered,
                state,
            });
            match append(service, current.id, steps, snapshot).await? {
                Some(task) => *current = task,
                None => {
                    // A cancel won: its output is refused. The task stays `cancelling` until the
                    // engine has noticed and stopped (its own time to notice a cancel), so the
                    // acknowledgement means what it says.
                    cancel.raise();
                    if ending.is_none() {
                        // An engine that never notices (a stalled upstream) is stopped anyway.
                        let _ = tokio::time::timeout(ENGINE_STOP_GRACE, async {
                            while let Some(Ok(GenerationItem::Delta { .. })) = items.recv().await {}
                        })
                        .await;
                    }
                    return Ok(Ending::Cancelled);
                }
            }
        }
        if let Some(ending) = ending {
            return Ok(ending);
        }
    }
}

/// How long a worker waits, after a cancel won, for its engine to notice and stop before it
/// stops the engine itself.
const ENGINE_STOP_GRACE: Duration = Duration::from_secs(30);

/// How often a worker looks at a task's cancel flag while it waits for something else.
const CANCEL_POLL: Duration = Duration::from_millis(10);

/// Resolves once `flag` is raised.
async fn raised(flag: &CancelFlag) {
    while !flag.is_raised() {
        tokio::time::sleep(CANCEL_POLL).await;
    }
}

fn engine_task_error(error: &EngineError) -> TaskError {
    let code = match error {
        EngineError::ModelUnavailable(_) => TaskErrorCode::ModelUnavailable,
        EngineError::DigestMismatch => TaskErrorCode::ModelDigestMismatch,
        EngineError::Failed(_) => TaskErrorCode::EngineError,
    };
    task_error(code, error.to_string())
}

/// Where a resumed task continues (I-6): its snapshot's state and the text of the deltas that
/// snapshot covers, i.e. the deltas after the last `response.queued` up to the snapshot.
async fn resume_point(
    service: &Service,
    task: &Task,
) -> Result<(Option<ResumePoint>, String), AppError> {
    let store = &service.inner.store;
    let Some(snapshot) = store.snapshot(task.id).await? else {
        return Ok((None, String::new()));
    };
    let mut text = String::new();
    let mut after = 0;
    loop {
        let page = store.events(task.id, after, 1000).await?;
        for event in &page.items {
            after = event.sequence_number;
            if event.sequence_number > snapshot.sequence_number {
                break;
            }
            match &event.payload {
                EventPayload::Queued { .. } => text.clear(),
                EventPayload::OutputTextDelta { delta } => text.push_str(delta),
                _ => {}
            }
        }
        if !page.has_more || after >= snapshot.sequence_number {
            break;
        }
    }
    Ok((
        Some(ResumePoint {
            state: snapshot.state,
            text_so_far: text.clone(),
        }),
        text,
    ))
}
