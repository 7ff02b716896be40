//! The storage contract suite: async checks generic over any [`Store`], so every storage adapter
//! can prove the persistence rules (P-n) and invariants (I-n) of the spec with the same code.
//!
//! Each function expects a fresh, empty store and panics (like a test) when the adapter breaks
//! the contract. `tests/contract.rs` runs them against a file-backed [`crate::SqliteStore`].
//! Fixture builders (`task`, `record`, …) are public so other adapters' tests can reuse them.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::{AtomicU64, Ordering};

use lmsp_domain::auth::{Client, Pairing, Scope, Scopes, Secret};
use lmsp_domain::cancel::CancelDecision;
use lmsp_domain::event::{Event, EventKind};
use lmsp_domain::idempotency::{
    IdempotencyKey, IdempotencyRecord, IdempotencyScope, RequestDigest, StoredReply,
};
use lmsp_domain::ids::{ClientId, ResponseId, ServiceId, TaskId};
use lmsp_domain::model::{Digest, FileFingerprint, ModelId, ModelRecord};
use lmsp_domain::ports::{
    CancelOutcome, CreateOutcome, Redemption, ServiceIdentity, Snapshot, StepOutcome, Store,
    TaskFilter,
};
use lmsp_domain::recovery::{RestartPolicy, StartEpoch};
use lmsp_domain::status::TaskStatus;
use lmsp_domain::task::{Input, Metadata, Response, Task, TaskError, TaskSpec, Usage};
use lmsp_domain::time::Timestamp;
use lmsp_domain::transition::{Refusal, Step};
use lmsp_domain::TaskErrorCode;
use ulid::Ulid;

static COUNTER: AtomicU64 = AtomicU64::new(1);

/// A base time for fixtures.
pub const T0: Timestamp = Timestamp::from_millis(1_700_000_000_000);

fn next() -> u64 {
    COUNTER.fetch_add(1, Ordering::Relaxed)
}

/// A fresh ULID that sorts after every earlier one from this function (creation order).
pub fn ulid() -> Ulid {
    let n = next();
    Ulid::from_parts(
        1_700_000_000_000 + n,
        u128::from(n) << 40 | u128::from(rand_part()),
    )
}

fn rand_part() -> u32 {
    // Distinguishes processes sharing a database (crash tests re-open the same file).
    std::process::id()
}

/// A fresh task id, later than every earlier one.
pub fn task_id() -> TaskId {
    TaskId::from_ulid(ulid())
}

/// A fresh client id.
pub fn client_id() -> ClientId {
    ClientId::from_ulid(ulid())
}

/// The reference model id.
pub fn model_id() -> ModelId {
    ModelId::parse(ModelId::REFERENCE).expect("valid model id")
}

/// A new queued task of `client` with `policy`.
pub fn task(client: ClientId, policy: RestartPolicy) -> Task {
    Task::new_queued(
        task_id(),
        client,
        model_id(),
        policy,
        TaskSpec {
            input: Input::Text(String::from("hello")),
            max_output_tokens: 16,
            seed: 7,
        },
        Metadata::new(),
        T0,
    )
}

/// An idempotency record for `task` under `key`.
pub fn record(task: &Task, key: &str) -> IdempotencyRecord {
    IdempotencyRecord {
        scope: IdempotencyScope {
            client_id: task.client_id,
            method: String::from("POST"),
            path: String::from("/v1/responses"),
        },
        key: IdempotencyKey::parse(key).expect("valid key"),
        digest: RequestDigest([3; 32]),
        reply: StoredReply {
            status: 202,
            body: String::from("{}"),
            location: None,
            task_id: Some(task.id),
            from_task: None,
        },
        created_at: T0,
        expires_at: T0.plus_millis(86_400_000),
    }
}

