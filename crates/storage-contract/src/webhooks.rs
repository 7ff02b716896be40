//! Webhooks (`WebhookStore`): endpoints stored, listed, rewritten and removed with their
//! deliveries; the outbox, whose deliveries a store records itself, each one "recorded in the
//! same transaction as the terminal state it announces" (a background response's task reaching
//! [`webhooks::task_event`]'s statuses, a batch reaching [`webhooks::batch_event`]'s), one per
//! endpoint subscribed to the event, due at once, with the event id [`webhooks::event_id`] of
//! its subject, on every write path (steps, cancels, recovery, the batch steps); and the claims
//! that lease due deliveries to one deliverer, per endpoint, until an attempt is recorded.

use lmsp_domain::batch::{
    Batch, BatchEndpoint, BatchLine, BatchStatus, FilePurpose, LineError, LineErrorCode, NewBatch,
    StoredFile,
};
use lmsp_domain::ids::{BatchId, ClientId, FileId, InstanceId, WebhookEndpointId};
use lmsp_domain::ports::{BatchStore, Store, WebhookStore};
use lmsp_domain::recovery::RestartPolicy;
use lmsp_domain::status::TaskStatus;
use lmsp_domain::task::{Metadata, Task};
use lmsp_domain::time::Timestamp;
use lmsp_domain::transition::Step;
use lmsp_domain::webhooks::{
    self, AttemptOutcome, Delivery, RetryPolicy, WebhookEndpoint, WebhookEventType,
};
use ulid::Ulid;

use crate::fixtures::*;
use crate::support::*;
use crate::{fresh_store, StoreFactory};

use lmsp_domain::webhooks::WebhookEventType::{
    BatchCancelled, BatchCompleted, BatchExpired, BatchFailed, ResponseCancelled,
    ResponseCompleted, ResponseFailed, ResponseIncomplete,
};

/// Every event type about a response.
const RESPONSE_EVENTS: [WebhookEventType; 4] = [
    ResponseCompleted,
    ResponseFailed,
    ResponseCancelled,
    ResponseIncomplete,
];

/// Every event type about a batch.
const BATCH_EVENTS: [WebhookEventType; 4] =
    [BatchCompleted, BatchFailed, BatchCancelled, BatchExpired];

/// A new endpoint receiving `event_types`, registered at `time(0)`.
fn new_endpoint(event_types: &[WebhookEventType]) -> WebhookEndpoint {
    let id = WebhookEndpointId::from_ulid(ulid());
    WebhookEndpoint {
        id,
        name: format!("receiver {id}"),
        url: format!("https://hooks.example/lmsp/{id}?tenant=7"),
        event_types: event_types.to_vec(),
        secret: format!("whsec_{}", "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo0NTY3ODk="),
        previous_secret: None,
        created_at: time(0),
        updated_at: time(0),
    }
}

/// An endpoint receiving `event_types`, stored.
async fn registered<S: Store + ?Sized>(
    store: &S,
    event_types: &[WebhookEventType],
) -> WebhookEndpoint {
    let endpoint = new_endpoint(event_types);
    store.insert_endpoint(endpoint.clone()).await.unwrap();
    endpoint
}

/// The delivery a store records for `endpoint` when `subject` fires `event_type` at `at`: no
/// attempt yet, due at once.
fn recorded(
    endpoint: &WebhookEndpoint,
    event_type: WebhookEventType,
    subject: Ulid,
    at: Timestamp,
) -> Delivery {
    Delivery {
        endpoint_id: endpoint.id,
        event_id: webhooks::event_id(subject),
        event_type,
        subject,
        created_at: at,
        attempts: 0,
        next_attempt_at: Some(at),
        last_status: None,
        last_error: None,
        last_attempt_at: None,
        delivered_at: None,
        given_up_at: None,
    }
}

/// The delivery recorded for `endpoint` when the task `task` (as stored at its end) fired its
/// event.
fn recorded_for_task(endpoint: &WebhookEndpoint, task: &Task) -> Delivery {
    let event_type = webhooks::task_event(task.status).expect("an ended task");
    let at = task.finished_at.expect("an ended task has finished");
    recorded(endpoint, event_type, task.id.ulid(), at)
}

