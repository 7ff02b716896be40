//! Retention (P-5, P-6, I-4): `purge_finished` removes finished tasks past the cut-off in
//! bounded batches, never an unfinished one; `purge_idempotency` removes expired records.

use lmsp_domain::idempotency::{KeyDecision, Operation};
use lmsp_domain::recovery::RestartPolicy;
use lmsp_domain::status::TaskStatus;
use lmsp_domain::transition::Step;

use crate::fixtures::*;
use crate::support::*;
use crate::{fresh_store, StoreFactory};

/// P-5, P-6, I-4: a purge removes only finished tasks whose `finished_at` is before the cut-off,
/// oldest first, with their events, response and snapshot, at most `batch` at a time, saying
/// whether more are left; an unfinished task is never purged, however old; the idempotency
/// record of a purged task stays, its reply no longer naming the task.
pub async fn a_purge_removes_only_finished_tasks_older_than_the_cutoff_p5_p6_i4<F: StoreFactory>(
    factory: &F,
) {
    let (store, listener) = fresh_store(factory).await;
    let worker = instance_id();
    let mut old = Vec::new();
    let with_key = task(worker, RestartPolicy::Fail);
    let record = record_for(&with_key, "purged-task");
    store
        .create_task(with_key.clone(), Some(record.clone()))
        .await
        .unwrap();
    store.release_key(&record.scope, &record.key).await.unwrap();
    let running = step(
        &store,
        &with_key,
        worker,
        vec![claim(&with_key), Step::Loaded, output("a")],
        None,
        time(1),
    )
    .await;
    let done = applied(
        store
            .finish(
                running.id,
                worker,
                complete(&running, "a", time(100)),
                time(100),
            )
            .await
            .unwrap(),
    )
    .0;
    old.push(done);
    for (status, at) in [(TaskStatus::Failed, 200), (TaskStatus::Cancelled, 300)] {
        let running = task_in(
            &store,
            task(worker, RestartPolicy::Fail),
            worker,
            TaskStatus::Running,
        )
        .await;
        let finished = match status {
            TaskStatus::Failed => store
                .finish(running.id, worker, fail(), time(at))
                .await
                .unwrap(),
            _ => {
                store.cancel(running.id, None, time(at)).await.unwrap();
                store
                    .finish(running.id, worker, Step::AcknowledgeCancel, time(at))
                    .await
                    .unwrap()
            }
        };
        old.push(applied(finished).0);
    }
    let young_running = task_in(
        &store,
        task(worker, RestartPolicy::Fail),
        worker,
        TaskStatus::Running,
    )
    .await;
    let young = applied(
        store
            .finish(
                young_running.id,
                worker,
                complete(&young_running, "", time(10_000)),
                time(10_000),
            )
            .await
            .unwrap(),
    )
    .0;
    let unfinished = [
        task_in(
            &store,
            task(worker, RestartPolicy::Fail),
            worker,
            TaskStatus::Queued,
        )
        .await,
        task_in(
            &store,
            task(worker, RestartPolicy::Fail),
            worker,
            TaskStatus::Running,
        )
        .await,
        task_in(
            &store,
            task(worker, RestartPolicy::Fail),
            worker,
            TaskStatus::Cancelling,
        )
        .await,
    ];
    let old_events: u64 = old.iter().map(|task| task.last_sequence_number).sum();
    let mark = listener.mark();

    let cutoff = time(5_000);
    let first = store.purge_finished(cutoff, 2).await.unwrap();
    assert!(
        first.tasks >= 1 && first.tasks <= 2,
        "P-5: a bounded batch: {first:?}"
    );
    assert!(first.more, "P-5: more are left");
    let mut total = first;
    let mut rounds = 0;
    while total.tasks < 3 {
        let next = store.purge_finished(cutoff, 2).await.unwrap();
        assert!(next.tasks >= 1, "a batch that says more makes progress");
        total.tasks += next.tasks;
        total.events += next.events;
        total.more = next.more;
        rounds += 1;
        assert!(rounds < 5, "the purge does not end");
    }
    assert_eq!(total.tasks, 3);
    assert!(!total.more, "nothing is left before the cut-off");
    assert_eq!(
        total.events, old_events,
        "P-5: the events go with their tasks"
    );
    let after = store.purge_finished(cutoff, 2).await.unwrap();
    assert_eq!((after.tasks, after.events, after.more), (0, 0, false));

    for gone in &old {
        assert_eq!(store.task(gone.id).await.unwrap(), None, "P-5");
        assert!(
            all_events(&store, gone.id).await.is_empty(),
            "P-5: its events"
        );
        assert_eq!(
            store.response(gone.id).await.unwrap(),
            None,
            "P-5: its response"
        );
        assert_eq!(store.snapshot(gone.id).await.unwrap(), None);
        assert_eq!(
            store.task_by_response(gone.response_id).await.unwrap(),
            None
        );
    }
    assert_log_consistent(&store, young.id).await;
    for kept in &unfinished {
        let (task, _) = assert_log_consistent(&store, kept.id).await;
        assert_eq!(&task, kept, "P-6: an unfinished task is untouched");
    }
    match store
        .claim_key(&task_claim(&with_key, "purged-task"), time(20_000))
        .await
        .unwrap()
    {
        KeyDecision::Replay(reply) => {
            assert_eq!(
                reply.task_id, None,
                "the reply no longer names the purged task"
            );
            assert_eq!(reply.body, reply_for(&with_key).body);
        }
        other => panic!("I-8: the key outlives its purged task, not {other:?}"),
    }

    let far = store
        .purge_finished(time(1_000_000_000), 100)
        .await
        .unwrap();
    assert_eq!(
        (far.tasks, far.more),
        (1, false),
        "I-4: only the young finished one"
    );
    assert_eq!(far.events, young.last_sequence_number);
    for kept in &unfinished {
        assert!(store.task(kept.id).await.unwrap().is_some(), "P-6, I-4");
    }
    assert!(
        listener.events_since(mark).is_empty(),
        "a purge writes no event"
    );
}

