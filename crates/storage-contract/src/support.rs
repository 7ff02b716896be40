//! Helpers the checks share: reading a whole log and checking it (I-1, I-2), driving a task to a
//! status through the ports, unwrapping outcomes, and waiting, within a bound, for news from
//! another process.

use std::time::{Duration, Instant};

use lmsp_domain::cancel::CancelDecision;
use lmsp_domain::event::{Event, EventKind};
use lmsp_domain::ids::{InstanceId, TaskId};
use lmsp_domain::ports::{
    CancelOutcome, CreateOutcome, InstanceInfo, Registration, Snapshot, StepOutcome, Store,
};
// The port traits, so that every check calls the store's methods through `use support::*`.
pub use lmsp_domain::ports::{
    ClientStore, IdempotencyStore, InstanceStore, ModelStore, ServiceStore, TaskStore,
};
use lmsp_domain::status::TaskStatus;
use lmsp_domain::task::Task;
use lmsp_domain::time::Timestamp;
use lmsp_domain::transition::{Refusal, Step};

use crate::fixtures::{claim, complete, fail, instance, output, time};

/// How long a check waits at most for news that travels between processes.
pub const NEWS_DEADLINE: Duration = Duration::from_secs(10);

/// The lease the suite's instances take.
pub const LEASE: i64 = 30_000;

/// Registers an instance named `name` at `at` with a lease of [`LEASE`], expecting it to
/// register.
pub async fn register<S: Store + ?Sized>(store: &S, name: &str, at: Timestamp) -> InstanceInfo {
    let info = instance(name, at, LEASE);
    match store
        .register_instance(info.clone())
        .await
        .expect("register_instance")
    {
        Registration::Registered { .. } => info,
        other => panic!("{name} did not register: {other:?}"),
    }
}

/// Every event of a task, paging through [`lmsp_domain::ports::TaskStore::events`].
pub async fn all_events<S: Store + ?Sized>(store: &S, task_id: TaskId) -> Vec<Event> {
    let mut events: Vec<Event> = Vec::new();
    loop {
        let after = events.last().map_or(0, |event| event.sequence_number);
        let page = store.events(task_id, after, 100).await.expect("events");
        let empty = page.items.is_empty();
        events.extend(page.items);
        if !page.has_more || empty {
            return events;
        }
    }
}

/// I-1, I-2: the task exists; its log starts with `response.created` at 1 and runs 1…n without
/// gap or repeat; `last_sequence_number` is n; the status is the one the last event implies; at
/// most one terminal event, and only last. Returns the task and its log.
pub async fn assert_log_consistent<S: Store + ?Sized>(
    store: &S,
    task_id: TaskId,
) -> (Task, Vec<Event>) {
    let task = store
        .task(task_id)
        .await
        .expect("task")
        .unwrap_or_else(|| panic!("I-1: {task_id} does not exist"));
    let events = all_events(store, task_id).await;
    assert!(!events.is_empty(), "I-1: {task_id} has no events");
    assert_eq!(
        events[0].kind(),
        EventKind::Created,
        "I-1: the first event of {task_id}"
    );
    for (index, event) in events.iter().enumerate() {
        assert_eq!(
            event.task_id, task_id,
            "an event of another task in the log"
        );
        assert_eq!(
            event.sequence_number,
            index as u64 + 1,
            "I-2: a gap or repeat in the log of {task_id}"
        );
    }
    let last = events.last().expect("a log");
    assert_eq!(
        task.last_sequence_number, last.sequence_number,
        "I-2: last_sequence_number of {task_id}"
    );
    assert_eq!(
        task.status,
        last.kind().implied_status(),
        "I-2: the status of {task_id} is not the one its last event implies"
    );
    let terminals = events.iter().filter(|e| e.kind().is_terminal()).count();
    assert!(
        terminals <= 1,
        "I-2: {task_id} has {terminals} terminal events"
    );
    if terminals == 1 {
        assert!(
            last.kind().is_terminal(),
            "I-2: a terminal event is not last"
        );
    }
    (task, events)
}

/// The kinds of some events.
pub fn kinds(events: &[Event]) -> Vec<EventKind> {
    events.iter().map(Event::kind).collect()
}