/// The delivery recorded for `endpoint` when `batch` (as stored at its end) fired its event.
fn recorded_for_batch(endpoint: &WebhookEndpoint, batch: &Batch) -> Delivery {
    let event_type = webhooks::batch_event(batch.status).expect("an ended batch");
    let at = batch.ended_at().expect("an ended batch has an end");
    recorded(endpoint, event_type, batch.id.ulid(), at)
}

/// Deliveries in a fixed order (by endpoint, then event), for comparing what is stored or
/// claimed with what is expected whatever order a store answers in.
fn sorted(mut deliveries: Vec<Delivery>) -> Vec<Delivery> {
    deliveries.sort_by(|a, b| {
        (a.endpoint_id.ulid(), &a.event_id).cmp(&(b.endpoint_id.ulid(), &b.event_id))
    });
    deliveries
}

/// Every stored delivery of `endpoint`, sorted.
async fn stored<S: Store + ?Sized>(store: &S, endpoint: &WebhookEndpoint) -> Vec<Delivery> {
    sorted(store.deliveries(endpoint.id, 100).await.unwrap())
}

/// A background response's task accepted by `worker`, of policy `policy`, moved to `status`; as
/// stored then.
async fn background_in<S: Store + ?Sized>(
    store: &S,
    worker: InstanceId,
    policy: RestartPolicy,
    status: TaskStatus,
) -> Task {
    let new = TaskBuilder::new(worker).background().policy(policy).build();
    let task = task_in(store, new, worker, status).await;
    store.task(task.id).await.unwrap().expect("the task")
}

/// A background response's task accepted by `worker`, claimed, and ended at `at` (`completed`
/// or `failed`); as stored then.
async fn background_ended_at<S: Store + ?Sized>(
    store: &S,
    worker: InstanceId,
    status: TaskStatus,
    at: Timestamp,
) -> Task {
    let created = create(store, TaskBuilder::new(worker).background().build()).await;
    let running = step(
        store,
        &created,
        worker,
        vec![claim(&created), Step::Loaded],
        None,
        time(1),
    )
    .await;
    let end = match status {
        TaskStatus::Completed => complete(&running, "done", at),
        TaskStatus::Failed => fail(),
        other => panic!("not an end of a running task: {other:?}"),
    };
    let ended = applied(store.finish(running.id, worker, end, at).await.unwrap()).0;
    assert_eq!(ended.status, status);
    assert_eq!(ended.finished_at, Some(at));
    ended
}

/// A stored upload of `client` and a stored `validating` batch reading it.
async fn validating<S: Store + ?Sized>(store: &S, client: ClientId) -> Batch {
    let input = StoredFile {
        id: FileId::from_ulid(ulid()),
        client_id: client,
        filename: String::from("requests.jsonl"),
        purpose: FilePurpose::Batch,
        bytes: 123,
        digest: String::from("ab").repeat(32),
        created_at: time(0),
        batch_id: None,
    };
    store.insert_file(input.clone()).await.unwrap();
    let batch = Batch::new(NewBatch {
        id: BatchId::from_ulid(ulid()),
        client_id: client,
        endpoint: BatchEndpoint::Responses,
        input_file_id: input.id,
        completion_window_ms: 24 * 60 * 60 * 1000,
        metadata: Metadata::new(),
        created_at: time(0),
    });
    store.insert_batch(batch.clone()).await.unwrap();
    batch
}

/// A batch of `client` started with one line accepted by `owner` (a task of a batch is never in
/// the background): the batch as stored, and its line's task.
async fn started<S: Store + ?Sized>(
    store: &S,
    client: ClientId,
    owner: InstanceId,
) -> (Batch, Task) {
    let batch = validating(store, client).await;
    let mut line = TaskBuilder::new(owner).client(client).build();
    line.batch = Some(BatchLine {
        batch_id: batch.id,
        line: 1,
        custom_id: String::from("request-1"),
    });
    store.stage_batch_tasks(vec![line]).await.unwrap();
    let stored = store
        .start_batch(batch.started(time(10)))
        .await
        .unwrap()
        .expect("a validating batch starts");
    let tasks = store.batch_tasks(batch.id, &[], 0, 2).await.unwrap();
    assert_eq!(tasks.len(), 1);
    (stored, tasks.into_iter().next().unwrap())
}