/// A response for `task`.
pub fn response(task: &Task, text: &str) -> Response {
    Response {
        id: ResponseId::from_ulid(ulid()),
        task_id: task.id,
        model: task.model.clone(),
        output_text: text.to_owned(),
        usage: Usage {
            input_tokens: 1,
            output_tokens: 2,
        },
        created_at: task.created_at,
        completed_at: T0.plus_millis(10),
    }
}

/// The `Complete` step for `task`.
pub fn complete(task: &Task) -> Step {
    Step::Complete {
        response: Box::new(response(task, "done")),
    }
}

/// Every event of a task.
pub async fn all_events<S: Store + ?Sized>(store: &S, id: TaskId) -> Vec<Event> {
    let mut out: Vec<Event> = Vec::new();
    loop {
        let after = out.last().map_or(0, |e| e.sequence_number);
        let page = store.events(id, after, 500).await.expect("events");
        out.extend(page.items);
        if !page.has_more {
            return out;
        }
    }
}

/// I-2: the log is gapless from 1, `last_sequence_number` is its end, the status is the one the
/// last event implies, at most one terminal event and only last; seq 1 is `response.created` (I-1).
pub async fn assert_log_consistent<S: Store + ?Sized>(store: &S, id: TaskId) -> (Task, Vec<Event>) {
    let task = store.task(id).await.expect("task").expect("task exists");
    let events = all_events(store, id).await;
    assert!(!events.is_empty(), "I-1: {id} has no events");
    assert_eq!(
        events[0].kind(),
        EventKind::Created,
        "I-1: first event of {id}"
    );
    for (index, event) in events.iter().enumerate() {
        assert_eq!(event.sequence_number, index as u64 + 1, "I-2: gap in {id}");
    }
    let last = events.last().expect("non-empty");
    assert_eq!(
        task.last_sequence_number, last.sequence_number,
        "I-2: lsn of {id}"
    );
    assert_eq!(
        task.status,
        last.kind().implied_status(),
        "I-2: status of {id}"
    );
    let terminals = events.iter().filter(|e| e.kind().is_terminal()).count();
    assert!(terminals <= 1, "I-2: {id} has {terminals} terminal events");
    if terminals == 1 {
        assert!(
            last.kind().is_terminal(),
            "I-2: terminal event of {id} is not last"
        );
    }
    (task, events)
}

async fn create<S: Store + ?Sized>(store: &S, task: Task) -> Task {
    match store.create_task(task, None).await.expect("create") {
        CreateOutcome::Created(task) => task,
        other => panic!("not created: {other:?}"),
    }
}

async fn to_running<S: Store + ?Sized>(store: &S, policy: RestartPolicy) -> Task {
    let created = create(store, task(client_id(), policy)).await;
    match store
        .append(
            created.id,
            vec![Step::ClaimForLoading { model: model_id() }, Step::Loaded],
            None,
            T0.plus_millis(1),
        )
        .await
        .expect("append")
    {
        StepOutcome::Applied { task, .. } => task,
        other => panic!("not applied: {other:?}"),
    }
}

/// P-2, I-1: a created task is `queued` with `response.created` at sequence 1, readable at once.
pub async fn create_stores_task_with_created_event_p2_i1<S: Store + ?Sized>(store: &S) {
    let new = task(client_id(), RestartPolicy::Fail);
    let created = create(store, new.clone()).await;
    assert_eq!(created.status, TaskStatus::Queued);
    assert_eq!(created.last_sequence_number, 1);
    let (stored, events) = assert_log_consistent(store, new.id).await;
    assert_eq!(stored, created);
    assert_eq!(events.len(), 1);
    assert!(store.task(task_id()).await.expect("task").is_none());
}