/// I-4: with a batch of one, each purge takes one task (the oldest finished first) and says
/// whether more are left, until none is.
pub async fn a_purge_in_batches_of_one_takes_the_oldest_first_until_none_is_left_i4<
    F: StoreFactory,
>(
    factory: &F,
) {
    let (store, _listener) = fresh_store(factory).await;
    let worker = instance_id();
    let mut finished = Vec::new();
    for at in [300, 100, 200] {
        let running = task_in(
            &store,
            task(worker, RestartPolicy::Fail),
            worker,
            TaskStatus::Running,
        )
        .await;
        let done = store
            .finish(running.id, worker, fail(), time(at))
            .await
            .unwrap();
        finished.push((at, applied(done).0.id));
    }
    finished.sort();
    let mut reports = Vec::new();
    for (_, expected_gone) in &finished {
        let report = store.purge_finished(time(1_000), 1).await.unwrap();
        assert_eq!(report.tasks, 1);
        assert_eq!(
            store.task(*expected_gone).await.unwrap(),
            None,
            "oldest finished first"
        );
        reports.push(report.more);
    }
    assert_eq!(reports, vec![true, true, false]);
}

/// I-8: `purge_idempotency` removes the records expired at a time, at most `batch` at a time;
/// a live record stays and still answers.
pub async fn purging_idempotency_records_removes_only_expired_ones_in_batches_i8<
    F: StoreFactory,
>(
    factory: &F,
) {
    let (store, _listener) = fresh_store(factory).await;
    let holder = instance_id();
    let client = client_id();
    let mut claims = Vec::new();
    for (index, at) in [0, 1, 2, 10_000].into_iter().enumerate() {
        let claim = key_claim(
            client,
            Operation::RegisterModel,
            &format!("key-{index}"),
            "{}",
            holder,
            time(at),
        );
        assert_eq!(
            store.claim_key(&claim, time(at)).await.unwrap(),
            KeyDecision::Proceed
        );
        let reply = lmsp_domain::idempotency::StoredReply {
            task_id: None,
            body: vec![index as u8],
        };
        let registered = store
            .insert_model_with_key(
                upstream_model(&format!("m{index}"), "upstream"),
                claim.answered_record(reply, time(at)),
            )
            .await
            .unwrap();
        assert_eq!(registered, lmsp_domain::ports::KeyedInsert::Inserted);
        store.release_key(&claim.scope, &claim.key).await.unwrap();
        claims.push(claim);
    }
    let at = time(TTL_MILLIS + 5_000);
    assert_eq!(store.purge_idempotency(at, 2).await.unwrap(), 2);
    assert_eq!(store.purge_idempotency(at, 2).await.unwrap(), 1);
    assert_eq!(store.purge_idempotency(at, 2).await.unwrap(), 0);
    for claim in &claims[..3] {
        assert_eq!(
            store.claim_key(claim, at).await.unwrap(),
            KeyDecision::Proceed,
            "purged"
        );
    }
    match store.claim_key(&claims[3], at).await.unwrap() {
        KeyDecision::Replay(reply) => assert_eq!(reply.body, vec![3]),
        other => panic!("a live record stays, not {other:?}"),
    }
}