/// Ends `batch`, read in `from` (`finalizing` or `cancelling`), at `at`; the batch as stored.
async fn end<S: Store + ?Sized>(
    store: &S,
    from: BatchStatus,
    batch: &Batch,
    at: Timestamp,
) -> Batch {
    store
        .end_batch(from, batch.ended(None, None, at), Vec::new())
        .await
        .unwrap()
        .expect("the batch ends")
}

/// Endpoints are stored as registered (every event type, a previous secret and until when it is
/// kept), read back by id, listed newest first in pages before an id, rewritten whole but for
/// their id and registration time, and removed; an endpoint that is not there is neither
/// rewritten nor removed.
pub async fn webhook_endpoints_are_stored_listed_newest_first_rewritten_and_removed<
    F: StoreFactory,
>(
    factory: &F,
) {
    let (store, _) = fresh_store(factory).await;
    let first = registered(&store, &RESPONSE_EVENTS).await;
    let second = registered(&store, &[BatchExpired, ResponseCompleted]).await;
    let mut third = new_endpoint(&[BatchCompleted]);
    third.previous_secret = Some((String::from("whsec_b2xkIHNlY3JldA=="), time(5_000)));
    third.updated_at = time(7);
    store.insert_endpoint(third.clone()).await.unwrap();

    assert_eq!(store.endpoint(first.id).await.unwrap(), Some(first.clone()));
    assert_eq!(
        store.endpoint(second.id).await.unwrap(),
        Some(second.clone()),
        "the event types keep their order"
    );
    assert_eq!(store.endpoint(third.id).await.unwrap(), Some(third.clone()));
    assert_eq!(
        store
            .endpoint(WebhookEndpointId::from_ulid(ulid()))
            .await
            .unwrap(),
        None
    );

    let page = store.list_endpoints(None, 2).await.unwrap();
    assert_eq!(
        page.items,
        vec![third.clone(), second.clone()],
        "newest first"
    );
    assert!(page.has_more);
    let rest = store.list_endpoints(Some(second.id), 2).await.unwrap();
    assert_eq!(rest.items, vec![first.clone()], "older than `before`");
    assert!(!rest.has_more);
    let all = store.list_endpoints(None, 3).await.unwrap();
    assert_eq!(all.items.len(), 3);
    assert!(!all.has_more, "exactly `limit` left: no more");

    let rotated = WebhookEndpoint {
        name: String::from("renamed"),
        url: String::from("http://receiver.internal:8080/hook"),
        event_types: vec![BatchFailed, ResponseFailed, BatchCancelled],
        secret: String::from("whsec_bmV3IHNlY3JldA=="),
        previous_secret: Some((first.secret.clone(), time(86_400_000))),
        updated_at: time(100),
        // Neither is rewritten.
        created_at: time(99),
        ..first.clone()
    };
    assert!(store.update_endpoint(rotated.clone()).await.unwrap());
    assert_eq!(
        store.endpoint(first.id).await.unwrap(),
        Some(WebhookEndpoint {
            created_at: first.created_at,
            ..rotated.clone()
        }),
        "every column but the id and the registration time"
    );
    let unrotated = WebhookEndpoint {
        previous_secret: None,
        updated_at: time(200),
        ..third.clone()
    };
    assert!(store.update_endpoint(unrotated.clone()).await.unwrap());
    assert_eq!(
        store.endpoint(third.id).await.unwrap(),
        Some(unrotated),
        "the previous secret dropped"
    );
    let missing = new_endpoint(&[BatchCompleted]);
    assert!(!store.update_endpoint(missing.clone()).await.unwrap());
    assert_eq!(store.endpoint(missing.id).await.unwrap(), None);

    assert!(store.delete_endpoint(second.id).await.unwrap());
    assert_eq!(store.endpoint(second.id).await.unwrap(), None);
    assert!(!store.delete_endpoint(second.id).await.unwrap());
    let left = store.list_endpoints(None, 10).await.unwrap();
    assert_eq!(
        left.items.iter().map(|e| e.id).collect::<Vec<_>>(),
        vec![third.id, first.id]
    );
}

/// The outbox, for responses: a background response's task that completes, fails, or is
/// cancelled (queued, or running and acknowledged by its worker) records, in the same
/// transaction as that end, exactly one delivery of `response.<status>` to each endpoint
/// subscribed to it, with the event id of its task's ULID, due at its end; none to an endpoint
/// not subscribed, none for a task that is not in the background, none before the end, and none
/// again for a cancel of a task that had ended.
pub async fn a_background_response_that_ends_records_one_webhook_delivery_per_subscribed_endpoint<
    F: StoreFactory,
