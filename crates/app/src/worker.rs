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

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use lmsp_domain::ports::{
    EngineError, GenerationItem, GenerationJob, ResumePoint, Snapshot, StepOutcome, StoreError,
};
use lmsp_domain::resume::{resume_point, run_so_far, RunSoFar};
use lmsp_domain::transition::advance_all;
use lmsp_domain::worker::{after_refusal, resumed, AfterRefusal, Resumed};
use lmsp_domain::{
    Controls, Event, Response, Step, Task, TaskError, TaskErrorCode, TaskId, TokenLogprob, Usage,
};

use crate::engines::Engines;
use crate::lifecycle::Lifecycle;
use crate::models::{Models, Unready};
use crate::retry::{retry, Abandoned};
use crate::shared::Core;

/// The most deltas committed in one append.
pub(crate) const MAX_BATCH: usize = 64;

/// The worker pool of this process: what its workers share, and how work reaches them.
#[derive(Clone)]
pub(crate) struct Workers {
    pool: Arc<Pool>,
}

struct Pool {
    core: Arc<Core>,
    life: Arc<Lifecycle>,
    engines: Engines,
    models: Models,
    /// Raised when a task is queued here, or handed over by recovery, or shutdown begins.
    work_available: Notify,
    /// Tasks recovery handed to this instance to resume: taken before queued ones.
    resumed: Mutex<VecDeque<TaskId>>,
    /// The workers (their supervisors). After shutdown begins a worker ends as soon as it has no
    /// task, so this process runs no task once they have all ended.
    running: TaskTracker,
}

impl Workers {
    pub(crate) fn new(
        core: Arc<Core>,
        life: Arc<Lifecycle>,
        engines: Engines,
        models: Models,
    ) -> Self {
        Self {
            pool: Arc::new(Pool {
                core,
                life,
                engines,
                models,
                work_available: Notify::new(),
                resumed: Mutex::new(VecDeque::new()),
                running: TaskTracker::new(),
            }),
        }
    }

    /// The engines the workers run tasks on.
    pub(crate) fn engines(&self) -> &Engines {
        &self.pool.engines
    }

    /// Starts `count` workers (at least one), each under a supervisor that replaces it when it
    /// panics.
    pub(crate) fn spawn(&self, count: usize) {
        for _ in 0..count.max(1) {
            self.pool.running.spawn(supervise(Arc::clone(&self.pool)));
        }
    }

    /// A task was queued: one idle worker takes it.
    pub(crate) fn work_arrived(&self) {
        self.pool.work_available.notify_one();
    }

    /// Tasks recovery handed to this instance: its workers resume them first.
    pub(crate) fn resume(&self, tasks: &[TaskId]) {
        if tasks.is_empty() {
            return;
        }
        self.pool
            .resumed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(tasks.iter().copied());
        self.pool.work_available.notify_waiters();
    }

    /// Wakes every idle worker (shutdown began: they end).
    pub(crate) fn wake_all(&self) {
        self.pool.work_available.notify_waiters();
    }

    /// Waits until every worker has ended. (Before shutdown begins workers never end.)
    pub(crate) async fn ended(&self) {
        let running = &self.pool.running;
        running.close();
        running.wait().await;
    }
}

async fn supervise(pool: Arc<Pool>) {
    loop {
        let current: Arc<Mutex<Option<TaskId>>> = Arc::default();
        let worker = tokio::spawn(run_worker(Arc::clone(&pool), Arc::clone(&current)));
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
                    finish_for_sure(&pool, task_id, Step::Fail { error }).await;
                    pool.core.listener.running.end(task_id);
                }
            }
            _ => return,
        }
    }
}

