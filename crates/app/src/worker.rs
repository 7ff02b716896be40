//! The worker pool.
//!
//! A worker takes resumed tasks first (they were under way before their instance stopped), then
//! the oldest queued task, and drives it through the store: every step is a store transaction
//! that the domain may refuse. Output is batched: the engine runs in its own task and feeds a
//! channel; the worker commits whatever has piled up (up to [`MAX_BATCH`] deltas) in one append,
//! so a fast engine fills group commits and a slow one gets each token out at once.
//!
//! No task is ever stranded: a write the store cannot commit is retried with backoff; when the
//! store still cannot commit, the run is given up and the task is failed with
//! `storage_unavailable` (or cancelled, when a cancel is pending), retried until the store takes
//! it. A panicking worker is replaced, and the task it ran is failed. Only the end of the process
//! leaves a task unfinished, for recovery.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use lmsp_domain::ports::{
    EngineError, GenerationItem, GenerationJob, ModelFileError, ResumePoint, Snapshot, StepOutcome,
    StoreError,
};
use lmsp_domain::transition::{advance_all, Refusal};
use lmsp_domain::{
    EventPayload, ModelToLoad, Response, Step, Task, TaskError, TaskErrorCode, TaskId, TaskStatus,
    Usage,
};

use crate::retry::{retry, Abandoned};
use crate::service::Service;

/// The most deltas committed in one append.
pub(crate) const MAX_BATCH: usize = 64;

/// Starts a worker under a supervisor that replaces it when it panics.
pub(crate) fn spawn_worker(service: Service) {
    let workers = service.inner.workers.clone();
    workers.spawn(supervise(service));
}

async fn supervise(service: Service) {
    loop {
        let current: Arc<Mutex<Option<TaskId>>> = Arc::default();
        let worker = tokio::spawn(run_worker(service.clone(), Arc::clone(&current)));
        match worker.await {
            Err(error) if error.is_panic() => {
                let task = current
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .take();
                tracing::error!(task_id = ?task, "a worker panicked; a new one takes its place");
                if let Some(task_id) = task {
                    let error = TaskError::new(
                        TaskErrorCode::EngineError,
                        "the worker running the task stopped unexpectedly",
                    );
                    finish_for_sure(&service, task_id, Step::Fail { error }).await;
                    service.inner.listener.running.end(task_id);
                }
            }
            _ => return,
        }
    }
}

async fn run_worker(service: Service, current: Arc<Mutex<Option<TaskId>>>) {
    let inner = &service.inner;
    loop {
        let next = tokio::select! {
            biased;
            () = inner.stop_taking_work.cancelled() => return,
            next = next_work(&service) => next,
        };
        match next {
            Ok(Some((task, resumed))) => {
                let task_id = task.id;
                *current.lock().unwrap_or_else(PoisonError::into_inner) = Some(task_id);
                run_task(&service, task, resumed).await;
                *current.lock().unwrap_or_else(PoisonError::into_inner) = None;
                inner.listener.running.end(task_id);
            }
            Ok(None) => {
                tokio::select! {
                    () = inner.work_available.notified() => {}
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                    () = inner.stop_taking_work.cancelled() => return,
                }
            }
            Err(error) => {
                tracing::warn!(%error, "a worker could not take work; trying again shortly");
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(500)) => {}
                    () = inner.stop_taking_work.cancelled() => return,
                }
            }
        }
    }
}

async fn next_work(service: &Service) -> Result<Option<(Task, bool)>, StoreError> {
    let inner = &service.inner;
    loop {
        let resumed = inner
            .resumed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop_front();
        let Some(task_id) = resumed else { break };
        match inner.store.task(task_id).await? {
            Some(task) if task.status == TaskStatus::Running && task.owner == inner.instance => {
                inner.listener.running.start(task.id);
                return Ok(Some((task, true)));
            }
            // Cancelled since recovery: acknowledge it (the cancel found no worker).
            Some(task) if task.status == TaskStatus::Cancelling && task.owner == inner.instance => {
                finish_for_sure(service, task.id, Step::AcknowledgeCancel).await;
            }
            _ => {}
        }
    }
    let claimed = inner
        .store
        .claim_next(inner.instance, service.now())
        .await?;
    Ok(claimed.map(|task| {
        inner.listener.running.start(task.id);
        (task, false)
    }))
}

/// How a run ended.
enum Ending {
    Completed(Usage),
    Failed(TaskError),
    Cancelled,
    /// The store could not record the run: give it up.
    StoreGaveUp,
    /// The task is no longer this worker's to write (another instance took it, or it is gone),
    /// or the process is stopping: write nothing.
    Leave,
}