>(
    factory: &F,
) {
    let (store, _) = fresh_store(factory).await;
    let worker = instance_id();
    let every = registered(&store, &RESPONSE_EVENTS).await;
    let completions = registered(&store, &[ResponseCompleted, BatchCompleted]).await;
    let batches = registered(&store, &BATCH_EVENTS).await;

    let running = background_in(&store, worker, RestartPolicy::Fail, TaskStatus::Running).await;
    let cancelling =
        background_in(&store, worker, RestartPolicy::Fail, TaskStatus::Cancelling).await;
    assert!(
        store.deliveries(every.id, 10).await.unwrap().is_empty(),
        "no event before an end"
    );

    let completed = background_in(&store, worker, RestartPolicy::Fail, TaskStatus::Completed).await;
    let failed = background_in(&store, worker, RestartPolicy::Fail, TaskStatus::Failed).await;
    let cancelled_queued =
        background_in(&store, worker, RestartPolicy::Fail, TaskStatus::Cancelled).await;
    finish(&store, &cancelling, worker, Step::AcknowledgeCancel).await;
    let cancelled_running = store.task(cancelling.id).await.unwrap().unwrap();
    assert_eq!(cancelled_running.status, TaskStatus::Cancelled);
    for ended in [&completed, &failed, &cancelled_queued] {
        assert!(ended.status.is_finished(), "{:?}", ended.status);
    }
    // Not in the background: their clients were there.
    for status in [
        TaskStatus::Completed,
        TaskStatus::Failed,
        TaskStatus::Cancelled,
    ] {
        task_in(&store, task(worker, RestartPolicy::Fail), worker, status).await;
    }
    // A cancel of an ended task moves nothing and fires nothing.
    store.cancel(completed.id, None, time(950)).await.unwrap();
    store
        .cancel(cancelled_queued.id, None, time(950))
        .await
        .unwrap();

    let ended = [&completed, &failed, &cancelled_queued, &cancelled_running];
    assert_eq!(
        stored(&store, &every).await,
        sorted(
            ended
                .iter()
                .map(|task| recorded_for_task(&every, task))
                .collect()
        ),
        "one delivery per end, with the event id of the task"
    );
    assert_eq!(
        stored(&store, &completions).await,
        vec![recorded_for_task(&completions, &completed)],
        "only the events subscribed to"
    );
    assert!(
        store.deliveries(batches.id, 10).await.unwrap().is_empty(),
        "no response event to an endpoint of batch events"
    );
    assert_eq!(
        store.task(running.id).await.unwrap().unwrap().status,
        TaskStatus::Running
    );

    let recent = store.deliveries(every.id, 10).await.unwrap();
    assert!(
        recent
            .windows(2)
            .all(|pair| pair[0].created_at >= pair[1].created_at),
        "the most recent event first: {recent:?}"
    );
    let two = store.deliveries(every.id, 2).await.unwrap();
    assert_eq!(two.len(), 2, "at most `limit`");
    assert_eq!(two[0].created_at, recent[0].created_at);
}

/// The outbox, for batches: a batch that ends completed, failed (refused while validating),
/// cancelled or expired records, with the step that ends it, exactly one delivery of
/// `batch.<status>` to each endpoint subscribed to it, with the event id of the batch's ULID, due
/// at its end; the steps before an end record none, nor does a refused step, and a batch's
/// tasks (never in the background) none.
pub async fn a_batch_that_ends_records_one_webhook_delivery_per_subscribed_endpoint<
    F: StoreFactory,