async fn run_worker(pool: Arc<Pool>, current: Arc<Mutex<Option<TaskId>>>) {
    let stop_taking_work = &pool.life.stop_taking_work;
    loop {
        let next = tokio::select! {
            biased;
            () = stop_taking_work.cancelled() => return,
            next = next_work(&pool) => next,
        };
        match next {
            Ok(Some((task, resumed))) => {
                let task_id = task.id;
                *current.lock().unwrap_or_else(PoisonError::into_inner) = Some(task_id);
                run_task(&pool, task, resumed).await;
                *current.lock().unwrap_or_else(PoisonError::into_inner) = None;
                pool.core.listener.running.end(task_id);
            }
            Ok(None) => {
                tokio::select! {
                    () = pool.work_available.notified() => {}
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                    () = stop_taking_work.cancelled() => return,
                }
            }
            Err(error) => {
                tracing::warn!(%error, "a worker could not take work; trying again shortly");
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(500)) => {}
                    () = stop_taking_work.cancelled() => return,
                }
            }
        }
    }
}

async fn next_work(pool: &Pool) -> Result<Option<(Task, bool)>, StoreError> {
    let core = &pool.core;
    loop {
        let next = pool
            .resumed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop_front();
        let Some(task_id) = next else { break };
        let Some(task) = core.store.task(task_id).await? else {
            continue;
        };
        match resumed(&task, core.instance) {
            Resumed::Run => {
                core.listener.running.start(task.id);
                return Ok(Some((task, true)));
            }
            // Cancelled since recovery: the cancel found no worker.
            Resumed::Acknowledge => {
                finish_for_sure(pool, task.id, Step::AcknowledgeCancel).await;
            }
            Resumed::Skip => {}
        }
    }
    let claimed = core
        .store
        .claim(core.instance, core.now(), core.settings.tier_aging)
        .await?;
    Ok(claimed.map(|task| {
        core.listener.running.start(task.id);
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
async fn finish_for_sure(pool: &Pool, task_id: TaskId, step: Step) {
    let core = &pool.core;
    let policy = core.settings.store_retry.forever();
    let mut step = step;
    loop {
        let outcome = retry(policy, &pool.life.stop_now, || {
            core.store
                .finish(task_id, core.instance, step.clone(), core.now())
        })
        .await;
        match outcome {
            Ok(StepOutcome::Refused { task, refusal }) => {
                match after_refusal(refusal, &task, core.instance, None) {
                    AfterRefusal::Acknowledge if step != Step::AcknowledgeCancel => {
                        step = Step::AcknowledgeCancel;
                    }
                    _ => {
                        tracing::debug!(%task_id, status = %task.status, %refusal, "finish refused");
                        return;
                    }
                }
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
async fn run_task(pool: &Pool, task: Task, resumed: bool) {
    let task_id = task.id;
    let ending = run(pool, task, resumed).await;
    let step = match ending {
        Ending::Completed(_) | Ending::Leave => return,
        Ending::Failed(error) => Step::Fail { error },
        Ending::Cancelled => Step::AcknowledgeCancel,
        Ending::StoreGaveUp => Step::Fail {
            error: storage_gave_up(),
        },
    };
    finish_for_sure(pool, task_id, step).await;
}

/// Waits for a task's cancel token (or the process's hard stop).
async fn cancelled_or_stopping(cancel: &CancellationToken, stop_now: &CancellationToken) -> Ending {
    tokio::select! {
        () = cancel.cancelled() => Ending::Cancelled,
        () = stop_now.cancelled() => Ending::Leave,
    }
}

async fn run(pool: &Pool, task: Task, resumed: bool) -> Ending {
    let core = &pool.core;
    let cancel = core.listener.running.start(task.id);
    let stop_now = pool.life.stop_now.clone();
    let model = match pool.models.prepare(&task, &stop_now).await {
        Ok(model) => model,
        Err(Unready::Failed(error)) => return Ending::Failed(error),
        Err(Unready::Stopping) => return Ending::Leave,
        Err(Unready::StoreGaveUp) => return Ending::StoreGaveUp,
    };
    let Some(engine) = model
        .record
        .engine()
        .and_then(|kind| pool.engines.get(kind))
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
    let (resume, so_far) = if resumed {
        match resume_from_log(pool, &task).await {
            Ok(Some((resume, so_far))) => (Some(resume), so_far),
            Ok(None) => (None, RunSoFar::default()),
            Err(_) => return Ending::StoreGaveUp,
        }
    } else {
        (None, RunSoFar::default())
    };
    let job = GenerationJob {
        model,
        spec: task.spec.clone(),
        resume,
    };
    let starting = async {
        tokio::select! {
            generation = engine.generate(job) => Ok(generation),
            ending = cancelled_or_stopping(&cancel, &stop_now) => Err(ending),
        }
    };
    let (mut current, generation) = if resumed {
        match starting.await {
            Ok(generation) => (task, generation),
            Err(ending) => return ending,
        }
    } else {
        // The engine starts while `Loaded` commits (its output is taken only after the commit),
        // so a cached prompt's first token does not wait for one more commit first.
        let (appended, started) =
            tokio::join!(append(pool, &task, vec![Step::Loaded], None), starting);
        match (appended, started) {
            (Appended::Applied(task), Ok(generation)) => (task, generation),
            (Appended::Applied(_), Err(ending)) => return ending,
            (Appended::Ended(ending), started) => {
                // Nothing will resume this run (unless the process is stopping, when the
                // generation is only dropped): the engine may drop what it kept for that. An
                // engine that does not stop is dropped after the grace, as on a cancel.
                if !matches!(ending, Ending::Leave) {
                    if let Ok(Ok(mut generation)) = started {
                        let grace = core.settings.engine_stop_grace;
                        let _ = tokio::time::timeout(grace, generation.stop()).await;
                    }
                }
                return ending;
            }
        }
    };
    let mut output = Output::new(current.spec.controls.clone(), so_far);
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
            let last = !matches!(
                item,
                Ok(Some(
                    GenerationItem::Delta { .. }
                        | GenerationItem::Logprobs { .. }
                        | GenerationItem::CallStarted { .. }
                        | GenerationItem::ArgumentsDelta { .. }
                ))
            );
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
    let ending = drive(pool, &mut current, &mut items, &mut output, &cancel).await;
    if let Ending::Cancelled = ending {
        // Wait for the engine to stop (its own time to notice a cancel), so the acknowledgement
        // means what it says; an engine that never stops is dropped after the grace.
        cancel.cancel();
        let grace = core.settings.engine_stop_grace;
        let abort = producer.abort_handle();
        if tokio::time::timeout(grace, producer).await.is_err() {
            abort.abort();
        }
    } else {
        producer.abort();
    }
    match ending {
        Ending::Completed(usage) => {
            let so_far = output.into_run();
            let response = Response {
                id: current.response_id,
                task_id: current.id,
                model: current.model.clone(),
                output_text: so_far.text,
                calls: so_far.calls,
                logprobs: so_far.logprobs,
                usage,
                created_at: current.created_at,
                completed_at: core.now(),
            };
            let complete = Step::Complete {
                response: Box::new(response),
            };
            finish_for_sure(pool, current.id, complete).await;
            Ending::Completed(usage)
        }
        other => other,
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
async fn append(pool: &Pool, current: &Task, steps: Vec<Step>, state: Option<Vec<u8>>) -> Appended {
    let core = &pool.core;
    let at = core.now();
    // What the log will look like after the steps: decided by the domain here too, so that the
    // snapshot names its last event and a retried write that did commit is recognised.
    let expected = match advance_all(current, &steps, core.instance, None, at) {
        Ok(expected) => expected.task.last_sequence_number,
        Err(refusal) => {
            let error = TaskError::new(
                TaskErrorCode::EngineError,
                format!("the worker's steps do not fit the task: {refusal}"),
            );
            return Appended::Ended(Ending::Failed(error));
        }
    };
    let snapshot = state.map(|state| Snapshot {
        sequence_number: expected,
        state,
    });
    let outcome = retry(core.settings.store_retry, &pool.life.stop_now, || {
        core.store.append(
            current.id,
            core.instance,
            current.last_sequence_number,
            steps.clone(),
            snapshot.clone(),
            at,
        )
    })
    .await;
    match outcome {
        Ok(StepOutcome::Applied { task, .. }) => Appended::Applied(task),
        Ok(StepOutcome::Refused { task, refusal }) => {
            match after_refusal(refusal, &task, core.instance, Some(expected)) {
                AfterRefusal::Acknowledge => Appended::Ended(Ending::Cancelled),
                AfterRefusal::AlreadyApplied => Appended::Applied(task),
                AfterRefusal::Leave => {
                    tracing::warn!(task_id = %current.id, status = %task.status, %refusal, "a worker's step was refused; it leaves the task");
                    Appended::Ended(Ending::Leave)
                }
            }
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
    pool: &Pool,
    current: &mut Task,
    items: &mut mpsc::Receiver<Result<GenerationItem, EngineError>>,
    output: &mut Output,
    cancel: &CancellationToken,
) -> Ending {
    let stop_now = pool.life.stop_now.clone();
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
        let mut item = Some(first);
        while let Some(next) = item.take() {
            match next {
                Ok(GenerationItem::Finished { usage }) => {
                    output.finish(&mut steps);
                    ending = Some(Ending::Completed(usage));
                }
                Ok(other) => match output.take(other, &mut steps) {
                    After::State(after) => state = Some(after),
                    After::NoSnapshot => state = None,
                    After::Same => {}
                },
                Err(error) => ending = Some(Ending::Failed(engine_task_error(&error))),
            }
            if ending.is_none() && steps.len() < MAX_BATCH {
                item = items.try_recv().ok();
            }
        }
        if !steps.is_empty() {
            let core = &pool.core;
            let written = advance_all(current, &steps, core.instance, None, core.now())
                .map(|advanced| advanced.events)
                .unwrap_or_default();
            match append(pool, current, steps, state).await {
                Appended::Applied(task) => {
                    *current = task;
                    for event in &written {
                        output.run.follow(&event.payload);
                    }
                }
                Appended::Ended(ending) => return ending,
            }
        }
        if let Some(ending) = ending {
            return ending;
        }
    }
}

/// What an item means for the snapshot of the batch it is in.
enum After {
    /// The engine state right after the item's steps.
    State(Vec<u8>),
    /// The batch's steps go past any state the engine gave (text held back or cut at a stop
    /// string): the batch is written without a snapshot.
    NoSnapshot,
    /// Nothing changes.
    Same,
}

/// What a run has written, and turns the engine's items into steps: log probabilities join the
/// delta they describe, a call's end is made explicit, text is cut at the first stop string
/// (whatever the engine), and text that may be the start of a stop string is held back until
/// the next text shows it is not (its state is not snapshotted meanwhile, so a resumed run
/// continues from before it and produces it again).
struct Output {
    controls: Controls,
    /// What the run's committed steps wrote.
    run: RunSoFar,
    /// Text held back: it may be the start of a stop string.
    held: String,
    /// Log probabilities waiting for their delta.
    logprobs: Option<Vec<TokenLogprob>>,
    /// The open call: its function and its arguments so far.
    call: Option<(String, String)>,
    /// Whether the run made a call (text after one is dropped: a response's message comes first).
    called: bool,
    /// A stop string was met: the rest of the output is dropped.
    stopped: bool,
}

impl Output {
    fn new(controls: Controls, run: RunSoFar) -> Self {
        let call = run
            .calls
            .last()
            .filter(|_| run.call_open)
            .map(|call| (call.name.clone(), call.arguments.clone()));
        let called = !run.calls.is_empty();
        Self {
            controls,
            run,
            held: String::new(),
            logprobs: None,
            call,
            called,
            stopped: false,
        }
    }

    fn into_run(self) -> RunSoFar {
        self.run
    }

    fn close_call(&mut self, steps: &mut Vec<Step>) {
        if let Some((name, arguments)) = self.call.take() {
            steps.push(Step::CallDone { name, arguments });
        }
    }

    fn text_step(&mut self, delta: String, steps: &mut Vec<Step>) {
        if delta.is_empty() {
            return;
        }
        match self.logprobs.take() {
            Some(logprobs) => steps.push(Step::OutputLogprobs { delta, logprobs }),
            None => steps.push(Step::Output { delta }),
        }
    }

    /// The steps of one item, and what it means for the batch's snapshot.
    fn take(&mut self, item: GenerationItem, steps: &mut Vec<Step>) -> After {
        if self.stopped {
            return After::Same;
        }
        match item {
            GenerationItem::Logprobs { tokens } => {
                self.logprobs.get_or_insert_with(Vec::new).extend(tokens);
                After::Same
            }
            GenerationItem::Delta { text, state } => {
                if self.call.is_some() || self.called {
                    self.close_call(steps);
                    self.logprobs = None;
                    return After::State(state);
                }
                self.held.push_str(&text);
                if let Some(at) = self.controls.stop_at(&self.held) {
                    let mut before = std::mem::take(&mut self.held);
                    before.truncate(at);
                    self.text_step(before, steps);
                    self.stopped = true;
                    // The text after the stop string is never written: no snapshot covers it.
                    return After::NoSnapshot;
                }
                let keep = self.controls.stop_holdback(&self.held);
                let cut = self.held.len() - keep;
                let ready: String = self.held.drain(..cut).collect();
                self.text_step(ready, steps);
                if self.held.is_empty() {
                    After::State(state)
                } else {
                    After::NoSnapshot
                }
            }
            GenerationItem::CallStarted { name, state } => {
                let held = std::mem::take(&mut self.held);
                self.text_step(held, steps);
                self.close_call(steps);
                self.call = Some((name.clone(), String::new()));
                self.called = true;
                steps.push(Step::CallStarted { name });
                After::State(state)
            }
            GenerationItem::ArgumentsDelta { text, state } => {
                if let Some((_, arguments)) = &mut self.call {
                    arguments.push_str(&text);
                    steps.push(Step::CallArguments { delta: text });
                }
                After::State(state)
            }
            GenerationItem::Finished { .. } => After::Same,
        }
    }

    /// The steps that end the output: the held text, the open call.
    fn finish(&mut self, steps: &mut Vec<Step>) {
        if !self.stopped {
            let held = std::mem::take(&mut self.held);
            self.text_step(held, steps);
        }
        self.close_call(steps);
    }
}

/// Where a resumed task continues (I-6), from its snapshot and its log up to it
/// ([`resume_point`]); `None` for a task without a snapshot (it starts over).
async fn resume_from_log(
    pool: &Pool,
    task: &Task,
) -> Result<Option<(ResumePoint, RunSoFar)>, Abandoned> {
    let core = &pool.core;
    let policy = core.settings.store_retry;
    let stop_now = &pool.life.stop_now;
    let snapshot = retry(policy, stop_now, || core.store.snapshot(task.id)).await?;
    let Some(snapshot) = snapshot else {
        return Ok(None);
    };
    let mut log: Vec<Event> = Vec::new();
    loop {
        let after = log.last().map_or(0, |event| event.sequence_number);
        let page = retry(policy, stop_now, || core.store.events(task.id, after, 1000)).await?;
        let past = page
            .items
            .last()
            .is_none_or(|event| event.sequence_number > snapshot.sequence_number);
        log.extend(page.items);
        if past || !page.has_more {
            break;
        }
    }
    let so_far = run_so_far(task, snapshot.sequence_number, &log);
    Ok(Some((resume_point(task, snapshot, &log), so_far)))
}