fn engine_task_error(error: &EngineError) -> TaskError {
    let code = match error {
        EngineError::ModelUnavailable(_) => TaskErrorCode::ModelUnavailable,
        EngineError::DigestMismatch => TaskErrorCode::ModelDigestMismatch,
        EngineError::UpstreamUnavailable(_) => TaskErrorCode::UpstreamUnavailable,
        EngineError::Timeout(_) => TaskErrorCode::Timeout,
        EngineError::Failed(_) => TaskErrorCode::EngineError,
    };
    TaskError::new(code, error.to_string())
}

fn storage_gave_up() -> TaskError {
    TaskError::new(
        TaskErrorCode::StorageUnavailable,
        "the run could not be recorded: the storage could not commit, and the run was given up",
    )
}

/// Finishes a task, retrying until the store takes it or the process stops; when a cancel won
/// the race, acknowledges it instead (P-4).
async fn finish_for_sure(service: &Service, task_id: TaskId, step: Step) {
    let inner = &service.inner;
    let policy = inner.settings.store_retry.forever();
    let mut step = step;
    loop {
        let outcome = retry(policy, &inner.stop_now, || {
            inner
                .store
                .finish(task_id, inner.instance, step.clone(), service.now())
        })
        .await;
        match outcome {
            Ok(StepOutcome::Refused {
                refusal: Refusal::CancelPending { .. },
                ..
            }) => step = Step::AcknowledgeCancel,
            Ok(StepOutcome::Refused { task, refusal }) => {
                tracing::debug!(%task_id, status = %task.status, %refusal, "finish refused");
                return;
            }
            Ok(_) => return,
            Err(error) => {
                tracing::warn!(%task_id, %error, "a task's end was not recorded; recovery will see to it");
                return;
            }
        }
    }
}

/// Runs a task to its end; see the module documentation.
async fn run_task(service: &Service, task: Task, resumed: bool) {
    let task_id = task.id;
    let ending = run(service, task, resumed).await;
    let step = match ending {
        Ending::Completed(_) | Ending::Leave => return,
        Ending::Failed(error) => Step::Fail { error },
        Ending::Cancelled => Step::AcknowledgeCancel,
        Ending::StoreGaveUp => Step::Fail {
            error: storage_gave_up(),
        },
    };
    finish_for_sure(service, task_id, step).await;
}

/// Waits for a task's cancel token (or the process's hard stop).
async fn cancelled_or_stopping(cancel: &CancellationToken, stop_now: &CancellationToken) -> Ending {
    tokio::select! {
        () = cancel.cancelled() => Ending::Cancelled,
        () = stop_now.cancelled() => Ending::Leave,
    }
}