/// P-2, I-8: the idempotency record commits with its task; a second create with the same key
/// returns the record and writes nothing.
pub async fn create_with_idempotency_is_atomic_i8<S: Store + ?Sized>(store: &S) {
    let first = task(client_id(), RestartPolicy::Fail);
    let rec = record(&first, "key-1");
    assert!(matches!(
        store
            .create_task(first.clone(), Some(rec.clone()))
            .await
            .expect("create"),
        CreateOutcome::Created(_)
    ));
    let found = store
        .idempotency_record(&rec.scope, &rec.key, T0)
        .await
        .expect("read");
    assert_eq!(found, Some(rec.clone()));
    let mut second = task(first.client_id, RestartPolicy::Fail);
    second.id = task_id();
    let rec2 = record(&second, "key-1");
    match store
        .create_task(second.clone(), Some(rec2))
        .await
        .expect("create")
    {
        CreateOutcome::IdempotencyConflict(existing) => assert_eq!(existing, rec),
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert!(store.task(second.id).await.expect("read").is_none(), "I-8");
    // Expired records are not returned, and can be purged.
    assert!(store
        .idempotency_record(&rec.scope, &rec.key, rec.expires_at)
        .await
        .expect("read")
        .is_none());
    assert_eq!(
        store
            .insert_idempotency_record(rec.clone())
            .await
            .expect("insert"),
        Some(rec.clone())
    );
    assert_eq!(
        store
            .purge_idempotency(rec.expires_at, 100)
            .await
            .expect("purge"),
        1
    );
    assert_eq!(
        store
            .insert_idempotency_record(rec.clone())
            .await
            .expect("insert"),
        None
    );
}

/// P-3, I-2: appended steps number their events after the last one, move the status in the
/// same transaction, are all-or-nothing, and a stale step is refused with nothing written.
pub async fn append_is_gapless_and_all_or_nothing_p3_i2<S: Store + ?Sized>(store: &S) {
    let running = to_running(store, RestartPolicy::Fail).await;
    assert_eq!(running.status, TaskStatus::Running);
    assert_eq!(running.last_sequence_number, 3);
    assert!(running.started_at.is_some());
    let outcome = store
        .append(
            running.id,
            vec![
                Step::Output {
                    delta: String::from("a"),
                },
                Step::Output {
                    delta: String::from("b"),
                },
            ],
            Some(Snapshot {
                sequence_number: 5,
                state: vec![1, 2, 3],
            }),
            T0.plus_millis(2),
        )
        .await
        .expect("append");
    let StepOutcome::Applied { task, events } = outcome else {
        panic!("not applied: {outcome:?}");
    };
    assert_eq!(task.last_sequence_number, 5);
    assert_eq!(
        events.iter().map(|e| e.sequence_number).collect::<Vec<_>>(),
        vec![4, 5]
    );
    assert_eq!(
        store.snapshot(running.id).await.expect("snapshot"),
        Some(Snapshot {
            sequence_number: 5,
            state: vec![1, 2, 3]
        })
    );
    // A refusal in the middle writes nothing of the earlier steps.
    let refused = store
        .append(
            running.id,
            vec![
                Step::Output {
                    delta: String::from("c"),
                },
                Step::Loaded,
            ],
            None,
            T0.plus_millis(3),
        )
        .await
        .expect("append");
    match refused {
        StepOutcome::Refused { task, refusal } => {
            assert_eq!(task.last_sequence_number, 5);
            assert_eq!(
                refusal,
                Refusal::WrongStatus {
                    status: TaskStatus::Running,
                    step: lmsp_domain::transition::StepKind::Loaded
                }
            );
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    let (after, events) = assert_log_consistent(store, running.id).await;
    assert_eq!(after.last_sequence_number, 5);
    assert_eq!(events.len(), 5);
    let page = store.events(running.id, 2, 2).await.expect("events");
    assert_eq!(page.items.len(), 2);
    assert_eq!(page.items[0].sequence_number, 3);
    assert!(page.has_more);
    assert_eq!(
        store
            .append(task_id(), vec![Step::Loaded], None, T0)
            .await
            .expect("append"),
        StepOutcome::NotFound
    );
}

/// P-3: `finish(Complete)` stores the response and drops the snapshot; finished is absorbing.
pub async fn finish_stores_response_and_drops_snapshot_p3<S: Store + ?Sized>(store: &S) {
    let running = to_running(store, RestartPolicy::Fail).await;
    store
        .append(
            running.id,
            vec![Step::Output {
                delta: String::from("x"),
            }],
            Some(Snapshot {
                sequence_number: 4,
                state: vec![9],
            }),
            T0.plus_millis(2),
        )
        .await
        .expect("append");
    let step = complete(&running);
    let Step::Complete { response } = &step else {
        unreachable!()
    };
    let response = response.as_ref().clone();
    let outcome = store
        .finish(running.id, step.clone(), T0.plus_millis(3))
        .await
        .expect("finish");
    let StepOutcome::Applied { task, .. } = outcome else {
        panic!("not applied: {outcome:?}");
    };
    assert_eq!(task.status, TaskStatus::Completed);
    assert_eq!(task.finished_at, Some(T0.plus_millis(3)));
    assert_eq!(task.response_id, Some(response.id));
    assert_eq!(
        store.response(response.id).await.expect("response"),
        Some(response)
    );
    assert!(store
        .snapshot(running.id)
        .await
        .expect("snapshot")
        .is_none());
    assert!(matches!(
        store
            .finish(running.id, step, T0.plus_millis(4))
            .await
            .expect("finish"),
        StepOutcome::Refused {
            refusal: Refusal::Finished { .. },
            ..
        }
    ));
    let failed = to_running(store, RestartPolicy::Fail).await;
    let outcome = store
        .finish(
            failed.id,
            Step::Fail {
                error: TaskError {
                    code: TaskErrorCode::ServerRestarted,
                    message: String::from("x"),
                },
            },
            T0.plus_millis(5),
        )
        .await
        .expect("finish");
    assert!(
        matches!(outcome, StepOutcome::Applied { task, .. } if task.status == TaskStatus::Failed && task.error.is_some())
    );
    assert_log_consistent(store, running.id).await;
    assert_log_consistent(store, failed.id).await;
}

/// The queue: `claim_next` takes the oldest queued task (creation order), once.
pub async fn claim_next_takes_the_oldest_queued_task<S: Store + ?Sized>(store: &S) {
    assert!(store.claim_next(T0).await.expect("claim").is_none());
    let first = create(store, task(client_id(), RestartPolicy::Fail)).await;
    let second = create(store, task(client_id(), RestartPolicy::Fail)).await;
    let claimed = store.claim_next(T0).await.expect("claim").expect("a task");
    assert_eq!(claimed.id, first.id);
    assert_eq!(claimed.status, TaskStatus::Loading);
    let claimed = store.claim_next(T0).await.expect("claim").expect("a task");
    assert_eq!(claimed.id, second.id);
    assert!(store.claim_next(T0).await.expect("claim").is_none());
    assert_log_consistent(store, first.id).await;
}

/// P-4, I-3: cancel follows the table of API.md §4, respects the client filter, and a cancel
/// accepted while running makes a later completion refused.
pub async fn cancel_follows_the_table_p4_i3<S: Store + ?Sized>(store: &S) {
    let queued = create(store, task(client_id(), RestartPolicy::Fail)).await;
    match store
        .cancel(queued.id, Some(client_id()), T0)
        .await
        .expect("cancel")
    {
        CancelOutcome::NotFound => {}
        other => panic!("another client's task must be not found, got {other:?}"),
    }
    match store
        .cancel(queued.id, Some(queued.client_id), T0)
        .await
        .expect("cancel")
    {
        CancelOutcome::Decided { decision, task } => {
            assert_eq!(decision, CancelDecision::CancelledNow);
            assert_eq!(task.status, TaskStatus::Cancelled);
        }
        other => panic!("{other:?}"),
    }
    match store.cancel(queued.id, None, T0).await.expect("cancel") {
        CancelOutcome::Decided { decision, .. } => {
            assert_eq!(decision, CancelDecision::AlreadyCancelled)
        }
        other => panic!("{other:?}"),
    }
    let running = to_running(store, RestartPolicy::Fail).await;
    match store.cancel(running.id, None, T0).await.expect("cancel") {
        CancelOutcome::Decided { decision, task } => {
            assert_eq!(decision, CancelDecision::CancellingNow);
            assert_eq!(task.status, TaskStatus::Cancelling);
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        store.cancel(running.id, None, T0).await.expect("cancel"),
        CancelOutcome::Decided {
            decision: CancelDecision::AlreadyCancelling,
            ..
        }
    ));
    assert!(matches!(
        store
            .finish(running.id, complete(&running), T0)
            .await
            .expect("finish"),
        StepOutcome::Refused {
            refusal: Refusal::CancelPending { .. },
            ..
        }
    ));
    assert!(matches!(
        store
            .finish(running.id, Step::AcknowledgeCancel, T0)
            .await
            .expect("finish"),
        StepOutcome::Applied { task, .. } if task.status == TaskStatus::Cancelled
    ));
    let done = to_running(store, RestartPolicy::Fail).await;
    store
        .finish(done.id, complete(&done), T0)
        .await
        .expect("finish");
    assert!(matches!(
        store.cancel(done.id, None, T0).await.expect("cancel"),
        CancelOutcome::Decided {
            decision: CancelDecision::NotCancellable,
            task
        } if task.status == TaskStatus::Completed
    ));
    assert_eq!(
        store.cancel(task_id(), None, T0).await.expect("cancel"),
        CancelOutcome::NotFound
    );
    for id in [queued.id, running.id, done.id] {
        assert_log_consistent(store, id).await;
    }
}

/// P-5, P-6, I-4: purge removes only finished tasks older than the cut-off, in bounded batches,
/// with their events, response, snapshot and idempotency record; never an unfinished task.
pub async fn purge_removes_only_old_finished_tasks_p5_p6_i4<S: Store + ?Sized>(store: &S) {
    let mut finished = Vec::new();
    for _ in 0..3 {
        let running = to_running(store, RestartPolicy::Fail).await;
        store
            .finish(running.id, complete(&running), T0.plus_millis(100))
            .await
            .expect("finish");
        finished.push(running.id);
    }
    let young = to_running(store, RestartPolicy::Fail).await;
    store
        .finish(young.id, complete(&young), T0.plus_millis(10_000))
        .await
        .expect("finish");
    let with_key = task(client_id(), RestartPolicy::Fail);
    let key = record(&with_key, "purge-key");
    store
        .create_task(with_key.clone(), Some(key.clone()))
        .await
        .expect("create");
    let unfinished = to_running(store, RestartPolicy::Fail).await;
    store
        .cancel(with_key.id, None, T0.plus_millis(100))
        .await
        .expect("cancel");
    let cutoff = T0.plus_millis(5_000);
    let first = store.purge_finished(cutoff, 2).await.expect("purge");
    assert_eq!(first.tasks, 2, "P-6: bounded batch");
    let second = store.purge_finished(cutoff, 100).await.expect("purge");
    assert_eq!(second.tasks, 2);
    assert_eq!(
        first.events + second.events,
        3 * 4 + 2,
        "P-5: events go with their tasks"
    );
    assert_eq!(
        store
            .purge_finished(cutoff, 100)
            .await
            .expect("purge")
            .tasks,
        0
    );
    for id in finished.iter().chain([&with_key.id]) {
        assert!(store.task(*id).await.expect("task").is_none(), "P-5");
        assert!(all_events(store, *id).await.is_empty(), "P-5 events");
    }
    assert_eq!(
        store
            .idempotency_record(&key.scope, &key.key, T0)
            .await
            .expect("read"),
        Some(key.clone()),
        "I-8: a key outlives its purged task until the key itself expires"
    );
    assert_log_consistent(store, young.id).await;
    assert_log_consistent(store, unfinished.id).await;
    let far = store
        .purge_finished(T0.plus_millis(1_000_000_000), 100)
        .await
        .expect("purge");
    assert_eq!(
        far.tasks, 1,
        "I-4: only the young finished one, never the running one"
    );
    assert!(
        store.task(unfinished.id).await.expect("task").is_some(),
        "I-4"
    );
}

/// P-7…P-11, I-5: every leftover moves per the recovery table with one event and
/// `restarts + 1`; a resumed task is reported oldest first; a second run in the same start
/// changes nothing; a later start moves a resumed task again.
pub async fn recovery_follows_the_table_and_is_idempotent_p7_p11_i5<S: Store + ?Sized>(store: &S) {
    let queued_fail = create(store, task(client_id(), RestartPolicy::Fail)).await;
    let queued_retry = create(store, task(client_id(), RestartPolicy::Retry)).await;
    let running_fail = to_running(store, RestartPolicy::Fail).await;
    let running_retry = to_running(store, RestartPolicy::Retry).await;
    let running_resume = to_running(store, RestartPolicy::Resume).await;
    store
        .append(
            running_resume.id,
            vec![Step::Output {
                delta: String::from("x"),
            }],
            Some(Snapshot {
                sequence_number: 4,
                state: vec![4],
            }),
            T0,
        )
        .await
        .expect("append");
    let resume_no_snapshot = to_running(store, RestartPolicy::Resume).await;
    let cancelling = to_running(store, RestartPolicy::Resume).await;
    store.cancel(cancelling.id, None, T0).await.expect("cancel");
    let done = to_running(store, RestartPolicy::Fail).await;
    store
        .finish(done.id, complete(&done), T0)
        .await
        .expect("finish");

    let start = StartEpoch(1);
    let report = store
        .recover_leftovers(start, T0.plus_millis(50))
        .await
        .expect("recover");
    assert_eq!(report.moved, 6);
    assert_eq!(report.untouched, 1);
    assert_eq!(
        report.resumed,
        vec![running_resume.id, resume_no_snapshot.id]
    );
    let expect = [
        (queued_fail.id, TaskStatus::Failed, 1),
        (queued_retry.id, TaskStatus::Queued, 0),
        (running_fail.id, TaskStatus::Failed, 1),
        (running_retry.id, TaskStatus::Queued, 1),
        (running_resume.id, TaskStatus::Running, 1),
        (resume_no_snapshot.id, TaskStatus::Running, 1),
        (cancelling.id, TaskStatus::Cancelled, 1),
        (done.id, TaskStatus::Completed, 0),
    ];
    for (id, status, restarts) in expect {
        let (task, _) = assert_log_consistent(store, id).await;
        assert_eq!(task.status, status, "P-8..P-10: {id}");
        assert_eq!(task.restarts, restarts, "P-11: {id}");
    }
    let failed = store
        .task(running_fail.id)
        .await
        .expect("task")
        .expect("exists");
    assert_eq!(
        failed.error.map(|e| e.code),
        Some(TaskErrorCode::ServerRestarted),
        "P-9"
    );
    let events = all_events(store, running_resume.id).await;
    assert_eq!(
        events.last().map(|e| e.payload.clone()),
        Some(lmsp_domain::event::EventPayload::Resumed {
            from_sequence_number: 4
        })
    );
    let before = store.count_by_status().await.expect("count");
    let again = store
        .recover_leftovers(start, T0.plus_millis(60))
        .await
        .expect("recover");
    assert_eq!(again.moved, 0, "I-5");
    assert!(again.resumed.is_empty(), "I-5");
    assert_eq!(store.count_by_status().await.expect("count"), before);
    let later = store
        .recover_leftovers(StartEpoch(2), T0.plus_millis(70))
        .await
        .expect("recover");
    assert_eq!(
        later.resumed,
        vec![running_resume.id, resume_no_snapshot.id]
    );
    let task = store
        .task(running_resume.id)
        .await
        .expect("task")
        .expect("exists");
    assert_eq!(task.restarts, 2);
}

/// Listing: newest first, filtered by client and status, paginated with `has_more`; counts.
pub async fn list_and_count_tasks<S: Store + ?Sized>(store: &S) {
    let client = client_id();
    let a = create(store, task(client, RestartPolicy::Fail)).await;
    let b = create(store, task(client, RestartPolicy::Fail)).await;
    let c = create(store, task(client, RestartPolicy::Fail)).await;
    let other = create(store, task(client_id(), RestartPolicy::Fail)).await;
    store.cancel(b.id, None, T0).await.expect("cancel");
    let page = store
        .list_tasks(TaskFilter {
            client_id: Some(client),
            limit: 2,
            ..TaskFilter::default()
        })
        .await
        .expect("list");
    assert_eq!(
        page.items.iter().map(|t| t.id).collect::<Vec<_>>(),
        vec![c.id, b.id]
    );
    assert!(page.has_more);
    let rest = store
        .list_tasks(TaskFilter {
            client_id: Some(client),
            before: Some(b.id),
            limit: 2,
            ..TaskFilter::default()
        })
        .await
        .expect("list");
    assert_eq!(
        rest.items.iter().map(|t| t.id).collect::<Vec<_>>(),
        vec![a.id]
    );
    assert!(!rest.has_more);
    let cancelled = store
        .list_tasks(TaskFilter {
            statuses: vec![TaskStatus::Cancelled],
            limit: 10,
            ..TaskFilter::default()
        })
        .await
        .expect("list");
    assert_eq!(cancelled.items.len(), 1);
    let all = store
        .list_tasks(TaskFilter {
            limit: 10,
            ..TaskFilter::default()
        })
        .await
        .expect("list");
    assert_eq!(all.items.len(), 4);
    assert_eq!(all.items[0].id, other.id);
    let mut counts = store.count_by_status().await.expect("count");
    counts.sort_by_key(|(status, _)| status.as_str());
    assert_eq!(
        counts,
        vec![(TaskStatus::Cancelled, 1), (TaskStatus::Queued, 3)]
    );
}

/// A client with these scopes and a fresh token, and that token.
pub fn new_client_with(scopes: Scopes) -> (Client, Secret) {
    let token = Secret::new(format!("lmsp_token-{}", next()));
    let client = Client {
        id: client_id(),
        name: String::from("paired"),
        scopes,
        token_hash: token.hash(),
        created_at: T0,
        revoked_at: None,
    };
    (client, token)
}

/// Clients (only token hashes stored), pairing codes (redeemed atomically, once, before they
/// expire, only for the scopes they grant), revocation.
pub async fn clients_and_pairings<S: Store + ?Sized>(store: &S) {
    let secret = Secret::new("lmsp_secret-token");
    let client = Client {
        id: client_id(),
        name: String::from("laptop"),
        scopes: Scopes::new([Scope::ResponsesRead, Scope::ResponsesWrite]),
        token_hash: secret.hash(),
        created_at: T0,
        revoked_at: None,
    };
    store.insert_client(client.clone()).await.expect("insert");
    assert_eq!(
        store
            .client_by_token_hash(secret.hash())
            .await
            .expect("read"),
        Some(client.clone())
    );
    assert_eq!(
        store.list_clients().await.expect("list"),
        vec![client.clone()]
    );
    assert!(store.revoke_client(client.id, T0).await.expect("revoke"));
    assert!(!store.revoke_client(client.id, T0).await.expect("revoke"));
    assert!(store
        .client_by_token_hash(secret.hash())
        .await
        .expect("read")
        .is_none());
    let code = Secret::new("123-456");
    let pairing = Pairing {
        code_hash: code.hash(),
        scopes: Scopes::new([Scope::Admin]),
        created_at: T0,
        expires_at: T0.plus_millis(1000),
    };
    store.insert_pairing(pairing.clone()).await.expect("insert");
    let (asks_admin, _) = new_client_with(Scopes::new([Scope::Admin]));
    assert_eq!(
        store
            .redeem_pairing(code.hash(), asks_admin.clone(), T0.plus_millis(1000))
            .await
            .expect("redeem"),
        Redemption::NoSuchCode,
        "expired"
    );
    let (asks_more, _) = new_client_with(Scopes::new([Scope::Admin, Scope::ModelsRead]));
    let narrow = Pairing {
        code_hash: Secret::new("654-321").hash(),
        scopes: Scopes::new([Scope::ModelsRead]),
        ..pairing.clone()
    };
    store.insert_pairing(narrow.clone()).await.expect("insert");
    assert_eq!(
        store
            .redeem_pairing(narrow.code_hash, asks_more.clone(), T0)
            .await
            .expect("redeem"),
        Redemption::ScopesNotGranted,
        "a wider scope than granted"
    );
    assert!(
        store
            .client_by_token_hash(asks_more.token_hash)
            .await
            .expect("read")
            .is_none(),
        "nothing stored for a refused redemption"
    );
    assert_eq!(
        store
            .redeem_pairing(code.hash(), asks_admin.clone(), T0)
            .await
            .expect("redeem"),
        Redemption::Paired
    );
    assert_eq!(
        store
            .client_by_token_hash(asks_admin.token_hash)
            .await
            .expect("read"),
        Some(asks_admin.clone()),
        "the client is stored with the redemption"
    );
    let (again, _) = new_client_with(Scopes::new([Scope::Admin]));
    assert_eq!(
        store
            .redeem_pairing(code.hash(), again, T0)
            .await
            .expect("redeem"),
        Redemption::NoSuchCode,
        "one use"
    );
    assert_eq!(
        store.burn_pairings().await.expect("burn"),
        1,
        "the narrow code"
    );
}

/// P-1: models are metadata only (path, size, mtime, digest, format).
pub async fn models_are_metadata_only_p1<S: Store + ?Sized>(store: &S) {
    let model = ModelRecord {
        id: ModelId::parse("tiny-1").expect("id"),
        format: String::from("gguf"),
        file: FileFingerprint {
            path: String::from("tiny.gguf"),
            size_bytes: 42,
            modified_millis: 5,
            digest: Digest::from_sha256([7; 32]),
        },
        created_at: T0,
    };
    assert!(store.insert_model(model.clone()).await.expect("insert"));
    assert!(!store.insert_model(model.clone()).await.expect("insert"));
    assert_eq!(
        store.model(&model.id).await.expect("read"),
        Some(model.clone())
    );
    let file = FileFingerprint {
        size_bytes: 43,
        modified_millis: 6,
        digest: Digest::from_sha256([8; 32]),
        ..model.file.clone()
    };
    store
        .update_model_file(&model.id, file.clone())
        .await
        .expect("update");
    let listed = store.list_models().await.expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].file, file);
    assert!(store.delete_model(&model.id).await.expect("delete"));
    assert!(!store.delete_model(&model.id).await.expect("delete"));
}

/// The service identity is stored once; each start takes a larger epoch.
pub async fn begin_start_keeps_identity_and_counts_epochs<S: Store + ?Sized>(store: &S) {
    let candidate = ServiceIdentity {
        id: ServiceId::from_ulid(ulid()),
        created_at: T0,
    };
    let first = store.begin_start(candidate.clone()).await.expect("start");
    assert!(first.first_start);
    assert_eq!(first.identity, candidate);
    let other = ServiceIdentity {
        id: ServiceId::from_ulid(ulid()),
        created_at: T0.plus_millis(1),
    };
    let second = store.begin_start(other).await.expect("start");
    assert!(!second.first_start);
    assert_eq!(second.identity, candidate);
    assert!(second.epoch > first.epoch);
}