>(
    factory: &F,
) {
    let (store, _) = fresh_store(factory).await;
    let client = client_id();
    let worker = instance_id();
    let every = registered(&store, &BATCH_EVENTS).await;
    let completions = registered(&store, &[BatchCompleted, ResponseCompleted]).await;
    let responses = registered(&store, &RESPONSE_EVENTS).await;

    // Completed: its line completes, it finalizes, then ends.
    let (batch, line) = started(&store, client, worker).await;
    let running = step(
        &store,
        &line,
        worker,
        vec![claim(&line), Step::Loaded, output("done")],
        None,
        time(20),
    )
    .await;
    finish(
        &store,
        &running,
        worker,
        complete(&running, "done", time(21)),
    )
    .await;
    let counted = store.batch(batch.id).await.unwrap().unwrap();
    let finalizing = store
        .update_batch(BatchStatus::InProgress, counted.finalizing(false, time(30)))
        .await
        .unwrap()
        .unwrap();
    assert!(
        store.deliveries(every.id, 10).await.unwrap().is_empty(),
        "no event before an end"
    );
    let completed = end(&store, BatchStatus::Finalizing, &finalizing, time(31)).await;
    assert_eq!(completed.status, BatchStatus::Completed);
    assert_eq!(
        store
            .end_batch(
                BatchStatus::Finalizing,
                finalizing.ended(None, None, time(32)),
                Vec::new()
            )
            .await
            .unwrap(),
        None,
        "a refused step ends nothing"
    );

    // Failed: its input was refused.
    let refused = validating(&store, client).await;
    let failed = store
        .update_batch(
            BatchStatus::Validating,
            refused.refused(
                vec![LineError::at(1, LineErrorCode::InvalidJsonLine, "not JSON")],
                time(40),
            ),
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(failed.status, BatchStatus::Failed);

    // Cancelled: cancelled while validating, then ended.
    let cancelled = validating(&store, client).await;
    let cancelling = store
        .update_batch(
            BatchStatus::Validating,
            cancelled.cancelled_by_client(time(50)).unwrap(),
        )
        .await
        .unwrap()
        .unwrap();
    let cancelled = end(&store, BatchStatus::Cancelling, &cancelling, time(51)).await;
    assert_eq!(cancelled.status, BatchStatus::Cancelled);

    // Expired: its window passed; its line is cancelled, then it ends.
    let (batch, line) = started(&store, client, worker).await;
    store.cancel(line.id, None, time(60)).await.unwrap();
    let finalizing = store
        .update_batch(BatchStatus::InProgress, batch.finalizing(true, time(61)))
        .await
        .unwrap()
        .unwrap();
    let expired = end(&store, BatchStatus::Finalizing, &finalizing, time(62)).await;
    assert_eq!(expired.status, BatchStatus::Expired);

    let ended = [&completed, &failed, &cancelled, &expired];
    assert_eq!(
        stored(&store, &every).await,
        sorted(
            ended
                .iter()
                .map(|batch| recorded_for_batch(&every, batch))
                .collect()
        ),
        "one delivery per end, with the event id of the batch"
    );
    assert_eq!(
        stored(&store, &completions).await,
        vec![recorded_for_batch(&completions, &completed)],
        "only the events subscribed to, and no response event of a batch's task"
    );
    assert!(
        store.deliveries(responses.id, 10).await.unwrap().is_empty(),
        "a batch's tasks are not in the background"
    );
}

/// P-7, the outbox: recovery that fails a background response's task (policy `fail`, running or
/// queued on an instance that stopped) records its `response.failed` delivery in the recovery's
/// write, once; a task recovery queues again records none.
pub async fn recovery_that_fails_a_background_response_records_its_webhook_delivery_p7<
    F: StoreFactory,
>(
    factory: &F,
) {
    let (store, _) = fresh_store(factory).await;
    let hook = registered(&store, &RESPONSE_EVENTS).await;
    let gone = register(&store, "gone", time(0)).await.id;
    let running = background_in(&store, gone, RestartPolicy::Fail, TaskStatus::Running).await;
    let queued = background_in(&store, gone, RestartPolicy::Fail, TaskStatus::Queued).await;
    let retried = background_in(&store, gone, RestartPolicy::Retry, TaskStatus::Running).await;
    store.retire_instance(gone, time(30)).await.unwrap();
    let rescuer = register(&store, "rescuer", time(31)).await.id;
    store
        .recover_instance(gone, rescuer, time(32))
        .await
        .unwrap();

    let running = store.task(running.id).await.unwrap().unwrap();
    let queued = store.task(queued.id).await.unwrap().unwrap();
    assert_eq!(running.status, TaskStatus::Failed);
    assert_eq!(queued.status, TaskStatus::Failed);
    assert_eq!(
        store.task(retried.id).await.unwrap().unwrap().status,
        TaskStatus::Queued
    );
    let expected = sorted(vec![
        recorded_for_task(&hook, &running),
        recorded_for_task(&hook, &queued),
    ]);
    assert_eq!(stored(&store, &hook).await, expected);

    store
        .recover_instance(gone, rescuer, time(33))
        .await
        .unwrap();
    assert_eq!(stored(&store, &hook).await, expected, "I-5: once");
}

/// A claim leases the deliveries due at `now` until `lease_until`: none before they are due, at
/// most `per_endpoint` of each endpoint and `limit` in all, oldest due first; while an endpoint
/// has a delivery leased (up to and at `lease_until`), a claim takes none of its deliveries but
/// still takes another endpoint's; once the lease ran out, the deliveries are due again.
pub async fn claimed_webhook_deliveries_are_leased_per_endpoint_until_their_lease_runs_out<
    F: StoreFactory,
>(
    factory: &F,
) {
    let (store, _) = fresh_store(factory).await;
    let worker = instance_id();
    let a = registered(&store, &[ResponseCompleted]).await;
    let b = registered(&store, &[ResponseCompleted]).await;
    let c = registered(&store, &[ResponseFailed]).await;
    // Due one after the other: the tasks' ends, then the failure's.
    let mut tasks = Vec::new();
    for n in 0..3 {
        tasks.push(
            background_ended_at(&store, worker, TaskStatus::Completed, time(1_000 + n)).await,
        );
    }
    let failed = background_ended_at(&store, worker, TaskStatus::Failed, time(1_003)).await;
    let due = time(1_003);
    let ids: Vec<String> = tasks
        .iter()
        .map(|task| webhooks::event_id(task.id.ulid()))
        .collect();

    assert!(
        store
            .claim_deliveries(time(999), time(2_000), 10, 10)
            .await
            .unwrap()
            .is_empty(),
        "none is due yet"
    );
    let first_lease = due.plus_millis(1_000);
    let first = store
        .claim_deliveries(due, first_lease, 2, 3)
        .await
        .unwrap();
    assert_eq!(first.len(), 3, "at most `limit`: {first:?}");
    for endpoint in [&a, &b] {
        let taken: Vec<&Delivery> = first
            .iter()
            .filter(|d| d.endpoint_id == endpoint.id)
            .collect();
        assert!(taken.len() <= 2, "at most `per_endpoint`: {first:?}");
        assert!(
            taken.iter().any(|d| d.event_id == ids[0]),
            "the oldest due first: {first:?}"
        );
        assert!(taken.iter().all(|d| d.event_id != ids[2]), "{first:?}");
    }
    assert!(
        first.iter().all(|d| d.endpoint_id != c.id),
        "c's delivery is due last: {first:?}"
    );
    assert!(first.iter().all(|d| d.attempts == 0));

    let second_lease = due.plus_millis(1_001);
    let second = store
        .claim_deliveries(due.plus_millis(1), second_lease, 2, 10)
        .await
        .unwrap();
    assert_eq!(
        second,
        vec![recorded_for_task(&c, &failed)],
        "a and b hold a leased delivery each: only c's is taken"
    );
    assert!(
        store
            .claim_deliveries(due.plus_millis(2), due.plus_millis(2_000), 10, 10)
            .await
            .unwrap()
            .is_empty(),
        "every endpoint holds a leased delivery"
    );
    assert!(
        store
            .claim_deliveries(first_lease, due.plus_millis(2_000), 10, 10)
            .await
            .unwrap()
            .is_empty(),
        "a lease holds up to and at its end"
    );

    let after = store
        .claim_deliveries(
            second_lease.plus_millis(1),
            second_lease.plus_millis(1_000),
            10,
            10,
        )
        .await
        .unwrap();
    let mut expected: Vec<Delivery> = Vec::new();
    for endpoint in [&a, &b] {
        expected.extend(tasks.iter().map(|task| recorded_for_task(endpoint, task)));
    }
    expected.push(recorded_for_task(&c, &failed));
    assert_eq!(
        sorted(after),
        sorted(expected),
        "the leases ran out and nothing was recorded: everything is due again"
    );
}

/// An attempt is stored as the domain made it (`Delivery::after_attempt`) and ends the lease:
/// the endpoint's next delivery can be claimed at once; a delivered one, or one given up, is
/// never claimed again; one due again later is claimed only once that time comes.
pub async fn a_recorded_webhook_attempt_is_stored_and_ends_the_lease<F: StoreFactory>(factory: &F) {
    let (store, _) = fresh_store(factory).await;
    let worker = instance_id();
    let hook = registered(&store, &[ResponseCompleted, ResponseFailed]).await;
    let one = background_ended_at(&store, worker, TaskStatus::Completed, time(1_000)).await;
    let two = background_ended_at(&store, worker, TaskStatus::Completed, time(1_001)).await;
    let three = background_ended_at(&store, worker, TaskStatus::Failed, time(1_002)).await;
    let due = time(1_002);
    let lease = due.plus_millis(10_000);
    let policy = RetryPolicy::DEFAULT;

    let claimed = store.claim_deliveries(due, lease, 1, 10).await.unwrap();
    assert_eq!(
        claimed,
        vec![recorded_for_task(&hook, &one)],
        "one per endpoint"
    );
    let delivered = claimed[0].after_attempt(
        AttemptOutcome::Answered(204),
        &policy,
        due.plus_millis(5),
        0.0,
    );
    assert!(delivered.delivered_at.is_some());
    store.record_attempt(delivered.clone()).await.unwrap();

    // The lease ended with the attempt: the next delivery is taken before `lease`.
    let claimed = store
        .claim_deliveries(due.plus_millis(6), lease, 1, 10)
        .await
        .unwrap();
    assert_eq!(claimed, vec![recorded_for_task(&hook, &two)]);
    let retried = claimed[0].after_attempt(
        AttemptOutcome::Answered(503),
        &policy,
        due.plus_millis(7),
        0.0,
    );
    let again_at = retried.next_attempt_at.expect("tried again");
    assert_eq!(again_at, due.plus_millis(7 + policy.base_ms));
    store.record_attempt(retried.clone()).await.unwrap();

    let claimed = store
        .claim_deliveries(due.plus_millis(8), lease, 1, 10)
        .await
        .unwrap();
    assert_eq!(claimed, vec![recorded_for_task(&hook, &three)]);
    let no_answer = RetryPolicy {
        retry_for_ms: 0,
        ..policy
    };
    let given_up = claimed[0].after_attempt(
        AttemptOutcome::NoAnswer(String::from("connection refused")),
        &no_answer,
        due.plus_millis(9),
        0.5,
    );
    assert!(given_up.given_up_at.is_some() && given_up.next_attempt_at.is_none());
    store.record_attempt(given_up.clone()).await.unwrap();

    assert_eq!(
        stored(&store, &hook).await,
        sorted(vec![delivered.clone(), retried.clone(), given_up.clone()]),
        "each attempt stored as the domain made it"
    );
    assert!(
        store
            .claim_deliveries(
                again_at.plus_millis(-1),
                again_at.plus_millis(10_000),
                10,
                10
            )
            .await
            .unwrap()
            .is_empty(),
        "not due yet; the delivered and the given-up one never again"
    );
    let claimed = store
        .claim_deliveries(again_at, again_at.plus_millis(10_000), 10, 10)
        .await
        .unwrap();
    assert_eq!(claimed, vec![retried], "due again at its time, and only it");
}

/// Removing an endpoint removes its deliveries with it (and only its): none is listed or claimed
/// any more; another endpoint's stay.
pub async fn removing_a_webhook_endpoint_removes_its_deliveries<F: StoreFactory>(factory: &F) {
    let (store, _) = fresh_store(factory).await;
    let worker = instance_id();
    let gone = registered(&store, &[ResponseCompleted]).await;
    let kept = registered(&store, &[ResponseCompleted]).await;
    let task = background_in(&store, worker, RestartPolicy::Fail, TaskStatus::Completed).await;
    let due = task.finished_at.unwrap();
    assert_eq!(store.deliveries(gone.id, 10).await.unwrap().len(), 1);

    assert!(store.delete_endpoint(gone.id).await.unwrap());
    assert!(store.deliveries(gone.id, 10).await.unwrap().is_empty());
    assert_eq!(
        store.deliveries(kept.id, 10).await.unwrap(),
        vec![recorded_for_task(&kept, &task)]
    );
    assert_eq!(
        store
            .claim_deliveries(due, due.plus_millis(1_000), 10, 10)
            .await
            .unwrap(),
        vec![recorded_for_task(&kept, &task)],
        "only the kept endpoint's"
    );
}