async fn run(service: &Service, task: Task, resumed: bool) -> Ending {
    let inner = &service.inner;
    let cancel = inner.listener.running.start(task.id);
    let stop_now = inner.stop_now.clone();
    let model = match prepare_model(service, &task).await {
        Ok(model) => model,
        Err(ending) => return ending,
    };
    let Some(engine) = model
        .record
        .engine()
        .and_then(|kind| inner.engines.get(kind))
        .cloned()
    else {
        return Ending::Failed(TaskError::new(
            TaskErrorCode::ModelUnavailable,
            format!(
                "no engine of this service runs models of format `{}`",
                model.record.format_name()
            ),
        ));
    };
    // A cancel while the model loads stops the load: the task need not wait for it to end.
    let loaded = tokio::select! {
        loaded = engine.load(&model) => loaded,
        ending = cancelled_or_stopping(&cancel, &stop_now) => return ending,
    };
    if let Err(error) = loaded {
        return Ending::Failed(engine_task_error(&error));
    }
    let (mut current, resume, mut output) = if resumed {
        match resume_point(service, &task).await {
            Ok((resume, text)) => (task, resume, text),
            Err(_) => return Ending::StoreGaveUp,
        }
    } else {
        match append(service, &task, vec![Step::Loaded], None).await {
            Appended::Applied(task) => (task, None, String::new()),
            Appended::Ended(ending) => return ending,
        }
    };
    let job = GenerationJob {
        model,
        spec: current.spec.clone(),
        resume,
    };
    let generation = tokio::select! {
        generation = engine.generate(job) => generation,
        ending = cancelled_or_stopping(&cancel, &stop_now) => return ending,
    };
    let mut generation = match generation {
        Ok(generation) => generation,
        Err(error) => return Ending::Failed(engine_task_error(&error)),
    };
    // The engine runs ahead in its own task; the worker commits what has piled up. On a cancel
    // the producer stops the engine (and waits for it) before it ends.
    let (items_sender, mut items) =
        mpsc::channel::<Result<GenerationItem, EngineError>>(MAX_BATCH * 4);
    let producer_cancel = cancel.clone();
    let producer = tokio::spawn(async move {
        loop {
            let item = tokio::select! {
                biased;
                () = producer_cancel.cancelled() => {
                    generation.stop().await;
                    return;
                }
                item = generation.next_item() => item,
            };
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
    let ending = drive(service, &mut current, &mut items, &mut output, &cancel).await;
    if let Ending::Cancelled = ending {
        // Wait for the engine to stop (its own time to notice a cancel), so the acknowledgement
        // means what it says; an engine that never stops is dropped after the grace.
        cancel.cancel();
        let grace = inner.settings.engine_stop_grace;
        let abort = producer.abort_handle();
        if tokio::time::timeout(grace, producer).await.is_err() {
            abort.abort();
        }
    } else {
        producer.abort();
    }
    match ending {
        Ending::Completed(usage) => {
            let response = Response {
                id: current.response_id,
                task_id: current.id,
                model: current.model.clone(),
                output_text: output,
                usage,
                created_at: current.created_at,
                completed_at: service.now(),
            };
            let complete = Step::Complete {
                response: Box::new(response),
            };
            finish_for_sure(service, current.id, complete).await;
            Ending::Completed(usage)
        }
        other => other,
    }
}

/// The task's model, checked against its file's digest, ready for its engine.
async fn prepare_model(service: &Service, task: &Task) -> Result<ModelToLoad, Ending> {
    let inner = &service.inner;
    let found = retry(inner.settings.store_retry, &inner.stop_now, || {
        inner.store.model(&task.model)
    })
    .await;
    let mut record = match found {
        Ok(Some(record)) => record,
        Ok(None) => {
            return Err(Ending::Failed(TaskError::new(
                TaskErrorCode::ModelNotFound,
                format!("model `{}` is not registered", task.model),
            )))
        }
        Err(Abandoned::Stopped) => return Err(Ending::Leave),
        Err(_) => return Err(Ending::StoreGaveUp),
    };
    let Some(file) = record.file().cloned() else {
        return Ok(ModelToLoad { record, path: None });
    };
    match inner.model_files.verify(&file).await {
        Ok(verified) => {
            if let Some(rehashed) = verified.rehashed {
                if let Err(error) = inner
                    .store
                    .update_model_file(&record.id, rehashed.clone())
                    .await
                {
                    tracing::warn!(model = %record.id, %error, "a re-hashed model file was not recorded");
                }
                if let lmsp_domain::ModelSource::File { file, .. } = &mut record.source {
                    *file = rehashed;
                }
            }
            Ok(ModelToLoad {
                record,
                path: Some(verified.path),
            })
        }
        Err(error) => {
            let code = match error {
                ModelFileError::DigestMismatch => TaskErrorCode::ModelDigestMismatch,
                _ => TaskErrorCode::ModelUnavailable,
            };
            Err(Ending::Failed(TaskError::new(code, error.to_string())))
        }
    }
}

/// What an append came to.
// `Task` is not boxed: the value is matched at once, once per append.
#[allow(clippy::large_enum_variant)]
enum Appended {
    /// Committed: the task as it is now.
    Applied(Task),
    /// The run ends here.
    Ended(Ending),
}

/// Appends a worker's steps to `current` (with retries), and makes sense of a refusal.
async fn append(
    service: &Service,
    current: &Task,
    steps: Vec<Step>,
    state: Option<Vec<u8>>,
) -> Appended {
    let inner = &service.inner;
    let at = service.now();
    // What the log will look like after the steps: decided by the domain here too, so that the
    // snapshot names its last event and a retried write that did commit is recognised.
    let expected = match advance_all(current, &steps, inner.instance, None, at) {
        Ok(expected) => expected,
        Err(refusal) => {
            let error = TaskError::new(
                TaskErrorCode::EngineError,
                format!("the worker's steps do not fit the task: {refusal}"),
            );
            return Appended::Ended(Ending::Failed(error));
        }
    };
    let snapshot = state.map(|state| Snapshot {
        sequence_number: expected.task.last_sequence_number,
        state,
    });
    let outcome = retry(inner.settings.store_retry, &inner.stop_now, || {
        inner.store.append(
            current.id,
            inner.instance,
            current.last_sequence_number,
            steps.clone(),
            snapshot.clone(),
            at,
        )
    })
    .await;
    match outcome {
        Ok(StepOutcome::Applied { task, .. }) => Appended::Applied(task),
        Ok(StepOutcome::Refused {
            refusal: Refusal::CancelPending { .. },
            ..
        }) => Appended::Ended(Ending::Cancelled),
        // A cancel committed since the worker last looked (by another instance, or in the race
        // with its notice): the sequence moved on, so the step is stale, but the task is still
        // this worker's to acknowledge. Leaving it would strand it `cancelling`.
        Ok(StepOutcome::Refused { task, .. })
            if task.status == TaskStatus::Cancelling && task.owner == inner.instance =>
        {
            Appended::Ended(Ending::Cancelled)
        }
        // An earlier try committed after all: the log is exactly where the steps lead.
        Ok(StepOutcome::Refused {
            task,
            refusal: Refusal::Stale { stored },
        }) if stored == expected.task.last_sequence_number => Appended::Applied(task),
        Ok(StepOutcome::Refused { task, refusal }) => {
            tracing::warn!(task_id = %current.id, status = %task.status, %refusal, "a worker's step was refused; it leaves the task");
            Appended::Ended(Ending::Leave)
        }
        Ok(StepOutcome::NotFound) => Appended::Ended(Ending::Leave),
        Err(Abandoned::Stopped) => Appended::Ended(Ending::Leave),
        Err(error) => {
            tracing::error!(task_id = %current.id, %error, "a run could not be recorded; it is given up");
            Appended::Ended(Ending::StoreGaveUp)
        }
    }
}

async fn drive(
    service: &Service,
    current: &mut Task,
    items: &mut mpsc::Receiver<Result<GenerationItem, EngineError>>,
    output: &mut String,
    cancel: &CancellationToken,
) -> Ending {
    let stop_now = service.inner.stop_now.clone();
    loop {
        let first = tokio::select! {
            biased;
            ending = cancelled_or_stopping(cancel, &stop_now) => return ending,
            first = items.recv() => first,
        };
        let Some(first) = first else {
            return Ending::Failed(TaskError::new(
                TaskErrorCode::EngineError,
                "the engine stopped without finishing",
            ));
        };
        let mut steps = Vec::new();
        let mut state = None;
        let mut ending = None;
        let mut text = String::new();
        let mut item = Some(first);
        while let Some(next) = item.take() {
            match next {
                Ok(GenerationItem::Delta {
                    text: delta,
                    state: after,
                }) => {
                    text.push_str(&delta);
                    steps.push(Step::Output { delta });
                    state = Some(after);
                }
                Ok(GenerationItem::Finished { usage }) => ending = Some(Ending::Completed(usage)),
                Err(error) => ending = Some(Ending::Failed(engine_task_error(&error))),
            }
            if ending.is_none() && steps.len() < MAX_BATCH {
                item = items.try_recv().ok();
            }
        }
        if !steps.is_empty() {
            match append(service, current, steps, state).await {
                Appended::Applied(task) => {
                    *current = task;
                    output.push_str(&text);
                }
                Appended::Ended(ending) => return ending,
            }
        }
        if let Some(ending) = ending {
            return ending;
        }
    }
}

/// Where a resumed task continues (I-6): its snapshot's state and the text of the deltas that
/// snapshot covers, i.e. those of the open output item up to the snapshot.
async fn resume_point(
    service: &Service,
    task: &Task,
) -> Result<(Option<ResumePoint>, String), Abandoned> {
    let inner = &service.inner;
    let policy = inner.settings.store_retry;
    let snapshot = retry(policy, &inner.stop_now, || inner.store.snapshot(task.id)).await?;
    let Some(snapshot) = snapshot else {
        return Ok((None, String::new()));
    };
    let open = task.items.open_item(task.id);
    let mut text = String::new();
    let mut after = 0;
    'pages: loop {
        let page = retry(policy, &inner.stop_now, || {
            inner.store.events(task.id, after, 1000)
        })
        .await?;
        for event in &page.items {
            after = event.sequence_number;
            if event.sequence_number > snapshot.sequence_number {
                break 'pages;
            }
            match &event.payload {
                // Without an open item (a task the first release wrote), the run's text is
                // what follows the last `response.queued`.
                EventPayload::Queued { .. } if open.is_none() => text.clear(),
                EventPayload::OutputTextDelta { item, delta }
                    if open.is_none_or(|o| o == *item) =>
                {
                    text.push_str(delta);
                }
                _ => {}
            }
        }
        if !page.has_more {
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