/// The task and events of an applied step, or a panic naming what happened instead.
pub fn applied(outcome: StepOutcome) -> (Task, Vec<Event>) {
    match outcome {
        StepOutcome::Applied { task, events } => (task, events),
        other => panic!("the step was not applied: {other:?}"),
    }
}

/// The task and refusal of a refused step, or a panic.
pub fn refused(outcome: StepOutcome) -> (Task, Refusal) {
    match outcome {
        StepOutcome::Refused { task, refusal } => (task, refusal),
        other => panic!("the step was not refused: {other:?}"),
    }
}

/// The decision and task of a cancel, or a panic.
pub fn decided(outcome: CancelOutcome) -> (CancelDecision, Task) {
    match outcome {
        CancelOutcome::Decided { decision, task } => (decision, task),
        CancelOutcome::NotFound => panic!("the cancel found no task"),
    }
}

/// Stores a new task without an idempotency record; the stored task.
pub async fn create<S: Store + ?Sized>(store: &S, task: Task) -> Task {
    match store.create_task(task, None).await.expect("create_task") {
        CreateOutcome::Created(task) => task,
        other => panic!("not created: {other:?}"),
    }
}

/// Applies `steps` on behalf of `by` where the log is now; the task after them.
pub async fn step<S: Store + ?Sized>(
    store: &S,
    task: &Task,
    by: InstanceId,
    steps: Vec<Step>,
    snapshot: Option<Snapshot>,
    at: Timestamp,
) -> Task {
    let outcome = store
        .append(task.id, by, task.last_sequence_number, steps, snapshot, at)
        .await
        .expect("append");
    applied(outcome).0
}

/// Applies a finishing step on behalf of `by`; the task after it.
pub async fn finish<S: Store + ?Sized>(store: &S, task: &Task, by: InstanceId, step: Step) -> Task {
    applied(
        store
            .finish(task.id, by, step, time(900))
            .await
            .expect("finish"),
    )
    .0
}

/// A new task, created and moved to `status` by worker instance `worker` (which claims it);
/// a `running` task has produced no output yet, a `completed` one produced "done".
pub async fn task_in<S: Store + ?Sized>(
    store: &S,
    new: Task,
    worker: InstanceId,
    status: TaskStatus,
) -> Task {
    let created = create(store, new).await;
    if status == TaskStatus::Queued {
        return created;
    }
    if status == TaskStatus::Cancelled {
        decided(
            store
                .cancel(created.id, None, time(5))
                .await
                .expect("cancel"),
        );
        return store.task(created.id).await.expect("task").expect("a task");
    }
    let loading = step(
        store,
        &created,
        worker,
        vec![claim(&created)],
        None,
        time(1),
    )
    .await;
    if status == TaskStatus::Loading {
        return loading;
    }
    if status == TaskStatus::Failed {
        return finish(store, &loading, worker, fail()).await;
    }
    let running = step(store, &loading, worker, vec![Step::Loaded], None, time(2)).await;
    match status {
        TaskStatus::Running => running,
        TaskStatus::Cancelling => {
            decided(
                store
                    .cancel(running.id, None, time(5))
                    .await
                    .expect("cancel"),
            )
            .1
        }
        TaskStatus::Completed => {
            let with_output =
                step(store, &running, worker, vec![output("done")], None, time(3)).await;
            finish(
                store,
                &with_output,
                worker,
                complete(&with_output, "done", time(4)),
            )
            .await
        }
        _ => unreachable!("every status is handled"),
    }
}

/// Waits until `probe` answers, checking every few milliseconds, for at most `deadline`; panics
/// naming `what` when it does not. For news that travels between processes only: what a store
/// answers to its own caller is checked at once.
pub async fn eventually<T, Fut>(what: &str, deadline: Duration, mut probe: impl FnMut() -> Fut) -> T
where
    Fut: std::future::Future<Output = Option<T>>,
{
    let started = Instant::now();
    loop {
        if let Some(found) = probe().await {
            return found;
        }
        assert!(
            started.elapsed() < deadline,
            "{what}: not within {deadline:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
